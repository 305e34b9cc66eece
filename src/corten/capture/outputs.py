"""The structure of a program's outputs: what ``forward`` returns, as a small serialisable tree.

A Corten program computes a flat list of output tensors (the memory plan, the C library and the
runners only ever see that list).  :class:`OutputTree` is the structure ``forward`` returned them
in - a tensor, (nested) tuples and lists, dicts (``str`` or ``int`` keys, ``OrderedDict`` too),
NamedTuples and torch's ``torch.return_types`` structs, with ``None`` leaves - so that
``Program.run`` can return the same structure, the C library can name its outputs after the dict
keys and fields (``logits``, ``aux_0``) and a saved program keeps it (``manifest.json``).

* :func:`output_tree` builds it from a ``torch.utils._pytree`` ``TreeSpec`` and the leaves' values,
  refusing (:class:`CaptureError`, naming the output's path, e.g. ``output["aux"][1]``) a leaf that
  is neither a tensor nor ``None`` and containers Corten cannot rebuild after a save;
* :func:`flatten_outputs` makes a captured ``GraphModule`` return the flat tuple of its tensor
  leaves (``None`` leaves dropped) and returns the tree of what it returned before;
* :func:`tensor_leaves` is the flat list of tensors of any (pytree) value, in the same order.
"""
from __future__ import annotations

import collections
import json
import sys
from typing import Any, Sequence

import torch
import torch.utils._pytree as pytree

from corten.errors import CaptureError

__all__ = ["OutputTree", "output_tree", "flatten_outputs", "tensor_leaves", "ROOT"]

ROOT = "output"  # the name of the whole returned value in paths: output["aux"][1]
TENSOR, NONE = "tensor", "none"
SEQUENCES = {tuple: "tuple", list: "list"}
MAPPINGS = {dict: "dict", collections.OrderedDict: "ordereddict"}
RECORDS = ("namedtuple", "structseq")  # a tuple subclass with field names


def _children(spec) -> list:
    return list(spec.children()) if hasattr(spec, "children") else list(spec.children_specs)


