"""``quantized_lut``: any elementwise function as a lookup table (int8: 256 entries; int16: 513, interpolated),
and ``quantized_activation_s16``: TFLite's 16x8 sigmoid / tanh.

One op serves every elementwise nonlinearity: ``output[i] = table[input[i] + 128]``, where entry
``k`` of the int8 ``table`` is the output for the input value ``k - 128``.  The reference kernel
and the C kernel both only index the table, so they are bit-exact by construction; all the
arithmetic happens ahead of time, in float64, when the lowering builds the table
(:func:`build_table`)::

    for q in -128..127:   y = f(s_in * (q - zp_in))
                          table[q + 128] = clamp(round_half_away(y / s_out) + zp_out, -128, 127)

``round_half_away`` rounds ties away from zero (C's ``round``, as TFLite's LUT generation does);
fake-quantization rounds ties to even, so a table entry may be one step from the fake-quantized
model exactly at a tie.

Lowered this way: ``hardswish``, ``hardsigmoid``, ``sigmoid``, ``tanh``, ``silu``, ``gelu``
(``approximate='none'`` and ``'tanh'``), ``elu`` (any ``alpha``), ``leaky_relu`` (any slope), ``mish``,
``softplus``, ``selu``, ``celu``, ``logsigmoid``, ``hardshrink``, ``softshrink``, the elementwise math
``abs``, ``neg``, ``sign``, ``square`` / ``x ** k`` (any constant exponent), ``sqrt``, ``rsqrt``, ``exp``,
``exp2``, ``expm1``, ``log``, ``log2``, ``log10``, ``log1p``, ``erf``, ``sin``, ``cos``, ``atan``,
``clamp_min``, ``clamp_max``, ``k - x`` (``rsub``), ``threshold``, ``floor``, ``ceil``, ``round``,
``trunc``, ``frac``, ``rrelu`` (eval), their
in-place variants, and ``relu`` / ``relu6`` / ``hardtanh`` / ``clamp`` when they are *not* fused into
the conv/linear/add before them (after a pool, at the model input, or when the producer has other
users).  ``sigmoid`` and ``tanh`` get TFLite's fixed output quantization (scale 1/256, zero point
-128 and scale 1/128, zero point 0); the others observe their output range.

CMSIS-NN has no generic int8 table-lookup kernel, so both C flavours run Corten's portable
``corten_lut_s8``.  The output keeps the input's memory format (channels_last stays channels_last).

**int16 activations (TFLite's 16x8 scheme).**  On an int16 input the op takes an int16 table of 513
entries and interpolates between two of them (TFLite's ``lut_lookup_with_interpolation``; the table
is TFLite's ``LUTPopulate<int16_t>`` of the same float function, see :mod:`corten.ops._lut16`)::

    output[i] = lut[256 + (q >> 7)] + ((lut[257 + (q >> 7)] - lut[256 + (q >> 7)]) * (q & 0x7f) + 64 >> 7)

with ``q = input[i]``; input and output are int16 (zero point 0).  Every function above but
``sigmoid`` and ``tanh`` and the step functions (``sign``, ``floor``, ``ceil``, ``round``, ``trunc``,
``frac``, ``threshold``, ``hardshrink``: interpolation smears their jumps, so they stay int8 between
requantizes, see ``STEP_FUNCTIONS``) lowers this way in an int16 region, with an observed symmetric
int16 output.
C: the portable ``corten_lut_s16`` in both flavours (in place allowed; CMSIS-NN has no generic s16
table kernel).  The table's 512 segments span the whole input range, so its error grows with the
input scale (measured over all 65536 inputs, in output steps: tanh 6.0 at input scale 2**-12, 117
at 1.9e-3; the drift of TFLite's grid - entry i sampled at ``-32768 + i * 65535 / 512``, read at
``-32768 + 128 i`` - adds up to one input step).

**int16 sigmoid and tanh** lower to ``quantized_activation_s16(input, table, input_multiplier,
input_shift, function)``, TFLite's 16x8 ``Logistic`` / ``Tanh`` (``reference_integer_ops``; output
scale 1/32768, zero point 0 for both, TFLite's fixed 16x8 quantization)::

    x  = (q * input_multiplier + rounding) >> input_shift     # the input in steps of 1 / (3 * 4096)
    y  = interpolate sigmoid_table[|x| >> 9] .. [+1] on |x| & 0x1ff   (tanh: >> 8, & 0xff: 2 sigmoid(2x) - 1)
    y  = mirrored for x < 0, rounded to Q0.15 (saturated where |x| >> 9 >= 255)

``sigmoid_table`` is ``sigmoid(i / 24)`` in 0.16 for i = 0..255 (:func:`sigmoid_table`: each entry
lowered by half the error of its interpolated midpoint; equal to CMSIS-NN's ``sigmoid_table_uint16``,
checked in ``tests/test_lut16.py``), so the table covers sigmoid's useful range at every input scale
(measured max error over all inputs: sigmoid 1.0 / tanh 1.5 steps at input scale 2**-12, 1.2 / 2.4
at 1.9e-3, against 2.4 / 6.0 and 17 / 117 for the 513-entry table).  ``input_multiplier`` /
``input_shift`` come from TFLite's ``SigmoidPrepare``/``TanhPrepare`` (:func:`activation_s16_params`).
CMSIS-NN's ``arm_nn_activation_s16`` is the same arithmetic for multipliers ``3 * 2**j`` only (a
power-of-two input scale ``2**(left_shift - 12)``; byte-identical on all 65536 inputs for left
shifts -6..3, ``tests/test_lut16.py``): the "cmsis-nn" flavour calls it for those and runs Corten's
portable ``corten_activation_s16`` for every other scale (observed scales are not powers of two, so
that is the common case; the CMSIS-NN kernel is a plain C loop, no faster).
"""
from __future__ import annotations

