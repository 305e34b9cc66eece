"""``corten.quantized_avg_pool2d`` / ``quantized_max_pool2d`` vs ``naive.py``.

Case counts in the default run: AVG_POOL_CASES and MAX_POOL_CASES random pools (<= 6x6
spatial, <= 4 channels, kernels up to 4x4, strides up to 3, padding below the kernel), plus
GLOBAL_POOL_CASES global average pools (kernel = whole input, as MobileNetV2's final pool).
"""
from __future__ import annotations

import random

import pytest
import torch

import naive
import op_cases as oc
from corten.ops import CortenOpError

AVG_POOL_CASES = 2400
MAX_POOL_CASES = 2400
GLOBAL_POOL_CASES = 300
CHUNKS = 2

avg_pool = torch.ops.corten.quantized_avg_pool2d
max_pool = torch.ops.corten.quantized_max_pool2d


def _random_pool(rng: random.Random) -> dict:
    kernel = [rng.randint(1, 4), rng.randint(1, 4)]
    stride = [rng.randint(1, 3), rng.randint(1, 3)]
    padding = [rng.randint(0, k - 1) for k in kernel]
    h = rng.randint(max(1, kernel[0] - 2 * padding[0]), 6)
    w = rng.randint(max(1, kernel[1] - 2 * padding[1]), 6)
    x = oc.int8_tensor(rng, (rng.choice((1, 1, 2)), rng.randint(1, 4), h, w))
    if rng.random() < 0.2:  # all-equal windows exercise the rounding of exact averages and ties
        x = torch.full_like(x, rng.choice((-128, -1, 0, 1, 127)))
    lo, hi = oc.activation_range(rng)
    return dict(input=x, kernel_size=kernel, stride=stride, padding=padding, activation_min=lo, activation_max=hi)


def _check(op, naive_fn, rng, case, i):
    out = op(oc.maybe_channels_last(rng, case["input"]), case["kernel_size"], case["stride"], case["padding"],
             case["activation_min"], case["activation_max"])
    assert out.dtype == torch.int8 and oc.is_channels_last(out)
    expected = naive_fn(oc.nhwc_list(case["input"]), case["kernel_size"], case["stride"], case["padding"],
                        case["activation_min"], case["activation_max"])
    assert oc.nhwc_list(out) == expected, f"case {i}: {case}"


@pytest.mark.parametrize("chunk", range(CHUNKS))
def test_avg_pool_matches_naive(chunk):
    rng = random.Random(6000 + chunk)
    for i in range(AVG_POOL_CASES // CHUNKS):
        _check(avg_pool, naive.avg_pool2d, rng, _random_pool(rng), i)


@pytest.mark.parametrize("chunk", range(CHUNKS))
def test_max_pool_matches_naive(chunk):
    rng = random.Random(7000 + chunk)
    for i in range(MAX_POOL_CASES // CHUNKS):
        _check(max_pool, naive.max_pool2d, rng, _random_pool(rng), i)


def test_global_avg_pool_matches_naive():
    rng = random.Random(8000)
    for i in range(GLOBAL_POOL_CASES):
        h, w = rng.randint(1, 7), rng.randint(1, 7)
        x = oc.int8_tensor(rng, (1, rng.randint(1, 8), h, w))
        case = dict(input=x, kernel_size=[h, w], stride=[1, 1], padding=[0, 0], activation_min=-128, activation_max=127)
        _check(avg_pool, naive.avg_pool2d, rng, case, i)


@pytest.mark.parametrize("values, expected", [
    ([1, 2], 2),        # 1.5 -> 2: (3 + 1) / 2
    ([-1, -2], -2),     # -1.5 -> -2: (-3 - 1) / 2, ties away from zero
    ([0, 1], 1),        # 0.5 -> 1
    ([0, -1], -1),      # -0.5 -> -1
    ([1, 1, 2], 1),     # 1.33 -> 1
    ([-1, -1, -2], -1),
    ([127, 127], 127),
    ([-128, -128, -128, 127], -64),  # -257/4 = -64.25 -> -64
])
def test_avg_pool_rounding_hand_values(values, expected):
    x = torch.tensor(values, dtype=torch.int8).reshape(1, 1, 1, len(values))
    assert avg_pool(x, [1, len(values)], [1, 1], [0, 0], -128, 127).flatten().tolist() == [expected]
    assert naive.avg_pool2d([[[[v] for v in values]]], [1, len(values)], [1, 1], [0, 0], -128, 127) == [[[[expected]]]]


def test_padding_is_excluded_from_windows():
    """All -128: a padded max pool never picks the padding, a padded average never counts it."""
    x = torch.full((1, 2, 3, 3), -128, dtype=torch.int8)
    assert max_pool(x, [3, 3], [1, 1], [1, 1], -128, 127).unique().tolist() == [-128]
    assert avg_pool(x, [3, 3], [1, 1], [1, 1], -128, 127).unique().tolist() == [-128]


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("op", [avg_pool, max_pool], ids=["avg", "max"])
def test_opcheck_pool(op, seed):
    case = _random_pool(random.Random(seed))
    case["input"] = case["input"].contiguous(memory_format=torch.channels_last)
    torch.library.opcheck(op.default, tuple(case.values()))


def _good():
    return dict(input=torch.zeros((1, 2, 4, 4), dtype=torch.int8), kernel_size=[2, 2], stride=[2, 2],
                padding=[0, 0], activation_min=-128, activation_max=127)


@pytest.mark.parametrize("op, name", [(avg_pool, "quantized_avg_pool2d"), (max_pool, "quantized_max_pool2d")])
@pytest.mark.parametrize("arg, value", [
    ("input", torch.zeros((1, 2, 4, 4), dtype=torch.uint8)),
    ("input", torch.zeros((2, 4, 4), dtype=torch.int8)),
    ("input", torch.zeros((1, 2, 1, 1), dtype=torch.int8)),    # smaller than the 2x2 kernel
    ("kernel_size", [0, 2]),
    ("kernel_size", [2]),
    ("stride", [1, 0]),
    ("padding", [2, 0]),                                       # padding must be below the kernel
    ("padding", [0, -1]),
    ("activation_min", 5),
    ("activation_min", -129),
    ("activation_max", 128),
])
def test_pool_bad_arguments(op, name, arg, value):
    args = _good()
    args[arg] = value
    if arg == "activation_min" and value == 5:
        args["activation_max"] = 4
    with pytest.raises(CortenOpError, match=rf"{name}.*'{arg}'"):
        op(**args)


def test_pool_good_arguments_are_accepted():
    assert avg_pool(**_good()).shape == max_pool(**_good()).shape == (1, 2, 2, 2)
