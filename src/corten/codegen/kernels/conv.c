/*
 * conv.c - Corten portable int8 convolutions: conv2d (OHWI filters) and depthwise conv2d.
 *
 * acc = bias[o] + sum over in-input taps of (x + input_offset) * w, accumulated with int32
 * wrap-around, then requantize(acc, multiplier, shift) + output_offset clamped to the activation
 * range.  Taps falling into the padding contribute 0 and are skipped.
 */
#include <stddef.h>

#include "corten_internal.h"
#include "corten_kernels.h"

static int corten_conv_args_ok(const corten_conv_params *p, const corten_quant *q, const corten_dims *in_dims,
                               const int8_t *in, const corten_dims *f_dims, const int8_t *f,
                               const corten_dims *out_dims, const int8_t *out)
{
    if (p == NULL || q == NULL || q->multiplier == NULL || q->shift == NULL || in_dims == NULL || in == NULL ||
        f_dims == NULL || f == NULL || out_dims == NULL || out == NULL) {
        return 0;
    }
    if (p->stride_h < 1 || p->stride_w < 1 || p->dilation_h < 1 || p->dilation_w < 1 || p->pad_h < 0 ||
        p->pad_w < 0 || f_dims->h < 1 || f_dims->w < 1 || in_dims->n != out_dims->n) {
        return 0;
    }
    return 1;
}

int corten_conv2d_s8(const corten_conv_params *params, const corten_quant *quant,
                     const corten_dims *input_dims, const int8_t *input,
                     const corten_dims *filter_dims, const int8_t *filter, const int32_t *bias,
                     const corten_dims *output_dims, int8_t *output)
{
    int32_t b, oy, ox, oc;
    int32_t in_h, in_w, c_in, c_out, kh, kw, filter_row;

    if (!corten_conv_args_ok(params, quant, input_dims, input, filter_dims, filter, output_dims, output) ||
        filter_dims->c != input_dims->c || filter_dims->n != output_dims->c) {
        return CORTEN_ERROR_ARGUMENT;
    }
    in_h = input_dims->h;
    in_w = input_dims->w;
    c_in = input_dims->c;
    c_out = output_dims->c;
    kh = filter_dims->h;
    kw = filter_dims->w;
    filter_row = kh * kw * c_in; /* bytes of one output channel's filter */

    for (b = 0; b < input_dims->n; b++) {
        const int8_t *in_batch = input + (size_t)b * in_h * in_w * c_in;
        for (oy = 0; oy < output_dims->h; oy++) {
            const int32_t iy0 = oy * params->stride_h - params->pad_h;
            const int32_t ky_begin = corten_first_valid_tap(iy0, params->dilation_h);
            const int32_t ky_end = corten_end_valid_tap(iy0, params->dilation_h, kh, in_h);
            for (ox = 0; ox < output_dims->w; ox++) {
                const int32_t ix0 = ox * params->stride_w - params->pad_w;
                const int32_t kx_begin = corten_first_valid_tap(ix0, params->dilation_w);
                const int32_t kx_end = corten_end_valid_tap(ix0, params->dilation_w, kw, in_w);
                /* With unit dilation along W, the valid taps of a filter row are one contiguous run
                 * of (kx_end - kx_begin) * c_in bytes in both the input row and the filter. */
                const int32_t run = params->dilation_w == 1 ? (kx_end - kx_begin) * c_in : c_in;
                const int32_t runs_per_row = params->dilation_w == 1 ? (kx_begin < kx_end ? 1 : 0)
                                                                     : (kx_end > kx_begin ? kx_end - kx_begin : 0);
                int8_t *out_px = output + (((size_t)b * output_dims->h + oy) * output_dims->w + ox) * c_out;

                for (oc = 0; oc < c_out; oc += 4) {
                    const int32_t group = (c_out - oc) < 4 ? (c_out - oc) : 4;
                    uint32_t acc[4] = {0u, 0u, 0u, 0u};
                    int32_t ky, r, g;
                    for (ky = ky_begin; ky < ky_end; ky++) {
                        const int32_t iy = iy0 + ky * params->dilation_h;
                        for (r = 0; r < runs_per_row; r++) {
                            const int32_t kx = kx_begin + r;
                            const int32_t ix = ix0 + kx * params->dilation_w;
                            const int8_t *x = in_batch + ((size_t)iy * in_w + ix) * c_in;
                            const int8_t *w = filter + (size_t)oc * filter_row + ((size_t)ky * kw + kx) * c_in;
                            if (group == 4) {
                                corten_dot4_offset_s8(x, w, filter_row, run, params->input_offset, acc);
                            } else {
                                for (g = 0; g < group; g++) {
                                    acc[g] += (uint32_t)corten_dot_offset_s8(x, w + (size_t)g * filter_row, run,
                                                                             params->input_offset);
                                }
                            }
                        }
                    }
                    for (g = 0; g < group; g++) {
                        const int32_t o = oc + g;
                        const uint32_t total = acc[g] + (bias != NULL ? (uint32_t)bias[o] : 0u);
                        out_px[o] = corten_finish(corten_u32_to_i32(total), o, quant->multiplier, quant->shift,
                                                  quant->per_channel, params->output_offset,
                                                  params->activation_min, params->activation_max);
                    }
                }
            }
        }
    }
    return CORTEN_OK;
}

