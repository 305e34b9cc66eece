"""Shared pieces of the C runners: result type, errors, harness files and define handling.

The harness (``harness/main.c``) is generic over a model library exporting
``int <name>_run(const int8_t *input, int8_t *output, uint8_t *arena)``. It is configured with
the preprocessor defines built by :func:`harness_defines`, reads ``input.bin``, calls the model
once, writes ``output.bin`` and prints ``CORTEN_RESULT status=<s> elapsed=<n> unit=<ns|ticks>``.
"""
from __future__ import annotations

import hashlib
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from corten.errors import CBuildError, CRunError, CRunnerError, CRunTimeout  # noqa: F401  (re-exported)

RUNNERS_DIR = Path(__file__).resolve().parent
HARNESS_DIR = RUNNERS_DIR / "harness"
HARNESS_MAIN = HARNESS_DIR / "main.c"
INPUT_FILE = "input.bin"
OUTPUT_FILE = "output.bin"
REQUIRED_DEFINES = ("CORTEN_MODEL_HEADER", "CORTEN_RUN", "CORTEN_ARENA_BYTES")
WARNING_FLAGS = ("-std=c99", "-Wall", "-Wextra", "-Werror")
LOG_TAIL_CHARS = 4000

_RESULT_RE = re.compile(r"CORTEN_RESULT status=(-?\d+) elapsed=(\d+) unit=(\w+)")

Progress = Callable[[str], None]


def print_progress(message: str) -> None:
    """Default progress sink: one line on stderr, flushed (QEMU runs can take minutes)."""
    print(f"[corten] {message}", file=sys.stderr, flush=True)


@dataclass(frozen=True)
class CRunResult:
    """Outcome of one harness run.

    output: the model's output bytes (empty when the model returned a non-zero status).
    status: the value returned by ``<name>_run`` (0 = success).
    wall_s: host runs: wall-clock time of the inference call alone (clock_gettime around it);
        QEMU runs: host wall-clock time of the whole QEMU process (boot, file I/O, inference).
    instructions: QEMU runs: instructions executed by the inference call (see qemu.py for the
        method and its error); host runs: None.
    log: build and run output (stdout/stderr), for diagnostics.
    where: "host" or "<target> on QEMU <machine>".
    """

    output: bytes
    status: int
    wall_s: float
    instructions: int | None
    log: str
    where: str = "host"
    cycles: Any = None  # QEMU runs with cycles=True: the corten.runners.cycles.CycleEstimate


@dataclass(frozen=True)
class HarnessReport:
    status: int
    elapsed: int
    unit: str


def quote_header(header: str) -> str:
    """``net.h`` -> ``"net.h"`` (already quoted or <...> names are returned unchanged)."""
    header = header.strip()
    if header.startswith(('"', "<")):
        return header
    return f'"{header}"'


def harness_defines(
    header: str,
    run_function: str,
    input_bytes: int,
    output_bytes: int,
    arena_bytes: int,
    arena_align: int = 16,
) -> dict[str, str]:
    """The preprocessor defines the generic harness needs for one model library."""
    if arena_align <= 0 or arena_align & (arena_align - 1):
        raise ValueError(f"arena alignment must be a power of two, got {arena_align}")
    return {
        "CORTEN_MODEL_HEADER": quote_header(header),
        "CORTEN_RUN": run_function,
        "CORTEN_INPUT_BYTES": str(int(input_bytes)),
        "CORTEN_OUTPUT_BYTES": str(int(output_bytes)),
        "CORTEN_ARENA_BYTES": str(int(arena_bytes)),
        "CORTEN_ARENA_ALIGN": str(int(arena_align)),
    }


def complete_defines(
    defines: Mapping[str, str], input_size: int, output_size: int, custom_main: bool = False
) -> dict[str, str]:
    """Check the caller's defines and fill in the I/O sizes the runner knows.

    CORTEN_INPUT_BYTES / CORTEN_OUTPUT_BYTES default to len(input_bytes) / output_size and must
    agree with them when given; the model header is quoted if it was passed bare.
    """
    out = {str(k): str(v) for k, v in defines.items()}
    if custom_main:  # the caller's own main(): it defines what it needs
        return out
    missing = [name for name in REQUIRED_DEFINES if name not in out]
    if missing:
        raise ValueError(
            f"harness defines missing {', '.join(missing)}; build them with "
            "corten.runners.harness_defines(header, run_function, in_bytes, out_bytes, arena_bytes)"
        )
    out["CORTEN_MODEL_HEADER"] = quote_header(out["CORTEN_MODEL_HEADER"])
    for name, actual in (("CORTEN_INPUT_BYTES", input_size), ("CORTEN_OUTPUT_BYTES", output_size)):
        given = out.setdefault(name, str(actual))
        if int(given, 0) != actual:
            raise ValueError(f"{name}={given} in defines but the runner was given {actual} bytes")
    return out


LINK_INPUT_SUFFIXES = (".a", ".o", ".obj")


def split_sources(sources: Iterable[Path]) -> tuple[list[str], list[str]]:
    """(files to compile, prebuilt objects/archives); archives go last on the link line so that
    the linker sees the model's and the harness's undefined symbols before it scans them."""
    compile_units: list[str] = []
    link_inputs: list[str] = []
    for source in sources:
        (link_inputs if Path(source).suffix in LINK_INPUT_SUFFIXES else compile_units).append(str(source))
    return compile_units, link_inputs


