"""Deliberately naive, independent models of ``corten.quantized_lut`` and of its table construction.

Scalar Python on lists, ``math`` instead of torch for the real functions, and the exact
(``Fraction``-based) ``naive.round_half_away`` for the rounding.
"""
from __future__ import annotations

import math
from typing import Callable

import naive

SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


def lookup(values: list[int], table: list[int]) -> list[int]:
    """``output[i] = table[values[i] + 128]``, one element at a time."""
    out = []
    for v in values:
        assert -128 <= v <= 127
        out.append(table[v + 128])
    return out


# ----------------------------------------------------------------------------- real functions (float64)
def sigmoid(x: float) -> float:
    if x >= 0:
        return 1.0 / (1.0 + math.exp(-x))
    e = math.exp(x)  # no overflow for very negative x
    return e / (1.0 + e)


def hardsigmoid(x: float) -> float:
    return min(max(x + 3.0, 0.0), 6.0) / 6.0


def hardswish(x: float) -> float:
    return x * min(max(x + 3.0, 0.0), 6.0) / 6.0


def silu(x: float) -> float:
    return x * sigmoid(x)


def gelu(x: float) -> float:
    return x * 0.5 * (1.0 + math.erf(x * math.sqrt(0.5)))


def gelu_tanh(x: float) -> float:
    return 0.5 * x * (1.0 + math.tanh(SQRT_2_OVER_PI * (x + 0.044715 * x * x * x)))


def elu(alpha: float) -> Callable[[float], float]:
    return lambda x: x if x > 0 else alpha * math.expm1(x)


def leaky_relu(slope: float) -> Callable[[float], float]:
    return lambda x: x if x > 0 else slope * x


def clamp(lo: float | None, hi: float | None) -> Callable[[float], float]:
    def f(x: float) -> float:
        if lo is not None and x < lo:
            x = lo
        if hi is not None and x > hi:
            x = hi
        return x
    return f


relu = clamp(0.0, None)
relu6 = clamp(0.0, 6.0)


# ----------------------------------------------------------------------------- the table
def table(fn: Callable[[float], float], s_in: float, zp_in: int, s_out: float, zp_out: int) -> list[int]:
    """Entry q + 128 = clamp(round_half_away(fn(s_in * (q - zp_in)) / s_out) + zp_out), in float64."""
    out = []
    for q in range(-128, 128):
        y = fn(s_in * (q - zp_in))
        quotient = y / s_out
        if math.isinf(quotient) or abs(quotient) > 1e6:
            out.append(127 if quotient > 0 else -128)
            continue
        out.append(naive.clamp(naive.round_half_away(quotient) + zp_out, -128, 127))
    return out
