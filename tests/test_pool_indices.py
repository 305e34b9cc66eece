"""Max-pool indices as a program output (``F.max_pool2d(..., return_indices=True)[1]``, ExecuTorch's
suite returns them): ``quantized_max_pool2d_indices`` against a naive window walk (ties included),
its index rule against torch's own indices on float values, the portable C kernel byte for byte on
the host and QEMU through whole programs."""
from __future__ import annotations

import random
import shutil
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import corten
from corten.ops.pool import max_pool_window_argmax, pool_out_size

OPS = torch.ops.corten
GEOMETRIES = [  # kernel, stride, padding, dilation, ceil_mode
    ((2, 2), (2, 2), (0, 0), (1, 1), False),
    ((3, 3), (2, 2), (1, 1), (1, 1), False),
    ((3, 2), (1, 2), (1, 0), (1, 1), True),
    ((2, 3), (2, 1), (0, 1), (2, 1), False),
    ((3, 3), (3, 3), (1, 1), (1, 1), True),
]


def naive_indices(x: torch.Tensor, kernel, stride, padding, dilation, ceil_mode) -> list:
    """Torch's rule written out: per (n, c, oy, ox) the first strictly larger tap in row-major order."""
    n, c, h, w = x.shape
    ho = pool_out_size(h, kernel[0], stride[0], padding[0], padding[0], dilation[0], ceil_mode)
    wo = pool_out_size(w, kernel[1], stride[1], padding[1], padding[1], dilation[1], ceil_mode)
    out = []
    for b in range(n):
        for ch in range(c):
            for oy in range(ho):
                for ox in range(wo):
                    best, at = None, None
                    for ky in range(kernel[0]):
                        for kx in range(kernel[1]):
                            iy = oy * stride[0] - padding[0] + ky * dilation[0]
                            ix = ox * stride[1] - padding[1] + kx * dilation[1]
                            if 0 <= iy < h and 0 <= ix < w and (best is None or x[b, ch, iy, ix] > best):
                                best, at = x[b, ch, iy, ix], iy * w + ix
                    out.append(at)
    return out


@pytest.mark.parametrize("geometry", GEOMETRIES, ids=lambda g: "k{}s{}p{}d{}{}".format(*g[:4], "c" * g[4]))
def test_reference_matches_naive_walk_with_ties(geometry):
    rng = random.Random(7)
    for _ in range(6):
        shape = (rng.randint(1, 2), rng.randint(1, 3), rng.randint(4, 8), rng.randint(4, 8))
        x = torch.randint(-3, 3, shape, dtype=torch.int8)  # few levels: many ties
        got = OPS.quantized_max_pool2d_indices(x.contiguous(memory_format=torch.channels_last), *map(list, geometry[:4]),
                                               geometry[4])
        assert got.dtype == torch.int32
        assert got.flatten().tolist() == naive_indices(x, *geometry)


@pytest.mark.parametrize("geometry", GEOMETRIES, ids=lambda g: "k{}s{}p{}d{}{}".format(*g[:4], "c" * g[4]))
def test_index_rule_is_torchs(geometry):
    """On float values (ties included) the window walk gives torch's own indices."""
    torch.manual_seed(0)
    for x in (torch.randn(2, 3, 7, 8), torch.randint(-2, 2, (1, 2, 6, 7)).float()):
        want = F.max_pool2d(x, *geometry, return_indices=True)[1]
        assert torch.equal(max_pool_window_argmax(x, *geometry), want)


class Pools(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)

    def forward(self, x):
        y = self.conv(x)
        values, indices = F.max_pool2d(y, 3, 2, 1, return_indices=True)
        return values, indices, F.max_pool2d(y, (3, 2), (1, 2), (1, 0), ceil_mode=True, return_indices=True)[1]


@pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")
def test_indices_are_program_outputs_byte_exact_in_c():
    warnings.simplefilter("ignore")
    torch.manual_seed(0)
    model = Pools().eval()
    calib = [(torch.randn(1, 3, 7, 9),) for _ in range(4)]
    prog = corten.compile(model, calib[0], calibration=calib)
    assert prog.unlowered_ops() == [] and prog.op_counts()["quantized_max_pool2d_indices"] == 2
    x = torch.randn(1, 3, 7, 9)
    want = prog.run_int8(x)
    assert [t.dtype for t in want] == [torch.int8, torch.int32, torch.int32]
    on = ("host", "qemu") if shutil.which("qemu-system-arm") and shutil.which("arm-none-eabi-gcc") else ("host",)
    for where in on:
        assert all(torch.equal(a, b) for a, b in zip(want, prog.c_run(x, on=where, target="cortex-m4").outputs))
    # the int8 maxima are float's except where rounding ties two taps (then the first one's index)
    ref = model(x)
    assert (prog.run(x)[1] == ref[1]).float().mean() > 0.9
