"""``corten_mul_s8`` (src/corten/codegen/kernels/mul.c) byte for byte against ``corten.quantized_mul``
through ctypes, over random broadcastable shapes (the emitter's loop geometry), and quantized
models with mul through the whole pipeline: dialect (Tester.test_dialect), then C on the host and
on QEMU (Cortex-M55), portable kernels (CMSIS-NN too when CMSIS_NN_PATH is set)."""
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
from corten.testing import Tester

OPS = torch.ops.corten
C_CASES = 400


class MulParams(ctypes.Structure):
    _fields_ = [(f, ctypes.c_int32) for f in ("input1_offset", "input2_offset", "output_offset", "output_multiplier",
                                              "output_shift", "activation_min", "activation_max")]


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    return ne.build_kernel_library(tmp_path_factory.mktemp("mul"), "mul")


@needs_gcc
def test_mul_kernel_matches_reference(lib):
    rng = random.Random(61)
    for i in range(C_CASES):
        s1, s2 = ne.random_broadcast_shapes(rng)
        x1, x2 = oc.int8_tensor(rng, s1), oc.int8_tensor(rng, s2)
        mult, shift = oc.multiplier_shift(rng, -16.0, 0.0)
        args = (oc.input_offset(rng), oc.input_offset(rng), oc.output_offset(rng), mult, shift,
                *oc.activation_range(rng))
        want = OPS.quantized_mul(x1, x2, *args)
        out = (ctypes.c_int8 * want.numel())()
        shape = ne.broadcast_struct(want.shape, s1, s2)
        rc = lib.corten_mul_s8(ctypes.byref(MulParams(*args)), ctypes.byref(shape), ne.c_buffer(x1),
                               ne.c_buffer(x2), out)
        assert rc == 0
        assert bytes(out) == ne.c_bytes(want), f"case {i}: {s1} * {s2}, {args}"


@needs_gcc
def test_mul_kernel_rejects_null_and_negative_geometry(lib):
    x = (ctypes.c_int8 * 4)()
    out = (ctypes.c_int8 * 4)()
    params = MulParams(0, 0, 0, 1 << 30, 0, -128, 127)
    shape = ne.broadcast_struct((1, 4), (1, 4), (1, 4))
    assert lib.corten_mul_s8(ctypes.byref(params), ctypes.byref(shape), x, x, out) == 0
    assert lib.corten_mul_s8(None, ctypes.byref(shape), x, x, out) == -1
    assert lib.corten_mul_s8(ctypes.byref(params), None, x, x, out) == -1
    assert lib.corten_mul_s8(ctypes.byref(params), ctypes.byref(shape), x, None, out) == -1
    shape.input2_strides.c = -1
    assert lib.corten_mul_s8(ctypes.byref(params), ctypes.byref(shape), x, x, out) == -1


# ----------------------------------------------------------------------------- models
class SqueezeExcite(nn.Module):
    """conv -> global average pool -> 1x1 conv -> relu -> gate the feature map (broadcast mul)."""

    def __init__(self, c: int = 8):
        super().__init__()
        self.conv = nn.Conv2d(3, c, 3, padding=1)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Conv2d(c, c, 1)

    def forward(self, x):
        y = torch.relu(self.conv(x))
        return y * torch.relu(self.fc(self.pool(y)))


class TwoConvMul(nn.Module):
    """act(conv_a(x) * conv_b(x)): same-shape operands (arm_elementwise_mul_s8 in CMSIS-NN)."""

    def __init__(self, act=None):
        super().__init__()
        self.a, self.b = nn.Conv2d(3, 4, 3, padding=1), nn.Conv2d(3, 4, 3, padding=1)
        self.act = act or nn.Identity()

    def forward(self, x):
        return self.act(self.a(x) * self.b(x))


