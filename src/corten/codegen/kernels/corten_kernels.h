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

/** Output requantization: one multiplier/shift (per_channel == 0) or one per output channel;
 *  single_rounding (corten_linear_s8 only): one rounding, as TFLite's reference FULLY_CONNECTED. */
typedef struct {
    const int32_t *multiplier;
    const int32_t *shift;
    int32_t per_channel;
    int32_t single_rounding;
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

/** Pooling geometry (PyTorch's; see corten/ops/pool.py); the pooled values keep the input's
 *  quantization.  pad_h / pad_w are the top / left padding, pad_bottom / pad_right the trailing
 *  padding counted by count_include_pad (a ceil-mode window may reach past it); divisor_override > 0
 *  replaces every average's divisor.  Max pools ignore the last two fields. */
typedef struct {
    int32_t kernel_h;
    int32_t kernel_w;
    int32_t stride_h;
    int32_t stride_w;
    int32_t pad_h;
    int32_t pad_w;
    int32_t activation_min;
    int32_t activation_max;
    int32_t pad_bottom;
    int32_t pad_right;
    int32_t dilation_h;
    int32_t dilation_w;
    int32_t count_include_pad;
    int32_t divisor_override;
    int32_t zero_point; /* used when count_include_pad or divisor_override > 0: sums q - zero_point */
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
 * Depthwise conv2d (depth multiplier 1) whose output overwrites its input (TinyEngine's in-place
 * depthwise): `data` holds the NHWC input on entry and the NHWC output on return (the output is no
 * larger than the input).  Channel by channel, input channel c (n * h * w bytes) is first copied
 * to `temp`, then output channel c is computed from it and written: output byte (p, c) lands on
 * input byte (p, c) of an already copied channel.  Same arithmetic, same bytes as
 * corten_depthwise_conv2d_s8.  `temp` holds input_dims->n * h * w bytes.
 */
int corten_depthwise_conv2d_s8_in_place(const corten_conv_params *params, const corten_quant *quant,
                                        const corten_dims *input_dims, int8_t *data,
                                        const corten_dims *filter_dims, const int8_t *filter, const int32_t *bias,
                                        const corten_dims *output_dims, int8_t *temp);

/**
 * Fully connected: for each of `batches` rows, out[o] = requantize(kernel_sum[o] + sum_k x[k] * w[o][k])
 * with kernel_sum = bias + input_offset * rowsum(w) precomputed.  Weights [out_features, in_features].
 */
int corten_linear_s8(const corten_linear_params *params, const corten_quant *quant, int32_t batches,
                     int32_t in_features, int32_t out_features, const int8_t *input, const int8_t *weight,
                     const int32_t *kernel_sum, int8_t *output);

/**
 * A8W4: the same layers with int4 weights packed two per byte (CMSIS-NN's s4 layout: the whole
 * filter array as one sequence of nibbles, element 2k in the low nibble of byte k); the arithmetic
 * is the int8-weight kernels' (arm_convolve_s4 / arm_depthwise_conv_s4 / arm_fully_connected_s4).
 */
int corten_conv2d_s4(const corten_conv_params *params, const corten_quant *quant,
                     const corten_dims *input_dims, const int8_t *input,
                     const corten_dims *filter_dims, const int8_t *packed_filter, const int32_t *bias,
                     const corten_dims *output_dims, int8_t *output);
int corten_depthwise_conv2d_s4(const corten_conv_params *params, const corten_quant *quant,
                               const corten_dims *input_dims, const int8_t *input,
                               const corten_dims *filter_dims, const int8_t *packed_filter, const int32_t *bias,
                               const corten_dims *output_dims, int8_t *output);
int corten_linear_s4(const corten_linear_params *params, const corten_quant *quant, int32_t batches,
                     int32_t in_features, int32_t out_features, const int8_t *input, const int8_t *packed_weight,
                     const int32_t *kernel_sum, int8_t *output);

/** 16x8 average / max pool (arm_avgpool_s16 / arm_max_pool_s16 arithmetic, every variant of the s8 ones). */
int corten_avg_pool2d_s16(const corten_pool_params *params, const corten_dims *input_dims, const int16_t *input,
                          const corten_dims *output_dims, int16_t *output);
int corten_max_pool2d_s16(const corten_pool_params *params, const corten_dims *input_dims, const int16_t *input,
                          const corten_dims *output_dims, int16_t *output);

/**
 * 16x8 conv2d / depthwise conv2d (arm_convolve_s16 / arm_depthwise_conv_s16 arithmetic): int16 NHWC
 * input and output (zero point 0; params->input_offset and output_offset must be 0), int8 filters
 * as the s8 kernels take them, optional int64 bias [C_out]; int64 accumulator, then
 * clamp(arm_nn_requantize_s64(acc, REDUCE_MULTIPLIER(m[o]), shift[o])).
 */
int corten_conv2d_s16(const corten_conv_params *params, const corten_quant *quant,
                      const corten_dims *input_dims, const int16_t *input,
                      const corten_dims *filter_dims, const int8_t *filter, const int64_t *bias,
                      const corten_dims *output_dims, int16_t *output);

int corten_depthwise_conv2d_s16(const corten_conv_params *params, const corten_quant *quant,
                                const corten_dims *input_dims, const int16_t *input,
                                const corten_dims *filter_dims, const int8_t *filter, const int64_t *bias,
                                const corten_dims *output_dims, int16_t *output);

/**
 * 16x8 fully connected (arm_fully_connected_s16 arithmetic): int16 input (zero point 0), int8 weights
 * [out_features, in_features], optional int64 bias (NULL: none); acc = bias[o] + sum_k x[k] * w[o][k]
 * in int64, out = clamp(arm_nn_requantize_s64(acc, REDUCE_MULTIPLIER(m[o]), shift[o])).
 * params->output_offset must be 0.
 */
int corten_linear_s16(const corten_linear_params *params, const corten_quant *quant, int32_t batches,
                      int32_t in_features, int32_t out_features, const int16_t *input, const int8_t *weight,
                      const int64_t *bias, int16_t *output);

/**
 * Requantize between an int8 and an int16 grid (TFLite's Requantize): out = clamp(output_offset +
 * arm_nn_requantize(q + input_offset, multiplier, shift)) on the output's range; one of input8/input16
 * and one of output8/output16 is non-NULL (int8 -> int16 or int16 -> int8).
 */
int corten_requantize_s8_s16(const int8_t *input8, const int16_t *input16, int32_t input_offset,
                             int32_t output_offset, int32_t multiplier, int32_t shift, int8_t *output8,
                             int16_t *output16, int32_t size);

/** Elementwise add of two same-size int8 tensors; output may be the same buffer as either input. */
int corten_add_s8(const corten_add_params *params, const int8_t *input1, const int8_t *input2,
                  int8_t *output, int32_t size);

/** Average pool (divisor: divisor_override, the padded window with count_include_pad, else the
 *  in-input elements; CMSIS-NN rounding), NHWC. */
int corten_avg_pool2d_s8(const corten_pool_params *params, const corten_dims *input_dims, const int8_t *input,
                         const corten_dims *output_dims, int8_t *output);

/** Max pool with dilation (padding never wins), NHWC. */
int corten_max_pool2d_s8(const corten_pool_params *params, const corten_dims *input_dims, const int8_t *input,
                         const corten_dims *output_dims, int8_t *output);

/** The max pool's indices (torch's return_indices=True): element [n, oy, ox, c] (NHWC) is the int32
 *  iy * W + ix of the window's first largest value (taps in row-major window order; padding never
 *  wins), written at byte 4 * its index (any alignment), as corten_argmax_s8. */
int corten_max_pool2d_indices_s8(const corten_pool_params *params, const corten_dims *input_dims,
                                 const int8_t *input, const corten_dims *output_dims, int8_t *indices);

/** Adaptive average / max pool with PyTorch's windows [floor(i*in/out), ceil((i+1)*in/out)), NHWC. */
int corten_adaptive_avg_pool2d_s8(int32_t activation_min, int32_t activation_max, const corten_dims *input_dims,
                                  const int8_t *input, const corten_dims *output_dims, int8_t *output);
int corten_adaptive_max_pool2d_s8(int32_t activation_min, int32_t activation_max, const corten_dims *input_dims,
                                  const int8_t *input, const corten_dims *output_dims, int8_t *output);

/** Copy an NHWC tensor into NCHW order (what a flatten/reshape of a channels-last tensor reads). */
int corten_nhwc_to_nchw_s8(const corten_dims *dims, const int8_t *input, int8_t *output);

/** Copy values held in NCHW order into an NHWC tensor of shape dims (an un-flatten before a conv). */
int corten_nchw_to_nhwc_s8(const corten_dims *dims, const int8_t *input, int8_t *output);
int corten_nhwc_to_nchw_s16(const corten_dims *dims, const int16_t *input, int16_t *output);
int corten_nchw_to_nhwc_s16(const corten_dims *dims, const int16_t *input, int16_t *output);

/** Elementwise table lookup: output[i] = table[input[i] + 128] for `size` bytes (table: int8 [256]);
 *  output may be the same buffer as input (see corten/ops/lut.py). */
int corten_lut_s8(const int8_t *input, const int8_t *table, int8_t *output, int32_t size);

/** 16x8 table lookup with interpolation (TFLite's lut_lookup_with_interpolation): 513-entry int16
 *  table, entry 256 + (q >> 7) and the next one weighted by q & 0x7f; output may be input. */
int corten_lut_s16(const int16_t *input, const int16_t *table, int16_t *output, int32_t size);

/** TFLite's 16x8 Logistic (function 0) / Tanh (1): input (q * multiplier + rounding) >> shift in
 *  steps of 1/(3 * 4096), interpolated in the 256-entry sigmoid(i / 24) table (0.16); output scale
 *  1/32768, output may be input.  multiplier 1..65535, shift 0..31 (corten/ops/lut.py). */
int corten_activation_s16(const int16_t *input, const uint16_t *table, int32_t multiplier, int32_t shift,
                          int32_t function, int16_t *output, int32_t size);

/**
 * Grouped conv2d, NHWC input, OHWI filter [C_out, kH, kW, C_in / groups] (groups = C_in / filter C, as
 * arm_convolve_s8), optional int32 bias [C_out]; output channel o reads the input channels of group
 * o / (C_out / groups).  params->depth_multiplier is ignored.
 */
int corten_grouped_conv2d_s8(const corten_conv_params *params, const corten_quant *quant,
                             const corten_dims *input_dims, const int8_t *input,
                             const corten_dims *filter_dims, const int8_t *filter, const int32_t *bias,
                             const corten_dims *output_dims, int8_t *output);

/**
 * Broadcast geometry of a binary elementwise op (see corten/ops/mul.py loop_geometry): the output's
 * dims in storage order (NHWC for 4-D tensors, row-major for lower ranks padded with leading 1s) and
 * each input's element strides along those dims (0 where the input is broadcast).
 */
typedef struct {
    corten_dims output;
    corten_dims input1_strides;
    corten_dims input2_strides;
} corten_broadcast;

/** arm_elementwise_mul_s8 parameters (see corten/ops/mul.py). */
typedef struct {
    int32_t input1_offset;
    int32_t input2_offset;
    int32_t output_offset;
    int32_t output_multiplier;
    int32_t output_shift;
    int32_t activation_min;
    int32_t activation_max;
} corten_mul_params;

/** Sub takes the add parameters; input2_multiplier is the positive one, the kernel negates it
 *  (corten/ops/sub.py). */
typedef corten_add_params corten_sub_params;

/** Elementwise multiply with broadcasting: output = requantize((x1 + off1) * (x2 + off2)) + out_off. */
int corten_mul_s8(const corten_mul_params *params, const corten_broadcast *shape, const int8_t *input1,
                  const int8_t *input2, int8_t *output);

/** 16x8 elementwise multiply with broadcasting (arm_elementwise_mul_s16 arithmetic: offsets 0, int16 bounds). */
int corten_elementwise_mul_s16(const corten_mul_params *params, const corten_broadcast *shape,
                               const int16_t *input1, const int16_t *input2, int16_t *output);

/** Elementwise subtract with broadcasting: the add arithmetic with input2's multiplier negated. */
int corten_sub_s8(const corten_sub_params *params, const corten_broadcast *shape, const int8_t *input1,
                  const int8_t *input2, int8_t *output);

/** 16x8 elementwise add, same shape and broadcasting (arm_elementwise_add_s16 arithmetic; corten/ops/add.py). */
int corten_add_s16(const corten_add_params *params, const int16_t *input1, const int16_t *input2,
                   int16_t *output, int32_t size);
int corten_add_broadcast_s16(const corten_add_params *params, const corten_broadcast *shape, const int16_t *input1,
                             const int16_t *input2, int16_t *output);

/** Elementwise add with broadcasting (the corten_add_s8 arithmetic; corten/ops/add.py). */
int corten_add_broadcast_s8(const corten_add_params *params, const corten_broadcast *shape, const int8_t *input1,
                            const int8_t *input2, int8_t *output);

/** Elementwise division with broadcasting (corten/ops/div.py): the quotient of the offset inputs in Q16,
 *  requantized with the mul parameters' multiplier/shift. */
int corten_div_s8(const corten_mul_params *params, const corten_broadcast *shape, const int8_t *input1,
                  const int8_t *input2, int8_t *output);

/** A reduction (corten/ops/reduce.py) of a dense tensor of 4 storage dims: reduce[k] != 0 marks a
 *  reduced dim, out_strides[k] is the output's element stride along a kept one.  mode 0 max, 1 min,
 *  2 sum (requantize(sum(x + input_offset), multiplier, shift) + output_offset). */
typedef struct {
    int32_t dims[4];
    int32_t reduce[4];
    int32_t out_strides[4];
    int32_t mode;
    int32_t input_offset;
    int32_t output_offset;
    int32_t multiplier;
    int32_t shift;
    int32_t activation_min;
    int32_t activation_max;
} corten_reduce_params;

int corten_reduce_s8(const corten_reduce_params *params, const int8_t *input, int8_t *output);

/** argmax (mode 0) / argmin (mode 1) over the one dim with reduce[k] != 0 (corten/ops/reduce.py): the
 *  int32 index of the first largest (smallest) value, written (memcpy, any alignment) at byte 4 * the
 *  output element offset given by out_strides.  The other params fields are unused. */
int corten_argmax_s8(const corten_reduce_params *params, const int8_t *input, int8_t *output);

/** Comparison of broadcast int8 operands (mode 0 eq, 1 ne, 2 lt, 3 le, 4 gt, 5 ge): 1 / 0 bytes. */
int corten_compare_s8(int32_t mode, const corten_broadcast *shape, const int8_t *input1, const int8_t *input2,
                      int8_t *output);

/** output = condition ? a : b over three broadcast operands (element strides along the output's dims). */
int corten_where_s8(const corten_dims *out_dims, const corten_dims *cond_strides, const int8_t *condition,
                    const corten_dims *a_strides, const int8_t *a, const corten_dims *b_strides, const int8_t *b,
                    int8_t *output);

/** Elementwise maximum / minimum of two int8 tensors on one quantization grid, with broadcasting. */
int corten_maximum_s8(const corten_broadcast *shape, const int8_t *input1, const int8_t *input2, int8_t *output);
int corten_minimum_s8(const corten_broadcast *shape, const int8_t *input1, const int8_t *input2, int8_t *output);

/**
 * Constant padding (arm_pad_s8): pre_pad / post_pad values of pad_value around a tensor of
 * input_dims, all in storage order (NHWC; lower ranks right-aligned).  Output must not overlap.
 */
int corten_pad_s8(const int8_t *input, int8_t *output, int8_t pad_value, const corten_dims *input_dims,
                  const corten_dims *pre_pad, const corten_dims *post_pad);

/**
 * One input of a concatenation: for o in [0, outer), copy `inner` bytes from input + o * inner to
 * output + o * output_inner + offset (channel concat of NHWC: outer = N*H*W, inner = C_i).
 */
int corten_concat_s8(const int8_t *input, int32_t outer, int32_t inner, int32_t output_inner, int32_t offset,
                     int8_t *output);

#define CORTEN_TRANSPOSE_MAX_DIMS 6

/** Row-major N-D transpose of bytes: output dim j is input dim perm[j]; dims are the input's. */
int corten_transpose_s8(int32_t num_dims, const int32_t *dims, const int32_t *perm, const int8_t *input,
                        int8_t *output);

#define CORTEN_STRIDED_COPY_MAX_DIMS 10

/**
 * A strided (or indexed) byte copy: slice, select, flip, expand, repeat, pixel_shuffle, gather, ...
 * The output bytes, in order, are indexed by dims[0..num_dims) (row-major, outermost first); output
 * byte (i_0, ..., i_k) is input byte offset + sum_d i_d * strides[d], where at d == index_dim (when
 * index is not NULL) the term is index[i_d] instead.  Strides may be negative or zero.
 */
typedef struct {
    int32_t num_dims;       /* 1 .. CORTEN_STRIDED_COPY_MAX_DIMS */
    const int32_t *dims;    /* output sizes, each >= 1 */
    const int32_t *strides; /* input byte step per output index (ignored at index_dim) */
    int32_t offset;         /* input byte of output byte 0, before the index term */
    const int32_t *index;   /* NULL, or dims[index_dim] input byte offsets */
    int32_t index_dim;      /* -1 without an index table */
    int32_t input_size;     /* input bytes: every byte read must lie in [0, input_size) */
} corten_strided_copy_params;

/** Copy input to output as params say; input and output must not overlap.  Returns CORTEN_OK or
 * CORTEN_ERROR_ARGUMENT (bad geometry, or a byte read outside the input). */
int corten_strided_copy_s8(const corten_strided_copy_params *params, const int8_t *input, int8_t *output);

/**
 * Softmax over num_rows rows of row_size (1..4095) int8 values with arm_softmax_s8 arithmetic
 * (see corten/ops/softmax.py): output scale 1/256, zero point -128.
 */
int corten_softmax_s8(const int8_t *input, int32_t num_rows, int32_t row_size, int32_t mult, int32_t shift,
                      int32_t diff_min, int8_t *output);

/** Softmax over rows along a non-innermost dimension: outer blocks of row_size elements, inner bytes
 *  apart (element i of row (o, j) at (o * row_size + i) * inner + j). */
int corten_softmax_strided_s8(const int8_t *input, int32_t outer, int32_t row_size, int32_t inner, int32_t mult,
                              int32_t shift, int32_t diff_min, int8_t *output);

/** 16x8 softmax (TFLite's SoftmaxInt16, arm_softmax_s16 arithmetic) over rows laid out as in
 *  corten_softmax_strided_s8 (inner 1: contiguous rows), 1..65535 elements; shift -31..15 (a
 *  TFLite QuantizeMultiplier shift); exp_lut / one_by_one_lut: 513-entry tables; output scale
 *  1/32768.  The output must not overlap the input (it holds the row's exponentials meanwhile). */
int corten_softmax_s16(const int16_t *input, int32_t outer, int32_t row_size, int32_t inner, int32_t mult,
                       int32_t shift, const int16_t *exp_lut, const int16_t *one_by_one_lut, int16_t *output);

/** TFLite's int8 LogSoftmax (output scale 16/256, zero point 127) over rows laid out as in
 *  corten_softmax_strided_s8; reverse_shift <= 0. */
int corten_log_softmax_s8(const int8_t *input, int32_t outer, int32_t row_size, int32_t inner, int32_t mult,
                          int32_t shift, int32_t reverse_mult, int32_t reverse_shift, int32_t diff_min,
                          int8_t *output);

/** Transposed convolution parameters (PyTorch conv_transpose2d conventions). */
typedef struct {
    int32_t stride_h;
    int32_t stride_w;
    int32_t pad_h;
    int32_t pad_w;
    int32_t output_pad_h;
    int32_t output_pad_w;
    int32_t dilation_h;
    int32_t dilation_w;
    int32_t input_offset;
    int32_t output_offset;
    int32_t activation_min;
    int32_t activation_max;
} corten_conv_transpose_params;

/**
 * Transposed conv2d, NHWC input, OHWI filter [C_out, kH, kW, C_in] (not flipped), optional int32 bias,
 * NHWC output of H_out = (H - 1) * stride_h - 2 * pad_h + dilation_h * (kH - 1) + output_pad_h + 1.
 */
int corten_conv_transpose2d_s8(const corten_conv_transpose_params *params, const corten_quant *quant,
                               const corten_dims *input_dims, const int8_t *input,
                               const corten_dims *filter_dims, const int8_t *filter, const int32_t *bias,
                               const corten_dims *output_dims, int8_t *output);

/** One unidirectional LSTM layer (corten/ops/lstm.py: TFLite's int8 LSTM, arm_lstm_unidirectional_s8's
 *  arithmetic).  Weights [4][hidden][input] / [4][hidden][hidden] in gate order (input, forget, cell,
 *  output); effective biases [4][hidden]; gate_multipliers/gate_shifts [4][2] (input, hidden term);
 *  sigmoid_table: 256 values of sigmoid(k/24) in 0.16 fixed point. */
typedef struct {
    int32_t time_major; /* input [T][B][I] (1) or [B][T][I] (0); the output sequence likewise */
    int32_t last_only;  /* 1: the output is only the last hidden state [B][H] */
    int32_t batches;
    int32_t time_steps;
    int32_t input_size;
    int32_t hidden_size;
    int32_t output_offset;
    int32_t output_multiplier;
    int32_t output_shift;
    int32_t forget_to_cell_multiplier;
    int32_t forget_to_cell_shift;
    int32_t input_to_cell_multiplier;
    int32_t input_to_cell_shift;
    int32_t cell_clip;
    int32_t cell_scale_power;
    const int8_t *input_weights;
    const int8_t *hidden_weights;
    const int32_t *input_effective_bias;
    const int32_t *hidden_effective_bias;
    const int32_t *gate_multipliers;
    const int32_t *gate_shifts;
    const int32_t *sigmoid_table;
} corten_lstm_params;

/** LSTM layer; scratch: 10 * batches * hidden_size + batches * hidden_size bytes, 2-byte aligned. */
int corten_lstm_s8(const corten_lstm_params *params, const int8_t *input, int8_t *output, void *scratch);

/* The pieces of corten_lstm_s8, for a caller computing the gate pre-activations itself (e.g. with
 * CMSIS-NN's arm_nn_vec_mat_mul_result_acc_s8_s16), step by step: for each t and batch b, for each
 * gate k, fill corten_lstm_gate_row(k, b) (returned zeroed) with sat16(R(x.Wx_k + ebx_k) +
 * R(h.Wh_k + ebh_k)) where x = corten_lstm_input_row(t, b) and h = corten_lstm_hidden_in(t, b)
 * (NULL at t = 0: no hidden term); then corten_lstm_step_s8(t) applies the gates' sigmoid/tanh and
 * updates the cell state and the hidden state/output. */
const int8_t *corten_lstm_input_row(const corten_lstm_params *params, const int8_t *input, int32_t t, int32_t b);
const int8_t *corten_lstm_hidden_in(const corten_lstm_params *params, const int8_t *output, const void *scratch,
                                    int32_t t, int32_t b);
int16_t *corten_lstm_gate_row(const corten_lstm_params *params, void *scratch, int32_t gate, int32_t b);
int corten_lstm_step_s8(const corten_lstm_params *params, int32_t t, int8_t *output, void *scratch);

/** Batched matmul quantization: offsets are negated zero points (output: the zero point). */
typedef struct {
    int32_t lhs_offset;
    int32_t rhs_offset;
    int32_t output_offset;
    int32_t output_multiplier;
    int32_t output_shift;
    int32_t activation_min;
    int32_t activation_max;
} corten_matmul_params;

/** Batched matmul geometry: output [batch0, batch1, m, n]; element strides per tensor as
 *  {batch0, batch1, row, col} (lhs rows m / cols k, rhs rows k / cols n); 0 for a broadcast dim. */
typedef struct {
    int32_t batch[2];
    int32_t m;
    int32_t n;
    int32_t k;
    int32_t lhs_stride[4];
    int32_t rhs_stride[4];
    int32_t out_stride[4];
} corten_matmul_dims;

/** Layer norm parameters: eps on the integer scale (eps * n^2 / s_in^2), output zero point, clamp. */
typedef struct {
    int64_t eps_q;
    int32_t output_offset;
    int32_t activation_min;
    int32_t activation_max;
} corten_layer_norm_params;

/** Layer norm over rows of row_size (1..4095) int8 values, inner bytes apart (element i of row (o, j)
 *  at (o * row_size + i) * inner + j); per-element multiplier/shift/bias fold gamma and beta. */
int corten_layer_norm_s8(const corten_layer_norm_params *params, int32_t outer, int32_t row_size, int32_t inner,
                         const int32_t *multiplier, const int32_t *shift, const int32_t *bias, const int8_t *input,
                         int8_t *output);

/** out = lhs @ rhs per batch, arm_batch_matmul_s8 arithmetic (see corten/ops/matmul.py). */
int corten_matmul_s8(const corten_matmul_params *params, const corten_matmul_dims *dims, const int8_t *lhs,
                     const int8_t *rhs, int8_t *output);

#ifdef __cplusplus
}
#endif

#endif /* CORTEN_KERNELS_H */
