"""``quantized_pad``: constant padding of an int8 tensor (CMSIS-NN's ``arm_pad_s8``).

``pre_pad[d]`` / ``post_pad[d]`` values equal to ``pad_value`` are added before / after the data
along each *logical* dimension ``d`` (torch order: NCHW for a 4-D activation).  The output keeps
the input's quantization (the quantizer shares it), so the pad value is the real padding constant
quantized with the input's parameters: 0.0 becomes the zero point; a constant outside the
input's range saturates to -128 / 127.

Tensors of 1 to 4 dimensions are supported; in C the padding is applied to the storage
dimensions (NHWC for 4-D, row-major otherwise, see :func:`pad_storage_dims`), so padding N, H, W
and C of an activation all cost one pass over the output.
"""
from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F

from corten.errors import LoweringError
from corten.ops import checks
from corten.ops._common import output_format, storage_dim_order
from corten.ops._movement import check_shared_movement
from corten.ops._qparams import quantize_value
from corten.ops._rules import Match
from corten.ops.registry import OpFamily, annotates, lowers, register_family
from corten.providers import CMSIS_NN, PORTABLE

FAMILY = "pad"
MAX_DIMS = 4


def _check(input, pre_pad, post_pad, pad_value) -> list[int]:
    op = "quantized_pad"
    checks.dtype(op, "input", input, torch.int8)
    if not 1 <= input.dim() <= MAX_DIMS:
        checks.fail(op, "input", f"expected 1 to {MAX_DIMS} dimensions, got shape {tuple(input.shape)}")
    for name, pads in (("pre_pad", pre_pad), ("post_pad", post_pad)):
        if len(pads) != input.dim():
            checks.fail(op, name, f"{list(pads)} has {len(pads)} entries; expected one per input dimension "
                                  f"({input.dim()})")
        if min(pads) < 0:
            checks.fail(op, name, f"{list(pads)} has a negative entry (cropping is not padding)")
    checks.in_range(op, "pad_value", pad_value, -128, 127)
    return [int(s) + int(a) + int(b) for s, a, b in zip(input.shape, pre_pad, post_pad)]


def torch_pad_list(pre_pad: Sequence[int], post_pad: Sequence[int]) -> list[int]:
    """Per-dimension pads -> ``F.pad``'s list (last dimension first, before/after pairs)."""
    out: list[int] = []
    for a, b in zip(reversed(list(pre_pad)), reversed(list(post_pad))):
        out += [int(a), int(b)]
    return out


