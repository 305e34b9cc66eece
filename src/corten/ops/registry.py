"""The one registry of Corten op families, and the typed extension points the stages use.

An op family is one module in :mod:`corten.ops` that owns everything about a group of related ops:
their ``torch.library`` schema, fake kernel and bit-exact reference kernel, the quantizer
annotation of the ATen ops it lowers, the lowering rule and its C kernels (registered with the
kernel providers of :mod:`corten.providers`).  Stages never list ops themselves: they ask this registry.

Extension points (the only ones; each is registered by the family module at import time):

* ``annotates(kind, *aten_ops)`` - how CortenQuantizer annotates the ATen ops (see :class:`Annotation`).
* ``@lowers(*aten_ops)`` - the lowering rule ``rule(match: corten.ops._rules.Match) -> torch.fx.Node``:
  builds the Corten node(s) replacing one quantized ATen op (with ``match.call``/``add_constant``)
  and returns the node that replaces the final quantize; raises
  :class:`corten.errors.LoweringError` with the reason to refuse (the op then stays unlowered
  and is reported with that reason).  ``formats=`` (:class:`NumberFormat`: activation dtype, weight
  dtype) says which element types the rule lowers - int8 by default, ``A16W8`` (16x8), ``A8W4``
  (int4 weights) - the same dtype key the kernel providers register kernels under.
* ``rewrites_aten(pass)`` - an ATen-level rewrite the family needs before quantization (the
  quantizer runs them after Corten's ATen passes), e.g. ``nn.LSTM`` split into layers.
* ``@family.provides(Hook.X, *op_names)`` - the per-op hooks of the later stages, one signature each:

  - ``Hook.IN_PLACE_INPUTS``: ``fn(node: torch.fx.Node) -> tuple[int, ...]``, the indices of the
    node's tensor arguments its kernel may overwrite with its output (same size, each element read
    before it is written).  Optional (memory planner; tests' independent plan checker).
  - ``Hook.ALIAS_OFFSET``: ``fn(node: torch.fx.Node) -> int | None``, the byte of its first input
    where the node's output starts when the output is one contiguous run of that input's bytes (a
    view: no C code, no bytes of its own), else None.  Optional (memory planner, C generator; see
    :func:`corten.memory.views.alias_offset`).

  - ``Hook.COST``: ``fn(node: torch.fx.Node) -> Cost``, the multiply-accumulates of one run of the
    node and the bytes of its weights.  Optional: no hook is ``Cost()`` (data movement, elementwise,
    tables).  Read through :func:`op_cost` by the profile and compile report (codegen), banding,
    the auto-precision report - one count of MACs.
  - ``Hook.WINDOW``: ``fn(node) -> Window``, the node's window along H (kernel, stride, dilation,
    padding and the schema argument holding it); provided by the ops that can run in row bands
    (``padding_arg`` None: output row r reads input row r).  Read through :func:`op_window` by
    :mod:`corten.memory.banding`.
  - ``Hook.ACCUMULATOR_TAPS``: ``fn(node) -> int``, the int8 x int8 products (input offset
    applied) summed into one int32 accumulator per output value; the overflow check
    (:func:`corten.validation.check_lowered`) compares it with
    :data:`corten.fixed_point.MAX_ACCUMULATOR_TAPS`.  Read through :func:`accumulator_taps`.
  - ``Hook.UNUSED_ARGS``: ``fn(node) -> tuple[str, ...]``, the schema arguments this call's kernel
    does not read (placeholders: a max/min ``quantized_reduce`` has no requantization, its
    ``multiplier`` is 0); the numeric checks of :func:`corten.validation.check_lowered` skip them.
    Read through :func:`unused_args`.

  Metadata hooks read shapes with :func:`node_shape` (``meta["val"]``, or the constant behind a
  ``get_attr``), so the same hook serves every stage's graph.

  ``kind`` is the :class:`Hook` member or its string value; anything else raises ValueError when
  the family module is imported, so a misspelled hook cannot silently disable a feature.

The C kernels of an op (their emission and scratch) are not hooks: the family registers them with
the kernel providers (``@PORTABLE.kernel(op)``, ``@CMSIS_NN.kernel(op, supports=..., scratch=...)``,
see :mod:`corten.providers`), which any other provider can join without editing a family.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, Callable, NamedTuple, Sequence

import torch

from corten.fx_nodes import get_attr, node_arg

NAMESPACE = "corten"
_FAMILIES: dict[str, "OpFamily"] = {}


class Hook(str, enum.Enum):
    """The per-op hook kinds (signatures in the module docstring)."""

    IN_PLACE_INPUTS = "in_place_inputs"
    ALIAS_OFFSET = "alias_offset"
    # op metadata (one definition each, read by codegen, memory, validation and the compiler)
    COST = "cost"
    WINDOW = "window"
    ACCUMULATOR_TAPS = "accumulator_taps"
    UNUSED_ARGS = "unused_args"

    @classmethod
    def of(cls, kind: "Hook | str") -> "Hook":
        """``kind`` as a :class:`Hook`; ValueError naming the valid kinds for anything else."""
        try:
            return cls(kind)
        except ValueError:
            valid = ", ".join(repr(h.value) for h in cls)
            raise ValueError(f"unknown hook kind {kind!r}: one of {valid}") from None


@dataclass
class OpFamily:
    """What one op-family module contributes.  Hooks not provided stay ``None``."""

    name: str
    ops: tuple[str, ...]  # op names in the ``corten`` namespace
    doc: str = ""
    # Hooks used by later stages (memory plan, C codegen), keyed by (Hook, op name).
    hooks: dict[tuple[Hook, str], Callable] = field(default_factory=dict)

    def provides(self, kind: Hook | str, *op_names: str) -> Callable:
        """Decorator: register ``fn`` as this family's ``kind`` hook (a :class:`Hook`) for the given
        ops (all the family's ops if none).  An unknown kind or op raises ValueError at once."""
        hook = Hook.of(kind)
        for name in op_names:
            if name not in self.ops:
                raise ValueError(f"family {self.name!r} has no op {name!r}")

        def deco(fn: Callable) -> Callable:
            for name in op_names or self.ops:
                if (hook, name) in self.hooks:
                    raise ValueError(f"family {self.name!r}: two {hook.value!r} hooks for {name!r}")
                self.hooks[(hook, name)] = fn
            return fn

        return deco

    def hook(self, kind: Hook | str, op_name: str) -> Callable | None:
        return self.hooks.get((Hook.of(kind), op_name))


def register_family(family: OpFamily) -> OpFamily:
    if family.name in _FAMILIES:
        raise ValueError(f"op family {family.name!r} registered twice")
    _FAMILIES[family.name] = family
    return family


_LOWERINGS: dict[Any, Callable] = {}


class NumberFormat(NamedTuple):
    """A number format a lowering rule handles: the element types of its activations and of its
    weights (an op without weights reads only ``act``).  The dispatch key of the lowering side;
    the kernel providers key their kernels on the same two dtypes (``@PORTABLE.kernel(op, act=...,
    weight=...)``), so a new format is one more key on each side."""

    act: torch.dtype
    weight: torch.dtype = torch.int8

    def __str__(self) -> str:
        return f"A{torch.iinfo(self.act).bits}W{_bits(self.weight)}"


def _bits(dtype: torch.dtype) -> int:
    return 4 if dtype == torch.int4 else torch.iinfo(dtype).bits


A8W8 = NumberFormat(torch.int8, torch.int8)  # int8 activations and weights (every op)
A16W8 = NumberFormat(torch.int16, torch.int8)  # TFLite's 16x8: int16 activations, int8 weights
A8W4 = NumberFormat(torch.int8, torch.int4)  # int4 weights (packed two per byte in C), int8 activations
INT8_ONLY = (A8W8,)

_FORMATS: dict[Any, tuple[tuple[NumberFormat, Callable | None], ...]] = {}


def lowers(*aten_targets: Any, formats: Sequence[NumberFormat] = INT8_ONLY,
           when: dict[NumberFormat, Callable] | None = None) -> Callable:
    """Decorator for a lowering rule: ``fn(match) -> torch.fx.Node`` replaces a quantized ATen op
    (``torch.ops.aten.conv2d.default``, ...) by Corten ops.  The rule lives in the op family module
    of the ops it produces; :mod:`corten.lowering` finds it here.

    ``formats``: the :class:`NumberFormat` s the rule lowers (default int8 only; e.g. ``(A8W8,
    A16W8)`` for an op with 16x8 kernels, ``A8W4`` for int4 weights); ``when``: a format's further
    condition on the ATen node (``{A8W4: fn(node) -> bool}``).  The quantizer gives a node only a
    format its rule lowers (:func:`lowers_format`) and the lowering refuses the others."""
    when = dict(when or {})
    unknown = [f for f in when if f not in formats]
    if unknown:
        raise ValueError(f"when= names formats the rule does not lower: {unknown}")

    def deco(fn: Callable) -> Callable:
        for t in aten_targets:
            if t in _LOWERINGS:
                raise ValueError(f"two lowering rules for {t}")
            _LOWERINGS[t] = fn
            _FORMATS[t] = tuple((NumberFormat(*f), when.get(f)) for f in formats)
        return fn

    return deco


def lowers_format(node: Any, act: torch.dtype = torch.int8, weight: torch.dtype = torch.int8) -> bool:
    """Whether the lowering rule of ``node``'s target (an ATen node, or the target itself) handles
    activations of dtype ``act`` with weights of dtype ``weight`` (its ``when`` condition, if any,
    asked of the node; given only a target, the format's condition is not asked)."""
    target = getattr(node, "target", node)
    for fmt, cond in _FORMATS.get(target, ()):
        if fmt == (act, weight) and (cond is None or target is node or bool(cond(node))):
            return True
    return False


def formats_of(aten_target: Any) -> tuple[NumberFormat, ...]:
    """The number formats the lowering rule of ``aten_target`` handles (() without a rule)."""
    return tuple(f for f, _ in _FORMATS.get(aten_target, ()))


def lowering_rule(aten_target: Any) -> Callable | None:
    return _LOWERINGS.get(aten_target)


def lowered_aten_ops() -> list[Any]:
    """The ATen ops with a lowering rule (not the pseudo-targets such as ``"requantize"``)."""
    return [t for t in _LOWERINGS if not isinstance(t, str)]


_ATEN_REWRITES: list[Callable] = []


def rewrites_aten(aten_pass: Callable) -> Callable:
    """Register an ATen-level rewrite ``pass(gm) -> PassResult`` that an op family needs before
    quantization (e.g. ``aten.lstm.input`` split into per-layer nodes); the quantizer runs these
    after Corten's ATen passes, in registration order."""
    _ATEN_REWRITES.append(aten_pass)
    return aten_pass


def aten_rewrites() -> list[Callable]:
    return list(_ATEN_REWRITES)


@dataclass(frozen=True)
class Annotation:
    """How CortenQuantizer annotates one ATen op (declared by the op family that lowers it).

    ``kind``:
      * ``"weighted"`` - conv/linear-like: int8 activation input, per-channel symmetric weight
        (quantized along ``weight_axis``), int32 bias, int8 output after a fused activation;
      * ``"binary"``   - two int8 activation inputs, int8 output after a fused activation;
      * ``"unary"``    - one int8 activation input, an int8 output with its own qparams;
      * ``"fixed"``    - as unary, with output qparams fixed per activation dtype to ``fixed[dtype] =
        (scale, zero_point)`` (e.g. ``{torch.int8: ..., torch.int16: ...}``; a dtype not in it is
        not given to the op);
      * ``"shared"``   - output (and any further tensor inputs) share the first input's qparams.

    Which element types an op takes (int16 activations, int4 weights) is its lowering rule's
    ``formats`` (:func:`lowers`), not the annotation's.
    """

    kind: str
    weight_axis: int = 0
    fixed: dict | None = None


ANNOTATION_KINDS = ("weighted", "binary", "unary", "fixed", "shared")
_ANNOTATIONS: dict[Any, Annotation] = {}


def annotates(kind: str, *aten_targets: Any, weight_axis: int = 0,
              fixed: dict[torch.dtype, tuple[float, int]] | None = None) -> None:
    """Declare how the quantizer annotates ``aten_targets`` (see :class:`Annotation`)."""
    if kind not in ANNOTATION_KINDS:
        raise ValueError(f"annotation kind {kind!r} is not one of {ANNOTATION_KINDS}")
    if (kind == "fixed") != (fixed is not None):
        raise ValueError("fixed= (qparams per activation dtype) goes with kind 'fixed' only")
    for t in aten_targets:
        if t in _ANNOTATIONS:
            raise ValueError(f"two annotations for {t}")
        _ANNOTATIONS[t] = Annotation(kind, weight_axis, dict(fixed) if fixed is not None else None)


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


def hook_for(op_name: str, kind: Hook | str) -> Callable | None:
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


# ----------------------------------------------------------------------------- what "lowered" means
# The one definition the operator table, unlowered_ops(), the memory planner and the C generator
# share: a lowered program's call_function nodes are Corten ops or one of these ATen view ops
# (a byte alias, or a layout copy the generator emits itself).
_VIEW_TARGETS: set[Any] = {torch.ops.aten.reshape.default}


def register_view_target(target: Any) -> None:
    """Declare an ATen op that stays in lowered programs as a view (memory and codegen handle it)."""
    _VIEW_TARGETS.add(target)


def is_view_target(target: Any) -> bool:
    return target in _VIEW_TARGETS


def is_lowered_node(node: Any) -> bool:
    """True when the FX ``node`` may appear in a lowered program: a placeholder, get_attr or output,
    a Corten op, or a registered view op.  Anything else (a float ATen op, a ``quantized_decomposed``
    quantize/dequantize the lowering could not fold) means the program is not lowered."""
    if node.op != "call_function":
        return True
    return op_name_of(node.target) is not None or node.target in _VIEW_TARGETS


# ----------------------------------------------------------------------------- op metadata
@dataclass(frozen=True)
class Cost:
    """What one run of a node costs: multiply-accumulates and weight bytes (``Hook.COST``)."""

    macs: int = 0
    weight_bytes: int = 0


@dataclass(frozen=True)
class Window:
    """A node's window along H (``Hook.WINDOW``): output row ``r`` reads input rows
    ``r * stride - pads[0]`` .. ``+ dilation * (kernel - 1)``.  ``padding_arg`` names the schema
    argument holding ``[top, left(, bottom, right)]`` (a band rewrites it); None for row-wise ops
    (kernel 1, stride 1, no padding).  ``ceil_mode``: the last window may overhang by an amount that
    depends on the input height (such a node cannot run in bands)."""

    kernel: int = 1
    stride: int = 1
    dilation: int = 1
    pads: tuple[int, int, int, int] = (0, 0, 0, 0)  # top, left, bottom, right
    padding_arg: str | None = None
    ceil_mode: bool = False


ROW_WISE = Window()


def _value(node: Any) -> torch.Tensor:
    val = node.meta.get("val")
    if val is None and node.op == "get_attr":
        val = get_attr(node.graph.owning_module, node)
    return val


def node_shape(node: Any) -> tuple[int, ...]:
    """The shape of a node's value: its ``meta["val"]``, or the constant a ``get_attr`` names."""
    return tuple(int(d) for d in _value(node).shape)


def weight_bits(node: Any) -> int:
    """The width of a node's weights in the C constants: 4 for an op given ``weight_bits=4`` (int4
    values packed two per byte), else 8 x the weight's element size (0 for ops without weights)."""
    from corten.providers import weight_dtype

    dt = weight_dtype(node) if op_name_of(getattr(node, "target", None)) is not None else None
    if dt is None:
        return 0
    return 4 if dt == torch.int4 else 8 * torch.empty((), dtype=dt).element_size()


def constant_nbytes(node: Any, arg: Any, value: torch.Tensor) -> int:
    """The flash bytes of the constant ``value`` that ``node`` reads as its argument node ``arg``:
    its elements' bytes, or half of them rounded up for the int4 weight of a ``weight_bits=4`` op
    (the one definition the memory plan, the cost hooks and the constant writer agree on)."""
    n = int(value.numel())
    if weight_bits(node) == 4 and node_arg(node, "weight", None) is arg:
        return (n + 1) // 2
    return n * value.element_size()


def weighted_cost(node: Any, taps: int, weight: str = "weight") -> Cost:
    """The cost of an op computing each output value from ``taps`` products with its ``weight``
    constant: ``numel(output) * taps`` MACs, the weight's bytes (packed int4 weights: half)."""
    w_node = node_arg(node, weight)
    w = _value(w_node)
    out = 1
    for d in node_shape(node):
        out *= d
    return Cost(out * taps, constant_nbytes(node, w_node, w))


def _metadata(node: Any, kind: Hook) -> Callable | None:
    name = op_name_of(getattr(node, "target", None))
    return None if name is None else hook_for(name, kind)


def op_cost(node: Any) -> Cost:
    """The ``Hook.COST`` of a Corten op node (``Cost()`` for other nodes and ops without one)."""
    fn = _metadata(node, Hook.COST)
    return Cost() if fn is None else fn(node)


def op_window(node: Any) -> Window | None:
    """The ``Hook.WINDOW`` of a Corten op node, or None (the op cannot run in row bands)."""
    fn = _metadata(node, Hook.WINDOW)
    return None if fn is None else fn(node)


def accumulator_taps(node: Any) -> int | None:
    """The ``Hook.ACCUMULATOR_TAPS`` of a Corten op node, or None (no int32 accumulation to check)."""
    fn = _metadata(node, Hook.ACCUMULATOR_TAPS)
    return None if fn is None else fn(node)


def unused_args(node: Any) -> tuple[str, ...]:
    """The ``Hook.UNUSED_ARGS`` of a Corten op node: the arguments its kernel ignores (``()`` for other
    nodes and ops without the hook)."""
    fn = _metadata(node, Hook.UNUSED_ARGS)
    return () if fn is None else tuple(fn(node))
