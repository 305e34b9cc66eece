"""``quantized_add`` with broadcasting and constant operands (``x + 1.5``, ``x + bias``), and
maximum/minimum with a constant tensor: the reference op against ``naive_elementwise.add``, the
portable ``corten_add_broadcast_s8`` byte for byte through ctypes, user-style models through the
pipeline (dialect, C on the host, QEMU M55 and M4), and with CMSIS_NN_PATH the CMSIS-NN flavour
(``arm_elementwise_add_s8`` once per repeated block for the per-channel case)."""
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
from corten.lowering.qparams import add_params
from corten.testing import Tester

OPS = torch.ops.corten
needs_gcc = pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")
needs_qemu = pytest.mark.skipif(shutil.which("qemu-system-arm") is None or shutil.which("arm-none-eabi-gcc") is None,
                                reason="needs qemu-system-arm and arm-none-eabi-gcc")
CMSIS_NN_PATH = os.environ.get("CMSIS_NN_PATH")
FIELDS = ("input1_offset", "input1_multiplier", "input1_shift", "input2_offset", "input2_multiplier", "input2_shift",
          "left_shift", "output_offset", "output_multiplier", "output_shift", "activation_min", "activation_max")


class AddParams(ctypes.Structure):
    _fields_ = [(f, ctypes.c_int32) for f in FIELDS]


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


def test_broadcast_add_matches_naive():
    rng = random.Random(71)
    for i in range(300):
        s1, s2 = ne.random_broadcast_shapes(rng)
        x1, x2 = oc.int8_tensor(rng, s1), oc.int8_tensor(rng, s2)
        args = _params(rng)
        got = OPS.quantized_add(x1, x2, *args)
        shape, want = ne.add(x1.tolist(), x2.tolist(), *args)
        assert tuple(got.shape) == shape
        assert got.contiguous().flatten().tolist() == want, f"case {i}: {s1} + {s2}, {args}"


def test_broadcast_add_rejects_non_broadcastable_shapes():
    from corten.ops import CortenOpError

    x = torch.zeros(1, 3, 2, 2, dtype=torch.int8)
    with pytest.raises(CortenOpError, match="quantized_add.*'input2'.*does not broadcast"):
        OPS.quantized_add(x, torch.zeros(1, 2, 2, 2, dtype=torch.int8), 0, 1 << 30, 0, 0, 1 << 30, 0, 20, 0,
                          1 << 30, -19, -128, 127)


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    return ne.build_kernel_library(tmp_path_factory.mktemp("add"), "add")


@needs_gcc
def test_add_broadcast_kernel_matches_reference(lib):
    rng = random.Random(72)
    for i in range(400):
        s1, s2 = ne.random_broadcast_shapes(rng)
        x1, x2 = oc.int8_tensor(rng, s1), oc.int8_tensor(rng, s2)
        args = _params(rng)
        want = OPS.quantized_add(x1, x2, *args)
        out = (ctypes.c_int8 * want.numel())()
        shape = ne.broadcast_struct(want.shape, s1, s2)
        assert lib.corten_add_broadcast_s8(ctypes.byref(AddParams(*args)), ctypes.byref(shape), ne.c_buffer(x1),
                                           ne.c_buffer(x2), out) == 0
        assert bytes(out) == ne.c_bytes(want), f"case {i}: {s1} + {s2}, {args}"


@needs_gcc
def test_add_broadcast_kernel_rejects_bad_arguments(lib):
    x = (ctypes.c_int8 * 4)()
    good = (0, 1 << 30, 0, 0, 1 << 30, 0, 20, 0, 1 << 30, -19, -128, 127)
    shape = ne.broadcast_struct((4,), (4,), (1,))
    assert lib.corten_add_broadcast_s8(ctypes.byref(AddParams(*good)), ctypes.byref(shape), x, x, x) == 0
    assert lib.corten_add_broadcast_s8(None, ctypes.byref(shape), x, x, x) == -1
    assert lib.corten_add_broadcast_s8(ctypes.byref(AddParams(*good)), None, x, x, x) == -1
    bad = AddParams(*good)
    bad.left_shift = 23
    assert lib.corten_add_broadcast_s8(ctypes.byref(bad), ctypes.byref(shape), x, x, x) == -1


# ----------------------------------------------------------------------------- models
class PlusNumber(nn.Module):
    """``conv(x) + k`` and ``k + conv(x)`` for a Python number."""

    def __init__(self, k: float, first: bool = False):
        super().__init__()
        self.conv, self.k, self.first = nn.Conv2d(3, 4, 3, padding=1), k, first

    def forward(self, x):
        y = self.conv(x)
        return self.k + y if self.first else y + self.k


