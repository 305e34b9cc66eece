"""Edge and property tests of :mod:`corten.fixed_point` against ``naive.py`` and hand-derived values."""
from __future__ import annotations

import math
import random
from fractions import Fraction

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import naive
from corten import fixed_point as fp

I32_MIN, I32_MAX = -(2**31), 2**31 - 1
int32s = st.integers(I32_MIN, I32_MAX)
shifts = st.integers(-31, 30)
q31_multipliers = st.one_of(st.just(0), st.integers(2**30, I32_MAX))

# Values where the arithmetic changes behaviour: extremes, ties, signs, powers of two.
EDGE_VALUES = sorted({I32_MIN, I32_MIN + 1, -(2**30) - 1, -(2**30), -(2**30) + 1, -65536, -255, -3, -2, -1,
                      0, 1, 2, 3, 255, 65535, 2**30 - 1, 2**30, 2**30 + 1, I32_MAX - 1, I32_MAX})
EDGE_MULTIPLIERS = [0, 2**30, 2**30 + 1, 1518500250, 2**31 - 2, I32_MAX]
HYPOTHESIS = settings(max_examples=2000, deadline=None, derandomize=True)


def t64(values) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int64)


# ----------------------------------------------------------------------------- wrap
@pytest.mark.parametrize("value, wrapped", [
    (2**31, I32_MIN), (2**32, 0), (-(2**31) - 1, I32_MAX), (I32_MAX, I32_MAX), (I32_MIN, I32_MIN),
    (3 << 30, -(2**30)), (-1, -1), (2**40 + 5, 5),
])
def test_wrap_int32(value, wrapped):
    assert fp.wrap_int32(value) == wrapped
    assert fp.wrap_int32_t(t64([value])).item() == wrapped


# ----------------------------------------------------------------------------- doubling high multiply
@pytest.mark.parametrize("m1, m2, expected", [
    (I32_MIN, I32_MIN, I32_MAX),             # the one saturating case
    (I32_MIN, I32_MIN + 1, I32_MAX),         # 2**62 - 2**31 -> (2**31 - 1) + rounding stays in range
    (I32_MAX, I32_MAX, I32_MAX - 1),
    (1, 2**30, 1),                           # +0.5 rounds up
    (-1, 2**30, 0),                          # -0.5 rounds towards +inf
    (-3, 2**30, -1),                         # -1.5 -> -1
    (3, 2**30, 2),                           # +1.5 -> 2
    (2**30, 2**30, 2**29),
    (0, I32_MIN, 0),
    (I32_MIN, 2**30, -(2**30)),
])
def test_saturating_doubling_high_mult_hand_values(m1, m2, expected):
    assert fp.saturating_rounding_doubling_high_mul_scalar(m1, m2) == expected
    assert naive.doubling_high_mult(m1, m2) == expected
    assert fp.saturating_rounding_doubling_high_mul(t64([m1]), m2).item() == expected
    assert fp.saturating_rounding_doubling_high_mul(t64([m1]), t64([m2])).item() == expected


@pytest.mark.parametrize("m1, m2, expected", [
    (I32_MIN, I32_MIN, I32_MIN),   # no saturation: 2**31 wraps
    (1, 2**30, 1),                 # +0.5 -> 1
    (-1, 2**30, 0),                # -0.5 -> 0 (ties towards +inf)
    (-3, 2**30, -1),               # -1.5 -> -1
    (5, 2**30, 3),                 # 2.5 -> 3
    (I32_MAX, I32_MAX, I32_MAX - 1),
    (2**30, 2**30, 2**29),
])
def test_doubling_high_mult_no_sat_hand_values(m1, m2, expected):
    assert fp.doubling_high_mult_no_sat_scalar(m1, m2) == expected
    assert naive.doubling_high_mult_no_sat(m1, m2) == expected
    assert fp.doubling_high_mult_no_sat(t64([m1]), m2).item() == expected


