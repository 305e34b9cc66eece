"""A deliberately naive, independent model of CMSIS-NN's int8 kernels, for testing Corten's ops.

Written from the C semantics of CMSIS-NN (``arm_nnsupportfunctions.h``, ``arm_convolve_s8``,
``arm_depthwise_conv_s8``, ``arm_fully_connected_s8`` + ``arm_vector_sum_s8``,
``arm_elementwise_add_s8``, ``arm_avgpool_s8``, ``arm_max_pool_s8``) and TFLite's
``AffineQuantize`` / ``Dequantize``, with nothing shared with :mod:`corten`: plain Python ints,
nested loops in the C kernels' order, and an explicit int32 wrap wherever the C code computes in
``int32_t`` and could overflow.  Slow on purpose; keep the shapes small.

Tensors are plain nested lists, NHWC for activations (the C buffers' layout):

* conv input ``x[n][h][w][c]``, OHWI weight ``w[o][kh][kw][c]``;
* depthwise weight ``w[kh][kw][c_out]`` (the ``[1, kH, kW, C_out]`` tensor without its leading 1),
  output channel ``c * mult + m`` reading input channel ``c``;
* linear input ``x[batch][k]``, weight ``w[out][k]``.
"""
from __future__ import annotations

import math
import struct
from fractions import Fraction

I32_MIN = -(1 << 31)
I32_MAX = (1 << 31) - 1


# ----------------------------------------------------------------------------- C integer helpers
def i32(v: int) -> int:
    """The int32_t a C cast (or an overflowing int32 operation) leaves of ``v``."""
    v &= 0xFFFFFFFF
    return v - (1 << 32) if v >= (1 << 31) else v


def i8(v: int) -> int:
    """The int8_t a C cast leaves of ``v``."""
    v &= 0xFF
    return v - 256 if v >= 128 else v


def c_div(a: int, b: int) -> int:
    """C's integer division, truncating towards zero."""
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b >= 0) else -q


def asr(v: int, n: int) -> int:
    """Arithmetic shift right (what ``>>`` does to a signed value on Arm)."""
    return v // (1 << n)


# ----------------------------------------------------------------------------- fixed point
def doubling_high_mult(m1: int, m2: int) -> int:
    """arm_nn_doubling_high_mult: nudge by +-2**30, divide the int64 by 2**31 (truncating), cast."""
    nudge = 1 << 30
    if (m1 < 0) != (m2 < 0):
        nudge = 1 - nudge
    acc = nudge + m1 * m2  # fits int64 for int32 operands
    result = i32(c_div(acc, 1 << 31))
    if m1 == m2 == I32_MIN:
        result = I32_MAX
    return result


def doubling_high_mult_no_sat(m1: int, m2: int) -> int:
    """arm_nn_doubling_high_mult_no_sat: ``(int32_t)((m1 * m2 + 2**30) >> 31)``."""
    return i32(asr(m1 * m2 + (1 << 30), 31))


def divide_by_power_of_two(dividend: int, exponent: int) -> int:
    """arm_nn_divide_by_power_of_two on int32 operands (exponent 0..31), written as in C."""
    assert 0 <= exponent <= 31
    remainder_mask = i32((1 << exponent) - 1)
    remainder = i32(remainder_mask & dividend)
    result = asr(dividend, exponent)
    threshold = asr(remainder_mask, 1)
    if result < 0:
        threshold += 1
    if remainder > threshold:
        result += 1
    return result


def requantize(val: int, multiplier: int, shift: int) -> int:
    """arm_nn_requantize, default (double rounding) build: ``val * (1 << LEFT_SHIFT)`` wraps."""
    left = shift if shift > 0 else 0
    right = -shift if shift <= 0 else 0
    return divide_by_power_of_two(doubling_high_mult_no_sat(i32(val * (1 << left)), multiplier), right)


def requantize_single_rounding(val: int, multiplier: int, shift: int) -> int:
    """arm_nn_requantize built with CMSIS_NN_USE_SINGLE_ROUNDING."""
    total_shift = 31 - shift
    new_val = val * multiplier
    result = asr(new_val, total_shift - 1)
    return i32(asr(result + 1, 1))


def quantize_multiplier(scale: float) -> tuple[int, int]:
    """TFLite QuantizeMultiplier with exact rational arithmetic: scale = q * 2**(shift-31)."""
    if scale == 0:
        return 0, 0
    exp = 0
    frac = Fraction(scale)
    while frac >= 1:
        frac /= 2
        exp += 1
    while frac < Fraction(1, 2):
        frac *= 2
        exp -= 1
    scaled = frac * (1 << 31)
    q = math.floor(scaled + Fraction(1, 2))  # std::round: half away from zero (scaled > 0)
    if q == 1 << 31:
        q //= 2
        exp += 1
    if exp < -31:
        return 0, 0
    return q, exp


def clamp(v: int, lo: int, hi: int) -> int:
    return min(max(v, lo), hi)


