"""Broadcast geometry shared by the elementwise families (mul, sub, minmax, ...).

Broadcasting follows torch/numpy: shapes are aligned on the right and a dimension of size 1 is
repeated, ranks 1 to 4 (the C kernels loop over 4 dims), and rank 5 when the walk collapses into 4 loops.  :func:`loop_geometry`
gives, for an output shape and one input shape, the output's dims in C storage order and the
input's element strides along them (0 where the input is broadcast); the ``ctx`` helpers turn that
into the ``corten_broadcast`` struct of the portable kernels.
"""
from __future__ import annotations

from typing import Sequence

import torch

from corten.fixed_point import clamp_activation, requantize, wrap_int32_t
from corten.providers import NodeView, element_pointer
from corten.providers.base import tensor_dtype
from corten.ops import checks
from corten.ops._common import (  # noqa: F401  (storage_strides re-exported)
    MAX_ELEMENTWISE_RANK,
    MAX_RANK,
    broadcast_loops,
    collapse_loops,
    output_format,
    storage_dim_order,
    storage_strides,
)


def broadcast_shape(op: str, input1: torch.Tensor, input2: torch.Tensor) -> tuple[int, ...]:
    """The numpy broadcast of the two inputs' shapes; errors name ``op`` and the argument."""
    for name, t in (("input1", input1), ("input2", input2)):
        if not 1 <= t.dim() <= MAX_ELEMENTWISE_RANK:
            checks.fail(op, name, f"rank {t.dim()} (shape {tuple(t.shape)}) is not 1 to {MAX_ELEMENTWISE_RANK}")
    try:
        return tuple(int(d) for d in torch.broadcast_shapes(input1.shape, input2.shape))
    except RuntimeError:
        checks.fail(op, "input2", f"shape {tuple(input2.shape)} does not broadcast with input1's "
                                  f"{tuple(input1.shape)}")


def output_layout(shape: Sequence[int]) -> torch.memory_format:
    """4-D activations are channels_last (NHWC bytes); other ranks are row-major."""
    return output_format(len(shape))


def empty_output(shape: Sequence[int], like: torch.Tensor, dtype: torch.dtype = torch.int8) -> torch.Tensor:
    return torch.empty(tuple(shape), dtype=dtype, device=like.device, memory_format=output_layout(shape))


def loop_geometry(out_shape: Sequence[int], in_shape: Sequence[int],
                  row_major: bool = False) -> tuple[list[int], list[int], list[int]]:
    """``(output dims, input dims, input strides)``, each 4 values in the output's storage order
    (padded with leading 1s / 0s): the loops of a C kernel writing the output bytes in order.

    The input is aligned on the right (numpy broadcasting); along a dim where it has size 1 its
    stride is 0 and its dim 1.  A rank-5 output gives 5 values (:func:`operands_geometry` collapses
    them into 4 loops for the kernels)."""
    dims, idims, strides = broadcast_loops(out_shape, in_shape, row_major)
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


def dense_full_operands(node) -> tuple[int, ...]:
    """Input positions (0, 1) whose bytes have the output's shape and order: a kernel that writes
    the output bytes in order, each after reading the input bytes at that index, may write its
    output over them (the ``in_place_inputs`` hook of the elementwise binary families: add, sub,
    mul, div, maximum/minimum).  Constants are never listed."""
    out_shape = tuple(node.meta["val"].shape)
    found = []
    for i in (0, 1):
        arg = node.args[i]
        if is_constant(arg):
            continue
        dims, idims, strides = loop_geometry(out_shape, tuple(arg.meta["val"].shape))
        if idims == dims and is_dense(idims, strides):
            found.append(i)
    return tuple(found)


