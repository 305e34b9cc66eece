/*
 * pool.c - Corten portable int8 pooling (see corten/ops/pool.py): average (arm_avgpool_s8
 * arithmetic) and max (arm_max_pool_s8), with PyTorch's padding, ceil_mode, count_include_pad,
 * divisor_override and (max) dilation; adaptive average and max pools with PyTorch's windows.
 *
 * Sums only read elements inside the input.  The average rounds as CMSIS-NN does:
 * (sum > 0 ? sum + d / 2 : sum - d / 2) / d with C's truncating division, d the window's divisor.
 */
#include <stddef.h>
#include <string.h>

#include "corten_internal.h"
#include "corten_kernels.h"

static int corten_pool_args_ok(const corten_pool_params *p, const corten_dims *in_dims, const void *in,
                               const corten_dims *out_dims, const void *out)
{
    if (p == NULL || in_dims == NULL || in == NULL || out_dims == NULL || out == NULL) {
        return 0;
    }
    return p->kernel_h >= 1 && p->kernel_w >= 1 && p->stride_h >= 1 && p->stride_w >= 1 && p->pad_h >= 0 &&
           p->pad_w >= 0 && p->pad_bottom >= 0 && p->pad_right >= 0 && p->dilation_h >= 1 && p->dilation_w >= 1 &&
           p->divisor_override >= 0 && in_dims->n == out_dims->n && in_dims->c == out_dims->c;
}

/* The taps of the window at output (oy, ox) that fall inside the input: rows iy0 + dilation_h * [ky_begin,
 * ky_end), columns ix0 + dilation_w * [kx_begin, kx_end).  Shared by both pools. */
typedef struct {
    int32_t iy0, ix0, ky_begin, ky_end, kx_begin, kx_end;
} corten_pool_window;

static corten_pool_window corten_pool_window_at(const corten_pool_params *p, const corten_dims *in_dims,
                                                int32_t oy, int32_t ox)
{
    corten_pool_window win;
    corten_axis_taps(oy, p->stride_h, p->pad_h, p->dilation_h, p->kernel_h, in_dims->h, &win.iy0, &win.ky_begin,
                     &win.ky_end);
    corten_axis_taps(ox, p->stride_w, p->pad_w, p->dilation_w, p->kernel_w, in_dims->w, &win.ix0, &win.kx_begin,
                     &win.kx_end);
    return win;
}

static int32_t corten_min_i32(int32_t a, int32_t b)
{
    return a < b ? a : b;
}

/* The average-pool divisor of a window (see corten_pool_params). */
static int32_t corten_avg_divisor(const corten_pool_params *p, const corten_dims *in_dims,
                                  const corten_pool_window *win)
{
    if (p->divisor_override > 0) {
        return p->divisor_override;
    }
    if (p->count_include_pad) {
        const int32_t rows = corten_min_i32(win->iy0 + p->kernel_h, in_dims->h + p->pad_bottom) - win->iy0;
        const int32_t cols = corten_min_i32(win->ix0 + p->kernel_w, in_dims->w + p->pad_right) - win->ix0;
        return rows * cols;
    }
    return (win->ky_end - win->ky_begin) * (win->kx_end - win->kx_begin);
}

/*
 * The walk every windowed pool makes, written once: CORTEN_POOL_WINDOWS(in_type, out_type, out_step, body)
 * runs `body` (a block) for each batch and output pixel (oy, ox) with, in scope: `ch` (= input_dims->c),
 * `in_batch` (the batch's input), `win` (the taps of the window inside the input, corten_pool_window_at)
 * and `out_px` (the pixel's first of out_step * ch output elements).  An empty window returns
 * CORTEN_ERROR_ARGUMENT from the enclosing function.  Needs `params`, `input_dims`, `input`,
 * `output_dims` and `output` in scope.
 */
