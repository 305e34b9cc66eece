"""The kernel-provider API: who computes a node in C, with how much scratch, by which call.

A **provider** is a kernel library (Corten's portable C99 kernels, CMSIS-NN, Corten's generated
kernels, a vendor's library).  A build takes an ordered tuple of providers; for each node the first
one whose :meth:`Provider.supports` returns ``None`` runs it (the others' reasons are the node's
fallback report).  The memory planner reserves that provider's :meth:`Provider.scratch_bytes`, the
C generator writes its :meth:`Provider.emit`, and the step records (report, profile) read the
structured :class:`KernelCall` s of the returned :class:`KernelStep` - never the C text.

Two ways to write one:

* :class:`KernelProvider` - a table of kernels, each registered for (op, activation dtypes, weight
  dtypes, ISAs) with ``@provider.kernel(op, ...)``: its ``supports(node, target) -> None | reason``,
  its ``scratch(node, target) -> int`` and its ``emit(ctx) -> str``.  Portable and CMSIS-NN are
  two (:mod:`corten.providers.portable`, :mod:`corten.providers.cmsis_nn`); the op families
  register their kernels in them.  A provider from anywhere else registers kernels the same way,
  with no edit to any op family (``tests/test_providers.py`` claims ``quantized_add`` with a toy).
* a :class:`Provider` subclass overriding ``supports`` / ``scratch_bytes`` / ``emit`` (e.g. a
  generator of kernels that decides per node).

``emit`` gets the emission context (:class:`corten.codegen.context.EmitContext`: arguments by
schema name, buffers, constants, scratch, and the recording helpers ``ctx.params`` / ``ctx.dims``
/ ``ctx.call`` / ``ctx.invoke``); what it declares and calls through them becomes the step's
:class:`KernelCall` list.  Extra C sources of a provider (its own kernels) come from
:meth:`Provider.sources` and are compiled with the model.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable, Sequence

import torch

from corten.errors import CodegenError, UsageError
from corten.fx_nodes import node_arg


# ----------------------------------------------------------------------------- structured calls
@dataclass(frozen=True)
class ParamStruct:
    """A ``const`` parameter struct a kernel call takes: ``const <ctype> <name> = {<fields>};``."""

    ctype: str
    name: str
    fields: dict  # field -> int, C expression (str) or nested dict


@dataclass(frozen=True)
class KernelCall:
    """One call of a kernel function: its name, arguments (C expressions) and the parameter
    structs declared for it.  ``checked``: wrapped in the generated error check (the function
    returns 0 on success)."""

    function: str
    args: tuple[str, ...]
    structs: tuple[ParamStruct, ...] = ()
    checked: bool = True

    @property
    def expr(self) -> str:
        return f"{self.function}({', '.join(self.args)})"


@dataclass(frozen=True)
class KernelStep:
    """What a provider emits for one node: the calls (in order) and their C statements (the structs,
    the calls and whatever loop or pointer arithmetic the kernel needs around them)."""

    provider: str
    calls: tuple[KernelCall, ...]
    code: str
    uses_portable: bool = False  # the calls include Corten's portable helpers of the node's family
    note: str = ""  # how the kernel computes the step, for the reports (e.g. a generated kernel's strategy)

    @property
    def kernel(self) -> str:
        """The step's (first) kernel function, ``"inline"`` for a step without calls."""
        return self.calls[0].function if self.calls else "inline"


# ----------------------------------------------------------------------------- node facts
def tensor_dtype(value: Any) -> torch.dtype | None:
    val = value.meta.get("val") if isinstance(value, torch.fx.Node) else None
    return val.dtype if isinstance(val, torch.Tensor) else None


def activation_dtype(node: torch.fx.Node) -> torch.dtype | None:
    """The element type of the node's activation input: its first tensor argument that is not a
    weight (``torch.int8``, ``torch.int16``; ``torch.float32`` for a program-edge quantize)."""
    for a in node.args:
        items = a if isinstance(a, (list, tuple)) else (a,)
        for x in items:
            dt = tensor_dtype(x)
            if dt is not None:
                return dt
    return None


