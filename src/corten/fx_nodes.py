"""The two questions every stage asks of a ``torch.fx`` node, answered once.

* :func:`node_arg` - an argument of a call by its schema name, whether it was given positionally, by
  keyword or not at all (then the schema's default); :func:`node_args` all of them, :func:`arg_position`
  where one sits in ``node.args``;
* :func:`get_attr` - the object a ``get_attr`` node (or its dotted target) refers to in its module.

Any stage may import this module (like :mod:`corten.errors`); it imports nothing of Corten's.
"""
from __future__ import annotations

from typing import Any

import torch

_MISSING = object()


def _schema_arguments(node: torch.fx.Node):
    schema = getattr(node.target, "_schema", None)
    if schema is None:
        raise TypeError(f"{node.name}: {node.target} has no schema (not an ATen / torch.library op)")
    return schema.arguments


def node_arg(node: torch.fx.Node, name: str, default: Any = _MISSING) -> Any:
    """Argument ``name`` of the call ``node`` (schema order): positional, keyword, else the schema's
    default, else ``default``; KeyError when the schema has no such argument and no default was given."""
    for i, a in enumerate(_schema_arguments(node)):
        if a.name != name:
            continue
        if i < len(node.args):
            return node.args[i]
        if name in node.kwargs:
            return node.kwargs[name]
        if a.has_default_value():
            return a.default_value
        if default is not _MISSING:
            return default
        raise KeyError(f"{node.name}: argument {name!r} of {node.target} not given and without default")
    if default is not _MISSING:
        return default
    raise KeyError(f"{node.name}: {node.target} has no argument {name!r}")


def arg_position(node: torch.fx.Node, name: str) -> int:
    """The position of argument ``name`` in the schema of the call ``node`` (to rewrite ``node.args``)."""
    for i, a in enumerate(_schema_arguments(node)):
        if a.name == name:
            return i
    raise KeyError(f"{node.name}: {node.target} has no argument {name!r}")


def node_args(node: torch.fx.Node) -> dict[str, Any]:
    """Every argument the call ``node`` was given, by schema name (absent optional ones left out)."""
    out = {}
    for i, a in enumerate(_schema_arguments(node)):
        if i < len(node.args):
            out[a.name] = node.args[i]
        elif a.name in node.kwargs:
            out[a.name] = node.kwargs[a.name]
    return out


def aten_overloads(*names: str) -> tuple:
    """The ATen overloads that exist in this torch (``"slice.Tensor"``, ...), in the order given."""
    out = []
    for name in names:
        op, overload = name.split(".")
        packet = getattr(torch.ops.aten, op, None)
        if packet is not None and hasattr(packet, overload):
            out.append(getattr(packet, overload))
    return tuple(out)


def get_attr(module: torch.nn.Module, target: "str | torch.fx.Node") -> Any:
    """The object behind a ``get_attr`` node or target (a dotted path such as ``features.0.0.weight``)."""
    if isinstance(target, torch.fx.Node):
        if target.op != "get_attr":
            raise TypeError(f"{target.name} is a {target.op} node, not a get_attr")
        target = target.target
    obj: Any = module
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj
