"""Fold a symmetric zero pad into the 2-D convolutions that read it.

``conv2d(F.pad(x, (l, r, t, b)), padding=(ph, pw))`` equals ``conv2d(x, padding=(ph + t, pw + l))``
when ``l == r``, ``t == b`` and the pad value is 0: the convolution's own padding is zeros too.
After quantization both mean the real value 0 (the pad value would be the zero point; conv
padding is folded through the input offset), so the fold is exact in int8 as well, and saves the
pad's copy and its output buffer.

The fold is done only when every user of the pad is an ``aten.conv2d.default`` reading it as its
input, the pad touches H and W only, and each new padding stays within the dilated kernel extent
(padding up to the kernel size is what the conv kernels are tested with).
"""
from __future__ import annotations

import torch
from torch.fx import GraphModule, Node
from torch.fx.passes.infra.pass_base import PassBase, PassResult

from corten.aten_passes.graph_utils import finish_rewrite, set_arg
from corten.fx_nodes import node_arg

aten = torch.ops.aten
PAD_OPS = (aten.pad.default, aten.constant_pad_nd.default)
CONV = aten.conv2d.default


def symmetric_zero_pad(node: Node) -> tuple[int, int] | None:
    """``(pad_h, pad_w)`` of a constant zero pad of a 4-D tensor's H and W with equal sides, else None."""
    if node.op != "call_function" or node.target not in PAD_OPS:
        return None
    x = node.args[0]
    val = x.meta.get("val") if isinstance(x, Node) else None
    if not isinstance(val, torch.Tensor) or val.dim() != 4:
        return None
    pad = list(node_arg(node, "pad", []))
    if node.target == aten.pad.default:
        if node_arg(node, "mode", "constant") != "constant":
            return None
        value = node_arg(node, "value", None)
    else:
        value = node_arg(node, "value", 0)
    if value not in (None, 0, 0.0) or len(pad) > 8 or len(pad) % 2 or any(p for p in pad[4:]):
        return None
    left, right, top, bottom = (list(pad) + [0, 0, 0, 0])[:4]
    if left != right or top != bottom or min(left, top) < 0 or not (left or top):
        return None
    return int(top), int(left)


def _pair(v, default: int) -> list[int]:
    if v is None:
        return [default, default]
    v = list(v) if isinstance(v, (list, tuple)) else [v]
    return [int(d) for d in (v * 2 if len(v) == 1 else v)]


def _folded_padding(conv: Node, pad_node: Node, pad_hw: tuple[int, int]) -> list[int] | None:
    """The conv's padding with ``pad_hw`` added, or None when the conv cannot take it."""
    if conv.op != "call_function" or conv.target != CONV or conv.args[0] is not pad_node:
        return None
    if any(a is pad_node for a in list(conv.args[1:]) + list(conv.kwargs.values())):
        return None
    weight = conv.args[1].meta.get("val") if isinstance(conv.args[1], Node) else None
    if not isinstance(weight, torch.Tensor) or weight.dim() != 4:
        return None
    padding = _pair(node_arg(conv, "padding", None), 0)
    dilation = _pair(node_arg(conv, "dilation", None), 1)
    new = [padding[0] + pad_hw[0], padding[1] + pad_hw[1]]
    extent = [dilation[0] * (weight.shape[2] - 1) + 1, dilation[1] * (weight.shape[3] - 1) + 1]
    if new[0] > extent[0] or new[1] > extent[1]:
        return None
    return new


class FoldPadIntoConvPass(PassBase):
    """``conv2d(pad(x))`` -> ``conv2d(x)`` with the (symmetric, zero) pad added to its padding."""

    def call(self, graph_module: GraphModule) -> PassResult:
        modified = False
        for node in list(graph_module.graph.nodes):
            pad_hw = symmetric_zero_pad(node)
            if pad_hw is None or not node.users:
                continue
            convs = list(node.users)
            paddings = [_folded_padding(c, node, pad_hw) for c in convs]
            if any(p is None for p in paddings):
                continue
            for conv, padding in zip(convs, paddings):
                set_arg(conv, 4, "padding", padding)
                conv.replace_input_with(node, node.args[0])
            graph_module.graph.erase_node(node)
            modified = True
        if modified:
            finish_rewrite(graph_module)
        return PassResult(graph_module, modified)
