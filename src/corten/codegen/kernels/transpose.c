/*
 * transpose.c - Corten portable int8 N-D transpose over row-major bytes (arm_transpose_s8
 * semantics for any rank up to CORTEN_TRANSPOSE_MAX_DIMS): output dimension j is input
 * dimension perm[j].  The compiler passes the storage-order dims (NHWC for 4-D activations),
 * with size-1 dims dropped and adjacent dims merged.
 */
#include <stddef.h>

#include "corten_kernels.h"

int corten_transpose_s8(int32_t num_dims, const int32_t *dims, const int32_t *perm, const int8_t *input,
                        int8_t *output)
{
    size_t in_stride[CORTEN_TRANSPOSE_MAX_DIMS];
    size_t out_dims[CORTEN_TRANSPOSE_MAX_DIMS];
    size_t src_stride[CORTEN_TRANSPOSE_MAX_DIMS]; /* input stride of output dim j */
    size_t index[CORTEN_TRANSPOSE_MAX_DIMS];
    size_t total = 1, i, src = 0;
    int32_t j, seen = 0;
    if (dims == NULL || perm == NULL || input == NULL || output == NULL || input == output || num_dims < 1 ||
        num_dims > CORTEN_TRANSPOSE_MAX_DIMS) {
        return CORTEN_ERROR_ARGUMENT;
    }
    for (j = num_dims - 1; j >= 0; j--) {
        if (dims[j] < 1 || perm[j] < 0 || perm[j] >= num_dims || (seen & (1 << perm[j])) != 0) {
            return CORTEN_ERROR_ARGUMENT;
        }
        seen |= 1 << perm[j];
        in_stride[j] = total;
        total *= (size_t)dims[j];
    }
    for (j = 0; j < num_dims; j++) {
        out_dims[j] = (size_t)dims[perm[j]];
        src_stride[j] = in_stride[perm[j]];
        index[j] = 0;
    }
    /* Walk the output in order, keeping src = sum_j index[j] * src_stride[j]. */
    for (i = 0; i < total; i++) {
        output[i] = input[src];
        for (j = num_dims - 1; j >= 0; j--) {
            index[j]++;
            src += src_stride[j];
            if (index[j] < out_dims[j]) {
                break;
            }
            src -= index[j] * src_stride[j];
            index[j] = 0;
        }
    }
    return CORTEN_OK;
}
