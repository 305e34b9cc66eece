"""Idioms of models written by other people (issue 21), written from their patterns, not copied:
in-place writes into views (GhostNet's ``+=`` on a sliced cat), no-op dtype code (EfficientViT's
disabled autocast and float32 casts), ``x + 0`` (MobileOne's ``identity_out = 0``).  Each lowers
fully, is byte-exact in C on the host and raises no QuantizationWarning; what cannot be made
functional is refused with the reason and what to write instead."""
from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

import corten
from conftest import needs_gcc
from corten.errors import QuantizationWarning, UnsupportedOpsError


def _calib(shape, n=4, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(shape, generator=g),) for _ in range(n)]


def _compile_quietly(model, shape, **kw):
    """Compile with real (random-normal) calibration data; no QuantizationWarning may fire."""
    x = torch.randn(shape, generator=torch.Generator().manual_seed(0))
    with warnings.catch_warnings():
        warnings.simplefilter("error", QuantizationWarning)
        prog = corten.compile(model.eval(), (x,), calibration=_calib(shape), **kw)
    return prog, x


def _assert_lowered_and_byte_exact(prog, x, model, tol=0.15):
    assert prog.unlowered_ops() == [], prog.unlowered_ops()
    want = prog.run_int8(x)
    run = prog.c_run(x, kernels="portable")
    assert all(torch.equal(a, b) for a, b in zip(want, run.outputs))
    with torch.no_grad():
        ref = model(x)
    got = prog.run(x)
    for r, g in zip(ref if isinstance(ref, tuple) else (ref,), got if isinstance(got, tuple) else (got,)):
        assert (r - g).abs().max() <= tol * max(1.0, r.abs().max().item()), (r - g).abs().max()


# ----------------------------------------------------------------------------- in-place writes into views
class GhostLike(nn.Module):
    """A ghost module: a primary conv, a cheap depthwise conv of its output, both concatenated and
    cut to the output width, then ``+=`` of the shortcut onto that slice."""

    def __init__(self, c_in=4, c_out=6):
        super().__init__()
        init = (c_out + 1) // 2
        self.out_chs = c_out
        self.primary = nn.Sequential(nn.Conv2d(c_in, init, 1), nn.BatchNorm2d(init), nn.ReLU(inplace=True))
        self.cheap = nn.Sequential(nn.Conv2d(init, init, 3, padding=1, groups=init), nn.BatchNorm2d(init),
                                   nn.ReLU(inplace=True))
        self.shortcut = nn.Sequential(nn.Conv2d(c_in, c_out, 1), nn.BatchNorm2d(c_out))

    def forward(self, x):
        shortcut = x
        x1 = self.primary(x)
        x2 = self.cheap(x1)
        out = torch.cat([x1, x2], dim=1)[:, :self.out_chs]
        out += self.shortcut(shortcut)
        return out


class SliceWrites(nn.Module):
    """``+=``/``*=``/``relu_`` onto a full-range slice, a partial slice, a select, a ``.view()`` and a
    transpose, each base read afterwards (its new value is written back)."""

    def __init__(self, kind: str):
        super().__init__()
        self.kind = kind
        self.conv = nn.Conv2d(3, 4, 1)
        self.other = nn.Conv2d(3, 4, 1)

    def forward(self, x):
        y = self.conv(x)
        z = self.other(x)
        if self.kind == "full_slice":
            v = y[:, :]
            v += z
        elif self.kind == "partial_slice":
            y[:, 1:3] += z[:, :2]
        elif self.kind == "select":
            y[:, 2] *= 0.5
        elif self.kind == "view":
            v = y.view(1, 4, -1)
            v += z.view(1, 4, -1)
        elif self.kind == "transpose":
            y.transpose(2, 3).relu_()
        elif self.kind == "slice_of_slice":
            y[:, 1:][:, :, :2] += 1.0
        return y * 2


@needs_gcc
def test_ghost_module_in_place_add_onto_a_sliced_cat():
    torch.manual_seed(0)
    model = GhostLike()
    prog, x = _compile_quietly(model, (1, 4, 8, 8))
    assert prog.op_counts().get("quantized_add") == 1
    _assert_lowered_and_byte_exact(prog, x, model)


@needs_gcc
@pytest.mark.parametrize("kind", ["full_slice", "partial_slice", "select", "view", "transpose", "slice_of_slice"])
def test_in_place_write_into_a_view_is_functional(kind):
    torch.manual_seed(0)
    model = SliceWrites(kind).eval()
    prog, x = _compile_quietly(model, (1, 3, 5, 5))
    _assert_lowered_and_byte_exact(prog, x, model)


class StridedWrite(nn.Module):
    def forward(self, x):
        y = x * 2
        y[:, ::2] += 1.0  # a step-2 slice: no single piece to write back
        return y


