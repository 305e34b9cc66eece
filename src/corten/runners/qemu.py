"""Build a model library with arm-none-eabi-gcc and run it on an emulated Cortex-M board.

Boards (QEMU 7.2 machine types; memory maps checked with ``info mtree``)::

    target      machine     core clock  VECTORS+CODE            CONST (weights)        RAM (data, bss/arena, heap, stack)
    cortex-m3   mps2-an385  25 MHz      SSRAM1 0x00000000 4 MiB PSRAM 0x21000000 16 MiB SSRAM2/3 0x20000000 4 MiB
    cortex-m4   mps2-an386  25 MHz      SSRAM1 0x00000000 4 MiB PSRAM 0x21000000 16 MiB SSRAM2/3 0x20000000 4 MiB
    cortex-m7   mps2-an500  25 MHz      SSRAM1 0x00000000 4 MiB PSRAM 0x60000000 16 MiB SSRAM2/3 0x20000000 4 MiB
    cortex-m33  mps2-an505  20 MHz      SSRAM1 0x10000000 4 MiB PSRAM 0x80000000 12 MiB PSRAM    0x80c00000 4 MiB
                                        (Secure alias; reset VTOR_S = 0x10000000)
    cortex-m55  mps3-an547  32 MHz      vectors: ITCM 0x0 512 KiB; code+const: DDR 0x60000000 64 MiB;
                                        RAM: SRAM 2 0x21000000 4 MiB

Instruction counting
--------------------
QEMU runs with ``-icount shift=0``: the virtual clock advances exactly 1 ns per executed guest
instruction. The harness reads SysTick (core clock, extended to 64 bits by counting wraps in the
SysTick exception) immediately before and after the ``<name>_run`` call, so

    instructions = elapsed_ticks * 1e9 / core_clock_hz      (50 per tick at 20 MHz, 40 at 25 MHz, 31.25 at 32 MHz)

Error: the reading is quantised to one tick (at most 50 / 40 / 31.25 instructions either way)
and includes a fixed overhead of ~25 instructions (tail of the first timer read, the call
sequence, head of the second read; counted from the M3 disassembly). Measured with a busy loop
of exactly 2N instructions (N = 1000 and N = 1e8): the reading minus 2N is +40 on the 25 MHz
boards, 0 on mps2-an505 (50-instruction ticks) and +31 on mps3-an547, i.e. the overhead rounded
to whole ticks, independent of N. SysTick wraps every 2^24 ticks (0.5-0.84 G instructions);
each wrap adds the ~5-instruction exception handler, < 1e-8 relative.
The count is instructions, not cycles: QEMU models no pipeline, caches or memory wait states.
"""
from __future__ import annotations

import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from ..errors import UnsupportedTargetError
from ..targets import TARGETS, Target, get_target
from .common import (
    HARNESS_DIR,
    HARNESS_MAIN,
    RUNNERS_DIR,
    WARNING_FLAGS,
    CBuildError,
    CRunError,
    CRunResult,
    CRunTimeout,
    Progress,
    compile_and_link,
    complete_defines,
    define_flags,
    include_flags,
    parse_harness_report,
    prepare_workdir,
    print_progress,
    read_output,
    split_sources,
    tail,
)

ARM_CC = "arm-none-eabi-gcc"
QEMU = "qemu-system-arm"
BOARDS_DIR = RUNNERS_DIR / "boards"
BOARD_SOURCES = (BOARDS_DIR / "startup.c", BOARDS_DIR / "timer_systick.c")
ELF_NAME = "corten_harness.elf"
MAP_NAME = "corten_harness.map"
ICOUNT_SHIFT = 0  # 2**0 ns of virtual time per instruction
NS_PER_INSTRUCTION = 2**ICOUNT_SHIFT


@dataclass(frozen=True)
class MemoryRegion:
    name: str
    origin: int
    size: int
    holds: str  # which sections the Corten linker script puts there


@dataclass(frozen=True)
class Board:
    """A QEMU machine that emulates one Cortex-M target, with Corten's linker script for it."""

    target: str  # Corten target name, e.g. "cortex-m55"
    machine: str  # qemu-system-arm -M value
    core_clock_hz: int  # SysTick clock (CLKSOURCE=1) in QEMU
    memory: tuple[MemoryRegion, ...]

    @property
    def linker_script(self) -> Path:
        return BOARDS_DIR / f"{self.machine}.ld"

    @property
    def instructions_per_tick(self) -> float:
        return 1e9 / (self.core_clock_hz * NS_PER_INSTRUCTION)

    def describe(self) -> str:
        return f"{self.target} on QEMU {self.machine}"


