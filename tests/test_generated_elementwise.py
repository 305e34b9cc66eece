"""Corten's generated add / sub and average-pool kernels (``codegen/generated_elementwise.py``):
small models whose adds, subs and pools the generator takes, byte for byte against the reference
ops on the host (plain, DSP and Helium paths' C) and on QEMU Cortex-M4 / M55 (the real SXTAB16);
edge cases: odd element counts (the unrolled loop's tail), in-place adds, ReLU clamps, sub, channel
counts not a multiple of 4, more than 256 taps (the int32 path), divisor_override and
count_include_pad (the zero-point correction), strided pools; and the tables' arithmetic against
the op on every pair of int8 values."""
from __future__ import annotations

import functools
import warnings

import pytest
import torch
import torch.nn as nn

import corten
from conftest import HOST_CFLAGS, needs_gcc, needs_qemu
from corten.codegen import generated_elementwise as ge
from corten.ops._broadcast import PARAM_NAMES
from corten.ops.add import quantized_add
from corten.ops.sub import quantized_sub


class Residual(nn.Module):
    """conv -> (+ input, in place), relu; conv - conv; then the pools."""

    def __init__(self, c: int, pool: nn.Module):
        super().__init__()
        self.a = nn.Conv2d(c, c, 3, padding=1)
        self.b = nn.Conv2d(c, c, 1)
        self.pool = pool

    def forward(self, x):
        y = torch.relu(self.a(x) + x)
        z = self.b(y) - 0.5 * y
        return self.pool(z + y)


CASES = {
    # (channels, input H, W, pool)
    "global-c6": (6, 5, 7, nn.AdaptiveAvgPool2d(1)),            # 35 taps, 4 SIMD + 2 scalar channels
    "stride2-c3": (3, 6, 9, nn.AvgPool2d(2)),                   # only scalar channels (C < 4)
    "taps289-c8": (8, 17, 17, nn.AvgPool2d(17)),                # > 256 taps: int32 sums
    "override-c5": (5, 6, 6, nn.AvgPool2d(3, stride=2, divisor_override=7)),
    "include-pad-c12": (12, 4, 8, nn.AvgPool2d((2, 4), count_include_pad=True)),
}


@functools.lru_cache(maxsize=None)  # one compile per case for all its host and QEMU runs
def _compiled(case: str):
    torch.manual_seed(7)
    c, h, w, pool = CASES[case]
    model = Residual(c, pool).eval()
    ex = (torch.randn(2, c, h, w),)
    warnings.simplefilter("ignore")
    prog = corten.compile(model, ex, calibration=None, seed=0, name="elt")
    return prog, torch.randn(2, c, h, w, generator=torch.Generator().manual_seed(1)) * 1.5


def _check_choices(prog, target):
    steps = prog.kernel_choices("generated", target)
    for op in ("quantized_add", "quantized_sub", "quantized_avg_pool2d"):
        mine = [s for s in steps if s.op == op]
        assert mine and all(s.provider == "generated" and s.kernel.startswith("elt_gen_") for s in mine), (op, steps)


@needs_gcc
@pytest.mark.parametrize("target", ["cortex-m3", "cortex-m4", "cortex-m55"])
@pytest.mark.parametrize("case", list(CASES))
def test_generated_add_and_pool_on_host(case, target):
    prog, x = _compiled(case)
    _check_choices(prog, target)
    run = prog.c_run(x, on="host", kernels="generated", target=target, cflags=HOST_CFLAGS)
    assert all(torch.equal(a, b) for a, b in zip(run.outputs, prog.run_int8(x)))


@needs_qemu
@pytest.mark.parametrize("target", ["cortex-m4", "cortex-m55"])
@pytest.mark.parametrize("case", ["global-c6", "taps289-c8", "include-pad-c12"])
def test_generated_add_and_pool_on_qemu(case, target):
    prog, x = _compiled(case)
    run = prog.c_run(x, on="qemu", kernels="generated", target=target)
    assert all(torch.equal(a, b) for a, b in zip(run.outputs, prog.run_int8(x)))


def _params(rng: torch.Generator) -> dict:
    r = lambda lo, hi: int(torch.randint(lo, hi, (1,), generator=rng))  # noqa: E731
    return dict(input1_offset=r(-127, 129), input1_multiplier=r(1 << 30, 1 << 31), input1_shift=r(-12, 1),
                input2_offset=r(-127, 129), input2_multiplier=r(1 << 30, 1 << 31), input2_shift=r(-12, 1),
                left_shift=r(16, 23), output_offset=r(-128, 128), output_multiplier=r(1 << 30, 1 << 31),
                output_shift=r(-25, 2), activation_min=r(-128, 0), activation_max=r(0, 128))


@pytest.mark.parametrize("sign", [1, -1])
def test_add_tables_equal_the_op_on_every_pair(sign):
    """The tables' arithmetic (what the C computes) equals quantized_add / quantized_sub on all
    256 x 256 pairs of int8 values, for random parameters, including extreme shifts."""
    rng = torch.Generator().manual_seed(11)
    x1 = torch.arange(-128, 128, dtype=torch.int8).repeat_interleave(256).reshape(1, 256, 16, 16)
    x2 = torch.arange(-128, 128, dtype=torch.int8).repeat(256).reshape(1, 256, 16, 16)
    op = quantized_add if sign == 1 else quantized_sub
    for _ in range(20):
        v = _params(rng)
        want = op(x1, x2, *(v[k] for k in PARAM_NAMES))
        got = ge.add_reference(x1, x2, v, sign)
        assert torch.equal(got, want.contiguous()), v


def test_avg_pool_reason_refuses_padding_and_overhang():
    g = dict(padding=[1, 1], kernel=[3, 3], stride=[1, 1], h=5, w=5, ho=5, wo=5)
    assert "padded" in ge.avg_pool_reason(g)
    g = dict(padding=[0, 0], kernel=[2, 2], stride=[2, 2], h=5, w=5, ho=3, wo=3)
    assert "overhangs" in ge.avg_pool_reason(g)
    g = dict(padding=[0, 0], kernel=[2, 2], stride=[2, 2], h=5, w=5, ho=2, wo=2)
    assert ge.avg_pool_reason(g) is None
