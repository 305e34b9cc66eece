"""``quantized_softmax`` (CMSIS-NN's ``arm_softmax_s8``; int16: ``arm_softmax_s16``) and
``quantized_log_softmax`` (TFLite's int8 reference ``LogSoftmax``), over any dimension.

Every row (the ``dim`` dimension; ``row_size`` elements) is processed as the C kernel does, in int32
fixed point with the input differences in Q5.26 (``kScaledDiffIntegerBits = 5``) and the sum of
exponentials in Q12.19 (``ACCUM_BITS = 12``)::

    diff   = x - max(row)                                   # in [-255, 0]
    e      = exp_on_negative_values(MUL_SAT(diff << input_left_shift, input_multiplier))
    sum    = sum over diff >= diff_min of DIV_POW2(e, 12)
    scale  = one_over_one_plus_x_for_x_in_0_1((sum << clz(sum)) - 2**31)
    y      = clamp(DIV_POW2(MUL_SAT(scale, e), 35 - clz(sum)) - 128, -128, 127)   (diff >= diff_min)
    y      = -128                                                                (otherwise)

The output quantization is fixed: scale 1/256, zero point -128.  The compiler derives
``input_multiplier``, ``input_left_shift`` and ``diff_min`` as TFLite(-Micro) does for int8
softmax (:func:`softmax_params`: ``PreprocessSoftmaxScaling`` and ``CalculateInputRadius``).

One corner is defined here where the C code is not: when at least 512 elements of a row lie close
to the row's maximum, ``sum >= 2**28`` and the final rounding shift ``35 - clz(sum)`` exceeds 31.
CMSIS-NN then shifts an int32 by 32 or more (undefined behaviour in C: x86 and Arm give different
bytes).  Corten rounds exactly instead - the product is below 2**31, so the quotient is 0 and the
output -128, the correctly rounded probability (below 1/512).  Rows of at most 511 elements never
reach it.  Rows longer than 4095 elements are refused: the int32 sum could overflow.

Any dimension: in memory (NHWC for 4-D activations, row-major otherwise) the rows of dim ``d`` are
``outer`` blocks of ``row_size`` elements ``inner`` bytes apart (:func:`row_geometry`).  When
``inner == 1`` (the innermost dimension in memory: the last dim of a 2-D/3-D tensor, the channel
dim of a 4-D one) the CMSIS-NN flavour calls ``arm_softmax_s8``; otherwise both flavours run the
portable strided kernel (no transpose, no extra memory).

**16x8 (int16 rows).**  On an int16 input ``quantized_softmax`` is TFLite's ``SoftmaxInt16`` (CMSIS-NN's
``arm_softmax_s16``) with two 513-entry int16 tables, ``exp_lut`` (exp on [-10, 0]) and
``one_by_one_lut`` (1/(1+x) on [0, 1]), TFLite's ``LUTPopulate<int16_t>`` in float32
(:func:`softmax_s16_tables`; equal entry for entry to the tables of CMSIS-NN's unit tests), read with
interpolation (:mod:`corten.ops._lut16`)::

    e      = lut(exp_lut, clamp(requantize(x - max(row), mult, shift) + 32767))   # Q0.15
    sum    = sum of e;  h = clz(sum)
    recip  = lut(one_by_one_lut, clamp((((sum << (h - 1)) + 2**13) >> 14) - 98304))
    y      = clamp((((e * recip) >> (30 - h)) + 1) >> 1, -32768, 32767)

``mult``/``shift`` are TFLite's ``QuantizeMultiplier(s_in / (10 / 65535))`` (``input_left_shift`` is
its signed shift here; ``diff_min`` is 0), output scale 1/32768, zero point 0; rows of 1 to 65535
elements.  Corten saturates the two clamps as TFLite does.  ``arm_softmax_s16`` computes the same
except that it narrows without saturating: the 1/(1+x) index wraps (int32 overflow, undefined in C)
when the top 18 bits of the row's sum of exponentials are all set - possible from 9 elements on
(1 sum in ~2**17) - and reads 1.0 instead of ~0.5, and a row of one element gives 32768, cast to
-32768.  So the "cmsis-nn" flavour calls ``arm_softmax_s16`` (one shared pair of table constants)
for contiguous rows of 2 to 8 elements, where neither can happen, and Corten's portable
``corten_softmax_s16`` otherwise (``arm_softmax_s16`` is a plain C loop, so nothing is lost in speed;
both corners are shown in ``tests/test_softmax_s16.py`` against CMSIS-NN built on the host).

``quantized_log_softmax`` is TFLite's ``reference_integer_ops::LogSoftmax`` bit for bit (CMSIS-NN
has no log-softmax): the same Q5.26 differences and Q12.19 sum of exponentials, then gemmlowp's
fixed-point ``log_x_for_x_greater_than_or_equal_to_1`` of the sum (Q5.26), and per element
``clamp(RDBPOT(diff_q5 - log_sum, 22) + 127)`` for differences above
``max(diff_min - 1, MBQM(log_sum + INT32_MIN, reverse_multiplier, reverse_shift))``, -128
otherwise.  Output quantization fixed by TFLite: scale 16/256, zero point 127.  Parameters from
``PreprocessLogSoftmaxScalingExp`` (:func:`log_softmax_params`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from corten.errors import LoweringError
from corten.fixed_point import (
    INT32_MAX,
    INT32_MIN,
    divide_by_power_of_two,
    quantize_multiplier,
    requantize,
    saturating_rounding_doubling_high_mul,
    wrap_int32_t,
)
from corten.ops import _lut16, checks
from corten.ops._common import output_format, storage_dim_order
from corten.ops._rules import Match
from corten.ops.registry import A8W8, A16W8, OpFamily, annotates, lowers, register_family
from corten.providers import CMSIS_NN, PORTABLE, NodeView

FAMILY = "softmax"

SCALED_DIFF_INTEGER_BITS = 5  # TFLite kScaledDiffIntegerBits: differences in Q5.26
ACCUM_BITS = 12  # CMSIS-NN ACCUM_BITS: the sum of exponentials in Q12.19
OUTPUT_SCALE = 1.0 / 256.0
OUTPUT_ZERO_POINT = -128
MAX_ROW_SIZE = 4095  # 4096 * DIV_POW2(Q31_MAX, 12) = 2**31 overflows the int32 sum
MAX_LEFT_SHIFT = 31

# exp(-1/4) polynomial constants and exp(-2**k / 4) for k = 0..6 (bits 24..30 of the Q5.26 input).
_EXP_CONSTANT_TERM = 1895147668
_ONE_THIRD = 715827883
_EXP_BARREL = (1672461947, 1302514674, 790015084, 290630308, 39332535, 720401, 242)


# ----------------------------------------------------------------------------- compile-time parameters
@dataclass(frozen=True)
class SoftmaxParams:
    """What ``arm_softmax_s8`` takes besides the data: ``mult``, ``shift`` and ``diff_min``."""

    input_multiplier: int
    input_left_shift: int
    diff_min: int


def quantize_multiplier_greater_than_one(real: float) -> tuple[int, int]:
    """TFLite ``QuantizeMultiplierGreaterThanOne``: ``real > 1`` -> (Q31 multiplier, left shift >= 0).

    Unlike :func:`corten.fixed_point.quantize_multiplier` the shift may be 31 (reals up to
    ``2**31 - 1``, the cap :func:`softmax_params` applies)."""
    if not math.isfinite(real) or real <= 1.0:
        raise ValueError(f"quantize_multiplier_greater_than_one: expected a finite real > 1, got {real!r}")
    frac, exp = math.frexp(real)
    q = int(math.floor(frac * 2**31 + 0.5))  # TfLiteRound: half away from zero (frac > 0)
    if q == 2**31:
        q //= 2
        exp += 1
    if exp > MAX_LEFT_SHIFT:
        raise ValueError(f"quantize_multiplier_greater_than_one: {real!r} needs a left shift of {exp} > 31")
    return q, exp


def calculate_input_radius(input_integer_bits: int, input_left_shift: int, total_signed_bits: int = 31) -> int:
    """TFLite ``CalculateInputRadius``: the largest |difference| whose rescaled value stays in range."""
    max_input_rescaled = (1.0 * ((1 << input_integer_bits) - 1) * (1 << (total_signed_bits - input_integer_bits))
                          / (1 << input_left_shift))
    return int(math.floor(max_input_rescaled))


def softmax_params(input_scale: float, beta: float = 1.0) -> SoftmaxParams:
    """TFLite int8 softmax preparation (``PreprocessSoftmaxScaling`` + ``CalculateInputRadius``,
    double rounding), in float64 in TFLite's order of operations."""
    real = min(beta * input_scale * (1 << (31 - SCALED_DIFF_INTEGER_BITS)), (1 << 31) - 1.0)
    if not real > 1.0:
        raise ValueError(
            f"softmax: beta * input_scale = {beta * input_scale!r} is too small (must exceed 2**-26); "
            "the input's quantization scale is degenerate - recalibrate the model")
    mult, left_shift = quantize_multiplier_greater_than_one(real)
    diff_min = -calculate_input_radius(SCALED_DIFF_INTEGER_BITS, left_shift)
    return SoftmaxParams(mult, left_shift, diff_min)


