"""Random-model fuzzer: tiny models built from every lowered op family, compiled, run by the Python
reference and by the C library (host, under AddressSanitizer + UndefinedBehaviorSanitizer; a share
on QEMU Cortex-M55); every model must give byte-identical outputs or be refused cleanly at compile
time (a Corten error naming the problem).  Anything else - a traceback, a byte difference, a
sanitizer report, a refusal only when emitting C - is a failure.

    python -m corten.testing.fuzz --n 1000 --seed 0          # the nightly run (seeds 0..999)
    python -m corten.testing.fuzz --n 20 --seed 500 --qemu-every 5 -v

Most models are a chain of 1-4 *steps* on a 4-D NCHW activation, optionally ended by a 2-D tail
(flatten + linear [+ softmax]) and a second output.  Each op family is one entry of
:data:`FAMILIES`: a function ``(rng, shape) -> (nn.Module, new shape) | None`` - adding a family is
adding one function.  Other model kinds are entries of :data:`KINDS` (``[1, C, L]`` sequences with
the :data:`SEQ_FAMILIES` conv1d/pool1d/mean over time, LSTMs, two-input models, and chains of
:data:`ANY_FAMILIES` - matmul, LayerNorm, div, reductions, comparisons + where, softmax, movement,
pool variants, one tensor fed to several inputs of one op (``cat([x, x])``, ``x * x``, ``x @ x``) -
on tensors of rank 1-4 with batch 1, 2 or 4 and up to three outputs; a kind that forces such a
step; and ``precision="int16"`` programs built from the 2-D and any-rank chains).
Everything derives from the seed (``random.Random(seed)``), so a failing seed reproduces exactly.
"""
from __future__ import annotations

import argparse
import random
import sys
import time
import traceback
import warnings
from dataclasses import dataclass, field
from typing import Callable

import torch
from torch import nn
from torch.nn import functional as F

Shape = tuple[int, int, int, int]
SANITIZE = ("-O1", "-g", "-fno-omit-frame-pointer", "-fsanitize=address,undefined", "-fno-sanitize-recover=all")


# ----------------------------------------------------------------------------- building blocks
class Lambda(nn.Module):
    """A parameter-free step: ``fn(x)`` (kept as a module so the models print readably)."""

    def __init__(self, name: str, fn: Callable):
        super().__init__()
        self.name, self.fn = name, fn

    def forward(self, x):
        return self.fn(x)

    def extra_repr(self) -> str:
        return self.name


BINARY_OPS = {"add": torch.add, "sub": torch.sub, "mul": torch.mul, "max": torch.maximum, "min": torch.minimum}


def Residual(op: str, body: nn.Module, other: nn.Module) -> nn.Module:  # noqa: N802  (a module factory)
    """``op(body(x), other(x))`` for a binary elementwise op (add/sub/mul/maximum/minimum)."""
    return Two(op, BINARY_OPS[op], body, other)


def Cat(dim: int, a: nn.Module, b: nn.Module) -> nn.Module:  # noqa: N802  (a module factory)
    """``torch.cat([a(x), b(x)], dim)``."""
    return Two(f"cat dim={dim}", lambda u, v: torch.cat([u, v], dim=dim), a, b)


class Chain(nn.Module):
    def __init__(self, steps: list[nn.Module], tail: nn.Module | None, two_outputs: bool):
        super().__init__()
        self.steps = nn.ModuleList(steps)
        self.tail = tail
        self.two_outputs = two_outputs

    def forward(self, x):
        mid = None
        for i, s in enumerate(self.steps):
            x = s(x)
            if i == 0:
                mid = x
        out = self.tail(x) if self.tail is not None else x
        return (out, mid) if self.two_outputs else out


def _append_step(made: tuple[nn.Module, Shape], family: str, steps: list[nn.Module], fams: list[str]) -> Shape:
    """Append a family's ``(module, output shape)`` to the chain being drawn; returns the new shape."""
    steps.append(made[0])
    fams.append(family)
    return made[1]


def _randomise(m: nn.Module, rng: random.Random) -> nn.Module:
    """Seeded weights (torch's default init with a generator) and non-trivial BatchNorm statistics."""
    g = torch.Generator().manual_seed(rng.randrange(2**31))
    with torch.no_grad():
        for p in m.parameters():
            p.copy_(torch.empty_like(p).uniform_(-1, 1, generator=g) / max(1, p[0].numel() ** 0.5))
        for mod in m.modules():
            if isinstance(mod, nn.BatchNorm2d):
                mod.running_mean.copy_(torch.randn(mod.num_features, generator=g) * 0.2)
                mod.running_var.copy_(torch.rand(mod.num_features, generator=g) + 0.5)
    return m


def _act(rng: random.Random) -> list[nn.Module]:
    return [[], [nn.ReLU()], [nn.ReLU6()], [nn.Hardtanh(-1.0, 1.0)]][rng.randrange(4)]


def _out_hw(size: int, k: int, s: int, p: int, d: int = 1) -> int:
    return (size + 2 * p - d * (k - 1) - 1) // s + 1


