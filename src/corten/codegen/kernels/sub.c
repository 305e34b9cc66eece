/*
 * sub.c - Corten portable int8 elementwise subtract with broadcasting (see corten/ops/sub.py).
 *
 * TFLite's int8 SUB: the arm_elementwise_add_s8 arithmetic with input2's multiplier negated.
 * The output is written in storage order; each input is read through its strides in
 * corten_broadcast (0 along a broadcast dimension).
 */
#include <stddef.h>

#include "corten_internal.h"
#include "corten_kernels.h"

static int sub_shape_ok(const corten_broadcast *s)
{
    const corten_dims *d = &s->output;
    const corten_dims *a = &s->input1_strides;
    const corten_dims *b = &s->input2_strides;
    return d->n >= 0 && d->h >= 0 && d->w >= 0 && d->c >= 0 && a->n >= 0 && a->h >= 0 && a->w >= 0 && a->c >= 0 &&
           b->n >= 0 && b->h >= 0 && b->w >= 0 && b->c >= 0;
}

int corten_sub_s8(const corten_sub_params *params, const corten_broadcast *shape, const int8_t *input1,
                  const int8_t *input2, int8_t *output)
{
    int32_t n, h, w, c, neg_mult2;
    if (params == NULL || shape == NULL || input1 == NULL || input2 == NULL || output == NULL ||
        !sub_shape_ok(shape) || params->left_shift < 0 || params->left_shift > 22 || params->input2_multiplier < 0) {
        return CORTEN_ERROR_ARGUMENT;
    }
    neg_mult2 = -params->input2_multiplier; /* multiplier in [0, 2**31 - 1]: negation cannot overflow */
    for (n = 0; n < shape->output.n; n++) {
        for (h = 0; h < shape->output.h; h++) {
            for (w = 0; w < shape->output.w; w++) {
                const int8_t *a = input1 + n * shape->input1_strides.n + h * shape->input1_strides.h +
                                  w * shape->input1_strides.w;
                const int8_t *b = input2 + n * shape->input2_strides.n + h * shape->input2_strides.h +
                                  w * shape->input2_strides.w;
                for (c = 0; c < shape->output.c; c++) {
                    /* (x + offset) is in [-255, 255] and left_shift <= 22: the shifted value fits in int32. */
                    const int32_t x1 = ((int32_t)a[c * shape->input1_strides.c] + params->input1_offset) *
                                       (1 << params->left_shift);
                    const int32_t x2 = ((int32_t)b[c * shape->input2_strides.c] + params->input2_offset) *
                                       (1 << params->left_shift);
                    const int32_t p = corten_requantize(x1, params->input1_multiplier, params->input1_shift);
                    const int32_t q = corten_requantize(x2, neg_mult2, params->input2_shift);
                    const int32_t y = corten_requantize(corten_add_wrap(p, q), params->output_multiplier,
                                                        params->output_shift);
                    *output++ = corten_offset_clamp(y, params->output_offset, params->activation_min,
                                                    params->activation_max);
                }
            }
        }
    }
    return CORTEN_OK;
}
