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

int corten_avg_pool2d_s8(const corten_pool_params *params, const corten_dims *input_dims, const int8_t *input,
                         const corten_dims *output_dims, int8_t *output)
{
    int32_t b, oy, ox;
    if (!corten_pool_args_ok(params, input_dims, input, output_dims, output)) {
        return CORTEN_ERROR_ARGUMENT;
    }
    for (b = 0; b < input_dims->n; b++) {
        const int32_t ch = input_dims->c;
        const int8_t *in_batch = input + (size_t)b * input_dims->h * input_dims->w * ch;
        for (oy = 0; oy < output_dims->h; oy++) {
            const int32_t iy0 = oy * params->stride_h - params->pad_h;
            const int32_t ky_begin = corten_first_valid_tap(iy0, 1);
            const int32_t ky_end = corten_end_valid_tap(iy0, 1, params->kernel_h, input_dims->h);
            for (ox = 0; ox < output_dims->w; ox++) {
                const int32_t ix0 = ox * params->stride_w - params->pad_w;
                const int32_t kx_begin = corten_first_valid_tap(ix0, 1);
                const int32_t kx_end = corten_end_valid_tap(ix0, 1, params->kernel_w, input_dims->w);
                const int32_t count = (ky_end - ky_begin) * (kx_end - kx_begin);
                int8_t *out_px = output + (((size_t)b * output_dims->h + oy) * output_dims->w + ox) * ch;
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
                    for (ky = ky_begin; ky < ky_end; ky++) {
                        for (kx = kx_begin; kx < kx_end; kx++) {
                            const int8_t *x = in_batch + ((size_t)(iy0 + ky) * input_dims->w + (ix0 + kx)) * ch + c0;
                            for (j = 0; j < n; j++) {
                                sum[j] += x[j];
                            }
                        }
                    }
                    for (j = 0; j < n; j++) {
                        int32_t avg = (sum[j] > 0 ? sum[j] + count / 2 : sum[j] - count / 2) / count;
                        avg = avg < params->activation_min ? params->activation_min : avg;
                        avg = avg > params->activation_max ? params->activation_max : avg;
                        out_px[c0 + j] = (int8_t)avg;
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
        const int8_t *in_batch = input + (size_t)b * input_dims->h * input_dims->w * ch;
        for (oy = 0; oy < output_dims->h; oy++) {
            const int32_t iy0 = oy * params->stride_h - params->pad_h;
            const int32_t ky_begin = corten_first_valid_tap(iy0, 1);
            const int32_t ky_end = corten_end_valid_tap(iy0, 1, params->kernel_h, input_dims->h);
            for (ox = 0; ox < output_dims->w; ox++) {
                const int32_t ix0 = ox * params->stride_w - params->pad_w;
                const int32_t kx_begin = corten_first_valid_tap(ix0, 1);
                const int32_t kx_end = corten_end_valid_tap(ix0, 1, params->kernel_w, input_dims->w);
                int8_t *out_px = output + (((size_t)b * output_dims->h + oy) * output_dims->w + ox) * ch;
                int32_t c;
                if (ky_end <= ky_begin || kx_end <= kx_begin) {
                    return CORTEN_ERROR_ARGUMENT;
                }
                for (c = 0; c < ch; c++) {
                    int32_t best = -128;
                    int32_t ky, kx;
                    for (ky = ky_begin; ky < ky_end; ky++) {
                        for (kx = kx_begin; kx < kx_end; kx++) {
                            const int32_t v = in_batch[((size_t)(iy0 + ky) * input_dims->w + (ix0 + kx)) * ch + c];
                            best = v > best ? v : best;
                        }
                    }
                    best = best < params->activation_min ? params->activation_min : best;
                    best = best > params->activation_max ? params->activation_max : best;
                    out_px[c] = (int8_t)best;
                }
            }
        }
    }
    return CORTEN_OK;
}
