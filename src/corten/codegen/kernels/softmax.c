/*
 * softmax.c - Corten portable int8 softmax over rows (arm_softmax_s8 arithmetic).
 *
 * Per row: differences to the row maximum are rescaled to Q5.26 (input_mult, input_shift), their
 * exponentials (Q0.31) summed in Q12.19, the sum inverted by Newton-Raphson and each output
 * written as round(exp / sum * 256) - 128 in [-128, 127]; differences below diff_min give -128.
 * Mirrors corten/ops/softmax.py bit for bit, in well-defined C99 (wrap-around on uint32).
 *
 * Where arm_softmax_s8 shifts an int32 by 32 or more (rows whose sum of exponentials reaches
 * 2**28, i.e. at least 512 elements near the maximum: undefined behaviour in C), this kernel
 * rounds exactly: the quotient is 0 and the output -128.
 *
 * corten_softmax_s16: TFLite's 16x8 SoftmaxInt16 (arm_softmax_s16 arithmetic with TFLite's
 * saturation where arm_softmax_s16 wraps): exp and 1/(1+x) from 513-entry interpolated tables.
 */
#include <stddef.h>

#include "corten_internal.h"
#include "corten_kernels.h"

#define CORTEN_SOFTMAX_ACCUM_BITS 12
#define CORTEN_SOFTMAX_MAX_ROW 4095 /* 4096 * 2**19 overflows the int32 sum */

/* arm_nn_doubling_high_mult: round(a * b / 2**31), ties towards +inf, INT32_MIN**2 saturating. */
static int32_t corten_softmax_mul_sat(int32_t a, int32_t b)
{
    int64_t p;
    if (a == INT32_MIN && b == INT32_MIN) {
        return INT32_MAX;
    }
    p = (int64_t)a * (int64_t)b + (((a < 0) != (b < 0)) ? (1 - ((int64_t)1 << 30)) : ((int64_t)1 << 30));
    return (int32_t)(p / ((int64_t)1 << 31)); /* |quotient| <= 2**31 - 1 here */
}

/* arm_nn_mult_by_power_of_two: val * 2**exponent, saturated to int32. */
static int32_t corten_softmax_mul_pow2(int32_t val, int32_t exponent)
{
    const int32_t thresh = (int32_t)((((uint32_t)1) << (31 - exponent)) - 1u);
    if (val > thresh) {
        return INT32_MAX;
    }
    if (val < -thresh) {
        return INT32_MIN;
    }
    return corten_u32_to_i32((uint32_t)val << exponent);
}

/* arm_nn_exp_on_negative_values: exp(val) for a Q5.26 val <= 0, as Q0.31. */
static int32_t corten_softmax_exp_on_negative(int32_t val)
{
    static const int32_t barrel[7] = {1672461947, 1302514674, 790015084, 290630308, 39332535, 720401, 242};
    const int32_t val_mod_minus_quarter = (int32_t)((uint32_t)val & 0xFFFFFFu) - (1 << 24);
    const uint32_t remainder = (uint32_t)val_mod_minus_quarter - (uint32_t)val;
    const int32_t x = val_mod_minus_quarter * 32 + (1 << 28); /* in [-2**28, 2**28) */
    const int32_t x2 = corten_softmax_mul_sat(x, x);
    int32_t poly = corten_add_wrap(corten_divide_by_power_of_two(corten_softmax_mul_sat(x2, x2), 2),
                                   corten_softmax_mul_sat(x2, x));
    int32_t result;
    int32_t k;
    poly = corten_add_wrap(corten_softmax_mul_sat(poly, 715827883), x2);
    poly = corten_add_wrap(x, corten_divide_by_power_of_two(poly, 1));
    result = corten_add_wrap(1895147668, corten_softmax_mul_sat(1895147668, poly));
    for (k = 0; k < 7; k++) {
        if (remainder & (((uint32_t)1) << (24 + k))) {
            result = corten_softmax_mul_sat(result, barrel[k]);
        }
    }
    return val == 0 ? INT32_MAX : result;
}

/* arm_nn_one_over_one_plus_x_for_x_in_0_1: 1 / (1 + x) for a Q0.31 x, as Q1.30 (Newton-Raphson). */
static int32_t corten_softmax_one_over_one_plus_x(int32_t val)
{
    const int64_t sum = (int64_t)val + INT32_MAX;
    const int32_t half_denominator = corten_wrap_i32((sum + (sum >= 0 ? 1 : -1)) / 2);
    int32_t x = corten_add_wrap(1515870810, corten_softmax_mul_sat(half_denominator, -1010580540));
    int32_t i;
    for (i = 0; i < 3; i++) {
        const int32_t err = corten_u32_to_i32((uint32_t)(1 << 29) -
                                              (uint32_t)corten_softmax_mul_sat(half_denominator, x));
        x = corten_add_wrap(x, corten_softmax_mul_pow2(corten_softmax_mul_sat(x, err), 2));
    }
    return corten_softmax_mul_pow2(x, 1);
}