#define CORTEN_POOL_WINDOWS(in_type, out_type, out_step, ...)                                              \
    for (int32_t b = 0; b < input_dims->n; b++) {                                                          \
        const int32_t ch = input_dims->c;                                                                  \
        const in_type *in_batch = input + (ptrdiff_t)b * input_dims->h * input_dims->w * ch;               \
        for (int32_t oy = 0; oy < output_dims->h; oy++) {                                                  \
            for (int32_t ox = 0; ox < output_dims->w; ox++) {                                              \
                const corten_pool_window win = corten_pool_window_at(params, input_dims, oy, ox);          \
                out_type *out_px =                                                                         \
                    output + (out_step) * ((((ptrdiff_t)b * output_dims->h + oy) * output_dims->w + ox) * ch); \
                if (win.ky_end <= win.ky_begin || win.kx_end <= win.kx_begin) {                            \
                    return CORTEN_ERROR_ARGUMENT;                                                          \
                }                                                                                          \
                __VA_ARGS__                                                                                \
            }                                                                                              \
        }                                                                                                  \
    }

/*
 * Average pooling is the same for every element width (int8; 16x8: int16 values, zero point 0 - the
 * window sums stay in int32 since a window has fewer than 65,536 taps).  CORTEN_AVG_BLOCK defines
 * `name`: sum the channels [c0, c0 + n) of the input rows [y0, y1) x columns [x0, x1) (dilation 1),
 * each value minus zp, and write zp + their rounded averages by `divisor`.  CORTEN_AVG_POOL defines
 * the pool over every window with it.
 */
#define CORTEN_AVG_BLOCK(name, type)                                                                       \
    static void name(const type *in_batch, int32_t in_w, int32_t ch, int32_t y0, int32_t y1, int32_t x0,   \
                     int32_t x1, int32_t divisor, int32_t zp, int32_t act_min, int32_t act_max, type *out_px) \
    {                                                                                                      \
        int32_t c0;                                                                                        \
        for (c0 = 0; c0 < ch; c0 += CORTEN_BLOCK) {                                                        \
            const int32_t n = (ch - c0) < CORTEN_BLOCK ? (ch - c0) : CORTEN_BLOCK;                         \
            int32_t sum[CORTEN_BLOCK];                                                                     \
            int32_t y, x, j;                                                                               \
            for (j = 0; j < CORTEN_BLOCK; j++) {                                                           \
                sum[j] = 0;                                                                                \
            }                                                                                              \
            for (y = y0; y < y1; y++) {                                                                    \
                for (x = x0; x < x1; x++) {                                                                \
                    const type *v = in_batch + ((ptrdiff_t)y * in_w + x) * ch + c0;                        \
                    for (j = 0; j < n; j++) {                                                              \
                        sum[j] += v[j] - zp;                                                               \
                    }                                                                                      \
                }                                                                                          \
            }                                                                                              \
            for (j = 0; j < n; j++) {                                                                      \
                const int32_t avg = (sum[j] > 0 ? sum[j] + divisor / 2 : sum[j] - divisor / 2) / divisor;  \
                out_px[c0 + j] = (type)corten_clamp_i32(avg + zp, act_min, act_max);                       \
            }                                                                                              \
        }                                                                                                  \
    }

#define CORTEN_AVG_POOL(name, type, block)                                                                 \
    int name(const corten_pool_params *params, const corten_dims *input_dims, const type *input,           \
             const corten_dims *output_dims, type *output)                                                 \
    {                                                                                                      \
        int32_t zp;                                                                                        \
        if (!corten_pool_args_ok(params, input_dims, input, output_dims, output) || params->dilation_h != 1 || \
            params->dilation_w != 1) {                                                                     \
            return CORTEN_ERROR_ARGUMENT;                                                                  \
        }                                                                                                  \
        /* CMSIS-NN's average (divisor = element count) sums the raw values; PyTorch's other divisors     \
         * need the real values, q - zero_point (the padding being the real 0). */                        \
        zp = (params->count_include_pad || params->divisor_override > 0) ? params->zero_point : 0;         \
        CORTEN_POOL_WINDOWS(type, type, 1, {                                                               \
            const int32_t divisor = corten_avg_divisor(params, input_dims, &win);                          \
            if (divisor <= 0) {                                                                            \
                return CORTEN_ERROR_ARGUMENT;                                                              \
            }                                                                                              \
            block(in_batch, input_dims->w, ch, win.iy0 + win.ky_begin, win.iy0 + win.ky_end,              \
                  win.ix0 + win.kx_begin, win.ix0 + win.kx_end, divisor, zp, params->activation_min,       \
                  params->activation_max, out_px);                                                         \
        })                                                                                                 \
        return CORTEN_OK;                                                                                  \
    }

