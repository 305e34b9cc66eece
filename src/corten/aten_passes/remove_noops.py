"""Remove nodes that return their input unchanged in an inference graph.

On torch 2.13 ``torch.export`` of an eval-mode model keeps ``nn.Dropout`` as
``aten.dropout.default(x, p, train=False)``; ``Tensor.clone()`` / ``.detach()`` appear as
``aten.clone.default`` / ``aten.detach.default``; ``.contiguous()`` on an already contiguous tensor
is traced away, but ``aten.contiguous`` / ``aten.alias`` may appear in other graphs.  Each such node
is removed and its users read its input instead.

A node is kept when an in-place op (e.g. ``hardtanh_``) writes to its output or to its input while
the other one is still read: there the copy protects the original value.
"""
from __future__ import annotations

import torch
from torch.fx import GraphModule, Node
from torch.fx.passes.infra.pass_base import PassBase, PassResult

from corten.aten_passes.graph_utils import finish_rewrite, is_mutating

aten = torch.ops.aten

IDENTITY_OPS = {
    aten.clone.default,
    aten.alias.default,
    aten.detach.default,
    aten.contiguous.default,
}
# Dropout variants: (input, p, train); identities when train is False or p == 0.  The in-place ones
# (``nn.Dropout(inplace=True)``, e.g. torchvision's MobileNetV3 classifier) write nothing then.
DROPOUT_OPS = {
    aten.dropout.default,
    aten.feature_dropout.default,
    aten.alpha_dropout.default,
    aten.feature_alpha_dropout.default,
    aten.dropout_.default,
    aten.feature_dropout_.default,
    aten.alpha_dropout_.default,
    aten.feature_alpha_dropout_.default,
}


def is_noop(node: Node) -> bool:
    """True when ``node`` returns its first argument's value unchanged."""
    if node.op != "call_function" or not isinstance(node.args[0] if node.args else None, Node):
        return False
    if node.target in IDENTITY_OPS:
        return True
    if node.target in DROPOUT_OPS:
        p = node.args[1] if len(node.args) > 1 else node.kwargs.get("p")
        train = node.args[2] if len(node.args) > 2 else node.kwargs.get("train")
        return train is False or p == 0
    return False


def _copy_protects_input(node: Node) -> bool:
    """True when removing ``node`` would let an in-place op change a value still needed: a user
    writes to ``node``'s output while the input is read elsewhere (or is a graph input /
    parameter), or another user of the input writes to it while ``node``'s output is still read."""
    source = node.args[0]
    if any(is_mutating(user) for user in node.users):
        if source.op in ("placeholder", "get_attr") or len(source.users) > 1:
            return True
    return any(is_mutating(user) for user in source.users if user is not node)


class RemoveNoOpsPass(PassBase):
    """Remove eval-mode dropout, clone, alias, detach and contiguous nodes."""

    def call(self, graph_module: GraphModule) -> PassResult:
        modified = False
        for node in list(graph_module.graph.nodes):
            if is_noop(node) and not _copy_protects_input(node):
                node.replace_all_uses_with(node.args[0])
                graph_module.graph.erase_node(node)
                modified = True
        if modified:
            # without the copies a ``view`` may read a non-contiguous tensor (MultiheadAttention's
            # ``.contiguous()`` before ``select`` + ``view`` at batch > 1); the graph is functional by
            # now (in-place ops are gone), so the equivalent reshape computes the same values
            for node in graph_module.graph.nodes:
                if node.op == "call_function" and node.target == aten.view.default:
                    node.target = aten.reshape.default
            finish_rewrite(graph_module)
        return PassResult(graph_module, modified)
