/*
 * add.c - Corten portable elementwise add (arm_elementwise_add_s8 / arm_elementwise_add_s16
 * arithmetic), int8 and 16x8, each written once for both widths (corten_rescaled_add_one).
 *
 * corten_add_s8 / _s16: same-shape operands.  Each output element depends only on the input
 * elements at the same index, and is written after both are read, so the output may share its
 * bytes with either input (in-place add).  corten_add_broadcast_s8 / _s16: numpy broadcasting (see
 * corten/ops/add.py).
 */
#include <stddef.h>

#include "corten_internal.h"
#include "corten_kernels.h"

#define CORTEN_ADD(name, type, max_left_shift, offsets)                                                    \
    int name(const corten_add_params *params, const type *input1, const type *input2, type *output,       \
             int32_t size)                                                                                 \
    {                                                                                                      \
        int32_t i;                                                                                         \
        if (params == NULL || input1 == NULL || input2 == NULL || output == NULL || size < 0 ||            \
            params->left_shift < 0 || params->left_shift > (max_left_shift)) {                             \
            return CORTEN_ERROR_ARGUMENT;                                                                  \
        }                                                                                                  \
        {   /* a local copy: the stores through `type *` cannot change it, so it is read once */           \
            const corten_add_params p = *params;                                                           \
            for (i = 0; i < size; i++) {                                                                   \
                output[i] = (type)corten_rescaled_add_one(&p, p.input2_multiplier, input1[i], input2[i], offsets); \
            }                                                                                              \
        }                                                                                                  \
        return CORTEN_OK;                                                                                  \
    }

CORTEN_ADD(corten_add_s8, int8_t, CORTEN_ADD_MAX_LEFT_SHIFT_S8, CORTEN_S8_OFFSETS)
CORTEN_ADD(corten_add_s16, int16_t, CORTEN_ADD_MAX_LEFT_SHIFT_S16, CORTEN_S16_OFFSETS)

int corten_add_broadcast_s8(const corten_add_params *params, const corten_broadcast *shape, const int8_t *input1,
                            const int8_t *input2, int8_t *output)
{
    if (params == NULL) {
        return CORTEN_ERROR_ARGUMENT;
    }
    return corten_rescaled_add_broadcast(params, params->input2_multiplier, shape, input1, input2, output);
}

int corten_add_broadcast_s16(const corten_add_params *params, const corten_broadcast *shape, const int16_t *input1,
                             const int16_t *input2, int16_t *output)
{
    if (params == NULL) {
        return CORTEN_ERROR_ARGUMENT;
    }
    return corten_rescaled_add_broadcast_s16(params, params->input2_multiplier, shape, input1, input2, output);
}
