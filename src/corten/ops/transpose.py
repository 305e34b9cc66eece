"""``quantized_transpose``: a permutation of an int8 tensor's dimensions (``arm_transpose_s8``).

The op's meaning is torch's ``input.permute(perm)`` on *logical* dimensions: output dim ``i`` is
input dim ``perm[i]``.  The values keep their quantization (the quantizer shares it), so no
arithmetic is involved, only bytes move.

The C kernel works on *bytes*.  A graph tensor's bytes are in storage order: NHWC for 4-D
activations (logical NCHW), row-major for every other rank (:func:`storage_dim_order`).  The
logical permutation is therefore turned into a permutation of storage dimensions
(:func:`byte_permutation`), simplified by dropping size-1 dimensions and merging dimensions that
stay adjacent: ``[1, C, H, W].permute(0, 2, 3, 1)`` reads NHWC bytes ``(H, W, C)`` and writes
the NHWC bytes of ``[1, H, W, C]``, i.e. ``(W, C, H)``: a 2-D transpose of ``[H, W*C]``.

A permutation that keeps the order of the dimensions larger than 1 is a reshape in disguise; the
lowering turns it into ``aten.reshape`` (free, or a layout copy, as the generator decides).

The optional ``shape`` argument reshapes the permuted values (row-major, not 4-D): the lowering
uses it when every reader of a permute flattens it, so ``conv -> permute(0, 2, 3, 1) -> flatten``
(a channels-last flatten) is one copy of the NHWC bytes instead of a transpose plus a layout copy.
"""
from __future__ import annotations

from typing import Sequence

import torch

from corten.errors import LoweringError
from corten.ops import checks
from corten.ops._common import RESHAPES, output_format, storage_dim_order, storage_shape
from corten.ops._movement import aten_overloads, check_shared_movement, composes_with_copy, lower_byte_map
from corten.ops._rules import DQ_PER_TENSOR, Match
from corten.ops.registry import OpFamily, annotates, lowers, register_family
from corten.providers import CMSIS_NN, PORTABLE, NodeView

FAMILY = "transpose"
MAX_DIMS = 6  # CORTEN_TRANSPOSE_MAX_DIMS in corten_kernels.h
CMSIS_MAX_DIMS = 4  # arm_transpose_s8 takes cmsis_nn_dims


# ----------------------------------------------------------------------------- byte layout helpers
def normalize_perm(perm: Sequence[int], rank: int) -> list[int]:
    """``perm`` with negative entries made positive; ValueError unless it permutes ``range(rank)``."""
    p = [int(d) + rank if int(d) < 0 else int(d) for d in perm]
    if sorted(p) != list(range(rank)):
        raise ValueError(f"{list(perm)} is not a permutation of the {rank} dimensions")
    return p


def simplify_permutation(dims: Sequence[int], perm: Sequence[int]) -> tuple[list[int], list[int]]:
    """The smallest equivalent ``(dims, perm)`` of a row-major byte permutation.

    ``dims`` are the input's row-major sizes and output dim ``j`` is input dim ``perm[j]``.  Size-1
    dimensions are dropped and runs of input dims that stay consecutive in the output are merged.
    An identity (a plain copy) comes back as ``([size], [0])`` or ``([], [])`` for one element.
    """
    keep = [d for d in range(len(dims)) if int(dims[d]) != 1]
    renumber = {d: i for i, d in enumerate(keep)}
    sizes = [int(dims[d]) for d in keep]
    order = [renumber[d] for d in perm if d in renumber]
    # Merge input dims i, i+1 when the output reads them one after the other.
    groups: list[list[int]] = []
    for d in order:
        if groups and groups[-1][-1] + 1 == d:
            groups[-1].append(d)
        else:
            groups.append([d])
    # The merged input dims, in input order, and the output order over them.
    by_input = sorted(groups, key=lambda g: g[0])
    merged_dims = []
    for g in by_input:
        size = 1
        for d in g:
            size *= sizes[d]
        merged_dims.append(size)
    index = {g[0]: i for i, g in enumerate(by_input)}
    merged_perm = [index[g[0]] for g in groups]
    return merged_dims, merged_perm


def byte_permutation(in_shape: Sequence[int], perm: Sequence[int],
                     flattened: bool = False) -> tuple[list[int], list[int]]:
    """The simplified storage-level ``(dims, perm)`` that ``input.permute(perm)`` performs on bytes.

    Storage position ``j`` of the output holds output logical dim ``order[j]``, which is input
    logical dim ``perm[order[j]]``, found at input storage position ``inv_order[...]``.
    ``flattened``: the permuted values are then reshaped to a row-major (not 4-D) shape, so the
    output's bytes are in the permuted logical order (``order`` is the identity).
    """
    rank = len(in_shape)
    perm = normalize_perm(perm, rank)
    order = tuple(range(rank)) if flattened else storage_dim_order(rank)
    inv = {d: j for j, d in enumerate(storage_dim_order(rank))}
    byte_perm = [inv[perm[order[j]]] for j in range(rank)]
    return simplify_permutation(storage_shape(in_shape), byte_perm)


