"""A deliberately naive ``arm_softmax_s8`` (CMSIS-NN's scalar path) in plain Python ints.

Written line by line from the C, independently of ``corten.ops.softmax`` and ``corten.fixed_point``:
one row at a time, one element at a time, every int32 operation wrapped explicitly.  Also TFLite's
int8 softmax preparation (``PreprocessSoftmaxScaling``, ``CalculateInputRadius``).
"""
from __future__ import annotations

import math

Q31_MIN, Q31_MAX = -(2**31), 2**31 - 1


def i32(v: int) -> int:
    """What storing ``v`` in an int32_t gives on a two's-complement machine."""
    v &= 0xFFFFFFFF
    return v - (1 << 32) if v & 0x80000000 else v


def c_div(a: int, b: int) -> int:
    """C integer division (truncates towards zero)."""
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b >= 0) else -q


def mul_sat(m1: int, m2: int) -> int:
    """arm_nn_doubling_high_mult."""
    mult = 1 << 30
    if (m1 < 0) != (m2 < 0):
        mult = 1 - mult
    mult = mult + m1 * m2
    result = i32(c_div(mult, 1 << 31))
    if m1 == m2 and m1 == Q31_MIN:
        result = Q31_MAX
    return result


def div_pow2(dividend: int, exponent: int) -> int:
    """arm_nn_divide_by_power_of_two (exponent 0..31)."""
    assert 0 <= exponent <= 31
    remainder_mask = (1 << exponent) - 1
    remainder = remainder_mask & dividend
    result = dividend >> exponent
    threshold = remainder_mask >> 1
    if result < 0:
        threshold += 1
    if remainder > threshold:
        result += 1
    return result


def mul_pow2(val: int, exp: int) -> int:
    """arm_nn_mult_by_power_of_two."""
    thresh = (1 << (31 - exp)) - 1
    result = i32(val << exp)
    if val > thresh:
        result = Q31_MAX
    if val < -thresh:
        result = Q31_MIN
    return result


def exp_on_neg(val: int) -> int:
    """arm_nn_exp_on_negative_values."""
    shift = 24
    val_mod_minus_quarter = i32((val & ((1 << shift) - 1)) - (1 << shift))
    remainder = i32(val_mod_minus_quarter - val)
    x = i32(i32(val_mod_minus_quarter << 5) + (1 << 28))
    x2 = mul_sat(x, x)
    inner = i32(div_pow2(mul_sat(x2, x2), 2) + mul_sat(x2, x))
    inner = i32(mul_sat(inner, 715827883) + x2)
    inner = i32(x + div_pow2(inner, 1))
    result = i32(1895147668 + mul_sat(1895147668, inner))
    for c in (1672461947, 1302514674, 790015084, 290630308, 39332535, 720401, 242):
        if remainder & (1 << shift):
            result = mul_sat(result, c)
        shift += 1
    if val == 0:
        result = Q31_MAX
    return result


def one_over1(val: int) -> int:
    """arm_nn_one_over_one_plus_x_for_x_in_0_1."""
    s = val + Q31_MAX
    half_denominator = i32(c_div(s + (1 if s >= 0 else -1), 2))
    x = i32(1515870810 + mul_sat(half_denominator, -1010580540))
    shift = 1 << 29
    for _ in range(3):
        x = i32(x + mul_pow2(mul_sat(x, i32(shift - mul_sat(half_denominator, x))), 2))
    return mul_pow2(x, 1)


def clz32(v: int) -> int:
    v &= 0xFFFFFFFF
    n = 0
    bit = 1 << 31
    while n < 32 and not v & bit:
        n += 1
        bit >>= 1
    return n


def softmax_row(row: list[int], mult: int, shift: int, diff_min: int) -> list[int]:
    """One row of arm_nn_softmax_common_s8 (int8 output).  A final shift above 31 (undefined in
    C) is taken as an exact rounding division, which gives 0 for the non-negative products."""
    mask = 1 << shift
    mx = row[0]
    for v in row[1:]:
        mx = max(mx, v)
    total = 0
    for v in row:
        diff = v - mx
        if diff >= diff_min:
            total = i32(total + div_pow2(exp_on_neg(mul_sat(i32(diff * mask), mult)), 12))
    headroom = clz32(total)
    shifted_scale = one_over1(i32(((total << headroom) if total > 0 else 0) - (1 << 31)))
    bits_over_unit = 12 - headroom + 23
    out = []
    for v in row:
        diff = v - mx
        if diff >= diff_min:
            prod = mul_sat(shifted_scale, exp_on_neg(mul_sat(i32(diff * mask), mult)))
            q = div_pow2(prod, bits_over_unit) if bits_over_unit <= 31 else 0
            res = q - 128
            out.append(max(min(res, 127), -128))
        else:
            out.append(-128)
    return out


# ----------------------------------------------------------------------------- TFLite preparation
def tflite_quantize_multiplier(d: float) -> tuple[int, int]:
    if d == 0.0:
        return 0, 0
    q, shift = math.frexp(d)
    q_fixed = int(math.copysign(math.floor(abs(q) * (1 << 31) + 0.5), q))
    if q_fixed == 1 << 31:
        q_fixed //= 2
        shift += 1
    if shift < -31:
        shift, q_fixed = 0, 0
    return q_fixed, shift


def tflite_softmax_params(beta: float, input_scale: float) -> tuple[int, int, int]:
    """(input_multiplier, input_left_shift, diff_min) as TFLite's int8 softmax Prepare computes them."""
    integer_bits = 5
    real = min(beta * input_scale * (1 << (31 - integer_bits)), (1 << 31) - 1.0)
    assert real > 1.0
    mult, left_shift = tflite_quantize_multiplier(real)
    assert left_shift >= 0
    radius = math.floor(1.0 * ((1 << integer_bits) - 1) * (1 << (31 - integer_bits)) / (1 << left_shift))
    return mult, left_shift, -int(radius)


