"""16x8 softmax: ``quantized_softmax`` on int16 rows (TFLite's ``SoftmaxInt16``, CMSIS-NN's
``arm_softmax_s16``; output scale 1/32768, zero point 0).

* the exp and 1/(1+x) tables vs ``naive_s16.softmax_s16_tables`` and the reference vs
  ``naive_s16.softmax_s16`` on random rows (any length, any dim, strided rows);
* the portable ``corten_softmax_s16`` (softmax.c) byte for byte against the reference;
* CMSIS-NN (``CMSIS_NN_PATH``, read locally, nothing copied): its unit-test tables equal Corten's,
  its ``softmax_s16`` TFLite vectors are reproduced exactly, and its ``arm_softmax_s16`` built here
  equals the reference on rows of 2..8 elements - and wraps where TFLite saturates outside them
  (why the "cmsis-nn" flavour calls it only there).
"""
from __future__ import annotations

import ctypes
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
from corten.ops.softmax import S16_MAX_LEFT_SHIFT, softmax_s16_params, softmax_s16_tables

softmax = torch.ops.corten.quantized_softmax
EXP_LUT, ONE_LUT = softmax_s16_tables()


def _rand_case(rng: random.Random):
    scale = 10 ** rng.uniform(-5.5, -2.5)
    mult, shift = softmax_s16_params(scale)
    n = rng.choice([1, 2, 3, 5, 8, 9, 10, 17, 64, 300])
    spread = rng.choice([40, 2000, 32767])
    centre = rng.randint(-20000, 20000)
    row = [min(max(centre + rng.randint(-spread, spread), -32768), 32767) for _ in range(n)]
    return row, mult, shift


def test_tables_match_naive():
    want_exp, want_one = naive_s16.softmax_s16_tables()
    assert EXP_LUT.tolist() == want_exp and ONE_LUT.tolist() == want_one
    # TFLite narrows the slope to int16: these tables never need it (so the lookups agree with TFLite's)
    assert int((EXP_LUT[1:].int() - EXP_LUT[:-1].int()).abs().max()) < 32768
    assert int((ONE_LUT[1:].int() - ONE_LUT[:-1].int()).abs().max()) < 32768


def test_reference_matches_naive_on_random_rows():
    rng = random.Random(1610)
    for _ in range(400):
        row, mult, shift = _rand_case(rng)
        got = softmax(torch.tensor([row], dtype=torch.int16), mult, shift, 0, -1, EXP_LUT, ONE_LUT)
        assert got.dtype == torch.int16
        assert got[0].tolist() == naive_s16.softmax_s16(row, mult, shift, EXP_LUT.tolist(), ONE_LUT.tolist())


def test_reference_any_dim_and_close_to_float():
    rng = random.Random(1611)
    x = torch.randint(-6000, 6000, (2, 5, 3, 4), dtype=torch.int16).contiguous(memory_format=torch.channels_last)
    scale = 7e-4
    mult, shift = softmax_s16_params(scale)
    for dim in range(4):
        got = softmax(x, mult, shift, 0, dim, EXP_LUT, ONE_LUT)
        assert got.is_contiguous(memory_format=torch.channels_last)
        rows = got.movedim(dim, -1).reshape(-1, x.shape[dim])
        ins = x.movedim(dim, -1).reshape(-1, x.shape[dim])
        for r_in, r_out in zip(ins.tolist(), rows.tolist()):
            assert r_out == naive_s16.softmax_s16(r_in, mult, shift, EXP_LUT.tolist(), ONE_LUT.tolist())
        exact = torch.softmax(x.to(torch.float64) * scale, dim=dim)
        assert float((got.to(torch.float64) / 32768 - exact).abs().max()) < 3e-4
    del rng


def test_single_element_rows_saturate_to_one():
    """A row of one: exp 32762 * 1/(1+x) rounds to 32768, TFLite clamps it to 32767 (arm_softmax_s16 wraps)."""
    got = softmax(torch.tensor([[5], [-32768], [32767]], dtype=torch.int16), *softmax_s16_params(1e-3), 0, -1,
                  EXP_LUT, ONE_LUT)
    assert got.flatten().tolist() == [32767] * 3


def test_refusals():
    x = torch.zeros(2, 4, dtype=torch.int16)
    with pytest.raises(CortenOpError, match="input"):  # without the tables: the int8 op
        softmax(x, 1 << 30, 0, 0, -1)
    with pytest.raises(CortenOpError, match="one_by_one_lut"):
        softmax(x, 1 << 30, 0, 0, -1, EXP_LUT)
    with pytest.raises(CortenOpError, match="diff_min"):
        softmax(x, 1 << 30, 0, -5, -1, EXP_LUT, ONE_LUT)
    with pytest.raises(CortenOpError, match="input_left_shift"):
        softmax(x, 1 << 30, S16_MAX_LEFT_SHIFT + 1, 0, -1, EXP_LUT, ONE_LUT)
    with pytest.raises(CortenOpError, match="exp_lut"):
        softmax(torch.zeros(2, 4, dtype=torch.int8), 1 << 30, 1, -5, -1, EXP_LUT, ONE_LUT)
    with pytest.raises(ValueError, match="left shift"):
        softmax_s16_params(40.0)


