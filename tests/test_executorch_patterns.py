"""The model patterns ExecuTorch's Cortex-M backend tests exercise, written afresh for Corten.

ExecuTorch tests its Cortex-M flow (``backends/cortex_m/test/models`` and ``ops``) on small
modules: conv + activation + pool chains, Linear + BatchNorm1d, MobileNet inverted residual and
squeeze-excite blocks, batched matmuls (constant and broadcast operands), constant pads of rank 1
to 4, division with broadcasting, maximum / minimum, transposed convs with activations,
output padding and dilation, LSTMs (``nn.LSTM`` and ``torch.ao.nn.quantizable.LSTM``), a Silero-VAD
style front end (learned STFT as a conv1d, magnitude, LSTMCell, state stacked as an output),
Wav2Letter's conv1d stack, attention (SDPA and the spelled-out ``q @ k^T / sqrt(d)``) and YOLO11
pieces (C2f, SPPF, DFL).  These are Corten's own small equivalents: each one must lower completely
and its C library (portable kernels, on the host) must give the bytes of ``run_int8``.  A few go
through :class:`corten.testing.tester.Tester` the way ExecuTorch's tests drive their tester.

Two things the sweep found are fixed and tested here: a factory tensor written in place
(``torch.zeros(...).squeeze_(0)``, quantizable LSTM's initial state) now folds to a constant, and a
one-element input whose calibration samples differ is no longer refused as "constant".
"""
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import corten
from conftest import HOST_CFLAGS, needs_gcc
from corten.errors import QuantizationError
from corten.testing.tester import Tester


def ramp(lo, hi, shape):
    n = 1
    for s in shape:
        n *= s
    return torch.linspace(lo, hi, n).reshape(shape)


class Fn(nn.Module):
    """``forward`` is ``fn`` applied to the inputs (the module's submodules are its parameters)."""

    def __init__(self, fn, **mods):
        super().__init__()
        self.fn = fn
        for k, m in mods.items():
            self.add_module(k, m)

    def forward(self, *x):
        return self.fn(self, *x)


class LinearBatchNorm(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(6, 12))
        self.bn = nn.BatchNorm1d(6)
        with torch.no_grad():
            self.bn.running_mean.uniform_(-0.5, 0.5)
            self.bn.running_var.uniform_(0.5, 2.0)

    def forward(self, x):
        return self.bn(F.linear(x, self.w))


class MobileBlock(nn.Module):
    """Expand 1x1 -> depthwise 3x3 -> squeeze-excite (hardsigmoid gate) -> project, with the residual."""

    def __init__(self, c=6, e=12):
        super().__init__()
        self.expand = nn.Sequential(nn.Conv2d(c, e, 1, bias=False), nn.BatchNorm2d(e), nn.Hardswish())
        self.dw = nn.Sequential(nn.Conv2d(e, e, 3, padding=1, groups=e, bias=False), nn.BatchNorm2d(e), nn.ReLU6())
        self.se1, self.se2 = nn.Conv2d(e, 4, 1), nn.Conv2d(4, e, 1)
        self.project = nn.Sequential(nn.Conv2d(e, c, 1, bias=False), nn.BatchNorm2d(c))

    def forward(self, x):
        y = self.dw(self.expand(x))
        y = y * F.hardsigmoid(self.se2(F.relu(self.se1(F.adaptive_avg_pool2d(y, 1)))))
        return self.project(y) + x


