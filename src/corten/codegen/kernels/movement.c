/*
 * movement.c - Corten portable int8 strided / indexed byte copy: every exact data-movement op
 * (slice, select, flip, expand, repeat, roll, pixel_shuffle, nearest upsampling, index_select,
 * gather, ...) is one call with the loop geometry the compiler derived (corten/ops/movement.py).
 * The innermost dimension is copied with memcpy (stride 1), memset (stride 0) or a byte loop.
 */
#include <stddef.h>
#include <string.h>

#include "corten_kernels.h"

/* Lowest and highest input byte the copy reads, or -1 for a malformed geometry. */
static int32_t corten_strided_copy_range(const corten_strided_copy_params *p, int64_t *lo, int64_t *hi)
{
    int32_t d, i;
    *lo = p->offset;
    *hi = p->offset;
    for (d = 0; d < p->num_dims; d++) {
        if (p->dims[d] < 1) {
            return -1;
        }
        if (d == p->index_dim && p->index != NULL) {
            int32_t first = p->index[0], least = first, most = first;
            for (i = 1; i < p->dims[d]; i++) {
                least = p->index[i] < least ? p->index[i] : least;
                most = p->index[i] > most ? p->index[i] : most;
            }
            *lo += least;
            *hi += most;
        } else {
            const int64_t span = (int64_t)(p->dims[d] - 1) * p->strides[d];
            *lo += span < 0 ? span : 0;
            *hi += span > 0 ? span : 0;
        }
    }
    return 0;
}

int corten_strided_copy_s8(const corten_strided_copy_params *params, const int8_t *input, int8_t *output)
{
    ptrdiff_t step[CORTEN_STRIDED_COPY_MAX_DIMS]; /* input byte step of each outer dim */
    int32_t count[CORTEN_STRIDED_COPY_MAX_DIMS];  /* current index of each outer dim */
    int64_t lo, hi;
    ptrdiff_t src;
    size_t rows = 1, row, inner_len, out = 0;
    int32_t d, inner, inner_stride, k;
    const int32_t *inner_index;
    if (params == NULL || input == NULL || output == NULL || input == output || params->dims == NULL ||
        params->strides == NULL || params->num_dims < 1 || params->num_dims > CORTEN_STRIDED_COPY_MAX_DIMS ||
        (params->index != NULL && (params->index_dim < 0 || params->index_dim >= params->num_dims)) ||
        corten_strided_copy_range(params, &lo, &hi) != 0 || lo < 0 || hi >= (int64_t)params->input_size) {
        return CORTEN_ERROR_ARGUMENT;
    }
    inner = params->num_dims - 1;
    inner_len = (size_t)params->dims[inner];
    inner_stride = params->strides[inner];
    inner_index = (params->index != NULL && params->index_dim == inner) ? params->index : NULL;
    for (d = 0; d < inner; d++) {
        step[d] = (params->index != NULL && d == params->index_dim) ? 0 : (ptrdiff_t)params->strides[d];
        count[d] = 0;
        rows *= (size_t)params->dims[d];
    }
    /* src = offset + sum over outer dims of their term; the odometer below keeps it current. */
    src = (ptrdiff_t)params->offset;
    if (params->index != NULL && params->index_dim < inner) {
        src += params->index[0];
    }
    for (row = 0; row < rows; row++) {
        const int8_t *from = input + src;
        int8_t *to = output + out;
        if (inner_index != NULL) {
            for (k = 0; k < (int32_t)inner_len; k++) {
                to[k] = from[inner_index[k]];
            }
        } else if (inner_stride == 1) {
            memcpy(to, from, inner_len);
        } else if (inner_stride == 0) {
            memset(to, *from, inner_len);
        } else {
            for (k = 0; k < (int32_t)inner_len; k++) {
                to[k] = from[(ptrdiff_t)k * inner_stride];
            }
        }
        out += inner_len;
        /* advance the outer index (i_0, ..., i_{inner-1}) like an odometer */
        for (d = inner - 1; d >= 0; d--) {
            const int indexed = params->index != NULL && d == params->index_dim;
            count[d]++;
            if (count[d] < params->dims[d]) {
                src += indexed ? (ptrdiff_t)params->index[count[d]] - params->index[count[d] - 1] : step[d];
                break;
            }
            src -= indexed ? (ptrdiff_t)params->index[count[d] - 1] - params->index[0]
                           : (ptrdiff_t)(count[d] - 1) * step[d];
            count[d] = 0;
        }
    }
    return CORTEN_OK;
}
