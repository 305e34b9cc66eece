"""``FoldPadIntoConvPass``: a symmetric zero pad before 2-D convs becomes conv padding (exact in
float and in int8), and every pad it must not fold stays."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from corten.aten_passes.fold_pad_into_conv import FoldPadIntoConvPass
from corten.capture import capture_module
from corten.testing import Tester

aten = torch.ops.aten


class PadConv(nn.Module):
    def __init__(self, pad=(1, 1, 2, 2), value=0.0, kernel=3, padding=0, dilation=1, second_user=None):
        super().__init__()
        self.conv = nn.Conv2d(3 + sum(pad[4:6]), 4, kernel, padding=padding, dilation=dilation)
        self.pad, self.value, self.second_user = pad, value, second_user

    def forward(self, x):
        y = F.pad(x, self.pad, value=self.value)
        out = self.conv(y)
        if self.second_user == "conv":
            out = out + self.conv(y)
        elif self.second_user == "relu":
            out = out + torch.relu(y).mean()
        return out


def _run_pass(model, x):
    gm = capture_module(model.eval(), (x,))
    result = FoldPadIntoConvPass()(gm)
    return result, [n for n in result.graph_module.graph.nodes if n.op == "call_function"]


@pytest.mark.parametrize("kwargs, padding", [
    (dict(pad=(1, 1, 2, 2)), [2, 1]),
    (dict(pad=(1, 1, 1, 1), padding=1), [2, 2]),
    (dict(pad=(2, 2), kernel=5), [0, 2]),  # W only
    (dict(pad=(0, 0, 1, 1, 0, 0)), [1, 0]),  # zero channel pads are fine
    (dict(pad=(1, 1, 1, 1), second_user="conv"), [1, 1]),  # every user is a conv: fold into both
])
def test_symmetric_zero_pad_is_folded_exactly(kwargs, padding):
    torch.manual_seed(0)
    model, x = PadConv(**kwargs), torch.randn(1, 3, 7, 8)
    want = model.eval()(x)
    result, nodes = _run_pass(model, x)
    assert result.modified
    assert not [n for n in nodes if n.target in (aten.pad.default, aten.constant_pad_nd.default)]
    convs = [n for n in nodes if n.target == aten.conv2d.default]
    assert convs and all(list(c.args[4] if len(c.args) > 4 else c.kwargs["padding"]) == padding for c in convs)
    torch.testing.assert_close(result.graph_module(x), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kwargs", [
    dict(pad=(1, 2, 1, 1)),  # asymmetric W
    dict(pad=(1, 1, 0, 1)),  # asymmetric H
    dict(pad=(1, 1, 1, 1), value=0.5),  # not zero
    dict(pad=(1, 1, 1, 1, 1, 0)),  # channel pad
    dict(pad=(2, 2, 2, 2), kernel=1),  # beyond the kernel extent
    dict(pad=(1, 1, 1, 1), second_user="relu"),  # the padded tensor is needed elsewhere
])
def test_other_pads_stay(kwargs):
    torch.manual_seed(0)
    result, nodes = _run_pass(PadConv(**kwargs), torch.randn(1, 3, 7, 8))
    assert not result.modified
    assert [n for n in nodes if n.target in (aten.pad.default, aten.constant_pad_nd.default)]


def test_folded_pad_disappears_from_the_int8_program():
    torch.manual_seed(1)
    t = Tester(PadConv(pad=(1, 1, 1, 1), kernel=3).eval(), (torch.randn(1, 3, 6, 6),))
    t.test_dialect({"aten.pad.default": 0, "aten.conv2d.default": 1},
                   {"quantize_per_tensor": 1, "quantized_conv2d": 1, "dequantize_per_tensor": 1}, qtol=1)
