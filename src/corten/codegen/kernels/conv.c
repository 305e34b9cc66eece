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
        p->pad_w < 0 || f_dims->h < 1 || f_dims->w < 1 || in_dims->n != out_dims->n ||
        p->input_offset < -127 || p->input_offset > 128) {
        return 0;
    }
    return 1;
}

/* The filter of a conv2d ([C_out, kH, kW, C_in]) fits its input and output (every element width). */
static int corten_conv2d_shapes_ok(const corten_dims *in_dims, const corten_dims *f_dims, const corten_dims *out_dims)
{
    return f_dims->c == in_dims->c && f_dims->n == out_dims->c;
}

/* The filter of a depthwise conv ([1, kH, kW, C_out], C_out = C_in * depth multiplier) fits its input and output. */
static int corten_depthwise_shapes_ok(const corten_conv_params *p, const corten_dims *in_dims,
                                      const corten_dims *f_dims, const corten_dims *out_dims)
{
    return p->depth_multiplier >= 1 && f_dims->n == 1 && f_dims->c == out_dims->c &&
           out_dims->c == in_dims->c * p->depth_multiplier;
}

/* The in-input taps of one output pixel's window. */
typedef struct {
    int32_t iy0, ix0;           /* top-left input coordinate (may be negative: padding) */
    int32_t ky_begin, ky_end;   /* valid filter rows [begin, end) */
    int32_t kx_begin, kx_end;   /* valid filter columns [begin, end) */
} corten_window;

static void corten_window_at(const corten_conv_params *p, int32_t oy, int32_t ox, int32_t kh, int32_t kw,
                             int32_t in_h, int32_t in_w, corten_window *win)
{
    corten_axis_taps(oy, p->stride_h, p->pad_h, p->dilation_h, kh, in_h, &win->iy0, &win->ky_begin, &win->ky_end);
    corten_axis_taps(ox, p->stride_w, p->pad_w, p->dilation_w, kw, in_w, &win->ix0, &win->kx_begin, &win->kx_end);
}

/* acc[g] += sum over the window's valid taps of (x + input_offset) * w[oc + g], g < group. */
static void corten_conv_window_acc(const corten_conv_params *p, const corten_window *win, const int8_t *in_batch,
                                   int32_t in_w, int32_t c_in, const int8_t *w_oc, int32_t kw, int32_t filter_row,
                                   int32_t group, uint32_t acc[4])
{
    /* With unit dilation along W the valid taps of a filter row are one contiguous run of
     * (kx_end - kx_begin) * c_in bytes in both the input row and the filter. */
    const int32_t contiguous = p->dilation_w == 1;
    const int32_t run = contiguous ? (win->kx_end - win->kx_begin) * c_in : c_in;
    const int32_t runs = win->kx_end > win->kx_begin ? (contiguous ? 1 : win->kx_end - win->kx_begin) : 0;
    int32_t ky, r, g;
    for (ky = win->ky_begin; ky < win->ky_end; ky++) {
        const int32_t iy = win->iy0 + ky * p->dilation_h;
        for (r = 0; r < runs; r++) {
            const int32_t kx = win->kx_begin + r;
            const int32_t ix = win->ix0 + kx * p->dilation_w;
            const int8_t *x = in_batch + ((ptrdiff_t)iy * in_w + ix) * c_in;
            const int8_t *w = w_oc + ((ptrdiff_t)ky * kw + kx) * c_in;
            if (group == 4) {
                corten_dot4_offset_s8(x, w, filter_row, run, p->input_offset, acc);
            } else {
                for (g = 0; g < group; g++) {
                    acc[g] += (uint32_t)corten_dot_offset_s8(x, w + (ptrdiff_t)g * filter_row, run, p->input_offset);
                }
            }
        }
    }
}

static void corten_conv_store(const corten_conv_params *p, const corten_quant *q, const int32_t *bias,
                              const uint32_t acc[4], int32_t oc, int32_t group, int8_t *out_px)
{
    int32_t g;
    for (g = 0; g < group; g++) {
        const int32_t o = oc + g;
        const uint32_t total = acc[g] + (bias != NULL ? (uint32_t)bias[o] : 0u);
        out_px[o] = corten_finish(corten_u32_to_i32(total), o, q->multiplier, q->shift, q->per_channel,
                                  p->output_offset, p->activation_min, p->activation_max);
    }
}

