/*
 * add.c - Corten portable int8 elementwise add (arm_elementwise_add_s8 arithmetic).
 *
 * corten_add_s8: same-shape operands.  Each output element depends only on the input elements at
 * the same index, and is written after both are read, so the output may share its bytes with
 * either input (in-place add).  corten_add_broadcast_s8: numpy broadcasting (see corten/ops/add.py).
 */
#include <stddef.h>

#include "corten_internal.h"
#include "corten_kernels.h"

int corten_add_s8(const corten_add_params *params, const int8_t *input1, const int8_t *input2,
                  int8_t *output, int32_t size)
{
    int32_t i;
    if (params == NULL || input1 == NULL || input2 == NULL || output == NULL || size < 0 || params->left_shift < 0 ||
        params->left_shift > 22) {
        return CORTEN_ERROR_ARGUMENT;
    }
    for (i = 0; i < size; i++) {
        /* (x + offset) is in [-255, 255] and left_shift <= 22, so the shifted value fits in int32. */
        const int32_t x1 = ((int32_t)input1[i] + params->input1_offset) * (1 << params->left_shift);
        const int32_t x2 = ((int32_t)input2[i] + params->input2_offset) * (1 << params->left_shift);
        const int32_t a = corten_requantize(x1, params->input1_multiplier, params->input1_shift);
        const int32_t b = corten_requantize(x2, params->input2_multiplier, params->input2_shift);
        const int32_t sum = corten_requantize(corten_add_wrap(a, b), params->output_multiplier, params->output_shift);
        output[i] = corten_offset_clamp(sum, params->output_offset, params->activation_min, params->activation_max);
    }
    return CORTEN_OK;
}

int corten_add_broadcast_s8(const corten_add_params *params, const corten_broadcast *shape, const int8_t *input1,
                            const int8_t *input2, int8_t *output)
{
    if (params == NULL) {
        return CORTEN_ERROR_ARGUMENT;
    }
    return corten_rescaled_add_broadcast(params, params->input2_multiplier, shape, input1, input2, output);
}

/* 16x8 (arm_elementwise_add_s16 arithmetic): offsets are 0 and left_shift <= 15, so x << left_shift
 * fits in int32 for every int16 x. */
static inline int16_t corten_add_one_s16(const corten_add_params *params, int32_t x1, int32_t x2)
{
    const int32_t a = corten_requantize(x1 * (1 << params->left_shift), params->input1_multiplier, params->input1_shift);
    const int32_t b = corten_requantize(x2 * (1 << params->left_shift), params->input2_multiplier, params->input2_shift);
    int32_t sum = corten_requantize(corten_add_wrap(a, b), params->output_multiplier, params->output_shift);
    sum = sum < params->activation_min ? params->activation_min : sum;
    sum = sum > params->activation_max ? params->activation_max : sum;
    return (int16_t)sum;
}

int corten_add_s16(const corten_add_params *params, const int16_t *input1, const int16_t *input2,
                   int16_t *output, int32_t size)
{
    int32_t i;
    if (params == NULL || input1 == NULL || input2 == NULL || output == NULL || size < 0 || params->left_shift < 0 ||
        params->left_shift > 15) {
        return CORTEN_ERROR_ARGUMENT;
    }
    for (i = 0; i < size; i++) {
        output[i] = corten_add_one_s16(params, input1[i], input2[i]);
    }
    return CORTEN_OK;
}

int corten_add_broadcast_s16(const corten_add_params *params, const corten_broadcast *shape, const int16_t *input1,
                             const int16_t *input2, int16_t *output)
{
    int32_t n, h, w, c;
    if (params == NULL || shape == NULL || input1 == NULL || input2 == NULL || output == NULL ||
        !corten_broadcast_ok(shape) || params->left_shift < 0 || params->left_shift > 15) {
        return CORTEN_ERROR_ARGUMENT;
    }
    for (n = 0; n < shape->output.n; n++) {
        for (h = 0; h < shape->output.h; h++) {
            for (w = 0; w < shape->output.w; w++) {
                const int16_t *a = input1 + n * shape->input1_strides.n + h * shape->input1_strides.h +
                                   w * shape->input1_strides.w;
                const int16_t *b = input2 + n * shape->input2_strides.n + h * shape->input2_strides.h +
                                   w * shape->input2_strides.w;
                for (c = 0; c < shape->output.c; c++) {
                    *output++ = corten_add_one_s16(params, a[c * shape->input1_strides.c], b[c * shape->input2_strides.c]);
                }
            }
        }
    }
    return CORTEN_OK;
}
