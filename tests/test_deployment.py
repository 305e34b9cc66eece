"""Deployment: one value (core, kernel providers, board, budgets) instead of target/kernels strings."""
from __future__ import annotations

import pytest
import torch
from torch import nn

import corten
from conftest import needs_gcc
from corten import Deployment
from corten.errors import BudgetError, UnsupportedTargetError, UsageError
from corten.providers import CMSIS_NN, PORTABLE
from corten.runners.qemu import BOARDS, board_for
from corten.targets import TARGETS, get_target


def test_one_table_of_cores_and_boards():
    """targets.py is the one table: every core's flags and ISA, and the QEMU board of the runnable ones."""
    assert set(BOARDS) == {name for name, t in TARGETS.items() if t.board is not None}
    assert set(BOARDS) == {"cortex-m3", "cortex-m4", "cortex-m7", "cortex-m33", "cortex-m55"}
    for name, board in BOARDS.items():
        assert board is TARGETS[name].board and board.target == name and board_for(name) is board
    with pytest.raises(UnsupportedTargetError, match="runnable targets: cortex-m3"):
        board_for("cortex-m85")


def test_of_builds_a_deployment_from_the_convenience_strings():
    d = Deployment.of("cortex-m4", "cmsis-nn", max_arena=64 * 1024)
    assert d.target is get_target("cortex-m4") and d.core == "cortex-m4" and d.isa == "dsp"
    assert d.providers == (CMSIS_NN, PORTABLE) and d.kernels == "cmsis-nn" and d.links_cmsis_nn
    assert d.board is get_target("cortex-m4").board and d.max_arena == 65536 and d.max_flash is None
    assert d.key == ("cortex-m4", ("cmsis-nn", "portable"))
    assert Deployment.of().core == "cortex-m55" and Deployment.of().providers == (PORTABLE,)
    assert Deployment.of("cortex-m85").board is None
    assert Deployment.of("cortex-m4", board=None).board is None
    assert d.with_kernels("portable").providers == (PORTABLE,) and d.with_target("cortex-m7").board.machine == "mps2-an500"
    assert Deployment.coerce(d) is d and Deployment.coerce("cortex-m3", "cmsis-nn").key == ("cortex-m3", ("cmsis-nn", "portable"))
    assert "cortex-m4 (dsp), cmsis-nn kernels, mps2-an386, arena 65,536 B" == d.describe()
    with pytest.raises(UsageError, match="unknown target"):
        Deployment.of("cortex-a53")
    with pytest.raises(UsageError, match="kernels must be one of"):
        Deployment.of("cortex-m4", "tensorflow")
    with pytest.raises(UsageError, match="max_arena must be a positive"):
        Deployment.of("cortex-m4", max_arena=0)
    with pytest.raises(UnsupportedTargetError, match="cortex-m85"):
        Deployment.of("cortex-m85").require_board()


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.fc = nn.Linear(8 * 8 * 8, 4)

    def forward(self, x):
        return self.fc(torch.relu(self.conv(x)).flatten(1))


@pytest.fixture(scope="module")
def prog():
    torch.manual_seed(0)
    x = torch.randn(1, 3, 8, 8, generator=torch.Generator().manual_seed(0))
    return corten.compile(Net().eval(), (x,), calibration=None, seed=0), x


def test_program_conveniences_are_deployments(prog, tmp_path):
    prog, _ = prog
    d = Deployment.of("cortex-m4", "cmsis-nn")
    assert prog.memory_for("cmsis-nn", "cortex-m4") is prog.memory_for(deployment=d)
    assert prog.memory_for(deployment=d).target == "cortex-m4" and prog.memory_for(deployment=d).kernels == "cmsis-nn"
    assert prog.memory is prog.memory_for(deployment=Deployment.of(prog.target, "cmsis-nn"))
    assert prog.deployment().key == (prog.target.name, ("cmsis-nn", "portable"))
    assert prog.deployment("portable", "cortex-m3").key == ("cortex-m3", ("portable",))
    assert prog.deployment(deployment=d, kernels="portable").key == ("cortex-m4", ("portable",))
    a = prog.emit_c(tmp_path / "a", kernels="cmsis-nn", target="cortex-m4")
    b = prog.emit_c(tmp_path / "b", deployment=d)
    for f in (a.header, a.source, a.constants):
        assert f.read_text() == (tmp_path / "b" / f.name).read_text()
    assert b.kernels == "cmsis-nn" and b.providers == ("cmsis-nn", "portable")
    assert [s.kernel for s in prog.kernel_choices(deployment=d)] == [s.kernel for s in b.steps]
    assert "Kernels of a CMSIS-NN build" in prog.fallback_report(deployment=d)


def test_budgets_come_with_the_deployment(prog):
    prog, x = prog
    arena = prog.memory_for("portable").arena_bytes
    assert prog.fit_budget(deployment=Deployment.of(prog.target, "portable", max_arena=arena)) is prog
    with pytest.raises(BudgetError):
        prog.fit_budget(deployment=Deployment.of(prog.target, "portable", max_flash=16))
    torch.manual_seed(0)
    with pytest.raises(BudgetError):
        corten.compile(Net().eval(), (x,), calibration=None, seed=0,
                       deployment=Deployment.of("cortex-m4", "portable", max_flash=16))
    with pytest.raises(UsageError, match="deployment must be"):
        corten.compile(Net().eval(), (x,), calibration=None, deployment="cortex-m4")


@needs_gcc
def test_c_run_takes_a_deployment(prog):
    prog, x = prog
    want = prog.run_int8(x)
    run = prog.c_run(x, deployment=Deployment.of("cortex-m4", "portable"))
    assert run.kernels == "portable" and all(torch.equal(w, g) for w, g in zip(want, run.outputs))
    with pytest.raises(UnsupportedTargetError, match="no QEMU board"):
        prog.c_run(x, on="qemu", deployment=Deployment.of("cortex-m4", board=None))
