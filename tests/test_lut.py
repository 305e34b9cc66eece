"""``corten.quantized_lut`` and its table construction vs ``naive_lut.py``.

* the reference kernel against a naive element-by-element lookup (random tables and shapes,
  contiguous and channels_last);
* every lowered function: the table :func:`corten.ops.lut.build_table` makes from the ATen op (as
  the lowering does) against an independent float64 ``math`` implementation, for realistic and
  extreme quantization parameters, and the lookup through that table;
* the rounding (half away from zero, float64 quotient) and saturation, opcheck, argument errors.
"""
from __future__ import annotations

import math
import random

import pytest
import torch

import naive_lut
import op_cases as oc
from corten.ops import CortenOpError
from corten.ops.lut import build_table, input_values, real_function, round_half_away

KERNEL_CASES = 2000
TABLE_CASES_PER_FUNCTION = 50

lut = torch.ops.corten.quantized_lut
aten = torch.ops.aten


def _random_table(rng: random.Random) -> torch.Tensor:
    return torch.tensor([rng.randint(-128, 127) for _ in range(256)], dtype=torch.int8)


def _random_shape(rng: random.Random) -> tuple[int, ...]:
    rank = rng.choice((1, 2, 3, 4, 4, 4))
    return tuple(rng.randint(1, 5) for _ in range(rank))


# ----------------------------------------------------------------------------- the kernel
def test_kernel_matches_naive_lookup():
    rng = random.Random(9100)
    for i in range(KERNEL_CASES):
        table = _random_table(rng)
        x = oc.int8_tensor(rng, _random_shape(rng))
        if x.dim() == 4:
            x = oc.maybe_channels_last(rng, x)
        out = lut(x, table)
        assert out.dtype == torch.int8 and out.shape == x.shape
        expected = naive_lut.lookup(x.flatten().tolist(), table.tolist())
        assert out.flatten().tolist() == expected, f"case {i}"


@pytest.mark.parametrize("channels_last", [True, False])
def test_output_keeps_memory_format(channels_last):
    x = torch.randint(-128, 128, (1, 3, 4, 5), dtype=torch.int8)
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    x = x.contiguous(memory_format=fmt)
    table = torch.arange(127, -129, -1, dtype=torch.int8)  # q -> -1 - q
    out = lut(x, table)
    assert out.is_contiguous(memory_format=fmt)
    assert torch.equal(out, (-1 - x.to(torch.int32)).to(torch.int8))


def test_every_entry_is_reachable():
    """Input -128 reads entry 0 and input 127 entry 255: the table is not off by one."""
    table = torch.arange(-128, 128, dtype=torch.int8).flip(0)
    x = torch.arange(-128, 128, dtype=torch.int8)
    assert lut(x, table).tolist() == list(range(127, -129, -1))


def test_opcheck():
    rng = random.Random(9101)
    x = oc.int8_tensor(rng, (1, 4, 3, 3)).contiguous(memory_format=torch.channels_last)
    torch.library.opcheck(torch.ops.corten.quantized_lut.default, (x, _random_table(rng)))
    torch.library.opcheck(torch.ops.corten.quantized_lut.default, (oc.int8_tensor(rng, (2, 7)), _random_table(rng)))


@pytest.mark.parametrize("x, table, arg", [
    (torch.zeros(4, dtype=torch.int16), torch.zeros(256, dtype=torch.int8), "input"),
    (torch.zeros(4, dtype=torch.int8), torch.zeros(256, dtype=torch.int32), "table"),
    (torch.zeros(4, dtype=torch.int8), torch.zeros(255, dtype=torch.int8), "table"),
    (torch.zeros(4, dtype=torch.int8), torch.zeros(2, 128, dtype=torch.int8), "table"),
])
def test_bad_arguments_name_op_and_argument(x, table, arg):
    with pytest.raises(CortenOpError, match=rf"quantized_lut: argument '{arg}'"):
        lut(x, table)


# ----------------------------------------------------------------------------- table construction
class _Node:
    """The bits of an FX node :func:`real_function` reads: target, scalar args and kwargs."""

    def __init__(self, target, *args, **kwargs):
        self.target, self.args, self.kwargs, self.name = target, (None, *args), kwargs, str(target)


