"""TFLite int8 models -> Corten programs, byte for byte against LiteRT's reference interpreter
(``BUILTIN_REF``: TFLite's reference kernels).  The models are written here (tests/tflite_builder.py):
every supported operator with per-channel weights, asymmetric activations, fused activations,
SAME/VALID padding and strides, plus 200 random models."""
from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("tflite")
pytest.importorskip("ai_edge_litert")

import corten  # noqa: E402
from conftest import needs_arm_gcc, needs_cmsis_nn, needs_gcc, needs_qemu  # noqa: E402
from corten.errors import ModelFileError, UsageError  # noqa: E402
from corten.frontends.tflite import tflite_input, tflite_output  # noqa: E402
from tflite_builder import TfliteBuilder, litert_outputs, random_input, random_model, random_models  # noqa: E402


def _write(tmp_path, data: bytes, name="m.tflite"):
    p = tmp_path / name
    p.write_bytes(data)
    return p


def _tfl_shape(spec):
    s = spec.shape
    return (s[0], s[2], s[3], s[1]) if len(s) == 4 else tuple(s)


def assert_exact(tmp_path, data: bytes, samples: int = 3, seed: int = 0):
    prog = corten.compile(str(_write(tmp_path, data)), target="cortex-m4")
    rng = np.random.default_rng(seed)
    for _ in range(samples):
        xs = [random_input(_tfl_shape(spec), rng) for spec in prog.inputs]
        refs = litert_outputs(data, xs)
        floats = [tflite_input(prog, x, k) for k, x in enumerate(xs)]
        for q, x in zip(prog.quantize_inputs(*floats), xs):  # the float inputs quantize back to the int8 ones
            assert np.array_equal(tflite_output(q), x)
        got = prog.run_int8(*floats)
        for g, r in zip(got, refs):
            g = tflite_output(g)
            assert g.shape == r.shape and np.array_equal(g, r), (prog.op_counts(), int((g != r).sum()))
    return prog


# ----------------------------------------------------------------------------- one operator each
def _net(kind: str, seed: int = 0) -> bytes:
    m = TfliteBuilder(seed)
    x = m.input([1, 9, 7, 3], 0.043, -7)
    if kind.startswith("conv"):
        _, pad, act, stride, pc = kind.split("-")
        x = m.conv_2d(x, 5, (3, 2), (int(stride), 1), pad, act, per_channel=pc == "pc")
    elif kind.startswith("dilated"):
        x = m.conv_2d(x, 4, (3, 3), (1, 1), "SAME", "RELU", dilation=(2, 1))
    elif kind.startswith("dw"):
        _, pad, act, mult = kind.split("-")
        x = m.depthwise_conv_2d(x, int(mult), (3, 3), (2, 2), pad, act)
    elif kind.startswith("fc"):
        _, pc, act = kind.split("-")
        x = m.fully_connected(m.reshape(x, [1, -1]), 6, act, per_channel=pc == "pc")
    elif kind in ("add", "sub", "mul"):
        y = m.conv_2d(x, 3, (1, 1), (1, 1), "SAME", "NONE")
        x = m.binary(kind.upper(), x, y, "RELU6")
    elif kind.startswith("broadcast"):
        op = kind.split("-")[1]
        x = m.binary(op.upper(), x, m.const_act([3]), "RELU")
    elif kind.startswith("avg") or kind.startswith("max"):
        _, pad = kind.split("-")
        x = m.pool("AVERAGE_POOL_2D" if kind.startswith("avg") else "MAX_POOL_2D", x, (3, 2), (2, 2), pad, "RELU")
    elif kind == "softmax":
        x = m.softmax(m.reshape(x, [9, 21]), beta=1.0)
    elif kind == "softmax-4d":
        x = m.softmax(x)
    elif kind == "transpose":
        x = m.transpose(x, [0, 2, 1, 3])
    elif kind == "transpose-3d":
        x = m.transpose(m.reshape(x, [9, 7, 3]), [2, 0, 1])
    elif kind == "slice":
        x = m.strided_slice(x, [0, 1, 0, 1], [1, 8, 7, 3], [1, 2, 3, 1])
    elif kind == "concat":
        y = m.conv_2d(x, 2, (1, 1), (1, 1), "SAME", "NONE", out_q=(x.scale, x.zero_point))
        x = m.concatenation([x, y], 3)
    elif kind == "concat-h":
        x = m.concatenation([x, x], 1)
    elif kind == "pad":
        x = m.pad(x, [[0, 0], [1, 2], [0, 1], [0, 0]])
    elif kind in ("RELU", "RELU6", "RELU_N1_TO_1"):
        x = m.relu(kind, x)
    elif kind == "requantize":
        x = m.requantize(x)
    elif kind == "flatten-fc-softmax":
        x = m.softmax(m.fully_connected(m.reshape(m.conv_2d(x, 4, (3, 3), (2, 2), "VALID", "RELU"), [1, -1]), 10))
    m.output(x)
    return m.finish()


