/*
 * corten_internal.h - helpers shared by Corten's portable kernels (not part of the public API).
 *
 * Dot products accumulate in uint32 (two's-complement wrap, no signed overflow) and are split
 * into fixed-size blocks so that compilers vectorise them at -O2.  A product
 * (x + input_offset) * w has |x + input_offset| <= 255 and |w| <= 128, so it lies in
 * [-32640, 32640] and is computed exactly in int16 (corten_mul_s16), which lets compilers use
 * 16-bit SIMD multiplies.
 */
#ifndef CORTEN_INTERNAL_H
#define CORTEN_INTERNAL_H

#include <stdint.h>

#include "corten_fixed_point.h"
#include "corten_kernels.h"

#define CORTEN_BLOCK 16
#define CORTEN_HALF_BLOCK 8

/** TFLite's lut_lookup_with_interpolation of an int16 value q in a 513-entry int16 table, the slope
 *  in int32 (corten/ops/_lut16.py): table[256 + (q >> 7)] + ((slope * (q & 0x7f) + 64) >> 7). */
static inline int16_t corten_lut16_lookup(int32_t q, const int16_t *table)
{
    const int32_t index = (q + 32768) >> 7; /* 256 + (q >> 7), with no negative value shifted */
    const int32_t base = table[index];
    const int32_t t = ((int32_t)table[index + 1] - base) * (q & 0x7F) + 64;
    return (int16_t)(base + corten_asr32(t, 7));
}

/** (x + offset) * w for an int8 x, an offset in [-127, 128] and an int8 w: exact in int16. */
static inline int16_t corten_mul_s16(int16_t x_plus_offset, int8_t w)
{
    return (int16_t)(x_plus_offset * (int16_t)w);
}

/** An int16 product as the uint32 addend of a wrapping sum (two's complement; no sign conversion). */
static inline uint32_t corten_widen_s16(int16_t v)
{
    const int32_t wide = v;
    return (uint32_t)wide;
}

/** sum_k (x[k] + offset) * w[k], wrapped to int32. */
static inline int32_t corten_dot_offset_s8(const int8_t *x, const int8_t *w, int32_t n, int32_t offset)
{
    const int16_t off16 = (int16_t)offset;
    uint32_t sum = 0;
    int32_t k = 0;
/* Whole chunks of `len` inputs (a constant: host compilers turn a chunk into SIMD multiply-adds). */
#define CORTEN_DOT_CHUNKS(len)                                                                         \
    for (; k + (len) <= n; k += (len)) {                                                               \
        uint32_t part = 0;                                                                             \
        int32_t j;                                                                                     \
        for (j = 0; j < (len); j++) {                                                                  \
            part += corten_widen_s16(corten_mul_s16((int16_t)(x[k + j] + off16), w[k + j]));           \
        }                                                                                              \
        sum += part;                                                                                   \
    }
    CORTEN_DOT_CHUNKS(CORTEN_BLOCK)
    CORTEN_DOT_CHUNKS(CORTEN_HALF_BLOCK)
#undef CORTEN_DOT_CHUNKS
    for (; k < n; k++) {
        sum += corten_widen_s16(corten_mul_s16((int16_t)(x[k] + off16), w[k]));
    }
    return corten_u32_to_i32(sum);
}

/*
 * CORTEN_DOT_BLOCKS selects how corten_dot4_offset_s8 is written; both compute the same wrapping
 * sums, byte for byte.  1: 16-wide blocks of int16 products, which host compilers turn into SIMD
 * multiply-adds.  0: one plain int32 multiply-accumulate per tap, the fastest form for Cortex-M
 * compilers: with the blocks gcc 12 shuffles the four sums through the stack on Cortex-M55 (6.75
 * instead of 4.5 instructions per MAC on the 1x1 convolutions of MobileNetV2, QEMU M55).  Default:
 * 0 on Arm, 1 elsewhere; define it to override.
 */
#ifndef CORTEN_DOT_BLOCKS
#if defined(__arm__) || defined(__thumb__)
#define CORTEN_DOT_BLOCKS 0
#else
#define CORTEN_DOT_BLOCKS 1
#endif
#endif

/** Four dot products sharing x: out[r] += sum_k (x[k] + offset) * w[r * w_stride + k] (wrapping). */
#if CORTEN_DOT_BLOCKS
static inline void corten_dot4_offset_s8(const int8_t *x, const int8_t *w, int32_t w_stride, int32_t n,
                                         int32_t offset, uint32_t out[4])
{
    /* four blocked single dot products (each vectorised; the wrapping sums do not depend on the order) */
    int32_t r;
    for (r = 0; r < 4; r++) {
        out[r] += (uint32_t)corten_dot_offset_s8(x, w + r * w_stride, n, offset);
    }
}
#else
static inline void corten_dot4_offset_s8(const int8_t *x, const int8_t *w, int32_t w_stride, int32_t n,
                                         int32_t offset, uint32_t out[4])
{
    const int8_t *w0 = w;
    const int8_t *w1 = w + w_stride;
    const int8_t *w2 = w + 2 * w_stride;
    const int8_t *w3 = w + 3 * w_stride;
    uint32_t s0 = out[0], s1 = out[1], s2 = out[2], s3 = out[3];
    int32_t k;
    for (k = 0; k < n; k++) {
        /* |x + offset| <= 256 and |w| <= 128: every product fits in int32. */
        const int32_t xv = (int32_t)x[k] + offset;
        s0 += (uint32_t)(xv * (int32_t)w0[k]);
        s1 += (uint32_t)(xv * (int32_t)w1[k]);
        s2 += (uint32_t)(xv * (int32_t)w2[k]);
        s3 += (uint32_t)(xv * (int32_t)w3[k]);
    }
    out[0] = s0;
    out[1] = s1;
    out[2] = s2;
    out[3] = s3;
}
#endif

