"""``quantized_maximum`` / ``quantized_minimum``: CMSIS-NN's ``arm_maximum_s8`` / ``arm_minimum_s8``.

TFLite's int8 MAXIMUM and MINIMUM require both inputs and the output to share one scale and zero
point, and CMSIS-NN's kernels take no quantization parameters: they compare the int8 values
(``max``/``min`` commute with the monotonic affine map).  Corten does the same: the quantizer
annotates ``aten.maximum``/``aten.minimum`` as *shared* (one observer for both inputs and the
output), and the lowering refuses operands whose qparams differ.

Broadcasting follows torch/numpy (shapes aligned on the right, size-1 dims repeated, ranks 1..4).
``arm_maximum_s8`` broadcasts too, over NHWC dims, but its row walk advances a pointer twice for one
shape pattern (an operand with ``W * C == 1`` and ``H > 1`` against one with ``W > 1``, e.g.
``[1, 1, H, 1]`` vs ``[1, C, H, W]`` in torch order): :func:`cmsis_broadcast_supported` routes those
shapes, and operands whose bytes are not in the output's loop order, to the portable kernel.
"""
from __future__ import annotations

from typing import Sequence

import torch

from corten.errors import LoweringError
from corten.ops import checks
from corten.ops._broadcast import (
    broadcast_shape,
    broadcast_struct,
    dense_full_operands,
    empty_output,
    is_dense,
    operand_expr,
    operand_geometry,
    output_layout,
)
from corten.ops._common import binary_operands
from corten.ops._rules import Match
from corten.ops.registry import OpFamily, annotates, lowers, register_family
from corten.providers import CMSIS_NN, PORTABLE, NodeView

FAMILY = "minmax"
OPS = {"quantized_maximum": torch.maximum, "quantized_minimum": torch.minimum}


def _check(op: str, input1, input2) -> tuple[int, ...]:
    checks.dtype(op, "input1", input1, torch.int8)
    checks.dtype(op, "input2", input2, torch.int8)
    return broadcast_shape(op, input1, input2)


def _reference(op: str, input1: torch.Tensor, input2: torch.Tensor) -> torch.Tensor:
    shape = _check(op, input1, input2)
    return OPS[op](input1, input2).contiguous(memory_format=output_layout(shape))


def _elementwise_op(name: str):
    """Define ``corten::<name>`` (``quantized_maximum`` / ``quantized_minimum``): reference and fake kernel."""
    def kernel(input1: torch.Tensor, input2: torch.Tensor) -> torch.Tensor:
        return _reference(name, input1, input2)

    kernel.__name__ = kernel.__qualname__ = name
    op = torch.library.custom_op(f"corten::{name}", kernel, mutates_args=())

    @op.register_fake
    def _(input1, input2):
        return empty_output(_check(name, input1, input2), input1)

    return op


quantized_maximum = _elementwise_op("quantized_maximum")
quantized_minimum = _elementwise_op("quantized_minimum")


family = register_family(OpFamily(FAMILY, tuple(OPS), doc=__doc__))


# ----------------------------------------------------------------------------- lowering

ATEN_OPS = {torch.ops.aten.maximum.default: "quantized_maximum", torch.ops.aten.minimum.default: "quantized_minimum"}
annotates("shared", *ATEN_OPS)


@lowers(*ATEN_OPS)
def lower_minmax(m: Match):
    """``aten.maximum``/``aten.minimum`` of two int8 tensors on one quantization grid (numpy
    broadcasting), or of a tensor and a constant tensor (its int8 values, quantized by CortenQuantizer
    on the shared grid, are the other operand) -> the Corten op."""
    what = "maximum" if m.node.target == torch.ops.aten.maximum.default else "minimum"
    a, b = binary_operands(m, what)
    if not (a.qparams == b.qparams == m.output):
        raise LoweringError(f"{what} needs both inputs and the output on one quantization grid (CMSIS-NN compares "
                            f"int8 values); got {a.qparams}, {b.qparams} -> {m.output}. Quantize the model with "
                            "CortenQuantizer, which shares them")
    if m.activation is not None:
        raise LoweringError(f"{what} followed by a fused activation is not supported")
    return m.call(ATEN_OPS[m.node.target], a.node, b.node)


