"""Dialect tests of the 1-D, grouped and transposed convolutions (``Tester.test_dialect``).

1-D ops (``conv1d``, ``max_pool1d``, ``avg_pool1d``, ``mean(-1)``) lower to the 2-D Corten ops on an
``[N, C, 1, L]`` view; a chain of them keeps the 4-D tensor, so only the reshapes at the chain's
ends remain (checked by counting ``aten.reshape`` nodes of the lowered program).
"""
from __future__ import annotations

from typing import Callable

import pytest
import torch
from torch import nn

from corten.memory.views import reshape_is_alias
from corten.testing.tester import Tester

Q, DQ = "quantize_per_tensor", "dequantize_per_tensor"
CONV, DW, GROUPED = "quantized_conv2d", "quantized_depthwise_conv2d", "quantized_grouped_conv2d"
TRANSPOSE, MAX, AVG, LINEAR = "quantized_conv_transpose2d", "quantized_max_pool2d", "quantized_avg_pool2d", \
    "quantized_linear"
A_CONV1D, A_CONV, A_BN, A_RELU = "aten.conv1d.default", "aten.conv2d.default", "aten.batch_norm.default", \
    "aten.relu.default"
A_MAX1D, A_AVG1D, A_MEAN = "aten.max_pool1d.default", "aten.avg_pool1d.default", "aten.mean.dim"
A_TRANSPOSE = "aten.conv_transpose2d.input"
RESHAPE = torch.ops.aten.reshape.default


def lowered(**ops: int) -> dict[str, int]:
    return {Q: 1, **ops, DQ: 1}


class Fn(nn.Module):
    def __init__(self, fn: Callable[[torch.Tensor], torch.Tensor]):
        super().__init__()
        self.fn = fn

    def forward(self, x):
        return self.fn(x)


def _bn1d(c: int) -> nn.BatchNorm1d:
    bn = nn.BatchNorm1d(c)
    with torch.no_grad():
        bn.running_mean.uniform_(-0.5, 0.5)
        bn.running_var.uniform_(0.5, 2.0)
        bn.weight.uniform_(0.5, 1.5)
        bn.bias.uniform_(-0.2, 0.2)
    return bn


class KwsLike(nn.Module):
    """A small keyword-spotting-like 1-D net: Conv1d+BN+ReLU, MaxPool1d, Conv1d, mean over time, Linear."""

    def __init__(self, c_in: int = 10, classes: int = 6):
        super().__init__()
        self.features = nn.Sequential(nn.Conv1d(c_in, 16, 3, padding=1), _bn1d(16), nn.ReLU(), nn.MaxPool1d(2),
                                      nn.Conv1d(16, 24, 3, stride=2), nn.ReLU())
        self.fc = nn.Linear(24, classes)

    def forward(self, x):
        return self.fc(self.features(x).mean(-1))


# (id, model builder, input shape, ops_before, ops_after)
CASES = [
    ("conv1d_bn_relu", lambda: nn.Sequential(nn.Conv1d(4, 8, 3, padding=1), _bn1d(8), nn.ReLU()), (1, 4, 16),
     {A_CONV1D: 1, A_BN: 0, A_RELU: 1}, lowered(**{CONV: 1})),
    ("conv1d_stride2_dilation2_no_bias", lambda: nn.Conv1d(3, 5, 3, stride=2, padding=2, dilation=2, bias=False),
     (1, 3, 17), {A_CONV1D: 1}, lowered(**{CONV: 1})),
    ("conv1d_depthwise", lambda: nn.Sequential(nn.Conv1d(6, 12, 5, padding=2, groups=6), nn.ReLU6()), (1, 6, 12),
     {A_CONV1D: 1}, lowered(**{DW: 1})),
    ("conv1d_grouped", lambda: nn.Conv1d(6, 4, 3, groups=2), (1, 6, 10), {A_CONV1D: 1}, lowered(**{GROUPED: 1})),
    ("maxpool1d", lambda: nn.Sequential(nn.Conv1d(3, 6, 3), nn.MaxPool1d(3, stride=2, padding=1)), (1, 3, 15),
     {A_CONV1D: 1, A_MAX1D: 1}, lowered(**{CONV: 1, MAX: 1})),
    ("maxpool1d_of_input", lambda: nn.MaxPool1d(2), (1, 3, 8), {A_MAX1D: 1}, lowered(**{MAX: 1})),
    ("avgpool1d", lambda: nn.Sequential(nn.Conv1d(3, 6, 1), nn.AvgPool1d(2)), (1, 3, 9), {A_AVG1D: 1},
     lowered(**{CONV: 1, AVG: 1})),
    ("avgpool1d_padding", lambda: nn.Sequential(nn.Conv1d(3, 6, 1), nn.AvgPool1d(3, 1, 1, count_include_pad=False)),
     (1, 3, 9), {A_AVG1D: 1}, lowered(**{CONV: 1, AVG: 1})),
    ("mean_over_time", lambda: nn.Sequential(nn.Conv1d(3, 6, 3), Fn(lambda x: x.mean(-1))), (1, 3, 9),
     {A_MEAN: 1}, lowered(**{CONV: 1, AVG: 1})),
    ("mean_over_time_keepdim", lambda: nn.Sequential(nn.Conv1d(3, 6, 3), Fn(lambda x: x.mean(2, keepdim=True))),
     (1, 3, 9), {A_MEAN: 1}, lowered(**{CONV: 1, AVG: 1})),
    ("adaptive_avgpool1d", lambda: nn.Sequential(nn.Conv1d(3, 6, 3), nn.AdaptiveAvgPool1d(3)), (1, 3, 11),
     {"aten.adaptive_avg_pool1d.default": 1}, lowered(**{CONV: 1, AVG: 1})),
    ("kws_like", KwsLike, (1, 10, 24), {A_CONV1D: 2, A_MAX1D: 1, A_MEAN: 1, A_BN: 0},
     lowered(**{CONV: 2, MAX: 1, AVG: 1, LINEAR: 1})),
    ("grouped_conv2d", lambda: nn.Sequential(nn.Conv2d(4, 6, 3, padding=1, groups=2), nn.ReLU()), (1, 4, 6, 6),
     {A_CONV: 1}, lowered(**{GROUPED: 1})),
    ("grouped_conv2d_3_groups_stride2", lambda: nn.Conv2d(6, 9, 3, stride=2, groups=3, bias=False), (1, 6, 7, 7),
     {A_CONV: 1}, lowered(**{GROUPED: 1})),
    ("conv_transpose2d", lambda: nn.Sequential(nn.Conv2d(3, 6, 3, padding=1), nn.ReLU(), nn.ConvTranspose2d(6, 4, 3)),
     (1, 3, 5, 5), {A_TRANSPOSE: 1}, lowered(**{CONV: 1, TRANSPOSE: 1})),
    ("conv_transpose2d_stride2_relu",
     lambda: nn.Sequential(nn.ConvTranspose2d(4, 3, 3, stride=2, padding=1, output_padding=1), nn.ReLU()),
     (1, 4, 4, 4), {A_TRANSPOSE: 1, A_RELU: 1}, lowered(**{TRANSPOSE: 1})),
    ("conv_transpose2d_no_bias_2x2", lambda: nn.ConvTranspose2d(5, 2, 2, stride=2, bias=False), (1, 5, 3, 3),
     {A_TRANSPOSE: 1}, lowered(**{TRANSPOSE: 1})),
    ("conv_transpose1d_bn_relu", lambda: nn.Sequential(nn.Conv1d(3, 6, 3, padding=1), nn.ReLU(),
                                                       nn.ConvTranspose1d(6, 4, 4, stride=2, padding=1), _bn1d(4),
                                                       nn.ReLU()),
     (1, 3, 8), {A_CONV1D: 1, "aten.conv_transpose1d.default": 1, A_BN: 0}, lowered(**{CONV: 1, TRANSPOSE: 1})),
    ("conv_transpose1d_output_padding_dilation", lambda: nn.ConvTranspose1d(4, 2, 3, stride=3, padding=1,
                                                                            output_padding=1, dilation=2),
     (2, 4, 5), {"aten.conv_transpose1d.default": 1}, lowered(**{TRANSPOSE: 1})),
]


