"""Decompose ``F.scaled_dot_product_attention`` into the ops Corten lowers one by one.

``torch.export`` keeps ``aten.scaled_dot_product_attention`` whole.  Before quantization it is
rewritten as the attention users write by hand::

    softmax((q @ k.transpose(-2, -1)) * scale, dim=-1) @ v          (scale = 1 / sqrt(E) by default)

so that every intermediate tensor gets its own observer and each op lowers through its family
(matmul, mul by a constant, softmax).  ``is_causal=True`` and a constant boolean ``attn_mask`` (or a
float one of 0 and large negative values; a mask computed from constants - a ``key_padding_mask``
buffer - is folded to one first) become the masked softmax ``p = softmax(s * keep + amin(s) * (1 - keep)) * keep;
p / p.sum(-1)`` with the constant 0/1 ``keep`` (``decompose_composites.masked_softmax``); another
constant float mask is added to the scores.
Calls with a computed mask, ``dropout_p > 0`` or ``enable_gqa=True`` are left alone (and reported
as unlowered).
"""
from __future__ import annotations

import math

import torch
from torch.fx import GraphModule, Node
from torch.fx.passes.infra.pass_base import PassBase, PassResult

from corten.aten_passes.decompose_composites import fold_constants, masked_softmax_constants
from corten.aten_passes.graph_utils import add_constant, finish_rewrite
from corten.fx_nodes import get_attr, node_arg

aten = torch.ops.aten
SDPA = aten.scaled_dot_product_attention.default


class DecomposeScaledDotProductAttentionPass(PassBase):
    def call(self, gm: GraphModule) -> PassResult:
        # a mask computed from constants after functionalization (nn.MultiheadAttention's
        # key_padding_mask of a buffer: ``zeros_like(m).masked_fill_(m, -inf)``, then view/expand)
        masks = [node_arg(n, "attn_mask", None) for n in gm.graph.nodes if n.op == "call_function" and n.target == SDPA]
        modified = fold_constants(gm, only_for=[m for m in masks if isinstance(m, Node) and m.op != "get_attr"])
        for node in list(gm.graph.nodes):
            if node.op != "call_function" or node.target != SDPA:
                continue
            q, k, v = node.args[:3]
            scale = node_arg(node, "scale", None)
            mask = node_arg(node, "attn_mask", None)
            causal = bool(node_arg(node, "is_causal", False))
            if ((mask is not None and not (isinstance(mask, Node) and mask.op == "get_attr"))
                    or (mask is not None and causal) or node_arg(node, "dropout_p", 0.0) != 0.0
                    or isinstance(scale, Node) or node.kwargs.get("enable_gqa", False)):
                continue
            keep, additive = None, None
            n_q, n_k = int(q.meta["val"].shape[-2]), int(k.meta["val"].shape[-2])
            if causal:
                keep = torch.ones(n_q, n_k, dtype=torch.bool).tril()
            elif mask is not None:
                m = get_attr(gm, mask).detach()
                if m.dtype == torch.bool:
                    keep = m
                elif bool(((m == 0) | (m <= -1e4)).all()):
                    keep = m == 0
                else:
                    additive = m.to(torch.float32)
            if scale is None:
                scale = 1.0 / math.sqrt(int(q.meta["val"].shape[-1]))
            g = gm.graph
            extra = []
            keep_node = drop_node = None
            if keep is not None:
                keep_node, drop_node = (add_constant(gm, f"{node.name}_{what}", c, node) for what, c in
                                        zip(("keep", "drop"), masked_softmax_constants(keep)))
            add_node = add_constant(gm, f"{node.name}_mask", additive, node) if additive is not None else None
            with g.inserting_before(node):
                kt = g.call_function(aten.transpose.int, (k, -2, -1))
                scores = g.call_function(aten.matmul.default, (q, kt))
                scaled = g.call_function(aten.mul.Tensor, (scores, float(scale)))
                if add_node is not None:
                    scaled = g.call_function(aten.add.Tensor, (scaled, add_node))
                    extra.append(scaled)
                if keep_node is not None:  # masked scores lowered to the row minimum (see masked_softmax)
                    low = g.call_function(aten.amin.default, (scaled, [-1], True))
                    kept_scores = g.call_function(aten.mul.Tensor, (scaled, keep_node))
                    low_scores = g.call_function(aten.mul.Tensor, (low, drop_node))
                    scaled = g.call_function(aten.add.Tensor, (kept_scores, low_scores))
                    extra += [low, kept_scores, low_scores, scaled]
                weights = g.call_function(aten.softmax.int, (scaled, -1))
                if keep_node is not None:  # masked softmax: renormalise over the kept positions
                    kept = g.call_function(aten.mul.Tensor, (weights, keep_node))
                    total = g.call_function(aten.sum.dim_IntList, (kept, [-1], True))
                    weights = g.call_function(aten.div.Tensor, (kept, total))
                    extra += [kept, total, weights]
                out = g.call_function(aten.matmul.default, (weights, v))
            for n in (kt, scores, scaled, weights, out, *extra):
                n.meta["stack_trace"] = node.meta.get("stack_trace")
                n.meta["nn_module_stack"] = node.meta.get("nn_module_stack", {})
            node.replace_all_uses_with(out)
            g.erase_node(node)
            modified = True
        if modified:
            finish_rewrite(gm)
        return PassResult(gm, modified)
