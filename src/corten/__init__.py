"""Corten: compile PyTorch models to bit-exact int8 programs for Arm Cortex-M (CMSIS-NN)."""
from corten import ops  # noqa: F401  (registers the corten:: ops)
from corten.errors import QuantizationWarning  # noqa: F401

__version__ = "0.1.0"


def compile(model, example_inputs, target="cortex-m55", calibration=None, seed=0, **kwargs):
    """See :func:`corten.compiler.compile`."""
    from corten.compiler import compile as _compile

    return _compile(model, example_inputs, target=target, calibration=calibration, seed=seed, **kwargs)


def prepare_qat(model, example_inputs, target="cortex-m55"):
    """See :func:`corten.quantizer.qat.prepare_qat`: a module to fine-tune, then ``corten.compile``."""
    from corten.quantizer.qat import prepare_qat as _prepare_qat

    return _prepare_qat(model, example_inputs, target=target)


def convert_qat(qat_module):
    """See :func:`corten.quantizer.qat.convert_qat` (``corten.compile`` calls it for you)."""
    from corten.quantizer.qat import convert_qat as _convert_qat

    return _convert_qat(qat_module)


def load(path):
    """See :func:`corten.program.load`."""
    from corten.program import load as _load

    return _load(path)
