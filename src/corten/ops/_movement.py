"""The byte-map engine of exact data movement (below the op families: :mod:`corten.ops.movement`
defines ``quantized_strided_copy`` with it, :mod:`corten.ops.shape` and :mod:`corten.ops.transpose`
fall back to it).

Every graph tensor's C bytes are its values in *storage order*: NHWC for a 4-D activation whose
graph shape is logical NCHW, row-major for every other rank (:func:`storage_dim_order`).

How a movement op becomes one strided copy: the ATen op itself runs on a tensor holding, at each
logical position, the *byte offset* of that element in the input's storage
(:func:`storage_index`); reading the result in the output's storage order gives, for every output
byte, the input byte it copies (:func:`byte_map`).  :func:`fit_copy_plan` factors that table into
the fewest affine levels (``dims``, ``strides``, ``offset``; strides may be negative or zero) plus
at most one indexed level (``index``), and verifies that the plan reproduces the table exactly.
So one rule covers every pure movement op torch has, correct by construction.

Also here: which reshapes keep every value at the same byte (:func:`shapes_share_bytes`, used by
the memory planner's views) and the lowering helpers the families share (:func:`lower_byte_map`,
composition of a movement with the movement that produced its input).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch

from corten.errors import LoweringError
from corten.fx_nodes import aten_overloads, node_arg
from corten.ops._common import storage_dim_order
from corten.ops._rules import DQ_PER_TENSOR, Match
from corten.ops.registry import op_name_of

OP = "quantized_strided_copy"
MAX_DIMS = 10  # CORTEN_STRIDED_COPY_MAX_DIMS in corten_kernels.h
INT32_MAX = 2**31 - 1
RESHAPE = torch.ops.aten.reshape.default
_aten = torch.ops.aten


# ----------------------------------------------------------------------------- byte layout
def _numel(shape: Sequence[int]) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


def storage_index(shape: Sequence[int], dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """A tensor of logical ``shape`` holding, at each position, that element's byte offset in the
    tensor's C storage (NHWC for 4-D).  float64 by default: every movement op accepts it (nearest
    upsampling does not take integers) and offsets below 2**53 are exact."""
    shape = [int(d) for d in shape]
    order = storage_dim_order(len(shape))
    idx = torch.arange(_numel(shape), dtype=dtype).reshape([shape[d] for d in order])
    return idx.permute([order.index(d) for d in range(len(shape))])


def storage_values(t: torch.Tensor) -> torch.Tensor:
    """The values of logical tensor ``t`` in its C storage order, flattened."""
    return t.permute(storage_dim_order(t.dim())).reshape(-1)


def to_storage(t: torch.Tensor) -> torch.Tensor:
    """The C bytes of a graph tensor (any memory format) as a flat tensor."""
    return storage_values(t).contiguous()


def from_storage(flat: torch.Tensor, shape: Sequence[int]) -> torch.Tensor:
    """The graph tensor of logical ``shape`` whose C bytes are ``flat`` (channels_last for 4-D)."""
    shape = [int(d) for d in shape]
    order = storage_dim_order(len(shape))
    t = flat.reshape([shape[d] for d in order]).permute([order.index(d) for d in range(len(shape))])
    return t.contiguous(memory_format=torch.channels_last if len(shape) == 4 else torch.contiguous_format)


# ----------------------------------------------------------------------------- copy plans
@dataclass(frozen=True)
class CopyPlan:
    """``(dims, strides, offset, index, index_dim)`` of one strided copy (see the module docstring)."""

    dims: tuple[int, ...]
    strides: tuple[int, ...]
    offset: int
    index: tuple[int, ...] | None = None
    index_dim: int = -1

    @property
    def numel(self) -> int:
        return _numel(self.dims)

    def source_bytes(self) -> np.ndarray:
        """The input byte read by each output byte (int64, output storage order)."""
        return plan_source_bytes(self.dims, self.strides, self.offset, self.index, self.index_dim)

    def contiguous_run(self) -> bool:
        """True when the output is one contiguous run of input bytes (an alias is possible)."""
        return self.index is None and (len(self.dims) == 0 or (len(self.dims) == 1 and self.strides[0] == 1))

    def byte_range(self) -> tuple[int, int]:
        """(lowest, highest) input byte read."""
        lo = hi = self.offset
        for k, (d, s) in enumerate(zip(self.dims, self.strides)):
            if k == self.index_dim and self.index is not None:
                lo, hi = lo + min(self.index), hi + max(self.index)
            else:
                lo, hi = lo + min(0, (d - 1) * s), hi + max(0, (d - 1) * s)
        return lo, hi


def plan_source_bytes(dims, strides, offset, index=None, index_dim=-1) -> np.ndarray:
    dims = [int(d) for d in dims]
    src = np.full(dims, int(offset), dtype=np.int64)
    for k, (d, s) in enumerate(zip(dims, strides)):
        if k == index_dim and index is not None:
            step = np.asarray(index, dtype=np.int64)
        else:
            step = np.arange(d, dtype=np.int64) * int(s)
        src += step.reshape([d if j == k else 1 for j in range(len(dims))])
    return src.reshape(-1)


def _divisors(n: int) -> list[int]:
    small = [d for d in range(1, int(n**0.5) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


def _innermost_level(t: np.ndarray) -> tuple[int, int] | None:
    """The largest ``(size, stride)`` with ``t`` = rows of ``size`` bytes ``stride`` apart, or None."""
    n = len(t)
    s = int(t[1] - t[0])
    bad = np.flatnonzero(np.diff(t) != s)
    run = n if len(bad) == 0 else int(bad[0]) + 1
    step = np.arange(n, dtype=np.int64) * s
    for size in reversed(_divisors(n)):
        if size < 2 or size > run:
            continue
        rows = t.reshape(-1, size)
        if np.array_equal(rows - rows[:, :1], np.broadcast_to(step[:size], rows.shape)):
            return size, s
    return None


def _affine_levels(t: np.ndarray, inner: list[tuple[int, int]]) -> np.ndarray:
    """Peel affine levels off ``t`` (innermost first, appended to ``inner``); returns what is left
    (length 1 when ``t`` is fully affine)."""
    while len(t) > 1:
        level = _innermost_level(t)
        if level is None:
            break
        inner.append(level)
        t = t[::level[0]]
    return t


def fit_copy_plan(table: np.ndarray | Sequence[int]) -> CopyPlan:
    """The :class:`CopyPlan` whose output byte ``j`` reads input byte ``table[j]``: as many affine
    levels as possible (merged), and where the table is not affine one indexed level, as small as
    the table allows (``index_select``) or the whole table (a general gather).  Verified."""
    t = np.asarray(table, dtype=np.int64).reshape(-1)
    if t.size == 0:
        raise ValueError("an empty tensor has no copy plan")
    offset = int(t[0])
    inner: list[tuple[int, int]] = []  # innermost first
    rest = _affine_levels(t, inner)
    levels: list[tuple[int, int]] = list(reversed(inner))  # outermost first
    index: tuple[int, ...] | None = None
    index_dim = -1
    if len(rest) > 1:
        n = len(rest)
        for m in _divisors(n)[1:]:
            rows = rest.reshape(-1, m)
            rel = rows - rows[:, :1]
            if not np.array_equal(rel, np.broadcast_to(rel[0], rel.shape)):
                continue
            outer: list[tuple[int, int]] = []
            if len(_affine_levels(rows[:, 0].copy(), outer)) > 1:
                continue
            index = tuple(int(v) for v in rel[0])
            index_dim = len(outer)
            levels = list(reversed(outer)) + [(m, 0)] + levels
            break
    plan = CopyPlan(tuple(d for d, _ in levels), tuple(s for _, s in levels), offset, index, index_dim)
    if not np.array_equal(plan.source_bytes(), t):  # pragma: no cover - guards the factorisation
        raise AssertionError(f"copy plan {plan} does not reproduce its byte table")
    return plan


def byte_map(fn, in_shape: Sequence[int]) -> tuple[list[int], np.ndarray]:
    """``(output shape, table)``: ``fn`` (a pure data-movement function of one tensor) applied to a
    tensor of logical ``in_shape``; ``table[j]`` is the input byte that output byte ``j`` holds."""
    out = fn(storage_index(in_shape))
    if not isinstance(out, torch.Tensor):
        raise ValueError(f"expected one tensor from the movement op, got {type(out).__name__}")
    table = storage_values(out.to(torch.float64)).numpy()
    return [int(d) for d in out.shape], np.rint(table).astype(np.int64)


# ----------------------------------------------------------------------------- reshapes that keep the bytes
def storage_is_logical(shape: Sequence[int]) -> bool:
    """True when a tensor of this shape has its C bytes in logical (row-major NCHW) order."""
    if len(shape) != 4:
        return True
    _, c, h, w = (int(d) for d in shape)
    return c == 1 or h * w == 1


def storage_order(shape: Sequence[int]) -> torch.Tensor:
    """The logical (row-major) index of the value held at each byte of a tensor of ``shape``."""
    shape = [int(d) for d in shape]
    idx = torch.arange(int(torch.Size(shape).numel()), dtype=torch.int64).reshape(shape)
    if len(shape) == 4:
        idx = idx.permute(0, 2, 3, 1)
    return idx.reshape(-1)


def shapes_share_bytes(in_shape: Sequence[int], out_shape: Sequence[int]) -> bool:
    """True when reshaping ``in_shape`` to ``out_shape`` leaves every value at the same byte."""
    in_logical, out_logical = storage_is_logical(in_shape), storage_is_logical(out_shape)
    if in_logical and out_logical:
        return True
    if in_logical != out_logical:
        return False
    return bool(torch.equal(storage_order(in_shape), storage_order(out_shape)))


def node_shape(node) -> list[int]:
    return [int(d) for d in node.meta["val"].shape]


def reshape_keeps_bytes(node) -> bool:
    """True for an ``aten.reshape`` node whose output bytes are its input's (an alias)."""
    return node.target == RESHAPE and shapes_share_bytes(node_shape(node.args[0]), node_shape(node))


