"""Compatibility alias: the rule API moved below the op families, to :mod:`corten.ops._rules`.

New code (and every op family) imports from :mod:`corten.ops._rules` directly.
"""
from corten.errors import LoweringError
from corten.ops._rules import (ACTIVATIONS, DQ_PER_CHANNEL, DQ_PER_TENSOR, Q_PER_TENSOR, Int8Value, Match,
                                qparams_of, source_location)

__all__ = ["ACTIVATIONS", "DQ_PER_CHANNEL", "DQ_PER_TENSOR", "Int8Value", "LoweringError", "Match", "Q_PER_TENSOR",
           "qparams_of", "source_location"]
