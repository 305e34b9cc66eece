"""Memory regions (issue 25 item 1) and weights sections (item 2): the arena split over a board's RAM
regions, fastest first, each region's arena a C buffer in its linker section; constants in named
sections; the generated GCC linker-script fragment.

Plans are checked by the independent checkers of tests/test_memory.py (per region: every buffer
inside its region's arena, no two live buffers of one region sharing a byte, the program re-run on
one byte buffer per region) and run byte-exact in C, on QEMU Cortex-M55 with the arenas in the
board's DTCM and SRAM and the weights in its QSPI flash (read back from the linker map).
"""
from __future__ import annotations

import random
import re
import warnings
from pathlib import Path

import pytest
import torch

import corten
from corten.deployment import ArenaRegion, Deployment, parse_memory, parse_weights_section, weights_section_for
from corten.errors import BudgetError, UsageError
from corten.memory import check_budget, plan_memory

from conftest import needs_gcc, needs_qemu
from test_memory import RESIDUAL, Program, check_deployment_plan, export

KIB = 1024


def _plan(program: Program, memory, target="cortex-m55", kernels="cmsis-nn"):
    return check_deployment_plan(program, Deployment.of(target, kernels, memory=memory))


# ----------------------------------------------------------------------------- the spec
def test_memory_spec_forms():
    want = (ArenaRegion("dtcm", 32 * KIB, 0, ".dtcm_bss", "DTCM"), ArenaRegion("sram", None, 1))
    assert parse_memory("dtcm=32K@.dtcm_bss:DTCM,sram=rest") == want
    assert parse_memory({"dtcm": {"size": "32KiB", "section": ".dtcm_bss", "memory": "DTCM"}, "sram": None}) == want
    assert parse_memory([want[1], want[0]]) == want  # sorted by speed rank
    assert parse_memory([("a", 4096), ("b", "1M")]) == (ArenaRegion("a", 4096, 0), ArenaRegion("b", 1 << 20, 1))
    assert parse_memory(None) == ()
    r = parse_memory({"fast": 64})[0]
    assert (r.section_name, r.memory_name) == (".bss.corten_fast", "FAST")
    for bad, match in [("dtcm=12Q", "not bytes"), ({"a": 0}, "positive"), ({"a": 1, "b": {"sise": 2}}, "unknown"),
                       ([("a", 1), ("a", 2)], "twice"), ({"1x": 4}, "C identifier"), (42, "dict"),
                       ({"a": {"size": 4, "section": "bad section"}}, "linker section")]:
        with pytest.raises(UsageError, match=match):
            parse_memory(bad)


def test_weights_section_rules():
    assert parse_weights_section(".ext_flash") == (("", ".ext_flash"),)
    rules = parse_weights_section("features=.a,features.1=.b,=.c")
    assert weights_section_for(rules, "features.12.conv") == ".a"  # a dot boundary: not features.1
    assert weights_section_for(rules, "features.1.conv") == ".b"
    assert weights_section_for(rules, "classifier") == ".c"
    assert weights_section_for(parse_weights_section({"features": ".a"}), "head") is None
    with pytest.raises(UsageError, match="linker section"):
        parse_weights_section({"x": "no spaces allowed"})


# ----------------------------------------------------------------------------- plans
def test_two_regions_scratch_and_small_tensors_take_the_fast_one():
    program = Program((1, 3, 8, 8), RESIDUAL)
    _, one = _plan(program, None)
    ep, plan = _plan(program, {"fast": 1 * KIB, "slow": None})
    fast, slow = plan.regions
    assert (fast.name, fast.capacity, slow.capacity) == ("fast", 1 * KIB, None)
    assert 0 < fast.nbytes <= 1 * KIB and slow.nbytes > 0
    assert plan.arena_bytes == fast.nbytes + slow.nbytes
    assert min(plan.scratch.values(), key=lambda a: a.nbytes).memory == "fast"  # CMSIS-NN scratch is hottest
    assert all(a.memory == "fast" or a.nbytes + fast.nbytes > fast.capacity for a in plan.scratch.values())
    small = min((a for a in plan.tensors.values() if a.region == "arena"), key=lambda a: a.nbytes)
    assert small.memory == "fast"
    assert all(a.memory == "" for a in one.tensors.values()) and one.regions == []
    # one region with room for everything: today's plan's bytes
    _, roomy = _plan(program, {"only": None})
    assert roomy.regions[0].nbytes == one.arena_bytes


