"""16x8 nonlinearities: ``quantized_lut`` on int16 activations (TFLite's 513-entry interpolated
table, ``corten.ops._lut16``).

* tables vs ``naive_s16.lut_populate_s16`` (TFLite's ``LUTPopulateInt16<float>`` written out with
  numpy float32 scalars) and the reference lookup vs ``naive_s16.lut_lookup_s16``, exhaustively over
  all 65536 int16 inputs, for several functions and scales;
* ``corten_lut_s16`` (lut.c) byte for byte against the reference, all 65536 inputs, smooth and
  arbitrary (steep) tables, in place;
* CMSIS-NN (``CMSIS_NN_PATH``, read locally, nothing copied): the softmax tables of its unit tests
  and ``sigmoid_table_uint16`` of ``arm_nn_activation_s16`` equal what Corten / the formula compute;
  the accuracy of the two int16 sigmoid/tanh schemes at a power-of-two scale (family docstring).
"""
from __future__ import annotations

import ctypes
import math
import random
import re
import subprocess
from pathlib import Path

import pytest
import torch

import naive_s16
from conftest import CMSIS_NN_PATH, needs_cmsis_nn, needs_gcc
from corten.codegen import KERNELS_DIR
from corten.errors import CortenOpError
from corten.ops import _lut16
from corten.ops.lut import (SIGMOID, TANH, activation_s16_params, build_table16, cmsis_left_shift,
                             sigmoid_table)

lut = torch.ops.corten.quantized_lut
ALL = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16)


def _gelu(x):
    return 0.5 * x * (1.0 + math.erf(x / math.sqrt(2.0)))


def _elu(x):
    return x if x > 0 else math.expm1(x)


def _sigmoid(x):
    return 1.0 / (1.0 + math.exp(-x)) if x >= 0 else math.exp(x) / (1.0 + math.exp(x))


# (name, torch function, naive float function, output scale for an input scale)
FUNCTIONS = [
    ("sigmoid", torch.sigmoid, _sigmoid, lambda s: 1 / 32768),
    ("tanh", torch.tanh, math.tanh, lambda s: 1 / 32768),
    ("silu", torch.nn.functional.silu, lambda x: x * _sigmoid(x), lambda s: s),
    ("gelu", torch.nn.functional.gelu, _gelu, lambda s: s),
    ("elu", torch.nn.functional.elu, _elu, lambda s: s * 1.25),
]
SCALES = [2.0**-12, 3.7e-4, 1.9e-3]


@pytest.mark.parametrize("name,fn,naive_fn,out_scale", FUNCTIONS, ids=[f[0] for f in FUNCTIONS])
@pytest.mark.parametrize("s_in", SCALES)
def test_int16_table_and_lookup_match_naive_exhaustively(name, fn, naive_fn, out_scale, s_in):
    s_out = out_scale(s_in)
    table = build_table16(fn, s_in, s_out)
    want_table = naive_s16.lut_populate_s16(naive_fn, s_in, 0, s_out, 0)
    assert table.dtype == torch.int16 and table.tolist() == want_table
    got = lut(ALL, table)
    assert got.dtype == torch.int16
    assert got.tolist() == [naive_s16.lut_lookup_s16(q, want_table) for q in range(-32768, 32768)]
    # and it is the function: within two output steps of f(s_in * q), plus the drift of TFLite's grid
    # (entry i sits at input -32768 + i * 65535 / 512, the lookup reads it at -32768 + 128 i: up to one
    # input step apart, |f'| <= 1.13 here) and the interpolation error h**2 / 8 * max|f''| (<= 1 here)
    # of segments h = 128 input steps wide
    exact = torch.tensor([naive_fn(s_in * q) for q in range(-32768, 32768, 7)], dtype=torch.float64)
    err = (got[::7].to(torch.float64) * s_out - exact).abs().max() / s_out
    assert err < 2.0 + (1.13 * s_in + (128 * s_in) ** 2 / 8) / s_out, (name, s_in, float(err))


