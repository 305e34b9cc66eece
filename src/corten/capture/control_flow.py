"""Control flow decided by constants: ``torch.cond`` on a constant predicate becomes the branch it
takes, ``while_loop`` whose condition depends only on constants (a counter starting at a constant,
a trip count from a buffer) is unrolled.

torch.export keeps both as higher-order ops over sub-graphs.  A program of fixed kernels can run
them when the decision is known at compile time: the predicate is evaluated here on the constants
(parameters, buffers, lifted tensors) and the chosen sub-graph's ops are copied into the graph in
its place, once per iteration for a loop.  The counter's own arithmetic stays in the graph as ops on
constants, used by nothing once the loop is gone, and is removed.  A predicate that reads an input
keeps its op (refused later as data-dependent control flow), as does a loop past
:data:`MAX_UNROLLED_ITERATIONS`.
"""
from __future__ import annotations

import operator
from typing import Any

import torch
from torch.fx import Graph, GraphModule, Node

MAX_UNROLLED_ITERATIONS = 1024

_UNKNOWN = object()  # a value that depends on a program input


def _hop(name: str):
    return getattr(torch.ops.higher_order, name, None)


class _Constants:
    """Concrete values of the graph's nodes that depend on constants only (memoized)."""

    def __init__(self, ep: torch.export.ExportedProgram) -> None:
        self.gm = ep.graph_module
        sig = ep.graph_signature
        named = {**sig.inputs_to_parameters, **sig.inputs_to_buffers, **sig.inputs_to_lifted_tensor_constants}
        self.placeholders: dict[str, Any] = {}
        for ph, name in named.items():
            value = ep.state_dict.get(name) if name in ep.state_dict else ep.constants.get(name)
            if isinstance(value, torch.Tensor):
                self.placeholders[ph] = value.detach()
        self.memo: dict[Node, Any] = {}

    def value(self, node: Any) -> Any:
        if not isinstance(node, Node):
            return node
        if node in self.memo:
            return self.memo[node]
        pending = [node]  # iterative: unrolled counters make long chains
        while pending:
            n = pending[-1]
            if n in self.memo:
                pending.pop()
                continue
            todo = [a for a in n.all_input_nodes if a not in self.memo]
            if todo and n.op == "call_function":
                pending.extend(todo)
                continue
            pending.pop()
            self.memo[n] = self._evaluate(n)
        return self.memo[node]

    def _evaluate(self, n: Node) -> Any:
        if n.op == "placeholder":
            return self.placeholders.get(n.name, _UNKNOWN)
        if n.op == "get_attr":
            return getattr(self.gm, str(n.target), _UNKNOWN)
        if n.op != "call_function" or isinstance(n.target, torch._ops.HigherOrderOperator):
            return _UNKNOWN
        args, kwargs = torch.fx.node.map_arg((n.args, n.kwargs), lambda a: self.memo[a])
        if _has_unknown((args, kwargs)):
            return _UNKNOWN
        try:
            with torch.no_grad():
                return n.target(*args, **kwargs)
        except Exception:  # an op that cannot run eagerly on these values: not a compile-time value
            return _UNKNOWN


def _has_unknown(tree: Any) -> bool:
    found = []
    torch.fx.node.map_aggregate(tree, lambda v: found.append(v is _UNKNOWN) or v)
    return any(found)


def _truth(value: Any) -> bool | None:
    if value is _UNKNOWN:
        return None
    if isinstance(value, torch.Tensor):
        return bool(value.item()) if value.numel() == 1 else None
    return bool(value)


