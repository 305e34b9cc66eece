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

from corten.ops._broadcast import (PARAM_NAMES, broadcast_struct, cmsis_add_call, cmsis_add_rows, cmsis_add_supports,
                                   dense_full_operands, numel, rescaled_binary_op, rescaled_operands, same_dense_shape)
from corten.ops._common import lower_rescaled_binary
from corten.ops._rules import Match
from corten.ops.registry import OpFamily, annotates, lowers, register_family
from corten.providers import CMSIS_NN, PORTABLE

FAMILY = "sub"


quantized_sub = rescaled_binary_op("quantized_sub", -1)


family = register_family(OpFamily(FAMILY, ("quantized_sub",), doc=__doc__))


# ----------------------------------------------------------------------------- lowering

annotates("binary", torch.ops.aten.sub.Tensor, torch.ops.aten.sub_.Tensor)


@lowers(torch.ops.aten.sub.Tensor)
def lower_sub(m: Match):
    """``aten.sub.Tensor`` (alpha 1) of two int8 tensors (numpy broadcasting), or of a tensor and a
    constant in either order -> ``quantized_sub`` (see :func:`corten.ops._common.binary_operands`)."""
    return lower_rescaled_binary(m, "sub", "quantized_sub", "")


@family.provides("in_place_inputs", "quantized_sub")
def _quantized_sub_in_place_inputs(node) -> tuple[int, ...]:
    """As quantized_add (same kernels, input2's multiplier negated): operands of the output's
    shape and order (:func:`dense_full_operands`)."""
    return dense_full_operands(node)


# ----------------------------------------------------------------------------- kernels
@PORTABLE.kernel("quantized_sub")
def _sub_portable(ctx) -> str:
    """``corten_sub_s8`` (any broadcast)."""
    v, x1, x2, out = rescaled_operands(ctx)
    return ctx.block(
        ctx.params("corten_sub_params", "params", {k: v[k] for k in PARAM_NAMES}),
        broadcast_struct(ctx),
        ctx.call("corten_sub_s8", "&params", "&shape", x1, x2, out))


@CMSIS_NN.kernel("quantized_sub", act=(torch.int8,), supports=cmsis_add_supports)
def _sub_cmsis(ctx) -> str:
    """``arm_elementwise_add_s8`` with input2's multiplier negated (CMSIS-NN has no s8 subtract),
    once for same-shape operands or once per repeated block in the per-channel broadcast case
    (:func:`corten.ops._broadcast.cmsis_add_rows`)."""
    v, x1, x2, out = rescaled_operands(ctx)
    if same_dense_shape(ctx):
        return cmsis_add_call(ctx, x1, x2, out, v, str(numel(ctx.shape())), negate2=True)
    return cmsis_add_rows(ctx, x1, x2, out, v, negate2=True)