def per_dim_pads(pad: Sequence[int], rank: int) -> tuple[list[int], list[int]]:
    """``F.pad``'s list (``[last_before, last_after, second_last_before, ...]``) -> per-dimension
    ``(pre_pad, post_pad)`` of a ``rank``-D tensor.  ValueError for an odd or too long list."""
    pad = [int(p) for p in pad]
    if len(pad) % 2 or len(pad) > 2 * rank:
        raise ValueError(f"pad list {pad} must have an even length of at most {2 * rank} for a {rank}-D tensor")
    pre, post = [0] * rank, [0] * rank
    for i in range(len(pad) // 2):
        pre[rank - 1 - i], post[rank - 1 - i] = pad[2 * i], pad[2 * i + 1]
    return pre, post


@torch.library.custom_op("corten::quantized_pad", mutates_args=())
def quantized_pad(input: torch.Tensor, pre_pad: list[int], post_pad: list[int], pad_value: int) -> torch.Tensor:
    _check(input, pre_pad, post_pad, pad_value)
    out = F.pad(input.contiguous(), torch_pad_list(pre_pad, post_pad), mode="constant", value=pad_value)
    return out.contiguous(memory_format=output_format(input.dim()))


@quantized_pad.register_fake
def _(input, pre_pad, post_pad, pad_value):
    shape = _check(input, pre_pad, post_pad, pad_value)
    return input.new_empty(shape).contiguous(memory_format=output_format(len(shape)))


family = register_family(OpFamily(FAMILY, ("quantized_pad",), doc=__doc__))


def pad_storage_dims(shape: Sequence[int], pre_pad: Sequence[int], post_pad: Sequence[int]):
    """``(input, pre, post)`` as 4-entry storage-order lists (NHWC for 4-D; a lower-rank row-major
    tensor right-aligned, e.g. ``[B, F]`` -> ``[1, 1, B, F]``), as ``arm_pad_s8`` takes them."""
    order = storage_dim_order(len(shape))
    lead = [1] * (MAX_DIMS - len(shape))
    zeros = [0] * (MAX_DIMS - len(shape))
    return (lead + [int(shape[d]) for d in order], zeros + [int(pre_pad[d]) for d in order],
            zeros + [int(post_pad[d]) for d in order])


# ----------------------------------------------------------------------------- lowering

_aten = torch.ops.aten
annotates("shared", _aten.constant_pad_nd.default, _aten.pad.default)


def _pad_args(node) -> tuple[list[int], float]:
    """(F.pad list, real constant) of a ``constant_pad_nd`` or ``pad`` node."""
    args = list(node.args) + [None] * 4
    pad = args[1] if args[1] is not None else node.kwargs.get("pad")
    if node.target == _aten.pad.default:
        mode = args[2] if args[2] is not None else node.kwargs.get("mode", "constant")
        if mode != "constant":
            raise LoweringError(f"pad mode {mode!r} is not supported; only mode='constant'")
        value = args[3] if args[3] is not None else node.kwargs.get("value")
    else:
        value = args[2] if args[2] is not None else node.kwargs.get("value", 0)
    return list(pad), float(value or 0.0)


@lowers(_aten.constant_pad_nd.default, _aten.pad.default)
def lower_pad(m: Match):
    """``F.pad(x, pad, value=v)`` -> ``quantized_pad`` with ``v`` quantized on ``x``'s grid."""
    check_shared_movement(m, "pad")
    x = m.inputs[0]
    rank = x.node.meta["val"].dim()
    if not 1 <= rank <= MAX_DIMS:
        raise LoweringError(f"pad of a {rank}-D tensor: only 1 to {MAX_DIMS} dimensions are supported")
    pad, value = _pad_args(m.node)
    try:
        pre, post = per_dim_pads(pad, rank)
    except ValueError as e:
        raise LoweringError(str(e)) from None
    if min(pre + post) < 0:
        raise LoweringError(f"pad {pad} has negative entries (cropping); slice the tensor instead")
    if not any(pre + post):
        return x.node
    return m.call("quantized_pad", x.node, pre, post, quantize_value(value, x.qparams))


# ----------------------------------------------------------------------------- C emission
def _pad_call(ctx, dims_type: str, function: str) -> str:
    """One call of ``function(src, out, value, &input_dims, &pre_pad, &post_pad)`` on storage-order
    dims (``corten_pad_s8`` and ``arm_pad_s8`` take the same arguments)."""
    dims, pre, post = pad_storage_dims(ctx.shape(ctx.arg("input")), ctx.arg("pre_pad"), ctx.arg("post_pad"))
    value = int(ctx.arg("pad_value"))
    src, out = ctx.input("input"), ctx.out()
    return ctx.block(
        ctx.dims("input_dims", dims_type, *dims),
        ctx.dims("pre_pad", dims_type, *pre),
        ctx.dims("post_pad", dims_type, *post),
        ctx.call(function, src, out, value, "&input_dims", "&pre_pad", "&post_pad"))


@PORTABLE.kernel("quantized_pad")
def _pad_portable(ctx) -> str:
    """One ``corten_pad_s8`` call."""
    return _pad_call(ctx, "corten_dims", "corten_pad_s8")


@CMSIS_NN.kernel("quantized_pad")
def _pad_cmsis(ctx) -> str:
    """One ``arm_pad_s8`` call."""
    return _pad_call(ctx, "cmsis_nn_dims", "arm_pad_s8")
