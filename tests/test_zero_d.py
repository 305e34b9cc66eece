"""Math on computed 0-D tensors (aten_passes/lift_zero_d.py): full reductions, dot products and the
pointwise ops after them run on one-element tensors; the program keeps PyTorch's 0-D shapes, lowers
fully and is byte-exact in C."""
from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

import corten
from conftest import needs_gcc, needs_qemu
from corten.aten_passes import AtenPassManager
from corten.aten_passes.lift_zero_d import is_pointwise
from corten.capture import capture_module


class Head(nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fc, self.fn = nn.Linear(6, 6), fn

    def forward(self, x):
        return self.fn(self.fc(x), x)


MODELS = {
    # an anomaly score: the mean squared reconstruction error, as one number
    "mse_score": lambda y, x: ((y - x) ** 2).mean(),
    "scaled_mean": lambda y, x: y.mean() * 2 + 0.5,
    "amax_plus_sigmoid_sum": lambda y, x: torch.sigmoid(y.sum()) + y.amax(),
    "sum_over_every_dim": lambda y, x: torch.relu(y.sum(dim=(0, 1))) - y.amin(),
    "centred_by_a_dot": lambda y, x: y - torch.dot(y[0], x[0]) * 0.1,
    "score_and_vector": lambda y, x: (torch.tanh(y.abs().max()), y[1] * 2),
    "inner_and_outer": lambda y, x: torch.inner(y[0], x[0]) + torch.outer(y[0], x[1]),
    "frobenius": lambda y, x: torch.linalg.norm(y) * 0.5,
    "where_on_a_0_d_comparison": lambda y, x: torch.where(y.sum() > 0, y, -y),
    "product_of_0_d_and_clamp_bounds": lambda y, x: y.mean() * y.amax() + torch.clamp(y, y.amin() * 0.5, y.amax() * 0.5),
    "cosine_of_rows": lambda y, x: (y[0] * y[1]).sum() / (y[0].norm() * y[1].norm() + 1e-6),
}


def _compile(name):
    torch.manual_seed(0)
    model = Head(MODELS[name]).eval()
    x = torch.randn(2, 6)
    calib = [(x,)] + [(torch.randn(2, 6),) for _ in range(7)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return model, x, corten.compile(model, (x,), calibration=calib)


@needs_gcc
@pytest.mark.parametrize("name", list(MODELS))
def test_zero_d_math_lowers_and_is_byte_exact(name):
    model, x, prog = _compile(name)
    assert prog.unlowered_ops() == []
    want = prog.run_int8(x)
    assert all(torch.equal(a, b) for a, b in zip(want, prog.run_c(x, on="host", int8=True)))
    with torch.no_grad():
        ref = model(x)
    got = prog.run(x)
    ref, got = (ref, got) if isinstance(ref, tuple) else ((ref,), (got,))
    assert [tuple(r.shape) for r in ref] == [tuple(g.shape) for g in got]
    for r, g in zip(ref, got):
        assert float((r - g).abs().max()) <= 0.08 * max(1.0, float(r.abs().max())), (name, r, g)


def test_the_pass_leaves_no_pointwise_op_on_a_0_d_tensor():
    torch.manual_seed(0)
    gm = AtenPassManager()(capture_module(Head(MODELS["amax_plus_sigmoid_sum"]).eval(), (torch.randn(2, 6),)))
    for node in gm.graph.nodes:
        if is_pointwise(node):
            assert node.meta["val"].dim() >= 1, node.format_node()
        if node.target in (torch.ops.aten.amax.default, torch.ops.aten.sum.dim_IntList):
            assert node.args[2] is True  # (keepdim)
    (out,) = gm.graph.output_node().args[0]
    assert tuple(out.meta["val"].shape) == ()


@needs_qemu
def test_a_0_d_score_is_byte_exact_on_qemu_m4():
    _, x, prog = _compile("mse_score")
    assert all(torch.equal(a, b) for a, b in zip(prog.run_int8(x), prog.run_c(x, on="qemu", target="cortex-m4",
                                                                                int8=True)))


def test_a_returned_0_d_comparison_is_refused_by_name():
    """A program returns comparison results as the comparison computes them: a 0-D one is refused
    at compile time (naming the op and its line), never at C emission."""
    model = Head(lambda y, x: y.sum() > 0).eval()
    with pytest.raises(corten.errors.UnsupportedOpsError) as info:
        corten.compile(model, (torch.randn(2, 6),), calibration=[(torch.randn(2, 6),) for _ in range(2)])
    (node,) = info.value.nodes
    assert node.op == "aten.gt.Scalar" and "rank-0" in node.reason and "test_zero_d.py" in node.location
