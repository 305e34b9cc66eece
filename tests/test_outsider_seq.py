"""Sequence / audio / time-series / small-transformer models written the way public code writes them
(tests/outsider_seq_models.py): each compiles fully lowered, runs byte-exact in C on the host (portable
kernels) and agrees with the float model (cosine >= 0.95 on every output), calibrated on 4 N(0, 1)
samples.  Then focused tests of what these models found: a bias shared by several weighted ops (each op
its own bias scale), -inf masks (folded into masked softmaxes, or refused by op and line where an int8
tensor would hold them), and refusals that say what to write instead.
"""
from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import corten
from conftest import HOST_CFLAGS, needs_gcc
from corten.errors import CortenError, QuantizationError, QuantizationWarning, UnsupportedOpsError
from model_checks import assert_c_bytes_equal, assert_close_to_float, seeded_samples
from outsider_seq_models import SEQ_MODELS

CASES = {name: (factory, shapes) for name, factory, shapes in SEQ_MODELS}
# the host C at -O0 (a third of the -O2 build time; the C is the same, and tests/test_idioms.py builds
# the same portable kernels at -O2 on 150 models)


def _compile(name):
    factory, shapes = CASES[name]
    torch.manual_seed(0)
    model = factory().eval()
    inputs, calibration = seeded_samples(shapes, 4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        prog = corten.compile(model, inputs, calibration=calibration, name="seq")
    return model, inputs, prog


@pytest.fixture(scope="module")
def compiled():
    cache = {}

    def get(name):
        if name not in cache:
            cache[name] = _compile(name)
        return cache[name]
    return get


def test_corpus_size():
    assert len(CASES) == len(SEQ_MODELS) >= 40


@needs_gcc
@pytest.mark.parametrize("name", list(CASES))
def test_lowered_byte_exact_in_c_and_close_to_float(compiled, name):
    model, inputs, prog = compiled(name)
    assert prog.unlowered_ops() == [], prog.operator_table()
    assert_c_bytes_equal(prog, inputs, HOST_CFLAGS)
    assert_close_to_float(model, inputs, prog, name)


# ----------------------------------------------------------------------------- a bias read by several ops
class SharedLinear(nn.Module):
    """One nn.Linear applied to two inputs of very different ranges (a shared encoder, an RNN's
    recurrent weights at every step): each call has its own input scale, so its own bias scale."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(6, 4)
        with torch.no_grad():
            self.fc.bias.copy_(torch.tensor([0.5, -0.4, 0.3, -0.2]))

    def forward(self, x, y):
        return self.fc(x), self.fc(8.0 * y)


def test_a_bias_shared_by_two_linears_is_quantized_with_each_ones_input_scale():
    torch.manual_seed(0)
    model = SharedLinear().eval()
    g = torch.Generator().manual_seed(3)
    xs = [(torch.randn(2, 6, generator=g), torch.randn(2, 6, generator=g)) for _ in range(5)]
    prog = corten.compile(model, xs[0], calibration=xs[1:])
    assert prog.op_counts()["quantized_linear"] == 2
    with torch.no_grad():
        ref = model(*xs[0])
    for r, q in zip(ref, prog.run(*xs[0])):
        # before: the second call's int32 bias had the first call's scale (8x too small a step: the
        # bias came out 1/8 of its value, an error of ~0.4 on outputs of range ~1)
        assert (r - q).abs().max() < 0.05 * max(1.0, float(r.abs().max())), (r - q).abs().max()


# ----------------------------------------------------------------------------- -inf masks
class AdditiveInfMaskSoftmax(nn.Module):
    def __init__(self, t=4):
        super().__init__()
        self.fc = nn.Linear(8, t)
        self.register_buffer("m", torch.zeros(t).masked_fill(torch.arange(t) >= t - 1, float("-inf")))

    def forward(self, x):
        return F.softmax(self.fc(x) + self.m, dim=-1)


def test_an_additive_minus_inf_mask_before_a_softmax_becomes_the_masked_softmax():
    torch.manual_seed(0)
    model = AdditiveInfMaskSoftmax().eval()
    g = torch.Generator().manual_seed(2)
    xs = [(torch.randn(3, 8, generator=g),) for _ in range(5)]
    prog = corten.compile(model, xs[0], calibration=xs[1:])
    assert prog.unlowered_ops() == []
    # the mask became 0/1 multipliers of a masked softmax (no int8 tensor holds -inf: the result is exact)
    assert prog.op_counts()["quantized_softmax"] == 1 and prog.op_counts()["quantized_div"] == 1
    with torch.no_grad():
        ref = model(*xs[0])
    got = prog.run(*xs[0])
    assert float(got[:, -1].abs().max()) == 0.0  # the masked position stays exactly 0
    assert (ref - got).abs().max() < 0.02


class CausalScores(nn.Module):
    def __init__(self, t=6):
        super().__init__()
        self.register_buffer("tril", torch.tril(torch.ones(t, t)))

    def forward(self, q, k):
        w = (q @ k.transpose(-2, -1)).masked_fill(self.tril == 0, float("-inf"))
        return F.softmax(w, dim=-1)


def _later_keys_score_higher(g):
    q = torch.randn(2, 6, 4, generator=g)
    k = torch.randn(2, 6, 4, generator=g) * torch.linspace(0.2, 3, 6).view(1, 6, 1)
    return q, k + torch.linspace(0, 2, 6).view(1, 6, 1) * q.mean(1, keepdim=True)


def test_masked_softmax_keeps_its_mass_when_masked_scores_are_larger():
    """Causal attention whose later (masked) keys score far higher: the masked softmax used to take
    the softmax of every score first, so the kept ones rounded to 0 and row 0 came out all zeros
    (error 1.0); the masked scores are lowered to the row minimum first."""
    g = torch.Generator().manual_seed(0)
    xs = [_later_keys_score_higher(g) for _ in range(6)]
    with warnings.catch_warnings():
        warnings.simplefilter("error", QuantizationWarning)  # (amin's unused multiplier 0 warned)
        prog = corten.compile(CausalScores().eval(), xs[0], calibration=xs[1:])
    assert prog.unlowered_ops() == []
    ref = CausalScores()(*xs[0])
    got = prog.run(*xs[0])
    assert torch.equal(got[:, 0, 0], torch.ones(2))
    assert (ref - got).abs().max() < 0.1


class InfBufferAdded(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.register_buffer("floor", torch.tensor([0.0, float("-inf"), 0.0, 1.0]))

    def forward(self, x):
        return torch.relu(self.fc(x) + self.floor)


def test_a_minus_inf_buffer_an_int8_tensor_would_hold_is_refused_by_op_and_line():
    x = torch.randn(2, 4)
    with pytest.raises(QuantizationError) as e:
        corten.compile(InfBufferAdded().eval(), (x,), calibration=[(torch.randn(2, 4),) for _ in range(3)])
    msg = str(e.value)
    for words in ("'floor'", "1 Inf value", "test_outsider_seq.py:", "masked_fill", "finite value"):
        assert words in msg, msg


def test_transformer_encoder_with_a_mask_buffer_captures():
    """nn.TransformerEncoder(x, mask=buffer) compared the mask with a causal one (a data-dependent
    guard torch.export refused); the comparison is only a fast-path hint, and the mask is applied."""
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0)
    enc = nn.TransformerEncoder(layer, 1, enable_nested_tensor=False).eval()

    class Causal(nn.Module):
        def __init__(self):
            super().__init__()
            self.enc = enc
            self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(4))

        def forward(self, x):
            return self.enc(x, mask=self.mask)

    model = Causal().eval()
    g = torch.Generator().manual_seed(4)
    xs = [(torch.randn(4, 2, 8, generator=g),) for _ in range(4)]
    prog = corten.compile(model, xs[0], calibration=xs[1:])
    assert prog.unlowered_ops() == []
    with torch.no_grad():
        ref = model(*xs[0])
    got = prog.run(*xs[0])
    assert F.cosine_similarity(ref.flatten(), got.flatten(), dim=0) > 0.98
    # the mask is applied: the first step attends to itself only, whatever the later steps hold (up to
    # the int8 rounding of its renormalised weight), while the later steps change
    x2 = xs[0][0].clone()
    x2[1:] = torch.randn(3, 2, 8, generator=g)
    got2 = prog.run(x2)
    assert (got2[0] - got[0]).abs().max() < 0.05
    assert (got2[1:] - got[1:]).abs().max() > 0.5


# ----------------------------------------------------------------------------- refusals that say what to do
class EmbeddingOfComputedIndices(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(10, 4)

    def forward(self, x):
        return self.emb(x.long())


class TopKPool(nn.Module):
    def forward(self, x):
        return torch.topk(x, 2, dim=-1).values.mean(-1)


class Spectrogram(nn.Module):
    def forward(self, wav):
        return torch.stft(wav, 8, return_complex=True).abs()


@pytest.mark.parametrize("model, shape, op, words", [
    (EmbeddingOfComputedIndices(), (2, 3), "aten.embedding", ["computed indices", "before the program"]),
    (EmbeddingOfComputedIndices(), (2, 3), "aten.to.dtype", ["integer", "outside the program"]),
    (TopKPool(), (2, 3, 8), "aten.topk", ["top-k", "in the caller"]),
    (Spectrogram(), (2, 32), "aten.stft", ["spectrogram", "as the input", "Conv1d"]),
], ids=["embedding", "long_cast", "topk", "stft"])
def test_unsupported_sequence_ops_are_refused_with_line_and_what_to_do(model, shape, op, words):
    g = torch.Generator().manual_seed(0)
    make = lambda: torch.randint(0, 10, shape, generator=g).float()  # noqa: E731 (valid indices too)
    with pytest.raises(UnsupportedOpsError) as e:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            corten.compile(model.eval(), (make(),), calibration=[(make(),) for _ in range(3)])
    assert isinstance(e.value, CortenError)
    line = next(ln for ln in str(e.value).splitlines() if "test_outsider_seq.py:" in ln and
                any(w in ln for w in words))
    for w in words:
        assert w in line, line
    assert op in str(e.value)

