"""``corten.quantize_per_tensor`` / ``dequantize_per_tensor`` vs naive TFLite-style rounding.

Case counts in the default run: QUANTIZE_CASES random (tensor, scale, zero point) triples of up to
64 values each (about a fifth of them exact ties ``(k + 0.5) * scale`` with a power-of-two scale)
and DEQUANTIZE_CASES random int8 tensors; both compared bit for bit with ``naive.py``.
"""
from __future__ import annotations

import random

import pytest
import torch

import naive
import op_cases as oc
from corten.ops import CortenOpError

QUANTIZE_CASES = 3000
DEQUANTIZE_CASES = 3000

quantize = torch.ops.corten.quantize_per_tensor
dequantize = torch.ops.corten.dequantize_per_tensor


def _random_scale(rng: random.Random) -> float:
    if rng.random() < 0.2:
        return 2.0 ** rng.randint(-10, 2)  # quotients of ties are exact
    return naive.f32(2.0 ** rng.uniform(-12, 3))


def _random_floats(rng: random.Random, scale: float, zero_point: int, n: int) -> list[float]:
    values = []
    for _ in range(n):
        r = rng.random()
        if r < 0.2:  # an exact tie: (k + 0.5) * scale, both signs
            values.append(naive.f32((rng.randint(-200, 200) + 0.5) * scale))
        elif r < 0.3:  # far outside the int8 range: clamps
            values.append(naive.f32(rng.choice((-1, 1)) * 300 * scale * rng.uniform(1, 10)))
        elif r < 0.35:
            values.append(rng.choice((0.0, -0.0)))
        else:
            values.append(naive.f32(rng.uniform(-140 - zero_point, 140 - zero_point) * scale))
    return values


def _shape_of(n: int, rng: random.Random):
    return rng.choice(((n,), (1, n), (n, 1, 1, 1)))


def test_quantize_matches_naive():
    rng = random.Random(9000)
    for i in range(QUANTIZE_CASES):
        scale, zp = _random_scale(rng), rng.randint(-128, 127)
        values = _random_floats(rng, scale, zp, rng.randint(1, 64))
        x = torch.tensor(values, dtype=torch.float32).reshape(_shape_of(len(values), rng))
        out = quantize(x, scale, zp)
        assert out.dtype == torch.int8 and out.shape == x.shape
        assert out.flatten().tolist() == [naive.quantize(v, scale, zp) for v in values], f"case {i}: {scale}, {zp}"


def test_dequantize_matches_naive():
    rng = random.Random(9001)
    for i in range(DEQUANTIZE_CASES):
        scale, zp = _random_scale(rng), rng.randint(-128, 127)
        q = oc.int8_tensor(rng, (rng.randint(1, 64),))
        out = dequantize(q, scale, zp)
        assert out.dtype == torch.float32
        assert out.tolist() == [naive.dequantize(v, scale, zp) for v in q.tolist()], f"case {i}: {scale}, {zp}"


@pytest.mark.parametrize("x, scale, zp, expected", [
    (0.5, 1.0, 0, 1),       # half away from zero (round-half-even would give 0)
    (-0.5, 1.0, 0, -1),
    (2.5, 1.0, 0, 3),       # round-half-even would give 2
    (-2.5, 1.0, 0, -3),
    (0.49999997, 1.0, 0, 0),
    (1.5, 0.5, -128, -125),
    (1000.0, 1.0, 0, 127),
    (-1000.0, 1.0, 5, -128),
    (0.3, 0.1, 0, 3),       # float32 0.3 / 0.1 = 3.0000001 -> 3
    (-0.0, 1.0, 7, 7),
])
def test_quantize_hand_values(x, scale, zp, expected):
    assert naive.quantize(x, scale, zp) == expected
    assert quantize(torch.tensor([x], dtype=torch.float32), scale, zp).tolist() == [expected]


def test_dequantize_hand_values():
    out = dequantize(torch.tensor([-128, 0, 5, 127], dtype=torch.int8), 0.5, 5)
    assert out.tolist() == [-66.5, -2.5, 0.0, 61.0]


def test_quantize_dequantize_round_trip_is_identity_on_the_grid():
    q = torch.arange(-128, 128, dtype=torch.int32).to(torch.int8)
    for scale, zp in ((0.05, 3), (1 / 255, -128), (0.0123, 0)):
        assert torch.equal(quantize(dequantize(q, scale, zp), scale, zp), q)


@pytest.mark.parametrize("seed", range(3))
def test_opcheck_quantize(seed):
    rng = random.Random(seed)
    scale, zp = _random_scale(rng), rng.randint(-128, 127)
    x = torch.tensor(_random_floats(rng, scale, zp, 12), dtype=torch.float32).reshape(3, 4)
    torch.library.opcheck(quantize.default, (x, scale, zp))
    torch.library.opcheck(dequantize.default, (oc.int8_tensor(rng, (2, 3, 2)), scale, zp))


@pytest.mark.parametrize("op, name, good_input", [
    (quantize, "quantize_per_tensor", torch.zeros(3, dtype=torch.float32)),
    (dequantize, "dequantize_per_tensor", torch.zeros(3, dtype=torch.int8)),
])
@pytest.mark.parametrize("arg, bad", [
    ("input", "dtype"),
    ("scale", 0.0),
    ("scale", -1.0),
    ("scale", float("nan")),
    ("zero_point", 128),
    ("zero_point", -129),
])
def test_quantize_bad_arguments(op, name, good_input, arg, bad):
    args = dict(input=good_input, scale=0.1, zero_point=0)
    args[arg] = good_input.to(torch.float64 if good_input.is_floating_point() else torch.int16) if bad == "dtype" else bad
    with pytest.raises(CortenOpError, match=rf"{name}.*'{arg}'"):
        op(**args)