def keeps_logical_order(in_shape: Sequence[int], perm: Sequence[int]) -> bool:
    """True when ``permute(perm)`` only moves size-1 dims: the values keep their logical (row-major)
    order, so the permute is a reshape."""
    moved = [d for d in perm if int(in_shape[d]) != 1]
    return moved == sorted(moved)


# ----------------------------------------------------------------------------- the op
def _check(input, perm, shape=None) -> list[int]:
    op = "quantized_transpose"
    checks.dtype(op, "input", input, torch.int8)
    if not 1 <= input.dim() <= MAX_DIMS:
        checks.fail(op, "input", f"expected 1 to {MAX_DIMS} dimensions, got shape {tuple(input.shape)}")
    if len(perm) != input.dim():
        checks.fail(op, "perm", f"{list(perm)} has {len(perm)} entries for a {input.dim()}-D input")
    if sorted(perm) != list(range(input.dim())):
        checks.fail(op, "perm", f"{list(perm)} is not a permutation of 0..{input.dim() - 1} (no negative entries)")
    if shape is None:
        return [int(input.shape[d]) for d in perm]
    numel = 1
    for d in shape:
        numel *= int(d)
    if len(shape) == 4 or min(shape, default=1) < 1 or numel != input.numel():
        checks.fail(op, "shape", f"{list(shape)} must be a shape of {input.numel()} elements that is not 4-D "
                                 "(its bytes are row-major)")
    return [int(d) for d in shape]


@torch.library.custom_op("corten::quantized_transpose", mutates_args=())
def quantized_transpose(input: torch.Tensor, perm: list[int], shape: list[int] | None = None) -> torch.Tensor:
    """``input.permute(perm)`` (logical dims), laid out as every graph tensor (NHWC for 4-D);
    with ``shape``, ``input.permute(perm).reshape(shape)`` (a channels-last flatten in one copy)."""
    out_shape = _check(input, perm, shape)
    out = input.permute(perm).clone(memory_format=output_format(input.dim()))  # never a view of input
    return out if shape is None else out.reshape(out_shape).contiguous()


@quantized_transpose.register_fake
def _(input, perm, shape=None):
    out_shape = _check(input, perm, shape)
    return input.new_empty(out_shape).contiguous(memory_format=output_format(len(out_shape)))


family = register_family(OpFamily(FAMILY, ("quantized_transpose",), doc=__doc__))


# ----------------------------------------------------------------------------- lowering

_aten = torch.ops.aten
PERMUTES = aten_overloads("permute.default", "transpose.int", "t.default", "movedim.int", "movedim.intlist",
                          "moveaxis.int", "moveaxis.intlist", "swapaxes.default", "swapdims.default",
                          "numpy_T.default", "mT.default", "adjoint.default", "permute_copy.default",
                          "transpose_copy.int")
annotates("shared", *PERMUTES)


def aten_permutation(node) -> list[int]:
    """The logical permutation of a permute-like node (``permute``, ``transpose``, ``t``,
    ``movedim``, ``swapaxes``, ``.T``, ``.mT``, ...): the op applied to a probe tensor whose
    dimension ``d`` has size ``d + 2`` tells where each dimension went."""
    rank = node.args[0].meta["val"].dim()
    if node.target == _aten.permute.default:
        return normalize_perm(node.args[1], rank)
    probe = torch.empty([d + 2 for d in range(rank)], device="meta")
    out = node.target(probe, *node.args[1:], **node.kwargs)
    return [int(s) - 2 for s in out.shape]


@lowers(*PERMUTES)
def lower_permute(m: Match):
    """A permute that moves bytes -> ``quantized_transpose``; one that only moves size-1 dims ->
    ``aten.reshape`` (the generator makes it an alias or a layout copy)."""
    check_shared_movement(m, "permute")
    x = m.inputs[0]
    in_shape = [int(d) for d in x.node.meta["val"].shape]
    if len(in_shape) > MAX_DIMS:
        raise LoweringError(f"permute of a {len(in_shape)}-D tensor: at most {MAX_DIMS} dimensions are supported")
    perm = aten_permutation(m.node)
    out_shape = [in_shape[d] for d in perm]
    if perm == sorted(perm):
        return x.node
    if keeps_logical_order(in_shape, perm):
        return m.call_aten(_aten.reshape.default, x.node, out_shape)
    if composes_with_copy(m) and not _read_by_matmul(m):
        # bytes another movement just copied (e.g. a flatten of NHWC): one strided copy for both
        # (not before a matmul, which folds a transposed operand into its kernel call)
        return lower_byte_map(m, lambda t: t.permute(perm), "permute")
    flat = _flattened_shape(m)
    if flat is None:
        return m.call("quantized_transpose", x.node, perm)
    node = m.call("quantized_transpose", x.node, perm, flat)
    node.meta["val"] = m.out_q.meta["val"].reshape(flat).contiguous()
    return node