def test_int16_lookup_of_arbitrary_tables_matches_naive():
    """Steep tables too (adjacent entries 65535 apart: TFLite's int16 slope would wrap; Corten's is exact)."""
    rng = random.Random(1600)
    for _ in range(3):
        table = [rng.randint(-32768, 32767) for _ in range(513)]
        got = lut(ALL, torch.tensor(table, dtype=torch.int16)).tolist()
        assert got == [naive_s16.lut_lookup_s16(q, table) for q in range(-32768, 32768)]
        assert all(min(table[256 + (q >> 7)], table[257 + (q >> 7)]) <= v <= max(table[256 + (q >> 7)],
                   table[257 + (q >> 7)]) for q, v in zip(range(-32768, 32768, 97), got[::97]))


def test_int16_table_edge_cases():
    # infinite values (exp far beyond the float32 range): saturated entries, no NaN
    t = build_table16(torch.exp, 0.05, 1e-3)
    assert t[-1] == 32767 and t[0] == 0
    assert t.tolist() == naive_s16.lut_populate_s16(lambda x: math.exp(x) if x < 700 else math.inf, 0.05, 0, 1e-3, 0)
    with pytest.raises(ValueError, match="NaN"):
        build_table16(lambda x: torch.full_like(x, float("nan")), 1e-3, 1e-3)
    with pytest.raises(ValueError, match="scale"):
        build_table16(torch.tanh, 0.0, 1e-3)
    with pytest.raises(CortenOpError, match="table"):
        lut(ALL[:5], torch.zeros(256, dtype=torch.int16))
    with pytest.raises(CortenOpError, match="input"):  # an int8 table reads int8 inputs
        lut(ALL[:5], torch.zeros(513, dtype=torch.int8))


def test_int16_lookup_keeps_channels_last():
    x = ALL[:2 * 3 * 4 * 5].reshape(2, 3, 4, 5).contiguous(memory_format=torch.channels_last)
    y = lut(x, build_table16(torch.tanh, 1e-3, 1 / 32768))
    assert y.is_contiguous(memory_format=torch.channels_last) and y.shape == x.shape


# ----------------------------------------------------------------------------- C kernel
@pytest.fixture(scope="module")
def clib(tmp_path_factory):
    out = tmp_path_factory.mktemp("lut16") / "liblut16.so"
    subprocess.run(["gcc", "-std=c99", "-O2", "-Wall", "-Wextra", "-Wpedantic", "-Werror", "-fsanitize=undefined",
                    "-fno-sanitize-recover", "-shared", "-fPIC", "-I", str(KERNELS_DIR), str(KERNELS_DIR / "lut.c"),
                    "-o", str(out)], check=True, capture_output=True, text=True)
    so = ctypes.CDLL(str(out))
    so.corten_lut_s16.restype = ctypes.c_int
    so.corten_lut_s16.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int32]
    so.corten_activation_s16.restype = ctypes.c_int
    so.corten_activation_s16.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int32, ctypes.c_int32,
                                         ctypes.c_int32, ctypes.c_void_p, ctypes.c_int32]
    return so


def _run_c(so, x: torch.Tensor, table: torch.Tensor, in_place: bool = False) -> bytes:
    data = x.contiguous().numpy().tobytes()
    inp = ctypes.create_string_buffer(data, len(data))
    tab = ctypes.create_string_buffer(table.numpy().tobytes(), 2 * 513)
    out = inp if in_place else ctypes.create_string_buffer(len(data))
    assert so.corten_lut_s16(inp, tab, out, x.numel()) == 0
    return out.raw[:len(data)]


@needs_gcc
def test_c_kernel_matches_reference_on_all_inputs(clib):
    rng = random.Random(1601)
    tables = [build_table16(fn, s, out(s)) for _, fn, _, out in FUNCTIONS for s in SCALES[:2]]
    tables += [torch.tensor([rng.randint(-32768, 32767) for _ in range(513)], dtype=torch.int16) for _ in range(3)]
    tables += [torch.tensor([32767 if i % 2 else -32768 for i in range(513)], dtype=torch.int16)]
    for i, table in enumerate(tables):
        assert _run_c(clib, ALL, table, in_place=i % 2 == 1) == lut(ALL, table).numpy().tobytes(), i