def operands_geometry(ctx, names=("input1", "input2")) -> dict[str, tuple[list[int], list[int], list[int]]]:
    """:func:`loop_geometry` of each input in ``names`` of this node (constants are row-major
    arrays); a rank-5 output's loops collapsed into 4 (:func:`corten.ops._common.collapse_loops`;
    the lowering refused any broadcast that does not collapse)."""
    geo = {n: loop_geometry(ctx.shape(), ctx.shape(ctx.arg(n)), row_major=is_constant(ctx.arg(n))) for n in names}
    dims = geo[names[0]][0]
    if len(dims) <= MAX_RANK:
        return geo
    cdims, cstrides = collapse_loops(dims, [geo[n][2] for n in names])
    if len(cdims) > MAX_RANK:
        raise ValueError(f"{ctx.op_name}: a rank-{len(dims)} broadcast that does not collapse to {MAX_RANK} loops")
    pad = MAX_RANK - len(cdims)
    out = [1] * pad + cdims
    result = {}
    for n, s in zip(names, cstrides):
        s = [0] * pad + s
        result[n] = (out, [d if st != 0 else 1 for d, st in zip(out, s)], s)
    return result


def operand_geometry(ctx, name: str) -> tuple[list[int], list[int], list[int]]:
    """:func:`loop_geometry` of the input ``name`` of this node (see :func:`operands_geometry`)."""
    return operands_geometry(ctx)[name]


def operand_expr(ctx, name: str) -> str:
    """C expression of input ``name``: its activation buffer, or its constant array."""
    return ctx.const(name, torch.int8) if is_constant(ctx.arg(name)) else ctx.input(name)


def broadcast_struct(ctx) -> str:
    """C initialiser statement of ``corten_broadcast shape`` for this node's two inputs."""
    o, _, s1 = operand_geometry(ctx, "input1")
    _, _, s2 = operand_geometry(ctx, "input2")
    dims = lambda v: dict(zip("nhwc", (int(x) for x in v)))  # noqa: E731
    return ctx.params("corten_broadcast", "shape", dict(output=dims(o), input1_strides=dims(s1),
                                                        input2_strides=dims(s2)))


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


def row_broadcast(ctx) -> tuple[str, int, int] | None:
    """``(full operand name, outer, inner)`` when one operand has the output's shape and bytes and
    the other is one dense block of the output's ``inner`` trailing storage elements, repeated
    ``outer`` times (the per-channel case ``[N, C, H, W] op [C, 1, 1]``: a C-vector per NHWC pixel;
    or a row per batch).  Then a flat CMSIS-NN kernel runs once per block.  None otherwise (also
    when nothing repeats, or the block is a single element)."""
    geo = {name: operand_geometry(ctx, name) for name in ("input1", "input2")}
    for full, part in (("input1", "input2"), ("input2", "input1")):
        dims, fdims, fstrides = geo[full]
        _, pdims, pstrides = geo[part]
        if fdims != dims or not is_dense(fdims, fstrides):
            continue
        k = 0
        while k < MAX_RANK and pdims[k] == 1:
            k += 1
        if pdims[k:] != dims[k:] or not is_dense(pdims[k:], pstrides[k:]):
            continue
        outer, inner = numel(dims[:k]), numel(dims[k:])
        if outer > 1 and inner > 1:
            return full, outer, inner
    return None


# ----------------------------------------------------------------------------- the add arithmetic (add, sub)
def rescaled_sum(input1, input2, input1_offset, input1_multiplier, input1_shift, input2_offset, input2_multiplier,
                 input2_shift, left_shift, output_offset, output_multiplier, output_shift, activation_min,
                 activation_max, shape) -> torch.Tensor:
    """The add arithmetic over the broadcast operands (sub passes input2's multiplier negated)."""
    a = requantize((input1.to(torch.int64) + input1_offset) << left_shift, input1_multiplier, input1_shift)
    b = requantize((input2.to(torch.int64) + input2_offset) << left_shift, input2_multiplier, input2_shift)
    out = wrap_int32_t(requantize(wrap_int32_t(a + b), output_multiplier, output_shift) + output_offset)
    return clamp_activation(out, activation_min, activation_max,
                            input1.dtype).contiguous(memory_format=output_layout(shape))