def _tester(build, shape, seed=0) -> Tester:
    torch.manual_seed(seed)
    return Tester(build(), (torch.randn(shape),))


@pytest.mark.parametrize("case_id, build, shape, before, after", CASES, ids=[c[0] for c in CASES])
def test_lowering(case_id, build, shape, before, after):
    _tester(build, shape).test_dialect(ops_before=before, ops_after=after, qtol=1)


def _reshapes(tester: Tester) -> list[torch.fx.Node]:
    return [n for n in tester.program.ep.graph.nodes if n.target == RESHAPE]


def test_1d_chain_keeps_the_4d_tensor():
    """kws_like: one reshape into [N, C, 1, L] and one out of the pooled [N, C, 1, 1] (free); none
    between the conv1d -> max_pool1d -> conv1d -> mean ops.  The first reads the program input
    alone, so the C library takes the input in its NHWC layout and that reshape is free too
    (memory.views.input_layout_reshape)."""
    from corten.memory.views import input_layout_reshape

    t = _tester(KwsLike, (1, 10, 24)).lower()
    reshapes = _reshapes(t)
    assert [tuple(r.meta["val"].shape) for r in reshapes] == [(1, 10, 1, 24), (1, 24)]
    assert input_layout_reshape(reshapes[0].args[0]) is reshapes[0]
    assert [reshape_is_alias(r) for r in reshapes] == [True, True]


def test_1d_output_is_reshaped_back():
    """A conv1d whose output is the program output ends with a reshape to [N, C, L] (a layout copy)."""
    t = _tester(lambda: nn.Conv1d(3, 4, 3), (1, 3, 8)).lower()
    assert [tuple(r.meta["val"].shape) for r in _reshapes(t)] == [(1, 3, 1, 8), (1, 4, 6)]
    assert tuple(t.program.run(torch.randn(1, 3, 8)).shape) == (1, 4, 6)


@pytest.mark.parametrize("build, shape, pool", [
    (lambda: nn.Sequential(nn.Conv1d(3, 6, 1), nn.AvgPool1d(3, 1, 1)), (1, 3, 9), "quantized_avg_pool2d"),
    (lambda: nn.Sequential(nn.Conv1d(3, 6, 1), nn.MaxPool1d(2, ceil_mode=True)), (1, 3, 9), "quantized_max_pool2d"),
    (lambda: nn.Sequential(nn.Conv1d(3, 6, 1), nn.AdaptiveAvgPool1d(2)), (1, 3, 9), "quantized_adaptive_avg_pool2d"),
], ids=["count_include_pad", "ceil_mode", "adaptive_not_uniform"])
def test_1d_pool_variants_lower(build, shape, pool):
    """Formerly refused 1-D pool variants (count_include_pad with padding, ceil_mode, non-uniform
    adaptive windows) lower fully and stay within one step of the fake-quantized model."""
    t = _tester(build, shape)
    t.test_dialect(ops_before={}, ops_after={"quantize_per_tensor": 1, "quantized_conv2d": 1, pool: 1,
                                             "dequantize_per_tensor": 1}, qtol=1)
