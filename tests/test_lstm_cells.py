"""LSTM and GRU cells written by hand from nn.Linear, sigmoid, tanh, mul, add and sub, unrolled over a
few time steps in forward (one input per step), lower through the existing families (linear, lut,
mul, add, sub) fully, agree with float and run byte-exact in C."""
from __future__ import annotations

import pytest
import torch
from torch import nn

import corten

I, H, STEPS = 6, 8, 3


class HandLSTM(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.x = nn.ModuleList(nn.Linear(I, H) for _ in range(4))
        self.h = nn.ModuleList(nn.Linear(H, H, bias=False) for _ in range(4))
        self.fc = nn.Linear(H, 5)

    def forward(self, *xs):
        h = c = None
        for x in xs:
            pre = [self.x[k](x) if h is None else self.x[k](x) + self.h[k](h) for k in range(4)]
            i, f, g, o = torch.sigmoid(pre[0]), torch.sigmoid(pre[1]), torch.tanh(pre[2]), torch.sigmoid(pre[3])
            c = i * g if c is None else f * c + i * g
            h = o * torch.tanh(c)
        return self.fc(h)


class HandGRU(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(1)
        self.x = nn.ModuleList(nn.Linear(I, H) for _ in range(3))
        self.h = nn.ModuleList(nn.Linear(H, H) for _ in range(3))
        self.fc = nn.Linear(H, 5)

    def forward(self, *xs):
        h = None
        for x in xs:
            if h is None:
                z = torch.sigmoid(self.x[1](x))
                n = torch.tanh(self.x[2](x))
                h = n - z * n
            else:
                r = torch.sigmoid(self.x[0](x) + self.h[0](h))
                z = torch.sigmoid(self.x[1](x) + self.h[1](h))
                n = torch.tanh(self.x[2](x) + r * self.h[2](h))
                h = n + z * (h - n)
        return self.fc(h)


@pytest.mark.parametrize("cls", [HandLSTM, HandGRU])
def test_hand_written_cell_lowers_and_runs_in_c(cls):
    model = cls().eval()
    xs = tuple(torch.randn(1, I, generator=torch.Generator().manual_seed(k)) for k in range(STEPS))
    prog = corten.compile(model, xs)
    assert prog.unlowered_ops() == []
    ops = prog.op_counts()
    assert ops.get("quantized_linear", 0) > 0 and ops.get("quantized_lut", 0) > 0 and ops.get("quantized_mul", 0) > 0
    g = torch.Generator().manual_seed(9)
    for _ in range(3):
        inp = tuple(torch.randn(1, I, generator=g) for _ in range(STEPS))
        cos = torch.nn.functional.cosine_similarity(prog.run(*inp).flatten(), model(*inp).flatten(), dim=0)
        assert float(cos) >= 0.95
    expected = prog.run_int8(*xs)
    got = prog.run_c(*xs, on="host", int8=True)
    assert all(torch.equal(e, o) for e, o in zip(expected, got))
