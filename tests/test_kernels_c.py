"""Each portable C kernel (src/corten/codegen/kernels) against the Python reference op, byte for byte.

The kernels are compiled once into a shared library (gcc -O2, warnings as errors) and called
through ctypes on many seeded random cases.
"""
from __future__ import annotations

import ctypes
import random
import subprocess

import pytest
import torch
from conftest import needs_gcc

import corten.ops  # noqa: F401  (registers the ops)
from corten.codegen import KERNELS_DIR
from corten.fixed_point import quantize_multiplier, requantize_scalar

pytestmark = needs_gcc
OPS = torch.ops.corten


class Dims(ctypes.Structure):
    _fields_ = [("n", ctypes.c_int32), ("h", ctypes.c_int32), ("w", ctypes.c_int32), ("c", ctypes.c_int32)]


class Quant(ctypes.Structure):
    _fields_ = [("multiplier", ctypes.POINTER(ctypes.c_int32)), ("shift", ctypes.POINTER(ctypes.c_int32)),
                ("per_channel", ctypes.c_int32)]


def _int_struct(name, fields):
    return type(name, (ctypes.Structure,), {"_fields_": [(f, ctypes.c_int32) for f in fields]})


ConvParams = _int_struct("ConvParams", ["stride_h", "stride_w", "pad_h", "pad_w", "dilation_h", "dilation_w",
                                        "depth_multiplier", "input_offset", "output_offset", "activation_min",
                                        "activation_max"])
PoolParams = _int_struct("PoolParams", ["kernel_h", "kernel_w", "stride_h", "stride_w", "pad_h", "pad_w",
                                        "activation_min", "activation_max", "pad_bottom", "pad_right", "dilation_h",
                                        "dilation_w", "count_include_pad", "divisor_override", "zero_point"])
AddParams = _int_struct("AddParams", ["input1_offset", "input1_multiplier", "input1_shift", "input2_offset",
                                      "input2_multiplier", "input2_shift", "left_shift", "output_offset",
                                      "output_multiplier", "output_shift", "activation_min", "activation_max"])
LinearParams = _int_struct("LinearParams", ["output_offset", "activation_min", "activation_max"])


def _build(tmp_path_factory, *defines: str):
    out = tmp_path_factory.mktemp("kernels") / "libcorten_kernels.so"
    sources = sorted(str(p) for p in KERNELS_DIR.glob("*.c"))
    cmd = ["gcc", "-std=c99", "-O2", "-Wall", "-Wextra", "-Werror", "-shared", "-fPIC", *defines, "-I",
           str(KERNELS_DIR), *sources, "-o", str(out)]
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    return ctypes.CDLL(str(out))


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    return _build(tmp_path_factory)


@pytest.fixture(scope="module")
def plain_dot_lib(tmp_path_factory):
    """The kernels with the plain multiply-accumulate dot products Arm builds use by default
    (CORTEN_DOT_BLOCKS=0, see corten_internal.h): the same bytes as the blocked host form."""
    return _build(tmp_path_factory, "-DCORTEN_DOT_BLOCKS=0")


@pytest.fixture(params=["blocks", "plain"])
def dot_lib(request):
    return request.getfixturevalue("lib" if request.param == "blocks" else "plain_dot_lib")


# ----------------------------------------------------------------------------- helpers
def _buf(t: torch.Tensor, activation: bool = True):
    """ctypes buffer holding the C bytes of an int8/int32 tensor (4-D activations: NHWC)."""
    if t.dim() == 4 and activation:
        t = t.permute(0, 2, 3, 1)
    t = t.contiguous()
    ctype = {torch.int8: ctypes.c_int8, torch.int32: ctypes.c_int32}[t.dtype]
    arr = (ctype * t.numel())()
    ctypes.memmove(arr, t.numpy().tobytes(), t.numel() * t.element_size())
    return arr


def _nhwc_bytes(t: torch.Tensor) -> bytes:
    if t.dim() == 4:
        t = t.permute(0, 2, 3, 1)
    return t.contiguous().numpy().tobytes()


def _dims_nchw(t: torch.Tensor) -> Dims:
    n, c, h, w = t.shape
    return Dims(n, h, w, c)


def _rand_int8(g: torch.Generator, shape, lo=-128, hi=127) -> torch.Tensor:
    return torch.randint(lo, hi + 1, shape, generator=g, dtype=torch.int8)