#define CORTEN_PIXEL_TILE 8
#define CORTEN_PATCH_MAX 256

/*
 * Few input channels (e.g. an RGB stem): the taps' runs are too short to vectorise, so each
 * window is gathered once into an int16 patch of (x + input_offset) values, zero for padding taps
 * and for the tail up to a whole number of blocks.  Rows whose block-rounded read would pass the
 * end of the filter array use an exact-length dot product.
 */
static void corten_conv2d_patch(const corten_conv_params *p, const corten_quant *q, const corten_dims *in_dims,
                                const int8_t *input, const corten_dims *f_dims, const int8_t *filter,
                                const int32_t *bias, const corten_dims *out_dims, int8_t *output)
{
    const int32_t in_h = in_dims->h, in_w = in_dims->w, c_in = in_dims->c, c_out = out_dims->c;
    const int32_t kh = f_dims->h, kw = f_dims->w, filter_row = kh * kw * c_in;
    const int32_t padded = (filter_row + CORTEN_BLOCK - 1) / CORTEN_BLOCK * CORTEN_BLOCK;
    const int16_t off16 = (int16_t)p->input_offset;
    int16_t patch[CORTEN_PATCH_MAX];
    int32_t b, oy, ox, oc, ky, kx, c, k;
    for (b = 0; b < in_dims->n; b++) {
        const int8_t *in_batch = input + (ptrdiff_t)b * in_h * in_w * c_in;
        for (oy = 0; oy < out_dims->h; oy++) {
            for (ox = 0; ox < out_dims->w; ox++) {
                int8_t *out_px = output + (((ptrdiff_t)b * out_dims->h + oy) * out_dims->w + ox) * c_out;
                const int32_t iy0 = oy * p->stride_h - p->pad_h, ix0 = ox * p->stride_w - p->pad_w;
                k = 0;
                for (ky = 0; ky < kh; ky++) {
                    const int32_t iy = iy0 + ky * p->dilation_h;
                    for (kx = 0; kx < kw; kx++) {
                        const int32_t ix = ix0 + kx * p->dilation_w;
                        if (iy >= 0 && iy < in_h && ix >= 0 && ix < in_w) {
                            const int8_t *x = in_batch + ((ptrdiff_t)iy * in_w + ix) * c_in;
                            for (c = 0; c < c_in; c++) {
                                patch[k++] = (int16_t)(x[c] + off16);
                            }
                        } else {
                            for (c = 0; c < c_in; c++) {
                                patch[k++] = 0;
                            }
                        }
                    }
                }
                for (; k < padded; k++) {
                    patch[k] = 0;
                }
                for (oc = 0; oc < c_out; oc += 4) {
                    const int32_t group = (c_out - oc) < 4 ? (c_out - oc) : 4;
                    const int8_t *w = filter + (ptrdiff_t)oc * filter_row;
                    uint32_t acc[4] = {0u, 0u, 0u, 0u};
                    if (group == 4 && (oc + 3) * filter_row + padded <= c_out * filter_row) {
                        corten_dot4_patch(patch, w, filter_row, padded, acc);
                    } else {
                        int32_t g;
                        for (g = 0; g < group; g++) {
                            acc[g] = corten_dot_patch(patch, w + (ptrdiff_t)g * filter_row, filter_row);
                        }
                    }
                    corten_conv_store(p, q, bias, acc, oc, group, out_px);
                }
            }
        }
    }
}

/*
 * General path: output pixels in tiles of CORTEN_PIXEL_TILE; for each group of four output
 * channels the tile's windows are computed while the group's filter rows stay in cache.
 */
