"""Fixed-point arithmetic of CMSIS-NN's int8 kernels (TFLite int8 spec), as small pure functions.

Every function here mirrors one C function of CMSIS-NN's ``arm_nnsupportfunctions.h`` bit for bit,
including two's-complement wrap-around where the C code wraps.  The vectorised forms take and
return ``torch.int64`` tensors that hold int32 values; the scalar forms take Python ints.  No
float arithmetic is used on the integer path: the float functions are
:func:`quantize_multiplier` and the float -> integer rounding :func:`round_half_away` /
:func:`round_half_away_t` (the edge quantize op, and the compiler ahead of time).

Conventions (as in CMSIS-NN):

* a real scale ``s`` is represented as ``multiplier * 2**(shift - 31)`` with ``multiplier`` in
  ``[2**30, 2**31 - 1]`` (or 0) and ``shift`` in ``[-31, 30]``; positive shift means left shift.
* ``requantize`` is CMSIS-NN's default *double rounding*: a rounding doubling high multiply
  (ties towards +inf) followed by a rounding right shift (ties away from zero).  With
  ``single_rounding=True`` it is the ``CMSIS_NN_USE_SINGLE_ROUNDING`` variant (one rounding, ties
  towards +inf).
"""
from __future__ import annotations

import math

import torch

from corten.errors import QuantizationError

INT32_MIN = -(2**31)
INT32_MAX = 2**31 - 1
INT8_MIN = -128
INT8_MAX = 127
INT16_MIN = -(2**15)
INT16_MAX = 2**15 - 1
# int8 x int8 products, input offset applied, are at most 128 * 255 = 32,640 in magnitude: 65,792 of them
# always fit an int32 sum (2**31 // 32640), more may overflow.  The one limit of the overflow checks.
MAX_ACCUMULATOR_TAPS = 65792
REDUCED_SHIFT_MAX = 14  # arm_nn_requantize_s64 shifts by 14 - shift: the s16 kernels need shift <= 14
SHIFT_MIN = -31
SHIFT_MAX = 30


class ScaleError(QuantizationError):
    """A real scale CMSIS-NN's multiplier/shift pair cannot represent (shift above 30, negative,
    NaN or infinite); the lowering turns it into a QuantizationError naming the node."""


# ----------------------------------------------------------------------------- scalar helpers
def wrap_int32(x: int) -> int:
    """Two's-complement wrap of a Python int to int32 (what a C cast or overflowing shift does)."""
    return ((x + 2**31) & 0xFFFFFFFF) - 2**31


def round_half_away(x: float) -> int:
    """Round half away from zero (C's ``round``, TFLite's ``TfLiteRound``), exactly:
    ``floor(|x| + 0.5)`` would round 0.49999999999999994 up to 1."""
    a = abs(x)
    r = math.floor(a)
    if a - r >= 0.5:  # exact: a - floor(a) is representable
        r += 1
    return int(math.copysign(r, x))


def round_half_away_t(v: torch.Tensor) -> torch.Tensor:
    """:func:`round_half_away` on a float tensor, computed in float64 (exact for float32 and
    float64 inputs); returns float64 integral values."""
    v = v.to(torch.float64)
    a = v.abs()
    whole = torch.floor(a)
    return torch.sign(v) * (whole + (a - whole >= 0.5).to(torch.float64))


def quantize_multiplier(scale: float) -> tuple[int, int]:
    """Real ``scale`` -> ``(multiplier, shift)`` with ``scale ~= multiplier * 2**(shift - 31)``.

    TFLite's ``QuantizeMultiplier``: ``frexp`` splits the scale into a fraction in [0.5, 1) and an
    exponent; the fraction is rounded (half away from zero) to Q31.  A fraction that rounds up to
    2**31 is renormalised.  Scales too small to represent (exponent below -31, i.e. scale < 2**-32)
    *underflow explicitly* to ``(0, 0)``: the requantized value is then exactly 0, which is the
    correctly rounded result for any int32 accumulator.  Zero maps to ``(0, 0)``.  Negative, NaN,
    infinite scales, and scales of 2**30 or more (shift above 30, outside CMSIS-NN's range), raise.
    """
    if not math.isfinite(scale) or scale < 0:
        raise ScaleError(f"quantize_multiplier: scale must be finite and >= 0, got {scale!r}")
    if scale == 0.0:
        return 0, 0
    frac, exp = math.frexp(scale)
    q = int(math.floor(abs(frac) * 2**31 + 0.5))  # exact: frac*2**31 is exact in float64
    if q == 2**31:
        q //= 2
        exp += 1
    if exp < SHIFT_MIN:
        return 0, 0
    if exp > SHIFT_MAX:
        raise ScaleError(
            f"quantize_multiplier: scale {scale!r} needs shift {exp} > {SHIFT_MAX}; "
            "CMSIS-NN cannot represent it (check the quantization parameters)"
        )
    return q, exp


