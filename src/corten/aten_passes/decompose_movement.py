"""Put data movement in the forms the quantizer and the lowering take: one tensor in, one out.

* the edge dialect's ``*_copy`` spellings of view ops (``view_copy``, ``permute_copy``, ``t_copy``,
  ``expand_copy``, ``alias_copy``, ...) become the view ops (:data:`COPY_SPELLINGS`);
* ``split`` / ``split_with_sizes`` / ``chunk`` / ``tensor_split`` / ``unbind`` read through
  ``getitem`` become one ``slice`` (``select`` for ``unbind``) per piece that is used;
* ``stack`` / ``hstack`` / ``vstack`` / ``dstack`` become reshapes (``unsqueeze``) and one ``cat``;
* ``expand_as`` / ``view_as`` / ``reshape_as`` become ``expand`` / ``reshape`` to the other
  tensor's (static) shape, so that the other tensor is not an input of the op; ``dst.copy_(src)``
  (e.g. into ``torch.empty_like(x)``) becomes ``src`` expanded to ``dst``'s shape;
* data movement of constants is folded: ``self.pos_embedding[:, :T]``, ``torch.tensor([0, 2])``
  (``lift_fresh_copy``) and the like become constants before the quantizer sees them.
"""
from __future__ import annotations

import operator

import torch
from torch.fx import GraphModule, Node
from torch.fx.passes.infra.pass_base import PassBase, PassResult

from corten.aten_passes.graph_utils import _unique_attr_name, finish_rewrite
from corten.fx_nodes import aten_overloads, get_attr

aten = torch.ops.aten


def _ops(*names: str) -> frozenset:
    return frozenset(aten_overloads(*names))


SPLITS = _ops("split.Tensor", "split_with_sizes.default", "chunk.default", "tensor_split.sections",
              "tensor_split.indices", "unsafe_split.Tensor", "unsafe_split_with_sizes.default", "split.sizes")
UNBINDS = _ops("unbind.int")
STACKS = _ops("stack.default", "hstack.default", "vstack.default", "dstack.default")
AS_OTHER = {aten.expand_as.default: aten.expand.default, aten.view_as.default: aten.reshape.default,
            aten.reshape_as.default: aten.reshape.default}
COPIES = _ops("copy.default", "copy_.default")
# Ops folded when every tensor they read is a constant (pure functions of their inputs, no arithmetic).
FOLDABLE = _ops(
    "lift_fresh_copy.default", "detach.default", "detach_.default", "clone.default", "alias.default",
    "contiguous.default", "_to_copy.default", "to.dtype", "slice.Tensor", "select.int", "narrow.default",
    "expand.default", "repeat.default", "tile.default", "flip.default", "permute.default", "transpose.int",
    "t.default", "view.default", "reshape.default", "_unsafe_view.default", "flatten.using_ints", "squeeze.dim",
    "squeeze.dims", "squeeze.default", "unsqueeze.default", "unflatten.int", "cat.default", "index_select.default",
    "gather.default", "pixel_shuffle.default", "pixel_unshuffle.default", "movedim.int", "swapaxes.default",
    "roll.default", "repeat_interleave.self_int", "index.Tensor", "take_along_dim.default", "fliplr.default",
    "flipud.default", "narrow_copy.default", "broadcast_to.default", "swapdims.default", "numpy_T.default",
    "mT.default", "squeeze_.dim", "unsqueeze_.default", "diagonal.default", "atleast_1d.default",
    "atleast_2d.default", "atleast_3d.default", "channel_shuffle.default", "ravel.default", "movedim.intlist")


