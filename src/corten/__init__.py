"""Corten: compile PyTorch models to bit-exact int8 programs for Arm Cortex-M (CMSIS-NN)."""
from corten import ops  # noqa: F401  (registers the corten:: ops)

__version__ = "0.1.0"


def compile(model, example_inputs, target="cortex-m55", calibration=None, seed=0, **kwargs):
    """See :func:`corten.compiler.compile`."""
    from corten.compiler import compile as _compile

    return _compile(model, example_inputs, target=target, calibration=calibration, seed=seed, **kwargs)


def load(path):
    """See :func:`corten.program.load`."""
    from corten.program import load as _load

    return _load(path)
