"""Small helpers shared by the ATen passes: constants behind ``get_attr`` nodes, adding new
constants, argument access, cleaning up what a rewrite orphaned, and refreshing ``meta["val"]``."""
from __future__ import annotations

import re
from typing import Any, Iterable

import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx import GraphModule, Node
from torch.fx.passes.fake_tensor_prop import FakeTensorProp

from corten.errors import AtenPassError
from corten.fx_nodes import get_attr


def is_constant(arg: Any) -> bool:
    """True for ``None`` (an absent optional tensor) or a ``get_attr`` node."""
    return arg is None or (isinstance(arg, Node) and arg.op == "get_attr")


def constant_value(gm: GraphModule, arg: Node | None) -> torch.Tensor | None:
    """The tensor behind a ``get_attr`` node (None stays None)."""
    if arg is None:
        return None
    if not is_constant(arg):
        raise AtenPassError(f"{arg.name} is a {arg.op} node, not a constant (get_attr)")
    value = get_attr(gm, arg)
    if not isinstance(value, torch.Tensor):
        raise AtenPassError(f"get_attr {arg.target} is a {type(value).__name__}, not a tensor")
    return value.detach()


def _unique_attr_name(gm: GraphModule, base: str) -> str:
    base = re.sub(r"[^0-9a-zA-Z_]", "_", base)
    name, i = base, 0
    while hasattr(gm, name):
        i += 1
        name = f"{base}_{i}"
    return name


def add_constant(gm: GraphModule, base_name: str, value: torch.Tensor, before: Node) -> Node:
    """Register ``value`` as a new (non-trainable) parameter of ``gm`` under a fresh name derived
    from ``base_name`` and return a ``get_attr`` node for it inserted before ``before``.
    Existing parameters are never modified: they may be shared with the user's model."""
    name = _unique_attr_name(gm, base_name)
    gm.register_parameter(name, nn.Parameter(value.detach().clone(), requires_grad=False))
    with gm.graph.inserting_before(before):
        node = gm.graph.get_attr(name)
    mode = _fake_mode_of(gm)
    if mode is not None:  # shaped like the exported nodes, so no re-propagation is needed for it
        node.meta["val"] = mode.from_tensor(value.detach(), static_shapes=True)
    return node


def _fake_mode_of(gm: GraphModule) -> FakeTensorMode | None:
    for n in gm.graph.nodes:
        mode = getattr(n.meta.get("val"), "fake_mode", None)
        if mode is not None:
            return mode
    return None


def set_arg(node: Node, index: int, name: str, value: Any) -> None:
    """Set argument ``index`` / ``name`` of ``node``; appends it when it is the next positional
    argument (e.g. a bias after ``(input, weight)``)."""
    if len(node.args) > index:
        node.update_arg(index, value)
    elif name in node.kwargs or len(node.args) < index:
        node.update_kwarg(name, value)
    else:
        node.args = (*node.args, value)


def erase_if_unused(gm: GraphModule, nodes: Iterable[Any]) -> None:
    """Erase the given ``get_attr`` nodes that a rewrite left without users."""
    for node in nodes:
        if isinstance(node, Node) and node.op == "get_attr" and not node.users:
            gm.graph.erase_node(node)


def is_mutating(node: Node) -> bool:
    """True when ``node`` is an ATen op that writes to one of its tensor arguments (e.g. ``hardtanh_``)."""
    schema = getattr(node.target, "_schema", None)
    return schema is not None and any(a.alias_info is not None and a.alias_info.is_write
                                      for a in schema.arguments)


def remove_unused_attributes(gm: GraphModule) -> None:
    """Erase ``get_attr`` nodes without users, delete parameters/buffers no ``get_attr`` refers to
    (e.g. BatchNorm statistics after a fold, ``num_batches_tracked``), then submodules left empty,
    so the GraphModule's state holds only what the graph uses."""
    erase_if_unused(gm, list(gm.graph.nodes))
    used = {n.target for n in gm.graph.nodes if n.op == "get_attr"}
    used_modules = {n.target for n in gm.graph.nodes if n.op == "call_module"}
    for qualified, _ in list(gm.named_parameters(remove_duplicate=False)) + \
            list(gm.named_buffers(remove_duplicate=False)):
        if qualified in used:
            continue
        owner_path, _, attr = qualified.rpartition(".")
        owner = gm.get_submodule(owner_path) if owner_path else gm
        if owner_path in used_modules or any(u.startswith(owner_path + ".") for u in used_modules):
            continue  # belongs to a module the graph calls
        owner._parameters.pop(attr, None)
        owner._buffers.pop(attr, None)
    gm.delete_all_unused_submodules()


def refresh_meta_val(gm: GraphModule) -> None:
    """Recompute ``node.meta["val"]`` (fake tensors) for every node from the placeholders' shapes,
    so nodes a pass created carry shapes and dtypes like the exported ones.  No-op when the
    placeholders carry no ``val`` (a graph that did not come from torch.export)."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    vals = [n.meta.get("val") for n in placeholders]
    if not placeholders or any(not isinstance(v, torch.Tensor) for v in vals):
        return
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    inputs = [mode.from_tensor(torch.empty(v.shape, dtype=v.dtype), static_shapes=True) for v in vals]
    FakeTensorProp(gm, mode).propagate_dont_convert_inputs(*inputs)


def finish_rewrite(gm: GraphModule) -> None:
    """What every pass does after changing ``gm``: drop unused state, check, recompile, and re-infer
    shapes when a node lacks them.  The passes only remove shape-preserving nodes, rewire arguments
    without changing shapes, or add nodes; constants added with :func:`add_constant` carry their
    shape already, so re-propagation (a fake run of the whole graph) happens only after a pass
    created other nodes."""
    remove_unused_attributes(gm)
    gm.graph.lint()
    gm.recompile()
    if any("val" not in n.meta for n in gm.graph.nodes if n.op != "output"):
        refresh_meta_val(gm)
