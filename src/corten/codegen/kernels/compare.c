/*
 * compare.c - Corten portable comparisons and selection (see corten/ops/compare.py).
 *
 * corten_compare_s8 writes 1 / 0 bytes (a bool tensor) for input1 OP input2 over broadcast int8
 * operands (mode 0 eq, 1 ne, 2 lt, 3 le, 4 gt, 5 ge); corten_where_s8 selects int8 bytes
 * (condition != 0 ? a : b) over three broadcast operands.  Outputs are written in storage order.
 */
#include <stddef.h>

#include "corten_internal.h"
#include "corten_kernels.h"

static int8_t corten_compare_one(int32_t mode, int32_t a, int32_t b)
{
    switch (mode) {
    case 0:
        return (int8_t)(a == b);
    case 1:
        return (int8_t)(a != b);
    case 2:
        return (int8_t)(a < b);
    case 3:
        return (int8_t)(a <= b);
    case 4:
        return (int8_t)(a > b);
    default:
        return (int8_t)(a >= b);
    }
}

int corten_compare_s8(int32_t mode, const corten_broadcast *shape, const int8_t *input1, const int8_t *input2,
                      int8_t *output)
{
    if (shape == NULL || input1 == NULL || input2 == NULL || output == NULL || mode < 0 || mode > 5 ||
        !corten_broadcast_ok(shape)) {
        return CORTEN_ERROR_ARGUMENT;
    }
    CORTEN_BROADCAST_EACH(shape, int8_t, input1, input2, output, corten_compare_one(mode, x1, x2));
    return CORTEN_OK;
}

int corten_where_s8(const corten_dims *out_dims, const corten_dims *cond_strides, const int8_t *condition,
                    const corten_dims *a_strides, const int8_t *a, const corten_dims *b_strides, const int8_t *b,
                    int8_t *output)
{
    int32_t n, h, w, c;
    if (out_dims == NULL || cond_strides == NULL || condition == NULL || a_strides == NULL || a == NULL ||
        b_strides == NULL || b == NULL || output == NULL) {
        return CORTEN_ERROR_ARGUMENT;
    }
    for (n = 0; n < out_dims->n; n++) {
        for (h = 0; h < out_dims->h; h++) {
            for (w = 0; w < out_dims->w; w++) {
                for (c = 0; c < out_dims->c; c++) {
                    const ptrdiff_t ci = (ptrdiff_t)n * cond_strides->n + (ptrdiff_t)h * cond_strides->h +
                                         (ptrdiff_t)w * cond_strides->w + (ptrdiff_t)c * cond_strides->c;
                    const ptrdiff_t ai = (ptrdiff_t)n * a_strides->n + (ptrdiff_t)h * a_strides->h +
                                         (ptrdiff_t)w * a_strides->w + (ptrdiff_t)c * a_strides->c;
                    const ptrdiff_t bi = (ptrdiff_t)n * b_strides->n + (ptrdiff_t)h * b_strides->h +
                                         (ptrdiff_t)w * b_strides->w + (ptrdiff_t)c * b_strides->c;
                    *output++ = condition[ci] ? a[ai] : b[bi];
                }
            }
        }
    }
    return CORTEN_OK;
}
