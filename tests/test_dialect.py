"""Dialect tests: one small model per lowering rule and variant, run through ``Tester.test_dialect``.

Each case quantizes a float model with ``CortenQuantizer``, lowers it with ``CortenPassManager``
and checks (1) a few op counts of the quantized ATen graph (``ops_before``), (2) the exact Corten
op counts of the lowered program (``ops_after``), no op left unlowered, and (3) that the int8
program agrees with the PT2E fake-quantized model to within ``qtol`` output quantization steps.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

import pytest
import torch
from torch import nn
from torch.fx.interpreter import Interpreter

from corten.testing.tester import Tester as DialectTester, count_ops

Q, DQ = "quantize_per_tensor", "dequantize_per_tensor"
CONV, DW, LINEAR, ADD = "quantized_conv2d", "quantized_depthwise_conv2d", "quantized_linear", "quantized_add"
AVG, MAX = "quantized_avg_pool2d", "quantized_max_pool2d"

# ATen display names (``corten.testing.tester.count_ops``) of the quantized graph.
A_CONV, A_LINEAR, A_ADD = "aten.conv2d.default", "aten.linear.default", "aten.add.Tensor"
A_RELU, A_HARDTANH, A_CLAMP = "aten.relu.default", "aten.hardtanh.default", "aten.clamp.default"
A_BN = "aten.batch_norm.default"
A_DROPOUT = "aten.dropout.default"
QD_Q = "quantized_decomposed.quantize_per_tensor.default"
QD_DQ_CH = "quantized_decomposed.dequantize_per_channel.default"


def lowered(n_inputs: int = 1, **ops: int) -> dict[str, int]:
    """The expected ``Program.op_counts()``: input quantizes, ``ops``, one output dequantize."""
    return {Q: n_inputs, **ops, DQ: 1}


class Fn(nn.Module):
    """A module applying a plain function (for functional ops in a Sequential)."""

    def __init__(self, fn: Callable[[torch.Tensor], torch.Tensor]):
        super().__init__()
        self.fn = fn

    def forward(self, x):
        return self.fn(x)


class TwoConvAdd(nn.Module):
    """``act(conv_a(x) + conv_b(x))``: an add of two quantized tensors with different scales."""

    def __init__(self, act: nn.Module | None = None):
        super().__init__()
        self.a = nn.Conv2d(3, 6, 3, padding=1)
        self.b = nn.Conv2d(3, 6, 1)
        self.act = act or nn.Identity()

    def forward(self, x):
        return self.act(self.a(x) + self.b(x))


class Residual(nn.Module):
    """``x + conv(relu(conv(x)))``: the MobileNetV2 residual shape (one add operand is the input)."""

    def __init__(self, c: int = 4):
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(c, c, 3, padding=1), nn.ReLU(), nn.Conv2d(c, c, 1))

    def forward(self, x):
        return x + self.body(x)


class InputsAdd(nn.Module):
    """The sum of two program inputs: both operands come straight from input quantizes."""

    def forward(self, a, b):
        return a + b


class MultiOp(nn.Module):
    """conv -> depthwise -> residual add -> avg pool -> flatten -> linear."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Sequential(nn.Conv2d(3, 8, 3, stride=2, padding=1), nn.ReLU6())
        self.dw = nn.Sequential(nn.Conv2d(8, 8, 3, padding=1, groups=8), nn.ReLU())
        self.pool = nn.AvgPool2d(2)
        self.fc = nn.Linear(8 * 2 * 2, 10)

    def forward(self, x):
        y = self.conv(x)
        y = y + self.dw(y)
        y = torch.flatten(self.pool(y), 1)
        return self.fc(y)


@dataclass
class Case:
    """One dialect test: a seeded model, its input shape(s) and the expected graphs."""

    id: str
    build: Callable[[], nn.Module]
    shapes: tuple[tuple[int, ...], ...]
    ops_before: dict[str, int]
    ops_after: dict[str, int]
    qtol: float = 1
    absent_before: tuple[str, ...] = field(default=())  # ATen ops the ATen passes must have removed


