"""``corten.quantized_pad``: reference kernel vs a naive oracle, opcheck, argument errors, the
lowering of ``F.pad`` / ``constant_pad_nd`` (dialect tests), the portable C kernel byte for byte,
and a conv -> pad -> conv model on the host and QEMU.

Case counts: PAD_CASES random pads of 1-D to 4-D tensors (<= 5 per dim, pads 0..3) vs the naive
oracle; C_PAD_CASES through ``corten_pad_s8``.
"""
from __future__ import annotations

import ctypes
import random
import shutil
import subprocess

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from conftest import needs_cmsis_nn

import naive_data_movement as naive
import op_cases as oc
from corten.codegen import KERNELS_DIR
from corten.ops import CortenOpError
from corten.ops.pad import pad_storage_dims, per_dim_pads, torch_pad_list
from corten.testing import Tester

PAD_CASES = 2000
C_PAD_CASES = 400
pad = torch.ops.corten.quantized_pad


def _random_case(rng: random.Random) -> dict:
    rank = rng.randint(1, 4)
    shape = [rng.randint(1, 5) for _ in range(rank)]
    pre = [rng.choice((0, 0, 1, 2, 3)) for _ in range(rank)]
    post = [rng.choice((0, 0, 1, 2, 3)) for _ in range(rank)]
    x = oc.int8_tensor(rng, shape)
    if rank == 4:
        x = oc.maybe_channels_last(rng, x)
    return dict(input=x, pre_pad=pre, post_pad=post, pad_value=rng.randint(-128, 127))


# ----------------------------------------------------------------------------- reference kernel
def test_pad_matches_naive():
    rng = random.Random(9100)
    for i in range(PAD_CASES):
        c = _random_case(rng)
        out = pad(**c)
        want, want_shape = naive.pad(c["input"].flatten().tolist(), list(c["input"].shape), c["pre_pad"],
                                     c["post_pad"], c["pad_value"])
        assert list(out.shape) == want_shape and out.dtype == torch.int8
        assert out.flatten().tolist() == want, f"case {i}: {c}"
        if out.dim() == 4:
            assert oc.is_channels_last(out)


def test_pad_list_conversions():
    assert per_dim_pads([1, 2, 3, 4], 4) == ([0, 0, 3, 1], [0, 0, 4, 2])
    assert per_dim_pads([], 2) == ([0, 0], [0, 0])
    assert torch_pad_list([0, 0, 3, 1], [0, 0, 4, 2]) == [1, 2, 3, 4, 0, 0, 0, 0]
    with pytest.raises(ValueError, match="even length"):
        per_dim_pads([1, 2, 3], 2)
    with pytest.raises(ValueError, match="at most 4"):
        per_dim_pads([1] * 6, 2)
    # storage order: NCHW pads of an activation become NHWC; lower ranks are right-aligned
    assert pad_storage_dims([1, 3, 4, 5], [0, 1, 2, 3], [0, 4, 5, 6]) == ([1, 4, 5, 3], [0, 2, 3, 1], [0, 5, 6, 4])
    assert pad_storage_dims([2, 7], [1, 2], [3, 4]) == ([1, 1, 2, 7], [0, 0, 1, 2], [0, 0, 3, 4])


@pytest.mark.parametrize("seed", range(3))
def test_opcheck_pad(seed):
    c = _random_case(random.Random(seed))
    torch.library.opcheck(pad.default, (c["input"], c["pre_pad"], c["post_pad"], c["pad_value"]))


def _good():
    return dict(input=torch.zeros((1, 2, 3, 3), dtype=torch.int8), pre_pad=[0, 0, 1, 1], post_pad=[0, 0, 1, 1],
                pad_value=0)


@pytest.mark.parametrize("arg, value", [
    ("input", torch.zeros((1, 2, 3, 3), dtype=torch.int16)),
    ("input", torch.zeros((1, 1, 2, 3, 3), dtype=torch.int8)),
    ("pre_pad", [0, 1, 1]),
    ("post_pad", [0, 0, -1, 1]),
    ("pad_value", 128),
    ("pad_value", -129),
])
def test_pad_bad_arguments(arg, value):
    args = _good()
    args[arg] = value
    with pytest.raises(CortenOpError, match=rf"quantized_pad.*'{arg}'"):
        pad(**args)