def _multipliers(rng: random.Random, count: int):
    """Realistic plus extreme (multiplier, shift) pairs."""
    pairs = []
    for _ in range(count):
        kind = rng.random()
        if kind < 0.1:
            pairs.append((2**31 - 1, rng.randint(-31, 30)))  # up to shift 30: int32 wrap of the offset add
        elif kind < 0.15:
            pairs.append((1 << 30, rng.choice([-31, -1, 0, 30])))
        elif kind < 0.2:
            pairs.append((0, 0))
        else:
            pairs.append(quantize_multiplier(rng.uniform(1e-5, 0.05)))
    mult = torch.tensor([m for m, _ in pairs], dtype=torch.int32)
    shift = torch.tensor([s for _, s in pairs], dtype=torch.int32)
    return mult, shift


def _activation(rng: random.Random):
    if rng.random() < 0.5:
        return -128, 127
    lo = rng.randint(-128, 100)
    return lo, rng.randint(lo, 127)


def _quant(mult, shift, keep):
    keep.extend([_buf(mult), _buf(shift)])
    return Quant(ctypes.cast(keep[-2], ctypes.POINTER(ctypes.c_int32)),
                 ctypes.cast(keep[-1], ctypes.POINTER(ctypes.c_int32)), int(mult.numel() > 1))


# ----------------------------------------------------------------------------- fixed point
def test_requantize_scalar_matches_python(lib, tmp_path):
    """corten_requantize on edge values, through a tiny C driver (static inline functions)."""
    rng = random.Random(0)
    vals = [0, 1, -1, 2**31 - 1, -(2**31), 2**30, -(2**30), 12345, -12345] + \
        [rng.randint(-(2**31), 2**31 - 1) for _ in range(300)]
    cases = []
    for v in vals:
        m, s = (rng.choice([2**31 - 1, 1 << 30, 0]), rng.randint(-31, 30)) if rng.random() < 0.3 else \
            (rng.randint(1 << 30, 2**31 - 1), rng.randint(-31, 30))
        cases.append((v, m, s))
    driver = tmp_path / "rq.c"
    driver.write_text(
        '#include <stdio.h>\n#include <inttypes.h>\n#include "corten_fixed_point.h"\n'
        "int main(void) { long long v, m, s; while (scanf(\"%lld %lld %lld\", &v, &m, &s) == 3) "
        "printf(\"%\" PRId32 \"\\n\", corten_requantize((int32_t)v, (int32_t)m, (int32_t)s)); return 0; }\n")
    exe = tmp_path / "rq"
    subprocess.run(["gcc", "-std=c99", "-O2", "-Wall", "-Wextra", "-Werror", "-fsanitize=undefined",
                    "-fno-sanitize-recover", "-I", str(KERNELS_DIR), str(driver), "-o", str(exe)],
                   check=True, capture_output=True)
    stdin = "".join(f"{v} {m} {s}\n" for v, m, s in cases)
    got = subprocess.run([str(exe)], input=stdin, capture_output=True, text=True, check=True).stdout.split()
    want = [requantize_scalar(v, m, s) for v, m, s in cases]
    assert [int(x) for x in got] == want


# ----------------------------------------------------------------------------- conv2d
def _conv_case(rng, g, depthwise):
    n = rng.choice([1, 1, 2])
    c_in = rng.choice([1, 3, 4, 8, 17, 33])
    mult = rng.choice([1, 1, 2, 3]) if depthwise else 1
    c_out = c_in * mult if depthwise else rng.choice([1, 3, 4, 5, 16, 19])
    kh, kw = rng.choice([(1, 1), (3, 3), (2, 3), (5, 5), (1, 3)])
    stride = [rng.randint(1, 3), rng.randint(1, 3)]
    dilation = [rng.choice([1, 1, 2]), rng.choice([1, 1, 3])]
    padding = [rng.randint(0, kh), rng.randint(0, kw)]
    h_min = max(1, dilation[0] * (kh - 1) + 1 - 2 * padding[0])
    w_min = max(1, dilation[1] * (kw - 1) + 1 - 2 * padding[1])
    h, w = rng.randint(h_min, h_min + 9), rng.randint(w_min, w_min + 9)
    x = _rand_int8(g, (n, c_in, h, w)).contiguous(memory_format=torch.channels_last)
    weight = _rand_int8(g, (1, kh, kw, c_out) if depthwise else (c_out, kh, kw, c_in))
    bias = None if rng.random() < 0.2 else torch.randint(-(2**20), 2**20, (c_out,), generator=g, dtype=torch.int32)
    if bias is not None and rng.random() < 0.1:
        bias[0] = 2**31 - 1  # wraps in int32, as in CMSIS-NN
    m, s = _multipliers(rng, c_out if rng.random() < 0.7 else 1)
    act = _activation(rng)
    return dict(x=x, weight=weight, bias=bias, stride=stride, padding=padding, dilation=dilation, mult=mult,
                input_offset=rng.randint(-127, 128), output_offset=rng.randint(-128, 127), m=m, s=s, act=act)


