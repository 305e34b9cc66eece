"""``quantized_sub``: TFLite's int8 SUB, i.e. the ``arm_elementwise_add_s8`` arithmetic with input2's
multiplier negated, with numpy broadcasting.

Per output element, in int32 exactly as the C kernels (``x1``/``x2`` the broadcast input values)::

    a = requantize((x1 + input1_offset) << left_shift, input1_multiplier, input1_shift)
    b = requantize((x2 + input2_offset) << left_shift, -input2_multiplier, input2_shift)
    y = clamp(requantize(a + b, output_multiplier, output_shift) + output_offset, act_min, act_max)

The op takes the *positive* multipliers that the add recipe derives (``corten.ops._qparams.
add_params``: ``twice_max = 2 * max(s1, s2)``, left shift 20) and negates input2's itself, as
TFLite's and NNAPI's SUB preparation do to reuse their add kernels.  Negating is not the same as
subtracting ``requantize(.., +m)``: the doubling high multiply rounds ties towards +inf, so
``requantize(v, -m) == -requantize(v, m)`` fails on exact ties; this op defines the negated form.
``arm_nn_requantize`` documents multipliers in ``[NN_Q31_MIN + 1, Q31_MAX]``, so with CMSIS-NN the
same-shape case is one ``arm_elementwise_add_s8`` call with ``-input2_multiplier``.

``x - c`` with a Python number or a quantized constant tensor ``c`` (and ``c - x`` for a tensor)
is lowered with ``c`` as an int8 constant operand, as for mul (``corten.ops._common.constant_operand``).
"""
from __future__ import annotations

import torch

from corten.errors import LoweringError
from corten.ops import checks
from corten.ops._broadcast import (
    broadcast_shape,
    broadcast_struct,
    empty_output,
    numel,
    operand_expr,
    output_layout,
    same_dense_shape,
)
from corten.ops._common import (
    RESCALED_BINARY_PARAMS, RESCALED_BINARY_SCHEMA, check_lowerable_shapes, check_ranks, constant_operand,
    is_activation_operand, rescaled_binary,
)
from corten.ops._qparams import add_params
from corten.ops._rules import Int8Value, Match
from corten.ops.registry import OpFamily, annotates, lowers, register_family

FAMILY = "sub"


def _check(input1, input2, *params) -> tuple[int, ...]:
    op = "quantized_sub"
    checks.dtype(op, "input1", input1, torch.int8)
    checks.dtype(op, "input2", input2, torch.int8)
    shape = broadcast_shape(op, input1, input2)
    checks.rescaled_binary(op, *params)
    return shape


@torch.library.custom_op("corten::quantized_sub", mutates_args=(), schema=RESCALED_BINARY_SCHEMA)
def quantized_sub(input1: torch.Tensor, input2: torch.Tensor, *params: int) -> torch.Tensor:
    """``params``: the 12 scalars of :data:`corten.ops._common.RESCALED_BINARY_PARAMS` (input2's
    multiplier positive; the op negates it)."""
    shape = _check(input1, input2, *params)
    out = rescaled_binary(input1, input2, params, negate_input2=True)
    return out.contiguous(memory_format=output_layout(shape))


@quantized_sub.register_fake
def _(input1, input2, *params):
    return empty_output(_check(input1, input2, *params), input1)


family = register_family(OpFamily(FAMILY, ("quantized_sub",), doc=__doc__))


# ----------------------------------------------------------------------------- lowering

annotates("binary", torch.ops.aten.sub.Tensor, torch.ops.aten.sub_.Tensor)


@lowers(torch.ops.aten.sub.Tensor)
def lower_sub(m: Match):
    """``aten.sub.Tensor`` (alpha 1) of two int8 tensors (numpy broadcasting) -> ``quantized_sub``."""
    if m.node.kwargs.get("alpha", 1) != 1:
        raise LoweringError("sub with alpha != 1 is not supported")
    if len(m.inputs) == 1:  # x - c or c - x: the constant becomes an int8 operand (see _common.constant_operand)
        check_ranks(m, "sub")
        x = m.inputs[0]
        values, qparams = constant_operand(m, x)
        const = Int8Value(m.add_constant(values, "operand"), qparams)
        a, b = (x, const) if is_activation_operand(m.node.args[0], x) else (const, x)
    else:
        check_lowerable_shapes(m, "sub")
        a, b = m.inputs
    try:
        p = add_params(a.qparams.scale, b.qparams.scale, m.output.scale)
    except ValueError as e:
        raise LoweringError(f"sub: the input/output scales cannot be requantized ({e})") from None
    act_min, act_max = m.activation_bounds
    return m.call("quantized_sub", a.node, b.node, a.qparams.offset, p.input1_multiplier, p.input1_shift,
                  b.qparams.offset, p.input2_multiplier, p.input2_shift, p.left_shift, m.output.zero_point,
                  p.output_multiplier, p.output_shift, act_min, act_max)


# ----------------------------------------------------------------------------- scratch memory
@family.provides("scratch_bytes", "quantized_sub")
def _sub_scratch(node, target) -> int:
    """Neither ``arm_elementwise_add_s8`` nor the portable broadcast kernel takes a buffer."""
    return 0


# ----------------------------------------------------------------------------- C emission
PARAM_NAMES = RESCALED_BINARY_PARAMS


@family.provides("emit_c", "quantized_sub")
def _emit_sub_c(ctx) -> str:
    """Same-shape operands with kernels="cmsis-nn": ``arm_elementwise_add_s8`` with input2's
    multiplier negated (CMSIS-NN has no s8 subtract).  Otherwise ``corten_sub_s8`` (portable), also
    in the CMSIS-NN flavour when the operands broadcast: CMSIS-NN's add does not broadcast."""
    v = {k: int(ctx.arg(k)) for k in PARAM_NAMES}
    x1, x2, out = operand_expr(ctx, "input1"), operand_expr(ctx, "input2"), ctx.out()
    # arm_elementwise_add_s8's DSP path shifts (x + offset) masked to 16 bits, which is only right
    # for left shifts >= 16 (the lowering always uses 20); other left shifts run the portable kernel.
    if ctx.kernels == "cmsis-nn" and same_dense_shape(ctx) and v["left_shift"] >= 16:
        args = [x1, x2, v["input1_offset"], v["input1_multiplier"], v["input1_shift"], v["input2_offset"],
                -v["input2_multiplier"], v["input2_shift"], v["left_shift"], out, v["output_offset"],
                v["output_multiplier"], v["output_shift"], v["activation_min"], v["activation_max"],
                numel(ctx.shape())]
        return ctx.call("arm_elementwise_add_s8(" + ", ".join(a if isinstance(a, str) else ctx.int_(a)
                                                                for a in args) + ")")
    ctx.portable_kernel()
    return ctx.block(
        ctx.params("corten_sub_params", "params", {k: v[k] for k in PARAM_NAMES}),
        broadcast_struct(ctx),
        ctx.call(f"corten_sub_s8(&params, &shape, {x1}, {x2}, {out})"))
