/*
 * reduce.c - Corten portable int8 reductions (see corten/ops/reduce.py): max / min of the int8 values,
 * or TFLite's SUM/MEAN arithmetic (requantize(sum(x + input_offset)) + output_offset).
 *
 * The input is described by its 4 storage dims (dense, outermost first) and which of them are reduced;
 * each output element gets the reduction over the reduced dims at one position of the kept dims, and is
 * written at sum(position * out_strides).
 */
#include <stddef.h>
#include <string.h>

#include "corten_internal.h"
#include "corten_kernels.h"

int corten_reduce_s8(const corten_reduce_params *p, const int8_t *input, int8_t *output)
{
    ptrdiff_t in_stride[4];
    int32_t kept[4], red[4], nk = 0, nr = 0, k;
    int32_t pos[4] = {0, 0, 0, 0};
    ptrdiff_t step = 1;
    if (p == NULL || input == NULL || output == NULL || p->mode < 0 || p->mode > 2) {
        return CORTEN_ERROR_ARGUMENT;
    }
    for (k = 3; k >= 0; k--) {
        if (p->dims[k] < 1) {
            return CORTEN_ERROR_ARGUMENT;
        }
        in_stride[k] = step;
        step *= p->dims[k];
    }
    for (k = 0; k < 4; k++) {
        if (p->reduce[k]) {
            red[nr++] = k;
        } else {
            kept[nk++] = k;
        }
    }
    for (;;) {
        /* one output element: the kept dims at pos[] */
        ptrdiff_t base = 0, out_off = 0;
        int32_t rpos[4] = {0, 0, 0, 0};
        int32_t acc = p->mode == 0 ? -128 : (p->mode == 1 ? 127 : 0);
        uint32_t sum = 0;
        int32_t j, v;
        for (j = 0; j < nk; j++) {
            base += pos[j] * in_stride[kept[j]];
            out_off += (ptrdiff_t)pos[j] * p->out_strides[kept[j]];
        }
        for (;;) {
            ptrdiff_t off = base;
            for (j = 0; j < nr; j++) {
                off += rpos[j] * in_stride[red[j]];
            }
            v = input[off];
            if (p->mode == 0) {
                acc = v > acc ? v : acc;
            } else if (p->mode == 1) {
                acc = v < acc ? v : acc;
            } else {
                sum += (uint32_t)(v + p->input_offset);
            }
            for (j = nr - 1; j >= 0; j--) {
                if (++rpos[j] < p->dims[red[j]]) {
                    break;
                }
                rpos[j] = 0;
            }
            if (j < 0) {
                break;
            }
        }
        if (p->mode == 2) {
            output[out_off] = corten_offset_clamp(corten_requantize(corten_u32_to_i32(sum), p->multiplier, p->shift),
                                                  p->output_offset, p->activation_min, p->activation_max);
        } else {
            acc = acc < p->activation_min ? p->activation_min : acc;
            output[out_off] = (int8_t)(acc > p->activation_max ? p->activation_max : acc);
        }
        for (j = nk - 1; j >= 0; j--) {
            if (++pos[j] < p->dims[kept[j]]) {
                break;
            }
            pos[j] = 0;
        }
        if (j < 0) {
            break;
        }
    }
    return CORTEN_OK;
}

int corten_argmax_s8(const corten_reduce_params *p, const int8_t *input, int8_t *output)
{
    /* the walk of corten_reduce_s8 with exactly one reduced dim; output element k is the int32 index
     * (first of the largest value for mode 0, of the smallest for mode 1) written at byte 4 * k */
    ptrdiff_t in_stride[4];
    int32_t kept[4], nk = 0, red = -1, k;
    int32_t pos[4] = {0, 0, 0, 0};
    ptrdiff_t step = 1;
    if (p == NULL || input == NULL || output == NULL || p->mode < 0 || p->mode > 1) {
        return CORTEN_ERROR_ARGUMENT;
    }
    for (k = 3; k >= 0; k--) {
        if (p->dims[k] < 1) {
            return CORTEN_ERROR_ARGUMENT;
        }
        in_stride[k] = step;
        step *= p->dims[k];
    }
    for (k = 0; k < 4; k++) {
        if (p->reduce[k]) {
            if (red >= 0) {
                return CORTEN_ERROR_ARGUMENT;
            }
            red = k;
        } else {
            kept[nk++] = k;
        }
    }
    if (red < 0) {
        return CORTEN_ERROR_ARGUMENT;
    }
    for (;;) {
        ptrdiff_t base = 0, out_off = 0;
        int32_t i, j, best = 0, best_index = 0;
        for (j = 0; j < nk; j++) {
            base += pos[j] * in_stride[kept[j]];
            out_off += (ptrdiff_t)pos[j] * p->out_strides[kept[j]];
        }
        for (i = 0; i < p->dims[red]; i++) {
            int32_t v = input[base + (ptrdiff_t)i * in_stride[red]];
            if (i == 0 || (p->mode == 0 ? v > best : v < best)) {
                best = v;
                best_index = i;
            }
        }
        memcpy(output + 4 * out_off, &best_index, sizeof best_index);
        for (j = nk - 1; j >= 0; j--) {
            if (++pos[j] < p->dims[kept[j]]) {
                break;
            }
            pos[j] = 0;
        }
        if (j < 0) {
            break;
        }
    }
    return CORTEN_OK;
}