@pytest.mark.parametrize("depthwise", [False, True], ids=["conv2d", "depthwise"])
def test_conv_matches_reference(dot_lib, depthwise):
    lib = dot_lib
    rng = random.Random(1 + depthwise)
    g = torch.Generator().manual_seed(1 + depthwise)
    for case_index in range(120):
        c = _conv_case(rng, g, depthwise)
        args = (c["x"], c["weight"], c["bias"], c["stride"], c["padding"], c["dilation"])
        tail = (c["input_offset"], c["output_offset"], c["m"], c["s"], *c["act"])
        if depthwise:
            want = OPS.quantized_depthwise_conv2d(*args, c["mult"], *tail)
        else:
            want = OPS.quantized_conv2d(*args, *tail)
        keep = []
        params = ConvParams(c["stride"][0], c["stride"][1], c["padding"][0], c["padding"][1], c["dilation"][0],
                            c["dilation"][1], c["mult"], c["input_offset"], c["output_offset"], *c["act"])
        out = (ctypes.c_int8 * want.numel())()
        wdims = Dims(*c["weight"].shape)
        bias = _buf(c["bias"]) if c["bias"] is not None else None
        fn = lib.corten_depthwise_conv2d_s8 if depthwise else lib.corten_conv2d_s8
        rc = fn(ctypes.byref(params), ctypes.byref(_quant(c["m"], c["s"], keep)), ctypes.byref(_dims_nchw(c["x"])),
                _buf(c["x"]), ctypes.byref(wdims), _buf(c["weight"], activation=False), bias, ctypes.byref(_dims_nchw(want)), out)
        assert rc == 0
        assert bytes(out) == _nhwc_bytes(want), f"case {case_index}: {c['weight'].shape} {c['stride']} {c['padding']}"


def test_conv_rejects_null_and_bad_shapes(lib):
    params = ConvParams(1, 1, 0, 0, 1, 1, 1, 0, 0, -128, 127)
    mult, shift = torch.tensor([1 << 30], dtype=torch.int32), torch.tensor([0], dtype=torch.int32)
    keep = []
    q = _quant(mult, shift, keep)
    d = Dims(1, 2, 2, 3)
    x = (ctypes.c_int8 * 12)()
    wd = Dims(3, 1, 1, 3)
    w = (ctypes.c_int8 * 9)()
    out = (ctypes.c_int8 * 12)()
    assert lib.corten_conv2d_s8(ctypes.byref(params), ctypes.byref(q), ctypes.byref(d), x, ctypes.byref(wd), w,
                                None, ctypes.byref(d), out) == 0
    assert lib.corten_conv2d_s8(ctypes.byref(params), ctypes.byref(q), ctypes.byref(d), None, ctypes.byref(wd), w,
                                None, ctypes.byref(d), out) == -1
    assert lib.corten_conv2d_s8(None, ctypes.byref(q), ctypes.byref(d), x, ctypes.byref(wd), w,
                                None, ctypes.byref(d), out) == -1
    bad = Dims(3, 1, 1, 4)  # C_in mismatch
    assert lib.corten_conv2d_s8(ctypes.byref(params), ctypes.byref(q), ctypes.byref(d), x, ctypes.byref(bad), w,
                                None, ctypes.byref(d), out) == -1
    assert lib.corten_depthwise_conv2d_s8(ctypes.byref(params), ctypes.byref(q), ctypes.byref(d), x,
                                          ctypes.byref(Dims(1, 1, 1, 3)), w, None, ctypes.byref(d), None) == -1
    assert lib.corten_add_s8(None, x, x, out, 12) == -1
    assert lib.corten_nhwc_to_nchw_s8(ctypes.byref(d), x, None) == -1


# ----------------------------------------------------------------------------- linear
def test_linear_matches_reference(dot_lib):
    lib = dot_lib
    from corten.ops.linear import kernel_sum

    rng = random.Random(3)
    g = torch.Generator().manual_seed(3)
    for _ in range(80):
        batches = rng.choice([1, 1, 3])
        in_f, out_f = rng.choice([1, 5, 16, 33, 100]), rng.choice([1, 2, 4, 7, 10, 64])
        x = _rand_int8(g, (batches, in_f))
        w = _rand_int8(g, (out_f, in_f))
        input_offset = rng.randint(-127, 128)
        bias = None if rng.random() < 0.3 else torch.randint(-(2**16), 2**16, (out_f,), generator=g, dtype=torch.int32)
        ks = kernel_sum(w, bias, input_offset)
        m, s = _multipliers(rng, out_f if rng.random() < 0.5 else 1)
        out_off, act = rng.randint(-128, 127), _activation(rng)
        want = OPS.quantized_linear(x, w, ks, input_offset, out_off, m, s, *act)
        keep = []
        out = (ctypes.c_int8 * want.numel())()
        rc = lib.corten_linear_s8(ctypes.byref(LinearParams(out_off, *act)), ctypes.byref(_quant(m, s, keep)),
                                  batches, in_f, out_f, _buf(x), _buf(w), _buf(ks), out)
        assert rc == 0
        assert bytes(out) == _nhwc_bytes(want)