# ----------------------------------------------------------------------------- fixed-point helpers
# CMSIS-NN keeps these in arm_nnsupportfunctions.h "for the softmax layer only"; vectorised here over
# int64 tensors holding int32 values, wrapping wherever the C int32 arithmetic wraps.
def _mul_sat(a: torch.Tensor, b: torch.Tensor | int) -> torch.Tensor:
    return saturating_rounding_doubling_high_mul(a, b)


def _add(a: torch.Tensor, b: torch.Tensor | int) -> torch.Tensor:
    return wrap_int32_t(a + b)


def mult_by_power_of_two(val: torch.Tensor, exponent: int) -> torch.Tensor:
    """``arm_nn_mult_by_power_of_two``: ``val << exponent`` saturated to int32."""
    thresh = (1 << (31 - exponent)) - 1
    out = wrap_int32_t(val << exponent)
    out = torch.where(val > thresh, INT32_MAX, out)
    return torch.where(val < -thresh, INT32_MIN, out)


def exp_on_negative_values(val: torch.Tensor) -> torch.Tensor:
    """``arm_nn_exp_on_negative_values``: exp of a Q5.26 value <= 0, as Q0.31."""
    val_mod_minus_quarter = (val & ((1 << 24) - 1)) - (1 << 24)
    remainder = wrap_int32_t(val_mod_minus_quarter - val)
    x = wrap_int32_t(val_mod_minus_quarter << 5) + (1 << 28)
    x2 = _mul_sat(x, x)
    poly = _add(divide_by_power_of_two(_mul_sat(x2, x2), 2), _mul_sat(x2, x))
    poly = _add(x, divide_by_power_of_two(_add(_mul_sat(poly, _ONE_THIRD), x2), 1))
    result = _add(_mul_sat(torch.full_like(poly, _EXP_CONSTANT_TERM), poly), _EXP_CONSTANT_TERM)
    for bit, factor in enumerate(_EXP_BARREL, start=24):
        result = torch.where((remainder & (1 << bit)) != 0, _mul_sat(result, factor), result)
    return torch.where(val == 0, INT32_MAX, result)


