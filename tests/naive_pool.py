"""Deliberately naive plain-Python pools written from PyTorch's definitions (``avg_pool2d``'s
``pool_size`` / ``divide_factor``, ``max_pool2d``'s dilated taps, ``pooling_output_shape``, the
adaptive windows) with CMSIS-NN's integer rounding.  Tensors are nested lists ``[N][H][W][C]``."""
from __future__ import annotations

from naive import c_div, clamp


def out_size(size, k, stride, before, after, dilation=1, ceil_mode=False):
    """PyTorch's ``pooling_output_shape`` (leading/trailing padding given separately)."""
    numerator = size + before + after - dilation * (k - 1) - 1
    if ceil_mode:
        o = -(-numerator // stride) + 1
        if (o - 1) * stride >= size + before:
            o -= 1
    else:
        o = numerator // stride + 1
    return o


def _round_div(total, d):
    return c_div(total + d // 2, d) if total > 0 else c_div(total - d // 2, d)


def avg_pool2d(x, kernel, stride, pads, ceil_mode, count_include_pad, divisor_override, act_min, act_max,
               zero_point=0):
    """``pads`` = (top, left, bottom, right).  Divisor = element count: CMSIS-NN's raw-value average;
    other divisors average the real values ``q - zero_point`` (padding = real 0)."""
    n_b, h, w, ch = len(x), len(x[0]), len(x[0][0]), len(x[0][0][0])
    top, left, bottom, right = pads
    oh = out_size(h, kernel[0], stride[0], top, bottom, 1, ceil_mode)
    ow = out_size(w, kernel[1], stride[1], left, right, 1, ceil_mode)
    out = []
    for b in range(n_b):
        plane = []
        for oy in range(oh):
            row = []
            for ox in range(ow):
                hs, ws = oy * stride[0] - top, ox * stride[1] - left
                he, we = min(hs + kernel[0], h + bottom), min(ws + kernel[1], w + right)
                pool_size = (he - hs) * (we - ws)
                hs_c, ws_c, he_c, we_c = max(hs, 0), max(ws, 0), min(he, h), min(we, w)
                if divisor_override:
                    d = divisor_override
                elif count_include_pad:
                    d = pool_size
                else:
                    d = (he_c - hs_c) * (we_c - ws_c)
                zp = zero_point if (divisor_override or count_include_pad) else 0
                pixel = []
                for c in range(ch):
                    total = sum(x[b][iy][ix][c] - zp for iy in range(hs_c, he_c) for ix in range(ws_c, we_c))
                    pixel.append(clamp(_round_div(total, d) + zp, act_min, act_max))
                row.append(pixel)
            plane.append(row)
        out.append(plane)
    return out


def max_pool2d(x, kernel, stride, pads, dilation, ceil_mode, act_min, act_max):
    n_b, h, w, ch = len(x), len(x[0]), len(x[0][0]), len(x[0][0][0])
    top, left, bottom, right = pads
    oh = out_size(h, kernel[0], stride[0], top, bottom, dilation[0], ceil_mode)
    ow = out_size(w, kernel[1], stride[1], left, right, dilation[1], ceil_mode)
    out = []
    for b in range(n_b):
        plane = []
        for oy in range(oh):
            row = []
            for ox in range(ow):
                pixel = []
                for c in range(ch):
                    vals = [x[b][iy][ix][c]
                            for iy in (oy * stride[0] - top + ky * dilation[0] for ky in range(kernel[0]))
                            for ix in (ox * stride[1] - left + kx * dilation[1] for kx in range(kernel[1]))
                            if 0 <= iy < h and 0 <= ix < w]
                    pixel.append(clamp(max(vals), act_min, act_max))
                row.append(pixel)
            plane.append(row)
        out.append(plane)
    return out


def adaptive_pool2d(x, out_hw, is_avg, act_min, act_max):
    n_b, h, w, ch = len(x), len(x[0]), len(x[0][0]), len(x[0][0][0])
    import math

    def bounds(i, size, o):
        return math.floor(i * size / o), math.ceil((i + 1) * size / o)

    out = []
    for b in range(n_b):
        plane = []
        for oy in range(out_hw[0]):
            y0, y1 = bounds(oy, h, out_hw[0])
            row = []
            for ox in range(out_hw[1]):
                x0, x1 = bounds(ox, w, out_hw[1])
                pixel = []
                for c in range(ch):
                    vals = [x[b][iy][ix][c] for iy in range(y0, y1) for ix in range(x0, x1)]
                    v = _round_div(sum(vals), len(vals)) if is_avg else max(vals)
                    pixel.append(clamp(v, act_min, act_max))
                row.append(pixel)
            plane.append(row)
        out.append(plane)
    return out