# ----------------------------------------------------------------------------- C
def _so(out: Path, sources, includes) -> ctypes.CDLL:
    subprocess.run(["gcc", "-std=c99", "-O2", "-Wall", "-Wextra", "-Wpedantic", "-Werror", "-fsanitize=undefined",
                    "-fno-sanitize-recover", "-shared", "-fPIC", *(f"-I{p}" for p in includes), *map(str, sources),
                    "-o", str(out)], check=True, capture_output=True, text=True)
    return ctypes.CDLL(str(out))


@pytest.fixture(scope="module")
def portable(tmp_path_factory):
    lib = _so(tmp_path_factory.mktemp("softmax16") / "libsm16.so", [KERNELS_DIR / "softmax.c"], [KERNELS_DIR])
    lib.corten_softmax_s16.restype = ctypes.c_int
    lib.corten_softmax_s16.argtypes = [ctypes.c_void_p, ctypes.c_int32, ctypes.c_int32, ctypes.c_int32,
                                       ctypes.c_int32, ctypes.c_int32, ctypes.c_void_p, ctypes.c_void_p,
                                       ctypes.c_void_p]
    return lib


def _buf(t: torch.Tensor):
    data = t.contiguous().numpy().tobytes()
    return ctypes.create_string_buffer(data, len(data))


def _corner_row(mult: int, shift: int, n: int) -> list[int]:
    """A row of n >= 9 whose sum of exponentials is 2**18 - 1 (its top 18 bits set): n - 1 maxima and
    one element whose exponential makes up the rest."""
    d = torch.arange(-65535, 1, dtype=torch.int64)
    from corten.fixed_point import requantize

    e = _lut16.lookup((requantize(d, mult, shift) + 32767).clamp(-32768, 32767), EXP_LUT)
    e_max = int(e[-1])
    need = (1 << 18) - 1 - (n - 1) * e_max
    hit = (e == need).nonzero()
    assert need > 0 and hit.numel(), (need, n)
    return [20000] * (n - 1) + [20000 + int(d[hit[0, 0]])]


