/*
 * matmul.c - Corten portable batched int8 matrix product (arm_batch_matmul_s8 arithmetic).
 *
 * out[b0][b1][m][n] = clamp(requantize(sum_k (lhs[b0][b1][m][k] + lhs_offset) *
 *                                            (rhs[b0][b1][k][n] + rhs_offset)) + output_offset)
 * with an int32 accumulator that wraps.  Every tensor is read or written through element strides
 * (batch0, batch1, row, col), so NHWC 4-D activations, transposed operands and broadcast batch
 * dims (stride 0) need no copy.
 */
#include <stddef.h>

#include "corten_kernels.h"

int corten_matmul_s8(const corten_matmul_params *params, const corten_matmul_dims *dims, const int8_t *lhs,
                     const int8_t *rhs, int8_t *output)
{
    int32_t b0, b1, i, j, k;
    if (params == NULL || dims == NULL || lhs == NULL || rhs == NULL || output == NULL || dims->batch[0] < 1 ||
        dims->batch[1] < 1 || dims->m < 1 || dims->n < 1 || dims->k < 1 || params->output_shift < -31 ||
        params->output_shift > 30 || params->activation_min > params->activation_max) {
        return CORTEN_ERROR_ARGUMENT;
    }
    for (b0 = 0; b0 < dims->batch[0]; b0++) {
        for (b1 = 0; b1 < dims->batch[1]; b1++) {
            const int8_t *l_b = lhs + (ptrdiff_t)b0 * dims->lhs_stride[0] + (ptrdiff_t)b1 * dims->lhs_stride[1];
            const int8_t *r_b = rhs + (ptrdiff_t)b0 * dims->rhs_stride[0] + (ptrdiff_t)b1 * dims->rhs_stride[1];
            int8_t *o_b = output + (ptrdiff_t)b0 * dims->out_stride[0] + (ptrdiff_t)b1 * dims->out_stride[1];
            for (i = 0; i < dims->m; i++) {
                const int8_t *l_row = l_b + (ptrdiff_t)i * dims->lhs_stride[2];
                for (j = 0; j < dims->n; j++) {
                    const int8_t *l = l_row;
                    const int8_t *r = r_b + (ptrdiff_t)j * dims->rhs_stride[3];
                    uint32_t acc = 0u;
                    for (k = 0; k < dims->k; k++) {
                        acc += (uint32_t)((*l + params->lhs_offset) * (*r + params->rhs_offset));
                        l += dims->lhs_stride[3];
                        r += dims->rhs_stride[2];
                    }
                    o_b[(ptrdiff_t)i * dims->out_stride[2] + (ptrdiff_t)j * dims->out_stride[3]] = corten_offset_clamp(
                        corten_requantize(corten_u32_to_i32(acc), params->output_multiplier, params->output_shift),
                        params->output_offset, params->activation_min, params->activation_max);
                }
            }
        }
    }
    return CORTEN_OK;
}
