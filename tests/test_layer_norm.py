"""``quantized_layer_norm``: the exact integer reference kernel against ``naive_layer_norm.py`` and
against float LayerNorm (the error it adds), the portable C kernel against the reference (host),
the lowering of nn.LayerNorm / F.layer_norm and the emitted C on the host and QEMU Cortex-M55/M4."""
from __future__ import annotations

import ctypes
import random
import shutil
import subprocess
import warnings

import pytest
import torch
from torch import nn

import corten.ops  # noqa: F401
from conftest import needs_gcc
import naive_layer_norm as naive
from corten.codegen import KERNELS_DIR
from corten.ops.checks import CortenOpError
from corten.ops.layer_norm import isqrt_t, layer_norm_params
from corten.testing.tester import Tester

ln = torch.ops.corten.quantized_layer_norm
GCC = shutil.which("gcc")
HAVE_QEMU = shutil.which("qemu-system-arm") is not None and shutil.which("arm-none-eabi-gcc") is not None


def _case(rng: random.Random, n: int | None = None):
    n = n or rng.choice([1, 2, 3, 8, 17, 64, 200, 1000])
    rows = rng.randint(1, 4)
    spread = rng.choice([0, 1, 3, 40, 127])
    centre = rng.randint(-100, 100)
    x = torch.tensor([[max(-128, min(127, centre + rng.randint(-spread, spread))) for _ in range(n)]
                      for _ in range(rows)], dtype=torch.int8)
    s_in = rng.choice([0.002, 0.02, 0.1, 1.0])
    s_out = rng.choice([0.01, 0.03, 0.1])
    w = torch.tensor([rng.uniform(-2, 2) for _ in range(n)], dtype=torch.float64)
    b = torch.tensor([rng.uniform(-1, 1) for _ in range(n)], dtype=torch.float64)
    eps = rng.choice([0.0, 1e-5, 1e-3])
    mult, shift, bias, eps_q = layer_norm_params(w, b, eps, n, s_in, s_out)
    zp = rng.randint(-20, 20)
    return x, (mult, shift, bias, eps_q, zp, -128, 127), (w, b, eps, s_in, s_out, zp)


def test_isqrt_exact():
    rng = random.Random(1)
    vals = [0, 1, 2, 3, 4, (1 << 62) - 1, (1 << 60), (1 << 61) + 12345] + [rng.randrange(1 << 62) for _ in range(2000)]
    import math
    assert isqrt_t(torch.tensor(vals)).tolist() == [math.isqrt(v) for v in vals]


def test_reference_matches_naive():
    rng = random.Random(2)
    for _ in range(150):
        x, params, _ = _case(rng)
        got = ln(x, *params).tolist()
        mult, shift, bias, eps_q, zp, amin, amax = params
        want = [naive.layer_norm_row(r, mult.tolist(), shift.tolist(), bias.tolist(), eps_q, zp, amin, amax)
                for r in x.tolist()]
        assert got == want


def test_error_against_float_layer_norm():
    """The integer kernel is within one output step of float LayerNorm of the dequantized int8 input
    (half a step of final rounding + the Q16 normalized value + the folded gamma/beta rounding)."""
    rng = random.Random(3)
    worst = 0.0
    for _ in range(100):
        x, params, (w, b, eps, s_in, s_out, zp) = _case(rng)
        got = ln(x, *params).double()
        real = torch.nn.functional.layer_norm(x.double() * s_in, (x.shape[1],), w, b, eps)
        want = (real / s_out + zp).clamp(-128, 127)
        worst = max(worst, float((got - want).abs().max()))
    assert worst <= 0.51, worst


def test_constant_row_without_eps_gives_beta():
    mult, shift, bias, eps_q = layer_norm_params(torch.ones(4), torch.full((4,), 0.5), 0.0, 4, 0.1, 0.01)
    assert eps_q == 0
    assert ln(torch.full((1, 4), 7, dtype=torch.int8), mult, shift, bias, eps_q, 0, -128, 127).tolist() == [[50] * 4]


