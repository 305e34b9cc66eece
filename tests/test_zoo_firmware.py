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
import torch

from corten.codegen import KERNELS_DIR
from corten.runners.program_runner import ProgramRunner
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
            _check([*cmd, *STRICT, *includes, "-fsyntax-only", str(lib.source), str(lib.constants)], tmp_path)


# ----------------------------------------------------------------------------- memory per kernel flavour
@pytest.mark.parametrize("name", list(EXPECTED_OPS))
def test_arena_is_planned_for_the_kernel_flavour(name):
    """Portable kernels take no CMSIS-NN scratch (only an LSTM's own state buffers): the portable plan reserves none for zoo models.  The CMSIS-NN plan
    reserves, per step, exactly the bytes of CMSIS-NN's *_get_buffer_size* formula for that call on
    the target's ISA (the providers' scratch_bytes), and the emitted library hands each call
    exactly its planned buffer."""
    import re

    from corten.memory.tensors import analyse
    from corten.providers import CMSIS_NN, PORTABLE

    prog, _ = compiled(name)
    portable, cmsis = prog.memory_for("portable"), prog.memory_for("cmsis-nn")
    assert (portable.kernels, cmsis.kernels) == ("portable", "cmsis-nn")
    assert prog.memory is cmsis
    assert "portable kernels" in portable.report() and "cmsis-nn kernels" in cmsis.report()
    steps = analyse(prog.ep)
    want = {"scratch_bytes": {}, "portable_scratch_bytes": {}}
    for node, op in zip(steps.steps, steps.op_names):
        if op == "reshape_copy":
            continue
        cmsis_runs = CMSIS_NN.supports(node, prog.target) is None
        for kind, provider in (("scratch_bytes", CMSIS_NN if cmsis_runs else PORTABLE),
                               ("portable_scratch_bytes", PORTABLE)):
            n = int(provider.scratch_bytes(node, prog.target))
            if n:
                want[kind][node.name] = n
    # portable: only a portable kernel's own buffers (an LSTM's state; the one-channel temporary of an
    # in-place depthwise, issue 25), never CMSIS-NN scratch
    for k in portable.in_place_kernels:
        node = steps.steps[[n.name for n in steps.steps].index(k)]
        b, _, h, w = node.args[0].meta["val"].shape
        want["portable_scratch_bytes"][k] = b * h * w
    assert {k: a.nbytes for k, a in portable.scratch.items()} == want["portable_scratch_bytes"]
    assert all(op == "quantized_lstm" or k in portable.in_place_kernels
               for k, op in ((k, steps.op_names[[n.name for n in steps.steps].index(k)]) for k in portable.scratch))
    assert portable.arena_bytes <= cmsis.arena_bytes
    assert {k: a.nbytes for k, a in cmsis.scratch.items()} == want["scratch_bytes"]
    # the portable plan (in-place depthwise included) passes the independent plan checker: the program
    # re-run on the planned bytes (tests/test_banding.py), byte-exact
    from test_banding import replay_on_planned_bytes

    x = compiled(name)[1]
    want_outs = prog.ep.module()(x)
    want_outs = list(want_outs) if isinstance(want_outs, (tuple, list)) else [want_outs]
    outs = replay_on_planned_bytes(prog.ep, portable, [x])
    assert len(outs) == len(want_outs) and all(torch.equal(a, b) for a, b in zip(outs, want_outs))
    if name == "mv2":  # 20 MB of constants to write; the plan check above covers it
        return
    for kernels, plan in (("portable", portable), ("cmsis-nn", cmsis)):
        _, lib = library(name, kernels)
        assert lib.arena_bytes == plan.arena_bytes
        src = lib.source.read_text()
        # each scratch buffer is a named pointer declared from the plan: scratch_<module path> = act + offset
        declared = {n: int(o or 0) for n, o in re.findall(r"int8_t \*const (scratch_\w+) = act(?: \+ (\d+))?;", src)}
        given = sorted((declared[n], int(s)) for n, s in re.findall(r"\.buf = \(void \*\)(scratch_\w+), \.size = (\d+)", src))
        planned = sorted((a.offset, a.nbytes) for a in plan.scratch.values())
        assert set(given) <= set(planned)  # each CMSIS-NN context gets exactly its planned buffer
        assert {off for off, _ in planned} <= set(declared.values())
        assert all(re.search(rf"\(void \*\){n}\b", src) for n in declared)
        if kernels == "cmsis-nn":
            assert len(given) == len([1 for k in plan.scratch if "lstm" not in k])


def test_planned_flash_is_the_librarys_constant_arrays_for_each_flavour(tmp_path):
    """A plan's constant_bytes is the flash its deployment's library defines: the generated kernels
    store their own weight layouts (pre-widened DSP words, Helium chunks, border copies), so their
    flash is counted as written, and a max_flash between the int8 weights and that refuses them."""
    from corten.errors import BudgetError

    prog, _ = compiled("ds-cnn")
    flash = {}
    for kernels, target in (("portable", "cortex-m4"), ("cmsis-nn", "cortex-m4"), ("generated", "cortex-m4"),
                            ("generated", "cortex-m55")):
        d = prog.deployment(kernels, target)
        lib = prog.emit_c(tmp_path / f"{kernels}-{target}", deployment=d)
        flash[kernels, target] = prog.memory_for(deployment=d).constant_bytes
        assert flash[kernels, target] == lib.constant_bytes
    assert flash["portable", "cortex-m4"] == flash["cmsis-nn", "cortex-m4"]
    assert flash["generated", "cortex-m4"] > flash["portable", "cortex-m4"]
    limit = flash["portable", "cortex-m4"]
    assert prog.fit_budget(max_flash=limit, deployment=prog.deployment("portable", "cortex-m4")) is prog
    with pytest.raises(BudgetError, match="flash"):
        prog.fit_budget(max_flash=limit, deployment=prog.deployment("generated", "cortex-m4"))


def test_ds_cnn_portable_arena_has_no_cmsis_scratch():
    """The issue's example: ds-cnn for M55 declared 19,824 B with portable kernels."""
    prog, _ = compiled("ds-cnn")
    assert prog.memory_for("portable").arena_bytes < prog.memory_for("cmsis-nn").arena_bytes == 19824
