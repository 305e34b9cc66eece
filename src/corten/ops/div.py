"""``quantized_div``: elementwise division of two int8 tensors, exact in integer arithmetic, with
numpy broadcasting (CMSIS-NN and TFLite Micro have no int8 DIV; this is Corten's own kernel).

With ``a = x1 + input1_offset`` and ``b = x2 + input2_offset`` (both in [-255, 255], the real values
over their scales), per output element::

    q = sign(a * b) * ((|a| * 2**16 + |b| / 2) / |b|)          (C division; |a| * 2**16 < 2**24)
    y = clamp(requantize(q, output_multiplier, output_shift) + output_offset, act_min, act_max)

i.e. the quotient ``a / b`` in Q16, rounded half away from zero (relative error <= 2**-9 for a
non-zero quotient), then one requantization by ``s1 / (s2 * s_out * 2**16)``.  A zero divisor
(``b == 0``) saturates: ``act_max`` for ``a > 0``, ``act_min`` for ``a < 0``, and ``0 / 0`` gives
the output zero point (clamped) - where float division gives inf / nan.

Lowering (``x / y``, ``torch.div``, ``torch.true_divide``; ``aten.div.Tensor``):

* ``x / k`` for a Python number ``k``: folded into the quantization - a ``quantized_mul`` by the
  one-element constant ``[sign(k)]`` of scale ``1 / |k|`` (the multiplier ``s_x / (|k| * s_out)``);
* ``x / y`` of two activations, ``x / c`` of a quantized constant tensor (e.g. a parameter) and
  ``k / x``: ``quantized_div`` (the constant as an int8 operand, a number ``k`` as ``[sign(k)]`` of
  scale ``|k|``).
* ``torch.reciprocal(x)`` (and ``k / x``, which exports as ``reciprocal(x) * k``): ``quantized_div``
  of the constant ``[1]``.
``rounding_mode="floor"|"trunc"`` (``aten.div.Tensor_mode``) is refused.
"""
from __future__ import annotations

import torch

from corten.errors import LoweringError
from corten.fixed_point import clamp_activation, requantize, wrap_int32_t
from corten.ops import checks
from corten.ops._broadcast import (
    broadcast_shape,
    broadcast_struct,
    dense_full_operands,
    operand_expr,
    requantized_binary_op,
)
from corten.ops._common import binary_operands, check_ranks, effective_multiplier
from corten.ops._rules import Match
from corten.ops.registry import OpFamily, annotates, lowers, register_family
from corten.providers import CMSIS_NN, PORTABLE

FAMILY = "div"
QUOTIENT_BITS = 16


def _check(input1, input2, input1_offset, input2_offset, output_offset, output_multiplier, output_shift,
           activation_min, activation_max) -> tuple[int, ...]:
    op = "quantized_div"
    checks.requantized_binary(op, ("input1", "input2"), input1, input2, input1_offset, input2_offset, output_offset,
                              output_multiplier, output_shift, activation_min, activation_max)
    return broadcast_shape(op, input1, input2)


