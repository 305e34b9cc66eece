"""Implementation tests: compiled programs' C libraries run on the host and on emulated Cortex-M
boards (QEMU) and produce exactly the Python reference's bytes."""
from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

import corten
from corten.cli import main as cli_main
from corten.testing import Tester
from corten.zoo import get_model

QEMU_TARGETS = ["cortex-m3", "cortex-m4", "cortex-m7", "cortex-m55"]


@pytest.fixture(scope="module")
def mv2_small():
    warnings.simplefilter("ignore")
    model, example = get_model("mv2-0.35-96")
    prog = corten.compile(model, example, target="cortex-m55", name="mv2_small")
    inputs = [example[0], torch.randn(example[0].shape, generator=torch.Generator().manual_seed(7))]
    return prog, inputs


def test_mv2_small_host_byte_exact(mv2_small):
    prog, inputs = mv2_small
    for x in inputs:
        assert torch.equal(prog.run_c(x, on="host", int8=True)[0], prog.run_int8(x)[0])
    assert prog.last_c_run.on == "host" and prog.last_c_run.wall_s > 0
    # the float path: C output dequantized equals prog.run exactly
    assert torch.equal(prog.run_c(inputs[0], on="host"), prog.run(inputs[0]))


@pytest.mark.parametrize("target", QEMU_TARGETS)
def test_mv2_small_qemu_byte_exact(mv2_small, target):
    prog, inputs = mv2_small
    x = inputs[1]
    got = prog.run_c(x, on="qemu", target=target, int8=True)[0]
    assert torch.equal(got, prog.run_int8(x)[0])
    run = prog.last_c_run
    assert run.target == target and run.instructions is not None
    # MobileNetV2-0.35 at 96x96 is ~11M MACs: tens of millions of instructions, not thousands
    assert 2e7 < run.instructions < 2e9


class _SmallNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(3, 8, 3, 2, 1)
        self.bn = nn.BatchNorm2d(8)
        self.dw = nn.Conv2d(8, 8, 3, 1, 1, groups=8)
        self.pw = nn.Conv2d(8, 8, 1)
        self.pool = nn.MaxPool2d(2, 2)
        self.fc = nn.Linear(8 * 4 * 4, 10)

    def forward(self, x):
        y = torch.relu(self.bn(self.c1(x)))
        y = y + self.pw(nn.functional.relu6(self.dw(y)))
        y = self.pool(y)
        return self.fc(torch.flatten(y, 1))  # flatten of an NHWC tensor with H*W > 1: a real copy in C


def test_tester_implementation_host_and_qemu():
    torch.manual_seed(0)
    t = Tester(_SmallNet().eval(), (torch.randn(1, 3, 16, 16),), target="cortex-m4")
    results = t.test_implementation(on=("host", "qemu"), n_inputs=2)
    assert {(r[0], r[1]) for r in results} == {("host", None), ("qemu", "cortex-m4")}


def test_cli_run_reports_byte_equality(tmp_path, capsys):
    out = tmp_path / "prog"
    assert cli_main(["compile", "ds-cnn", "--out", str(out), "--calib", "2", "--emit-c"]) == 0
    assert (out / "c" / "ds_cnn.h").exists()
    assert cli_main(["run", str(out), "--on", "host"]) == 0
    text = capsys.readouterr().out
    assert "byte-for-byte equal to the Python reference: YES" in text
    import numpy as np

    np.save(tmp_path / "x.npy", np.random.RandomState(0).randn(1, 1, 49, 10).astype("float32"))
    assert cli_main(["run", str(out), "--on", "host", "--input", str(tmp_path / "x.npy")]) == 0
    assert "byte-for-byte equal to the Python reference: YES" in capsys.readouterr().out
    np.save(tmp_path / "bad.npy", np.zeros((1, 3, 8, 8), "float32"))
    assert cli_main(["run", str(out), "--input", str(tmp_path / "bad.npy")]) == 2
    assert "(1, 3, 8, 8) != the program's input (1, 1, 49, 10)" in capsys.readouterr().err


def test_budget_refusal(tmp_path, capsys):
    rc = cli_main(["compile", "ds-cnn", "--out", str(tmp_path / "p"), "--calib", "1", "--max-arena", "1000"])
    assert rc == 2
    err = capsys.readouterr().err
    assert "does not fit" in err and "peak at step" in err


class _TwoInTwoOut(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Conv2d(3, 8, 3, 1, 1)
        self.b = nn.Conv2d(3, 8, 3, 1, 1)
        self.fc = nn.Linear(8, 5)

    def forward(self, x, y):
        z = torch.relu(self.a(x)) + self.b(y)
        return self.fc(nn.functional.adaptive_avg_pool2d(z, 1).flatten(1)), z


def test_several_inputs_and_outputs_host_and_qemu(tmp_path):
    torch.manual_seed(1)
    x, y = torch.randn(1, 3, 8, 8), torch.randn(1, 3, 8, 8)
    prog = corten.compile(_TwoInTwoOut().eval(), (x, y), name="two_io")
    assert len(prog.inputs) == 2 and len(prog.outputs) == 2
    expected = prog.run_int8(x, y)
    for on, target in (("host", None), ("qemu", "cortex-m55")):
        got = prog.run_c(x, y, on=on, target=target, int8=True)
        assert all(torch.equal(e, g) for e, g in zip(expected, got))
    lib = prog.emit_c(tmp_path / "lib")
    header = lib.header.read_text()
    assert "#define TWO_IO_NUM_INPUTS 2" in header and "#define TWO_IO_OUTPUT1_OFFSET 5" in header
    assert lib.input_bytes == 2 * 3 * 8 * 8 and lib.outputs[1].offset == 5
