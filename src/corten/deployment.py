"""Where a program's C library runs and with what: a :class:`Deployment`.

One value instead of the ``target`` and ``kernels`` strings: the core (its gcc flags and ISA, from
the target table :data:`corten.targets.TARGETS`), the kernel providers in the order they are tried
for each node (:mod:`corten.providers`), the board that runs it (the core's QEMU board by default;
``None`` for a core Corten does not emulate) and the memory budgets (arena and constant bytes). The
memory planner, the C generator, the runners and :class:`corten.program.Program` take it; the
strings stay as conveniences that build one (``Deployment.of("cortex-m4", "cmsis-nn")``)::

    d = Deployment.of("cortex-m55", kernels="cmsis-nn", max_arena=256 * 1024)
    prog.emit_c("out/", deployment=d)
    prog.run_c(x, on="qemu", deployment=d)

The board's memory map for the arena (``memory=``, :class:`ArenaRegion`): several RAM regions
(DTCM, SRAM banks, external PSRAM), fastest first; the planner places every tensor and scratch
buffer in one of them and the C library declares one arena per region in its linker section.
``weights_section=``: the linker section of the constant arrays (one for all, or per module path
prefix).  Both are written to a GCC linker-script fragment ``<name>_sections.ld``.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Any, Mapping, Sequence

from corten.errors import UnsupportedTargetError, UsageError
from corten.providers import Provider, chain_label, resolve_providers
from corten.targets import Board, Target, get_target, no_board_message

DEFAULT_TARGET = "cortex-m55"
_UNSET: Any = object()
_SIZE_UNITS = {"": 1, "b": 1, "k": 1024, "kb": 1024, "kib": 1024, "m": 1024 * 1024, "mb": 1024 * 1024,
               "mib": 1024 * 1024}


@dataclass(frozen=True)
class ArenaRegion:
    """One RAM region of the board's memory map that holds part of the arena.

    ``size``: its bytes (None: no limit - "the rest"); ``rank``: speed, 0 the fastest (the planner
    fills faster regions first with hot, small buffers: scratch, then the smallest activations);
    ``section``: the linker section of its C buffer (default ``.bss.corten_<name>``); ``memory``: the
    linker ``MEMORY`` region the generated fragment puts that section in (default ``NAME``)."""

    name: str
    size: int | None
    rank: int = 0
    section: str | None = None
    memory: str | None = None

    @property
    def section_name(self) -> str:
        return self.section or f".bss.corten_{self.name}"

    @property
    def memory_name(self) -> str:
        return self.memory or self.name.upper()

    def to_json(self) -> dict:
        return {"name": self.name, "size": self.size, "rank": self.rank, "section": self.section,
                "memory": self.memory}


def parse_size(text: "str | int | None", what: str) -> int | None:
    """Bytes from an int or ``"32K"`` / ``"512KiB"`` / ``"4M"``; None / ``"rest"`` / ``"*"``: no limit."""
    if text is None or (isinstance(text, str) and text.strip().lower() in ("rest", "*", "")):
        return None
    if isinstance(text, bool):
        raise UsageError(f"{what}: size must be a number of bytes, got {text!r}")
    if isinstance(text, int):
        value = text
    else:
        m = re.fullmatch(r"\s*(\d+)\s*([A-Za-z]*)\s*", str(text))
        if m is None or m.group(2).lower() not in _SIZE_UNITS:
            raise UsageError(f"{what}: size {text!r} is not bytes ('65536', '64K', '1M' or 'rest')")
        value = int(m.group(1)) * _SIZE_UNITS[m.group(2).lower()]
    if value <= 0:
        raise UsageError(f"{what}: size must be positive, got {text!r}")
    return value


def _section_name_problem(section: object) -> str | None:
    if not isinstance(section, str) or not re.fullmatch(r"\.?[A-Za-z_][A-Za-z0-9_.]*", section):
        return f"{section!r} is not a linker section name (e.g. '.dtcm_bss', '.ext_flash')"
    return None


def parse_memory(spec: Any) -> tuple[ArenaRegion, ...]:
    """The arena's memory regions, fastest first, from ``memory=``:

    * ``{"dtcm": 64 * 1024, "sram": 512 * 1024}`` (insertion order = speed rank; a size of None or
      ``"rest"``: unlimited), values may be dicts ``{"size": ..., "rank": ..., "section": ...,
      "memory": ...}``;
    * a sequence of :class:`ArenaRegion` or ``(name, size)`` pairs;
    * the CLI string ``"dtcm=32K@.dtcm_bss,sram=rest"`` (``@section`` optional, ``:MEMORY`` after it
      optional: ``dtcm=32K@.dtcm_bss:DTCM``)."""
    if spec is None:
        return ()
    items: list[ArenaRegion] = []
    if isinstance(spec, str):
        for k, part in enumerate(p.strip() for p in spec.split(",") if p.strip()):
            m = re.fullmatch(r"([A-Za-z_]\w*)\s*(?:=\s*([^@:]*))?(?:@([^:]*))?(?::(\w+))?", part)
            if m is None:
                raise UsageError(f"memory region {part!r}: write NAME=SIZE[@SECTION][:MEMORY], e.g. "
                                 "'dtcm=32K@.dtcm_bss,sram=rest'")
            items.append(ArenaRegion(m.group(1), parse_size(m.group(2), f"memory region {m.group(1)!r}"), k,
                                     m.group(3) or None, m.group(4) or None))
    elif isinstance(spec, Mapping):
        for k, (name, value) in enumerate(spec.items()):
            if isinstance(value, Mapping):
                unknown = set(value) - {"size", "rank", "section", "memory"}
                if unknown:
                    raise UsageError(f"memory region {name!r}: unknown keys {sorted(unknown)} (size, rank, "
                                     "section, memory)")
                items.append(ArenaRegion(str(name), parse_size(value.get("size"), f"memory region {name!r}"),
                                         int(value.get("rank", k)), value.get("section"), value.get("memory")))
            else:
                items.append(ArenaRegion(str(name), parse_size(value, f"memory region {name!r}"), k))
    elif isinstance(spec, (list, tuple)):
        for k, value in enumerate(spec):
            if isinstance(value, ArenaRegion):
                items.append(value)
            elif isinstance(value, Mapping) and "name" in value:
                items.extend(parse_memory({value["name"]: {x: y for x, y in value.items() if x != "name"}}))
            elif isinstance(value, (list, tuple)) and len(value) == 2:
                items.append(ArenaRegion(str(value[0]), parse_size(value[1], f"memory region {value[0]!r}"), k))
            else:
                raise UsageError(f"memory[{k}] = {value!r}: give corten.ArenaRegion(name, size, ...) or a "
                                 "(name, size) pair")
    else:
        raise UsageError(f"memory= must be a dict {{name: size}}, a list of regions or a string "
                         f"'dtcm=32K,sram=rest', got {type(spec).__name__}")
    if not items:
        raise UsageError("memory= names no region")
    names = set()
    for r in items:
        if not re.fullmatch(r"[A-Za-z_]\w*", r.name):
            raise UsageError(f"memory region name {r.name!r} must be a C identifier (it names the C buffer)")
        if r.name in names:
            raise UsageError(f"memory region {r.name!r} is given twice")
        names.add(r.name)
        if r.section is not None and (problem := _section_name_problem(r.section)):
            raise UsageError(f"memory region {r.name!r}: section {problem}")
    if len({r.section_name for r in items}) != len(items):
        raise UsageError("memory regions must have distinct linker sections")
    return tuple(sorted(items, key=lambda r: r.rank))


def parse_weights_section(spec: Any) -> tuple[tuple[str, str], ...]:
    """``weights_section=``: one section for every constant array (``".ext_flash"``) or per module
    path prefix (``{"features": ".ext_flash", "classifier": ".itcm_rodata", "": ".rodata_slow"}``:
    the longest prefix matching a layer's module path at a dot boundary wins; "" matches all).
    The CLI form is ``".ext_flash"`` or ``"features=.ext_flash,classifier=.itcm_rodata"``."""
    if spec is None:
        return ()
    if isinstance(spec, str):
        if "=" in spec:
            spec = dict(part.split("=", 1) for part in spec.split(",") if part.strip())
        else:
            spec = {"": spec}
    if not isinstance(spec, Mapping):
        raise UsageError(f"weights_section must be a section name or {{module path prefix: section}}, got "
                         f"{type(spec).__name__}")
    rules = []
    for prefix, section in spec.items():
        if problem := _section_name_problem(section):
            raise UsageError(f"weights_section for {prefix!r}: {problem}")
        rules.append((str(prefix).strip(), section.strip()))
    return tuple(sorted(rules))


def weights_section_for(rules: "tuple[tuple[str, str], ...]", module_path: str) -> str | None:
    """The section of a constant of the layer at ``module_path`` (None: the default .rodata)."""
    best = None
    for prefix, section in rules:
        if prefix == "" or module_path == prefix or module_path.startswith(prefix + "."):
            if best is None or len(prefix) > len(best[0]):
                best = (prefix, section)
    return best[1] if best else None


@dataclass(frozen=True)
class Deployment:
    """A core, its kernel providers (in order), its board and its memory budgets."""

    target: Target
    providers: tuple[Provider, ...]
    board: Board | None = None  # the QEMU board of runs on="qemu" (None: none emulates this core)
    max_arena: int | None = None  # bytes of RAM for the arena (scratch included)
    max_flash: int | None = None  # bytes of constant data
    memory: tuple[ArenaRegion, ...] = ()  # the arena's RAM regions, fastest first (): one arena
    weights_sections: tuple[tuple[str, str], ...] = ()  # (module path prefix, linker section) of constants

    @classmethod
    def of(cls, target: "str | Target | None" = None, kernels: "str | Provider | Sequence" = "portable", *,
           board: "Board | None" = _UNSET, max_arena: int | None = None, max_flash: int | None = None,
           memory: Any = None, weights_section: Any = None) -> "Deployment":
        """A deployment from the convenience strings: a target name (or :class:`Target`), a
        ``kernels`` provider name or sequence (:func:`corten.providers.resolve_providers`); the
        board defaults to the core's QEMU board.  ``memory``: the arena's regions
        (:func:`parse_memory`); ``weights_section``: where constants go (:func:`parse_weights_section`)."""
        tgt = get_target(target or DEFAULT_TARGET) if not isinstance(target, Target) else target
        for name, value in (("max_arena", max_arena), ("max_flash", max_flash)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value <= 0):
                raise UsageError(f"{name} must be a positive number of bytes, got {value!r}")
        return cls(tgt, resolve_providers(kernels), tgt.board if board is _UNSET else board, max_arena, max_flash,
                   parse_memory(memory), parse_weights_section(weights_section))

    @classmethod
    def coerce(cls, deployment: "Deployment | str | Target | None", kernels: Any = None,
               default_kernels: Any = "portable") -> "Deployment":
        """``deployment`` itself, or one built from a target (name) and ``kernels`` (both optional)."""
        if isinstance(deployment, Deployment):
            if kernels is not None and resolve_providers(kernels) != deployment.providers:
                return deployment.with_kernels(kernels)
            return deployment
        return cls.of(deployment, default_kernels if kernels is None else kernels)

    # ------------------------------------------------------------------ views
    @property
    def core(self) -> str:
        """The target name ("cortex-m55")."""
        return self.target.name

    @property
    def isa(self) -> str:
        return self.target.isa

    @property
    def kernels(self) -> str:
        """The provider chain as reports name it ("cmsis-nn", "portable", "toy+cmsis-nn+portable")."""
        return chain_label(self.providers)

    @property
    def links_cmsis_nn(self) -> bool:
        return any(p.links_cmsis_nn for p in self.providers)

    @property
    def key(self) -> tuple:
        """What a memory plan or C library depends on: the core, the providers, the memory regions
        and the weights' sections (not the board or the budgets)."""
        key = (self.core, tuple(p.name for p in self.providers))
        return key + (self.memory, self.weights_sections) if self.memory or self.weights_sections else key

    def with_memory(self, memory: Any = None, weights_section: Any = _UNSET) -> "Deployment":
        """This deployment with other arena regions (None: one arena) and weights sections."""
        ws = self.weights_sections if weights_section is _UNSET else parse_weights_section(weights_section)
        return replace(self, memory=parse_memory(memory), weights_sections=ws)

    def with_kernels(self, kernels: Any) -> "Deployment":
        return replace(self, providers=resolve_providers(kernels))

    def with_target(self, target: "str | Target") -> "Deployment":
        tgt = get_target(target) if isinstance(target, str) else target
        return replace(self, target=tgt, board=tgt.board)

    def require_board(self) -> Board:
        """The board of a QEMU run: :class:`UnsupportedTargetError` naming the runnable targets when none."""
        if self.board is None:
            raise UnsupportedTargetError(no_board_message(self.core))
        return self.board

    def describe(self) -> str:
        budgets = [f"{n} {v:,} B" for n, v in (("arena", self.max_arena), ("flash", self.max_flash)) if v]
        budgets += [f"{r.name} {f'{r.size:,} B' if r.size else 'rest'}" for r in self.memory]
        board = self.board.machine if self.board else "no QEMU board"
        return f"{self.core} ({self.isa}), {self.kernels} kernels, {board}" + (f", {', '.join(budgets)}" if budgets
                                                                                else "")
