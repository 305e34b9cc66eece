"""Rewrite in-place ATen ops as their functional forms, so they lower like them.

``torch.export`` (training IR) keeps the in-place ops a model calls: ``out += identity`` is
``aten.add_.Tensor(out, identity)``, ``nn.ReLU(inplace=True)`` is ``aten.relu_.default``,
``x.mul_(s)``, ``torch.sigmoid_(x)``, ``F.hardswish(x, inplace=True)``, ``x.clamp_(0, 6)``...  Their
result is an alias of the tensor they write, and later Python code that reads that tensor reads the
node the op wrote to, e.g.::

    y = conv(x)           # conv2d
    y.add_(x)             # add_ = aten.add_.Tensor(conv2d, x)
    return y * 2          # mul = aten.mul.Tensor(conv2d, 2)   <- reads the written value

:class:`FunctionalizeInPlacePass` replaces each ``op_`` node by the functional ``op`` with the same
arguments and makes every node after it that reads the written tensor read the new node instead,
so the graph is pure dataflow (the quantizer and the lowering rules only know functional ops).

A write into a *view* (``x[:, :2].add_(1)``, ``x.view(-1).relu_()``) changes the viewed base
tensor too: it is not rewritten (the op is then refused with its name and source line).  Nor is a
write into a program input or a parameter (the caller's tensor would change).
"""
from __future__ import annotations

import torch
from torch.fx import GraphModule, Node
from torch.fx.passes.infra.pass_base import PassBase, PassResult

from corten.aten_passes.graph_utils import finish_rewrite

aten = torch.ops.aten


def functional_variant(target) -> "torch._ops.OpOverload | None":
    """``aten.add_.Tensor`` -> ``aten.add.Tensor`` (same overload, same arguments); None when
    ``target`` is not an in-place ATen op writing its first argument or has no functional twin."""
    if not isinstance(target, torch._ops.OpOverload) or target.namespace != "aten":
        return None
    schema = target._schema
    base = schema.name.split("::", 1)[1]
    if not base.endswith("_") or base.startswith("_") or not schema.arguments:
        return None
    first = schema.arguments[0].alias_info
    if first is None or not first.is_write:
        return None
    packet = getattr(aten, base[:-1], None)
    if packet is None:
        return None
    overload = target._overloadname
    fn = getattr(packet, overload, None)
    if fn is None:
        return None
    if [a.name for a in fn._schema.arguments] != [a.name for a in schema.arguments]:
        return None
    return fn


def _is_view(node: Node) -> bool:
    """True when ``node``'s output aliases its first input (a view op: slice, select, view, ...)."""
    schema = getattr(node.target, "_schema", None)
    if schema is None or not schema.returns or not schema.arguments:
        return False
    ret, first = schema.returns[0].alias_info, schema.arguments[0].alias_info
    return ret is not None and first is not None and not ret.is_write and ret.before_set == first.before_set


class FunctionalizeInPlacePass(PassBase):
    """``op_(x, ...)`` -> ``op(x, ...)``; later readers of ``x`` read the result."""

    def call(self, graph_module: GraphModule) -> PassResult:
        graph = graph_module.graph
        order = {n: i for i, n in enumerate(graph.nodes)}
        modified = False
        for node in list(graph.nodes):
            if node.op != "call_function":
                continue
            fn = functional_variant(node.target)
            if fn is None or not node.args or not isinstance(node.args[0], Node):
                continue
            written = node.args[0]
            if written.op in ("placeholder", "get_attr") or (written.op == "call_function" and _is_view(written)):
                continue
            if any(_is_view(u) and order[u] < order[node] for u in written.users):
                continue  # a view taken before the write would see it
            with graph.inserting_after(node):
                new = graph.call_function(fn, node.args, node.kwargs)
            new.meta.update(node.meta)
            order[new] = order[node]
            node.replace_all_uses_with(new)
            for user in list(written.users):
                if user is not node and user is not new and order.get(user, -1) > order[node]:
                    user.replace_input_with(written, new)
            graph.erase_node(node)
            modified = True
        if modified:
            finish_rewrite(graph_module)
        return PassResult(graph_module, modified)
