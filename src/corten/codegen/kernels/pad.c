/*
 * pad.c - Corten portable int8 constant padding (arm_pad_s8 semantics) of a 4-D tensor given in
 * storage order (NHWC for an activation; a lower-rank row-major tensor right-aligned in the
 * four dimensions).  Pure byte moves: no arithmetic on the values.
 */
#include <stddef.h>
#include <string.h>

#include "corten_kernels.h"

static int32_t corten_pad_dims_valid(const corten_dims *d, int32_t minimum)
{
    return d->n >= minimum && d->h >= minimum && d->w >= minimum && d->c >= minimum;
}

int corten_pad_s8(const int8_t *input, int8_t *output, int8_t pad_value, const corten_dims *input_dims,
                  const corten_dims *pre_pad, const corten_dims *post_pad)
{
    size_t out_c, out_row, out_image, y_bytes;
    int32_t b, y, x;
    if (input == NULL || output == NULL || input_dims == NULL || pre_pad == NULL || post_pad == NULL ||
        !corten_pad_dims_valid(input_dims, 1) || !corten_pad_dims_valid(pre_pad, 0) ||
        !corten_pad_dims_valid(post_pad, 0)) {
        return CORTEN_ERROR_ARGUMENT;
    }
    out_c = (size_t)pre_pad->c + (size_t)input_dims->c + (size_t)post_pad->c;
    out_row = ((size_t)pre_pad->w + (size_t)input_dims->w + (size_t)post_pad->w) * out_c;
    out_image = ((size_t)pre_pad->h + (size_t)input_dims->h + (size_t)post_pad->h) * out_row;
    y_bytes = (size_t)input_dims->w * (size_t)input_dims->c;

    memset(output, pad_value, (size_t)pre_pad->n * out_image);
    output += (size_t)pre_pad->n * out_image;
    for (b = 0; b < input_dims->n; b++) {
        memset(output, pad_value, (size_t)pre_pad->h * out_row);
        output += (size_t)pre_pad->h * out_row;
        for (y = 0; y < input_dims->h; y++) {
            memset(output, pad_value, (size_t)pre_pad->w * out_c);
            output += (size_t)pre_pad->w * out_c;
            if (pre_pad->c == 0 && post_pad->c == 0) {
                /* whole rows of pixels are contiguous in input and output */
                memcpy(output, input, y_bytes);
                output += y_bytes;
                input += y_bytes;
            } else {
                for (x = 0; x < input_dims->w; x++) {
                    memset(output, pad_value, (size_t)pre_pad->c);
                    output += pre_pad->c;
                    memcpy(output, input, (size_t)input_dims->c);
                    output += input_dims->c;
                    input += input_dims->c;
                    memset(output, pad_value, (size_t)post_pad->c);
                    output += post_pad->c;
                }
            }
            memset(output, pad_value, (size_t)post_pad->w * out_c);
            output += (size_t)post_pad->w * out_c;
        }
        memset(output, pad_value, (size_t)post_pad->h * out_row);
        output += (size_t)post_pad->h * out_row;
    }
    memset(output, pad_value, (size_t)post_pad->n * out_image);
    return CORTEN_OK;
}