@family.provides("in_place_inputs")
def _minmax_in_place_inputs(node) -> tuple[int, ...]:
    """``arm_maximum_s8``/``arm_minimum_s8`` and the portable kernel walk the full-shape operand
    in step with the output (only the broadcast operand's pointer moves back), each output byte
    written after the operand bytes at its index are read: operands of the output's shape and
    order may be overwritten (:func:`dense_full_operands`)."""
    return dense_full_operands(node)


# ----------------------------------------------------------------------------- C emission
def cmsis_broadcast_supported(dims1: Sequence[int], dims2: Sequence[int]) -> bool:
    """True when ``arm_maximum_s8``/``arm_minimum_s8`` broadcast NHWC ``dims1`` against ``dims2``
    correctly.  Their row walk double-steps (and reads past the operand) when one operand has
    ``W * C == 1`` but ``H * W * C > 1`` and the other ``W > 1`` and ``H * W * C > 1``, with the two
    per-batch shapes differing; every other broadcastable pair is handled (checked exhaustively over
    dims 1..3 against the CMSIS-NN sources in tests/test_minmax.py)."""
    d1, d2 = [int(v) for v in dims1], [int(v) for v in dims2]
    if d1[1:] == d2[1:]:
        return True
    for x, y in ((d1, d2), (d2, d1)):
        if x[2] * x[3] == 1 and x[1] > 1 and y[2] > 1 and y[1] * y[2] * y[3] > 1:
            return False
    return True


def _what(op_name: str) -> str:
    return "maximum" if op_name == "quantized_maximum" else "minimum"


def _cmsis_supports(node, target) -> str | None:
    """``arm_maximum_s8``/``arm_minimum_s8`` need both operands' bytes in the output's loop order and
    a broadcast they compute correctly (see :func:`cmsis_broadcast_supported`)."""
    v = NodeView(node, target)
    _, d1, s1 = operand_geometry(v, "input1")
    _, d2, s2 = operand_geometry(v, "input2")
    if is_dense(d1, s1) and is_dense(d2, s2) and cmsis_broadcast_supported(d1, d2):
        return None
    return f"arm_{_what(v.op_name)}_s8 cannot take these operands (strided, or a broadcast it does not support)"


@PORTABLE.kernel("quantized_maximum", "quantized_minimum")
def _minmax_portable(ctx) -> str:
    """``corten_maximum_s8``/``corten_minimum_s8`` (any broadcast, strided operands)."""
    x1, x2, out = operand_expr(ctx, "input1"), operand_expr(ctx, "input2"), ctx.out()
    return ctx.block(broadcast_struct(ctx), ctx.call(f"corten_{_what(ctx.op_name)}_s8", "&shape", x1, x2, out))


@CMSIS_NN.kernel("quantized_maximum", "quantized_minimum", act=(torch.int8,), supports=_cmsis_supports)
def _minmax_cmsis(ctx) -> str:
    """``arm_maximum_s8``/``arm_minimum_s8``."""
    x1, x2, out = operand_expr(ctx, "input1"), operand_expr(ctx, "input2"), ctx.out()
    odims, d1, _ = operand_geometry(ctx, "input1")
    _, d2, _ = operand_geometry(ctx, "input2")
    return ctx.block(
        ctx.params("cmsis_nn_context", "nn_ctx", dict(buf="NULL", size=0)),
        ctx.dims("input1_dims", "cmsis_nn_dims", *d1),
        ctx.dims("input2_dims", "cmsis_nn_dims", *d2),
        ctx.dims("output_dims", "cmsis_nn_dims", *odims),
        ctx.call(f"arm_{_what(ctx.op_name)}_s8", "&nn_ctx", x1, "&input1_dims", x2, "&input2_dims", out,
                 "&output_dims"))