def test_doubling_high_mult_edge_grid():
    values = EDGE_VALUES
    a = t64([m1 for m1 in values for _ in values])
    b = t64([m2 for _ in values for m2 in values])
    sat = fp.saturating_rounding_doubling_high_mul(a, b).tolist()
    nosat = fp.doubling_high_mult_no_sat(a, b).tolist()
    for i, (m1, m2) in enumerate(zip(a.tolist(), b.tolist())):
        assert sat[i] == naive.doubling_high_mult(m1, m2) == fp.saturating_rounding_doubling_high_mul_scalar(m1, m2)
        assert nosat[i] == naive.doubling_high_mult_no_sat(m1, m2) == fp.doubling_high_mult_no_sat_scalar(m1, m2)


@HYPOTHESIS
@given(int32s, int32s)
def test_doubling_high_mult_property(m1, m2):
    assert fp.saturating_rounding_doubling_high_mul_scalar(m1, m2) == naive.doubling_high_mult(m1, m2)
    assert fp.doubling_high_mult_no_sat_scalar(m1, m2) == naive.doubling_high_mult_no_sat(m1, m2)


# ----------------------------------------------------------------------------- divide by power of two
@pytest.mark.parametrize("dividend, exponent, expected", [
    (5, 1, 3), (-5, 1, -3), (3, 1, 2), (-3, 1, -2), (1, 1, 1), (-1, 1, -1),   # ties away from zero
    (7, 2, 2), (6, 2, 2), (-6, 2, -2), (2, 2, 1), (-2, 2, -1), (-7, 2, -2), (5, 2, 1), (-5, 2, -1),
    (I32_MAX, 31, 1), (I32_MIN, 31, -1), (2**30, 31, 1), (-(2**30), 31, -1), (2**30 - 1, 31, 0),
    (-(2**30) + 1, 31, 0), (I32_MIN, 0, I32_MIN), (I32_MAX, 0, I32_MAX), (-1, 31, 0), (0, 17, 0),
    (I32_MAX, 30, 2), (I32_MIN, 30, -2),
])
def test_divide_by_power_of_two_hand_values(dividend, exponent, expected):
    assert fp.divide_by_power_of_two_scalar(dividend, exponent) == expected
    assert naive.divide_by_power_of_two(dividend, exponent) == expected
    assert fp.divide_by_power_of_two(t64([dividend]), exponent).item() == expected


def test_divide_by_power_of_two_all_exponents_against_exact_rounding():
    """Every exponent 0..31 on the edge values: result = round-half-away(dividend / 2**e)."""
    for exponent in range(32):
        got = fp.divide_by_power_of_two(t64(EDGE_VALUES), exponent).tolist()
        per_element = fp.divide_by_power_of_two(t64(EDGE_VALUES), t64([exponent] * len(EDGE_VALUES))).tolist()
        for value, g, pe in zip(EDGE_VALUES, got, per_element):
            q = Fraction(value, 2**exponent)
            exact = math.floor(abs(q) + Fraction(1, 2)) * (1 if q >= 0 else -1)
            assert g == pe == exact == fp.divide_by_power_of_two_scalar(value, exponent), (value, exponent)
            assert naive.divide_by_power_of_two(value, exponent) == exact


@pytest.mark.parametrize("exponent", [-1, 32])
def test_divide_by_power_of_two_refuses_bad_exponent(exponent):
    with pytest.raises(ValueError):
        fp.divide_by_power_of_two_scalar(1, exponent)


@HYPOTHESIS
@given(int32s, st.integers(0, 31))
def test_divide_by_power_of_two_property(dividend, exponent):
    expected = naive.divide_by_power_of_two(dividend, exponent)
    assert fp.divide_by_power_of_two_scalar(dividend, exponent) == expected
    q = Fraction(dividend, 2**exponent)
    assert expected == math.floor(abs(q) + Fraction(1, 2)) * (1 if q >= 0 else -1)


