/*
 * corten_internal.h - helpers shared by Corten's portable kernels (not part of the public API).
 *
 * Dot products accumulate in uint32 (two's-complement wrap, no signed overflow) and are split
 * into fixed-size blocks so that compilers vectorise them at -O2.
 */
#ifndef CORTEN_INTERNAL_H
#define CORTEN_INTERNAL_H

#include <stdint.h>

#include "corten_fixed_point.h"

#define CORTEN_BLOCK 16

/** sum_k (x[k] + offset) * w[k], wrapped to int32. */
static inline int32_t corten_dot_offset_s8(const int8_t *x, const int8_t *w, int32_t n, int32_t offset)
{
    uint32_t sum = 0;
    int32_t k = 0;
    for (; k + CORTEN_BLOCK <= n; k += CORTEN_BLOCK) {
        uint32_t part = 0;
        int32_t j;
        for (j = 0; j < CORTEN_BLOCK; j++) {
            part += (uint32_t)(((int32_t)x[k + j] + offset) * (int32_t)w[k + j]);
        }
        sum += part;
    }
    for (; k < n; k++) {
        sum += (uint32_t)(((int32_t)x[k] + offset) * (int32_t)w[k]);
    }
    return corten_u32_to_i32(sum);
}

/** Four dot products sharing x: out[r] += sum_k (x[k] + offset) * w[r * w_stride + k] (wrapping). */
static inline void corten_dot4_offset_s8(const int8_t *x, const int8_t *w, int32_t w_stride, int32_t n,
                                         int32_t offset, uint32_t out[4])
{
    const int8_t *w0 = w;
    const int8_t *w1 = w + w_stride;
    const int8_t *w2 = w + 2 * w_stride;
    const int8_t *w3 = w + 3 * w_stride;
    uint32_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    int32_t k = 0;
    for (; k + CORTEN_BLOCK <= n; k += CORTEN_BLOCK) {
        uint32_t p0 = 0, p1 = 0, p2 = 0, p3 = 0;
        int32_t j;
        for (j = 0; j < CORTEN_BLOCK; j++) {
            const int32_t xv = (int32_t)x[k + j] + offset;
            p0 += (uint32_t)(xv * (int32_t)w0[k + j]);
            p1 += (uint32_t)(xv * (int32_t)w1[k + j]);
            p2 += (uint32_t)(xv * (int32_t)w2[k + j]);
            p3 += (uint32_t)(xv * (int32_t)w3[k + j]);
        }
        s0 += p0;
        s1 += p1;
        s2 += p2;
        s3 += p3;
    }
    for (; k < n; k++) {
        const int32_t xv = (int32_t)x[k] + offset;
        s0 += (uint32_t)(xv * (int32_t)w0[k]);
        s1 += (uint32_t)(xv * (int32_t)w1[k]);
        s2 += (uint32_t)(xv * (int32_t)w2[k]);
        s3 += (uint32_t)(xv * (int32_t)w3[k]);
    }
    out[0] += s0;
    out[1] += s1;
    out[2] += s2;
    out[3] += s3;
}

/** First tap index k in [0, kernel) with 0 <= start + k * dilation (start may be negative). */
static inline int32_t corten_first_valid_tap(int32_t start, int32_t dilation)
{
    return start >= 0 ? 0 : (-start + dilation - 1) / dilation;
}

/** One past the last tap index k < kernel with start + k * dilation < size. */
static inline int32_t corten_end_valid_tap(int32_t start, int32_t dilation, int32_t kernel, int32_t size)
{
    int32_t end;
    if (start >= size) {
        return 0;
    }
    end = (size - start + dilation - 1) / dilation;
    return end < kernel ? end : kernel;
}

/** Requantize an accumulator for output channel `channel` and narrow to int8. */
static inline int8_t corten_finish(int32_t acc, int32_t channel, const int32_t *multiplier, const int32_t *shift,
                                   int32_t per_channel, int32_t output_offset, int32_t act_min, int32_t act_max)
{
    const int32_t q = per_channel ? channel : 0;
    return corten_offset_clamp(corten_requantize(acc, multiplier[q], shift[q]), output_offset, act_min, act_max);
}

#endif /* CORTEN_INTERNAL_H */
