/*
 * layer_norm.c - Corten portable int8 layer norm, exact integer arithmetic (see corten/ops/layer_norm.py).
 *
 * Per row of n values (stride `inner` bytes apart): S = sum x, Q = sum x^2, V = (n*Q - S^2) * 2^20 + eps_q
 * (int64), r = isqrt(V * 4^e) with V * 4^e in [2^60, 2^62), z = round(d * 2^(26+e) / r) for
 * d = n*x - S, then requantize(z, multiplier[i], shift[i]) + bias[i], a rounding shift by 8, the
 * output offset and the clamp.
 */
#include <stddef.h>

#include "corten_kernels.h"

#define CORTEN_LN_Z_BITS 16
#define CORTEN_LN_OUT_BITS 8
#define CORTEN_LN_V_BITS 20
#define CORTEN_LN_MAX_ROW 4095

/* floor(sqrt(v)) for v < 2^62. */
static uint32_t corten_isqrt64(uint64_t v)
{
    uint64_t res = 0u;
    uint64_t bit = (uint64_t)1 << 62;
    while (bit > v) {
        bit >>= 2;
    }
    while (bit != 0u) {
        if (v >= res + bit) {
            v -= res + bit;
            res = (res >> 1) + bit;
        } else {
            res >>= 1;
        }
        bit >>= 2;
    }
    return (uint32_t)res;
}

static int32_t corten_bit_length64(uint64_t v)
{
    int32_t n = 0;
    while (v != 0u) {
        v >>= 1;
        n++;
    }
    return n;
}

int corten_layer_norm_s8(const corten_layer_norm_params *params, int32_t outer, int32_t row_size, int32_t inner,
                         const int32_t *multiplier, const int32_t *shift, const int32_t *bias, const int8_t *input,
                         int8_t *output)
{
    int32_t o, j, i;
    if (params == NULL || multiplier == NULL || shift == NULL || bias == NULL || input == NULL || output == NULL ||
        outer < 0 || inner < 1 || row_size < 1 || row_size > CORTEN_LN_MAX_ROW || params->eps_q < 0 ||
        params->eps_q > ((int64_t)1 << 61) || params->activation_min > params->activation_max) {
        return CORTEN_ERROR_ARGUMENT;
    }
    for (o = 0; o < outer; o++) {
        for (j = 0; j < inner; j++) {
            const size_t base = ((size_t)o * (size_t)row_size) * (size_t)inner + (size_t)j;
            const int8_t *in = input + base;
            int8_t *out = output + base;
            int32_t s = 0, q = 0, e = 0;
            int64_t v;
            uint64_t r = 0u;
            for (i = 0; i < row_size; i++) {
                const int32_t x = in[(ptrdiff_t)i * inner];
                s += x;
                q += x * x;
            }
            v = ((int64_t)row_size * q - (int64_t)s * s) * ((int64_t)1 << CORTEN_LN_V_BITS) + params->eps_q;
            if (v > 0) {
                e = (62 - corten_bit_length64((uint64_t)v)) / 2;
                r = corten_isqrt64((uint64_t)v << (2 * e));
            }
            for (i = 0; i < row_size; i++) {
                const int32_t d = row_size * in[(ptrdiff_t)i * inner] - s;
                int32_t z = 0;
                int32_t acc;
                if (r != 0u) {
                    const int64_t num = (int64_t)d * ((int64_t)1 << (CORTEN_LN_Z_BITS + CORTEN_LN_V_BITS / 2 + e));
                    const uint64_t mag = (2u * (uint64_t)(num < 0 ? -num : num) + r) / (2u * r);
                    z = num < 0 ? -(int32_t)mag : (int32_t)mag;
                }
                acc = corten_add_wrap(corten_requantize(z, multiplier[i], shift[i]), bias[i]);
                out[(ptrdiff_t)i * inner] = corten_offset_clamp(corten_divide_by_power_of_two(acc, CORTEN_LN_OUT_BITS),
                                                             params->output_offset, params->activation_min,
                                                             params->activation_max);
            }
        }
    }
    return CORTEN_OK;
}
