"""``quantized_mul``: CMSIS-NN's ``arm_elementwise_mul_s8``, with numpy broadcasting.

Per output element, in int32 exactly as the C kernels (``x1``/``x2`` the broadcast input values)::

    y = clamp(requantize((x1 + input1_offset) * (x2 + input2_offset), output_multiplier, output_shift)
              + output_offset, activation_min, activation_max)

The product lies in [-255 * 255, 255 * 255], so it cannot overflow.  The compiler derives one
multiplier/shift from the effective scale ``s1 * s2 / s_out`` (TFLite's ``PrepareMul``).

Broadcasting follows torch/numpy: shapes are aligned on the right and a dimension of size 1 is
repeated.  This covers the squeeze-and-excitation gate ``[N, C, H, W] * [N, C, 1, 1]`` and
per-row scaling of 2-D tensors.  Ranks up to 4 are supported (the C kernels loop over 4 dims).

This module also holds the broadcast geometry shared by the elementwise families (sub, minmax):
:func:`loop_geometry` gives, for an output shape and one input shape, the output's dims in C
storage order and the input's element strides along them (0 where the input is broadcast).
"""
from __future__ import annotations

from typing import Sequence

import torch

from corten.fixed_point import clamp_activation, requantize, wrap_int32_t
from corten.ops import checks
from corten.ops.registry import OpFamily, register_family

FAMILY = "mul"
MAX_RANK = 4


# ----------------------------------------------------------------------------- broadcasting (shared)
def broadcast_shape(op: str, input1: torch.Tensor, input2: torch.Tensor) -> tuple[int, ...]:
    """The numpy broadcast of the two inputs' shapes; errors name ``op`` and the argument."""
    for name, t in (("input1", input1), ("input2", input2)):
        if not 1 <= t.dim() <= MAX_RANK:
            checks.fail(op, name, f"rank {t.dim()} (shape {tuple(t.shape)}) is not 1 to {MAX_RANK}")
    try:
        return tuple(int(d) for d in torch.broadcast_shapes(input1.shape, input2.shape))
    except RuntimeError:
        checks.fail(op, "input2", f"shape {tuple(input2.shape)} does not broadcast with input1's "
                                  f"{tuple(input1.shape)}")


def output_layout(shape: Sequence[int]) -> torch.memory_format:
    """4-D activations are channels_last (NHWC bytes); other ranks are row-major."""
    return torch.channels_last if len(shape) == 4 else torch.contiguous_format


def empty_output(shape: Sequence[int], like: torch.Tensor) -> torch.Tensor:
    return torch.empty(tuple(shape), dtype=torch.int8, device=like.device, memory_format=output_layout(shape))


def storage_order(rank: int) -> tuple[int, ...]:
    """Logical dims in C storage order, outermost first: NHWC for 4-D, row-major otherwise."""
    return (0, 2, 3, 1) if rank == 4 else tuple(range(rank))


def storage_strides(shape: Sequence[int]) -> list[int]:
    """Element stride of each logical dim of a tensor's C bytes."""
    strides, step = [0] * len(shape), 1
    for d in reversed(storage_order(len(shape))):
        strides[d] = step
        step *= int(shape[d])
    return strides


def loop_geometry(out_shape: Sequence[int], in_shape: Sequence[int]) -> tuple[list[int], list[int], list[int]]:
    """``(output dims, input dims, input strides)``, each 4 values in the output's storage order
    (padded with leading 1s / 0s): the loops of a C kernel writing the output bytes in order.

    The input is aligned on the right (numpy broadcasting); along a dim where it has size 1 its
    stride is 0 and its dim 1."""
    out_shape, in_shape = [int(d) for d in out_shape], [int(d) for d in in_shape]
    in_strides = storage_strides(in_shape)
    lead = len(out_shape) - len(in_shape)
    dims, idims, strides = [], [], []
    for d in storage_order(len(out_shape)):
        j = d - lead
        size = in_shape[j] if j >= 0 else 1
        dims.append(out_shape[d])
        idims.append(size)
        strides.append(in_strides[j] if size != 1 else 0)
    pad = MAX_RANK - len(dims)
    return [1] * pad + dims, [1] * pad + idims, [0] * pad + strides


def is_dense(dims: Sequence[int], strides: Sequence[int]) -> bool:
    """True when ``strides`` are the row-major strides of ``dims`` (ignoring size-1 dims): the
    input's bytes are in the output's loop order and the CMSIS-NN kernels can read them."""
    step = 1
    for size, stride in zip(reversed(list(dims)), reversed(list(strides))):
        if size != 1 and stride != step:
            return False
        step *= size
    return True


def broadcast_struct(ctx) -> str:
    """C initialiser statement of ``corten_broadcast shape`` for this node's two inputs."""
    out = ctx.shape()
    o, _, s1 = loop_geometry(out, ctx.shape(ctx.arg("input1")))
    _, _, s2 = loop_geometry(out, ctx.shape(ctx.arg("input2")))
    fmt = lambda v: "{" + ", ".join(str(int(x)) for x in v) + "}"  # noqa: E731
    return f"const corten_broadcast shape = {{{fmt(o)}, {fmt(s1)}, {fmt(s2)}}};"


def same_dense_shape(ctx) -> bool:
    """True when both inputs have the output's shape and byte order (a flat elementwise loop)."""
    out = ctx.shape()
    for name in ("input1", "input2"):
        dims, idims, strides = loop_geometry(out, ctx.shape(ctx.arg(name)))
        if idims != dims or not is_dense(idims, strides):
            return False
    return True


def numel(shape: Sequence[int]) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