# ----------------------------------------------------------------------------- op families
def fam_conv(rng: random.Random, shape: Shape):
    """conv2d: kernel 1-5 (square or not), stride 1-3, padding, dilation, groups/depthwise, bias, BN, act."""
    _, c, h, w = shape
    kh, kw = rng.choice([(1, 1), (3, 3), (2, 2), (5, 5), (1, 3), (3, 1)])
    s = rng.choice([1, 1, 2, 3])
    d = rng.choice([1, 1, 2])
    ph, pw = rng.randint(0, kh // 2 + 1), rng.randint(0, kw // 2 + 1)
    kind = rng.choice(["plain", "plain", "depthwise", "grouped"])
    if kind == "depthwise":
        groups, c_out = c, c * rng.choice([1, 1, 2])
    elif kind == "grouped" and c > 1 and c % 2 == 0:
        groups = 2
        c_out = 2 * rng.randint(1, 4)
    else:
        groups, c_out = 1, rng.randint(1, 12)
    oh, ow = _out_hw(h, kh, s, ph, d), _out_hw(w, kw, s, pw, d)
    if oh < 1 or ow < 1:
        return None
    layers: list[nn.Module] = [nn.Conv2d(c, c_out, (kh, kw), s, (ph, pw), (d, d), groups, bias=rng.random() < 0.8)]
    if rng.random() < 0.3:
        layers.append(nn.BatchNorm2d(c_out))
    layers += _act(rng)
    return nn.Sequential(*layers), (shape[0], c_out, oh, ow)


def fam_conv_same(rng: random.Random, shape: Shape):
    """conv2d with padding='same' (stride 1, odd kernel)."""
    _, c, h, w = shape
    k = rng.choice([1, 3, 5])
    c_out = rng.randint(1, 8)
    return nn.Sequential(nn.Conv2d(c, c_out, k, padding="same"), *_act(rng)), (shape[0], c_out, h, w)


def fam_conv_transpose(rng: random.Random, shape: Shape):
    _, c, h, w = shape
    k = rng.randint(1, 4)
    s = rng.choice([1, 2])
    p = rng.randint(0, k - 1)
    op = rng.randint(0, s - 1)
    c_out = rng.randint(1, 6)
    oh, ow = (h - 1) * s - 2 * p + k + op, (w - 1) * s - 2 * p + k + op
    if oh < 1 or ow < 1 or oh > 24 or ow > 24:
        return None
    return nn.Sequential(nn.ConvTranspose2d(c, c_out, k, s, p, op), *_act(rng)), (shape[0], c_out, oh, ow)


def _branch(rng: random.Random, shape: Shape) -> nn.Module:
    """A shape-preserving branch: identity (the operand is the step's input), a 1x1/3x3 conv, or a pool."""
    _, c, _, _ = shape
    r = rng.random()
    if r < 0.3:
        return nn.Identity()
    if r < 0.7:
        k = rng.choice([1, 3])
        return nn.Sequential(nn.Conv2d(c, c, k, padding=k // 2), *_act(rng))
    return nn.MaxPool2d(3, 1, 1)


def fam_binary(rng: random.Random, shape: Shape):
    """add/sub/mul/maximum/minimum of two same-shape branches (incl. the step input itself)."""
    op = rng.choice(["add", "add", "sub", "mul", "max", "min"])
    body = _branch(rng, shape)
    other = _branch(rng, shape)
    if isinstance(body, nn.Identity) and isinstance(other, nn.Identity):
        other = nn.Sequential(nn.Conv2d(shape[1], shape[1], 1))
    return Residual(op, body, other), shape


def fam_broadcast(rng: random.Random, shape: Shape):
    """mul/add/sub/max/min with a broadcast operand: per-channel [1, C, 1, 1] (squeeze-excitation)."""
    _, c, _, _ = shape
    op = rng.choice(["mul", "mul", "add", "sub", "max", "min"])
    gate = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Conv2d(c, c, 1),
                         rng.choice([nn.Hardsigmoid(), nn.Sigmoid(), nn.ReLU()]))
    return Residual(op, nn.Identity(), gate), shape


def fam_pool(rng: random.Random, shape: Shape):
    _, c, h, w = shape
    kind = rng.choice(["max", "avg", "adaptive", "mean"])
    if kind == "adaptive":
        return nn.AdaptiveAvgPool2d(1), (shape[0], c, 1, 1)
    if kind == "mean":
        return Lambda("mean_hw", lambda x: x.mean((2, 3), keepdim=True)), (shape[0], c, 1, 1)
    k = rng.randint(1, 3)
    s = rng.randint(1, 2)
    p = rng.randint(0, k // 2)
    oh, ow = _out_hw(h, k, s, p), _out_hw(w, k, s, p)
    if oh < 1 or ow < 1:
        return None
    if kind == "max":
        return nn.MaxPool2d(k, s, p), (shape[0], c, oh, ow)
    return nn.AvgPool2d(k, s, p, count_include_pad=False), (shape[0], c, oh, ow)


LUTS = [nn.Hardswish, nn.Hardsigmoid, nn.Sigmoid, nn.Tanh, nn.SiLU, nn.GELU, nn.ELU,
        lambda: nn.LeakyReLU(0.1), nn.ReLU, lambda: nn.Hardtanh(-0.5, 0.5)]


def fam_lut(rng: random.Random, shape: Shape):
    """A lookup-table activation after a non-fusing op (a max pool keeps it standalone)."""
    return nn.Sequential(nn.MaxPool2d(1), rng.choice(LUTS)()), shape


def fam_pad(rng: random.Random, shape: Shape):
    _, c, h, w = shape
    pads = [rng.randint(0, 2) for _ in range(4)]
    value = rng.choice([0.0, 0.0, 0.5, -1.0])
    return (Lambda(f"pad{pads},{value}", lambda x: F.pad(x, pads, value=value)),
            (shape[0], c, h + pads[2] + pads[3], w + pads[0] + pads[1]))


def fam_cat(rng: random.Random, shape: Shape):
    _, c, h, w = shape
    dim = rng.choice([1, 1, 2, 3])
    c2 = rng.randint(1, 4) if dim == 1 else c
    b = nn.Sequential(nn.Conv2d(c, c2, 1), *_act(rng))
    new = list(shape)
    new[dim] += c2 if dim == 1 else shape[dim]
    return Cat(dim, nn.Identity() if rng.random() < 0.5 else nn.MaxPool2d(1), b), tuple(new)


def fam_transpose(rng: random.Random, shape: Shape):
    perm = rng.choice([(0, 1, 3, 2), (0, 2, 1, 3), (0, 3, 2, 1), (0, 2, 3, 1)])
    return Lambda(f"permute{perm}", lambda x: x.permute(*perm)), tuple(shape[i] for i in perm)


FAMILIES: dict[str, Callable] = {
    "conv": fam_conv, "conv_same": fam_conv_same, "conv_transpose": fam_conv_transpose, "binary": fam_binary,
    "broadcast": fam_broadcast, "pool": fam_pool, "lut": fam_lut, "pad": fam_pad, "cat": fam_cat,
    "transpose": fam_transpose,
}


def tail_linear(rng: random.Random, shape: Shape):
    """flatten + linear (+ activation, + softmax over the features)."""
    n = shape[1] * shape[2] * shape[3]
    out = rng.randint(1, 10)
    layers: list[nn.Module] = [nn.Flatten(), nn.Linear(n, out), *_act(rng)]
    if rng.random() < 0.4:
        layers.append(nn.Softmax(dim=-1))
    elif rng.random() < 0.3:
        layers += [nn.Linear(out, rng.randint(1, 6)), rng.choice(LUTS)()]
    return nn.Sequential(*layers)


# ----------------------------------------------------------------------------- one case
@dataclass
class Case:
    seed: int
    model: nn.Module
    inputs: tuple[torch.Tensor, ...]
    families: list[str] = field(default_factory=list)
    precision: str = "int8"  # corten.compile(precision=...): "int16" runs the 16x8 ops where they exist


# ----------------------------------------------------------------------------- other model kinds
class Seq(nn.Module):
    """A chain on a ``[1, C, L]`` sequence (conv1d, pool1d, activations), then mean over time or
    flatten, then linear."""

    def __init__(self, steps: list[nn.Module], head: nn.Module, mean: bool):
        super().__init__()
        self.steps, self.head, self.mean = nn.ModuleList(steps), head, mean

    def forward(self, x):
        for s in self.steps:
            x = s(x)
        x = x.mean(dim=2) if self.mean else x.flatten(1)
        return self.head(x)


def fam_seq_conv(rng: random.Random, shape):
    _, c, length = shape
    k, s, d = rng.choice([1, 3, 5]), rng.choice([1, 1, 2]), rng.choice([1, 1, 2])
    p = rng.randint(0, k // 2)
    c_out = rng.randint(1, 8)
    lo = (length + 2 * p - d * (k - 1) - 1) // s + 1
    if lo < 1:
        return None
    groups = c if (rng.random() < 0.25 and c_out % c == 0) else 1
    return nn.Sequential(nn.Conv1d(c, c_out, k, s, p, d, groups), *_act(rng)), (shape[0], c_out, lo)


def fam_seq_pool(rng: random.Random, shape):
    _, c, length = shape
    k = rng.randint(1, 3)
    s = rng.randint(1, 2)
    lo = (length - k) // s + 1
    if lo < 1:
        return None
    pool = nn.MaxPool1d(k, s) if rng.random() < 0.5 else nn.AvgPool1d(k, s)
    layers = [pool] + ([rng.choice(LUTS)()] if rng.random() < 0.4 else [])
    return nn.Sequential(*layers), (shape[0], c, lo)


SEQ_FAMILIES: dict[str, Callable] = {"conv1d": fam_seq_conv, "pool1d": fam_seq_pool}


def make_seq_case(seed: int, rng: random.Random) -> Case:
    shape = (1, rng.randint(1, 6), rng.randint(1, 24))
    in_shape = shape
    steps, fams = [], []
    for _ in range(rng.randint(1, 3)):
        name = rng.choice(list(SEQ_FAMILIES))
        made = SEQ_FAMILIES[name](rng, shape)
        if made is None:
            continue
        steps.append(made[0])
        shape = made[1]
        fams.append(name)
    mean = rng.random() < 0.5
    n = shape[1] if mean else shape[1] * shape[2]
    head = nn.Sequential(nn.Linear(n, rng.randint(1, 8)), *([nn.Softmax(-1)] if rng.random() < 0.3 else []))
    fams.append("mean_time" if mean else "linear")
    model = _randomise(Seq(steps, head, mean), rng).eval()
    x = torch.randn(in_shape, generator=torch.Generator().manual_seed(seed))
    return Case(seed, model, (x,), fams)


class LSTMNet(nn.Module):
    def __init__(self, features: int, hidden: int, layers: int, last: str, out: int, batch_first: bool):
        super().__init__()
        self.lstm = nn.LSTM(features, hidden, layers, batch_first=batch_first)
        self.last, self.batch_first = last, batch_first
        self.fc = nn.Linear(hidden, out)

    def forward(self, x):
        y, (h_n, _) = self.lstm(x)
        if self.last == "h_n":
            return self.fc(h_n[-1])
        if self.last == "last":
            return self.fc(y[:, -1] if self.batch_first else y[-1])
        return self.fc(y)


def make_lstm_case(seed: int, rng: random.Random) -> Case:
    """nn.LSTM (1-2 layers, batch_first or not, batch 1/2/4) read as the sequence, its last step or h_n."""
    t, f, h = rng.randint(1, 8), rng.randint(1, 8), rng.randint(1, 8)
    batch_first = rng.random() < 0.7
    n = rng.choice([1, 1, 2, 4])
    last = rng.choice(["seq", "last", "last", "h_n"])
    model = _randomise(LSTMNet(f, h, rng.randint(1, 2), last, rng.randint(1, 6), batch_first), rng).eval()
    x = torch.randn((n, t, f) if batch_first else (t, n, f), generator=torch.Generator().manual_seed(seed))
    return Case(seed, model, (x,), ["lstm", f"lstm_{last}", f"batch{n}"])


class TwoIn(nn.Module):
    def __init__(self, c1: int, c2: int, c_out: int, op: str):
        super().__init__()
        self.a, self.b, self.op = nn.Conv2d(c1, c_out, 1), nn.Conv2d(c2, c_out, 3, padding=1), op

    def forward(self, x, y):
        a, b = self.a(x), torch.relu(self.b(y))
        return torch.cat([a, b], 1) if self.op == "cat" else (a + b if self.op == "add" else a * b)


def make_two_input_case(seed: int, rng: random.Random) -> Case:
    h, w = rng.randint(1, 10), rng.randint(1, 10)
    c1, c2 = rng.randint(1, 4), rng.randint(1, 4)
    op = rng.choice(["add", "mul", "cat"])
    model = _randomise(TwoIn(c1, c2, rng.randint(1, 6), op), rng).eval()
    g = torch.Generator().manual_seed(seed)
    return Case(seed, model, (torch.randn((1, c1, h, w), generator=g), torch.randn((1, c2, h, w), generator=g)),
                ["two_inputs", op])


# ----------------------------------------------------------------------------- any-rank tensors
# The late families on tensors of rank 1-4 (batch 1, 2 or 4 in dim 0 from rank 2 on): a chain of
# ANY_FAMILIES steps (at rank 4 the 4-D FAMILIES too), ended by up to three outputs.  A step is
# ``(rng, shape) -> (module, new shape) | None`` as above, for any rank.
AnyShape = tuple[int, ...]
MAX_ELEMS = 1024


class Const(nn.Module):
    """``fn(x, w)`` with a constant (parameter) operand ``w``."""

    def __init__(self, name: str, fn: Callable, w: torch.Tensor):
        super().__init__()
        self.name, self.fn = name, fn
        self.w = nn.Parameter(w)

    def forward(self, x):
        return self.fn(x, self.w)

    def extra_repr(self) -> str:
        return f"{self.name} w{tuple(self.w.shape)}"


class Two(nn.Module):
    """``fn(a(x), b(x))``: a binary op on two branches of the same input."""

    def __init__(self, name: str, fn: Callable, a: nn.Module, b: nn.Module):
        super().__init__()
        self.name, self.fn, self.a, self.b = name, fn, a, b

    def forward(self, x):
        return self.fn(self.a(x), self.b(x))

    def extra_repr(self) -> str:
        return self.name


class Affine(nn.Module):
    """``x * w + b`` with ``w``, ``b`` over the last dim (broadcast mul + add: any rank)."""

    def __init__(self, n: int):
        super().__init__()
        self.w, self.b = nn.Parameter(torch.randn(n)), nn.Parameter(torch.randn(n))

    def forward(self, x):
        return x * self.w + self.b


def _lin(n: int, m: int, rank: int = 3) -> nn.Module:
    """A projection of the last dim giving a second, independently quantized operand: a Linear up to
    rank 3; at rank 4 (channels-last in C, where a Linear over W is refused) ``x * w + b`` or ``x @ W``."""
    if rank < 4:
        return nn.Linear(n, m)
    if n == m:
        return Affine(n)
    return Const("x@W", lambda x, w: torch.matmul(x, w), torch.randn(n, m) / max(1, n) ** 0.5)


def _dim(rng: random.Random, r: int, batch: bool = True) -> int:
    """A dim of a rank-``r`` tensor, positive or negative; the batch dim (0) only when ``batch``."""
    lo = 0 if (batch or r == 1) else 1
    d = rng.randint(lo, r - 1)
    return d - r if rng.random() < 0.4 else d


def _numel(shape: AnyShape) -> int:
    n = 1
    for v in shape:
        n *= v
    return n


def fam_matmul(rng: random.Random, shape: AnyShape):
    """matmul/@/bmm/mm: activation x constant (either side, transposed operand), activation x
    activation (two projections, ``q @ k.transpose(-2, -1)`` or ``x @ x.mT``)."""
    r = len(shape)
    if r < 2:
        k, m = shape[0], rng.randint(1, 8)
        return Const("vec@W", lambda x, w: x @ w, torch.randn(k, m)), (m,)
    *lead, rows, k = shape
    kind = rng.choice(["act_const", "act_constT", "const_act", "act_act", "act_actT", "self_T"])
    if kind == "act_const":
        m = rng.randint(1, 8)
        fn = (lambda x, w: torch.bmm(x, w.expand(x.shape[0], -1, -1))) if (r == 3 and rng.random() < 0.3) else \
            (lambda x, w: torch.matmul(x, w))
        return Const("x@W", fn, torch.randn(k, m)), (*lead, rows, m)
    if kind == "act_constT":
        m = rng.randint(1, 8)
        return Const("x@W.T", lambda x, w: x @ w.t(), torch.randn(m, k)), (*lead, rows, m)
    if kind == "const_act":
        m = rng.randint(1, 8)
        fn = (lambda x, w: torch.mm(w, x)) if r == 2 else (lambda x, w: w @ x)
        return Const("W@x", fn, torch.randn(m, rows)), (*lead, m, k)
    if kind == "self_T":
        return Lambda("x@x.mT", lambda x: x @ x.transpose(-2, -1)), (*lead, rows, rows)
    d = rng.randint(1, 6)
    if kind == "act_actT":  # attention scores: q @ k^T
        fn = (lambda a, b: torch.bmm(a, b.transpose(1, 2))) if r == 3 and rng.random() < 0.4 else \
            (lambda a, b: a @ b.transpose(-2, -1))
        return Two("q@k.T", fn, _lin(k, d, len(shape)), _lin(k, d, len(shape))), (*lead, rows, rows)
    # x @ b with b = Linear(rows -> d) of x's transpose: [.., k, d]
    return Two("x@lin(x.mT)", torch.matmul, nn.Identity(),
               nn.Sequential(Lambda("mT", lambda t: t.transpose(-2, -1)), _lin(rows, d, len(shape)))), \
        (*lead, rows, d)


def fam_layer_norm(rng: random.Random, shape: AnyShape):
    """LayerNorm over the last 1 or 2 dims, with or without affine parameters."""
    r = len(shape)
    nd = 1 if r < 3 or rng.random() < 0.7 else 2
    if shape[-1] == 1 and nd == 1 and rng.random() < 0.5:
        return None
    return nn.LayerNorm(list(shape[r - nd:]), elementwise_affine=rng.random() < 0.7,
                        eps=rng.choice([1e-5, 1e-3])), shape


def fam_div(rng: random.Random, shape: AnyShape):
    """x / scalar, x / constant tensor, x / y of two branches, 1 / x (bounded away from 0 or not)."""
    kind = rng.choice(["scalar", "const", "tensor", "tensor_pos", "recip"])
    if kind == "scalar":
        k = rng.choice([3.0, -2.0, 0.5, 7.25, 1e-2])
        return Lambda(f"x/{k}", lambda x: x / k), shape
    if kind == "const":
        w = torch.rand(shape[-1]) + 0.5
        return Const("x/w", lambda x, w: x / w, w), shape
    if kind == "recip":
        return Lambda("1/(|x|+0.5)", lambda x: torch.reciprocal(torch.sigmoid(x) + 0.25)), shape
    n = shape[-1]
    if kind == "tensor_pos":
        return Two("a/(sigmoid(b)+0.5)", lambda a, b: a / (torch.sigmoid(b) + 0.5), _lin(n, n, len(shape)),
                   _lin(n, n, len(shape))), shape
    return Two("a/b", lambda a, b: torch.div(a, b), nn.Identity(), _lin(n, n, len(shape))), shape


def fam_reduce(rng: random.Random, shape: AnyShape):
    """mean/sum/amax/amin/max.values over 1-2 dims, keepdim or not."""
    r = len(shape)
    kind = rng.choice(["mean", "sum", "amax", "amin", "max_values"])
    keep = rng.random() < 0.5
    if kind == "max_values":
        d = _dim(rng, r)
        dims: tuple[int, ...] = (d,)
        fn = (lambda x: torch.max(x, dim=d, keepdim=keep).values)
    else:
        nd = 1 if r == 1 else rng.randint(1, min(2, r))
        dims = tuple(sorted(set(_dim(rng, r) % r for _ in range(nd))))
        if rng.random() < 0.3:
            dims = tuple(d - r for d in dims)
        fn = {"mean": lambda x: x.mean(dims, keepdim=keep), "sum": lambda x: x.sum(dims, keepdim=keep),
              "amax": lambda x: x.amax(dims, keepdim=keep), "amin": lambda x: torch.amin(x, dims, keepdim=keep)}[kind]
    pos = {d % r for d in dims}
    new = tuple((1 if i in pos else v) for i, v in enumerate(shape) if keep or i not in pos)
    if not new:
        return None  # a 0-d output: not a model output Corten takes
    return Lambda(f"{kind}{dims},keep={keep}", fn), new


def fam_compare_where(rng: random.Random, shape: AnyShape):
    """eq/ne/lt/le/gt/ge against a number or another branch, feeding torch.where (tensor or number arms)."""
    op = rng.choice([torch.gt, torch.lt, torch.ge, torch.le, torch.eq, torch.ne])
    n = shape[-1]
    t = rng.choice([0.0, 0.25, -0.5])
    arm = rng.choice(["zero", "scaled", "branch"])
    if rng.random() < 0.5:
        def fn(a, b):
            cond = op(a, t)
            other = 0.0 if arm == "zero" else (a * 0.5 if arm == "scaled" else b)
            return torch.where(cond, a, other)
    else:
        def fn(a, b):
            return torch.where(op(a, b), a, b) if arm != "zero" else torch.where(op(a, b), b, 0.0)
    return Two(f"where({op.__name__},{arm})", fn, nn.Identity(), _lin(n, n, len(shape))), shape


def fam_softmax(rng: random.Random, shape: AnyShape):
    """softmax / log_softmax over any dim."""
    d = _dim(rng, len(shape))
    if rng.random() < 0.5:
        return nn.Softmax(dim=d), shape
    return Lambda(f"log_softmax({d})", lambda x: F.log_softmax(x, dim=d)), shape


def fam_slice(rng: random.Random, shape: AnyShape):
    """x[..., a:b:step] with negative indices, narrow, select (rank - 1)."""
    r = len(shape)
    d = _dim(rng, r, batch=False) % r
    size = shape[d]
    kind = rng.choice(["slice", "slice", "select", "narrow"])
    if kind == "select" and r > 1:
        i = rng.randint(-size, size - 1)
        return Lambda(f"select({d},{i})", lambda x: x.select(d, i)), shape[:d] + shape[d + 1:]
    if kind == "narrow":
        length = rng.randint(1, size)
        start = rng.randint(0, size - length)
        return Lambda(f"narrow({d},{start},{length})", lambda x: x.narrow(d, start, length)), \
            shape[:d] + (length,) + shape[d + 1:]
    start = rng.randint(-size, size - 1)
    stop = rng.choice([None, rng.randint(-size, size)])
    step = rng.choice([1, 1, 2, 3])
    out = len(range(size)[slice(start, stop, step)])
    if out < 1:
        return None
    idx = (slice(None),) * d + (slice(start, stop, step),)
    return Lambda(f"[{d}:{start}:{stop}:{step}]", lambda x: x[idx]), shape[:d] + (out,) + shape[d + 1:]


def fam_split(rng: random.Random, shape: AnyShape):
    """split/chunk/unbind pieces recombined: cat of reordered pieces, or an elementwise op of two."""
    r = len(shape)
    d = _dim(rng, r, batch=False) % r
    size = shape[d]
    if size < 2:
        return None
    if rng.random() < 0.5:
        k = rng.randint(2, min(4, size))

        def fn(x):
            parts = torch.chunk(x, k, dim=d)
            return torch.cat(parts[::-1], dim=d)
        return Lambda(f"chunk({k},{d})->cat reversed", fn), shape
    sz = rng.randint(1, size - 1)

    def fn2(x):
        a, *rest = torch.split(x, sz, dim=d)
        return a * 0.5 + a if rng_add else torch.maximum(a, a.flip(d))
    rng_add = rng.random() < 0.5
    return Lambda(f"split({sz},{d})[0]", fn2), shape[:d] + (sz,) + shape[d + 1:]


def fam_stack(rng: random.Random, shape: AnyShape):
    """stack of two branches on a new dim (rank + 1, at most 4), or cat on any dim."""
    r = len(shape)
    n = shape[-1]
    if r < 4 and rng.random() < 0.5:
        d = rng.randint(0, r)
        new = shape[:d] + (2,) + shape[d:]
        return Two(f"stack({d})", lambda a, b: torch.stack([a, b], d), nn.Identity(), _lin(n, n, len(shape))), new
    d = _dim(rng, r) % r
    new = list(shape)
    new[d] *= 2
    if d == r - 1:
        return Two(f"cat({d})", lambda a, b: torch.cat([a, b], d), nn.Identity(), _lin(n, n, len(shape))), tuple(new)
    return Two(f"cat({d})", lambda a, b: torch.cat([a, b], d), _lin(n, n, len(shape)), nn.ReLU()), tuple(new)


def fam_expand(rng: random.Random, shape: AnyShape):
    """expand of a size-1 dim (after a keepdim reduction), repeat/tile, repeat_interleave."""
    r = len(shape)
    kind = rng.choice(["expand", "repeat", "interleave"])
    d = _dim(rng, r, batch=False) % r
    k = rng.randint(2, 3)
    if kind == "expand":
        new = list(shape)
        new[d] = k
        sizes = [-1] * r
        sizes[d] = k
        return Lambda(f"amax({d}).expand{sizes}", lambda x: x.amax(d, keepdim=True).expand(*sizes)), tuple(new)
    if kind == "interleave":
        new = list(shape)
        new[d] *= k
        return Lambda(f"repeat_interleave({k},{d})", lambda x: x.repeat_interleave(k, dim=d)), tuple(new)
    reps = [1] * r
    reps[d] = k
    new = list(shape)
    new[d] *= k
    return Lambda(f"repeat{reps}", lambda x: x.repeat(*reps)), tuple(new)


def fam_flip_permute(rng: random.Random, shape: AnyShape):
    """flip/roll, permute/transpose/movedim of any rank."""
    r = len(shape)
    kind = rng.choice(["flip", "roll", "permute", "transpose"] if r > 1 else ["flip", "roll"])
    if kind == "flip":
        dims = sorted({_dim(rng, r) % r for _ in range(rng.randint(1, 2))})
        return Lambda(f"flip{dims}", lambda x: x.flip(dims)), shape
    if kind == "roll":
        d = _dim(rng, r)
        sh = rng.randint(-3, 3)
        return Lambda(f"roll({sh},{d})", lambda x: torch.roll(x, sh, d)), shape
    if kind == "transpose":
        a, b = rng.sample(range(r), 2)
        new = list(shape)
        new[a], new[b] = new[b], new[a]
        return Lambda(f"transpose({a},{b})", lambda x: x.transpose(a, b)), tuple(new)
    perm = list(range(r))
    rng.shuffle(perm)
    return Lambda(f"permute{perm}", lambda x: x.permute(*perm)), tuple(shape[i] for i in perm)


def fam_index_select(rng: random.Random, shape: AnyShape):
    """index_select / x[:, [i, j]] with constant indices (repeats, any order)."""
    r = len(shape)
    d = _dim(rng, r, batch=False) % r
    idx = [rng.randrange(shape[d]) for _ in range(rng.randint(1, 5))]
    if rng.random() < 0.5:
        t = torch.tensor(idx)
        return Lambda(f"index_select({d},{idx})", lambda x: torch.index_select(x, d, t)), \
            shape[:d] + (len(idx),) + shape[d + 1:]
    key = (slice(None),) * d + (idx,)
    return Lambda(f"[{d}:{idx}]", lambda x: x[key]), shape[:d] + (len(idx),) + shape[d + 1:]


def fam_pixel_shuffle(rng: random.Random, shape: AnyShape):
    """pixel_shuffle / pixel_unshuffle (rank 4), through a 1x1 conv to r^2 channels."""
    if len(shape) != 4:
        return None
    n, c, h, w = shape
    f = 2
    if rng.random() < 0.5 and h % f == 0 and w % f == 0:
        return nn.PixelUnshuffle(f), (n, c * f * f, h // f, w // f)
    c2 = rng.randint(1, 2)
    return nn.Sequential(nn.Conv2d(c, c2 * f * f, 1), nn.PixelShuffle(f)), (n, c2, h * f, w * f)


def fam_pool_variants(rng: random.Random, shape: AnyShape):
    """avg/max pool 2-D (rank 4) or 1-D (rank 3): ceil_mode, count_include_pad, divisor_override, dilation."""
    r = len(shape)
    if r not in (3, 4):
        return None
    size = shape[2:]
    k = rng.randint(1, 3)
    s = rng.randint(1, 3)
    p = rng.randint(0, k // 2)
    ceil = rng.random() < 0.5
    d = rng.choice([1, 1, 2])
    kind = rng.choice(["avg", "max"])
    if kind == "avg":
        d = 1
    outs = []
    for v in size:
        eff = d * (k - 1) + 1
        num = v + 2 * p - eff
        if num < 0:
            return None
        o = (-(-num // s) if ceil else num // s) + 1
        if ceil and (o - 1) * s >= v + p:
            o -= 1
        outs.append(o)
    if kind == "max":
        pool = (nn.MaxPool2d if r == 4 else nn.MaxPool1d)(k, s, p, dilation=d, ceil_mode=ceil)
    elif r == 4:
        pool = nn.AvgPool2d(k, s, p, ceil_mode=ceil, count_include_pad=rng.random() < 0.5,
                            divisor_override=rng.choice([None, None, 1, 3]))
    else:
        pool = nn.AvgPool1d(k, s, p, ceil_mode=ceil, count_include_pad=rng.random() < 0.5)
    return pool, (*shape[:2], *outs)


def fam_elementwise(rng: random.Random, shape: AnyShape):
    """add/sub/mul/maximum/minimum with a broadcast constant, a number, or a projection of x; a LUT."""
    n = shape[-1]
    kind = rng.choice(["const", "number", "branch", "lut"])
    op = rng.choice([torch.add, torch.sub, torch.mul, torch.maximum, torch.minimum])
    if kind == "lut":
        return nn.Sequential(Lambda("amax-keep", lambda x: torch.maximum(x, x.flip(-1))), rng.choice(LUTS)()), shape
    if kind == "number":
        if op in (torch.maximum, torch.minimum):
            op = torch.add
        v = rng.choice([1.5, -0.25, 3.0])
        return Lambda(f"{op.__name__}({v})", lambda x: op(x, v)), shape
    if kind == "const":
        r = len(shape)
        bshape = tuple(v if rng.random() < 0.5 else 1 for v in shape[max(0, r - rng.randint(1, r)):])
        return Const(f"{op.__name__}(w)", lambda x, w: op(x, w), torch.randn(bshape)), shape
    return Two(op.__name__, op, nn.Identity(), nn.Sequential(_lin(n, n, len(shape)), *_act(rng))), shape


def fam_linear(rng: random.Random, shape: AnyShape):
    """Linear over the last dim of rank 1-3, activation (at rank 4, one in five: Corten refuses it)."""
    m = rng.randint(1, 8)
    if len(shape) == 4 and rng.random() < 0.8:
        return None
    return nn.Sequential(nn.Linear(shape[-1], m), *_act(rng)), (*shape[:-1], m)


def fam_reshape(rng: random.Random, shape: AnyShape):
    """flatten of the trailing dims / unflatten of the last one / unsqueeze+squeeze."""
    r = len(shape)
    if r >= 2 and rng.random() < 0.5:
        new = (*shape[:-2], shape[-2] * shape[-1])
        return Lambda("flatten(-2)", lambda x: x.flatten(-2)), new
    last = shape[-1]
    f = next((f for f in (2, 3) if last % f == 0), None)
    if f is None or r >= 4:
        return Lambda("unsqueeze(-1).squeeze(-1)", lambda x: x.unsqueeze(-1).squeeze(-1)), shape
    return Lambda(f"unflatten(-1,{f})", lambda x: x.unflatten(-1, (f, last // f))), (*shape[:-1], f, last // f)


def fam_self_input(rng: random.Random, shape: AnyShape):
    """One tensor fed to several inputs of one op: ``cat([x, x])``, a tensor concatenated with itself
    at several levels, ``x + x``, ``x * x``, ``maximum(x, x)``, ``x @ x`` (square) / ``x @ x.mT``."""
    r = len(shape)
    kinds = ["cat", "cat_nested", "add", "mul", "max"] + (["matmul"] if r >= 2 else [])
    kind = rng.choice(kinds)
    if kind in ("cat", "cat_nested"):
        d = _dim(rng, r)
        if kind == "cat":
            fn, times = (lambda x: torch.cat([x, x], d)), 2
        else:
            def fn(x):  # t0 = [x, x]; t1 = [t0, x]; [t1, t0]: five copies of x along d
                t0 = torch.cat([x, x], d)
                t1 = torch.cat([t0, x], d)
                return torch.cat([t1, t0], d)
            times = 5
        new = tuple(v * times if i == d % r else v for i, v in enumerate(shape))
        return Lambda(f"{kind}(x,x;{d})", fn), new
    if kind == "matmul":
        *lead, rows, k = shape
        if rows == k and rng.random() < 0.5:
            return Lambda("x@x", lambda x: torch.matmul(x, x)), shape
        return Lambda("x@x.mT", lambda x: x @ x.transpose(-2, -1)), (*lead, rows, rows)
    fn = {"add": lambda x: x + x, "mul": lambda x: torch.mul(x, x), "max": lambda x: torch.maximum(x, x)}[kind]
    return Lambda(f"{kind}(x,x)", fn), shape


ANY_FAMILIES: dict[str, Callable] = {
    "matmul": fam_matmul, "layer_norm": fam_layer_norm, "div": fam_div, "reduce": fam_reduce,
    "compare_where": fam_compare_where, "softmax": fam_softmax, "slice": fam_slice, "split": fam_split,
    "stack_cat": fam_stack, "expand_repeat": fam_expand, "flip_permute": fam_flip_permute,
    "index_select": fam_index_select, "pixel_shuffle": fam_pixel_shuffle, "pool_variants": fam_pool_variants,
    "elementwise": fam_elementwise, "linear_any": fam_linear, "reshape": fam_reshape,
    "self_input": fam_self_input,
}


class AnyChain(nn.Module):
    """Steps in order; the outputs are the last value and (optionally) earlier ones."""

    def __init__(self, steps: list[nn.Module], outputs: list[int]):
        super().__init__()
        self.steps = nn.ModuleList(steps)
        self.outputs = outputs  # indices of step results returned besides the last

    def forward(self, x):
        seen = []
        for s in self.steps:
            x = s(x)
            seen.append(x)
        if not self.outputs:
            return x
        return (x, *[seen[i] for i in self.outputs])


def make_any_case(seed: int, rng: random.Random, force: str | None = None) -> Case:
    """A chain of 1-4 :data:`ANY_FAMILIES` steps (and the 4-D :data:`FAMILIES` at rank 4) on a rank 1-4
    input with batch 1, 2 or 4; one to three outputs.  ``force``: one step (at a random place, after
    a first step) is of that family when it fits."""
    r = rng.choice([1, 2, 3, 3, 4, 4])
    n = rng.choice([1, 1, 2, 4])
    dims = [rng.randint(1, 8) for _ in range(r)]
    shape: AnyShape = tuple(dims) if r == 1 else (n, *dims[1:])
    in_shape = shape
    steps, fams = [], [f"rank{r}", f"batch{shape[0] if r > 1 else 1}"]
    names = list(ANY_FAMILIES)
    n_steps = rng.randint(1, 4) if force is None else rng.randint(2, 4)
    forced_at = rng.randint(1, n_steps - 1) if force is not None else -1
    for i in range(n_steps):
        for attempt in range(10):
            pool = names + (list(FAMILIES) if len(shape) == 4 else [])
            name = force if (i == forced_at and attempt < 5) else rng.choice(pool)
            fam = ANY_FAMILIES.get(name) or FAMILIES[name]
            made = fam(rng, shape)
            if made is not None and 1 <= len(made[1]) <= 4 and min(made[1]) >= 1 and max(made[1]) <= 32 \
                    and _numel(made[1]) <= MAX_ELEMS:
                break
        else:
            continue
        shape = _append_step(made, name, steps, fams)
    if not steps:
        steps, fams = [nn.Linear(shape[-1], 3)], fams + ["linear_any"]
    outputs = sorted(rng.sample(range(len(steps) - 1), rng.randint(0, min(2, len(steps) - 1)))) \
        if len(steps) > 1 and rng.random() < 0.3 else []
    if outputs:
        fams.append(f"outputs{len(outputs) + 1}")
    model = _randomise(AnyChain(steps, outputs), rng).eval()
    x = torch.randn(in_shape, generator=torch.Generator().manual_seed(seed)) * rng.choice([1.0, 0.5, 3.0])
    return Case(seed, model, (x,), fams)


# Model kinds beyond the 2-D chains (drawn from their own stream, so a 2-D seed's model never
# changes when a kind is added): name -> (weight, builder(seed, rng) -> Case).
def make_self_input_case(seed: int, rng: random.Random) -> Case:
    """An any-rank chain with one :func:`fam_self_input` step (one tensor fed to several inputs of
    one op) after a first step, so that the repeated tensor is a computed one."""
    return make_any_case(seed, rng, force="self_input")


def make_int16_case(seed: int, rng: random.Random) -> Case:
    """A 2-D chain or an any-rank chain compiled with ``precision="int16"``: 16x8 where an op has it,
    int8 elsewhere, so the int8 <-> int16 boundaries are exercised too."""
    case = make_chain_case(seed) if rng.random() < 0.5 else make_any_case(seed, rng)
    case.precision = "int16"
    case.families.append("int16")
    return case


KINDS: dict[str, tuple[float, Callable]] = {
    "seq": (0.12, make_seq_case), "lstm": (0.05, make_lstm_case), "two_inputs": (0.05, make_two_input_case),
    "any": (0.40, make_any_case), "self_input": (0.06, make_self_input_case), "int16": (0.10, make_int16_case),
}


def make_case(seed: int) -> Case:
    """The random model and input of ``seed`` (deterministic)."""
    pick = random.Random(f"kind-{seed}").random()
    for name, (weight, builder) in KINDS.items():
        if pick < weight:
            return builder(seed, random.Random(f"{name}-{seed}"))
        pick -= weight
    return make_chain_case(seed)


def make_chain_case(seed: int) -> Case:
    """A 2-D chain of :data:`FAMILIES` steps (the default kind)."""
    rng = random.Random(seed)
    shape: Shape = (1, rng.randint(1, 6), rng.randint(1, 12), rng.randint(1, 12))
    in_shape = shape
    steps, fams = [], []
    first = rng.random() < 0.7  # most models start with a conv, like real ones
    for i in range(rng.randint(1, 4)):
        name = "conv" if (i == 0 and first) else rng.choice(list(FAMILIES))
        for _ in range(10):
            made = FAMILIES[name](rng, shape)
            if made is not None and max(made[1]) <= 32 and min(made[1]) >= 1:
                break
            name = rng.choice(list(FAMILIES))
        else:
            continue
        shape = _append_step(made, name, steps, fams)
    if not steps:
        steps, fams = [nn.Conv2d(shape[1], 2, 1)], ["conv"]
    tail = tail_linear(rng, shape) if rng.random() < 0.3 else None
    if tail is not None:
        fams.append("linear")
    two = rng.random() < 0.15 and len(steps) > 1
    if two:
        fams.append("two_outputs")
    model = _randomise(Chain(steps, tail, two), rng).eval()
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(in_shape, generator=g) * rng.choice([1.0, 0.5, 3.0])
    return Case(seed, model, (x,), fams)


@dataclass
class Outcome:
    seed: int
    status: str  # "exact" | "refused" | "FAIL"
    families: list[str]
    detail: str = ""
    seconds: float = 0.0


def refusal_types() -> tuple[type, ...]:
    """The errors that count as a clean refusal at compile time."""
    from corten.errors import CortenError

    return (CortenError,)


def _compile_case(seed: int, builder: Callable[[int], Case] | None = None):
    """(case, program or None, outcome or None): a refusal or a failure ends the case here."""
    from corten.compiler import compile as corten_compile

    t0 = time.perf_counter()
    case = (builder or make_case)(seed)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            prog = corten_compile(case.model, case.inputs, seed=seed, name=f"fuzz{seed}", precision=case.precision)
    except refusal_types() as e:
        first = str(e).strip().splitlines()[0][:160]
        return case, None, Outcome(seed, "refused", case.families, f"{type(e).__name__}: {first}",
                                   time.perf_counter() - t0)
    except Exception:  # noqa: BLE001 - any other exception is a fuzz failure
        return case, None, Outcome(seed, "FAIL", case.families, "compile raised:\n" + traceback.format_exc(limit=6),
                                   time.perf_counter() - t0)
    return case, prog, None


def _compare(seed, fams, where, expected, got) -> Outcome | None:
    for i, (e, g) in enumerate(zip(expected, got)):
        if not torch.equal(e, g):
            return Outcome(seed, "FAIL", fams, f"{where}: output {i}: {int((e != g).sum())} of {e.numel()} bytes differ")
    return None


def run_case(seed: int, qemu: bool = False, sanitize: bool = True, host: bool = True,
             builder: Callable[[int], Case] | None = None) -> Outcome:
    """One model alone (``builder(seed)``, default :func:`make_case`): compile, run the reference
    and the C library (its own build)."""
    t0 = time.perf_counter()
    case, prog, outcome = _compile_case(seed, builder)
    if outcome is not None:
        return outcome
    try:
        expected = prog.run_int8(*case.inputs)
        runs = ([dict(on="host", cflags=SANITIZE if sanitize else ())] if host else []) + \
               ([dict(on="qemu", target="cortex-m55")] if qemu else [])
        for kw in runs:
            bad = _compare(seed, case.families, kw["on"], expected, prog.run_c(*case.inputs, int8=True, **kw))
            if bad is not None:
                return bad
    except Exception:  # noqa: BLE001
        return Outcome(seed, "FAIL", case.families, "after compile:\n" + traceback.format_exc(limit=6),
                       time.perf_counter() - t0)
    finally:
        runner = getattr(prog, "_runner", None)
        if runner is not None:
            runner.close()
            prog._runner = None
    return Outcome(seed, "exact", case.families, "", time.perf_counter() - t0)


BATCH_MAIN = r"""/* Fuzz batch harness: runs every model on in_<i>.bin, writes out_<i>.bin. Buffers are heap blocks of
 * the exact size, so AddressSanitizer sees any access outside them. */
#define _POSIX_C_SOURCE 200112L
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
%(includes)s

/* Read (write) the `bytes` bytes of `buf` from (to) the file <prefix>_<name>.bin: 1 when all moved. */
static int move_file(const char *prefix, const char *name, void *buf, size_t bytes, int write)
{
    char path[256];
    FILE *f;
    size_t done;
    snprintf(path, sizeof path, "%%s_%%s.bin", prefix, name);
    f = fopen(path, write ? "wb" : "rb");
    if (f == NULL) {
        return 0;
    }
    done = write ? fwrite(buf, 1, bytes, f) : fread(buf, 1, bytes, f);
    fclose(f);
    return done == bytes;
}

static int run_one(const char *name, int (*fn)(const int8_t *, int8_t *, uint8_t *), size_t in_bytes,
                   size_t out_bytes, size_t arena_bytes, size_t align)
{
    int8_t *in = malloc(in_bytes), *out = malloc(out_bytes);
    void *arena = NULL;
    int status;
    if (posix_memalign(&arena, align < sizeof(void *) ? sizeof(void *) : align, arena_bytes ? arena_bytes : 1) != 0
        || in == NULL || out == NULL) {
        printf("FUZZ %%s alloc-failed\n", name);
        return 1;
    }
    if (!move_file("in", name, in, in_bytes, 0)) {
        printf("FUZZ %%s no-input\n", name);
        return 1;
    }
    status = fn(in, out, (uint8_t *)arena);
    if (!move_file("out", name, out, out_bytes, 1)) {
        printf("FUZZ %%s no-output\n", name);
        return 1;
    }
    printf("FUZZ %%s status=%%d\n", name, status);
    free(in);
    free(out);
    free(arena);
    return status != 0;
}

int main(void)
{
    int failed = 0;
%(calls)s
    return failed;
}
"""


def run_host_batch(items, workdir, cflags=SANITIZE) -> dict[int, list[torch.Tensor] | str]:
    """Build ONE host binary holding every program of ``items`` ([(seed, program, inputs)]) plus
    Corten's kernels (compiled once per process), run it, and return seed -> int8 outputs (or an
    error text).  One build per batch keeps 200 sanitized models to minutes on 2 cores."""
    import subprocess
    from pathlib import Path

    from corten.runners.common import WARNING_FLAGS, compile_and_link
    from corten.runners.host import HOST_CC
    from corten.runners.program_runner import c_bytes_to_tensor, host_kernel_objects, inputs_to_c_bytes

    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    libs, sources, includes, calls, kernel_files = {}, [], [], [], {}
    results: dict[int, list[torch.Tensor] | str] = {}
    for seed, prog, inputs in items:
        try:
            lib = prog.emit_c(workdir, kernels="portable")  # one directory: the models share corten_kernels/
        except Exception as e:  # noqa: BLE001 - a compiled program that cannot be emitted is a failure
            results[seed] = f"emit_c raised {type(e).__name__}: {e}"
            continue
        libs[seed] = lib
        sources += lib.model_sources
        for k in lib.kernel_files:
            kernel_files.setdefault(k.name, k)
        includes.append(f'#include "{lib.header.name}"')
        calls.append(f'    failed |= run_one("{seed}", {lib.run_symbol}, {lib.input_bytes}u, {lib.output_bytes}u, '
                     f'{lib.arena_bytes}u, {lib.arena_align}u);')
        data = inputs_to_c_bytes(lib, prog.quantize_inputs(*inputs))
        (workdir / f"in_{seed}.bin").write_bytes(data)
    if not libs:
        return results
    main = workdir / "fuzz_main.c"
    main.write_text(BATCH_MAIN % {"includes": "\n".join(includes), "calls": "\n".join(calls)})
    objects = host_kernel_objects(list(kernel_files.values()), tuple(cflags))
    binary = workdir / "fuzz_batch"
    inc = sorted({f"-I{lib.out_dir}" for lib in libs.values()})
    compile_and_link([HOST_CC, *WARNING_FLAGS, *cflags, *inc, *map(str, sources), str(main), *map(str, objects),
                      "-o", str(binary)], "host (fuzz batch)")
    proc = subprocess.run([str(binary)], cwd=workdir, capture_output=True, text=True, timeout=600,
                          stdin=subprocess.DEVNULL)
    statuses = dict(line.split()[1:3] for line in proc.stdout.splitlines() if line.startswith("FUZZ "))
    for seed, lib in libs.items():
        st = statuses.get(str(seed))
        if st != "status=0":
            results[seed] = (f"host batch: model status {st}" if st else
                             f"host batch: not reached (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
            continue
        data = (workdir / f"out_{seed}.bin").read_bytes()
        results[seed] = [c_bytes_to_tensor(data[t.offset:t.offset + t.nbytes], t.shape, t.bits) for t in lib.outputs]
    return results


def fuzz(seeds, qemu_every: int = 0, sanitize: bool = True, verbose: bool = False, batch: int = 25,
         out=sys.stdout) -> list[Outcome]:
    """Every seed compiled and checked against the reference; the host C runs ``batch`` models per
    build (a failing batch is re-run model by model to name the seed); every ``qemu_every``-th
    compiled model also runs alone on QEMU Cortex-M55."""
    import tempfile

    seeds = list(seeds)
    results: list[Outcome] = []
    cflags = SANITIZE if sanitize else ("-O2",)

    def report(r: Outcome, extra: str = "") -> None:
        results.append(r)
        if verbose or r.status == "FAIL":
            detail = r.detail if verbose > 1 else r.detail[:400]
            print(f"seed {r.seed}: {r.status} [{', '.join(r.families)}]{extra} {r.seconds:.1f}s {detail}",
                  file=out, flush=True)

    compiled = 0
    for b in range(0, len(seeds), batch):
        pending = []
        for seed in seeds[b:b + batch]:
            t0 = time.perf_counter()
            case, prog, outcome = _compile_case(seed)
            if outcome is not None:
                report(outcome)
                continue
            try:
                expected = prog.run_int8(*case.inputs)
            except Exception:  # noqa: BLE001
                report(Outcome(seed, "FAIL", case.families, "reference raised:\n" + traceback.format_exc(limit=6)))
                continue
            qemu = bool(qemu_every) and compiled % qemu_every == 0
            compiled += 1
            if qemu:
                try:
                    bad = _compare(seed, case.families, "qemu cortex-m55", expected,
                                   prog.run_c(*case.inputs, on="qemu", target="cortex-m55", int8=True))
                except Exception:  # noqa: BLE001
                    bad = Outcome(seed, "FAIL", case.families, "qemu raised:\n" + traceback.format_exc(limit=6))
                finally:
                    if getattr(prog, "_runner", None) is not None:
                        prog._runner.close()
                        prog._runner = None
                if bad is not None:
                    report(bad, " +qemu")
                    continue
            pending.append((seed, prog, case, expected, qemu, time.perf_counter() - t0))
        if not pending:
            continue
        t0 = time.perf_counter()
        with tempfile.TemporaryDirectory(prefix="corten-fuzz-") as tmp:
            try:
                outs = run_host_batch([(s, p, c.inputs) for s, p, c, *_ in pending], tmp, cflags)
            except Exception as e:  # noqa: BLE001 - e.g. a build error: find the model by itself
                outs = {s: f"batch build: {type(e).__name__}: {str(e)[-1500:]}" for s, *_ in pending}
        share = (time.perf_counter() - t0) / len(pending)
        batch_problem, blamed = None, False
        for seed, prog, case, expected, qemu, secs in pending:
            got = outs.get(seed, "missing")
            extra = " +qemu" if qemu else ""
            if isinstance(got, str) and got.startswith("emit_c raised"):
                report(Outcome(seed, "FAIL", case.families, got), extra)
                blamed = True
                continue
            if isinstance(got, str):  # the batch build or run failed: run the model alone to find the culprit
                batch_problem = got
                r = run_case(seed, qemu=False, sanitize=sanitize)
                blamed |= r.status == "FAIL"
                report(r, extra)
                continue
            bad = _compare(seed, case.families, "host", expected, got)
            blamed |= bad is not None
            report(bad or Outcome(seed, "exact", case.families, "", secs + share), extra)
        if batch_problem is not None and not blamed:  # no model fails alone: the batch itself is the bug
            report(Outcome(pending[0][0], "FAIL", pending[0][2].families,
                           f"batch of seeds {pending[0][0]}..{pending[-1][0]} failed, no model alone: {batch_problem}"))
    return results


def summary(results: list[Outcome]) -> str:
    exact = sum(r.status == "exact" for r in results)
    refused = [r for r in results if r.status == "refused"]
    failed = [r for r in results if r.status == "FAIL"]
    fam_counts: dict[str, int] = {}
    for r in results:
        if r.status == "exact":
            for f in r.families:
                fam_counts[f] = fam_counts.get(f, 0) + 1
    lines = [f"{len(results)} models: {exact} byte-exact, {len(refused)} refused cleanly, {len(failed)} FAILED",
             "byte-exact models per family: " + ", ".join(f"{k} {v}" for k, v in sorted(fam_counts.items()))]
    reasons: dict[str, int] = {}
    for r in refused:
        key = r.detail.split(":")[0] + ":" + " ".join(r.detail.split(":", 1)[-1].split()[:8])
        reasons[key] = reasons.get(key, 0) + 1
    for k, v in sorted(reasons.items(), key=lambda kv: -kv[1])[:10]:
        lines.append(f"  refused x{v}: {k}")
    if failed:
        lines.append("failed seeds: " + " ".join(str(r.seed) for r in failed))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m corten.testing.fuzz", description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=100, help="number of models (seeds SEED .. SEED+N-1)")
    p.add_argument("--seed", type=int, default=0, help="first seed")
    p.add_argument("--qemu-every", type=int, default=20, help="also run every K-th model on QEMU Cortex-M55 (0: never)")
    p.add_argument("--no-sanitize", action="store_true", help="host build without ASan/UBSan")
    p.add_argument("--batch", type=int, default=25, help="models per host C build (default 25)")
    p.add_argument("-v", "--verbose", action="count", default=0, help="one line per model (-vv: full details)")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    # torch's pytree deprecation note, printed once per program copy: not about the models under test
    warnings.filterwarnings("ignore", message=".*LeafSpec.*is deprecated", category=FutureWarning)
    t0 = time.perf_counter()
    results = fuzz(range(args.seed, args.seed + args.n), args.qemu_every, not args.no_sanitize, args.verbose,
                   args.batch)
    print(summary(results))
    print(f"{time.perf_counter() - t0:.0f} s")
    return 1 if any(r.status == "FAIL" for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
