"""``quantized_softmax``: CMSIS-NN's ``arm_softmax_s8`` over the last dimension.

Every row (the last dimension; ``row_size`` elements) is processed as the C kernel does, in int32
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
    saturating_rounding_doubling_high_mul,
    wrap_int32_t,
)
from corten.ops import checks
from corten.ops._rules import Match
from corten.ops.registry import OpFamily, annotates, lowers, register_family

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


# ----------------------------------------------------------------------------- the op
def _check(input, input_multiplier, input_left_shift, diff_min):
    op = "quantized_softmax"
    checks.dtype(op, "input", input, torch.int8)
    if input.dim() < 1:
        checks.fail(op, "input", "expected at least one dimension (softmax runs over the last one)")
    if input.numel() and not 1 <= input.shape[-1] <= MAX_ROW_SIZE:
        checks.fail(op, "input", f"last dimension {input.shape[-1]} is outside [1, {MAX_ROW_SIZE}] "
                    "(the int32 sum of exponentials could overflow); split the rows")
    checks.scalar_multiplier(op, "input_multiplier", input_multiplier)
    checks.in_range(op, "input_left_shift", input_left_shift, 0, MAX_LEFT_SHIFT)
    # diff_min <= 0 keeps the row maximum in the sum; diff_min * 2**shift >= INT32_MIN keeps every
    # counted difference's shifted value in int32.
    checks.in_range(op, "diff_min", diff_min, -(2**31 >> input_left_shift), 0)


@torch.library.custom_op("corten::quantized_softmax", mutates_args=())
def quantized_softmax(input: torch.Tensor, input_multiplier: int, input_left_shift: int,
                      diff_min: int) -> torch.Tensor:
    _check(input, input_multiplier, input_left_shift, diff_min)
    if input.numel() == 0:
        return torch.empty_like(input, memory_format=torch.contiguous_format)
    rows = input.reshape(-1, input.shape[-1]).to(torch.int64)
    out = softmax_rows(rows, input_multiplier, input_left_shift, diff_min)
    return out.to(torch.int8).reshape(input.shape)


@quantized_softmax.register_fake
def _(input, input_multiplier, input_left_shift, diff_min):
    _check(input, input_multiplier, input_left_shift, diff_min)
    return torch.empty_like(input, memory_format=torch.contiguous_format)


family = register_family(OpFamily(FAMILY, ("quantized_softmax",), doc=__doc__))


# ----------------------------------------------------------------------------- lowering

SOFTMAX_OPS = (torch.ops.aten.softmax.int, torch.ops.aten._softmax.default)
annotates("fixed", *SOFTMAX_OPS, fixed=(OUTPUT_SCALE, OUTPUT_ZERO_POINT))


def _softmax_dim(m: Match) -> int:
    node = m.node
    dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim")
    ndim = node.args[0].meta["val"].dim()
    if node.target == torch.ops.aten._softmax.default:
        half_to_float = node.args[2] if len(node.args) > 2 else node.kwargs.get("half_to_float", False)
        if half_to_float:
            raise LoweringError("softmax with half_to_float=True is not supported")
    elif (node.args[2] if len(node.args) > 2 else node.kwargs.get("dtype")) is not None:
        raise LoweringError("softmax with an explicit dtype is not supported (drop the dtype argument)")
    return dim + ndim if dim < 0 else dim


@lowers(*SOFTMAX_OPS)
def lower_softmax(m: Match):
    """``aten.softmax.int`` / ``aten._softmax`` over the last dimension -> ``quantized_softmax``.

    Other dimensions are refused (no transpose is inserted); so are 4-D inputs, whose last logical
    dimension (W) is not contiguous in their channels-last bytes."""
    x = m.inputs[0]
    shape = tuple(m.node.args[0].meta["val"].shape)
    dim = _softmax_dim(m)
    if dim != len(shape) - 1:
        raise LoweringError(f"softmax over dim {dim} of a {len(shape)}-D tensor: only the last dimension is "
                            "supported (move that dimension last with a reshape/flatten first)")
    if len(shape) == 4:
        raise LoweringError("softmax of a 4-D activation: its last dimension is not contiguous in the channels-last "
                            "layout; flatten to 2-D (or 3-D) before the softmax")
    if not 1 <= shape[-1] <= MAX_ROW_SIZE:
        raise LoweringError(f"softmax over {shape[-1]} elements: rows must have 1 to {MAX_ROW_SIZE} elements")
    if m.activation is not None:
        raise LoweringError("an activation after softmax cannot be fused")
    if (m.output.scale, m.output.zero_point) != (OUTPUT_SCALE, OUTPUT_ZERO_POINT):
        raise LoweringError(f"softmax output quantized with scale {m.output.scale}, zero point "
                            f"{m.output.zero_point}; CMSIS-NN needs 1/256 and -128 (use CortenQuantizer)")
    try:
        p = softmax_params(x.qparams.scale)
    except ValueError as e:
        raise LoweringError(str(e)) from None
    return m.call("quantized_softmax", x.node, p.input_multiplier, p.input_left_shift, p.diff_min)


# ----------------------------------------------------------------------------- scratch memory
@family.provides("scratch_bytes", "quantized_softmax")
def _softmax_scratch(node, target) -> int:
    """``arm_softmax_s8`` takes no context buffer."""
    return 0


# ----------------------------------------------------------------------------- C emission
@family.provides("emit_c", "quantized_softmax")
def _emit_softmax_c(ctx) -> str:
    """One ``corten_softmax_s8`` (portable) or ``arm_softmax_s8`` (CMSIS-NN, returns void) call."""
    x_node = ctx.arg("input")
    val = x_node.meta["val"]
    if not val.is_contiguous():
        ctx.fail("the input is not contiguous in memory (a channels-last 4-D tensor?); softmax needs its rows "
                 "contiguous (flatten the input first)")
    shape = ctx.shape(x_node)
    row_size = int(shape[-1])
    num_rows = 1
    for d in shape[:-1]:
        num_rows *= int(d)
    mult = ctx.int_(int(ctx.arg("input_multiplier")))
    shift = int(ctx.arg("input_left_shift"))
    diff_min = ctx.int_(int(ctx.arg("diff_min")))
    x, out = ctx.input("input"), ctx.out()
    if ctx.kernels == "portable":
        return ctx.call(f"corten_softmax_s8({x}, {num_rows}, {row_size}, {mult}, {shift}, {diff_min}, {out})")
    return f"arm_softmax_s8({x}, {num_rows}, {row_size}, {mult}, {shift}, {diff_min}, {out});"
