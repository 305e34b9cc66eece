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
