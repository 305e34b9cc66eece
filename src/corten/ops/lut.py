"""``quantized_lut``: any elementwise int8 -> int8 function as a 256-entry lookup table.

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
"""
from __future__ import annotations

import math
from typing import Any, Callable

import torch

from corten.errors import LoweringError
from corten.fixed_point import round_half_away_t as round_half_away  # exact ties-away rounding
from corten.ops import checks
from corten.ops._common import layout_of
from corten.ops._rules import Match
from corten.ops.registry import OpFamily, annotates, lowers, register_family

FAMILY = "lut"
TABLE_SIZE = 256
INPUT_BIAS = 128  # table index of input value q is q + 128


def _check(input: torch.Tensor, table: torch.Tensor) -> None:
    op = "quantized_lut"
    checks.dtype(op, "input", input, torch.int8)
    checks.dtype(op, "table", table, torch.int8)
    checks.shape(op, "table", table, (TABLE_SIZE,))


@torch.library.custom_op("corten::quantized_lut", mutates_args=())
def quantized_lut(input: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    _check(input, table)
    index = input.to(torch.int64) + INPUT_BIAS
    return table[index].contiguous(memory_format=layout_of(input))


@quantized_lut.register_fake
def _(input, table):
    _check(input, table)
    return torch.empty_like(input, memory_format=layout_of(input))


family = register_family(OpFamily(FAMILY, ("quantized_lut",), doc=__doc__))


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
# TFLite's fixed output quantization: sigmoid in [0, 1), tanh in [-1, 1).
SIGMOID_QPARAMS = (1.0 / 256.0, -128)
TANH_QPARAMS = (1.0 / 128.0, 0)

annotates("fixed", _aten.sigmoid.default, _aten.sigmoid_.default, fixed=SIGMOID_QPARAMS)
annotates("fixed", _aten.tanh.default, _aten.tanh_.default, fixed=TANH_QPARAMS)
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


@lowers(*FUNCTIONS, *CLAMPS)
def lower_lut(m: Match):
    """A standalone quantized elementwise activation -> ``quantized_lut`` with its table computed
    from the float function and the input/output quantization parameters."""
    if len(m.inputs) != 1:
        raise LoweringError("an elementwise activation needs exactly one quantized tensor input")
    x = m.inputs[0]
    try:
        table = build_table(real_function(m.node), x.qparams.scale, x.qparams.zero_point,
                            m.output.scale, m.output.zero_point)
    except ValueError as e:
        raise LoweringError(f"{m.node.name}: {e}") from e
    # A clamp the lowering saw fused after this node (no quantize in between) folds into the table.
    lo, hi = m.activation_bounds
    table = table.clamp(lo, hi)
    return m.call("quantized_lut", x.node, m.add_constant(table, "table"))


# ----------------------------------------------------------------------------- scratch memory
@family.provides("scratch_bytes", "quantized_lut")
def _lut_scratch(node: Any, target: Any) -> int:
    """``corten_lut_s8`` needs no buffer; it is elementwise, so its output may overwrite its input."""
    return 0


# ----------------------------------------------------------------------------- C emission
@family.provides("emit_c", "quantized_lut")
def _emit_lut_c(ctx) -> str:
    """One ``corten_lut_s8`` call, in both flavours: CMSIS-NN has no generic s8 table-lookup
    kernel (its ``arm_relu6_s8``/``arm_relu_q7`` clamp raw values without quantization
    parameters), so the "cmsis-nn" flavour runs Corten's portable kernel too."""
    ctx.portable_kernel("CMSIS-NN has no generic int8 lookup-table kernel")
    size = 1
    for d in ctx.shape(ctx.arg("input")):
        size *= int(d)
    table = ctx.const("table", torch.int8)
    return ctx.call(f"corten_lut_s8({ctx.input('input')}, {table}, {ctx.out()}, {size})")


@family.provides("in_place_inputs", "quantized_lut")
def _quantized_lut_in_place_inputs(node) -> tuple[int, ...]:
    """Inputs the kernel may overwrite with its output (a table lookup per byte: output may be the input buffer)."""
    return (0,)