def conv(act: nn.Module | None = None, gain: float = 1.0, **kw) -> Callable[[], nn.Module]:
    """A Conv2d (+ activation); ``gain`` scales the weights so that outputs reach a clamp's bounds."""

    def build():
        args = dict(kw)
        layer = nn.Conv2d(args.pop("c_in", 3), args.pop("c_out", 8), args.pop("k", 3), **args)
        with torch.no_grad():
            layer.weight.mul_(gain)
        return nn.Sequential(layer, *([act] if act is not None else []))

    return build


def seq(*make: Callable[[], nn.Module]) -> Callable[[], nn.Module]:
    return lambda: nn.Sequential(*(m() for m in make))


ONE_CONV = {A_CONV: 1}
CONV_CASES = [
    Case("conv_relu", conv(nn.ReLU(), padding=1), ((1, 3, 8, 8),), {**ONE_CONV, A_RELU: 1, QD_DQ_CH: 2}, lowered(**{CONV: 1})),
    Case("conv_relu6", conv(nn.ReLU6(), gain=8, padding=1), ((1, 3, 8, 8),), {**ONE_CONV, A_HARDTANH: 1},
         lowered(**{CONV: 1})),
    Case("conv_hardtanh", conv(nn.Hardtanh(-1.0, 1.0), gain=3, padding=1), ((1, 3, 8, 8),), {**ONE_CONV, A_HARDTANH: 1},
         lowered(**{CONV: 1})),
    Case("conv_clamp", conv(Fn(lambda x: torch.clamp(x, min=0.0, max=2.0)), gain=3, padding=1), ((1, 3, 8, 8),),
         {**ONE_CONV, A_CLAMP: 1}, lowered(**{CONV: 1})),
    Case("conv_no_activation", conv(padding=1), ((1, 3, 8, 8),), {**ONE_CONV, QD_Q: 2}, lowered(**{CONV: 1})),
    Case("conv_no_bias", conv(nn.ReLU(), padding=1, bias=False), ((1, 3, 8, 8),), {**ONE_CONV, QD_DQ_CH: 1},
         lowered(**{CONV: 1})),
    Case("conv_stride2", conv(nn.ReLU(), stride=2, padding=1), ((1, 3, 9, 9),), ONE_CONV, lowered(**{CONV: 1})),
    Case("conv_padding0", conv(padding=0), ((1, 3, 8, 8),), ONE_CONV, lowered(**{CONV: 1})),
    Case("conv_padding2", conv(k=5, padding=2), ((1, 3, 8, 8),), ONE_CONV, lowered(**{CONV: 1})),
    Case("conv_dilation2", conv(nn.ReLU(), padding=2, dilation=2), ((1, 3, 9, 9),), ONE_CONV,
         lowered(**{CONV: 1})),
    Case("conv_kernel_3x1", conv(k=(3, 1), padding=(1, 0)), ((1, 3, 8, 6),), ONE_CONV, lowered(**{CONV: 1})),
    Case("conv_kernel_1x5_stride_2x1", conv(nn.ReLU(), k=(1, 5), stride=(2, 1), padding=(0, 2)), ((1, 3, 6, 10),),
         ONE_CONV, lowered(**{CONV: 1})),
    Case("conv_1x1", conv(c_in=5, c_out=7, k=1), ((1, 5, 4, 4),), ONE_CONV, lowered(**{CONV: 1})),
    Case("conv_odd_sizes", conv(nn.ReLU(), c_in=5, c_out=3, k=3, stride=2, padding=1), ((1, 5, 13, 7),), ONE_CONV,
         lowered(**{CONV: 1})),
    Case("depthwise_mult1", conv(nn.ReLU6(), gain=4, c_in=6, c_out=6, padding=1, groups=6), ((1, 6, 8, 8),),
         {**ONE_CONV, A_HARDTANH: 1}, lowered(**{DW: 1})),
    Case("depthwise_mult2", conv(c_in=4, c_out=8, padding=1, groups=4), ((1, 4, 7, 7),), ONE_CONV,
         lowered(**{DW: 1})),
    Case("depthwise_stride2", conv(nn.ReLU(), c_in=8, c_out=8, stride=2, padding=1, groups=8), ((1, 8, 9, 9),),
         ONE_CONV, lowered(**{DW: 1})),
    Case("depthwise_no_bias_5x5", conv(c_in=3, c_out=3, k=5, padding=2, groups=3, bias=False), ((1, 3, 8, 8),),
         ONE_CONV, lowered(**{DW: 1})),
    Case("conv_relu_inplace", conv(nn.ReLU(inplace=True), padding=1), ((1, 3, 6, 6),),
         {**ONE_CONV, "aten.relu.default": 1}, lowered(**{CONV: 1})),
    Case("conv_relu6_inplace", conv(nn.ReLU6(inplace=True), gain=8, padding=1), ((1, 3, 6, 6),),
         {**ONE_CONV, "aten.hardtanh.default": 1}, lowered(**{CONV: 1})),
    Case("conv_1x1_stride2", conv(nn.ReLU(), c_in=4, c_out=6, k=1, stride=2), ((1, 4, 7, 7),), ONE_CONV,
         lowered(**{CONV: 1})),
    Case("depthwise_dilation2", conv(c_in=4, c_out=4, padding=2, dilation=2, groups=4), ((1, 4, 7, 7),), ONE_CONV,
         lowered(**{DW: 1})),
    Case("conv_batchnorm_relu", seq(lambda: nn.Conv2d(3, 8, 3, padding=1, bias=False), lambda: _bn2d(8),
                                    nn.ReLU),
         ((1, 3, 8, 8),), {**ONE_CONV, A_RELU: 1}, lowered(**{CONV: 1}), absent_before=(A_BN,)),
    Case("depthwise_batchnorm", seq(lambda: nn.Conv2d(4, 4, 3, padding=1, groups=4), lambda: _bn2d(4)),
         ((1, 4, 6, 6),), ONE_CONV, lowered(**{DW: 1}), absent_before=(A_BN,)),
]


