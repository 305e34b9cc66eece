"""``quantized_mul``: CMSIS-NN's ``arm_elementwise_mul_s8``, with numpy broadcasting.

Per output element, in int32 exactly as the C kernels (``x1``/``x2`` the broadcast input values)::

    y = clamp(requantize((x1 + input1_offset) * (x2 + input2_offset), output_multiplier, output_shift)
              + output_offset, activation_min, activation_max)

The product lies in [-255 * 255, 255 * 255], so it cannot overflow.  The compiler derives one
multiplier/shift from the effective scale ``s1 * s2 / s_out`` (TFLite's ``PrepareMul``).

Broadcasting follows torch/numpy: shapes are aligned on the right and a dimension of size 1 is
repeated.  This covers the squeeze-and-excitation gate ``[N, C, H, W] * [N, C, 1, 1]`` and
per-row scaling of 2-D tensors.  Ranks up to 4 are supported (the C kernels loop over 4 dims).

A multiply by a constant is lowered too: by a Python number ``k`` the second operand is the
one-element int8 constant ``[sign(k)]`` with scale ``|k|`` (so ``|k|`` is folded exactly into the
requantization ``s_x * |k| / s_out``); by a constant tensor, its int8 values (quantized per tensor
by CortenQuantizer) are the second operand, read from a row-major constant array in C.

This module also holds the broadcast geometry shared by the elementwise families (sub, minmax):
:func:`loop_geometry` gives, for an output shape and one input shape, the output's dims in C
storage order and the input's element strides along them (0 where the input is broadcast).
"""
from __future__ import annotations

import torch

from corten.errors import LoweringError
from corten.fixed_point import clamp_activation, requantize, wrap_int32_t
from corten.ops import checks
from corten.ops._broadcast import (  # noqa: F401  (loop_geometry etc. re-exported for existing users)
    broadcast_shape,
    broadcast_struct,
    dense_full_operands,
    empty_output,
    is_dense,
    loop_geometry,
    numel,
    operand_expr,
    output_layout,
    requantized_binary_op,
    row_broadcast,
    typed_operands,
    same_dense_shape,
    storage_strides,
)
from corten.ops._common import (MAX_RANK, check_lowerable_shapes, check_ranks, constant_operand,  # noqa: F401
                                effective_multiplier)
from corten.ops._rules import Match
from corten.ops.registry import A8W8, A16W8, OpFamily, annotates, lowers, register_family
from corten.providers import CMSIS_NN, PORTABLE, NodeView
from corten.providers.base import tensor_dtype

FAMILY = "mul"


# ----------------------------------------------------------------------------- the op
def _check(input1, input2, input1_offset, input2_offset, output_offset, output_multiplier, output_shift,
           activation_min, activation_max) -> tuple[int, ...]:
    op = "quantized_mul"
    if _wide(input1, input2):  # 16x8 (TFLite's int16 MUL, arm_elementwise_mul_s16): no offsets
        for name, v in (("input1_offset", input1_offset), ("input2_offset", input2_offset),
                        ("output_offset", output_offset)):
            checks.in_range(op, name, v, 0, 0)
        checks.scalar_multiplier(op, "output_multiplier", output_multiplier)
        checks.scalar_shift(op, "output_shift", output_shift)
        checks.activation(op, activation_min, activation_max, torch.int16)
    else:
        checks.requantized_binary(op, ("input1", "input2"), input1, input2, input1_offset, input2_offset,
                                  output_offset, output_multiplier, output_shift, activation_min, activation_max)
    return broadcast_shape(op, input1, input2)


def _wide(input1, input2) -> bool:
    """Both operands int16 (the 16x8 multiply; |x1 * x2| <= 2**30 fits in int32)."""
    return all(isinstance(t, torch.Tensor) and t.dtype == torch.int16 for t in (input1, input2))


def _product(input1, input2, input1_offset, input2_offset, output_offset, output_multiplier, output_shift,
             activation_min, activation_max) -> torch.Tensor:
    product = (input1.to(torch.int64) + input1_offset) * (input2.to(torch.int64) + input2_offset)
    out = wrap_int32_t(requantize(product, output_multiplier, output_shift) + output_offset)
    return clamp_activation(out, activation_min, activation_max, input1.dtype)


quantized_mul = requantized_binary_op("quantized_mul", _check, _product)


family = register_family(OpFamily(FAMILY, ("quantized_mul",), doc=__doc__))


# ----------------------------------------------------------------------------- lowering

annotates("binary", torch.ops.aten.mul.Tensor, torch.ops.aten.mul_.Tensor)


