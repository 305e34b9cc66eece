"""Corten: compile PyTorch models to bit-exact int8 programs for Arm Cortex-M (CMSIS-NN)."""
from corten import ops  # noqa: F401  (registers the corten:: ops)
from corten import codegen  # noqa: F401  (registers the kernel provider kernels="generated")
from corten.deployment import ArenaRegion, Deployment  # noqa: F401  (core, kernel providers, board, budgets, memory regions)
from corten.errors import (  # noqa: F401  (``except corten.CortenError`` catches every refusal)
    BudgetError, CortenError, QuantizationError, QuantizationWarning, UnsupportedOpsError, UsageError)

__version__ = "0.1.0"


def compile(model, example_inputs=None, target="cortex-m55", calibration=None, seed=0, **kwargs):
    """See :func:`corten.compiler.compile`.  ``model`` may also be the path of an int8 ``.tflite`` model
    (converted with its own quantization, :mod:`corten.frontends.tflite`; no example inputs or
    calibration) or of a float ``.onnx`` model (converted to torch, then compiled as a module; the
    example inputs default to zeros of the ONNX input shapes)."""
    from corten.compiler import compile as _compile
    from corten.frontends import model_format

    kind = model_format(model)
    if kind == "tflite":
        from corten.frontends.tflite import compile_tflite

        return compile_tflite(model, target=target, example_inputs=example_inputs, calibration=calibration,
                              **kwargs)
    if kind == "onnx":
        from corten.frontends.onnx import onnx_module

        model, default_inputs = onnx_module(model)
        example_inputs = default_inputs if example_inputs is None else example_inputs
    if example_inputs is None:
        from corten.errors import UsageError

        raise UsageError("corten.compile(model, example_inputs): example inputs are needed for an nn.Module")
    return _compile(model, example_inputs, target=target, calibration=calibration, seed=seed, **kwargs)


def prepare_qat(model, example_inputs, target="cortex-m55", weights="int8"):
    """See :func:`corten.quantizer.qat.prepare_qat`: a module to fine-tune, then ``corten.compile``
    (``weights="int4"`` or a dict: those layers train and compile with int4 weights)."""
    from corten.quantizer.qat import prepare_qat as _prepare_qat

    return _prepare_qat(model, example_inputs, target=target, weights=weights)


def weights_report(prog):
    """See :func:`corten.program.weights_report`: flash per layer and per weight width."""
    from corten.program import weights_report as _weights_report

    return _weights_report(prog)


def convert_qat(qat_module):
    """See :func:`corten.quantizer.qat.convert_qat` (``corten.compile`` calls it for you)."""
    from corten.quantizer.qat import convert_qat as _convert_qat

    return _convert_qat(qat_module)


def load(path):
    """See :func:`corten.program.load`."""
    from corten.program import load as _load

    return _load(path)
