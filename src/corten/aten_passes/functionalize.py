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

A write into a *view* (``x[:, :2] += y``, ``x.view(-1).relu_()``, GhostNet's
``out = torch.cat([x1, x2], 1)[:, :c]; out += shortcut``) changes the viewed base tensor too.  It
becomes functional as well: the op computes the view's new value, later readers of the view read
it, and when the base (or a view between it and the written one) is read after the write, its new
value is written back out of place - a ``cat`` of the untouched pieces and the new values for a
slice (step 1) or a select, a ``reshape`` for ``view``/``reshape``/``(un)squeeze``/``flatten``, the
inverse permutation for ``permute``/``transpose``/``t``.  What cannot be written back (a strided
slice, an ``expand``ed view, another view of the same tensor read after the write) is left in
place and refused with the reason and what to write instead (``node.meta["corten_refusal"]``).  A
write into a program input or a parameter/buffer (module state such as a call counter) is left as
torch.export kept it.
"""
from __future__ import annotations

import torch
from torch.fx import GraphModule, Node
from torch.fx.passes.infra.pass_base import PassBase, PassResult

from corten.aten_passes.graph_utils import _fake_mode_of, finish_rewrite

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


# What to write instead, appended to every refusal of a write into a view.
_INSTEAD = ("write it out of place: ``y = x + other`` (and build the whole tensor with ``torch.cat`` "
            "when only part of it changes)")


def _view_chain(node: Node) -> list[Node]:
    """``[node, its base, the base's base, ...]`` up to the first tensor that is not a view."""
    chain = [node]
    while chain[-1].op == "call_function" and _is_view(chain[-1]) and isinstance(chain[-1].args[0], Node):
        chain.append(chain[-1].args[0])
    return chain


def _aliases(base: Node, before: int, order: dict) -> set[Node]:
    """``base`` and every view of it (views of views too) taken before position ``before``."""
    out, todo = {base}, [base]
    while todo:
        t = todo.pop()
        for u in t.users:
            if (u not in out and order.get(u, before) < before and u.op == "call_function" and _is_view(u)
                    and u.args and u.args[0] is t):
                out.add(u)
                todo.append(u)
    return out


_RESHAPING_VIEWS = {aten.view.default, aten._unsafe_view.default, aten.reshape.default, aten.unsqueeze.default,
                    aten.squeeze.default, aten.squeeze.dim, aten.squeeze.dims, aten.flatten.using_ints,
                    aten.unflatten.int, aten.alias.default, aten.view_as.default}


def _slice_step(view: Node):
    return view.args[4] if len(view.args) > 4 else view.kwargs.get("step", 1)


def _cannot_write_back(view: Node) -> str:
    """Why the new value of ``view.args[0]`` cannot be rebuilt from ``view``'s new value ('' when it can)."""
    t = view.target
    if t in _RESHAPING_VIEWS or t in (aten.permute.default, aten.transpose.int, aten.t.default, aten.select.int):
        return ""
    if t == aten.slice.Tensor:
        step = _slice_step(view)
        return "" if step in (None, 1) else f"a slice with step {step} cannot be written back as one piece"
    return f"a write through {getattr(t, '__name__', t)} cannot be written back into its base"


def _norm(i, size: int, default: int) -> int:
    if i is None:
        return default
    i = int(i)
    return max(0, min(size, i + size if i < 0 else i))


def _write_back(graph, view: Node, new_view: Node) -> Node:
    """Nodes (at the graph's insertion point) computing the new value of ``view.args[0]`` once
    ``view`` holds ``new_view`` (:func:`_cannot_write_back` is '')."""
    base = view.args[0]
    shape = list(base.meta["val"].shape)
    t = view.target
    call = graph.call_function
    if t in _RESHAPING_VIEWS:
        return call(aten.reshape.default, (new_view, shape))
    if t == aten.permute.default:
        perm = [d % len(shape) for d in view.args[1]]
        return call(aten.permute.default, (new_view, [perm.index(k) for k in range(len(shape))]))
    if t in (aten.transpose.int, aten.t.default):
        a, b = (view.args[1], view.args[2]) if t == aten.transpose.int else (0, 1)
        return call(aten.transpose.int, (new_view, a, b))
    d = int(view.args[1]) % len(shape)  # slice (step 1) or select: the untouched pieces around it
    size = shape[d]
    if t == aten.select.int:
        lo = int(view.args[2]) % size
        hi, mid = lo + 1, call(aten.unsqueeze.default, (new_view, d))
    else:
        lo = _norm(view.args[2] if len(view.args) > 2 else view.kwargs.get("start"), size, 0)
        hi = max(lo, _norm(view.args[3] if len(view.args) > 3 else view.kwargs.get("end"), size, size))
        mid = new_view
    pieces = ([call(aten.slice.Tensor, (base, d, 0, lo))] if lo > 0 else []) + [mid] + \
        ([call(aten.slice.Tensor, (base, d, hi, size))] if hi < size else [])
    if len(pieces) == 1:
        return pieces[0]
    cat = call(aten.cat.default, (pieces, d))
    cat.meta[_WRITTEN] = (d, lo, hi, new_view)
    return cat


_WRITTEN = "corten_written_back"  # on a write-back cat: (dim, start, end, the new value of that range)


def _rewrites_what_it_read(node: Node) -> bool:
    """``node`` is ``copy_(base'[range], v)`` where ``base'`` is the write-back of ``v`` into that
    very range: Python's ``y[a:b] += z`` (``t = y[a:b]; t += z; y[a:b] = t``), whose second write
    changes nothing once the first one is functional."""
    if node.target != aten.copy_.default or len(node.args) < 2:
        return False
    view, src = node.args[0], node.args[1]
    if not isinstance(view, Node) or not view.args or not isinstance(view.args[0], Node):
        return False
    done = view.args[0].meta.get(_WRITTEN)
    if done is None or done[3] is not src:
        return False
    d, lo, hi, _ = done
    size = view.args[0].meta["val"].shape[d]
    if view.target == aten.select.int:
        return int(view.args[1]) % len(view.args[0].meta["val"].shape) == d and int(view.args[2]) % size == lo \
            and hi == lo + 1
    if view.target != aten.slice.Tensor or _slice_step(view) not in (None, 1):
        return False
    start = _norm(view.args[2] if len(view.args) > 2 else view.kwargs.get("start"), size, 0)
    end = max(start, _norm(view.args[3] if len(view.args) > 3 else view.kwargs.get("end"), size, size))
    return int(view.args[1]) % view.args[0].meta["val"].dim() == d and (start, end) == (lo, hi)


class FunctionalizeInPlacePass(PassBase):
    """``op_(x, ...)`` -> ``op(x, ...)``; later readers of ``x`` read the result (and of the
    tensor ``x`` is a view of, its new value, written back out of place)."""

    def call(self, graph_module: GraphModule) -> PassResult:
        graph = graph_module.graph
        order = {n: i for i, n in enumerate(graph.nodes)}
        mode = _fake_mode_of(graph_module)
        modified = False
        for node in list(graph.nodes):
            if node.op != "call_function":
                continue
            fn = functional_variant(node.target)
            if fn is None or not node.args or not isinstance(node.args[0], Node):
                continue
            why = self._rewrite(graph, node, fn, order, mode)
            if why:
                node.meta["corten_refusal"] = f"{why}; {_INSTEAD}"
            elif why is not None:
                modified = True
        for n in graph.nodes:
            n.meta.pop(_WRITTEN, None)
        if modified:
            # a factory tensor written in place (``torch.zeros(1, b, h).squeeze_(0)``, the initial state of
            # ``torch.ao.nn.quantizable.LSTM``) was kept by the constant folding, which runs before this
            # pass; now that the write is a new value, the tensor and what is computed from it fold
            from corten.aten_passes.decompose_composites import fold_constants

            while fold_constants(graph_module):
                pass
            finish_rewrite(graph_module)
        return PassResult(graph_module, modified)

    @staticmethod
    def _rewrite(graph, node: Node, fn, order: dict, mode) -> str | None:
        """Rewrite the in-place ``node`` as ``fn``; '' when done, else why it stays (None: a write
        into a program input or a parameter/buffer, left as it is)."""
        at = order[node]
        if _rewrites_what_it_read(node):
            view = node.args[0]
            node.replace_all_uses_with(node.args[1])
            graph.erase_node(node)
            if not view.users:
                graph.erase_node(view)
            return ""
        chain = _view_chain(node.args[0])
        base = chain[-1]
        if base.op in ("placeholder", "get_attr"):
            return None  # state (a buffer counter, a cache): left to the later stages, as torch.export kept it
        aliases = _aliases(base, at, order)
        stale = [0]  # chain positions read after the write (they need the new value)
        for a in aliases:
            for u in a.users:
                if u is node or u in aliases or order.get(u, -1) <= at:
                    continue
                if a not in chain:
                    return (f"writes in place into a view of '{base.name}' while another view of it ('{a.name}', "
                            f"taken before the write) is read after the write and would see it")
                stale.append(chain.index(a))
        top = max(stale)
        for k in range(top):
            why = _cannot_write_back(chain[k])
            if why:
                return (f"writes in place into a view of '{chain[k + 1].name}', which is read after the write: "
                        f"{why}")
        before = set(graph.nodes)
        values = []
        with graph.inserting_after(node):
            if node.target == aten.copy_.default:  # ``v[...] = t`` / ``v.copy_(t)``: the view's new value is t
                src = node.args[1]
                same = isinstance(src, Node) and tuple(src.meta["val"].shape) == tuple(node.meta["val"].shape)
                values.append(src if same else graph.call_function(
                    aten.expand.default, (src, list(node.meta["val"].shape))))
            else:
                values.append(graph.call_function(fn, node.args, node.kwargs))
        point = node if values[0] in before else values[0]  # the write-back goes after the new value
        for k in range(top):
            with graph.inserting_before(point.next):  # (inserting_after would put each node before the last)
                values.append(_write_back(graph, chain[k], values[-1]))
            point = values[-1]
        created = [n for n in graph.nodes if n not in before]
        for n in created:  # in graph order: each one's inputs have their shapes
            order[n] = at
            n.meta.update({key: v for key, v in node.meta.items() if key not in ("val", "tensor_meta")})
            if mode is not None:
                with mode:
                    n.meta["val"] = n.target(*torch.fx.node.map_arg(n.args, lambda a: a.meta["val"]),
                                             **torch.fx.node.map_arg(n.kwargs, lambda a: a.meta["val"]))
        node.replace_all_uses_with(values[0])
        for k in range(top + 1):
            for user in list(chain[k].users):
                if user not in created and order.get(user, -1) > at:
                    user.replace_input_with(chain[k], values[k])
        graph.erase_node(node)
        return ""