def one_over_one_plus_x_for_x_in_0_1(val: torch.Tensor) -> torch.Tensor:
    """``arm_nn_one_over_one_plus_x_for_x_in_0_1``: Newton-Raphson 1/(1+x) for Q0.31 x, as Q1.30."""
    total = val + INT32_MAX  # int64 in C as well
    half_denominator = wrap_int32_t(torch.div(total + torch.where(total >= 0, 1, -1), 2, rounding_mode="trunc"))
    x = _add(_mul_sat(half_denominator, -1010580540), 1515870810)
    for _ in range(3):
        step = _mul_sat(x, wrap_int32_t((1 << 29) - _mul_sat(half_denominator, x)))
        x = _add(x, mult_by_power_of_two(step, 2))
    return mult_by_power_of_two(x, 1)


def _bit_length(v: torch.Tensor) -> torch.Tensor:
    """Bit length of non-negative int64 values below 2**53 (exact through float64's frexp)."""
    return torch.frexp(v.to(torch.float64)).exponent.to(torch.int64)


def softmax_rows(rows: torch.Tensor, input_multiplier: int, input_left_shift: int, diff_min: int) -> torch.Tensor:
    """``arm_softmax_s8`` on an int64 ``[num_rows, row_size]`` tensor of int8 values -> int64 outputs."""
    diff = rows - rows.amax(dim=1, keepdim=True)
    valid = diff >= diff_min
    # diff * (1 << shift) fits int32 wherever diff >= diff_min (checked); the others are masked out.
    scaled = torch.where(valid, diff, 0) << input_left_shift
    exps = exp_on_negative_values(_mul_sat(scaled, input_multiplier))
    sums = torch.where(valid, divide_by_power_of_two(exps, ACCUM_BITS), 0).sum(dim=1, keepdim=True)
    headroom = 32 - _bit_length(sums)  # CLZ; sum >= DIV_POW2(Q31_MAX, 12) > 0: the maximum is always counted
    shifted_scale = one_over_one_plus_x_for_x_in_0_1(((sums << headroom) & 0xFFFFFFFF) - (1 << 31))
    bits_over_unit = ACCUM_BITS - headroom + 23
    prod = _mul_sat(shifted_scale.expand_as(exps), exps)
    quotient = divide_by_power_of_two(prod, bits_over_unit.clamp(max=31).expand_as(prod))
    quotient = torch.where(bits_over_unit > 31, 0, quotient)  # see the module docstring
    out = (quotient - 128).clamp(-128, 127)
    return torch.where(valid, out, -128)


# ----------------------------------------------------------------------------- 16x8 (int16) softmax
S16_OUTPUT_SCALE = 1.0 / 32768.0
S16_OUTPUT_ZERO_POINT = 0
S16_MAX_LEFT_SHIFT = 15  # (x - max) * 2**shift must fit int32 for differences down to -65535
S16_MAX_ROW_SIZE = 65535  # the int32 sum of Q0.15 exponentials
_INT16_RANGE = 65535  # std::numeric_limits<int16_t>::max() - min()
_CMSIS_SAFE_ROW_SIZE = 8  # rows whose sum of exponentials cannot reach 2**18 - 1 (see the module docstring)


def softmax_s16_tables() -> tuple[torch.Tensor, torch.Tensor]:
    """TFLite's int16 softmax tables (``SoftmaxPrepare`` / TFLM's ``CalculateSoftmaxParams``): exp(x) for
    x in [-10, 0] and 1/(1+x) for x in [0, 1], each ``LUTPopulate<int16_t>`` with output scale 2/65535
    (:func:`corten.ops._lut16.populate`, float32 as TFLite)."""
    f32 = torch.float32
    r = torch.tensor(float(_INT16_RANGE), dtype=f32)
    exp_lut = _lut16.populate(lambda x: torch.exp(x.to(f32)), float(torch.tensor(10.0, dtype=f32) / r), 32767,
                              float(torch.tensor(2.0, dtype=f32) / r), 0)
    one = torch.tensor(1.0, dtype=f32)
    one_lut = _lut16.populate(lambda x: one / (one + x.to(f32)), float(one / r), -32768,
                              float(torch.tensor(2.0, dtype=f32) / r), 0)
    return exp_lut, one_lut