# ----------------------------------------------------------------------------- requantize
@pytest.mark.parametrize("val, mult, shift, expected", [
    (1, 2**30, 0, 1),            # 0.5 -> 1 (doubling high mult rounds ties up)
    (-1, 2**30, 0, 0),           # -0.5 -> 0
    (3, 2**30, -1, 1),           # 0.75 -> 1
    (1, 2**30 + 1, -1, 1),       # double rounding: 0.25000000023 -> 0.5 -> 1
    (-1, 2**30 + 1, -1, -1),     # mirror image
    (100, 2**30, 1, 100),        # 100 * 0.5 * 2
    (2**20, I32_MAX, 12, 0),     # val << 12 = 2**32 wraps to 0
    (3 << 29, 2**30, 1, -(2**29)),  # 3 << 30 wraps to -2**30, times 0.5
    (I32_MAX, I32_MAX, -31, 1),  # ~0.99999 -> 1
    (I32_MIN, 2**30, -31, -1),   # -2**30 / 2**31 = -0.5 -> -1 (ties away from zero)
    (12345, 0, 5, 0),
    (I32_MIN, I32_MAX, 0, I32_MIN + 1),
])
def test_requantize_hand_values(val, mult, shift, expected):
    assert fp.requantize_scalar(val, mult, shift) == expected
    assert naive.requantize(val, mult, shift) == expected
    assert fp.requantize(t64([val]), mult, shift).item() == expected
    assert fp.requantize(t64([val]), t64([mult]), t64([shift])).item() == expected


@pytest.mark.parametrize("val, mult, shift, expected", [
    (1, 2**30 + 1, -1, 0),       # single rounding: 0.25000000023 -> 0
    (-1, 2**30, 0, 0),           # -0.5 -> 0 (ties towards +inf)
    (-3, 2**30, 0, -1),          # -1.5 -> -1
    (3, 2**30, 0, 2),            # 1.5 -> 2
    (2**20, I32_MAX, 12, -2),    # no pre-shift wrap: round(2**32 - 2) = 4294967294 wraps to -2
    (I32_MAX, I32_MAX, -31, 1),
])
def test_requantize_single_rounding_hand_values(val, mult, shift, expected):
    assert fp.requantize_scalar(val, mult, shift, single_rounding=True) == expected
    assert naive.requantize_single_rounding(val, mult, shift) == expected
    assert fp.requantize(t64([val]), mult, shift, single_rounding=True).item() == expected


def test_requantize_edge_grid_all_shifts():
    """Every shift -31..30 x edge multipliers x edge values, scalar and vectorised, vs naive."""
    rows = [(v, m, s) for s in range(-31, 31) for m in EDGE_MULTIPLIERS for v in EDGE_VALUES]
    vals, mults, sh = (t64(list(c)) for c in zip(*rows))
    double = fp.requantize(vals, mults, sh).tolist()
    single = fp.requantize(vals, mults, sh, single_rounding=True).tolist()
    for (v, m, s), d, sr in zip(rows, double, single):
        assert d == naive.requantize(v, m, s) == fp.requantize_scalar(v, m, s), (v, m, s)
        assert sr == naive.requantize_single_rounding(v, m, s) == fp.requantize_scalar(v, m, s, True), (v, m, s)


def test_requantize_per_channel_broadcast():
    """multiplier/shift of shape [C] broadcast along the last (channel) axis of a channels-last value."""
    rng = random.Random(7)
    channels = 5
    mult = [rng.choice(EDGE_MULTIPLIERS + [rng.randint(2**30, I32_MAX)]) for _ in range(channels)]
    shift = [rng.randint(-31, 30) for _ in range(channels)]
    vals = [[[rng.randint(I32_MIN, I32_MAX) for _ in range(channels)] for _ in range(3)] for _ in range(2)]
    got = fp.requantize(t64(vals), t64(mult), t64(shift)).tolist()
    for i in range(2):
        for j in range(3):
            for c in range(channels):
                assert got[i][j][c] == naive.requantize(vals[i][j][c], mult[c], shift[c])


@HYPOTHESIS
@given(int32s, q31_multipliers, shifts)
def test_requantize_property(val, mult, shift):
    assert fp.requantize_scalar(val, mult, shift) == naive.requantize(val, mult, shift)
    assert fp.requantize_scalar(val, mult, shift, True) == naive.requantize_single_rounding(val, mult, shift)