# ----------------------------------------------------------------------------- quantize
def f32(v: float) -> float:
    """Round a Python float (float64) to the nearest float32 value."""
    return struct.unpack("<f", struct.pack("<f", v))[0]


def round_half_away(v: float) -> int:
    """std::round, exactly (on the rational value of ``v``)."""
    r = Fraction(v)
    q = math.floor(abs(r) + Fraction(1, 2))
    return q if r >= 0 else -q


def quantize(x: float, scale: float, zero_point: int) -> int:
    """TFLite AffineQuantize: ``clamp(round(x / scale) + zp)`` with a float32 division.

    The float64 quotient of two float32 values, rounded once to float32, is the correctly rounded
    float32 quotient (float64 has more than 2 * 24 + 2 bits), i.e. what a float32 divide gives.
    """
    quotient = f32(f32(x) / f32(scale))
    return clamp(round_half_away(quotient) + zero_point, -128, 127)


def dequantize(q: int, scale: float, zero_point: int) -> float:
    """TFLite Dequantize: ``(q - zp) * scale`` in float32 (the float64 product is exact)."""
    return f32(float(q - zero_point) * f32(scale))


# ----------------------------------------------------------------------------- kernels
def conv2d(x, w, bias, stride, padding, dilation, input_offset, output_offset, mult, shift, act_min, act_max):
    """arm_convolve_s8 (groups = 1), NHWC in, NHWC out.  ``mult``/``shift`` are per output channel."""
    n_batch, in_h, in_w, in_c = len(x), len(x[0]), len(x[0][0]), len(x[0][0][0])
    out_c, ker_h, ker_w = len(w), len(w[0]), len(w[0][0])
    out_h = (in_h + 2 * padding[0] - dilation[0] * (ker_h - 1) - 1) // stride[0] + 1
    out_w = (in_w + 2 * padding[1] - dilation[1] * (ker_w - 1) - 1) // stride[1] + 1
    pad_value = i8(-input_offset)  # im2col fills padding with -input_offset
    out = []
    for b in range(n_batch):
        plane = []
        for oy in range(out_h):
            row = []
            for ox in range(out_w):
                # im2col column for this output pixel
                col = []
                for ky in range(ker_h):
                    for kx in range(ker_w):
                        iy = oy * stride[0] - padding[0] + dilation[0] * ky
                        ix = ox * stride[1] - padding[1] + dilation[1] * kx
                        for c in range(in_c):
                            if 0 <= iy < in_h and 0 <= ix < in_w:
                                col.append(x[b][iy][ix][c])
                            else:
                                col.append(pad_value)
                pixel = []
                for o in range(out_c):
                    acc = bias[o] if bias is not None else 0
                    k = 0
                    for ky in range(ker_h):
                        for kx in range(ker_w):
                            for c in range(in_c):
                                acc = i32(acc + (col[k] + input_offset) * w[o][ky][kx][c])
                                k += 1
                    acc = requantize(acc, mult[o], shift[o])
                    acc = i32(acc + output_offset)
                    pixel.append(i8(clamp(acc, act_min, act_max)))
                row.append(pixel)
            plane.append(row)
        out.append(plane)
    return out


def depthwise_conv2d(x, w, bias, stride, padding, dilation, ch_mult, input_offset, output_offset,
                     mult, shift, act_min, act_max):
    """arm_depthwise_conv_s8 (generic path): taps outside the input are skipped."""
    n_batch, in_h, in_w, in_c = len(x), len(x[0]), len(x[0][0]), len(x[0][0][0])
    ker_h, ker_w = len(w), len(w[0])
    out_h = (in_h + 2 * padding[0] - dilation[0] * (ker_h - 1) - 1) // stride[0] + 1
    out_w = (in_w + 2 * padding[1] - dilation[1] * (ker_w - 1) - 1) // stride[1] + 1
    out = []
    for b in range(n_batch):
        plane = []
        for oy in range(out_h):
            row = []
            for ox in range(out_w):
                pixel = []
                for c in range(in_c):
                    for m in range(ch_mult):
                        o = c * ch_mult + m
                        acc = bias[o] if bias is not None else 0
                        for ky in range(ker_h):
                            iy = oy * stride[0] - padding[0] + dilation[0] * ky
                            if not 0 <= iy < in_h:
                                continue
                            for kx in range(ker_w):
                                ix = ox * stride[1] - padding[1] + dilation[1] * kx
                                if not 0 <= ix < in_w:
                                    continue
                                acc = i32(acc + (x[b][iy][ix][c] + input_offset) * w[ky][kx][o])
                        acc = requantize(acc, mult[o], shift[o])
                        acc = i32(acc + output_offset)
                        pixel.append(i8(clamp(acc, act_min, act_max)))
                row.append(pixel)
            plane.append(row)
        out.append(plane)
    return out


