/*
 * concat.c - Corten portable int8 concatenation, one call per input tensor (the shape of
 * arm_concatenation_s8_x, generalised to any storage axis by the caller's chunk sizes).
 */
#include <stddef.h>
#include <string.h>

#include "corten_kernels.h"

int corten_concat_s8(const int8_t *input, int32_t outer, int32_t inner, int32_t output_inner, int32_t offset,
                     int8_t *output)
{
    int32_t o;
    if (input == NULL || output == NULL || outer < 0 || inner < 0 || offset < 0 ||
        (int64_t)offset + inner > (int64_t)output_inner) {
        return CORTEN_ERROR_ARGUMENT;
    }
    for (o = 0; o < outer; o++) {
        memcpy(output + (size_t)o * (size_t)output_inner + (size_t)offset, input + (size_t)o * (size_t)inner,
               (size_t)inner);
    }
    return CORTEN_OK;
}
