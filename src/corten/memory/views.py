"""Which ``aten.reshape`` nodes of a lowered program are free (aliases) and which need a copy in C.

A graph tensor's C bytes are its values in *storage order*: NHWC for 4-D activations (Corten's
convention: the reference kernels return ``channels_last`` tensors), row-major for every other
rank.  ``torch.reshape`` keeps the *logical* (row-major NCHW) order of the values.  A reshape is
therefore byte-for-byte free exactly when every value sits at the same byte in its input and in
its output; otherwise the C code must copy (permute) the bytes.

A 4-D ``[N, C, H, W]`` tensor's NHWC storage equals its logical order when ``C == 1`` or
``H * W == 1``, so the common cases are decided without building any index tensor:

* ``[1, 1280, 1, 1] -> [1, 1280]`` (MobileNetV2's flatten): alias;
* ``[1, 16, 5, 5] -> [1, 400]`` (flatten of a feature map): copy (NHWC -> NCHW order);
* ``[1, 400] -> [1, 16, 5, 5]`` (un-flatten before a conv): copy (NCHW -> NHWC order);
* ``[1, 8, 4, 4] -> [1, 8, 16, 1]``: both sides permuted the same way, alias.
"""
from __future__ import annotations

from typing import Sequence

import torch

RESHAPE = torch.ops.aten.reshape.default


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


def reshape_is_alias(node: torch.fx.Node) -> bool:
    """True when the ``aten.reshape`` ``node`` can share its input's bytes; False when C must copy.

    Shared by the memory planner (an alias gets its input's offset and extends its lifetime) and
    the C generator (which emits the NHWC <-> NCHW copy for the others).
    """
    if node.op != "call_function" or node.target != RESHAPE:
        raise ValueError(f"reshape_is_alias: node {node.name!r} is {node.target}, not aten.reshape.default")
    src = node.args[0]
    if not isinstance(src, torch.fx.Node) or "val" not in src.meta or "val" not in node.meta:
        raise ValueError(f"reshape_is_alias: node {node.name!r} lacks meta['val'] shapes on its input or "
                         "output; run it through torch.export (or FakeTensorProp) first")
    return shapes_share_bytes(tuple(src.meta["val"].shape), tuple(node.meta["val"].shape))
