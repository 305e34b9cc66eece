/*
 * lut.c - Corten portable int8 table lookup: any elementwise int8 -> int8 function
 * (hardswish, sigmoid, tanh, gelu, a standalone relu/clamp, ...) as a 256-entry table.
 *
 * output[i] = table[input[i] + 128]: entry k of the table is the output for the input value
 * k - 128.  The compiler computes the table ahead of time from the float function and the
 * input/output quantization (see corten/ops/lut.py), so this kernel does no arithmetic and is
 * bit-exact with the reference by construction.  CMSIS-NN has no generic s8 lookup kernel: the
 * "cmsis-nn" flavour of a model runs this one too.
 *
 * corten_lut_s16: the int16 (16x8) variant, TFLite's lut_lookup_with_interpolation on a 513-entry
 * int16 table over the whole int16 input range (corten/ops/_lut16.py).
 *
 * corten_activation_s16: TFLite's int16 Logistic / Tanh (reference_integer_ops) with a general input
 * multiplier; CMSIS-NN's arm_nn_activation_s16 computes the same for multipliers 3 * 2**j.
 */
#include <stddef.h>

#include "corten_internal.h"
#include "corten_kernels.h"

int corten_lut_s8(const int8_t *input, const int8_t *table, int8_t *output, int32_t size)
{
    int32_t i;
    if (input == NULL || table == NULL || output == NULL || size < 0) {
        return CORTEN_ERROR_ARGUMENT;
    }
    /* Each output byte reads only the input byte at its index, so output may be input. */
    for (i = 0; i < size; i++) {
        output[i] = table[(int32_t)input[i] + 128];
    }
    return CORTEN_OK;
}

int corten_lut_s16(const int16_t *input, const int16_t *table, int16_t *output, int32_t size)
{
    int32_t i;
    if (input == NULL || table == NULL || output == NULL || size < 0) {
        return CORTEN_ERROR_ARGUMENT;
    }
    /* Elementwise (output may be input). */
    for (i = 0; i < size; i++) {
        output[i] = corten_lut16_lookup(input[i], table);
    }
    return CORTEN_OK;
}

int corten_activation_s16(const int16_t *input, const uint16_t *table, int32_t multiplier, int32_t shift,
                          int32_t function, int16_t *output, int32_t size)
{
    int32_t i;
    const int32_t frac_bits = function == 1 ? 8 : 9; /* tanh(x) = 2 * sigmoid(2x) - 1 */
    int32_t rounding;
    if (input == NULL || table == NULL || output == NULL || size < 0 || multiplier < 1 || multiplier > 65535 ||
        shift < 0 || shift > 31 || function < 0 || function > 1) {
        return CORTEN_ERROR_ARGUMENT;
    }
    rounding = shift > 0 ? (int32_t)(1UL << (shift - 1)) : 0;
    if (32768 * (int64_t)multiplier + rounding > INT32_MAX) {
        return CORTEN_ERROR_ARGUMENT; /* q * multiplier + rounding must fit int32 */
    }
    for (i = 0; i < size; i++) {
        /* |input * multiplier| + rounding < 2**31 (checked above) */
        const int32_t x = corten_asr32((int32_t)input[i] * multiplier + rounding, shift);
        const uint32_t a = (uint32_t)(x >= 0 ? x : -x);
        const uint32_t uh = a >> frac_bits;
        uint32_t r;
        if (uh >= 255u) {
            r = function == 1 ? 0xFFFFu << 8 : 0x7FFFu << 10;
        } else {
            const uint32_t ua = table[uh];
            const uint32_t ub = table[uh + 1];
            r = (ua << frac_bits) + (a & ((1u << frac_bits) - 1u)) * (ub - ua);
        }
        if (function == 1) {
            /* x >= 0: r >= 2**23 (table[0] = 32768); x < 0: a negative result, shifted as a floor division */
            const int32_t v = x >= 0 ? (int32_t)(r - (1u << 23)) + (1 << 7) : (1 << 23) + (1 << 7) - 1 - (int32_t)r;
            output[i] = (int16_t)corten_asr32(v, 8);
        } else {
            const uint32_t v = x >= 0 ? r + (1u << 9) : (1u << 25) - r + (1u << 9) - 1u;
            output[i] = (int16_t)(v >> 10);
        }
    }
    return CORTEN_OK;
}
