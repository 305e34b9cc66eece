/*
 * corten_kernels.h - Corten's portable C99 int8 kernels.
 *
 * Each kernel is bit-exact with the matching reference kernel in corten/ops (CMSIS-NN / TFLite
 * int8 arithmetic).  Activations are NHWC int8; no kernel allocates, uses float or keeps state.
 * Every kernel returns CORTEN_OK, or CORTEN_ERROR_ARGUMENT for a NULL pointer or an impossible
 * shape/parameter.
 */
#ifndef CORTEN_KERNELS_H
#define CORTEN_KERNELS_H

#include <stdint.h>

#include "corten_fixed_point.h"

#ifdef __cplusplus
extern "C" {
#endif

#define CORTEN_OK 0
#define CORTEN_ERROR_ARGUMENT (-1)

/** A 4-D activation or filter shape, NHWC order (filters: OHWI, i.e. n = C_out, c = C_in). */
typedef struct {
    int32_t n;
    int32_t h;
    int32_t w;
    int32_t c;
} corten_dims;

/** Output requantization: one multiplier/shift (per_channel == 0) or one per output channel. */
typedef struct {
    const int32_t *multiplier;
    const int32_t *shift;
    int32_t per_channel;
} corten_quant;

/** Convolution geometry and offsets: input_offset = -input zero point (in [-127, 128]),
 *  output_offset = output zero point. */
typedef struct {
    int32_t stride_h;
    int32_t stride_w;
    int32_t pad_h;
    int32_t pad_w;
    int32_t dilation_h;
    int32_t dilation_w;
    int32_t depth_multiplier; /* depthwise only; ignored by corten_conv2d_s8 */
    int32_t input_offset;
    int32_t output_offset;
    int32_t activation_min;
    int32_t activation_max;
} corten_conv_params;

/** Pooling geometry; the pooled values keep the input's quantization. */
typedef struct {
    int32_t kernel_h;
    int32_t kernel_w;
    int32_t stride_h;
    int32_t stride_w;
    int32_t pad_h;
    int32_t pad_w;
    int32_t activation_min;
    int32_t activation_max;
} corten_pool_params;

/** arm_elementwise_add_s8 parameters (see corten/ops/add.py). */
typedef struct {
    int32_t input1_offset;
    int32_t input1_multiplier;
    int32_t input1_shift;
    int32_t input2_offset;
    int32_t input2_multiplier;
    int32_t input2_shift;
    int32_t left_shift;
    int32_t output_offset;
    int32_t output_multiplier;
    int32_t output_shift;
    int32_t activation_min;
    int32_t activation_max;
} corten_add_params;

/** Linear layer parameters (the input offset is folded into the kernel sums). */
typedef struct {
    int32_t output_offset;
    int32_t activation_min;
    int32_t activation_max;
} corten_linear_params;

/**
 * conv2d, NHWC input, OHWI filter [C_out, kH, kW, C_in], optional int32 bias [C_out] (NULL: none),
 * NHWC output.  Symmetric zero padding (padding contributes the real value 0).
 */
int corten_conv2d_s8(const corten_conv_params *params, const corten_quant *quant,
                     const corten_dims *input_dims, const int8_t *input,
                     const corten_dims *filter_dims, const int8_t *filter, const int32_t *bias,
                     const corten_dims *output_dims, int8_t *output);

/**
 * Depthwise conv2d, filter [1, kH, kW, C_out] with C_out = C_in * depth_multiplier; output
 * channel c * depth_multiplier + m reads input channel c.
 */
int corten_depthwise_conv2d_s8(const corten_conv_params *params, const corten_quant *quant,
                               const corten_dims *input_dims, const int8_t *input,
                               const corten_dims *filter_dims, const int8_t *filter, const int32_t *bias,
                               const corten_dims *output_dims, int8_t *output);

/**
 * Fully connected: for each of `batches` rows, out[o] = requantize(kernel_sum[o] + sum_k x[k] * w[o][k])
 * with kernel_sum = bias + input_offset * rowsum(w) precomputed.  Weights [out_features, in_features].
 */
int corten_linear_s8(const corten_linear_params *params, const corten_quant *quant, int32_t batches,
                     int32_t in_features, int32_t out_features, const int8_t *input, const int8_t *weight,
                     const int32_t *kernel_sum, int8_t *output);

/** Elementwise add of two same-size int8 tensors; output may be the same buffer as either input. */
int corten_add_s8(const corten_add_params *params, const int8_t *input1, const int8_t *input2,
                  int8_t *output, int32_t size);

/** Average pool (windows count only in-input elements, CMSIS-NN rounding), NHWC. */
int corten_avg_pool2d_s8(const corten_pool_params *params, const corten_dims *input_dims, const int8_t *input,
                         const corten_dims *output_dims, int8_t *output);

/** Max pool (padding never wins), NHWC. */
int corten_max_pool2d_s8(const corten_pool_params *params, const corten_dims *input_dims, const int8_t *input,
                         const corten_dims *output_dims, int8_t *output);

/** Copy an NHWC tensor into NCHW order (what a flatten/reshape of a channels-last tensor reads). */
int corten_nhwc_to_nchw_s8(const corten_dims *dims, const int8_t *input, int8_t *output);

/** Copy values held in NCHW order into an NHWC tensor of shape dims (an un-flatten before a conv). */
int corten_nchw_to_nhwc_s8(const corten_dims *dims, const int8_t *input, int8_t *output);

#ifdef __cplusplus
}
#endif

#endif /* CORTEN_KERNELS_H */
