"""Rewrites as data: a table from ATen op to a small rewrite function, and the pass that runs it.

A rewrite function takes the node of its op and returns either a :class:`Rewrite` (a Python
function of the node's tensor inputs and some constant tensors, whose ``make_fx`` trace replaces the
node) or a :class:`Refusal` (a string: why this call's argument form is not rewritten; the op then
stays in the graph and is lowered whole or refused by name later).  Nothing is swallowed: an error
while tracing a rewrite is an :class:`AtenPassError` naming the node.

Adding a decomposition is one function registered with ``@TABLE.rewrites(aten_op, ...)``; the
table refuses a second rule for the same op when the module is imported.
"""
from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Callable, Iterable, Sequence

import torch
from torch.fx import GraphModule, Node
from torch.fx.experimental.proxy_tensor import make_fx
from torch.fx.passes.infra.pass_base import PassBase, PassResult

from corten.aten_passes.graph_utils import AtenPassError, add_constant, finish_rewrite, refresh_meta_val
from corten.fx_nodes import get_attr

aten = torch.ops.aten


@dataclass(frozen=True)
class Rewrite:
    """``fn(*tensor_args, *constants)`` computes what the node computed; ``pre_dispatch`` keeps
    ``aten.linear`` whole in the trace (recurrent cells' gates are linear layers)."""

    fn: Callable
    tensor_args: Sequence[Node]
    constants: Sequence[torch.Tensor] = ()
    pre_dispatch: bool = False


class Refusal(str):
    """Why a rewrite function leaves its node alone (the argument form it does not take)."""


RewriteFn = Callable[[Node], "Rewrite | Refusal"]


@dataclass(frozen=True)
class _Rule:
    fn: RewriteFn
    float_outputs: int | None  # how many leading outputs must be floating point (None: all)


class RewriteTable:
    """``op -> rewrite function``.  ``@table.rewrites(op, ...)`` registers one function for one or
    more ops; before calling it the table refuses nodes whose (first ``float_outputs``) results are
    not floating-point tensors (the rewrites compute in float, before quantization)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._rules: dict[object, _Rule] = {}

    def rewrites(self, *ops, float_outputs: int | None = None) -> Callable[[RewriteFn], RewriteFn]:
        def register(fn: RewriteFn) -> RewriteFn:
            for op in ops:
                if op in self._rules:
                    raise ValueError(f"{self.name}: {op} already rewritten by {self._rules[op].fn.__name__}")
                self._rules[op] = _Rule(fn, float_outputs)
            return fn
        return register

    @property
    def ops(self) -> list[object]:
        return list(self._rules)

    def __contains__(self, op: object) -> bool:
        return op in self._rules

    def apply(self, node: Node) -> Rewrite | Refusal | None:
        """The rewrite of ``node``, the reason it has none, or None when no rule names its op."""
        rule = self._rules.get(node.target)
        if rule is None:
            return None
        val = node.meta.get("val")
        vals = list(val) if isinstance(val, (tuple, list)) else [val]
        if rule.float_outputs is not None:
            vals = vals[:rule.float_outputs]
        if not vals or not all(isinstance(v, torch.Tensor) and v.dtype.is_floating_point for v in vals):
            return Refusal("its results are not floating-point tensors")
        return rule.fn(node)


def inline(gm: GraphModule, node: Node, rewrite: Rewrite) -> None:
    """Replace ``node`` by the ``make_fx`` trace of ``rewrite.fn`` (its nodes keep ``node``'s source)."""
    tensor_args, constants = list(rewrite.tensor_args), list(rewrite.constants)
    # traced on inputs with the real strides (a transposed q/k), and every view of the trace
    # becomes a reshape, which is valid whatever the strides of the tensors it is later run on
    examples = [get_attr(gm, n).detach().clone() if n.op == "get_attr" else
                torch.empty_strided(n.meta["val"].shape, n.meta["val"].stride(), dtype=n.meta["val"].dtype).zero_()
                for n in tensor_args] + constants
    try:
        traced = make_fx(rewrite.fn, pre_dispatch=rewrite.pre_dispatch)(*examples)
    except Exception as e:  # re-raised with the node named: a rewrite that cannot trace is a bug
        raise AtenPassError(f"{node.name} ({node.target}): its decomposition failed to trace: "
                            f"{type(e).__name__}: {e}") from e
    g = gm.graph
    env: dict[Node, object] = {}
    placeholders = [n for n in traced.graph.nodes if n.op == "placeholder"]
    const_nodes = [add_constant(gm, f"{node.name}_const{i}", c, node) for i, c in enumerate(constants)]
    for p, v in zip(placeholders, tensor_args + const_nodes):
        env[p] = v
    result = None
    with g.inserting_before(node):
        for n in traced.graph.nodes:
            if n.op == "placeholder":
                continue
            if n.op == "get_attr":
                env[n] = add_constant(gm, f"{node.name}_{n.target}", getattr(traced, n.target), node)
                continue
            if n.op == "output":
                result = torch.fx.node.map_arg(n.args[0], lambda x: env[x])
                continue
            target = aten.reshape.default if n.target in (aten.view.default, aten._unsafe_view.default) else n.target
            new = g.call_function(target, torch.fx.node.map_arg(n.args, lambda x: env[x]),
                                  torch.fx.node.map_arg(n.kwargs, lambda x: env[x]))
            if isinstance(n.meta.get("val"), torch.Tensor):  # shapes for a later rewrite in this pass
                new.meta["val"] = n.meta["val"]
            new.meta["stack_trace"] = node.meta.get("stack_trace")
            new.meta["nn_module_stack"] = node.meta.get("nn_module_stack", {})
            env[n] = new
    if isinstance(result, (tuple, list)):  # (output, h_n[, c_n]): the getitem users read the pieces
        for user in list(node.users):
            if user.op == "call_function" and user.target is operator.getitem:
                user.replace_all_uses_with(result[user.args[1]])
                g.erase_node(user)
        if node.users:
            raise AtenPassError(f"{node.name}: a tuple result read other than by indexing")
    else:
        node.replace_all_uses_with(result)
    g.erase_node(node)


GraphStep = Callable[[GraphModule], bool]


class RewriteTablePass(PassBase):
    """Run ``prepare`` steps (each ``gm -> modified``) then every rule of ``table`` on the nodes of
    its ops, in graph order.  ``refusals`` maps the name of each node a rule left alone to its
    reason (also kept in ``node.meta["corten_rewrite_refused"]``)."""

    def __init__(self, table: RewriteTable, prepare: Iterable[GraphStep] = ()) -> None:
        super().__init__()
        self.table = table
        self.prepare = tuple(prepare)
        self.refusals: dict[str, str] = {}

    def call(self, gm: GraphModule) -> PassResult:
        modified = False
        for step in self.prepare:
            modified = step(gm) or modified
        self.refusals = {}
        for node in list(gm.graph.nodes):
            if node.op != "call_function":
                continue
            result = self.table.apply(node)
            if result is None:
                continue
            if isinstance(result, Refusal):
                self.refusals[node.name] = str(result)
                node.meta["corten_rewrite_refused"] = str(result)
                continue
            inputs = list(node.all_input_nodes)
            inline(gm, node, result)
            for a in inputs:  # e.g. the masked_fill a masked softmax replaced
                if a.op == "call_function" and not a.users:
                    gm.graph.erase_node(a)
            modified = True
        if modified:
            # fake tensors everywhere (the traces carried real ones), before finish_rewrite: it
            # then finds every node with a shape and does not propagate a second time
            refresh_meta_val(gm)
            finish_rewrite(gm)
        return PassResult(gm, modified)