def softmax_s16_params(input_scale: float, beta: float = 1.0) -> tuple[int, int]:
    """TFLite's int16 softmax multiplier: ``QuantizeMultiplier(beta * s_in / (10 / 65535))`` (the
    differences [-65535, 0] onto [-10, 0] in the exp table's input steps)."""
    mult, shift = quantize_multiplier(beta * float(input_scale) / (10.0 / 65535.0))
    if shift > S16_MAX_LEFT_SHIFT:
        raise ValueError(f"int16 softmax: input scale {input_scale!r} needs a left shift of {shift} > "
                         f"{S16_MAX_LEFT_SHIFT} (the shifted differences would overflow int32)")
    return mult, shift


def softmax_s16_rows(rows: torch.Tensor, input_multiplier: int, input_shift: int, exp_lut: torch.Tensor,
                     one_by_one_lut: torch.Tensor) -> torch.Tensor:
    """TFLite's ``SoftmaxInt16`` / CMSIS-NN's ``arm_softmax_s16`` on int64 rows ``[num_rows, row_size]``
    of int16 values -> int64 outputs (see the module docstring)."""
    diff = rows - rows.amax(dim=1, keepdim=True)
    scaled = requantize(diff, input_multiplier, input_shift)
    exps = _lut16.lookup((scaled + 32767).clamp(-32768, 32767), exp_lut)
    sums = exps.sum(dim=1, keepdim=True)
    headroom = 32 - _bit_length(sums)  # CLZ: sum >= 32767 (the maximum's own exponential)
    shifted = ((sums << (headroom - 1)) + (1 << 13)) >> 14
    recip = _lut16.lookup((shifted - 98304).clamp(-32768, 32767), one_by_one_lut)
    out = (exps * recip) >> (30 - headroom)
    return ((out + 1) >> 1).clamp(-32768, 32767)


# ----------------------------------------------------------------------------- layout
def row_geometry(shape, dim: int) -> tuple[int, int, int]:
    """``(outer, row_size, inner)`` of the rows along logical ``dim`` in a graph tensor's bytes:
    element ``i`` of row ``(o, j)`` is at ``(o * row_size + i) * inner + j``."""
    rank = len(shape)
    dim = dim + rank if dim < 0 else dim
    order = storage_dim_order(rank)
    pos = order.index(dim)
    outer = inner = 1
    for d in order[:pos]:
        outer *= int(shape[d])
    for d in order[pos + 1:]:
        inner *= int(shape[d])
    return outer, int(shape[dim]), inner


def _rows_apply(input: torch.Tensor, dim: int, fn) -> torch.Tensor:
    """``fn`` on int64 rows ``[num_rows, row_size]`` along ``dim``; result of the input's dtype laid
    out as the graph."""
    moved = input.movedim(dim, -1)
    rows = moved.reshape(-1, moved.shape[-1]).to(torch.int64)
    out = fn(rows).to(input.dtype).reshape(moved.shape).movedim(-1, dim)
    return out.contiguous(memory_format=output_format(input.dim()))


def _check_rows(op, input, dim, dtype=torch.int8, max_row=MAX_ROW_SIZE):
    checks.dtype(op, "input", input, dtype)
    if input.dim() < 1:
        checks.fail(op, "input", "expected at least one dimension")
    if not -input.dim() <= dim < input.dim():
        checks.fail(op, "dim", f"{dim} is not a dimension of a {input.dim()}-D tensor")
    if input.numel() and not 1 <= input.shape[dim] <= max_row:
        checks.fail(op, "input", f"dimension {dim} has {input.shape[dim]} elements, outside [1, {max_row}] "
                    "(the int32 sum of exponentials could overflow); split the rows")


# ----------------------------------------------------------------------------- the ops
def _check(input, input_multiplier, input_left_shift, diff_min, dim=-1, exp_lut=None, one_by_one_lut=None):
    op = "quantized_softmax"
    if input.dtype == torch.int16 and (exp_lut is not None or one_by_one_lut is not None):
        # 16x8: the tables, a signed shift, no diff_min (an int16 input without tables: refused below)
        _check_rows(op, input, dim, torch.int16, S16_MAX_ROW_SIZE)
        for name, t in (("exp_lut", exp_lut), ("one_by_one_lut", one_by_one_lut)):
            if t is None:
                checks.fail(op, name, "an int16 softmax needs its 513-entry int16 table")
            checks.dtype(op, name, t, torch.int16)
            checks.shape(op, name, t, (_lut16.LUT16_SIZE,))
        checks.scalar_multiplier(op, "input_multiplier", input_multiplier)
        checks.in_range(op, "input_left_shift", input_left_shift, -31, S16_MAX_LEFT_SHIFT)
        checks.in_range(op, "diff_min", diff_min, 0, 0)
        return
    _check_rows(op, input, dim)
    if exp_lut is not None or one_by_one_lut is not None:
        checks.fail(op, "exp_lut", "the int8 softmax takes no tables")
    checks.scalar_multiplier(op, "input_multiplier", input_multiplier)
    checks.in_range(op, "input_left_shift", input_left_shift, 0, MAX_LEFT_SHIFT)
    # diff_min <= 0 keeps the row maximum in the sum; diff_min * 2**shift >= INT32_MIN keeps every
    # counted difference's shifted value in int32.
    checks.in_range(op, "diff_min", diff_min, -(2**31 >> input_left_shift), 0)