def weight_dtype(node: torch.fx.Node) -> torch.dtype | None:
    """The element type of the node's ``weight`` argument (None for ops without one):
    ``torch.int4`` for an op given ``weight_bits=4`` (int4 values held in an int8 tensor, packed
    two per byte in C), else the tensor's dtype."""
    names = [a.name for a in node.target._schema.arguments]
    if "weight" not in names:
        return None
    if "weight_bits" in names and int(node_arg(node, "weight_bits")) == 4:
        return torch.int4
    return tensor_dtype(NodeView(node).arg("weight"))


# The element types of the C kernels: a kernel's name ends in its element type's suffix
# (``corten_add_s8`` / ``_s16``, ``corten_conv2d_s4`` for int4 weights), and an activation buffer
# (an ``int8_t *`` into the arena) is cast to its element type's pointer.
KERNEL_SUFFIXES = {torch.int8: "s8", torch.int16: "s16", torch.int4: "s4"}
C_ELEMENT_TYPES = {torch.int8: "int8_t", torch.int16: "int16_t", torch.int32: "int32_t", torch.int64: "int64_t"}


def kernel_suffix(dtype: torch.dtype | None) -> str:
    """``"s8"``, ``"s16"`` or ``"s4"``: the suffix of the C kernels of ``dtype`` elements."""
    try:
        return KERNEL_SUFFIXES[dtype]
    except KeyError:
        raise CodegenError(f"no C kernels for {dtype} elements (one of {_dtype_names(KERNEL_SUFFIXES)})") from None


def element_pointer(expr: str, dtype: torch.dtype | None, const: bool = False) -> str:
    """The arena buffer expression ``expr`` (an ``int8_t *``) as a pointer to ``dtype`` elements
    (``expr`` itself for int8)."""
    if dtype in (None, torch.int8):
        return expr
    ctype = C_ELEMENT_TYPES[dtype]
    return f"(const {ctype} *)(const void *){expr}" if const else f"({ctype} *)(void *){expr}"


def op_of(node: torch.fx.Node) -> str:
    """The Corten op name of a node (``quantized_add``)."""
    return node.target._schema.name.split("::", 1)[1]


def nhwc(shape: Sequence[int]) -> tuple[int, int, int, int]:
    """Logical NCHW shape of a 4-D activation -> its memory-order dims (n, h, w, c)."""
    shape = tuple(int(d) for d in shape)
    if len(shape) == 4:
        n, c, h, w = shape
        return n, h, w, c
    raise CodegenError(f"expected a 4-D activation, got shape {shape}")


class NodeView:
    """What a kernel's checks read of a node: arguments by schema name, shapes, the op name and the
    target.  ``supports(node, target)`` functions wrap the node in one (``NodeView(node, target)``);
    the emission context (:class:`corten.codegen.context.EmitContext`) is one too, so the same
    helpers serve both."""

    def __init__(self, node: torch.fx.Node, target: Any = None) -> None:
        self.node, self.target, self.op_name = node, target, op_of(node)

    def arg(self, name: str) -> Any:
        """The node's argument ``name`` (schema order), positional or keyword."""
        try:
            return node_arg(self.node, name)
        except KeyError:
            raise CodegenError(f"node {self.node.name!r} ({self.op_name}) has no argument {name!r}") from None

    def shape(self, node: torch.fx.Node | None = None) -> tuple[int, ...]:
        """Logical (torch) shape of ``node`` (default: this node's output)."""
        return tuple(int(d) for d in (node or self.node).meta["val"].shape)

    def nhwc(self, node: torch.fx.Node | None = None) -> tuple[int, int, int, int]:
        return nhwc(self.shape(node))

    def dtype(self, name: str = "input") -> torch.dtype | None:
        """The element type of the tensor argument ``name``."""
        return tensor_dtype(self.arg(name))

    def fail(self, msg: str) -> None:
        raise CodegenError(f"{self.op_name} node {self.node.name!r}: {msg}")


