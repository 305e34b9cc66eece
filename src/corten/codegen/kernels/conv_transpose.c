/*
 * conv_transpose.c - Corten portable int8 transposed convolution (OHWI filters [C_out, kH, kW, C_in]).
 *
 * Gather form of the scatter definition: output (oy, ox) sums, over the filter taps (ky, kx) for
 * which t = oy + pad_h - ky * dilation_h is a non-negative multiple of stride_h with iy = t / stride_h
 * inside the input (and likewise along W), the products (x[iy, ix, c] + input_offset) * w[o, ky, kx, c].
 * acc = bias[o] + that sum in int32 with wrap-around, then requantize + output_offset + clamp.
 */
#include <stddef.h>

#include "corten_internal.h"
#include "corten_kernels.h"

/* The input coordinate tap k reads for output coordinate o, or -1 when it reads none. */
static int32_t corten_transpose_source(int32_t o, int32_t k, int32_t pad, int32_t stride, int32_t dilation,
                                       int32_t size)
{
    const int32_t t = o + pad - k * dilation;
    int32_t i;
    if (t < 0 || t % stride != 0) {
        return -1;
    }
    i = t / stride;
    return i < size ? i : -1;
}

static int corten_conv_transpose_args_ok(const corten_conv_transpose_params *p, const corten_quant *q,
                                         const corten_dims *in_dims, const int8_t *in, const corten_dims *f_dims,
                                         const int8_t *f, const corten_dims *out_dims, const int8_t *out)
{
    int32_t full_h, full_w;
    if (p == NULL || q == NULL || q->multiplier == NULL || q->shift == NULL || in_dims == NULL || in == NULL ||
        f_dims == NULL || f == NULL || out_dims == NULL || out == NULL) {
        return 0;
    }
    if (p->stride_h < 1 || p->stride_w < 1 || p->dilation_h < 1 || p->dilation_w < 1 || p->pad_h < 0 ||
        p->pad_w < 0 || p->output_pad_h < 0 || p->output_pad_w < 0 || f_dims->h < 1 || f_dims->w < 1 ||
        f_dims->c != in_dims->c || f_dims->n != out_dims->c || in_dims->n != out_dims->n ||
        p->input_offset < -127 || p->input_offset > 128) {
        return 0;
    }
    full_h = (in_dims->h - 1) * p->stride_h + p->dilation_h * (f_dims->h - 1) + 1;
    full_w = (in_dims->w - 1) * p->stride_w + p->dilation_w * (f_dims->w - 1) + 1;
    return out_dims->h == full_h - 2 * p->pad_h + p->output_pad_h &&
           out_dims->w == full_w - 2 * p->pad_w + p->output_pad_w;
}

int corten_conv_transpose2d_s8(const corten_conv_transpose_params *params, const corten_quant *quant,
                               const corten_dims *input_dims, const int8_t *input,
                               const corten_dims *filter_dims, const int8_t *filter, const int32_t *bias,
                               const corten_dims *output_dims, int8_t *output)
{
    const corten_conv_transpose_params *p = params;
    int32_t in_h, in_w, c_in, kh, kw, c_out, b, oy, ox, o, ky, kx;
    if (!corten_conv_transpose_args_ok(params, quant, input_dims, input, filter_dims, filter, output_dims,
                                       output)) {
        return CORTEN_ERROR_ARGUMENT;
    }
    in_h = input_dims->h;
    in_w = input_dims->w;
    c_in = input_dims->c;
    kh = filter_dims->h;
    kw = filter_dims->w;
    c_out = output_dims->c;
    for (b = 0; b < input_dims->n; b++) {
        const int8_t *in_batch = input + (ptrdiff_t)b * in_h * in_w * c_in;
        for (oy = 0; oy < output_dims->h; oy++) {
            for (ox = 0; ox < output_dims->w; ox++) {
                int8_t *out_px = output + (((ptrdiff_t)b * output_dims->h + oy) * output_dims->w + ox) * c_out;
                for (o = 0; o < c_out; o++) {
                    const int8_t *w_o = filter + (ptrdiff_t)o * kh * kw * c_in;
                    uint32_t acc = bias != NULL ? (uint32_t)bias[o] : 0u;
                    for (ky = 0; ky < kh; ky++) {
                        const int32_t iy = corten_transpose_source(oy, ky, p->pad_h, p->stride_h, p->dilation_h, in_h);
                        if (iy < 0) {
                            continue;
                        }
                        for (kx = 0; kx < kw; kx++) {
                            const int32_t ix =
                                corten_transpose_source(ox, kx, p->pad_w, p->stride_w, p->dilation_w, in_w);
                            if (ix < 0) {
                                continue;
                            }
                            acc += (uint32_t)corten_dot_offset_s8(in_batch + ((ptrdiff_t)iy * in_w + ix) * c_in,
                                                                  w_o + ((ptrdiff_t)ky * kw + kx) * c_in, c_in,
                                                                  p->input_offset);
                        }
                    }
                    out_px[o] = corten_finish(corten_u32_to_i32(acc), o, quant->multiplier, quant->shift,
                                              quant->per_channel, p->output_offset, p->activation_min,
                                              p->activation_max);
                }
            }
        }
    }
    return CORTEN_OK;
}
