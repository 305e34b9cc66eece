"""One pipeline: ``corten.compile`` runs the stages of ``corten.compiler.Pipeline`` in order, and the
``Tester`` drives the same stages one by one, so both give the same program for every zoo model
(graph text and every constant, bit for bit).  Also: compiling touches no global state."""
from __future__ import annotations

import pytest
import torch

import corten
from corten.compiler import Pipeline, default_calibration
from corten.testing import Tester
from conftest import ZOO_224
from corten.zoo import MODELS, get_model

CALIBRATION = 2  # the equality holds for any calibration; 2 samples keep the test short


def _constants(program) -> dict[str, torch.Tensor]:
    ep = program.ep
    return {**ep.state_dict, **ep.constants}


@pytest.mark.slow
@pytest.mark.parametrize("name", [n for n in MODELS if n not in ZOO_224])  # (the stages are size-blind)
def test_tester_and_compile_give_the_same_program(name):
    model, example = get_model(name)
    samples = default_calibration(example, CALIBRATION, seed=0)
    compiled = corten.compile(model, example, calibration=samples)
    tester = Tester(model, example, calibration=samples).lower()
    tested = tester.program
    assert tested.stages["lowered"] == compiled.stages["lowered"]
    assert tested.stages["quantized"] == compiled.stages["quantized"]
    a, b = _constants(compiled), _constants(tested)
    assert a.keys() == b.keys() and a
    for key in a:
        assert a[key].dtype == b[key].dtype and torch.equal(a[key], b[key]), key
    assert tested.op_counts() == compiled.op_counts() and not compiled.unlowered_ops()
    # the Tester keeps the quantized ATen graph (the lowering ran on a copy of it)
    assert any(n.target == torch.ops.aten.conv2d.default or n.target == torch.ops.aten.linear.default
               for n in tester.converted.graph.nodes)


def test_stages_are_individually_callable_and_inspectable():
    model, example = get_model("ds-cnn")
    p = Pipeline(model, example, "cortex-m4", calibration=default_calibration(example, 1, 0))
    assert p.capture().exported is not None and "conv2d" in p.graphs["exported"]
    assert p.prepare().prepared is not None and "bn_fused" in p.graphs
    assert p.calibrate().calibration_samples == 1
    p.convert()
    assert all("val" in n.meta for n in p.converted.graph.nodes if n.op != "output")
    p.lower()
    assert p.lowered is p.converted and not p.unlowered  # lowered in place unless keep_converted
    prog = p.export()
    assert prog.target.name == "cortex-m4" and prog.info["calibration_samples"] == 1
    assert set(prog.info["timings_s"]) == {"capture", "quantize", "lower"}
    assert set(prog.stages) == {"exported", "bn_fused", "quantized", "lowered"}


def test_compile_leaves_the_global_rng_alone():
    model, example = get_model("deep-ae")
    torch.manual_seed(1234)
    expected = torch.rand(4)
    torch.manual_seed(1234)
    corten.compile(model, example, calibration=None, seed=7)
    assert torch.equal(torch.rand(4), expected)


class _ConvBnZoo(torch.nn.Module):
    """conv2d+BN, bias-free conv+BN, conv1d+BN, transposed conv+BN, a BN after a non-conv and one
    weight shared by two convs each followed by its own BN: every branch of torchao's folding."""

    def __init__(self):
        super().__init__()
        nn = torch.nn
        self.a, self.bn_a = nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4)
        self.b, self.bn_b = nn.Conv2d(4, 4, 1, bias=False), nn.BatchNorm2d(4)
        self.t, self.bn_t = nn.ConvTranspose2d(4, 4, 2, stride=2), nn.BatchNorm2d(4)
        self.bn_free = nn.BatchNorm2d(4)
        self.c1, self.bn_1 = nn.Conv1d(4, 4, 3, padding=1), nn.BatchNorm1d(4)
        self.shared, self.bn_s1, self.bn_s2 = nn.Conv2d(4, 4, 1), nn.BatchNorm2d(4), nn.BatchNorm2d(4)
        for m in self.modules():
            if isinstance(m, nn.modules.batchnorm._BatchNorm):
                m.running_mean.uniform_(-1, 1)
                m.running_var.uniform_(0.5, 2)
                m.weight.data.uniform_(0.5, 1.5)

    def forward(self, x):
        y = self.bn_b(self.b(self.bn_a(self.a(x))))
        y = self.bn_free(torch.relu(y))
        z = self.bn_t(self.t(y))[:, :, :8, :8]
        s = self.bn_s1(self.shared(z)) + self.bn_s2(self.shared(y))
        return self.bn_1(self.c1(s.flatten(2)))


def test_fuse_conv_bn_folds_exactly_as_torchao_does():
    """``fuse_conv_bn`` (one dead-code pass) gives torchao's ``_fuse_conv_bn_`` graph and weights."""
    from torchao.quantization.pt2e.utils import _fuse_conv_bn_

    from corten.capture import capture
    from corten.compiler import fuse_conv_bn, unguarded_module

    torch.manual_seed(0)
    ep = capture(_ConvBnZoo().eval(), (torch.randn(1, 3, 8, 8),))
    ours, theirs = unguarded_module(ep), unguarded_module(ep)
    fuse_conv_bn(ours)
    _fuse_conv_bn_(theirs)
    assert ours.code == theirs.code
    assert [n.name for n in ours.graph.nodes] == [n.name for n in theirs.graph.nodes]
    a, b = ours.state_dict(), theirs.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert sum(n.target == torch.ops.aten.batch_norm.default for n in ours.graph.nodes) == 1  # bn_free stays
