"""``quantized_cat``: concatenation of int8 tensors sharing one quantization
(CMSIS-NN's ``arm_concatenation_s8_{x,y,z,w}``).

``torch.cat(inputs, dim)`` on logical dimensions; all inputs and the output share the first
input's quantization parameters (the quantizer shares them), so only bytes move.  An input may
be a constant (a class token, a coordinate map): it is stored as an int8 array in that quantization.

In storage order (NHWC for 4-D, row-major otherwise) a concatenation along storage position
``k`` is, for each of the ``outer = prod(dims[:k])`` outer indices, one contiguous chunk of
``prod(dims_i[k:])`` bytes per input placed side by side (:func:`concat_geometry`).  Along
channels of an NHWC activation the chunks are the pixels' channel vectors: the inputs
interleave pixel by pixel; along the batch dimension each input is a single block.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from corten.errors import LoweringError
from corten.ops import checks
from corten.ops._broadcast import is_constant
from corten.ops._common import is_activation_operand, output_format, storage_dim_order, storage_shape
from corten.ops._rules import DQ_PER_TENSOR, Match, qparams_of
from corten.ops.registry import OpFamily, annotates, lowers, register_family
from corten.providers import CMSIS_NN, PORTABLE, NodeView

FAMILY = "concat"
CMSIS_MAX_DIMS = 4  # arm_concatenation_s8_* see a tensor as [w][z][y][x]
CMSIS_MAX_DIM_SIZE = 65535  # ... with uint16_t sizes


def _check(inputs, dim) -> list[int]:
    op = "quantized_cat"
    if len(inputs) == 0:
        checks.fail(op, "inputs", "expected at least one tensor")
    first = inputs[0]
    for i, t in enumerate(inputs):
        checks.dtype(op, f"inputs[{i}]", t, torch.int8)
    if first.dim() < 1:
        checks.fail(op, "inputs[0]", "expected a tensor of at least one dimension, got a scalar")
    checks.in_range(op, "dim", dim, 0, first.dim() - 1)
    for i, t in enumerate(inputs[1:], start=1):
        same = t.dim() == first.dim() and all(t.shape[d] == first.shape[d] for d in range(t.dim()) if d != dim)
        if not same:
            checks.fail(op, f"inputs[{i}]", f"shape {tuple(t.shape)} differs from inputs[0]'s {tuple(first.shape)} "
                                            f"outside dimension {dim}")
    shape = list(first.shape)
    shape[dim] = sum(int(t.shape[dim]) for t in inputs)
    return shape


@torch.library.custom_op("corten::quantized_cat", mutates_args=())
def quantized_cat(inputs: list[torch.Tensor], dim: int) -> torch.Tensor:
    _check(inputs, dim)
    return torch.cat([t.contiguous() for t in inputs], dim).contiguous(memory_format=output_format(inputs[0].dim()))


@quantized_cat.register_fake
def _(inputs, dim):
    shape = _check(inputs, dim)
    return inputs[0].new_empty(shape).contiguous(memory_format=output_format(len(shape)))


family = register_family(OpFamily(FAMILY, ("quantized_cat",), doc=__doc__))


@dataclass(frozen=True)
class ConcatChunk:
    """One input's part of a concatenation in storage order: ``outer`` times, copy ``inner`` bytes
    from ``input + o * inner`` to ``output + o * output_inner + offset``."""

    outer: int
    inner: int
    output_inner: int
    offset: int


def concat_position(rank: int, dim: int) -> int:
    """Storage position of logical dimension ``dim`` (channels of a 4-D tensor: 3)."""
    return storage_dim_order(rank).index(dim)


def concat_geometry(shapes: Sequence[Sequence[int]], dim: int) -> list[ConcatChunk]:
    """The byte copies of ``torch.cat`` of tensors of logical ``shapes`` along ``dim``."""
    k = concat_position(len(shapes[0]), dim)
    out_dims = storage_shape(shapes[0])
    out_dims[k] = sum(int(s[dim]) for s in shapes)
    outer = _prod(out_dims[:k])
    below = _prod(out_dims[k + 1:])
    chunks, start = [], 0
    for s in shapes:
        size = int(s[dim])
        chunks.append(ConcatChunk(outer, size * below, out_dims[k] * below, start * below))
        start += size
    return chunks


def _prod(values) -> int:
    p = 1
    for v in values:
        p *= int(v)
    return p


# ----------------------------------------------------------------------------- lowering

_aten = torch.ops.aten
annotates("shared", _aten.cat.default)


@lowers(_aten.cat.default)
def lower_cat(m: Match):
    """``torch.cat`` of int8 tensors sharing one quantization -> ``quantized_cat``.  An input that
    is a quantized constant (a ViT class token ``cls.expand(B, -1, -1)``, a learned padding row)
    becomes an int8 constant array in the output's quantization, copied like an activation."""
    tensors = m.node.args[0]
    dim = m.node.args[1] if len(m.node.args) > 1 else m.node.kwargs.get("dim", 0)
    if m.activation is not None:
        raise LoweringError("an activation after a cat is not fused; apply it to the inputs")
    parts = []
    for i, arg in enumerate(tensors):
        value = next((v for v in m.inputs if is_activation_operand(arg, v)), None)
        if value is None:
            parts.append(m.add_constant(_constant_in(m, arg, i), f"input{i}"))
            continue
        if value.qparams != m.output:
            raise LoweringError(f"cat input {i} has quantization {value.qparams}, the output {m.output}: all "
                                "inputs must share the output's (CortenQuantizer shares them unless a producer "
                                "fixes its own, e.g. a sigmoid)")
        parts.append(value.node)
    if all(p.op == "get_attr" for p in parts):
        raise LoweringError("cat of constants only is a constant; compute it outside the model")
    if len(parts) == 1:
        return parts[0]
    return m.call("quantized_cat", parts, int(dim) % len(m.node.meta["val"].shape))


