"""Banded (row-tile) schedules: asymmetric conv padding, in-place cat, the banding rewrite and the
budget-driven search (corten.memory.banding)."""
from __future__ import annotations

import pytest
import torch

import corten  # noqa: F401  (registers the corten:: ops)


def _rand(shape, gen, lo=-128, hi=128, dtype=torch.int8):
    return torch.randint(lo, hi, shape, dtype=dtype, generator=gen)


@pytest.mark.parametrize("pad", [[0, 1, 2, 1], [2, 0, 0, 1], [1, 1, 1, 1], [0, 0, 1, 0]])
@pytest.mark.parametrize("stride", [1, 2])
def test_asymmetric_conv_padding_equals_explicitly_padded_input(pad, stride):
    """[top, left, bottom, right] padding == the input padded with its zero point, unpadded conv."""
    g = torch.Generator().manual_seed(sum(pad) * 7 + stride)
    cl = torch.channels_last
    x = _rand((1, 5, 9, 7), g).contiguous(memory_format=cl)
    w, wd = _rand((6, 3, 3, 5), g), _rand((1, 3, 3, 5), g)
    b = _rand((6,), g, -1000, 1000, torch.int32)
    m, sh = torch.full((6,), 1 << 30, dtype=torch.int32), torch.full((6,), -6, dtype=torch.int32)
    zp = -3  # input_offset 3
    xp = torch.nn.functional.pad(x.to(torch.int32), (pad[1], pad[3], pad[0], pad[2]), value=zp)
    xp = xp.to(torch.int8).contiguous(memory_format=cl)
    conv, dw = torch.ops.corten.quantized_conv2d, torch.ops.corten.quantized_depthwise_conv2d
    y = conv(x, w, b, [stride] * 2, pad, [1, 1], 3, -2, m, sh, -128, 127)
    assert torch.equal(y, conv(xp, w, b, [stride] * 2, [0, 0], [1, 1], 3, -2, m, sh, -128, 127))
    yd = dw(x, wd, b[:5], [stride] * 2, pad, [1, 1], 1, 3, -2, m[:5], sh[:5], -128, 127)
    assert torch.equal(yd, dw(xp, wd, b[:5], [stride] * 2, [0, 0], [1, 1], 1, 3, -2, m[:5], sh[:5], -128, 127))