@torch.library.custom_op("corten::quantized_softmax", mutates_args=())
def quantized_softmax(input: torch.Tensor, input_multiplier: int, input_left_shift: int,
                      diff_min: int, dim: int = -1, exp_lut: torch.Tensor | None = None,
                      one_by_one_lut: torch.Tensor | None = None) -> torch.Tensor:
    _check(input, input_multiplier, input_left_shift, diff_min, dim, exp_lut, one_by_one_lut)
    if input.numel() == 0:
        return torch.empty_like(input, memory_format=output_format(input.dim()))
    if input.dtype == torch.int16:
        return _rows_apply(input, dim, lambda rows: softmax_s16_rows(rows, input_multiplier, input_left_shift,
                                                                      exp_lut, one_by_one_lut))
    return _rows_apply(input, dim, lambda rows: softmax_rows(rows, input_multiplier, input_left_shift, diff_min))


@quantized_softmax.register_fake
def _(input, input_multiplier, input_left_shift, diff_min, dim=-1, exp_lut=None, one_by_one_lut=None):
    _check(input, input_multiplier, input_left_shift, diff_min, dim, exp_lut, one_by_one_lut)
    return torch.empty_like(input, memory_format=output_format(input.dim()))


# ----------------------------------------------------------------------------- log_softmax
LOG_OUTPUT_SCALE = 16.0 / 256.0
LOG_OUTPUT_ZERO_POINT = 127
_LOG_INPUT_INTEGER_BITS = 12  # log_x's input: the Q12.19 sum of exponentials
_LOG_OUTPUT_INTEGER_BITS = 5  # log_x's output: Q5.26, as the differences
_LOG_ACCUM_INTEGER_BITS = _LOG_OUTPUT_INTEGER_BITS + 1
_LOG_FINAL_SHIFT = 31 - SCALED_DIFF_INTEGER_BITS - 4  # Q5.26 -> Q4 output steps of 1/16
# gemmlowp constants (Q0.31): log(2), 2**-0.25, 2**-0.5, 1/4 and the rational approximation's alphas.
_LOG_2, _SQRT_SQRT_HALF, _SQRT_HALF, _ONE_QUARTER = 1488522236, 1805811301, 1518500250, 536870912
_ALPHA_N, _ALPHA_D, _ALPHA_I, _ALPHA_F = 117049297, 127690142, 1057819769, 638450708


@dataclass(frozen=True)
class LogSoftmaxParams:
    """TFLite ``PreprocessLogSoftmaxScalingExp`` + ``CalculateInputRadius`` (beta 1)."""

    input_multiplier: int
    input_left_shift: int
    reverse_multiplier: int
    reverse_shift: int  # <= 0: a right shift (MultiplyByQuantizedMultiplier convention)
    diff_min: int


def log_softmax_params(input_scale: float) -> LogSoftmaxParams:
    p = softmax_params(input_scale)
    reverse = (1 << (31 - p.input_left_shift)) / float(p.input_multiplier)
    if not 0.0 < reverse < 1.0:
        raise ValueError(f"log_softmax: the input scale {input_scale!r} gives a reverse scaling {reverse!r} "
                         "outside (0, 1)")
    rm, rs = quantize_multiplier(reverse)
    return LogSoftmaxParams(p.input_multiplier, p.input_left_shift, rm, rs, p.diff_min)


def _sat_shift_left(x: torch.Tensor, exponent: torch.Tensor | int) -> torch.Tensor:
    """TFLite ``SaturatingRoundingMultiplyByPOTParam`` for exponents >= 0: ``x * 2**e`` saturated."""
    e = torch.as_tensor(exponent, dtype=torch.int64)
    thresh = (torch.ones_like(e) << (31 - e)) - 1
    out = wrap_int32_t(x << e)
    out = torch.where(x > thresh, INT32_MAX, out)
    return torch.where(x < -thresh, INT32_MIN, out)


def _sat_add(a: torch.Tensor, b: torch.Tensor | int) -> torch.Tensor:
    return (a + b).clamp(INT32_MIN, INT32_MAX)


def _rounding_half_sum(a: torch.Tensor, b: int) -> torch.Tensor:
    s = a + b
    s = s + torch.where(s >= 0, 1, -1)
    return torch.div(s, 2, rounding_mode="trunc")


def _clz(v: torch.Tensor) -> torch.Tensor:
    """CountLeadingZeros of uint32 values (v > 0 here)."""
    return 32 - _bit_length(v & 0xFFFFFFFF)