# The edge dialect's copying spellings of view ops (ExecuTorch programs call them: ``view_copy``,
# ``permute_copy``, ...): the same values as the view, which is what Corten lowers (its data
# movement is a copy anyway); same arguments.  ``alias_copy`` / ``detach_copy`` are identities.
COPY_SPELLINGS = {getattr(getattr(aten, c), o): getattr(getattr(aten, v), o2) for c, o, v, o2 in (
    ("view_copy", "default", "reshape", "default"), ("_reshape_copy", "default", "reshape", "default"),
    ("t_copy", "default", "t", "default"), ("expand_copy", "default", "expand", "default"),
    ("permute_copy", "default", "permute", "default"), ("transpose_copy", "int", "transpose", "int"),
    ("unsqueeze_copy", "default", "unsqueeze", "default"), ("squeeze_copy", "default", "squeeze", "default"),
    ("squeeze_copy", "dim", "squeeze", "dim"), ("squeeze_copy", "dims", "squeeze", "dims"),
    ("slice_copy", "Tensor", "slice", "Tensor"), ("select_copy", "int", "select", "int"),
    ("split_copy", "Tensor", "split", "Tensor"), ("split_with_sizes_copy", "default", "split_with_sizes", "default"),
    ("unbind_copy", "int", "unbind", "int"), ("diagonal_copy", "default", "diagonal", "default"),
    ("alias_copy", "default", "alias", "default"), ("detach_copy", "default", "detach", "default"),
    ("unfold_copy", "default", "unfold", "default"))
    if hasattr(getattr(aten, c, None), o) and hasattr(getattr(aten, v, None), o2)}


def _shape(node: Node) -> list[int]:
    return [int(d) for d in node.meta["val"].shape]


def _is_constant(arg) -> bool:
    return isinstance(arg, Node) and arg.op == "get_attr"


def _call(graph, target, args, like: Node) -> Node:
    n = graph.call_function(target, tuple(args))
    for key in ("stack_trace", "nn_module_stack", "source_fn_stack"):
        if key in like.meta:
            n.meta[key] = like.meta[key]
    return n


