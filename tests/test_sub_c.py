"""``corten_sub_s8`` (src/corten/codegen/kernels/sub.c) byte for byte against ``corten.quantized_sub``
through ctypes, over random broadcastable shapes, and models with sub through the pipeline: dialect
(Tester.test_dialect), then C on the host and on QEMU (Cortex-M55); with CMSIS_NN_PATH set also the
CMSIS-NN flavour (same-shape sub is arm_elementwise_add_s8 with input2's multiplier negated)."""
from __future__ import annotations

import ctypes
import random
import warnings

import pytest
import torch
from torch import nn
from conftest import needs_cmsis_nn, needs_gcc, needs_qemu

import naive_elementwise as ne
import op_cases as oc
from corten.ops._qparams import add_params
from corten.testing import Tester

OPS = torch.ops.corten
C_CASES = 400
FIELDS = ("input1_offset", "input1_multiplier", "input1_shift", "input2_offset", "input2_multiplier", "input2_shift",
          "left_shift", "output_offset", "output_multiplier", "output_shift", "activation_min", "activation_max")


class SubParams(ctypes.Structure):
    _fields_ = [(f, ctypes.c_int32) for f in FIELDS]


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    return ne.build_kernel_library(tmp_path_factory.mktemp("sub"), "sub")


def _params(rng: random.Random) -> tuple:
    if rng.random() < 0.6:
        p = add_params(*(2.0 ** rng.uniform(-9, -2) for _ in range(3)))
        m1, s1, m2, s2, ls, mo, so = (p.input1_multiplier, p.input1_shift, p.input2_multiplier, p.input2_shift,
                                      p.left_shift, p.output_multiplier, p.output_shift)
    else:
        (m1, s1), (m2, s2), (mo, so) = (oc.multiplier_shift(rng, -20.0, 0.0) for _ in range(3))
        ls = rng.choice((0, 20, 22, rng.randint(0, 22)))
    return (oc.input_offset(rng), m1, s1, oc.input_offset(rng), m2, s2, ls, oc.output_offset(rng), mo, so,
            *oc.activation_range(rng))


@needs_gcc
def test_sub_kernel_matches_reference(lib):
    rng = random.Random(62)
    for i in range(C_CASES):
        s1, s2 = ne.random_broadcast_shapes(rng)
        x1, x2 = oc.int8_tensor(rng, s1), oc.int8_tensor(rng, s2)
        args = _params(rng)
        want = OPS.quantized_sub(x1, x2, *args)
        out = (ctypes.c_int8 * want.numel())()
        shape = ne.broadcast_struct(want.shape, s1, s2)
        rc = lib.corten_sub_s8(ctypes.byref(SubParams(*args)), ctypes.byref(shape), ne.c_buffer(x1),
                               ne.c_buffer(x2), out)
        assert rc == 0
        assert bytes(out) == ne.c_bytes(want), f"case {i}: {s1} - {s2}, {args}"


@needs_gcc
def test_sub_kernel_rejects_bad_arguments(lib):
    x = (ctypes.c_int8 * 4)()
    out = (ctypes.c_int8 * 4)()
    good = (0, 1 << 30, 0, 0, 1 << 30, 0, 20, 0, 1 << 30, -19, -128, 127)
    shape = ne.broadcast_struct((4,), (4,), (4,))
    assert lib.corten_sub_s8(ctypes.byref(SubParams(*good)), ctypes.byref(shape), x, x, out) == 0
    assert lib.corten_sub_s8(None, ctypes.byref(shape), x, x, out) == -1
    assert lib.corten_sub_s8(ctypes.byref(SubParams(*good)), ctypes.byref(shape), None, x, out) == -1
    for field, value in (("left_shift", 23), ("left_shift", -1), ("input2_multiplier", -(1 << 30))):
        bad = SubParams(*good)
        setattr(bad, field, value)
        assert lib.corten_sub_s8(ctypes.byref(bad), ctypes.byref(shape), x, x, out) == -1, field


# ----------------------------------------------------------------------------- models
class TwoConvSub(nn.Module):
    """conv_a(x) - conv_b(x) (+ relu): same-shape operands."""

    def __init__(self, act=None):
        super().__init__()
        self.a, self.b = nn.Conv2d(3, 4, 3, padding=1), nn.Conv2d(3, 4, 3, padding=1)
        self.act = act or nn.Identity()

    def forward(self, x):
        return self.act(self.a(x) - self.b(x))