def test_random_programs_and_regions_pass_the_plan_checker():
    rng = random.Random(11)
    for trial in range(4):
        specs, channels = [], [3]
        for _ in range(7):
            src = rng.randrange(len(channels))
            same = [j for j, c in enumerate(channels) if c == channels[src] and j != src]
            if same and rng.random() < 0.3:
                specs.append(("add", src, rng.choice(same)))
                channels.append(channels[src])
            elif rng.random() < 0.4:
                specs.append(("dw", src, 3, 1, 1, 1))
                channels.append(channels[src])
            else:
                c, k = rng.choice([4, 8]), rng.choice([1, 3])
                specs.append(("conv", src, c, k, 1, (k - 1) // 2))
                channels.append(c)
        memory = {"r0": rng.choice([128, 512, 1024])}
        if rng.random() < 0.5:
            memory["r1"] = rng.choice([256, 2048])
        memory["rest"] = None
        _plan(Program((1, 3, 6, 6), specs, seed=trial), memory, rng.choice(["cortex-m3", "cortex-m4", "cortex-m55"]))


def test_region_that_does_not_fit_is_named():
    program = Program((1, 3, 8, 8), RESIDUAL)
    ep = export(program)
    plan = plan_memory(ep, Deployment.of("cortex-m55", "cmsis-nn", memory={"fast": 512, "slow": 1024}))
    assert plan.regions[-1].over > 0
    with pytest.raises(BudgetError, match=r"memory region 'slow' needs [\d,]+ B but has 1,024 B"):
        check_budget(plan, None, None)


def test_report_summary_and_plot_show_every_region(tmp_path):
    _, plan = _plan(Program((1, 3, 8, 8), RESIDUAL), "fast=1K@.dtcm_bss:DTCM,slow=rest")
    report = plan.report()
    assert re.search(r"region fast\s+[\d,]+ B\s+of 1,024 B, section \.dtcm_bss -> DTCM", report)
    assert re.search(r"region slow\s+[\d,]+ B\s+\(no limit\), section \.bss\.corten_slow -> SLOW", report)
    assert plan.summary()["regions"] == {r.name: r.nbytes for r in plan.regions}
    png = plan.plot(tmp_path / "mem.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# ----------------------------------------------------------------------------- C
class _Small(torch.nn.Module):
    def __init__(self):
        super().__init__()
        nn = torch.nn
        self.features = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 8, 3, padding=1, groups=8),
                                      nn.ReLU(), nn.Conv2d(8, 16, 1))
        self.classifier = nn.Linear(16 * 8 * 8, 5)

    def forward(self, x):
        return self.classifier(self.features(x).flatten(1))


@pytest.fixture(scope="module")
def small():
    torch.manual_seed(0)
    x = torch.randn(1, 3, 8, 8)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        prog = corten.compile(_Small().eval(), (x,), target="cortex-m55", name="small_regions",
                              memory={"fast": 1 * KIB, "slow": None},
                              weights_section={"features": ".ext_flash", "classifier": ".itcm_rodata"})
    return prog, x


def test_compile_keeps_regions_and_sections(small, tmp_path):
    prog, _ = small
    d = prog.deployment()
    assert [r.name for r in d.memory] == ["fast", "slow"] and dict(d.weights_sections)["features"] == ".ext_flash"
    assert [r.name for r in prog.memory.regions] == ["fast", "slow"]
    assert [r.name for r in prog.memory_for("portable").regions] == ["fast", "slow"]
    prog.save(tmp_path / "p")
    again = corten.load(tmp_path / "p")
    assert again.deployment().memory == d.memory and again.memory.regions == prog.memory.regions
    assert prog.with_memory(None).memory.regions == []


def test_emitted_library_declares_region_arenas_sections_and_fragment(small, tmp_path):
    prog, _ = small
    lib = prog.emit_c(tmp_path / "c", kernels="portable")
    assert lib.arena_bytes == 0 and [r.name for r in lib.regions] == ["fast", "slow"]
    h, c, k = lib.header.read_text(), lib.source.read_text(), lib.constants.read_text()
    plan = prog.memory_for("portable")
    for r in plan.regions:
        assert f"#define SMALL_REGIONS_ARENA_{r.name.upper()}_BYTES {r.nbytes}" in h
        assert f'#define SMALL_REGIONS_ARENA_{r.name.upper()}_SECTION "{r.section}"' in h
        assert (f"uint8_t small_regions_arena_{r.name}[SMALL_REGIONS_ARENA_{r.name.upper()}_BYTES] "
                f"SMALL_REGIONS_IN_SECTION(SMALL_REGIONS_ARENA_{r.name.upper()}_SECTION);") in c
    # each arena tensor's named pointer is in its planned region at its planned offset
    pointers = re.findall(r"= \(int8_t \*\)small_regions_arena_(\w+)(?: \+ (\d+))?; /\* \d+ B, node '(\w+)'", c)
    assert pointers
    for region, off, node in pointers:
        a = plan.tensors.get(node) or plan.scratch[node]
        assert (a.memory, a.offset) == (region, int(off or 0))
    assert re.search(r'small_regions_features_0_weight\[\d+\] CORTEN_CONST_ALIGNED CORTEN_SECTION\("\.ext_flash"\)', k)
    assert re.search(r'small_regions_classifier_weight\[\d+\] CORTEN_CONST_ALIGNED CORTEN_SECTION\("\.itcm_rodata"\)', k)
    frag = lib.linker_fragment.read_text()
    assert ".bss.corten_fast (NOLOAD) : ALIGN(16) { *(.bss.corten_fast) } > FAST" in frag
    assert ".ext_flash : ALIGN(16) { KEEP(*(.ext_flash)) } > EXT_FLASH" in frag
    assert ".itcm_rodata : ALIGN(16) { KEEP(*(.itcm_rodata)) } > ITCM_RODATA" in frag


@needs_gcc
def test_regions_host_c_byte_exact(small):
    prog, x = small
    run = prog.c_run(x, kernels="portable")
    assert all(torch.equal(a, b) for a, b in zip(prog.run_int8(x), run.outputs))


def _map_sections(prog) -> dict[str, int]:
    """Output section -> address in the last QEMU build's linker map."""
    maps = sorted(Path(prog._runner.workdir).glob("*/run-qemu/corten_harness.map"), key=lambda p: p.stat().st_mtime)
    text = maps[-1].read_text()
    return {m.group(1): int(m.group(2), 16)
            for m in re.finditer(r"^(\.[\w.]+)\s+(0x[0-9a-f]+)\s+0x[0-9a-f]+", text, re.M)}


def _qemu_two_regions(prog, x):
    run = prog.c_run(x, on="qemu", kernels="portable", target="cortex-m55")
    assert all(torch.equal(a, b) for a, b in zip(prog.run_int8(x), run.outputs))
    sections = _map_sections(prog)
    # mps3-an547: DTCM 0x20000000 (512 KiB), SRAM 2 0x21000000 (4 MiB), QSPI flash 0x28000000 (8 MiB)
    assert 0x20000000 <= sections[".bss.corten_dtcm"] < 0x20080000
    assert 0x21000000 <= sections[".bss.corten_sram"] < 0x21400000
    assert 0x28000000 <= sections[".ext_flash"] < 0x28800000
    return run


@needs_qemu
def test_ds_cnn_two_regions_on_qemu_m55_dtcm_sram_and_weights_in_flash():
    from test_zoo_programs import compiled

    base, x = compiled("ds-cnn")
    prog = base.with_memory({"dtcm": 8 * KIB, "sram": None}, ".ext_flash")
    plan = prog.memory_for("portable")
    assert all(r.nbytes > 0 for r in plan.regions) and plan.regions[0].nbytes <= 8 * KIB
    _qemu_two_regions(prog, x)


@needs_qemu
@pytest.mark.slow
def test_mv2_small_two_regions_on_qemu_m55():
    from test_zoo_programs import compiled

    base, x = compiled("mv2-0.35-96")
    prog = base.with_memory({"dtcm": 32 * KIB, "sram": None}, ".ext_flash")
    plan = prog.memory_for("portable")
    assert 0 < plan.regions[0].nbytes <= 32 * KIB and plan.regions[1].nbytes > 0
    _qemu_two_regions(prog, x)


def test_cli_memory_and_weights_section(tmp_path):
    from corten.cli import main

    model = tmp_path / "net.py"
    model.write_text("import torch\n\ndef make():\n    m = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU(),"
                     " torch.nn.Conv2d(4, 4, 1))\n    return m.eval(), (torch.randn(1, 3, 6, 6),)\n")
    out = tmp_path / "out"
    code = main(["compile", f"{model}:make", "--out", str(out), "--calib", "2", "--memory", "fast=128,slow=rest",
                 "--weights-section", ".ext_flash", "--emit-c"])
    assert code == 0
    report = (out / "report.txt").read_text()
    assert "region fast" in report and "region slow" in report
    assert (out / "c" / "net_sections.ld").read_text().count("> EXT_FLASH") == 1
    code = main(["compile", f"{model}:make", "--out", str(tmp_path / "o2"), "--calib", "2", "--memory",
                 "fast=16,slow=32"])
    assert code == 2