class PlusBias(nn.Module):
    """``conv(x) + bias`` with a ``[C, 1, 1]`` parameter (the per-channel case), then relu."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bias = nn.Parameter(torch.randn(8, 1, 1))

    def forward(self, x):
        return torch.relu(self.conv(x) + self.bias)


class PlusPooled(nn.Module):
    """``a + mean_hw(b)``: [1, C, H, W] + [1, C, 1, 1] of two activations."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Conv2d(3, 6, 3, padding=1), nn.Conv2d(3, 6, 3, padding=1)

    def forward(self, x):
        return self.a(x) + nn.functional.adaptive_avg_pool2d(self.b(x), 1)


class RowBias(nn.Module):
    """2-D: ``linear(x) + b`` with a [1, F] activation row broadcast over a [B, F]-like [1, F] and a
    [F] parameter (rank 1)."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 6)
        self.b = nn.Parameter(torch.randn(6))

    def forward(self, x):
        return self.fc(x) + self.b


class MaxConstant(nn.Module):
    """``maximum(conv(x), floor)`` and ``minimum(.., cap)`` with constant tensors."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.floor = nn.Parameter(torch.full((4, 1, 1), -0.3) + 0.1 * torch.randn(4, 1, 1))

    def forward(self, x):
        return torch.minimum(torch.maximum(self.conv(x), self.floor), torch.tensor(0.8))


IO = {"quantize_per_tensor": 1, "dequantize_per_tensor": 1}
CONV, ADD = "quantized_conv2d", "quantized_add"
MODELS = {
    "plus_number": (lambda: PlusNumber(1.5), (1, 3, 5, 5), {**IO, CONV: 1, ADD: 1}, {"aten.add.Tensor": 1}),
    "number_plus_negative": (lambda: PlusNumber(-0.75, first=True), (1, 3, 5, 5), {**IO, CONV: 1, ADD: 1},
                             {"aten.add.Tensor": 1}),
    "plus_bias": (PlusBias, (1, 3, 5, 5), {**IO, CONV: 1, ADD: 1}, {"aten.add.Tensor": 1}),
    "plus_pooled": (PlusPooled, (1, 3, 6, 6), {**IO, CONV: 2, "quantized_avg_pool2d": 1, ADD: 1},
                    {"aten.add.Tensor": 1}),
    "row_bias": (RowBias, (1, 8), {**IO, "quantized_linear": 1, ADD: 1}, {"aten.add.Tensor": 1}),
    "max_constant": (MaxConstant, (1, 3, 5, 5), {**IO, CONV: 1, "quantized_maximum": 1, "quantized_minimum": 1},
                     {"aten.maximum.default": 1, "aten.minimum.default": 1}),
}
_TESTERS: dict[str, Tester] = {}


def _tester(name: str) -> Tester:
    if name not in _TESTERS:
        factory, shape, _, _ = MODELS[name]
        torch.manual_seed(0)
        _TESTERS[name] = Tester(factory().eval(), (torch.randn(shape),))
    return _TESTERS[name]


@pytest.mark.parametrize("name", sorted(MODELS))
def test_add_broadcast_dialect(name):
    warnings.simplefilter("ignore")
    _, _, after, before = MODELS[name]
    report = _tester(name).test_dialect(ops_before=before, ops_after=after, qtol=2)
    assert report.cosine_vs_float > 0.99, report


@needs_gcc
@pytest.mark.parametrize("name", sorted(MODELS))
def test_add_broadcast_implementation_host(name):
    warnings.simplefilter("ignore")
    _tester(name).test_implementation(on=("host",), n_inputs=2)


@needs_qemu
@pytest.mark.parametrize("name", ["plus_bias", "plus_pooled", "max_constant"])
def test_add_broadcast_implementation_qemu(name):
    warnings.simplefilter("ignore")
    _tester(name).test_implementation(on=("qemu",), n_inputs=1, targets=["cortex-m55", "cortex-m4"])


def test_cmsis_emission_uses_per_block_calls(tmp_path):
    """The per-channel case runs ``arm_elementwise_add_s8`` once per pixel (C-vector blocks)."""
    from corten.codegen import emit_c
    from corten.memory import plan_memory

    warnings.simplefilter("ignore")
    for name, calls in (("plus_bias", "for (i = 0; i < 25; i++)"), ("plus_pooled", "for (i = 0; i < 36; i++)"),
                        ("plus_number", "corten_add_broadcast_s8")):
        prog = _tester(name).lower().program
        lib = emit_c(prog.ep, plan_memory(prog.ep, prog.target), tmp_path / name, name, prog.target,
                     kernels="cmsis-nn")
        assert calls in lib.source.read_text(), name


@pytest.mark.skipif(not CMSIS_NN_PATH, reason="set CMSIS_NN_PATH to a CMSIS-NN source tree")
@pytest.mark.parametrize("name", ["plus_bias", "plus_pooled", "row_bias", "max_constant"])
def test_add_broadcast_implementation_cmsis_nn(name):
    warnings.simplefilter("ignore")
    _tester(name).test_implementation(on=("host", "qemu"), kernels="cmsis-nn", n_inputs=1,
                                      targets=["cortex-m55", "cortex-m4"])