CORTEN_AVG_BLOCK(corten_avg_block, int8_t)
CORTEN_AVG_BLOCK(corten_avg_block_s16, int16_t)
CORTEN_AVG_POOL(corten_avg_pool2d_s8, int8_t, corten_avg_block)
CORTEN_AVG_POOL(corten_avg_pool2d_s16, int16_t, corten_avg_block_s16)

/* Max pooling is the same for every element width: CORTEN_MAX_POOL defines it once (``lowest``: the
 * type's smallest value). */
#define CORTEN_MAX_POOL(name, type, lowest)                                                                \
    int name(const corten_pool_params *params, const corten_dims *input_dims, const type *input,           \
             const corten_dims *output_dims, type *output)                                                 \
    {                                                                                                      \
        if (!corten_pool_args_ok(params, input_dims, input, output_dims, output)) {                        \
            return CORTEN_ERROR_ARGUMENT;                                                                  \
        }                                                                                                  \
        CORTEN_POOL_WINDOWS(type, type, 1, {                                                               \
            int32_t c;                                                                                     \
            for (c = 0; c < ch; c++) {                                                                     \
                int32_t best = (lowest);                                                                   \
                int32_t ky, kx;                                                                            \
                for (ky = win.ky_begin; ky < win.ky_end; ky++) {                                           \
                    const int32_t iy = win.iy0 + ky * params->dilation_h;                                  \
                    for (kx = win.kx_begin; kx < win.kx_end; kx++) {                                       \
                        const int32_t ix = win.ix0 + kx * params->dilation_w;                              \
                        const int32_t v = in_batch[((ptrdiff_t)iy * input_dims->w + ix) * ch + c];         \
                        best = v > best ? v : best;                                                        \
                    }                                                                                      \
                }                                                                                          \
                out_px[c] = (type)corten_clamp_i32(best, params->activation_min, params->activation_max);  \
            }                                                                                              \
        })                                                                                                 \
        return CORTEN_OK;                                                                                  \
    }

CORTEN_MAX_POOL(corten_max_pool2d_s8, int8_t, -128)
CORTEN_MAX_POOL(corten_max_pool2d_s16, int16_t, -32768)

int corten_max_pool2d_indices_s8(const corten_pool_params *params, const corten_dims *input_dims, const int8_t *input,
                                 const corten_dims *output_dims, int8_t *indices)
{
    int8_t *const output = indices; /* int32 indices, 4 little-endian bytes each like the targets' */
    if (indices == NULL ||
        !corten_pool_args_ok(params, input_dims, input, output_dims, indices)) {
        return CORTEN_ERROR_ARGUMENT;
    }
    CORTEN_POOL_WINDOWS(int8_t, int8_t, 4, {
        int32_t c, ky, kx;
        for (c = 0; c < ch; c++) {
            int32_t best = -129, at = 0; /* the first tap always wins over -129 */
            for (ky = win.ky_begin; ky < win.ky_end; ky++) {
                const int32_t iy = win.iy0 + ky * params->dilation_h;
                for (kx = win.kx_begin; kx < win.kx_end; kx++) {
                    const int32_t ix = win.ix0 + kx * params->dilation_w;
                    const int32_t v = in_batch[((ptrdiff_t)iy * input_dims->w + ix) * ch + c];
                    if (v > best) { /* strictly larger: the first maximum stays */
                        best = v;
                        at = iy * input_dims->w + ix;
                    }
                }
            }
            memcpy(out_px + 4 * c, &at, sizeof at); /* int32, little-endian like the targets */
        }
    })
    return CORTEN_OK;
}