def _bn2d(c: int) -> nn.BatchNorm2d:
    return _randomized_bn(nn.BatchNorm2d(c))


def _bn1d(c: int) -> nn.BatchNorm1d:
    return _randomized_bn(nn.BatchNorm1d(c))


def _randomized_bn(bn):
    """A BatchNorm that is not an identity, so folding it wrong shows in the numbers."""
    c = bn.num_features
    with torch.no_grad():
        bn.weight.copy_(torch.rand(c) + 0.5)
        bn.bias.copy_(torch.randn(c) * 0.2)
        bn.running_mean.copy_(torch.randn(c) * 0.3)
        bn.running_var.copy_(torch.rand(c) + 0.5)
    return bn


ONE_LINEAR = {A_LINEAR: 1}
LINEAR_CASES = [
    Case("linear", lambda: nn.Linear(12, 5), ((1, 12),), {**ONE_LINEAR, QD_DQ_CH: 2}, lowered(**{LINEAR: 1})),
    Case("linear_relu", seq(lambda: nn.Linear(12, 5), nn.ReLU), ((1, 12),), {**ONE_LINEAR, A_RELU: 1},
         lowered(**{LINEAR: 1})),
    Case("linear_relu6", seq(lambda: nn.Linear(12, 5), nn.ReLU6), ((1, 12),), {**ONE_LINEAR, A_HARDTANH: 1},
         lowered(**{LINEAR: 1})),
    Case("linear_clamp", seq(lambda: nn.Linear(12, 5), lambda: Fn(lambda x: x.clamp(-0.5, 0.5))), ((1, 12),),
         {**ONE_LINEAR, A_CLAMP: 1}, lowered(**{LINEAR: 1})),
    Case("linear_3d_input", lambda: nn.Linear(12, 5), ((1, 3, 12),), ONE_LINEAR, lowered(**{LINEAR: 1})),
    Case("linear_no_bias", lambda: nn.Linear(9, 7, bias=False), ((1, 9),), {**ONE_LINEAR, QD_DQ_CH: 1}, lowered(**{LINEAR: 1})),
    Case("linear_batchnorm1d", seq(lambda: nn.Linear(12, 6), lambda: _bn1d(6)), ((1, 12),), ONE_LINEAR,
         lowered(**{LINEAR: 1}), absent_before=(A_BN,)),
    Case("linear_chain_with_dropout", seq(lambda: nn.Linear(10, 16), nn.ReLU, lambda: nn.Dropout(0.5),
                                          lambda: nn.Linear(16, 4)),
         ((1, 10),), {A_LINEAR: 2}, lowered(**{LINEAR: 2}), absent_before=(A_DROPOUT,)),
]

