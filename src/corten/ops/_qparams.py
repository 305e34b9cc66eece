"""Quantization-parameter math done ahead of time by the lowering rules (pure functions).

Part of the rule API below the op families (see :mod:`corten.ops._rules`)."""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from corten.fixed_point import int_range, quantize_multiplier, round_half_away

ADD_LEFT_SHIFT = 20  # TFLite's left shift for int8 add: 255 << 20 still fits in int32
ADD_LEFT_SHIFT_S16 = 15  # TFLite's for the 16x8 add (input_scale/output_scale not powers of two): 32767 << 15 fits


@dataclass(frozen=True)
class QParams:
    """Per-tensor affine parameters: ``real = scale * (q - zero_point)``; ``dtype`` int8 (asymmetric)
    or int16 (TFLite's 16x8 scheme: symmetric, zero point 0, range [-32768, 32767])."""

    scale: float
    zero_point: int
    dtype: torch.dtype = torch.int8

    @property
    def qmin(self) -> int:
        return int_range(self.dtype)[0]

    @property
    def qmax(self) -> int:
        return int_range(self.dtype)[1]

    @property
    def offset(self) -> int:
        """CMSIS-NN's input offset: the negated zero point."""
        return -self.zero_point


def quantize_value(x: float, q: QParams) -> int:
    """A real value on the integer grid of ``q``, saturated (TFLite ``CalculateActivationRangeQuantized``)."""
    if math.isinf(x):
        return q.qmax if x > 0 else q.qmin
    v = q.zero_point + round_half_away(x / q.scale)
    return max(q.qmin, min(q.qmax, v))


def activation_range(q: QParams, lo: float | None, hi: float | None) -> tuple[int, int]:
    """``[activation_min, activation_max]`` on ``q``'s grid of a fused clamp to ``[lo, hi]`` (None: unbounded)."""
    amin = q.qmin if lo is None else quantize_value(lo, q)
    amax = q.qmax if hi is None else quantize_value(hi, q)
    return amin, amax


def per_channel_multipliers(input_scale: float, weight_scales: torch.Tensor,
                            output_scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``input_scale * weight_scale[c] / output_scale`` -> int32 multiplier and shift tensors.

    The effective scale is formed in float64 from the float32 scales, as TFLite does in double.
    """
    mults, shifts = [], []
    for ws in weight_scales.to(torch.float64).tolist():
        m, s = quantize_multiplier(float(input_scale) * ws / float(output_scale))
        mults.append(m)
        shifts.append(s)
    return torch.tensor(mults, dtype=torch.int32), torch.tensor(shifts, dtype=torch.int32)


@dataclass(frozen=True)
class AddParams:
    input1_multiplier: int
    input1_shift: int
    input2_multiplier: int
    input2_shift: int
    output_multiplier: int
    output_shift: int
    left_shift: int = ADD_LEFT_SHIFT


def add_params(s1: float, s2: float, s_out: float, left_shift: int = ADD_LEFT_SHIFT) -> AddParams:
    """TFLite ADD preparation: both inputs rescaled to ``2 * max(s1, s2)`` after a left shift
    (:data:`ADD_LEFT_SHIFT` int8, :data:`ADD_LEFT_SHIFT_S16` for the 16x8 add)."""
    twice_max = 2.0 * max(s1, s2)
    m1, sh1 = quantize_multiplier(s1 / twice_max)
    m2, sh2 = quantize_multiplier(s2 / twice_max)
    mo, sho = quantize_multiplier(twice_max / ((1 << left_shift) * s_out))
    return AddParams(m1, sh1, m2, sh2, mo, sho, left_shift)


def requantize_args(q_in: QParams, q_out: QParams, src) -> tuple:
    """The arguments of ``quantized_requantize(src, ...)`` from ``q_in``'s grid to ``q_out``'s (TFLite's
    Requantize: ``out = zp_out + MultiplyByQuantizedMultiplier(q - zp_in, s_in / s_out)``)."""
    mult, shift = quantize_multiplier(float(q_in.scale) / float(q_out.scale))
    return (src, -q_in.zero_point, q_out.zero_point, mult, shift, 16 if q_out.dtype == torch.int16 else 8)

def scale_input(x: torch.Tensor, s: torch.Tensor, o: torch.Tensor) -> torch.Tensor:
    """The per-feature input map before the quantize (``compile(..., input_scaling="per_feature")``,
    :mod:`corten.quantizer.input_scaling`): ``x / s + o`` in float32, in this order - the one
    formula, which the C header's ``<name>_scale_input`` computes alike."""
    return x.to(torch.float32) / s + o
