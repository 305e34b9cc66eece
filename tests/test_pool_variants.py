"""Every pooling variant: average pools with ceil_mode, count_include_pad (with padding),
divisor_override and asymmetric padding; max pools with ceil_mode and dilation; adaptive average and
max pools with non-uniform windows; conv1d/conv2d with ``padding="same"`` and an even kernel (an exact
``quantized_pad``).  Reference ops against ``naive_pool.py`` (PyTorch's definitions) and against
PyTorch's own float pools on integer inputs; portable C kernels byte for byte through ctypes; user-style
models through the pipeline (dialect, C on the host, QEMU M55 + M4, CMSIS-NN with CMSIS_NN_PATH)."""
from __future__ import annotations

import ctypes
import os
import random
import shutil
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import naive_elementwise as ne
import naive_pool as npool
import op_cases as oc
from corten.fixed_point import round_half_away_t
from corten.testing import Tester

OPS = torch.ops.corten
needs_gcc = pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")
needs_qemu = pytest.mark.skipif(shutil.which("qemu-system-arm") is None or shutil.which("arm-none-eabi-gcc") is None,
                                reason="needs qemu-system-arm and arm-none-eabi-gcc")
CMSIS_NN_PATH = os.environ.get("CMSIS_NN_PATH")


def _nhwc_list(x):
    return x.permute(0, 2, 3, 1).tolist()