def log_x_ge_1(sum_q12: torch.Tensor) -> torch.Tensor:
    """gemmlowp/TFLite ``log_x_for_x_greater_than_or_equal_to_1<5>`` of a Q12.19 value -> Q5.26."""
    shifted_quarter = divide_by_power_of_two(torch.tensor(_ONE_QUARTER), _LOG_ACCUM_INTEGER_BITS)
    z_a = sum_q12
    z_a_headroom_plus_1 = _clz(z_a)
    r_a_tmp = _sat_shift_left(z_a, z_a_headroom_plus_1 - 1)
    r_a_raw = _sat_shift_left(_mul_sat(r_a_tmp, _SQRT_HALF), 1)
    z_a_pow_2_adj = _sat_add(_sat_shift_left(_LOG_INPUT_INTEGER_BITS - z_a_headroom_plus_1,
                                             31 - _LOG_ACCUM_INTEGER_BITS), shifted_quarter)
    z_b = _mul_sat(z_a, _SQRT_HALF)
    z_b_headroom = _clz(z_b) - 1
    r_b_raw = _sat_shift_left(z_a, z_b_headroom)
    z_b_pow_2_adj = _sat_add(_sat_shift_left(_LOG_INPUT_INTEGER_BITS - z_b_headroom,
                                             31 - _LOG_ACCUM_INTEGER_BITS), -shifted_quarter)
    r = torch.minimum(r_a_raw, r_b_raw)
    z_pow_2_adj = torch.maximum(z_a_pow_2_adj, z_b_pow_2_adj)
    p = _rounding_half_sum(r, _SQRT_SQRT_HALF)
    q = wrap_int32_t(r - _SQRT_SQRT_HALF)
    q = wrap_int32_t(q + q)
    common_sq = _mul_sat(q, q)
    num = _add(_mul_sat(q, r), _mul_sat(_mul_sat(q, common_sq), _ALPHA_N))
    inner = _add(_add(torch.full_like(q, _ALPHA_I), q), _mul_sat(torch.full_like(q, _ALPHA_D), common_sq))
    denom_minus_one = _add(_mul_sat(p, inner), _mul_sat(torch.full_like(q, _ALPHA_F), q))
    recip_denom = one_over_one_plus_x_for_x_in_0_1(denom_minus_one)
    num_scaled = divide_by_power_of_two(num, _LOG_ACCUM_INTEGER_BITS)
    acc = _add(_mul_sat(z_pow_2_adj, _LOG_2), _mul_sat(num_scaled, recip_denom))
    return mult_by_power_of_two(acc, _LOG_ACCUM_INTEGER_BITS - _LOG_OUTPUT_INTEGER_BITS)


def _mbqm(x: torch.Tensor, multiplier: int, shift: int) -> torch.Tensor:
    """TFLite ``MultiplyByQuantizedMultiplier`` (double rounding)."""
    left, right = max(shift, 0), max(-shift, 0)
    return divide_by_power_of_two(_mul_sat(wrap_int32_t(x << left), multiplier), right)


def log_softmax_rows(rows: torch.Tensor, input_multiplier: int, input_left_shift: int, reverse_multiplier: int,
                     reverse_shift: int, diff_min: int) -> torch.Tensor:
    """TFLite ``reference_integer_ops::LogSoftmax`` on int64 rows ``[num_rows, row_size]``."""
    diff = rows - rows.amax(dim=1, keepdim=True)
    valid = diff >= diff_min
    diff_q5 = _mbqm(torch.where(valid, diff, 0), input_multiplier, input_left_shift)
    exps = exp_on_negative_values(diff_q5)
    sums = torch.where(valid, divide_by_power_of_two(exps, ACCUM_BITS), 0).sum(dim=1, keepdim=True)
    log_sum = log_x_ge_1(wrap_int32_t(sums))
    shifted = wrap_int32_t(log_sum + INT32_MIN)
    adjusted_diff_min = torch.clamp(_mbqm(shifted, reverse_multiplier, reverse_shift), min=diff_min - 1)
    out = divide_by_power_of_two(wrap_int32_t(diff_q5 - log_sum), _LOG_FINAL_SHIFT) + LOG_OUTPUT_ZERO_POINT
    out = out.clamp(-128, 127)
    return torch.where(diff > adjusted_diff_min, out, -128)


def _check_log(input, input_multiplier, input_left_shift, reverse_multiplier, reverse_shift, diff_min, dim):
    op = "quantized_log_softmax"
    _check_rows(op, input, dim)
    checks.scalar_multiplier(op, "input_multiplier", input_multiplier)
    checks.in_range(op, "input_left_shift", input_left_shift, 0, MAX_LEFT_SHIFT)
    checks.scalar_multiplier(op, "reverse_multiplier", reverse_multiplier)
    checks.in_range(op, "reverse_shift", reverse_shift, -31, 0)
    checks.in_range(op, "diff_min", diff_min, -(2**31 >> input_left_shift), 0)


@torch.library.custom_op("corten::quantized_log_softmax", mutates_args=())
def quantized_log_softmax(input: torch.Tensor, input_multiplier: int, input_left_shift: int,
                          reverse_multiplier: int, reverse_shift: int, diff_min: int, dim: int = -1) -> torch.Tensor:
    _check_log(input, input_multiplier, input_left_shift, reverse_multiplier, reverse_shift, diff_min, dim)
    if input.numel() == 0:
        return torch.empty_like(input, memory_format=output_format(input.dim()))
    return _rows_apply(input, dim, lambda rows: log_softmax_rows(
        rows, input_multiplier, input_left_shift, reverse_multiplier, reverse_shift, diff_min))


