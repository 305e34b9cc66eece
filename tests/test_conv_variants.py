"""``corten.quantized_grouped_conv2d`` / ``quantized_conv_transpose2d`` reference kernels vs
``naive_conv_variants.py``; opcheck; argument errors.

Case counts: GROUPED_CASES random grouped convolutions and TRANSPOSE_CASES random transposed
convolutions (spatial <= 5x5, <= 6 channels), in CHUNKS seeded chunks each.
"""
from __future__ import annotations

import random

import pytest
import torch

import naive_conv_variants as naive
import op_cases as oc
from corten.ops import CortenOpError

GROUPED_CASES = 1200
TRANSPOSE_CASES = 1200
CHUNKS = 4

grouped = torch.ops.corten.quantized_grouped_conv2d
transpose = torch.ops.corten.quantized_conv_transpose2d


def _quant(rng, c_out):
    mult, shift, _ = oc.per_channel(rng, c_out)
    return dict(bias=oc.bias_list(rng, c_out), input_offset=oc.input_offset(rng), output_offset=oc.output_offset(rng),
                mult=mult, shift=shift, act=oc.activation_range(rng))


def _random_grouped(rng: random.Random) -> dict:
    kh, kw = rng.randint(1, 3), rng.randint(1, 3)
    stride = [rng.randint(1, 2), rng.randint(1, 2)]
    dilation = [rng.choice((1, 1, 2)), rng.choice((1, 1, 2))]
    padding = [rng.randint(0, 2), rng.randint(0, 2)]
    h_min = max(1, dilation[0] * (kh - 1) + 1 - 2 * padding[0])
    w_min = max(1, dilation[1] * (kw - 1) + 1 - 2 * padding[1])
    h, w = rng.randint(h_min, max(h_min, 5)), rng.randint(w_min, max(w_min, 5))
    groups = rng.choice((2, 2, 3))
    ck, per_group = rng.randint(1, 3), rng.randint(1, 3)
    c_in, c_out = groups * ck, groups * per_group
    return dict(input=oc.int8_tensor(rng, (rng.choice((1, 1, 2)), c_in, h, w)),
                weight=oc.int8_tensor(rng, (c_out, kh, kw, ck)), stride=stride, padding=padding,
                dilation=dilation, groups=groups, **_quant(rng, c_out))


def _random_transpose(rng: random.Random) -> dict:
    kh, kw = rng.randint(1, 4), rng.randint(1, 4)
    stride = [rng.randint(1, 3), rng.randint(1, 3)]
    dilation = [rng.choice((1, 1, 1, 2)), rng.choice((1, 1, 1, 2))]
    padding = [rng.randint(0, 2), rng.randint(0, 2)]
    output_padding = [rng.randint(0, max(stride[0], dilation[0]) - 1), rng.randint(0, max(stride[1], dilation[1]) - 1)]
    h, w = rng.randint(1, 5), rng.randint(1, 5)
    for i, size in enumerate((h, w)):  # keep the output non-empty
        k = (kh, kw)[i]
        while (size - 1) * stride[i] + dilation[i] * (k - 1) + output_padding[i] + 1 - 2 * padding[i] < 1:
            padding[i] -= 1
    c_in, c_out = rng.randint(1, 6), rng.randint(1, 6)
    return dict(input=oc.int8_tensor(rng, (rng.choice((1, 1, 2)), c_in, h, w)),
                weight=oc.int8_tensor(rng, (c_out, kh, kw, c_in)), stride=stride, padding=padding,
                output_padding=output_padding, dilation=dilation, **_quant(rng, c_out))


def _run_grouped(rng, case):
    m, s = oc.qparam_tensors(case["mult"], case["shift"])
    return grouped(oc.maybe_channels_last(rng, case["input"]), case["weight"], oc.bias_tensor(case["bias"]),
                   case["stride"], case["padding"], case["dilation"], case["groups"], case["input_offset"],
                   case["output_offset"], m, s, *case["act"])


def _naive_grouped(case):
    c_out = case["weight"].shape[0]
    return naive.grouped_conv2d(oc.nhwc_list(case["input"]), case["weight"].tolist(), case["bias"], case["stride"],
                                case["padding"], case["dilation"], case["input_offset"], case["output_offset"],
                                oc.expand(case["mult"], c_out), oc.expand(case["shift"], c_out), *case["act"])