def define_flags(defines: Mapping[str, str]) -> list[str]:
    return [f"-D{name}={value}" for name, value in defines.items()]


def include_flags(include_dirs: Iterable[Path]) -> list[str]:
    return [f"-I{Path(d)}" for d in include_dirs]


def prepare_workdir(workdir: Path, input_bytes: bytes) -> Path:
    """Create workdir, write input.bin and remove a stale output.bin."""
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / INPUT_FILE).write_bytes(bytes(input_bytes))
    (workdir / OUTPUT_FILE).unlink(missing_ok=True)
    return workdir


def tail(text: str, limit: int = LOG_TAIL_CHARS) -> str:
    return text if len(text) <= limit else "...\n" + text[-limit:]


def compile_and_link(command: Sequence[str], where: str) -> str:
    """Run one compiler command; raise CBuildError naming ``where`` on failure. Returns output."""
    try:
        proc = subprocess.run(
            list(command), capture_output=True, text=True, stdin=subprocess.DEVNULL, check=False
        )
    except FileNotFoundError as exc:
        raise CBuildError(
            f"cannot build for {where}: compiler {command[0]!r} not found ({exc}); install it "
            "(Debian: gcc, gcc-arm-none-eabi + libnewlib-arm-none-eabi)"
        ) from None
    output = proc.stdout + proc.stderr
    if proc.returncode != 0:
        raise CBuildError(
            f"build for {where} failed (exit {proc.returncode}).\ncommand: {' '.join(command)}\n"
            f"{tail(output)}"
        )
    return output


_OBJECT_DIR: tempfile.TemporaryDirectory | None = None
_OBJECTS: dict[str, Path] = {}


def _headers_digest(dirs: Iterable[Path]) -> bytes:
    h = hashlib.sha256()
    for d in sorted({Path(d) for d in dirs}):
        for header in sorted(d.glob("*.h")):
            h.update(header.name.encode() + b"\0" + header.read_bytes())
    return h.digest()


def cached_objects(sources: Iterable[Path], compile_command: Sequence[str], include_dirs: Sequence[Path] = (),
                   where: str = "kernels") -> list[Path]:
    """The object files of library ``sources`` (Corten's kernel files, a CMSIS-NN tree) compiled with
    ``compile_command`` (compiler and flags, without ``-c``/``-o``), each once per process for its
    content, the headers beside it and in ``include_dirs``, and the command: a program's own C is
    small, the kernel libraries are most of a build's time (Corten's kernels ~3 s for a Cortex-M,
    10-15 s under ASan; CMSIS-NN's ~100 files more) and do not depend on the program (no harness
    define reaches them).  Each file is its own translation unit either way: the objects are the ones
    a single compile-and-link command would make."""
    global _OBJECT_DIR
    if _OBJECT_DIR is None:
        _OBJECT_DIR = tempfile.TemporaryDirectory(prefix="corten-kernel-objects-")
    command = [*compile_command, *include_flags(include_dirs)]
    digests: dict[Path, bytes] = {}  # the headers of each source directory, read once per call
    objects = []
    for src in map(Path, sources):
        if src.parent not in digests:
            digests[src.parent] = _headers_digest([src.parent, *include_dirs])
        key = hashlib.sha256(b"\0".join([src.read_bytes(), digests[src.parent],
                                          "\0".join(command).encode()])).hexdigest()[:24]
        obj = _OBJECTS.get(key)
        if obj is None or not obj.exists():
            obj = Path(_OBJECT_DIR.name) / f"{src.stem}-{key}.o"
            compile_and_link([*command, f"-I{src.parent}", "-c", str(src), "-o", str(obj)], f"{where} ({src.name})")
            _OBJECTS[key] = obj
        objects.append(obj)
    return objects


def run_captured(command: Sequence[str], workdir: Path, timeout_s: float) -> subprocess.CompletedProcess:
    """Run a built harness (natively or under QEMU) in ``workdir``: text output captured, no stdin,
    at most ``timeout_s`` seconds (``subprocess.TimeoutExpired`` and ``FileNotFoundError`` reach the
    caller, which words them for its runner)."""
    return subprocess.run(list(command), cwd=workdir, capture_output=True, text=True, stdin=subprocess.DEVNULL,
                          timeout=timeout_s, check=False)


def parse_harness_report(text: str) -> HarnessReport | None:
    """The last CORTEN_RESULT line of the harness output, or None if there is none."""
    matches = _RESULT_RE.findall(text)
    if not matches:
        return None
    status, elapsed, unit = matches[-1]
    return HarnessReport(int(status), int(elapsed), unit)


def read_output(workdir: Path, output_size: int, where: str) -> bytes:
    path = Path(workdir) / OUTPUT_FILE
    if not path.exists():
        raise CRunError(f"{where}: the harness reported success but wrote no {path}")
    data = path.read_bytes()
    if len(data) != output_size:
        raise CRunError(f"{where}: {path} has {len(data)} bytes, expected {output_size}")
    return data
