"""Reductions (``quantized_reduce``): max / min / sum / mean over any dims with or without keepdim,
against a naive plain-Python reduction written from TFLite's SUM/MEAN arithmetic, the portable
``corten_reduce_s8`` byte for byte through ctypes, and user-style models (``x.amax(dim=1)``,
``x.max(dim=2).values``, ``x.sum(-1, keepdim=True)``, ``x.mean(dim=1)``) through the pipeline."""
from __future__ import annotations

import ctypes
import itertools
import random
import shutil
import warnings

import pytest
import torch
from torch import nn

import naive
import naive_elementwise as ne
import op_cases as oc
from corten.testing import Tester

OPS = torch.ops.corten
needs_gcc = pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")
needs_qemu = pytest.mark.skipif(shutil.which("qemu-system-arm") is None or shutil.which("arm-none-eabi-gcc") is None,
                                reason="needs qemu-system-arm and arm-none-eabi-gcc")


def naive_reduce(x, dims, keepdim, mode, in_off, out_off, mult, shift, lo, hi):
    """Flat row-major result of the reduction of the nested list ``x``."""
    shape = ne.shape_of(x)
    flat = ne.flatten(x)
    kept = [d for d in range(len(shape)) if d not in dims]
    out = []
    for kpos in itertools.product(*(range(shape[d]) for d in kept)):
        vals = []
        for rpos in itertools.product(*(range(shape[d]) for d in dims)):
            idx = [0] * len(shape)
            for d, p in zip(kept, kpos):
                idx[d] = p
            for d, p in zip(dims, rpos):
                idx[d] = p
            f = 0
            for d, p in enumerate(idx):
                f = f * shape[d] + p
            vals.append(flat[f])
        if mode == 0:
            v = max(vals)
        elif mode == 1:
            v = min(vals)
        else:
            v = naive.i32(naive.requantize(sum(a + in_off for a in vals), mult, shift) + out_off)
        out.append(naive.clamp(v, lo, hi))
    return out


def _case(rng):
    rank = rng.randint(1, 4)
    shape = tuple(rng.randint(1, 4) for _ in range(rank))
    dims = sorted(rng.sample(range(rank), rng.randint(1, rank)))
    keepdim = rng.random() < 0.5 or len(dims) == rank
    mode = rng.randint(0, 2)
    m, s = oc.multiplier_shift(rng, -8.0, 0.0)
    return shape, dims, keepdim, (mode, oc.input_offset(rng), oc.output_offset(rng), m, s, *oc.activation_range(rng))


def test_reduce_matches_naive():
    rng = random.Random(101)
    for i in range(300):
        shape, dims, keepdim, args = _case(rng)
        x = oc.int8_tensor(rng, shape)
        got = OPS.quantized_reduce(x, dims, keepdim, *args)
        assert got.contiguous().flatten().tolist() == naive_reduce(x.tolist(), dims, keepdim, *args), \
            f"case {i}: {shape} {dims} {keepdim} {args}"


def test_reduce_bad_arguments():
    from corten.ops import CortenOpError

    x = torch.zeros(1, 3, 4, dtype=torch.int8)
    with pytest.raises(CortenOpError, match="quantized_reduce.*'dims'"):
        OPS.quantized_reduce(x, [3], False, 0, 0, 0, 0, 0, -128, 127)
    with pytest.raises(CortenOpError, match="quantized_reduce.*'mode'"):
        OPS.quantized_reduce(x, [1], False, 5, 0, 0, 0, 0, -128, 127)


class ReduceParams(ctypes.Structure):
    _fields_ = [("dims", ctypes.c_int32 * 4), ("reduce", ctypes.c_int32 * 4), ("out_strides", ctypes.c_int32 * 4)] + \
        [(f, ctypes.c_int32) for f in ("mode", "input_offset", "output_offset", "multiplier", "shift",
                                       "activation_min", "activation_max")]


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    return ne.build_kernel_library(tmp_path_factory.mktemp("reduce"), "reduce")