def test_four_d_last_dim_and_multi_dim_rows():
    rng = random.Random(4)
    x = torch.randint(-128, 128, (2, 3, 4, 5), dtype=torch.int8).contiguous(memory_format=torch.channels_last)
    m, s, b, e = layer_norm_params(torch.rand(5), torch.rand(5), 1e-5, 5, 0.05, 0.03)
    out = ln(x, m, s, b, e, 3, -128, 127)
    flat = ln(x.reshape(-1, 5).contiguous(), m, s, b, e, 3, -128, 127).reshape(2, 3, 4, 5)
    assert torch.equal(out, flat) and out.is_contiguous(memory_format=torch.channels_last)
    y = torch.randint(-128, 128, (3, 4, 6), dtype=torch.int8)
    m, s, b, e = layer_norm_params(torch.rand(24), torch.rand(24), 1e-5, 24, 0.05, 0.03)
    assert torch.equal(ln(y, m, s, b, e, 0, -128, 127, 2), ln(y.reshape(3, 24), m, s, b, e, 0, -128, 127).reshape(3, 4, 6))
    torch.library.opcheck(ln.default, (y, m, s, b, e, 0, -128, 127, 2))
    del rng


@pytest.mark.parametrize("change,msg", [({"num_dims": 2}, "num_dims"), ({"eps_q": -1}, "eps_q"),
                                        ({"output_offset": 200}, "output_offset"),
                                        ({"multiplier": torch.full((5,), 7, dtype=torch.int32)}, "multiplier"),
                                        ({"bias": torch.zeros(4, dtype=torch.int32)}, "bias")])
def test_bad_arguments(change, msg):
    m, s, b, e = layer_norm_params(torch.rand(5), torch.rand(5), 1e-5, 5, 0.05, 0.03)
    args = dict(input=torch.zeros((2, 2, 2, 5), dtype=torch.int8).contiguous(memory_format=torch.channels_last),
                multiplier=m, shift=s, bias=b, eps_q=e, output_offset=0, activation_min=-128, activation_max=127)
    args.update(change)
    with pytest.raises(CortenOpError, match=msg):
        ln(**args)


# ----------------------------------------------------------------------------- portable C kernel (host)
class _Params(ctypes.Structure):
    _fields_ = [("eps_q", ctypes.c_int64), ("output_offset", ctypes.c_int32), ("activation_min", ctypes.c_int32),
                ("activation_max", ctypes.c_int32)]


@pytest.fixture(scope="module")
def portable(tmp_path_factory):
    if GCC is None:
        pytest.skip("needs gcc")
    out = tmp_path_factory.mktemp("ln") / "libln.so"
    subprocess.run([GCC, "-std=c99", "-O2", "-shared", "-fPIC", "-Wall", "-Wextra", "-Werror", f"-I{KERNELS_DIR}",
                    str(KERNELS_DIR / "layer_norm.c"), "-o", str(out)], check=True, capture_output=True, text=True)
    return ctypes.CDLL(str(out))


def _c_array(t: torch.Tensor, ctype):
    t = t.contiguous()
    return (ctype * t.numel())(*t.flatten().tolist())


def test_portable_kernel_matches_reference(portable):
    rng = random.Random(5)
    for i in range(200):
        x, (mult, shift, bias, eps_q, zp, amin, amax), _ = _case(rng, n=rng.choice([1, 5, 33, 300, 4095]) if i % 10 == 0 else None)
        amin, amax = (-100, 90) if i % 3 == 0 else (amin, amax)
        want = ln(x, mult, shift, bias, eps_q, zp, amin, amax)
        dst = (ctypes.c_int8 * x.numel())()
        p = _Params(eps_q, zp, amin, amax)
        assert portable.corten_layer_norm_s8(ctypes.byref(p), x.shape[0], x.shape[1], 1, _c_array(mult, ctypes.c_int32),
                                             _c_array(shift, ctypes.c_int32), _c_array(bias, ctypes.c_int32),
                                             x.numpy().tobytes(), dst) == 0
        assert bytes(dst) == want.numpy().tobytes()


