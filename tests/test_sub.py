"""``corten.quantized_sub`` reference kernel vs ``naive_elementwise.sub`` (TFLite int8 SUB: the add
arithmetic with input2's multiplier negated, numpy broadcasting), opcheck, argument errors.

Case counts in the default run: SUB_REALISTIC_CASES with the TFLite add/sub recipe (left shift 20,
``twice_max`` scaling) and SUB_EXTREME_CASES with arbitrary multipliers, shifts -31..30 and left
shifts 0..22, over random broadcastable shape pairs of ranks 1 to 4.
"""
from __future__ import annotations

import random

import pytest
import torch

import naive
import naive_elementwise as ne
import op_cases as oc
from corten.ops._qparams import add_params
from corten.ops import CortenOpError

SUB_REALISTIC_CASES = 1500
SUB_EXTREME_CASES = 1500

sub = torch.ops.corten.quantized_sub
add = torch.ops.corten.quantized_add
NAMES = ("input1", "input2", "input1_offset", "input1_multiplier", "input1_shift", "input2_offset",
         "input2_multiplier", "input2_shift", "left_shift", "output_offset", "output_multiplier", "output_shift",
         "activation_min", "activation_max")


def _params(rng: random.Random, extreme: bool) -> dict:
    if extreme:
        params = {}
        for name in ("input1", "input2", "output"):
            params[f"{name}_multiplier"], params[f"{name}_shift"] = oc.multiplier_shift(rng, -20.0, 0.0)
        params["left_shift"] = rng.choice((0, 20, 22, rng.randint(0, 22)))
        return params
    p = add_params(*(2.0 ** rng.uniform(-9, -2) for _ in range(3)))
    return dict(input1_multiplier=p.input1_multiplier, input1_shift=p.input1_shift,
                input2_multiplier=p.input2_multiplier, input2_shift=p.input2_shift, left_shift=p.left_shift,
                output_multiplier=p.output_multiplier, output_shift=p.output_shift)


def _random_case(rng: random.Random, extreme: bool) -> dict:
    s1, s2 = ne.random_broadcast_shapes(rng)
    lo, hi = oc.activation_range(rng)
    x1 = oc.int8_tensor(rng, s1)
    if x1.dim() == 4:
        x1 = oc.maybe_channels_last(rng, x1)
    return dict(input1=x1, input2=oc.int8_tensor(rng, s2), input1_offset=oc.input_offset(rng),
                input2_offset=oc.input_offset(rng), output_offset=oc.output_offset(rng), activation_min=lo,
                activation_max=hi, **_params(rng, extreme))


def _naive(case):
    return ne.sub(case["input1"].tolist(), case["input2"].tolist(), *(case[n] for n in NAMES[2:]))


@pytest.mark.parametrize("extreme, cases, seed", [(False, SUB_REALISTIC_CASES, 6200),
                                                  (True, SUB_EXTREME_CASES, 6201)])
def test_sub_matches_naive(extreme, cases, seed):
    rng = random.Random(seed)
    for i in range(cases):
        case = _random_case(rng, extreme)
        out = sub(**case)
        shape, want = _naive(case)
        assert out.dtype == torch.int8 and tuple(out.shape) == shape
        assert out.flatten().tolist() == want, f"case {i}: {case}"


def test_sub_realistic_params_match_float_difference():
    rng = random.Random(14)
    for _ in range(300):
        s1, s2, so = (2.0 ** rng.uniform(-9, -2) for _ in range(3))
        p = add_params(s1, s2, so)
        a, b = rng.randint(-128, 127), rng.randint(-128, 127)
        (_, (got,)) = ne.sub([a], [b], 0, p.input1_multiplier, p.input1_shift, 0, p.input2_multiplier,
                             p.input2_shift, p.left_shift, 0, p.output_multiplier, p.output_shift, -128, 127)
        real = min(max((a * s1 - b * s2) / so, -128.0), 127.0)
        assert abs(got - real) <= 1.0


