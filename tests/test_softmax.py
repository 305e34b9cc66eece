"""``corten.quantized_softmax`` reference kernel vs ``naive_softmax.py`` (``arm_softmax_s8``), the
TFLite preparation of its parameters, opcheck and argument errors.

Default run: SOFTMAX_TFLITE_CASES cases with TFLite-derived parameters (random input scale and beta)
and SOFTMAX_RAW_CASES with arbitrary valid (multiplier, shift, diff_min), each a batch of 1-6 rows of
one random size (mostly 1..64, 3% from 65 to 1000) drawn from several row shapes: uniform, all
equal, two values, extremes only, a cluster near the maximum.
"""
from __future__ import annotations

import math
import random

import pytest
import torch

import naive_softmax as naive
from corten.ops import CortenOpError
from corten.ops.softmax import (
    MAX_ROW_SIZE,
    SoftmaxParams,
    calculate_input_radius,
    quantize_multiplier_greater_than_one,
    softmax_params,
)

SOFTMAX_TFLITE_CASES = 1200
SOFTMAX_RAW_CASES = 600

softmax = torch.ops.corten.quantized_softmax


# ----------------------------------------------------------------------------- case generators
def random_row(rng: random.Random, n: int) -> list[int]:
    kind = rng.choice(("uniform", "uniform", "equal", "two", "extremes", "cluster", "narrow"))
    if kind == "uniform":
        return [rng.randint(-128, 127) for _ in range(n)]
    if kind == "equal":
        return [rng.randint(-128, 127)] * n
    if kind == "two":
        a, b = rng.randint(-128, 127), rng.randint(-128, 127)
        return [rng.choice((a, b)) for _ in range(n)]
    if kind == "extremes":
        return [rng.choice((-128, 127)) for _ in range(n)]
    if kind == "cluster":  # many values at or just below the maximum
        top = rng.randint(-120, 127)
        return [top - rng.randint(0, 3) if rng.random() < 0.8 else rng.randint(-128, top) for _ in range(n)]
    lo = rng.randint(-128, 120)
    return [rng.randint(lo, lo + 7) for _ in range(n)]


def random_row_size(rng: random.Random) -> int:
    r = rng.random()
    if r < 0.9:
        return rng.randint(1, 64)
    if r < 0.97:
        return rng.choice((1, 2, 3, 4, 5, 15, 16, 17, 255, 256, 257))
    return rng.choice((511, 512, 513, rng.randint(65, 1000)))


def random_scale_beta(rng: random.Random) -> tuple[float, float]:
    """A float32 input scale and a beta with beta * scale * 2**26 > 1 (some at the 2**31 - 1 cap)."""
    while True:
        r = rng.random()
        if r < 0.85:
            scale = 2.0 ** rng.uniform(-10, 1)
        elif r < 0.93:
            scale = 2.0 ** rng.uniform(1, 8)  # beta * scale * 2**26 capped at 2**31 - 1: left shift 31
        else:
            scale = 2.0 ** rng.uniform(-25.9, -20)  # tiny: diff_min far below -255
        scale = float(torch.tensor(scale, dtype=torch.float32))
        beta = rng.choice((1.0, 1.0, 0.5, 2.0, rng.uniform(0.05, 20.0)))
        if beta * scale * 2**26 > 1.0:
            return scale, beta


def raw_params(rng: random.Random) -> tuple[int, int, int]:
    """Arbitrary valid (multiplier, left shift, diff_min), not necessarily TFLite-derived."""
    mult = rng.choice((2**30, 2**31 - 1, rng.randint(2**30, 2**31 - 1), rng.randint(2**30, 2**31 - 1)))
    shift = rng.choice((0, 1, 30, 31, rng.randint(0, 31), rng.randint(0, 31)))
    lowest = -(2**31 >> shift)
    diff_min = rng.choice((0, -1, lowest, max(lowest, -255), rng.randint(max(lowest, -300), 0)))
    return mult, shift, diff_min


def check_rows(rows: list[list[int]], mult: int, shift: int, diff_min: int) -> None:
    x = torch.tensor(rows, dtype=torch.int8)
    got = softmax(x, mult, shift, diff_min)
    assert got.dtype == torch.int8 and got.shape == x.shape
    want = [naive.softmax_row(r, mult, shift, diff_min) for r in rows]
    assert got.tolist() == want, (mult, shift, diff_min, rows)


# ----------------------------------------------------------------------------- property tests
def test_params_match_tflite_preparation():
    rng = random.Random(11)
    for _ in range(3000):
        scale, beta = random_scale_beta(rng)
        p = softmax_params(scale, beta)
        assert (p.input_multiplier, p.input_left_shift, p.diff_min) == naive.tflite_softmax_params(beta, scale)
        assert 2**30 <= p.input_multiplier < 2**31 and 0 <= p.input_left_shift <= 31
        assert p.diff_min * 2**p.input_left_shift >= -(2**31)


def test_params_known_values():
    # beta * scale * 2**26 = 2**25 * 1.5: multiplier 1.5 * 2**30, shift 26; radius floor(31 * 2**26 / 2**26)
    assert softmax_params(0.75) == SoftmaxParams(3 * 2**29, 26, -31)
    # capped at 2**31 - 1: shift 31, radius floor(31 / 32) = 0 (only the maximum counts)
    p = softmax_params(64.0)
    assert (p.input_multiplier, p.input_left_shift, p.diff_min) == (2**31 - 1, 31, 0)
    assert calculate_input_radius(5, 1) == 31 * 2**25
    assert quantize_multiplier_greater_than_one(2.0) == (2**30, 2)


