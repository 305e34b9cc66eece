"""Run generated C model libraries on the host and on QEMU-emulated Cortex-M boards."""
from .common import (
    CBuildError,
    CRunError,
    CRunnerError,
    CRunResult,
    CRunTimeout,
    harness_defines,
)
from .host import run_on_host
from .qemu import BOARDS, Board, UnsupportedTargetError, board_for, run_on_qemu, runnable_targets

__all__ = [
    "BOARDS",
    "Board",
    "CBuildError",
    "CRunError",
    "CRunResult",
    "CRunTimeout",
    "CRunnerError",
    "UnsupportedTargetError",
    "board_for",
    "harness_defines",
    "run_on_host",
    "run_on_qemu",
    "runnable_targets",
]