# ----------------------------------------------------------------------------- add
@pytest.mark.parametrize("in_place", [None, 1, 2])
def test_add_matches_reference(lib, in_place):
    rng = random.Random(4 + (in_place or 0))
    g = torch.Generator().manual_seed(4)
    for _ in range(60):
        shape = (1, rng.choice([1, 3, 16]), rng.randint(1, 7), rng.randint(1, 7))
        a = _rand_int8(g, shape).contiguous(memory_format=torch.channels_last)
        b = _rand_int8(g, shape).contiguous(memory_format=torch.channels_last)
        s1, s2, so = rng.uniform(0.01, 1), rng.uniform(0.01, 1), rng.uniform(0.01, 1)
        twice_max = 2 * max(s1, s2)
        left = rng.choice([20, 20, 0, 22, 7])
        m1, sh1 = quantize_multiplier(s1 / twice_max)
        m2, sh2 = quantize_multiplier(s2 / twice_max)
        mo, sho = quantize_multiplier(twice_max / ((1 << left) * so))
        if rng.random() < 0.15:
            m1, sh1 = 2**31 - 1, rng.randint(0, 8)  # extreme: left shifts that wrap
        args = (rng.randint(-127, 128), m1, sh1, rng.randint(-127, 128), m2, sh2, left, rng.randint(-128, 127), mo,
                sho, *_activation(rng))
        want = OPS.quantized_add(a, b, *args)
        abuf, bbuf = _buf(a), _buf(b)
        out = {None: (ctypes.c_int8 * a.numel())(), 1: abuf, 2: bbuf}[in_place]
        assert lib.corten_add_s8(ctypes.byref(AddParams(*args)), abuf, bbuf, out, a.numel()) == 0
        assert bytes(out) == _nhwc_bytes(want)


# ----------------------------------------------------------------------------- pools
@pytest.mark.parametrize("kind", ["avg", "max"])
def test_pool_matches_reference(lib, kind):
    rng = random.Random(5 if kind == "avg" else 6)
    g = torch.Generator().manual_seed(5)
    for _ in range(80):
        kh, kw = rng.randint(1, 4), rng.randint(1, 4)
        h, w = rng.randint(kh, 10), rng.randint(kw, 10)
        if rng.random() < 0.15:
            kh, kw = h, w  # global pool
        stride = [rng.randint(1, 3), rng.randint(1, 3)]
        padding = [rng.randint(0, kh - 1), rng.randint(0, kw - 1)]
        x = _rand_int8(g, (rng.choice([1, 2]), rng.choice([1, 5, 16, 21]), h, w))
        x = x.contiguous(memory_format=torch.channels_last)
        act = _activation(rng)
        op = OPS.quantized_avg_pool2d if kind == "avg" else OPS.quantized_max_pool2d
        want = op(x, [kh, kw], stride, padding, *act)
        out = (ctypes.c_int8 * want.numel())()
        params = PoolParams(kh, kw, stride[0], stride[1], padding[0], padding[1], *act, padding[0], padding[1], 1, 1,
                            0, 0, 0)
        fn = lib.corten_avg_pool2d_s8 if kind == "avg" else lib.corten_max_pool2d_s8
        assert fn(ctypes.byref(params), ctypes.byref(_dims_nchw(x)), _buf(x), ctypes.byref(_dims_nchw(want)), out) == 0
        assert bytes(out) == _nhwc_bytes(want)


# ----------------------------------------------------------------------------- layout
def test_nhwc_to_nchw(lib):
    g = torch.Generator().manual_seed(7)
    for shape in [(1, 3, 4, 5), (2, 7, 2, 3), (1, 1, 3, 3), (1, 16, 1, 1)]:
        x = _rand_int8(g, shape).contiguous(memory_format=torch.channels_last)
        out = (ctypes.c_int8 * x.numel())()
        assert lib.corten_nhwc_to_nchw_s8(ctypes.byref(_dims_nchw(x)), _buf(x), out) == 0
        assert bytes(out) == x.contiguous().numpy().tobytes()