/**
 * Four dot products of an int16 patch (values x + input_offset, already offset) with int8 rows:
 * out[r] += sum_k patch[k] * w[r * w_stride + k], for n a multiple of CORTEN_BLOCK.
 */
static inline void corten_dot4_patch(const int16_t *patch, const int8_t *w, int32_t w_stride, int32_t n,
                                     uint32_t out[4])
{
    const int8_t *w0 = w;
    const int8_t *w1 = w + w_stride;
    const int8_t *w2 = w + 2 * w_stride;
    const int8_t *w3 = w + 3 * w_stride;
    uint32_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    int32_t k;
    for (k = 0; k + CORTEN_BLOCK <= n; k += CORTEN_BLOCK) {
        uint32_t p0 = 0, p1 = 0, p2 = 0, p3 = 0;
        int32_t j;
        for (j = 0; j < CORTEN_BLOCK; j++) {
            const int16_t xv = patch[k + j];
            p0 += corten_widen_s16(corten_mul_s16(xv, w0[k + j]));
            p1 += corten_widen_s16(corten_mul_s16(xv, w1[k + j]));
            p2 += corten_widen_s16(corten_mul_s16(xv, w2[k + j]));
            p3 += corten_widen_s16(corten_mul_s16(xv, w3[k + j]));
        }
        s0 += p0;
        s1 += p1;
        s2 += p2;
        s3 += p3;
    }
    out[0] += s0;
    out[1] += s1;
    out[2] += s2;
    out[3] += s3;
}