def _constant_in(m: Match, arg, index: int) -> torch.Tensor:
    """The int8 values, in the cat output's quantization, of the quantized constant input ``arg``
    (requantized exactly as the fake-quantized model rounds it: ``round_half_even``)."""
    if not (isinstance(arg, torch.fx.Node) and arg.target in DQ_PER_TENSOR and arg.args[0].op == "get_attr"):
        raise LoweringError(f"cat input {index} is neither an int8 activation nor a quantized constant; every "
                            "input must be one (CortenQuantizer quantizes tensors and parameters it sees)")
    values = m.constant(arg.args[0])
    q = qparams_of(arg)
    if values.dtype != torch.int8 or q.dtype != torch.int8:
        raise LoweringError(f"cat input {index}: the constant is not an int8 per-tensor quantized tensor")
    if q == m.output:
        return values
    real = (values.to(torch.float64) - q.zero_point) * q.scale
    out = m.output
    return (torch.round(real / out.scale) + out.zero_point).clamp(out.qmin, out.qmax).to(torch.int8)


# ----------------------------------------------------------------------------- C emission
_CMSIS_VARIANT = "wzyx"  # storage position (right-aligned to 4 dims) -> arm_concatenation_s8_<axis>


@dataclass(frozen=True)
class CmsisConcatCall:
    """One ``arm_concatenation_s8_<axis>(input, x, y, z, w, output[, output_size], offset)`` call."""

    axis: str  # "x" | "y" | "z" | "w"
    x: int
    y: int
    z: int
    w: int
    output_size: int | None  # output size along the axis (not taken by the w variant)
    offset: int

    def args(self, src: str, out: str) -> list[str]:
        sizes = [src, str(self.x), str(self.y), str(self.z), str(self.w), out]
        if self.output_size is None:
            return sizes + [f"{self.offset}u"]
        return sizes + [str(self.output_size), f"{self.offset}u"]


def cmsis_concat_calls(shapes: Sequence[Sequence[int]], dim: int) -> list[CmsisConcatCall]:
    """The CMSIS-NN calls of ``torch.cat`` of tensors of logical ``shapes`` (rank <= 4) along
    ``dim``: storage dims right-aligned to CMSIS-NN's ``[w][z][y][x]``, the variant named after
    the concatenated axis.  ValueError when a size does not fit CMSIS-NN's ``uint16_t``."""
    rank = len(shapes[0])
    if rank > CMSIS_MAX_DIMS:
        raise ValueError(f"a {rank}-D concatenation; arm_concatenation_s8 takes at most {CMSIS_MAX_DIMS} dimensions")
    lead = [1] * (CMSIS_MAX_DIMS - rank)
    k = len(lead) + concat_position(rank, dim)
    total = sum(int(s[dim]) for s in shapes)
    if total > CMSIS_MAX_DIM_SIZE:
        raise ValueError(f"output size {total} along the concatenated axis exceeds arm_concatenation_s8's "
                         "uint16_t limit")
    calls, start = [], 0
    for s in shapes:
        w, z, y, x = lead + storage_shape(s)
        if max(w, z, y, x) > CMSIS_MAX_DIM_SIZE:
            raise ValueError(f"input sizes {[w, z, y, x]} exceed arm_concatenation_s8's uint16_t limit")
        axis = _CMSIS_VARIANT[k]
        calls.append(CmsisConcatCall(axis, x, y, z, w, None if axis == "w" else total, start))
        start += int(s[dim])
    return calls


def _operands(ctx) -> tuple[list, int, list[str], str]:
    nodes = list(ctx.arg("inputs"))
    shapes = [ctx.shape(n) for n in nodes]
    out = ctx.out()
    srcs = [ctx.constant(n, f"input{i}", torch.int8) if is_constant(n) else ctx.buffer(n) for i, n in enumerate(nodes)]
    if out in srcs:
        ctx.fail("the memory plan puts an input in the output buffer; a cat cannot run in place")
    return shapes, int(ctx.arg("dim")), srcs, out


def _cmsis_supports(node, target) -> str | None:
    v = NodeView(node, target)
    try:
        cmsis_concat_calls([v.shape(n) for n in v.arg("inputs")], int(v.arg("dim")))
    except ValueError as e:
        return str(e)
    return None


@PORTABLE.kernel("quantized_cat")
def _cat_portable(ctx) -> str:
    """One ``corten_concat_s8`` copy per input."""
    shapes, dim, srcs, out = _operands(ctx)
    return "\n".join(ctx.call("corten_concat_s8", src, c.outer, c.inner, c.output_inner, c.offset, out)
                     for src, c in zip(srcs, concat_geometry(shapes, dim)))


@CMSIS_NN.kernel("quantized_cat", supports=_cmsis_supports)
def _cat_cmsis(ctx) -> str:
    """One ``arm_concatenation_s8_*`` call per input, the variant of the concatenated storage axis
    (tensors of up to 4 dimensions, sizes within ``uint16_t``)."""
    shapes, dim, srcs, out = _operands(ctx)
    return "\n".join(ctx.invoke(f"arm_concatenation_s8_{c.axis}", *c.args(src, out)) + ";"
                     for src, c in zip(srcs, cmsis_concat_calls(shapes, dim)))
