"""KWT-tiny: a keyword transformer on MFCC frames.

After Berg et al., "Keyword Transformer: A Self-Attention Model for Keyword Spotting"
(Interspeech 2021), scaled down for a microcontroller: the 49 x 10 MFCC input (49 frames of 20 ms,
10 coefficients, as MLPerf Tiny's DS-CNN) is embedded frame by frame (a linear "patch" embedding
of each 10-coefficient frame), a learned positional embedding is applied, two pre-norm transformer
blocks (LayerNorm, hand-written multi-head self-attention, LayerNorm, GELU MLP, residuals) follow,
then a final LayerNorm, mean pooling over the frames and a linear classifier over 12 classes.

The attention is written out as users write it (``view`` -> ``transpose(1, 2)`` heads,
``softmax(q @ k.transpose(-2, -1) * scale) @ v``, heads merged back), not with
``nn.MultiheadAttention``.  Weights are seeded random (no downloads): truncated-normal-like
``N(0, 0.02)``-style initialisation scaled per layer so that the random network stays well
conditioned, LayerNorm affine parameters drawn around (1, 0).
"""
from __future__ import annotations

import math

import torch
from torch import nn


class Attention(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads, self.scale = heads, (dim // heads) ** -0.5
        self.q, self.k, self.v, self.proj = (nn.Linear(dim, dim) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        h = self.heads

        def split(y: torch.Tensor) -> torch.Tensor:
            return y.view(b, t, h, d // h).transpose(1, 2)  # [b, heads, t, d/heads]

        q, k, v = split(self.q(x)), split(self.k(x)), split(self.v(x))
        attn = torch.softmax((q @ k.transpose(-2, -1)) * self.scale, dim=-1)
        return self.proj((attn @ v).transpose(1, 2).reshape(b, t, d))


class Block(nn.Module):
    def __init__(self, dim: int, heads: int, mlp_dim: int) -> None:
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn = Attention(dim, heads)
        self.fc1, self.fc2 = nn.Linear(dim, mlp_dim), nn.Linear(mlp_dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.fc2(nn.functional.gelu(self.fc1(self.norm2(x))))


class KWTTiny(nn.Module):
    """``[N, 49, 10]`` MFCC frames -> 12 logits."""

    def __init__(self, frames: int = 49, mfcc: int = 10, dim: int = 32, heads: int = 2, mlp_dim: int = 64,
                 depth: int = 2, num_classes: int = 12, generator: torch.Generator | None = None) -> None:
        super().__init__()
        self.embed = nn.Linear(mfcc, dim)
        self.pos = nn.Parameter(torch.zeros(1, frames, dim))
        self.blocks = nn.Sequential(*(Block(dim, heads, mlp_dim) for _ in range(depth)))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, num_classes)
        _init(self, generator)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # learned positional embedding, stored with the opposite sign (a convention of the learned
        # parameter): the subtraction of a constant lowers as quantized_sub
        x = self.blocks(self.embed(x) - self.pos)
        return self.head(self.norm(x).transpose(1, 2).mean(-1))  # mean over the frames


def _init(model: nn.Module, generator: torch.Generator | None) -> None:
    g = generator if generator is not None else torch.Generator().manual_seed(0)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.Linear):
                m.weight.normal_(0.0, 1.0 / math.sqrt(m.in_features), generator=g)
                m.bias.normal_(0.0, 0.02, generator=g)
            elif isinstance(m, nn.LayerNorm):
                m.weight.copy_(1.0 + 0.1 * torch.randn(m.weight.shape, generator=g))
                m.bias.copy_(0.05 * torch.randn(m.bias.shape, generator=g))
        model.pos.copy_(0.5 * torch.randn(model.pos.shape, generator=g))
        for blk in model.blocks:  # residual branches start small (the zero-init-residual idea, as the CNNs)
            blk.attn.proj.weight.mul_(0.5)
            blk.fc2.weight.mul_(0.5)
