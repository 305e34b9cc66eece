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

int corten_sub_s8(const corten_sub_params *params, const corten_broadcast *shape, const int8_t *input1,
                  const int8_t *input2, int8_t *output)
{
    if (params == NULL || params->input2_multiplier < 0) {
        return CORTEN_ERROR_ARGUMENT;
    }
    /* multiplier in [0, 2**31 - 1]: the negation cannot overflow */
    return corten_rescaled_add_broadcast(params, -params->input2_multiplier, shape, input1, input2, output);
}