KINDS = ["conv-SAME-NONE-1-pc", "conv-VALID-RELU-2-pc", "conv-SAME-RELU6-2-pt", "conv-VALID-RELU_N1_TO_1-1-pt",
         "dilated", "dw-SAME-RELU6-1", "dw-VALID-NONE-2", "fc-pt-NONE", "fc-pc-RELU", "fc-pt-RELU6", "add", "sub", "mul",
         "broadcast-add", "broadcast-mul", "broadcast-sub", "avg-SAME", "avg-VALID", "max-SAME", "max-VALID", "softmax",
         "softmax-4d", "transpose", "transpose-3d", "slice", "concat", "concat-h", "pad", "RELU", "RELU6",
         "RELU_N1_TO_1", "requantize", "flatten-fc-softmax"]


@pytest.mark.parametrize("kind", KINDS)
def test_operator_matches_litert(tmp_path, kind):
    assert_exact(tmp_path, _net(kind), samples=4)


@pytest.mark.parametrize("per_channel", [False, True])
def test_fully_connected_rounds_once_like_litert(tmp_path, per_channel):
    """LiteRT's reference FULLY_CONNECTED requantizes with one rounding (CMSIS-NN's kernel with two
    differs on ~1 output in 1,500 here): 1,200 outputs a sample, byte-exact, in Python and in C."""
    m = TfliteBuilder(5)
    x = m.input([4, 200], 0.05, 3)
    m.output(m.fully_connected(x, 300, "NONE", per_channel=per_channel))
    data = m.finish()
    prog = assert_exact(tmp_path, data, samples=10)
    node = next(n for n in prog.ep.graph.nodes if n.target == torch.ops.corten.quantized_linear.default)
    assert node.args[9] is True


UNARY = [("LOGISTIC", (1 / 256, -128), None, {}), ("TANH", (1 / 128, 0), None, {}),
         ("LEAKY_RELU", None, "LeakyReluOptions", {"Alpha": 0.1}), ("HARD_SWISH", None, None, {}),
         ("RELU", None, None, {}), ("RELU6", None, None, {}), ("RELU_N1_TO_1", None, None, {}),
         ("QUANTIZE", None, None, {})]


@pytest.mark.parametrize("code,out_q,options,fields", UNARY, ids=[u[0] for u in UNARY])
def test_elementwise_activation_tables_match_litert_on_every_int8_value(tmp_path, code, out_q, options, fields):
    """Every int8 input value, 6 random input quantizations: the table of TFLite's own arithmetic
    (LUTPopulate<int8_t> in float32 for LOGISTIC/TANH; the integer reference kernels of LEAKY_RELU,
    HARD_SWISH, ReluX and Requantize)."""
    q = np.arange(-128, 128, dtype=np.int8).reshape(1, 256)
    for seed in range(6):
        rng = np.random.default_rng(seed)
        m = TfliteBuilder(seed)
        x = m.input([1, 256], float(rng.uniform(0.005, 0.2)), int(rng.integers(-40, 41)))
        m.output(m.unary(code, x, out_q, options, **fields))
        data = m.finish()
        prog = corten.compile(str(_write(tmp_path, data)))
        got = tflite_output(prog.run_int8(tflite_input(prog, q))[0])
        assert np.array_equal(got, litert_outputs(data, [q])[0]), seed


