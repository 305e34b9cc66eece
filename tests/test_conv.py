"""``corten.quantized_conv2d`` / ``quantized_depthwise_conv2d`` reference kernels vs ``naive.py``.

Case counts in the default run: CONV2D_CASES random convolutions and DEPTHWISE_CASES random
depthwise convolutions (shapes <= 6x6 spatial, <= 4 channels), each in CHUNKS seeded chunks.
"""
from __future__ import annotations

import random

import pytest
import torch

import naive
import op_cases as oc
from corten.ops import CortenOpError

CONV2D_CASES = 2400
DEPTHWISE_CASES = 2400
CHUNKS = 4

conv2d = torch.ops.corten.quantized_conv2d
depthwise = torch.ops.corten.quantized_depthwise_conv2d


def _geometry(rng: random.Random):
    """Random kernel/stride/padding/dilation and an input size with at least one output pixel."""
    kh, kw = rng.randint(1, 3), rng.randint(1, 3)
    stride = [rng.randint(1, 3), rng.randint(1, 3)]
    dilation = [rng.choice((1, 1, 2, 3)), rng.choice((1, 1, 2, 3))]
    padding = [rng.randint(0, 2), rng.randint(0, 2)]
    h_min = max(1, dilation[0] * (kh - 1) + 1 - 2 * padding[0])
    w_min = max(1, dilation[1] * (kw - 1) + 1 - 2 * padding[1])
    h, w = rng.randint(h_min, max(h_min, 6)), rng.randint(w_min, max(w_min, 6))
    return kh, kw, stride, padding, dilation, h, w


def _random_conv2d(rng: random.Random) -> dict:
    kh, kw, stride, padding, dilation, h, w = _geometry(rng)
    n, c_in, c_out = rng.choice((1, 1, 1, 2)), rng.randint(1, 4), rng.randint(1, 4)
    mult, shift, _ = oc.per_channel(rng, c_out)
    lo, hi = oc.activation_range(rng)
    return dict(input=oc.int8_tensor(rng, (n, c_in, h, w)), weight=oc.int8_tensor(rng, (c_out, kh, kw, c_in)),
                bias=oc.bias_list(rng, c_out), stride=stride, padding=padding, dilation=dilation,
                input_offset=oc.input_offset(rng), output_offset=oc.output_offset(rng),
                mult=mult, shift=shift, act=(lo, hi))


def _random_depthwise(rng: random.Random) -> dict:
    kh, kw, stride, padding, dilation, h, w = _geometry(rng)
    n, c_in, ch_mult = rng.choice((1, 1, 1, 2)), rng.randint(1, 4), rng.choice((1, 1, 2, 3, 4))
    c_out = c_in * ch_mult
    mult, shift, _ = oc.per_channel(rng, c_out, log2_lo=-10.0, log2_hi=-2.0)
    lo, hi = oc.activation_range(rng)
    return dict(input=oc.int8_tensor(rng, (n, c_in, h, w)), weight=oc.int8_tensor(rng, (1, kh, kw, c_out)),
                bias=oc.bias_list(rng, c_out), stride=stride, padding=padding, dilation=dilation, ch_mult=ch_mult,
                input_offset=oc.input_offset(rng), output_offset=oc.output_offset(rng),
                mult=mult, shift=shift, act=(lo, hi))


def _run_conv2d(rng, case):
    m, s = oc.qparam_tensors(case["mult"], case["shift"])
    return conv2d(oc.maybe_channels_last(rng, case["input"]), case["weight"], oc.bias_tensor(case["bias"]),
                  case["stride"], case["padding"], case["dilation"], case["input_offset"], case["output_offset"],
                  m, s, *case["act"])


def _naive_conv2d(case):
    c_out = case["weight"].shape[0]
    return naive.conv2d(oc.nhwc_list(case["input"]), case["weight"].tolist(), case["bias"], case["stride"],
                        case["padding"], case["dilation"], case["input_offset"], case["output_offset"],
                        oc.expand(case["mult"], c_out), oc.expand(case["shift"], c_out), *case["act"])


def _run_depthwise(rng, case):
    m, s = oc.qparam_tensors(case["mult"], case["shift"])
    return depthwise(oc.maybe_channels_last(rng, case["input"]), case["weight"], oc.bias_tensor(case["bias"]),
                     case["stride"], case["padding"], case["dilation"], case["ch_mult"], case["input_offset"],
                     case["output_offset"], m, s, *case["act"])


def _naive_depthwise(case):
    c_out = case["weight"].shape[3]
    return naive.depthwise_conv2d(oc.nhwc_list(case["input"]), case["weight"][0].tolist(), case["bias"],
                                  case["stride"], case["padding"], case["dilation"], case["ch_mult"],
                                  case["input_offset"], case["output_offset"], oc.expand(case["mult"], c_out),
                                  oc.expand(case["shift"], c_out), *case["act"])