@needs_gcc
def test_portable_matches_reference(portable):
    rng = random.Random(1612)
    for i in range(300):
        row_size = rng.choice([1, 2, 7, 9, 10, 33, 256])
        outer, inner = rng.randint(1, 3), rng.choice([1, 1, 3])
        x = torch.randint(-32768, 32768, (outer, row_size, inner), dtype=torch.int16)
        if rng.random() < 0.5:
            x = (x // rng.choice([8, 512])).to(torch.int16)
        mult, shift = softmax_s16_params(10 ** rng.uniform(-5.5, -2.5))
        want = softmax(x, mult, shift, 0, 1, EXP_LUT, ONE_LUT)
        out = ctypes.create_string_buffer(2 * x.numel())
        assert portable.corten_softmax_s16(_buf(x), outer, row_size, inner, mult, shift, _buf(EXP_LUT),
                                           _buf(ONE_LUT), out) == 0
        assert out.raw == want.contiguous().numpy().tobytes(), i
    mult, shift = softmax_s16_params(3e-4)
    row = torch.tensor([_corner_row(mult, shift, 9)], dtype=torch.int16)
    out = ctypes.create_string_buffer(18)
    assert portable.corten_softmax_s16(_buf(row), 1, 9, 1, mult, shift, _buf(EXP_LUT), _buf(ONE_LUT), out) == 0
    assert out.raw == softmax(row, mult, shift, 0, -1, EXP_LUT, ONE_LUT).numpy().tobytes()
    assert portable.corten_softmax_s16(_buf(row), 1, 9, 1, mult, 16, _buf(EXP_LUT), _buf(ONE_LUT), out) == -1
    assert portable.corten_softmax_s16(_buf(row), 1, 9, 1, mult, shift, None, _buf(ONE_LUT), out) == -1


# ----------------------------------------------------------------------------- CMSIS-NN (local oracle)
def _c_arrays(path: Path) -> dict[str, list[int]]:
    return {m.group(1): [int(v) for v in re.findall(r"-?\d+", m.group(2))]
            for m in re.finditer(r"const\s+\w+\s+(\w+)\[\d+\]\s*=\s*\{([^}]*)\}", path.read_text())}


@needs_cmsis_nn
def test_tables_equal_cmsis_nn_test_tables():
    common = Path(CMSIS_NN_PATH) / "Tests/UnitTest/TestCases/Common/Softmax"
    assert _c_arrays(common / "exp_lut_data.h")["softmax_s16_exp_lut"] == EXP_LUT.tolist()
    assert _c_arrays(common / "one_by_one_lut_data.h")["softmax_s16_one_by_one_lut"] == ONE_LUT.tolist()


@needs_cmsis_nn
def test_reference_reproduces_cmsis_nn_softmax_s16_vectors():
    d = Path(CMSIS_NN_PATH) / "Tests/UnitTest/TestCases/TestData/softmax_s16"
    cfg = {k: int(v) for k, v in re.findall(r"#define\s+SOFTMAX_S16_(\w+)\s+(-?\d+)", (d / "config_data.h").read_text())}
    arrays = {**_c_arrays(d / "input_data.h"), **_c_arrays(d / "output_ref_data.h")}
    x = torch.tensor(arrays["softmax_s16_input"], dtype=torch.int16).reshape(cfg["NUM_ROWS"], cfg["ROW_SIZE"])
    got = softmax(x, cfg["INPUT_MULT"], cfg["INPUT_LEFT_SHIFT"], 0, -1, EXP_LUT, ONE_LUT)
    assert got.flatten().tolist() == arrays["softmax_s16_output_ref"]
    # the vectors' multiplier is TFLite's for the input scale it stands for
    scale = cfg["INPUT_MULT"] / 2**31 * 2.0 ** cfg["INPUT_LEFT_SHIFT"] * 10 / 65535
    assert softmax_s16_params(scale) == (cfg["INPUT_MULT"], cfg["INPUT_LEFT_SHIFT"])


@needs_cmsis_nn
def test_arm_softmax_s16_equals_reference_on_rows_of_2_to_8_and_wraps_outside(tmp_path):
    root = Path(CMSIS_NN_PATH)
    so = tmp_path / "libarmsm16.so"
    subprocess.run(["gcc", "-std=c99", "-O2", "-shared", "-fPIC", f"-I{root / 'Include'}",
                    str(root / "Source/SoftmaxFunctions/arm_softmax_s16.c"), "-o", str(so)],
                   check=True, capture_output=True, text=True)
    lib = ctypes.CDLL(str(so))

    class Lut(ctypes.Structure):
        _fields_ = [("exp_lut", ctypes.c_void_p), ("one_by_one_lut", ctypes.c_void_p)]

    exp_buf, one_buf = _buf(EXP_LUT), _buf(ONE_LUT)
    lut = Lut(ctypes.cast(exp_buf, ctypes.c_void_p), ctypes.cast(one_buf, ctypes.c_void_p))

    def arm(x: torch.Tensor, mult: int, shift: int) -> bytes:
        out = ctypes.create_string_buffer(2 * x.numel())
        assert lib.arm_softmax_s16(_buf(x), x.shape[0], x.shape[1], mult, shift, ctypes.byref(lut), out) == 0
        return out.raw

    rng = random.Random(1613)
    for _ in range(2000):
        row_size = rng.randint(2, 8)
        x = torch.randint(-32768, 32768, (rng.randint(1, 4), row_size), dtype=torch.int16)
        x = (x // rng.choice([1, 16, 1024])).to(torch.int16)
        mult, shift = softmax_s16_params(10 ** rng.uniform(-5.5, -2.5))
        assert arm(x, mult, shift) == softmax(x, mult, shift, 0, -1, EXP_LUT, ONE_LUT).numpy().tobytes()
    mult, shift = softmax_s16_params(3e-4)
    one = torch.tensor([[123]], dtype=torch.int16)
    assert arm(one, mult, shift) != softmax(one, mult, shift, 0, -1, EXP_LUT, ONE_LUT).numpy().tobytes()
    corner = torch.tensor([_corner_row(mult, shift, 9)], dtype=torch.int16)
    ref = softmax(corner, mult, shift, 0, -1, EXP_LUT, ONE_LUT)
    got = torch.frombuffer(bytearray(arm(corner, mult, shift)), dtype=torch.int16)
    assert got[0] > ref[0, 0] + 3000  # 1/(1+x) read at -32768 (1.0) instead of 32767 (0.5): about twice


def test_opcheck_int16_softmax():
    x = torch.randint(-32768, 32768, (2, 3, 4, 5), dtype=torch.int16).contiguous(memory_format=torch.channels_last)
    mult, shift = softmax_s16_params(1e-3)
    torch.library.opcheck(torch.ops.corten.quantized_softmax.default, (x, mult, shift, 0, 1, EXP_LUT, ONE_LUT))
