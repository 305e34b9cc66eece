"""The four MLPerf Tiny int8 reference models (tests/data/mlperf_tiny, Apache-2.0, see PROVENANCE.md)
compiled from their .tflite files: byte-exact with LiteRT's reference interpreter (BUILTIN_REF) on
random int8 inputs, with the reference kernels (prog.run_int8) and with the portable C library on the
host; CMSIS-NN and QEMU locally (benchmarks/bench_tflite.py runs 100 inputs each)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("tflite")
pytest.importorskip("ai_edge_litert")

import corten  # noqa: E402
from conftest import needs_arm_gcc, needs_cmsis_nn, needs_gcc, needs_qemu  # noqa: E402
from corten.frontends.tflite import tflite_input, tflite_output  # noqa: E402
from tflite_builder import litert_outputs, random_input  # noqa: E402

DATA = Path(__file__).parent / "data" / "mlperf_tiny"
MODELS = {"kws_ref_model.tflite": {"quantized_conv2d": 5, "quantized_depthwise_conv2d": 4, "quantized_avg_pool2d": 1,
                                   "quantized_linear": 1, "quantized_softmax": 1},
          "pretrainedResnet_quant.tflite": {"quantized_conv2d": 9, "quantized_add": 3, "quantized_avg_pool2d": 1,
                                            "quantized_linear": 1, "quantized_softmax": 1},
          "vww_96_int8.tflite": {"quantized_conv2d": 14, "quantized_depthwise_conv2d": 13,
                                 "quantized_avg_pool2d": 1, "quantized_linear": 1, "quantized_softmax": 1},
          "ad01_int8.tflite": {"quantized_linear": 10}}


@pytest.fixture(scope="module", params=list(MODELS))
def model(request):
    path = DATA / request.param
    prog = corten.compile(str(path), target="cortex-m4")
    rng = np.random.default_rng(0)
    spec = prog.inputs[0]
    shape = (spec.shape[0], spec.shape[2], spec.shape[3], spec.shape[1]) if len(spec.shape) == 4 else spec.shape
    qs = [random_input(shape, rng) for _ in range(10)]
    data = path.read_bytes()
    return request.param, prog, qs, [litert_outputs(data, [q])[0] for q in qs]


def test_mlperf_tiny_model_compiles_to_its_ops(model):
    name, prog, _, _ = model
    counts = {k: v for k, v in prog.op_counts().items() if k not in ("quantize_per_tensor", "dequantize_per_tensor")}
    assert counts == MODELS[name]
    assert not prog.unlowered_ops()


def test_mlperf_tiny_model_matches_litert_in_python(model):
    _, prog, qs, refs = model
    for q, r in zip(qs, refs):
        assert np.array_equal(tflite_output(prog.run_int8(tflite_input(prog, q))[0]), r)


@needs_gcc
def test_mlperf_tiny_model_matches_litert_in_c_on_the_host(model):
    _, prog, qs, refs = model
    for q, r in list(zip(qs, refs))[:3]:
        run = prog.c_run(tflite_input(prog, q), on="host", kernels="portable")
        assert np.array_equal(tflite_output(run.outputs[0]), r)


@needs_cmsis_nn
@needs_qemu
@needs_arm_gcc
@pytest.mark.slow
@pytest.mark.parametrize("target", ["cortex-m4", "cortex-m55"])
def test_mlperf_tiny_model_matches_litert_on_qemu_with_cmsis_nn(model, target):
    _, prog, qs, refs = model
    run = prog.c_run(tflite_input(prog, qs[0]), on="qemu", target=target, kernels="cmsis-nn")
    assert np.array_equal(tflite_output(run.outputs[0]), refs[0])
