"""CortenQuantizer: the TFLite/CMSIS-NN int8 scheme as PT2E annotations, through prepare/convert,
QAT and composition with other quantizers."""
from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn
from torchao.quantization.pt2e import move_exported_model_to_eval
from torchao.quantization.pt2e.fake_quantize import FusedMovingAvgObsFakeQuantize
from torchao.quantization.pt2e.observer import HistogramObserver, PerChannelMinMaxObserver
from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e, prepare_qat_pt2e
from torchao.quantization.pt2e.quantizer import (
    ComposableQuantizer, DerivedQuantizationSpec, QuantizationSpec, SharedQuantizationSpec,
)

from corten.capture import capture_module
from corten.compiler import default_calibration, unguarded_module
from corten.lowering import CortenPassManager, unlowered_nodes
from corten.ops.registry import lowered_aten_ops
from corten.quantizer import CortenQuantizer
from corten.quantizer.quantizer import quantizable_ops
from corten.quantizer.qat import fast_conv_bn_rewrites
from corten.testing.tester import count_ops

aten = torch.ops.aten
qd = torch.ops.quantized_decomposed


class ConvLinear(nn.Module):
    """conv+relu -> residual add -> max pool -> flatten -> linear."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 6, 3, padding=1)
        self.conv2 = nn.Conv2d(6, 6, 1)
        self.pool = nn.MaxPool2d(2)
        self.fc = nn.Linear(6 * 3 * 3, 4)

    def forward(self, x):
        y = torch.relu(self.conv(x))
        y = y + self.conv2(y)
        return self.fc(torch.flatten(self.pool(y), 1))


X = torch.randn(1, 3, 6, 6, generator=torch.Generator().manual_seed(0))


def _model() -> nn.Module:
    torch.manual_seed(0)
    return ConvLinear().eval()


def _node(gm, target):
    (node,) = [n for n in gm.graph.nodes if n.target == target]
    return node


@pytest.fixture(scope="module")
def annotated():
    q = CortenQuantizer()
    gm = q.transform_for_annotation(capture_module(_model(), (X,)))
    return q.annotate(gm)


def _ann(node):
    return node.meta["quantization_annotation"]


def _resolved(spec):
    """The spec a ``SharedQuantizationSpec`` stands for (its links followed to a real spec)."""
    while isinstance(spec, SharedQuantizationSpec):
        e = spec.edge_or_node
        spec = _ann(e[1]).input_qspec_map[e[0]] if isinstance(e, tuple) else _ann(e).output_qspec
    return spec


def _is_activation_spec(spec) -> bool:
    spec = _resolved(spec)
    return (isinstance(spec, QuantizationSpec) and spec.dtype == torch.int8 and spec.quant_min == -128
            and spec.quant_max == 127 and spec.qscheme == torch.per_tensor_affine)


def _is_weight_spec(spec) -> bool:
    return (isinstance(spec, QuantizationSpec) and spec.dtype == torch.int8 and spec.quant_min == -127
            and spec.quant_max == 127 and spec.qscheme == torch.per_channel_symmetric and spec.ch_axis == 0)


@pytest.mark.parametrize("target", [aten.conv2d.default, aten.linear.default], ids=["conv2d", "linear"])
def test_weighted_op_annotation(annotated, target):
    node = [n for n in annotated.graph.nodes if n.target == target][0]
    x, w, b = node.args[:3]
    specs = _ann(node).input_qspec_map
    assert set(specs) == {x, w, b}
    assert _is_activation_spec(specs[x])
    assert _is_weight_spec(specs[w])
    bias = specs[b]
    assert isinstance(bias, DerivedQuantizationSpec)
    assert bias.dtype == torch.int32 and bias.qscheme == torch.per_channel_symmetric and bias.ch_axis == 0
    assert bias.derived_from == [(x, node), (w, node)]


def test_activation_is_fused_into_the_conv(annotated):
    conv = [n for n in annotated.graph.nodes if n.target == aten.conv2d.default][0]
    (relu,) = conv.users
    assert relu.target == aten.relu.default
    assert _ann(conv).output_qspec is None  # no quantize between conv and relu
    assert _is_activation_spec(_ann(relu).output_qspec)


def test_add_and_shared_ops_annotation(annotated):
    add = _node(annotated, aten.add.Tensor)
    assert len(_ann(add).input_qspec_map) == 2
    assert all(_is_activation_spec(s) for s in _ann(add).input_qspec_map.values())
    assert _is_activation_spec(_ann(add).output_qspec)
    # the pool shares its input edge's qparams, the flatten after it joins that group, and that
    # tensor is the add's output: one group whose members all point at its first member, the add's
    # output, in one link (see quantizer._share_with_roots)
    pool = _node(annotated, aten.max_pool2d.default)
    assert pool.args[0] is add
    members = [_ann(pool).input_qspec_map[add]] + [_ann(_node(annotated, t)).output_qspec
                                                    for t in (aten.max_pool2d.default, aten.flatten.using_ints)]
    assert all(isinstance(s, SharedQuantizationSpec) and s.edge_or_node is add for s in members)


def test_every_lowered_op_is_annotated():
    assert set(lowered_aten_ops()) <= set(quantizable_ops())


# ----------------------------------------------------------------------------- prepare + convert
def _ptq(quantizer) -> tuple[torch.fx.GraphModule, torch.fx.GraphModule]:
    gm = capture_module(_model(), (X,))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        prepared = prepare_pt2e(gm, quantizer)
        with torch.no_grad():
            for sample in default_calibration((X,), 4):
                prepared(*sample)
        observers = [m for m in prepared.modules() if isinstance(m, (HistogramObserver, PerChannelMinMaxObserver))]
        converted = convert_pt2e(prepared)
    return observers, converted


@pytest.fixture(scope="module")
def converted():
    return _ptq(CortenQuantizer())


def _attr(gm, node):
    obj = gm
    for part in node.target.split("."):
        obj = getattr(obj, part)
    return obj


def test_ptq_uses_histogram_and_per_channel_observers(converted):
    observers, _ = converted
    kinds = {type(o) for o in observers}
    assert kinds == {HistogramObserver, PerChannelMinMaxObserver}


@pytest.mark.parametrize("observer", ["histogram", "percentile", "mse"])
def test_range_search_once_searches_each_histogram_once_with_the_same_result(observer, monkeypatch):
    """compiler.Pipeline.convert runs convert_pt2e in ``range_search_once``: an observer asked
    again for its qparams (convert_pt2e, then every bias's derive function) does not search again,
    and gets what a fresh search gives; a changed histogram is searched anew."""
    import copy

    from corten.quantizer.observers import range_search_once

    gm = capture_module(_model(), (X,))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        prepared = prepare_pt2e(gm, CortenQuantizer(observer=observer))
        with torch.no_grad():
            for sample in default_calibration((X,), 4):
                prepared(*sample)
        plain = copy.deepcopy(prepared)  # (torch's pytree specs warn when copied)
    obs = next(m for m in prepared.modules() if isinstance(m, HistogramObserver))
    cls = type(obs)
    searches = []
    search = cls._non_linear_param_search
    monkeypatch.setattr(cls, "_non_linear_param_search", lambda self: searches.append(self) or search(self))
    expected = obs.calculate_qparams()
    assert len(searches) == 1
    with range_search_once(prepared):
        for _ in range(3):
            got = obs.calculate_qparams()
            assert all(torch.equal(a, b) for a, b in zip(got, expected))
        assert len(searches) == 2  # the first call inside the block searched, the others did not
        obs.histogram[0] += 1  # another histogram: searched again
        assert all(torch.equal(a, b) for a, b in zip(obs._non_linear_param_search(), search(obs)))
        assert len(searches) == 3
        obs.histogram[0] -= 1
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            converted = convert_pt2e(prepared)
    assert type(obs) is cls and "_non_linear_param_search" not in vars(obs)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        reference = convert_pt2e(plain)

    def q_params(g):
        return [[a for a in n.args[1:] if not isinstance(a, torch.fx.Node)] for n in g.graph.nodes
                if n.target in (qd.quantize_per_tensor.default, qd.dequantize_per_tensor.default)]

    assert q_params(converted) == q_params(reference)
    assert torch.equal(converted(X), reference(X))


def _observed(i, g):
    """A histogram observer after one of six kinds of calibration data (normal, heavy-tailed,
    one spike, constant, sparse cubes, a narrow peak with two outliers), 2048/256/64 bins."""
    obs = HistogramObserver(dtype=torch.qint8 if i % 2 else torch.quint8, bins=(2048, 256, 64)[i % 3])
    for _ in range(1 + i % 3):
        kind = i % 6
        if kind == 0:
            x = torch.randn(1000, generator=g) * (1 + i)
        elif kind == 1:
            x = torch.randn(5000, generator=g).exp()
        elif kind == 2:
            x = torch.zeros(100)
            x[i % 100] = float(i) + 1
        elif kind == 3:
            x = torch.full((50,), float(i % 7) - 3)
        elif kind == 4:
            x = torch.relu(torch.randn(3000, generator=g)) ** 3
        else:
            x = torch.cat([torch.randn(4000, generator=g) * 0.01, torch.tensor([50.0, -20.0])])
        obs(x)
    return obs


def test_l2_range_search_equals_torchs_search_bit_for_bit():
    """The compiler's range search on Python numbers gives torch's ``_non_linear_param_search``
    range exactly, on 120 histograms of six kinds (the float32 rounding of each quantile bound
    included: a differing bin would move a range by a bin width)."""
    from corten.quantizer.observers import l2_range_search

    g = torch.Generator().manual_seed(0)
    compared = 0
    for i in range(120):
        obs = _observed(i, g)
        if float(obs.histogram.sum()) == 0 or float(obs.max_val) <= float(obs.min_val):
            continue  # torch's calculate_qparams does not search these
        want, got = HistogramObserver._non_linear_param_search(obs), l2_range_search(obs)
        assert torch.equal(want[0], got[0]) and torch.equal(want[1], got[1]), (i, want, got)
        compared += 1
    assert compared >= 90


def test_converted_activations_are_int8_per_tensor(converted):
    _, gm = converted
    qs = [n for n in gm.graph.nodes if n.target in (qd.quantize_per_tensor.default, qd.dequantize_per_tensor.default)]
    assert qs
    for n in qs:
        _, scale, zp, qmin, qmax, dtype = n.args
        assert (qmin, qmax, dtype) == (-128, 127, torch.int8)
        assert scale > 0 and -128 <= zp <= 127


def _conv_quantization(gm, conv):
    """(input scale, int8 weight, weight scales, weight dq args, int32 bias, bias scales, bias dq args)."""
    x_dq, w_dq, b_dq = conv.args[:3]
    assert w_dq.target == qd.dequantize_per_channel.default and b_dq.target == qd.dequantize_per_channel.default
    w, w_scale, w_zp = (_attr(gm, a) for a in w_dq.args[:3])
    b, b_scale, b_zp = (_attr(gm, a) for a in b_dq.args[:3])
    assert torch.all(w_zp == 0) and torch.all(b_zp == 0)
    return x_dq.args[1], w, w_scale, w_dq.args[3:], b, b_scale, b_dq.args[3:]


@pytest.mark.parametrize("target, float_layer", [(aten.conv2d.default, "conv"), (aten.conv2d.default, "conv2"),
                                                 (aten.linear.default, "fc")], ids=["conv", "conv1x1", "linear"])
def test_weights_per_channel_symmetric_and_bias_int32(converted, target, float_layer):
    _, gm = converted
    node = [n for n in gm.graph.nodes if n.target == target][{"conv": 0, "conv2": 1, "fc": 0}[float_layer]]
    x_scale, w, w_scale, w_args, b, b_scale, b_args = _conv_quantization(gm, node)
    layer = getattr(_model(), float_layer)
    assert w_args == (0, -127, 127, torch.int8) and w.dtype == torch.int8
    assert int(w.min()) >= -127 and int(w.max()) <= 127
    c_out = layer.weight.shape[0]
    assert w_scale.shape == (c_out,)
    amax = layer.weight.detach().abs().flatten(1).amax(1)
    torch.testing.assert_close(w_scale.float(), amax / 127, rtol=1e-5, atol=0)
    # each channel's largest weight maps to +-127 and the rest round to the nearest step
    assert torch.equal(w.flatten(1).abs().amax(1), torch.full((c_out,), 127, dtype=torch.int8))
    shape = (-1,) + (1,) * (w.dim() - 1)
    assert float((w.float() * w_scale.view(shape) - layer.weight.detach()).abs().max()) <= float(w_scale.max()) / 2 + 1e-7
    # bias: int32, scale = input_scale * weight_scale exactly (in float32)
    assert b_args == (0, -(2**31) + 1, 2**31 - 1, torch.int32) and b.dtype == torch.int32
    expected = torch.tensor(x_scale, dtype=torch.float32) * w_scale.to(torch.float32)
    assert torch.equal(b_scale.to(torch.float32), expected)
    assert torch.equal(b, torch.round(layer.bias.detach() / expected).to(torch.int32))


def test_converted_graph_lowers_fully(converted):
    _, gm = converted
    ep = torch.export.export(gm, (X,))
    pm = CortenPassManager()
    lowered = pm(unguarded_module(ep))
    assert unlowered_nodes(lowered, pm.refusals) == []
    assert count_ops(lowered.graph) == {
        "corten.quantize_per_tensor.default": 1, "corten.quantized_conv2d.default": 2,
        "corten.quantized_add.default": 1, "corten.quantized_max_pool2d.default": 1, "aten.reshape.default": 1,
        "corten.quantized_linear.default": 1, "corten.dequantize_per_tensor.default": 1}


def test_composable_quantizer_gives_the_same_program(converted):
    _, alone = converted
    _, composed = _ptq(ComposableQuantizer([CortenQuantizer()]))
    assert count_ops(composed.graph) == count_ops(alone.graph)
    params = {n.name: [a for a in n.args[1:] if not isinstance(a, torch.fx.Node)]
              for n in alone.graph.nodes if n.target == qd.quantize_per_tensor.default}
    params_c = {n.name: [a for a in n.args[1:] if not isinstance(a, torch.fx.Node)]
                for n in composed.graph.nodes if n.target == qd.quantize_per_tensor.default}
    assert params == params_c
    assert torch.equal(alone(X), composed(X))


# ----------------------------------------------------------------------------- QAT
class TwoConvBnReLU(nn.Module):
    """Two conv-bn-relu -> pool -> linear heads, one conv with a bias and one without (QAT conv-bn
    folding gives the latter a new float bias)."""

    def __init__(self):
        super().__init__()
        self.with_bias = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU())
        self.without_bias = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU())
        self.fc1, self.fc2 = nn.Linear(8, 4), nn.Linear(8, 4)

    @staticmethod
    def _pool(y):
        return torch.flatten(nn.functional.adaptive_avg_pool2d(y, 1), 1)

    def forward(self, x):
        return self.fc1(self._pool(self.with_bias(x))), self.fc2(self._pool(self.without_bias(x)))


def _qat_prepare(quantizer: CortenQuantizer):
    torch.manual_seed(0)
    gm = unguarded_module(torch.export.export(TwoConvBnReLU().train(), (torch.randn(2, 3, 8, 8),)))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with fast_conv_bn_rewrites():  # Corten's exact shortcut of torchao's conv-bn pattern tracing
            return prepare_qat_pt2e(gm, quantizer)


@pytest.fixture(scope="module")
def qat():
    """Export in train mode, prepare for QAT with the quantizer's defaults, train two steps,
    convert, lower (built once)."""
    prepared = _qat_prepare(CortenQuantizer(is_qat=True))
    fake_quants = [m for m in prepared.modules() if isinstance(m, FusedMovingAvgObsFakeQuantize)]
    opt = torch.optim.SGD(prepared.parameters(), lr=0.05)
    before = [p.detach().clone() for p in prepared.parameters()]
    for _ in range(2):
        xb, yb = torch.randn(2, 3, 8, 8), torch.randint(0, 4, (2,))
        loss = sum(nn.functional.cross_entropy(out, yb) for out in prepared(xb))
        opt.zero_grad()
        loss.backward()
        opt.step()
    trained = any(not torch.equal(a, p) for a, p in zip(before, prepared.parameters()))
    move_exported_model_to_eval(prepared)
    with warnings.catch_warnings(), fast_conv_bn_rewrites():
        warnings.simplefilter("ignore")
        converted = convert_pt2e(prepared)
    x = torch.randn(1, 3, 8, 8)
    pm = CortenPassManager()
    lowered = pm(unguarded_module(torch.export.export(converted, (x,))))
    return fake_quants, trained, converted, lowered, unlowered_nodes(lowered, pm.refusals), x


def _ancestors(node) -> set:
    seen, todo = set(), [node]
    while todo:
        n = todo.pop()
        for a in n.all_input_nodes:
            if a not in seen:
                seen.add(a)
                todo.append(a)
    return seen


def test_qat_prepare_train_convert(qat):
    fake_quants, trained, converted, _, _, _ = qat
    assert len(fake_quants) >= 6 and trained
    ops = count_ops(converted.graph)
    assert "aten.batch_norm.default" not in ops and "aten._native_batch_norm_legit.default" not in ops
    assert ops["aten.conv2d.default"] == 2 and ops["aten.linear.default"] == 2


@pytest.mark.parametrize("head", [0, 1], ids=["conv_with_bias", "conv_without_bias"])
def test_qat_head_lowers_and_matches_the_converted_model(qat, head):
    """Each conv-bn-relu head lowers completely (the bias-less conv gets the float bias of the QAT
    BatchNorm folding, quantized by the lowering) and stays within one output step."""
    _, _, converted, lowered, unlowered, x = qat
    assert unlowered == []
    out = lowered.graph.output_node().args[0][head]
    assert out.target == torch.ops.corten.dequantize_per_tensor.default
    path_ops = [n.target for n in _ancestors(out) if n.op == "call_function"]
    assert path_ops.count(torch.ops.corten.quantized_conv2d.default) == 1
    assert path_ops.count(torch.ops.corten.quantized_linear.default) == 1
    assert all(getattr(t, "namespace", None) == "corten" or t == aten.reshape.default for t in path_ops), path_ops
    with torch.no_grad():
        got, ref = lowered(x)[head], converted(x)[head]
    steps = float((got - ref).abs().max()) / out.args[1]
    assert round(steps, 3) <= 1


def test_qat_without_aten_passes_prepares_too():
    prepared = _qat_prepare(CortenQuantizer(is_qat=True, aten_passes=False))
    assert any(isinstance(m, FusedMovingAvgObsFakeQuantize) for m in prepared.modules())