@lowers(torch.ops.aten.mul.Tensor, formats=(A8W8, A16W8))
def lower_mul(m: Match):
    """``aten.mul.Tensor`` -> ``quantized_mul``: of two int8 tensors (numpy broadcasting), or of an
    int8 tensor and a constant, which becomes the op's second operand (see :func:`constant_operand`)."""
    if len(m.inputs) == 1:
        check_ranks(m, "mul")
        x = m.inputs[0]
        values, qparams = constant_operand(m, x)
        b_node, b_qparams = m.add_constant(values, "operand"), qparams
    else:
        check_lowerable_shapes(m, "mul")
        x, b = m.inputs
        b_node, b_qparams = b.node, b.qparams
    if m.output.dtype == torch.int16 and not (x.qparams.dtype == b_qparams.dtype == torch.int16):
        raise LoweringError("an int16 mul needs two int16 operands (a constant operand or an int8 one: keep the op "
                            "int8 with precision=)")
    scale = float(x.qparams.scale) * float(b_qparams.scale) / float(m.output.scale)
    mult, shift = effective_multiplier(scale, f"mul: effective scale s1 * s2 / s_out = {scale:g}")
    act_min, act_max = m.activation_bounds
    return m.call("quantized_mul", x.node, b_node, x.qparams.offset, b_qparams.offset, m.output.zero_point,
                  mult, shift, act_min, act_max)


@family.provides("in_place_inputs", "quantized_mul")
def _quantized_mul_in_place_inputs(node) -> tuple[int, ...]:
    """``arm_elementwise_mul_s8`` (whole tensor or per repeated block) and ``corten_mul_s8`` write
    each output byte after reading the operands at its index: the output may take the bytes of
    an operand of the output's shape and order (:func:`dense_full_operands`)."""
    return dense_full_operands(node)


# ----------------------------------------------------------------------------- kernels
_NAMES = ("input1_offset", "input2_offset", "output_offset", "output_multiplier", "output_shift",
          "activation_min", "activation_max")


def _operands(ctx) -> tuple[dict, str, str, str]:
    return ({k: ctx.int_(int(ctx.arg(k))) for k in _NAMES}, *typed_operands(ctx))


def _cmsis_mul_supports(node, target) -> str | None:
    v = NodeView(node, target)
    if same_dense_shape(v) or row_broadcast(v) is not None:
        return None
    return ("broadcast that is not one operand repeated in dense blocks (arm_elementwise_mul_s8 takes "
            "equal-length vectors)")


def _cmsis_mul_s16_supports(node, target) -> str | None:
    if same_dense_shape(NodeView(node, target)):
        return None
    return "int16 broadcast (arm_elementwise_mul_s16 takes equal-length vectors)"


_PORTABLE_MUL = {torch.int8: "corten_mul_s8", torch.int16: "corten_elementwise_mul_s16"}


@PORTABLE.kernel("quantized_mul", act=tuple(_PORTABLE_MUL))
def _mul_portable(ctx) -> str:
    """``corten_mul_s8`` (``corten_elementwise_mul_s16`` for 16x8; any broadcast)."""
    v, x1, x2, out = _operands(ctx)
    return ctx.block(
        ctx.params("corten_mul_params", "params", {k: v[k] for k in _NAMES}),
        broadcast_struct(ctx),
        ctx.call(_PORTABLE_MUL[tensor_dtype(ctx.node)], "&params", "&shape", x1, x2, out))


def _cmsis_args(v: dict, p1: str, p2: str, o: str, size: str) -> list[str]:
    return [p1, p2, v["input1_offset"], v["input2_offset"], o, v["output_offset"], v["output_multiplier"],
            v["output_shift"], v["activation_min"], v["activation_max"], size]


@CMSIS_NN.kernel("quantized_mul", act=(torch.int8,), supports=_cmsis_mul_supports)
def _cmsis_mul_s8(ctx) -> str:
    """Same-shape operands: one ``arm_elementwise_mul_s8`` call; the per-channel broadcast: one call
    per repeated block (CMSIS-NN has no broadcasting s8 multiply)."""
    v, x1, x2, out = _operands(ctx)
    if same_dense_shape(ctx):
        return ctx.call("arm_elementwise_mul_s8", *_cmsis_args(v, x1, x2, out, str(numel(ctx.shape()))))
    full, outer, inner = row_broadcast(ctx)
    p1 = f"{x1} + i * {inner}" if full == "input1" else x1
    p2 = f"{x2} + i * {inner}" if full == "input2" else x2
    body = ctx.call("arm_elementwise_mul_s8", *_cmsis_args(v, p1, p2, f"{out} + i * {inner}", str(inner)))
    return ctx.block("int32_t i;", f"for (i = 0; i < {outer}; i++) {{",
                     "\n".join("    " + line for line in body.split("\n")), "}")


@CMSIS_NN.kernel("quantized_mul", act=(torch.int16,), supports=_cmsis_mul_s16_supports)
def _cmsis_mul_s16(ctx) -> str:
    """16x8 multiply of same-shape operands: ``arm_elementwise_mul_s16``."""
    v, x1, x2, out = _operands(ctx)
    return ctx.call("arm_elementwise_mul_s16", *_cmsis_args(v, x1, x2, out, str(numel(ctx.shape()))))