PARAM_NAMES = ("input1_offset", "input1_multiplier", "input1_shift", "input2_offset", "input2_multiplier",
               "input2_shift", "left_shift", "output_offset", "output_multiplier", "output_shift",
               "activation_min", "activation_max")


def typed_operands(ctx) -> tuple[str, str, str]:
    """The C expressions of a binary node's input1, input2 (an activation buffer or a constant array)
    and output, as pointers to the output's element type (``int8_t *``; ``int16_t *`` in 16x8)."""
    dt = tensor_dtype(ctx.node)
    return (element_pointer(operand_expr(ctx, "input1"), dt, const=True),
            element_pointer(operand_expr(ctx, "input2"), dt, const=True), element_pointer(ctx.out(), dt))


def rescaled_operands(ctx) -> tuple[dict, str, str, str]:
    """(the add arithmetic's parameters by name, input1, input2 and output C expressions - see
    :func:`typed_operands`) of an add/sub node."""
    return ({k: int(ctx.arg(k)) for k in PARAM_NAMES}, *typed_operands(ctx))


def cmsis_add_call(ctx, x1: str, x2: str, out: str, v: dict, size, negate2: bool = False) -> str:
    """One ``arm_elementwise_add_s8`` call (``negate2``: input2's multiplier negated, for sub)."""
    m2 = -v["input2_multiplier"] if negate2 else v["input2_multiplier"]
    args = [x1, x2, v["input1_offset"], v["input1_multiplier"], v["input1_shift"], v["input2_offset"], m2,
            v["input2_shift"], v["left_shift"], out, v["output_offset"], v["output_multiplier"], v["output_shift"],
            v["activation_min"], v["activation_max"], size]
    return ctx.call("arm_elementwise_add_s8", *args)


# CMSIS-NN's DSP path masks (x + offset) to 16 bits before the left shift: only exact for left
# shifts >= 16 (the lowering uses 20); smaller shifts run Corten's portable kernels instead.
def cmsis_add_supports(node, target) -> str | None:
    """Whether ``arm_elementwise_add_s8`` computes this int8 add (sub: with input2's multiplier negated)."""
    v = NodeView(node, target)
    left_shift = int(v.arg("left_shift"))
    if left_shift < 16:
        return f"left shift {left_shift} < 16: arm_elementwise_add_s8 masks (x + offset) to 16 bits before shifting"
    if same_dense_shape(v) or row_broadcast(v) is not None:
        return None
    return ("broadcast that is not one operand repeated in dense blocks (arm_elementwise_add_s8 takes "
            "equal-length vectors)")


def cmsis_add_rows(ctx, x1: str, x2: str, out: str, v: dict, negate2: bool = False) -> str | None:
    """The broadcast per-channel case as one ``arm_elementwise_add_s8`` call per repeated block
    (see :func:`row_broadcast`), or None when the shapes are not of that form."""
    rows = row_broadcast(ctx)
    if rows is None:
        return None
    full, outer, inner = rows
    p1 = f"{x1} + i * {inner}" if full == "input1" else x1
    p2 = f"{x2} + i * {inner}" if full == "input2" else x2
    body = cmsis_add_call(ctx, p1, p2, f"{out} + i * {inner}", v, str(inner), negate2)
    return ctx.block("int32_t i;", f"for (i = 0; i < {outer}; i++) {{",
                     "\n".join("    " + line for line in body.split("\n")), "}")


def binary_custom_op(name: str, kernel, check):
    """``corten::<name>`` from its reference ``kernel`` (its signature is the schema) and the fake
    kernel of a binary elementwise op: ``check(input1, input2, *args)``'s broadcast shape, of
    ``input1``'s dtype, in :func:`output_layout`."""
    kernel.__name__ = kernel.__qualname__ = name
    custom = torch.library.custom_op(f"corten::{name}", mutates_args=())(kernel)

    @custom.register_fake
    def _(input1, input2, *args):
        return empty_output(check(input1, input2, *args), input1, input1.dtype)

    return custom


