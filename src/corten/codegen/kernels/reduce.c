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

/* The layout every reduction walks: the dense strides of the 4 storage dims (in_stride), the kept dims
 * kept[0, *nk) and the reduced ones red[0, *nr), outermost first.  0: a dim below 1. */
static int corten_reduce_layout(const corten_reduce_params *p, ptrdiff_t in_stride[4], int32_t kept[4], int32_t *nk,
                                int32_t red[4], int32_t *nr)
{
    ptrdiff_t step = 1;
    int32_t k;
    for (k = 3; k >= 0; k--) {
        if (p->dims[k] < 1) {
            return 0;
        }
        in_stride[k] = step;
        step *= p->dims[k];
    }
    *nk = 0;
    *nr = 0;
    for (k = 0; k < 4; k++) {
        if (p->reduce[k]) {
            red[(*nr)++] = k;
        } else {
            kept[(*nk)++] = k;
        }
    }
    return 1;
}

/* The next position pos[0, n) over the dims dims[which[j]] (the last one fastest); 0 once every
 * position has been visited (pos back to all zeros). */
static int corten_reduce_next(int32_t *pos, const int32_t *which, int32_t n, const int32_t *dims)
{
    int32_t j;
    for (j = n - 1; j >= 0; j--) {
        if (++pos[j] < dims[which[j]]) {
            return 1;
        }
        pos[j] = 0;
    }
    return 0;
}

/* The input offset (*base) and output element offset (*out_off) of the kept dims at pos[0, nk). */
static void corten_reduce_offsets(const corten_reduce_params *p, const ptrdiff_t in_stride[4], const int32_t *kept,
                                  int32_t nk, const int32_t *pos, ptrdiff_t *base, ptrdiff_t *out_off)
{
    int32_t j;
    *base = 0;
    *out_off = 0;
    for (j = 0; j < nk; j++) {
        *base += pos[j] * in_stride[kept[j]];
        *out_off += (ptrdiff_t)pos[j] * p->out_strides[kept[j]];
    }
}

int corten_reduce_s8(const corten_reduce_params *p, const int8_t *input, int8_t *output)
{
    ptrdiff_t in_stride[4];
    int32_t kept[4], red[4], nk, nr;
    int32_t pos[4] = {0, 0, 0, 0};
    if (p == NULL || input == NULL || output == NULL || p->mode < 0 || p->mode > 2 ||
        !corten_reduce_layout(p, in_stride, kept, &nk, red, &nr)) {
        return CORTEN_ERROR_ARGUMENT;
    }
    do {
        /* one output element: the kept dims at pos[] */
        ptrdiff_t base, out_off;
        int32_t rpos[4] = {0, 0, 0, 0};
        int32_t acc = p->mode == 0 ? -128 : (p->mode == 1 ? 127 : 0);
        uint32_t sum = 0;
        corten_reduce_offsets(p, in_stride, kept, nk, pos, &base, &out_off);
        do {
            ptrdiff_t off = base;
            int32_t j, v;
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
        } while (corten_reduce_next(rpos, red, nr, p->dims));
        if (p->mode == 2) {
            output[out_off] = corten_offset_clamp(corten_requantize(corten_u32_to_i32(sum), p->multiplier, p->shift),
                                                  p->output_offset, p->activation_min, p->activation_max);
        } else {
            acc = acc < p->activation_min ? p->activation_min : acc;
            output[out_off] = (int8_t)(acc > p->activation_max ? p->activation_max : acc);
        }
    } while (corten_reduce_next(pos, kept, nk, p->dims));
    return CORTEN_OK;
}

int corten_argmax_s8(const corten_reduce_params *p, const int8_t *input, int8_t *output)
{
    /* the walk of corten_reduce_s8 with exactly one reduced dim; output element k is the int32 index
     * (first of the largest value for mode 0, of the smallest for mode 1) written at byte 4 * k */
    ptrdiff_t in_stride[4];
    int32_t kept[4], red[4], nk, nr;
    int32_t pos[4] = {0, 0, 0, 0};
    if (p == NULL || input == NULL || output == NULL || p->mode < 0 || p->mode > 1 ||
        !corten_reduce_layout(p, in_stride, kept, &nk, red, &nr) || nr != 1) {
        return CORTEN_ERROR_ARGUMENT;
    }
    do {
        ptrdiff_t base, out_off;
        int32_t i, best = 0, best_index = 0;
        corten_reduce_offsets(p, in_stride, kept, nk, pos, &base, &out_off);
        for (i = 0; i < p->dims[red[0]]; i++) {
            int32_t v = input[base + (ptrdiff_t)i * in_stride[red[0]]];
            if (i == 0 || (p->mode == 0 ? v > best : v < best)) {
                best = v;
                best_index = i;
            }
        }
        memcpy(output + 4 * out_off, &best_index, sizeof best_index);
    } while (corten_reduce_next(pos, kept, nk, p->dims));
    return CORTEN_OK;
}
