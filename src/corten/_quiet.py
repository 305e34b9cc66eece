"""Silence the import-time noise of torchao, and nothing else.

Importing torchao logs two "Failed to load .../torchao/_C_*.so" lines (CUDA-only extensions that a
CPU install cannot load; torchao runs without them) and makes torch's pytree log a deprecation
about torchao's own enum registration.  Neither concerns a Corten user.  :func:`quiet_torchao_import`
drops exactly those log records while torchao is first imported; every other message - and every
message after the import - is untouched.  No global logging or warnings state is changed.
"""
from __future__ import annotations

import contextlib
import logging
import re
from collections.abc import Iterator

_NOISE = (
    ("torchao", re.compile(r"^Failed to load .*torchao.*\.so")),
    ("torch.utils._pytree", re.compile(r"is an Enum subclass and is now natively supported")),
)


class _DropNoise(logging.Filter):
    def __init__(self, pattern: re.Pattern) -> None:
        super().__init__()
        self.pattern = pattern

    def filter(self, record: logging.LogRecord) -> bool:
        return not self.pattern.search(record.getMessage())


@contextlib.contextmanager
def quiet_torchao_import() -> Iterator[None]:
    """Context manager: import torchao modules inside it without its known import-time log noise."""
    installed = []
    for name, pattern in _NOISE:
        logger, filt = logging.getLogger(name), _DropNoise(pattern)
        logger.addFilter(filt)
        installed.append((logger, filt))
    try:
        yield
    finally:
        for logger, filt in installed:
            logger.removeFilter(filt)
