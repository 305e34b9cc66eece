"""Sequence / audio / time-series / small-transformer models for microcontrollers, written the way
public code writes them (keyword spotting, TC-ResNet, MatchboxNet/QuartzNet, Conformer, TCN, WaveNet,
DLinear / PatchTST / N-BEATS forecasters, streaming RNNs): each with its own idioms - Chomp1d slicing,
``x.new_zeros`` initial states, ``Tensor.unfold`` patches, sinusoidal buffers, hand-written norms,
einsum attention with constant masks, dict outputs.  Patterns tests/idiom_models.py and
tests/corpus_models.py already cover are not repeated; these are whole small networks in which
they meet.  See tests/test_outsider_seq.py.

Each entry of :data:`SEQ_MODELS` is ``(name, factory, input shapes)``.  Shapes are tiny.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


# ----------------------------------------------------------------------------- keyword spotting
class CRNN(nn.Module):
    """KWS CRNN: Conv2d over a [N, 1, T, F] spectrogram, freq folded into features, GRU, last step."""

    def __init__(self, n_mels=8, classes=4, hidden=8):
        super().__init__()
        self.conv = nn.Sequential(nn.Conv2d(1, 4, (3, 3), stride=(1, 2), padding=(1, 1), bias=False),
                                  nn.BatchNorm2d(4), nn.ReLU(inplace=True))
        self.gru = nn.GRU(4 * (n_mels // 2), hidden, batch_first=True)
        self.fc = nn.Linear(hidden, classes)

    def forward(self, x):  # [N, 1, T, F]
        x = self.conv(x)
        b, c, t, f = x.size()
        x = x.permute(0, 2, 1, 3).contiguous().view(b, t, c * f)
        out, _ = self.gru(x)
        return self.fc(out[:, -1, :])


class CRNNAttnPool(nn.Module):
    """Conv1d front-end, GRU, then additive attention pooling over time (softmax over dim=1)."""

    def __init__(self, f=10, hidden=8, classes=3):
        super().__init__()
        self.conv = nn.Conv1d(f, hidden, 5, stride=2, padding=2)
        self.rnn = nn.GRU(hidden, hidden, batch_first=True)
        self.att = nn.Sequential(nn.Linear(hidden, hidden), nn.Tanh(), nn.Linear(hidden, 1, bias=False))
        self.cls = nn.Linear(hidden, classes)

    def forward(self, x):  # [N, T, F]
        h = F.relu(self.conv(x.transpose(1, 2))).transpose(1, 2)
        h, _ = self.rnn(h)
        w = torch.softmax(self.att(h), dim=1)  # [N, T, 1]
        ctx = torch.sum(w * h, dim=1)
        return F.log_softmax(self.cls(ctx), dim=-1)


class ResBlockTC(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, (9, 1), stride=(stride, 1), padding=(4, 0), bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, (9, 1), padding=(4, 0), bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride=(stride, 1), bias=False), nn.BatchNorm2d(cout),
                                      nn.ReLU())

    def forward(self, x):
        identity = x if self.down is None else self.down(x)
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + identity)


class TCResNet(nn.Module):
    """TC-ResNet8: MFCC coefficients as channels, time as height, (k, 1) kernels."""

    def __init__(self, n_mfcc=10, classes=5):
        super().__init__()
        self.first = nn.Conv2d(n_mfcc, 8, (3, 1), padding=(1, 0), bias=False)
        self.blocks = nn.Sequential(ResBlockTC(8, 12, 2), ResBlockTC(12, 12, 1), ResBlockTC(12, 16, 2))
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(16, classes)

    def forward(self, x):  # [N, T, F] -> [N, F, T, 1]
        x = x.permute(0, 2, 1).unsqueeze(-1)
        x = self.blocks(self.first(x))
        return self.fc(self.pool(x).view(x.size(0), -1))


class SepConvBN(nn.Module):
    def __init__(self, cin, cout, k, dilation=1, act=True):
        super().__init__()
        self.dw = nn.Conv1d(cin, cin, k, padding=dilation * (k - 1) // 2, dilation=dilation, groups=cin, bias=False)
        self.pw = nn.Conv1d(cin, cout, 1, bias=False)
        self.bn = nn.BatchNorm1d(cout, eps=1e-3)
        self.act = nn.ReLU() if act else nn.Identity()
        self.drop = nn.Dropout(0.1)

    def forward(self, x):
        return self.drop(self.act(self.bn(self.pw(self.dw(x)))))


class MatchboxBlock(nn.Module):
    """NeMo Jasper/Matchbox block: R separable sub-blocks, the last without activation, plus a
    pointwise + BN residual, then ReLU and dropout."""

    def __init__(self, cin, cout, k, repeat=2):
        super().__init__()
        layers = []
        for i in range(repeat):
            layers.append(SepConvBN(cin if i == 0 else cout, cout, k, act=i < repeat - 1))
        self.mconv = nn.ModuleList(layers)
        self.res = nn.Sequential(nn.Conv1d(cin, cout, 1, bias=False), nn.BatchNorm1d(cout, eps=1e-3))
        self.out = nn.Sequential(nn.ReLU(), nn.Dropout(0.1))

    def forward(self, x):
        out = x
        for layer in self.mconv:
            out = layer(out)
        out = out + self.res(x)
        return self.out(out)


class MatchboxNet(nn.Module):
    def __init__(self, f=8, classes=4):
        super().__init__()
        self.prologue = nn.Sequential(nn.Conv1d(f, 16, 11, stride=2, padding=5, bias=False), nn.BatchNorm1d(16),
                                      nn.ReLU())
        self.blocks = nn.Sequential(MatchboxBlock(16, 12, 13), MatchboxBlock(12, 12, 15))
        self.epilogue = nn.Sequential(SepConvBN(12, 16, 7, dilation=2), SepConvBN(16, 16, 1))
        self.decoder = nn.Conv1d(16, classes, 1)

    def forward(self, audio_signal):  # [N, F, T]
        x = self.epilogue(self.blocks(self.prologue(audio_signal)))
        x = F.adaptive_avg_pool1d(self.decoder(x), 1)
        return x.squeeze(-1)


class QuartzSame(nn.Module):
    """QuartzNet-ish block written with padding='same' (dilated, odd and even kernels) and
    channels_last [N, T, C] input/output."""

    def __init__(self, c=8):
        super().__init__()
        self.dw = nn.Conv1d(c, c, 5, padding="same", dilation=2, groups=c)
        self.pw = nn.Conv1d(c, c, 1)
        self.dw_even = nn.Conv1d(c, c, 4, padding="same", groups=c)
        self.bn = nn.BatchNorm1d(c)

    def forward(self, x):  # [N, T, C]
        y = x.transpose(1, 2)
        y = F.relu(self.bn(self.pw(self.dw(y))))
        y = self.dw_even(y)
        return (x.transpose(1, 2) + y).transpose(1, 2)


# ----------------------------------------------------------------------------- conformer / transformers
class FeedForward(nn.Module):
    def __init__(self, d, mult=2):
        super().__init__()
        self.net = nn.Sequential(nn.LayerNorm(d), nn.Linear(d, d * mult), nn.SiLU(), nn.Dropout(0.0),
                                 nn.Linear(d * mult, d), nn.Dropout(0.0))

    def forward(self, x):
        return self.net(x)


class ConvModule(nn.Module):
    def __init__(self, d, k=5):
        super().__init__()
        self.ln = nn.LayerNorm(d)
        self.pw1 = nn.Conv1d(d, 2 * d, 1)
        self.glu = nn.GLU(dim=1)
        self.dw = nn.Conv1d(d, d, k, padding=k // 2, groups=d)
        self.bn = nn.BatchNorm1d(d)
        self.act = nn.SiLU()
        self.pw2 = nn.Conv1d(d, d, 1)

    def forward(self, x):  # [N, T, D]
        x = self.ln(x).transpose(1, 2)
        x = self.glu(self.pw1(x))
        x = self.pw2(self.act(self.bn(self.dw(x))))
        return x.transpose(1, 2)


class ConformerBlock(nn.Module):
    def __init__(self, d=16, heads=2):
        super().__init__()
        self.ff1 = FeedForward(d)
        self.ln_att = nn.LayerNorm(d)
        self.att = nn.MultiheadAttention(d, heads, dropout=0.0, batch_first=True)
        self.conv = ConvModule(d)
        self.ff2 = FeedForward(d)
        self.ln_out = nn.LayerNorm(d)

    def forward(self, x):
        x = x + 0.5 * self.ff1(x)
        y = self.ln_att(x)
        x = x + self.att(y, y, y, need_weights=False)[0]
        x = x + self.conv(x)
        x = x + 0.5 * self.ff2(x)
        return self.ln_out(x)


class SinusoidalPE(nn.Module):
    """The PyTorch tutorial's PositionalEncoding: a [max_len, 1, d] buffer, seq-first input."""

    def __init__(self, d, max_len=32):
        super().__init__()
        position = torch.arange(max_len).unsqueeze(1)
        div_term = torch.exp(torch.arange(0, d, 2) * (-math.log(10000.0) / d))
        pe = torch.zeros(max_len, 1, d)
        pe[:, 0, 0::2] = torch.sin(position * div_term)
        pe[:, 0, 1::2] = torch.cos(position * div_term)
        self.register_buffer("pe", pe)
        self.dropout = nn.Dropout(0.1)

    def forward(self, x):  # [T, N, D]
        return self.dropout(x + self.pe[: x.size(0)])