_KIB = 1024
_MIB = 1024 * 1024


def _mps2_memory(psram_origin: int) -> tuple[MemoryRegion, ...]:
    return (
        MemoryRegion("ZBT SSRAM1", 0x00000000, 4 * _MIB, "vector table, .text"),
        MemoryRegion("PSRAM", psram_origin, 16 * _MIB, ".rodata (weights), .data load image"),
        MemoryRegion("ZBT SSRAM2/3", 0x20000000, 4 * _MIB, ".data, .bss (arena), heap, stack"),
    )


BOARDS: dict[str, Board] = {
    b.target: b
    for b in (
        Board("cortex-m3", "mps2-an385", 25_000_000, _mps2_memory(0x21000000)),
        Board("cortex-m4", "mps2-an386", 25_000_000, _mps2_memory(0x21000000)),
        Board("cortex-m7", "mps2-an500", 25_000_000, _mps2_memory(0x60000000)),
        Board(
            "cortex-m33",
            "mps2-an505",
            20_000_000,
            (
                MemoryRegion("ZBT SSRAM1 (Secure alias)", 0x10000000, 4 * _MIB, "vector table, .text"),
                MemoryRegion("PSRAM", 0x80000000, 12 * _MIB, ".rodata (weights), .data image"),
                MemoryRegion("PSRAM", 0x80C00000, 4 * _MIB, ".data, .bss (arena), heap, stack"),
            ),
        ),
        Board(
            "cortex-m55",
            "mps3-an547",
            32_000_000,
            (
                MemoryRegion("ITCM", 0x00000000, 512 * _KIB, "vector table"),
                MemoryRegion("DDR", 0x60000000, 64 * _MIB, ".text, .rodata (weights), .data image"),
                MemoryRegion("SRAM 2", 0x21000000, 4 * _MIB, ".data, .bss (arena), heap, stack"),
            ),
        ),
    )
}


def runnable_targets() -> list[str]:
    return list(BOARDS)


def board_for(target: str) -> Board:
    """The QEMU board for a Corten target name; clear errors for unknown or board-less targets."""
    get_target(target)  # raises ValueError for names that are not Corten targets at all
    try:
        return BOARDS[target]
    except KeyError:
        raise UnsupportedTargetError(
            f"target {target!r} has no QEMU board; runnable targets: {', '.join(BOARDS)} "
            f"(all targets can still be built: {', '.join(TARGETS)})"
        ) from None


def float_abi_flags(target: Target) -> list[str]:
    """-mfpu/-mfloat-abi for a core: soft float without FPU, hard float ABI with one.

    ``fpu == "auto"`` (Cortex-M55/M85) lets -mcpu pick the FPU and MVE (Helium) extensions.
    """
    if target.fpu is None:
        return ["-mfloat-abi=soft"]
    if target.fpu == "auto":
        return ["-mfloat-abi=hard"]
    return [f"-mfpu={target.fpu}", "-mfloat-abi=hard"]


def arm_build_command(
    sources: Sequence[Path],
    include_dirs: Sequence[Path],
    defines: Mapping[str, str],
    board: Board,
    elf: Path,
    cflags: Sequence[str] = ("-O2",),
    main: Path | None = None,
) -> list[str]:
    """The arm-none-eabi-gcc command line that builds the board harness ELF."""
    target = get_target(board.target)
    compile_units, link_inputs = split_sources(sources)
    return [
        ARM_CC,
        *WARNING_FLAGS,
        *cflags,
        f"-mcpu={target.cpu}",
        "-mthumb",
        *float_abi_flags(target),
        "-ffunction-sections",
        "-fdata-sections",
        "--specs=rdimon.specs",  # newlib + semihosting syscalls (librdimon)
        "-nostartfiles",  # Corten's startup.c replaces rdimon-crt0/crti/crtn
        *include_flags([*include_dirs, HARNESS_DIR]),
        *define_flags(defines),
        *compile_units,
        str(main or HARNESS_MAIN),
        *(str(s) for s in BOARD_SOURCES),
        *link_inputs,
        f"-L{BOARDS_DIR}",
        f"-T{board.linker_script}",
        "-Wl,--gc-sections",
        f"-Wl,-Map={elf.with_name(MAP_NAME)}",
        "-o",
        str(elf),
    ]


def memory_hint(board: Board) -> str:
    """Explains a linker region overflow with the board's memory map."""
    regions = "; ".join(
        f"{r.name} 0x{r.origin:08x} {r.size // 1024} KiB: {r.holds}" for r in board.memory
    )
    return (
        f"the program does not fit the memory of {board.describe()} ({regions}); "
        "reduce the arena/weights or pick a board with more memory"
    )


