"""Decompose ``F.scaled_dot_product_attention`` into the ops Corten lowers one by one.

``torch.export`` keeps ``aten.scaled_dot_product_attention`` whole.  Before quantization it is
rewritten as the attention users write by hand::

    softmax((q @ k.transpose(-2, -1)) * scale, dim=-1) @ v          (scale = 1 / sqrt(E) by default)

so that every intermediate tensor gets its own observer and each op lowers through its family
(matmul, mul by a constant, softmax).  Calls with an ``attn_mask``, ``dropout_p > 0``,
``is_causal=True`` or ``enable_gqa=True`` are left alone (and reported as unlowered).
"""
from __future__ import annotations

import math

import torch
from torch.fx import GraphModule, Node
from torch.fx.passes.infra.pass_base import PassBase, PassResult

from corten.aten_passes.graph_utils import finish_rewrite

aten = torch.ops.aten
SDPA = aten.scaled_dot_product_attention.default


def _arg(node: Node, i: int, name: str, default):
    if len(node.args) > i:
        return node.args[i]
    return node.kwargs.get(name, default)


class DecomposeScaledDotProductAttentionPass(PassBase):
    def call(self, gm: GraphModule) -> PassResult:
        modified = False
        for node in list(gm.graph.nodes):
            if node.op != "call_function" or node.target != SDPA:
                continue
            q, k, v = node.args[:3]
            scale = _arg(node, 6, "scale", None)
            if (_arg(node, 3, "attn_mask", None) is not None or _arg(node, 4, "dropout_p", 0.0) != 0.0
                    or _arg(node, 5, "is_causal", False) or isinstance(scale, Node)
                    or node.kwargs.get("enable_gqa", False)):
                continue
            if scale is None:
                scale = 1.0 / math.sqrt(int(q.meta["val"].shape[-1]))
            g = gm.graph
            with g.inserting_before(node):
                kt = g.call_function(aten.transpose.int, (k, -2, -1))
                scores = g.call_function(aten.matmul.default, (q, kt))
                scaled = g.call_function(aten.mul.Tensor, (scores, float(scale)))
                weights = g.call_function(aten.softmax.int, (scaled, -1))
                out = g.call_function(aten.matmul.default, (weights, v))
            for n in (kt, scores, scaled, weights, out):
                n.meta["stack_trace"] = node.meta.get("stack_trace")
                n.meta["nn_module_stack"] = node.meta.get("nn_module_stack", {})
            node.replace_all_uses_with(out)
            g.erase_node(node)
            modified = True
        if modified:
            finish_rewrite(gm)
        return PassResult(gm, modified)