# ----------------------------------------------------------------------------- providers
class Provider:
    """A kernel library (see the module docstring).  Subclasses override the methods."""

    name: str = ""
    title: str = ""  # how reports name it ("CMSIS-NN")
    links_cmsis_nn: bool = False  # the library's build links CMSIS-NN (CMSIS_NN_PATH)
    # the provider stores constants in layouts of its own (not only the program's int8 tensors): a
    # plan's flash (Program.memory_for) then counts the arrays its library defines
    own_constant_layouts: bool = False

    def supports(self, node: torch.fx.Node, target: Any) -> str | None:
        """None when this provider computes ``node`` on ``target`` (a :class:`corten.targets.Target`
        or :class:`corten.deployment.Deployment`), else why not (the fallback report shows it)."""
        return f"{self.title or self.name} has no kernel for {op_of(node)}"

    def scratch_bytes(self, node: torch.fx.Node, target: Any) -> int:
        """Bytes of scratch buffer this provider's kernel for ``node`` needs (the memory plan reserves them)."""
        return 0

    def yields_to(self, node: torch.fx.Node, target: Any, later: Sequence["Provider"]) -> str | None:
        """The per-layer preference rule: ``supports`` cannot see the rest of the chain, so once this
        provider supports ``node``, :func:`choose_provider` asks it whether it lets one of the
        ``later`` providers (those after it in the chain) run the node instead because that one is
        faster for this layer.  None: this provider runs it; else the reason (naming the later
        provider, which must support the node), shown by the reports as the step's reason."""
        return None

    def emit(self, ctx: Any) -> KernelStep:
        """The step computing ``ctx.node`` (only called for nodes :meth:`supports` accepts)."""
        raise NotImplementedError(f"provider {self.name!r} does not emit C")

    def in_place_scratch(self, node: torch.fx.Node, target: Any) -> int | None:
        """When this provider has a kernel for ``node`` that writes its output over its first
        input's bytes (output starting at the input's first byte; e.g. a depthwise conv channel by
        channel): the bytes of the temporary that kernel needs; None when it has none.  The memory
        planner uses it where the input dies at the node and the plan gets smaller."""
        return None

    def emit_in_place(self, ctx: Any) -> KernelStep:
        """The step computing ``ctx.node`` over its input (nodes :meth:`in_place_scratch` accepts)."""
        raise NotImplementedError(f"provider {self.name!r} has no in-place kernel")

    def includes(self, name: str) -> tuple[str, ...]:
        """``#include`` lines the ``.c`` of model ``name`` needs when this provider runs a step (or
        leads the build)."""
        return ()

    def sources(self, name: str, steps: Sequence[KernelStep]) -> dict[str, str]:
        """Extra C files (file name -> text) written next to model ``name`` and compiled with it,
        given the steps this provider emitted (e.g. generated kernels).  None by default."""
        return {}

    def __repr__(self) -> str:
        return f"<kernel provider {self.name!r}>"


EmitFn = Callable[[Any], str]
SupportsFn = Callable[[torch.fx.Node, Any], "str | None"]
ScratchFn = Callable[[torch.fx.Node, Any], int]


@dataclass(frozen=True)
class Kernel:
    """One registered kernel of a :class:`KernelProvider` (``None`` filters match anything)."""

    op: str
    emit: EmitFn
    act: tuple[torch.dtype, ...] | None = None  # activation element types
    weight: tuple[torch.dtype, ...] | None = None  # weight element types
    isas: tuple[str, ...] | None = None  # "plain", "dsp", "mve"
    supports: SupportsFn | None = None  # further conditions: None | reason
    scratch: ScratchFn | None = None  # scratch bytes (0 without)

    def matches(self, node: torch.fx.Node, target: Any) -> bool:
        return ((self.act is None or activation_dtype(node) in self.act)
                and (self.weight is None or weight_dtype(node) in self.weight)
                and (self.isas is None or getattr(target, "isa", None) in self.isas))


def _dtype_names(dts: Iterable[torch.dtype]) -> str:
    return "/".join(str(d).replace("torch.", "") for d in dts)


