""""Lowered" is one definition (corten.ops.registry.is_lowered_node) shared by the operator table,
unlowered_ops(), the memory planner and the C generator: a quantize/dequantize pair the lowering
could not fold is reported as unlowered, never left for emit_c to trip over."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import corten
from corten.lowering import unlowered_nodes
from corten.ops.registry import is_lowered_node


def _leftover_pair_graph() -> torch.fx.GraphModule:
    """input -> corten quantize -> quantized_decomposed dequantize/quantize -> corten dequantize."""
    from torch.ao.quantization.fx._decomposed import quantized_decomposed_lib  # noqa: F401

    g = torch.fx.Graph()
    x = g.placeholder("x")
    q = g.call_function(torch.ops.corten.quantize_per_tensor.default, (x, 0.1, 0))
    dq = g.call_function(torch.ops.quantized_decomposed.dequantize_per_tensor.default,
                         (q, 0.1, 0, -128, 127, torch.int8))
    rq = g.call_function(torch.ops.quantized_decomposed.quantize_per_tensor.default,
                         (dq, 0.2, 0, -128, 127, torch.int8))
    out = g.call_function(torch.ops.corten.dequantize_per_tensor.default, (rq, 0.2, 0))
    g.output(out)
    return torch.fx.GraphModule(torch.nn.Module(), g)


def test_a_leftover_requantization_is_reported_as_unlowered():
    gm = _leftover_pair_graph()
    names = [n.op for n in unlowered_nodes(gm)]
    assert len(names) == 2
    assert names[0].startswith("quantized_decomposed.dequantize_per_tensor")
    assert names[1].startswith("quantized_decomposed.quantize_per_tensor")
    assert [n.name for n in gm.graph.nodes if not is_lowered_node(n)] == [n.name for n in unlowered_nodes(gm)]


class SigmoidIntoConv(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)

    def forward(self, x):
        return self.conv(F.max_pool2d(torch.sigmoid(x), 2))  # pool shares sigmoid's fixed qparams


def test_requantization_between_lowered_ops_becomes_a_table():
    x = torch.randn(1, 3, 6, 6)
    prog = corten.compile(SigmoidIntoConv().eval(), (x,))
    assert prog.unlowered_ops() == []
    assert prog.op_counts()["quantized_lut"] == 2  # sigmoid + the requantization to the conv's input scale
    assert all(is_lowered_node(n) for n in prog.ep.graph.nodes)
    assert torch.equal(prog.run_c(x, int8=True)[0], prog.run_int8(x)[0])


@pytest.mark.parametrize("body", ["silu", "x_plus_sigmoid", "conv_of_sigmoid"])
def test_fixed_qparams_output_is_read_as_it_is(body):
    """A consumer of sigmoid's output shares its (1/256, -128) quantization: no requantization."""
    conv = nn.Conv2d(3, 3, 3, padding=1)

    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = conv

        def forward(self, x):
            if body == "silu":
                y = self.conv(x)
                return y * torch.sigmoid(y)
            if body == "x_plus_sigmoid":
                return x + torch.sigmoid(x)
            return self.conv(torch.sigmoid(x))

    x = torch.randn(1, 3, 5, 5)
    prog = corten.compile(M().eval(), (x,))
    assert prog.unlowered_ops() == [] and prog.op_counts()["quantized_lut"] == 1
    assert torch.equal(prog.run_c(x, int8=True)[0], prog.run_int8(x)[0])
