"""``corten.quantized_add`` reference kernel vs ``naive.py`` (``arm_elementwise_add_s8``).

Case counts in the default run: ADD_REALISTIC_CASES with TFLite-derived multipliers (left shift 20,
``twice_max`` scaling) and ADD_EXTREME_CASES with arbitrary multipliers, shifts -31..30 and left
shifts 0..22, over random shapes of 1 to 4 dimensions (<= 48 elements).
"""
from __future__ import annotations

import random

import pytest
import torch

import naive
import op_cases as oc
from corten.ops import CortenOpError

ADD_REALISTIC_CASES = 2000
ADD_EXTREME_CASES = 2000

add = torch.ops.corten.quantized_add


def _tflite_add_params(rng: random.Random) -> dict:
    """Multipliers as TFLite's PrepareGeneralSubOp/Add derive them from three real scales."""
    s1, s2, s_out = (2.0 ** rng.uniform(-9, -2) for _ in range(3))
    left_shift = 20
    twice_max = 2 * max(s1, s2)
    m1, sh1 = naive.quantize_multiplier(s1 / twice_max)
    m2, sh2 = naive.quantize_multiplier(s2 / twice_max)
    mo, sho = naive.quantize_multiplier(twice_max / ((1 << left_shift) * s_out))
    return dict(input1_multiplier=m1, input1_shift=sh1, input2_multiplier=m2, input2_shift=sh2,
                left_shift=left_shift, output_multiplier=mo, output_shift=sho)


def _extreme_add_params(rng: random.Random) -> dict:
    params = {}
    for name in ("input1", "input2", "output"):
        m, s = oc.multiplier_shift(rng, -20.0, 0.0)
        params[f"{name}_multiplier"], params[f"{name}_shift"] = m, s
    params["left_shift"] = rng.choice((0, 20, 22, rng.randint(0, 22)))
    return params


def _random_shape(rng: random.Random):
    dims = rng.randint(1, 4)
    return tuple(rng.randint(1, 4) if d < dims - 1 else rng.randint(1, 3) for d in range(dims))


def _random_case(rng: random.Random, extreme: bool) -> dict:
    shape = _random_shape(rng)
    params = _extreme_add_params(rng) if extreme else _tflite_add_params(rng)
    lo, hi = oc.activation_range(rng)
    return dict(input1=oc.int8_tensor(rng, shape), input2=oc.int8_tensor(rng, shape),
                input1_offset=oc.input_offset(rng), input2_offset=oc.input_offset(rng),
                output_offset=oc.output_offset(rng), activation_min=lo, activation_max=hi, **params)


def _naive(case) -> list[int]:
    return naive.elementwise_add(
        case["input1"].flatten().tolist(), case["input2"].flatten().tolist(),
        case["input1_offset"], case["input1_multiplier"], case["input1_shift"],
        case["input2_offset"], case["input2_multiplier"], case["input2_shift"], case["left_shift"],
        case["output_offset"], case["output_multiplier"], case["output_shift"],
        case["activation_min"], case["activation_max"])


@pytest.mark.parametrize("extreme, cases, seed", [(False, ADD_REALISTIC_CASES, 5000),
                                                  (True, ADD_EXTREME_CASES, 5001)])
def test_add_matches_naive(extreme, cases, seed):
    rng = random.Random(seed)
    for i in range(cases):
        case = _random_case(rng, extreme)
        out = add(**case)
        assert out.dtype == torch.int8 and out.shape == case["input1"].shape
        assert out.flatten().tolist() == _naive(case), f"case {i}: {case}"


def test_add_realistic_params_match_float_sum():
    """Sanity of the TFLite parameter recipe: the result is within 1 of the real-valued sum."""
    rng = random.Random(12)
    for _ in range(300):
        s1, s2, s_out = (2.0 ** rng.uniform(-9, -2) for _ in range(3))
        twice_max = 2 * max(s1, s2)
        m1, sh1 = naive.quantize_multiplier(s1 / twice_max)
        m2, sh2 = naive.quantize_multiplier(s2 / twice_max)
        mo, sho = naive.quantize_multiplier(twice_max / ((1 << 20) * s_out))
        a, b = rng.randint(-128, 127), rng.randint(-128, 127)
        (got,) = naive.elementwise_add([a], [b], 0, m1, sh1, 0, m2, sh2, 20, 0, mo, sho, -128, 127)
        real = min(max((a * s1 + b * s2) / s_out, -128.0), 127.0)
        assert abs(got - real) <= 1.0


def test_add_output_is_channels_last_for_4d():
    """As mul and sub: a 4-D output is NHWC bytes (channels_last) whatever the inputs' layouts."""
    rng = random.Random(1)
    case = _random_case(rng, extreme=False)
    x1 = oc.int8_tensor(rng, (1, 3, 2, 2)).contiguous(memory_format=torch.channels_last)
    x2 = oc.int8_tensor(rng, (1, 3, 2, 2)).contiguous(memory_format=torch.channels_last)
    case.update(input1=x1, input2=x2)
    out = add(**case)
    assert oc.is_channels_last(out) and not out.is_contiguous()
    assert out.flatten().tolist() == _naive({**case, "input1": x1.contiguous(), "input2": x2.contiguous()})
    case.update(input1=x1.contiguous(), input2=x2.contiguous())
    assert oc.is_channels_last(add(**case))
    case.update(input1=x1[0, 0], input2=x2[0, 0])
    assert add(**case).is_contiguous()


@pytest.mark.parametrize("seed", range(3))
def test_opcheck_add(seed):
    rng = random.Random(seed)
    case = _random_case(rng, extreme=bool(seed % 2))
    names = ("input1", "input2", "input1_offset", "input1_multiplier", "input1_shift", "input2_offset",
             "input2_multiplier", "input2_shift", "left_shift", "output_offset", "output_multiplier",
             "output_shift", "activation_min", "activation_max")
    torch.library.opcheck(add.default, tuple(case[n] for n in names))


def _good():
    return dict(input1=torch.zeros((1, 2, 3, 3), dtype=torch.int8), input2=torch.zeros((1, 2, 3, 3), dtype=torch.int8),
                input1_offset=0, input1_multiplier=2**30, input1_shift=0, input2_offset=0,
                input2_multiplier=2**30, input2_shift=0, left_shift=20, output_offset=0,
                output_multiplier=2**30, output_shift=-19, activation_min=-128, activation_max=127)


@pytest.mark.parametrize("arg, value", [
    ("input1", torch.zeros((1, 2, 3, 3), dtype=torch.int16)),
    ("input2", torch.zeros((1, 2, 3, 3), dtype=torch.float32)),
    ("input2", torch.zeros((1, 2, 3, 4), dtype=torch.int8)),
    ("input1_offset", 129),
    ("input2_offset", -128),
    ("output_offset", 128),
    ("input1_multiplier", 2**30 - 1),
    ("input2_multiplier", -5),
    ("output_multiplier", 2**31),
    ("input1_shift", 31),
    ("input2_shift", -32),
    ("output_shift", 40),
    ("left_shift", 23),
    ("left_shift", -1),
    ("activation_min", 10),
    ("activation_max", 128),
])
def test_add_bad_arguments(arg, value):
    args = _good()
    args[arg] = value
    if arg == "activation_min":
        args["activation_max"] = 0
    with pytest.raises(CortenOpError, match=rf"quantized_add.*'{arg}'"):
        add(**args)


def test_add_good_arguments_are_accepted():
    assert add(**_good()).shape == (1, 2, 3, 3)
