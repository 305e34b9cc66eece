"""``quantized_strided_copy``: exact data movement of an int8 tensor (slice, select, narrow, flip,
expand, repeat, tile, roll, pixel_shuffle/unshuffle, channel_shuffle, nearest upsampling,
index_select / gather / indexing with constant indices, reshapes between channels-last shapes).

Every output value is an input value, so the output keeps the input's quantization (the
quantizer shares it) and no arithmetic is involved: only bytes move.

The op is defined on the tensors' C *bytes* (storage order: NHWC for a 4-D activation whose
graph shape is logical NCHW, row-major for every other rank, see
:func:`corten.ops.transpose.storage_dim_order`).  The output's bytes, walked in storage order,
are indexed by ``dims`` (row-major, outermost first, ``prod(dims) == numel``); output byte
``(i_0, ..., i_k)`` reads input byte::

    offset + sum_d i_d * strides[d]          (d != index_dim)
           + index[i_{index_dim}]            (when an index table is given)

Strides may be negative (flip) or zero (expand, repeat, nearest upsampling).  ``index`` (int32,
``dims[index_dim]`` entries) covers the one dimension that is not affine: ``index_select`` along
a dimension, or - with ``dims == [numel]`` - any gather at all.

How a lowering finds ``(dims, strides, offset, index)`` (:func:`byte_map` and
:func:`fit_copy_plan`): the ATen op itself runs on a tensor holding, at each logical position,
the *byte offset* of that element in the input's storage (:func:`storage_index`); reading the
result in the output's storage order gives, for every output byte, the input byte it copies.
That table is then factored into the fewest affine levels (plus at most one indexed level).  So
one rule covers every pure movement op torch has, and the plan is correct by construction:
:func:`fit_copy_plan` verifies that the plan reproduces the table exactly.

When the plan reads one contiguous run of input bytes (a slice of H, of the batch, a narrow of a
row-major tensor's outer dims, ...), the memory planner makes the output an *alias* of those
bytes (hook ``"alias_offset"``, see :mod:`corten.memory.views`): no copy runs in C.
"""
from __future__ import annotations

import torch

from corten.errors import LoweringError
from corten.ops import checks
from corten.ops._common import output_format
from corten.ops._movement import (
    MAX_DIMS, OP, CopyPlan, _numel, aten_overloads, constant_value, from_storage, lower_byte_map,
    plan_source_bytes, strided_copy_alias_offset, to_storage,
)
from corten.ops._rules import Match
from corten.ops.registry import Hook, OpFamily, annotates, lowers, register_family
from corten.providers import CMSIS_NN, PORTABLE

FAMILY = "movement"


# ----------------------------------------------------------------------------- the op
def _check(input, shape, dims, strides, offset, index, index_dim) -> list[int]:
    checks.dtype(OP, "input", input, torch.int8)
    shape = [int(d) for d in shape]
    if not 1 <= len(shape) or min(shape) < 1:
        checks.fail(OP, "shape", f"{shape} must have at least one dimension and no empty one")
    if len(dims) != len(strides):
        checks.fail(OP, "strides", f"{list(strides)} has {len(strides)} entries for {len(dims)} dims")
    if len(dims) > MAX_DIMS or (dims and min(dims) < 1):
        checks.fail(OP, "dims", f"{list(dims)}: expected at most {MAX_DIMS} sizes, each at least 1")
    if _numel(dims) != _numel(shape):
        checks.fail(OP, "dims", f"{list(dims)} walk {_numel(dims)} bytes; shape {shape} has {_numel(shape)}")
    if index is not None:
        checks.dtype(OP, "index", index, torch.int32)
        if not 0 <= index_dim < len(dims) or index.dim() != 1 or index.numel() != dims[index_dim]:
            checks.fail(OP, "index", f"expected a 1-D table of dims[index_dim] entries, got shape "
                                     f"{tuple(index.shape)} for dims {list(dims)}, index_dim {index_dim}")
    elif index_dim != -1:
        checks.fail(OP, "index_dim", f"{index_dim} without an index table (use -1)")
    plan = CopyPlan(tuple(int(d) for d in dims), tuple(int(s) for s in strides), int(offset),
                    None if index is None else tuple(index.tolist()), int(index_dim))
    lo, hi = plan.byte_range()
    if lo < 0 or hi >= input.numel():
        checks.fail(OP, "strides", f"the copy reads input bytes {lo}..{hi}, outside the input's {input.numel()}")
    return shape


@torch.library.custom_op("corten::quantized_strided_copy", mutates_args=())
def quantized_strided_copy(input: torch.Tensor, shape: list[int], dims: list[int], strides: list[int], offset: int,
                           index: torch.Tensor | None = None, index_dim: int = -1) -> torch.Tensor:
    """Output (logical ``shape``, laid out as every graph tensor) whose C byte ``(i_0..i_k)`` over
    ``dims`` is input C byte ``offset + sum i_d * strides[d]`` (``index[i_d]`` at ``index_dim``)."""
    shape = _check(input, shape, dims, strides, offset, index, index_dim)
    src = to_storage(input)
    where = plan_source_bytes(dims, strides, offset, None if index is None else index.tolist(), index_dim)
    return from_storage(src[torch.from_numpy(where)], shape)