def test_portable_kernel_strided_rows(portable):
    x = torch.randint(-128, 128, (2, 3, 4, 5), dtype=torch.int8).contiguous(memory_format=torch.channels_last)
    m, s, b, e = layer_norm_params(torch.randn(5), torch.randn(5), 1e-5, 5, 0.05, 0.03)
    want = ln(x, m, s, b, e, 3, -128, 127)
    src = x.permute(0, 2, 3, 1).contiguous().numpy().tobytes()  # NHWC bytes: W rows are C = 3 bytes apart
    dst = (ctypes.c_int8 * x.numel())()
    p = _Params(e, 3, -128, 127)
    assert portable.corten_layer_norm_s8(ctypes.byref(p), 2 * 4, 5, 3, _c_array(m, ctypes.c_int32),
                                         _c_array(s, ctypes.c_int32), _c_array(b, ctypes.c_int32), src, dst) == 0
    assert bytes(dst) == want.permute(0, 2, 3, 1).contiguous().numpy().tobytes()
    p.eps_q = -1
    assert portable.corten_layer_norm_s8(ctypes.byref(p), 1, 5, 1, _c_array(m, ctypes.c_int32),
                                         _c_array(s, ctypes.c_int32), _c_array(b, ctypes.c_int32), src, dst) != 0


# ----------------------------------------------------------------------------- through the compiler
class Block(nn.Module):
    """Pre-norm transformer MLP block: LayerNorm -> Linear -> GELU -> Linear (+ residual), and a bare
    F.layer_norm without affine parameters."""

    def __init__(self, d: int = 16):
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.fc1, self.fc2 = nn.Linear(d, 2 * d), nn.Linear(2 * d, d)
        with torch.no_grad():
            self.norm.weight.uniform_(0.5, 1.5)
            self.norm.bias.uniform_(-0.3, 0.3)

    def forward(self, x):
        y = x + self.fc2(nn.functional.gelu(self.fc1(self.norm(x))))
        return y, nn.functional.layer_norm(y, (16,))


def _tester() -> Tester:
    warnings.simplefilter("ignore")
    torch.manual_seed(0)
    model = Block()
    return Tester(model.eval(), (torch.randn(1, 6, 16),))


def test_dialect():
    t = _tester()
    report = t.test_dialect(ops_before={"aten.layer_norm.default": 2},
                            ops_after={"quantize_per_tensor": 1, "quantized_layer_norm": 2, "quantized_linear": 2,
                                       "quantized_lut": 1, "quantized_add": 1, "dequantize_per_tensor": 2}, qtol=1)
    assert report.cosine_vs_float > 0.99


def test_implementation_host_and_qemu():
    on = ("host", "qemu") if HAVE_QEMU else ("host",)
    _tester().test_implementation(on=on, n_inputs=1, targets=["cortex-m55", "cortex-m4"])


class ConvLayerNorm(nn.Module):
    """``nn.LayerNorm`` over several trailing dims of a feature map (``(C, H, W)`` or ``(H, W)``)."""

    def __init__(self, normalized):
        super().__init__()
        self.conv, self.norm = nn.Conv2d(3, 4, 3, padding=1), nn.LayerNorm(normalized)
        with torch.no_grad():
            self.norm.weight.uniform_(0.5, 1.5), self.norm.bias.uniform_(-0.5, 0.5)

    def forward(self, x):
        return torch.relu(self.norm(self.conv(x)))


@needs_gcc
@pytest.mark.parametrize("normalized", [(4, 6, 6), (6, 6)], ids=["chw", "hw"])
def test_layer_norm_over_several_dims_of_a_feature_map_is_spelled_out_and_byte_exact(normalized):
    import corten

    torch.manual_seed(0)
    model = ConvLayerNorm(normalized).eval()
    x = torch.randn(1, 3, 6, 6)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        prog = corten.compile(model, (x,), calibration=[(x,)] + [(torch.randn(1, 3, 6, 6),) for _ in range(7)])
    assert prog.unlowered_ops() == [] and "quantized_layer_norm" not in prog.op_counts()
    assert all(torch.equal(a, b) for a, b in zip(prog.run_int8(x), prog.run_c(x, on="host", int8=True)))
    with torch.no_grad():
        ref = model(x)
    cos = torch.nn.functional.cosine_similarity(prog.run(x).flatten(), ref.flatten(), dim=0)
    assert float(cos) > 0.98
