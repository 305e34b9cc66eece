"""Compatibility alias: the quantization-parameter math moved to :mod:`corten.ops._qparams`."""
from corten.ops._qparams import (
    ADD_LEFT_SHIFT,
    AddParams,
    QParams,
    activation_range,
    add_params,
    per_channel_multipliers,
    quantize_value,
)

__all__ = ["ADD_LEFT_SHIFT", "AddParams", "QParams", "activation_range", "add_params", "per_channel_multipliers",
           "quantize_value"]