REDUCTIONS = [(code, axes, keep) for code in ("MEAN", "REDUCE_MAX", "REDUCE_MIN")
              for axes, keep in (([1, 2], True), ([1, 2], False), ([3], False), ([1], False), ([2, 3], True))]


@pytest.mark.parametrize("code,axes,keep", REDUCTIONS)
def test_reductions_match_litert(tmp_path, code, axes, keep):
    """MEAN divides TFLite's Q31 multiplier by the element count in integers (QuantizedMeanOrSum)."""
    for seed in range(3):
        rng = np.random.default_rng(seed)
        m = TfliteBuilder(seed)
        x = m.input([1, 5, 7, 6], float(rng.uniform(0.01, 0.1)), int(rng.integers(-40, 41)))
        m.output(m.reduce(code, x, axes, keep))
        assert_exact(tmp_path, m.finish(), samples=2, seed=seed)


def _bmm_net(adj_x: bool, adj_y: bool, sa=(3, 16, 24), sb=(1, 24, 20)) -> bytes:
    sa, sb = list(sa), list(sb)
    if adj_x:
        sa = sa[:-2] + [sa[-1], sa[-2]]
    if adj_y:
        sb = sb[:-2] + [sb[-1], sb[-2]]
    m = TfliteBuilder(1)
    a, b = m.input(sa, 0.05, 3), m.input(sb, 0.07, -5)
    m.output(m.batch_matmul(a, b, adj_x, adj_y))
    return m.finish()


@pytest.mark.parametrize("adj_x", [False, True])
@pytest.mark.parametrize("adj_y", [False, True])
@pytest.mark.parametrize("shapes", [((2, 16, 24), (2, 24, 20)), ((16, 24), (24, 20)), ((3, 16, 24), (1, 24, 20))])
def test_batch_matmul_matches_litert(tmp_path, adj_x, adj_y, shapes):
    assert_exact(tmp_path, _bmm_net(adj_x, adj_y, *shapes), samples=2)


@needs_gcc
def test_batch_matmul_c_library_matches_litert(tmp_path):
    data = _bmm_net(True, True)
    prog = corten.compile(str(_write(tmp_path, data)))
    rng = np.random.default_rng(3)
    xs = [random_input(_tfl_shape(spec), rng) for spec in prog.inputs]
    run = prog.c_run(*[tflite_input(prog, x, k) for k, x in enumerate(xs)], on="host", kernels="portable")
    assert np.array_equal(tflite_output(run.outputs[0]), litert_outputs(data, xs)[0])


@pytest.mark.parametrize("op", ["ADD", "SUB", "MUL"])
def test_elementwise_on_large_tensors_matches_litert(tmp_path, op):
    m = TfliteBuilder(11)
    a = m.input([1, 32, 32, 8], 0.031, -9)
    b = m.conv_2d(a, 8, (1, 1), (1, 1), "SAME", "NONE")
    m.output(m.binary(op, a, b, "NONE"))
    assert_exact(tmp_path, m.finish(), samples=3)


@pytest.mark.parametrize("first", range(0, 200, 50))
def test_random_tflite_models_match_litert(tmp_path, first):
    """200 seeded random models, in 4 chunks (conv, depthwise, pools, add/sub/mul with broadcasting,
    pad, concat, relu, slice, requantize, logistic/tanh/hard-swish/leaky-relu, mean/reduce-max, fc,
    softmax; random scales, zero points, paddings, strides, fused activations): every output byte
    equals LiteRT's reference kernels.  Ten models share a .tflite file (independent inputs and
    outputs: one conversion each ten)."""
    for seeds in np.arange(first, first + 50).reshape(-1, 10):
        assert_exact(tmp_path, random_models(seeds), samples=2, seed=int(seeds[0]))


def test_one_random_model_alone_matches_litert(tmp_path):
    assert_exact(tmp_path, random_model(7), samples=2, seed=7)


# ----------------------------------------------------------------------------- C, budgets, refusals
def _c_matches(tmp_path, data, kernels, on="host", target=None, samples=3):
    prog = corten.compile(str(_write(tmp_path, data)))
    rng = np.random.default_rng(1)
    for _ in range(samples):
        q = random_input(_tfl_shape(prog.inputs[0]), rng)
        run = prog.c_run(tflite_input(prog, q), on=on, kernels=kernels, target=target)
        assert np.array_equal(tflite_output(run.outputs[0]), litert_outputs(data, [q])[0])