def rescaled_binary_op(name: str, sign: int):
    """Define ``corten::<name>``: the add arithmetic of two int8 tensors (numpy broadcasting), each
    rescaled to a common scale; ``sign`` -1 subtracts the second (``quantized_sub``).  add and sub
    share this one definition (schema, argument checks, reference and fake kernels)."""
    op = name

    def check(input1, input2, input1_offset, input1_multiplier, input1_shift, input2_offset, input2_multiplier,
              input2_shift, left_shift, output_offset, output_multiplier, output_shift, activation_min,
              activation_max) -> tuple[int, ...]:
        # 16x8 (TFLite's int16 ADD, arm_elementwise_add_s16): both operands int16, no offsets
        wide = all(isinstance(t, torch.Tensor) and t.dtype == torch.int16 for t in (input1, input2))
        checks.dtype(op, "input1", input1, torch.int16 if wide else torch.int8)
        checks.dtype(op, "input2", input2, torch.int16 if wide else torch.int8)
        shape = broadcast_shape(op, input1, input2)
        if wide:
            checks.rescaled_binary_s16(op, input1_offset, input1_multiplier, input1_shift, input2_offset,
                                       input2_multiplier, input2_shift, left_shift, output_offset, output_multiplier,
                                       output_shift, activation_min, activation_max)
        else:
            checks.rescaled_binary(op, input1_offset, input1_multiplier, input1_shift, input2_offset,
                                   input2_multiplier, input2_shift, left_shift, output_offset, output_multiplier,
                                   output_shift, activation_min, activation_max)
        return shape

    def kernel(input1: torch.Tensor, input2: torch.Tensor, input1_offset: int, input1_multiplier: int,
               input1_shift: int, input2_offset: int, input2_multiplier: int, input2_shift: int, left_shift: int,
               output_offset: int, output_multiplier: int, output_shift: int, activation_min: int,
               activation_max: int) -> torch.Tensor:
        args = (input1_offset, input1_multiplier, input1_shift, input2_offset, input2_multiplier, input2_shift,
                left_shift, output_offset, output_multiplier, output_shift, activation_min, activation_max)
        shape = check(input1, input2, *args)
        return rescaled_sum(input1, input2, input1_offset, input1_multiplier, input1_shift, input2_offset,
                            sign * input2_multiplier, input2_shift, left_shift, output_offset, output_multiplier,
                            output_shift, activation_min, activation_max, shape)

    return binary_custom_op(name, kernel, check)


# ----------------------------------------------------------------------------- one requantization (mul, div)
def requantized_binary_op(name: str, check, arithmetic):
    """Define ``corten::<name>``: a binary op of two tensors (numpy broadcasting) whose int32 result
    is requantized once, with offsets per input, one output multiplier/shift and activation bounds.
    mul and div share this one definition (schema, reference and fake kernels):

    * ``check(input1, input2, *params)`` validates the arguments (naming ``name``) and returns the
      broadcast output shape;
    * ``arithmetic(input1, input2, *params)`` computes the output values (the dtype of the result);
    * the output is in :func:`output_layout` of its shape; the fake kernel gives ``input1``'s dtype.
    """

    def kernel(input1: torch.Tensor, input2: torch.Tensor, input1_offset: int, input2_offset: int,
               output_offset: int, output_multiplier: int, output_shift: int, activation_min: int,
               activation_max: int) -> torch.Tensor:
        args = (input1_offset, input2_offset, output_offset, output_multiplier, output_shift, activation_min,
                activation_max)
        shape = check(input1, input2, *args)
        return arithmetic(input1, input2, *args).contiguous(memory_format=output_layout(shape))

    return binary_custom_op(name, kernel, check)