static int32_t corten_softmax_clz(uint32_t v)
{
    int32_t n = 0;
    while (n < 32 && !(v & 0x80000000u)) {
        v <<= 1;
        n++;
    }
    return n;
}

/* exp of (diff * 2**shift) rescaled by mult; diff * 2**shift fits int32 when diff >= diff_min. */
static int32_t corten_softmax_exp(int32_t diff, int32_t mult, int32_t shift)
{
    const int32_t scaled = (int32_t)((int64_t)diff * ((int64_t)1 << shift));
    return corten_softmax_exp_on_negative(corten_softmax_mul_sat(scaled, mult));
}

static int corten_softmax_bad_args(const int8_t *input, const int8_t *output, int32_t outer, int32_t row_size,
                                   int32_t inner, int32_t shift, int32_t diff_min)
{
    return input == NULL || output == NULL || outer < 0 || inner < 1 || row_size < 1 ||
           row_size > CORTEN_SOFTMAX_MAX_ROW || shift < 0 || shift > 31 || diff_min > 0 ||
           (int64_t)diff_min * ((int64_t)1 << shift) < INT32_MIN;
}

static int32_t corten_softmax_row_max(const int8_t *in, int32_t row_size, int32_t stride)
{
    int32_t max = in[0];
    int32_t c;
    for (c = 1; c < row_size; c++) {
        if (in[(ptrdiff_t)c * stride] > max) {
            max = in[(ptrdiff_t)c * stride];
        }
    }
    return max;
}

/* One row of row_size elements stride bytes apart. */
static void corten_softmax_row(const int8_t *in, int8_t *out, int32_t row_size, int32_t stride, int32_t mult,
                               int32_t shift, int32_t diff_min)
{
    const int32_t max = corten_softmax_row_max(in, row_size, stride);
    int32_t sum = 0;
    int32_t headroom, bits_over_unit, scale, c;
    for (c = 0; c < row_size; c++) {
        const int32_t diff = in[(ptrdiff_t)c * stride] - max;
        if (diff >= diff_min) {
            sum += corten_divide_by_power_of_two(corten_softmax_exp(diff, mult, shift), CORTEN_SOFTMAX_ACCUM_BITS);
        }
    }
    /* sum >= 2**19 (the maximum's own term) and < 2**31 (row_size <= 4095). */
    headroom = corten_softmax_clz((uint32_t)sum);
    bits_over_unit = CORTEN_SOFTMAX_ACCUM_BITS - headroom + 23;
    scale = corten_softmax_one_over_one_plus_x(corten_u32_to_i32(((uint32_t)sum << headroom) - 0x80000000u));
    for (c = 0; c < row_size; c++) {
        const int32_t diff = in[(ptrdiff_t)c * stride] - max;
        int32_t res = -128;
        if (diff >= diff_min) {
            const int32_t prod = corten_softmax_mul_sat(scale, corten_softmax_exp(diff, mult, shift));
            res = (bits_over_unit > 31 ? 0 : corten_divide_by_power_of_two(prod, bits_over_unit)) - 128;
            res = res > 127 ? 127 : res;
        }
        out[(ptrdiff_t)c * stride] = (int8_t)res;
    }
}

int corten_softmax_strided_s8(const int8_t *input, int32_t outer, int32_t row_size, int32_t inner, int32_t mult,
                              int32_t shift, int32_t diff_min, int8_t *output)
{
    int32_t o, j;
    if (corten_softmax_bad_args(input, output, outer, row_size, inner, shift, diff_min)) {
        return CORTEN_ERROR_ARGUMENT;
    }
    for (o = 0; o < outer; o++) {
        for (j = 0; j < inner; j++) {
            const size_t base = ((size_t)o * (size_t)row_size) * (size_t)inner + (size_t)j;
            corten_softmax_row(input + base, output + base, row_size, inner, mult, shift, diff_min);
        }
    }
    return CORTEN_OK;
}

int corten_softmax_s8(const int8_t *input, int32_t num_rows, int32_t row_size, int32_t mult, int32_t shift,
                      int32_t diff_min, int8_t *output)
{
    return corten_softmax_strided_s8(input, num_rows, row_size, 1, mult, shift, diff_min, output);
}

