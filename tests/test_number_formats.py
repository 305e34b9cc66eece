"""Element types as a dispatch key (docs/architecture.md, "Element types as a dispatch key"): a lowering
rule declares the NumberFormats it lowers, the quantizer gives a layer only a declared format, the
providers key their kernels on the same dtypes, and the emitters name kernels and cast buffers from
the dtype."""
from __future__ import annotations

import re
import warnings
from pathlib import Path

import pytest
import torch
from torch import nn

import corten
from corten.errors import CodegenError
from corten.ops.registry import A8W4, A8W8, A16W8, NumberFormat, formats_of, lowers, lowers_format, weight_bits
from corten.providers import element_pointer, kernel_suffix

OPS = Path(__file__).resolve().parents[1] / "src" / "corten" / "ops"
aten = torch.ops.aten


def test_no_width_flags_left_in_the_op_families():
    """The element width is the formats= key, never a boolean flag of a rule or an annotation."""
    flagged = [f"{p.name}:{i}" for p in sorted(OPS.glob("*.py"))
               for i, line in enumerate(p.read_text().splitlines(), 1)
               if re.search(r"\b(int16|int4|fixed16)\s*=\s*(True|False|_)", line)]
    assert flagged == []


def test_formats_are_declared_per_aten_op():
    assert A8W8 == (torch.int8, torch.int8) and str(A16W8) == "A16W8" and str(A8W4) == "A8W4"
    assert set(formats_of(aten.conv2d.default)) == {A8W8, A16W8, A8W4}
    assert set(formats_of(aten.conv1d.default)) == {A8W8, A8W4}  # no 16x8 rule for conv1d
    assert set(formats_of(aten.add.Tensor)) == {A8W8, A16W8}
    assert formats_of(aten.sub.Tensor) == (A8W8,)  # the default: int8 only
    assert formats_of(aten.hypot.default) == ()  # no rule at all
    for target in (aten.linear.default, aten.conv2d.default, aten.add.Tensor):
        assert not lowers_format(target, act=torch.int16, weight=torch.int4)  # A16W4: never declared


def _conv_node(groups: int, c_in: int = 4):
    """An ATen conv2d node of ``groups`` groups over a [1, c_in, 6, 6] input."""
    g = torch.fx.Graph()
    x = g.placeholder("x")
    x.meta["val"] = torch.empty(1, c_in, 6, 6)
    w = g.placeholder("w")
    return g.call_function(aten.conv2d.default, (x, w, None, [1, 1], [0, 0], [1, 1], groups))


def test_a_format_condition_is_asked_of_the_node():
    """conv2d's A8W4 and A16W8 hold for 1 or C_in groups (when=), not for other grouped convolutions."""
    assert lowers_format(_conv_node(1), act=torch.int8, weight=torch.int4)
    assert lowers_format(_conv_node(4), act=torch.int8, weight=torch.int4)
    assert not lowers_format(_conv_node(2), act=torch.int8, weight=torch.int4)
    assert lowers_format(_conv_node(2), act=torch.int8)  # int8 has no condition
    assert not lowers_format(_conv_node(2), act=torch.int16)  # 16x8: 1 or C_in groups too (it stays int8)
    assert lowers_format(_conv_node(1), act=torch.int16) and lowers_format(_conv_node(4), act=torch.int16)


def test_a_condition_for_an_undeclared_format_is_refused():
    with pytest.raises(ValueError, match="formats the rule does not lower"):
        lowers("not-an-op", formats=(A8W8,), when={A8W4: lambda node: True})


class _LinearNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(8, 6), nn.Linear(6, 4)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


def test_the_quantizer_gives_only_declared_formats():
    """precision int16 + weights int4 on a linear layer: A16W4 is declared nowhere, so the 16x8 layer
    keeps int8 weights; the int8 layer (precision {'fc2': 'int8'}) gets its int4 weights (A8W4)."""
    warnings.simplefilter("ignore")
    torch.manual_seed(0)
    model, x = _LinearNet().eval(), torch.randn(2, 8)
    prog = corten.compile(model, (x,), precision={"fc1": "int16"}, weights="int4", seed=0)
    assert prog.unlowered_ops() == []
    widths = {(str(n.args[0].meta["val"].dtype), weight_bits(n))
              for n in prog.ep.graph.nodes if n.target == torch.ops.corten.quantized_linear.default}
    assert widths == {("torch.int16", 8), ("torch.int8", 4)}, widths
    assert torch.equal(prog.run_c(x, int8=True)[0], prog.run_int8(x)[0])


def test_kernel_names_and_buffer_types_follow_the_dtype():
    assert [kernel_suffix(d) for d in (torch.int8, torch.int16, torch.int4)] == ["s8", "s16", "s4"]
    with pytest.raises(CodegenError, match="no C kernels for torch.float32"):
        kernel_suffix(torch.float32)
    assert element_pointer("act_x", torch.int8, const=True) == "act_x"
    assert element_pointer("act_x", torch.int16, const=True) == "(const int16_t *)(const void *)act_x"
    assert element_pointer("act_y", torch.int16) == "(int16_t *)(void *)act_y"


def test_number_format_is_a_named_pair():
    f = NumberFormat(torch.int16)
    assert f == A16W8 and f.weight == torch.int8