class RowScale(nn.Module):
    """2-D broadcast: a [2, 3] matrix (a reshaped linear output) scaled column-wise by a [1, 3] row."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(10, 6), nn.Linear(10, 3)

    def forward(self, x):
        return self.a(x).reshape(2, 3) * self.b(x)


class ConstantMul(nn.Module):
    """conv(x) * k for a Python number k (folded into the requantization), or * a learned tensor
    (an int8 constant operand, row-major in C)."""

    def __init__(self, factor):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.factor = nn.Parameter(torch.randn(factor)) if isinstance(factor, tuple) else factor

    def forward(self, x):
        return self.factor * self.conv(x) if isinstance(self.factor, nn.Parameter) else self.conv(x) * self.factor


class Rank5Square(nn.Module):
    def forward(self, x):
        return x * x


MUL, CONV = "quantized_mul", "quantized_conv2d"
IO = {"quantize_per_tensor": 1, "dequantize_per_tensor": 1}
MODELS = {
    # a product of two convolved tensors inherits their one-step differences to fake-quant
    # (scaled by the other operand) plus its own rounding: two output steps, as for add
    "se": (SqueezeExcite, (1, 3, 6, 6), {**IO, CONV: 2, "quantized_avg_pool2d": 1, MUL: 1}, 2),
    "same_shape": (TwoConvMul, (1, 3, 5, 5), {**IO, CONV: 2, MUL: 1}, 2),
    "same_shape_relu": (lambda: TwoConvMul(nn.ReLU()), (1, 3, 5, 5), {**IO, CONV: 2, MUL: 1}, 2),
    "rows_2d": (RowScale, (1, 10), {**IO, "quantized_linear": 2, MUL: 1}, 2),
    # one quantized operand: the constant's own rounding is in the fake-quantized model too
    "by_negative_number": (lambda: ConstantMul(-3.0), (1, 3, 5, 5), {**IO, CONV: 1, MUL: 1}, 1),
    "by_number": (lambda: ConstantMul(0.5), (1, 3, 5, 5), {**IO, CONV: 1, MUL: 1}, 1),
    "by_parameter": (lambda: ConstantMul((1, 4, 5, 5)), (1, 3, 5, 5), {**IO, CONV: 1, MUL: 1}, 1),
    "by_channel_parameter": (lambda: ConstantMul((4, 1, 1)), (1, 3, 5, 5), {**IO, CONV: 1, MUL: 1}, 1),
}


_TESTERS: dict[str, Tester] = {}


def _tester(name: str) -> Tester:
    """One quantized Tester per model for the module (quantizing is the slow part)."""
    if name not in _TESTERS:
        factory, shape, _, _ = MODELS[name]
        torch.manual_seed(0)
        _TESTERS[name] = Tester(factory().eval(), (torch.randn(shape),))
    return _TESTERS[name]


@pytest.mark.parametrize("name", sorted(MODELS))
def test_mul_dialect(name):
    warnings.simplefilter("ignore")
    _, _, after, qtol = MODELS[name]
    report = _tester(name).test_dialect(ops_before={"aten.mul.Tensor": 1}, ops_after=after, qtol=qtol)
    assert report.cosine_vs_float > 0.99


def test_mul_dialect_fuses_relu():
    warnings.simplefilter("ignore")
    t = _tester("same_shape_relu").lower()
    (node,) = [n for n in t.program.ep.graph.nodes if "quantized_mul" in str(n.target)]
    assert node.args[7] == node.args[4]  # activation_min == output zero point: the relu's 0 on the output grid
    assert "aten.relu" in t.program.stages["quantized"]  # the relu was there, and got fused


@needs_gcc
def test_mul_of_rank5_tensors_lowers_and_is_byte_exact():
    # a same-shape rank-5 product collapses into the kernel's loops (it was refused before)
    warnings.simplefilter("ignore")
    t = Tester(Rank5Square().eval(), (torch.randn(1, 2, 3, 2, 2),)).lower()
    assert t.program.unlowered_ops() == []
    assert t.program.op_counts().get(MUL) == 1
    t.test_implementation(on=("host",), n_inputs=2)


@needs_gcc
@pytest.mark.parametrize("name", ["rows_2d", "by_parameter", "by_channel_parameter"])
def test_mul_implementation_host(name):
    warnings.simplefilter("ignore")
    _tester(name).test_implementation(on=("host",), n_inputs=2)


@needs_qemu
def test_mul_se_implementation_qemu_m55():
    warnings.simplefilter("ignore")
    _tester("se").test_implementation(on=("host", "qemu"), n_inputs=1)


@needs_cmsis_nn
@pytest.mark.parametrize("name", ["se", "same_shape", "by_parameter"])
def test_mul_implementation_cmsis_nn(name):
    warnings.simplefilter("ignore")
    _tester(name).test_implementation(on=("host", "qemu"), kernels="cmsis-nn", n_inputs=1,
                                      targets=["cortex-m55", "cortex-m4"])  # MVE and DSP code paths