def quantize_multiplier_smaller_than_one(scale: float) -> tuple[int, int]:
    """As :func:`quantize_multiplier`, but refuses scales >= 1 (TFLite's variant for outputs)."""
    if scale >= 1.0:
        raise ValueError(f"scale {scale!r} must be < 1")
    return quantize_multiplier(scale)


def doubling_high_mult_no_sat_scalar(m1: int, m2: int) -> int:
    """``arm_nn_doubling_high_mult_no_sat``: ``(m1*m2 + 2**30) >> 31`` cast to int32 (ties to +inf)."""
    return wrap_int32((m1 * m2 + (1 << 30)) >> 31)


def saturating_rounding_doubling_high_mul_scalar(m1: int, m2: int) -> int:
    """``arm_nn_doubling_high_mult``: rounding with a sign-dependent nudge, division truncating
    towards zero, and INT32_MIN * INT32_MIN saturating to INT32_MAX."""
    if m1 == m2 == INT32_MIN:
        return INT32_MAX
    nudge = (1 << 30) if (m1 < 0) == (m2 < 0) else 1 - (1 << 30)
    p = m1 * m2 + nudge
    q = abs(p) >> 31
    return wrap_int32(q if p >= 0 else -q)


def divide_by_power_of_two_scalar(dividend: int, exponent: int) -> int:
    """``arm_nn_divide_by_power_of_two``: rounding arithmetic right shift, ties away from zero."""
    if not 0 <= exponent <= 31:
        raise ValueError(f"exponent {exponent} outside [0, 31]")
    mask = (1 << exponent) - 1
    remainder = dividend & mask
    result = dividend >> exponent
    threshold = (mask >> 1) + (1 if result < 0 else 0)
    return result + (1 if remainder > threshold else 0)


def requantize_scalar(val: int, multiplier: int, shift: int, single_rounding: bool = False) -> int:
    """``arm_nn_requantize`` on one int32 value."""
    if single_rounding:
        total_shift = 31 - shift
        r = (val * multiplier) >> (total_shift - 1)
        return wrap_int32((r + 1) >> 1)
    left = shift if shift > 0 else 0
    right = -shift if shift < 0 else 0
    return divide_by_power_of_two_scalar(
        doubling_high_mult_no_sat_scalar(wrap_int32(val << left), multiplier), right
    )


# ----------------------------------------------------------------------------- vectorised forms
def wrap_int32_t(x: torch.Tensor) -> torch.Tensor:
    """Two's-complement wrap of an int64 tensor to the int32 range (kept in int64).

    torch's int64 -> int32 conversion keeps the low 32 bits (a C++ ``static_cast``), which is
    exactly the wrap; two conversions are cheaper than the add/mask/subtract formulation."""
    return x.to(torch.int32).to(torch.int64)


def doubling_high_mult_no_sat(m1: torch.Tensor, m2: torch.Tensor | int) -> torch.Tensor:
    """Vectorised ``arm_nn_doubling_high_mult_no_sat``; inputs int32 values held in int64."""
    # |m1*m2| <= 2**62, so the int64 product and the +2**30 cannot overflow.
    return wrap_int32_t((m1 * m2 + (1 << 30)) >> 31)


def saturating_rounding_doubling_high_mul(m1: torch.Tensor, m2: torch.Tensor | int) -> torch.Tensor:
    """Vectorised ``arm_nn_doubling_high_mult`` (saturating INT32_MIN * INT32_MIN)."""
    m2 = torch.as_tensor(m2, dtype=torch.int64)
    same_sign = (m1 < 0) == (m2 < 0)
    p = m1 * m2 + torch.where(same_sign, 1 << 30, 1 - (1 << 30))
    q = torch.where(p >= 0, p >> 31, -((-p) >> 31))  # C's truncating division by 2**31
    out = wrap_int32_t(q)
    return torch.where((m1 == INT32_MIN) & (m2 == INT32_MIN), torch.full_like(out, INT32_MAX), out)


def divide_by_power_of_two(dividend: torch.Tensor, exponent: torch.Tensor | int) -> torch.Tensor:
    """Vectorised ``arm_nn_divide_by_power_of_two`` (exponent in [0, 31], scalar or per element)."""
    return _divide_by_power_of_two_(dividend.to(torch.int64, copy=True), exponent)


