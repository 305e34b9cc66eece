"""Every zoo model's int8 outputs, memory plans and generated C are pinned (tests/data/zoo_golden.json):
a refactor changes none of them (issue 20: "every zoo model's generated C, plan and outputs are
unchanged by the refactor").  Reuses the programs and libraries of tests/test_zoo_programs.py.

The calibration's float arithmetic is torch's CPU kernels, whose code paths depend on the CPU (its
vector ISA and vendor): another CPU can round an observer's range differently, and so change
scales, constants and outputs without any change to Corten.  So each record keeps the machine it
was made on, and the digests come in two kinds:

* machine-independent, compared everywhere: the memory plans (shapes and schedule only) and the
  *form* of the generated C (every numeric literal masked: names, calls, structs, array lengths);
* exact, compared on a machine like the recording one: the int8 outputs and the C byte for byte.

A change that means to alter the C or a plan re-records with
``CORTEN_RECORD_ZOO_GOLDEN=1 pytest tests/test_zoo_golden.py`` and says so in its commit.
"""
from __future__ import annotations

import hashlib
import json
import os
import platform
import re
from pathlib import Path

import pytest
import torch

from corten.runners.program_runner import ProgramRunner
from test_zoo_programs import EXPECTED_OPS, compiled


def library(name: str, kernels: str):
    """The program's emitted library (shared with test_zoo_programs' C runs when they ran first)."""
    prog, _ = compiled(name)
    if getattr(prog, "_runner", None) is None:
        prog._runner = ProgramRunner(prog)
    return prog._runner.library(kernels, prog.target)


GOLDEN = Path(__file__).parent / "data" / "zoo_golden.json"
RECORD = "CORTEN_RECORD_ZOO_GOLDEN"  # =1: (re)write GOLDEN from this run instead of comparing


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:20]


def _plan_digest(plan) -> str:
    rows = [f"arena {plan.arena_bytes}"]
    rows += [f"t {k} {a.region} {a.offset} {a.nbytes}" for k, a in sorted(plan.tensors.items())]
    rows += [f"s {k} {a.region} {a.offset} {a.nbytes}" for k, a in sorted(plan.scratch.items())]
    return _sha("\n".join(rows).encode())


def _c_digest(lib) -> str:
    """The model's own files (the shared corten_kernels/ are pinned by their own tests), the
    kernels-version check masked: a kernel edit changes that hash, not the model's C."""
    text = "".join(p.read_text() for p in (lib.header, lib.source, lib.constants_header, lib.constants))
    return _sha(re.sub(r"CORTEN_KERNELS_VERSION != 0x[0-9a-f]+UL", "CORTEN_KERNELS_VERSION != <v>", text).encode())


def _c_form_digest(lib) -> str:
    """The model's C with every numeric literal and every byte string (large int8 arrays) masked
    (what no CPU's float rounding changes)."""
    text = "".join(p.read_text() for p in (lib.header, lib.source, lib.constants_header, lib.constants))
    text = re.sub(r'"(\\x[0-9a-f]{2})+"', "<bytes>", text)
    return _sha(re.sub(r"(?<![A-Za-z0-9_.])-?(0x[0-9a-fA-F]+|[0-9][0-9.eE+-]*)[uUlLfF]*", "#", text).encode())


def machine() -> str:
    """What torch's float CPU kernels depend on: architecture, vector ISA, CPU vendor."""
    vendor = ""
    try:
        vendor = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                       if ln.startswith(("vendor_id", "CPU implementer"))), "")
    except OSError:
        pass
    return f"{platform.machine()} {torch.backends.cpu.get_cpu_capability()} {vendor or platform.processor()}"


EXACT = ("outputs", "c")  # compared only on a machine like the recording one


def _zoo_digest(name: str) -> dict:
    prog, x = compiled(name)
    got = {"machine": machine(), "outputs": [_sha(t.numpy().tobytes()) for t in prog.run_int8(x)],
           "plan": {k: _plan_digest(prog.memory_for(k)) for k in ("portable", "cmsis-nn")}}
    if name != "mv2":  # (20 MB of constants to write; its program, plan and outputs are pinned)
        libs = {k: library(name, k) for k in ("portable", "cmsis-nn")}
        got["c"] = {k: _c_digest(lib) for k, lib in libs.items()}
        got["c_form"] = {k: _c_form_digest(lib) for k, lib in libs.items()}
    return got


@pytest.mark.parametrize("name", list(EXPECTED_OPS))
def test_zoo_programs_plans_c_and_outputs_are_unchanged(name):
    """Every zoo model's int8 outputs, memory plans (both kernel flavours) and generated C (its own
    files, both flavours) hash as recorded in tests/data/zoo_golden.json.  A change that means to
    alter them (a new kernel call, another plan) re-records with CORTEN_RECORD_ZOO_GOLDEN=1 and says
    so in its commit; a refactor leaves them alone."""
    got = _zoo_digest(name)
    if os.environ.get(RECORD) == "1":
        data = json.loads(GOLDEN.read_text()) if GOLDEN.exists() else {}
        data[name] = got
        GOLDEN.parent.mkdir(exist_ok=True)
        GOLDEN.write_text(json.dumps(dict(sorted(data.items())), indent=1) + "\n")
        return
    want = json.loads(GOLDEN.read_text())[name]
    keys = [k for k in want if k != "machine" and (k not in EXACT or want["machine"] == got["machine"])]
    assert "plan" in keys and (name == "mv2" or "c_form" in keys)
    changed = [k for k in keys if got.get(k) != want[k]]
    assert not changed, (f"{name}: {', '.join(changed)} changed; if intended, re-record with {RECORD}=1 and say "
                         "why in the commit")