def q16_quotient(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``sign(a * b) * ((|a| << 16) + |b| / 2) / |b|`` (int64 in, int64 out); 0 where ``b == 0``."""
    den = b.abs()
    num = (a.abs() << QUOTIENT_BITS) + den // 2
    q = torch.div(num, den.clamp(min=1), rounding_mode="trunc")
    q = torch.where((a < 0) != (b < 0), -q, q)
    return torch.where(den == 0, torch.zeros_like(q), q)


def _quotient(input1, input2, input1_offset, input2_offset, output_offset, output_multiplier, output_shift,
              activation_min, activation_max) -> torch.Tensor:
    a = input1.to(torch.int64) + input1_offset
    b = input2.to(torch.int64) + input2_offset
    a, b = torch.broadcast_tensors(a, b)
    out = wrap_int32_t(requantize(q16_quotient(a, b), output_multiplier, output_shift) + output_offset)
    out = clamp_activation(out, activation_min, activation_max)
    zero_div = torch.where(a > 0, activation_max, torch.where(a < 0, activation_min,
                                                              min(max(output_offset, activation_min), activation_max)))
    return torch.where(b == 0, zero_div.to(out.dtype), out)


quantized_div = requantized_binary_op("quantized_div", _check, _quotient)


family = register_family(OpFamily(FAMILY, ("quantized_div",), doc=__doc__))


# ----------------------------------------------------------------------------- lowering
annotates("binary", torch.ops.aten.div.Tensor, torch.ops.aten.div_.Tensor, torch.ops.aten.div.Tensor_mode,
          torch.ops.aten.true_divide.Tensor)


@lowers(torch.ops.aten.div.Tensor_mode)
def lower_div_mode(m: Match):
    mode = m.node.kwargs.get("rounding_mode", m.node.args[2] if len(m.node.args) > 2 else None)
    raise LoweringError(f"div with rounding_mode={mode!r} is not supported; use true division (x / y)")


@lowers(torch.ops.aten.div.Tensor, torch.ops.aten.true_divide.Tensor)
def lower_div(m: Match):
    """``x / k`` -> ``quantized_mul`` by ``1 / k`` (folded into the multiplier); every other
    division -> ``quantized_div``."""
    divisor = m.node.args[1] if len(m.node.args) > 1 else None
    if len(m.inputs) == 1 and isinstance(divisor, (int, float)) and not isinstance(divisor, bool):
        check_ranks(m, "div")
        if divisor == 0 or divisor != divisor or divisor in (float("inf"), float("-inf")):
            raise LoweringError(f"division by {divisor!r}: the divisor must be a finite non-zero number")
        x = m.inputs[0]
        scale = float(x.qparams.scale) / (abs(float(divisor)) * float(m.output.scale))
        mult, shift = effective_multiplier(scale, f"div: effective scale s_x / (|k| * s_out) = {scale:g}")
        sign = m.add_constant(torch.tensor([-1 if divisor < 0 else 1], dtype=torch.int8), "reciprocal_sign")
        act_min, act_max = m.activation_bounds
        return m.call("quantized_mul", x.node, sign, x.qparams.offset, 0, m.output.zero_point, mult, shift,
                      act_min, act_max)
    a, b = binary_operands(m, "div")
    scale = float(a.qparams.scale) / (float(b.qparams.scale) * float(m.output.scale) * (1 << QUOTIENT_BITS))
    mult, shift = effective_multiplier(
        scale, f"div: effective scale s1 / (s2 * s_out) = {scale * (1 << QUOTIENT_BITS):g}")
    act_min, act_max = m.activation_bounds
    return m.call("quantized_div", a.node, b.node, a.qparams.offset, b.qparams.offset, m.output.zero_point, mult,
                  shift, act_min, act_max)


annotates("unary", torch.ops.aten.reciprocal.default)


@lowers(torch.ops.aten.reciprocal.default)
def lower_reciprocal(m: Match):
    """``1 / x`` (``torch.reciprocal``; ``k / x`` exports as ``reciprocal(x) * k``) -> ``quantized_div``
    of the one-element constant ``[1]`` (scale 1) by ``x``."""
    check_ranks(m, "reciprocal")
    x = m.inputs[0]
    one = m.add_constant(torch.tensor([1], dtype=torch.int8), "one")
    scale = 1.0 / (float(x.qparams.scale) * float(m.output.scale) * (1 << QUOTIENT_BITS))
    mult, shift = effective_multiplier(scale, "reciprocal: effective scale 1 / (s_x * s_out)")
    act_min, act_max = m.activation_bounds
    return m.call("quantized_div", one, x.node, 0, x.qparams.offset, m.output.zero_point, mult, shift,
                  act_min, act_max)


# ----------------------------------------------------------------------------- scratch memory
@family.provides("in_place_inputs", "quantized_div")
def _quantized_div_in_place_inputs(node) -> tuple[int, ...]:
    """``corten_div_s8`` writes each output byte after reading the operands at its index: an
    operand of the output's shape and order may be overwritten (:func:`dense_full_operands`)."""
    return dense_full_operands(node)


# ----------------------------------------------------------------------------- C emission
@PORTABLE.kernel("quantized_div")
def _emit_div_c(ctx) -> str:
    """``corten_div_s8`` (portable, in both flavours: CMSIS-NN has no int8 division)."""
    names = ("input1_offset", "input2_offset", "output_offset", "output_multiplier", "output_shift",
             "activation_min", "activation_max")
    v = {k: ctx.int_(int(ctx.arg(k))) for k in names}
    x1, x2, out = operand_expr(ctx, "input1"), operand_expr(ctx, "input2"), ctx.out()
    return ctx.block(
        ctx.params("corten_mul_params", "params", {k: v[k] for k in names}),
        broadcast_struct(ctx),
        ctx.call("corten_div_s8", "&params", "&shape", x1, x2, out))


CMSIS_NN.declines("quantized_div", reason="CMSIS-NN has no int8 division")