def _c_net() -> bytes:
    m = TfliteBuilder(2)
    x = m.input([1, 12, 10, 3], 0.043, -7)
    x = m.conv_2d(x, 6, (3, 3), (2, 2), "SAME", "RELU6")
    y = m.depthwise_conv_2d(x, 1, (3, 3), (1, 1), "SAME", "RELU")
    x = m.pool("MAX_POOL_2D", m.binary("ADD", x, y, "NONE"), (2, 2), (2, 2), "SAME")
    z = m.reduce("MEAN", m.unary("HARD_SWISH", x), [1, 2], False)
    x = m.fully_connected(m.reshape(x, [1, -1]), 40, "RELU", per_channel=True)
    x = m.concatenation([m.unary("LOGISTIC", x, (1 / 256, -128)),
                         m.unary("TANH", m.fully_connected(z, 8), (1 / 256, -128))], 1)
    m.output(m.softmax(m.fully_connected(x, 10)))
    return m.finish()


@needs_gcc
def test_tflite_program_c_library_matches_litert(tmp_path):
    _c_matches(tmp_path, _c_net(), "portable")


@needs_cmsis_nn
def test_tflite_program_cmsis_nn_library_matches_litert(tmp_path):
    """(FULLY_CONNECTED runs Corten's single-rounding kernel in the CMSIS-NN flavour too.)"""
    _c_matches(tmp_path, _c_net(), "cmsis-nn")


@needs_qemu
@needs_arm_gcc
def test_tflite_program_on_qemu_m4_matches_litert(tmp_path):
    _c_matches(tmp_path, _c_net(), "portable", on="qemu", target="cortex-m4", samples=1)


def test_tflite_save_load_and_cli_banding(tmp_path):
    from corten.cli import main

    m = TfliteBuilder(3)
    x = m.input([1, 24, 24, 3], 0.05, 2)
    x = m.conv_2d(x, 8, (3, 3), (1, 1), "SAME", "RELU")
    x = m.depthwise_conv_2d(x, 1, (3, 3), (1, 1), "SAME", "RELU6")
    x = m.conv_2d(x, 8, (3, 3), (2, 2), "SAME", "RELU")
    m.output(m.pool("AVERAGE_POOL_2D", x, (12, 12), (12, 12), "VALID"))
    data = m.finish()
    path = _write(tmp_path, data, "banded.tflite")
    prog = corten.compile(str(path))
    full = prog.memory_for("portable").arena_bytes
    budget = int(full * 0.75)
    banded = corten.compile(str(path), max_arena=budget, kernels="portable")
    assert banded.schedule is not None and banded.memory_for("portable").arena_bytes <= budget
    q = random_input((1, 24, 24, 3), np.random.default_rng(0))
    ref = litert_outputs(data, [q])[0]
    assert np.array_equal(tflite_output(banded.run_int8(tflite_input(banded, q))[0]), ref)
    banded.save(tmp_path / "saved")
    again = corten.load(tmp_path / "saved")
    assert np.array_equal(tflite_output(again.run_int8(tflite_input(again, q))[0]), ref)
    code = main(["compile", str(path), "--out", str(tmp_path / "out"), "--max-arena", str(budget),
                 "--kernels", "portable"])
    assert code == 0
    assert "budget: fits" in (tmp_path / "out" / "report.txt").read_text() or \
        (tmp_path / "out" / "manifest.json").exists()


def test_unsupported_operator_is_refused_by_name(tmp_path):
    m = TfliteBuilder(0)
    x = m.input([1, 4, 4, 2], 0.05, 0)
    y = m.act([1, 4, 4, 2], 1.0 / 256, -128)
    m.op("LOG_SOFTMAX", [x], [y], None)
    m.output(y)
    with pytest.raises(ModelFileError) as e:
        corten.compile(str(_write(tmp_path, m.finish(), "bad.tflite")))
    msg = str(e.value)
    assert "bad.tflite" in msg and "operator 0 (LOG_SOFTMAX" in msg and "'t0'" in msg and "'t1'" in msg