_MATMULS = aten_overloads("matmul.default", "bmm.default", "mm.default")


def _read_by_matmul(m: Match) -> bool:
    """True when a matmul reads the permute's output (through its dequantize nodes)."""
    return any(r.target in _MATMULS for dq in m.out_q.users for r in dq.users)


def _flattened_shape(m: Match) -> list[int] | None:
    """The common non-4-D shape every reader of the permute's int8 output reshapes it to (through
    its dequantize nodes), or None.  Then the permute and the reshape are one transpose: the
    reshapes' own lowering finds their input already in shape and vanishes."""
    dqs = list(m.out_q.users)
    readers = [r for dq in dqs for r in dq.users]
    if not dqs or not readers or any(dq.target not in DQ_PER_TENSOR for dq in dqs):
        return None
    if any(r.target not in RESHAPES for r in readers):  # (e.g. the output node, whose val is a tuple)
        return None
    shapes = {tuple(int(d) for d in r.meta["val"].shape) if "val" in r.meta else None for r in readers}
    if len(shapes) != 1:
        return None
    (shape,) = shapes
    return None if shape is None or len(shape) == 4 else list(shape)


# ----------------------------------------------------------------------------- C emission
def _c_list(values) -> str:
    return "{" + ", ".join(str(int(v)) for v in values) + "}"


def cmsis_transpose_plan(in_shape: Sequence[int], perm: Sequence[int],
                         flattened: bool = False) -> tuple[list[int], list[int], list[int]]:
    """``(input_dims, output_dims, permutations)`` of the ``arm_transpose_s8`` call doing
    ``permute(perm)`` on a graph tensor of logical ``in_shape``: the simplified byte permutation,
    its dims padded with 1s to the 4 ``cmsis_nn_dims`` fields (an identity is a 1-D copy).
    ValueError when more than 4 byte dims remain."""
    dims, bperm = byte_permutation(in_shape, perm, flattened)
    if not dims:
        dims, bperm = [1], [0]
    if len(dims) > CMSIS_MAX_DIMS:
        raise ValueError(f"the byte permutation has {len(dims)} dimensions {dims} after simplification; "
                         f"arm_transpose_s8 takes at most {CMSIS_MAX_DIMS}")
    pad = [1] * (CMSIS_MAX_DIMS - len(dims))
    return dims + pad, [dims[p] for p in bperm] + pad, bperm


def _byte_permutation(ctx) -> tuple[list[int], list[int]]:
    dims, perm = byte_permutation(ctx.shape(ctx.arg("input")), ctx.arg("perm"), ctx.arg("shape") is not None)
    return (dims, perm) if dims else ([1], [0])


def _cmsis_supports(node, target) -> str | None:
    v = NodeView(node, target)
    try:
        cmsis_transpose_plan(v.shape(v.arg("input")), v.arg("perm"), v.arg("shape") is not None)
    except ValueError:
        return "more than 4 byte dims after merging (arm_transpose_s8 takes 4)"
    return None


@PORTABLE.kernel("quantized_transpose")
def _transpose_portable(ctx) -> str:
    """``corten_transpose_s8`` over the simplified byte permutation (up to 6 storage dims); an
    identity is a plain copy."""
    dims, perm = _byte_permutation(ctx)
    src, out = ctx.input("input"), ctx.out()
    return ctx.block(
        f"const int32_t dims[{len(dims)}] = {_c_list(dims)};",
        f"const int32_t perm[{len(perm)}] = {_c_list(perm)};",
        ctx.call("corten_transpose_s8", len(dims), "dims", "perm", src, out))


@CMSIS_NN.kernel("quantized_transpose", supports=_cmsis_supports)
def _transpose_cmsis(ctx) -> str:
    """``arm_transpose_s8`` over the simplified byte permutation (up to 4 storage dims)."""
    src, out = ctx.input("input"), ctx.out()
    in_dims, out_dims, perm = cmsis_transpose_plan(ctx.shape(ctx.arg("input")), ctx.arg("perm"),
                                                   ctx.arg("shape") is not None)
    return ctx.block(
        ctx.dims("input_dims", "cmsis_nn_dims", *in_dims),
        ctx.dims("output_dims", "cmsis_nn_dims", *out_dims),
        f"const uint32_t perm[{len(perm)}] = {_c_list(perm)};",
        ctx.params("cmsis_nn_transpose_params", "params", dict(num_dims=len(perm), permutations="perm")),
        ctx.call("arm_transpose_s8", src, out, "&input_dims", "&output_dims", "&params"))
