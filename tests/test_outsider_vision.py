"""Vision models for microcontrollers written the way other people write them (tests/outsider_vision_models.py:
RepVGG / MobileOne in train-time form, GhostNetV2, MnasNet and lukemelas' EfficientNet,
RegNetY, DenseNet, SqueezeNet, ShuffleNetV2, a YOLOv5/v8 backbone + neck + Detect head, FPN, UNets,
ESPCN, DeepLab's ASPP, PSPNet, Inception's 1x7/7x1, pix2pix padding, ResNet-D, BlazeFace, FOMO, NanoDet,
SSD, FCOS, CBAM / coordinate attention / non-local / GCNet / SKNet, GeM, CoordConv, BlurPool, spatial softmax,
LRN, spectral / weight norm, a torch.fx-traced module, BatchNorm with batch statistics, a -inf padded
max pool, argmax / bool outputs, two inputs, ...).  Each is compiled with N(0, 1) calibration,
must be fully lowered, byte-exact in host C (portable kernels) and close to the float model (cosine
>= 0.95 per output).  What cannot be compiled (data-dependent addresses, input-dependent weights) is
refused with the op, this file's line, the reason and what to write instead.
"""
from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

import corten
from conftest import HOST_CFLAGS, needs_gcc
from corten.errors import QuantizationWarning, UnsupportedOpsError
from model_checks import assert_c_bytes_equal, assert_close_to_float, seeded_samples
from outsider_vision_models import VISION, build

SHAPES = {name: shape for name, _, shape in VISION}
# name -> words the refusal must contain (besides the op and the source line)
REFUSED = {
    "segnet_max_unpool": ["max_unpool2d", "addresses computed from the data", "nn.Upsample"],
    "spatial_transformer": ["grid_sample", "positions computed from the data", "outside the compiled model"],
    "condconv_dynamic_weights": ["computed in forward", "constant weights only", "mix their outputs"],
}
COMPILED = [name for name, _, _ in VISION if name not in REFUSED]


def _samples(name):
    """(example inputs, 4 calibration samples), N(0, 1); an entry's shape is one input's or a list of them."""
    return seeded_samples(SHAPES[name] if isinstance(SHAPES[name], list) else [SHAPES[name]], 4)


@pytest.fixture(scope="module")
def compiled():
    """name -> (model, input, program), compiled once for the tests of this module."""
    cache = {}

    def get(name):
        if name not in cache:
            model = build(name)
            xs, calibration = _samples(name)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", QuantizationWarning)  # (e.g. PSPNet's dead ReLU branch)
                cache[name] = (model, xs, corten.compile(model, xs, calibration=calibration, name="vision"))
        return cache[name]
    return get


def test_the_set_is_broad():
    assert len(COMPILED) >= 60 and len(set(SHAPES)) == len(VISION)


@needs_gcc
@pytest.mark.parametrize("name", COMPILED)
def test_lowered_byte_exact_in_c_and_close_to_float(compiled, name):
    model, xs, prog = compiled(name)
    assert prog.unlowered_ops() == [], prog.operator_table()
    assert_c_bytes_equal(prog, xs, HOST_CFLAGS)  # (-O0: the same C, built faster)
    assert_close_to_float(model, xs, prog, name)


@pytest.mark.parametrize("name", list(REFUSED))
def test_what_cannot_compile_is_refused_with_op_line_reason_and_what_to_do(name):
    xs, calibration = _samples(name)
    with pytest.raises(UnsupportedOpsError) as e:
        corten.compile(build(name), xs, calibration=calibration)
    msg = str(e.value)
    assert "outsider_vision_models.py:" in msg, msg
    assert "<unknown source>" not in msg, msg  # (no stray quantize node of the weight listed)
    for word in REFUSED[name]:
        assert word in msg, (word, msg)


class Reductions(nn.Module):
    """CBAM's channel pool and the other max / min reductions over dims."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 6, 3, padding=1)

    def forward(self, x):
        y = self.conv(x)
        return torch.max(y, 1)[0] + y.amin(dim=(2, 3), keepdim=True).mean(1), y.max(dim=-1).values


def test_max_and_min_reductions_raise_no_multiplier_underflow_warning():
    """A max/min quantized_reduce has no requantization (multiplier 0 is a placeholder): validation
    must not report it as an underflow (Hook.UNUSED_ARGS)."""
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(2)
    x = torch.randn(1, 3, 6, 6, generator=g)
    with warnings.catch_warnings():
        warnings.simplefilter("error", QuantizationWarning)
        prog = corten.compile(Reductions().eval(), (x,), calibration=[(torch.randn(1, 3, 6, 6, generator=g),)
                                                                     for _ in range(4)])
    assert prog.op_counts()["quantized_reduce"] >= 2 and prog.unlowered_ops() == []
