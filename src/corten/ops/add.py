"""``quantized_add``: CMSIS-NN's ``arm_elementwise_add_s8`` arithmetic, with numpy broadcasting.

Per output element, in int32 exactly as the C kernels (``x1``/``x2`` the broadcast input values)::

    a = requantize((x1 + input1_offset) << left_shift, input1_multiplier, input1_shift)
    b = requantize((x2 + input2_offset) << left_shift, input2_multiplier, input2_shift)
    y = clamp(requantize(a + b, output_multiplier, output_shift) + output_offset, act_min, act_max)

The compiler derives the multipliers the TFLite way: with ``twice_max = 2 * max(s1, s2)``,
``left_shift = 20``, input scales ``s_i / twice_max`` and output scale
``twice_max / (2**left_shift * s_out)``.

Broadcasting is sub's and mul's (:mod:`corten.ops._broadcast`: shapes aligned on the right, ranks 1..4).
``x + k`` with a Python number ``k`` adds the one-element int8 constant ``[sign(k)]`` of scale
``|k|`` (so ``k`` enters the input2 multiplier exactly), and ``x + c`` with a constant tensor
(e.g. a bias parameter ``[C, 1, 1]``) adds its int8 values, quantized per tensor by
CortenQuantizer (:func:`corten.ops._common.constant_operand`).

C: same-shape operands run ``corten_add_s8`` / ``arm_elementwise_add_s8`` over the flat buffers
(in place allowed); broadcasting runs ``corten_add_broadcast_s8``, or with CMSIS-NN, when one
operand is a block repeated along the outer dims (the per-channel case ``[N, C, H, W] + [C, 1, 1]``:
one C-vector per pixel in NHWC), one ``arm_elementwise_add_s8`` call per repetition.
"""
from __future__ import annotations

import torch

from corten.ops._broadcast import (
    PARAM_NAMES,
    broadcast_struct,
    cmsis_add_call,
    cmsis_add_rows,
    cmsis_add_supports,
    dense_full_operands,
    numel,
    rescaled_binary_op,
    rescaled_operands,
    same_dense_shape,
)
from corten.ops._common import lower_rescaled_binary
from corten.ops._rules import Match
from corten.ops.registry import A8W8, A16W8, ROW_WISE, Hook, OpFamily, annotates, lowers, register_family
from corten.providers import CMSIS_NN, PORTABLE, NodeView, kernel_suffix
from corten.providers.base import tensor_dtype

FAMILY = "add"


quantized_add = rescaled_binary_op("quantized_add", 1)


family = register_family(OpFamily(FAMILY, ("quantized_add",), doc=__doc__))
family.provides(Hook.WINDOW)(lambda node: ROW_WISE)  # same-shape operands: output row r reads row r


# ----------------------------------------------------------------------------- lowering
annotates("binary", torch.ops.aten.add.Tensor, torch.ops.aten.add_.Tensor)


@lowers(torch.ops.aten.add.Tensor, formats=(A8W8, A16W8))
def lower_add(m: Match):
    """``aten.add.Tensor`` (alpha 1) of two int8 tensors (numpy broadcasting), or of an int8 tensor
    and a constant -> ``quantized_add``."""
    return lower_rescaled_binary(m, "add", "quantized_add", " (scale the operand with a mul instead)")


# ----------------------------------------------------------------------------- kernels
def _cmsis_s16_supports(node, target) -> str | None:
    if same_dense_shape(NodeView(node, target)):
        return None
    return "int16 broadcast (arm_elementwise_add_s16 takes equal-length vectors)"


@PORTABLE.kernel("quantized_add", act=(torch.int8, torch.int16))
def _add_portable(ctx) -> str:
    """Same shape: one ``corten_add_s8`` call (safe when the planner puts the output over an input);
    broadcasting: ``corten_add_broadcast_s8`` (``_s16`` for 16x8)."""
    v, x1, x2, out = rescaled_operands(ctx)
    suffix = kernel_suffix(tensor_dtype(ctx.node))
    params = ctx.params("corten_add_params", "params", {k: v[k] for k in PARAM_NAMES})
    if same_dense_shape(ctx):
        return ctx.block(params, ctx.call(f"corten_add_{suffix}", "&params", x1, x2, out, numel(ctx.shape())))
    return ctx.block(params, broadcast_struct(ctx),
                     ctx.call(f"corten_add_broadcast_{suffix}", "&params", "&shape", x1, x2, out))


@CMSIS_NN.kernel("quantized_add", act=(torch.int8,), supports=cmsis_add_supports)
def _cmsis_add_s8(ctx) -> str:
    """``arm_elementwise_add_s8`` once (same shape) or once per repeated block
    (:func:`corten.ops._broadcast.cmsis_add_rows`)."""
    v, x1, x2, out = rescaled_operands(ctx)
    if same_dense_shape(ctx):
        return cmsis_add_call(ctx, x1, x2, out, v, str(numel(ctx.shape())))
    return cmsis_add_rows(ctx, x1, x2, out, v)


@CMSIS_NN.kernel("quantized_add", act=(torch.int16,), supports=_cmsis_s16_supports)
def _cmsis_add_s16(ctx) -> str:
    """``arm_elementwise_add_s16`` (same shape only)."""
    v, x1, x2, out = rescaled_operands(ctx)
    return ctx.call("arm_elementwise_add_s16", x1, x2, 0, v["input1_multiplier"], v["input1_shift"], 0,
                    v["input2_multiplier"], v["input2_shift"], v["left_shift"], out, 0, v["output_multiplier"],
                    v["output_shift"], v["activation_min"], v["activation_max"], str(numel(ctx.shape())))


@family.provides("in_place_inputs", "quantized_add")
def _quantized_add_in_place_inputs(node) -> tuple[int, ...]:
    """Inputs the kernel may overwrite with its output: the operands of the output's shape."""
    return dense_full_operands(node)
