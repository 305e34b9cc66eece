"""Comparisons (eq/ne/lt/le/gt/ge, tensor-tensor and tensor-number), ``torch.where`` and clamp with
tensor bounds: the integer thresholds against exact rational comparisons of the real values, the
reference ops against a naive broadcast, the portable ``corten_compare_s8`` / ``corten_where_s8``
byte for byte through ctypes, and user-style models through the pipeline (dialect, host, QEMU)."""
from __future__ import annotations

import ctypes
import operator
import random
import shutil
import warnings
from fractions import Fraction

import pytest
import torch
from torch import nn

import naive_elementwise as ne
import op_cases as oc
from corten.ops.compare import MODES, scalar_threshold
from corten.testing import Tester

OPS = torch.ops.corten
PY = (operator.eq, operator.ne, operator.lt, operator.le, operator.gt, operator.ge)
needs_gcc = pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")
needs_qemu = pytest.mark.skipif(shutil.which("qemu-system-arm") is None or shutil.which("arm-none-eabi-gcc") is None,
                                reason="needs qemu-system-arm and arm-none-eabi-gcc")


def test_scalar_threshold_is_exact():
    """For every int8 q: ``q mode' t`` == ``scale * (q - zp) OP c`` in exact rational arithmetic."""
    rng = random.Random(111)
    for _ in range(400):
        scale = 2.0 ** rng.uniform(-8, 0)
        zp = rng.randint(-128, 127)
        c = rng.choice([0.0, float(rng.randint(-3, 3)) * scale, rng.uniform(-300, 300) * scale,
                        (rng.randint(-140, 140) - zp) * scale, rng.uniform(-1, 1)])
        for mode in range(6):
            m2, t = scalar_threshold(mode, c, scale, zp)
            for q in range(-128, 128):
                want = PY[mode](Fraction(scale) * (q - zp), Fraction(c))
                assert PY[m2](q, t) == want, (MODES[mode], c, scale, zp, q)


def test_compare_and_where_match_naive():
    rng = random.Random(112)
    for i in range(200):
        s1, s2 = ne.random_broadcast_shapes(rng)
        x1, x2 = oc.int8_tensor(rng, s1), oc.int8_tensor(rng, s2)
        mode = rng.randint(0, 5)
        got = OPS.quantized_compare(x1, x2, mode)
        shape, want = ne.binary(lambda a, b: int(PY[mode](a, b)), x1.tolist(), x2.tolist())
        assert got.dtype == torch.bool and got.contiguous().flatten().int().tolist() == want, f"case {i}"
        cond = torch.rand(s1, generator=torch.Generator().manual_seed(i)) < 0.5
        got = OPS.quantized_where(cond, x1, x2)
        _, pairs = ne.binary(lambda a, b: (a, b), x1.tolist(), x2.tolist())
        _, conds = ne.binary(lambda a, b: a, cond.int().tolist(), x2.tolist())
        assert got.contiguous().flatten().tolist() == [a if c else b for c, (a, b) in zip(conds, pairs)], f"case {i}"


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    return ne.build_kernel_library(tmp_path_factory.mktemp("compare"), "compare")


@needs_gcc
def test_compare_and_where_kernels_match_reference(lib):
    from corten.ops._broadcast import loop_geometry

    class Dims(ctypes.Structure):
        _fields_ = [(f, ctypes.c_int32) for f in ("n", "h", "w", "c")]

    rng = random.Random(113)
    for i in range(300):
        s1, s2 = ne.random_broadcast_shapes(rng)
        x1, x2 = oc.int8_tensor(rng, s1), oc.int8_tensor(rng, s2)
        mode = rng.randint(0, 5)
        want = OPS.quantized_compare(x1, x2, mode)
        out = (ctypes.c_int8 * want.numel())()
        shape = ne.broadcast_struct(want.shape, s1, s2)
        assert lib.corten_compare_s8(mode, ctypes.byref(shape), ne.c_buffer(x1), ne.c_buffer(x2), out) == 0
        assert bytes(out) == ne.c_bytes(want.to(torch.int8)), f"compare case {i}"
        cond = torch.rand(s2, generator=torch.Generator().manual_seed(i)) < 0.5
        want = OPS.quantized_where(cond, x1, x2)
        dims, _, sc = loop_geometry(want.shape, cond.shape)
        _, _, sa = loop_geometry(want.shape, s1)
        _, _, sb = loop_geometry(want.shape, s2)
        out = (ctypes.c_int8 * want.numel())()
        assert lib.corten_where_s8(ctypes.byref(Dims(*dims)), ctypes.byref(Dims(*sc)), ne.c_buffer(cond.to(torch.int8)),
                                   ctypes.byref(Dims(*sa)), ne.c_buffer(x1), ctypes.byref(Dims(*sb)),
                                   ne.c_buffer(x2), out) == 0
        assert bytes(out) == ne.c_bytes(want), f"where case {i}"