@quantized_log_softmax.register_fake
def _(input, input_multiplier, input_left_shift, reverse_multiplier, reverse_shift, diff_min, dim=-1):
    _check_log(input, input_multiplier, input_left_shift, reverse_multiplier, reverse_shift, diff_min, dim)
    return torch.empty_like(input, memory_format=output_format(input.dim()))


family = register_family(OpFamily(FAMILY, ("quantized_softmax", "quantized_log_softmax"), doc=__doc__))


# ----------------------------------------------------------------------------- lowering

SOFTMAX_OPS = (torch.ops.aten.softmax.int, torch.ops.aten._softmax.default)
LOG_SOFTMAX_OPS = (torch.ops.aten.log_softmax.int, torch.ops.aten._log_softmax.default)
annotates("fixed", *SOFTMAX_OPS, fixed={torch.int8: (OUTPUT_SCALE, OUTPUT_ZERO_POINT),
                                         torch.int16: (S16_OUTPUT_SCALE, S16_OUTPUT_ZERO_POINT)})
annotates("fixed", *LOG_SOFTMAX_OPS, fixed={torch.int8: (LOG_OUTPUT_SCALE, LOG_OUTPUT_ZERO_POINT)})


def _softmax_dim(m: Match, what: str) -> int:
    node = m.node
    dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim")
    ndim = node.args[0].meta["val"].dim()
    if node.target in (torch.ops.aten._softmax.default, torch.ops.aten._log_softmax.default):
        half_to_float = node.args[2] if len(node.args) > 2 else node.kwargs.get("half_to_float", False)
        if half_to_float:
            raise LoweringError(f"{what} with half_to_float=True is not supported")
    elif (node.args[2] if len(node.args) > 2 else node.kwargs.get("dtype")) is not None:
        raise LoweringError(f"{what} with an explicit dtype is not supported (drop the dtype argument)")
    return dim + ndim if dim < 0 else dim


def _check_lowerable(m: Match, what: str, fixed: tuple[float, int], max_row: int = MAX_ROW_SIZE
                     ) -> tuple[int, list[int]]:
    shape = [int(d) for d in m.node.args[0].meta["val"].shape]
    dim = _softmax_dim(m, what)
    if not 1 <= shape[dim] <= max_row:
        raise LoweringError(f"{what} over {shape[dim]} elements: rows must have 1 to {max_row} elements "
                            "(split the dimension)")
    if m.activation is not None:
        raise LoweringError(f"an activation after {what} cannot be fused")
    if (m.output.scale, m.output.zero_point) != fixed:
        raise LoweringError(f"{what} output quantized with scale {m.output.scale}, zero point "
                            f"{m.output.zero_point}; the int8 kernel needs {fixed[0]} and {fixed[1]} "
                            "(use CortenQuantizer)")
    return dim, shape


@lowers(*SOFTMAX_OPS, formats=(A8W8, A16W8))
def lower_softmax(m: Match):
    """``aten.softmax.int`` / ``aten._softmax`` over any dim -> ``quantized_softmax`` (int8, or int16
    with TFLite's tables)."""
    x = m.inputs[0]
    if x.qparams.dtype == torch.int16:
        return _lower_softmax_s16(m, x)
    dim, _ = _check_lowerable(m, "softmax", (OUTPUT_SCALE, OUTPUT_ZERO_POINT))
    try:
        p = softmax_params(x.qparams.scale)
    except ValueError as e:
        raise LoweringError(str(e)) from None
    return m.call("quantized_softmax", x.node, p.input_multiplier, p.input_left_shift, p.diff_min, dim)


def _table_constant(m: Match, name: str, table: torch.Tensor):
    """One buffer per table in the program, shared by every int16 softmax node."""
    attr = f"_corten_softmax_s16_{name}"
    if not hasattr(m.gm, attr):
        m.gm.register_buffer(attr, table.contiguous())
    with m.gm.graph.inserting_before(m.out_q):
        n = m.gm.graph.get_attr(attr)
    m.new_nodes.append(n)
    return n


def _lower_softmax_s16(m: Match, x):
    if m.output.dtype != torch.int16:
        raise LoweringError(f"{m.node.name}: an int16 softmax input with an {m.output.dtype} output")
    dim, _ = _check_lowerable(m, "softmax", (S16_OUTPUT_SCALE, S16_OUTPUT_ZERO_POINT), S16_MAX_ROW_SIZE)
    try:
        mult, shift = softmax_s16_params(x.qparams.scale)
    except ValueError as e:
        raise LoweringError(f"{m.node.name}: {e}") from None
    exp_lut, one_lut = softmax_s16_tables()
    return m.call("quantized_softmax", x.node, mult, shift, 0, dim, _table_constant(m, "exp_lut", exp_lut),
                  _table_constant(m, "one_by_one_lut", one_lut))


@lowers(*LOG_SOFTMAX_OPS)
def lower_log_softmax(m: Match):
    """``aten.log_softmax.int`` / ``aten._log_softmax`` over any dim -> ``quantized_log_softmax``."""
    x = m.inputs[0]
    dim, _ = _check_lowerable(m, "log_softmax", (LOG_OUTPUT_SCALE, LOG_OUTPUT_ZERO_POINT))
    try:
        p = log_softmax_params(x.qparams.scale)
    except ValueError as e:
        raise LoweringError(str(e)) from None
    return m.call("quantized_log_softmax", x.node, p.input_multiplier, p.input_left_shift, p.reverse_multiplier,
                  p.reverse_shift, p.diff_min, dim)


