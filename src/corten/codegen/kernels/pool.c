/*
 * pool.c - Corten portable int8 pooling: average (arm_avgpool_s8) and max (arm_max_pool_s8).
 *
 * Windows only count the elements inside the input (padding excluded).  The average rounds as
 * CMSIS-NN does: (sum > 0 ? sum + count / 2 : sum - count / 2) / count with C's truncating division.
 */
#include <stddef.h>

#include "corten_internal.h"
#include "corten_kernels.h"

static int corten_pool_args_ok(const corten_pool_params *p, const corten_dims *in_dims, const int8_t *in,
                               const corten_dims *out_dims, const int8_t *out)
{
    if (p == NULL || in_dims == NULL || in == NULL || out_dims == NULL || out == NULL) {
        return 0;
    }
    return p->kernel_h >= 1 && p->kernel_w >= 1 && p->stride_h >= 1 && p->stride_w >= 1 && p->pad_h >= 0 &&
           p->pad_w >= 0 && in_dims->n == out_dims->n && in_dims->c == out_dims->c;
}

/* The taps of the window at output (oy, ox) that fall inside the input: rows iy0 + [ky_begin, ky_end),
 * columns ix0 + [kx_begin, kx_end).  Shared by both pools, which exclude padding the same way. */
typedef struct {
    int32_t iy0, ix0, ky_begin, ky_end, kx_begin, kx_end;
} corten_pool_window;

static corten_pool_window corten_pool_window_at(const corten_pool_params *p, const corten_dims *in_dims,
                                                int32_t oy, int32_t ox)
{
    corten_pool_window win;
    win.iy0 = oy * p->stride_h - p->pad_h;
    win.ix0 = ox * p->stride_w - p->pad_w;
    win.ky_begin = corten_first_valid_tap(win.iy0, 1);
    win.ky_end = corten_end_valid_tap(win.iy0, 1, p->kernel_h, in_dims->h);
    win.kx_begin = corten_first_valid_tap(win.ix0, 1);
    win.kx_end = corten_end_valid_tap(win.ix0, 1, p->kernel_w, in_dims->w);
    return win;
}

static int8_t corten_pool_clamp(int32_t v, const corten_pool_params *p)
{
    v = v < p->activation_min ? p->activation_min : v;
    return (int8_t)(v > p->activation_max ? p->activation_max : v);
}

int corten_avg_pool2d_s8(const corten_pool_params *params, const corten_dims *input_dims, const int8_t *input,
                         const corten_dims *output_dims, int8_t *output)
{
    int32_t b, oy, ox;
    if (!corten_pool_args_ok(params, input_dims, input, output_dims, output)) {
        return CORTEN_ERROR_ARGUMENT;
    }
    for (b = 0; b < input_dims->n; b++) {
        const int32_t ch = input_dims->c;
        const int8_t *in_batch = input + (ptrdiff_t)b * input_dims->h * input_dims->w * ch;
        for (oy = 0; oy < output_dims->h; oy++) {
            for (ox = 0; ox < output_dims->w; ox++) {
                const corten_pool_window win = corten_pool_window_at(params, input_dims, oy, ox);
                const int32_t count = (win.ky_end - win.ky_begin) * (win.kx_end - win.kx_begin);
                int8_t *out_px = output + (((ptrdiff_t)b * output_dims->h + oy) * output_dims->w + ox) * ch;
                int32_t c0;
                if (count <= 0) {
                    return CORTEN_ERROR_ARGUMENT;
                }
                for (c0 = 0; c0 < ch; c0 += CORTEN_BLOCK) {
                    const int32_t n = (ch - c0) < CORTEN_BLOCK ? (ch - c0) : CORTEN_BLOCK;
                    int32_t sum[CORTEN_BLOCK];
                    int32_t ky, kx, j;
                    for (j = 0; j < CORTEN_BLOCK; j++) {
                        sum[j] = 0;
                    }
                    for (ky = win.ky_begin; ky < win.ky_end; ky++) {
                        for (kx = win.kx_begin; kx < win.kx_end; kx++) {
                            const int8_t *x =
                                in_batch + ((ptrdiff_t)(win.iy0 + ky) * input_dims->w + (win.ix0 + kx)) * ch + c0;
                            for (j = 0; j < n; j++) {
                                sum[j] += x[j];
                            }
                        }
                    }
                    for (j = 0; j < n; j++) {
                        const int32_t avg = (sum[j] > 0 ? sum[j] + count / 2 : sum[j] - count / 2) / count;
                        out_px[c0 + j] = corten_pool_clamp(avg, params);
                    }
                }
            }
        }
    }
    return CORTEN_OK;
}

int corten_max_pool2d_s8(const corten_pool_params *params, const corten_dims *input_dims, const int8_t *input,
                         const corten_dims *output_dims, int8_t *output)
{
    int32_t b, oy, ox;
    if (!corten_pool_args_ok(params, input_dims, input, output_dims, output)) {
        return CORTEN_ERROR_ARGUMENT;
    }
    for (b = 0; b < input_dims->n; b++) {
        const int32_t ch = input_dims->c;
        const int8_t *in_batch = input + (ptrdiff_t)b * input_dims->h * input_dims->w * ch;
        for (oy = 0; oy < output_dims->h; oy++) {
            for (ox = 0; ox < output_dims->w; ox++) {
                const corten_pool_window win = corten_pool_window_at(params, input_dims, oy, ox);
                int8_t *out_px = output + (((ptrdiff_t)b * output_dims->h + oy) * output_dims->w + ox) * ch;
                int32_t c;
                if (win.ky_end <= win.ky_begin || win.kx_end <= win.kx_begin) {
                    return CORTEN_ERROR_ARGUMENT;
                }
                for (c = 0; c < ch; c++) {
                    int32_t best = -128;
                    int32_t ky, kx;
                    for (ky = win.ky_begin; ky < win.ky_end; ky++) {
                        for (kx = win.kx_begin; kx < win.kx_end; kx++) {
                            const int32_t v =
                                in_batch[((ptrdiff_t)(win.iy0 + ky) * input_dims->w + (win.ix0 + kx)) * ch + c];
                            best = v > best ? v : best;
                        }
                    }
                    out_px[c] = corten_pool_clamp(best, params);
                }
            }
        }
    }
    return CORTEN_OK;
}
