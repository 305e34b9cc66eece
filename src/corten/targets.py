"""Cortex-M targets: one table of each core's compiler flags, its instruction-set features (which
pick kernels and scratch sizes) and the QEMU board that emulates it, if any.

Boards (QEMU 7.2 machine types; memory maps checked with ``info mtree``; the linker scripts and the
run harness are in ``corten/runners/boards``)::

    target      machine     core clock  VECTORS+CODE            CONST (weights)        RAM (data, bss/arena, heap, stack)
    cortex-m3   mps2-an385  25 MHz      SSRAM1 0x00000000 4 MiB PSRAM 0x21000000 16 MiB SSRAM2/3 0x20000000 4 MiB
    cortex-m4   mps2-an386  25 MHz      SSRAM1 0x00000000 4 MiB PSRAM 0x21000000 16 MiB SSRAM2/3 0x20000000 4 MiB
    cortex-m7   mps2-an500  25 MHz      SSRAM1 0x00000000 4 MiB PSRAM 0x60000000 16 MiB SSRAM2/3 0x20000000 4 MiB
    cortex-m33  mps2-an505  20 MHz      SSRAM1 0x10000000 4 MiB PSRAM 0x80000000 12 MiB PSRAM    0x80c00000 4 MiB
                                        (Secure alias; reset VTOR_S = 0x10000000)
    cortex-m55  mps3-an547  32 MHz      vectors: ITCM 0x0 512 KiB; code+const: DDR 0x60000000 64 MiB;
                                        RAM: SRAM 2 0x21000000 4 MiB
"""
from __future__ import annotations

from dataclasses import dataclass

from corten.errors import UnsupportedTargetError, UsageError

ICOUNT_SHIFT = 0  # QEMU -icount shift: 2**0 ns of virtual time per instruction
NS_PER_INSTRUCTION = 2**ICOUNT_SHIFT


@dataclass(frozen=True)
class MemoryRegion:
    name: str
    origin: int
    size: int
    holds: str  # which sections the Corten linker script puts there


@dataclass(frozen=True)
class Board:
    """A QEMU machine that emulates one Cortex-M target (Corten's linker script for it:
    ``corten/runners/boards/<machine>.ld``)."""

    target: str  # Corten target name, e.g. "cortex-m55"
    machine: str  # qemu-system-arm -M value
    core_clock_hz: int  # SysTick clock (CLKSOURCE=1) in QEMU
    memory: tuple[MemoryRegion, ...]

    @property
    def instructions_per_tick(self) -> float:
        return 1e9 / (self.core_clock_hz * NS_PER_INSTRUCTION)

    def describe(self) -> str:
        return f"{self.target} on QEMU {self.machine}"


@dataclass(frozen=True)
class Target:
    name: str  # "cortex-m55"
    cpu: str  # gcc -mcpu value
    isa: str  # "plain" (no DSP extension), "dsp" (Armv7E-M / Armv8-M Main DSP) or "mve" (Helium)
    fpu: str | None  # gcc -mfpu value, None when the core has no FPU
    arch: str
    board: Board | None = None  # the QEMU board emulating this core (None: build only)

    @property
    def has_dsp(self) -> bool:
        return self.isa in ("dsp", "mve")

    @property
    def has_mve(self) -> bool:
        return self.isa == "mve"


_KIB = 1024
_MIB = 1024 * 1024


def _mps2(target: str, machine: str, psram_origin: int) -> Board:
    return Board(target, machine, 25_000_000, (
        MemoryRegion("ZBT SSRAM1", 0x00000000, 4 * _MIB, "vector table, .text"),
        MemoryRegion("PSRAM", psram_origin, 16 * _MIB, ".rodata (weights), .data load image"),
        MemoryRegion("ZBT SSRAM2/3", 0x20000000, 4 * _MIB, ".data, .bss (arena), heap, stack"),
    ))


TARGETS: dict[str, Target] = {
    t.name: t
    for t in (
        Target("cortex-m0", "cortex-m0", "plain", None, "armv6-m"),
        Target("cortex-m0plus", "cortex-m0plus", "plain", None, "armv6-m"),
        Target("cortex-m3", "cortex-m3", "plain", None, "armv7-m", _mps2("cortex-m3", "mps2-an385", 0x21000000)),
        Target("cortex-m4", "cortex-m4", "dsp", "fpv4-sp-d16", "armv7e-m",
               _mps2("cortex-m4", "mps2-an386", 0x21000000)),
        Target("cortex-m7", "cortex-m7", "dsp", "fpv5-d16", "armv7e-m", _mps2("cortex-m7", "mps2-an500", 0x60000000)),
        Target("cortex-m33", "cortex-m33", "dsp", "fpv5-sp-d16", "armv8-m.main", Board(
            "cortex-m33", "mps2-an505", 20_000_000, (
                MemoryRegion("ZBT SSRAM1 (Secure alias)", 0x10000000, 4 * _MIB, "vector table, .text"),
                MemoryRegion("PSRAM", 0x80000000, 12 * _MIB, ".rodata (weights), .data image"),
                MemoryRegion("PSRAM", 0x80C00000, 4 * _MIB, ".data, .bss (arena), heap, stack"),
            ))),
        Target("cortex-m55", "cortex-m55", "mve", "auto", "armv8.1-m.main", Board(
            "cortex-m55", "mps3-an547", 32_000_000, (
                MemoryRegion("ITCM", 0x00000000, 512 * _KIB, "vector table"),
                MemoryRegion("DDR", 0x60000000, 64 * _MIB, ".text, .rodata (weights), .data image"),
                MemoryRegion("SRAM 2", 0x21000000, 4 * _MIB, ".data, .bss (arena), heap, stack"),
            ))),
        Target("cortex-m85", "cortex-m85", "mve", "auto", "armv8.1-m.main"),
    )
}


def board_for(target: "str | Target") -> Board:
    """The QEMU board of a target (name); :class:`UnsupportedTargetError` naming the runnable
    targets for a core without one (UsageError for names that are not targets at all)."""
    tgt = get_target(target) if isinstance(target, str) else target
    if tgt.board is None:
        raise UnsupportedTargetError(no_board_message(tgt.name))
    return tgt.board


def no_board_message(name: str) -> str:
    runnable = [t.name for t in TARGETS.values() if t.board is not None]
    return (f"target {name!r} has no QEMU board; runnable targets: {', '.join(runnable)} "
            f"(all targets can still be built: {', '.join(TARGETS)})")


def get_target(name: str) -> Target:
    try:
        return TARGETS[name]
    except KeyError:
        raise UsageError(f"unknown target {name!r}; choose one of: {', '.join(TARGETS)}") from None