# An add of two conv outputs inherits their one-step differences scaled by s_conv / s_add (> 1
# here), so a model with ops in front of the add may be two output steps from fake-quant.
ADD_CASES = [
    Case("add", TwoConvAdd, ((1, 3, 6, 6),), {A_ADD: 1, A_CONV: 2}, lowered(**{CONV: 2, ADD: 1})),
    Case("add_relu", lambda: TwoConvAdd(nn.ReLU()), ((1, 3, 6, 6),), {A_ADD: 1, A_RELU: 1},
         lowered(**{CONV: 2, ADD: 1}), qtol=2),
    Case("add_residual", Residual, ((1, 4, 5, 5),), {A_ADD: 1, A_CONV: 2}, lowered(**{CONV: 2, ADD: 1})),
    Case("add_two_inputs", InputsAdd, ((1, 3, 5, 7), (1, 3, 5, 7)), {A_ADD: 1}, lowered(2, **{ADD: 1})),
]

# avg pools: CMSIS-NN rounds the average half away from zero where fake-quant rounds half to
# even, so they may differ by one step; max pools only select values and must be exact.
POOL_CASES = [
    Case("avg_pool2d", lambda: nn.AvgPool2d(2), ((1, 4, 8, 8),), {"aten.avg_pool2d.default": 1},
         lowered(**{AVG: 1})),
    Case("avg_pool2d_odd_input_stride", lambda: nn.AvgPool2d(3, stride=2), ((1, 3, 9, 7),),
         {"aten.avg_pool2d.default": 1}, lowered(**{AVG: 1})),
    Case("avg_pool2d_padding_exclude_pad", lambda: nn.AvgPool2d(3, stride=1, padding=1, count_include_pad=False),
         ((1, 4, 6, 6),), {"aten.avg_pool2d.default": 1}, lowered(**{AVG: 1})),
    Case("adaptive_avg_pool2d_1", lambda: nn.AdaptiveAvgPool2d(1), ((1, 8, 5, 5),),
         {"aten.adaptive_avg_pool2d.default": 1}, lowered(**{AVG: 1})),
    Case("mean_keepdim", lambda: Fn(lambda x: x.mean((2, 3), keepdim=True)), ((1, 6, 4, 6),),
         {"aten.mean.dim": 1}, lowered(**{AVG: 1})),
    Case("mean_no_keepdim", lambda: Fn(lambda x: x.mean((2, 3))), ((1, 6, 4, 6),),
         {"aten.mean.dim": 1}, lowered(**{AVG: 1})),
    Case("mean_negative_dims", lambda: Fn(lambda x: x.mean((-1, -2))), ((1, 5, 3, 3),),
         {"aten.mean.dim": 1}, lowered(**{AVG: 1})),
    Case("max_pool2d", lambda: nn.MaxPool2d(2), ((1, 4, 8, 8),), {"aten.max_pool2d.default": 1},
         lowered(**{MAX: 1}), qtol=0),
    Case("max_pool2d_padding", lambda: nn.MaxPool2d(3, stride=2, padding=1), ((1, 4, 7, 9),),
         {"aten.max_pool2d.default": 1}, lowered(**{MAX: 1}), qtol=0),
    Case("conv_relu_max_pool", seq(lambda: nn.Conv2d(3, 4, 3), nn.ReLU, lambda: nn.MaxPool2d(2)), ((1, 3, 9, 9),),
         {A_CONV: 1, "aten.max_pool2d.default": 1}, lowered(**{CONV: 1, MAX: 1})),
]