def vector_sum(w, bias, lhs_offset: int) -> list[int]:
    """arm_vector_sum_s8 with rhs_offset 0: the kernel_sum context buffer of the Helium FC path."""
    out = []
    for o, row in enumerate(w):
        acc = bias[o] if bias is not None else 0
        if lhs_offset:
            s = 0
            for v in row:
                s = i32(s + v)
            acc = i32(acc + i32(s * lhs_offset))
        out.append(acc)
    return out


def fully_connected(x, w, bias, input_offset, output_offset, mult, shift, act_min, act_max):
    """arm_fully_connected_s8 / _per_channel_s8 (scalar path): bias + sum((x + offset) * w)."""
    out = []
    for row_x in x:
        res = []
        for o, row_w in enumerate(w):
            acc = bias[o] if bias is not None else 0
            for xv, wv in zip(row_x, row_w):
                acc = i32(acc + (xv + input_offset) * wv)
            acc = requantize(acc, mult[o], shift[o])
            acc = i32(acc + output_offset)
            res.append(i8(clamp(acc, act_min, act_max)))
        out.append(res)
    return out


def fully_connected_with_kernel_sum(x, w, kernel_sum, output_offset, mult, shift, act_min, act_max):
    """The Helium FC path: accumulator starts at kernel_sum and adds raw ``x * w``."""
    out = []
    for row_x in x:
        res = []
        for o, row_w in enumerate(w):
            acc = kernel_sum[o]
            for xv, wv in zip(row_x, row_w):
                acc = i32(acc + xv * wv)
            acc = requantize(acc, mult[o], shift[o])
            acc = i32(acc + output_offset)
            res.append(i8(clamp(acc, act_min, act_max)))
        out.append(res)
    return out


def elementwise_add(a, b, a_offset, a_mult, a_shift, b_offset, b_mult, b_shift, left_shift,
                    out_offset, out_mult, out_shift, act_min, act_max):
    """arm_elementwise_add_s8 on flat lists of int8 values."""
    out = []
    for va, vb in zip(a, b):
        in1 = i32((va + a_offset) << left_shift)
        in2 = i32((vb + b_offset) << left_shift)
        in1 = requantize(in1, a_mult, a_shift)
        in2 = requantize(in2, b_mult, b_shift)
        s = i32(in1 + in2)
        s = requantize(s, out_mult, out_shift)
        s = i32(s + out_offset)
        out.append(i8(clamp(s, act_min, act_max)))
    return out


def _pool_out(size: int, k: int, stride: int, pad: int) -> int:
    return (size + 2 * pad - k) // stride + 1


def avg_pool2d(x, kernel, stride, padding, act_min, act_max):
    """arm_avgpool_s8 (reference C path): average of the in-bounds elements, C rounding."""
    n_batch, in_h, in_w, ch = len(x), len(x[0]), len(x[0][0]), len(x[0][0][0])
    out_h = _pool_out(in_h, kernel[0], stride[0], padding[0])
    out_w = _pool_out(in_w, kernel[1], stride[1], padding[1])
    out = []
    for b in range(n_batch):
        plane = []
        for oy in range(out_h):
            row = []
            for ox in range(out_w):
                pixel = []
                for c in range(ch):
                    total = 0
                    count = 0
                    for ky in range(oy * stride[0] - padding[0], oy * stride[0] - padding[0] + kernel[0]):
                        for kx in range(ox * stride[1] - padding[1], ox * stride[1] - padding[1] + kernel[1]):
                            if 0 <= ky < in_h and 0 <= kx < in_w:
                                total += x[b][ky][kx][c]
                                count += 1
                    assert count > 0
                    if total > 0:
                        total = c_div(total + count // 2, count)
                    else:
                        total = c_div(total - count // 2, count)
                    pixel.append(i8(clamp(total, act_min, act_max)))
                row.append(pixel)
            plane.append(row)
        out.append(plane)
    return out


def max_pool2d(x, kernel, stride, padding, act_min, act_max):
    """arm_max_pool_s8: max of the in-bounds elements, then clamp."""
    n_batch, in_h, in_w, ch = len(x), len(x[0]), len(x[0][0]), len(x[0][0][0])
    out_h = _pool_out(in_h, kernel[0], stride[0], padding[0])
    out_w = _pool_out(in_w, kernel[1], stride[1], padding[1])
    out = []
    for b in range(n_batch):
        plane = []
        for oy in range(out_h):
            row = []
            for ox in range(out_w):
                best = None
                for ky in range(kernel[0]):
                    for kx in range(kernel[1]):
                        iy = oy * stride[0] - padding[0] + ky
                        ix = ox * stride[1] - padding[1] + kx
                        if not (0 <= iy < in_h and 0 <= ix < in_w):
                            continue
                        vals = x[b][iy][ix]
                        best = list(vals) if best is None else [v if v > cur else cur for v, cur in zip(vals, best)]
                assert best is not None
                row.append([clamp(v, act_min, act_max) for v in best])
            plane.append(row)
        out.append(plane)
    return out
