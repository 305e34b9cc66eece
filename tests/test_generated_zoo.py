"""Every zoo model with Corten's generated kernels (``kernels="generated"``, portable fallback: CI
has no CMSIS-NN): byte-exact on the host for the plain, DSP and Helium code paths (the libraries
of Cortex-M3, M4 and M55 builds compiled for the host, where the DSP primitives are C functions
and the Helium blocks their C equivalents), and on QEMU Cortex-M4 and M55 with the real intrinsics;
the steps say which provider runs each (and why the generator does not).  Reuses test_zoo_programs' programs."""
from __future__ import annotations

import pytest
import torch

from conftest import HOST_CFLAGS, ZOO_224, needs_gcc, needs_qemu
from test_zoo_programs import EXPECTED_OPS, compiled


def _params(names):
    return [pytest.param(n, marks=pytest.mark.slow) if n in ZOO_224 else n for n in names]


# the host runs the plain (M3) path of every model in C, and the DSP (M4) and Helium (M55) paths'
# C equivalents of the models without a 96x96 or 224x224 image input; the MobileNets run the DSP
# and Helium paths with the real instructions on QEMU below (their C equivalents on the host cost
# ~50 s of the suite and test the same per-layer code as the small models and test_generated_kernels)
MOBILENETS = ("mv2", "mv3-small", "mv2-0.35-96", "mv1-0.25-96")
HOST_CASES = [(n, t) for n in EXPECTED_OPS for t in ("cortex-m3", "cortex-m4", "cortex-m55")
              if n not in MOBILENETS or t == "cortex-m3"]


@needs_gcc
@pytest.mark.parametrize("name, target", [pytest.param(n, t, marks=pytest.mark.slow) if n in ZOO_224 else (n, t)
                                          for n, t in HOST_CASES])
def test_zoo_generated_byte_exact_on_host(name, target):
    prog, x = compiled(name)
    run = prog.c_run(x, on="host", kernels="generated", target=target, cflags=HOST_CFLAGS)
    assert all(torch.equal(a, b) for a, b in zip(run.outputs, prog.run_int8(x)))


@needs_qemu
@pytest.mark.parametrize("target", ["cortex-m4", "cortex-m55"])
@pytest.mark.parametrize("name", _params(EXPECTED_OPS))
def test_zoo_generated_byte_exact_on_qemu(name, target):
    prog, x = compiled(name)
    run = prog.c_run(x, on="qemu", kernels="generated", target=target)
    assert all(torch.equal(a, b) for a, b in zip(run.outputs, prog.run_int8(x)))


@needs_qemu
def test_generated_beats_portable_and_reports_choices():
    """On QEMU M4 the generated ds-cnn runs fewer instructions than the portable build, the same
    bytes, and its estimated cycles come with the run; each step says which kernel and why."""
    prog, x = compiled("ds-cnn")
    gen = prog.c_run(x, on="qemu", kernels="generated", target="cortex-m4", cycles=True)
    port = prog.c_run(x, on="qemu", kernels="portable", target="cortex-m4")
    assert all(torch.equal(a, b) for a, b in zip(gen.outputs, port.outputs))
    assert gen.instructions < 0.5 * port.instructions
    assert gen.cycles_estimate is not None and gen.instructions <= gen.cycles_estimate < 3 * gen.instructions
    steps = prog.kernel_choices("generated", "cortex-m4")
    convs = [s for s in steps if s.op in ("quantized_conv2d", "quantized_depthwise_conv2d", "quantized_avg_pool2d")]
    assert convs and all(s.provider == "generated" and s.kernel.startswith(f"{prog.name}_gen_") for s in convs)
    assert any(s.op == "quantized_avg_pool2d" and "average pool" in s.note for s in convs)


def test_per_layer_rule_yields_to_a_later_provider(monkeypatch):
    """The per-layer preference rule: the generator supports deep-ae's linear layers, and runs them
    unless YIELDS_TO names a later provider of the chain for their class on the core's ISA path; the
    chain then gives them to that provider, the reports say why; the planner chooses the same."""
    from corten.codegen import generated as gen
    from corten.providers import resolve_providers

    prog, _ = compiled("deep-ae")
    chain = ("generated", "cmsis-nn")
    assert [p.name for p in resolve_providers("generated+cmsis-nn")] == ["generated", "cmsis-nn", "portable"]
    steps = [s for s in prog.kernel_choices(chain, "cortex-m4") if s.op == "quantized_linear"]
    assert steps and all(s.provider == "generated" and "matrix-vector" in s.note for s in steps)
    monkeypatch.setitem(gen.YIELDS_TO, ("dsp", "matvec"), ("cmsis-nn",))
    steps = [s for s in prog.kernel_choices(chain, "cortex-m4") if s.op == "quantized_linear"]
    assert steps and all(s.provider == "cmsis-nn" and "yields to CMSIS-NN" in s.reason for s in steps)
    report = prog.choices_report("generated+cmsis-nn", "cortex-m4")
    assert "cmsis-nn" in report and "yields to CMSIS-NN" in report
    # without the named provider in the chain the generator keeps the layer; other ISA paths are unaffected
    assert all(s.provider == "generated" for s in prog.kernel_choices("generated", "cortex-m4")
               if s.op == "quantized_linear")
    assert all(s.provider == "generated" for s in prog.kernel_choices(chain, "cortex-m3")
               if s.op == "quantized_linear")
    plan = prog.memory_for(deployment=prog.deployment(chain, "cortex-m4"))
    assert plan.arena_bytes > 0