# (id, ATen node as the lowering sees it, the independent float64 function)
FUNCTIONS = [
    ("hardswish", _Node(aten.hardswish.default), naive_lut.hardswish),
    ("hardswish_", _Node(aten.hardswish_.default), naive_lut.hardswish),
    ("hardsigmoid", _Node(aten.hardsigmoid.default), naive_lut.hardsigmoid),
    ("sigmoid", _Node(aten.sigmoid.default), naive_lut.sigmoid),
    ("tanh", _Node(aten.tanh.default), math.tanh),
    ("silu", _Node(aten.silu.default), naive_lut.silu),
    ("silu_", _Node(aten.silu_.default), naive_lut.silu),
    ("gelu", _Node(aten.gelu.default), naive_lut.gelu),
    ("gelu_tanh", _Node(aten.gelu.default, approximate="tanh"), naive_lut.gelu_tanh),
    ("elu", _Node(aten.elu.default), naive_lut.elu(1.0)),
    ("elu_alpha_0.3", _Node(aten.elu.default, 0.3), naive_lut.elu(0.3)),
    ("elu_alpha_2.5_", _Node(aten.elu_.default, 2.5), naive_lut.elu(2.5)),
    ("leaky_relu", _Node(aten.leaky_relu.default), naive_lut.leaky_relu(0.01)),
    ("leaky_relu_0.2", _Node(aten.leaky_relu.default, 0.2), naive_lut.leaky_relu(0.2)),
    ("leaky_relu_-0.5_", _Node(aten.leaky_relu_.default, -0.5), naive_lut.leaky_relu(-0.5)),
    ("relu", _Node(aten.relu.default), naive_lut.relu),
    ("relu_", _Node(aten.relu_.default), naive_lut.relu),
    ("relu6", _Node(aten.relu6.default), naive_lut.relu6),
    ("hardtanh", _Node(aten.hardtanh.default), naive_lut.clamp(-1.0, 1.0)),
    ("hardtanh_0_6_", _Node(aten.hardtanh_.default, 0.0, 6.0), naive_lut.clamp(0.0, 6.0)),
    ("clamp_-1.5_2", _Node(aten.clamp.default, -1.5, 2.0), naive_lut.clamp(-1.5, 2.0)),
    ("clamp_min_only", _Node(aten.clamp.default, 0.25), naive_lut.clamp(0.25, None)),
    ("clamp_max_only_kw", _Node(aten.clamp.default, max=-0.5), naive_lut.clamp(None, -0.5)),
    ("clamp_3_7_", _Node(aten.clamp_.default, 3.0, 7.0), naive_lut.clamp(3.0, 7.0)),
]


def _qparams(rng: random.Random) -> tuple[float, int]:
    """Realistic (scale 2**U(-9, 0)) or extreme scales and zero points."""
    if rng.random() < 0.7:
        return 2.0 ** rng.uniform(-9, 0), rng.randint(-128, 127)
    scale = rng.choice((1e-6, 2.0**-20, 1.0 / 3.0, 0.5, 1.0, 7.3, 100.0, 2.0**10, rng.uniform(1e-4, 1e3)))
    return scale, rng.choice((-128, 127, 0, rng.randint(-128, 127)))


@pytest.mark.parametrize("fid, node, reference", FUNCTIONS, ids=[f[0] for f in FUNCTIONS])
def test_table_matches_float64_reference(fid, node, reference):
    rng = random.Random(f"lut-{fid}")
    fn = real_function(node)
    for i in range(TABLE_CASES_PER_FUNCTION):
        (s_in, zp_in), (s_out, zp_out) = _qparams(rng), _qparams(rng)
        table = build_table(fn, s_in, zp_in, s_out, zp_out)
        expected = naive_lut.table(reference, s_in, zp_in, s_out, zp_out)
        assert table.dtype == torch.int8 and table.shape == (256,)
        assert table.tolist() == expected, f"case {i}: s_in={s_in!r} zp_in={zp_in} s_out={s_out!r} zp_out={zp_out}"
        # and the lookup through it, on a random tensor
        x = oc.int8_tensor(rng, (1, 2, 3, 3)).contiguous(memory_format=torch.channels_last)
        assert lut(x, table).flatten().tolist() == naive_lut.lookup(x.flatten().tolist(), expected)


