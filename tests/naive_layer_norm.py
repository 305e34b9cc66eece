"""A deliberately naive exact integer layer norm (the arithmetic documented in
corten/ops/layer_norm.py) in plain Python ints: math.isqrt, Python's exact integer division,
CMSIS-NN's arm_nn_requantize written out.  Independent of corten.ops.layer_norm and
corten.fixed_point."""
from __future__ import annotations

import math


def i32(v: int) -> int:
    v &= 0xFFFFFFFF
    return v - (1 << 32) if v & 0x80000000 else v


def div_pow2(x: int, e: int) -> int:
    mask = (1 << e) - 1
    rem = x & mask
    res = x >> e
    thr = (mask >> 1) + (1 if res < 0 else 0)
    return res + (1 if rem > thr else 0)


def requantize(val: int, mult: int, shift: int) -> int:
    left, right = max(shift, 0), max(-shift, 0)
    x = i32(val * (1 << left))
    x = i32((x * mult + (1 << 30)) >> 31)
    return div_pow2(x, right)


def layer_norm_row(row: list[int], mult: list[int], shift: list[int], bias: list[int], eps_q: int, out_off: int,
                   amin: int, amax: int) -> list[int]:
    n = len(row)
    s = sum(row)
    v = ((n * sum(x * x for x in row) - s * s) << 20) + eps_q
    e = 0
    while v > 0 and (v << (2 * (e + 1))) < (1 << 62):
        e += 1
    r = math.isqrt(v << (2 * e)) if v > 0 else 0
    out = []
    for i, x in enumerate(row):
        num = (n * x - s) * (1 << (16 + 10 + e))
        if r == 0:
            z = 0
        else:
            mag = (2 * abs(num) + r) // (2 * r)
            z = -mag if num < 0 else mag
        acc = i32(requantize(z, mult[i], shift[i]) + bias[i])
        o = i32(div_pow2(acc, 8) + out_off)
        out.append(max(amin, min(amax, o)))
    return out
