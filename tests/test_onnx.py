"""Float ONNX models through the PyTorch pipeline: ``corten.compile("x.onnx", example_inputs)`` converts
with onnx2torch and compiles the module (quantization with calibration); three zoo models exported to
ONNX compile to the same op counts as the PyTorch model, with the same bytes, and their C library
reproduces them on the host."""
from __future__ import annotations

import importlib.util
import warnings

import pytest
import torch

pytest.importorskip("onnx")
if importlib.util.find_spec("onnx2torch") is None:  # (importing it needs Corten's torchvision stand-in)
    pytest.skip("onnx2torch is not installed", allow_module_level=True)

import corten  # noqa: E402
from conftest import needs_gcc  # noqa: E402
from corten.errors import ModelFileError  # noqa: E402
from corten.zoo import get_model  # noqa: E402


def _export(model, example, path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, example, str(path), dynamo=False)


@needs_gcc
@pytest.mark.slow
@pytest.mark.parametrize("name", ["ds-cnn", "resnet8", "mv1-0.25-96", "deep-ae"])
def test_onnx_zoo_model_compiles_like_pytorch(tmp_path, name):
    model, example = get_model(name)
    example = example if isinstance(example, tuple) else (example,)
    path = tmp_path / f"{name}.onnx"
    _export(model, example, path)
    calib = [tuple(torch.randn_like(x) for x in example) for _ in range(4)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref = corten.compile(model, example, calibration=calib, seed=0)
        prog = corten.compile(str(path), example, calibration=calib, seed=0)
    assert prog.op_counts() == ref.op_counts()
    assert not prog.unlowered_ops()
    x = calib[0]
    assert all(torch.equal(a, b) for a, b in zip(prog.run_int8(*x), ref.run_int8(*x)))
    run = prog.c_run(*x, on="host", kernels="portable")
    assert all(torch.equal(a, b) for a, b in zip(run.outputs, prog.run_int8(*x)))


def test_onnx_example_inputs_default_to_the_model_shapes(tmp_path):
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU(), torch.nn.Flatten(),
                                torch.nn.Linear(4 * 6 * 6, 5)).eval()
    path = tmp_path / "small.onnx"
    _export(model, (torch.zeros(1, 3, 8, 8),), path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        prog = corten.compile(str(path))
    assert prog.inputs[0].shape == (1, 3, 8, 8)
    assert prog.op_counts()["quantized_conv2d"] == 1 and prog.op_counts()["quantized_linear"] == 1


def test_not_an_onnx_file_is_refused(tmp_path):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"\x00garbage")
    with pytest.raises(ModelFileError, match="bad.onnx"):
        corten.compile(str(bad))