SHAPE_CASES = [
    Case("flatten", lambda: nn.Flatten(), ((1, 3, 4, 5),), {"aten.flatten.using_ints": 1}, lowered(), qtol=0),
    Case("view", lambda: Fn(lambda x: x.view(1, -1)), ((1, 2, 3, 5),), {"aten.view.default": 1}, lowered(), qtol=0),
    Case("reshape", lambda: Fn(lambda x: x.reshape(1, 6, 5)), ((1, 30),), {}, lowered(), qtol=0),
    Case("unsqueeze", lambda: Fn(lambda x: x.unsqueeze(1)), ((1, 12),), {"aten.unsqueeze.default": 1}, lowered(),
         qtol=0),
    Case("squeeze", lambda: Fn(lambda x: x.squeeze(-1)), ((1, 4, 3, 1),), {}, lowered(), qtol=0),
    Case("conv_flatten_linear", seq(lambda: nn.Conv2d(3, 4, 3, stride=2), nn.ReLU, nn.Flatten,
                                    lambda: nn.Linear(4 * 3 * 3, 5)),
         ((1, 3, 7, 7),), {A_CONV: 1, A_LINEAR: 1, "aten.flatten.using_ints": 1}, lowered(**{CONV: 1, LINEAR: 1})),
    Case("dropout_removed", lambda: nn.Sequential(nn.Dropout(0.3), nn.AvgPool2d(2)), ((1, 2, 4, 4),),
         {"aten.avg_pool2d.default": 1}, lowered(**{AVG: 1}), absent_before=(A_DROPOUT,)),
    Case("conv_dropout_conv", seq(lambda: nn.Conv2d(3, 4, 3, padding=1), nn.ReLU, lambda: nn.Dropout2d(0.5),
                                  lambda: nn.Conv2d(4, 2, 1)),
         ((1, 3, 5, 5),), {A_CONV: 2}, lowered(**{CONV: 2}), absent_before=(A_DROPOUT, "aten.feature_dropout.default")),
]

MULTI_CASES = [
    Case("conv_dw_add_pool_flatten_linear", MultiOp, ((1, 3, 8, 8),),
         {A_CONV: 2, A_ADD: 1, "aten.avg_pool2d.default": 1, "aten.flatten.using_ints": 1, A_LINEAR: 1},
         lowered(**{CONV: 1, DW: 1, ADD: 1, AVG: 1, LINEAR: 1}), qtol=2),
]

ALL_CASES = CONV_CASES + LINEAR_CASES + ADD_CASES + POOL_CASES + SHAPE_CASES + MULTI_CASES


def make_tester(case: Case, seed: int = 0) -> DialectTester:
    torch.manual_seed(seed)
    model = case.build().eval()
    g = torch.Generator().manual_seed(seed + 1)
    inputs = tuple(torch.randn(s, generator=g) for s in case.shapes)
    return DialectTester(model, inputs)


