/*
 * linear.c - Corten portable int8 fully connected layer (arm_fully_connected_s8 arithmetic).
 *
 * acc[o] = kernel_sum[o] + sum_k x[k] * w[o][k] (int32 wrap-around), where the compiler has folded
 * bias + input_offset * rowsum(w) into kernel_sum; then requantize + output offset + clamp (one rounding
 * when quant->single_rounding: TFLite's reference FULLY_CONNECTED as LiteRT runs it).
 * corten_linear_s16: the 16x8 variant (arm_fully_connected_s16): int64 accumulator and bias,
 * arm_nn_requantize_s64 with the reduced multiplier, no offsets.
 */
#include <stddef.h>

#include "corten_internal.h"
#include "corten_kernels.h"

/* The arguments the int8-activation linears (int8 and packed int4 weights) need. */
static int corten_linear_args_ok(const corten_linear_params *params, const corten_quant *quant, int32_t batches,
                                 int32_t in_features, int32_t out_features, const int8_t *input,
                                 const int8_t *weight, const int32_t *kernel_sum, const int8_t *output)
{
    return params != NULL && quant != NULL && quant->multiplier != NULL && quant->shift != NULL && input != NULL &&
           weight != NULL && kernel_sum != NULL && output != NULL && batches >= 0 && in_features >= 1 &&
           out_features >= 1;
}

/* Output o of the int8-activation linears from its int32 sum: requantized (one rounding when
 * quant->single_rounding), offset and clamped. */
static inline int8_t corten_linear_output(const corten_linear_params *params, const corten_quant *quant,
                                          int32_t total, int32_t o)
{
    if (quant->single_rounding) {
        const int32_t q = quant->per_channel ? o : 0;
        return corten_offset_clamp(corten_requantize_single(total, quant->multiplier[q], quant->shift[q]),
                                   params->output_offset, params->activation_min, params->activation_max);
    }
    return corten_finish(total, o, quant->multiplier, quant->shift, quant->per_channel, params->output_offset,
                         params->activation_min, params->activation_max);
}

int corten_linear_s8(const corten_linear_params *params, const corten_quant *quant, int32_t batches,
                     int32_t in_features, int32_t out_features, const int8_t *input, const int8_t *weight,
                     const int32_t *kernel_sum, int8_t *output)
{
    int32_t b, o, g;
    if (!corten_linear_args_ok(params, quant, batches, in_features, out_features, input, weight, kernel_sum, output)) {
        return CORTEN_ERROR_ARGUMENT;
    }
    for (b = 0; b < batches; b++) {
        const int8_t *x = input + (ptrdiff_t)b * in_features;
        int8_t *y = output + (ptrdiff_t)b * out_features;
        for (o = 0; o < out_features; o += 4) {
            const int32_t group = (out_features - o) < 4 ? (out_features - o) : 4;
            uint32_t acc[4] = {0u, 0u, 0u, 0u};
            const int8_t *w = weight + (ptrdiff_t)o * in_features;
            if (group == 4) {
                corten_dot4_offset_s8(x, w, in_features, in_features, 0, acc);
            } else {
                for (g = 0; g < group; g++) {
                    acc[g] = (uint32_t)corten_dot_offset_s8(x, w + (ptrdiff_t)g * in_features, in_features, 0);
                }
            }
            for (g = 0; g < group; g++) {
                y[o + g] = corten_linear_output(params, quant, corten_u32_to_i32(acc[g] + (uint32_t)kernel_sum[o + g]),
                                                o + g);
            }
        }
    }
    return CORTEN_OK;
}

/* A8W4: int4 weights packed two per byte, row o starting at nibble o * in_features (CMSIS-NN's s4
 * layout); the int8 kernel's arithmetic and output stage. */
int corten_linear_s4(const corten_linear_params *params, const corten_quant *quant, int32_t batches,
                     int32_t in_features, int32_t out_features, const int8_t *input, const int8_t *packed_weight,
                     const int32_t *kernel_sum, int8_t *output)
{
    int32_t b, o, k;
    if (!corten_linear_args_ok(params, quant, batches, in_features, out_features, input, packed_weight, kernel_sum,
                               output)) {
        return CORTEN_ERROR_ARGUMENT;
    }
    for (b = 0; b < batches; b++) {
        const int8_t *x = input + (ptrdiff_t)b * in_features;
        int8_t *y = output + (ptrdiff_t)b * out_features;
        for (o = 0; o < out_features; o++) {
            const int32_t k0 = o * in_features;
            uint32_t acc = (uint32_t)kernel_sum[o];
            for (k = 0; k < in_features; k++) {
                acc += (uint32_t)((int32_t)x[k] * corten_s4_at(packed_weight, k0 + k));
            }
            y[o] = corten_linear_output(params, quant, corten_u32_to_i32(acc), o);
        }
    }
    return CORTEN_OK;
}

int corten_linear_s16(const corten_linear_params *params, const corten_quant *quant, int32_t batches,
                      int32_t in_features, int32_t out_features, const int16_t *input, const int8_t *weight,
                      const int64_t *bias, int16_t *output)
{
    int32_t b, o, k;
    if (params == NULL || quant == NULL || quant->multiplier == NULL || quant->shift == NULL || input == NULL ||
        weight == NULL || output == NULL || batches < 0 || in_features < 1 || out_features < 1 ||
        params->output_offset != 0) {
        return CORTEN_ERROR_ARGUMENT;
    }
    for (b = 0; b < batches; b++) {
        const int16_t *x = input + (ptrdiff_t)b * in_features;
        int16_t *y = output + (ptrdiff_t)b * out_features;
        for (o = 0; o < out_features; o++) {
            const int8_t *w = weight + (ptrdiff_t)o * in_features;
            const int32_t q = quant->per_channel ? o : 0;
            int64_t acc = bias != NULL ? bias[o] : 0;
            for (k = 0; k < in_features; k++) {
                acc += (int64_t)((int32_t)x[k] * (int32_t)w[k]);
            }
            y[o] = corten_clamp_s16(corten_requantize_s64(acc, corten_reduce_multiplier(quant->multiplier[q]),
                                                          quant->shift[q]),
                                    params->activation_min, params->activation_max);
        }
    }
    return CORTEN_OK;
}