class DecomposeMovementPass(PassBase):
    """See the module docstring."""

    def call(self, gm: GraphModule) -> PassResult:
        modified = False
        for _ in range(8):  # a piece of a split may itself be split, unbound or stacked: repeat
            changed = False
            for node in list(gm.graph.nodes):
                if node.op != "call_function":
                    continue
                if node.target in COPY_SPELLINGS:  # view_copy -> reshape, permute_copy -> permute, ...
                    node.target = COPY_SPELLINGS[node.target]
                    changed = True
                if node.target in SPLITS or node.target in UNBINDS:
                    changed |= self._split(gm, node)
                elif node.target in STACKS:
                    changed |= self._stack(gm, node)
                elif node.target in AS_OTHER and isinstance(node.args[1], Node) and "val" in node.args[1].meta:
                    with gm.graph.inserting_before(node):
                        new = _call(gm.graph, AS_OTHER[node.target], (node.args[0], _shape(node.args[1])), node)
                    node.replace_all_uses_with(new)
                    gm.graph.erase_node(node)
                    changed = True
                elif node.target in COPIES:
                    changed |= self._copy(gm, node)
            changed |= self._fold_constants(gm)
            if not changed:
                break
            modified = True
            gm.graph.eliminate_dead_code(is_impure_node=lambda n: n.op in ("placeholder", "output")
                                         or bool(n.meta.get("corten_refusal")))
            finish_rewrite(gm)  # new nodes get meta["val"]
        return PassResult(gm, modified)

    # -- dst.copy_(src): the values of src, in dst's shape
    def _copy(self, gm: GraphModule, node: Node) -> bool:
        dst, src = node.args[0], node.args[1]
        if node.meta.get("corten_refusal"):
            return False  # a write into a view FunctionalizeInPlacePass could not make functional
        if not isinstance(src, Node) or "val" not in src.meta or "val" not in dst.meta or \
                src.meta["val"].dtype != dst.meta["val"].dtype:
            return False
        if any(u is not node for u in dst.users) and dst.op != "call_function":
            return False  # a graph input or constant written in place: keep (export refuses it anyway)
        if _shape(src) == _shape(dst):
            node.replace_all_uses_with(src)
        else:
            with gm.graph.inserting_before(node):
                new = _call(gm.graph, aten.expand.default, (src, _shape(dst)), node)
            node.replace_all_uses_with(new)
        gm.graph.erase_node(node)
        return True

    # -- one piece per getitem
    def _split(self, gm: GraphModule, node: Node) -> bool:
        users = list(node.users)
        if not users or any(u.target is not operator.getitem for u in users) or "val" not in node.args[0].meta:
            return False
        x = node.args[0]
        shape = _shape(x)
        rank = len(shape)
        probe = torch.empty(shape, device="meta")
        pieces = node.target(probe, *node.args[1:], **node.kwargs)
        for user in users:
            i = int(user.args[1])
            piece = pieces[i]
            with gm.graph.inserting_before(user):
                if node.target in UNBINDS:
                    dim = int(node.args[1] if len(node.args) > 1 else node.kwargs.get("dim", 0)) % rank
                    new = _call(gm.graph, aten.select.int, (x, dim, i), node)
                else:
                    dims = [d for d in range(rank) if piece.shape[d] != shape[d]]
                    if not dims:
                        user.replace_all_uses_with(x)
                        gm.graph.erase_node(user)
                        continue
                    (dim,) = dims
                    start = piece.storage_offset() // probe.stride(dim) if probe.stride(dim) else 0
                    new = _call(gm.graph, aten.slice.Tensor, (x, dim, start, start + int(piece.shape[dim])), node)
            user.replace_all_uses_with(new)
            gm.graph.erase_node(user)
        gm.graph.erase_node(node)
        return True

    # -- stack = reshapes + cat
    def _stack(self, gm: GraphModule, node: Node) -> bool:
        tensors = list(node.args[0])
        if not tensors or any(not isinstance(t, Node) or "val" not in t.meta for t in tensors):
            return False
        rank = len(_shape(tensors[0]))
        if node.target == aten.stack.default:
            dim = int(node.args[1] if len(node.args) > 1 else node.kwargs.get("dim", 0)) % (rank + 1)

            def shaped(s):
                return s[:dim] + [1] + s[dim:]
        elif node.target == aten.hstack.default:
            dim = 0 if rank == 1 else 1

            def shaped(s):
                return s
        elif node.target == aten.vstack.default:
            dim = 0

            def shaped(s):
                return [1] + s if len(s) == 1 else s
        else:  # dstack
            dim = 2

            def shaped(s):
                return [1, s[0], 1] if len(s) == 1 else (s + [1] if len(s) == 2 else s)
        with gm.graph.inserting_before(node):
            parts = []
            for t in tensors:
                s = _shape(t)
                parts.append(t if shaped(s) == s else _call(gm.graph, aten.reshape.default, (t, shaped(s)), node))
            new = _call(gm.graph, aten.cat.default, (parts, dim), node)
        node.replace_all_uses_with(new)
        gm.graph.erase_node(node)
        return True

    # -- constants
    def _fold_constants(self, gm: GraphModule) -> bool:
        modified = False
        for node in list(gm.graph.nodes):
            if node.op != "call_function" or node.target not in FOLDABLE or not node.users:
                continue
            inputs = node.all_input_nodes
            if not inputs or not all(_is_constant(a) for a in inputs):
                continue
            args = torch.fx.node.map_arg(node.args, lambda a: get_attr(gm, a).detach())
            kwargs = torch.fx.node.map_arg(node.kwargs, lambda a: get_attr(gm, a).detach())
            with torch.no_grad():
                value = node.target(*args, **kwargs)
            if not isinstance(value, torch.Tensor):
                continue
            name = _unique_attr_name(gm, f"_folded_{node.name}")
            gm.register_buffer(name, value.detach().clone().contiguous())
            with gm.graph.inserting_before(node):
                const = gm.graph.get_attr(name)
            node.replace_all_uses_with(const)
            modified = True
        return modified