# ----------------------------------------------------------------------------- strided copy nodes
def strided_copy_alias_offset(node) -> int | None:
    """The input byte where a ``quantized_strided_copy`` node's output starts when it reads one
    contiguous run of bytes (then it can be an alias of them), else None."""
    if node_arg(node, "index") is not None:
        return None
    dims, strides, offset = node_arg(node, "dims"), node_arg(node, "strides"), node_arg(node, "offset")
    simple = [(int(d), int(s)) for d, s in zip(dims, strides) if int(d) != 1]
    if not simple or (len(simple) == 1 and simple[0][1] == 1):
        return int(offset)
    return None


# ----------------------------------------------------------------------------- lowering helpers
# Arguments that are computations on constants (``torch.tensor([0, 2])`` in forward() becomes
# ``lift_fresh_copy`` of a lifted constant, often followed by ``detach_``): evaluated at compile time.
CONSTANT_CHAIN_OPS = frozenset(aten_overloads(
    "lift_fresh_copy.default", "detach.default", "detach_.default", "clone.default", "alias.default",
    "contiguous.default", "_to_copy.default", "to.dtype", "expand.default", "view.default", "reshape.default",
    "unsqueeze.default", "squeeze.dim", "permute.default", "slice.Tensor", "select.int"))


def constant_value(m: Match, node) -> torch.Tensor:
    """The value of a constant argument (an index tensor) of a movement op; LoweringError otherwise."""
    if node.op == "get_attr":
        return m.constant(node)
    if node.op == "call_function" and node.target in CONSTANT_CHAIN_OPS:
        args = torch.fx.node.map_arg(node.args, lambda n: constant_value(m, n))
        kwargs = torch.fx.node.map_arg(node.kwargs, lambda n: constant_value(m, n))
        return node.target(*args, **kwargs)
    raise LoweringError(f"its argument {node.name} is computed from the model's input; only constant indices "
                        "(e.g. torch.tensor([0, 2]) or a registered buffer) can be compiled")