/** sum_k patch[k] * w[k] over n values (any n). */
static inline uint32_t corten_dot_patch(const int16_t *patch, const int8_t *w, int32_t n)
{
    uint32_t sum = 0;
    int32_t k;
    for (k = 0; k < n; k++) {
        sum += corten_widen_s16(corten_mul_s16(patch[k], w[k]));
    }
    return sum;
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

/** The taps along one axis of the window of output coordinate `o` (stride, pad, dilation and kernel,
 *  over an input axis of `size`): *origin = o * stride - pad, the input coordinate of tap 0 (negative in
 *  the padding), and the tap indices [*begin, *end) that fall inside the input. */
static inline void corten_axis_taps(int32_t o, int32_t stride, int32_t pad, int32_t dilation, int32_t kernel,
                                    int32_t size, int32_t *origin, int32_t *begin, int32_t *end)
{
    *origin = o * stride - pad;
    *begin = corten_first_valid_tap(*origin, dilation);
    *end = corten_end_valid_tap(*origin, dilation, kernel, size);
}

/** Element k of an int4 array packed two per byte in CMSIS-NN's s4 order (element 2j in the low
 *  nibble of byte j, 2j + 1 in the high one; two's complement nibbles). */
static inline int32_t corten_s4_at(const int8_t *packed, int32_t k)
{
    const int32_t nibble = ((int32_t)(uint8_t)packed[k >> 1] >> ((k & 1) << 2)) & 0xF;
    return (nibble ^ 8) - 8;
}

/** Requantize an accumulator for output channel `channel` and narrow to int8. */
static inline int8_t corten_finish(int32_t acc, int32_t channel, const int32_t *multiplier, const int32_t *shift,
                                   int32_t per_channel, int32_t output_offset, int32_t act_min, int32_t act_max)
{
    const int32_t q = per_channel ? channel : 0;
    return corten_offset_clamp(corten_requantize(acc, multiplier[q], shift[q]), output_offset, act_min, act_max);
}

/** Every dim and stride of a broadcast geometry is non-negative. */
static inline int corten_broadcast_ok(const corten_broadcast *s)
{
    const corten_dims *d = &s->output;
    const corten_dims *a = &s->input1_strides;
    const corten_dims *b = &s->input2_strides;
    return d->n >= 0 && d->h >= 0 && d->w >= 0 && d->c >= 0 && a->n >= 0 && a->h >= 0 && a->w >= 0 && a->c >= 0 &&
           b->n >= 0 && b->h >= 0 && b->w >= 0 && b->c >= 0;
}

/**
 * The loop of every broadcasting elementwise kernel: each output element of `shape` in storage
 * order gets `*(output)++ = (STORE)`, where STORE reads x1 and x2, the input1 and input2 elements at
 * its index as int32 (both inputs of element type `type`, each read through its strides: 0 along a
 * broadcast dimension).  An output element is written after the input elements at its index are
 * read, so the output may be an input with the output's shape.
 */
#define CORTEN_BROADCAST_EACH(shape, type, input1, input2, output, STORE)                                 \
    do {                                                                                                   \
        int32_t n_, h_, w_, c_;                                                                            \
        for (n_ = 0; n_ < (shape)->output.n; n_++) {                                                       \
            for (h_ = 0; h_ < (shape)->output.h; h_++) {                                                   \
                for (w_ = 0; w_ < (shape)->output.w; w_++) {                                               \
                    const type *a_ = (input1) + n_ * (shape)->input1_strides.n + h_ * (shape)->input1_strides.h + \
                                     w_ * (shape)->input1_strides.w;                                       \
                    const type *b_ = (input2) + n_ * (shape)->input2_strides.n + h_ * (shape)->input2_strides.h + \
                                     w_ * (shape)->input2_strides.w;                                       \
                    for (c_ = 0; c_ < (shape)->output.c; c_++) {                                           \
                        const int32_t x1 = a_[c_ * (shape)->input1_strides.c];                             \
                        const int32_t x2 = b_[c_ * (shape)->input2_strides.c];                             \
                        *(output)++ = (STORE);                                                             \
                    }                                                                                      \
                }                                                                                          \
            }                                                                                              \
        }                                                                                                  \
    } while (0)

/*
 * The element widths of the kernels written once for several: int8 has zero points (the offsets of
 * the params structs), 16x8 is symmetric (TFLite's int16: no offsets, the params' offsets not read,
 * as arm_elementwise_add_s16 / _mul_s16 do).  An instance passes its width's constant, so the
 * compiler drops the offset arithmetic of 16x8.
 */
#define CORTEN_S8_OFFSETS 1
#define CORTEN_S16_OFFSETS 0

/* The largest left_shift of the add kernels of each width (see corten_rescaled_add_one). */
#define CORTEN_ADD_MAX_LEFT_SHIFT_S8 22
#define CORTEN_ADD_MAX_LEFT_SHIFT_S16 15

/**
 * The arm_elementwise_add_s8 / _s16 arithmetic of one pair of elements x1, x2 (int8 or int16;
 * `offsets`: CORTEN_S8_OFFSETS or CORTEN_S16_OFFSETS), with input2's multiplier given separately
 * (add passes params->input2_multiplier, sub its negation): the output value, offset and clamped.
 * With left_shift <= 22 (int8: |x + offset| <= 255) or <= 15 (int16) the shifted values fit in int32.
 */
static inline int32_t corten_rescaled_add_one(const corten_add_params *params, int32_t input2_multiplier, int32_t x1,
                                              int32_t x2, int offsets)
{
    const int32_t a = corten_requantize((x1 + (offsets ? params->input1_offset : 0)) * (1 << params->left_shift),
                                        params->input1_multiplier, params->input1_shift);
    const int32_t b = corten_requantize((x2 + (offsets ? params->input2_offset : 0)) * (1 << params->left_shift),
                                        input2_multiplier, params->input2_shift);
    const int32_t y = corten_requantize(corten_add_wrap(a, b), params->output_multiplier, params->output_shift);
    return corten_offset_clamp_i32(y, offsets ? params->output_offset : 0, params->activation_min,
                                   params->activation_max);
}

/**
 * CORTEN_RESCALED_ADD_BROADCAST defines `name`: the add arithmetic over broadcast operands of element
 * type `type` (see corten_rescaled_add_one and CORTEN_BROADCAST_EACH).
 */
#define CORTEN_RESCALED_ADD_BROADCAST(name, type, max_left_shift, offsets)                                        \
    static inline int name(const corten_add_params *params, int32_t input2_multiplier,                     \
                           const corten_broadcast *shape, const type *input1, const type *input2, type *output) \
    {                                                                                                      \
        if (params == NULL || shape == NULL || input1 == NULL || input2 == NULL || output == NULL ||       \
            !corten_broadcast_ok(shape) || params->left_shift < 0 || params->left_shift > (max_left_shift)) { \
            return CORTEN_ERROR_ARGUMENT;                                                                  \
        }                                                                                                  \
        {   /* a local copy: the stores through `type *` cannot change it, so it is read once */           \
            const corten_add_params p = *params;                                                           \
            CORTEN_BROADCAST_EACH(shape, type, input1, input2, output,                                     \
                                  (type)corten_rescaled_add_one(&p, input2_multiplier, x1, x2, offsets)); \
        }                                                                                                  \
        return CORTEN_OK;                                                                                  \
    }

CORTEN_RESCALED_ADD_BROADCAST(corten_rescaled_add_broadcast, int8_t, CORTEN_ADD_MAX_LEFT_SHIFT_S8, CORTEN_S8_OFFSETS)
CORTEN_RESCALED_ADD_BROADCAST(corten_rescaled_add_broadcast_s16, int16_t, CORTEN_ADD_MAX_LEFT_SHIFT_S16,
                              CORTEN_S16_OFFSETS)

#endif /* CORTEN_INTERNAL_H */
