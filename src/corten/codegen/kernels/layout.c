/*
 * layout.c - Corten portable layout copies between NHWC bytes and NCHW order, for a reshape
 * (flatten/view) of a channels-last tensor that is not a byte-for-byte alias.
 */
#include <stddef.h>

#include "corten_kernels.h"

int corten_nhwc_to_nchw_s8(const corten_dims *dims, const int8_t *input, int8_t *output)
{
    int32_t b, y, x, c;
    if (dims == NULL || input == NULL || output == NULL || input == output) {
        return CORTEN_ERROR_ARGUMENT;
    }
    for (b = 0; b < dims->n; b++) {
        const ptrdiff_t plane = (ptrdiff_t)dims->h * dims->w;
        const int8_t *in_batch = input + (ptrdiff_t)b * plane * dims->c;
        int8_t *out_batch = output + (ptrdiff_t)b * plane * dims->c;
        for (y = 0; y < dims->h; y++) {
            for (x = 0; x < dims->w; x++) {
                const ptrdiff_t px = (ptrdiff_t)y * dims->w + x;
                for (c = 0; c < dims->c; c++) {
                    out_batch[(ptrdiff_t)c * plane + px] = in_batch[px * dims->c + c];
                }
            }
        }
    }
    return CORTEN_OK;
}

int corten_nchw_to_nhwc_s8(const corten_dims *dims, const int8_t *input, int8_t *output)
{
    int32_t b, y, x, c;
    if (dims == NULL || input == NULL || output == NULL || input == output) {
        return CORTEN_ERROR_ARGUMENT;
    }
    for (b = 0; b < dims->n; b++) {
        const ptrdiff_t plane = (ptrdiff_t)dims->h * dims->w;
        const int8_t *in_batch = input + (ptrdiff_t)b * plane * dims->c;
        int8_t *out_batch = output + (ptrdiff_t)b * plane * dims->c;
        for (y = 0; y < dims->h; y++) {
            for (x = 0; x < dims->w; x++) {
                const ptrdiff_t px = (ptrdiff_t)y * dims->w + x;
                for (c = 0; c < dims->c; c++) {
                    out_batch[px * dims->c + c] = in_batch[(ptrdiff_t)c * plane + px];
                }
            }
        }
    }
    return CORTEN_OK;
}

/* The same copies of int16 elements (16x8 programs). */
int corten_nhwc_to_nchw_s16(const corten_dims *dims, const int16_t *input, int16_t *output)
{
    int32_t b, y, x, c;
    if (dims == NULL || input == NULL || output == NULL || input == output) {
        return CORTEN_ERROR_ARGUMENT;
    }
    for (b = 0; b < dims->n; b++) {
        const ptrdiff_t plane = (ptrdiff_t)dims->h * dims->w;
        const int16_t *in_batch = input + (ptrdiff_t)b * plane * dims->c;
        int16_t *out_batch = output + (ptrdiff_t)b * plane * dims->c;
        for (y = 0; y < dims->h; y++) {
            for (x = 0; x < dims->w; x++) {
                const ptrdiff_t px = (ptrdiff_t)y * dims->w + x;
                for (c = 0; c < dims->c; c++) {
                    out_batch[(ptrdiff_t)c * plane + px] = in_batch[px * dims->c + c];
                }
            }
        }
    }
    return CORTEN_OK;
}

int corten_nchw_to_nhwc_s16(const corten_dims *dims, const int16_t *input, int16_t *output)
{
    int32_t b, y, x, c;
    if (dims == NULL || input == NULL || output == NULL || input == output) {
        return CORTEN_ERROR_ARGUMENT;
    }
    for (b = 0; b < dims->n; b++) {
        const ptrdiff_t plane = (ptrdiff_t)dims->h * dims->w;
        const int16_t *in_batch = input + (ptrdiff_t)b * plane * dims->c;
        int16_t *out_batch = output + (ptrdiff_t)b * plane * dims->c;
        for (y = 0; y < dims->h; y++) {
            for (x = 0; x < dims->w; x++) {
                const ptrdiff_t px = (ptrdiff_t)y * dims->w + x;
                for (c = 0; c < dims->c; c++) {
                    out_batch[px * dims->c + c] = in_batch[(ptrdiff_t)c * plane + px];
                }
            }
        }
    }
    return CORTEN_OK;
}
