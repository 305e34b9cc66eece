"""``corten.quantized_mul`` reference kernel vs ``naive_elementwise.mul`` (``arm_elementwise_mul_s8``
with numpy broadcasting), opcheck, argument errors.

Case counts in the default run: MUL_REALISTIC_CASES with multipliers from TFLite's
``s1 * s2 / s_out`` recipe and MUL_EXTREME_CASES with arbitrary multipliers and shifts -31..30,
over random broadcastable shape pairs of ranks 1 to 4 (<= 256 output elements).
"""
from __future__ import annotations

import random

import pytest
import torch

import naive
import naive_elementwise as ne
import op_cases as oc
from corten.ops import CortenOpError

MUL_REALISTIC_CASES = 1500
MUL_EXTREME_CASES = 1500

mul = torch.ops.corten.quantized_mul
NAMES = ("input1", "input2", "input1_offset", "input2_offset", "output_offset", "output_multiplier", "output_shift",
         "activation_min", "activation_max")


def _random_case(rng: random.Random, extreme: bool) -> dict:
    s1, s2 = ne.random_broadcast_shapes(rng)
    if extreme:
        mult, shift = oc.multiplier_shift(rng, -20.0, 0.0)
    else:
        scale = 2.0 ** rng.uniform(-9, -2) * 2.0 ** rng.uniform(-9, -2) / 2.0 ** rng.uniform(-9, -2)
        mult, shift = naive.quantize_multiplier(scale)
    lo, hi = oc.activation_range(rng)
    x1, x2 = oc.int8_tensor(rng, s1), oc.int8_tensor(rng, s2)
    if x1.dim() == 4:
        x1 = oc.maybe_channels_last(rng, x1)
    return dict(input1=x1, input2=x2, input1_offset=oc.input_offset(rng), input2_offset=oc.input_offset(rng),
                output_offset=oc.output_offset(rng), output_multiplier=mult, output_shift=shift,
                activation_min=lo, activation_max=hi)


def _naive(case):
    return ne.mul(case["input1"].tolist(), case["input2"].tolist(), *(case[n] for n in NAMES[2:]))


@pytest.mark.parametrize("extreme, cases, seed", [(False, MUL_REALISTIC_CASES, 6100),
                                                  (True, MUL_EXTREME_CASES, 6101)])
def test_mul_matches_naive(extreme, cases, seed):
    rng = random.Random(seed)
    for i in range(cases):
        case = _random_case(rng, extreme)
        out = mul(**case)
        shape, want = _naive(case)
        assert out.dtype == torch.int8 and tuple(out.shape) == shape
        assert out.flatten().tolist() == want, f"case {i}: {case}"


def test_mul_realistic_params_match_float_product():
    """The TFLite recipe (one multiplier for s1 * s2 / s_out) is within 1 step of the real product."""
    rng = random.Random(13)
    for _ in range(300):
        s1, s2, so = (2.0 ** rng.uniform(-7, -3) for _ in range(3))
        so *= 64
        m, s = naive.quantize_multiplier(s1 * s2 / so)
        a, b = rng.randint(-128, 127), rng.randint(-128, 127)
        (_, (got,)) = ne.mul([a], [b], 0, 0, 0, m, s, -128, 127)
        real = min(max(a * s1 * b * s2 / so, -128.0), 127.0)
        assert abs(got - real) <= 1.0


def test_mul_squeeze_excitation_broadcast():
    """[N,C,H,W] * [N,C,1,1]: every pixel of channel c is scaled by gate[c] (either operand order)."""
    g = torch.Generator().manual_seed(3)
    x = torch.randint(-128, 128, (2, 5, 3, 4), generator=g, dtype=torch.int8)
    x = x.contiguous(memory_format=torch.channels_last)
    gate = torch.randint(-128, 128, (2, 5, 1, 1), generator=g, dtype=torch.int8)
    args = (-3, 7, 2, 1 << 30, -8, -128, 127)
    out = mul(x, gate, *args)
    assert out.shape == x.shape and oc.is_channels_last(out)
    for n in range(2):
        for c in range(5):
            gate_map = gate[n:n + 1, c:c + 1].expand(1, 1, 3, 4).contiguous()
            single = mul(x[n:n + 1, c:c + 1].contiguous(), gate_map, *args)
            assert torch.equal(out[n:n + 1, c:c + 1], single)
    swapped = mul(gate, x, 7, -3, *args[2:])
    assert torch.equal(swapped, out)


def test_mul_output_layout():
    rng = random.Random(2)
    case = _random_case(rng, extreme=False)
    case.update(input1=oc.int8_tensor(rng, (1, 3, 2, 2)), input2=oc.int8_tensor(rng, (1, 3, 2, 2)))
    assert oc.is_channels_last(mul(**case)) and not mul(**case).is_contiguous()  # 4-D: NHWC bytes
    case.update(input1=oc.int8_tensor(rng, (3, 4)), input2=oc.int8_tensor(rng, (1, 4)))
    assert mul(**case).is_contiguous()


@pytest.mark.parametrize("seed", range(4))
def test_opcheck_mul(seed):
    rng = random.Random(seed)
    case = _random_case(rng, extreme=bool(seed % 2))
    torch.library.opcheck(mul.default, tuple(case[n] for n in NAMES))


def _good():
    return dict(input1=torch.zeros((1, 2, 3, 3), dtype=torch.int8), input2=torch.zeros((1, 2, 1, 1), dtype=torch.int8),
                input1_offset=0, input2_offset=0, output_offset=0, output_multiplier=2**30, output_shift=-7,
                activation_min=-128, activation_max=127)


@pytest.mark.parametrize("arg, value", [
    ("input1", torch.zeros((1, 2, 3, 3), dtype=torch.int16)),
    ("input2", torch.zeros((1, 2, 1, 1), dtype=torch.float32)),
    ("input2", torch.zeros((1, 3, 1, 1), dtype=torch.int8)),  # does not broadcast
    ("input2", torch.zeros((1, 1, 1, 1, 1, 1), dtype=torch.int8)),  # rank 6 (rank 5 is accepted)
    ("input1", torch.zeros((), dtype=torch.int8)),  # rank 0
    ("input1_offset", 129),
    ("input2_offset", -128),
    ("output_offset", 128),
    ("output_multiplier", 2**30 - 1),
    ("output_multiplier", -(2**30)),
    ("output_shift", 31),
    ("output_shift", -32),
    ("activation_min", 10),
    ("activation_max", 128),
])
def test_mul_bad_arguments(arg, value):
    args = _good()
    args[arg] = value
    if arg == "activation_min":
        args["activation_max"] = 0
    with pytest.raises(CortenOpError, match=rf"quantized_mul.*'{arg}'"):
        mul(**args)


def test_mul_good_arguments_are_accepted():
    assert mul(**_good()).shape == (1, 2, 3, 3)
