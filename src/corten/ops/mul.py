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


def storage_strides(shape: Sequence[int], row_major: bool = False) -> list[int]:
    """Element stride of each logical dim of a tensor's C bytes (``row_major``: a constant array,
    which the emitter writes in logical order whatever its rank)."""
    strides, step = [0] * len(shape), 1
    for d in reversed(range(len(shape)) if row_major else storage_order(len(shape))):
        strides[d] = step
        step *= int(shape[d])
    return strides


def loop_geometry(out_shape: Sequence[int], in_shape: Sequence[int],
                  row_major: bool = False) -> tuple[list[int], list[int], list[int]]:
    """``(output dims, input dims, input strides)``, each 4 values in the output's storage order
    (padded with leading 1s / 0s): the loops of a C kernel writing the output bytes in order.

    The input is aligned on the right (numpy broadcasting); along a dim where it has size 1 its
    stride is 0 and its dim 1."""
    out_shape, in_shape = [int(d) for d in out_shape], [int(d) for d in in_shape]
    in_strides = storage_strides(in_shape, row_major)
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


def is_constant(node) -> bool:
    """A lifted constant of the exported program (not an activation buffer)."""
    return isinstance(node, torch.fx.Node) and node.op == "placeholder"


def operand_geometry(ctx, name: str) -> tuple[list[int], list[int], list[int]]:
    """:func:`loop_geometry` of the input ``name`` of this node (constants are row-major arrays)."""
    node = ctx.arg(name)
    return loop_geometry(ctx.shape(), ctx.shape(node), row_major=is_constant(node))


def operand_expr(ctx, name: str) -> str:
    """C expression of input ``name``: its activation buffer, or its constant array."""
    return ctx.const(name, torch.int8) if is_constant(ctx.arg(name)) else ctx.input(name)


def broadcast_struct(ctx) -> str:
    """C initialiser statement of ``corten_broadcast shape`` for this node's two inputs."""
    o, _, s1 = operand_geometry(ctx, "input1")
    _, _, s2 = operand_geometry(ctx, "input2")
    fmt = lambda v: "{" + ", ".join(str(int(x)) for x in v) + "}"  # noqa: E731
    return f"const corten_broadcast shape = {{{fmt(o)}, {fmt(s1)}, {fmt(s2)}}};"


def same_dense_shape(ctx) -> bool:
    """True when both inputs have the output's shape and byte order (a flat elementwise loop)."""
    for name in ("input1", "input2"):
        dims, idims, strides = operand_geometry(ctx, name)
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
import math  # noqa: E402

from corten.fixed_point import quantize_multiplier  # noqa: E402
from corten.lowering.qparams import QParams  # noqa: E402
from corten.lowering.match import LoweringError, Match  # noqa: E402
from corten.ops.registry import annotates, lowers  # noqa: E402

annotates("binary", torch.ops.aten.mul.Tensor, torch.ops.aten.mul_.Tensor)


def check_lowerable_shapes(m: Match, what: str) -> None:
    """Both operands int8 activations of rank <= 4 (broadcasting allowed)."""
    if len(m.inputs) != 2:
        raise LoweringError(f"{what} of a tensor and a constant or Python scalar is not supported: both operands "
                            "must be int8 activations (compute the constant part in the model, or fold it into "
                            "a neighbouring conv/linear)")
    check_ranks(m, what)


def check_ranks(m: Match, what: str) -> None:
    """The activation operands and the output have ranks 1 to 4 (the C kernels' loops)."""
    for v in (*m.inputs, m):
        val = v.node.meta.get("val")
        rank = len(val.shape) if isinstance(val, torch.Tensor) else 1
        if not 1 <= rank <= MAX_RANK:
            raise LoweringError(f"{what} of rank-{rank} tensors is not supported (ranks 1 to {MAX_RANK})")


@lowers(torch.ops.aten.mul.Tensor)
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
    scale = float(x.qparams.scale) * float(b_qparams.scale) / float(m.output.scale)
    try:
        mult, shift = quantize_multiplier(scale)
    except ValueError as e:
        raise LoweringError(f"mul: effective scale s1 * s2 / s_out = {scale:g} cannot be requantized ({e})") from None
    act_min, act_max = m.activation_bounds
    return m.call("quantized_mul", x.node, b_node, x.qparams.offset, b_qparams.offset, m.output.zero_point,
                  mult, shift, act_min, act_max)


def constant_operand(m: Match, x) -> tuple[torch.Tensor, QParams]:
    """The constant operand of ``x * c`` (or ``x - c``, ``c - x``) as an int8 tensor and its qparams.

    * a Python number ``k``: the one-element tensor ``[sign(k)]`` with scale ``|k|`` and zero
      point 0, so that ``|k|`` folds into the requantization (``s_x * |k| / s_out``) exactly;
    * a constant tensor the quantizer quantized (``dequantize(int8 constant)``): its int8 values
      and per-tensor qparams; it is read in place of an activation, broadcast like one."""
    from corten.lowering.match import DQ_PER_TENSOR

    others = [a for a in m.node.args[:2]
              if not (isinstance(a, torch.fx.Node) and a.target in DQ_PER_TENSOR and a.args[0] is x.node)]
    what = m.node.target.__name__.split(".")[0]
    if len(others) != 1:
        raise LoweringError(f"{what}: expected one int8 activation operand and one constant")
    c = others[0]
    if isinstance(c, (int, float)) and not isinstance(c, bool):
        if not math.isfinite(c):
            raise LoweringError(f"{what} with {c!r}: the constant must be finite")
        return torch.tensor([-1 if c < 0 else 1], dtype=torch.int8), QParams(abs(float(c)), 0)
    if isinstance(c, torch.fx.Node) and c.target in DQ_PER_TENSOR and c.args[0].op == "get_attr":
        values = m.constant(c.args[0])
        scale, zero_point = c.args[1], c.args[2]
        if values.dtype != torch.int8 or not isinstance(scale, float) or not isinstance(zero_point, int):
            raise LoweringError(f"{what}: the constant operand is not an int8 per-tensor quantized constant")
        if not 1 <= values.dim() <= MAX_RANK:
            raise LoweringError(f"{what}: a rank-{values.dim()} constant operand is not supported "
                                f"(ranks 1 to {MAX_RANK})")
        return values, QParams(float(scale), int(zero_point))
    raise LoweringError(f"{what} of a tensor and an unquantized constant is not supported: both operands must be "
                        "int8 activations, quantized constants (CortenQuantizer) or a Python number")


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
    x1, x2, out = operand_expr(ctx, "input1"), operand_expr(ctx, "input2"), ctx.out()
    if ctx.kernels == "cmsis-nn" and same_dense_shape(ctx):
        args = [x1, x2, v["input1_offset"], v["input2_offset"], out, v["output_offset"], v["output_multiplier"],
                v["output_shift"], v["activation_min"], v["activation_max"], str(numel(ctx.shape()))]
        return ctx.call("arm_elementwise_mul_s8(" + ", ".join(args) + ")")
    ctx.portable_kernel()
    return ctx.block(
        "const corten_mul_params params = {" + ", ".join(v[k] for k in names) + "};",
        broadcast_struct(ctx),
        ctx.call(f"corten_mul_s8(&params, &shape, {x1}, {x2}, {out})"))