static void corten_conv2d_tiled(const corten_conv_params *p, const corten_quant *q, const corten_dims *in_dims,
                                const int8_t *input, const corten_dims *f_dims, const int8_t *filter,
                                const int32_t *bias, const corten_dims *out_dims, int8_t *output)
{
    const int32_t in_h = in_dims->h, in_w = in_dims->w, c_in = in_dims->c, c_out = out_dims->c;
    const int32_t kh = f_dims->h, kw = f_dims->w, filter_row = kh * kw * c_in;
    const int32_t pixels = out_dims->h * out_dims->w;
    corten_window win[CORTEN_PIXEL_TILE];
    int32_t b, p0, t, oc;
    for (b = 0; b < in_dims->n; b++) {
        const int8_t *in_batch = input + (ptrdiff_t)b * in_h * in_w * c_in;
        int8_t *out_batch = output + (ptrdiff_t)b * pixels * c_out;
        for (p0 = 0; p0 < pixels; p0 += CORTEN_PIXEL_TILE) {
            const int32_t count = (pixels - p0) < CORTEN_PIXEL_TILE ? (pixels - p0) : CORTEN_PIXEL_TILE;
            for (t = 0; t < count; t++) {
                corten_window_at(p, (p0 + t) / out_dims->w, (p0 + t) % out_dims->w, kh, kw, in_h, in_w, &win[t]);
            }
            for (oc = 0; oc < c_out; oc += 4) {
                const int32_t group = (c_out - oc) < 4 ? (c_out - oc) : 4;
                const int8_t *w_oc = filter + (ptrdiff_t)oc * filter_row;
                for (t = 0; t < count; t++) {
                    uint32_t acc[4] = {0u, 0u, 0u, 0u};
                    corten_conv_window_acc(p, &win[t], in_batch, in_w, c_in, w_oc, kw, filter_row, group, acc);
                    corten_conv_store(p, q, bias, acc, oc, group, out_batch + (ptrdiff_t)(p0 + t) * c_out);
                }
            }
        }
    }
}

int corten_conv2d_s8(const corten_conv_params *params, const corten_quant *quant,
                     const corten_dims *input_dims, const int8_t *input,
                     const corten_dims *filter_dims, const int8_t *filter, const int32_t *bias,
                     const corten_dims *output_dims, int8_t *output)
{
    int32_t filter_row;
    if (!corten_conv_args_ok(params, quant, input_dims, input, filter_dims, filter, output_dims, output) ||
        !corten_conv2d_shapes_ok(input_dims, filter_dims, output_dims)) {
        return CORTEN_ERROR_ARGUMENT;
    }
    filter_row = filter_dims->h * filter_dims->w * input_dims->c;
    if (input_dims->c < CORTEN_HALF_BLOCK && filter_row <= CORTEN_PATCH_MAX) {
        corten_conv2d_patch(params, quant, input_dims, input, filter_dims, filter, bias, output_dims, output);
    } else {
        corten_conv2d_tiled(params, quant, input_dims, input, filter_dims, filter, bias, output_dims, output);
    }
    return CORTEN_OK;
}

/*
 * The window loops of the simple (one output element at a time) convolutions, written once for the
 * element types: for each image, output pixel and output channel `o`, `ACC_T acc = INIT`; for each
 * filter tap (ky, kx) whose input pixel lies inside the input (padding taps contribute 0), with `x`
 * pointing at that pixel's IN_T channels, the statement TAP; then `out_px[o] = STORE`.  Expects
 * `params`, `input_dims`, `input`, `filter_dims`, `output_dims`, `output` in scope.
 */
#define CORTEN_CONV_WINDOWS(IN_T, OUT_T, ACC_T, INIT, TAP, STORE)                                              \
    do {                                                                                                       \
        int32_t b_, oy_, ox_, o;                                                                               \
        for (b_ = 0; b_ < output_dims->n; b_++) {                                                              \
            const IN_T *in_batch = input + (ptrdiff_t)b_ * input_dims->h * input_dims->w * input_dims->c;       \
            for (oy_ = 0; oy_ < output_dims->h; oy_++) {                                                       \
                for (ox_ = 0; ox_ < output_dims->w; ox_++) {                                                   \
                    OUT_T *out_px = output + (((ptrdiff_t)b_ * output_dims->h + oy_) * output_dims->w + ox_) *   \
                                                 output_dims->c;                                               \
                    corten_window win;                                                                         \
                    corten_window_at(params, oy_, ox_, filter_dims->h, filter_dims->w, input_dims->h,          \
                                     input_dims->w, &win);                                                     \
                    for (o = 0; o < output_dims->c; o++) {                                                     \
                        ACC_T acc = (INIT);                                                                    \
                        int32_t ky, kx;                                                                        \
                        for (ky = win.ky_begin; ky < win.ky_end; ky++) {                                       \
                            const int32_t iy_ = win.iy0 + ky * params->dilation_h;                             \
                            for (kx = win.kx_begin; kx < win.kx_end; kx++) {                                   \
                                const IN_T *x = in_batch + ((ptrdiff_t)iy_ * input_dims->w + win.ix0 +         \
                                                            kx * params->dilation_w) * input_dims->c;          \
                                TAP;                                                                           \
                            }                                                                                  \
                        }                                                                                      \
                        out_px[o] = (STORE);                                                                   \
                    }                                                                                          \
                }                                                                                              \
            }                                                                                                  \
        }                                                                                                      \
    } while (0)

