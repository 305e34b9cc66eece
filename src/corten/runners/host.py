"""Build a model library with the host C compiler and run it natively."""
from __future__ import annotations

import hashlib

import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

from .common import (
    HARNESS_DIR, HARNESS_MAIN, INPUT_FILE, OUTPUT_FILE, WARNING_FLAGS, CRunError, CRunResult, CRunTimeout, Progress,
    compile_and_link, complete_defines, define_flags, include_flags, parse_harness_report, prepare_workdir,
    print_progress, read_output, run_captured, split_sources, tail
)

HOST_CC = "gcc"
HOST_TIMER = HARNESS_DIR / "timer_host.c"
HOST_BINARY = "corten_host_harness"


def host_compile_command(cflags: Sequence[str] = ("-O2",), cc: str = HOST_CC) -> list[str]:
    """The host compiler and its flags (no sources, no link)."""
    return [cc, *WARNING_FLAGS, *cflags]


def host_build_command(
    sources: Sequence[Path],
    include_dirs: Sequence[Path],
    defines: Mapping[str, str],
    binary: Path,
    cflags: Sequence[str] = ("-O2",),
    cc: str = HOST_CC,
    main: Path | None = None,
) -> list[str]:
    """The gcc command line that builds the host harness executable."""
    compile_units, link_inputs = split_sources(sources)
    return [
        *host_compile_command(cflags, cc),
        *include_flags([*include_dirs, HARNESS_DIR]),
        *define_flags(defines),
        *compile_units,
        str(main or HARNESS_MAIN),
        str(HOST_TIMER),
        *link_inputs,
        "-o",
        str(binary),
    ]


def run_on_host(
    sources: list[Path],
    include_dirs: list[Path],
    defines: dict[str, str],
    input_bytes: bytes,
    output_size: int,
    workdir: Path,
    cflags: Sequence[str] = ("-O2",),
    *,
    timeout_s: float = 600.0,
    check: bool = True,
    progress: Progress | None = print_progress,
    main: Path | None = None,
) -> CRunResult:
    """Compile sources + the harness with the host gcc (-std=c99 -Wall -Wextra -Werror) and run it.

    ``wall_s`` is the wall-clock time of the inference call alone, measured by the harness with
    clock_gettime(CLOCK_MONOTONIC). With ``check`` a non-zero model status raises CRunError;
    otherwise it is returned in ``status`` (with empty ``output``).
    """
    where = "host"
    workdir = prepare_workdir(Path(workdir), input_bytes)
    full_defines = complete_defines(defines, len(input_bytes), output_size, custom_main=main is not None)
    binary = workdir / HOST_BINARY
    if progress:
        progress(f"building host harness in {workdir}")
    command = host_build_command(sources, include_dirs, full_defines, binary, cflags, main=main)
    # Re-running the same library on another input reuses the binary (same command, same sources).
    key = hashlib.sha256("\0".join(command).encode()
                         + b"".join(Path(s).read_bytes() for s in sources if Path(s).is_file())).hexdigest()
    stamp = binary.with_name(binary.name + ".build-key")
    if binary.is_file() and stamp.is_file() and stamp.read_text() == key:
        build_log = ""
    else:
        build_log = compile_and_link(command, where)
        stamp.write_text(key)
    if progress:
        progress(f"running host harness {binary}")
    try:
        proc = run_captured([str(binary), INPUT_FILE, OUTPUT_FILE], workdir, timeout_s)
    except subprocess.TimeoutExpired:
        raise CRunTimeout(f"{where}: harness {binary} did not finish within {timeout_s} s") from None
    log = build_log + proc.stdout + proc.stderr
    report = parse_harness_report(proc.stdout)
    if report is None:
        raise CRunError(
            f"{where}: harness {binary} exited with code {proc.returncode} without a result "
            f"(crash or I/O error):\n{tail(log)}"
        )
    if report.status != 0:
        if check:
            raise CRunError(
                f"{where}: model {full_defines['CORTEN_RUN']} returned status {report.status}\n"
                f"{tail(log)}"
            )
        return CRunResult(b"", report.status, report.elapsed * 1e-9, None, log, where)
    output = read_output(workdir, output_size, where)
    return CRunResult(output, 0, report.elapsed * 1e-9, None, log, where)