/* Depthwise with depth multiplier 1: channels in blocks, taps outer, so the inner loop runs over
 * contiguous channels of both the input pixel and the filter tap. */
static void corten_depthwise_mult1(const corten_conv_params *p, const corten_quant *q, const corten_dims *in_dims,
                                   const int8_t *input, const corten_dims *f_dims, const int8_t *filter,
                                   const int32_t *bias, const corten_dims *out_dims, int8_t *output)
{
    const int32_t in_h = in_dims->h, in_w = in_dims->w, ch = in_dims->c, kh = f_dims->h, kw = f_dims->w;
    int32_t b, oy, ox;
    for (b = 0; b < in_dims->n; b++) {
        const int8_t *in_batch = input + (size_t)b * in_h * in_w * ch;
        for (oy = 0; oy < out_dims->h; oy++) {
            const int32_t iy0 = oy * p->stride_h - p->pad_h;
            const int32_t ky_begin = corten_first_valid_tap(iy0, p->dilation_h);
            const int32_t ky_end = corten_end_valid_tap(iy0, p->dilation_h, kh, in_h);
            for (ox = 0; ox < out_dims->w; ox++) {
                const int32_t ix0 = ox * p->stride_w - p->pad_w;
                const int32_t kx_begin = corten_first_valid_tap(ix0, p->dilation_w);
                const int32_t kx_end = corten_end_valid_tap(ix0, p->dilation_w, kw, in_w);
                int8_t *out_px = output + (((size_t)b * out_dims->h + oy) * out_dims->w + ox) * ch;
                int32_t c0;
                for (c0 = 0; c0 < ch; c0 += CORTEN_BLOCK) {
                    const int32_t count = (ch - c0) < CORTEN_BLOCK ? (ch - c0) : CORTEN_BLOCK;
                    uint32_t acc[CORTEN_BLOCK];
                    int32_t ky, kx, j;
                    for (j = 0; j < CORTEN_BLOCK; j++) {
                        acc[j] = 0u;
                    }
                    for (ky = ky_begin; ky < ky_end; ky++) {
                        const int32_t iy = iy0 + ky * p->dilation_h;
                        for (kx = kx_begin; kx < kx_end; kx++) {
                            const int32_t ix = ix0 + kx * p->dilation_w;
                            const int8_t *x = in_batch + ((size_t)iy * in_w + ix) * ch + c0;
                            const int8_t *w = filter + ((size_t)ky * kw + kx) * ch + c0;
                            if (count == CORTEN_BLOCK) {
                                for (j = 0; j < CORTEN_BLOCK; j++) {
                                    acc[j] += (uint32_t)(((int32_t)x[j] + p->input_offset) * (int32_t)w[j]);
                                }
                            } else {
                                for (j = 0; j < count; j++) {
                                    acc[j] += (uint32_t)(((int32_t)x[j] + p->input_offset) * (int32_t)w[j]);
                                }
                            }
                        }
                    }
                    for (j = 0; j < count; j++) {
                        const int32_t o = c0 + j;
                        const uint32_t total = acc[j] + (bias != NULL ? (uint32_t)bias[o] : 0u);
                        out_px[o] = corten_finish(corten_u32_to_i32(total), o, q->multiplier, q->shift,
                                                  q->per_channel, p->output_offset, p->activation_min,
                                                  p->activation_max);
                    }
                }
            }
        }
    }
}