def _subgraph_value(sub: GraphModule, operands: list[Any], consts: _Constants) -> Any:
    """The sub-graph's (single) output evaluated on the operands' compile-time values."""
    env: dict[Node, Any] = {}
    placeholders = [n for n in sub.graph.nodes if n.op == "placeholder"]
    for ph, a in zip(placeholders, operands):
        env[ph] = consts.value(a)
    for n in sub.graph.nodes:
        if n.op == "placeholder":
            continue
        if n.op == "output":
            out = n.args[0]
            out = out[0] if isinstance(out, (list, tuple)) and len(out) == 1 else out
            return env.get(out, out) if isinstance(out, Node) else out
        if n.op == "get_attr":
            env[n] = getattr(sub, str(n.target), _UNKNOWN)
            continue
        args, kwargs = torch.fx.node.map_arg((n.args, n.kwargs), lambda a: env[a])
        if n.op != "call_function" or isinstance(n.target, torch._ops.HigherOrderOperator) \
                or _has_unknown((args, kwargs)):
            env[n] = _UNKNOWN
            continue
        try:
            with torch.no_grad():
                env[n] = n.target(*args, **kwargs)
        except Exception:
            env[n] = _UNKNOWN
    return _UNKNOWN


def _inline(gm: GraphModule, before: Node, sub: GraphModule, operands: list[Any]) -> list[Any]:
    """Copy ``sub``'s ops before ``before`` with its placeholders bound to ``operands``; its outputs."""
    graph: Graph = gm.graph
    val_map: dict[Node, Any] = {}
    placeholders = [n for n in sub.graph.nodes if n.op == "placeholder"]
    val_map.update(zip(placeholders, operands))
    for n in sub.graph.nodes:  # nested regions: their sub-graphs move up to the outer module
        if n.op == "get_attr":
            value = getattr(sub, str(n.target))
            name, k = f"{n.target}", 0
            while hasattr(gm, name):
                k += 1
                name = f"{n.target}_{k}"
            if isinstance(value, torch.nn.Module):
                gm.add_submodule(name, value)
            elif isinstance(value, torch.Tensor):  # a tensor made inside the region (a counter's start)
                gm.register_buffer(name, value, persistent=False)
            else:
                setattr(gm, name, value)
            with graph.inserting_before(before):
                val_map[n] = graph.get_attr(name)
            val_map[n].meta = dict(n.meta)
    with graph.inserting_before(before):
        out = graph.graph_copy(sub.graph, val_map)
    return list(out) if isinstance(out, (list, tuple)) else [out]


def _replace_results(node: Node, results: list[Any]) -> None:
    for user in list(node.users):
        if user.op == "call_function" and user.target is operator.getitem:
            user.replace_all_uses_with(results[user.args[1]])
            user.graph.erase_node(user)
    if node.users:
        raise RuntimeError(f"{node.name}: results used other than by index")
    node.graph.erase_node(node)


def _unroll_once(ep: torch.export.ExportedProgram) -> bool:
    gm = ep.graph_module
    consts = _Constants(ep)
    cond_op, while_op = _hop("cond"), _hop("while_loop")
    for node in list(gm.graph.nodes):
        if node.op != "call_function":
            continue
        if cond_op is not None and node.target is cond_op:
            pred, true_g, false_g, operands = node.args[:4]
            taken = _truth(consts.value(pred))
            if taken is None:
                continue
            branch = getattr(gm, str((true_g if taken else false_g).target))
            _replace_results(node, _inline(gm, node, branch, list(operands)))
            return True
        if while_op is not None and node.target is while_op:
            cond_g, body_g, carried, extra = node.args[:4]
            cond_sub, body_sub = getattr(gm, str(cond_g.target)), getattr(gm, str(body_g.target))
            values = list(carried)
            trips = 0
            while True:
                go = _truth(_subgraph_value(cond_sub, values + list(extra), consts))
                if go is None or trips > MAX_UNROLLED_ITERATIONS:
                    break
                if not go:
                    _replace_results(node, values)
                    return True
                values = _inline(gm, node, body_sub, values + list(extra))
                trips += 1
            # not decidable: drop the copies made so far (they are unused) and keep the loop
            gm.graph.eliminate_dead_code()
    return False


def unroll_constant_control_flow(ep: torch.export.ExportedProgram) -> bool:
    """Inline every ``cond`` with a constant predicate and unroll every ``while_loop`` whose
    condition is constant at each step (nested regions too); True when the graph changed."""
    changed = False
    while _unroll_once(ep):
        changed = True
    if changed:
        gm = ep.graph_module
        gm.graph.eliminate_dead_code()
        gm.delete_all_unused_submodules()
        gm.recompile()
    return changed
