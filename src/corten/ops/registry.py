"""The one registry of Corten op families.

An op family is one module in :mod:`corten.ops` that owns everything about a group of related ops:
their ``torch.library`` schema, fake kernel and bit-exact reference kernel, and - as the later
pipeline stages grow - the lowering rule that produces them, their scratch-memory needs per ISA
and their C emission.  Stages never list ops themselves: they ask this registry.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import torch

NAMESPACE = "corten"
_FAMILIES: dict[str, "OpFamily"] = {}


@dataclass
class OpFamily:
    """What one op-family module contributes.  Hooks not yet provided stay ``None``."""

    name: str
    ops: tuple[str, ...]  # op names in the ``corten`` namespace
    doc: str = ""
    # Hooks used by later stages (lowering, memory plan, C codegen); keyed by op name where
    # a family has several ops.
    hooks: dict[tuple[str, str], Callable] = field(default_factory=dict)

    def provides(self, kind: str, *op_names: str) -> Callable:
        """Decorator: register ``fn`` as this family's ``kind`` hook (``"lower"``,
        ``"scratch_bytes"``, ``"emit_c"``, ...) for the given ops (all the family's ops if none)."""

        def deco(fn: Callable) -> Callable:
            for name in op_names or self.ops:
                if name not in self.ops:
                    raise ValueError(f"family {self.name!r} has no op {name!r}")
                self.hooks[(kind, name)] = fn
            return fn

        return deco

    def hook(self, kind: str, op_name: str) -> Callable | None:
        return self.hooks.get((kind, op_name))


def register_family(family: OpFamily) -> OpFamily:
    if family.name in _FAMILIES:
        raise ValueError(f"op family {family.name!r} registered twice")
    _FAMILIES[family.name] = family
    return family


_LOWERINGS: dict[Any, Callable] = {}


def lowers(*aten_targets: Any) -> Callable:
    """Decorator for a lowering rule: ``fn(match) -> torch.fx.Node`` replaces a quantized ATen op
    (``torch.ops.aten.conv2d.default``, ...) by Corten ops.  The rule lives in the op family module
    of the ops it produces; :mod:`corten.lowering` finds it here."""

    def deco(fn: Callable) -> Callable:
        for t in aten_targets:
            if t in _LOWERINGS:
                raise ValueError(f"two lowering rules for {t}")
            _LOWERINGS[t] = fn
        return fn

    return deco


def lowering_rule(aten_target: Any) -> Callable | None:
    return _LOWERINGS.get(aten_target)


def lowered_aten_ops() -> list[Any]:
    return list(_LOWERINGS)


@dataclass(frozen=True)
class Annotation:
    """How CortenQuantizer annotates one ATen op (declared by the op family that lowers it).

    ``kind``:
      * ``"weighted"`` - conv/linear-like: int8 activation input, per-channel symmetric weight
        (quantized along ``weight_axis``), int32 bias, int8 output after a fused activation;
      * ``"binary"``   - two int8 activation inputs, int8 output after a fused activation;
      * ``"unary"``    - one int8 activation input, an int8 output with its own qparams;
      * ``"fixed"``    - as unary, with output qparams fixed to ``fixed = (scale, zero_point)``;
      * ``"shared"``   - output (and any further tensor inputs) share the first input's qparams.
    """

    kind: str
    weight_axis: int = 0
    fixed: tuple[float, int] | None = None


ANNOTATION_KINDS = ("weighted", "binary", "unary", "fixed", "shared")
_ANNOTATIONS: dict[Any, Annotation] = {}


def annotates(kind: str, *aten_targets: Any, weight_axis: int = 0, fixed: tuple[float, int] | None = None) -> None:
    """Declare how the quantizer annotates ``aten_targets`` (see :class:`Annotation`)."""
    if kind not in ANNOTATION_KINDS:
        raise ValueError(f"annotation kind {kind!r} is not one of {ANNOTATION_KINDS}")
    for t in aten_targets:
        if t in _ANNOTATIONS:
            raise ValueError(f"two annotations for {t}")
        _ANNOTATIONS[t] = Annotation(kind, weight_axis, fixed)


def annotation_for(aten_target: Any) -> Annotation | None:
    return _ANNOTATIONS.get(aten_target)


def annotated_aten_ops() -> list[Any]:
    return list(_ANNOTATIONS)


def families() -> dict[str, OpFamily]:
    return dict(_FAMILIES)


def family_of(op_name: str) -> OpFamily:
    for fam in _FAMILIES.values():
        if op_name in fam.ops:
            return fam
    raise KeyError(f"no Corten op family defines {op_name!r}")


def hook_for(op_name: str, kind: str) -> Callable | None:
    """The ``kind`` hook of the family that defines ``op_name`` (None when it provides none)."""
    return family_of(op_name).hook(kind, op_name)


def all_op_names() -> list[str]:
    return [name for fam in _FAMILIES.values() for name in fam.ops]


def op(name: str) -> torch._ops.OpOverload:
    """``op("quantized_conv2d")`` -> ``torch.ops.corten.quantized_conv2d.default``."""
    return getattr(getattr(torch.ops, NAMESPACE), name).default


def op_name_of(target: Any) -> str | None:
    """The Corten op name of an FX node target, or None when it is not a Corten op."""
    if isinstance(target, torch._ops.OpOverload) and target.namespace == NAMESPACE:
        return target._schema.name.split("::", 1)[1]
    return None