def check_shared_movement(m: Match, what: str) -> None:
    """A data-movement op reads one int8 activation and keeps its quantization."""
    if len(m.inputs) != 1:
        raise LoweringError(f"a {what} of {len(m.inputs)} activations; exactly one is supported")
    if m.inputs[0].qparams != m.output:
        raise LoweringError(f"a {what} must keep its input's quantization parameters (CortenQuantizer shares "
                            "them; another quantizer may not)")
    if m.activation is not None:
        raise LoweringError(f"an activation after a {what} is not fused; apply it before the {what}")


def lower_byte_map(m: Match, fn, what: str):
    """Lower the movement ``fn`` (logical tensor -> logical tensor) of ``m``'s one activation input:
    nothing when it moves no byte, else one ``quantized_strided_copy``."""
    check_shared_movement(m, what)
    x = m.inputs[0].node
    in_shape = [int(d) for d in x.meta["val"].shape]
    out_shape, table = byte_map(fn, in_shape)
    want = [int(d) for d in m.node.meta["val"].shape] if "val" in m.node.meta else out_shape
    if out_shape != want:  # pragma: no cover - torch's own op disagrees with its shape function
        raise LoweringError(f"re-running the {what} gave shape {out_shape}, the graph says {want}")
    if not out_shape:
        raise LoweringError(f"the {what} returns a 0-D tensor (a single element); keep a dimension, e.g. "
                            "x[..., i:i+1] instead of x[..., i]")
    if table.size == 0:
        raise LoweringError(f"the {what} returns an empty tensor of shape {out_shape}")
    if out_shape == in_shape and np.array_equal(table, np.arange(table.size)):
        return x
    return emit_copy(m, x, out_shape, table, what)