# ----------------------------------------------------------------------------- models
class LeakyWhere(nn.Module):
    """``torch.where(y > 0, y, 0.1 * y)`` and ``torch.where(y <= 0.5, y, 0.0)``."""

    def __init__(self, which):
        super().__init__()
        self.conv, self.which = nn.Conv2d(3, 4, 3, padding=1), which

    def forward(self, x):
        y = self.conv(x)
        if self.which == "leaky":
            return torch.where(y > 0, y, 0.1 * y)
        if self.which == "scalar":
            return torch.where(y <= 0.5, y, 0.0)
        if self.which == "tensors":
            z = torch.relu(y)
            return torch.where(y >= z * 0.5, y, z)
        z = torch.sigmoid(y)
        return torch.clamp(y, min=z - 1.0, max=z)


class ClampParams(nn.Module):
    """``clamp`` with per-channel parameter bounds (ExecuTorch's suite: constant tensor bounds), and
    one activation bound beside a constant one."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.lo = nn.Parameter(torch.linspace(-1.0, -0.2, 4).reshape(1, 4, 1, 1))
        self.hi = nn.Parameter(torch.linspace(0.3, 1.2, 4).reshape(1, 4, 1, 1))

    def forward(self, x):
        y = self.conv(x)
        return torch.clamp(y, min=self.lo, max=self.hi) + torch.clamp(y, min=y * 0.5, max=self.hi)


IO = {"quantize_per_tensor": 1, "dequantize_per_tensor": 1}
MODELS = {
    "leaky": (lambda: LeakyWhere("leaky"), {**IO, "quantized_conv2d": 1, "quantized_compare": 1, "quantized_mul": 1,
                                            "quantized_where": 1}),
    "scalar": (lambda: LeakyWhere("scalar"), {**IO, "quantized_conv2d": 1, "quantized_compare": 1,
                                              "quantized_where": 1}),
    # the sigmoid (fixed 1/256 grid) is requantized onto the clamp's shared grid by a second table
    "clamp_params": (ClampParams, {**IO, "quantized_conv2d": 1, "quantized_maximum": 2, "quantized_minimum": 2,
                                   "quantized_mul": 1, "quantized_add": 1}),
    "clamp_tensor": (lambda: LeakyWhere("clamp"), {**IO, "quantized_conv2d": 1, "quantized_lut": 2,
                                                   "quantized_sub": 1, "quantized_maximum": 1,
                                                   "quantized_minimum": 1}),
}
_TESTERS: dict[str, Tester] = {}


def _tester(name: str) -> Tester:
    if name not in _TESTERS:
        factory, _ = MODELS[name]
        torch.manual_seed(0)
        _TESTERS[name] = Tester(factory().eval(), (torch.randn(1, 3, 5, 5),))
    return _TESTERS[name]


@pytest.mark.parametrize("name", sorted(MODELS))
def test_where_dialect(name):
    warnings.simplefilter("ignore")
    report = _tester(name).test_dialect(ops_before={}, ops_after=MODELS[name][1], qtol=1)
    assert report.cosine_vs_float > 0.98, report


@needs_gcc
@pytest.mark.parametrize("name", sorted(MODELS))
def test_where_implementation_host(name):
    warnings.simplefilter("ignore")
    _tester(name).test_implementation(on=("host",), n_inputs=2)


@needs_qemu
def test_where_implementation_qemu():
    warnings.simplefilter("ignore")
    _tester("leaky").test_implementation(on=("qemu",), n_inputs=1, targets=["cortex-m55", "cortex-m4"])


class Masks(nn.Module):
    """Comparison results returned by the program (ExecuTorch's suite returns them): a mask beside
    the values, a tensor-tensor comparison, a dict output."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)

    def forward(self, x):
        y = self.conv(x)
        return {"y": y * 2, "positive": y > 0.1, "below": x < y[:, :3]}


@needs_gcc
def test_comparison_results_are_program_outputs_byte_exact():
    """A bool output is the comparison's bytes as they are: ``uint8_t`` 0/1 in C (``_BOOL`` in the
    header, no dequantize helper), ``torch.bool`` from run/run_c; equal on the host and QEMU M4."""
    import corten

    warnings.simplefilter("ignore")
    torch.manual_seed(0)
    model = Masks().eval()
    calib = [(torch.randn(1, 3, 5, 5),) for _ in range(4)]
    prog = corten.compile(model, calib[0], calibration=calib)
    assert prog.unlowered_ops() == []
    x = torch.randn(1, 3, 5, 5)
    want = prog.run_int8(x)
    assert [t.dtype for t in want] == [torch.int8, torch.bool, torch.bool]
    on = ("host", "qemu") if shutil.which("qemu-system-arm") and shutil.which("arm-none-eabi-gcc") else ("host",)
    for where in on:
        got = prog.c_run(x, on=where, target="cortex-m4").outputs
        assert all(torch.equal(a, b) for a, b in zip(want, got)), where
    out, ref = prog.run_c(x), model(x)
    assert out["positive"].dtype == torch.bool
    # exact on y's int8 grid: it differs from float only where y is within a rounding of 0.1
    # (output y * 2 has about twice y's scale: one of its steps bounds y's rounding)
    y = model.conv(x)
    near = (y - 0.1).abs() < float(prog.outputs[0].scale)
    assert torch.equal(out["positive"][~near], ref["positive"][~near])
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as d:
        prog.emit_c(d)
        h = "\n".join(p.read_text() for p in Path(d).glob("*.h"))
    assert "_OUTPUT1_BOOL 1" in h and "uint8_t *positive;" in h and "dequantize_output1" not in h
