"""TFLite's int16 lookup tables with linear interpolation (the 16x8 nonlinearities: ``quantized_lut`` on
int16 activations, the exp and 1/(1+x) tables of the int16 ``quantized_softmax``).

A table has 513 int16 entries over the whole int16 input range; an input ``q`` reads entry
``256 + (q >> 7)`` and the next one, and interpolates on its low 7 bits (TFLite's
``lut_lookup_with_interpolation``, ``tensorflow/lite/kernels/internal/common.h``)::

    index = 256 + (q >> 7)              # arithmetic shift: 0 .. 511
    delta = ((lut[index + 1] - lut[index]) * (q & 0x7f) + 64) >> 7
    y     = lut[index] + delta

TFLite narrows the slope ``lut[index + 1] - lut[index]`` to int16; Corten keeps it in int32, which
gives the same value whenever adjacent entries differ by at most 32767 (every smooth function:
TFLite's result wraps for steeper steps, Corten's stays between the two entries).

:func:`populate` is TFLite's ``LUTPopulate<int16_t>`` (``LUTPopulateInt16<float>``) step by step in
float32, as TFLite computes it (every ``+``, ``*``, ``/`` and ``round`` on float32 values; the
function evaluated in float64 on the float32 argument and rounded to float32, i.e. a correctly
rounded float32 function): 512 samples from ``input_min = s_in * (-32768 - zp_in)`` to
``input_max = s_in * (32767 - zp_in)`` in steps of ``(input_max - input_min) / 512``, scaled by
``65536 / (output_max - output_min)`` (TFLite maps the int16 output range onto 65536 steps, so
the scale is ``65535 / 65536`` of ``s_out``), each entry biased by half the error of the
interpolated midpoint, and the last entry ``f(input_max)``::

    sample   = round(f(x_i) * inv)
    interp   = round((f(x_{i+1}) * inv + sample) / 2)
    bias     = round((interp - round(f(x_i + step / 2) * inv)) / 2)
    lut[i]   = clamp(sample - bias, -32768, 32767)

(``round`` ties away from zero, C's ``round``.)  The softmax tables generated this way equal
CMSIS-NN's ``Tests/UnitTest/TestCases/Common/Softmax`` tables entry for entry (the ``double``
``gen_lut`` of TFLite 2.6 differs from them in two entries of the 1/(1+x) table).  Where TFLite's
arithmetic meets an infinite value (``inf - inf`` in the bias), Corten takes a bias of 0; a NaN
sample is refused.
"""
from __future__ import annotations

from typing import Callable

import torch

from corten.fixed_point import round_half_away_t

LUT16_SIZE = 513
LUT16_STEPS = 512
_F32 = torch.float32


def _round32(v: torch.Tensor) -> torch.Tensor:
    """C's ``std::round`` on float32 values (ties away from zero), result float32."""
    return round_half_away_t(v).to(_F32)


def populate(fn: Callable[[torch.Tensor], torch.Tensor], input_scale: float, input_zero_point: int,
             output_scale: float, output_zero_point: int) -> torch.Tensor:
    """The int16 [513] table of ``fn`` (float64 tensor -> float64 tensor, elementwise) between the
    input and output quantizations, as TFLite's ``LUTPopulate<int16_t>`` computes it (see the module
    docstring).  ValueError for a non-positive scale or a NaN value of ``fn``."""
    for what, s in (("input", input_scale), ("output", output_scale)):
        if not (torch.isfinite(torch.tensor(float(s))) and float(s) > 0):
            raise ValueError(f"int16 table: {what} scale must be finite and > 0, got {s!r}")
    s_in = torch.tensor(float(input_scale), dtype=_F32)
    s_out = torch.tensor(float(output_scale), dtype=_F32)
    f32 = lambda v: torch.tensor(float(v), dtype=_F32)  # noqa: E731  (an int converted as C converts it)
    input_min = s_in * f32(-32768 - int(input_zero_point))
    input_max = s_in * f32(32767 - int(input_zero_point))
    output_min = s_out * f32(-32768 - int(output_zero_point))
    output_max = s_out * f32(32767 - int(output_zero_point))
    step = (input_max - input_min) / f32(LUT16_STEPS)
    half_step = step / f32(2)
    inv = f32(65536) / (output_max - output_min)

    i = torch.arange(LUT16_STEPS, dtype=_F32)
    x = input_min + i * step
    x_mid = input_min + i * step + half_step
    x_next = input_min + (i + 1) * step

    def f(v: torch.Tensor) -> torch.Tensor:
        y = fn(v.to(torch.float64))
        if not isinstance(y, torch.Tensor) or y.shape != v.shape:
            raise ValueError("int16 table: the function must map each input value to one output value")
        return y.to(torch.float64).to(_F32)

    val, val_mid, val_next = f(x), f(x_mid), f(x_next)
    last = f(input_max.reshape(1))
    if torch.isnan(torch.cat([val, val_mid, val_next, last])).any():
        raise ValueError("int16 table: the function gives NaN for some int16 input value")
    sample = _round32(val * inv)
    interp = _round32((val_next * inv + sample) / f32(2))
    bias = _round32((interp - _round32(val_mid * inv)) / f32(2))
    bias = torch.where(torch.isnan(bias), torch.zeros_like(bias), bias)
    entries = (sample - bias).clamp(-32768.0, 32767.0)
    end = _round32(last * inv).clamp(-32768.0, 32767.0)
    return torch.cat([entries, end]).to(torch.int16)


def lookup(values: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """``lut_lookup_with_interpolation`` of int16 ``values`` (any integer dtype holding int16
    values) in an int16 [513] ``table``; int64 result."""
    v = values.to(torch.int64)
    t = table.to(torch.int64)
    index = 256 + (v >> 7)
    base = t[index]
    slope = t[index + 1] - base
    return base + ((slope * (v & 0x7F) + 64) >> 7)