class KernelProvider(Provider):
    """A provider made of registered kernels (see the module docstring).  Kernels of one op are
    tried in registration order: the first whose dtypes and ISA match and whose ``supports``
    accepts the node runs it."""

    def __init__(self, name: str, title: str = "", links_cmsis_nn: bool = False,
                 includes: Sequence[str] = ()) -> None:
        self.name, self.title, self.links_cmsis_nn = name, title or name, links_cmsis_nn
        self._includes = tuple(includes)
        self._kernels: dict[str, list[Kernel]] = {}
        self._in_place: dict[str, list[Kernel]] = {}  # kernels writing the output over the first input
        self._declines: dict[str, SupportsFn] = {}

    # ------------------------------------------------------------------ registration
    def kernel(self, *ops: str, act: Sequence[torch.dtype] | None = None, weight: Sequence[torch.dtype] | None = None,
               isas: Sequence[str] | None = None, supports: SupportsFn | None = None,
               scratch: ScratchFn | None = None) -> Callable[[EmitFn], EmitFn]:
        """Decorator: ``emit(ctx) -> str`` is this provider's kernel for ``ops`` (activation dtypes
        ``act``, weight dtypes ``weight``, ``isas``; ``supports`` / ``scratch`` as in :class:`Kernel`)."""
        if not ops:
            raise ValueError(f"provider {self.name!r}: a kernel needs at least one op")
        return self._registrar(self._kernels, ops, act, weight, isas, supports, scratch)

    def in_place_kernel(self, *ops: str, act: Sequence[torch.dtype] | None = None,
                        weight: Sequence[torch.dtype] | None = None, isas: Sequence[str] | None = None,
                        supports: SupportsFn | None = None, scratch: ScratchFn | None = None
                        ) -> Callable[[EmitFn], EmitFn]:
        """Decorator: ``emit(ctx) -> str`` computes ``ops`` writing the output over the first input
        (:meth:`Provider.in_place_scratch`; ``scratch``: its temporary's bytes)."""
        return self._registrar(self._in_place, ops, act, weight, isas, supports, scratch)

    @staticmethod
    def _registrar(table: dict[str, list[Kernel]], ops: Sequence[str], act, weight, isas, supports, scratch
                   ) -> Callable[[EmitFn], EmitFn]:
        """The decorator adding ``emit`` as a :class:`Kernel` of each of ``ops`` to ``table``."""
        def deco(emit: EmitFn) -> EmitFn:
            for op in ops:
                table.setdefault(op, []).append(Kernel(
                    op, emit, tuple(act) if act is not None else None, tuple(weight) if weight is not None else None,
                    tuple(isas) if isas is not None else None, supports, scratch))
            return emit

        return deco

    def _choose_in_place(self, node: torch.fx.Node, target: Any) -> Kernel | None:
        for k in self._in_place.get(op_of(node), []):
            if k.matches(node, target) and (k.supports is None or k.supports(node, target) is None):
                return k
        return None

    def in_place_scratch(self, node: torch.fx.Node, target: Any) -> int | None:
        k = self._choose_in_place(node, target)
        if k is None:
            return None
        return int(k.scratch(node, target)) if k.scratch is not None else 0

    def emit_in_place(self, ctx: Any) -> KernelStep:
        k = self._choose_in_place(ctx.node, ctx.target)
        if k is None:
            ctx.fail(f"provider {self.name!r} has no in-place kernel for it")
        code = k.emit(ctx)
        return KernelStep(self.name, tuple(ctx.calls), code, ctx.uses_portable)

    def declines(self, *ops: str, reason: "str | SupportsFn") -> None:
        """Say why this provider has no kernel for ``ops``: a text or ``reason(node, target) -> str``
        (the fallback report's wording; without it: "<title> has no kernel for <op>")."""
        for op in ops:
            self._declines[op] = reason if callable(reason) else (lambda node, target, text=reason: text)

    def ops(self) -> list[str]:
        """The ops this provider has at least one kernel for."""
        return list(self._kernels)

    # ------------------------------------------------------------------ Provider
    def _choose(self, node: torch.fx.Node, target: Any) -> tuple[Kernel | None, str | None]:
        op = op_of(node)
        kernels = self._kernels.get(op, [])
        if not kernels:
            why = self._declines.get(op)
            return None, (why(node, target) if why else None) or f"{self.title} has no kernel for {op}"
        reasons = []
        for k in kernels:
            if not k.matches(node, target):
                continue
            reason = k.supports(node, target) if k.supports is not None else None
            if reason is None:
                return k, None
            reasons.append(reason)
        if reasons:
            return None, "; ".join(dict.fromkeys(reasons))
        why = self._declines.get(op)
        if why is not None:
            return None, why(node, target)
        wdt = weight_dtype(node)
        weights = f" and {_dtype_names([wdt])} weights" if wdt is not None else ""
        return None, (f"{self.title} has no {op} kernel for {_dtype_names([activation_dtype(node)])} activations"
                      f"{weights} on ISA {getattr(target, 'isa', '?')}")

    def supports(self, node: torch.fx.Node, target: Any) -> str | None:
        return self._choose(node, target)[1]

    def scratch_bytes(self, node: torch.fx.Node, target: Any) -> int:
        k, reason = self._choose(node, target)
        if k is None:
            raise ValueError(f"provider {self.name!r} cannot run {node.name!r}: {reason}")
        return int(k.scratch(node, target)) if k.scratch is not None else 0

    def emit(self, ctx: Any) -> KernelStep:
        k, reason = self._choose(ctx.node, ctx.target)
        if k is None:
            ctx.fail(f"provider {self.name!r} cannot run it: {reason}")
        code = k.emit(ctx)
        return KernelStep(self.name, tuple(ctx.calls), code, ctx.uses_portable)

    def includes(self, name: str) -> tuple[str, ...]:
        return self._includes