def test_requantize_vectorised_many_random_cases():
    """50,000 seeded random (value, multiplier, shift) triples; values biased to small accumulators."""
    rng = random.Random(2024)
    rows = []
    for _ in range(50_000):
        bits = rng.choice([8, 16, 24, 31, 32])
        v = fp.wrap_int32(rng.getrandbits(bits) - (1 << (bits - 1)))
        m = rng.choice([0, rng.randint(2**30, I32_MAX), rng.randint(2**30, I32_MAX), rng.choice(EDGE_MULTIPLIERS)])
        s = rng.choice([rng.randint(-31, 30), rng.randint(-12, 2)])
        rows.append((v, m, s))
    vals, mults, sh = (t64(list(c)) for c in zip(*rows))
    double = fp.requantize(vals, mults, sh).tolist()
    single = fp.requantize(vals, mults, sh, single_rounding=True).tolist()
    for (v, m, s), d, sr in zip(rows, double, single):
        assert d == naive.requantize(v, m, s), (v, m, s)
        assert sr == naive.requantize_single_rounding(v, m, s), (v, m, s)


def test_clamp_activation_narrows_to_int8():
    out = fp.clamp_activation(t64([-1000, -128, -5, 0, 6, 127, 1000]), -5, 6)
    assert out.dtype == torch.int8
    assert out.tolist() == [-5, -5, -5, 0, 6, 6, 6]


# ----------------------------------------------------------------------------- quantize_multiplier
@pytest.mark.parametrize("scale, expected", [
    (0.0, (0, 0)),
    (0.5, (2**30, 0)),
    (1.0, (2**30, 1)),
    (0.75, (1610612736, 0)),
    (0.25, (2**30, -1)),
    (2.0**-32, (2**30, -31)),                          # smallest representable power of two
    (2.0**-33, (0, 0)),                                # underflows explicitly
    (1e-30, (0, 0)),
    (5e-324, (0, 0)),                                  # smallest subnormal
    (math.nextafter(1.0, 0.0), (2**30, 1)),            # fraction rounds to 2**31: renormalised
    (math.nextafter(2.0**-32, 0.0), (2**30, -31)),     # renormalised back into range
    (2.0**29, (2**30, 30)),                            # largest shift
    (math.nextafter(2.0**-33, 1.0), (0, 0)),
    (0.1, (1717986918, -3)),                           # 0.1 * 2**34 = 1717986918.4
    (1 / 3, (1431655765, -1)),                         # 2**32/3 = 1431655765.33
    (2 / 3, (1431655765, 0)),
])
def test_quantize_multiplier_hand_values(scale, expected):
    assert fp.quantize_multiplier(scale) == expected
    assert naive.quantize_multiplier(scale) == expected


@pytest.mark.parametrize("scale", [-1.0, -1e-30, -1e-300, float("nan"), float("inf"), float("-inf"),
                                   2.0**30, 1e10, math.nextafter(2.0**30, 0.0)])
def test_quantize_multiplier_refuses(scale):
    with pytest.raises(ValueError):
        fp.quantize_multiplier(scale)


def test_quantize_multiplier_smaller_than_one():
    assert fp.quantize_multiplier_smaller_than_one(0.5) == (2**30, 0)
    with pytest.raises(ValueError):
        fp.quantize_multiplier_smaller_than_one(1.0)


def _check_round_trip(scale: float) -> None:
    m, s = fp.quantize_multiplier(scale)
    assert (m, s) == naive.quantize_multiplier(scale)
    if scale < 2.0**-32 and m == 0:
        return
    assert 2**30 <= m <= I32_MAX and -31 <= s <= 30
    represented = Fraction(m) * Fraction(2) ** (s - 31)
    assert abs(represented - Fraction(scale)) <= Fraction(scale) * Fraction(1, 2**31), scale


@HYPOTHESIS
@given(st.floats(min_value=2.0**-40, max_value=2.0**29.99, allow_nan=False, allow_infinity=False))
def test_quantize_multiplier_round_trip_property(scale):
    _check_round_trip(scale)


def test_quantize_multiplier_round_trip_log_uniform():
    rng = random.Random(99)
    for _ in range(5000):
        _check_round_trip(2.0 ** rng.uniform(-34, 29.9))


def test_quantize_multiplier_then_requantize_is_close_to_real_scaling():
    """Integration: requantize(v, quantize_multiplier(s)) is within 1 of v * s (double rounding)."""
    rng = random.Random(5)
    for _ in range(3000):
        scale = 2.0 ** rng.uniform(-20, 0)
        v = rng.randint(-(2**20), 2**20)
        m, s = fp.quantize_multiplier(scale)
        assert abs(fp.requantize_scalar(v, m, s) - v * scale) <= 1.0