class TwoViews(nn.Module):
    def forward(self, x):
        y = x * 2
        a, b = y[:, :2], y[:, 1:]
        a += 1.0  # b (taken before) overlaps and is read after
        return a + 0.5, b


@pytest.mark.parametrize("model, words", [
    (StridedWrite(), ["step 2", "cannot be written back", "out of place"]),
    (TwoViews(), ["another view", "read after the write", "out of place"]),
], ids=["strided", "two_views"])
def test_in_place_write_that_cannot_be_functional_is_refused_with_why_and_what_to_write(model, words):
    x = torch.randn(1, 4, 3, 3)
    with pytest.raises(UnsupportedOpsError) as e:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            corten.compile(model.eval(), (x,), calibration=_calib((1, 4, 3, 3)))
    msg = str(e.value)
    assert "test_external_idioms.py:" in msg  # the user's file and line
    for w in words:
        assert w in msg, msg


# ----------------------------------------------------------------------------- no-op dtype code
class AttentionWithDisabledAutocast(nn.Module):
    """A linear-attention block in the style of EfficientViT: float32 casts everywhere and a
    ``torch.autocast(device_type=..., enabled=False)`` region around the attention arithmetic."""

    def __init__(self, c=8):
        super().__init__()
        self.qkv = nn.Conv2d(c, 3 * c, 1)
        self.proj = nn.Conv2d(c, c, 1)

    def forward(self, x):
        b, c, h, w = x.shape
        qkv = self.qkv(x).float()
        with torch.autocast(device_type=x.device.type, enabled=False):
            q, k, v = qkv.reshape(b, 3, c, h * w).to(torch.float32).unbind(1)
            q, k = torch.relu(q).to(qkv.dtype), torch.relu(k).type(torch.float32)
            kv = torch.matmul(v, k.transpose(-1, -2).float())
            out = torch.matmul(kv, q).to(dtype=x.dtype)
        out = out.reshape(b, c, h, w).contiguous()
        return self.proj(out.type_as(x)) + x