# ----------------------------------------------------------------------------- the registry
_PROVIDERS: dict[str, Provider] = {}


def register_provider(provider: Provider) -> Provider:
    """Make ``provider`` known by name (``kernels="<name>"`` in ``emit_c``, ``run_c``, the CLI)."""
    if not provider.name or not isinstance(provider.name, str):
        raise ValueError(f"a provider needs a name, got {provider.name!r}")
    old = _PROVIDERS.get(provider.name)
    if old is not None and old is not provider:
        raise ValueError(f"a kernel provider named {provider.name!r} is already registered")
    _PROVIDERS[provider.name] = provider
    return provider


def unregister_provider(name: str) -> None:
    """Forget the provider ``name`` (tests)."""
    _PROVIDERS.pop(name, None)


def provider_names() -> tuple[str, ...]:
    """The registered providers' names: the accepted ``kernels=`` values."""
    return tuple(_PROVIDERS)


def get_provider(name: str) -> Provider:
    try:
        return _PROVIDERS[name]
    except KeyError:
        raise UsageError(f"kernels must be one of {provider_names()} or a sequence of them, got {name!r}") from None


FALLBACK = "portable"  # the provider with a kernel for every op: the end of every chain


def resolve_providers(kernels: "str | Provider | Sequence[str | Provider]") -> tuple[Provider, ...]:
    """The ordered providers of a build: a name or provider means that one first, then Corten's
    portable kernels for whatever it does not support (``"cmsis-nn"`` -> CMSIS-NN, portable); a
    sequence - or names joined by ``+``, as :func:`chain_label` writes a chain - is taken as it is
    (portable appended when missing, so that every op has a kernel)."""
    if isinstance(kernels, str) and "+" in kernels:  # a chain by its label: "generated+cmsis-nn"
        kernels = tuple(kernels.split("+"))
    if isinstance(kernels, (str, Provider)):
        kernels = (kernels,)
    if not isinstance(kernels, (list, tuple)) or not kernels:
        raise UsageError(f"kernels must be one of {provider_names()} or a sequence of them, got {kernels!r}")
    chain: list[Provider] = []
    for k in kernels:
        p = get_provider(k) if isinstance(k, str) else k
        if not isinstance(p, Provider):
            raise UsageError(f"kernels: {k!r} is not a kernel provider (one of {provider_names()})")
        if p not in chain:
            chain.append(p)
    if all(p.name != FALLBACK for p in chain):
        chain.append(get_provider(FALLBACK))
    return tuple(chain)


def chain_label(providers: Sequence[Provider]) -> str:
    """The build's name in reports and generated comments: the leading provider's name when the
    rest is the portable fallback (``"cmsis-nn"``), else the names joined by ``+``."""
    names = [p.name for p in providers]
    if len(names) == 2 and names[1] == FALLBACK:
        return names[0]
    return "+".join(names)


def choose_provider(providers: Sequence[Provider], node: torch.fx.Node, target: Any) -> tuple[Provider, str]:
    """(the first provider supporting ``node`` and not yielding it to a later one - see
    :meth:`Provider.yields_to` -, why the ones before it do not run it - "" for the first).
    :class:`UsageError` when none does."""
    reasons = []
    for i, p in enumerate(providers):
        reason = p.supports(node, target)
        if reason is None:
            reason = p.yields_to(node, target, tuple(providers[i + 1:]))
        if reason is None:
            if len(reasons) == 1:
                return p, reasons[0][1]
            return p, "; ".join(f"{n}: {r}" for n, r in reasons)
        reasons.append((p.title or p.name, reason))
    raise UsageError(f"no kernel provider of {[p.name for p in providers]} runs node {node.name!r} "
                     f"({op_of(node)}): " + "; ".join(f"{n}: {r}" for n, r in reasons))
