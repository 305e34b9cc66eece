"""softmax through the compiler: quantizer annotation (fixed 1/256, -128), lowering of
``aten.softmax.int`` / ``aten._softmax.default`` over the last dim (refusal of too long rows), and the
emitted C on the host and QEMU (portable; CMSIS-NN's arm_softmax_s8 when CMSIS_NN_PATH is set).
Other dimensions and log_softmax: tests/test_log_softmax.py."""
from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn
from conftest import needs_cmsis_nn

from corten.testing.tester import Tester

Q, DQ, LINEAR, SOFTMAX = "quantize_per_tensor", "dequantize_per_tensor", "quantized_linear", "quantized_softmax"
A_LINEAR, A_SOFTMAX, A__SOFTMAX = "aten.linear.default", "aten.softmax.int", "aten._softmax.default"
LOWERED = {Q: 1, LINEAR: 1, SOFTMAX: 1, DQ: 1}


class LinearSoftmax(nn.Module):
    """``softmax(linear(x), dim)`` with a choice of softmax spelling."""

    def __init__(self, in_f: int = 16, out_f: int = 10, dim: int = -1, spelling: str = "module"):
        super().__init__()
        self.fc = nn.Linear(in_f, out_f)
        self.dim, self.spelling = dim, spelling
        self.softmax = nn.Softmax(dim=dim)

    def forward(self, x):
        y = self.fc(x)
        if self.spelling == "_softmax":
            return torch.ops.aten._softmax.default(y, self.dim, False)
        return self.softmax(y)


@pytest.fixture(autouse=True)
def _seeded():
    """Every test builds its model from a fixed seed: the models are constructed (``nn.Linear``'s random
    init) before ``_tester`` seeds the inputs, so without this their weights - and the float-agreement
    bounds - depended on which tests ran before."""
    torch.manual_seed(1234)


def _tester(model: nn.Module, shape, target: str = "cortex-m55") -> Tester:
    warnings.simplefilter("ignore")
    torch.manual_seed(0)
    return Tester(model.eval(), (torch.randn(shape),), target=target)


@pytest.mark.parametrize("spelling,aten_op", [("module", A_SOFTMAX), ("_softmax", A__SOFTMAX)])
def test_dialect_linear_softmax(spelling, aten_op):
    t = _tester(LinearSoftmax(spelling=spelling), (1, 16))
    report = t.test_dialect(ops_before={A_LINEAR: 1, aten_op: 1}, ops_after=LOWERED, qtol=1)
    assert report.cosine_vs_float > 0.99
    out_q = t.program.outputs[0]
    assert (out_q.scale, out_q.zero_point) == (1 / 256, -128)


def test_dialect_3d_rows():
    """[1, 5, 12] -> softmax over the 10 features of each of the 5 rows (num_rows = 5 in C)."""
    t = _tester(LinearSoftmax(12, 10), (1, 5, 12))
    t.test_dialect(ops_before={A_LINEAR: 1, A_SOFTMAX: 1}, ops_after=LOWERED, qtol=1)


def test_rows_longer_than_4095_refused():
    t = _tester(LinearSoftmax(4, 4096), (1, 4))
    t.lower()
    unlowered = t.program.unlowered_ops()
    assert [u.op for u in unlowered] == [A_SOFTMAX]
    assert "rows must have 1 to 4095" in unlowered[0].reason and "test_softmax_compile.py" in unlowered[0].location


def test_implementation_host_and_qemu_m55():
    t = _tester(LinearSoftmax(16, 40), (1, 3, 16))
    results = t.test_implementation(on=("host", "qemu"), n_inputs=2)
    assert {(r[0], r[1]) for r in results} == {("host", None), ("qemu", "cortex-m55")}


@needs_cmsis_nn
def test_implementation_cmsis_nn_m55():
    """arm_softmax_s8 itself: its Helium path on QEMU's Cortex-M55, its plain C path on the host.
    39 features per row: the Helium kernel's 4-wide loops and its 3-element scalar tail both run;
    48 rows per input, 3 inputs."""
    t = _tester(LinearSoftmax(16, 39), (1, 48, 16))
    t.test_implementation(on=("host", "qemu"), kernels="cmsis-nn", n_inputs=3)