@pytest.mark.parametrize("case", ALL_CASES, ids=lambda c: c.id)
def test_lowering_rule(case: Case):
    tester = make_tester(case)
    report = tester.test_dialect(ops_before=case.ops_before, ops_after=case.ops_after,
                                 qtol=case.qtol)
    before = count_ops(tester.quantized.graph)
    for gone in case.absent_before:
        assert gone not in before, f"{gone} should have been removed before quantization: {before}"
    lowered_ops = count_ops(tester.program.ep.graph)
    for gone in case.absent_before:
        assert gone not in lowered_ops
    # Only Corten ops and shape-only reshapes remain in the lowered program.
    leftovers = {k: v for k, v in lowered_ops.items() if not k.startswith("corten.") and k != "aten.reshape.default"}
    assert not leftovers, leftovers
    assert report.cosine_vs_float > 0.97, report


def test_one_output_step_is_checked():
    """``qtol=0`` is not vacuous: a conv+relu is within one step of the fake-quantized model but
    not always equal to it (the int8 kernels round differently from float fake-quant)."""
    tester = make_tester(CONV_CASES[0])
    with pytest.raises(AssertionError, match="steps > 0"):
        tester.test_dialect(ops_before={}, ops_after=CONV_CASES[0].ops_after, qtol=0)


def test_one_step_difference_counts_as_one_step():
    """A one-step difference reads as 1.000003 steps in float32 (conv without bias); it must
    still pass ``qtol=1``."""
    case = next(c for c in CONV_CASES if c.id == "conv_no_bias")
    make_tester(case).test_dialect(ops_before={}, ops_after=case.ops_after, qtol=1)


def test_wrong_expected_ops_fail():
    """The Tester rejects expectations that do not match (before and after lowering)."""
    case = CONV_CASES[0]
    tester = make_tester(case).lower()
    with pytest.raises(AssertionError, match="ops after lowering"):
        tester.test_dialect(ops_before={}, ops_after=lowered(**{DW: 1}), qtol=1)
    with pytest.raises(AssertionError, match="ops before lowering"):
        tester.test_dialect(ops_before={A_CONV: 2}, ops_after=case.ops_after, qtol=1)


ACTIVATION_BOUNDS = {"conv_relu": (0.0, None), "conv_relu6": (0.0, 6.0), "conv_hardtanh": (-1.0, 1.0),
                     "conv_clamp": (0.0, 2.0)}


def _on_grid(x: float, scale: float, zero_point: int) -> int:
    """``x`` on the output's int8 grid, rounding half away from zero, saturated."""
    steps = math.floor(abs(x) / scale + 0.5)
    return max(-128, min(127, zero_point + (steps if x >= 0 else -steps)))


@pytest.mark.parametrize("case_id", list(ACTIVATION_BOUNDS))
def test_fused_activation_becomes_int8_bounds(case_id):
    """ReLU/ReLU6/hardtanh/clamp fold into the conv's activation_min/max (no separate op), and
    the program's outputs reach but do not pass those bounds."""
    case = next(c for c in CONV_CASES if c.id == case_id)
    tester = make_tester(case).lower()
    (node,) = [n for n in tester.program.ep.graph.nodes if n.target == torch.ops.corten.quantized_conv2d.default]
    out = tester.program.outputs[0]
    lo, hi = ACTIVATION_BOUNDS[case_id]
    act_min, act_max = node.args[-2], node.args[-1]
    assert act_min == _on_grid(lo, out.scale, out.zero_point)
    assert act_max == (127 if hi is None else _on_grid(hi, out.scale, out.zero_point))
    y = tester.program.run(*tester.example_inputs)
    assert float(y.min()) == pytest.approx((act_min - out.zero_point) * out.scale)
    if hi is not None:  # the weights were scaled up so that the upper clamp is reached
        assert float(y.max()) == pytest.approx((act_max - out.zero_point) * out.scale)


# ----------------------------------------------------------------------------- MobileNetV2
MV2_OPS = {Q: 1, CONV: 35, DW: 17, ADD: 10, AVG: 1, LINEAR: 1, DQ: 1}
# End to end, one-step rounding differences per layer compound through 52 convolutions of a
# random-weight network (measured: 13 output steps, int8-vs-float cosine 0.987);
# test_mobilenet_v2_each_op_within_one_step checks the ops one at a time.
MV2_END_TO_END_QTOL = 24


