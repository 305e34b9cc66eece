"""Corten: compile PyTorch models to bit-exact int8 programs for Arm Cortex-M (CMSIS-NN)."""
from corten import ops  # noqa: F401  (registers the corten:: ops)

__version__ = "0.1.0"