class SeqFirstTransformer(nn.Module):
    """Seq-first (batch_first=False) encoder with the tutorial's PE, input scaled by sqrt(d), a
    float causal mask from nn.Transformer.generate_square_subsequent_mask, mean over time."""

    def __init__(self, f=6, d=16, t=6, classes=3):
        super().__init__()
        self.d = d
        self.inp = nn.Linear(f, d)
        self.pos = SinusoidalPE(d)
        layer = nn.TransformerEncoderLayer(d, 2, 32, dropout=0.1)
        self.enc = nn.TransformerEncoder(layer, 1, enable_nested_tensor=False)
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(t))
        self.out = nn.Linear(d, classes)

    def forward(self, src):  # [T, N, F]
        x = self.pos(self.inp(src) * math.sqrt(self.d))
        x = self.enc(x, mask=self.mask)
        return self.out(x.mean(dim=0))


class RMSNorm(nn.Module):
    def __init__(self, d, eps=1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d))

    def _norm(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)

    def forward(self, x):
        return self._norm(x.float()).type_as(x) * self.weight


class TinyLlamaBlock(nn.Module):
    """A llama-style block: RMSNorm, fused qkv split with torch.split, einsum attention with a
    registered causal bool mask via masked_fill(-inf), SwiGLU MLP."""

    def __init__(self, d=16, heads=2, t=6):
        super().__init__()
        self.h, self.hd = heads, d // heads
        self.norm1, self.norm2 = RMSNorm(d), RMSNorm(d)
        self.wqkv = nn.Linear(d, 3 * d, bias=False)
        self.wo = nn.Linear(d, d, bias=False)
        self.w1 = nn.Linear(d, 2 * d, bias=False)
        self.w3 = nn.Linear(d, 2 * d, bias=False)
        self.w2 = nn.Linear(2 * d, d, bias=False)
        self.register_buffer("causal", torch.triu(torch.ones(t, t, dtype=torch.bool), diagonal=1))

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = torch.split(self.wqkv(self.norm1(x)), [d, d, d], dim=-1)
        q = q.reshape(b, t, self.h, self.hd)
        k = k.reshape(b, t, self.h, self.hd)
        v = v.reshape(b, t, self.h, self.hd)
        att = torch.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(self.hd)
        att = att.masked_fill(self.causal[:t, :t], float("-inf"))
        att = F.softmax(att.float(), dim=-1).type_as(q)
        y = torch.einsum("bhqk,bkhd->bqhd", att, v).reshape(b, t, d)
        x = x + self.wo(y)
        h = self.norm2(x)
        return x + self.w2(F.silu(self.w1(h)) * self.w3(h))


