"""Every zoo model's C library under a firmware engineer's checks: strict warnings with every
compiler we have (host gcc, clang, arm-none-eabi-gcc for Cortex-M4 and M55).

Reuses the programs (and their emitted libraries) of tests/test_zoo_programs.py in the same session.
Kept cheap: the shared kernels are compiled once per compiler (-O2 -c, so that warnings that need
the optimiser show up); each model's own files are checked with -fsyntax-only.
"""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from corten.codegen import KERNELS_DIR
from corten.runners.program import ProgramRunner
from test_zoo_programs import EXPECTED_OPS, compiled
from conftest import CMSIS_NN_PATH

STRICT = ("-std=c99", "-Wall", "-Wextra", "-Wpedantic", "-Wshadow", "-Wconversion", "-Wsign-conversion", "-Werror")
COMPILERS = {
    "gcc": ["gcc"],
    "clang": ["clang"],
    "arm-m4": ["arm-none-eabi-gcc", "-mcpu=cortex-m4", "-mthumb", "-mfloat-abi=hard", "-mfpu=fpv4-sp-d16"],
    "arm-m55": ["arm-none-eabi-gcc", "-mcpu=cortex-m55", "-mthumb", "-mfloat-abi=hard"],
}


def _compiler(key: str) -> list[str]:
    cmd = COMPILERS[key]
    if shutil.which(cmd[0]) is None:
        if key == "gcc":
            pytest.fail("the host gcc is required")
        pytest.skip(f"{cmd[0]} is not installed (scripts/setup.sh installs it)")
    return cmd


def _check(cmd: list[str], cwd: Path) -> None:
    res = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    assert res.returncode == 0, f"{' '.join(cmd[:12])} ...\n{res.stderr[-4000:]}"


def library(name: str, kernels: str):
    """The program's emitted library (shared with test_zoo_programs' C runs when they ran first)."""
    prog, _ = compiled(name)
    if getattr(prog, "_runner", None) is None:
        prog._runner = ProgramRunner(prog)
    return prog, prog._runner.library(kernels, prog.target)


@pytest.mark.parametrize("compiler", list(COMPILERS))
def test_shared_kernels_build_with_strict_warnings(compiler, tmp_path):
    cmd = _compiler(compiler)
    sources = sorted(str(p) for p in KERNELS_DIR.glob("*.c"))
    _check([*cmd, *STRICT, "-O2", "-c", *sources], tmp_path)


@pytest.mark.parametrize("name", list(EXPECTED_OPS))
def test_zoo_library_builds_with_strict_warnings(name, tmp_path):
    flavours = ["portable"] + (["cmsis-nn"] if CMSIS_NN_PATH else [])
    for kernels in flavours:
        _, lib = library(name, kernels)
        includes = [f"-I{lib.out_dir}"] + ([f"-I{Path(CMSIS_NN_PATH) / 'Include'}"] if kernels == "cmsis-nn" else [])
        for key in COMPILERS:
            cmd = COMPILERS[key]
            if shutil.which(cmd[0]) is None:
                continue
            # the constants file is arrays of literals: one compiler is enough (mv2's is 20 MB of text)
            sources = [str(lib.source)] + ([str(lib.constants)] if key == "gcc" else [])
            _check([*cmd, *STRICT, *includes, "-fsyntax-only", *sources], tmp_path)
