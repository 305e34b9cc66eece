"""ATen passes: BatchNorm folding into conv / linear, the depthwise rewrite of the BatchNorms that
cannot be folded, and no-op removal.  Every case compares the rewritten graph with the float model."""
import collections

import pytest
import torch
from torch import nn

from corten.aten_passes import (AtenPassError, AtenPassManager, DecomposeCompositesPass, DecomposeMovementPass,
                                BatchNormToDepthwiseConvPass, FoldBatchNormPass, FuseBatchNormIntoConvPass,
                                FuseBatchNormIntoLinearPass,
                                RemoveNoOpsPass, fold_scale_into_conv_weight, is_batch_norm)
from corten.capture import capture, capture_module, remove_guards_fn

aten = torch.ops.aten
REL_TOL = 1e-5  # max |fused - float| allowed, relative to the float output's max |value|


def _randomize_bn(module: nn.Module, gen: torch.Generator) -> None:
    """Non-identity BatchNorm: mean, var, gamma, beta all away from (0, 1, 1, 0)."""
    for bn in module.modules():
        if isinstance(bn, nn.modules.batchnorm._BatchNorm):
            c = bn.num_features
            bn.running_mean.copy_(torch.randn(c, generator=gen))
            bn.running_var.copy_(0.2 + 2 * torch.rand(c, generator=gen))
            if bn.affine:
                bn.weight.data.copy_(0.5 + torch.rand(c, generator=gen))
                bn.bias.data.copy_(torch.randn(c, generator=gen))


def _prepare(module: nn.Module, *shapes, seed=0):
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.5)
        _randomize_bn(module, gen)
    module.eval()
    inputs = tuple(torch.randn(s, generator=gen) for s in shapes)
    return module, inputs


def _op_counts(gm) -> collections.Counter:
    return collections.Counter(n.target for n in gm.graph.nodes if n.op == "call_function")


def _assert_same_output(gm, module, inputs):
    with torch.no_grad():
        expected = module(*inputs)
        actual = gm(*inputs)
    scale = expected.abs().max().item()
    torch.testing.assert_close(actual, expected, atol=REL_TOL * scale, rtol=0)


def _run(module, inputs, manager=None):
    """capture_module + pass manager, checking the user's parameters are left untouched."""
    before = {k: v.clone() for k, v in module.state_dict().items()}
    gm = (manager or AtenPassManager())(capture_module(module, inputs))
    after = module.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before), "a pass modified the model's parameters"
    assert not any(is_batch_norm(n) for n in gm.graph.nodes)
    gm.graph.lint()
    return gm


class ProducerBN(nn.Module):
    def __init__(self, producer: nn.Module, bn: nn.Module):
        super().__init__()
        self.producer, self.bn = producer, bn

    def forward(self, x):
        return self.bn(self.producer(x))


# (name, producer factory(bias), BN, input shape, expected aten target of the producer)
PRODUCERS = [
    ("conv1d", lambda b: nn.Conv1d(3, 5, 3, padding=1, bias=b), nn.BatchNorm1d(5), (1, 3, 12), aten.conv1d.default),
    ("conv2d", lambda b: nn.Conv2d(3, 6, 3, stride=2, bias=b), nn.BatchNorm2d(6), (1, 3, 9, 9), aten.conv2d.default),
    ("depthwise", lambda b: nn.Conv2d(6, 6, 3, padding=1, groups=6, bias=b), nn.BatchNorm2d(6), (1, 6, 7, 7),
     aten.conv2d.default),
    ("depthwise_mult2", lambda b: nn.Conv2d(4, 8, 3, groups=4, bias=b), nn.BatchNorm2d(8), (1, 4, 7, 7),
     aten.conv2d.default),
    ("grouped", lambda b: nn.Conv2d(4, 6, 1, groups=2, bias=b), nn.BatchNorm2d(6), (1, 4, 5, 5), aten.conv2d.default),
    ("conv_transpose2d", lambda b: nn.ConvTranspose2d(3, 5, 3, stride=2, bias=b), nn.BatchNorm2d(5), (1, 3, 4, 4),
     aten.conv_transpose2d.input),
    ("conv_transpose2d_grouped", lambda b: nn.ConvTranspose2d(4, 6, 2, stride=2, groups=2, bias=b),
     nn.BatchNorm2d(6), (1, 4, 3, 3), aten.conv_transpose2d.input),
    ("conv_transpose1d", lambda b: nn.ConvTranspose1d(2, 4, 3, stride=2, bias=b), nn.BatchNorm1d(4), (1, 2, 6),
     aten.conv_transpose1d.default),
    ("linear", lambda b: nn.Linear(7, 5, bias=b), nn.BatchNorm1d(5), (1, 7), aten.linear.default),
]


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
@pytest.mark.parametrize("name, make, bn, shape, target", PRODUCERS, ids=[p[0] for p in PRODUCERS])
def test_batch_norm_folds_into_its_producer(name, make, bn, shape, target, bias):
    module, inputs = _prepare(ProducerBN(make(bias), bn), shape)
    gm = _run(module, inputs)
    assert _op_counts(gm) == {target: 1}
    producer = next(n for n in gm.graph.nodes if n.target == target)
    assert producer.args[2] is not None and producer.args[2].op == "get_attr"  # a bias, created if absent
    assert {n.target for n in gm.graph.nodes if n.op == "get_attr"} == \
           {producer.args[1].target, producer.args[2].target}
    assert not any("running" in k or k.startswith("bn.") for k in gm.state_dict())
    _assert_same_output(gm, module, inputs)


