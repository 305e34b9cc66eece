/*
 * lut.c - Corten portable int8 table lookup: any elementwise int8 -> int8 function
 * (hardswish, sigmoid, tanh, gelu, a standalone relu/clamp, ...) as a 256-entry table.
 *
 * output[i] = table[input[i] + 128]: entry k of the table is the output for the input value
 * k - 128.  The compiler computes the table ahead of time from the float function and the
 * input/output quantization (see corten/ops/lut.py), so this kernel does no arithmetic and is
 * bit-exact with the reference by construction.  CMSIS-NN has no generic s8 lookup kernel: the
 * "cmsis-nn" flavour of a model runs this one too.
 */
#include <stddef.h>

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
