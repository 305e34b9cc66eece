"""Dialect tests of ``quantized_lut``: every activation lowered standalone, and relu/clamp fused
into their producer versus standalone (``Tester.test_dialect`` on small seeded models)."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from corten.ops.lut import SIGMOID_QPARAMS, TANH_QPARAMS, build_table, real_function
from corten.testing.tester import Tester, count_ops

Q, DQ = "quantize_per_tensor", "dequantize_per_tensor"
CONV, LINEAR, ADD, MAX, AVG, LUT = ("quantized_conv2d", "quantized_linear", "quantized_add", "quantized_max_pool2d",
                                    "quantized_avg_pool2d", "quantized_lut")
A_CONV, A_MAX = "aten.conv2d.default", "aten.max_pool2d.default"


def lowered(**ops: int) -> dict[str, int]:
    return {Q: 1, **ops, DQ: 1}


class Fn(nn.Module):
    def __init__(self, fn: Callable[[torch.Tensor], torch.Tensor]):
        super().__init__()
        self.fn = fn

    def forward(self, x):
        return self.fn(x)


def after_conv(act: nn.Module) -> Callable[[], nn.Module]:
    return lambda: nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), act)


def after_pool(act: nn.Module) -> Callable[[], nn.Module]:
    """A max pool keeps its input's quantization and is exact, so the activation is the only
    op that rounds (and it cannot fuse into a pool)."""
    return lambda: nn.Sequential(nn.MaxPool2d(2), act)


@dataclass
class Case:
    id: str
    build: Callable[[], nn.Module]
    aten_op: str  # the ATen op that must be in the quantized graph (in-place forms arrive functional)
    ops_after: dict[str, int]
    shape: tuple[int, ...] = (1, 3, 8, 8)
    qtol: float = 1


FUNCTION_CASES = [
    Case("hardswish", after_pool(nn.Hardswish()), "aten.hardswish.default", lowered(**{MAX: 1, LUT: 1})),
    Case("hardswish_inplace", after_pool(nn.Hardswish(inplace=True)), "aten.hardswish.default",
         lowered(**{MAX: 1, LUT: 1})),
    Case("hardsigmoid", after_pool(nn.Hardsigmoid()), "aten.hardsigmoid.default", lowered(**{MAX: 1, LUT: 1})),
    Case("hardsigmoid_inplace", after_pool(nn.Hardsigmoid(inplace=True)), "aten.hardsigmoid.default",
         lowered(**{MAX: 1, LUT: 1})),
    Case("sigmoid", after_pool(nn.Sigmoid()), "aten.sigmoid.default", lowered(**{MAX: 1, LUT: 1})),
    Case("tanh", after_pool(nn.Tanh()), "aten.tanh.default", lowered(**{MAX: 1, LUT: 1})),
    Case("silu", after_pool(nn.SiLU()), "aten.silu.default", lowered(**{MAX: 1, LUT: 1})),
    Case("silu_inplace", after_pool(nn.SiLU(inplace=True)), "aten.silu.default", lowered(**{MAX: 1, LUT: 1})),
    Case("gelu", after_pool(nn.GELU()), "aten.gelu.default", lowered(**{MAX: 1, LUT: 1})),
    Case("gelu_tanh", after_pool(nn.GELU(approximate="tanh")), "aten.gelu.default", lowered(**{MAX: 1, LUT: 1})),
    Case("elu_alpha_0.5", after_pool(nn.ELU(0.5)), "aten.elu.default", lowered(**{MAX: 1, LUT: 1})),
    Case("elu_inplace", after_pool(nn.ELU(inplace=True)), "aten.elu.default", lowered(**{MAX: 1, LUT: 1})),
    Case("leaky_relu_0.2", after_pool(nn.LeakyReLU(0.2)), "aten.leaky_relu.default", lowered(**{MAX: 1, LUT: 1})),
    Case("leaky_relu_inplace", after_pool(nn.LeakyReLU(0.1, inplace=True)), "aten.leaky_relu.default",
         lowered(**{MAX: 1, LUT: 1})),
    Case("hardswish_after_conv", after_conv(nn.Hardswish()), "aten.hardswish.default", lowered(**{CONV: 1, LUT: 1}),
         qtol=2),
    Case("sigmoid_at_input", lambda: nn.Sigmoid(), "aten.sigmoid.default", lowered(**{LUT: 1})),
    Case("gelu_on_2d", lambda: nn.Sequential(nn.Linear(6, 5), nn.GELU()), "aten.gelu.default",
         lowered(**{LINEAR: 1, LUT: 1}), shape=(1, 6), qtol=2),
]

# relu / relu6 / hardtanh / clamp where they cannot fuse into a conv/linear/add.
STANDALONE_CLAMP_CASES = [
    Case("relu_after_pool", after_pool(nn.ReLU()), "aten.relu.default", lowered(**{MAX: 1, LUT: 1}), qtol=0),
    Case("relu_inplace_after_pool", after_pool(nn.ReLU(inplace=True)), "aten.relu.default",
         lowered(**{MAX: 1, LUT: 1}), qtol=0),
    Case("relu6_after_pool", after_pool(nn.ReLU6()), "aten.hardtanh.default", lowered(**{MAX: 1, LUT: 1}), qtol=0),
    Case("relu6_functional", after_pool(Fn(F.relu6)), "aten.relu6.default", lowered(**{MAX: 1, LUT: 1}),
         qtol=0),
    Case("hardtanh_after_pool", after_pool(nn.Hardtanh(-0.5, 0.75)), "aten.hardtanh.default",
         lowered(**{MAX: 1, LUT: 1}), qtol=0),
    Case("clamp_after_pool", after_pool(Fn(lambda x: torch.clamp(x, -1.5, 0.4))), "aten.clamp.default",
         lowered(**{MAX: 1, LUT: 1}), qtol=0),
    Case("clamp_min_only", after_pool(Fn(lambda x: x.clamp(min=0.3))), "aten.clamp.default",
         lowered(**{MAX: 1, LUT: 1}), qtol=0),
    Case("relu_at_input", lambda: nn.ReLU(), "aten.relu.default", lowered(**{LUT: 1}), qtol=0),
    Case("clamp_at_input", lambda: Fn(lambda x: torch.clamp(x, -0.25, 1.0)), "aten.clamp.default",
         lowered(**{LUT: 1}), qtol=0),
]


def _tester(case: Case, seed: int = 0) -> Tester:
    torch.manual_seed(seed)
    model = case.build().eval()
    x = torch.randn(case.shape, generator=torch.Generator().manual_seed(seed + 1)) * 2
    return Tester(model, (x,))


@pytest.mark.parametrize("case", FUNCTION_CASES + STANDALONE_CLAMP_CASES, ids=lambda c: c.id)
def test_activation_lowers_to_lut(case: Case):
    tester = _tester(case)
    report = tester.test_dialect(ops_before={case.aten_op: 1}, ops_after=case.ops_after, qtol=case.qtol)
    assert report.cosine_vs_float > 0.97, report
    # The table is the one build_table makes from the node's function and the qparams around it.
    (lut_node,) = [n for n in tester.program.ep.graph.nodes if n.target == torch.ops.corten.quantized_lut.default]
    assert tester.program.run_int8(*tester.example_inputs)[0].dtype == torch.int8
    table = _constant(tester, lut_node.args[1])
    assert table.dtype == torch.int8 and table.shape == (256,)


def _constant(tester: Tester, node) -> torch.Tensor:
    ep = tester.program.ep
    sig = ep.graph_signature
    key = {**sig.inputs_to_buffers, **sig.inputs_to_parameters, **sig.inputs_to_lifted_tensor_constants}[node.name]
    return ep.constants[key] if key in ep.constants else ep.state_dict[key]


def _quantized_node(tester: Tester, target):
    (node,) = [n for n in tester.quantized.graph.nodes if n.target == target]
    return node


def _qparams_around(node) -> tuple[tuple[float, int], tuple[float, int]]:
    dq, (q,) = node.args[0], list(node.users)
    return (float(dq.args[1]), int(dq.args[2])), (float(q.args[1]), int(q.args[2]))


@pytest.mark.parametrize("case_id, target", [
    ("hardswish", torch.ops.aten.hardswish.default), ("gelu_tanh", torch.ops.aten.gelu.default),
    ("elu_alpha_0.5", torch.ops.aten.elu.default), ("clamp_after_pool", torch.ops.aten.clamp.default),
])
def test_table_comes_from_function_and_qparams(case_id, target):
    """The lowered table equals build_table(node's function, input qparams, output qparams)."""
    case = next(c for c in FUNCTION_CASES + STANDALONE_CLAMP_CASES if c.id == case_id)
    tester = _tester(case).lower()
    node = _quantized_node(tester, target)
    (s_in, zp_in), (s_out, zp_out) = _qparams_around(node)
    (lut_node,) = [n for n in tester.program.ep.graph.nodes if n.target == torch.ops.corten.quantized_lut.default]
    assert torch.equal(_constant(tester, lut_node.args[1]), build_table(real_function(node), s_in, zp_in, s_out, zp_out))


@pytest.mark.parametrize("case_id, target, fixed", [
    ("sigmoid", torch.ops.aten.sigmoid.default, SIGMOID_QPARAMS),
    ("tanh", torch.ops.aten.tanh.default, TANH_QPARAMS),
])
def test_sigmoid_tanh_have_fixed_output_qparams(case_id, target, fixed):
    """TFLite's fixed output quantization: sigmoid scale 1/256 zp -128, tanh scale 1/128 zp 0."""
    case = next(c for c in FUNCTION_CASES if c.id == case_id)
    tester = _tester(case).lower()
    _, out = _qparams_around(_quantized_node(tester, target))
    assert out == (fixed[0], fixed[1])


# ----------------------------------------------------------------------------- fused vs standalone
def _tolerance(tester: Tester) -> int:
    """Output steps allowed vs fake-quant: the int8 conv/add/pool before a standalone clamp table
    may be one step off, which a slope-1 clamp turns into up to s_in / s_out output steps, plus the
    table's own rounding (at least 2, as for the other compound cases in test_dialect.py)."""
    from corten.ops.lut import CLAMPS

    ratios = [_qparams_around(n)[0][0] / _qparams_around(n)[1][0] for n in tester.quantized.graph.nodes
              if n.target in CLAMPS and "dequantize" in str(n.args[0].target)]
    return max([2] + [1 + math.ceil(r) for r in ratios])

class ConvTwoUsers(nn.Module):
    """The conv output feeds the relu and an add: the relu cannot fuse into the conv."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)

    def forward(self, x):
        y = self.conv(x)
        return torch.relu(y) + y


FUSED_VS_STANDALONE = [
    ("conv_relu_fused", lambda: nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU()), lowered(**{CONV: 1})),
    ("conv_relu6_inplace_fused", lambda: nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU6(inplace=True)),
     lowered(**{CONV: 1})),
    ("conv_clamp_fused", lambda: nn.Sequential(nn.Conv2d(3, 4, 3, padding=1),
                                               Fn(lambda x: x.clamp(-0.5, 0.5))), lowered(**{CONV: 1})),
    ("linear_relu_fused", lambda: nn.Sequential(nn.Linear(6, 4), nn.ReLU()), lowered(**{LINEAR: 1})),
    ("conv_relu_two_users", ConvTwoUsers, lowered(**{CONV: 1, LUT: 1, ADD: 1})),
    ("pool_relu_standalone", after_pool(nn.ReLU()), lowered(**{MAX: 1, LUT: 1})),
    ("conv_pool_clamp", lambda: nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.AvgPool2d(2),
                                              Fn(lambda x: x.clamp(min=-0.5))), lowered(**{CONV: 1, AVG: 1, LUT: 1})),
    ("conv_relu_then_pool_relu", lambda: nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                                                       nn.ReLU6()), lowered(**{CONV: 1, MAX: 1, LUT: 1})),
]


@pytest.mark.parametrize("cid, build, ops_after", FUSED_VS_STANDALONE, ids=[c[0] for c in FUSED_VS_STANDALONE])
def test_relu_clamp_fused_or_standalone(cid, build, ops_after):
    shape = (1, 6) if cid.startswith("linear") else (1, 3, 8, 8)
    tester = _tester(Case(cid, build, "", ops_after, shape=shape)).lower()
    report = tester.test_dialect(ops_before={}, ops_after=ops_after, qtol=_tolerance(tester))
    assert report.cosine_vs_float > 0.97, report
    lowered_ops = count_ops(tester.program.ep.graph)
    assert not {k for k in lowered_ops if not k.startswith("corten.") and k != "aten.reshape.default"}, lowered_ops


def test_fused_relu_is_not_annotated_on_its_own():
    """A relu fused into its conv has no quantize between them; a standalone one has its own."""
    fused = _tester(Case("f", FUSED_VS_STANDALONE[0][1], "", {})).quantize()
    (relu,) = [n for n in fused.converted.graph.nodes if n.target == torch.ops.aten.relu.default]
    assert relu.args[0].target == torch.ops.aten.conv2d.default
    standalone = _tester(Case("s", after_pool(nn.ReLU()), "", {})).quantize()
    (relu,) = [n for n in standalone.converted.graph.nodes if n.target == torch.ops.aten.relu.default]
    assert "dequantize" in str(relu.args[0].target)
    assert "quantize" in str(next(iter(relu.users)).target)


def test_standalone_relu_maps_negatives_to_zero():
    """relu after a max pool: negative inputs all become exactly 0.0 (the output's zero point)."""
    tester = _tester(STANDALONE_CLAMP_CASES[0]).lower()
    x = tester.example_inputs[0]
    y = tester.program.run(x)
    negative = F.max_pool2d(x, 2) < -tester.program.outputs[0].scale
    assert bool(negative.any()) and bool((y[negative] == 0.0).all())
    assert bool((y >= 0).all())
