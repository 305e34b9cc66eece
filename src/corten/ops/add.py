"""``quantized_add``: CMSIS-NN's ``arm_elementwise_add_s8`` (same-shape operands).

Per element, in int32 exactly as the C kernel::

    a = requantize((x1 + input1_offset) << left_shift, input1_multiplier, input1_shift)
    b = requantize((x2 + input2_offset) << left_shift, input2_multiplier, input2_shift)
    y = clamp(requantize(a + b, output_multiplier, output_shift) + output_offset, act_min, act_max)

The compiler derives the multipliers the TFLite way: with ``twice_max = 2 * max(s1, s2)``,
``left_shift = 20``, input scales ``s_i / twice_max`` and output scale
``twice_max / (2**left_shift * s_out)``.
"""
from __future__ import annotations

import torch

from corten.errors import LoweringError
from corten.ops import checks
from corten.ops._common import RESCALED_BINARY_PARAMS, RESCALED_BINARY_SCHEMA, layout_of, rescaled_binary
from corten.ops._qparams import add_params
from corten.ops._rules import Match
from corten.ops.registry import OpFamily, annotates, lowers, register_family

FAMILY = "add"


def _check(input1, input2, *params) -> None:
    op = "quantized_add"
    checks.dtype(op, "input1", input1, torch.int8)
    checks.dtype(op, "input2", input2, torch.int8)
    if input1.shape != input2.shape:
        checks.fail(op, "input2", f"shape {tuple(input2.shape)} differs from input1's {tuple(input1.shape)}")
    checks.rescaled_binary(op, *params)


@torch.library.custom_op("corten::quantized_add", mutates_args=(), schema=RESCALED_BINARY_SCHEMA)
def quantized_add(input1: torch.Tensor, input2: torch.Tensor, *params: int) -> torch.Tensor:
    """``params``: the 12 scalars of :data:`corten.ops._common.RESCALED_BINARY_PARAMS`."""
    _check(input1, input2, *params)
    out = rescaled_binary(input1, input2, params, negate_input2=False)
    return out.contiguous(memory_format=layout_of(input1))


@quantized_add.register_fake
def _(input1, input2, *params):
    _check(input1, input2, *params)
    return torch.empty_like(input1, memory_format=layout_of(input1))


family = register_family(OpFamily(FAMILY, ("quantized_add",), doc=__doc__))


# ----------------------------------------------------------------------------- lowering

annotates("binary", torch.ops.aten.add.Tensor, torch.ops.aten.add_.Tensor)


@lowers(torch.ops.aten.add.Tensor)
def lower_add(m: Match):
    """``aten.add.Tensor`` of two int8 tensors of one shape -> ``quantized_add``."""
    if len(m.inputs) != 2:
        raise LoweringError("add of a tensor and a constant/scalar is not supported yet")
    if m.node.kwargs.get("alpha", 1) != 1:
        raise LoweringError("add with alpha != 1 is not supported")
    a, b = m.inputs
    if tuple(a.node.meta["val"].shape) != tuple(b.node.meta["val"].shape):
        raise LoweringError("add with broadcasting is not supported yet (operands must have one shape)")
    p = add_params(a.qparams.scale, b.qparams.scale, m.output.scale)
    act_min, act_max = m.activation_bounds
    return m.call("quantized_add", a.node, b.node, a.qparams.offset, p.input1_multiplier, p.input1_shift,
                  b.qparams.offset, p.input2_multiplier, p.input2_shift, p.left_shift, m.output.zero_point,
                  p.output_multiplier, p.output_shift, act_min, act_max)


# ----------------------------------------------------------------------------- scratch memory
@family.provides("scratch_bytes", "quantized_add")
def _add_scratch(node, target) -> int:
    """``arm_elementwise_add_s8`` takes no context buffer.  It is purely elementwise (each output
    byte depends only on the input bytes at the same index), so the memory planner may write its
    output over an input that dies at the add."""
    return 0


# ----------------------------------------------------------------------------- C emission
@family.provides("emit_c", "quantized_add")
def _emit_add_c(ctx) -> str:
    """One ``corten_add_s8`` (portable) or ``arm_elementwise_add_s8`` (CMSIS-NN) call; both are
    safe when the planner puts the output over one of the inputs."""
    a, b = ctx.arg("input1"), ctx.arg("input2")
    if _memory_order(a.meta["val"]) != _memory_order(b.meta["val"]):
        ctx.fail("the two inputs have different memory layouts; their bytes cannot be added elementwise")
    size = 1
    for d in ctx.shape(a):
        size *= int(d)
    names = RESCALED_BINARY_PARAMS
    v = {k: ctx.int_(int(ctx.arg(k))) for k in names}
    x1, x2, out = ctx.input("input1"), ctx.input("input2"), ctx.out()
    # CMSIS-NN's DSP path masks (x + offset) to 16 bits before the left shift: only exact for left
    # shifts >= 16 (the lowering uses 20). Smaller shifts run Corten's portable kernel instead.
    use_portable = ctx.kernels == "portable" or int(ctx.arg("left_shift")) < 16
    if use_portable:
        if ctx.kernels != "portable":
            ctx.portable_kernel()
        return ctx.block(
            ctx.params("corten_add_params", "params", {k: v[k] for k in names}),
            ctx.call(f"corten_add_s8(&params, {x1}, {x2}, {out}, {size})"))
    args = [x1, x2, v["input1_offset"], v["input1_multiplier"], v["input1_shift"], v["input2_offset"],
            v["input2_multiplier"], v["input2_shift"], v["left_shift"], out, v["output_offset"],
            v["output_multiplier"], v["output_shift"], v["activation_min"], v["activation_max"], str(size)]
    return ctx.call("arm_elementwise_add_s8(" + ", ".join(args) + ")")


def _memory_order(t: torch.Tensor) -> tuple[int, ...]:
    """The order of ``t``'s dims in memory, outermost first, ignoring size-1 dims (whose strides carry
    no information: a channels_last [1, 1, H, W] tensor has the bytes of a contiguous one)."""
    dims = [d for d in range(t.dim()) if t.shape[d] != 1]
    return tuple(sorted(dims, key=lambda d: -t.stride(d)))


@family.provides("in_place_inputs", "quantized_add")
def _quantized_add_in_place_inputs(node) -> tuple[int, ...]:
    """Inputs the kernel may overwrite with its output (elementwise: each output byte is written after its inputs are read)."""
    return (0, 1)