class HandLayerNorm(nn.Module):
    """LayerNorm written out (mean, biased variance, sqrt) - the BERT/TF port style."""

    def __init__(self, d, eps=1e-12):
        super().__init__()
        self.gamma = nn.Parameter(torch.ones(d))
        self.beta = nn.Parameter(torch.zeros(d))
        self.eps = eps

    def forward(self, x):
        u = x.mean(-1, keepdim=True)
        s = (x - u).pow(2).mean(-1, keepdim=True)
        x = (x - u) / torch.sqrt(s + self.eps)
        return self.gamma * x + self.beta


class KWTLite(nn.Module):
    """Keyword Transformer: patches of time frames, a class token and a learned position table
    (nn.Parameter), pre-norm block with hand-written LayerNorm and GELU(tanh), class-token head."""

    def __init__(self, f=8, t=6, d=16, classes=4):
        super().__init__()
        self.proj = nn.Linear(f, d)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, d))
        self.pos_embed = nn.Parameter(torch.randn(1, t + 1, d) * 0.02)
        self.ln1, self.ln2, self.ln_f = HandLayerNorm(d), HandLayerNorm(d), HandLayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj_o = nn.Linear(d, d)
        self.fc1, self.fc2 = nn.Linear(d, 2 * d), nn.Linear(2 * d, d)
        self.heads = 2
        self.head = nn.Linear(d, classes)
        nn.init.normal_(self.cls_token, std=0.5)

    def forward(self, x):  # [N, T, F]
        x = self.proj(x)
        b, n, d = x.shape
        x = torch.cat((self.cls_token.expand(b, -1, -1), x), dim=1) + self.pos_embed
        qkv = self.qkv(self.ln1(x)).reshape(b, n + 1, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        a = (q @ k.transpose(-2, -1)) * (d // self.heads) ** -0.5
        y = (a.softmax(dim=-1) @ v).transpose(1, 2).reshape(b, n + 1, d)
        x = x + self.proj_o(y)
        x = x + self.fc2(F.gelu(self.fc1(self.ln2(x)), approximate="tanh"))
        return self.head(self.ln_f(x)[:, 0])


class MHAMaskedPool(nn.Module):
    """nn.MultiheadAttention with a learned query (attention pooling) and a constant key padding
    mask buffer: the last frames are padding."""

    def __init__(self, d=16, t=6, valid=4, classes=3):
        super().__init__()
        self.query = nn.Parameter(torch.randn(1, 1, d) * 0.5)
        self.att = nn.MultiheadAttention(d, 4, batch_first=True)
        self.register_buffer("pad", torch.arange(t) >= valid)
        self.fc = nn.Linear(d, classes)

    def forward(self, x):  # [N, T, D]
        q = self.query.expand(x.size(0), -1, -1)
        mask = self.pad.unsqueeze(0).expand(x.size(0), -1)
        y, _ = self.att(q, x, x, key_padding_mask=mask, need_weights=False)
        return self.fc(y.squeeze(1))


class TransformerDecoderTiny(nn.Module):
    def __init__(self, d=16):
        super().__init__()
        self.dec = nn.TransformerDecoderLayer(d, 2, 32, dropout=0.0, batch_first=True, norm_first=True)

    def forward(self, tgt, memory):
        return self.dec(tgt, memory)


# ----------------------------------------------------------------------------- TCN / WaveNet
class Chomp1d(nn.Module):
    def __init__(self, chomp_size):
        super().__init__()
        self.chomp_size = chomp_size

    def forward(self, x):
        return x[:, :, :-self.chomp_size].contiguous()


class TemporalBlock(nn.Module):
    """locuslab/TCN: conv, Chomp1d, ReLU, dropout twice, 1x1 downsample residual."""

    def __init__(self, n_in, n_out, k, dilation, dropout=0.2):
        super().__init__()
        padding = (k - 1) * dilation
        self.conv1 = nn.Conv1d(n_in, n_out, k, padding=padding, dilation=dilation)
        self.chomp1 = Chomp1d(padding)
        self.relu1 = nn.ReLU()
        self.dropout1 = nn.Dropout(dropout)
        self.conv2 = nn.Conv1d(n_out, n_out, k, padding=padding, dilation=dilation)
        self.chomp2 = Chomp1d(padding)
        self.relu2 = nn.ReLU()
        self.dropout2 = nn.Dropout(dropout)
        self.net = nn.Sequential(self.conv1, self.chomp1, self.relu1, self.dropout1,
                                 self.conv2, self.chomp2, self.relu2, self.dropout2)
        self.downsample = nn.Conv1d(n_in, n_out, 1) if n_in != n_out else None
        self.relu = nn.ReLU()

    def forward(self, x):
        out = self.net(x)
        res = x if self.downsample is None else self.downsample(x)
        return self.relu(out + res)


class LocusTCN(nn.Module):
    def __init__(self, n_in=3, channels=(6, 6, 8), k=3, classes=4):
        super().__init__()
        layers = []
        for i, c in enumerate(channels):
            layers.append(TemporalBlock(n_in if i == 0 else channels[i - 1], c, k, 2 ** i))
        self.network = nn.Sequential(*layers)
        self.linear = nn.Linear(channels[-1], classes)

    def forward(self, x):  # [N, C, T]
        y = self.network(x)
        return F.log_softmax(self.linear(y[:, :, -1]), dim=1)


class WeightNormTCN(nn.Module):
    """TCN block whose convs carry torch.nn.utils.parametrizations.weight_norm (as trained)."""

    def __init__(self, c=4, k=3):
        super().__init__()
        wn = nn.utils.parametrizations.weight_norm
        self.c1 = wn(nn.Conv1d(c, c, k, dilation=1))
        self.c2 = wn(nn.Conv1d(c, c, k, dilation=2))
        self.k = k

    def forward(self, x):
        y = F.relu(self.c1(F.pad(x, (self.k - 1, 0))))
        y = F.relu(self.c2(F.pad(y, (2 * (self.k - 1), 0))))
        return y + x


class WaveNetStack(nn.Module):
    """WaveNet: causal input conv, residual layers with dilations 1..8, gated tanh*sigmoid, skips
    summed in a Python list, ReLU -> 1x1 -> ReLU -> 1x1 head, softmax over channels."""

    def __init__(self, cin=1, res=8, skip=8, out=6, dilations=(1, 2, 4, 8)):
        super().__init__()
        self.causal = nn.Conv1d(cin, res, 2)
        self.dil = dilations
        self.filters = nn.ModuleList(nn.Conv1d(res, res, 2, dilation=d) for d in dilations)
        self.gates = nn.ModuleList(nn.Conv1d(res, res, 2, dilation=d) for d in dilations)
        self.res = nn.ModuleList(nn.Conv1d(res, res, 1) for _ in dilations)
        self.skips = nn.ModuleList(nn.Conv1d(res, skip, 1) for _ in dilations)
        self.end1 = nn.Conv1d(skip, skip, 1)
        self.end2 = nn.Conv1d(skip, out, 1)

    def forward(self, x):  # [N, 1, T]
        x = self.causal(F.pad(x, (1, 0)))
        skips = []
        for i, d in enumerate(self.dil):
            h = F.pad(x, (d, 0))
            z = torch.tanh(self.filters[i](h)) * torch.sigmoid(self.gates[i](h))
            skips.append(self.skips[i](z))
            x = x + self.res[i](z)
        s = sum(skips)
        return F.softmax(self.end2(F.relu(self.end1(F.relu(s)))), dim=1)


# ----------------------------------------------------------------------------- recurrent
class StreamingGRU(nn.Module):
    """Streaming KWS: the caller passes the hidden state in and gets the new one back."""

    def __init__(self, f=6, hidden=8, classes=3):
        super().__init__()
        self.gru = nn.GRU(f, hidden, num_layers=1, batch_first=True)
        self.fc = nn.Linear(hidden, classes)

    def forward(self, x, h0):
        out, hn = self.gru(x, h0)
        return self.fc(out[:, -1]), hn


class LSTMNewZeros(nn.Module):
    """h0/c0 built with x.new_zeros / torch.zeros(..., device=x.device), 2 layers, dropout."""

    def __init__(self, f=4, hidden=8, layers=2, classes=3):
        super().__init__()
        self.hidden, self.layers = hidden, layers
        self.lstm = nn.LSTM(f, hidden, layers, batch_first=True, dropout=0.1)
        self.fc = nn.Linear(hidden, classes)

    def forward(self, x):
        h0 = x.new_zeros(self.layers, x.size(0), self.hidden)
        c0 = torch.zeros(self.layers, x.size(0), self.hidden, device=x.device)
        out, (hn, cn) = self.lstm(x, (h0, c0))
        return self.fc(hn[-1])


class BiGRULastStates(nn.Module):
    """Bi-GRU, 2 layers: forward direction's last step and backward direction's first step."""

    def __init__(self, f=4, hidden=6, classes=3):
        super().__init__()
        self.h = hidden
        self.rnn = nn.GRU(f, hidden, num_layers=2, batch_first=True, bidirectional=True)
        self.fc = nn.Linear(2 * hidden, classes)

    def forward(self, x):
        out, _ = self.rnn(x)
        fwd = out[:, -1, :self.h]
        bwd = out[:, 0, self.h:]
        return self.fc(torch.cat([fwd, bwd], dim=1))


class LSTMAutoencoder(nn.Module):
    """LSTM autoencoder for anomaly detection: encode, repeat h_n over time, decode, per-step Linear."""

    def __init__(self, f=3, hidden=6, t=5):
        super().__init__()
        self.t = t
        self.enc = nn.LSTM(f, hidden, batch_first=True)
        self.dec = nn.LSTM(hidden, hidden, batch_first=True)
        self.out = nn.Linear(hidden, f)

    def forward(self, x):
        _, (h, _) = self.enc(x)
        z = h[-1].unsqueeze(1).repeat(1, self.t, 1)
        y, _ = self.dec(z)
        return self.out(y)


class BiLSTMHidden(nn.Module):
    """Bi-LSTM classifier from h_n: cat(h_n[-2], h_n[-1]) (the text-classification idiom)."""

    def __init__(self, f=4, hidden=6, classes=3):
        super().__init__()
        self.lstm = nn.LSTM(f, hidden, batch_first=True, bidirectional=True)
        self.fc = nn.Linear(2 * hidden, classes)

    def forward(self, x):
        _, (h_n, _) = self.lstm(x)
        return self.fc(torch.cat((h_n[-2, :, :], h_n[-1, :, :]), dim=1))


class GRUCellFlipped(nn.Module):
    """Hand-made bidirectional GRUCell loop over x and x.flip(1), outputs stacked over time."""

    def __init__(self, f=4, hidden=6):
        super().__init__()
        self.hidden = hidden
        self.fw = nn.GRUCell(f, hidden)
        self.bw = nn.GRUCell(f, hidden)

    def forward(self, x):
        b, t, _ = x.shape
        hf = x.new_zeros(b, self.hidden)
        hb = x.new_zeros(b, self.hidden)
        outs_f, outs_b = [], []
        xr = x.flip(1)
        for i in range(t):
            hf = self.fw(x[:, i, :], hf)
            hb = self.bw(xr[:, i, :], hb)
            outs_f.append(hf)
            outs_b.append(hb)
        return torch.cat([torch.stack(outs_f, dim=1), torch.stack(outs_b[::-1], dim=1)], dim=-1)


# ----------------------------------------------------------------------------- time-series forecasting
class MovingAvg(nn.Module):
    """DLinear's moving average: replicate the ends by repeat + cat, AvgPool1d over [N, C, T]."""

    def __init__(self, kernel_size):
        super().__init__()
        self.kernel_size = kernel_size
        self.avg = nn.AvgPool1d(kernel_size=kernel_size, stride=1, padding=0)

    def forward(self, x):  # [N, T, C]
        front = x[:, 0:1, :].repeat(1, (self.kernel_size - 1) // 2, 1)
        end = x[:, -1:, :].repeat(1, (self.kernel_size - 1) // 2, 1)
        x = torch.cat([front, x, end], dim=1)
        x = self.avg(x.permute(0, 2, 1))
        return x.permute(0, 2, 1)


class DLinear(nn.Module):
    def __init__(self, seq_len=12, pred_len=4, k=5):
        super().__init__()
        self.decomp = MovingAvg(k)
        self.lin_seasonal = nn.Linear(seq_len, pred_len)
        self.lin_trend = nn.Linear(seq_len, pred_len)

    def forward(self, x):  # [N, T, C]
        trend = self.decomp(x)
        seasonal = x - trend
        s = self.lin_seasonal(seasonal.permute(0, 2, 1))
        t = self.lin_trend(trend.permute(0, 2, 1))
        return (s + t).permute(0, 2, 1)


class PatchTSTLite(nn.Module):
    """PatchTST: channel-independent patches via Tensor.unfold, linear embedding + learned positions,
    one encoder layer, flatten head.  Instance normalisation (RevIN) by hand, de-normalised after."""

    def __init__(self, c=2, seq_len=16, patch=4, stride=4, d=16, pred=4):
        super().__init__()
        self.patch, self.stride = patch, stride
        n = (seq_len - patch) // stride + 1
        self.embed = nn.Linear(patch, d)
        self.pos = nn.Parameter(torch.randn(1, n, d) * 0.1)
        self.enc = nn.TransformerEncoderLayer(d, 2, 32, dropout=0.0, batch_first=True, activation="gelu")
        self.head = nn.Linear(n * d, pred)

    def forward(self, x):  # [N, T, C]
        means = x.mean(1, keepdim=True).detach()
        x = x - means
        stdev = torch.sqrt(torch.var(x, dim=1, keepdim=True, unbiased=False) + 1e-5)
        x = x / stdev
        b, t, c = x.shape
        z = x.permute(0, 2, 1).unfold(dimension=-1, size=self.patch, step=self.stride)  # [N, C, n, p]
        z = z.reshape(b * c, z.shape[2], z.shape[3])
        z = self.enc(self.embed(z) + self.pos)
        y = self.head(z.flatten(start_dim=-2)).reshape(b, c, -1).permute(0, 2, 1)
        return y * stdev + means


class NBeatsBlock(nn.Module):
    def __init__(self, back=12, fore=4, units=16):
        super().__init__()
        self.fc = nn.Sequential(nn.Linear(back, units), nn.ReLU(), nn.Linear(units, units), nn.ReLU())
        self.theta_b = nn.Linear(units, back, bias=False)
        self.theta_f = nn.Linear(units, fore, bias=False)

    def forward(self, x):
        h = self.fc(x)
        return self.theta_b(h), self.theta_f(h)


class NBeats(nn.Module):
    """N-BEATS generic: residual backcast subtraction, forecasts summed; returns a dict."""

    def __init__(self, back=12, fore=4, blocks=3):
        super().__init__()
        self.blocks = nn.ModuleList(NBeatsBlock(back, fore) for _ in range(blocks))

    def forward(self, x):  # [N, back]
        residuals = x.flip(dims=(1,))
        forecast = 0.0
        for block in self.blocks:
            b, f = block(residuals)
            residuals = residuals - b
            forecast = forecast + f
        return {"forecast": forecast, "residual": residuals}


class GatedResidualNetwork(nn.Module):
    """TFT's GRN: ELU, dropout, GLU gate, add & LayerNorm, optional skip projection."""

    def __init__(self, cin=6, hidden=8, cout=8):
        super().__init__()
        self.skip = nn.Linear(cin, cout)
        self.fc1 = nn.Linear(cin, hidden)
        self.elu = nn.ELU()
        self.fc2 = nn.Linear(hidden, hidden)
        self.gate = nn.Linear(hidden, 2 * cout)
        self.norm = nn.LayerNorm(cout)

    def forward(self, x):
        residual = self.skip(x)
        h = self.fc2(self.elu(self.fc1(x)))
        return self.norm(F.glu(self.gate(h), dim=-1) + residual)


class InceptionTime(nn.Module):
    """InceptionTime module: bottleneck, three kernel sizes, MaxPool1d(3, 1, 1) branch, cat, BN, ReLU,
    shortcut, GAP head."""

    def __init__(self, cin=3, nf=4, classes=3):
        super().__init__()
        self.bottleneck = nn.Conv1d(cin, nf, 1, bias=False)
        self.convs = nn.ModuleList(nn.Conv1d(nf, nf, k, padding=k // 2, bias=False) for k in (9, 5, 3))
        self.mp = nn.MaxPool1d(3, stride=1, padding=1)
        self.mp_conv = nn.Conv1d(cin, nf, 1, bias=False)
        self.bn = nn.BatchNorm1d(4 * nf)
        self.short = nn.Sequential(nn.Conv1d(cin, 4 * nf, 1, bias=False), nn.BatchNorm1d(4 * nf))
        self.gap = nn.AdaptiveAvgPool1d(1)
        self.fc = nn.Linear(4 * nf, classes)

    def forward(self, x):
        b = self.bottleneck(x)
        y = torch.cat([c(b) for c in self.convs] + [self.mp_conv(self.mp(x))], dim=1)
        y = F.relu(F.relu(self.bn(y)) + self.short(x))
        return self.fc(self.gap(y).squeeze(-1))


# ----------------------------------------------------------------------------- audio conv nets
class SE1d(nn.Module):
    def __init__(self, c, r=4):
        super().__init__()
        self.fc1 = nn.Linear(c, c // r)
        self.fc2 = nn.Linear(c // r, c)

    def forward(self, x):  # [N, C, T]
        s = x.mean(dim=-1)
        s = torch.sigmoid(self.fc2(F.relu(self.fc1(s))))
        return x * s.unsqueeze(-1)


class ActZoo1d(nn.Module):
    """Conv1d stack with SiLU, GELU(tanh), Mish, Hardswish, SE, MaxPool1d, AdaptiveAvgPool1d(2)
    and a logsumexp-over-time (LSE pooling) head next to the average."""

    def __init__(self, cin=2, c=8, classes=3):
        super().__init__()
        self.c1 = nn.Conv1d(cin, c, 3, padding=1)
        self.c2 = nn.Conv1d(c, c, 3, padding=1, groups=2)
        self.c3 = nn.Conv1d(c, c, 3, padding=1)
        self.c4 = nn.Conv1d(c, c, 1)
        self.se = SE1d(c)
        self.pool = nn.AdaptiveAvgPool1d(2)
        self.fc = nn.Linear(2 * c + c, classes)

    def forward(self, x):
        x = F.silu(self.c1(x))
        x = F.gelu(self.c2(x), approximate="tanh")
        x = F.max_pool1d(x, 2)
        x = F.mish(self.c3(x))
        x = self.se(F.hardswish(self.c4(x)))
        lse = torch.logsumexp(x, dim=-1)
        return self.fc(torch.cat([self.pool(x).flatten(1), lse], dim=1))


class SincLikeFrontend(nn.Module):
    """A fixed filterbank written with F.conv1d on a buffer, log compression of the energy
    (log(x^2 + eps)), per-utterance mean normalisation, then a small classifier."""

    def __init__(self, taps=9, bands=6, classes=3):
        super().__init__()
        t = torch.arange(taps) - taps // 2
        f = torch.linspace(0.05, 0.4, bands).unsqueeze(1)
        w = torch.cos(2 * math.pi * f * t) * torch.hann_window(taps, periodic=False)
        self.register_buffer("fb", w.unsqueeze(1))  # [bands, 1, taps]
        self.conv = nn.Conv1d(bands, 8, 3, padding=1)
        self.fc = nn.Linear(8, classes)

    def forward(self, wav):  # [N, 1, T]
        e = F.conv1d(wav, self.fb, stride=2, padding=self.fb.shape[-1] // 2)
        e = torch.log(e ** 2 + 1e-3)
        e = e - e.mean(dim=-1, keepdim=True)
        h = F.relu(self.conv(e))
        return self.fc(F.adaptive_max_pool1d(h, 1).view(h.size(0), -1))


class ReZeroGLU(nn.Module):
    """Residual with a learned scalar (ReZero, alpha Parameter of shape [1]) over a GLU FFN, with
    padding via nn.ConstantPad1d / nn.ZeroPad1d causal convs."""

    def __init__(self, c=8):
        super().__init__()
        self.pad = nn.ConstantPad1d((2, 0), 0.0)
        self.conv = nn.Conv1d(c, 2 * c, 3)
        self.zpad = nn.ZeroPad1d((1, 1))
        self.conv2 = nn.Conv1d(c, c, 3)
        self.alpha = nn.Parameter(torch.tensor([0.3]))

    def forward(self, x):  # [N, C, T]
        y = F.glu(self.conv(self.pad(x)), dim=1)
        y = self.conv2(self.zpad(y))
        return x + self.alpha * y


class LayerNormOverTC(nn.Module):
    """F.layer_norm over the last two dims [T, C] and a channels-first 1-D LayerNorm by hand
    (mean over dim=1)."""

    def __init__(self, t=6, c=8):
        super().__init__()
        self.fc = nn.Linear(c, c)
        self.w = nn.Parameter(torch.ones(t, c) * 1.2)
        self.b = nn.Parameter(torch.zeros(t, c) + 0.1)
        self.conv = nn.Conv1d(c, c, 3, padding=1)

    def forward(self, x):  # [N, T, C]
        y = F.layer_norm(self.fc(x), (x.shape[1], x.shape[2]), self.w, self.b)
        z = self.conv(y.transpose(1, 2))  # [N, C, T]
        mu = z.mean(1, keepdim=True)
        var = (z - mu).pow(2).mean(1, keepdim=True)
        return ((z - mu) / (var + 1e-5).sqrt()).transpose(1, 2)


SEQ_MODELS = [
    # keyword spotting
    ("kws_crnn_gru", CRNN, [(2, 1, 3, 8)]),
    ("kws_conv_gru_attention_pool", CRNNAttnPool, [(2, 4, 10)]),
    ("tc_resnet8", TCResNet, [(2, 8, 10)]),
    ("matchboxnet", MatchboxNet, [(2, 8, 8)]),
    ("quartznet_same_padding", QuartzSame, [(2, 9, 8)]),
    # transformers
    ("conformer_block", lambda: ConformerBlock(d=8), [(2, 4, 8)]),
    ("seq_first_transformer_pe_mask", SeqFirstTransformer, [(6, 2, 6)]),
    ("llama_block_rmsnorm_swiglu", TinyLlamaBlock, [(2, 6, 16)]),
    ("kwt_hand_layernorm", KWTLite, [(2, 6, 8)]),
    ("mha_query_pool_padding_mask", MHAMaskedPool, [(2, 6, 16)]),
    ("transformer_decoder_layer", TransformerDecoderTiny, [(2, 3, 16), (2, 5, 16)]),
    # TCN / WaveNet
    ("locus_tcn_chomp", LocusTCN, [(2, 3, 12)]),
    ("tcn_weight_norm", WeightNormTCN, [(2, 4, 10)]),
    ("wavenet_stack_skips", WaveNetStack, [(2, 1, 12)]),
    # recurrent
    ("streaming_gru_h0_in_out", StreamingGRU, [(2, 2, 6), (1, 2, 8)]),
    ("lstm_new_zeros_2layer", LSTMNewZeros, [(2, 3, 4)]),
    ("bigru_2layer_last_states", BiGRULastStates, [(2, 2, 4)]),
    ("lstm_autoencoder", LSTMAutoencoder, [(2, 5, 3)]),
    ("bilstm_h_n_cat", BiLSTMHidden, [(2, 2, 4)]),
    ("grucell_bidir_flip", GRUCellFlipped, [(2, 2, 4)]),
    # forecasting
    ("dlinear", DLinear, [(2, 12, 3)]),
    ("patchtst_revin_unfold", PatchTSTLite, [(2, 16, 2)]),
    ("nbeats_dict", NBeats, [(2, 12)]),
    ("tft_grn", GatedResidualNetwork, [(2, 5, 6)]),
    ("inception_time", InceptionTime, [(2, 3, 16)]),
    # audio conv nets
    ("act_zoo_1d_se_lse", ActZoo1d, [(2, 2, 16)]),
    ("fixed_filterbank_log_energy", SincLikeFrontend, [(2, 1, 32)]),
    ("rezero_glu_constpad", ReZeroGLU, [(2, 8, 10)]),
    ("layernorm_tc_and_channels_first", LayerNormOverTC, [(2, 6, 8)]),
]


# ----------------------------------------------------------------------------- streaming state, masks, norms
class StreamingConvState(nn.Module):
    """Streaming KWS conv: the caller keeps the last k-1 frames; cat(state, x) in, the new state out."""

    def __init__(self, c=4, k=3, classes=2):
        super().__init__()
        self.k = k
        self.conv = nn.Conv1d(c, 8, k)
        self.fc = nn.Linear(8, classes)

    def forward(self, x, state):  # x [N, C, T], state [N, C, k - 1]
        buf = torch.cat([state, x], dim=-1)
        y = F.relu(self.conv(buf))
        return self.fc(y.mean(-1)), buf[:, :, -(self.k - 1):]


class StreamingLSTM(nn.Module):
    """Seq-first LSTM with the caller's (h0, c0), returning the sequence and the new state."""

    def __init__(self, f=4, hidden=8):
        super().__init__()
        self.lstm = nn.LSTM(f, hidden)

    def forward(self, x, h0, c0):
        y, (h, c) = self.lstm(x, (h0, c0))
        return y, h, c


class ProjectedLSTM(nn.Module):
    def __init__(self, f=4, hidden=8, proj=4):
        super().__init__()
        self.lstm = nn.LSTM(f, hidden, batch_first=True, proj_size=proj)
        self.fc = nn.Linear(proj, 2)

    def forward(self, x):
        y, _ = self.lstm(x)
        return self.fc(y[:, -1])


class AnnotatedAttention(nn.Module):
    """The Annotated Transformer's attention: masked_fill(mask == 0, -1e9) with a [1, T, T] tril buffer,
    returning the output and the attention weights."""

    def __init__(self, d=8, t=5):
        super().__init__()
        self.q, self.k, self.v = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d)
        self.register_buffer("mask", torch.tril(torch.ones(1, t, t)))

    def forward(self, x):
        q, k, v = self.q(x), self.k(x), self.v(x)
        scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(q.size(-1))
        scores = scores.masked_fill(self.mask == 0, -1e9)
        p_attn = F.softmax(scores, dim=-1)
        return torch.matmul(p_attn, v), p_attn


class MHAFloatMask(nn.Module):
    """nn.MultiheadAttention with a float -inf causal attn_mask buffer and the default need_weights=True
    (the baddbmm path: the mask is added to the scores)."""

    def __init__(self, d=8, t=5):
        super().__init__()
        self.att = nn.MultiheadAttention(d, 2, batch_first=True)
        self.register_buffer("m", torch.zeros(t, t).masked_fill(torch.ones(t, t).triu(1).bool(), float("-inf")))

    def forward(self, x):
        return self.att(x, x, x, attn_mask=self.m)[0]


class MHABoolMaskWeights(nn.Module):
    """A bool causal mask built in forward, need_weights=True: output and averaged attention weights."""

    def __init__(self, d=8):
        super().__init__()
        self.att = nn.MultiheadAttention(d, 2, batch_first=True)

    def forward(self, x):
        t = x.size(1)
        m = torch.triu(torch.ones(t, t, dtype=torch.bool), diagonal=1)
        return self.att(x, x, x, attn_mask=m, need_weights=True, average_attn_weights=True)


class EncoderPaddingMask(nn.Module):
    def __init__(self, d=8):
        super().__init__()
        self.enc = nn.TransformerEncoderLayer(d, 2, 16, 0.0, batch_first=True)
        self.register_buffer("pad", torch.tensor([[False, False, False, True, True],
                                                  [False, False, False, False, True]]))

    def forward(self, x):
        return self.enc(x, src_key_padding_mask=self.pad)


class RMSNormBlock(nn.Module):
    """torch.nn.RMSNorm (no eps: the dtype's) before a SiLU-gated projection."""

    def __init__(self, d=8):
        super().__init__()
        self.norm = nn.RMSNorm(d)
        self.fc = nn.Linear(d, 2 * d)

    def forward(self, x):
        a, b = self.fc(self.norm(x)).chunk(2, dim=-1)
        return a * F.silu(b)


class MaxPoolReturnIndices(nn.Module):
    """nn.MaxPool1d(return_indices=True) whose indices are dropped (an autoencoder encoder reused)."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv1d(3, 4, 3, padding=1)
        self.pool = nn.MaxPool1d(2, return_indices=True)

    def forward(self, x):
        y, _ = self.pool(F.relu(self.conv(x)))
        return y


class GRUHeadsDict(nn.Module):
    """Frame-level and utterance-level heads from one bias-free GRU, as a dict."""

    def __init__(self):
        super().__init__()
        self.gru = nn.GRU(4, 6, batch_first=True, bias=False)
        self.frame = nn.Linear(6, 2)
        self.utt = nn.Linear(6, 3)

    def forward(self, x):
        y, h = self.gru(x)
        return {"frame": self.frame(y), "utt": F.softmax(self.utt(h.squeeze(0)), dim=-1)}


SEQ_MODELS += [
    ("streaming_conv_state_in_out", StreamingConvState, [(1, 4, 4), (1, 4, 2)]),
    ("streaming_lstm_h0_c0", StreamingLSTM, [(3, 2, 4), (1, 2, 8), (1, 2, 8)]),
    ("lstm_proj_size", ProjectedLSTM, [(2, 3, 4)]),
    ("annotated_attention_1e9", AnnotatedAttention, [(2, 5, 8)]),
    ("mha_float_inf_mask_need_weights", MHAFloatMask, [(2, 5, 8)]),
    ("mha_bool_mask_need_weights", MHABoolMaskWeights, [(2, 5, 8)]),
    ("encoder_src_key_padding_mask", EncoderPaddingMask, [(2, 5, 8)]),
    ("nn_rmsnorm_silu_gate", RMSNormBlock, [(2, 3, 8)]),
    ("maxpool1d_return_indices_dropped", MaxPoolReturnIndices, [(2, 3, 8)]),
    ("gru_no_bias_dict_heads", GRUHeadsDict, [(2, 2, 4)]),
]


# ----------------------------------------------------------------------------- speaker / front-end idioms
class FramedWindowed(nn.Module):
    """Framing a waveform with Tensor.unfold (overlapping hops) and a torch.hann_window made in forward."""

    def __init__(self, frame=8, hop=4):
        super().__init__()
        self.frame, self.hop = frame, hop
        self.fc = nn.Linear(frame, 4)

    def forward(self, wav):  # [N, T]
        frames = wav.unfold(-1, self.frame, self.hop)
        return self.fc(frames * torch.hann_window(self.frame))


class DeltaFeatures(nn.Module):
    """Delta features with torch.diff (prepend the first frame), stacked with the statics; nearest-exact
    time upsampling of a context path."""

    def __init__(self, c=3):
        super().__init__()
        self.ctx = nn.Conv1d(c, c, 3, stride=2, padding=1)

    def forward(self, x):  # [N, C, T]
        delta = torch.diff(x, dim=-1, prepend=x[..., :1])
        ctx = F.interpolate(self.ctx(x), size=x.shape[-1], mode="nearest-exact")
        return torch.cat([x, delta, ctx], dim=1)


class AttentiveStatsPool(nn.Module):
    """ECAPA-TDNN attentive statistics pooling with global context (mean/std repeated over time)."""

    def __init__(self, c=8, a=4):
        super().__init__()
        self.tdnn = nn.Conv1d(3 * c, a, 1)
        self.conv = nn.Conv1d(a, c, 1)

    def forward(self, x):  # [N, C, T]
        t = x.size(-1)
        mean = x.mean(dim=2, keepdim=True)
        std = torch.sqrt(x.var(dim=2, keepdim=True).clamp(min=1e-4))
        gx = torch.cat((x, mean.repeat(1, 1, t), std.repeat(1, 1, t)), dim=1)
        w = F.softmax(self.conv(torch.tanh(F.relu(self.tdnn(gx)))), dim=2)
        mu = torch.sum(x * w, dim=2)
        sg = torch.sqrt((torch.sum((x ** 2) * w, dim=2) - mu ** 2).clamp(min=1e-4))
        return torch.cat((mu, sg), 1)


class LengthMaskedMean(nn.Module):
    """Padded batch: a length buffer, mask = arange(T) >= lengths, masked_fill(mask, 0), sum / lengths."""

    def __init__(self, c=4):
        super().__init__()
        self.register_buffer("lengths", torch.tensor([5, 3]))
        self.fc = nn.Linear(c, c)

    def forward(self, x):  # [N, T, C]
        mask = torch.arange(x.size(1))[None, :] >= self.lengths[:, None]
        y = self.fc(x).masked_fill(mask[:, :, None], 0.0)
        return y.sum(1) / self.lengths[:, None]


class VectorAttentionPool(nn.Module):
    """Attention pooling with a context vector parameter: tanh(W x) @ w (a 1-D right operand)."""

    def __init__(self, c=8):
        super().__init__()
        self.fc = nn.Linear(c, c)
        self.w = nn.Parameter(torch.randn(c) * 0.5)

    def forward(self, x):  # [N, T, C]
        a = F.softmax(torch.tanh(self.fc(x)) @ self.w, dim=1).unsqueeze(-1)
        return (a * x).sum(1)


class WhereMaskAttention(nn.Module):
    """Causal attention written with torch.where(mask, scores, -inf) on a bool buffer."""

    def __init__(self, d=8, t=5):
        super().__init__()
        self.q = nn.Linear(d, d)
        self.register_buffer("allowed", torch.tril(torch.ones(t, t, dtype=torch.bool)))

    def forward(self, x):
        scores = self.q(x) @ x.transpose(1, 2) / math.sqrt(x.size(-1))
        return F.softmax(torch.where(self.allowed, scores, float("-inf")), dim=-1) @ x


SEQ_MODELS += [
    ("where_minus_inf_causal_attention", WhereMaskAttention, [(2, 5, 8)]),
    ("framing_unfold_hann_window", FramedWindowed, [(2, 24)]),
    ("delta_diff_nearest_exact", DeltaFeatures, [(2, 3, 8)]),
    ("ecapa_attentive_stats_pool", AttentiveStatsPool, [(2, 8, 6)]),
    ("length_masked_mean", LengthMaskedMean, [(2, 5, 4)]),
    ("vector_attention_pool", VectorAttentionPool, [(4, 5, 8)]),
]