class CudaAutocastOnCpu(nn.Module):
    """A CUDA autocast region (enabled) around float32 CPU work: it changes nothing on the CPU."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(6, 5)

    def forward(self, x):
        with torch.autocast(device_type="cuda", dtype=torch.float16):
            y = self.fc(x)
        with torch.autocast(device_type="cpu", dtype=torch.float32):
            return torch.sigmoid(y).float()


@needs_gcc
def test_disabled_autocast_and_float32_casts_vanish():
    torch.manual_seed(0)
    model = AttentionWithDisabledAutocast()
    prog, x = _compile_quietly(model, (1, 8, 4, 4))
    assert set(prog.op_counts()) >= {"quantized_matmul", "quantized_conv2d"}
    _assert_lowered_and_byte_exact(prog, x, model, tol=0.25)


@needs_gcc
def test_autocast_regions_for_other_devices_or_float32_vanish():
    torch.manual_seed(0)
    model = CudaAutocastOnCpu()
    prog, x = _compile_quietly(model, (2, 6))
    _assert_lowered_and_byte_exact(prog, x, model)


class Bfloat16Autocast(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(6, 5)

    def forward(self, x):
        with torch.autocast(device_type="cpu", dtype=torch.bfloat16):
            return self.fc(x)


def test_autocast_that_changes_precision_is_refused_with_file_and_line():
    with pytest.raises(UnsupportedOpsError) as e:
        corten.compile(Bfloat16Autocast().eval(), (torch.randn(2, 6),), calibration=_calib((2, 6)))
    msg = str(e.value)
    assert "test_external_idioms.py:" in msg and "<unknown source>" not in msg
    assert "bfloat16" in msg and "enabled=False" in msg


# ----------------------------------------------------------------------------- x + 0, honest warnings
class ReparamBlockLike(nn.Module):
    """A MobileOne/FastViT-style block at inference: a scale branch, an identity term that is the
    number 0 when the block has no identity branch, ``* 1`` and ``/ 1`` from folded scalings."""

    def __init__(self, c=6):
        super().__init__()
        self.conv = nn.Sequential(nn.Conv2d(c, c, 3, padding=1), nn.BatchNorm2d(c))
        self.scale = nn.Sequential(nn.Conv2d(c, c, 1), nn.BatchNorm2d(c))
        self.act = nn.ReLU()

    def forward(self, x):
        identity_out = 0
        scale_out = self.scale(x) * 1
        out = scale_out + identity_out
        out = out + self.conv(x) / 1
        out = out - 0.0
        return self.act(out + torch.zeros_like(out))


@needs_gcc
def test_adding_zero_and_multiplying_by_one_vanish_without_warnings():
    torch.manual_seed(0)
    model = ReparamBlockLike()
    prog, x = _compile_quietly(model, (1, 6, 6, 6))
    counts = prog.op_counts()
    assert counts.get("quantized_add") == 1 and "quantized_mul" not in counts and "quantized_div" not in counts, counts
    _assert_lowered_and_byte_exact(prog, x, model)


def test_a_1e_8_scale_output_warns():
    """torchvision's MobileNetV2 at its plain initialisation gives logits of about 1e-8: every int8
    output equals the zero point."""
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 4 * 4, 5))
    with torch.no_grad():
        model[3].weight.mul_(1e-8)
        model[3].bias.zero_()
    with pytest.warns(QuantizationWarning, match="less than one step of their int8 grid"):
        corten.compile(model.eval(), (torch.randn(1, 3, 6, 6),), calibration=_calib((1, 3, 6, 6)))


class SingleGroupNorm(nn.Module):
    """GroupNorm(1, C) (MobileViTv2's LayerNorm2d-like norm), spelled out by Corten with an rsqrt table."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.norm = nn.GroupNorm(1, 8)

    def forward(self, x):
        return self.norm(self.conv(x))


def test_a_saturated_group_norm_table_warns():
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(3)
    # one variance per sample: most samples quiet, a quarter loud - the quiet ones' variances all
    # fall into the lowest input level of the rsqrt table (rsqrt(0): beyond any output range)
    calib = [(torch.randn(1, 3, 6, 6, generator=g) * (3.0 if k % 4 == 0 else 0.05),) for k in range(32)]
    with pytest.warns(QuantizationWarning, match="lookup table .* saturates on [0-9]+ of 32 calibration batches"):
        corten.compile(SingleGroupNorm().eval(), calib[0], calibration=calib)


# ----------------------------------------------------------------------------- declared input ranges
class RecurrentStep(nn.Module):
    """One step of a small recurrent model (Silero-VAD-like): a feature input and a state input the
    test data holds at zero (``torch.zeros`` state), both of which the caller knows the ranges of."""

    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(8, 12)
        self.rec = nn.Linear(12, 12)
        self.out = nn.Linear(12, 3)

    def forward(self, x, state):
        h = torch.tanh(self.inp(x) + self.rec(state))
        return self.out(h), h


@needs_gcc
@pytest.mark.parametrize("key", [1, "state"])
def test_declared_input_range_takes_a_constant_calibration_input(key):
    torch.manual_seed(0)
    model = RecurrentStep().eval()
    g = torch.Generator().manual_seed(5)
    calib = [(torch.randn(2, 8, generator=g), torch.zeros(2, 12)) for _ in range(6)]
    with pytest.raises(corten.CortenError, match=r"input_ranges=\{1: \(lo, hi\)\}"):
        corten.compile(model, calib[0], calibration=calib)  # refused: and the message says how to declare
    prog = corten.compile(model, calib[0], calibration=calib, input_ranges={key: (-1.0, 1.0)})
    assert prog.unlowered_ops() == []
    q = prog.inputs[1]
    assert abs(q.scale - 2.0 / 255) < 1e-7  # the range [-1, 1] as a min/max observer quantizes it
    # real states (the tanh outputs of a previous step) run byte-exact in C
    x, state = torch.randn(2, 8, generator=g), torch.tanh(torch.randn(2, 12, generator=g))
    want = prog.run_int8(x, state)
    assert all(torch.equal(a, b) for a, b in zip(want, prog.c_run(x, state, kernels="portable").outputs))
    # (the layers after the state were calibrated on a zero state: compare floats there)
    out, h = prog.run(x, torch.zeros(2, 12))
    ref_out, ref_h = model(x, torch.zeros(2, 12))
    assert (h - ref_h).abs().max() < 0.05 and (out - ref_out).abs().max() < 0.1


def test_input_ranges_are_checked():
    model = RecurrentStep().eval()
    ex = (torch.randn(2, 8), torch.randn(2, 12))
    for bad, words in [({"h": (0, 1)}, "forward's inputs are x, state"), ({2: (0, 1)}, "takes 2 input"),
                       ({0: (1, 1)}, "finite lo < hi"), ({0: 3}, "pair (lo, hi)"), ([(0, 1)], "must be a dict")]:
        with pytest.raises(corten.UsageError, match=words.replace("(", r"\(").replace(")", r"\)")):
            corten.compile(model, ex, input_ranges=bad)


# ----------------------------------------------------------------------------- ExecuTorch-suite leftovers
class CopySpellings(nn.Module):
    """The edge dialect's ``*_copy`` spellings of view ops, as ExecuTorch's tests call them."""

    def __init__(self):
        super().__init__()
        self.c = nn.Conv2d(3, 4, 1)

    def forward(self, x):
        aten = torch.ops.aten
        y = self.c(x)
        a = aten.view_copy.default(y, [1, 4, 16])
        b = aten.permute_copy.default(a, [0, 2, 1])
        c = aten.t_copy.default(aten.select_copy.int(b, 0, 0))
        d = aten.expand_copy.default(aten.unsqueeze_copy.default(c, 0), [2, 4, 16])
        e = aten.alias_copy.default(aten.transpose_copy.int(d, 1, 2))
        f = aten.slice_copy.Tensor(aten.squeeze_copy.dim(aten.unsqueeze_copy.default(e, 1), 1), 1, 2, 10)
        return aten.detach_copy.default(f) * 2


@needs_gcc
def test_copy_spellings_of_view_ops_lower_byte_exact():
    torch.manual_seed(0)
    model = CopySpellings()
    prog, x = _compile_quietly(model, (1, 3, 4, 4))
    _assert_lowered_and_byte_exact(prog, x, model)


class FrameConv3d(nn.Module):
    """``nn.Conv3d`` with temporal kernel 1 (spatial 3x3 with a temporal stride, then pointwise)."""

    def __init__(self):
        super().__init__()
        self.c = nn.Conv3d(3, 5, (1, 3, 3), stride=(2, 1, 1), padding=(0, 1, 1))
        self.d = nn.Conv3d(5, 4, 1)

    def forward(self, x):
        return self.d(torch.relu(self.c(x)))


@needs_gcc
def test_conv3d_with_a_temporal_kernel_of_1_runs_as_2d_per_frame():
    torch.manual_seed(0)
    model = FrameConv3d()
    prog, x = _compile_quietly(model, (2, 3, 5, 6, 6))
    assert prog.op_counts()["quantized_conv2d"] == 2
    _assert_lowered_and_byte_exact(prog, x, model, tol=0.3)  # (4 calibration samples: a clipped outlier)


def test_conv3d_with_a_temporal_kernel_is_refused_by_name():
    with pytest.raises(UnsupportedOpsError, match="temporal kernel of 1"):
        corten.compile(nn.Conv3d(2, 3, 3).eval(), (torch.randn(1, 2, 4, 5, 5),), calibration=_calib((1, 2, 4, 5, 5)))


class TensorClamp(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b, self.c = nn.Linear(6, 6), nn.Linear(6, 6), nn.Linear(6, 6)

    def forward(self, x):
        lo = self.b(x)
        hi = lo + torch.sigmoid(self.c(x))
        return torch.clamp(self.a(x), min=lo, max=hi), torch.clamp(x, min=lo), torch.clamp(x, max=hi)


@needs_gcc
def test_clamp_with_tensor_bounds_byte_exact():
    torch.manual_seed(0)
    model = TensorClamp().eval()
    x = torch.randn(2, 6)
    with warnings.catch_warnings():  # (the min(max(.)) output shares a clipped input range: warned, not tested here)
        warnings.simplefilter("ignore", QuantizationWarning)
        prog = corten.compile(model, (x,), calibration=_calib((2, 6)))
    _assert_lowered_and_byte_exact(prog, x, model)


class IndexWrites(nn.Module):
    """``index_copy`` along rows and columns and the edge dialect's functional ``index_put``, with
    constant indices (registered buffers)."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(6, 6), nn.Linear(6, 6)
        self.register_buffer("rows", torch.tensor([3, 0]))
        self.register_buffer("cols", torch.tensor([5, 1]))

    def forward(self, x):
        y = self.a(x)
        v = self.b(x)[:2]
        return (y.index_copy(0, self.rows, v), torch.ops.aten.index_put.default(y, [self.rows], v),
                y.index_copy(1, self.cols, y[:, :2] * 2))


@needs_gcc
def test_index_copy_and_index_put_with_constant_indices_byte_exact():
    torch.manual_seed(0)
    model = IndexWrites().eval()
    x = torch.randn(4, 6)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", QuantizationWarning)
        prog = corten.compile(model, (x,), calibration=_calib((4, 6)))
    _assert_lowered_and_byte_exact(prog, x, model, tol=0.2)


class SoftSplit(nn.Module):
    """T2T-ViT's soft split: ``nn.Unfold`` patches (overlapping, padded), transposed to tokens, then a
    linear embedding of each token."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.unfold = nn.Unfold(kernel_size=3, stride=2, padding=1)
        self.embed = nn.Linear(4 * 9, 8)

    def forward(self, x):
        return self.embed(self.unfold(torch.relu(self.conv(x))).transpose(1, 2))


@needs_gcc
def test_unfold_soft_split_lowers_as_a_one_hot_convolution_byte_exact():
    torch.manual_seed(0)
    model = SoftSplit().eval()
    prog, x = _compile_quietly(model, (1, 3, 8, 8))
    assert prog.op_counts()["quantized_conv2d"] == 2
    _assert_lowered_and_byte_exact(prog, x, model)
