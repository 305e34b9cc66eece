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


# ----------------------------------------------------------------------------- int16 tables (16x8 nonlinearities)
def _f32_round(x):
    """C's ``std::round`` on a float: ties away from zero (exact on a numpy float32 value)."""
    import math

    import numpy as np

    if not math.isfinite(float(x)):
        return np.float32(x)
    a = abs(float(x))
    r = math.floor(a)
    if a - r >= 0.5:
        r += 1
    return np.float32(math.copysign(r, float(x)))


def lut_populate_s16(fn, input_scale, input_zero_point, output_scale, output_zero_point):
    """TFLite's ``LUTPopulateInt16<float>`` written out with numpy float32 scalars, one entry at a
    time, as the C++ loop does (``fn``: a Python float -> float function, evaluated in double and
    rounded to float32).  A NaN bias (``inf - inf``) counts as 0."""
    import math

    import numpy as np

    f32 = np.float32
    s_in, s_out = f32(input_scale), f32(output_scale)
    input_min = s_in * f32(-32768 - input_zero_point)
    input_max = s_in * f32(32767 - input_zero_point)
    output_min = s_out * f32(-32768 - output_zero_point)
    output_max = s_out * f32(32767 - output_zero_point)
    step = (input_max - input_min) / f32(512)
    half_step = step / f32(2)
    inv = f32(65536) / (output_max - output_min)
    with np.errstate(over="ignore", invalid="ignore"):
        def f(v):
            return f32(fn(float(v)))

        lut = []
        for i in range(512):
            val = f(input_min + f32(i) * step)
            val_mid = f(input_min + f32(i) * step + half_step)
            val_next = f(input_min + f32(i + 1) * step)
            sample = _f32_round(val * inv)
            interp = _f32_round((val_next * inv + sample) / f32(2))
            bias = _f32_round((interp - _f32_round(val_mid * inv)) / f32(2))
            if math.isnan(float(bias)):
                bias = f32(0)
            lut.append(int(min(max(float(sample - bias), -32768.0), 32767.0)))
        lut.append(int(min(max(float(_f32_round(f(input_max) * inv)), -32768.0), 32767.0)))
    return lut


def lut_lookup_s16(q, lut):
    """``lut_lookup_with_interpolation`` on one int16 value (the slope kept in a Python int)."""
    index = 256 + (q >> 7)
    base = lut[index]
    return base + ((lut[index + 1] - base) * (q & 0x7F) + 64 >> 7)


def cmsis_sigmoid_table():
    """CMSIS-NN's ``sigmoid_table_uint16`` (sigmoid(i / 24) in 0.16) from its formula: each entry
    lowered by half the error of the interpolated midpoint, rounded; the last entry 65535."""
    import math

    def s(t):
        return 65536.0 / (1.0 + math.exp(-t / 24.0))

    out = []
    for i in range(255):
        v = s(i) - ((s(i) + s(i + 1)) / 2 - s(i + 0.5)) / 2
        out.append(int(math.floor(v + 0.5)))
    return out + [65535]


def activation_s16(q, multiplier, shift, tanh, table):
    """TFLite's int16 ``reference_integer_ops::Logistic`` / ``Tanh`` on one value (general multiplier;
    ``arm_nn_activation_s16(left_shift)`` is multiplier ``3 << left_shift`` with shift 0, or 3 with
    shift ``-left_shift``)."""
    rounding = 1 << (shift - 1) if shift > 0 else 0
    frac, sat = (8, 0xFFFF << 8) if tanh else (9, 0x7FFF << 10)
    x = (q * multiplier + rounding) >> shift
    a = abs(x)
    uh = a >> frac
    if uh >= 255:
        r = sat
    else:
        ua, ub = table[uh], table[uh + 1]
        r = (ua << frac) + (a & ((1 << frac) - 1)) * (ub - ua)
    if tanh:  # int32 result, arithmetic shift
        r = (r - (1 << 23) + (1 << 7)) if x >= 0 else (-r + (1 << 23) + (1 << 7) - 1)
        return r >> 8
    r = (r + (1 << 9)) if x >= 0 else ((1 << 25) - r + (1 << 9) - 1)
    return r >> 10


def activation_s16_params(scale):
    """TFLite's int16 SigmoidPrepare / TanhPrepare, general path."""
    m, shift = scale * 4096.0 * 3.0, 0
    while m <= 32767.0 / 2.0 and shift <= 30:
        shift += 1
        m *= 2.0
    return int(m), shift


def softmax_s16(row, multiplier, shift, exp_lut, one_by_one_lut):
    """TFLite's ``reference_ops::SoftmaxInt16`` on one row of int16 values (plain Python ints; the
    differences rescaled with arm_nn_requantize, TFLite's MultiplyByQuantizedMultiplier)."""
    mx = max(row)
    exps = []
    for v in row:
        d = requantize(v - mx, multiplier, shift) + 32767
        exps.append(lut_lookup_s16(min(max(d, -32768), 32767), exp_lut))
    total = sum(exps)
    headroom_plus_one = 32 - total.bit_length()
    shifted = ((total << (headroom_plus_one - 1)) + (1 << 13)) >> 14
    recip = lut_lookup_s16(min(max(shifted - (1 << 15) - (1 << 16), -32768), 32767), one_by_one_lut)
    right = 31 - headroom_plus_one
    return [min(max((e * recip + (1 << (right - 1))) >> right, -32768), 32767) for e in exps]


def softmax_s16_tables():
    """TFLite's int16 softmax tables written out: exp on [-10, 0] and 1/(1+x) on [0, 1] (float lambdas)."""
    import math

    import numpy as np

    r = np.float32(65535)
    exp_lut = lut_populate_s16(lambda x: math.exp(np.float32(x)), np.float32(10) / r, 32767, np.float32(2) / r, 0)
    one_lut = lut_populate_s16(lambda x: np.float32(1) / (np.float32(1) + np.float32(x)), np.float32(1) / r, -32768,
                               np.float32(2) / r, 0)
    return exp_lut, one_lut
