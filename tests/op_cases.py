"""Seeded random generators of op arguments for the op tests (shapes kept small for ``naive.py``).

Quantization parameters come in two flavours: *realistic* ones (a random real scale through the
naive ``quantize_multiplier``) and *extreme* ones (multiplier 0, 2**30, 2**31 - 1, shifts -31 and
30, int32-limit biases) that exercise the wrap-around and saturation corners of the C arithmetic.
"""
from __future__ import annotations

import random

import torch

import naive

I32_MIN, I32_MAX = -(2**31), 2**31 - 1
EXTREME_MULTIPLIERS = (0, 2**30, 2**30 + 1, I32_MAX - 1, I32_MAX)


def int8_tensor(rng: random.Random, shape) -> torch.Tensor:
    """Uniform int8 values, with the extremes -128/127 over-represented."""
    n = 1
    for d in shape:
        n *= d
    values = [rng.choice((-128, 127)) if rng.random() < 0.1 else rng.randint(-128, 127) for _ in range(n)]
    return torch.tensor(values, dtype=torch.int8).reshape(shape)


def multiplier_shift(rng: random.Random, log2_lo: float = -14.0, log2_hi: float = -4.0) -> tuple[int, int]:
    """One (multiplier, shift): 80% from a realistic scale 2**U(lo, hi), 20% extreme."""
    if rng.random() < 0.8:
        return naive.quantize_multiplier(2.0 ** rng.uniform(log2_lo, log2_hi))
    return rng.choice(EXTREME_MULTIPLIERS + (rng.randint(2**30, I32_MAX),)), rng.choice((-31, -30, 0, 1, 29, 30, rng.randint(-31, 30)))


def per_channel(rng: random.Random, channels: int, **scale_range) -> tuple[list[int], list[int], bool]:
    """Per-tensor (length 1) or per-channel multiplier/shift lists, and whether per-channel."""
    per_ch = rng.random() < 0.6
    pairs = [multiplier_shift(rng, **scale_range) for _ in range(channels if per_ch else 1)]
    return [m for m, _ in pairs], [s for _, s in pairs], per_ch


def qparam_tensors(mult: list[int], shift: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.tensor(mult, dtype=torch.int32), torch.tensor(shift, dtype=torch.int32)


def input_offset(rng: random.Random) -> int:
    return rng.choice((-127, 128, 0, rng.randint(-127, 128), rng.randint(-127, 128)))


def output_offset(rng: random.Random) -> int:
    return rng.choice((-128, 127, 0, rng.randint(-128, 127), rng.randint(-128, 127)))


def activation_range(rng: random.Random) -> tuple[int, int]:
    r = rng.random()
    if r < 0.5:
        return -128, 127
    if r < 0.6:
        v = rng.randint(-128, 127)
        return v, v
    lo, hi = sorted((rng.randint(-128, 127), rng.randint(-128, 127)))
    return lo, hi


def bias_list(rng: random.Random, channels: int) -> list[int] | None:
    r = rng.random()
    if r < 0.15:
        return None
    if r < 0.25:  # near the int32 limits: the accumulation wraps in C
        return [rng.choice((I32_MIN, I32_MAX, I32_MAX - rng.randint(0, 2**20), I32_MIN + rng.randint(0, 2**20)))
                for _ in range(channels)]
    bits = rng.choice((8, 12, 16, 20))
    return [rng.randint(-(1 << bits), 1 << bits) for _ in range(channels)]


def bias_tensor(bias: list[int] | None) -> torch.Tensor | None:
    return None if bias is None else torch.tensor(bias, dtype=torch.int32)


def expand(values: list[int], channels: int) -> list[int]:
    """Per-tensor lists broadcast to one entry per channel (what the C side is given)."""
    return values * channels if len(values) == 1 else values


def maybe_channels_last(rng: random.Random, t: torch.Tensor) -> torch.Tensor:
    """Graph tensors are channels_last; the kernels must not depend on it, so vary it."""
    return t.contiguous(memory_format=torch.channels_last) if rng.random() < 0.5 else t.contiguous()


def nhwc_list(t: torch.Tensor) -> list:
    return t.permute(0, 2, 3, 1).tolist()


def is_channels_last(t: torch.Tensor) -> bool:
    return t.is_contiguous(memory_format=torch.channels_last)
