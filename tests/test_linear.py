"""``corten.quantized_linear`` reference kernel and ``kernel_sum`` vs ``naive.py``.

The op takes CMSIS-NN's Helium-path ``kernel_sum`` (``arm_vector_sum_s8``) instead of a bias; the
scalar/DSP C path adds the bias and the input offset in the loop instead.  Both C formulations are
modelled naively and the op must equal both (they agree modulo 2**32, which is what int32 wraps).

Case counts in the default run: LINEAR_CASES random fully connected layers (batch <= 3,
in_features <= 24, out_features <= 8) in CHUNKS seeded chunks.
"""
from __future__ import annotations

import random

import pytest
import torch

import naive
import op_cases as oc
from corten.ops import CortenOpError
from corten.ops.linear import kernel_sum

LINEAR_CASES = 3000
CHUNKS = 3

linear = torch.ops.corten.quantized_linear


def _random_linear(rng: random.Random) -> dict:
    batch, k, n_out = rng.randint(1, 3), rng.randint(1, 24), rng.randint(1, 8)
    mult, shift, _ = oc.per_channel(rng, n_out, log2_lo=-12.0, log2_hi=-4.0)
    return dict(x=oc.int8_tensor(rng, (batch, k)), w=oc.int8_tensor(rng, (n_out, k)), bias=oc.bias_list(rng, n_out),
                input_offset=oc.input_offset(rng), output_offset=oc.output_offset(rng), mult=mult, shift=shift,
                act=oc.activation_range(rng))


def _args(case, ksum: torch.Tensor):
    m, s = oc.qparam_tensors(case["mult"], case["shift"])
    return (case["x"], case["w"], ksum, case["input_offset"], case["output_offset"], m, s, *case["act"])


@pytest.mark.parametrize("chunk", range(CHUNKS))
def test_linear_matches_naive(chunk):
    rng = random.Random(4000 + chunk)
    for i in range(LINEAR_CASES // CHUNKS):
        case = _random_linear(rng)
        w = case["w"].tolist()
        n_out = len(w)
        mult, shift = oc.expand(case["mult"], n_out), oc.expand(case["shift"], n_out)
        naive_ksum = naive.vector_sum(w, case["bias"], case["input_offset"])
        ksum = kernel_sum(case["w"], oc.bias_tensor(case["bias"]), case["input_offset"])
        assert ksum.dtype == torch.int32 and ksum.tolist() == naive_ksum, f"kernel_sum, case {i}"
        out = linear(*_args(case, ksum))
        assert out.dtype == torch.int8 and out.shape == (case["x"].shape[0], n_out)
        expected = naive.fully_connected(case["x"].tolist(), w, case["bias"], case["input_offset"],
                                         case["output_offset"], mult, shift, *case["act"])
        helium = naive.fully_connected_with_kernel_sum(case["x"].tolist(), w, naive_ksum, case["output_offset"],
                                                       mult, shift, *case["act"])
        assert expected == helium
        assert out.tolist() == expected, f"case {i} of chunk {chunk}: {case}"


def test_linear_batched_leading_dims():
    """Leading dimensions are batch: [2, 3, K] behaves as 6 rows."""
    rng = random.Random(8)
    case = _random_linear(rng)
    k = case["w"].shape[1]
    x = oc.int8_tensor(rng, (2, 3, k))
    ksum = kernel_sum(case["w"], oc.bias_tensor(case["bias"]), case["input_offset"])
    out = linear(x, *_args(case, ksum)[1:])
    flat = linear(x.reshape(6, k), *_args(case, ksum)[1:])
    assert out.shape == (2, 3, case["w"].shape[0]) and torch.equal(out.reshape(6, -1), flat)


def test_linear_accumulator_wraps_like_int32():
    w = torch.full((1, 4), 127, dtype=torch.int8)
    x = torch.full((1, 4), 127, dtype=torch.int8)
    ksum = torch.tensor([2**31 - 1], dtype=torch.int32)
    m, s = oc.qparam_tensors([2**30], [-24])
    out = linear(x, w, ksum, 0, 0, m, s, -128, 127)
    expected = naive.fully_connected_with_kernel_sum(x.tolist(), w.tolist(), [2**31 - 1], 0, [2**30], [-24], -128, 127)
    assert expected == [[-64]]  # 2**31 - 1 + 64516 wraps to -2**31 + 64515; +64 without the wrap
    assert out.tolist() == expected


@pytest.mark.parametrize("seed", range(3))
def test_opcheck_linear(seed):
    rng = random.Random(seed)
    case = _random_linear(rng)
    ksum = kernel_sum(case["w"], oc.bias_tensor(case["bias"]), case["input_offset"])
    torch.library.opcheck(linear.default, _args(case, ksum))


def _good():
    return dict(input=torch.zeros((2, 5), dtype=torch.int8), weight=torch.zeros((3, 5), dtype=torch.int8),
                kernel_sum=torch.zeros(3, dtype=torch.int32), input_offset=0, output_offset=0,
                output_multiplier=torch.full((3,), 2**30, dtype=torch.int32),
                output_shift=torch.zeros(3, dtype=torch.int32), activation_min=-128, activation_max=127)


@pytest.mark.parametrize("arg, value", [
    ("input", torch.zeros((2, 5), dtype=torch.uint8)),
    ("input", torch.zeros((2, 4), dtype=torch.int8)),
    ("weight", torch.zeros((3, 5), dtype=torch.int32)),
    ("weight", torch.zeros((3, 5, 1), dtype=torch.int8)),
    ("kernel_sum", torch.zeros(3, dtype=torch.int64)),
    ("kernel_sum", torch.zeros(2, dtype=torch.int32)),
    ("input_offset", 129),
    ("input_offset", -128),
    ("output_offset", 128),
    ("output_multiplier", {"output_multiplier": torch.full((2,), 2**30, dtype=torch.int32),
                           "output_shift": torch.zeros(2, dtype=torch.int32)}),
    ("output_multiplier", torch.full((3,), 5, dtype=torch.int32)),
    ("output_multiplier", torch.full((3,), 2**30, dtype=torch.int64)),
    ("output_shift", torch.full((3,), 31, dtype=torch.int32)),
    ("output_shift", torch.zeros(1, dtype=torch.int32)),
    ("activation_min", 100),
    ("activation_max", 200),
])
def test_linear_bad_arguments(arg, value):
    args = _good()
    if isinstance(value, dict):  # several consistent overrides
        args.update(value)
    else:
        args[arg] = value
    if arg == "activation_min":
        args["activation_max"] = 50
    with pytest.raises(CortenOpError, match=rf"quantized_linear.*'{arg}'"):
        linear(**args)


def test_linear_good_arguments_are_accepted():
    assert linear(**_good()).tolist() == [[0, 0, 0], [0, 0, 0]]