class CentreChannels(nn.Module):
    """y - mean_hw(y): a [1, C, H, W] minus its [1, C, 1, 1] spatial mean (broadcast)."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 6, 3, padding=1)
        self.pool = nn.AdaptiveAvgPool2d(1)

    def forward(self, x):
        y = self.conv(x)
        return y - self.pool(y)


class ConstantSub(nn.Module):
    """conv(x) - k for a Python number, or parameter - conv(x) (the constant as input1)."""

    def __init__(self, constant):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.constant = nn.Parameter(torch.randn(constant)) if isinstance(constant, tuple) else constant

    def forward(self, x):
        if isinstance(self.constant, nn.Parameter):
            return self.constant - self.conv(x)
        return self.conv(x) - self.constant


class SubAlpha(nn.Module):
    def forward(self, x):
        return torch.sub(torch.relu(x), x, alpha=2)


SUB, CONV = "quantized_sub", "quantized_conv2d"
IO = {"quantize_per_tensor": 1, "dequantize_per_tensor": 1}
MODELS = {
    # the difference of two conv outputs inherits their one-step differences (as for add): 2 steps
    "same_shape": (TwoConvSub, (1, 3, 5, 5), {**IO, CONV: 2, SUB: 1}, 2),
    "same_shape_relu": (lambda: TwoConvSub(nn.ReLU()), (1, 3, 5, 5), {**IO, CONV: 2, SUB: 1}, 2),
    "centre_broadcast": (CentreChannels, (1, 3, 6, 6), {**IO, CONV: 1, "quantized_avg_pool2d": 1, SUB: 1}, 2),
    "minus_number": (lambda: ConstantSub(0.75), (1, 3, 5, 5), {**IO, CONV: 1, SUB: 1}, 1),
    "parameter_minus": (lambda: ConstantSub((4, 1, 1)), (1, 3, 5, 5), {**IO, CONV: 1, SUB: 1}, 1),
}
_TESTERS: dict[str, Tester] = {}


def _tester(name: str) -> Tester:
    if name not in _TESTERS:
        factory, shape, _, _ = MODELS[name]
        torch.manual_seed(0)
        _TESTERS[name] = Tester(factory().eval(), (torch.randn(shape),))
    return _TESTERS[name]


@pytest.mark.parametrize("name", sorted(MODELS))
def test_sub_dialect(name):
    warnings.simplefilter("ignore")
    _, _, after, qtol = MODELS[name]
    report = _tester(name).test_dialect(ops_before={"aten.sub.Tensor": 1}, ops_after=after, qtol=qtol)
    assert report.cosine_vs_float > 0.99


def test_sub_with_alpha_is_refused_clearly():
    warnings.simplefilter("ignore")
    t = Tester(SubAlpha().eval(), (torch.randn(1, 3, 4, 4),)).lower()
    assert any(u.op == "aten.sub.Tensor" and "alpha" in u.reason for u in t.program.unlowered_ops())


def test_sub_constant_keeps_operand_order():
    """``parameter - conv(x)``: the constant is input1 (sub does not commute)."""
    warnings.simplefilter("ignore")
    prog = _tester("parameter_minus").lower().program
    (node,) = [n for n in prog.ep.graph.nodes if "quantized_sub" in str(n.target)]
    assert node.args[0].op == "placeholder" and node.args[1].op == "call_function"


@needs_gcc
@pytest.mark.parametrize("name", ["same_shape_relu", "parameter_minus"])
def test_sub_implementation_host(name):
    warnings.simplefilter("ignore")
    _tester(name).test_implementation(on=("host",), n_inputs=2)


@needs_qemu
def test_sub_broadcast_implementation_qemu_m55():
    warnings.simplefilter("ignore")
    _tester("centre_broadcast").test_implementation(on=("host", "qemu"), n_inputs=1)


@needs_cmsis_nn
@pytest.mark.parametrize("name", ["same_shape", "centre_broadcast"])
def test_sub_implementation_cmsis_nn(name):
    warnings.simplefilter("ignore")
    _tester(name).test_implementation(on=("host", "qemu"), kernels="cmsis-nn", n_inputs=1,
                                      targets=["cortex-m55", "cortex-m4"])  # MVE and DSP code paths