def test_rounding_is_half_away_from_zero():
    """hardtanh(-200, 200) with s_in = 1, s_out = 2: q -> q / 2 has exact ties at odd q; they round
    away from zero (2.5 -> 3, -0.5 -> -1), not to even as torch.round / fake-quantize would."""
    table = build_table(real_function(_Node(aten.hardtanh.default, -200.0, 200.0)), 1.0, 0, 2.0, 0)
    got = {q: int(table[q + 128]) for q in (-5, -3, -1, 1, 3, 5, 4, -4)}
    assert got == {-5: -3, -3: -2, -1: -1, 1: 1, 3: 2, 5: 3, 4: 2, -4: -2}
    half_even = torch.round(torch.tensor([-2.5, -1.5, -0.5, 0.5, 1.5, 2.5])).tolist()
    assert half_even != [got[q] for q in (-5, -3, -1, 1, 3, 5)]  # the test tells the two apart


def test_table_is_computed_one_element_at_a_time():
    """elu(alpha=2.5) at x = -36.9 is -2.4999999999999996 (scalar exp) but -2.5 in ATen's vectorised
    float64 kernel: with output scale 1 that is a tie.  The table takes the scalar value (entry -43,
    not -44) on every machine, whatever its SIMD width."""
    node = _Node(aten.elu.default, 2.5)
    s_in, zp_in = 0.6049727983294387, -51
    x = input_values(s_in, zp_in)
    assert float(real_function(node)(x)[16]) == -2.4999999999999996
    assert int(build_table(real_function(node), s_in, zp_in, 1.0, -41)[16]) == -43


def test_round_half_away_tensor():
    v = torch.tensor([-2.5, -1.5, -0.5, -0.49999999999999994, 0.0, 0.5, 1.5, 2.5, 2.4999999999999996],
                     dtype=torch.float64)
    assert round_half_away(v).tolist() == [-3, -2, -1, 0, 0, 1, 2, 3, 2]


def test_zero_point_shift_and_saturation():
    """The output zero point is added after rounding, then the value saturates to int8."""
    fn = real_function(_Node(aten.leaky_relu.default, 1.0))  # identity
    table = build_table(fn, 1.0, 0, 1.0, 100)
    assert table[128 + 27].item() == 127 and table[128 + 28].item() == 127 and table[128 - 100].item() == 0
    assert table[0].item() == -28
    table = build_table(fn, 1.0, 0, 1.0, -128)
    assert table[0].item() == -128 and table[255].item() == -1


def test_infinite_values_saturate_and_nan_is_refused():
    table = build_table(lambda x: torch.where(x > 0, math.inf, -math.inf), 1.0, 0, 1.0, 0)
    assert table[:129].tolist() == [-128] * 129 and table[129:].tolist() == [127] * 127
    with pytest.raises(ValueError, match="NaN"):
        build_table(lambda x: x * math.nan, 1.0, 0, 1.0, 0)
    with pytest.raises(ValueError, match="output scale"):
        build_table(torch.tanh, 1.0, 0, 0.0, 0)
    with pytest.raises(ValueError, match="input scale"):
        build_table(torch.tanh, -1.0, 0, 1.0, 0)


def test_input_values_are_the_dequantized_grid():
    v = input_values(0.25, -3)
    assert v.dtype == torch.float64 and v.shape == (256,)
    assert v[0].item() == 0.25 * (-128 + 3) and v[255].item() == 0.25 * (127 + 3)


def test_real_function_refuses_tensor_arguments():
    from torch.fx import Graph

    from corten.errors import LoweringError

    g = Graph()
    x, lo = g.placeholder("x"), g.placeholder("lo")
    node = g.call_function(aten.clamp.default, (x, lo))
    with pytest.raises(LoweringError, match="only constant"):
        real_function(node)
    with pytest.raises(LoweringError, match="without min or max"):
        real_function(g.call_function(aten.clamp.default, (x,)))
