"""Build a model library with arm-none-eabi-gcc and run it on an emulated Cortex-M board.

The boards (QEMU machine, core clock, memory map) are the ``board`` column of the one target table,
:data:`corten.targets.TARGETS`; their linker scripts are ``boards/<machine>.ld`` here.

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
from pathlib import Path

from ..deployment import Deployment
from ..errors import UnsupportedTargetError  # noqa: F401  (re-exported)
from ..targets import ICOUNT_SHIFT, TARGETS, Board, MemoryRegion, Target, board_for, get_target  # noqa: F401
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
    run_captured,
    split_sources,
    tail,
)

ARM_CC = "arm-none-eabi-gcc"
QEMU = "qemu-system-arm"
BOARDS_DIR = RUNNERS_DIR / "boards"
BOARD_SOURCES = (BOARDS_DIR / "startup.c", BOARDS_DIR / "timer_systick.c")
ELF_NAME = "corten_harness.elf"
MAP_NAME = "corten_harness.map"
# The boards of the target table (corten.targets.TARGETS), by target name.
BOARDS: dict[str, Board] = {t.name: t.board for t in TARGETS.values() if t.board is not None}


def linker_script(board: Board) -> Path:
    """Corten's linker script of ``board``."""
    return BOARDS_DIR / f"{board.machine}.ld"


def runnable_targets() -> list[str]:
    return list(BOARDS)


def float_abi_flags(target: Target) -> list[str]:
    """-mfpu/-mfloat-abi for a core: soft float without FPU, hard float ABI with one.

    ``fpu == "auto"`` (Cortex-M55/M85) lets -mcpu pick the FPU and MVE (Helium) extensions.
    """
    if target.fpu is None:
        return ["-mfloat-abi=soft"]
    if target.fpu == "auto":
        return ["-mfloat-abi=hard"]
    return [f"-mfpu={target.fpu}", "-mfloat-abi=hard"]


def arm_compile_command(board: Board, cflags: Sequence[str] = ("-O2",)) -> list[str]:
    """arm-none-eabi-gcc and the code-generation flags of ``board``'s core (no sources, no link)."""
    target = get_target(board.target)
    return [ARM_CC, *WARNING_FLAGS, *cflags, f"-mcpu={target.cpu}", "-mthumb", *float_abi_flags(target),
            "-ffunction-sections", "-fdata-sections"]


def arm_build_command(
    sources: Sequence[Path],
    include_dirs: Sequence[Path],
    defines: Mapping[str, str],
    board: Board,
    elf: Path,
    cflags: Sequence[str] = ("-O2",),
    main: Path | None = None,
    linker_dirs: Sequence[Path] = (),
) -> list[str]:
    """The arm-none-eabi-gcc command line that builds the board harness ELF (``linker_dirs``: searched
    before the boards' directory for the scripts sections.ld INCLUDEs)."""
    compile_units, link_inputs = split_sources(sources)
    return [
        *arm_compile_command(board, cflags),
        "--specs=rdimon.specs",  # newlib + semihosting syscalls (librdimon)
        "-nostartfiles",  # Corten's startup.c replaces rdimon-crt0/crti/crtn
        *include_flags([*include_dirs, HARNESS_DIR]),
        *define_flags(defines),
        *compile_units,
        str(main or HARNESS_MAIN),
        *(str(s) for s in BOARD_SOURCES),
        *link_inputs,
        *(f"-L{d}" for d in linker_dirs),
        f"-L{BOARDS_DIR}",
        f"-T{linker_script(board)}",
        "-Wl,--gc-sections",
        f"-Wl,-Map={elf.with_name(MAP_NAME)}",
        "-o",
        str(elf),
    ]


def board_memory_names(board: Board) -> set[str]:
    """The MEMORY regions and REGION_ALIAS names Corten's linker script of ``board`` defines."""
    import re

    text = linker_script(board).read_text()
    memory = re.search(r"MEMORY\s*\{(.*?)\}", text, re.S)
    names = set(re.findall(r"^\s*(\w+)\s*\(", memory.group(1), re.M)) if memory else set()
    return names | set(re.findall(r'REGION_ALIAS\("(\w+)"', text))


def write_run_linker_scripts(board: Board, fragment: Path, workdir: Path) -> Path:
    """The per-build linker scripts of a model library with memory regions or weights sections: the
    fragment (``<name>_sections.ld``) as ``corten_run_sections.ld`` and, for each MEMORY name it uses
    that the board's script lacks, a REGION_ALIAS onto the board's RAM (arena sections) or CONST
    (weights).  Returns the directory to put first on the -L path."""
    import re

    text = Path(fragment).read_text()
    known = board_memory_names(board)
    aliases = []
    for line in text.splitlines():
        m = re.match(r"^\S+ .*?> (\w+)", line)
        if m and m.group(1) not in known:
            memory = m.group(1)
            known.add(memory)
            home = "RAM" if "(NOLOAD)" in line else "CONST"
            aliases.append(f'REGION_ALIAS("{memory}", {home}); /* {board.machine} has no {memory}: its {home} */')
    out = Path(workdir) / "linker"
    out.mkdir(parents=True, exist_ok=True)
    (out / "corten_run_sections.ld").write_text(text)
    (out / "corten_run_aliases.ld").write_text("\n".join(aliases) + "\n")
    return out


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
    target: "str | Deployment",
    workdir: Path,
    timeout_s: float = 600.0,
    cflags: Sequence[str] = ("-O2",),
    *,
    check: bool = True,
    progress: Progress | None = print_progress,
    main: Path | None = None,
    cycles: bool = False,
    linker_fragment: Path | None = None,
) -> CRunResult:
    """Build sources + harness for ``target`` (a target name, or a :class:`corten.deployment.Deployment`
    and its board) and run one inference on its QEMU board.

    ``wall_s`` is the host wall-clock time of the whole QEMU run; ``instructions`` counts the
    inference call alone (module docstring: method and error). Raises UnsupportedTargetError for
    targets without a board, CBuildError when the build fails, CRunTimeout after ``timeout_s``,
    and CRunError (naming target and board) on faults, missing output and, with ``check``, a
    non-zero model status (without ``check`` the status is returned with empty output).
    ``cycles``: also log the executed blocks and estimate the inference's cycles
    (:mod:`corten.runners.cycles`; ``result.cycles``, per step in a profile build).
    ``linker_fragment``: the model library's ``<name>_sections.ld`` (memory-region arenas, weights
    sections), linked into the board's script (:func:`write_run_linker_scripts`).
    """
    board = target.require_board() if isinstance(target, Deployment) else board_for(target)
    where = board.describe()
    workdir = prepare_workdir(Path(workdir), input_bytes)
    full_defines = complete_defines(defines, len(input_bytes), output_size, custom_main=main is not None)
    elf = workdir / ELF_NAME
    linker_dirs = [write_run_linker_scripts(board, linker_fragment, workdir)] if linker_fragment else []
    if progress:
        progress(f"building {where} in {workdir}")
    try:
        build_log = compile_and_link(
            arm_build_command(sources, include_dirs, full_defines, board, elf, cflags, main=main,
                              linker_dirs=linker_dirs), where
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
        proc = run_captured(command, workdir, timeout_s)
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
            estimate = estimate_cycles(trace, board.target, full_defines["CORTEN_RUN"],
                                       full_defines.get("CORTEN_PROFILE_HOOK"))
        finally:
            trace.unlink(missing_ok=True)
    if progress:
        progress(f"{where}: {instructions:,} instructions, {wall_s:.2f} s wall")
    return CRunResult(output, 0, wall_s, instructions, log, where, estimate)