@pytest.fixture(scope="module")
def mv2_tester():
    from corten.compiler import default_calibration
    from corten.zoo import get_model

    model, inputs = get_model("mv2-0.35-96")
    return DialectTester(model, inputs, calibration=default_calibration(inputs, 2)).lower()


def test_mobilenet_v2_is_fully_lowered(mv2_tester, capsys):
    report = mv2_tester.test_dialect(
        ops_before={A_CONV: 52, A_ADD: 10, A_LINEAR: 1, "aten.adaptive_avg_pool2d.default": 1, A_HARDTANH: 35,
                    "aten.hardtanh_.default": 0, A_BN: 0, A_DROPOUT: 0},
        ops_after=MV2_OPS, qtol=MV2_END_TO_END_QTOL, n_inputs=2)
    with capsys.disabled():
        print(f"\nmv2-0.35-96 DialectReport: {report}")
    assert report.cosine_vs_float > 0.95, report
    lowered_ops = count_ops(mv2_tester.program.ep.graph)
    assert set(lowered_ops) == {f"corten.{name}.default" for name in MV2_OPS} | {"aten.reshape.default"}, lowered_ops


class _Int8Outputs(Interpreter):
    """Runs a graph and records the int8 result of every node ``keep(node)`` selects, in order."""

    def __init__(self, gm, keep):
        super().__init__(gm)
        self.keep, self.values = keep, []

    def run_node(self, n):
        result = super().run_node(n)
        if self.keep(n):
            self.values.append(result)
        return result


class _OneOpAtATime(Interpreter):
    """Runs the lowered program but feeds every Corten op the fake-quantized model's int8 inputs
    (``reference``: the fake-quant int8 tensors aligned with the Corten ops), recording the
    largest difference of each op's output in int8 steps."""

    def __init__(self, gm, reference: dict):
        super().__init__(gm)
        self.reference, self.steps = reference, {}

    def run_node(self, n):
        result = super().run_node(n)
        if n.name not in self.reference:
            return result
        ref = self.reference[n.name]
        self.steps[n.name] = int((result.int() - ref.int()).abs().max())
        return ref.contiguous(memory_format=torch.channels_last) if ref.dim() == 4 else ref


def _is_int8_corten_op(n) -> bool:
    """A Corten op with an int8 result (everything but the final dequantize)."""
    return (n.op == "call_function" and getattr(n.target, "namespace", None) == "corten"
            and n.target != torch.ops.corten.dequantize_per_tensor.default)


def test_mobilenet_v2_each_op_within_one_step(mv2_tester):
    """Given the fake-quantized model's int8 inputs, every Corten op of MobileNetV2 reproduces the
    fake-quantized model's int8 output to within one step."""
    program, converted = mv2_tester.program, mv2_tester.converted
    x = mv2_tester.example_inputs
    qd_quantize = torch.ops.quantized_decomposed.quantize_per_tensor.default
    with torch.no_grad():
        fq = _Int8Outputs(converted, lambda n: n.target == qd_quantize)
        fq.run(*x)
    ops = [n for n in program.module().graph.nodes if _is_int8_corten_op(n)]
    # Align each Corten op with the next fake-quant quantize of the same shape (in graph order).
    reference, pending = {}, list(fq.values)
    for n in ops:
        shape = tuple(n.meta["val"].shape)
        while pending and tuple(pending[0].shape) != shape:
            pending.pop(0)
        assert pending, f"no fake-quantized tensor of shape {shape} for {n.name}"
        reference[n.name] = pending.pop(0)
    runner = _OneOpAtATime(program.module(), reference)
    with torch.no_grad():
        runner.run(*x)
    assert len(runner.steps) == sum(MV2_OPS.values()) - 1
    assert runner.steps["quantize_per_tensor"] == 0
    worst = {name: s for name, s in runner.steps.items() if s > 1}
    assert not worst, worst