def test_pad_good_arguments_are_accepted():
    assert pad(**_good()).shape == (1, 2, 5, 5)


# ----------------------------------------------------------------------------- lowering (dialect)
class ConvPadConv(nn.Module):
    def __init__(self, pad=(1, 2, 0, 1), value=0.0, c_in=3):
        super().__init__()
        self.a, self.b = nn.Conv2d(c_in, 4, 3), nn.Conv2d(4 + sum(pad[4:6]) if len(pad) > 4 else 4, 4, 3)
        self.pad, self.value = pad, value

    def forward(self, x):
        return self.b(F.pad(torch.relu(self.a(x)), self.pad, value=self.value))


LOWERED = {"quantize_per_tensor": 1, "quantized_conv2d": 2, "quantized_pad": 1, "dequantize_per_tensor": 1}


def _pad_node(t: Tester):
    (node,) = [n for n in t.program.ep.graph.nodes if n.target == pad.default]
    return node


@pytest.mark.parametrize("pads, value", [((1, 2, 0, 1), 0.0), ((1, 1, 1, 1), 0.5), ((0, 0, 0, 0, 1, 2), 0.0)],
                         ids=["hw-zeros", "hw-value", "channels"])
def test_dialect_conv_pad_conv(pads, value):
    torch.manual_seed(0)
    t = Tester(ConvPadConv(pads, value).eval(), (torch.randn(1, 3, 8, 7),))
    t.test_dialect({"aten.pad.default": 1, "aten.conv2d.default": 2}, LOWERED, qtol=1)
    # the pad value is the real constant on the input's (shared) int8 grid: 0.0 -> the zero point
    (q,) = [n for n in t.converted.graph.nodes
            if n.target == torch.ops.quantized_decomposed.quantize_per_tensor.default
            and n.args[0].target == torch.ops.aten.pad.default]
    scale, zp = float(q.args[1]), int(q.args[2])
    assert _pad_node(t).args[3] == max(-128, min(127, zp + round(value / scale)))


def test_dialect_zero_pad_module_and_constant_pad_nd():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.zp, self.b = nn.Conv2d(2, 3, 1), nn.ZeroPad2d((2, 0, 1, 3)), nn.Conv2d(3, 2, 3)

        def forward(self, x):
            y = self.b(self.zp(self.a(x)))
            return torch.constant_pad_nd(y, [1, 1])

    torch.manual_seed(1)
    t = Tester(Net().eval(), (torch.randn(1, 2, 5, 6),))
    t.test_dialect({}, {"quantize_per_tensor": 1, "quantized_conv2d": 2, "quantized_pad": 2,
                        "dequantize_per_tensor": 1}, qtol=1)


@pytest.mark.parametrize("mode", ["reflect", "replicate", "circular"])
def test_reflect_replicate_circular_pads_are_exact_index_copies(mode):
    """Spelled out as index_select with constant indices (aten_passes/decompose_composites): bytes only."""
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Conv2d(2, 3, 1)

        def forward(self, x):
            return F.pad(self.a(x), (2, 1, 1, 2), mode=mode)

    torch.manual_seed(2)
    x = torch.randn(1, 2, 5, 6)
    t = Tester(Net().eval(), (x,)).lower()
    assert t.program.unlowered_ops() == [] and "quantized_pad" not in t.program.op_counts()
    out = t.program.run_int8(x)[0]
    assert out.shape == (1, 3, 8, 9)
    inner = out[:, :, 1:6, 2:8].float()  # the conv's int8 output; the border must be its bytes, moved as torch pads
    assert torch.equal(F.pad(inner, (2, 1, 1, 2), mode=mode), out.float())
    assert torch.equal(out, t.program.run_c(x, on="host", int8=True)[0])


