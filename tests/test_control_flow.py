"""Control flow decided at compile time (capture/control_flow.py): ``torch.cond`` on a constant
predicate is its branch, ``while_loop`` with a constant trip count is unrolled (nested regions too);
the float graph computes what the model computes, the program is byte-exact in C, and a predicate
that reads an input stays refused by name."""
from __future__ import annotations

import shutil
import warnings

import pytest
import torch
from torch import nn
from torch._higher_order_ops.while_loop import while_loop

import corten
from corten.capture import capture
from corten.errors import UnsupportedOpsError


class Loop(nn.Module):
    """A counter from a constant to a buffer's trip count, one layer applied per iteration."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.register_buffer("trips", torch.tensor(3))

    def forward(self, x):
        _, y = while_loop(lambda i, y: i < self.trips, lambda i, y: (i + 1, torch.relu(self.fc(y)) + y),
                          (torch.tensor(0), x))
        return y


class Branch(nn.Module):
    """A flag buffer choosing a branch; the taken branch holds a loop of its own."""

    def __init__(self, flag: float):
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.register_buffer("flag", torch.tensor(flag))

    def forward(self, x):
        def taken(y):
            return while_loop(lambda i, z: i < 2, lambda i, z: (i + 1, self.fc(z).tanh()), (torch.tensor(0), y))[1]
        return torch.cond(self.flag > 0, taken, lambda y: y * 0.5, (x,))


def _hops(ep) -> list[str]:
    return [str(n.target) for n in ep.graph.nodes if isinstance(n.target, torch._ops.HigherOrderOperator)]


@pytest.mark.parametrize("make, linears", [(Loop, 3), (lambda: Branch(1.0), 2), (lambda: Branch(-1.0), 0)],
                         ids=["loop", "branch-taken", "branch-not-taken"])
def test_constant_control_flow_is_inlined(make, linears):
    torch.manual_seed(0)
    model = make().eval()
    x = torch.randn(2, 8)
    ep = capture(model, (x,))
    assert _hops(ep) == []
    assert sum(n.target == torch.ops.aten.linear.default for n in ep.graph.nodes) == linears
    assert torch.equal(ep.module()(x), model(x))


@pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")
def test_unrolled_loop_is_byte_exact_in_c():
    warnings.simplefilter("ignore")
    torch.manual_seed(0)
    model = Loop().eval()
    calib = [(torch.randn(1, 8),) for _ in range(16)]
    prog = corten.compile(model, calib[0], calibration=calib)
    assert prog.unlowered_ops() == [] and prog.op_counts()["quantized_linear"] == 3
    x = torch.randn(1, 8)
    assert torch.equal(prog.run_int8(x)[0], prog.c_run(x).outputs[0])
    assert (prog.run(x) - model(x)).abs().max() < 0.1 * model(x).abs().max() + 0.05


def test_data_dependent_loop_stays_refused_by_name():
    class Grow(nn.Module):
        def forward(self, x):
            return while_loop(lambda i, y: y.sum() < 100, lambda i, y: (i + 1, y * 2), (torch.tensor(0), x))[1]

    with pytest.raises(UnsupportedOpsError) as info:
        corten.compile(Grow().eval(), (torch.rand(1, 8) + 0.1,))
    assert "higher_order.while_loop" in str(info.value) and "constant" in str(info.value)


def test_branch_with_a_nested_loop_compiles():
    warnings.simplefilter("ignore")
    torch.manual_seed(0)
    model = Branch(1.0).eval()
    prog = corten.compile(model, (torch.randn(1, 8),))
    assert prog.unlowered_ops() == [] and prog.op_counts()["quantized_linear"] == 2