@pytest.mark.parametrize("seed", range(3))
def test_reference_matches_naive_tflite_params(seed):
    rng = random.Random(100 + seed)
    for _ in range(SOFTMAX_TFLITE_CASES // 3):
        n = random_row_size(rng)
        scale, beta = random_scale_beta(rng)
        p = softmax_params(scale, beta)
        rows = [random_row(rng, n) for _ in range(rng.randint(1, 6 if n <= 64 else 2))]
        check_rows(rows, p.input_multiplier, p.input_left_shift, p.diff_min)


def test_reference_matches_naive_raw_params():
    rng = random.Random(7)
    for _ in range(SOFTMAX_RAW_CASES):
        n = random_row_size(rng) if rng.random() < 0.5 else rng.randint(1, 8)
        rows = [random_row(rng, n) for _ in range(rng.randint(1, 4 if n <= 64 else 1))]
        check_rows(rows, *raw_params(rng))


def test_row_sizes_1_to_1000():
    """Every row size up to 100, then every 23rd up to 1000, with the largest ranges (-128..127) and
    a tied maximum in every row."""
    rng = random.Random(3)
    p = softmax_params(0.0625)
    for n in [*range(1, 101), *range(101, 1001, 23), 1000]:
        row = [rng.choice((-128, 127, rng.randint(-128, 127))) for _ in range(n)]
        row[rng.randrange(n)] = 127
        check_rows([row], p.input_multiplier, p.input_left_shift, p.diff_min)


def test_equal_rows_are_uniform():
    """All-equal rows: every output is round(256 / n) - 128 up to one step, and n >= 512 gives the
    defined -128 (CMSIS-NN's shift by >= 32 there is undefined behaviour in C)."""
    p = softmax_params(0.1)
    for n in (1, 2, 3, 7, 100, 255, 256, 257, 511, 512, 600, 1000, MAX_ROW_SIZE):
        out = softmax(torch.full((2, n), 5, dtype=torch.int8), p.input_multiplier, p.input_left_shift, p.diff_min)
        assert len(set(out.flatten().tolist())) == 1
        got = int(out[0, 0])
        if n >= 512:
            assert got == -128
        else:
            assert abs(got - (min(255, round(256 / n)) - 128)) <= 1, n
        if n < 600:
            assert out[0].tolist() == naive.softmax_row([5] * n, p.input_multiplier, p.input_left_shift, p.diff_min)


def test_close_to_float_softmax():
    rng = random.Random(5)
    for _ in range(200):
        scale, beta = random_scale_beta(rng)
        n = rng.randint(1, 100)
        x = torch.tensor([[rng.randint(-128, 127) for _ in range(n)]], dtype=torch.int8)
        p = softmax_params(scale, beta)
        got = (softmax(x, p.input_multiplier, p.input_left_shift, p.diff_min).double() + 128) / 256
        want = torch.softmax(x.double() * scale * beta, dim=-1)
        assert float((got - want).abs().max()) <= 2.5 / 256


def test_multi_dim_input_runs_over_last_dim():
    rng = random.Random(9)
    p = softmax_params(0.05)
    x = torch.tensor([random_row(rng, 10) for _ in range(12)], dtype=torch.int8).reshape(2, 3, 2, 10)
    got = softmax(x, p.input_multiplier, p.input_left_shift, p.diff_min)
    flat = softmax(x.reshape(12, 10), p.input_multiplier, p.input_left_shift, p.diff_min)
    assert torch.equal(got.reshape(12, 10), flat)
    assert softmax(torch.empty((0, 4), dtype=torch.int8), 2**30, 1, -1).shape == (0, 4)


# ----------------------------------------------------------------------------- opcheck and errors
@pytest.mark.parametrize("seed", range(4))
def test_opcheck_softmax(seed):
    rng = random.Random(seed)
    n = rng.randint(1, 40)
    x = torch.tensor([random_row(rng, n) for _ in range(rng.randint(1, 3))], dtype=torch.int8)
    if seed % 2:
        x = x.reshape(1, *x.shape)
    torch.library.opcheck(softmax.default, (x, *raw_params(rng)))


def _good() -> dict:
    return dict(input=torch.zeros((2, 5), dtype=torch.int8), input_multiplier=2**30, input_left_shift=20,
                diff_min=-100)


@pytest.mark.parametrize("arg,value", [
    ("input", torch.zeros((2, 5), dtype=torch.int16)),
    ("input", torch.zeros((), dtype=torch.int8)),
    ("input", torch.zeros((1, MAX_ROW_SIZE + 1), dtype=torch.int8)),
    ("input_multiplier", 2**30 - 1),
    ("input_multiplier", -5),
    ("input_left_shift", -1),
    ("input_left_shift", 32),
    ("diff_min", 1),
    ("diff_min", -(2**11) - 1),  # -2049 * 2**20 < INT32_MIN
])
def test_bad_arguments(arg, value):
    args = _good()
    args[arg] = value
    with pytest.raises(CortenOpError, match=rf"quantized_softmax.*'{arg}'"):
        softmax(**args)


def test_boundary_arguments_accepted():
    args = _good()
    args["diff_min"] = -(2**11)  # exactly INT32_MIN after the shift
    softmax(**args)
    softmax(torch.zeros((1, MAX_ROW_SIZE), dtype=torch.int8), 2**31 - 1, 31, 0)


@pytest.mark.parametrize("scale", [0.0, 2.0**-27, -1.0, math.nan])
def test_degenerate_scale_refused(scale):
    with pytest.raises(ValueError, match="softmax|greater_than_one"):
        softmax_params(scale)
