/*
 * minmax.c - Corten portable int8 elementwise maximum / minimum with broadcasting
 * (arm_maximum_s8 / arm_minimum_s8 semantics; see corten/ops/minmax.py).
 *
 * Both inputs and the output share one quantization (TFLite MAXIMUM/MINIMUM), so the op compares
 * the int8 values directly.  The output is written in storage order; each input is read through
 * its strides in corten_broadcast (0 along a broadcast dimension).
 */
#include <stddef.h>

#include "corten_internal.h"
#include "corten_kernels.h"

/* take_max != 0: maximum, else minimum. */
static int minmax_s8(int take_max, const corten_broadcast *shape, const int8_t *input1, const int8_t *input2,
                     int8_t *output)
{
    if (shape == NULL || input1 == NULL || input2 == NULL || output == NULL || !corten_broadcast_ok(shape)) {
        return CORTEN_ERROR_ARGUMENT;
    }
    CORTEN_BROADCAST_EACH(shape, int8_t, input1, input2, output,
                          (int8_t)(take_max ? (x1 >= x2 ? x1 : x2) : (x1 <= x2 ? x1 : x2)));
    return CORTEN_OK;
}

int corten_maximum_s8(const corten_broadcast *shape, const int8_t *input1, const int8_t *input2, int8_t *output)
{
    return minmax_s8(1, shape, input1, input2, output);
}

int corten_minimum_s8(const corten_broadcast *shape, const int8_t *input1, const int8_t *input2, int8_t *output)
{
    return minmax_s8(0, shape, input1, input2, output);
}