/* PyTorch's adaptive window i of `out` along a dim of `size`: [floor(i*size/out), ceil((i+1)*size/out)). */
static int32_t corten_adaptive_start(int32_t i, int32_t size, int32_t out)
{
    return (int32_t)(((int64_t)i * size) / out);
}

static int32_t corten_adaptive_end(int32_t i, int32_t size, int32_t out)
{
    return (int32_t)(((int64_t)(i + 1) * size + out - 1) / out);
}

static int corten_adaptive_args_ok(int32_t act_min, int32_t act_max, const corten_dims *in_dims, const int8_t *in,
                                   const corten_dims *out_dims, const int8_t *out)
{
    return in_dims != NULL && in != NULL && out_dims != NULL && out != NULL && act_min <= act_max &&
           in_dims->n == out_dims->n && in_dims->c == out_dims->c && out_dims->h >= 1 && out_dims->w >= 1 &&
           in_dims->h >= 1 && in_dims->w >= 1;
}

/* PyTorch's adaptive pools: the average (take_max 0) or the maximum of each adaptive window. */
static int corten_adaptive_pool2d_s8(int take_max, int32_t activation_min, int32_t activation_max,
                                     const corten_dims *input_dims, const int8_t *input, const corten_dims *output_dims,
                                     int8_t *output)
{
    int32_t b, oy, ox;
    if (!corten_adaptive_args_ok(activation_min, activation_max, input_dims, input, output_dims, output)) {
        return CORTEN_ERROR_ARGUMENT;
    }
    for (b = 0; b < input_dims->n; b++) {
        const int32_t ch = input_dims->c;
        const int8_t *in_batch = input + (ptrdiff_t)b * input_dims->h * input_dims->w * ch;
        for (oy = 0; oy < output_dims->h; oy++) {
            const int32_t y0 = corten_adaptive_start(oy, input_dims->h, output_dims->h);
            const int32_t y1 = corten_adaptive_end(oy, input_dims->h, output_dims->h);
            for (ox = 0; ox < output_dims->w; ox++) {
                const int32_t x0 = corten_adaptive_start(ox, input_dims->w, output_dims->w);
                const int32_t x1 = corten_adaptive_end(ox, input_dims->w, output_dims->w);
                int8_t *out_px = output + (((ptrdiff_t)b * output_dims->h + oy) * output_dims->w + ox) * ch;
                int32_t c, y, x;
                if (!take_max) {
                    corten_avg_block(in_batch, input_dims->w, ch, y0, y1, x0, x1, (y1 - y0) * (x1 - x0), 0,
                                     activation_min, activation_max, out_px);
                    continue;
                }
                for (c = 0; c < ch; c++) {
                    int32_t best = -128;
                    for (y = y0; y < y1; y++) {
                        for (x = x0; x < x1; x++) {
                            const int32_t v = in_batch[((ptrdiff_t)y * input_dims->w + x) * ch + c];
                            best = v > best ? v : best;
                        }
                    }
                    out_px[c] = (int8_t)corten_clamp_i32(best, activation_min, activation_max);
                }
            }
        }
    }
    return CORTEN_OK;
}

int corten_adaptive_avg_pool2d_s8(int32_t activation_min, int32_t activation_max, const corten_dims *input_dims,
                                  const int8_t *input, const corten_dims *output_dims, int8_t *output)
{
    return corten_adaptive_pool2d_s8(0, activation_min, activation_max, input_dims, input, output_dims, output);
}

int corten_adaptive_max_pool2d_s8(int32_t activation_min, int32_t activation_max, const corten_dims *input_dims,
                                  const int8_t *input, const corten_dims *output_dims, int8_t *output)
{
    return corten_adaptive_pool2d_s8(1, activation_min, activation_max, input_dims, input, output_dims, output);
}
