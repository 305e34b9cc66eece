/*
 * mul.c - Corten portable int8 elementwise multiply with broadcasting (arm_elementwise_mul_s8
 * arithmetic; see corten/ops/mul.py).
 *
 * The output is written in storage order; each input is read through its strides in
 * corten_broadcast (0 along a broadcast dimension), so [N, H, W, C] * [N, 1, 1, C] (a
 * squeeze-and-excitation gate) and same-shape operands take the same loop.
 */
#include <stddef.h>

#include "corten_internal.h"
#include "corten_kernels.h"

int corten_mul_s8(const corten_mul_params *params, const corten_broadcast *shape, const int8_t *input1,
                  const int8_t *input2, int8_t *output)
{
    int32_t n, h, w, c;
    if (params == NULL || shape == NULL || input1 == NULL || input2 == NULL || output == NULL ||
        !corten_broadcast_ok(shape)) {
        return CORTEN_ERROR_ARGUMENT;
    }
    for (n = 0; n < shape->output.n; n++) {
        for (h = 0; h < shape->output.h; h++) {
            for (w = 0; w < shape->output.w; w++) {
                const int8_t *a = input1 + n * shape->input1_strides.n + h * shape->input1_strides.h +
                                  w * shape->input1_strides.w;
                const int8_t *b = input2 + n * shape->input2_strides.n + h * shape->input2_strides.h +
                                  w * shape->input2_strides.w;
                for (c = 0; c < shape->output.c; c++) {
                    /* |x + offset| <= 255, so the product fits in int32 exactly. */
                    const int32_t x1 = (int32_t)a[c * shape->input1_strides.c] + params->input1_offset;
                    const int32_t x2 = (int32_t)b[c * shape->input2_strides.c] + params->input2_offset;
                    const int32_t y = corten_requantize(x1 * x2, params->output_multiplier, params->output_shift);
                    *output++ = corten_offset_clamp(y, params->output_offset, params->activation_min,
                                                    params->activation_max);
                }
            }
        }
    }
    return CORTEN_OK;
}

/* 16x8 (arm_elementwise_mul_s16 arithmetic): offsets are 0 and |x1 * x2| <= 2^30 fits in int32. */
int corten_elementwise_mul_s16(const corten_mul_params *params, const corten_broadcast *shape,
                               const int16_t *input1, const int16_t *input2, int16_t *output)
{
    int32_t n, h, w, c;
    if (params == NULL || shape == NULL || input1 == NULL || input2 == NULL || output == NULL ||
        !corten_broadcast_ok(shape)) {
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
                    const int32_t x1 = a[c * shape->input1_strides.c];
                    const int32_t x2 = b[c * shape->input2_strides.c];
                    int32_t y = corten_requantize(x1 * x2, params->output_multiplier, params->output_shift);
                    y = y < params->activation_min ? params->activation_min : y;
                    y = y > params->activation_max ? params->activation_max : y;
                    *output++ = (int16_t)y;
                }
            }
        }
    }
    return CORTEN_OK;
}