@quantized_strided_copy.register_fake
def _(input, shape, dims, strides, offset, index=None, index_dim=-1):
    shape = [int(d) for d in shape]
    return input.new_empty(shape).contiguous(memory_format=output_format(len(shape)))


family = register_family(OpFamily(FAMILY, (OP,), doc=__doc__))


# ----------------------------------------------------------------------------- lowering
# Single-input ops whose every output element is an input element.  Integer / index arguments
# must be constants; the rule runs the op itself on the byte-offset tensor.
MOVEMENT_OPS = aten_overloads(
    "slice.Tensor", "select.int", "narrow.default", "narrow_copy.default", "expand.default",
    "broadcast_to.default", "repeat.default", "tile.default", "repeat_interleave.self_int", "flip.default",
    "fliplr.default", "flipud.default", "rot90.default", "roll.default", "pixel_shuffle.default",
    "pixel_unshuffle.default", "channel_shuffle.default", "native_channel_shuffle.default", "index_select.default",
    "index.Tensor", "gather.default", "take_along_dim.default", "diagonal.default", "unfold.default",
    "as_strided.default", "upsample_nearest1d.vec", "upsample_nearest2d.vec", "upsample_nearest3d.vec",
    "upsample_nearest1d.default", "upsample_nearest2d.default", "_unsafe_index.Tensor",
    "_upsample_nearest_exact1d.vec", "_upsample_nearest_exact2d.vec", "_upsample_nearest_exact1d.default",
    "_upsample_nearest_exact2d.default",
)
annotates("shared", *MOVEMENT_OPS)


def _op_name(node) -> str:
    return getattr(node.target, "__name__", str(node.target)).split(".")[0]


@lowers(*MOVEMENT_OPS)
def lower_movement(m: Match):
    """slice / select / flip / expand / repeat / pixel_shuffle / index_select / gather ... of one int8
    activation -> ``quantized_strided_copy`` (or nothing, when no byte moves)."""
    what = _op_name(m.node)
    if len(m.inputs) != 1:
        raise LoweringError(f"a {what} of {len(m.inputs)} activations; exactly one is supported")
    x = m.inputs[0].node
    dq = next(a for a in m.node.all_input_nodes if a.op == "call_function" and a.args and a.args[0] is x)
    args = torch.fx.node.map_arg(m.node.args, lambda n: _INPUT if n is dq else constant_value(m, n))
    kwargs = torch.fx.node.map_arg(m.node.kwargs, lambda n: _INPUT if n is dq else constant_value(m, n))

    def fn(t):
        def put(a):
            return t if a is _INPUT else a
        return m.node.target(*_deep(put, args), **{k: _deep(put, v) for k, v in kwargs.items()})

    return lower_byte_map(m, fn, what)


_INPUT = object()  # where the activation goes in a movement op's arguments


def _deep(f, a):
    if isinstance(a, tuple):
        return tuple(_deep(f, b) for b in a)
    if isinstance(a, list):
        return [_deep(f, b) for b in a]
    return f(a)


# ----------------------------------------------------------------------------- memory: views
@family.provides(Hook.ALIAS_OFFSET, OP)
def _strided_copy_alias_offset(node) -> int | None:
    """The input byte where this copy's output starts when it reads one contiguous run of bytes
    (then the memory planner may make it an alias of them), else None."""
    return strided_copy_alias_offset(node)


# ----------------------------------------------------------------------------- C emission
def _c_list(values) -> str:
    return "{" + ", ".join(str(int(v)) for v in values) + "}"


@PORTABLE.kernel(OP)
def _emit_strided_copy_c(ctx) -> str:
    """``corten_strided_copy_s8`` (the portable kernel, in both flavours: CMSIS-NN has no general
    strided copy; permutes lower to ``quantized_transpose`` and its ``arm_transpose_s8``)."""
    dims, strides = [int(d) for d in ctx.arg("dims")], [int(s) for s in ctx.arg("strides")]
    index_dim = int(ctx.arg("index_dim"))
    if not dims:  # one byte
        dims, strides = [1], [0]
    index = ctx.const("index", torch.int32) if ctx.arg("index") is not None else "NULL"
    src = ctx.input("input")
    in_bytes = _numel(ctx.shape(ctx.arg("input")))
    return ctx.block(
        f"static const int32_t dims[{len(dims)}] = {_c_list(dims)};",
        f"static const int32_t strides[{len(strides)}] = {_c_list(strides)};",
        "const corten_strided_copy_params params = {",
        f"    .num_dims = {len(dims)},",
        "    .dims = dims,",
        "    .strides = strides,",
        f"    .offset = {int(ctx.arg('offset'))},",
        f"    .index = {index},",
        f"    .index_dim = {index_dim},",
        f"    .input_size = {in_bytes},",
        "};",
        ctx.call("corten_strided_copy_s8", "&params", src, ctx.out()))


CMSIS_NN.declines(OP, reason="CMSIS-NN has no strided/indexed byte copy")