@needs_gcc
def test_c_kernel_rejects_bad_arguments(clib):
    buf = ctypes.create_string_buffer(2 * 513)
    assert clib.corten_lut_s16(None, buf, buf, 4) == -1
    assert clib.corten_lut_s16(buf, None, buf, 4) == -1
    assert clib.corten_lut_s16(buf, buf, None, 4) == -1
    assert clib.corten_lut_s16(buf, buf, buf, -1) == -1
    assert clib.corten_lut_s16(buf, buf, buf, 0) == 0


# ----------------------------------------------------------------------------- CMSIS-NN (local oracle)
def _c_table(path: Path, name: str) -> list[int]:
    m = re.search(re.escape(name) + r"\[\d+\]\s*=\s*\{([^}]*)\}", path.read_text())
    assert m, (path, name)
    return [int(v) for v in re.findall(r"-?\d+", m.group(1))]


@needs_cmsis_nn
def test_cmsis_nn_sigmoid_table_is_the_formula():
    table = _c_table(Path(CMSIS_NN_PATH) / "Source/NNSupportFunctions/arm_nntables.c", "sigmoid_table_uint16")
    assert table == naive_s16.cmsis_sigmoid_table() == [v & 0xFFFF for v in sigmoid_table().tolist()]


# ----------------------------------------------------------------------------- int16 sigmoid / tanh
act16 = torch.ops.corten.quantized_activation_s16
ACT_SCALES = [2.0**-12, 2.0**-13, 2.0**-9, 3.7e-4, 1.9e-3, 7.3e-6]


@pytest.mark.parametrize("s_in", ACT_SCALES)
@pytest.mark.parametrize("function", [SIGMOID, TANH], ids=["sigmoid", "tanh"])
def test_activation_s16_matches_naive_exhaustively(function, s_in):
    mult, shift = activation_s16_params(s_in)
    assert (mult, shift) == naive_s16.activation_s16_params(s_in)
    table = sigmoid_table()
    got = act16(ALL, table, mult, shift, function)
    assert got.dtype == torch.int16
    t = [v & 0xFFFF for v in table.tolist()]
    want = [naive_s16.activation_s16(q, mult, shift, function == TANH, t) for q in range(-32768, 32768)]
    assert got.tolist() == want
    fn = math.tanh if function == TANH else _sigmoid
    exact = torch.tensor([fn(s_in * q) * 32768 for q in range(-32768, 32768)], dtype=torch.float64)
    assert float((got.to(torch.float64) - exact).abs().max()) < 4.0


def test_activation_s16_power_of_two_scales_map_to_cmsis_left_shifts():
    for left_shift in range(-6, 4):
        mult, shift = activation_s16_params(2.0 ** (left_shift - 12))
        assert cmsis_left_shift(mult, shift) == left_shift
        cmsis_mult, cmsis_shift = (3 << left_shift, 0) if left_shift >= 0 else (3, -left_shift)
        table = sigmoid_table()
        for f in (SIGMOID, TANH):
            assert torch.equal(act16(ALL, table, mult, shift, f), act16(ALL, table, cmsis_mult, cmsis_shift, f))
    assert cmsis_left_shift(*activation_s16_params(3.7e-4)) is None


def test_activation_s16_refusals():
    with pytest.raises(CortenOpError, match="input_multiplier"):
        act16(ALL[:4], sigmoid_table(), 70000, 3, SIGMOID)
    with pytest.raises(CortenOpError, match="function"):
        act16(ALL[:4], sigmoid_table(), 3, 0, 2)
    with pytest.raises(ValueError, match="scale"):
        activation_s16_params(10.0)