def _random_avg(rng):
    n, c = rng.randint(1, 2), rng.randint(1, 4)
    kh, kw = rng.randint(1, 4), rng.randint(1, 4)
    sh, sw = rng.randint(1, 3), rng.randint(1, 3)
    h, w = rng.randint(kh, 8), rng.randint(kw, 8)
    if rng.random() < 0.3:  # asymmetric padding [top, left, bottom, right]
        pads = [rng.randint(0, (kh - 1) // 2 if kh > 1 else 0), rng.randint(0, (kw - 1) // 2 if kw > 1 else 0)]
        pads += [rng.randint(0, (kh - 1) // 2 if kh > 1 else 0), rng.randint(0, (kw - 1) // 2 if kw > 1 else 0)]
    else:
        pads = [rng.randint(0, kh // 2), rng.randint(0, kw // 2)]
    ceil = rng.random() < 0.5
    include = rng.random() < 0.5
    divisor = rng.choice((0, 0, 0, rng.randint(1, 20)))
    return dict(shape=(n, c, h, w), kernel=[kh, kw], stride=[sh, sw], padding=pads, ceil=ceil, include=include,
                divisor=divisor, act=oc.activation_range(rng), zp=oc.output_offset(rng))


def test_avg_pool_variants_match_naive():
    rng = random.Random(81)
    for i in range(300):
        k = _random_avg(rng)
        x = oc.int8_tensor(rng, k["shape"])
        got = OPS.quantized_avg_pool2d(x, k["kernel"], k["stride"], k["padding"], *k["act"], k["ceil"], k["include"],
                                       k["divisor"], k["zp"])
        pads = npool_pads(k["padding"])
        want = npool.avg_pool2d(_nhwc_list(x), k["kernel"], k["stride"], pads, k["ceil"], k["include"], k["divisor"],
                                *k["act"], k["zp"])
        assert _nhwc_list(got) == want, f"case {i}: {k}"


def npool_pads(p):
    return (p[0], p[1], p[0], p[1]) if len(p) == 2 else tuple(p)


def test_avg_pool_variants_match_pytorch():
    """Symmetric padding: PyTorch's float ``avg_pool2d`` of the int8 values, rounded half away from
    zero (exact: the float64 quotient of small integers is never off a .5 tie)."""
    rng = random.Random(82)
    for i in range(300):
        k = _random_avg(rng)
        if len(k["padding"]) == 4:
            continue
        x = oc.int8_tensor(rng, k["shape"])
        got = OPS.quantized_avg_pool2d(x, k["kernel"], k["stride"], k["padding"], -128, 127, k["ceil"], k["include"],
                                       k["divisor"], k["zp"])
        zp = k["zp"] if (k["include"] or k["divisor"]) else 0  # real values q - zp, padding the real 0
        ref = F.avg_pool2d(x.double() - zp, k["kernel"], k["stride"], k["padding"], k["ceil"], k["include"],
                           k["divisor"] or None)
        want = (round_half_away_t(ref) + zp).clamp(-128, 127).to(torch.int64)  # divisor_override can leave int8
        assert torch.equal(got.to(torch.int64), want), f"case {i}: {k}"


def test_max_pool_variants_match_pytorch_and_naive():
    rng = random.Random(83)
    for i in range(300):
        kh, kw = rng.randint(1, 3), rng.randint(1, 3)
        dh, dw = rng.randint(1, 3), rng.randint(1, 3)
        sh, sw = rng.randint(1, 3), rng.randint(1, 3)
        h, w = rng.randint(dh * (kh - 1) + 1, 9), rng.randint(dw * (kw - 1) + 1, 9)
        pads = [rng.randint(0, kh // 2), rng.randint(0, kw // 2)]
        ceil = rng.random() < 0.5
        x = oc.int8_tensor(rng, (rng.randint(1, 2), rng.randint(1, 3), h, w))
        got = OPS.quantized_max_pool2d(x, [kh, kw], [sh, sw], pads, -128, 127, [dh, dw], ceil)
        ref = F.max_pool2d(x.float(), [kh, kw], [sh, sw], pads, [dh, dw], ceil)
        assert torch.equal(got, ref.to(torch.int8)), f"case {i}"
        act = oc.activation_range(rng)
        got = OPS.quantized_max_pool2d(x, [kh, kw], [sh, sw], pads, *act, [dh, dw], ceil)
        want = npool.max_pool2d(_nhwc_list(x), [kh, kw], [sh, sw], npool_pads(pads), [dh, dw], ceil, *act)
        assert _nhwc_list(got) == want, f"case {i}"


def test_adaptive_pools_match_pytorch_and_naive():
    rng = random.Random(84)
    for i in range(200):
        h, w = rng.randint(1, 9), rng.randint(1, 9)
        oh, ow = rng.randint(1, h + 2), rng.randint(1, w + 2)
        x = oc.int8_tensor(rng, (rng.randint(1, 2), rng.randint(1, 3), h, w))
        act = oc.activation_range(rng)
        avg = OPS.quantized_adaptive_avg_pool2d(x, [oh, ow], -128, 127)
        ref = round_half_away_t(F.adaptive_avg_pool2d(x.double(), (oh, ow))).to(torch.int8)
        assert torch.equal(avg, ref), f"case {i}"
        mx = OPS.quantized_adaptive_max_pool2d(x, [oh, ow], -128, 127)
        assert torch.equal(mx, F.adaptive_max_pool2d(x.float(), (oh, ow)).to(torch.int8)), f"case {i}"
        for is_avg, op in ((True, OPS.quantized_adaptive_avg_pool2d), (False, OPS.quantized_adaptive_max_pool2d)):
            want = npool.adaptive_pool2d(_nhwc_list(x), (oh, ow), is_avg, *act)
            assert _nhwc_list(op(x, [oh, ow], *act)) == want, f"case {i}"


def test_pool_variant_bad_arguments():
    from corten.ops import CortenOpError

    x = torch.zeros(1, 2, 5, 5, dtype=torch.int8)
    with pytest.raises(CortenOpError, match="quantized_avg_pool2d.*'padding'"):
        OPS.quantized_avg_pool2d(x, [3, 3], [1, 1], [1, 1, 1], -128, 127)
    with pytest.raises(CortenOpError, match="quantized_avg_pool2d.*'divisor_override'"):
        OPS.quantized_avg_pool2d(x, [3, 3], [1, 1], [1, 1], -128, 127, False, False, -2)
    with pytest.raises(CortenOpError, match="quantized_max_pool2d.*'dilation'"):
        OPS.quantized_max_pool2d(x, [3, 3], [1, 1], [1, 1], -128, 127, [0, 1], False)
    with pytest.raises(CortenOpError, match="quantized_adaptive_max_pool2d.*'output_size'"):
        OPS.quantized_adaptive_max_pool2d(x, [0, 2], -128, 127)


# ----------------------------------------------------------------------------- C kernels
class PoolParams(ctypes.Structure):
    _fields_ = [(f, ctypes.c_int32) for f in ("kernel_h", "kernel_w", "stride_h", "stride_w", "pad_h", "pad_w",
                                              "activation_min", "activation_max", "pad_bottom", "pad_right",
                                              "dilation_h", "dilation_w", "count_include_pad", "divisor_override", "zero_point")]


class Dims(ctypes.Structure):
    _fields_ = [(f, ctypes.c_int32) for f in ("n", "h", "w", "c")]


def _dims(t):
    n, c, h, w = t.shape
    return Dims(n, h, w, c)


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    return ne.build_kernel_library(tmp_path_factory.mktemp("pool"), "pool")


def _run(fn, *args, want):
    out = (ctypes.c_int8 * want.numel())()
    assert fn(*args, out) == 0
    return bytes(out)


@needs_gcc
def test_pool_variant_kernels_match_reference(lib):
    rng = random.Random(85)
    for i in range(300):
        k = _random_avg(rng)
        x = oc.int8_tensor(rng, k["shape"])
        want = OPS.quantized_avg_pool2d(x, k["kernel"], k["stride"], k["padding"], *k["act"], k["ceil"],
                                        k["include"], k["divisor"], k["zp"])
        t, l, b, r = npool_pads(k["padding"])
        p = PoolParams(*k["kernel"], *k["stride"], t, l, *k["act"], b, r, 1, 1, int(k["include"]), k["divisor"],
                       k["zp"])
        got = _run(lib.corten_avg_pool2d_s8, ctypes.byref(p), ctypes.byref(_dims(x)), ne.c_buffer(x),
                   ctypes.byref(_dims(want)), want=want)
        assert got == ne.c_bytes(want), f"avg case {i}: {k}"
        dil = [rng.randint(1, 2), rng.randint(1, 2)]
        kernel = [min(kk, (s - 1) // d + 1) for kk, s, d in zip(k["kernel"], k["shape"][2:], dil)]
        pads = [min(pp, kk // 2) for pp, kk in zip(npool_pads(k["padding"])[:2], kernel)]
        want = OPS.quantized_max_pool2d(x, kernel, k["stride"], pads, *k["act"], dil, k["ceil"])
        p = PoolParams(*kernel, *k["stride"], *pads, *k["act"], *pads, *dil, 0, 0, 0)
        got = _run(lib.corten_max_pool2d_s8, ctypes.byref(p), ctypes.byref(_dims(x)), ne.c_buffer(x),
                   ctypes.byref(_dims(want)), want=want)
        assert got == ne.c_bytes(want), f"max case {i}: {k} {kernel} {dil}"
        oh, ow = rng.randint(1, k["shape"][2] + 1), rng.randint(1, k["shape"][3] + 1)
        for name in ("avg", "max"):
            want = getattr(OPS, f"quantized_adaptive_{name}_pool2d")(x, [oh, ow], *k["act"])
            got = _run(getattr(lib, f"corten_adaptive_{name}_pool2d_s8"), *k["act"], ctypes.byref(_dims(x)),
                       ne.c_buffer(x), ctypes.byref(_dims(want)), want=want)
            assert got == ne.c_bytes(want), f"adaptive {name} case {i}"


# ----------------------------------------------------------------------------- models
class Fn(nn.Module):
    def __init__(self, fn, channels=4):
        super().__init__()
        self.conv, self.fn = nn.Conv2d(3, channels, 3, padding=1), fn

    def forward(self, x):
        return self.fn(self.conv(x))


class Same1d(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv1d(3, 6, 4, padding="same")
        self.pool = nn.MaxPool1d(3, 2, ceil_mode=True)
        self.avg = nn.AdaptiveAvgPool1d(4)

    def forward(self, x):
        return self.avg(self.pool(self.conv(x)))


IO = {"quantize_per_tensor": 1, "dequantize_per_tensor": 1}
CONV, AVG, MAX = "quantized_conv2d", "quantized_avg_pool2d", "quantized_max_pool2d"
MODELS = {
    "avg_ceil_exclude": (lambda: Fn(lambda y: F.avg_pool2d(y, 3, 2, 1, ceil_mode=True, count_include_pad=False)),
                         (1, 3, 8, 8), {**IO, CONV: 1, AVG: 1}),
    "avg_include_pad": (lambda: Fn(lambda y: F.avg_pool2d(y, 3, 1, 1)), (1, 3, 6, 6), {**IO, CONV: 1, AVG: 1}),
    "avg_divisor": (lambda: Fn(lambda y: F.avg_pool2d(y, 2, divisor_override=3)), (1, 3, 6, 6),
                    {**IO, CONV: 1, AVG: 1}),
    "avg_layer_ceil": (lambda: Fn(nn.AvgPool2d(3, 2, ceil_mode=True)), (1, 3, 9, 9), {**IO, CONV: 1, AVG: 1}),
    "max_ceil_dilation": (lambda: Fn(nn.MaxPool2d(3, 2, padding=1, dilation=2, ceil_mode=True)), (1, 3, 9, 9),
                          {**IO, CONV: 1, MAX: 1}),
    "adaptive_max": (lambda: Fn(nn.AdaptiveMaxPool2d((3, 5))), (1, 3, 7, 9),
                     {**IO, CONV: 1, "quantized_adaptive_max_pool2d": 1}),
    "adaptive_avg": (lambda: Fn(nn.AdaptiveAvgPool2d((3, 5))), (1, 3, 7, 9),
                     {**IO, CONV: 1, "quantized_adaptive_avg_pool2d": 1}),
    "conv2d_same_even": (lambda: nn.Sequential(nn.Conv2d(3, 4, (4, 2), padding="same"), nn.ReLU()), (1, 3, 6, 7),
                         {**IO, "quantized_pad": 1, CONV: 1}),
    "conv1d_same_even": (Same1d, (1, 3, 13), {**IO, "quantized_pad": 1, CONV: 1, MAX: 1,
                                              "quantized_adaptive_avg_pool2d": 1}),
}
_TESTERS: dict[str, Tester] = {}


def _tester(name: str) -> Tester:
    if name not in _TESTERS:
        factory, shape, _ = MODELS[name]
        torch.manual_seed(0)
        _TESTERS[name] = Tester(factory().eval(), (torch.randn(shape),))
    return _TESTERS[name]


@pytest.mark.parametrize("name", sorted(MODELS))
def test_pool_variant_dialect(name):
    """Pools are exact on the shared grid (an average rounds once): within 1 step of the
    fake-quantized model, cosine > 0.98 against float."""
    warnings.simplefilter("ignore")
    _, _, after = MODELS[name]
    report = _tester(name).test_dialect(ops_before={}, ops_after=after, qtol=1)
    assert report.cosine_vs_float > 0.98, report


@needs_gcc
@pytest.mark.parametrize("name", sorted(MODELS))
def test_pool_variant_implementation_host(name):
    warnings.simplefilter("ignore")
    _tester(name).test_implementation(on=("host",), n_inputs=2)


@needs_qemu
@pytest.mark.parametrize("name", ["avg_ceil_exclude", "max_ceil_dilation", "adaptive_max", "conv1d_same_even"])
def test_pool_variant_implementation_qemu(name):
    warnings.simplefilter("ignore")
    _tester(name).test_implementation(on=("qemu",), n_inputs=1, targets=["cortex-m55", "cortex-m4"])


def test_cmsis_emission_routes_variants(tmp_path):
    """CMSIS-NN pooling where its semantics agree (include_pad without padding overhang...), portable
    otherwise."""
    from corten.codegen import emit_c
    from corten.memory import plan_memory

    warnings.simplefilter("ignore")
    for name, calls in (("avg_ceil_exclude", "corten_avg_pool2d_s8"), ("avg_include_pad", "corten_avg_pool2d_s8"),
                        ("avg_divisor", "corten_avg_pool2d_s8"), ("max_ceil_dilation", "corten_max_pool2d_s8"),
                        ("conv2d_same_even", "arm_pad_s8")):
        prog = _tester(name).lower().program
        lib = emit_c(prog.ep, plan_memory(prog.ep, prog.target), tmp_path / name, name, prog.target,
                     kernels="cmsis-nn")
        assert calls in lib.source.read_text(), name


@pytest.mark.skipif(not CMSIS_NN_PATH, reason="set CMSIS_NN_PATH to a CMSIS-NN source tree")
@pytest.mark.parametrize("name", ["avg_layer_ceil", "conv2d_same_even", "adaptive_avg"])
def test_pool_variant_implementation_cmsis_nn(name):
    warnings.simplefilter("ignore")
    _tester(name).test_implementation(on=("host", "qemu"), kernels="cmsis-nn", n_inputs=1,
                                      targets=["cortex-m55", "cortex-m4"])