# ----------------------------------------------------------------------------- C emission
def _geometry(ctx) -> tuple[int, int, int]:
    dim = int(ctx.arg("dim"))
    return row_geometry(ctx.shape(ctx.arg("input")), dim)


def _params(ctx) -> tuple[int, int, int, str, int, str, str, str]:
    outer, row_size, inner = _geometry(ctx)
    return (outer, row_size, inner, ctx.int_(int(ctx.arg("input_multiplier"))), int(ctx.arg("input_left_shift")),
            ctx.int_(int(ctx.arg("diff_min"))), ctx.input("input"), ctx.out())


def _cmsis_supports(node, target) -> str | None:
    if _geometry(NodeView(node, target))[2] != 1:
        return "softmax over a dim whose rows are strided in memory (arm_softmax_s8 takes contiguous rows)"
    return None


def _cmsis_s16_supports(node, target) -> str | None:
    _, row_size, inner = _geometry(NodeView(node, target))
    if inner != 1:
        return "softmax over a dim whose rows are strided in memory (arm_softmax_s16 takes contiguous rows)"
    if not 2 <= row_size <= _CMSIS_SAFE_ROW_SIZE:
        return (f"int16 softmax rows of {row_size} elements: arm_softmax_s16 wraps where TFLite saturates (rows of "
                "1, or of 9 or more whose sum of exponentials has its top 18 bits set)")
    return None


@PORTABLE.kernel("quantized_softmax", act=(torch.int8,))
def _softmax_portable(ctx) -> str:
    """``corten_softmax_s8`` (rows contiguous in memory, ``inner == 1``) or ``corten_softmax_strided_s8``."""
    outer, row_size, inner, mult, shift, diff_min, x, out = _params(ctx)
    if inner != 1:
        return ctx.call("corten_softmax_strided_s8", x, outer, row_size, inner, mult, shift, diff_min, out)
    return ctx.call("corten_softmax_s8", x, outer, row_size, mult, shift, diff_min, out)


@CMSIS_NN.kernel("quantized_softmax", act=(torch.int8,), supports=_cmsis_supports)
def _softmax_cmsis(ctx) -> str:
    """``arm_softmax_s8`` (contiguous rows; returns void)."""
    outer, row_size, _, mult, shift, diff_min, x, out = _params(ctx)
    return ctx.invoke("arm_softmax_s8", x, outer, row_size, mult, shift, diff_min, out) + ";"


def _s16_tables(ctx) -> tuple[str, str, str, str]:
    exp_lut, one_lut = ctx.const("exp_lut", torch.int16), ctx.const("one_by_one_lut", torch.int16)
    return exp_lut, one_lut, ctx.typed_input("input"), ctx.typed_out()


@PORTABLE.kernel("quantized_softmax", act=(torch.int16,))
def _softmax_s16_portable(ctx) -> str:
    """``corten_softmax_s16`` (any rows, strided too; TFLite's SoftmaxInt16 with its two tables)."""
    outer, row_size, inner = _geometry(ctx)
    mult, shift = ctx.int_(int(ctx.arg("input_multiplier"))), int(ctx.arg("input_left_shift"))
    exp_lut, one_lut, x, out = _s16_tables(ctx)
    return ctx.call("corten_softmax_s16", x, outer, row_size, inner, mult, shift, exp_lut, one_lut, out)


@CMSIS_NN.kernel("quantized_softmax", act=(torch.int16,), supports=_cmsis_s16_supports)
def _softmax_s16_cmsis(ctx) -> str:
    """``arm_softmax_s16`` for contiguous rows of 2 to 8 elements, where its int32 / int16 arithmetic
    cannot wrap (module docstring)."""
    outer, row_size, _ = _geometry(ctx)
    mult, shift = ctx.int_(int(ctx.arg("input_multiplier"))), int(ctx.arg("input_left_shift"))
    exp_lut, one_lut, x, out = _s16_tables(ctx)
    return ctx.block(
        ctx.params("cmsis_nn_softmax_lut_s16", "lut", {"exp_lut": exp_lut, "one_by_one_lut": one_lut}),
        ctx.call("arm_softmax_s16", x, outer, row_size, mult, shift, "&lut", out))


@PORTABLE.kernel("quantized_log_softmax")
def _log_softmax_portable(ctx) -> str:
    """``corten_log_softmax_s8`` (CMSIS-NN has no log-softmax kernel)."""
    outer, row_size, inner = _geometry(ctx)
    args = [ctx.int_(int(ctx.arg(a))) for a in ("input_multiplier", "input_left_shift", "reverse_multiplier",
                                                 "reverse_shift", "diff_min")]
    return ctx.call("corten_log_softmax_s8", ctx.input("input"), outer, row_size, inner, *args, ctx.out())


CMSIS_NN.declines("quantized_log_softmax", reason="CMSIS-NN has no log-softmax kernel")
