"""Real-world idioms (see tests/test_idioms.py): small models written the way people write them and that
tests/corpus_models.py does not cover - torch.nn's attention and recurrent modules, transformer layers,
SDPA with masks, embeddings, interpolation, normalisations, elementwise math, einsum, the
EfficientNet/ResNet/UNet/TCN building blocks, heads and several outputs; then (:data:`BLOCKS`) timm /
torchvision / audio blocks: ConvNeXt, SE/CBAM/ECA, Swin windows, MobileViT unfold, ViT/Mixer, WaveNet, ShuffleNet.

Each entry of :data:`IDIOMS` is ``(name, factory, input shapes)``.  Shapes are tiny.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class Fn(nn.Module):
    """``fn(x, *inputs)`` as a module, with optional submodules (``mods``) the function reads as ``self``."""

    def __init__(self, fn, **mods):
        super().__init__()
        self.fn = fn
        for k, v in mods.items():
            setattr(self, k, v)

    def forward(self, *xs):
        return self.fn(self, *xs)


# ----------------------------------------------------------------------------- attention
class MHA(nn.Module):
    def __init__(self, d=16, heads=2, batch_first=True, need_weights=False):
        super().__init__()
        self.attn = nn.MultiheadAttention(d, heads, batch_first=batch_first)
        self.need_weights = need_weights

    def forward(self, x):
        y, w = self.attn(x, x, x, need_weights=self.need_weights)
        return (y, w) if self.need_weights else y


class MHACross(nn.Module):
    def __init__(self, d=16, heads=4):
        super().__init__()
        self.attn = nn.MultiheadAttention(d, heads, batch_first=True)

    def forward(self, q, kv):
        return self.attn(q, kv, kv, need_weights=False)[0]


class Encoder(nn.Module):
    def __init__(self, d=16, heads=2, norm_first=False, activation="relu", layers=1):
        super().__init__()
        layer = nn.TransformerEncoderLayer(d, heads, dim_feedforward=32, dropout=0.0, activation=activation,
                                           batch_first=True, norm_first=norm_first)
        self.enc = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False) if layers > 1 else layer

    def forward(self, x):
        return self.enc(x)


class SDPA(nn.Module):
    def __init__(self, d=16, heads=2, causal=False, mask=None):
        super().__init__()
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.heads = heads
        self.causal = causal
        if mask is not None:
            self.register_buffer("mask", mask)
        else:
            self.mask = None

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        q = q.view(b, t, self.heads, c // self.heads).transpose(1, 2)
        k = k.view(b, t, self.heads, c // self.heads).transpose(1, 2)
        v = v.view(b, t, self.heads, c // self.heads).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=self.mask, is_causal=self.causal)
        return self.proj(y.transpose(1, 2).reshape(b, t, c))


class HandAttention(nn.Module):
    """Single-head attention with a causal mask written with masked_fill and a registered tril buffer."""

    def __init__(self, d=16, t=6):
        super().__init__()
        self.q, self.k, self.v = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d)
        self.register_buffer("tril", torch.tril(torch.ones(t, t)))

    def forward(self, x):
        q, k, v = self.q(x), self.k(x), self.v(x)
        w = q @ k.transpose(-2, -1) * (q.shape[-1] ** -0.5)
        w = w.masked_fill(self.tril == 0, float("-inf"))
        return F.softmax(w, dim=-1) @ v


# ----------------------------------------------------------------------------- recurrent
class RNNOut(nn.Module):
    def __init__(self, rnn, head=None, last=False):
        super().__init__()
        self.rnn = rnn
        self.head = head
        self.last = last

    def forward(self, x):
        y, _ = self.rnn(x)
        if self.last:
            y = y[:, -1]
        return self.head(y) if self.head is not None else y


class GRUHidden(nn.Module):
    def __init__(self):
        super().__init__()
        self.gru = nn.GRU(4, 8, batch_first=True)
        self.fc = nn.Linear(8, 3)

    def forward(self, x):
        _, h = self.gru(x)
        return self.fc(h[-1])


class CellLoop(nn.Module):
    def __init__(self, kind="gru"):
        super().__init__()
        self.kind = kind
        self.cell = nn.GRUCell(4, 8) if kind == "gru" else nn.LSTMCell(4, 8)
        self.fc = nn.Linear(8, 2)

    def forward(self, x):
        b, t, _ = x.shape
        h = torch.zeros(b, 8)
        c = torch.zeros(b, 8)
        for i in range(t):
            if self.kind == "gru":
                h = self.cell(x[:, i], h)
            else:
                h, c = self.cell(x[:, i], (h, c))
        return self.fc(h)


# ----------------------------------------------------------------------------- CNN blocks
class SE(nn.Module):
    def __init__(self, c, r=4):
        super().__init__()
        self.fc1 = nn.Conv2d(c, c // r, 1)
        self.fc2 = nn.Conv2d(c // r, c, 1)

    def forward(self, x):
        s = F.adaptive_avg_pool2d(x, 1)
        return x * torch.sigmoid(self.fc2(F.silu(self.fc1(s))))


class MBConv(nn.Module):
    def __init__(self, cin=8, cout=8, expand=2, stride=1):
        super().__init__()
        mid = cin * expand
        self.expand = nn.Sequential(nn.Conv2d(cin, mid, 1, bias=False), nn.BatchNorm2d(mid), nn.SiLU())
        self.dw = nn.Sequential(nn.Conv2d(mid, mid, 3, stride, 1, groups=mid, bias=False), nn.BatchNorm2d(mid),
                                nn.SiLU())
        self.se = SE(mid)
        self.project = nn.Sequential(nn.Conv2d(mid, cout, 1, bias=False), nn.BatchNorm2d(cout))
        self.residual = stride == 1 and cin == cout

    def forward(self, x):
        y = self.project(self.se(self.dw(self.expand(x))))
        return x + y if self.residual else y


class BasicBlock(nn.Module):
    def __init__(self, cin=8, cout=8, stride=1):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        identity = x
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        if self.down is not None:
            identity = self.down(x)
        out += identity
        return self.relu(out)


class DWStack(nn.Module):
    def __init__(self, c=4, n=3):
        super().__init__()
        layers = [nn.Conv2d(3, c, 3, 2, 1), nn.BatchNorm2d(c), nn.ReLU6()]
        for i in range(n):
            layers += [nn.Conv2d(c, c, 3, 1, 1, groups=c, bias=False), nn.BatchNorm2d(c), nn.ReLU6(),
                       nn.Conv2d(c, 2 * c, 1, bias=False), nn.BatchNorm2d(2 * c), nn.ReLU6()]
            c *= 2
        self.body = nn.Sequential(*layers)
        self.head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(c, 4))

    def forward(self, x):
        return self.head(self.body(x))


class UNet(nn.Module):
    def __init__(self, mode="nearest"):
        super().__init__()
        self.e1 = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU())
        self.e2 = nn.Sequential(nn.MaxPool2d(2), nn.Conv2d(4, 8, 3, padding=1), nn.ReLU())
        self.mode = mode
        self.up = nn.ConvTranspose2d(8, 4, 2, stride=2) if mode == "convT" else None
        self.d1 = nn.Sequential(nn.Conv2d(12 if mode != "convT" else 8, 4, 3, padding=1), nn.ReLU())
        self.out = nn.Conv2d(4, 2, 1)

    def forward(self, x):
        a = self.e1(x)
        b = self.e2(a)
        if self.mode == "convT":
            u = self.up(b)
        elif self.mode == "bilinear":
            u = F.interpolate(b, scale_factor=2, mode="bilinear", align_corners=False)
        else:
            u = F.interpolate(b, scale_factor=2, mode="nearest")
        return self.out(self.d1(torch.cat([a, u], dim=1)))


class TCN(nn.Module):
    def __init__(self, c=4, k=3, dilations=(1, 2, 4)):
        super().__init__()
        self.k = k
        self.dil = dilations
        self.inp = nn.Conv1d(2, c, 1)
        self.convs = nn.ModuleList(nn.Conv1d(c, c, k, dilation=d) for d in dilations)
        self.fc = nn.Linear(c, 3)

    def forward(self, x):  # [N, C, T]
        x = self.inp(x)
        for conv, d in zip(self.convs, self.dil):
            x = x + F.relu(conv(F.pad(x, ((self.k - 1) * d, 0))))
        return self.fc(x[:, :, -1])


# ----------------------------------------------------------------------------- helpers
def conv(cin=3, cout=4, k=3, **kw):
    return nn.Conv2d(cin, cout, k, padding=k // 2, **kw)


def lin(i=8, o=8):
    return nn.Linear(i, o)


def _w(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * 0.3


IMG = (1, 3, 8, 8)
IMG2 = (2, 3, 8, 8)
SEQ = (2, 6, 16)   # [N, T, C]
VEC = (2, 8)

IDIOMS = [
    # attention modules
    ("mha_batch_first", lambda: MHA(batch_first=True), [SEQ]),
    ("mha_seq_first", lambda: MHA(batch_first=False), [(6, 2, 16)]),
    ("mha_need_weights", lambda: MHA(need_weights=True), [SEQ]),
    ("mha_b1_4heads", lambda: MHA(heads=4), [(1, 5, 16)]),
    ("mha_cross", MHACross, [(2, 3, 16), (2, 5, 16)]),
    ("encoder_post_norm_relu", lambda: Encoder(), [SEQ]),
    ("encoder_pre_norm_gelu", lambda: Encoder(norm_first=True, activation="gelu"), [SEQ]),
    ("encoder_pre_norm_relu", lambda: Encoder(norm_first=True), [(1, 6, 16)]),
    ("encoder_post_norm_gelu_2layers", lambda: Encoder(activation="gelu", layers=2), [(1, 4, 16)]),
    ("sdpa_plain", lambda: SDPA(), [SEQ]),
    ("sdpa_causal", lambda: SDPA(causal=True), [SEQ]),
    ("sdpa_bool_mask", lambda: SDPA(mask=torch.tril(torch.ones(6, 6, dtype=torch.bool))), [SEQ]),
    ("sdpa_float_mask", lambda: SDPA(mask=torch.triu(torch.full((6, 6), -1e4), 1)), [SEQ]),
    ("hand_causal_attention", HandAttention, [SEQ]),
    # recurrent
    ("gru_seq", lambda: RNNOut(nn.GRU(4, 8, batch_first=True)), [(2, 3, 4)]),
    ("gru_last_head", lambda: RNNOut(nn.GRU(4, 8, batch_first=True), nn.Linear(8, 3), last=True), [(2, 3, 4)]),
    ("gru_hidden", GRUHidden, [(1, 3, 4)]),
    ("gru_2layer_seq_first", lambda: RNNOut(nn.GRU(4, 8, num_layers=2)), [(3, 2, 4)]),
    ("grucell_loop", lambda: CellLoop("gru"), [(2, 3, 4)]),
    ("lstmcell_loop", lambda: CellLoop("lstm"), [(2, 3, 4)]),
    ("bilstm", lambda: RNNOut(nn.LSTM(4, 8, batch_first=True, bidirectional=True)), [(2, 3, 4)]),
    ("bilstm_head", lambda: RNNOut(nn.LSTM(4, 6, batch_first=True, bidirectional=True), nn.Linear(12, 3), True),
     [(1, 3, 4)]),
    ("lstm_last_head", lambda: RNNOut(nn.LSTM(4, 8, batch_first=True), nn.Linear(8, 3), True), [(4, 3, 4)]),
    ("rnn_tanh", lambda: RNNOut(nn.RNN(4, 8, batch_first=True)), [(2, 3, 4)]),
    # embedding / constant index buffers
    ("embedding_pos", lambda: Fn(lambda s, x: x + s.pos(s.idx), pos=nn.Embedding(6, 16),
                                 idx=torch.nn.Buffer(torch.arange(6))), [SEQ]),
    ("embedding_table_param", lambda: Fn(lambda s, x: x + s.pe[:, : x.shape[1]],
                                         pe=nn.Parameter(torch.randn(1, 10, 16) * 0.2)), [SEQ]),
    ("cls_token_cat", lambda: Fn(lambda s, x: s.fc(torch.cat([s.cls.expand(x.shape[0], -1, -1), x], 1)[:, 0]),
                                 cls=nn.Parameter(torch.randn(1, 1, 16) * 0.3), fc=nn.Linear(16, 3)), [SEQ]),
    # interpolation
    ("interp_bilinear_x2", lambda: Fn(lambda s, x: F.interpolate(s.c(x), scale_factor=2, mode="bilinear"),
                                      c=conv()), [IMG]),
    ("interp_bilinear_size", lambda: Fn(lambda s, x: F.interpolate(s.c(x), size=(12, 12), mode="bilinear",
                                                                   align_corners=True), c=conv()), [IMG]),
    ("interp_nearest_size", lambda: Fn(lambda s, x: F.interpolate(s.c(x), size=(16, 16), mode="nearest"),
                                       c=conv()), [IMG2]),
    ("upsample_module_bilinear", lambda: nn.Sequential(conv(), nn.Upsample(scale_factor=2, mode="bilinear")), [IMG]),
    ("interp_linear_1d", lambda: Fn(lambda s, x: F.interpolate(s.c(x), scale_factor=2, mode="linear"),
                                    c=nn.Conv1d(3, 4, 3, padding=1)), [(2, 3, 8)]),
    # normalisations
    ("f_normalize", lambda: Fn(lambda s, x: F.normalize(s.fc(x), dim=-1), fc=lin()), [VEC]),
    ("std_var", lambda: Fn(lambda s, x: (x - x.mean(-1, keepdim=True)) / (x.std(-1, keepdim=True) + 1e-5)), [VEC]),
    ("var_only", lambda: Fn(lambda s, x: s.fc(x).var(dim=1, keepdim=True), fc=lin()), [VEC]),
    ("groupnorm", lambda: nn.Sequential(conv(3, 8), nn.GroupNorm(2, 8), nn.ReLU()), [IMG2]),
    ("instancenorm", lambda: nn.Sequential(conv(3, 8), nn.InstanceNorm2d(8, affine=True), nn.ReLU()), [IMG2]),
    ("layernorm_seq", lambda: nn.Sequential(nn.Linear(16, 16), nn.LayerNorm(16), nn.GELU()), [SEQ]),
    ("rmsnorm_by_hand", lambda: Fn(lambda s, x: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * s.g,
                                   g=nn.Parameter(torch.ones(16))), [SEQ]),
    ("batchnorm1d_mlp", lambda: nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 3)),
     [(4, 8)]),
    # elementwise math
    ("sqrt_abs", lambda: Fn(lambda s, x: torch.sqrt(torch.abs(s.fc(x)) + 0.1), fc=lin()), [VEC]),
    ("rsqrt", lambda: Fn(lambda s, x: torch.rsqrt(F.relu(s.fc(x)) + 0.5), fc=lin()), [VEC]),
    ("exp", lambda: Fn(lambda s, x: torch.exp(s.fc(x) * 0.5), fc=lin()), [VEC]),
    ("log", lambda: Fn(lambda s, x: torch.log(torch.sigmoid(s.fc(x)) + 0.01), fc=lin()), [VEC]),
    ("neg", lambda: Fn(lambda s, x: -s.fc(x), fc=lin()), [VEC]),
    ("square_pow", lambda: Fn(lambda s, x: s.fc(x) ** 2, fc=lin()), [VEC]),
    ("square_pow_method", lambda: Fn(lambda s, x: s.fc(x).pow(2) + x, fc=lin()), [VEC]),
    ("square_mul_self", lambda: Fn(lambda s, x: s.fc(x) * s.fc(x), fc=lin()), [VEC]),
    ("sign", lambda: Fn(lambda s, x: torch.sign(s.fc(x)) * x, fc=lin()), [VEC]),
    ("clamp_min", lambda: Fn(lambda s, x: torch.clamp_min(s.fc(x), 0.1), fc=lin()), [VEC]),
    ("clamp_max_method", lambda: Fn(lambda s, x: s.fc(x).clamp(max=0.5), fc=lin()), [VEC]),
    ("relu6", lambda: Fn(lambda s, x: F.relu6(s.c(x)), c=conv()), [IMG]),
    ("hardtanh_custom", lambda: Fn(lambda s, x: F.hardtanh(s.fc(x), -0.5, 0.5), fc=lin()), [VEC]),
    ("mish", lambda: Fn(lambda s, x: F.mish(s.c(x)), c=conv()), [IMG]),
    ("mish_module", lambda: nn.Sequential(lin(), nn.Mish(), lin()), [VEC]),
    ("softplus", lambda: Fn(lambda s, x: F.softplus(s.fc(x)), fc=lin()), [VEC]),
    ("glu", lambda: Fn(lambda s, x: F.glu(s.fc(x), dim=-1), fc=lin(8, 16)), [VEC]),
    ("prelu_module", lambda: nn.Sequential(conv(3, 4), nn.PReLU(4)), [IMG2]),
    ("prelu_single", lambda: nn.Sequential(lin(), nn.PReLU()), [VEC]),
    ("selu", lambda: nn.Sequential(lin(), nn.SELU()), [VEC]),
    ("celu", lambda: nn.Sequential(lin(), nn.CELU()), [VEC]),
    ("softsign", lambda: nn.Sequential(lin(), nn.Softsign()), [VEC]),
    ("tanhshrink", lambda: nn.Sequential(lin(), nn.Tanhshrink()), [VEC]),
    ("logsigmoid", lambda: nn.Sequential(lin(), nn.LogSigmoid()), [VEC]),
    ("gelu_tanh", lambda: Fn(lambda s, x: F.gelu(s.fc(x), approximate="tanh"), fc=lin()), [VEC]),
    ("swish_beta", lambda: Fn(lambda s, x: s.fc(x) * torch.sigmoid(1.5 * s.fc(x)), fc=lin()), [VEC]),
    ("div_by_tensor", lambda: Fn(lambda s, x: s.a(x) / (torch.sigmoid(s.b(x)) + 0.5), a=lin(), b=lin()), [VEC]),
    ("rsub_scalar", lambda: Fn(lambda s, x: 1 - torch.sigmoid(s.fc(x)), fc=lin()), [VEC]),
    ("where_relu", lambda: Fn(lambda s, x: torch.where(s.fc(x) > 0, s.fc(x), 0.1 * s.fc(x)), fc=lin()), [VEC]),
    ("where_scalar_other", lambda: Fn(lambda s, x: torch.where(x > 0, x, torch.zeros_like(x))), [VEC]),
    ("masked_fill", lambda: Fn(lambda s, x: s.fc(x).masked_fill(x < 0, 0.0), fc=lin()), [VEC]),
    # reductions
    ("mean_dim_tuple", lambda: Fn(lambda s, x: s.fc(torch.mean(s.c(x), dim=(2, 3))), c=conv(), fc=nn.Linear(4, 2)),
     [IMG2]),
    ("mean_dims_12_seq", lambda: Fn(lambda s, x: torch.mean(s.fc(x), dim=(1, 2)), fc=nn.Linear(16, 4)), [SEQ]),
    ("sum_keepdim", lambda: Fn(lambda s, x: s.fc(x) / s.fc(x).abs().sum(-1, keepdim=True).clamp_min(1e-3),
                               fc=lin()), [VEC]),
    ("mean_all", lambda: Fn(lambda s, x: s.fc(x).mean(), fc=lin()), [VEC]),
    ("seq_mean_pool", lambda: Fn(lambda s, x: s.fc(s.enc(x).mean(dim=1)), enc=nn.Linear(16, 16),
                                 fc=nn.Linear(16, 3)), [SEQ]),
    ("seq_max_pool", lambda: Fn(lambda s, x: s.enc(x).max(dim=1)[0], enc=nn.Linear(16, 8)), [SEQ]),
    ("logsumexp", lambda: Fn(lambda s, x: torch.logsumexp(s.fc(x), dim=-1, keepdim=True), fc=lin()), [VEC]),
    ("cumsum", lambda: Fn(lambda s, x: torch.cumsum(s.fc(x), dim=-1), fc=lin()), [VEC]),
    ("amax_keepdim_sub", lambda: Fn(lambda s, x: s.fc(x) - s.fc(x).amax(-1, keepdim=True), fc=lin()), [VEC]),
    ("norm_l2", lambda: Fn(lambda s, x: s.fc(x).norm(dim=-1, keepdim=True), fc=lin()), [VEC]),
    # matmul forms
    ("einsum_bij_bjk", lambda: Fn(lambda s, x: torch.einsum("bij,bjk->bik", s.a(x), s.b(x).transpose(1, 2)),
                                  a=nn.Linear(16, 8), b=nn.Linear(16, 8)), [SEQ]),
    ("einsum_bhqd_bhkd", lambda: Fn(lambda s, x: torch.einsum("bhqd,bhkd->bhqk", s.a(x).view(2, 6, 2, 4).transpose(1, 2),
                                                             s.b(x).view(2, 6, 2, 4).transpose(1, 2)),
                                    a=nn.Linear(16, 8), b=nn.Linear(16, 8)), [SEQ]),
    ("einsum_linear", lambda: Fn(lambda s, x: torch.einsum("btc,dc->btd", x, s.w), w=nn.Parameter(_w(4, 16))),
     [SEQ]),
    ("transpose_matmul", lambda: Fn(lambda s, x: s.a(x).transpose(1, 2) @ s.b(x), a=nn.Linear(16, 4),
                                    b=nn.Linear(16, 4)), [SEQ]),
    ("bmm", lambda: Fn(lambda s, x: torch.bmm(s.a(x), s.b(x).transpose(1, 2)), a=nn.Linear(16, 8),
                       b=nn.Linear(16, 8)), [SEQ]),
    ("addmm", lambda: Fn(lambda s, x: torch.addmm(s.bias, x, s.w), w=nn.Parameter(_w(8, 4)),
                         bias=nn.Parameter(_w(4, seed=1))), [VEC]),
    ("baddbmm", lambda: Fn(lambda s, x: torch.baddbmm(s.a(x) @ s.b(x).transpose(1, 2), s.a(x),
                                                      s.b(x).transpose(1, 2), alpha=0.5),
                           a=nn.Linear(16, 8), b=nn.Linear(16, 8)), [SEQ]),
    ("f_linear_const", lambda: Fn(lambda s, x: F.linear(x, s.w, s.b), w=torch.nn.Buffer(_w(4, 8)),
                                  b=torch.nn.Buffer(_w(4, seed=2))), [VEC]),
    ("f_linear_no_bias", lambda: Fn(lambda s, x: F.relu(F.linear(x, s.w)), w=nn.Parameter(_w(4, 8))), [VEC]),
    ("matmul_param", lambda: Fn(lambda s, x: x @ s.w, w=nn.Parameter(_w(16, 4))), [SEQ]),
    # CNN blocks
    ("mbconv_se", lambda: MBConv(), [(1, 8, 6, 6)]),
    ("mbconv_se_stride2", lambda: MBConv(8, 12, stride=2), [(2, 8, 6, 6)]),
    ("basic_block_iadd", lambda: BasicBlock(), [(2, 8, 6, 6)]),
    ("basic_block_down_iadd", lambda: BasicBlock(8, 16, 2), [(1, 8, 6, 6)]),
    ("dw_separable_stack", DWStack, [(2, 3, 16, 16)]),
    ("unet_nearest", lambda: UNet("nearest"), [IMG]),
    ("unet_bilinear", lambda: UNet("bilinear"), [IMG]),
    ("unet_convT", lambda: UNet("convT"), [IMG2]),
    ("tcn_causal", TCN, [(2, 2, 12)]),
    ("avgpool1d", lambda: nn.Sequential(nn.Conv1d(3, 4, 3, padding=1), nn.AvgPool1d(2), nn.Flatten(),
                                        nn.Linear(16, 3)), [(2, 3, 8)]),
    ("maxpool1d_stride", lambda: nn.Sequential(nn.Conv1d(3, 4, 3), nn.ReLU(), nn.MaxPool1d(3, 2)), [(2, 3, 11)]),
    ("flatten_linear_head", lambda: nn.Sequential(conv(3, 4), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                                                  nn.Linear(64, 5)), [IMG2]),
    ("adaptive_maxpool_head", lambda: nn.Sequential(conv(), nn.AdaptiveMaxPool2d((1, 1)), nn.Flatten(),
                                                    nn.Linear(4, 2)), [IMG2]),
    ("conv_silu_bn", lambda: nn.Sequential(nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), nn.SiLU(),
                                           nn.Conv2d(8, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), nn.SiLU()),
     [(4, 3, 6, 6)]),
    ("conv_hardswish_bn", lambda: nn.Sequential(nn.Conv2d(3, 8, 3, 2, 1, bias=False), nn.BatchNorm2d(8),
                                                nn.Hardswish()), [IMG2]),
    ("avgpool_ceil_pad", lambda: nn.Sequential(conv(), nn.AvgPool2d(3, 2, 1, ceil_mode=True)), [IMG]),
    ("maxpool_pad", lambda: nn.Sequential(conv(), nn.MaxPool2d(3, 2, 1)), [IMG2]),
    ("conv_reflect_pad", lambda: nn.Conv2d(3, 4, 3, padding=1, padding_mode="reflect"), [IMG]),
    ("conv_replicate_pad", lambda: Fn(lambda s, x: s.c(F.pad(x, (1, 1, 1, 1), mode="replicate")),
                                      c=nn.Conv2d(3, 4, 3)), [IMG]),
    ("conv_circular_pad", lambda: nn.Conv2d(3, 4, 3, padding=1, padding_mode="circular"), [IMG]),
    # outputs
    ("tuple_outputs", lambda: Fn(lambda s, x: (s.a(x), F.softmax(s.b(x), -1)), a=lin(8, 3), b=lin(8, 4)), [VEC]),
    ("dict_outputs", lambda: Fn(lambda s, x: {"logits": s.a(x), "emb": s.b(x)}, a=lin(8, 3), b=lin(8, 4)), [VEC]),
    ("list_outputs", lambda: Fn(lambda s, x: [s.a(x), s.b(x)], a=lin(8, 3), b=lin(8, 4)), [VEC]),
    ("softmax_dim1_img", lambda: Fn(lambda s, x: F.softmax(s.c(x), dim=1), c=conv()), [IMG2]),
    ("log_softmax_head", lambda: nn.Sequential(lin(), nn.ReLU(), lin(8, 4), nn.LogSoftmax(dim=1)), [(4, 8)]),
    # sequences [N, T, C]
    ("seq_conv1d_transpose", lambda: Fn(lambda s, x: s.c(x.transpose(1, 2)).transpose(1, 2), c=nn.Conv1d(16, 8, 3,
                                                                                                       padding=1)),
     [SEQ]),
    ("seq_mlp_gelu_residual", lambda: Fn(lambda s, x: x + s.b(F.gelu(s.a(s.ln(x)))), ln=nn.LayerNorm(16),
                                         a=nn.Linear(16, 32), b=nn.Linear(32, 16)), [SEQ]),
    ("seq_glu_gate", lambda: Fn(lambda s, x: s.a(x) * torch.sigmoid(s.b(x)), a=nn.Linear(16, 8),
                                b=nn.Linear(16, 8)), [(4, 3, 16)]),
    ("seq_dwconv1d", lambda: Fn(lambda s, x: s.c(x), c=nn.Conv1d(4, 4, 5, padding=2, groups=4)), [(2, 4, 10)]),
    ("patch_embed", lambda: Fn(lambda s, x: s.p(x).flatten(2).transpose(1, 2), p=nn.Conv2d(3, 16, 4, 4)),
     [IMG2]),
    ("batch4_mlp_dropout", lambda: nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Dropout(0.2), nn.Linear(16, 2)),
     [(4, 8)]),
]


# ----------------------------------------------------------------------------- timm / torchvision style blocks
class LayerNorm2d(nn.LayerNorm):
    """timm's LayerNorm over channels of an NCHW tensor via permute."""

    def forward(self, x):
        return F.layer_norm(x.permute(0, 2, 3, 1), self.normalized_shape, self.weight, self.bias,
                            self.eps).permute(0, 3, 1, 2)