def qemu_command(board: Board, elf: Path) -> list[str]:
    """qemu-system-arm command line: semihosting on the host filesystem, no UART, icount."""
    return [
        QEMU,
        "-M",
        board.machine,
        "-display",
        "none",
        "-monitor",
        "none",
        "-serial",
        "none",
        "-semihosting-config",
        "enable=on,target=native",
        "-icount",
        f"shift={ICOUNT_SHIFT},align=off,sleep=off",
        "-kernel",
        str(elf),
    ]


def run_on_qemu(
    sources: list[Path],
    include_dirs: list[Path],
    defines: dict[str, str],
    input_bytes: bytes,
    output_size: int,
    target: str,
    workdir: Path,
    timeout_s: float = 600.0,
    cflags: Sequence[str] = ("-O2",),
    *,
    check: bool = True,
    progress: Progress | None = print_progress,
    main: Path | None = None,
    cycles: bool = False,
) -> CRunResult:
    """Build sources + harness for ``target`` and run one inference on its QEMU board.

    ``wall_s`` is the host wall-clock time of the whole QEMU run; ``instructions`` counts the
    inference call alone (module docstring: method and error). Raises UnsupportedTargetError for
    targets without a board, CBuildError when the build fails, CRunTimeout after ``timeout_s``,
    and CRunError (naming target and board) on faults, missing output and, with ``check``, a
    non-zero model status (without ``check`` the status is returned with empty output).
    ``cycles``: also log the executed blocks and estimate the inference's cycles
    (:mod:`corten.runners.cycles`; ``result.cycles``, per step in a profile build).
    """
    board = board_for(target)
    where = board.describe()
    workdir = prepare_workdir(Path(workdir), input_bytes)
    full_defines = complete_defines(defines, len(input_bytes), output_size, custom_main=main is not None)
    elf = workdir / ELF_NAME
    if progress:
        progress(f"building {where} in {workdir}")
    try:
        build_log = compile_and_link(
            arm_build_command(sources, include_dirs, full_defines, board, elf, cflags, main=main), where
        )
    except CBuildError as exc:
        if "overflowed" in str(exc) or "will not fit" in str(exc) or "RAM overflow" in str(exc):
            raise CBuildError(f"{exc}\n{memory_hint(board)}") from None
        raise
    if progress:
        progress(f"running {where} (timeout {timeout_s:g} s)")
    command = qemu_command(board, elf)
    trace = workdir / "qemu_exec.log"
    if cycles:
        command += ["-d", "in_asm,exec,nochain", "-D", str(trace)]
    start = time.perf_counter()
    try:
        proc = subprocess.run(
            command,
            cwd=workdir,
            capture_output=True,
            text=True,
            stdin=subprocess.DEVNULL,
            timeout=timeout_s,
            check=False,
        )
    except FileNotFoundError:
        raise CRunError(f"{where}: {QEMU} not found; install qemu-system-arm") from None
    except subprocess.TimeoutExpired:
        raise CRunTimeout(
            f"{where}: QEMU did not finish within {timeout_s:g} s; raise timeout_s for big models"
        ) from None
    wall_s = time.perf_counter() - start
    log = build_log + proc.stdout + proc.stderr
    report = parse_harness_report(proc.stdout + proc.stderr)
    if report is None:
        raise CRunError(
            f"{where}: the harness reported no result (QEMU exit {proc.returncode}; a fault, "
            f"an I/O error or a crash).\ncommand: {' '.join(command)}\n{tail(log)}"
        )
    instructions = round(report.elapsed * board.instructions_per_tick)
    if report.status != 0:
        if check:
            raise CRunError(
                f"{where}: model {full_defines['CORTEN_RUN']} returned status {report.status}\n"
                f"{tail(log)}"
            )
        return CRunResult(b"", report.status, wall_s, instructions, log, where)
    output = read_output(workdir, output_size, where)
    estimate = None
    if cycles:
        from .cycles import estimate as estimate_cycles

        try:
            estimate = estimate_cycles(trace, target, full_defines["CORTEN_RUN"],
                                       full_defines.get("CORTEN_PROFILE_HOOK"))
        finally:
            trace.unlink(missing_ok=True)
    if progress:
        progress(f"{where}: {instructions:,} instructions, {wall_s:.2f} s wall")
    return CRunResult(output, 0, wall_s, instructions, log, where, estimate)