def _run_transpose(rng, case):
    m, s = oc.qparam_tensors(case["mult"], case["shift"])
    return transpose(oc.maybe_channels_last(rng, case["input"]), case["weight"], oc.bias_tensor(case["bias"]),
                     case["stride"], case["padding"], case["output_padding"], case["dilation"],
                     case["input_offset"], case["output_offset"], m, s, *case["act"])


def _naive_transpose(case):
    c_out = case["weight"].shape[0]
    return naive.conv_transpose2d(oc.nhwc_list(case["input"]), case["weight"].tolist(), case["bias"],
                                  case["stride"], case["padding"], case["output_padding"], case["dilation"],
                                  case["input_offset"], case["output_offset"], oc.expand(case["mult"], c_out),
                                  oc.expand(case["shift"], c_out), *case["act"])


def _describe(case) -> str:
    return repr({k: (tuple(v.shape) if isinstance(v, torch.Tensor) else v) for k, v in case.items()})


@pytest.mark.parametrize("chunk", range(CHUNKS))
def test_grouped_conv2d_matches_naive(chunk):
    rng = random.Random(5000 + chunk)
    for i in range(GROUPED_CASES // CHUNKS):
        case = _random_grouped(rng)
        out = _run_grouped(rng, case)
        assert out.dtype == torch.int8 and oc.is_channels_last(out)
        assert oc.nhwc_list(out) == _naive_grouped(case), f"case {i} of chunk {chunk}: {_describe(case)}"


@pytest.mark.parametrize("chunk", range(CHUNKS))
def test_conv_transpose2d_matches_naive(chunk):
    rng = random.Random(6000 + chunk)
    for i in range(TRANSPOSE_CASES // CHUNKS):
        case = _random_transpose(rng)
        out = _run_transpose(rng, case)
        assert out.dtype == torch.int8 and oc.is_channels_last(out)
        assert oc.nhwc_list(out) == _naive_transpose(case), f"case {i} of chunk {chunk}: {_describe(case)}"


def test_conv_transpose2d_matches_torch_on_integers():
    """With unit requantization the op is PyTorch's conv_transpose2d on (x + offset), exactly (all
    values stay small integers in float64)."""
    rng = random.Random(7)
    for _ in range(30):
        case = _random_transpose(rng)
        x, w = case["input"], case["weight"]
        c_out = w.shape[0]
        ref = torch.nn.functional.conv_transpose2d(
            x.double() + case["input_offset"], w.permute(3, 0, 1, 2).double(), stride=case["stride"],
            padding=case["padding"], output_padding=case["output_padding"], dilation=case["dilation"])
        # multiplier 2**30 with shift 1 is x1: the output is the accumulator clamped to int8
        m, s = oc.qparam_tensors([2**30] * c_out, [1] * c_out)
        out = transpose(x, w, None, case["stride"], case["padding"], case["output_padding"], case["dilation"],
                        case["input_offset"], 0, m, s, -128, 127)
        assert torch.equal(out.to(torch.int64), ref.clamp(-128, 127).to(torch.int64))


def test_grouped_with_one_group_is_conv2d():
    rng = random.Random(8)
    case = _random_grouped(rng)
    m, s = oc.qparam_tensors(case["mult"], case["shift"])
    x, w = case["input"], case["weight"]
    w_full = w[: w.shape[0] // case["groups"]].repeat(1, 1, 1, case["groups"])
    args = (oc.bias_tensor(case["bias"])[: w_full.shape[0]] if case["bias"] else None, case["stride"],
            case["padding"], case["dilation"])
    tail = (case["input_offset"], case["output_offset"], m[:1], s[:1], *case["act"])
    one = grouped(x, w_full, *args, 1, *tail)
    assert torch.equal(one, torch.ops.corten.quantized_conv2d(x, w_full, *args, *tail))


# ----------------------------------------------------------------------------- opcheck
def _grouped_args(seed):
    case = _random_grouped(random.Random(seed))
    m, s = oc.qparam_tensors(case["mult"], case["shift"])
    return (case["input"].contiguous(memory_format=torch.channels_last), case["weight"], oc.bias_tensor(case["bias"]),
            case["stride"], case["padding"], case["dilation"], case["groups"], case["input_offset"],
            case["output_offset"], m, s, *case["act"])


def _transpose_args(seed):
    case = _random_transpose(random.Random(seed))
    m, s = oc.qparam_tensors(case["mult"], case["shift"])
    return (case["input"].contiguous(memory_format=torch.channels_last), case["weight"], oc.bias_tensor(case["bias"]),
            case["stride"], case["padding"], case["output_padding"], case["dilation"], case["input_offset"],
            case["output_offset"], m, s, *case["act"])


@pytest.mark.parametrize("seed", range(2))
def test_opcheck(seed):
    torch.library.opcheck(grouped.default, _grouped_args(seed))
    torch.library.opcheck(transpose.default, _transpose_args(seed))


# ----------------------------------------------------------------------------- bad arguments
def _good_grouped():
    return dict(input=torch.zeros((1, 4, 5, 5), dtype=torch.int8), weight=torch.zeros((6, 3, 3, 2), dtype=torch.int8),
                bias=torch.zeros(6, dtype=torch.int32), stride=[1, 1], padding=[1, 1], dilation=[1, 1], groups=2,
                input_offset=0, output_offset=0, output_multiplier=torch.full((6,), 2**30, dtype=torch.int32),
                output_shift=torch.zeros(6, dtype=torch.int32), activation_min=-128, activation_max=127)


def _good_transpose():
    return dict(input=torch.zeros((1, 4, 3, 3), dtype=torch.int8), weight=torch.zeros((5, 3, 3, 4), dtype=torch.int8),
                bias=torch.zeros(5, dtype=torch.int32), stride=[2, 2], padding=[1, 1], output_padding=[1, 1],
                dilation=[1, 1], input_offset=0, output_offset=0,
                output_multiplier=torch.full((5,), 2**30, dtype=torch.int32),
                output_shift=torch.zeros(5, dtype=torch.int32), activation_min=-128, activation_max=127)


@pytest.mark.parametrize("arg, bad", [
    ("input", lambda a: a["input"].to(torch.int16)),
    ("weight", lambda a: torch.zeros((6, 3, 3, 3), dtype=torch.int8)),  # 3 x 2 groups != 4 channels
    ("weight", lambda a: torch.zeros((5, 3, 3, 2), dtype=torch.int8)),  # C_out not a multiple of groups
    ("groups", lambda a: 0),
    ("stride", lambda a: [0, 1]),
    ("input_offset", lambda a: 129),
    ("activation_max", lambda a: 128),
])
def test_grouped_bad_arguments(arg, bad):
    args = _good_grouped()
    args[arg] = bad(args)
    if arg == "weight" and args["weight"].shape[0] == 5:
        args.update(bias=None, output_multiplier=args["output_multiplier"][:1], output_shift=args["output_shift"][:1])
    with pytest.raises(CortenOpError, match=rf"quantized_grouped_conv2d.*'{arg}'"):
        grouped(**args)


@pytest.mark.parametrize("arg, bad", [
    ("input", lambda a: a["input"][0]),
    ("weight", lambda a: torch.zeros((5, 3, 3, 2), dtype=torch.int8)),  # C_in mismatch
    ("output_padding", lambda a: [2, 0]),  # not smaller than the stride
    ("output_padding", lambda a: [-1, 0]),
    ("padding", lambda a: [4, 4]),  # empty output
    ("bias", lambda a: a["bias"][:2]),
    ("output_shift", lambda a: torch.full((5,), 31, dtype=torch.int32)),
])
def test_transpose_bad_arguments(arg, bad):
    args = _good_transpose()
    args[arg] = bad(args)
    with pytest.raises(CortenOpError, match=rf"quantized_conv_transpose2d.*'{arg}'"):
        transpose(**args)


def test_good_arguments_are_accepted():
    assert grouped(**_good_grouped()).shape == (1, 6, 5, 5)
    assert transpose(**_good_transpose()).shape == (1, 5, 6, 6)