# ----------------------------------------------------------------------------- the op
def _check(input1, input2, input1_offset, input2_offset, output_offset, output_multiplier, output_shift,
           activation_min, activation_max) -> tuple[int, ...]:
    op = "quantized_mul"
    checks.dtype(op, "input1", input1, torch.int8)
    checks.dtype(op, "input2", input2, torch.int8)
    shape = broadcast_shape(op, input1, input2)
    checks.input_offset(op, "input1_offset", input1_offset)
    checks.input_offset(op, "input2_offset", input2_offset)
    checks.output_offset(op, "output_offset", output_offset)
    checks.scalar_multiplier(op, "output_multiplier", output_multiplier)
    checks.scalar_shift(op, "output_shift", output_shift)
    checks.activation(op, activation_min, activation_max)
    return shape


@torch.library.custom_op("corten::quantized_mul", mutates_args=())
def quantized_mul(
    input1: torch.Tensor,
    input2: torch.Tensor,
    input1_offset: int,
    input2_offset: int,
    output_offset: int,
    output_multiplier: int,
    output_shift: int,
    activation_min: int,
    activation_max: int,
) -> torch.Tensor:
    shape = _check(input1, input2, input1_offset, input2_offset, output_offset, output_multiplier, output_shift,
                   activation_min, activation_max)
    product = (input1.to(torch.int64) + input1_offset) * (input2.to(torch.int64) + input2_offset)
    out = wrap_int32_t(requantize(product, output_multiplier, output_shift) + output_offset)
    return clamp_activation(out, activation_min, activation_max).contiguous(memory_format=output_layout(shape))


@quantized_mul.register_fake
def _(input1, input2, input1_offset, input2_offset, output_offset, output_multiplier, output_shift,
      activation_min, activation_max):
    shape = _check(input1, input2, input1_offset, input2_offset, output_offset, output_multiplier, output_shift,
                   activation_min, activation_max)
    return empty_output(shape, input1)


family = register_family(OpFamily(FAMILY, ("quantized_mul",), doc=__doc__))


# ----------------------------------------------------------------------------- lowering
from corten.fixed_point import quantize_multiplier  # noqa: E402
from corten.lowering.match import LoweringError, Match  # noqa: E402
from corten.ops.registry import annotates, lowers  # noqa: E402

annotates("binary", torch.ops.aten.mul.Tensor, torch.ops.aten.mul_.Tensor)


def check_lowerable_shapes(m: Match, what: str) -> None:
    """Both operands int8 activations of rank <= 4 (broadcasting allowed)."""
    if len(m.inputs) != 2:
        raise LoweringError(f"{what} of a tensor and a constant or Python scalar is not supported: both operands "
                            "must be int8 activations (compute the constant part in the model, or fold it into "
                            "a neighbouring conv/linear)")
    for v in (*m.inputs, m):
        val = v.node.meta.get("val")
        rank = len(val.shape) if isinstance(val, torch.Tensor) else 1
        if not 1 <= rank <= MAX_RANK:
            raise LoweringError(f"{what} of rank-{rank} tensors is not supported (ranks 1 to {MAX_RANK})")


@lowers(torch.ops.aten.mul.Tensor)
def lower_mul(m: Match):
    """``aten.mul.Tensor`` of two int8 tensors (numpy broadcasting) -> ``quantized_mul``."""
    check_lowerable_shapes(m, "mul")
    a, b = m.inputs
    scale = float(a.qparams.scale) * float(b.qparams.scale) / float(m.output.scale)
    try:
        mult, shift = quantize_multiplier(scale)
    except ValueError as e:
        raise LoweringError(f"mul: effective scale s1 * s2 / s_out = {scale:g} cannot be requantized ({e})") from None
    act_min, act_max = m.activation_bounds
    return m.call("quantized_mul", a.node, b.node, a.qparams.offset, b.qparams.offset, m.output.zero_point,
                  mult, shift, act_min, act_max)


# ----------------------------------------------------------------------------- scratch memory
@family.provides("scratch_bytes", "quantized_mul")
def _mul_scratch(node, target) -> int:
    """Neither ``arm_elementwise_mul_s8`` nor the portable broadcast kernel takes a buffer."""
    return 0


# ----------------------------------------------------------------------------- C emission
@family.provides("emit_c", "quantized_mul")
def _emit_mul_c(ctx) -> str:
    """Same-shape operands with kernels="cmsis-nn": one ``arm_elementwise_mul_s8`` call.
    Otherwise ``corten_mul_s8`` (the portable kernel), also in the CMSIS-NN flavour when the
    operands broadcast: CMSIS-NN has no broadcasting s8 multiply."""
    names = ("input1_offset", "input2_offset", "output_offset", "output_multiplier", "output_shift",
             "activation_min", "activation_max")
    v = {k: ctx.int_(int(ctx.arg(k))) for k in names}
    x1, x2, out = ctx.input("input1"), ctx.input("input2"), ctx.out()
    if ctx.kernels == "cmsis-nn" and same_dense_shape(ctx):
        args = [x1, x2, v["input1_offset"], v["input2_offset"], out, v["output_offset"], v["output_multiplier"],
                v["output_shift"], v["activation_min"], v["activation_max"], str(numel(ctx.shape()))]
        return ctx.call("arm_elementwise_mul_s8(" + ", ".join(args) + ")")
    ctx.portable_kernel()
    return ctx.block(
        "const corten_mul_params params = {" + ", ".join(v[k] for k in names) + "};",
        broadcast_struct(ctx),
        ctx.call(f"corten_mul_s8(&params, &shape, {x1}, {x2}, {out})"))