/* ------------------------------------------------------------------------------- log-softmax
 * TFLite reference_integer_ops::LogSoftmax, with gemmlowp's log_x_for_x_greater_than_or_equal_to_1
 * (input Q12.19, output Q5.26).  See corten/ops/softmax.py. */

/* SaturatingRoundingMultiplyByPOTParam for exponent >= 0: x * 2**exponent saturated. */
static int32_t corten_log_sat_shl(int32_t x, int32_t exponent)
{
    return exponent == 0 ? x : corten_softmax_mul_pow2(x, exponent);
}

static int32_t corten_log_sat_add(int32_t a, int32_t b)
{
    const int64_t s = (int64_t)a + b;
    return s > INT32_MAX ? INT32_MAX : (s < INT32_MIN ? INT32_MIN : (int32_t)s);
}

static int32_t corten_log_x_ge_1(int32_t z_a)
{
    const int32_t shifted_quarter = corten_divide_by_power_of_two(536870912, 6);
    const int32_t z_a_headroom_plus_1 = corten_softmax_clz((uint32_t)z_a);
    const int32_t r_a_tmp = corten_log_sat_shl(z_a, z_a_headroom_plus_1 - 1);
    const int32_t r_a_raw = corten_log_sat_shl(corten_softmax_mul_sat(r_a_tmp, 1518500250), 1);
    const int32_t z_a_pow_2_adj = corten_log_sat_add(corten_log_sat_shl(12 - z_a_headroom_plus_1, 25), shifted_quarter);
    const int32_t z_b = corten_softmax_mul_sat(z_a, 1518500250);
    const int32_t z_b_headroom = corten_softmax_clz((uint32_t)z_b) - 1;
    const int32_t r_b_raw = corten_log_sat_shl(z_a, z_b_headroom);
    const int32_t z_b_pow_2_adj = corten_log_sat_add(corten_log_sat_shl(12 - z_b_headroom, 25), -shifted_quarter);
    const int32_t r = r_a_raw < r_b_raw ? r_a_raw : r_b_raw;
    const int32_t z_pow_2_adj = z_a_pow_2_adj > z_b_pow_2_adj ? z_a_pow_2_adj : z_b_pow_2_adj;
    const int64_t half_sum = (int64_t)r + 1805811301;
    const int32_t p = (int32_t)((half_sum + (half_sum >= 0 ? 1 : -1)) / 2);
    int32_t q = corten_u32_to_i32((uint32_t)r - 1805811301u);
    int32_t common_sq, num, inner, denom_minus_one, recip_denom, acc;
    q = corten_add_wrap(q, q);
    common_sq = corten_softmax_mul_sat(q, q);
    num = corten_add_wrap(corten_softmax_mul_sat(q, r),
                          corten_softmax_mul_sat(corten_softmax_mul_sat(q, common_sq), 117049297));
    inner = corten_add_wrap(corten_add_wrap(1057819769, q), corten_softmax_mul_sat(127690142, common_sq));
    denom_minus_one = corten_add_wrap(corten_softmax_mul_sat(p, inner), corten_softmax_mul_sat(638450708, q));
    recip_denom = corten_softmax_one_over_one_plus_x(denom_minus_one);
    acc = corten_add_wrap(corten_softmax_mul_sat(z_pow_2_adj, 1488522236),
                          corten_softmax_mul_sat(corten_divide_by_power_of_two(num, 6), recip_denom));
    return corten_softmax_mul_pow2(acc, 1);
}

/* MultiplyByQuantizedMultiplier with shift <= 0 (a right shift). */
static int32_t corten_log_mbqm_right(int32_t x, int32_t multiplier, int32_t shift)
{
    return corten_divide_by_power_of_two(corten_softmax_mul_sat(x, multiplier), -shift);
}

