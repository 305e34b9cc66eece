"""Shared test setup: make ``tests/naive.py`` importable as ``naive`` whatever the import mode."""
import os
import sys

_TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
if _TESTS_DIR not in sys.path:
    sys.path.insert(0, _TESTS_DIR)