def _divide_by_power_of_two_(x: torch.Tensor, exponent: torch.Tensor | int) -> torch.Tensor:
    """In-place form of :func:`divide_by_power_of_two` on an int64 tensor of int32 values.

    The C code's ``floor + (remainder > threshold)`` with ties away from zero is, for ``e >= 1``,
    ``floor((x + 2**(e-1) - [x < 0]) / 2**e)``: for ``x >= 0`` the carry comes exactly when the
    remainder reaches ``2**(e-1)``, for ``x < 0`` only when it exceeds it.  ``e == 0`` is the
    identity.  Fewer passes over the data than the C formulation, same integers.
    """
    if isinstance(exponent, int):
        if exponent == 0:
            return x
        negative = x >> 63  # -1 where x < 0, else 0
        x += (1 << exponent) >> 1
        x += negative
        return x.bitwise_right_shift_(exponent)
    exponent = torch.as_tensor(exponent, dtype=torch.int64)
    negative = (x >> 63) & (exponent > 0).to(torch.int64).neg_()  # -1 where x < 0 and e >= 1
    x += (torch.ones_like(exponent) << exponent) >> 1
    x += negative
    return x.bitwise_right_shift_(exponent)


def requantize(
    val: torch.Tensor,
    multiplier: torch.Tensor | int,
    shift: torch.Tensor | int,
    single_rounding: bool = False,
) -> torch.Tensor:
    """Vectorised ``arm_nn_requantize``.  ``multiplier``/``shift`` broadcast against ``val``
    (per-channel: shape ``[C]`` against a channels-last ``val``)."""
    multiplier = torch.as_tensor(multiplier, dtype=torch.int64)
    shift = torch.as_tensor(shift, dtype=torch.int64)
    if single_rounding:
        total_shift = 31 - shift
        r = (val * multiplier) >> (total_shift - 1)
        return wrap_int32_t((r + 1) >> 1)
    if bool((shift > 0).any()):  # val * (1 << LEFT_SHIFT(shift)) wraps in C
        val = wrap_int32_t(val.to(torch.int64) << shift.clamp(min=0))
    # arm_nn_doubling_high_mult_no_sat, in place on one fresh tensor: (val * m + 2**30) >> 31.
    x = val.to(torch.int64) * multiplier  # |val * m| <= 2**62
    x += 1 << 30
    x.bitwise_right_shift_(31)
    if bool((multiplier < 0).any()):  # only INT32_MIN * INT32_MIN leaves the int32 range
        x = wrap_int32_t(x)
    right = (-shift).clamp(min=0)
    return _divide_by_power_of_two_(x, int(right) if right.dim() == 0 else right)


def clamp_activation(x: torch.Tensor, activation_min: int, activation_max: int,
                     dtype: torch.dtype = torch.int8) -> torch.Tensor:
    """Clamp to the fused activation range and narrow to int8 (``dtype=torch.int16``: int16)."""
    return x.clamp(activation_min, activation_max).to(dtype)


# ----------------------------------------------------------------------------- s16 (16x8) kernels
def int_range(dtype: torch.dtype) -> tuple[int, int]:
    """``(min, max)`` of an activation dtype: int8 [-128, 127] or int16 [-32768, 32767]."""
    if dtype == torch.int8:
        return INT8_MIN, INT8_MAX
    if dtype == torch.int16:
        return INT16_MIN, INT16_MAX
    raise ValueError(f"activation dtype must be torch.int8 or torch.int16, got {dtype}")


def reduce_multiplier(multiplier: int) -> int:
    """CMSIS-NN's ``REDUCE_MULTIPLIER``: a Q31 multiplier rounded to Q15 for the s16 kernels."""
    return (multiplier + (1 << 15)) >> 16 if multiplier < 0x7FFF0000 else 0x7FFF


def reduce_multiplier_t(multiplier: torch.Tensor) -> torch.Tensor:
    m = multiplier.to(torch.int64)
    return torch.where(m < 0x7FFF0000, (m + (1 << 15)) >> 16, torch.full_like(m, 0x7FFF))


def requantize_s64(val: torch.Tensor, reduced_multiplier: torch.Tensor | int,
                   shift: torch.Tensor | int) -> torch.Tensor:
    """Vectorised ``arm_nn_requantize_s64``: ``((int32_t)((val * m) >> (14 - shift)) + 1) >> 1``
    (``val`` an int64 accumulator, ``m`` a reduced Q15 multiplier, ``shift <= 14``).  The 64 -> 32
    bit narrowing wraps as the C cast does."""
    m = torch.as_tensor(reduced_multiplier, dtype=torch.int64)
    shift = torch.as_tensor(shift, dtype=torch.int64)
    r = wrap_int32_t((val.to(torch.int64) * m) >> (REDUCED_SHIFT_MAX - shift))
    return (r + 1) >> 1


def requantize_s64_scalar(val: int, reduced_multiplier: int, shift: int) -> int:
    r = wrap_int32((val * reduced_multiplier) >> (REDUCED_SHIFT_MAX - shift))
    return (r + 1) >> 1
