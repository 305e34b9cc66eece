"""Division: ``quantized_div`` (tensor / tensor, exact integer Q16 quotient) against
``naive_elementwise.div`` (rational arithmetic), the portable ``corten_div_s8`` byte for byte through
ctypes, and user-style models (``x / 3.0`` folded into a mul, ``a / b``, ``x / param``, ``k / x``,
``torch.true_divide``) through the pipeline: dialect, C on the host and on QEMU M55 + M4 (CMSIS-NN has
no division: the CMSIS-NN flavour runs the portable kernel, checked with CMSIS_NN_PATH)."""
from __future__ import annotations

import ctypes
import os
import random
import shutil
import warnings

import pytest
import torch
from torch import nn

import naive_elementwise as ne
import op_cases as oc
from corten.testing import Tester

OPS = torch.ops.corten
needs_gcc = pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")
needs_qemu = pytest.mark.skipif(shutil.which("qemu-system-arm") is None or shutil.which("arm-none-eabi-gcc") is None,
                                reason="needs qemu-system-arm and arm-none-eabi-gcc")
CMSIS_NN_PATH = os.environ.get("CMSIS_NN_PATH")


class MulParams(ctypes.Structure):
    _fields_ = [(f, ctypes.c_int32) for f in ("input1_offset", "input2_offset", "output_offset", "output_multiplier",
                                              "output_shift", "activation_min", "activation_max")]


def _params(rng):
    m, s = oc.multiplier_shift(rng, -20.0, -8.0)
    return (oc.input_offset(rng), oc.input_offset(rng), oc.output_offset(rng), m, s, *oc.activation_range(rng))


def test_div_matches_naive():
    rng = random.Random(91)
    for i in range(300):
        s1, s2 = ne.random_broadcast_shapes(rng)
        x1, x2 = oc.int8_tensor(rng, s1), oc.int8_tensor(rng, s2)
        args = _params(rng)
        got = OPS.quantized_div(x1, x2, *args)
        shape, want = ne.div(x1.tolist(), x2.tolist(), *args)
        assert tuple(got.shape) == shape
        assert got.contiguous().flatten().tolist() == want, f"case {i}: {s1} / {s2}, {args}"


def test_div_by_zero_saturates():
    x1 = torch.tensor([5, -5, 0], dtype=torch.int8)
    x2 = torch.tensor([3, 3, 3], dtype=torch.int8)
    out = OPS.quantized_div(x1, x2, 0, -3, 7, 1 << 30, -10, -100, 100)
    assert out.tolist() == [100, -100, 7]


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    return ne.build_kernel_library(tmp_path_factory.mktemp("div"), "div")


@needs_gcc
def test_div_kernel_matches_reference(lib):
    rng = random.Random(92)
    for i in range(400):
        s1, s2 = ne.random_broadcast_shapes(rng)
        x1, x2 = oc.int8_tensor(rng, s1), oc.int8_tensor(rng, s2)
        args = _params(rng)
        want = OPS.quantized_div(x1, x2, *args)
        out = (ctypes.c_int8 * want.numel())()
        shape = ne.broadcast_struct(want.shape, s1, s2)
        assert lib.corten_div_s8(ctypes.byref(MulParams(*args)), ctypes.byref(shape), ne.c_buffer(x1),
                                 ne.c_buffer(x2), out) == 0
        assert bytes(out) == ne.c_bytes(want), f"case {i}: {s1} / {s2}, {args}"
    assert lib.corten_div_s8(None, ctypes.byref(shape), ne.c_buffer(x1), ne.c_buffer(x2), out) == -1


# ----------------------------------------------------------------------------- models
class DivNumber(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)

    def forward(self, x):
        return self.conv(x) / 3.0


class DivTensors(nn.Module):
    """``a / b`` with b kept away from 0 (a sigmoid + 0.5), and ``torch.true_divide``."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Conv2d(3, 4, 3, padding=1), nn.Conv2d(3, 4, 3, padding=1)

    def forward(self, x):
        return torch.true_divide(self.a(x), torch.sigmoid(self.b(x)) + 0.5)


class DivByParam(nn.Module):
    """``x / scale`` with a [C, 1, 1] parameter, and ``2 / (1 + relu(x))``."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.scale = nn.Parameter(torch.rand(4, 1, 1) + 0.5)

    def forward(self, x):
        y = self.conv(x)
        return y / self.scale + 2.0 / (torch.relu(y) + 1.0)


IO = {"quantize_per_tensor": 1, "dequantize_per_tensor": 1}
MODELS = {
    "div_number": (DivNumber, (1, 3, 5, 5), {**IO, "quantized_conv2d": 1, "quantized_mul": 1}, 1),
    "div_tensors": (DivTensors, (1, 3, 5, 5), {**IO, "quantized_conv2d": 2, "quantized_lut": 1, "quantized_add": 1,
                                               "quantized_div": 1}, 3),
    # 2.0 / t exports as reciprocal(t) * 2: a division of [1] by t and a mul
    "div_param": (DivByParam, (1, 3, 5, 5), {**IO, "quantized_conv2d": 1, "quantized_div": 2, "quantized_lut": 1,
                                             "quantized_add": 2, "quantized_mul": 1}, 3),
}
_TESTERS: dict[str, Tester] = {}


def _tester(name: str) -> Tester:
    if name not in _TESTERS:
        factory, shape, _, _ = MODELS[name]
        torch.manual_seed(0)
        _TESTERS[name] = Tester(factory().eval(), (torch.randn(shape),))
    return _TESTERS[name]


@pytest.mark.parametrize("name", sorted(MODELS))
def test_div_dialect(name):
    warnings.simplefilter("ignore")
    _, _, after, qtol = MODELS[name]
    report = _tester(name).test_dialect(ops_before={}, ops_after=after, qtol=qtol)
    assert report.cosine_vs_float > 0.98, report


def test_div_rounding_mode_is_refused():
    warnings.simplefilter("ignore")

    class Floor(nn.Module):
        def forward(self, x):
            return torch.div(x, torch.sigmoid(x) + 1, rounding_mode="floor")

    t = Tester(Floor().eval(), (torch.randn(1, 4),)).lower()
    assert any("rounding_mode" in u.reason for u in t.program.unlowered_ops())


@needs_gcc
@pytest.mark.parametrize("name", sorted(MODELS))
def test_div_implementation_host(name):
    warnings.simplefilter("ignore")
    _tester(name).test_implementation(on=("host",), n_inputs=2)


@needs_qemu
def test_div_implementation_qemu():
    warnings.simplefilter("ignore")
    _tester("div_param").test_implementation(on=("qemu",), n_inputs=1, targets=["cortex-m55", "cortex-m4"])


@pytest.mark.skipif(not CMSIS_NN_PATH, reason="set CMSIS_NN_PATH to a CMSIS-NN source tree")
def test_div_implementation_cmsis_nn():
    warnings.simplefilter("ignore")
    _tester("div_tensors").test_implementation(on=("host",), kernels="cmsis-nn", n_inputs=1)