def test_not_a_tflite_file_and_calibration_refused(tmp_path):
    bad = tmp_path / "x.tflite"
    bad.write_bytes(b"not a model at all")
    with pytest.raises(ModelFileError, match="TFL3"):
        corten.compile(str(bad))
    good = _write(tmp_path, _net("RELU"), "ok.tflite")
    with pytest.raises(UsageError, match="own int8"):
        corten.compile(str(good), calibration=torch.zeros(2, 3, 9, 7))


def test_cli_compiles_a_tflite_model_and_runs_its_c_library(tmp_path, capsys):
    from corten.cli import main

    path = _write(tmp_path, _net("flatten-fc-softmax"), "net.tflite")
    assert main(["compile", str(path), "--out", str(tmp_path / "out"), "--target", "cortex-m4"]) == 0
    out = capsys.readouterr().out
    assert "its own int8 quantization (TFLite)" in out and "corten.quantized_conv2d" in out
    assert (tmp_path / "out" / "manifest.json").exists()
    assert main(["compile", str(path), "--out", str(tmp_path / "o2"), "--compare"]) == 2  # no float model to compare


def test_cli_refuses_an_unsupported_tflite_operator(tmp_path, capsys):
    from corten.cli import main

    m = TfliteBuilder(0)
    x = m.input([1, 4, 4, 2], 0.05, 0)
    y = m.act([1, 4, 4, 2], 0.05, 0)
    m.op("SQUARE", [x], [y], None)
    m.output(y)
    assert main(["compile", str(_write(tmp_path, m.finish(), "sq.tflite")), "--out", str(tmp_path / "o")]) == 2
    assert "operator 0 (SQUARE" in capsys.readouterr().err


def _net16(kind: str, seed: int) -> bytes:
    from tflite_builder import INT16

    m = TfliteBuilder(seed)
    m.act_type = INT16
    x = m.input([1, 9, 7, 3], 0.0004, 0)
    if kind == "conv":
        x = m.conv_2d(x, 5, (3, 3), (2, 1), "SAME", "RELU", per_channel=seed % 2 == 0)
    elif kind == "dw":
        x = m.depthwise_conv_2d(x, 2, (3, 3), (1, 2), "VALID", "RELU6")
    elif kind == "conv-dw":
        x = m.depthwise_conv_2d(m.conv_2d(x, 4, (1, 1), (1, 1), "VALID", "NONE"), 1, (3, 3), (1, 1), "SAME", "NONE")
    else:  # fc: refused
        x = m.fully_connected(m.reshape(x, [9, 21]), 4)
    m.output(x)
    return m.finish()


@pytest.mark.parametrize("kind", ["conv", "dw", "conv-dw"])
def test_16x8_convolutions_match_litert(tmp_path, kind):
    """int16 activations (zero point 0), int8 per-channel weights, int64 biases."""
    for seed in range(3):
        data = _net16(kind, seed)
        prog = corten.compile(str(_write(tmp_path, data)))
        rng = np.random.default_rng(seed)
        for _ in range(2):
            q = rng.integers(-32768, 32768, (1, 9, 7, 3), dtype=np.int16)
            got = tflite_output(prog.run_int8(tflite_input(prog, q))[0])
            assert got.dtype == np.int16 and np.array_equal(got, litert_outputs(data, [q])[0])


@needs_gcc
def test_16x8_convolution_c_library_matches_litert(tmp_path):
    data = _net16("conv-dw", 1)
    prog = corten.compile(str(_write(tmp_path, data)))
    q = np.random.default_rng(0).integers(-32768, 32768, (1, 9, 7, 3), dtype=np.int16)
    run = prog.c_run(tflite_input(prog, q), on="host", kernels="portable")
    assert np.array_equal(tflite_output(run.outputs[0]), litert_outputs(data, [q])[0])


def test_16x8_fully_connected_is_refused(tmp_path):
    with pytest.raises(ModelFileError, match=r"operator 1 \(FULLY_CONNECTED.*int16 \(the 16x8 scheme\)"):
        corten.compile(str(_write(tmp_path, _net16("fc", 0))))