def _type_name(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _describe(value: Any) -> str:
    return "None" if value is None else type(value).__name__


def _refuse(where: str, what: str, fix: str) -> CaptureError:
    return CaptureError(f"{where} {what}; {fix}")


class OutputTree:
    """The structure of a program's outputs (a JSON-able tree of nodes, see :meth:`to_json`).

    Leaves are ``tensor`` (the program's outputs, in order) or ``none`` (a ``None`` forward
    returned; no program output).  ``paths`` / ``keys`` describe the tensor leaves."""

    def __init__(self, root: dict, classes: dict[str, type] | None = None) -> None:
        self.root = root
        self._classes = dict(classes or {})  # NamedTuple / struct classes by type name (not saved)
        self.paths: list[str] = []  # output["aux"][1], per tensor leaf
        self.keys: list[tuple[str | int, ...]] = []  # ("aux", 1), per tensor leaf
        self.keyed = False  # a dict key or a field name somewhere (names come from them)
        self._walk(root, ROOT, ())

    def _walk(self, node: dict, path: str, keys: tuple) -> None:
        kind = node["kind"]
        if kind == TENSOR:
            self.paths.append(path)
            self.keys.append(keys)
        elif kind in SEQUENCES.values():
            for i, child in enumerate(node["items"]):
                self._walk(child, f"{path}[{i}]", keys + (i,))
        elif kind in MAPPINGS.values():
            self.keyed = self.keyed or any(isinstance(k, str) for k in node["keys"])
            for k, child in zip(node["keys"], node["items"]):
                self._walk(child, f"{path}[{json.dumps(k)}]", keys + (k,))
        elif kind in RECORDS:
            self.keyed = True
            for f, child in zip(node["fields"], node["items"]):
                self._walk(child, f"{path}.{f}", keys + (f,))

    @property
    def num_tensors(self) -> int:
        return len(self.paths)

    @property
    def is_tensor(self) -> bool:
        """``forward`` returned one tensor (not in a container)."""
        return self.root["kind"] == TENSOR

    @property
    def is_flat_tuple(self) -> bool:
        """A tuple of tensors: what the program's own graph returns."""
        return self.root["kind"] == "tuple" and all(c["kind"] == TENSOR for c in self.root["items"])

    # ------------------------------------------------------------------ values
    def unflatten(self, tensors: Sequence[Any]) -> Any:
        """The structure ``forward`` returned, with ``tensors`` (one per tensor leaf, in order) at its leaves."""
        tensors = list(tensors)
        if len(tensors) != self.num_tensors:
            raise ValueError(f"the outputs have {self.num_tensors} tensor(s) ({', '.join(self.paths)}), "
                             f"got {len(tensors)} value(s)")
        it = iter(tensors)
        return self._build(self.root, it)

    def _build(self, node: dict, it) -> Any:
        kind = node["kind"]
        if kind == TENSOR:
            return next(it)
        if kind == NONE:
            return None
        items = [self._build(c, it) for c in node.get("items", ())]
        if kind == "tuple":
            return tuple(items)
        if kind == "list":
            return items
        if kind == "dict":
            return dict(zip(node["keys"], items))
        if kind == "ordereddict":
            return collections.OrderedDict(zip(node["keys"], items))
        cls = self._record_class(node)
        return cls(items) if kind == "structseq" and getattr(cls, "n_fields", None) is not None else cls(*items)

    def _record_class(self, node: dict) -> type:
        """The NamedTuple class: the live one, else the class of that name if its module is imported
        in this process (no module is imported for it) with the same fields, else a namedtuple of
        the same name and fields."""
        name, fields = node["type"], list(node["fields"])
        cls = self._classes.get(name)
        if cls is None:
            module, _, qualname = name.rpartition(".")
            obj = sys.modules.get(module)
            for part in qualname.split(".") if obj is not None else ():
                obj = getattr(obj, part, None)
            if isinstance(obj, type) and issubclass(obj, tuple) and _record_fields(obj) == fields:
                cls = obj
            else:
                last = qualname.rsplit(".", 1)[-1]
                cls = collections.namedtuple(last if last.isidentifier() else "Output", fields, rename=True)
            self._classes[name] = cls
        return cls

    # ------------------------------------------------------------------ persistence
    def to_json(self) -> dict:
        """``{"kind": "tensor" | "none"}``, ``{"kind": "tuple" | "list", "items": [...]}``, ``{"kind":
        "dict" | "ordereddict", "keys": [...], "items": [...]}`` or ``{"kind": "namedtuple" |
        "structseq", "type": "module.Class", "fields": [...], "items": [...]}``."""
        return json.loads(json.dumps(self.root))

    @staticmethod
    def from_json(d: Any) -> "OutputTree":
        """The tree :meth:`to_json` wrote; a :class:`ValueError` says what is malformed."""
        _check_node(d, ROOT)
        return OutputTree(json.loads(json.dumps(d)))

    @staticmethod
    def flat(n: int) -> "OutputTree":
        """``n`` tensors: one tensor (``n == 1``) or a tuple of them."""
        leaf = {"kind": TENSOR}
        return OutputTree(leaf if n == 1 else {"kind": "tuple", "items": [dict(leaf) for _ in range(n)]})

    def __eq__(self, other: object) -> bool:
        return isinstance(other, OutputTree) and self.root == other.root

    def __repr__(self) -> str:
        return f"OutputTree({', '.join(self.paths)})"


def _record_fields(cls: type) -> list[str] | None:
    fields = getattr(cls, "_fields", None)
    if fields is None and getattr(cls, "n_fields", None) is not None:  # torch.return_types (a struct sequence)
        fields = getattr(cls, "__match_args__", None)
    return list(fields) if fields is not None else None


def _check_node(d: Any, path: str) -> None:
    if not isinstance(d, dict) or not isinstance(d.get("kind"), str):
        raise ValueError(f"{path}: expected a node {{'kind': ...}}, got {d!r:.80}")
    kind = d["kind"]
    if kind in (TENSOR, NONE):
        return
    items = d.get("items")
    if not isinstance(items, list):
        raise ValueError(f"{path}: a {kind} node needs an 'items' list")
    if kind in MAPPINGS.values():
        keys = d.get("keys")
        if not isinstance(keys, list) or len(keys) != len(items) or \
                not all(isinstance(k, (str, int)) and not isinstance(k, bool) for k in keys):
            raise ValueError(f"{path}: a {kind} node needs one str or int key per item")
        labels = [f"[{json.dumps(k)}]" for k in keys]
    elif kind in RECORDS:
        fields = d.get("fields")
        if not isinstance(d.get("type"), str) or not isinstance(fields, list) or len(fields) != len(items) or \
                not all(isinstance(f, str) and f.isidentifier() for f in fields):
            raise ValueError(f"{path}: a {kind} node needs a 'type' name and one field name per item")
        labels = [f".{f}" for f in fields]
    elif kind in SEQUENCES.values():
        labels = [f"[{i}]" for i in range(len(items))]
    else:
        raise ValueError(f"{path}: unknown node kind {kind!r}")
    for label, child in zip(labels, items):
        _check_node(child, path + label)


def output_tree(spec, leaves: Sequence[Any], model_name: str) -> OutputTree:
    """The :class:`OutputTree` of a ``TreeSpec`` whose leaves hold ``leaves`` (values: tensors, fake
    tensors or fx nodes - their ``meta["val"]``, a tensor when they have none yet -; ``None``).  :class:`CaptureError`, naming the
    output's path, for a container Corten cannot rebuild (sets, deques, dataclasses, custom pytree
    nodes; dict keys other than str/int), a leaf that is not a tensor or None (``output[1]`` is an
    int), or when no leaf is a tensor."""
    leaves = list(leaves)
    if spec.num_leaves != len(leaves):
        raise CaptureError(f"{model_name}.forward: its output structure has {spec.num_leaves} leaves but the graph "
                           f"returns {len(leaves)} value(s)")
    classes: dict[str, type] = {}
    it = iter(enumerate(leaves))

    def build(s, path: str) -> dict:
        if s.is_leaf():
            i, v = next(it)
            val = v.meta.get("val", v) if isinstance(v, torch.fx.Node) else v
            if isinstance(val, (torch.Tensor, torch.fx.Node)):  # (a node without a value yet: a tensor op)
                return {"kind": TENSOR}
            if val is None:
                return {"kind": NONE}
            raise _refuse(f"{model_name}.forward returns {_describe(val)} as output {i} ({path} = {val!r:.40});",
                          "a compiled model returns float tensors only (a tensor, or tuples/lists/dicts/NamedTuples "
                          "of tensors, None allowed)",
                          "return constants and other values from a Python wrapper around the compiled program")
        children = _children(s)
        t = s.type
        if t in SEQUENCES:
            return {"kind": SEQUENCES[t], "items": [build(c, f"{path}[{k}]") for k, c in enumerate(children)]}
        if t in MAPPINGS:
            keys = list(s.context)
            for k in keys:
                if not isinstance(k, (str, int)) or isinstance(k, bool):
                    raise _refuse(f"{model_name}.forward returns a dict with the key {k!r} ({type(k).__name__}) at "
                                  f"{path};", "Corten programs name their outputs by str (or int) keys",
                                  "use string keys")
            return {"kind": MAPPINGS[t], "keys": keys,
                    "items": [build(c, f"{path}[{json.dumps(k)}]") for k, c in zip(keys, children)]}
        record = s.context if t is collections.namedtuple else t
        fields = _record_fields(record) if isinstance(record, type) else None
        if fields is not None and len(fields) == len(children):
            name = _type_name(record)
            classes[name] = record
            return {"kind": "namedtuple" if t is collections.namedtuple else "structseq", "type": name,
                    "fields": fields, "items": [build(c, f"{path}.{f}") for f, c in zip(fields, children)]}
        shown = _type_name(t) if isinstance(t, type) else getattr(t, "__name__", str(t))
        raise _refuse(f"{model_name}.forward returns a {shown} at {path};",
                      "Corten programs return a tensor, or tuples, lists, dicts and NamedTuples of tensors",
                      "return a dict or a NamedTuple of the tensors instead")

    root = build(spec, ROOT)
    tree = OutputTree(root, classes)
    if tree.num_tensors == 0:
        if leaves:
            raise CaptureError(f"{model_name}.forward returns None as output 0 and no tensor; return the "
                               "tensor(s) to compile")
        raise CaptureError(f"{model_name}.forward returns no tensor; return the tensor(s) to compile")
    return tree


def _out_spec(gm: torch.fx.GraphModule):
    info = getattr(gm.graph._codegen, "pytree_info", None)
    return None if info is None else info.out_spec


def flatten_outputs(gm: torch.fx.GraphModule, model_name: str) -> OutputTree:
    """Make ``gm`` (a captured module: ``ExportedProgram.module()``) return the flat tuple of its
    tensor outputs, ``None`` leaves dropped (a one-tensor forward keeps returning the tensor), and
    return the tree of what it returned before (refusals as :func:`output_tree`)."""
    out_node = gm.graph.output_node()
    flat = list(pytree.tree_leaves(out_node.args[0]))
    spec = _out_spec(gm)
    if spec is None:  # a module without pytree outputs: its output value is the structure
        spec = pytree.tree_structure(out_node.args[0])
    tree = output_tree(spec, flat, model_name)
    if tree.is_tensor or tree.is_flat_tuple:
        return tree
    tensors = [a for a in flat if isinstance(a, torch.fx.Node)]
    out_node.args = (tuple(tensors),)
    info = getattr(gm.graph._codegen, "pytree_info", None)
    if info is not None:
        gm.graph._codegen.pytree_info = info._replace(out_spec=pytree.tree_structure(tuple(range(len(tensors)))))
    gm.recompile()
    return tree


def tensor_leaves(value: Any) -> list[torch.Tensor]:
    """The tensors of ``value`` (a tensor or any pytree of them), in the program's output order."""
    return [v for v in pytree.tree_leaves(value) if isinstance(v, torch.Tensor)]