import math
from typing import Callable

import torch

from corten.errors import LoweringError
from corten.fixed_point import round_half_away_t as round_half_away  # exact ties-away rounding
from corten.ops import _lut16, checks
from corten.ops._common import layout_of
from corten.ops._rules import Match
from corten.ops.registry import A8W8, A16W8, ROW_WISE, Hook, OpFamily, annotates, lowers, register_family
from corten.providers import CMSIS_NN, PORTABLE, NodeView

FAMILY = "lut"
TABLE_SIZE = 256
INPUT_BIAS = 128  # table index of input value q is q + 128


def _check(input: torch.Tensor, table: torch.Tensor) -> None:
    op = "quantized_lut"
    if input.dtype == torch.int16 and table.dtype == torch.int16:  # 16x8: 513 int16 entries, interpolated
        checks.shape(op, "table", table, (_lut16.LUT16_SIZE,))
        return
    checks.dtype(op, "input", input, torch.int8)
    checks.dtype(op, "table", table, torch.int8)
    checks.shape(op, "table", table, (TABLE_SIZE,))


@torch.library.custom_op("corten::quantized_lut", mutates_args=())
def quantized_lut(input: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    _check(input, table)
    if input.dtype == torch.int16:
        out = _lut16.lookup(input, table).to(torch.int16)
        return out.contiguous(memory_format=layout_of(input))
    index = input.to(torch.int64) + INPUT_BIAS
    return table[index].contiguous(memory_format=layout_of(input))


@quantized_lut.register_fake
def _(input, table):
    _check(input, table)
    return torch.empty_like(input, memory_format=layout_of(input))


# ----------------------------------------------------------------------------- int16 sigmoid / tanh
SIGMOID, TANH = 0, 1  # CMSIS-NN's arm_nn_activation_type (ARM_SIGMOID, ARM_TANH)
SIGMOID_TABLE_SIZE = 256


def sigmoid_table() -> torch.Tensor:
    """TFLite's / CMSIS-NN's ``sigmoid_table_uint16``: ``sigmoid(i / 24)`` in 0.16 for i = 0..255, each
    entry lowered by half the error of the interpolated midpoint and rounded, the last 65535 (equal
    to CMSIS-NN's table, ``tests/test_lut16.py``).  Returned as int16 holding the uint16 bits."""
    def s(t: float) -> float:
        return 65536.0 / (1.0 + math.exp(-t / 24.0))

    vals = [math.floor(s(i) - ((s(i) + s(i + 1)) / 2 - s(i + 0.5)) / 2 + 0.5) for i in range(SIGMOID_TABLE_SIZE - 1)]
    return torch.tensor(vals + [65535], dtype=torch.int32).to(torch.int16)  # (uint16 bits)


def activation_s16_params(input_scale: float) -> tuple[int, int]:
    """TFLite's int16 ``SigmoidPrepare`` / ``TanhPrepare`` multiplier (the general-scale path):
    ``(multiplier, right_shift)`` with ``q * multiplier >> right_shift`` the input in steps of
    1 / (3 * 4096) - the units of the table.  (TFLite takes a separate power-of-two path when
    ``log2(scale)`` is within 1e-3 of -12 or -11; at exact powers of two both paths compute the same
    values, near them TFLite's rounds the scale - Corten always takes the general one.)"""
    multiplier, shift = float(input_scale) * 4096.0 * 3.0, 0
    while multiplier <= 32767.0 / 2.0 and shift <= 30:
        shift += 1
        multiplier *= 2.0
    mult = int(multiplier)
    if not 0 < mult <= 65535:
        raise ValueError(f"int16 sigmoid/tanh: input scale {input_scale!r} is outside what the int32 arithmetic "
                         "takes (multiplier 1 .. 65535, input scale up to ~5.3)")
    return mult, shift


def _check_activation(input, table, input_multiplier, input_shift, function):
    op = "quantized_activation_s16"
    checks.dtype(op, "input", input, torch.int16)
    checks.dtype(op, "table", table, torch.int16)
    checks.shape(op, "table", table, (SIGMOID_TABLE_SIZE,))
    checks.in_range(op, "input_multiplier", input_multiplier, 1, 65535)
    checks.in_range(op, "input_shift", input_shift, 0, 31)
    checks.in_range(op, "function", function, SIGMOID, TANH)
    if 32768 * input_multiplier + ((1 << input_shift) >> 1) > 2**31 - 1:
        checks.fail(op, "input_multiplier", f"{input_multiplier} with shift {input_shift}: q * multiplier + rounding "
                    "overflows int32")


@torch.library.custom_op("corten::quantized_activation_s16", mutates_args=())
def quantized_activation_s16(input: torch.Tensor, table: torch.Tensor, input_multiplier: int, input_shift: int,
                             function: int) -> torch.Tensor:
    """TFLite's int16 ``Logistic`` (``function`` 0) / ``Tanh`` (1), ``reference_integer_ops``."""
    _check_activation(input, table, input_multiplier, input_shift, function)
    t = table.to(torch.int64) & 0xFFFF
    rounding = (1 << (input_shift - 1)) if input_shift > 0 else 0
    x = (input.to(torch.int64) * input_multiplier + rounding) >> input_shift
    a = x.abs()
    frac_bits = 8 if function == TANH else 9  # tanh(x) = 2 * sigmoid(2x) - 1: one bit less
    uh = a >> frac_bits
    i = uh.clamp(max=SIGMOID_TABLE_SIZE - 2)
    ua, ub = t[i], t[i + 1]
    r = (ua << frac_bits) + (a & ((1 << frac_bits) - 1)) * (ub - ua)
    if function == TANH:
        r = torch.where(uh >= 255, 0xFFFF << 8, r)
        out = torch.where(x >= 0, r - (1 << 23) + (1 << 7), -r + (1 << 23) + (1 << 7) - 1) >> 8
    else:
        r = torch.where(uh >= 255, 0x7FFF << 10, r)
        out = torch.where(x >= 0, r + (1 << 9), (1 << 25) - r + (1 << 9) - 1) >> 10
    return out.to(torch.int16).contiguous(memory_format=layout_of(input))


@quantized_activation_s16.register_fake
def _(input, table, input_multiplier, input_shift, function):
    _check_activation(input, table, input_multiplier, input_shift, function)
    return torch.empty_like(input, memory_format=layout_of(input))


def cmsis_left_shift(input_multiplier: int, input_shift: int) -> int | None:
    """The ``left_shift`` of ``arm_nn_activation_s16`` (input ``q * 3 << left_shift``, or ``(q * 3 +
    rounding) >> -left_shift``) computing the same values as ``(multiplier, shift)``, or None: only
    multipliers ``3 * 2**j`` (a power-of-two input scale) have one."""
    j = 0
    while input_multiplier % (2 ** (j + 1)) == 0:
        j += 1
    if input_multiplier != 3 << j:
        return None
    return j - input_shift


family = register_family(OpFamily(FAMILY, ("quantized_lut", "quantized_activation_s16"), doc=__doc__))
family.provides(Hook.WINDOW, "quantized_lut")(lambda node: ROW_WISE)  # elementwise: output row r reads row r


# ----------------------------------------------------------------------------- table construction
def input_values(scale: float, zero_point: int) -> torch.Tensor:
    """The 256 real values ``scale * (q - zero_point)`` of q = -128..127, in float64."""
    q = torch.arange(-INPUT_BIAS, TABLE_SIZE - INPUT_BIAS, dtype=torch.float64)
    return float(scale) * (q - int(zero_point))


def build_table(fn: Callable[[torch.Tensor], torch.Tensor], input_scale: float, input_zero_point: int,
                output_scale: float, output_zero_point: int) -> torch.Tensor:
    """The int8 [256] table of the real function ``fn`` (float64 tensor -> float64 tensor) between
    the input and output quantizations: entry ``q + 128`` is
    ``clamp(round_half_away(fn(s_in * (q - zp_in)) / s_out) + zp_out, -128, 127)``."""
    if not (math.isfinite(input_scale) and input_scale > 0):
        raise ValueError(f"build_table: input scale must be finite and > 0, got {input_scale!r}")
    if not (math.isfinite(output_scale) and output_scale > 0):
        raise ValueError(f"build_table: output scale must be finite and > 0, got {output_scale!r}")
    y = fn(input_values(input_scale, input_zero_point))
    if not isinstance(y, torch.Tensor) or y.shape != (TABLE_SIZE,):
        raise ValueError("build_table: the function must map the 256 input values to 256 output values")
    y = y.to(torch.float64)
    if torch.isnan(y).any():
        raise ValueError("build_table: the function gives NaN for some int8 input value")
    # Clamp before rounding so that huge or infinite values saturate instead of overflowing.
    steps = round_half_away((y / float(output_scale)).clamp(-1e6, 1e6))
    return (steps + int(output_zero_point)).clamp(-128, 127).to(torch.int8)


def build_table16(fn: Callable[[torch.Tensor], torch.Tensor], input_scale: float, output_scale: float) -> torch.Tensor:
    """The int16 [513] interpolation table of ``fn`` between two symmetric int16 quantizations
    (TFLite's ``LUTPopulate<int16_t>``, :func:`corten.ops._lut16.populate`)."""
    return _lut16.populate(fn, input_scale, 0, output_scale, 0)


# ----------------------------------------------------------------------------- lowering

_aten = torch.ops.aten

# In-place variants compute the same function as their out-of-place op; the table is built with
# the out-of-place one (on the node's own scalar arguments).
FUNCTIONS = {
    _aten.hardswish.default: _aten.hardswish.default,
    _aten.hardswish_.default: _aten.hardswish.default,
    _aten.hardsigmoid.default: _aten.hardsigmoid.default,
    _aten.hardsigmoid_.default: _aten.hardsigmoid.default,
    _aten.sigmoid.default: _aten.sigmoid.default,
    _aten.sigmoid_.default: _aten.sigmoid.default,
    _aten.tanh.default: _aten.tanh.default,
    _aten.tanh_.default: _aten.tanh.default,
    _aten.silu.default: _aten.silu.default,
    _aten.silu_.default: _aten.silu.default,
    _aten.gelu.default: _aten.gelu.default,
    _aten.gelu_.default: _aten.gelu.default,
    _aten.elu.default: _aten.elu.default,
    _aten.elu_.default: _aten.elu.default,
    _aten.leaky_relu.default: _aten.leaky_relu.default,
    _aten.leaky_relu_.default: _aten.leaky_relu.default,
    # elementwise math and further activations (constant scalar arguments folded into the table)
    **{op: op for op in (
        _aten.abs.default, _aten.neg.default, _aten.sign.default, _aten.sgn.default, _aten.square.default,
        _aten.pow.Tensor_Scalar, _aten.sqrt.default, _aten.rsqrt.default, _aten.exp.default, _aten.exp2.default,
        _aten.expm1.default, _aten.log.default, _aten.log2.default, _aten.log10.default, _aten.log1p.default,
        _aten.erf.default, _aten.sin.default, _aten.cos.default, _aten.atan.default, _aten.mish.default,
        _aten.softplus.default, _aten.selu.default, _aten.celu.default, _aten.log_sigmoid.default,
        _aten.hardshrink.default, _aten.softshrink.default, _aten.clamp_min.default, _aten.clamp_max.default,
        _aten.rsub.Scalar, _aten.threshold.default, _aten.floor.default, _aten.ceil.default, _aten.round.default,
        _aten.trunc.default, _aten.frac.default)},
    # nn.RReLU in eval mode: a leaky relu of slope (lower + upper) / 2 (the training flag is a constant)
    _aten.rrelu.default: _aten.rrelu.default,
}
# Functions defined on part of the real line: the table evaluates them on the int8 grid clamped to
# their domain (the float model never feeds them values outside it; a grid point just below 0 is
# a rounding artefact of the input quantization).
DOMAIN_MIN = {_aten.sqrt.default: 0.0, _aten.rsqrt.default: 0.0, _aten.log.default: 0.0, _aten.log2.default: 0.0,
              _aten.log10.default: 0.0, _aten.log1p.default: -1.0}
# Also fused into a preceding conv/linear/add as activation_min/max (quantizer ``_fused_tail``,
# lowering ``_output_chain``); a standalone one becomes a table.
CLAMPS = {
    _aten.relu.default: _aten.relu.default,
    _aten.relu_.default: _aten.relu.default,
    _aten.relu6.default: _aten.relu6.default,
    _aten.hardtanh.default: _aten.hardtanh.default,
    _aten.hardtanh_.default: _aten.hardtanh.default,
    _aten.clamp.default: _aten.clamp.default,
    _aten.clamp_.default: _aten.clamp.default,
}
# TFLite's fixed output quantization: sigmoid in [0, 1), tanh in [-1, 1); in 16x8 both 1/32768, 0.
SIGMOID_QPARAMS = (1.0 / 256.0, -128)
TANH_QPARAMS = (1.0 / 128.0, 0)
SIGMOID_QPARAMS_S16 = TANH_QPARAMS_S16 = (1.0 / 32768.0, 0)

annotates("fixed", _aten.sigmoid.default, _aten.sigmoid_.default,
          fixed={torch.int8: SIGMOID_QPARAMS, torch.int16: SIGMOID_QPARAMS_S16})
annotates("fixed", _aten.tanh.default, _aten.tanh_.default,
          fixed={torch.int8: TANH_QPARAMS, torch.int16: TANH_QPARAMS_S16})
annotates("unary", *(t for t in FUNCTIONS if FUNCTIONS[t] not in (_aten.sigmoid.default, _aten.tanh.default)))
# The quantizer marks a relu/clamp fused into its producer as part of that producer's pattern
# first (the producer comes earlier in the graph), so this only annotates standalone ones.
annotates("unary", *CLAMPS)


def real_function(node) -> Callable[[torch.Tensor], torch.Tensor]:
    """The float function of an activation node: its out-of-place ATen op applied with the node's
    own scalar arguments (``alpha``, ``negative_slope``, ``approximate``, clamp bounds), on one
    element at a time (see below)."""
    fn = {**FUNCTIONS, **CLAMPS}.get(node.target)
    if fn is None:
        raise LoweringError(f"{node.target} has no table lowering")
    extra = tuple(node.args[1:])
    kwargs = dict(node.kwargs)
    for a in (*extra, *kwargs.values()):
        if isinstance(a, torch.fx.Node):
            raise LoweringError(f"{node.name}: argument {a.name} is a tensor; only constant (scalar) arguments "
                                "can be folded into a lookup table")
    if fn is _aten.clamp.default and all(v is None for v in (*extra, *kwargs.values())):
        raise LoweringError(f"{node.name}: clamp without min or max")
    if fn is _aten.pow.Tensor_Scalar and float(extra[0]) != int(float(extra[0])):
        lo = 0.0  # a fractional power (x ** 0.5) is real for x >= 0 only
    else:
        lo = DOMAIN_MIN.get(fn)
    if lo is not None:
        return lambda x: torch.cat([fn(v, *extra, **kwargs) for v in x.clamp(min=lo).split(1)])
    return lambda x: torch.cat([fn(v, *extra, **kwargs) for v in x.split(1)])


# Why one element at a time: ATen's vectorised float64 kernels (elu's exp, sigmoid, ...) can differ
# from the scalar ones by an ulp, and which elements take the vector path depends on the CPU's SIMD
# width.  An ulp matters where a function reaches a value that is a rounding tie (elu's asymptote
# -alpha = -2.5 with output scale 1): evaluated per element, the table is the same on every machine.


# Step functions stay int8: the int16 table interpolates across their jumps (measured over all 65536
# inputs at input scale 1e-3: sign off by up to 1.49, frac wrong by > 1% of its range on 24% of the
# inputs, floor/round/threshold by up to ~1 on 5%), where the int8 table is exact at every grid point.
STEP_FUNCTIONS = {_aten.sign.default, _aten.sgn.default, _aten.floor.default, _aten.ceil.default,
                  _aten.round.default, _aten.trunc.default, _aten.frac.default, _aten.threshold.default,
                  _aten.hardshrink.default}


def lower_lut(m: Match):
    """A standalone quantized elementwise activation -> ``quantized_lut`` with its table computed
    from the float function and the input/output quantization parameters (int8: 256 entries;
    int16: 513 interpolated entries)."""
    if len(m.inputs) != 1:
        raise LoweringError("an elementwise activation needs exactly one quantized tensor input")
    x = m.inputs[0]
    if x.qparams.dtype != m.output.dtype:
        raise LoweringError(f"{m.node.name}: a {x.qparams.dtype} input with a {m.output.dtype} output; a table "
                            "maps int8 to int8 or int16 to int16")
    fn = {**FUNCTIONS, **CLAMPS}.get(m.node.target)
    if x.qparams.dtype == torch.int16 and fn in (_aten.sigmoid.default, _aten.tanh.default) and m.activation is None:
        return _lower_activation_s16(m, x, TANH if fn is _aten.tanh.default else SIGMOID)
    try:
        if x.qparams.dtype == torch.int16:
            table = build_table16(real_function(m.node), x.qparams.scale, m.output.scale)
        else:
            table = build_table(real_function(m.node), x.qparams.scale, x.qparams.zero_point,
                                m.output.scale, m.output.zero_point)
    except ValueError as e:
        raise LoweringError(f"{m.node.name}: {e}") from e
    # A clamp the lowering saw fused after this node (no quantize in between) folds into the table.
    lo, hi = m.activation_bounds
    table = table.clamp(lo, hi)
    return m.call("quantized_lut", x.node, m.add_constant(table, "table"))


lowers(*(t for t in {**FUNCTIONS, **CLAMPS} if FUNCTIONS.get(t, t) not in STEP_FUNCTIONS),
       formats=(A8W8, A16W8))(lower_lut)
lowers(*(t for t in FUNCTIONS if FUNCTIONS[t] in STEP_FUNCTIONS))(lower_lut)


def _lower_activation_s16(m: Match, x, function: int):
    """int16 sigmoid / tanh -> ``quantized_activation_s16`` (TFLite's 16x8 Logistic / Tanh: output
    scale 1/32768, zero point 0)."""
    if (m.output.scale, m.output.zero_point) != SIGMOID_QPARAMS_S16:
        raise LoweringError(f"{m.node.name}: int16 {'tanh' if function == TANH else 'sigmoid'} output quantized with "
                            f"scale {m.output.scale}, zero point {m.output.zero_point}; TFLite's 16x8 kernel needs "
                            "1/32768 and 0 (use CortenQuantizer)")
    try:
        mult, shift = activation_s16_params(x.qparams.scale)
    except ValueError as e:
        raise LoweringError(f"{m.node.name}: {e}") from e
    return m.call("quantized_activation_s16", x.node, m.add_constant(sigmoid_table(), "sigmoid_table"), mult, shift,
                  function)


# ``corten_lut_s8``/``_s16``, ``corten_activation_s16`` and ``arm_nn_activation_s16`` need no buffer;
# they are elementwise, so the output may overwrite the input.


# ----------------------------------------------------------------------------- C emission
def _size(ctx) -> int:
    size = 1
    for d in ctx.shape(ctx.arg("input")):
        size *= int(d)
    return size


@PORTABLE.kernel("quantized_lut", act=(torch.int8,))
def _lut_s8(ctx) -> str:
    """One ``corten_lut_s8`` call: CMSIS-NN has no generic s8 table-lookup kernel (its
    ``arm_relu6_s8``/``arm_relu_q7`` clamp raw values without quantization parameters)."""
    table = ctx.const("table", torch.int8)
    return ctx.call("corten_lut_s8", ctx.input("input"), table, ctx.out(), _size(ctx))


@PORTABLE.kernel("quantized_lut", act=(torch.int16,))
def _lut_s16(ctx) -> str:
    """One ``corten_lut_s16`` call (TFLite's 513-entry interpolated table)."""
    table = ctx.const("table", torch.int16)
    x, out = ctx.typed_input("input"), ctx.typed_out()
    return ctx.call("corten_lut_s16", x, table, out, _size(ctx))


def _lut_cmsis_reason(node, target) -> str:
    wide = NodeView(node, target).dtype() == torch.int16
    return f"CMSIS-NN has no generic {'int16' if wide else 'int8'} lookup-table kernel"


CMSIS_NN.declines("quantized_lut", reason=_lut_cmsis_reason)


def _activation_args(ctx) -> tuple[int, int, int, str, str]:
    mult, shift, function = (int(ctx.arg(a)) for a in ("input_multiplier", "input_shift", "function"))
    return mult, shift, function, ctx.typed_input("input"), ctx.typed_out()


def _cmsis_activation_supports(node, target) -> str | None:
    v = NodeView(node, target)
    mult, shift = int(v.arg("input_multiplier")), int(v.arg("input_shift"))
    if cmsis_left_shift(mult, shift) is None:
        return (f"input multiplier {mult} >> {shift} is not 3 * 2**j (arm_nn_activation_s16 takes power-of-two "
                "input scales only)")
    return None


@CMSIS_NN.kernel("quantized_activation_s16", supports=_cmsis_activation_supports)
def _activation_s16_cmsis(ctx) -> str:
    """``arm_nn_activation_s16`` (the multiplier is ``3 * 2**j``: a power-of-two input scale)."""
    mult, shift, function, x, out = _activation_args(ctx)
    kind = "ARM_TANH" if function == TANH else "ARM_SIGMOID"
    return ctx.call("arm_nn_activation_s16", x, out, _size(ctx), cmsis_left_shift(mult, shift), kind)


@PORTABLE.kernel("quantized_activation_s16")
def _activation_s16_portable(ctx) -> str:
    """``corten_activation_s16`` (TFLite's int16 Logistic/Tanh at any input scale)."""
    mult, shift, function, x, out = _activation_args(ctx)
    table = ctx.const("table", torch.int16)
    return ctx.call("corten_activation_s16", x, f"(const uint16_t *)(const void *){table}", mult, shift, function, out,
                    _size(ctx))


@family.provides("in_place_inputs", "quantized_activation_s16")
def _activation_s16_in_place_inputs(node) -> tuple[int, ...]:
    """Elementwise: each output element reads only the input element at its index."""
    return (0,)


@family.provides("in_place_inputs", "quantized_lut")
def _quantized_lut_in_place_inputs(node) -> tuple[int, ...]:
    """Inputs the kernel may overwrite with its output (a table lookup per byte: output may be the input buffer)."""
    return (0,)