# ----------------------------------------------------------------------------- TFLite int8 LogSoftmax
# reference_integer_ops::LogSoftmax and gemmlowp's log_x_for_x_greater_than_or_equal_to_1_impl
# (InputIntegerBits = 12, deduced from the Q12.19 sum; OutputIntegerBits = 5), one gemmlowp
# fixed-point operation at a time.
def srmbpot_param(x: int, exponent: int) -> int:
    """TFLite SaturatingRoundingMultiplyByPOTParam (exponent >= 0)."""
    if exponent == 0:
        return x
    threshold = (1 << (31 - exponent)) - 1
    if x > threshold:
        return Q31_MAX
    if x < -threshold:
        return Q31_MIN
    return i32(x * (1 << exponent))


def sat_add(a: int, b: int) -> int:
    return max(Q31_MIN, min(Q31_MAX, a + b))


def rounding_half_sum(a: int, b: int) -> int:
    s = a + b
    return c_div(s + (1 if s >= 0 else -1), 2)


def log_x_ge_1(sum_q12: int) -> int:
    input_integer_bits, accum_integer_bits, output_integer_bits = 12, 6, 5
    log_2, sqrt_sqrt_half, sqrt_half, one_quarter = 1488522236, 1805811301, 1518500250, 536870912
    alpha_n, alpha_d, alpha_i, alpha_f = 117049297, 127690142, 1057819769, 638450708
    shifted_quarter = div_pow2(one_quarter, accum_integer_bits - 0)  # Rescale<6>(F0)
    z_a = sum_q12
    z_a_headroom_plus_1 = clz32(z_a)
    r_a_tmp = srmbpot_param(z_a, z_a_headroom_plus_1 - 1)
    r_a_raw = srmbpot_param(mul_sat(r_a_tmp, sqrt_half), 1)
    z_a_pow_2_adj = sat_add(srmbpot_param(input_integer_bits - z_a_headroom_plus_1, 31 - accum_integer_bits),
                            shifted_quarter)
    z_b = mul_sat(z_a, sqrt_half)
    z_b_headroom = clz32(z_b) - 1
    r_b_raw = srmbpot_param(z_a, z_b_headroom)
    z_b_pow_2_adj = max(Q31_MIN, min(Q31_MAX, srmbpot_param(input_integer_bits - z_b_headroom,
                                                            31 - accum_integer_bits) - shifted_quarter))
    r = min(r_a_raw, r_b_raw)
    z_pow_2_adj = max(z_a_pow_2_adj, z_b_pow_2_adj)
    p = rounding_half_sum(r, sqrt_sqrt_half)
    q = i32(r - sqrt_sqrt_half)
    q = i32(q + q)
    common_sq = mul_sat(q, q)
    num = i32(mul_sat(q, r) + mul_sat(mul_sat(q, common_sq), alpha_n))
    denom_minus_one_0 = i32(mul_sat(p, i32(i32(alpha_i + q) + mul_sat(alpha_d, common_sq))) + mul_sat(alpha_f, q))
    recip_denom = one_over1(denom_minus_one_0)
    num_scaled = div_pow2(num, accum_integer_bits)  # Rescale<6>(F0)
    total = i32(mul_sat(z_pow_2_adj, log_2) + mul_sat(num_scaled, recip_denom))
    return mul_pow2(total, accum_integer_bits - output_integer_bits)  # Rescale<5>(F6)


def mbqm(x: int, multiplier: int, shift: int) -> int:
    """TFLite MultiplyByQuantizedMultiplier (double rounding)."""
    left = shift if shift > 0 else 0
    right = -shift if shift < 0 else 0
    return div_pow2(mul_sat(i32(x * (1 << left)), multiplier), right)


def log_softmax_row(row: list[int], mult: int, shift: int, reverse_mult: int, reverse_shift: int,
                    diff_min: int) -> list[int]:
    """reference_integer_ops::LogSoftmax on one row; ``reverse_shift`` <= 0 is passed to
    MultiplyByQuantizedMultiplier as is (TFLite negates the stored right shift back)."""
    mx = -128
    for v in row:
        mx = max(mx, v)
    total = 0
    for v in row:
        diff = v - mx
        if diff >= diff_min:
            total = total + div_pow2(exp_on_neg(mbqm(diff, mult, shift)), 12)
    log_sum = log_x_ge_1(total)
    shifted = i32(log_sum + Q31_MIN)
    adjusted = max(diff_min - 1, mbqm(shifted, reverse_mult, reverse_shift))
    out = []
    for v in row:
        diff = v - mx
        if diff > adjusted:
            o = div_pow2(i32(mbqm(diff, mult, shift) - log_sum), 31 - 5 - 4) + 127
            out.append(max(min(o, 127), -128))
        else:
            out.append(-128)
    return out


def tflite_log_softmax_params(input_scale: float) -> tuple[int, int, int, int, int]:
    """PreprocessLogSoftmaxScalingExp (beta 1): (mult, left_shift, reverse_mult, reverse_shift <= 0, diff_min)."""
    mult, left_shift, diff_min = tflite_softmax_params(1.0, input_scale)
    real_reverse = (1 << (31 - left_shift)) / float(mult)
    assert 0.0 < real_reverse < 1.0
    rm, rs = tflite_quantize_multiplier(real_reverse)
    assert rs <= 0
    return mult, left_shift, rm, rs, diff_min
