/*
 * layout.c - Corten portable layout copies between NHWC bytes and NCHW order, for a reshape
 * (flatten/view) of a channels-last tensor that is not a byte-for-byte alias.
 *
 * The copy is the same for every element width: CORTEN_LAYOUT_COPY defines it once, and each
 * (direction, element type) pair below is one instance (int8 programs and 16x8 ones).
 */
#include <stddef.h>

#include "corten_kernels.h"

#define CORTEN_NHWC_INDEX ((ptrdiff_t)px * dims->c + c)
#define CORTEN_NCHW_INDEX ((ptrdiff_t)c * plane + px)

/* name(dims, input, output): output[out_index] = input[in_index] over one batch at a time. */
#define CORTEN_LAYOUT_COPY(name, type, out_index, in_index)                                  \
    int name(const corten_dims *dims, const type *input, type *output)                      \
    {                                                                                        \
        int32_t b, y, x, c;                                                                  \
        if (dims == NULL || input == NULL || output == NULL || input == output) {            \
            return CORTEN_ERROR_ARGUMENT;                                                    \
        }                                                                                    \
        for (b = 0; b < dims->n; b++) {                                                      \
            const ptrdiff_t plane = (ptrdiff_t)dims->h * dims->w;                            \
            const type *in_batch = input + (ptrdiff_t)b * plane * dims->c;                   \
            type *out_batch = output + (ptrdiff_t)b * plane * dims->c;                       \
            for (y = 0; y < dims->h; y++) {                                                  \
                for (x = 0; x < dims->w; x++) {                                              \
                    const ptrdiff_t px = (ptrdiff_t)y * dims->w + x;                         \
                    for (c = 0; c < dims->c; c++) {                                          \
                        out_batch[out_index] = in_batch[in_index];                           \
                    }                                                                        \
                }                                                                            \
            }                                                                                \
        }                                                                                    \
        return CORTEN_OK;                                                                    \
    }

CORTEN_LAYOUT_COPY(corten_nhwc_to_nchw_s8, int8_t, CORTEN_NCHW_INDEX, CORTEN_NHWC_INDEX)
CORTEN_LAYOUT_COPY(corten_nchw_to_nhwc_s8, int8_t, CORTEN_NHWC_INDEX, CORTEN_NCHW_INDEX)
CORTEN_LAYOUT_COPY(corten_nhwc_to_nchw_s16, int16_t, CORTEN_NCHW_INDEX, CORTEN_NHWC_INDEX)
CORTEN_LAYOUT_COPY(corten_nchw_to_nhwc_s16, int16_t, CORTEN_NHWC_INDEX, CORTEN_NCHW_INDEX)