def test_sub_is_add_with_negated_input2_multiplier():
    """Same shapes: sub == the add kernel's arithmetic with -m2 (through the naive add, which takes
    any int32 multiplier)."""
    rng = random.Random(15)
    for _ in range(300):
        case = _random_case(rng, extreme=rng.random() < 0.5)
        x1, x2 = oc.int8_tensor(rng, (7,)), oc.int8_tensor(rng, (7,))
        case.update(input1=x1, input2=x2)
        args = [case[n] for n in NAMES[2:]]
        args[4] = -args[4]  # input2_multiplier
        assert sub(**case).tolist() == naive.elementwise_add(x1.tolist(), x2.tolist(), *args)


def test_sub_negates_the_multiplier_not_the_requantized_input2():
    """On an exact tie of the doubling high multiply (rounded towards +inf) requantize(v, -m) is
    not -requantize(v, m): with v = 1 << 20 and m = 2**30 + 2**10, v * m = 2**50 + 2**30."""
    m = 2**30 + 2**10
    assert naive.requantize(1 << 20, -m, 0) == -(2**19) != -naive.requantize(1 << 20, m, 0)
    # input1 = 1 gives a = requantize(1 << 20, 2**30, 0) = 2**19, so a + b is 0 here, and -1 had
    # input2's requantized value been negated; the output multiplier (~1.0) keeps that difference.
    args = dict(input1=torch.tensor([1], dtype=torch.int8), input2=torch.tensor([1], dtype=torch.int8),
                input1_offset=0, input1_multiplier=2**30, input1_shift=0, input2_offset=0, input2_multiplier=m,
                input2_shift=0, left_shift=20, output_offset=0, output_multiplier=2**31 - 1, output_shift=0,
                activation_min=-128, activation_max=127)
    assert sub(**args).tolist() == [0]
    assert naive.requantize(2**19 - naive.requantize(1 << 20, m, 0), 2**31 - 1, 0) == -1


def test_sub_output_layout_and_broadcast():
    rng = random.Random(2)
    case = _random_case(rng, extreme=False)
    x = oc.int8_tensor(rng, (1, 3, 2, 2))
    b = oc.int8_tensor(rng, (1, 3, 1, 1))
    case.update(input1=x, input2=b)
    out = sub(**case)
    assert oc.is_channels_last(out) and not out.is_contiguous()
    case.update(input2=b.expand(1, 3, 2, 2).contiguous())
    assert torch.equal(sub(**case), out)


@pytest.mark.parametrize("seed", range(4))
def test_opcheck_sub(seed):
    rng = random.Random(seed)
    case = _random_case(rng, extreme=bool(seed % 2))
    torch.library.opcheck(sub.default, tuple(case[n] for n in NAMES))


def _good():
    return dict(input1=torch.zeros((1, 2, 3, 3), dtype=torch.int8), input2=torch.zeros((2, 1, 1), dtype=torch.int8),
                input1_offset=0, input1_multiplier=2**30, input1_shift=0, input2_offset=0,
                input2_multiplier=2**30, input2_shift=0, left_shift=20, output_offset=0,
                output_multiplier=2**30, output_shift=-19, activation_min=-128, activation_max=127)


@pytest.mark.parametrize("arg, value", [
    ("input1", torch.zeros((1, 2, 3, 3), dtype=torch.uint8)),
    ("input2", torch.zeros((2, 1, 1), dtype=torch.float32)),
    ("input2", torch.zeros((1, 2, 3, 2), dtype=torch.int8)),
    ("input1_offset", 129),
    ("input2_offset", -128),
    ("output_offset", 128),
    ("input1_multiplier", 2**30 - 1),
    ("input2_multiplier", -(2**30)),  # the op negates it itself: give the positive one
    ("output_multiplier", 2**31),
    ("input1_shift", 31),
    ("input2_shift", -32),
    ("output_shift", 40),
    ("left_shift", 23),
    ("left_shift", -1),
    ("activation_min", 10),
    ("activation_max", 128),
])
def test_sub_bad_arguments(arg, value):
    args = _good()
    args[arg] = value
    if arg == "activation_min":
        args["activation_max"] = 0
    with pytest.raises(CortenOpError, match=rf"quantized_sub.*'{arg}'"):
        sub(**args)


def test_sub_good_arguments_are_accepted():
    assert sub(**_good()).shape == (1, 2, 3, 3)