/* STORE of the int8-output simple loops: the int32 accumulator requantized (per channel) to int8. */
#define CORTEN_S8_STORE                                                                                        \
    corten_finish(corten_u32_to_i32(acc), o, quant->multiplier, quant->shift, quant->per_channel,               \
                  params->output_offset, params->activation_min, params->activation_max)

/* Depthwise with depth multiplier 1: channels in blocks, taps outer, so the inner loop runs over
 * contiguous channels of both the input pixel and the filter tap. */
static void corten_depthwise_mult1(const corten_conv_params *p, const corten_quant *q, const corten_dims *in_dims,
                                   const int8_t *input, const corten_dims *f_dims, const int8_t *filter,
                                   const int32_t *bias, const corten_dims *out_dims, int8_t *output)
{
    const int32_t in_h = in_dims->h, in_w = in_dims->w, ch = in_dims->c, kh = f_dims->h, kw = f_dims->w;
    const int16_t off16 = (int16_t)p->input_offset;
    int32_t b, oy, ox;
    for (b = 0; b < in_dims->n; b++) {
        const int8_t *in_batch = input + (ptrdiff_t)b * in_h * in_w * ch;
        for (oy = 0; oy < out_dims->h; oy++) {
            int32_t iy0, ky_begin, ky_end;
            corten_axis_taps(oy, p->stride_h, p->pad_h, p->dilation_h, kh, in_h, &iy0, &ky_begin, &ky_end);
            for (ox = 0; ox < out_dims->w; ox++) {
                int8_t *out_px = output + (((ptrdiff_t)b * out_dims->h + oy) * out_dims->w + ox) * ch;
                int32_t ix0, kx_begin, kx_end, c0;
                corten_axis_taps(ox, p->stride_w, p->pad_w, p->dilation_w, kw, in_w, &ix0, &kx_begin, &kx_end);
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
                            const int8_t *x = in_batch + ((ptrdiff_t)iy * in_w + ix) * ch + c0;
                            const int8_t *w = filter + ((ptrdiff_t)ky * kw + kx) * ch + c0;
                            if (count == CORTEN_BLOCK) {
                                for (j = 0; j < CORTEN_BLOCK; j++) {
                                    acc[j] += corten_widen_s16(corten_mul_s16((int16_t)(x[j] + off16), w[j]));
                                }
                            } else {
                                for (j = 0; j < count; j++) {
                                    acc[j] += corten_widen_s16(corten_mul_s16((int16_t)(x[j] + off16), w[j]));
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

int corten_depthwise_conv2d_s8(const corten_conv_params *params, const corten_quant *quant,
                               const corten_dims *input_dims, const int8_t *input,
                               const corten_dims *filter_dims, const int8_t *filter, const int32_t *bias,
                               const corten_dims *output_dims, int8_t *output)
{
    if (!corten_conv_args_ok(params, quant, input_dims, input, filter_dims, filter, output_dims, output) ||
        !corten_depthwise_shapes_ok(params, input_dims, filter_dims, output_dims)) {
        return CORTEN_ERROR_ARGUMENT;
    }
    if (params->depth_multiplier == 1) {
        corten_depthwise_mult1(params, quant, input_dims, input, filter_dims, filter, bias, output_dims, output);
    } else { /* any depth multiplier: output channel o reads input channel o / depth_multiplier */
        CORTEN_CONV_WINDOWS(int8_t, int8_t, uint32_t, bias != NULL ? (uint32_t)bias[o] : 0u, {
            const int32_t xv = (int32_t)x[o / params->depth_multiplier] + params->input_offset;
            acc += (uint32_t)(xv * (int32_t)filter[((ptrdiff_t)ky * filter_dims->w + kx) * output_dims->c + o]);
        }, CORTEN_S8_STORE);
    }
    return CORTEN_OK;
}

int corten_depthwise_conv2d_s8_in_place(const corten_conv_params *params, const corten_quant *quant,
                                        const corten_dims *input_dims, int8_t *data,
                                        const corten_dims *filter_dims, const int8_t *filter, const int32_t *bias,
                                        const corten_dims *output_dims, int8_t *temp)
{
    const int32_t n = input_dims != NULL ? input_dims->n : 0;
    const int32_t in_h = input_dims != NULL ? input_dims->h : 0, in_w = input_dims != NULL ? input_dims->w : 0;
    const int32_t ch = input_dims != NULL ? input_dims->c : 0;
    int32_t c, b, oy, ox, i;
    if (!corten_conv_args_ok(params, quant, input_dims, data, filter_dims, filter, output_dims, data) || temp == NULL ||
        params->depth_multiplier != 1 || filter_dims->n != 1 || filter_dims->c != ch || output_dims->c != ch ||
        (int64_t)output_dims->h * output_dims->w > (int64_t)in_h * in_w) {
        return CORTEN_ERROR_ARGUMENT;
    }
    for (c = 0; c < ch; c++) {
        const int32_t kh = filter_dims->h, kw = filter_dims->w;
        for (i = 0; i < n * in_h * in_w; i++) { /* input channel c, before any of it is overwritten */
            temp[i] = data[(ptrdiff_t)i * ch + c];
        }
        for (b = 0; b < n; b++) {
            const int8_t *plane = temp + (ptrdiff_t)b * in_h * in_w;
            for (oy = 0; oy < output_dims->h; oy++) {
                const int32_t iy0 = oy * params->stride_h - params->pad_h;
                const int32_t ky_begin = corten_first_valid_tap(iy0, params->dilation_h);
                const int32_t ky_end = corten_end_valid_tap(iy0, params->dilation_h, kh, in_h);
                for (ox = 0; ox < output_dims->w; ox++) {
                    const int32_t ix0 = ox * params->stride_w - params->pad_w;
                    const int32_t kx_begin = corten_first_valid_tap(ix0, params->dilation_w);
                    const int32_t kx_end = corten_end_valid_tap(ix0, params->dilation_w, kw, in_w);
                    uint32_t acc = bias != NULL ? (uint32_t)bias[c] : 0u;
                    int32_t ky, kx;
                    for (ky = ky_begin; ky < ky_end; ky++) {
                        const int32_t iy = iy0 + ky * params->dilation_h;
                        for (kx = kx_begin; kx < kx_end; kx++) {
                            const int32_t ix = ix0 + kx * params->dilation_w;
                            const int32_t xv = (int32_t)plane[(ptrdiff_t)iy * in_w + ix] + params->input_offset;
                            acc += (uint32_t)(xv * (int32_t)filter[((ptrdiff_t)ky * kw + kx) * ch + c]);
                        }
                    }
                    data[(((ptrdiff_t)b * output_dims->h + oy) * output_dims->w + ox) * ch + c] =
                        corten_finish(corten_u32_to_i32(acc), c, quant->multiplier, quant->shift, quant->per_channel,
                                      params->output_offset, params->activation_min, params->activation_max);
                }
            }
        }
    }
    return CORTEN_OK;
}

/*
 * Grouped conv2d: filter [C_out, kH, kW, CK] with groups = C_in / CK; output channel o belongs to
 * group o / (C_out / groups) and reads input channels [g * CK, (g + 1) * CK).  Within a filter tap
 * the group's input channels are contiguous, so each tap is one dot product of CK values.
 */
int corten_grouped_conv2d_s8(const corten_conv_params *params, const corten_quant *quant,
                             const corten_dims *input_dims, const int8_t *input,
                             const corten_dims *filter_dims, const int8_t *filter, const int32_t *bias,
                             const corten_dims *output_dims, int8_t *output)
{
    const corten_conv_params *p = params;
    int32_t in_h, in_w, c_in, ck, kh, kw, c_out, groups, per_group, b, oy, ox, o;
    if (!corten_conv_args_ok(params, quant, input_dims, input, filter_dims, filter, output_dims, output) ||
        filter_dims->c < 1 || filter_dims->n != output_dims->c || input_dims->c < filter_dims->c ||
        input_dims->c % filter_dims->c != 0) {
        return CORTEN_ERROR_ARGUMENT;
    }
    in_h = input_dims->h;
    in_w = input_dims->w;
    c_in = input_dims->c;
    ck = filter_dims->c;
    kh = filter_dims->h;
    kw = filter_dims->w;
    c_out = output_dims->c;
    groups = c_in / ck;
    if (c_out % groups != 0) {
        return CORTEN_ERROR_ARGUMENT;
    }
    per_group = c_out / groups;
    for (b = 0; b < input_dims->n; b++) {
        const int8_t *in_batch = input + (ptrdiff_t)b * in_h * in_w * c_in;
        for (oy = 0; oy < output_dims->h; oy++) {
            for (ox = 0; ox < output_dims->w; ox++) {
                corten_window win;
                int8_t *out_px = output + (((ptrdiff_t)b * output_dims->h + oy) * output_dims->w + ox) * c_out;
                corten_window_at(p, oy, ox, kh, kw, in_h, in_w, &win);
                for (o = 0; o < c_out; o++) {
                    const int32_t first_channel = (o / per_group) * ck;
                    const int8_t *w_o = filter + (ptrdiff_t)o * kh * kw * ck;
                    uint32_t acc = bias != NULL ? (uint32_t)bias[o] : 0u;
                    int32_t ky, kx;
                    for (ky = win.ky_begin; ky < win.ky_end; ky++) {
                        const int32_t iy = win.iy0 + ky * p->dilation_h;
                        for (kx = win.kx_begin; kx < win.kx_end; kx++) {
                            const int32_t ix = win.ix0 + kx * p->dilation_w;
                            const int8_t *x = in_batch + ((ptrdiff_t)iy * in_w + ix) * c_in + first_channel;
                            acc += (uint32_t)corten_dot_offset_s8(x, w_o + ((ptrdiff_t)ky * kw + kx) * ck, ck,
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

/*
 * A8W4 convolutions: int4 filters packed two per byte (corten_s4_at unpacks a nibble in the inner
 * loop), the int8 kernels' arithmetic: acc = bias[o] + sum over in-input taps of (x + input_offset) * w
 * with int32 wrap-around, requantized per channel.  Filter element (o, ky, kx, c) is nibble
 * ((o * kH + ky) * kW + kx) * C_in + c (conv2d, OHWI) or (ky * kW + kx) * C_out + o (depthwise).
 */
int corten_conv2d_s4(const corten_conv_params *params, const corten_quant *quant,
                     const corten_dims *input_dims, const int8_t *input,
                     const corten_dims *filter_dims, const int8_t *packed_filter, const int32_t *bias,
                     const corten_dims *output_dims, int8_t *output)
{
    if (!corten_conv_args_ok(params, quant, input_dims, input, filter_dims, packed_filter, output_dims, output) ||
        !corten_conv2d_shapes_ok(input_dims, filter_dims, output_dims)) {
        return CORTEN_ERROR_ARGUMENT;
    }
    CORTEN_CONV_WINDOWS(int8_t, int8_t, uint32_t, bias != NULL ? (uint32_t)bias[o] : 0u, {
        const int32_t k0 = ((o * filter_dims->h + ky) * filter_dims->w + kx) * input_dims->c;
        int32_t c;
        for (c = 0; c < input_dims->c; c++) {
            acc += (uint32_t)(((int32_t)x[c] + params->input_offset) * corten_s4_at(packed_filter, k0 + c));
        }
    }, CORTEN_S8_STORE);
    return CORTEN_OK;
}

int corten_depthwise_conv2d_s4(const corten_conv_params *params, const corten_quant *quant,
                               const corten_dims *input_dims, const int8_t *input,
                               const corten_dims *filter_dims, const int8_t *packed_filter, const int32_t *bias,
                               const corten_dims *output_dims, int8_t *output)
{
    if (!corten_conv_args_ok(params, quant, input_dims, input, filter_dims, packed_filter, output_dims, output) ||
        !corten_depthwise_shapes_ok(params, input_dims, filter_dims, output_dims)) {
        return CORTEN_ERROR_ARGUMENT;
    }
    CORTEN_CONV_WINDOWS(int8_t, int8_t, uint32_t, bias != NULL ? (uint32_t)bias[o] : 0u, {
        const int32_t xv = (int32_t)x[o / params->depth_multiplier] + params->input_offset;
        acc += (uint32_t)(xv * corten_s4_at(packed_filter, (ky * filter_dims->w + kx) * output_dims->c + o));
    }, CORTEN_S8_STORE);
    return CORTEN_OK;
}

/*
 * 16x8 convolutions (arm_convolve_s16 / arm_depthwise_conv_s16 arithmetic): int16 input and output
 * (zero point 0), int8 filters, int64 bias; acc = bias[o] + sum over in-input taps of x * w in
 * int64, out = clamp(arm_nn_requantize_s64(acc, REDUCE_MULTIPLIER(m[o]), shift[o])).  One window
 * per output pixel and channel: simple loops (the s16 path is for accuracy, not speed).
 */
static int corten_conv_s16_args_ok(const corten_conv_params *p, const corten_quant *q, const corten_dims *in_dims,
                                   const int16_t *in, const corten_dims *f_dims, const int8_t *f,
                                   const corten_dims *out_dims, const int16_t *out)
{
    if (p == NULL || q == NULL || q->multiplier == NULL || q->shift == NULL || in_dims == NULL || in == NULL ||
        f_dims == NULL || f == NULL || out_dims == NULL || out == NULL) {
        return 0;
    }
    return p->stride_h >= 1 && p->stride_w >= 1 && p->dilation_h >= 1 && p->dilation_w >= 1 && p->pad_h >= 0 &&
           p->pad_w >= 0 && f_dims->h >= 1 && f_dims->w >= 1 && in_dims->n == out_dims->n &&
           p->input_offset == 0 && p->output_offset == 0;
}

static int16_t corten_s16_output(int64_t acc, const int64_t *bias, int32_t o, const corten_quant *q,
                                 const corten_conv_params *p)
{
    const int32_t k = q->per_channel ? o : 0;
    const int64_t total = acc + (bias != NULL ? bias[o] : 0);
    return corten_clamp_s16(corten_requantize_s64(total, corten_reduce_multiplier(q->multiplier[k]), q->shift[k]),
                            p->activation_min, p->activation_max);
}

int corten_conv2d_s16(const corten_conv_params *params, const corten_quant *quant,
                      const corten_dims *input_dims, const int16_t *input,
                      const corten_dims *filter_dims, const int8_t *filter, const int64_t *bias,
                      const corten_dims *output_dims, int16_t *output)
{
    if (!corten_conv_s16_args_ok(params, quant, input_dims, input, filter_dims, filter, output_dims, output) ||
        !corten_conv2d_shapes_ok(input_dims, filter_dims, output_dims)) {
        return CORTEN_ERROR_ARGUMENT;
    }
    CORTEN_CONV_WINDOWS(int16_t, int16_t, int64_t, 0, {
        const int8_t *w = filter + (((ptrdiff_t)o * filter_dims->h + ky) * filter_dims->w + kx) * filter_dims->c;
        int32_t dot = 0; /* at most 2**22 per product: exact for C_in < 512 */
        int32_t c;
        for (c = 0; c < input_dims->c; c++) {
            dot += (int32_t)x[c] * (int32_t)w[c];
            if ((c & 255) == 255) {
                acc += dot;
                dot = 0;
            }
        }
        acc += dot;
    }, corten_s16_output(acc, bias, o, quant, params));
    return CORTEN_OK;
}

int corten_depthwise_conv2d_s16(const corten_conv_params *params, const corten_quant *quant,
                                const corten_dims *input_dims, const int16_t *input,
                                const corten_dims *filter_dims, const int8_t *filter, const int64_t *bias,
                                const corten_dims *output_dims, int16_t *output)
{
    if (!corten_conv_s16_args_ok(params, quant, input_dims, input, filter_dims, filter, output_dims, output) ||
        !corten_depthwise_shapes_ok(params, input_dims, filter_dims, output_dims)) {
        return CORTEN_ERROR_ARGUMENT;
    }
    CORTEN_CONV_WINDOWS(int16_t, int16_t, int64_t, 0, {
        const int16_t xv = x[o / params->depth_multiplier];
        const int8_t w = filter[((ptrdiff_t)ky * filter_dims->w + kx) * filter_dims->c + o];
        acc += (int64_t)((int32_t)xv * (int32_t)w);
    }, corten_s16_output(acc, bias, o, quant, params));
    return CORTEN_OK;
}