@needs_gcc
def test_c_activation_s16_matches_reference(clib):
    table = sigmoid_table()
    for i, s_in in enumerate(ACT_SCALES + [5.0]):
        for f in (SIGMOID, TANH):
            mult, shift = activation_s16_params(s_in)
            data = ALL.numpy().tobytes()
            inp = ctypes.create_string_buffer(data, len(data))
            out = inp if i % 2 else ctypes.create_string_buffer(len(data))
            tab = ctypes.create_string_buffer(table.numpy().tobytes(), 512)
            assert clib.corten_activation_s16(inp, tab, mult, shift, f, out, 65536) == 0
            assert out.raw[:len(data)] == act16(ALL, table, mult, shift, f).numpy().tobytes(), (s_in, f)
    buf = ctypes.create_string_buffer(1024)
    assert clib.corten_activation_s16(buf, buf, 0, 0, 0, buf, 4) == -1
    assert clib.corten_activation_s16(buf, buf, 3, 32, 0, buf, 4) == -1
    assert clib.corten_activation_s16(buf, None, 3, 0, 0, buf, 4) == -1


@needs_cmsis_nn
def test_arm_nn_activation_s16_matches_reference(tmp_path):
    """CMSIS-NN's own kernel and table, built here from CMSIS_NN_PATH, on all 65536 inputs."""
    root = Path(CMSIS_NN_PATH)
    so = tmp_path / "libact.so"
    subprocess.run(["gcc", "-std=c99", "-O2", "-shared", "-fPIC", "-I", str(root / "Include"),
                    str(root / "Source/ActivationFunctions/arm_nn_activation_s16.c"),
                    str(root / "Source/NNSupportFunctions/arm_nntables.c"), "-o", str(so)],
                   check=True, capture_output=True, text=True)
    lib = ctypes.CDLL(str(so))
    lib.arm_nn_activation_s16.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int32, ctypes.c_int32,
                                          ctypes.c_int]
    table = sigmoid_table()
    for left_shift in range(-6, 4):
        mult, shift = activation_s16_params(2.0 ** (left_shift - 12))
        for f in (SIGMOID, TANH):
            data = ALL.numpy().tobytes()
            inp, out = ctypes.create_string_buffer(data, len(data)), ctypes.create_string_buffer(len(data))
            lib.arm_nn_activation_s16(inp, out, 65536, left_shift, f)
            assert out.raw[:len(data)] == act16(ALL, table, mult, shift, f).numpy().tobytes(), (left_shift, f)


def test_int16_table_vs_activation_s16_accuracy():
    """The two int16 sigmoid/tanh schemes, largest error in output steps of 1/32768 over all 65536
    inputs: the 513-entry table spans the whole input range (its segments widen with the scale),
    TFLite's Logistic/Tanh table spans sigmoid's useful range [0, 10.6] at any scale."""
    for s_in in (2.0**-12, 1.9e-3):
        for name, fn, naive_fn, f in (("sigmoid", torch.sigmoid, _sigmoid, SIGMOID), ("tanh", torch.tanh, math.tanh, TANH)):
            exact = torch.tensor([naive_fn(s_in * q) * 32768 for q in range(-32768, 32768)], dtype=torch.float64)
            table = lut(ALL, build_table16(fn, s_in, 1 / 32768)).to(torch.float64)
            act = act16(ALL, sigmoid_table(), *activation_s16_params(s_in), f).to(torch.float64)
            e_table, e_act = float((table - exact).abs().max()), float((act - exact).abs().max())
            print(f"{name} at input scale {s_in:.3g}: 513-entry table {e_table:.2f} steps, Logistic/Tanh {e_act:.2f}")
            assert e_act < 4.0 and e_act < e_table


def test_opcheck_int16_ops():
    x = ALL[::97][:24].reshape(1, 2, 3, 4).contiguous(memory_format=torch.channels_last)
    torch.library.opcheck(torch.ops.corten.quantized_lut.default, (x, build_table16(torch.tanh, 1e-3, 1 / 32768)))
    torch.library.opcheck(torch.ops.corten.quantized_activation_s16.default,
                          (x, sigmoid_table(), *activation_s16_params(1e-3), TANH))