# ----------------------------------------------------------------------------- C kernel
class Dims(ctypes.Structure):
    _fields_ = [("n", ctypes.c_int32), ("h", ctypes.c_int32), ("w", ctypes.c_int32), ("c", ctypes.c_int32)]


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    if shutil.which("gcc") is None:
        pytest.skip("needs gcc")
    out = tmp_path_factory.mktemp("pad") / "libpad.so"
    subprocess.run(["gcc", "-std=c99", "-O2", "-Wall", "-Wextra", "-Werror", "-shared", "-fPIC", "-I",
                    str(KERNELS_DIR), str(KERNELS_DIR / "pad.c"), "-o", str(out)], check=True, capture_output=True)
    return ctypes.CDLL(str(out))


def _c_bytes(t: torch.Tensor):
    data = naive.storage_bytes(t.contiguous().flatten().tolist(), list(t.shape))
    return (ctypes.c_int8 * len(data))(*data)


def test_c_pad_matches_reference(lib):
    rng = random.Random(9200)
    for i in range(C_PAD_CASES):
        c = _random_case(rng)
        want = pad(**c)
        dims, pre, post = pad_storage_dims(list(c["input"].shape), c["pre_pad"], c["post_pad"])
        out = (ctypes.c_int8 * want.numel())()
        rc = lib.corten_pad_s8(_c_bytes(c["input"]), out, ctypes.c_int8(c["pad_value"]), ctypes.byref(Dims(*dims)),
                               ctypes.byref(Dims(*pre)), ctypes.byref(Dims(*post)))
        assert rc == 0
        assert list(out) == naive.storage_bytes(want.contiguous().flatten().tolist(), list(want.shape)), f"case {i}"


def test_c_pad_rejects_bad_arguments(lib):
    x, out = (ctypes.c_int8 * 4)(), (ctypes.c_int8 * 64)()
    d, z = Dims(1, 2, 2, 1), Dims(0, 1, 1, 0)
    assert lib.corten_pad_s8(x, out, ctypes.c_int8(0), ctypes.byref(d), ctypes.byref(z), ctypes.byref(z)) == 0
    assert lib.corten_pad_s8(None, out, ctypes.c_int8(0), ctypes.byref(d), ctypes.byref(z), ctypes.byref(z)) == -1
    assert lib.corten_pad_s8(x, out, ctypes.c_int8(0), ctypes.byref(d), ctypes.byref(Dims(0, -1, 0, 0)),
                             ctypes.byref(z)) == -1
    assert lib.corten_pad_s8(x, out, ctypes.c_int8(0), ctypes.byref(Dims(1, 0, 2, 1)), ctypes.byref(z),
                             ctypes.byref(z)) == -1


# ----------------------------------------------------------------------------- C library end to end
def test_implementation_conv_pad_conv_host_and_qemu():
    torch.manual_seed(3)
    t = Tester(ConvPadConv((1, 2, 2, 0, 0, 1), 0.25).eval(), (torch.randn(1, 3, 7, 6),))
    results = t.test_implementation(on=("host", "qemu"), n_inputs=2)
    assert {(r[0], r[1]) for r in results} == {("host", None), ("qemu", "cortex-m55")}


@needs_cmsis_nn
def test_implementation_cmsis_nn_arm_pad_s8(tmp_path):
    torch.manual_seed(3)
    t = Tester(ConvPadConv((1, 2, 2, 0, 0, 1), 0.25).eval(), (torch.randn(1, 3, 7, 6),))
    t.test_implementation(on=("host", "qemu"), kernels="cmsis-nn", n_inputs=1)
    assert "arm_pad_s8(" in t.program.emit_c(tmp_path, kernels="cmsis-nn").source.read_text()


def test_dialect_pad_of_linear_features():
    """2-D (row-major) tensors pad their last dimension; a negative constant lands on the grid."""

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(5, 4), nn.Linear(7, 3)

        def forward(self, x):
            return self.b(F.pad(self.a(x), (1, 2), value=-0.3))

    torch.manual_seed(4)
    t = Tester(Net().eval(), (torch.randn(1, 5),))
    t.test_dialect({"aten.pad.default": 1}, {"quantize_per_tensor": 1, "quantized_linear": 2, "quantized_pad": 1,
                                            "dequantize_per_tensor": 1}, qtol=1)
    assert _pad_node(t).args[1:3] == ([0, 1], [0, 2])
    t.test_implementation(on=("host",), n_inputs=1)