def emit_copy(m: Match, x, out_shape: list[int], table: np.ndarray, what: str):
    """One ``quantized_strided_copy`` of ``x`` whose output byte ``j`` is input byte ``table[j]``.
    When ``x`` is itself moved bytes read by this op alone (``x[:, :1].expand(...)``, a flatten
    then a transpose, ...), the two moves are composed into one copy from ``x``'s source."""
    source = movement_source(m, x)
    if source is not None:
        x, inner = source
        table = inner[table]
        if out_shape == [int(d) for d in x.meta["val"].shape] and np.array_equal(table, np.arange(table.size)):
            return x
    plan = fit_copy_plan(table)
    if len(plan.dims) > MAX_DIMS:
        raise LoweringError(f"the {what} needs {len(plan.dims)} nested loops over bytes ({list(plan.dims)}); "
                            f"at most {MAX_DIMS} are supported")
    lo, hi = plan.byte_range()
    if max(abs(v) for v in (*plan.strides, *(plan.index or ()), plan.offset, lo, hi)) > INT32_MAX:
        raise LoweringError(f"the {what} addresses more than 2**31 bytes")
    index = None
    if plan.index is not None:
        index = m.add_constant(torch.tensor(plan.index, dtype=torch.int32), "index")
    return m.call(OP, x, out_shape, list(plan.dims), list(plan.strides), plan.offset, index, plan.index_dim)


def _readers(x) -> list:
    """The nodes reading int8 ``x`` (through its dequantize nodes during the lowering)."""
    out = []
    for u in x.users:
        out.extend(u.users if u.op == "call_function" and u.target in DQ_PER_TENSOR else [u])
    return out


def movement_source(m: Match, x) -> tuple | None:
    """``(source, table)`` when int8 ``x`` is a lowered data movement of ``source`` (a strided copy,
    a transpose or a reshape) that only ``m.node`` reads: ``table[j]`` is the byte of ``source``
    that byte ``j`` of ``x`` holds."""
    if x.op != "call_function" or any(r is not m.node for r in _readers(x)):
        return None
    name = op_name_of(x.target)
    if name == OP:
        index = node_arg(x, "index")
        table = plan_source_bytes(node_arg(x, "dims"), node_arg(x, "strides"), node_arg(x, "offset"),
                                  None if index is None else m.constant(index).tolist(), node_arg(x, "index_dim"))
        return node_arg(x, "input"), table
    src = x.args[0] if x.args else None
    if not isinstance(src, torch.fx.Node) or "val" not in src.meta:
        return None
    shape = [int(d) for d in x.meta["val"].shape]
    if name == "quantized_transpose":
        perm = x.args[1]
        _, table = byte_map(lambda t: t.permute(perm).reshape(shape), src.meta["val"].shape)
        return src, table
    if x.target == _aten.reshape.default:
        _, table = byte_map(lambda t: t.reshape(shape), src.meta["val"].shape)
        return src, table
    return None


def composes_with_copy(m: Match) -> bool:
    """True when ``m``'s input is a data movement that copies bytes and that ``m.node`` alone reads:
    lowering ``m`` as a strided copy then makes the two moves one copy."""
    x = m.inputs[0].node
    return copies_bytes(x) and movement_source(m, x) is not None


def copies_bytes(x) -> bool:
    """True when int8 ``x`` is data movement that costs a copy in C (a transpose, a strided copy
    that is not one contiguous run, a reshape that is not an alias)."""
    if x.op != "call_function":
        return False
    name = op_name_of(x.target)
    if name == "quantized_transpose":
        return True
    if name == OP:
        return strided_copy_alias_offset(x) is None
    return x.target == RESHAPE and not reshape_keeps_bytes(x)



    return getattr(node.target, "__name__", str(node.target)).split(".")[0]
