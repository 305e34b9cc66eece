/*
 * quantize.c - Corten portable requantize between an int8 and an int16 region (TFLite's Requantize,
 * corten/ops/quantize.py quantized_requantize): out = clamp(output_offset + arm_nn_requantize(q +
 * input_offset, multiplier, shift)).  CMSIS-NN has no such kernel: both flavours call this one.
 */
#include <stddef.h>

#include "corten_internal.h"
#include "corten_kernels.h"

int corten_requantize_s8_s16(const int8_t *input8, const int16_t *input16, int32_t input_offset,
                             int32_t output_offset, int32_t multiplier, int32_t shift, int8_t *output8,
                             int16_t *output16, int32_t size)
{
    int32_t i;
    if ((input8 == NULL) == (input16 == NULL) || (output8 == NULL) == (output16 == NULL) || size < 0) {
        return CORTEN_ERROR_ARGUMENT;
    }
    for (i = 0; i < size; i++) {
        const int32_t q = input8 != NULL ? (int32_t)input8[i] : (int32_t)input16[i];
        const int32_t v = corten_add_wrap(corten_requantize(q + input_offset, multiplier, shift), output_offset);
        if (output8 != NULL) {
            output8[i] = (int8_t)(v < -128 ? -128 : (v > 127 ? 127 : v));
        } else {
            output16[i] = (int16_t)(v < -32768 ? -32768 : (v > 32767 ? 32767 : v));
        }
    }
    return CORTEN_OK;
}