def _describe(case) -> str:
    return {k: (tuple(v.shape) if isinstance(v, torch.Tensor) else v) for k, v in case.items()}.__repr__()


@pytest.mark.parametrize("chunk", range(CHUNKS))
def test_conv2d_matches_naive(chunk):
    rng = random.Random(1000 + chunk)
    for i in range(CONV2D_CASES // CHUNKS):
        case = _random_conv2d(rng)
        out = _run_conv2d(rng, case)
        assert out.dtype == torch.int8 and oc.is_channels_last(out)
        assert oc.nhwc_list(out) == _naive_conv2d(case), f"case {i} of chunk {chunk}: {_describe(case)}"


@pytest.mark.parametrize("chunk", range(CHUNKS))
def test_depthwise_matches_naive(chunk):
    rng = random.Random(2000 + chunk)
    for i in range(DEPTHWISE_CASES // CHUNKS):
        case = _random_depthwise(rng)
        out = _run_depthwise(rng, case)
        assert out.dtype == torch.int8 and oc.is_channels_last(out)
        assert oc.nhwc_list(out) == _naive_depthwise(case), f"case {i} of chunk {chunk}: {_describe(case)}"


def test_conv2d_pointwise_and_large_channels():
    """The 1x1 fast path and a larger channel count (longer dot products) still match."""
    rng = random.Random(3)
    for _ in range(20):
        case = _random_conv2d(rng)
        c_in, c_out = rng.randint(8, 40), rng.randint(1, 6)
        case["input"] = oc.int8_tensor(rng, (1, c_in, 3, 3))
        case["weight"] = oc.int8_tensor(rng, (c_out, 1, 1, c_in))
        case.update(stride=[1, 1], padding=[0, 0], dilation=[1, 1], bias=oc.bias_list(rng, c_out),
                    mult=oc.expand(case["mult"][:1], c_out), shift=oc.expand(case["shift"][:1], c_out))
        assert oc.nhwc_list(_run_conv2d(rng, case)) == _naive_conv2d(case)


def test_conv2d_accumulator_wraps_like_int32():
    """A bias at INT32_MAX plus a positive dot product wraps in C; the reference must wrap too."""
    x = torch.full((1, 1, 1, 1), 127, dtype=torch.int8)
    w = torch.full((1, 1, 1, 1), 127, dtype=torch.int8)
    bias = torch.tensor([2**31 - 1], dtype=torch.int32)
    m, s = oc.qparam_tensors([2**30], [-24])
    out = conv2d(x, w, bias, [1, 1], [0, 0], [1, 1], 128, 0, m, s, -128, 127)
    # acc = 2**31 - 1 + 255 * 127 wraps to -2**31 + 32384; times 2**-25 that is -64 (+64 without the wrap).
    expected = naive.conv2d([[[[127]]]], [[[[127]]]], [2**31 - 1], [1, 1], [0, 0], [1, 1], 128, 0,
                            [2**30], [-24], -128, 127)
    assert expected == [[[[-64]]]]
    assert oc.nhwc_list(out) == expected


# ----------------------------------------------------------------------------- opcheck
def _sample_conv2d_args(seed):
    rng = random.Random(seed)
    case = _random_conv2d(rng)
    m, s = oc.qparam_tensors(case["mult"], case["shift"])
    return (case["input"].contiguous(memory_format=torch.channels_last), case["weight"],
            oc.bias_tensor(case["bias"]), case["stride"], case["padding"], case["dilation"],
            case["input_offset"], case["output_offset"], m, s, *case["act"])


def _sample_depthwise_args(seed):
    rng = random.Random(seed)
    case = _random_depthwise(rng)
    m, s = oc.qparam_tensors(case["mult"], case["shift"])
    return (case["input"].contiguous(memory_format=torch.channels_last), case["weight"],
            oc.bias_tensor(case["bias"]), case["stride"], case["padding"], case["dilation"], case["ch_mult"],
            case["input_offset"], case["output_offset"], m, s, *case["act"])


@pytest.mark.parametrize("seed", range(3))
def test_opcheck_conv2d(seed):
    torch.library.opcheck(conv2d.default, _sample_conv2d_args(seed))


@pytest.mark.parametrize("seed", range(3))
def test_opcheck_depthwise(seed):
    torch.library.opcheck(depthwise.default, _sample_depthwise_args(seed))


def test_fake_kernel_shape_and_layout():
    from torch._subclasses.fake_tensor import FakeTensorMode

    args = _sample_conv2d_args(11)
    real = conv2d(*args)
    with FakeTensorMode() as mode:
        fake_args = [mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args]
        fake = conv2d(*fake_args)
    assert fake.shape == real.shape and fake.dtype == torch.int8 and oc.is_channels_last(fake)


# ----------------------------------------------------------------------------- bad arguments
def _good_conv2d_args():
    x = torch.zeros((1, 2, 5, 5), dtype=torch.int8)
    w = torch.zeros((3, 3, 3, 2), dtype=torch.int8)
    return dict(input=x, weight=w, bias=torch.zeros(3, dtype=torch.int32), stride=[1, 1], padding=[1, 1],
                dilation=[1, 1], input_offset=0, output_offset=0,
                output_multiplier=torch.full((3,), 2**30, dtype=torch.int32),
                output_shift=torch.zeros(3, dtype=torch.int32), activation_min=-128, activation_max=127)


def _good_depthwise_args():
    args = _good_conv2d_args()
    args["weight"] = torch.zeros((1, 3, 3, 4), dtype=torch.int8)
    args["bias"] = torch.zeros(4, dtype=torch.int32)
    args["output_multiplier"] = torch.full((4,), 2**30, dtype=torch.int32)
    args["output_shift"] = torch.zeros(4, dtype=torch.int32)
    return {**{k: v for k, v in args.items() if k not in ("input_offset",)}, "depth_multiplier": 2,
            "input_offset": 0}


COMMON_BAD = [
    ("input", lambda a: a["input"].to(torch.int32)),  # (int16 inputs are the 16x8 path: tests/test_int16.py)
    ("input", lambda a: a["input"][0]),
    ("weight", lambda a: a["weight"].to(torch.float32)),
    ("bias", lambda a: a["bias"].to(torch.int64)),
    ("bias", lambda a: a["bias"][:1]),
    ("stride", lambda a: [0, 1]),
    ("stride", lambda a: [1]),
    ("padding", lambda a: [-1, 0]),
    ("dilation", lambda a: [1, 0]),
    ("input_offset", lambda a: 129),
    ("input_offset", lambda a: -128),
    ("output_offset", lambda a: 128),
    ("output_offset", lambda a: -129),
    ("output_multiplier", lambda a: a["output_multiplier"].to(torch.int64)),
    ("output_multiplier", lambda a: {"output_multiplier": torch.full((2,), 2**30, dtype=torch.int32),
                                     "output_shift": torch.zeros(2, dtype=torch.int32)}),
    ("output_multiplier", lambda a: torch.full_like(a["output_multiplier"], 2**30 - 1)),
    ("output_multiplier", lambda a: torch.full_like(a["output_multiplier"], -(2**30))),
    ("output_shift", lambda a: torch.full_like(a["output_shift"], 31)),
    ("output_shift", lambda a: torch.full_like(a["output_shift"], -32)),
    ("output_shift", lambda a: a["output_shift"][:1]),
    ("activation_min", lambda a: 10),  # with activation_max lowered to 5 below
    ("activation_min", lambda a: -129),
    ("activation_max", lambda a: 128),
]


def _apply_bad(args, arg, make):
    """``make(args)`` gives the bad value of ``arg``, or a dict of several consistent overrides."""
    args = dict(args)
    bad = make(args)
    if isinstance(bad, dict):
        args.update(bad)
    else:
        args[arg] = bad
    if arg == "activation_min" and args[arg] == 10:
        args["activation_max"] = 5
    return args


@pytest.mark.parametrize("arg, make", COMMON_BAD + [
    ("weight", lambda a: torch.zeros((3, 3, 3, 5), dtype=torch.int8)),  # C_in mismatch
    ("input", lambda a: {"input": torch.zeros((1, 2, 1, 1), dtype=torch.int8), "padding": [0, 0]}),  # < kernel
])
def test_conv2d_bad_arguments(arg, make):
    args = _apply_bad(_good_conv2d_args(), arg, make)
    with pytest.raises(CortenOpError, match=rf"quantized_conv2d.*'{arg}'"):
        conv2d(**args)


@pytest.mark.parametrize("arg, make", COMMON_BAD + [
    ("weight", lambda a: {"weight": torch.zeros((1, 3, 3, 5), dtype=torch.int8), "bias": None,  # C_out != C_in * mult
                          "output_multiplier": a["output_multiplier"][:1], "output_shift": a["output_shift"][:1]}),
    ("weight", lambda a: torch.zeros((2, 3, 3, 4), dtype=torch.int8)),   # leading dim must be 1
    ("depth_multiplier", lambda a: 0),
])
def test_depthwise_bad_arguments(arg, make):
    args = _apply_bad(_good_depthwise_args(), arg, make)
    with pytest.raises(CortenOpError, match=rf"quantized_depthwise_conv2d.*'{arg}'"):
        depthwise(**args)


def test_good_arguments_are_accepted():
    assert conv2d(**_good_conv2d_args()).shape == (1, 3, 5, 5)
    assert depthwise(**_good_depthwise_args()).shape == (1, 4, 5, 5)