/* Depthwise with any depth multiplier: output channel o reads input channel o / mult. */
static void corten_depthwise_general(const corten_conv_params *p, const corten_quant *q, const corten_dims *in_dims,
                                     const int8_t *input, const corten_dims *f_dims, const int8_t *filter,
                                     const int32_t *bias, const corten_dims *out_dims, int8_t *output)
{
    const int32_t in_h = in_dims->h, in_w = in_dims->w, c_in = in_dims->c, kh = f_dims->h, kw = f_dims->w;
    const int32_t c_out = out_dims->c, mult = p->depth_multiplier;
    int32_t b, oy, ox, o;
    for (b = 0; b < in_dims->n; b++) {
        const int8_t *in_batch = input + (size_t)b * in_h * in_w * c_in;
        for (oy = 0; oy < out_dims->h; oy++) {
            const int32_t iy0 = oy * p->stride_h - p->pad_h;
            const int32_t ky_begin = corten_first_valid_tap(iy0, p->dilation_h);
            const int32_t ky_end = corten_end_valid_tap(iy0, p->dilation_h, kh, in_h);
            for (ox = 0; ox < out_dims->w; ox++) {
                const int32_t ix0 = ox * p->stride_w - p->pad_w;
                const int32_t kx_begin = corten_first_valid_tap(ix0, p->dilation_w);
                const int32_t kx_end = corten_end_valid_tap(ix0, p->dilation_w, kw, in_w);
                int8_t *out_px = output + (((size_t)b * out_dims->h + oy) * out_dims->w + ox) * c_out;
                for (o = 0; o < c_out; o++) {
                    const int32_t c = o / mult;
                    uint32_t acc = bias != NULL ? (uint32_t)bias[o] : 0u;
                    int32_t ky, kx;
                    for (ky = ky_begin; ky < ky_end; ky++) {
                        const int32_t iy = iy0 + ky * p->dilation_h;
                        for (kx = kx_begin; kx < kx_end; kx++) {
                            const int32_t ix = ix0 + kx * p->dilation_w;
                            const int32_t xv = (int32_t)in_batch[((size_t)iy * in_w + ix) * c_in + c] + p->input_offset;
                            acc += (uint32_t)(xv * (int32_t)filter[((size_t)ky * kw + kx) * c_out + o]);
                        }
                    }
                    out_px[o] = corten_finish(corten_u32_to_i32(acc), o, q->multiplier, q->shift, q->per_channel,
                                              p->output_offset, p->activation_min, p->activation_max);
                }
            }
        }
    }
}

int corten_depthwise_conv2d_s8(const corten_conv_params *params, const corten_quant *quant,
                               const corten_dims *input_dims, const int8_t *input,
                               const corten_dims *filter_dims, const int8_t *filter, const int32_t *bias,
                               const corten_dims *output_dims, int8_t *output)
{
    if (!corten_conv_args_ok(params, quant, input_dims, input, filter_dims, filter, output_dims, output) ||
        params->depth_multiplier < 1 || filter_dims->n != 1 || filter_dims->c != output_dims->c ||
        output_dims->c != input_dims->c * params->depth_multiplier) {
        return CORTEN_ERROR_ARGUMENT;
    }
    if (params->depth_multiplier == 1) {
        corten_depthwise_mult1(params, quant, input_dims, input, filter_dims, filter, bias, output_dims, output);
    } else {
        corten_depthwise_general(params, quant, input_dims, input, filter_dims, filter, bias, output_dims, output);
    }
    return CORTEN_OK;
}