class TinyVad(nn.Module):
    """Silero-VAD's shape: reflect pad, learned STFT (conv1d), magnitude, conv1d encoder, LSTMCell on
    a state input, sigmoid head, the new state stacked as a second output."""

    def __init__(self, bins=8, hidden=12):
        super().__init__()
        self.bins = bins
        self.stft = nn.Conv1d(1, 2 * bins, 16, stride=8, bias=False)
        self.enc = nn.ModuleList([nn.Conv1d(bins, hidden, 3, padding=1), nn.Conv1d(hidden, hidden, 3, 2, 1)])
        self.cell = nn.LSTMCell(hidden, hidden)
        self.head = nn.Conv1d(hidden, 1, 1)

    def forward(self, x, state):
        x = self.stft(F.pad(x, (0, 8), mode="reflect").unsqueeze(1))
        x = (x[:, :self.bins] ** 2 + x[:, self.bins:] ** 2).sqrt()
        for conv in self.enc:
            x = F.relu(conv(x))
        h, c = self.cell(x.mean(-1), (state[0], state[1]))
        y = torch.sigmoid(self.head(F.relu(h).unsqueeze(-1)))
        return y.squeeze(1).mean(dim=1, keepdim=True), torch.stack([h, c], 0)


class HeadsAttention(nn.Module):
    def __init__(self, d=16, heads=2, sdpa=True):
        super().__init__()
        self.qkv, self.out, self.heads, self.sdpa = nn.Linear(d, 3 * d), nn.Linear(d, d), heads, sdpa

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = (z.reshape(b, t, self.heads, d // self.heads).transpose(1, 2) for z in self.qkv(x).chunk(3, -1))
        if self.sdpa:
            y = F.scaled_dot_product_attention(q, k, v)
        else:
            y = torch.softmax(q @ k.transpose(-2, -1) / (d // self.heads) ** 0.5, dim=-1) @ v
        return self.out(y.transpose(1, 2).reshape(b, t, d))


def _cbs(i, o, k=1, s=1):  # YOLO's Conv: conv, BatchNorm, SiLU
    return nn.Sequential(nn.Conv2d(i, o, k, s, k // 2, bias=False), nn.BatchNorm2d(o), nn.SiLU())


class C2fSppf(nn.Module):
    """YOLO11 pieces: stride-2 stem, C2f (chunk, bottleneck with residual, concat), SPPF's chained
    5x5 max pools, nearest upsample."""

    def __init__(self):
        super().__init__()
        self.stem, self.cv1 = _cbs(3, 8, 3, 2), _cbs(8, 8)
        self.m = nn.Sequential(_cbs(4, 4, 3), _cbs(4, 4, 3))
        self.cv2, self.pool = _cbs(12, 8), nn.MaxPool2d(5, 1, 2)

    def forward(self, x):
        y = list(self.cv1(self.stem(x)).chunk(2, 1))
        y.append(self.m(y[-1]) + y[-1])
        z = self.cv2(torch.cat(y, 1))
        p1 = self.pool(z)
        return F.interpolate(torch.cat([z, p1, self.pool(p1)], 1), scale_factor=2.0, mode="nearest")


class Dfl(nn.Module):
    """YOLO's distribution focal loss decode: softmax over 16 bins, weighted by a fixed 1x1 conv."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(16, 1, 1, bias=False)
        with torch.no_grad():
            self.conv.weight.copy_(torch.arange(16.0).view(1, 16, 1, 1))

    def forward(self, x):
        b, _, a = x.shape
        return self.conv(x.view(b, 4, 16, a).transpose(2, 1).softmax(1)).view(b, 4, a)


def _bmm_const():
    m = Fn(lambda s, a: torch.bmm(a, s.rhs))
    m.register_buffer("rhs", torch.randn(2, 5, 3))
    return m


def _quantizable_lstm():
    return Fn(lambda s, x: s.lstm(x)[0], lstm=torch.ao.nn.quantizable.LSTM(4, 3))


CL = torch.channels_last
# name -> (model factory, example inputs factory)
PATTERNS = {
    "conv_relu_maxpool": (lambda: nn.Sequential(nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.ReLU(),
                                                nn.MaxPool2d(2, 2)),
                          lambda: (ramp(-1, 1, (1, 3, 8, 8)).to(memory_format=CL),)),
    "conv_relu6_avgpool_ceil": (lambda: nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU6(),
                                                      nn.AvgPool2d(3, 2, 1, ceil_mode=True, count_include_pad=False)),
                                lambda: (ramp(-1, 1, (1, 3, 7, 7)),)),
    "conv_hardtanh_inplace": (lambda: nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.Hardtanh(-1.0, 1.0, True)),
                              lambda: (ramp(-1, 1, (1, 3, 6, 6)),)),
    "linear_batchnorm1d": (LinearBatchNorm, lambda: (ramp(-1, 1, (2, 12)),)),
    "conv_add_relu": (lambda: Fn(lambda s, x: F.relu(s.a(x) + s.b(x)), a=nn.Conv2d(3, 6, 3, padding=1),
                                 b=nn.Conv2d(3, 6, 3, padding=1)), lambda: (ramp(-1, 1, (1, 3, 6, 6)),)),
    "mobilenet_block": (MobileBlock, lambda: (torch.randn(1, 6, 6, 6),)),
    "mul_add_three_inputs": (lambda: Fn(lambda s, x, y, z: x * y + z),
                             lambda: (ramp(-1, 1, (1, 8)), ramp(0, 2, (1, 8)), ramp(-0.5, 0.5, (1, 8)))),
    "transpose_linear": (lambda: Fn(lambda s, x: s.fc(x.transpose(-1, -2)), fc=nn.Linear(4, 6, bias=False)),
                         lambda: (ramp(-1, 1, (1, 4, 8)),)),
    "bmm": (lambda: Fn(lambda s, a, b: torch.bmm(a, b)), lambda: (torch.randn(3, 4, 5), torch.randn(3, 5, 2))),
    "bmm_constant_rhs": (_bmm_const, lambda: (torch.randn(2, 3, 5),)),
    "matmul_rank4": (lambda: Fn(lambda s, a, b: a @ b), lambda: (torch.randn(1, 2, 6, 4), torch.randn(1, 2, 4, 6))),
    "matmul_broadcast_batch": (lambda: Fn(lambda s, a, b: torch.matmul(a, b)),
                               lambda: (torch.randn(1, 4, 8), torch.randn(2, 8, 4))),
    "pad_rank4_every_dim": (lambda: Fn(lambda s, x: F.pad(x, (1, 1, 2, 2, 1, 0, 0, 1))),
                            lambda: (ramp(-0.5, 0.5, (1, 2, 3, 4)),)),
    "pad_rank1_value": (lambda: Fn(lambda s, x: F.pad(x, (2, 3), value=0.5)), lambda: (ramp(0, 1, (6,)),)),
    "div_small_denominator": (lambda: Fn(lambda s, a, b: a / b), lambda: (ramp(1, 10, (8,)), ramp(0.05, 2.5, (8,)))),
    "div_broadcast_one_element": (lambda: Fn(lambda s, a, b: a / b), lambda: (ramp(1, 5, (1,)), ramp(1, 5, (2, 2, 2)))),
    "maximum_broadcast_rank4": (lambda: Fn(lambda s, a, b: torch.maximum(a, b)),
                                lambda: (ramp(-4, 4, (1, 2, 3, 1)), ramp(-6, 6, (4, 1, 1, 3)))),
    "conv_transpose_relu": (lambda: nn.Sequential(nn.ConvTranspose2d(4, 2, 3, stride=2, padding=1), nn.ReLU()),
                            lambda: (ramp(-10, 10, (1, 4, 4, 4)),)),
    "conv_transpose_outpad_dilation": (lambda: nn.ConvTranspose2d(3, 4, 3, stride=2, padding=1, output_padding=1,
                                                                  dilation=2),
                                       lambda: (ramp(0, 6, (1, 3, 5, 5)),)),
    "conv_transpose_groups": (lambda: nn.ConvTranspose2d(4, 6, 3, groups=2), lambda: (ramp(-3, 3, (1, 4, 4, 4)),)),
    "maxpool_indices": (lambda: Fn(lambda s, x: s.p(x)[1], p=nn.MaxPool2d(2, 2, return_indices=True)),
                        lambda: (ramp(-50, 50, (1, 1, 6, 6)),)),
    "sigmoid_inplace": (lambda: Fn(lambda s, x: x.sigmoid_()), lambda: (ramp(-4, 4, (1, 4, 3, 3)),)),
    "lstm": (lambda: Fn(lambda s, x: s.lstm(x)[0], lstm=nn.LSTM(4, 3)), lambda: (ramp(-1, 1, (3, 1, 4)),)),
    "quantizable_lstm": (_quantizable_lstm, lambda: (ramp(-1, 1, (3, 1, 4)),)),
    "tiny_vad": (TinyVad, lambda: (torch.randn(1, 56), torch.zeros(2, 1, 12))),
    "wav2letter_convs": (lambda: Fn(lambda s, x: F.log_softmax(s.m(x), 1), m=nn.Sequential(
        nn.Conv1d(6, 12, 7, 2, 3), nn.ReLU(), nn.Conv1d(12, 12, 5, padding=2), nn.ReLU(), nn.Conv1d(12, 5, 1))),
        lambda: (torch.randn(1, 6, 20),)),
    "attention_sdpa": (lambda: HeadsAttention(sdpa=True), lambda: (torch.randn(1, 5, 16),)),
    "attention_scaled_scores": (lambda: HeadsAttention(sdpa=False), lambda: (torch.randn(1, 5, 16),)),
    "yolo_c2f_sppf": (C2fSppf, lambda: (torch.randn(1, 3, 12, 12),)),
    "yolo_dfl": (Dfl, lambda: (torch.randn(1, 64, 6),)),
}


def _calibration(example, n=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [example] + [tuple(torch.randn(x.shape, generator=g) * x.abs().max().clamp(min=1) for x in example)
                        for _ in range(n)]


def _build(name):
    torch.manual_seed(0)
    make_model, make_inputs = PATTERNS[name]
    model, example = make_model().eval(), make_inputs()
    return corten.compile(model, example, calibration=_calibration(example)), example


@needs_gcc
@pytest.mark.parametrize("name", sorted(PATTERNS))
def test_pattern_lowers_completely_and_c_is_byte_exact(name):
    prog, example = _build(name)
    assert prog.unlowered_ops() == [], [str(u) for u in prog.unlowered_ops()]
    expected = prog.run_int8(*example)
    run = prog.c_run(*example, on="host", kernels="portable", cflags=HOST_CFLAGS)
    assert len(run.outputs) == len(expected)
    for e, g in zip(expected, run.outputs):
        assert torch.equal(e, g), f"{name}: {int((e != g).sum())} of {e.numel()} bytes differ"


# ---------------------------------------------------------------- the Tester, as ExecuTorch's tests call theirs
TESTER_CASES = {
    # name: (ops before lowering (the keys checked), ops after lowering (exactly), qtol)
    "bmm": ({"aten.bmm.default": 1, "quantized_decomposed.quantize_per_tensor.default": 3},
            {"quantize_per_tensor": 2, "quantized_matmul": 1, "dequantize_per_tensor": 1}, 1),
    "pad_rank4_every_dim": ({"aten.pad.default": 1},
                            {"quantize_per_tensor": 1, "quantized_pad": 1, "dequantize_per_tensor": 1}, 0),
    "conv_transpose_relu": ({"aten.conv_transpose2d.input": 1, "aten.relu.default": 1},
                            {"quantize_per_tensor": 1, "quantized_conv_transpose2d": 1, "dequantize_per_tensor": 1}, 1),
    # three steps unrolled; the first step's hidden-state linear reads the folded zero state: a constant
    "quantizable_lstm": ({"aten.linear.default": 5, "aten.sigmoid.default": 9, "aten.tanh.default": 6},
                         {"quantize_per_tensor": 1, "quantized_strided_copy": 15, "quantized_linear": 5,
                          "quantized_add": 6, "quantized_lut": 15, "quantized_mul": 9, "quantized_cat": 1,
                          "dequantize_per_tensor": 1}, 1),
}


@needs_gcc
@pytest.mark.parametrize("name", sorted(TESTER_CASES))
def test_tester_dialect_and_implementation(name):
    before, after, qtol = TESTER_CASES[name]
    torch.manual_seed(0)
    make_model, make_inputs = PATTERNS[name]
    tester = Tester(make_model(), make_inputs())
    report = tester.test_dialect(before, after, qtol=qtol)
    assert report.max_steps_vs_quantized <= qtol
    runs = tester.test_implementation(on=("host",), n_inputs=1)
    assert [where for where, _, _ in runs] == ["host"]


# ---------------------------------------------------------------- the two fixes, focused
class WrittenFactory(nn.Module):
    """A factory tensor changed in place before use: ``torch.full(...).squeeze_(0)`` (quantizable LSTM's
    ``torch.zeros(1, b, h)`` initial state is squeezed the same way)."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        offset = torch.full((1, 1, 8), 0.25).squeeze_(0)
        return torch.relu(self.fc(x) + offset)


class AccumulatorFromZeros(nn.Module):
    """``acc = torch.zeros(...); acc += f(x)``: an accumulator started from a factory tensor."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        acc = torch.zeros(2, 8)
        acc += self.fc(x)
        return torch.relu(acc * 2.0)


class SliceOfZerosAssigned(nn.Module):
    """``buf = torch.zeros(...); buf[:, :4] = f(x)``: a factory tensor written through a view (was folded
    to a constant before the write was seen, and the write then refused)."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 4)

    def forward(self, x):
        buf = torch.zeros(2, 8)
        buf[:, :4] = self.fc(x)
        return torch.relu(buf)


@needs_gcc
@pytest.mark.parametrize("make, ops", [
    (WrittenFactory, {"quantize_per_tensor": 1, "quantized_linear": 1, "quantized_add": 1, "dequantize_per_tensor": 1}),
    (AccumulatorFromZeros, {"quantize_per_tensor": 1, "quantized_linear": 1, "quantized_add": 1, "quantized_mul": 1,
                            "dequantize_per_tensor": 1}),
    (SliceOfZerosAssigned, {"quantize_per_tensor": 1, "quantized_linear": 1, "quantized_cat": 1, "quantized_lut": 1,
                            "dequantize_per_tensor": 1}),
], ids=["squeeze_", "add_", "slice_copy_"])
def test_factory_written_in_place_folds_to_a_constant(make, ops):
    torch.manual_seed(0)
    m, x = make().eval(), torch.randn(2, 8)
    prog = corten.compile(m, (x,), calibration=_calibration((x,)))
    assert prog.unlowered_ops() == []
    assert prog.op_counts() == ops
    ref = m(x)
    assert float((prog.run(x) - ref).abs().max()) < 0.05 * float(ref.abs().max()) + 0.05
    assert torch.equal(prog.run_c(x, on="host", int8=True, cflags=HOST_CFLAGS)[0], prog.run_int8(x)[0])


def test_one_element_input_with_varying_calibration_is_accepted():
    m = Fn(lambda s, a, b: a * b).eval()
    example = (torch.ones(1), torch.randn(2, 3))
    cal = [(torch.tensor([v]), torch.randn(2, 3)) for v in (0.5, 1.0, 2.0, -1.0)]
    prog = corten.compile(m, example, calibration=cal)
    assert prog.unlowered_ops() == []
    a, b = torch.tensor([1.5]), cal[2][1] * 0.5  # inside the calibrated product range (2 * b)
    assert float((prog.run(a, b) - a * b).abs().max()) < 0.1


def test_one_element_input_constant_in_every_sample_is_still_refused():
    m = Fn(lambda s, a, b: a * b).eval()
    cal = [(torch.tensor([2.0]), torch.randn(2, 3)) for _ in range(3)]
    with pytest.raises(QuantizationError, match="input 0 is constant in every sample.*input_ranges"):
        corten.compile(m, (torch.ones(1), torch.randn(2, 3)), calibration=cal)