static void corten_log_softmax_row(const int8_t *in, int8_t *out, int32_t row_size, int32_t stride, int32_t mult,
                                   int32_t shift, int32_t reverse_mult, int32_t reverse_shift, int32_t diff_min)
{
    const int32_t max = corten_softmax_row_max(in, row_size, stride);
    int32_t sum = 0;
    int32_t log_sum, adjusted_diff_min, c;
    for (c = 0; c < row_size; c++) {
        const int32_t diff = in[(ptrdiff_t)c * stride] - max;
        if (diff >= diff_min) {
            sum += corten_divide_by_power_of_two(corten_softmax_exp(diff, mult, shift), CORTEN_SOFTMAX_ACCUM_BITS);
        }
    }
    log_sum = corten_log_x_ge_1(sum);
    adjusted_diff_min = corten_log_mbqm_right(corten_u32_to_i32((uint32_t)log_sum + 0x80000000u), reverse_mult,
                                              reverse_shift);
    if (adjusted_diff_min < diff_min - 1) {
        adjusted_diff_min = diff_min - 1;
    }
    for (c = 0; c < row_size; c++) {
        const int32_t diff = in[(ptrdiff_t)c * stride] - max;
        int32_t res = -128;
        if (diff > adjusted_diff_min) {
            const int32_t scaled = (int32_t)((int64_t)diff * ((int64_t)1 << shift));
            const int32_t diff_q5 = corten_softmax_mul_sat(scaled, mult);
            res = corten_divide_by_power_of_two(corten_u32_to_i32((uint32_t)diff_q5 - (uint32_t)log_sum), 22) + 127;
            res = res > 127 ? 127 : (res < -128 ? -128 : res);
        }
        out[(ptrdiff_t)c * stride] = (int8_t)res;
    }
}

int corten_log_softmax_s8(const int8_t *input, int32_t outer, int32_t row_size, int32_t inner, int32_t mult,
                          int32_t shift, int32_t reverse_mult, int32_t reverse_shift, int32_t diff_min,
                          int8_t *output)
{
    int32_t o, j;
    if (corten_softmax_bad_args(input, output, outer, row_size, inner, shift, diff_min) || reverse_shift > 0 ||
        reverse_shift < -31) {
        return CORTEN_ERROR_ARGUMENT;
    }
    for (o = 0; o < outer; o++) {
        for (j = 0; j < inner; j++) {
            const size_t base = ((size_t)o * (size_t)row_size) * (size_t)inner + (size_t)j;
            corten_log_softmax_row(input + base, output + base, row_size, inner, mult, shift, reverse_mult,
                                   reverse_shift, diff_min);
        }
    }
    return CORTEN_OK;
}

/* ----------------------------------------------------------------------------- 16x8 softmax */
static void corten_softmax_row_s16(const int16_t *in, int16_t *out, int32_t row_size, int32_t stride, int32_t mult,
                                   int32_t shift, const int16_t *exp_lut, const int16_t *one_by_one_lut)
{
    int32_t i;
    int32_t max = in[0];
    int32_t sum = 0;
    int32_t headroom, shifted, sym, recip;
    for (i = 1; i < row_size; i++) {
        max = in[i * stride] > max ? in[i * stride] : max;
    }
    for (i = 0; i < row_size; i++) {
        /* (x - max) * 2**shift fits int32: differences >= -65535, shift <= 15 */
        int32_t d = corten_requantize((int32_t)in[i * stride] - max, mult, shift) + 32767;
        d = d < -32768 ? -32768 : (d > 32767 ? 32767 : d);
        out[i * stride] = corten_lut16_lookup(d, exp_lut); /* the output holds the exponentials */
        sum += out[i * stride]; /* <= 65535 * 32767 */
    }
    headroom = corten_softmax_clz((uint32_t)sum);
    shifted = (int32_t)((((int64_t)sum << (headroom - 1)) + (1 << 13)) >> 14);
    sym = shifted - 98304;
    sym = sym > 32767 ? 32767 : sym; /* TFLite saturates; shifted >= 65536 */
    recip = corten_lut16_lookup(sym, one_by_one_lut);
    for (i = 0; i < row_size; i++) {
        int32_t v = (((int32_t)out[i * stride] * recip) >> (30 - headroom)) + 1; /* product >= 0, < 2**30 */
        v >>= 1;
        out[i * stride] = (int16_t)(v > 32767 ? 32767 : v);
    }
}

int corten_softmax_s16(const int16_t *input, int32_t outer, int32_t row_size, int32_t inner, int32_t mult,
                       int32_t shift, const int16_t *exp_lut, const int16_t *one_by_one_lut, int16_t *output)
{
    int32_t o, j;
    if (input == NULL || output == NULL || exp_lut == NULL || one_by_one_lut == NULL || outer < 0 || inner < 1 ||
        row_size < 1 || row_size > 65535 || mult < 0 || shift < -31 || shift > 15) {
        return CORTEN_ERROR_ARGUMENT;
    }
    for (o = 0; o < outer; o++) {
        for (j = 0; j < inner; j++) {
            const int32_t base = o * row_size * inner + j;
            corten_softmax_row_s16(input + base, output + base, row_size, inner, mult, shift, exp_lut, one_by_one_lut);
        }
    }
    return CORTEN_OK;
}