def test_batch_norm_pass_reports_modified_once():
    module, inputs = _prepare(ProducerBN(nn.Conv2d(3, 4, 1), nn.BatchNorm2d(4)), (1, 3, 4, 4))
    gm = capture_module(module, inputs)
    assert FoldBatchNormPass()(gm).modified is True
    assert FoldBatchNormPass()(gm).modified is False
    assert _op_counts(gm) == {aten.conv2d.default: 1}
    _assert_same_output(gm, module, inputs)


def test_transposed_fold_scales_output_channels_of_each_group():
    """[Cin, Cout/groups, k] layout: with 2 groups, column j of group g is output channel 2g + j."""
    weight = torch.ones(4, 2, 1)
    scale = torch.tensor([1.0, 2.0, 3.0, 4.0])
    folded = fold_scale_into_conv_weight(weight, scale, transposed=True, groups=2)
    assert folded[:, :, 0].tolist() == [[1, 2], [1, 2], [3, 4], [3, 4]]
    folded = fold_scale_into_conv_weight(torch.ones(4, 2, 1), scale, transposed=False, groups=2)
    assert folded[:, 0, 0].tolist() == [1, 2, 3, 4]


# ---- BatchNorms that must not be folded: rewritten as a depthwise 1x1 conv ----

class SkipConnection(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv, self.bn = nn.Conv2d(4, 4, 3, padding=1), nn.BatchNorm2d(4)

    def forward(self, x):
        y = self.conv(x)
        return self.bn(y) + y


class UsedTwice(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv, self.bn = nn.Conv2d(3, 4, 3, bias=False), nn.BatchNorm2d(4)

    def forward(self, x):
        y = self.conv(x)
        return self.bn(y), torch.relu(y)


class BatchNormOnInput(nn.Module):
    def __init__(self, bn):
        super().__init__()
        self.bn = bn

    def forward(self, x):
        return self.bn(x) * 2


class BatchNormAfterAdd(nn.Module):
    def __init__(self):
        super().__init__()
        self.bn = nn.BatchNorm2d(3)

    def forward(self, x, y):
        return self.bn(x + y)


class SequenceLinearBN(nn.Module):
    """BatchNorm1d over dimension 1 of a 3-D linear output [N, L, F]: L positions, not features."""

    def __init__(self):
        super().__init__()
        self.linear, self.bn = nn.Linear(6, 5), nn.BatchNorm1d(4)

    def forward(self, x):
        return self.bn(self.linear(x))


def _depthwise_nodes(gm):
    return [n for n in gm.graph.nodes if n.target == aten.conv2d.default and "corten_from" in n.meta]


def _check_depthwise(gm, channels):
    (conv,) = _depthwise_nodes(gm)
    assert conv.args[6] == channels
    assert tuple(conv.args[1].meta["val"].shape) == (channels, 1, 1, 1)
    assert tuple(conv.args[2].meta["val"].shape) == (channels,)
    return conv


@pytest.mark.parametrize("make, shapes, channels, extra_ops", [
    (SkipConnection, [(1, 4, 6, 6)], 4, {aten.conv2d.default: 2, aten.add.Tensor: 1}),
    (UsedTwice, [(1, 3, 6, 6)], 4, {aten.conv2d.default: 2, aten.relu.default: 1}),
    (lambda: BatchNormOnInput(nn.BatchNorm2d(3)), [(1, 3, 5, 5)], 3,
     {aten.conv2d.default: 1, aten.mul.Tensor: 1}),
    (BatchNormAfterAdd, [(1, 3, 4, 4), (1, 3, 4, 4)], 3, {aten.conv2d.default: 1, aten.add.Tensor: 1}),
    (lambda: BatchNormOnInput(nn.BatchNorm1d(5)), [(1, 5)], 5,
     {aten.view.default: 2, aten.conv2d.default: 1, aten.mul.Tensor: 1}),
    (lambda: BatchNormOnInput(nn.BatchNorm1d(5, affine=False)), [(1, 5)], 5,
     {aten.view.default: 2, aten.conv2d.default: 1, aten.mul.Tensor: 1}),
    (lambda: BatchNormOnInput(nn.BatchNorm1d(4)), [(1, 4, 9)], 4,
     {aten.unsqueeze.default: 1, aten.conv2d.default: 1, aten.squeeze.dim: 1, aten.mul.Tensor: 1}),
    (SequenceLinearBN, [(1, 4, 6)], 4,
     {aten.linear.default: 1, aten.unsqueeze.default: 1, aten.conv2d.default: 1, aten.squeeze.dim: 1}),
], ids=["skip_connection", "conv_used_twice", "no_producer_4d", "after_add", "no_producer_2d",
        "no_producer_2d_no_affine", "no_producer_3d", "linear_3d_output"])
def test_unfoldable_batch_norm_becomes_depthwise_conv(make, shapes, channels, extra_ops):
    module, inputs = _prepare(make(), *shapes)
    gm = _run(module, inputs)
    assert _op_counts(gm) == extra_ops
    _check_depthwise(gm, channels)
    outputs = [n for n in gm.graph.nodes if n.op != "output" and n.op != "get_attr"]
    assert all(isinstance(n.meta.get("val"), torch.Tensor) for n in outputs)
    with torch.no_grad():
        expected, actual = module(*inputs), gm(*inputs)
    for e, a in zip(expected if isinstance(expected, tuple) else (expected,),
                    actual if isinstance(actual, tuple) else (actual,)):
        torch.testing.assert_close(a, e, atol=REL_TOL * e.abs().max().item(), rtol=0)


def test_conv_weight_that_is_an_input_blocks_the_fold():
    class InputWeight(nn.Module):
        def __init__(self):
            super().__init__()
            self.bn = nn.BatchNorm2d(4)

        def forward(self, x, w):
            return self.bn(nn.functional.conv2d(x, w))

    module, inputs = _prepare(InputWeight(), (1, 3, 5, 5), (4, 3, 3, 3))
    gm = torch.export.export(module, inputs).module()  # capture() would refuse the batch-4 weight
    remove_guards_fn(gm)
    gm = AtenPassManager()(gm)
    assert _op_counts(gm) == {aten.conv2d.default: 2}
    _check_depthwise(gm, 4)
    _assert_same_output(gm, module, inputs)


def test_chained_batch_norms_all_fold_into_the_conv():
    module, inputs = _prepare(nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.BatchNorm2d(4)),
                              (1, 3, 6, 6))
    gm = _run(module, inputs)
    assert _op_counts(gm) == {aten.conv2d.default: 1}
    _assert_same_output(gm, module, inputs)


def test_dropout_between_conv_and_batch_norm_is_removed_then_folded():
    module, inputs = _prepare(nn.Sequential(nn.Conv2d(3, 4, 3), nn.Dropout(0.3), nn.BatchNorm2d(4)),
                              (1, 3, 6, 6))
    raw = capture_module(module, inputs)
    assert aten.dropout.default in _op_counts(raw)
    gm = _run(module, inputs)
    assert _op_counts(gm) == {aten.conv2d.default: 1}
    _assert_same_output(gm, module, inputs)


def test_decomposed_batch_norm_and_convolution_fold_too():
    """After run_decompositions() BatchNorm is _native_batch_norm_legit_no_training + getitem and
    conv is aten.convolution; the passes handle that form as well."""
    module, inputs = _prepare(ProducerBN(nn.ConvTranspose2d(4, 6, 2, stride=2, groups=2, bias=False),
                                         nn.BatchNorm2d(6)), (1, 4, 3, 3))
    gm = capture(module, inputs).run_decompositions().module()
    remove_guards_fn(gm)
    assert aten._native_batch_norm_legit_no_training.default in _op_counts(gm)
    gm = AtenPassManager()(gm)
    assert _op_counts(gm) == {aten.convolution.default: 1}
    _assert_same_output(gm, module, inputs)


def test_decomposed_batch_norm_without_producer_becomes_depthwise():
    module, inputs = _prepare(BatchNormOnInput(nn.BatchNorm2d(3)), (1, 3, 4, 4))
    gm = capture(module, inputs).run_decompositions().module()
    remove_guards_fn(gm)
    gm = AtenPassManager()(gm)
    assert not any(is_batch_norm(n) for n in gm.graph.nodes)
    _check_depthwise(gm, 3)
    _assert_same_output(gm, module, inputs)


def test_training_mode_batch_norm_is_refused():
    module, inputs = _prepare(ProducerBN(nn.Conv2d(3, 4, 1), nn.BatchNorm2d(4)), (1, 3, 4, 4))
    module.train()
    gm = torch.export.export(module, inputs).module()  # bypasses capture()'s own check
    with pytest.raises(AtenPassError, match=r"BatchNorm batch_norm is in training mode.*model\.eval\(\)"):
        AtenPassManager()(gm)


def test_pass_manager_accepts_a_custom_pass_list():
    module, inputs = _prepare(ProducerBN(nn.Conv2d(3, 4, 1), nn.BatchNorm2d(4)), (1, 3, 4, 4))
    manager = AtenPassManager([RemoveNoOpsPass(), FoldBatchNormPass()])
    gm = _run(module, inputs, manager)
    assert manager.modified_by == ["FoldBatchNormPass"]
    assert _op_counts(gm) == {aten.conv2d.default: 1}
    _assert_same_output(gm, module, inputs)


def test_pass_manager_checks_the_declared_order():
    with pytest.raises(AtenPassError, match="FoldBatchNormPass must run after RemoveNoOpsPass"):
        AtenPassManager([FoldBatchNormPass(), RemoveNoOpsPass()])
    with pytest.raises(AtenPassError, match="DecomposeMovementPass must run after DecomposeCompositesPass"):
        AtenPassManager([DecomposeMovementPass(), DecomposeCompositesPass()])


# ---- no-op removal ----

class NoOps(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 1)
        self.drop = nn.Dropout(0.5)

    def forward(self, x):
        y = self.drop(self.conv(x)).clone().detach()
        return torch.ops.aten.alias(y) + 1


def test_remove_noops_removes_dropout_clone_detach_alias():
    module, inputs = _prepare(NoOps(), (1, 3, 4, 4))
    gm = capture_module(module, inputs)
    removed = {aten.dropout.default, aten.clone.default, aten.detach.default, aten.alias.default}
    assert removed <= set(_op_counts(gm))
    result = RemoveNoOpsPass()(gm)
    assert result.modified
    assert _op_counts(result.graph_module) == {aten.conv2d.default: 1, aten.add.Tensor: 1}
    _assert_same_output(result.graph_module, module, inputs)
    assert RemoveNoOpsPass()(gm).modified is False


class ProtectiveClone(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 1)

    def forward(self, x):
        y = self.conv(x)
        z = y.clone()
        z.relu_()  # in place on the copy: y must keep its negative values
        return y + z


class CloneBeforeInPlace(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 1)

    def forward(self, x):
        y = self.conv(x)
        z = y.clone()  # keeps the negative values that relu_ below removes from y
        y.relu_()
        return y + z


@pytest.mark.parametrize("make", [ProtectiveClone, CloneBeforeInPlace])
def test_clone_protecting_a_value_from_an_in_place_op_goes_once_the_op_is_functional(make):
    module, inputs = _prepare(make(), (1, 3, 4, 4))
    gm = _run(module, inputs)
    counts = _op_counts(gm)
    assert aten.clone.default not in counts and aten.relu_.default not in counts
    assert counts[aten.relu.default] == 1
    _assert_same_output(gm, module, inputs)


class InPlaceResidual(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 3, 1)

    def forward(self, x):
        out = self.conv(x)
        out += x  # aten.add_.Tensor
        out.mul_(0.5)
        y = out.clamp_(-1.0, 1.0)
        return out * y + out.sigmoid_()


def test_in_place_ops_become_functional_and_later_reads_see_the_write():
    from corten.aten_passes import FunctionalizeInPlacePass

    module, inputs = _prepare(InPlaceResidual(), (1, 3, 4, 4))
    gm = capture_module(module, inputs)
    assert FunctionalizeInPlacePass()(gm).modified
    counts = _op_counts(gm)
    assert not [t for t in counts if t._schema.name.endswith("_")], counts
    assert counts[aten.add.Tensor] == 2 and counts[aten.clamp.default] == 1 and counts[aten.sigmoid.default] == 1
    _assert_same_output(gm, module, inputs)


class WriteThroughView(nn.Module):
    def forward(self, x):
        y = x * 2
        y[:, :1].relu_()  # writes into y through a view: y's new value is cat(relu(y[:, :1]), y[:, 1:])
        return y


def test_write_through_a_view_is_written_back_out_of_place():
    from corten.aten_passes import FunctionalizeInPlacePass

    module, inputs = _prepare(WriteThroughView(), (1, 3, 4, 4))
    gm = capture_module(module, inputs)
    FunctionalizeInPlacePass()(gm)
    counts = _op_counts(gm)
    assert aten.relu_.default not in counts and counts[aten.relu.default] == 1 and counts[aten.cat.default] == 1
    _assert_same_output(gm, module, inputs)


# ---- a whole model ----

def test_mobilenet_v2_has_no_batch_norm_after_the_passes():
    from corten.zoo import get_model

    model, inputs = get_model("mv2-0.35-96")
    before = {k: v.clone() for k, v in model.state_dict().items()}
    gm = capture_module(model, inputs)
    assert _op_counts(gm)[aten.batch_norm.default] == 52
    gm = AtenPassManager()(gm)
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())
    counts = _op_counts(gm)
    assert counts == {aten.conv2d.default: 52, aten.hardtanh.default: 35, aten.add.Tensor: 10,
                      aten.adaptive_avg_pool2d.default: 1, aten.flatten.using_ints: 1, aten.linear.default: 1}
    convs = [n for n in gm.graph.nodes if n.target == aten.conv2d.default]
    assert all(n.args[2] is not None for n in convs)  # every conv got the BN shift as its bias
    assert not _depthwise_nodes(gm)  # every BN in MobileNetV2 folds
    assert all(isinstance(n.meta.get("val"), torch.Tensor) for n in gm.graph.nodes if n.op == "call_function")
    _assert_same_output(gm, model, inputs)


def test_the_former_batch_norm_passes_are_steps_of_the_one_path():
    module, inputs = _prepare(ProducerBN(nn.Conv2d(3, 4, 1), nn.BatchNorm2d(4)), (1, 3, 4, 4))
    gm = capture_module(module, inputs)
    assert FuseBatchNormIntoLinearPass()(gm).modified is False
    assert FuseBatchNormIntoConvPass()(gm).modified is True
    assert FuseBatchNormIntoConvPass()(gm).modified is False
    assert BatchNormToDepthwiseConvPass()(gm).modified is False
    _assert_same_output(gm, module, inputs)
    gm = capture_module(module, inputs)
    manager = AtenPassManager([BatchNormToDepthwiseConvPass()])
    gm = manager(gm)
    assert manager.modified_by == ["BatchNormToDepthwiseConvPass"] and _op_counts(gm) == {aten.conv2d.default: 2}
    _assert_same_output(gm, module, inputs)
    with pytest.raises(ValueError, match="steps"):
        FoldBatchNormPass(("folded",))
