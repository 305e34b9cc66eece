"""Shared test setup: make ``tests/naive.py`` importable as ``naive`` whatever the import mode."""
import os
import sys

_TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
if _TESTS_DIR not in sys.path:
    sys.path.insert(0, _TESTS_DIR)

# Small models run faster on one intra-op thread than on two contended ones; the QEMU and C
# builds the suite starts use the other core.
import torch  # noqa: E402

torch.set_num_threads(1)
