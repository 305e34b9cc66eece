"""A deliberately naive, independent model of CMSIS-NN's 16x8 kernels (int16 activations, int8
weights, int64 bias), for testing Corten's s16 ops.

Written from the C of ``arm_fully_connected_s16`` / ``arm_nn_vec_mat_mult_t_s16`` and the helpers
``REDUCE_MULTIPLIER`` and ``arm_nn_requantize_s64`` in ``arm_nnsupportfunctions.h``, and TFLite's
Requantize (int8 <-> int16, ``MultiplyByQuantizedMultiplier``), with nothing shared with
:mod:`corten`: plain Python ints, the C loops, explicit wraps where the C code narrows.
"""
from __future__ import annotations

from naive import i32, requantize  # (the int8 helpers: C semantics of arm_nn_requantize)


def reduce_multiplier(m: int) -> int:
    """``REDUCE_MULTIPLIER(_mult) ((_mult < 0x7FFF0000) ? ((_mult + (1 << 15)) >> 16) : 0x7FFF)``."""
    return (m + (1 << 15)) // (1 << 16) if m < 0x7FFF0000 else 0x7FFF


def requantize_s64(val: int, reduced_multiplier: int, shift: int) -> int:
    """``arm_nn_requantize_s64``: ``int32_t result = new_val >> (14 - shift); (result + 1) >> 1``."""
    new_val = val * reduced_multiplier  # int64 in C (no overflow for the values tested)
    result = i32(new_val // (1 << (14 - shift)))  # arithmetic shift = floor division; the cast wraps
    return (result + 1) // 2


def linear_s16(x, w, bias, multiplier, shift, act_min, act_max):
    """``x[batch][k]`` int16, ``w[out][k]`` int8, ``bias[out]`` int64 or None; per-channel
    ``multiplier[out]`` / ``shift[out]`` (or one entry)."""
    out = []
    for row in x:
        y = []
        for o, wr in enumerate(w):
            acc = 0
            for a, b in zip(row, wr):
                acc += a * b
            if bias is not None:
                acc += bias[o]
            q = o if len(multiplier) > 1 else 0
            v = requantize_s64(acc, reduce_multiplier(multiplier[q]), shift[q])
            y.append(min(max(v, act_min), act_max))
        out.append(y)
    return out


def requantize_width(values, input_offset, output_offset, multiplier, shift, bits):
    """TFLite Requantize between int8 and int16 grids, elementwise on a flat list."""
    lo, hi = (-128, 127) if bits == 8 else (-32768, 32767)
    return [min(max(i32(requantize(v + input_offset, multiplier, shift) + output_offset), lo), hi) for v in values]


def _s16_out(acc, o, multiplier, shift, act_min, act_max):
    q = o if len(multiplier) > 1 else 0
    return min(max(requantize_s64(acc, reduce_multiplier(multiplier[q]), shift[q]), act_min), act_max)


def conv2d_s16(x, w, bias, stride, padding, dilation, multiplier, shift, act_min, act_max):
    """``arm_convolve_s16``: NHWC ``x[n][h][w][c]`` int16, OHWI ``w[o][kh][kw][c]``, int64 bias; zero padding."""
    n_, h_, w_, c_ = len(x), len(x[0]), len(x[0][0]), len(x[0][0][0])
    c_out, kh, kw = len(w), len(w[0]), len(w[0][0])
    ho = (h_ + 2 * padding[0] - dilation[0] * (kh - 1) - 1) // stride[0] + 1
    wo = (w_ + 2 * padding[1] - dilation[1] * (kw - 1) - 1) // stride[1] + 1
    out = []
    for n in range(n_):
        rows = []
        for oy in range(ho):
            cols = []
            for ox in range(wo):
                px = []
                for o in range(c_out):
                    acc = bias[o] if bias is not None else 0
                    for ky in range(kh):
                        for kx in range(kw):
                            iy = oy * stride[0] - padding[0] + ky * dilation[0]
                            ix = ox * stride[1] - padding[1] + kx * dilation[1]
                            if 0 <= iy < h_ and 0 <= ix < w_:
                                for c in range(c_):
                                    acc += x[n][iy][ix][c] * w[o][ky][kx][c]
                    px.append(_s16_out(acc, o, multiplier, shift, act_min, act_max))
                cols.append(px)
            rows.append(cols)
        out.append(rows)
    return out


def depthwise_s16(x, w, bias, stride, padding, dilation, ch_mult, multiplier, shift, act_min, act_max):
    """``arm_depthwise_conv_s16``: ``w[kh][kw][c_out]``, output channel ``c * ch_mult + m`` reads ``c``."""
    n_, h_, w_ = len(x), len(x[0]), len(x[0][0])
    kh, kw, c_out = len(w), len(w[0]), len(w[0][0])
    ho = (h_ + 2 * padding[0] - dilation[0] * (kh - 1) - 1) // stride[0] + 1
    wo = (w_ + 2 * padding[1] - dilation[1] * (kw - 1) - 1) // stride[1] + 1
    out = []
    for n in range(n_):
        rows = []
        for oy in range(ho):
            cols = []
            for ox in range(wo):
                px = []
                for o in range(c_out):
                    acc = bias[o] if bias is not None else 0
                    for ky in range(kh):
                        for kx in range(kw):
                            iy = oy * stride[0] - padding[0] + ky * dilation[0]
                            ix = ox * stride[1] - padding[1] + kx * dilation[1]
                            if 0 <= iy < h_ and 0 <= ix < w_:
                                acc += x[n][iy][ix][o // ch_mult] * w[ky][kx][o]
                    px.append(_s16_out(acc, o, multiplier, shift, act_min, act_max))
                cols.append(px)
            rows.append(cols)
        out.append(rows)
    return out


def pool_s16(x, kernel, stride, padding, act_min, act_max, is_avg):
    """``arm_avgpool_s16`` (average of the in-input taps, rounded away from zero) / ``arm_max_pool_s16``."""
    n_, h_, w_, c_ = len(x), len(x[0]), len(x[0][0]), len(x[0][0][0])
    ho = (h_ + 2 * padding[0] - kernel[0]) // stride[0] + 1
    wo = (w_ + 2 * padding[1] - kernel[1]) // stride[1] + 1
    out = []
    for n in range(n_):
        rows = []
        for oy in range(ho):
            cols = []
            for ox in range(wo):
                px = []
                for c in range(c_):
                    vals = [x[n][iy][ix][c]
                            for iy in range(oy * stride[0] - padding[0], oy * stride[0] - padding[0] + kernel[0])
                            for ix in range(ox * stride[1] - padding[1], ox * stride[1] - padding[1] + kernel[1])
                            if 0 <= iy < h_ and 0 <= ix < w_]
                    if is_avg:
                        s, k = sum(vals), len(vals)
                        v = (s + k // 2) // k if s > 0 else -((k // 2 - s) // k)  # C truncating division
                    else:
                        v = max(vals)
                    px.append(min(max(v, act_min), act_max))
                cols.append(px)
            rows.append(cols)
        out.append(rows)
    return out


def add_s16(x1, x2, mult1, shift1, mult2, shift2, left_shift, out_mult, out_shift, act_min, act_max):
    """``arm_elementwise_add_s16`` on two equal-length lists of int16 values (offsets are 0)."""
    out = []
    for a, b in zip(x1, x2):
        a = requantize(a * (1 << left_shift), mult1, shift1)
        b = requantize(b * (1 << left_shift), mult2, shift2)
        s = requantize(i32(a + b), out_mult, out_shift)
        out.append(min(max(s, act_min), act_max))
    return out


def mul_s16(x1, x2, out_mult, out_shift, act_min, act_max):
    """``arm_elementwise_mul_s16`` on two equal-length lists of int16 values (offsets are 0)."""
    return [min(max(requantize(a * b, out_mult, out_shift), act_min), act_max) for a, b in zip(x1, x2)]
