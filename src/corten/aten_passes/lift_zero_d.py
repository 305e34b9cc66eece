"""0-D tensors computed in the model run as one-element tensors.

A full reduction (``x.mean()``, ``x.amax()``, ``torch.dot(a, b)``) gives a 0-D tensor, and the math after it
(``x.mean() * 2``, ``torch.sigmoid(score) + bias``, ``y - y.sum()``) reads it.  Corten's elementwise
ops take ranks 1 to 5, so every pointwise op that reads a computed 0-D tensor reads it as ``[1]``
(``reshape(t, [1])``: the same one value, broadcast exactly as a 0-D tensor is), and a pointwise op
whose result is 0-D computes it as ``[1]`` and gives its users ``reshape(result, [])``: the program
keeps PyTorch's shapes, only the ops between run on one element.  A reduction over every dim without
keepdim (``x.amax()``, ``x.sum(dim=(0, 1))`` of a 2-D ``x``) is computed with keepdim and reshaped to
``[]``.  A ``reshape(reshape(s, []), [1])`` that this makes reads ``s`` directly (a ``[1, ..., 1]``
keepdim reduction, reshaped once).
"""
from __future__ import annotations

import torch
from torch.fx import GraphModule, Node
from torch.fx.passes.infra.pass_base import PassBase, PassResult

from corten.aten_passes.graph_utils import finish_rewrite

aten = torch.ops.aten
_RESHAPES = {aten.reshape.default, aten.view.default, aten._unsafe_view.default}
# pointwise ops without torch's pointwise tag
_ALSO_POINTWISE = {aten.hardswish.default}
# reductions ``op(x, dim, keepdim=False, ...)``: dim [] (or None) is every dim
_REDUCTIONS = {aten.amax.default, aten.amin.default, aten.sum.dim_IntList, aten.mean.dim}


def is_pointwise(node: Node) -> bool:
    return node.op == "call_function" and (node.target in _ALSO_POINTWISE
                                           or torch.Tag.pointwise in getattr(node.target, "tags", ()))


def _is_zero_d(arg) -> bool:
    """A computed (not a constant) floating-point or truth-value 0-D tensor."""
    val = arg.meta.get("val") if isinstance(arg, Node) else None
    return (isinstance(val, torch.Tensor) and val.dim() == 0 and (val.is_floating_point() or val.dtype == torch.bool)
            and arg.op not in ("get_attr", "placeholder"))


def _zero_d_truth_output(node: Node) -> bool:
    """A 0-D comparison result the program returns: it stays (and is refused by name) - a program
    returns comparison results as computed, not reshaped."""
    val = node.meta.get("val")
    return (isinstance(val, torch.Tensor) and val.dim() == 0 and not val.is_floating_point()
            and any(u.op == "output" for u in node.users))


def _reduces_to_zero_d(node: Node) -> bool:
    if node.op != "call_function" or node.target not in _REDUCTIONS or not isinstance(node.args[0], Node):
        return False
    val, x = node.meta.get("val"), node.args[0].meta.get("val")
    return isinstance(val, torch.Tensor) and val.dim() == 0 and isinstance(x, torch.Tensor) and x.dim() >= 1


_SOURCE_SHAPE = "corten_zero_d_source_shape"  # meta of a reshape(s, []) the pass made: the shape of s


def _read_as_zero_d(graph, node: Node, shape: tuple) -> None:
    """``node`` (now of ``shape``, one element) is read by its users as ``reshape(node, [])``: 0-D, as
    ``node`` was (that value is kept for the pointwise users the pass meets later)."""
    with graph.inserting_after(node):
        back = graph.call_function(aten.reshape.default, (node, []))
    back.meta["val"] = node.meta.pop("val")
    back.meta[_SOURCE_SHAPE] = shape
    node.replace_all_uses_with(back, delete_user_cb=lambda user: user is not back)


def _keep_dims(graph, node: Node) -> None:
    """``node``, a reduction over every dim without keepdim, with keepdim; its users read it as ``[]``."""
    rank = node.args[0].meta["val"].dim()
    node.args = (node.args[0], list(range(rank)), True)
    _read_as_zero_d(graph, node, (1,) * rank)


def _one_element(graph, arg: Node) -> Node:
    """``arg`` (0-D) as ``[1]``: the source ``s`` of a ``reshape(s, [])`` when ``s`` is ``[1]``, else
    ``reshape(s, [1])`` when ``s`` has one element, else ``reshape(arg, [1])``."""
    src = arg
    if arg.target in _RESHAPES and isinstance(arg.args[0], Node):
        shape = arg.meta.get(_SOURCE_SHAPE) or tuple(getattr(arg.args[0].meta.get("val"), "shape", (0,)))
        if tuple(shape) == (1,):
            return arg.args[0]
        if all(int(d) == 1 for d in shape):
            src = arg.args[0]
    with graph.inserting_after(src):
        return graph.call_function(aten.reshape.default, (src, [1]))


class LiftZeroDimPass(PassBase):
    """Pointwise ops on computed 0-D tensors run on ``[1]`` (see the module docstring)."""

    def call(self, gm: GraphModule) -> PassResult:
        graph = gm.graph
        modified = False
        for node in list(graph.nodes):
            if _reduces_to_zero_d(node):
                _keep_dims(graph, node)
                modified = True
                continue
            if not is_pointwise(node) or _zero_d_truth_output(node):
                continue
            zero_d = [a for a in node.all_input_nodes if _is_zero_d(a)]
            if not zero_d:
                continue
            for a in zero_d:
                node.replace_input_with(a, _one_element(graph, a))
            if node.meta.get("val") is not None and node.meta["val"].dim() == 0:
                _read_as_zero_d(graph, node, (1,))
            node.meta.pop("val", None)  # (re-inferred: it is [1] now, or broadcast as before)
            modified = True
        if modified:
            for n in list(reversed(graph.nodes)):  # reshapes left without users (the [] of a lifted chain)
                if n.op == "call_function" and n.target in _RESHAPES and not n.users:
                    graph.erase_node(n)
            finish_rewrite(gm)
        return PassResult(gm, modified)
