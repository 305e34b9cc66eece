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
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Sequence

from corten.errors import UnsupportedTargetError, UsageError
from corten.providers import Provider, chain_label, resolve_providers
from corten.targets import Board, Target, get_target, no_board_message

DEFAULT_TARGET = "cortex-m55"
_UNSET: Any = object()


@dataclass(frozen=True)
class Deployment:
    """A core, its kernel providers (in order), its board and its memory budgets."""

    target: Target
    providers: tuple[Provider, ...]
    board: Board | None = None  # the QEMU board of runs on="qemu" (None: none emulates this core)
    max_arena: int | None = None  # bytes of RAM for the arena (scratch included)
    max_flash: int | None = None  # bytes of constant data

    @classmethod
    def of(cls, target: "str | Target | None" = None, kernels: "str | Provider | Sequence" = "portable", *,
           board: "Board | None" = _UNSET, max_arena: int | None = None, max_flash: int | None = None) -> "Deployment":
        """A deployment from the convenience strings: a target name (or :class:`Target`), a
        ``kernels`` provider name or sequence (:func:`corten.providers.resolve_providers`); the
        board defaults to the core's QEMU board."""
        tgt = get_target(target or DEFAULT_TARGET) if not isinstance(target, Target) else target
        for name, value in (("max_arena", max_arena), ("max_flash", max_flash)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value <= 0):
                raise UsageError(f"{name} must be a positive number of bytes, got {value!r}")
        return cls(tgt, resolve_providers(kernels), tgt.board if board is _UNSET else board, max_arena, max_flash)

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
    def key(self) -> tuple[str, tuple[str, ...]]:
        """What a memory plan or C library depends on: the core and the providers (not the board
        or the budgets)."""
        return self.core, tuple(p.name for p in self.providers)

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
        board = self.board.machine if self.board else "no QEMU board"
        return f"{self.core} ({self.isa}), {self.kernels} kernels, {board}" + (f", {', '.join(budgets)}" if budgets
                                                                                else "")