class ConvNeXtBlock(nn.Module):
    def __init__(self, c=8, k=7):
        super().__init__()
        self.dw = nn.Conv2d(c, c, k, padding=k // 2, groups=c)
        self.norm = nn.LayerNorm(c, eps=1e-6)
        self.pw1 = nn.Linear(c, 4 * c)
        self.act = nn.GELU()
        self.pw2 = nn.Linear(4 * c, c)
        self.gamma = nn.Parameter(torch.full((c,), 0.5))

    def forward(self, x):
        y = self.dw(x).permute(0, 2, 3, 1)
        y = self.pw2(self.act(self.pw1(self.norm(y))))
        y = self.gamma * y
        return x + y.permute(0, 3, 1, 2)


class ConvNeXtCF(nn.Module):
    """ConvNeXt block channels-first: LayerNorm2d, 1x1 convs, layer scale as gamma[:, None, None]."""

    def __init__(self, c=8):
        super().__init__()
        self.dw = nn.Conv2d(c, c, 7, padding=3, groups=c)
        self.norm = LayerNorm2d(c)
        self.pw1 = nn.Conv2d(c, 2 * c, 1)
        self.pw2 = nn.Conv2d(2 * c, c, 1)
        self.gamma = nn.Parameter(torch.full((c,), 0.5))

    def forward(self, x):
        y = self.pw2(F.gelu(self.pw1(self.norm(self.dw(x)))))
        return x + y * self.gamma.view(1, -1, 1, 1)


class SEHard(nn.Module):
    """MobileNetV3 squeeze-excite: mean over (2, 3) keepdim, 1x1 convs, ReLU, hardsigmoid."""

    def __init__(self, c=8, r=4):
        super().__init__()
        self.fc1 = nn.Conv2d(c, c // r, 1)
        self.fc2 = nn.Conv2d(c // r, c, 1)

    def forward(self, x):
        s = x.mean((2, 3), keepdim=True)
        s = F.hardsigmoid(self.fc2(F.relu(self.fc1(s))), inplace=True)
        return x * s


class SELinear(nn.Module):
    """torchvision-style SE with Linear layers and view."""

    def __init__(self, c=8, r=2):
        super().__init__()
        self.fc = nn.Sequential(nn.Linear(c, c // r, bias=False), nn.ReLU(inplace=True),
                                nn.Linear(c // r, c, bias=False), nn.Sigmoid())

    def forward(self, x):
        b, c, _, _ = x.size()
        y = F.adaptive_avg_pool2d(x, 1).view(b, c)
        y = self.fc(y).view(b, c, 1, 1)
        return x * y.expand_as(x)


class CBAM(nn.Module):
    def __init__(self, c=8, r=2, k=7):
        super().__init__()
        self.mlp = nn.Sequential(nn.Conv2d(c, c // r, 1, bias=False), nn.ReLU(), nn.Conv2d(c // r, c, 1, bias=False))
        self.spatial = nn.Conv2d(2, 1, k, padding=k // 2, bias=False)

    def forward(self, x):
        ca = torch.sigmoid(self.mlp(F.adaptive_avg_pool2d(x, 1)) + self.mlp(F.adaptive_max_pool2d(x, 1)))
        x = x * ca
        avg = torch.mean(x, dim=1, keepdim=True)
        mx, _ = torch.max(x, dim=1, keepdim=True)
        sa = torch.sigmoid(self.spatial(torch.cat([avg, mx], dim=1)))
        return x * sa


class ECA(nn.Module):
    def __init__(self, k=3):
        super().__init__()
        self.avg = nn.AdaptiveAvgPool2d(1)
        self.conv = nn.Conv1d(1, 1, k, padding=(k - 1) // 2, bias=False)

    def forward(self, x):
        y = self.avg(x)
        y = self.conv(y.squeeze(-1).transpose(-1, -2)).transpose(-1, -2).unsqueeze(-1)
        return x * torch.sigmoid(y).expand_as(x)


class SwinWindows(nn.Module):
    """Swin window partition / reverse via view + permute, attention-free (an MLP per window token)."""

    def __init__(self, c=8, ws=2):
        super().__init__()
        self.ws = ws
        self.fc = nn.Linear(c, c)

    def forward(self, x):  # [B, H, W, C]
        b, h, w, c = x.shape
        ws = self.ws
        win = x.view(b, h // ws, ws, w // ws, ws, c).permute(0, 1, 3, 2, 4, 5).contiguous().view(-1, ws * ws, c)
        win = self.fc(win)
        y = win.view(b, h // ws, w // ws, ws, ws, c).permute(0, 1, 3, 2, 4, 5).contiguous().view(b, h, w, c)
        return x + y


class SwinAttnWindows(nn.Module):
    def __init__(self, c=8, ws=2, heads=2):
        super().__init__()
        self.ws, self.heads = ws, heads
        self.qkv = nn.Linear(c, 3 * c)
        self.proj = nn.Linear(c, c)

    def forward(self, x):  # [B, H, W, C]
        b, h, w, c = x.shape
        ws = self.ws
        win = x.view(b, h // ws, ws, w // ws, ws, c).permute(0, 1, 3, 2, 4, 5).reshape(-1, ws * ws, c)
        bw, n, _ = win.shape
        qkv = self.qkv(win).reshape(bw, n, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        attn = (q * (c // self.heads) ** -0.5) @ k.transpose(-2, -1)
        y = (attn.softmax(dim=-1) @ v).transpose(1, 2).reshape(bw, n, c)
        y = self.proj(y)
        return y.view(b, h // ws, w // ws, ws, ws, c).permute(0, 1, 3, 2, 4, 5).reshape(b, h, w, c)


class MobileViTUnfold(nn.Module):
    """MobileViT: local conv, unfold into patches with reshape/transpose, a transformer-ish MLP, fold back."""

    def __init__(self, c=8, p=2):
        super().__init__()
        self.p = p
        self.local = nn.Conv2d(c, c, 3, padding=1)
        self.ln = nn.LayerNorm(c)
        self.mlp = nn.Sequential(nn.Linear(c, 2 * c), nn.SiLU(), nn.Linear(2 * c, c))
        self.fuse = nn.Conv2d(2 * c, c, 3, padding=1)

    def forward(self, x):
        b, c, h, w = x.shape
        p = self.p
        y = self.local(x)
        # [B, C, H, W] -> [B*p*p, N, C]
        y = y.reshape(b * c * (h // p), p, w // p, p).transpose(1, 2)
        y = y.reshape(b, c, (h // p) * (w // p), p * p).transpose(1, 3).reshape(b * p * p, -1, c)
        y = y + self.mlp(self.ln(y))
        y = y.reshape(b, p * p, -1, c).transpose(1, 3).reshape(b * c * (h // p), w // p, p, p)
        y = y.transpose(1, 2).reshape(b, c, h, w)
        return self.fuse(torch.cat([x, y], 1))


class PatchEmbedPos(nn.Module):
    def __init__(self, c=16, p=4, n=4):
        super().__init__()
        self.proj = nn.Conv2d(3, c, p, p)
        self.pos = nn.Parameter(torch.randn(1, n, c) * 0.2)
        self.norm = nn.LayerNorm(c)

    def forward(self, x):
        x = self.proj(x).flatten(2).transpose(1, 2)
        return self.norm(x + self.pos)


class ViTTiny(nn.Module):
    def __init__(self, c=16, p=4):
        super().__init__()
        self.proj = nn.Conv2d(3, c, p, p)
        self.pos = nn.Parameter(torch.randn(1, 4, c) * 0.2)
        self.blk = nn.TransformerEncoderLayer(c, 2, 32, 0.0, activation="gelu", batch_first=True, norm_first=True)
        self.head = nn.Linear(c, 3)

    def forward(self, x):
        x = self.proj(x).flatten(2).transpose(1, 2) + self.pos
        return self.head(self.blk(x).mean(1))


class MixerBlock(nn.Module):
    def __init__(self, t=4, c=8):
        super().__init__()
        self.ln1 = nn.LayerNorm(c)
        self.tok = nn.Sequential(nn.Linear(t, 2 * t), nn.GELU(), nn.Linear(2 * t, t))
        self.ln2 = nn.LayerNorm(c)
        self.ch = nn.Sequential(nn.Linear(c, 2 * c), nn.GELU(), nn.Linear(2 * c, c))

    def forward(self, x):  # [N, T, C]
        x = x + self.tok(self.ln1(x).transpose(1, 2)).transpose(1, 2)
        return x + self.ch(self.ln2(x))


class WaveNetBlock(nn.Module):
    def __init__(self, c=4, d=2):
        super().__init__()
        self.d = d
        self.filt = nn.Conv1d(c, c, 2, dilation=d)
        self.gate = nn.Conv1d(c, c, 2, dilation=d)
        self.res = nn.Conv1d(c, c, 1)
        self.skip = nn.Conv1d(c, c, 1)

    def forward(self, x):
        y = F.pad(x, (self.d, 0))
        z = torch.tanh(self.filt(y)) * torch.sigmoid(self.gate(y))
        return x + self.res(z), self.skip(z)


class WaveNetChunk(nn.Module):
    """Gated activation from one conv split in two with torch.chunk."""

    def __init__(self, c=4):
        super().__init__()
        self.conv = nn.Conv1d(c, 2 * c, 3, padding=2, dilation=2)
        self.out = nn.Conv1d(c, c, 1)

    def forward(self, x):
        a, b = torch.chunk(self.conv(x), 2, dim=1)
        return x + self.out(torch.tanh(a) * torch.sigmoid(b))


class Audio1D(nn.Module):
    def __init__(self):
        super().__init__()
        self.f = nn.Sequential(nn.Conv1d(1, 4, 9, stride=4, padding=4), nn.BatchNorm1d(4), nn.ReLU(),
                               nn.MaxPool1d(2), nn.Conv1d(4, 8, 3, padding=1), nn.BatchNorm1d(8), nn.ReLU(),
                               nn.AdaptiveAvgPool1d(1), nn.Flatten(), nn.Linear(8, 3))

    def forward(self, x):
        return self.f(x)


class LSTMGatesChunk(nn.Module):
    """An LSTM step written with one linear and torch.chunk into four gates."""

    def __init__(self, i=4, h=6):
        super().__init__()
        self.h = h
        self.x2h = nn.Linear(i, 4 * h)
        self.h2h = nn.Linear(h, 4 * h)

    def forward(self, x):  # [N, T, I]
        b, t, _ = x.shape
        h = torch.zeros(b, self.h)
        c = torch.zeros(b, self.h)
        for k in range(t):
            i, f, g, o = (self.x2h(x[:, k]) + self.h2h(h)).chunk(4, 1)
            c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
            h = torch.sigmoid(o) * torch.tanh(c)
        return h


class InvertedResidualV3(nn.Module):
    def __init__(self, c=8):
        super().__init__()
        self.expand = nn.Sequential(nn.Conv2d(c, 2 * c, 1, bias=False), nn.BatchNorm2d(2 * c), nn.Hardswish())
        self.dw = nn.Sequential(nn.Conv2d(2 * c, 2 * c, 3, 1, 1, groups=2 * c, bias=False), nn.BatchNorm2d(2 * c),
                                nn.Hardswish())
        self.se = SEHard(2 * c)
        self.project = nn.Sequential(nn.Conv2d(2 * c, c, 1, bias=False), nn.BatchNorm2d(c))

    def forward(self, x):
        out = self.project(self.se(self.dw(self.expand(x))))
        out += x
        return out


class ShuffleUnit(nn.Module):
    """ShuffleNetV2 unit: chunk, branch, cat, channel shuffle via view/transpose."""

    def __init__(self, c=8):
        super().__init__()
        h = c // 2
        self.branch = nn.Sequential(nn.Conv2d(h, h, 1, bias=False), nn.BatchNorm2d(h), nn.ReLU(inplace=True),
                                    nn.Conv2d(h, h, 3, 1, 1, groups=h, bias=False), nn.BatchNorm2d(h),
                                    nn.Conv2d(h, h, 1, bias=False), nn.BatchNorm2d(h), nn.ReLU(inplace=True))

    def forward(self, x):
        x1, x2 = x.chunk(2, dim=1)
        out = torch.cat((x1, self.branch(x2)), dim=1)
        b, c, h, w = out.size()
        return out.view(b, 2, c // 2, h, w).transpose(1, 2).contiguous().view(b, c, h, w)


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, cin=16, planes=4):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, planes, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = nn.Conv2d(planes, planes * 4, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(planes * 4)
        self.relu = nn.ReLU(inplace=True)

    def forward(self, x):
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        out += x
        return self.relu(out)


class FireModule(nn.Module):
    def __init__(self, cin=8, s=4, e=4):
        super().__init__()
        self.squeeze = nn.Conv2d(cin, s, 1)
        self.e1 = nn.Conv2d(s, e, 1)
        self.e3 = nn.Conv2d(s, e, 3, padding=1)

    def forward(self, x):
        x = F.relu(self.squeeze(x), inplace=True)
        return torch.cat([F.relu(self.e1(x)), F.relu(self.e3(x))], 1)


class TwoInTwoOut(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Conv2d(3, 4, 3, padding=1)
        self.b = nn.Conv2d(3, 4, 3, padding=1)
        self.fc = nn.Linear(4, 2)

    def forward(self, x, y):
        z = F.relu(self.a(x)) + F.relu(self.b(y))
        return z, self.fc(z.mean((2, 3)))


class Siamese(nn.Module):
    def __init__(self):
        super().__init__()
        self.enc = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 4))

    def forward(self, a, b):
        ea, eb = self.enc(a), self.enc(b)
        return torch.abs(ea - eb).sum(1, keepdim=True), F.cosine_similarity(ea, eb, dim=1).unsqueeze(1)


class KWSConvGRU(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv1d(10, 8, 3, padding=1)
        self.gru = nn.GRU(8, 8, batch_first=True)
        self.fc = nn.Linear(8, 3)

    def forward(self, x):  # [N, T, F]
        y = F.relu(self.conv(x.transpose(1, 2))).transpose(1, 2)
        y, _ = self.gru(y)
        return self.fc(y[:, -1, :])


class DenseLayer(nn.Module):
    def __init__(self, cin=4, g=4):
        super().__init__()
        self.norm = nn.BatchNorm2d(cin)
        self.conv = nn.Conv2d(cin, g, 3, padding=1, bias=False)

    def forward(self, x):
        return torch.cat([x, self.conv(F.relu(self.norm(x)))], 1)


class SqueezeFormerFF(nn.Module):
    def __init__(self, c=8):
        super().__init__()
        self.ln = nn.LayerNorm(c)
        self.fc1 = nn.Linear(c, 2 * c)
        self.fc2 = nn.Linear(2 * c, c)

    def forward(self, x):
        return x + 0.5 * self.fc2(F.silu(self.fc1(self.ln(x))))


class ConformerConv(nn.Module):
    def __init__(self, c=8):
        super().__init__()
        self.ln = nn.LayerNorm(c)
        self.pw1 = nn.Conv1d(c, 2 * c, 1)
        self.dw = nn.Conv1d(c, c, 3, padding=1, groups=c)
        self.bn = nn.BatchNorm1d(c)
        self.pw2 = nn.Conv1d(c, c, 1)

    def forward(self, x):  # [N, T, C]
        y = self.ln(x).transpose(1, 2)
        y = F.glu(self.pw1(y), dim=1)
        y = self.pw2(F.silu(self.bn(self.dw(y))))
        return x + y.transpose(1, 2)


BLOCKS = [  # timm / torchvision / audio blocks (issue 8/9 breadth, wave 2)
    ("convnext_block", ConvNeXtBlock, [(2, 8, 6, 6)]),
    ("convnext_block_cf_ln2d", ConvNeXtCF, [(1, 8, 6, 6)]),
    ("layernorm2d_permute", lambda: nn.Sequential(conv(3, 8), LayerNorm2d(8)), [IMG2]),
    ("se_hardsigmoid", lambda: nn.Sequential(conv(3, 8), SEHard(8)), [IMG2]),
    ("se_linear_view", lambda: nn.Sequential(conv(3, 8), SELinear(8)), [(4, 3, 6, 6)]),
    ("cbam", lambda: nn.Sequential(conv(3, 8), CBAM(8)), [IMG2]),
    ("eca", lambda: nn.Sequential(conv(3, 8), ECA()), [IMG2]),
    ("swin_window_mlp", SwinWindows, [(2, 4, 4, 8)]),
    ("swin_window_attention", SwinAttnWindows, [(1, 4, 4, 8)]),
    ("mobilevit_unfold_fold", MobileViTUnfold, [(1, 8, 4, 4)]),
    ("patch_embed_pos_ln", PatchEmbedPos, [IMG2]),
    ("vit_tiny", ViTTiny, [IMG2]),
    ("mlp_mixer_block", MixerBlock, [(2, 4, 8)]),
    ("wavenet_gated_two_outputs", WaveNetBlock, [(2, 4, 10)]),
    ("wavenet_chunk_gate", WaveNetChunk, [(2, 4, 10)]),
    ("tcn_batch4", lambda: TCN(dilations=(1, 2)), [(4, 2, 10)]),
    ("audio1d_bn", Audio1D, [(2, 1, 64)]),
    ("mbv3_inverted_residual", InvertedResidualV3, [(2, 8, 4, 4)]),
    ("shufflenet_unit", ShuffleUnit, [(2, 8, 4, 4)]),
    ("resnet_bottleneck", Bottleneck, [(1, 16, 4, 4)]),
    ("squeezenet_fire", FireModule, [(2, 8, 4, 4)]),
    ("densenet_layer", lambda: nn.Sequential(DenseLayer(4), DenseLayer(8)), [(2, 4, 4, 4)]),
    ("two_inputs_two_outputs", TwoInTwoOut, [IMG2, IMG2]),
    ("siamese_distance", Siamese, [(8, 8), (8, 8)]),  # (4 rows x 3 samples left b saturating 3% of the test rows)
    ("squeezeformer_ff", SqueezeFormerFF, [(2, 4, 8)]),
    ("conformer_conv", ConformerConv, [(2, 5, 8)]),
    ("softmax_channels_4d", lambda: Fn(lambda s, x: s.c(x) * F.softmax(s.c(x), dim=1), c=conv()), [(4, 3, 4, 4)]),
    ("clamp06_div6", lambda: Fn(lambda s, x: s.c(x) * (s.c(x) + 3).clamp(0, 6) / 6, c=conv()), [IMG2]),
    ("f_hardswish_inplace", lambda: Fn(lambda s, x: F.hardswish(s.c(x), inplace=True), c=conv()), [IMG2]),
    ("relu6_div6_hsigmoid", lambda: Fn(lambda s, x: s.c(x) * F.relu6(s.c(x) + 3.0) / 6.0, c=conv()), [IMG2]),
    ("max_dim_indices_output", lambda: Fn(lambda s, x: s.fc(x).max(dim=1)[1], fc=lin(8, 4)), [VEC]),
    ("torch_max_indices_output", lambda: Fn(lambda s, x: torch.max(s.fc(x), 1).indices, fc=lin(8, 4)), [(4, 8)]),
    ("cumsum_seq_dim1", lambda: Fn(lambda s, x: s.fc(x).cumsum(1), fc=nn.Linear(16, 4)), [SEQ]),
    ("sum_all_normalise", lambda: Fn(lambda s, x: s.fc(x) - s.fc(x).mean(), fc=lin()), [VEC]),
    ("rank3_ntc_linear_relu", lambda: nn.Sequential(nn.Linear(16, 8), nn.ReLU(), nn.Linear(8, 4)), [(4, 6, 16)]),
    ("rank3_layer_scale_residual", lambda: Fn(lambda s, x: x + s.g * s.fc(x), fc=nn.Linear(16, 16),
                                              g=nn.Parameter(torch.full((16,), 0.1))), [SEQ]),
    ("rank5_conv3d_free_add", lambda: Fn(lambda s, x: F.relu(x * 2 + 1).mean(dim=2)), [(2, 2, 3, 4, 4)]),
    ("global_pool_flatten_dropout_head", lambda: nn.Sequential(conv(3, 8), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                                                               nn.Flatten(1), nn.Dropout(0.1), nn.Linear(8, 4)),
     [(4, 3, 6, 6)]),
    ("upsample_pixel_shuffle_head", lambda: nn.Sequential(conv(3, 8), nn.PixelShuffle(2), nn.Conv2d(2, 1, 3,
                                                                                                    padding=1)),
     [IMG2]),
    ("x_split_sum", lambda: Fn(lambda s, x: sum(torch.split(s.c(x), 2, dim=1)), c=conv(3, 6)), [IMG2]),
    ("stack_mean_branches", lambda: Fn(lambda s, x: torch.stack([s.a(x), s.b(x)], 0).mean(0), a=lin(), b=lin()),
     [VEC]),
]
IDIOMS += BLOCKS

# ----------------------------------------------------------------------------- more everyday math
MATH = [
    ("threshold_module", lambda: nn.Sequential(lin(), nn.Threshold(0.1, -0.5), lin()), [VEC]),
    ("round_to_eighths", lambda: Fn(lambda s, x: torch.round(s.fc(x) * 8) / 8, fc=lin()), [VEC]),
    ("floor_ceil_trunc_frac", lambda: Fn(lambda s, x: torch.floor(s.fc(x) * 8) + torch.ceil(s.fc(x) * 8)
                                         + torch.trunc(s.fc(x) * 8) + torch.frac(s.fc(x)), fc=lin()), [VEC]),
    ("rrelu_eval", lambda: nn.Sequential(lin(), nn.RReLU(0.1, 0.3), lin()), [VEC]),
    ("lerp_residual", lambda: Fn(lambda s, x: torch.lerp(x, s.fc(x), 0.25), fc=nn.Linear(8, 8)), [VEC]),
    ("addcmul_gate", lambda: Fn(lambda s, x: torch.addcmul(x, s.a(x), torch.sigmoid(s.b(x)), value=0.5),
                                a=nn.Linear(8, 8), b=nn.Linear(8, 8)), [VEC]),
    ("var_mean_standardise", lambda: Fn(lambda s, x: (lambda h, vm: (h - vm[1]) / torch.sqrt(vm[0] + 1e-5))(
        s.fc(x), torch.var_mean(s.fc(x), -1, keepdim=True)), fc=nn.Linear(8, 8)), [(4, 8)]),
    ("pairwise_distance_siamese", lambda: Fn(lambda s, x, y: F.pairwise_distance(s.fc(x), s.fc(y)), fc=lin()),
     [(4, 8), (4, 8)]),
    ("hypot_magnitude", lambda: Fn(lambda s, x: torch.hypot(s.a(x), s.b(x)), a=lin(), b=lin()), [VEC]),
    ("conv_transpose1d_upsampler", lambda: nn.Sequential(nn.Conv1d(4, 8, 3, padding=1), nn.ReLU(),
                                                         nn.ConvTranspose1d(8, 4, 4, stride=2, padding=1)),
     [(2, 4, 6)]),
    ("adaptive_max_pool1d_head", lambda: nn.Sequential(nn.Conv1d(4, 8, 3), nn.AdaptiveMaxPool1d(2), nn.Flatten(),
                                                       nn.Linear(16, 3)), [(2, 4, 9)]),
    ("x_over_abs_max", lambda: Fn(lambda s, x: s.fc(x) / (s.fc(x).abs().max() + 1e-3), fc=lin()), [VEC]),
    ("x_times_std", lambda: Fn(lambda s, x: s.fc(x) * s.fc(x).std(), fc=lin()), [VEC]),
    ("where_dead_zone_and", lambda: Fn(lambda s, x: (lambda h: torch.where((h > -0.5) & (h < 0.5),
                                                                            torch.zeros_like(h), h))(s.fc(x)),
                                       fc=lin()), [VEC]),
    ("masked_fill_or_not", lambda: Fn(lambda s, x: (lambda h: h.masked_fill(~((h > 1) | (h < -1)), 0.0))(s.fc(x)),
                                      fc=lin()), [VEC]),
]
IDIOMS += MATH