@needs_gcc
def test_reduce_kernel_matches_reference(lib):
    from corten.ops.reduce import reduce_geometry

    rng = random.Random(102)
    for i in range(400):
        shape, dims, keepdim, args = _case(rng)
        x = oc.int8_tensor(rng, shape)
        want = OPS.quantized_reduce(x, dims, keepdim, *args)
        sdims, flags, strides = reduce_geometry(shape, dims, keepdim)
        p = ReduceParams((ctypes.c_int32 * 4)(*sdims), (ctypes.c_int32 * 4)(*flags), (ctypes.c_int32 * 4)(*strides),
                         *args)
        out = (ctypes.c_int8 * want.numel())()
        assert lib.corten_reduce_s8(ctypes.byref(p), ne.c_buffer(x), out) == 0
        assert bytes(out) == ne.c_bytes(want), f"case {i}: {shape} {dims} {keepdim} {args}"
    assert lib.corten_reduce_s8(None, ne.c_buffer(x), out) == -1


# ----------------------------------------------------------------------------- models
class Reductions(nn.Module):
    """amax over channels, max.dim values over H, sum over W with keepdim, mean over channels."""

    def __init__(self, which):
        super().__init__()
        self.conv, self.which = nn.Conv2d(3, 4, 3, padding=1), which

    def forward(self, x):
        y = self.conv(x)
        if self.which == "amax":
            return y.amax(dim=1)
        if self.which == "max_dim":
            return y.max(dim=2, keepdim=True).values
        if self.which == "min_dim":
            return torch.min(y, dim=-1)[0]
        if self.which == "sum":
            return y.sum(-1, keepdim=True)
        return y.mean(dim=1)


class SeqMean(nn.Module):
    """A [N, T, F] sequence: linear then mean over T (token pooling)."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(6, 5)

    def forward(self, x):
        return self.fc(x).mean(dim=1)


IO = {"quantize_per_tensor": 1, "dequantize_per_tensor": 1}
R = {"quantized_conv2d": 1, "quantized_reduce": 1}
MODELS = {
    "amax": (lambda: Reductions("amax"), (1, 3, 4, 5), {**IO, **R}),
    "max_dim": (lambda: Reductions("max_dim"), (1, 3, 4, 5), {**IO, **R}),
    "min_dim": (lambda: Reductions("min_dim"), (1, 3, 4, 5), {**IO, **R}),
    "sum": (lambda: Reductions("sum"), (1, 3, 4, 5), {**IO, **R}),
    "mean_channels": (lambda: Reductions("mean"), (1, 3, 4, 5), {**IO, **R}),
    "seq_mean": (SeqMean, (1, 7, 6), {**IO, "quantized_linear": 1, "quantized_reduce": 1}),
}
_TESTERS: dict[str, Tester] = {}


def _tester(name: str) -> Tester:
    if name not in _TESTERS:
        factory, shape, _ = MODELS[name]
        torch.manual_seed(0)
        _TESTERS[name] = Tester(factory().eval(), (torch.randn(shape),))
    return _TESTERS[name]


@pytest.mark.parametrize("name", sorted(MODELS))
def test_reduce_dialect(name):
    warnings.simplefilter("ignore")
    _, _, after = MODELS[name]
    report = _tester(name).test_dialect(ops_before={}, ops_after=after, qtol=1)
    assert report.cosine_vs_float > 0.98, report


@needs_gcc
@pytest.mark.parametrize("name", sorted(MODELS))
def test_reduce_implementation_host(name):
    warnings.simplefilter("ignore")
    _tester(name).test_implementation(on=("host",), n_inputs=2)


@needs_qemu
@pytest.mark.parametrize("name", ["sum", "seq_mean"])
def test_reduce_implementation_qemu(name):
    warnings.simplefilter("ignore")
    _tester(name).test_implementation(on=("qemu",), n_inputs=1, targets=["cortex-m55", "cortex-m4"])
