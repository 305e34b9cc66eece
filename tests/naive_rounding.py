"""Naive models of output-aware weight rounding (corten.quantizer.rounding) and of the int4 weight
range search (corten.quantizer.observers.best_clip_scale): Python loops over plain lists, the loss
of a rounding evaluated from its definition each time, no shared code with Corten."""
from __future__ import annotations

import itertools
import math


def quad(r: list[float], h: list[list[float]]) -> float:
    """r^T H r."""
    return sum(r[i] * h[i][j] * r[j] for i in range(len(r)) for j in range(len(r)))


def output_error(q: list[float], w_scaled: list[float], h: list[list[float]]) -> float:
    return quad([a - b for a, b in zip(q, w_scaled)], h)


def candidates(w: float, qmin: int, qmax: int) -> tuple[int, int]:
    f = math.floor(w)
    return min(max(f, qmin), qmax), min(max(f + 1, qmin), qmax)


def round_half_even(v: float) -> int:
    return int(round(v))  # (Python rounds half to even, as torch.round)


def descend(w_scaled: list[float], h: list[list[float]], qmin: int, qmax: int) -> list[int]:
    """One channel: from round-to-nearest, repeatedly apply the single up/down flip that lowers
    ``output_error`` most (the first weight on a tie), until none lowers it."""
    q = [min(max(round_half_even(v), qmin), qmax) for v in w_scaled]
    while True:
        base = output_error(q, w_scaled, h)
        best, best_i, best_v = 0.0, None, None
        for i, v in enumerate(w_scaled):
            lo, hi = candidates(v, qmin, qmax)
            other = hi if q[i] == lo else lo
            if other == q[i]:
                continue
            trial = q[:i] + [other] + q[i + 1:]
            gain = output_error(trial, w_scaled, h) - base
            if gain < best - 1e-9 * (1 + abs(base)):
                best, best_i, best_v = gain, i, other
        if best_i is None:
            return q
        q[best_i] = best_v


def best_rounding(w_scaled: list[float], h: list[list[float]], qmin: int, qmax: int) -> float:
    """The smallest output error over every up/down rounding of one channel (brute force)."""
    choices = [sorted(set(candidates(v, qmin, qmax))) for v in w_scaled]
    return min(output_error(list(q), w_scaled, h) for q in itertools.product(*choices))


def im2col(x, kernel: tuple[int, int], stride, padding, dilation) -> list[list[float]]:
    """Rows of one sample ``x[c][y][x]`` (nested lists): for each output position (row-major), the
    zero-padded window values in (channel, ky, kx) order."""
    c_in, h_in, w_in = len(x), len(x[0]), len(x[0][0])
    kh, kw = kernel
    h_out = (h_in + 2 * padding[0] - dilation[0] * (kh - 1) - 1) // stride[0] + 1
    w_out = (w_in + 2 * padding[1] - dilation[1] * (kw - 1) - 1) // stride[1] + 1
    rows = []
    for oy in range(h_out):
        for ox in range(w_out):
            row = []
            for c in range(c_in):
                for ky in range(kh):
                    for kx in range(kw):
                        iy = oy * stride[0] - padding[0] + ky * dilation[0]
                        ix = ox * stride[1] - padding[1] + kx * dilation[1]
                        row.append(x[c][iy][ix] if 0 <= iy < h_in and 0 <= ix < w_in else 0.0)
            rows.append(row)
    return rows


def grid_scale(max_scale: float, i: int, floor: float, steps: int, eps: float) -> float:
    return max(max_scale * (1.0 - i * (1.0 - floor) / (steps - 1)), eps)


def clip_error(w: list[float], s: float, qmin: int, qmax: int) -> float:
    return sum((min(max(round_half_even(v / s), qmin), qmax) * s - v) ** 2 for v in w)


def best_clip_scale(w: list[float], max_scale: float, qmin: int, qmax: int, floor: float, steps: int,
                    eps: float) -> float:
    """One channel: the scale ``a * max_scale`` (``a`` from 1 down to ``floor`` in ``steps`` values)
    with the least squared round-to-nearest error, the first (largest) on a tie."""
    best, best_err = None, float("inf")
    for i in range(steps):
        s = grid_scale(max_scale, i, floor, steps, eps)
        err = clip_error(w, s, qmin, qmax)
        if err < best_err:
            best, best_err = s, err
    return best
