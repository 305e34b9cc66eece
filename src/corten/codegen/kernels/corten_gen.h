/*
 * corten_gen.h - inline building blocks of Corten's generated per-layer kernels (kernels="generated").
 *
 * The generator (corten/codegen/generated.py) writes one C function per convolution / depthwise /
 * linear layer with every shape, stride, padding, zero point and requantization constant known;
 * those functions call the always-inlined blocks below with constant arguments, so the compiler
 * specialises each block for the layer (fixed trip counts, immediate offsets).
 *
 * One block per ISA path, with the same arithmetic:
 *   _plain  scalar C (Cortex-M0/M3, any host);
 *   _dsp    SIMD through __sxtb16 / __smlad / __smlabb / __smlatt (arm_acle.h) on DSP cores
 *           (Cortex-M4/M7/M33/M55); elsewhere (host tests) the same functions written in C;
 *   _mve    Helium (arm_mve.h, Cortex-M55/M85); elsewhere the same results in scalar C.
 *
 * Accumulators never overflow: the generator only emits a layer whose every partial sum is
 * bounded below 2**31 in magnitude (checked from the weights and biases), so the SIMD
 * instructions' wrap-around never happens and the int32 sums equal the reference's.
 */
#ifndef CORTEN_GEN_H
#define CORTEN_GEN_H

#include <stdint.h>
#include <string.h>

#include "corten_fixed_point.h"

/* Always inlined on the cores (the specialisation above needs it); a host test build may define
 * CG_INLINE as plain `static inline` to let the compiler choose: the same C, compiled ~4-20x faster. */
#ifndef CG_INLINE
#define CG_INLINE static inline __attribute__((always_inline))
#endif

#if defined(__ARM_FEATURE_MVE) && (__ARM_FEATURE_MVE & 1)
#include <arm_mve.h>
#define CG_HAVE_MVE 1
#endif
#if defined(__ARM_FEATURE_DSP) && __ARM_FEATURE_DSP
#include <arm_acle.h>
#define CG_HAVE_DSP 1
#endif
/* CG_DSP_ASM: the assembly blocks that take 14 registers (CG_DSP_GROUPS, the two-pixel depthwise
 * window CG_DW2_STEP): an unoptimised build (gcc -O0) keeps r7 as its frame pointer and cannot
 * allocate them ("impossible constraints"), so there their users are the same sums in C */
#if defined(CG_HAVE_DSP) && defined(__OPTIMIZE__)
#define CG_DSP_ASM 1
#endif

/** Four int8 values as one word (an unaligned LDR on Armv7-M and later). */
CG_INLINE int32_t cg_read32(const int8_t *p)
{
    int32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* ------------------------------------------------------------------ DSP primitives */
#ifdef CG_HAVE_DSP
/** (x.b0, x.b2) sign-extended to two int16 lanes. */
CG_INLINE int32_t cg_sxtb16(int32_t x)
{
    return (int32_t)__sxtb16(x);
}
/** (x.b1, x.b3) sign-extended to two int16 lanes (one SXTB16 with ROR #8: gcc does not fold the rotate). */
CG_INLINE int32_t cg_sxtb16_ror8(int32_t x)
{
    int32_t r;
    __asm__("sxtb16 %0, %1, ror #8" : "=r"(r) : "r"(x));
    return r;
}
/** (a * b + 2**31) >> 32, the rounding high multiply (SMMULR). */
CG_INLINE int32_t cg_smmulr(int32_t a, int32_t b)
{
    int32_t r;
    __asm__("smmulr %0, %1, %2" : "=r"(r) : "r"(a), "r"(b));
    return r;
}
/** k + (a * b + 2**31) >> 32, the rounding high multiply-accumulate (SMMLAR; the 64-bit sum modulo 2**64). */
CG_INLINE int32_t cg_smmlar(int32_t a, int32_t b, int32_t k)
{
    int32_t r;
    __asm__("smmlar %0, %1, %2, %3" : "=r"(r) : "r"(a), "r"(b), "r"(k));
    return r;
}
CG_INLINE int32_t cg_smlad(int32_t a, int32_t b, int32_t acc)
{
    return __smlad(a, b, acc);
}
CG_INLINE int32_t cg_smlabb(int32_t a, int32_t b, int32_t acc)
{
    return __smlabb(a, b, acc);
}
CG_INLINE int32_t cg_smlatt(int32_t a, int32_t b, int32_t acc)
{
    return __smlatt(a, b, acc);
}
CG_INLINE int32_t cg_smlabt(int32_t a, int32_t b, int32_t acc)
{
    return __smlabt(a, b, acc);
}
CG_INLINE int32_t cg_smlatb(int32_t a, int32_t b, int32_t acc)
{
    return __smlatb(a, b, acc);
}
/** acc + (x.b0, x.b2) sign-extended, in two int16 lanes (SXTAB16; each lane wraps modulo 2**16). */
CG_INLINE int32_t cg_sxtab16(int32_t acc, int32_t x)
{
    return (int32_t)__sxtab16(acc, x);
}
/** acc + (x.b1, x.b3) sign-extended, in two int16 lanes (SXTAB16 with ROR #8). */
CG_INLINE int32_t cg_sxtab16_ror8(int32_t acc, int32_t x)
{
    int32_t r;
    __asm__("sxtab16 %0, %1, %2, ror #8" : "=r"(r) : "r"(acc), "r"(x));
    return r;
}
/** Saturate to int8 (SSAT #8). */
CG_INLINE int32_t cg_ssat8(int32_t v)
{
    return __ssat(v, 8);
}
#else
CG_INLINE int32_t cg_lo16(int32_t x)
{
    const int32_t v = (int32_t)((uint32_t)x & 0xFFFFu);
    return v >= 0x8000 ? v - 0x10000 : v;
}
CG_INLINE int32_t cg_hi16(int32_t x)
{
    return cg_lo16(corten_u32_to_i32((uint32_t)x >> 16));
}
CG_INLINE int32_t cg_byte(int32_t x, int k)
{
    const int32_t v = (int32_t)(((uint32_t)x >> (8 * k)) & 0xFFu);
    return v >= 0x80 ? v - 0x100 : v;
}
CG_INLINE int32_t cg_pack16(int32_t lo, int32_t hi)
{
    return corten_u32_to_i32(((uint32_t)lo & 0xFFFFu) | (((uint32_t)hi & 0xFFFFu) << 16));
}
CG_INLINE int32_t cg_sxtb16(int32_t x)
{
    return cg_pack16(cg_byte(x, 0), cg_byte(x, 2));
}
CG_INLINE int32_t cg_sxtb16_ror8(int32_t x)
{
    return cg_pack16(cg_byte(x, 1), cg_byte(x, 3));
}
CG_INLINE int32_t cg_sxtab16(int32_t acc, int32_t x)
{
    return cg_pack16(cg_lo16(acc) + cg_byte(x, 0), cg_hi16(acc) + cg_byte(x, 2));
}
CG_INLINE int32_t cg_sxtab16_ror8(int32_t acc, int32_t x)
{
    return cg_pack16(cg_lo16(acc) + cg_byte(x, 1), cg_hi16(acc) + cg_byte(x, 3));
}
CG_INLINE int32_t cg_smlad(int32_t a, int32_t b, int32_t acc)
{
    return acc + cg_lo16(a) * cg_lo16(b) + cg_hi16(a) * cg_hi16(b);
}
CG_INLINE int32_t cg_smlabb(int32_t a, int32_t b, int32_t acc)
{
    return acc + cg_lo16(a) * cg_lo16(b);
}
CG_INLINE int32_t cg_smlatt(int32_t a, int32_t b, int32_t acc)
{
    return acc + cg_hi16(a) * cg_hi16(b);
}
CG_INLINE int32_t cg_smlabt(int32_t a, int32_t b, int32_t acc)
{
    return acc + cg_lo16(a) * cg_hi16(b);
}
CG_INLINE int32_t cg_smlatb(int32_t a, int32_t b, int32_t acc)
{
    return acc + cg_hi16(a) * cg_lo16(b);
}
CG_INLINE int32_t cg_ssat8(int32_t v)
{
    return v < -128 ? -128 : (v > 127 ? 127 : v);
}
CG_INLINE int32_t cg_smmulr(int32_t a, int32_t b)
{
    return (int32_t)corten_asr64((int64_t)a * b + ((int64_t)1 << 31), 32);
}
CG_INLINE int32_t cg_smmlar(int32_t a, int32_t b, int32_t k)
{
    return corten_u32_to_i32((uint32_t)k + (uint32_t)cg_smmulr(a, b)); /* (k * 2**32 + ... ) >> 32 */
}
#endif

/** Int16 lane ``k`` (0 low, 1 high) of a word, sign-extended. */
CG_INLINE int32_t cg_lane16(int32_t x, int k)
{
    const int32_t v = (int32_t)(((uint32_t)x >> (16 * k)) & 0xFFFFu);
    return v >= 0x8000 ? v - 0x10000 : v;
}

/** The average pool's output (corten/ops/pool.py): CMSIS-NN's rounded division of the window sum
 *  ``s`` by ``div`` (C division truncates), plus ``zp``, clamped to [act_min, act_max]. */
CG_INLINE int8_t cg_avg_out(int32_t s, int32_t div, int32_t zp, int32_t act_min, int32_t act_max)
{
    const int32_t v = (s > 0 ? s + div / 2 : s - div / 2) / div + zp;
    return (int8_t)(v < act_min ? act_min : (v > act_max ? act_max : v));
}

/* ------------------------------------------------------------------ requantization */
/**
 * The short epilogue: arm_nn_requantize(acc, mult, shift) for accumulators the generator proved
 * small (|acc| * 2**left < 2**30) and multipliers >= 0 (corten/codegen/generated.py,
 * short_epilogue_ok; tests/test_generated_kernels.py checks it against the reference function).
 * q = {multiplier, right shift, 2**right shift, left shift}; ``left`` is 0 for the layer when
 * ``has_left`` is.  With a = acc << left, |a| < 2**30:
 *   doubling_high_mult_no_sat(a, m) = (a * m + 2**30) >> 31 = (2a * m + 2**31) >> 32 = SMMULR(2a, m)
 *   (2a cannot overflow);
 *   divide_by_power_of_two(v, r) = (v + ((2**r + (v >> 31)) >> 1)) >> r, i.e. v + 2**(r-1) for
 *   v >= 0 and v + 2**(r-1) - 1 for v < 0 (ties away from zero; + 0 when r = 0), which cannot
 *   overflow because |v| <= 2**30.
 * With CG_OFFSET_IN_ROUNDING (cg_output) q[2] is 2**r + out_offset * 2**(r+1) and the result
 * includes the output offset: (t + 2k) >> 1 = (t >> 1) + k and (u + k * 2**r) >> r = (u >> r) + k;
 * the generator folds it only where nothing wraps (generated.py, offset_folds).
 * ``doubled`` (CG_DOUBLED_ACC): ``acc`` is already 2 * the accumulator - the layer's pre-widened int16
 * weights and its biases are stored doubled (|2 * acc| < 2**31 on the short epilogue's domain), so the
 * doubling of SMMULR(2a, m) costs nothing here.
 * ``sign_from_acc`` (CG_SIGN_FROM_ACC, layers whose every channel shifts right by r >= 1, no left shift):
 * q[2] holds K = q2 / 2 (2**(r-1), plus out_offset * 2**r with CG_OFFSET_IN_ROUNDING) and the result is
 * (SMMLAR(2a, m, K + (a >> 31))) >> r: one instruction less.  Equal because (q2 + (v >> 31)) >> 1 =
 * K + (v >> 31) (q2 even) and SMMLAR(2a, m, k) = k + SMMULR(2a, m); the sign of v = SMMULR(2a, m)
 * (m >= 0) is the sign of a except where v = 0 < -a, and there (K - 1) >> r = K >> r (= out_offset)
 * for r >= 1 (tests/test_generated_kernels.py checks it on the domain edges and ties).
 */
CG_INLINE int32_t cg_requant_short(int32_t acc, const int32_t *q, int has_left, int doubled, int sign_from_acc)
{
    const int32_t a = has_left ? corten_u32_to_i32((uint32_t)acc << q[3]) : acc;
    const int32_t a2 = doubled ? a : a * 2;
    if (sign_from_acc) {
        return corten_asr32(cg_smmlar(a2, q[0], q[2] + corten_asr32(a2, 31)), q[1]);
    }
    {
        const int32_t v = cg_smmulr(a2, q[0]);
        const int32_t t = q[2] + corten_asr32(v, 31);
        return corten_asr32(v + (t >> 1), q[1]);
    }
}

/** The general epilogue: CMSIS-NN's arm_nn_requantize; q = {multiplier, shift, -, -}. */
CG_INLINE int32_t cg_requant_general(int32_t acc, const int32_t *q)
{
    return corten_requantize(acc, q[0], q[1]);
}

#define CG_OFFSET_IN_ROUNDING 4 /* cg_output's epilogue flag: q[2] holds the output offset too */
#define CG_DOUBLED_ACC 8        /* cg_output's epilogue flag: the accumulator is doubled (short epilogue) */
#define CG_SIGN_FROM_ACC 16     /* cg_output's epilogue flag: SMMLAR, the rounding's sign from the accumulator */

/**
 * acc -> int8 output: requantize, add the output offset, clamp to [act_min, act_max].
 * ``epilogue``: 0 general, 1 short, 2 short with left shifts; | CG_OFFSET_IN_ROUNDING: the short
 * epilogue's rounding constant adds the output offset (one addition less); | CG_DOUBLED_ACC: ``acc``
 * is twice the sum (doubled weights and biases; short epilogue only); | CG_SIGN_FROM_ACC: q[2] is half the
 * rounding constant, one SMMLAR (every right shift >= 1, no left shift; cg_requant_short).
 */
CG_INLINE int8_t cg_output(int32_t acc, const int32_t *q, int epilogue, int32_t out_offset, int32_t act_min,
                           int32_t act_max)
{
    if (epilogue) {
        int32_t v = cg_requant_short(acc, q, (epilogue & 3) == 2, epilogue & CG_DOUBLED_ACC,
                                     epilogue & CG_SIGN_FROM_ACC);
        if (!(epilogue & CG_OFFSET_IN_ROUNDING)) {
            v += out_offset; /* |v| <= 2**30: no wrap-around in the offset addition */
        }
        v = cg_ssat8(v);
        if (act_min > -128) {
            v = v < act_min ? act_min : v;
        }
        if (act_max < 127) {
            v = v > act_max ? act_max : v;
        }
        return (int8_t)v;
    }
    return corten_offset_clamp(cg_requant_general(acc, q), out_offset, act_min, act_max);
}

/* ------------------------------------------------------------------ dense dot products */
/*
 * cg_dot_2x2_<isa>(x, xs, w, ws, n, acc): two pixels (x, x + xs) times two filters (w, w + ws)
 * over n int8 values:  acc[0] += x.w   acc[1] += x.(w+ws)   acc[2] += (x+xs).w   acc[3] += (x+xs).(w+ws)
 * (xs = 0 or ws = 0 for a one-pixel / one-filter tail).
 */
CG_INLINE void cg_dot_2x2_plain(const int8_t *x, int32_t xs, const int8_t *w, int32_t ws, int32_t n, int32_t *acc)
{
    int32_t a0 = acc[0], a1 = acc[1], a2 = acc[2], a3 = acc[3];
    int32_t k;
    for (k = 0; k < n; k++) {
        const int32_t x0 = x[k], x1 = x[xs + k], w0 = w[k], w1 = w[ws + k];
        a0 += x0 * w0;
        a1 += x0 * w1;
        a2 += x1 * w0;
        a3 += x1 * w1;
    }
    acc[0] = a0;
    acc[1] = a1;
    acc[2] = a2;
    acc[3] = a3;
}

CG_INLINE void cg_dot_2x2_dsp(const int8_t *x, int32_t xs, const int8_t *w, int32_t ws, int32_t n, int32_t *acc)
{
    int32_t a0 = acc[0], a1 = acc[1], a2 = acc[2], a3 = acc[3];
    const int8_t *end = x + (n & ~3);
    while (x < end) {
        const int32_t xv0 = cg_read32(x), xv1 = cg_read32(x + xs);
        const int32_t x0a = cg_sxtb16(xv0), x0b = cg_sxtb16_ror8(xv0);
        const int32_t x1a = cg_sxtb16(xv1), x1b = cg_sxtb16_ror8(xv1);
        const int32_t wv0 = cg_read32(w);
        int32_t wa = cg_sxtb16(wv0), wb = cg_sxtb16_ror8(wv0);
        a0 = cg_smlad(x0a, wa, a0);
        a0 = cg_smlad(x0b, wb, a0);
        a2 = cg_smlad(x1a, wa, a2);
        a2 = cg_smlad(x1b, wb, a2);
        {
            const int32_t wv1 = cg_read32(w + ws);
            wa = cg_sxtb16(wv1);
            wb = cg_sxtb16_ror8(wv1);
        }
        a1 = cg_smlad(x0a, wa, a1);
        a1 = cg_smlad(x0b, wb, a1);
        a3 = cg_smlad(x1a, wa, a3);
        a3 = cg_smlad(x1b, wb, a3);
        x += 4;
        w += 4;
    }
    acc[0] = a0;
    acc[1] = a1;
    acc[2] = a2;
    acc[3] = a3;
    cg_dot_2x2_plain(x, xs, w, ws, n & 3, acc); /* the last n % 4 values */
}

/**
 * The DSP dot product with pre-widened weights: ``w`` holds, per four int8 weights, the int16
 * pairs (w0, w2), (w1, w3) (SXTB16 order), word aligned; ``n`` and ``ws`` count int8 weights
 * (n a multiple of 4).  Two words per four weights per filter, no unpacking of weights.
 */
CG_INLINE void cg_dot_2x2_dspw(const int8_t *x, int32_t xs, const int16_t *w, int32_t ws, int32_t n, int32_t *acc)
{
    int32_t a0 = acc[0], a1 = acc[1], a2 = acc[2], a3 = acc[3];
    const int64_t *wp = (const int64_t *)(const void *)w; /* 8-byte aligned: one LDRD per pair */
    int32_t k;
    for (k = 0; k < n; k += 4) {
        const int32_t xv0 = cg_read32(x + k), xv1 = cg_read32(x + xs + k);
        const int32_t x0a = cg_sxtb16(xv0), x0b = cg_sxtb16_ror8(xv0);
        const int32_t x1a = cg_sxtb16(xv1), x1b = cg_sxtb16_ror8(xv1);
        int64_t wv = wp[k / 4];
        int32_t wa = (int32_t)wv, wb = (int32_t)(wv >> 32);
        a0 = cg_smlad(x0a, wa, a0);
        a0 = cg_smlad(x0b, wb, a0);
        a2 = cg_smlad(x1a, wa, a2);
        a2 = cg_smlad(x1b, wb, a2);
        wv = wp[(ws + k) / 4];
        wa = (int32_t)wv;
        wb = (int32_t)(wv >> 32);
        a1 = cg_smlad(x0a, wa, a1);
        a1 = cg_smlad(x0b, wb, a1);
        a3 = cg_smlad(x1a, wa, a3);
        a3 = cg_smlad(x1b, wb, a3);
    }
    acc[0] = a0;
    acc[1] = a1;
    acc[2] = a2;
    acc[3] = a3;
}

/*
 * CG_DOT_2X2_PAIR(x, XS, w, n, acc, WIDE): the same product for a pair of filters whose pre-widened
 * weights are interleaved per four inputs - (w0, w2), (w1, w3) of the first filter, then of the
 * second, four words, 8-byte aligned - so that one pointer walks both filters' weights.  ``XS`` is an
 * integer literal (the byte offset of the second pixel, < 4096).  On DSP cores the body is one
 * block of 18 instructions per 4 inputs (6 LDR, 4 SXTB16, 8 SMLAD: 16 MACs), written in
 * assembly because gcc spills accumulators in this loop; elsewhere the same sums in C.  ``WIDE``: the
 * loop unrolling of CG_DSP_GROUPS (0 or 1, a constant).
 */
#ifdef CG_DSP_ASM
/* one group of four inputs: both pixels' words, then the four weight words, by six LDRs in a row
 * (pipelined: 2 + 5 cycles on a Cortex-M4, where an LDM of four takes 5 and does not pipeline with the
 * loads after it), 4 SXTB16, 8 SMLAD */
#define CG_PAIR_GROUP(XS)                                                                            \
    "ldr %[t1], [%[x], #" #XS "]\n\t"                                                                \
    "ldr %[t3], [%[x]], #4\n\t"                                                                      \
    "ldr %[wa0], [%[w]], #4\n\t"                                                                     \
    "ldr %[wb0], [%[w]], #4\n\t"                                                                     \
    "ldr %[wa1], [%[w]], #4\n\t"                                                                     \
    "ldr %[wb1], [%[w]], #4\n\t"                                                                     \
    "sxtb16 %[t2], %[t1]\n\t"                                                                        \
    "sxtb16 %[t1], %[t1], ror #8\n\t"                                                                \
    "smlad %[a2], %[t2], %[wa0], %[a2]\n\t"                                                          \
    "smlad %[a2], %[t1], %[wb0], %[a2]\n\t"                                                          \
    "smlad %[a3], %[t2], %[wa1], %[a3]\n\t"                                                          \
    "smlad %[a3], %[t1], %[wb1], %[a3]\n\t"                                                          \
    "sxtb16 %[t2], %[t3]\n\t"                                                                        \
    "sxtb16 %[t3], %[t3], ror #8\n\t"                                                                \
    "smlad %[a0], %[t2], %[wa0], %[a0]\n\t"                                                          \
    "smlad %[a0], %[t3], %[wb0], %[a0]\n\t"                                                          \
    "smlad %[a1], %[t2], %[wa1], %[a1]\n\t"                                                          \
    "smlad %[a1], %[t3], %[wb1], %[a1]\n\t"
/* (the straight blocks do not take the count: it stays a constant for the compiler where it is one) */
#define CG_PAIR_REGS                                                                                 \
    [x] "+r"(cg_x), [w] "+r"(cg_w), [a0] "+r"(cg_a0), [a1] "+r"(cg_a1), [a2] "+r"(cg_a2), [a3] "+r"(cg_a3), \
        [wa0] "=&r"(cg_wa0), [wb0] "=&r"(cg_wb0), [wa1] "=&r"(cg_wa1), [wb1] "=&r"(cg_wb1), [t1] "=&r"(cg_t1), \
        [t2] "=&r"(cg_t2), [t3] "=&r"(cg_t3)
#define CG_PAIR_OPERANDS : CG_PAIR_REGS : : "memory"
#define CG_PAIR_LOOP_OPERANDS : CG_PAIR_REGS, [n] "+r"(cg_n) : : "memory", "cc"
/* The loop of the DSP assembly dot products: N_ inputs (a multiple of 4) in groups of four (GROUP:
 * the assembly of one group over x, w, a0..a3), the accumulators ACC_[0..3] in registers throughout.
 * WIDE_ (a constant) 0: one group first when their count is odd, then two per iteration (small
 * code, for the many border copies); 1: the count's low bits as 1, 2, 4 and 8 groups in a row, then
 * sixteen per iteration (a taken branch costs a pipeline refill on a Cortex-M4: 5 cycles per loop
 * iteration; the hot copies).  With a constant N_ the unneeded blocks vanish. */
#define CG_8(GROUP) GROUP GROUP GROUP GROUP GROUP GROUP GROUP GROUP
#define CG_DSP_GROUPS(GROUP, X_, W_, N_, ACC_, WIDE_)                                                \
    do {                                                                                             \
        const int8_t *cg_x = (X_);                                                                   \
        const int16_t *cg_w = (W_);                                                                  \
        int32_t cg_n = (N_) >> 2;                                                                    \
        int32_t *const cg_acc = (ACC_);                                                              \
        int32_t cg_a0 = cg_acc[0], cg_a1 = cg_acc[1], cg_a2 = cg_acc[2], cg_a3 = cg_acc[3];          \
        /* (the weight words in r8-r11: the allocation that measured best; no LDM needs them now) */  \
        register int32_t cg_wa0 __asm__("r8"), cg_wb0 __asm__("r9");                                 \
        register int32_t cg_wa1 __asm__("r10"), cg_wb1 __asm__("r11");                               \
        int32_t cg_t1, cg_t2, cg_t3;                                                                 \
        if (cg_n & 1) {                                                                              \
            __asm__(GROUP CG_PAIR_OPERANDS);                                                          \
        }                                                                                            \
        if (WIDE_) {                                                                                 \
            if (cg_n & 2) {                                                                          \
                __asm__(GROUP GROUP CG_PAIR_OPERANDS);                                               \
            }                                                                                        \
            if (cg_n & 4) {                                                                          \
                __asm__(GROUP GROUP GROUP GROUP CG_PAIR_OPERANDS);                                   \
            }                                                                                        \
            if (cg_n & 8) {                                                                          \
                __asm__(CG_8(GROUP) CG_PAIR_OPERANDS);                                               \
            }                                                                                        \
            cg_n >>= 4;                                                                              \
            if (cg_n > 0) {                                                                          \
                __asm__("1:\n\t" CG_8(GROUP) CG_8(GROUP)                                               \
                        "subs %[n], %[n], #1\n\t"                                                    \
                        "bne 1b" CG_PAIR_LOOP_OPERANDS);                                             \
            }                                                                                        \
        } else {                                                                                     \
            cg_n >>= 1;                                                                              \
            if (cg_n == 1) {                                                                         \
                __asm__(GROUP GROUP CG_PAIR_OPERANDS);                                               \
            } else if (cg_n > 1) {                                                                   \
                __asm__("1:\n\t" GROUP GROUP                                                         \
                        "subs %[n], %[n], #1\n\t"                                                    \
                        "bne 1b" CG_PAIR_LOOP_OPERANDS);                                             \
            }                                                                                        \
        }                                                                                            \
        cg_acc[0] = cg_a0;                                                                           \
        cg_acc[1] = cg_a1;                                                                           \
        cg_acc[2] = cg_a2;                                                                           \
        cg_acc[3] = cg_a3;                                                                           \
    } while (0)
#define CG_DOT_2X2_PAIR(X_, XS, W_, N_, ACC_, WIDE_) CG_DSP_GROUPS(CG_PAIR_GROUP(XS), X_, W_, N_, ACC_, WIDE_)
#else
#define CG_DOT_2X2_PAIR(x, XS, w, n, acc, WIDE_) cg_dot_2x2_pair_c((x), (XS), (w), (n), (acc))
#endif

/** CG_DOT_2X2_PAIR in C (hosts; the DSP primitives are then C functions too). */
CG_INLINE void cg_dot_2x2_pair_c(const int8_t *x, int32_t xs, const int16_t *w, int32_t n, int32_t *acc)
{
    int32_t k;
    for (k = 0; k < n; k += 4) {
        int32_t wa0, wb0, wa1, wb1;
        const int32_t xv0 = cg_read32(x + k), xv1 = cg_read32(x + xs + k);
        memcpy(&wa0, w + 2 * k, 4);
        memcpy(&wb0, w + 2 * k + 2, 4);
        memcpy(&wa1, w + 2 * k + 4, 4);
        memcpy(&wb1, w + 2 * k + 6, 4);
        acc[0] = cg_smlad(cg_sxtb16_ror8(xv0), wb0, cg_smlad(cg_sxtb16(xv0), wa0, acc[0]));
        acc[1] = cg_smlad(cg_sxtb16_ror8(xv0), wb1, cg_smlad(cg_sxtb16(xv0), wa1, acc[1]));
        acc[2] = cg_smlad(cg_sxtb16_ror8(xv1), wb0, cg_smlad(cg_sxtb16(xv1), wa0, acc[2]));
        acc[3] = cg_smlad(cg_sxtb16_ror8(xv1), wb1, cg_smlad(cg_sxtb16(xv1), wa1, acc[3]));
    }
}

/*
 * cg_widen_words: the 4n int8 inputs at x -> 2n words of int16 pairs in SXTB16 order, (x0, x2) then
 * (x1, x3) per input word: the order of the pre-widened weights (generated.widened_weights), so that
 * one SMLAD multiplies a word of each.  DSP cores: eight words per iteration of an assembly loop (per
 * four words four LDRs in a row - pipelined -, eight SXTB16, eight STRs: 5.75 cycles a word on a
 * Cortex-M4 with the loop), then four in a row, the rest in C (n is a constant where the generator
 * calls it: the dead branches go).
 */
CG_INLINE void cg_widen_word(const int8_t *x, int32_t *s)
{
    const int32_t v = cg_read32(x);
    s[0] = cg_sxtb16(v);
    s[1] = cg_sxtb16_ror8(v);
}

CG_INLINE void cg_widen_words(const int8_t *x, int32_t *s, int32_t n)
{
    int32_t i = 0;
#ifdef CG_HAVE_DSP
#define CG_WIDEN4                                                                                    \
    "ldr %[a], [%[x]], #4\n\t"                                                                         \
    "ldr %[b], [%[x]], #4\n\t"                                                                         \
    "ldr %[c], [%[x]], #4\n\t"                                                                         \
    "ldr %[d], [%[x]], #4\n\t"                                                                         \
    "sxtb16 %[e], %[a]\n\t"                                                                            \
    "sxtb16 %[a], %[a], ror #8\n\t"                                                                    \
    "sxtb16 %[f], %[b]\n\t"                                                                            \
    "sxtb16 %[b], %[b], ror #8\n\t"                                                                    \
    "sxtb16 %[g], %[c]\n\t"                                                                            \
    "sxtb16 %[c], %[c], ror #8\n\t"                                                                    \
    "sxtb16 %[h], %[d]\n\t"                                                                            \
    "sxtb16 %[d], %[d], ror #8\n\t"                                                                    \
    "str %[e], [%[s]], #4\n\t"                                                                         \
    "str %[a], [%[s]], #4\n\t"                                                                         \
    "str %[f], [%[s]], #4\n\t"                                                                         \
    "str %[b], [%[s]], #4\n\t"                                                                         \
    "str %[g], [%[s]], #4\n\t"                                                                         \
    "str %[c], [%[s]], #4\n\t"                                                                         \
    "str %[h], [%[s]], #4\n\t"                                                                         \
    "str %[d], [%[s]], #4\n\t"
#define CG_WIDEN_OPERANDS                                                                            \
    : [x] "+r"(x), [s] "+r"(s), [a] "=&r"(a), [b] "=&r"(b), [c] "=&r"(c), [d] "=&r"(d), [e] "=&r"(e), \
      [f] "=&r"(f), [g] "=&r"(g), [h] "=&r"(h)                                                       \
    : [end] "r"(end)                                                                                 \
    : "memory", "cc"
    if (n >= 4) {
        const int8_t *const end = x + 32 * (n / 8);
        int32_t a, b, c, d, e, f, g, h;
        if (n >= 8) {
            __asm__ volatile("1:\n\t" CG_WIDEN4 CG_WIDEN4 "cmp %[x], %[end]\n\t"
                             "bne 1b" CG_WIDEN_OPERANDS);
        }
        if (n & 4) {
            __asm__ volatile(CG_WIDEN4 CG_WIDEN_OPERANDS);
        }
        n %= 4;
    }
#undef CG_WIDEN4
#undef CG_WIDEN_OPERANDS
#endif
    for (; i + 4 <= n; i += 4) {
        cg_widen_word(x + 4 * i, s + 2 * i);
        cg_widen_word(x + 4 * i + 4, s + 2 * i + 2);
        cg_widen_word(x + 4 * i + 8, s + 2 * i + 4);
        cg_widen_word(x + 4 * i + 12, s + 2 * i + 6);
    }
    for (; i < n; i++) {
        cg_widen_word(x + 4 * i, s + 2 * i);
    }
}

#define CG_PW_PIXELS 3 /* pixels per pointwise tile (cg_pointwise_c, generated._pointwise_asm) */

/*
 * cg_pointwise_c: a pointwise (1x1, stride 1, unpadded) layer's tile of CG_PW_PIXELS pixels, their
 * inputs widened (cg_widen_words: pixel p's k inputs at s + p * k / 2) -> y + p * ys, over the layer's
 * stream ``st`` (int16 words of generated.pointwise_stream: per pair of filters their two int32 biases,
 * their paired widened weights - CG_DOT_2X2_PAIR's layout, ``k`` inputs -, then {multiplier, right, K}
 * of each filter as int32), ``pairs`` pairs; ``epilogue``: cg_output's flags.  The generator writes
 * the same walk as one assembly loop per layer on DSP cores (generated._pointwise_asm: per pair of
 * filters the 3 x 2 tile in registers, per two inputs five LDRs and six SMLADs); this is its C (hosts).
 */
CG_INLINE void cg_pointwise_c(const int32_t *s, int8_t *y, int32_t ys, const int16_t *st, int32_t pairs, int32_t k,
                              int epilogue, int32_t out_offset)
{
    int32_t j, p, f, c;
    for (j = 0; j < pairs; j++) {
        int32_t b[2], q[6];
        memcpy(b, st, sizeof b);
        memcpy(q, st + 4 + 2 * k, sizeof q);
        for (p = 0; p < CG_PW_PIXELS; p++) {
            for (f = 0; f < 2; f++) {
                const int32_t qc[4] = {q[3 * f], q[3 * f + 1], q[3 * f + 2], 0};
                int32_t acc = b[f];
                for (c = 0; c < k / 2; c++) {
                    int32_t w;
                    memcpy(&w, st + 4 + 8 * (c / 2) + 4 * f + 2 * (c % 2), 4);
                    acc = cg_smlad(s[p * (k / 2) + c], w, acc);
                }
                y[p * ys + 2 * j + f] = cg_output(acc, qc, epilogue, out_offset, -128, 127);
            }
        }
        st += 4 + 2 * k + 12;
    }
}

/** Two int16 values (``lo`` in the low half) as one word (one PKHBT). */
CG_INLINE int32_t cg_pair16(int32_t lo, int32_t hi)
{
    return corten_u32_to_i32(((uint32_t)lo & 0xFFFFu) | ((uint32_t)hi << 16));
}

/*
 * cg_windows_c: a gathered-window layer's pixel pair - two windows of ``pairs`` int16 pairs at x and
 * x + xs (words; generated.window_pairs) -> (y, y + ys) over its stream ``s`` (generated.window_stream:
 * per group of four filters their four doubled biases, per pair the four filters' doubled weight pairs,
 * then {multiplier, right, K} of each filter), ``groups`` groups; ``epilogue``: cg_output's flags.  The
 * generator writes the same walk as one assembly loop per layer on DSP cores (its ``_win`` functions);
 * this is its C (hosts).
 */
CG_INLINE void cg_windows_c(const int32_t *x, int32_t xs, int8_t *y, int32_t ys, const int32_t *s, int32_t groups,
                            int32_t pairs, int epilogue, int32_t out_offset)
{
    int32_t g, p, f;
    for (g = 0; g < groups; g++) {
        int32_t acc[8];
        for (f = 0; f < 4; f++) {
            acc[f] = s[f];
            acc[f + 4] = s[f];
        }
        for (p = 0; p < pairs; p++) {
            for (f = 0; f < 4; f++) {
                acc[f] = cg_smlad(x[p], s[4 + 4 * p + f], acc[f]);
                acc[f + 4] = cg_smlad(x[xs + p], s[4 + 4 * p + f], acc[f + 4]);
            }
        }
        for (f = 0; f < 4; f++) {
            const int32_t *q = s + 4 + 4 * pairs + 3 * f;
            const int32_t qc[4] = {q[0], q[1], q[2], 0};
            const int8_t v0 = cg_output(acc[f], qc, epilogue, out_offset, -128, 127);
            const int8_t v1 = cg_output(acc[f + 4], qc, epilogue, out_offset, -128, 127);
            y[4 * g + f] = v0;
            y[ys + 4 * g + f] = v1;
        }
        s += 4 + 4 * pairs + 12;
    }
}

/*
 * CG_MATVEC4(X_, W_, N_, ACC_): one input row x (N_ int8 values, N_ a multiple of 4) times four
 * filters (a matrix-vector product: a linear layer over one row), acc[f] += x . w_f.  The weights
 * are pre-widened and interleaved per four inputs - (w0, w2), (w1, w3) of filter 0, then of filters
 * 1, 2, 3: eight words - read by runs of pipelined LDRs (one cycle each after the first on a
 * Cortex-M4, against 3 per LDRD), and each input word is widened once for four filters.  DSP cores:
 * per four inputs 9 LDR, 2 SXTB16, 8 SMLAD (16 MACs; CMSIS-NN's two-row arm_nn_vec_mat_mult_t_s8
 * needs 13 instructions for 8 MACs), the loop in the
 * assembly (sixteen groups per iteration: CG_DSP_GROUPS' wide form); elsewhere the same sums in C.
 */
#ifdef CG_DSP_ASM
#define CG_MATVEC_GROUP                                                                              \
    "ldr %[t1], [%[x]], #4\n\t"                                                                      \
    "ldr %[wa0], [%[w]], #4\n\t"                                                                     \
    "ldr %[wb0], [%[w]], #4\n\t"                                                                     \
    "ldr %[wa1], [%[w]], #4\n\t"                                                                     \
    "ldr %[wb1], [%[w]], #4\n\t"                                                                     \
    "sxtb16 %[t2], %[t1]\n\t"                                                                        \
    "sxtb16 %[t1], %[t1], ror #8\n\t"                                                                \
    "smlad %[a0], %[t2], %[wa0], %[a0]\n\t"                                                          \
    "smlad %[a0], %[t1], %[wb0], %[a0]\n\t"                                                          \
    "smlad %[a1], %[t2], %[wa1], %[a1]\n\t"                                                          \
    "smlad %[a1], %[t1], %[wb1], %[a1]\n\t"                                                          \
    "ldr %[wa0], [%[w]], #4\n\t"                                                                     \
    "ldr %[wb0], [%[w]], #4\n\t"                                                                     \
    "ldr %[wa1], [%[w]], #4\n\t"                                                                     \
    "ldr %[wb1], [%[w]], #4\n\t"                                                                     \
    "smlad %[a2], %[t2], %[wa0], %[a2]\n\t"                                                          \
    "smlad %[a2], %[t1], %[wb0], %[a2]\n\t"                                                          \
    "smlad %[a3], %[t2], %[wa1], %[a3]\n\t"                                                          \
    "smlad %[a3], %[t1], %[wb1], %[a3]\n\t"
#define CG_MATVEC4(X_, W_, N_, ACC_) CG_DSP_GROUPS(CG_MATVEC_GROUP, X_, W_, N_, ACC_, 1)
#else
#define CG_MATVEC4(x, w, n, acc) cg_matvec4_c((x), (w), (n), (acc))
#endif

/** CG_MATVEC4 in C (hosts; the DSP primitives are then C functions too). */
CG_INLINE void cg_matvec4_c(const int8_t *x, const int16_t *w, int32_t n, int32_t *acc)
{
    int32_t k, f;
    for (k = 0; k < n; k += 4) {
        const int32_t xv = cg_read32(x + k);
        for (f = 0; f < 4; f++) {
            int32_t wa, wb;
            memcpy(&wa, w + 4 * k + 4 * f, 4);
            memcpy(&wb, w + 4 * k + 4 * f + 2, 4);
            acc[f] = cg_smlad(cg_sxtb16_ror8(xv), wb, cg_smlad(cg_sxtb16(xv), wa, acc[f]));
        }
    }
}

#ifdef CG_HAVE_MVE
CG_INLINE void cg_dot_2x2_mve(const int8_t *x, int32_t xs, const int8_t *w, int32_t ws, int32_t n, int32_t *acc)
{
    int32_t a0 = acc[0], a1 = acc[1], a2 = acc[2], a3 = acc[3];
    while (n > 0) {
        const mve_pred16_t p = vctp8q((uint32_t)n);
        const int8x16_t x0 = vldrbq_z_s8(x, p), x1 = vldrbq_z_s8(x + xs, p);
        const int8x16_t w0 = vldrbq_z_s8(w, p), w1 = vldrbq_z_s8(w + ws, p);
        a0 = vmladavaq_s8(a0, x0, w0);
        a1 = vmladavaq_s8(a1, x0, w1);
        a2 = vmladavaq_s8(a2, x1, w0);
        a3 = vmladavaq_s8(a3, x1, w1);
        x += 16;
        w += 16;
        n -= 16;
    }
    acc[0] = a0;
    acc[1] = a1;
    acc[2] = a2;
    acc[3] = a3;
}
#else
#define cg_dot_2x2_mve cg_dot_2x2_plain
#endif

/*
 * cg_conv_2x4_mve: a tile of two pixels (x, x + xs) by four filters (w + o*k, k int8 weights
 * each) over ``rows`` kernel rows of ``run`` inputs (input rows ``x_row`` bytes apart, weight rows
 * ``w_row`` apart), accumulators from ``bias``, and the short epilogue on four lanes
 * (q planar: multiplier[c], left[c], -right[c], 2**right[c] at c, c + C, c + 2C, c + 3C).
 * Helium: per 16 inputs 2 + 4 loads and 8 VMLADAVA (128 MACs); one vector requantization per
 * pixel.  Elsewhere: the same values in C.
 */
#define CG_LEFT 1      /* epilogue flag: some channel shifts left (q's left row is read) */
#define CG_ALL_RIGHT 2 /* epilogue flag: every channel shifts right by >= 1 (no fix-up mask) */
#ifdef CG_HAVE_MVE
/**
 * The short epilogue on four lanes (cg_requant_short's values; q planar: multiplier[c], left[c],
 * -right[c], 2**right[c] at c, c + C, c + 2C, c + 3C), then the output offset and the clamp.
 * ``flags``: CG_LEFT, CG_ALL_RIGHT (compile-time constants of the layer).  The rounding shift is
 * VRSHL by -right (round half up, computed without overflow) of v - 1 for negative v when
 * right > 0: divide_by_power_of_two's ties away from zero, as CMSIS-NN's arm_requantize_mve_32x4
 * does; with CG_ALL_RIGHT the sign alone gives the -1 (VSHR #31), else it is masked by -right's
 * sign bit (0 where right is 0).
 */
CG_INLINE int32x4_t cg_requant4_mve(int32x4_t acc, const int32_t *q, int32_t c_total, int flags, int32_t out_offset,
                                    int32_t act_min, int32_t act_max)
{
    const int32x4_t mult = vldrwq_s32(q), neg_right = vldrwq_s32(q + 2 * c_total);
    int32x4_t v = (flags & CG_LEFT) ? vshlq_s32(acc, vldrwq_s32(q + c_total)) : acc;
    v = vqrdmulhq_s32(v, mult);
    v = vaddq_s32(v, vshrq_n_s32((flags & CG_ALL_RIGHT) ? v : vandq_s32(v, neg_right), 31));
    v = vrshlq_s32(v, neg_right);
    v = vaddq_n_s32(v, out_offset);
    v = vmaxq_s32(v, vdupq_n_s32(act_min));
    return vminq_s32(v, vdupq_n_s32(act_max));
}

CG_INLINE void cg_conv_2x4_mve(const int8_t *x, int32_t xs, int32_t x_row, const int8_t *w, int32_t k, int32_t w_row,
                               int32_t rows, int32_t run, const int32_t *bias, const int32_t *q, int32_t c_total,
                               int has_left, int32_t out_offset, int32_t act_min, int32_t act_max, int8_t *y0,
                               int8_t *y1)
{
    int32_t a0 = bias[0], a1 = bias[1], a2 = bias[2], a3 = bias[3];
    int32_t b0 = a0, b1 = a1, b2 = a2, b3 = a3;
    int32_t r;
    for (r = 0; r < rows; r++) {
        const int8_t *xp = x + r * x_row, *wp = w + r * w_row;
        int32_t n = run;
        while (n > 0) {
            const mve_pred16_t p = vctp8q((uint32_t)n);
            const int8x16_t x0 = vldrbq_z_s8(xp, p), x1 = vldrbq_z_s8(xp + xs, p);
            int8x16_t wv = vldrbq_z_s8(wp, p);
            a0 = vmladavaq_s8(a0, x0, wv);
            b0 = vmladavaq_s8(b0, x1, wv);
            wv = vldrbq_z_s8(wp + k, p);
            a1 = vmladavaq_s8(a1, x0, wv);
            b1 = vmladavaq_s8(b1, x1, wv);
            wv = vldrbq_z_s8(wp + 2 * k, p);
            a2 = vmladavaq_s8(a2, x0, wv);
            b2 = vmladavaq_s8(b2, x1, wv);
            wv = vldrbq_z_s8(wp + 3 * k, p);
            a3 = vmladavaq_s8(a3, x0, wv);
            b3 = vmladavaq_s8(b3, x1, wv);
            xp += 16;
            wp += 16;
            n -= 16;
        }
    }
    {
        /* both pixels' values before the stores (int8 stores may alias the tables) */
        int32x4_t va = vdupq_n_s32(a0), vb = vdupq_n_s32(b0);
        va = vsetq_lane_s32(a1, va, 1);
        va = vsetq_lane_s32(a2, va, 2);
        va = vsetq_lane_s32(a3, va, 3);
        vb = vsetq_lane_s32(b1, vb, 1);
        vb = vsetq_lane_s32(b2, vb, 2);
        vb = vsetq_lane_s32(b3, vb, 3);
        va = cg_requant4_mve(va, q, c_total, has_left, out_offset, act_min, act_max);
        vb = cg_requant4_mve(vb, q, c_total, has_left, out_offset, act_min, act_max);
        vstrbq_s32(y0, va);
        vstrbq_s32(y1, vb);
    }
}

/*
 * cg_conv_2x4_mvei: cg_conv_2x4_mve for windows whose kernel rows are whole (``run`` = kW * C_in
 * contiguous input bytes per row), with the four filters' weights interleaved in loop order: per
 * kernel row, per 16 inputs, 16 bytes of each filter (the last chunk of a row zero-padded), so one
 * pointer walks them.  The full chunks run in assembly, accumulators pinned to the even registers
 * VMLADAVA needs: per 16 inputs 2 + 4 loads and 8 VMLADAVA (128 MACs) plus the loop's SUBS/BNE; the
 * last ``tail`` (< 16) inputs of a row load predicated (zeros past the row), the weights are zero there.
 */
CG_INLINE void cg_conv_2x4_mvei(const int8_t *x, int32_t xs, int32_t x_row, const int8_t *w, int32_t rows,
                                int32_t chunks, int32_t tail, const int32_t *bias, const int32_t *q, int32_t c_total,
                                int has_left, int32_t out_offset, int32_t act_min, int32_t act_max, int8_t *y0,
                                int8_t *y1)
{
    register int32_t a0 __asm__("r0") = bias[0];
    register int32_t a1 __asm__("r2") = bias[1];
    register int32_t a2 __asm__("r4") = bias[2];
    register int32_t a3 __asm__("r6") = bias[3];
    register int32_t b0 __asm__("r8") = a0;
    register int32_t b1 __asm__("r10") = a1;
    register int32_t b2 __asm__("r12") = a2;
    register int32_t b3 __asm__("lr") = a3;
    int32_t r;
    for (r = 0; r < rows; r++) {
        const int8_t *x0 = x + r * x_row, *x1 = x0 + xs;
        int32_t n = chunks;
        if (n > 0) {
            __asm__("1:\n\t"
                    "vldrb.8 q0, [%[x0]], #16\n\t"
                    "vldrb.8 q1, [%[x1]], #16\n\t"
                    "vldrb.8 q2, [%[w], #16]\n\t"
                    "vldrb.8 q3, [%[w]], #64\n\t"
                    "vmladava.s8 %[a0], q0, q3\n\t"
                    "vmladava.s8 %[b0], q1, q3\n\t"
                    "vmladava.s8 %[a1], q0, q2\n\t"
                    "vmladava.s8 %[b1], q1, q2\n\t"
                    "vldrb.8 q2, [%[w], #-32]\n\t"
                    "vldrb.8 q3, [%[w], #-16]\n\t"
                    "vmladava.s8 %[a2], q0, q2\n\t"
                    "vmladava.s8 %[b2], q1, q2\n\t"
                    "vmladava.s8 %[a3], q0, q3\n\t"
                    "vmladava.s8 %[b3], q1, q3\n\t"
                    "subs %[n], %[n], #1\n\t"
                    "bne 1b"
                    : [x0] "+r"(x0), [x1] "+r"(x1), [w] "+r"(w), [n] "+r"(n), [a0] "+r"(a0), [a1] "+r"(a1),
                      [a2] "+r"(a2), [a3] "+r"(a3), [b0] "+r"(b0), [b1] "+r"(b1), [b2] "+r"(b2), [b3] "+r"(b3)
                    :
                    : "q0", "q1", "q2", "q3", "memory", "cc");
        }
        if (tail) {
            const mve_pred16_t p = vctp8q((uint32_t)tail);
            const int8x16_t v0 = vldrbq_z_s8(x0, p), v1 = vldrbq_z_s8(x1, p);
            int8x16_t wv = vldrbq_s8(w);
            a0 = vmladavaq_s8(a0, v0, wv);
            b0 = vmladavaq_s8(b0, v1, wv);
            wv = vldrbq_s8(w + 16);
            a1 = vmladavaq_s8(a1, v0, wv);
            b1 = vmladavaq_s8(b1, v1, wv);
            wv = vldrbq_s8(w + 32);
            a2 = vmladavaq_s8(a2, v0, wv);
            b2 = vmladavaq_s8(b2, v1, wv);
            wv = vldrbq_s8(w + 48);
            a3 = vmladavaq_s8(a3, v0, wv);
            b3 = vmladavaq_s8(b3, v1, wv);
            w += 64;
        }
    }
    {
        /* both pixels' values before the stores (int8 stores may alias the tables) */
        int32x4_t va = vdupq_n_s32(a0), vb = vdupq_n_s32(b0);
        va = vsetq_lane_s32(a1, va, 1);
        va = vsetq_lane_s32(a2, va, 2);
        va = vsetq_lane_s32(a3, va, 3);
        vb = vsetq_lane_s32(b1, vb, 1);
        vb = vsetq_lane_s32(b2, vb, 2);
        vb = vsetq_lane_s32(b3, vb, 3);
        va = cg_requant4_mve(va, q, c_total, has_left, out_offset, act_min, act_max);
        vb = cg_requant4_mve(vb, q, c_total, has_left, out_offset, act_min, act_max);
        vstrbq_s32(y0, va);
        vstrbq_s32(y1, vb);
    }
}
#else
CG_INLINE void cg_conv_2x4_mve(const int8_t *x, int32_t xs, int32_t x_row, const int8_t *w, int32_t k, int32_t w_row,
                               int32_t rows, int32_t run, const int32_t *bias, const int32_t *q, int32_t c_total,
                               int has_left, int32_t out_offset, int32_t act_min, int32_t act_max, int8_t *y0,
                               int8_t *y1)
{
    int32_t f, px;
    (void)has_left;
    for (px = 0; px < 2; px++) {
        for (f = 0; f < 4; f++) {
            int32_t acc = bias[f], r, i, qc[4];
            for (r = 0; r < rows; r++) {
                for (i = 0; i < run; i++) {
                    acc += x[px * xs + r * x_row + i] * w[f * k + r * w_row + i];
                }
            }
            qc[0] = q[f];
            qc[1] = -q[2 * c_total + f];
            qc[2] = q[3 * c_total + f];
            qc[3] = q[c_total + f];
            (px ? y1 : y0)[f] = cg_output(acc, qc, 2, out_offset, act_min, act_max);
        }
    }
}
CG_INLINE void cg_conv_2x4_mvei(const int8_t *x, int32_t xs, int32_t x_row, const int8_t *w, int32_t rows,
                                int32_t chunks, int32_t tail, const int32_t *bias, const int32_t *q, int32_t c_total,
                                int has_left, int32_t out_offset, int32_t act_min, int32_t act_max, int8_t *y0,
                                int8_t *y1)
{
    const int32_t row_bytes = 64 * (chunks + (tail ? 1 : 0)), run = 16 * chunks + tail;
    int32_t f, px;
    (void)has_left;
    for (px = 0; px < 2; px++) {
        for (f = 0; f < 4; f++) {
            int32_t acc = bias[f], r, i, qc[4];
            for (r = 0; r < rows; r++) {
                for (i = 0; i < run; i++) {
                    acc += x[px * xs + r * x_row + i] * w[r * row_bytes + (i / 16) * 64 + f * 16 + i % 16];
                }
            }
            qc[0] = q[f];
            qc[1] = -q[2 * c_total + f];
            qc[2] = q[3 * c_total + f];
            qc[3] = q[c_total + f];
            (px ? y1 : y0)[f] = cg_output(acc, qc, 2, out_offset, act_min, act_max);
        }
    }
}
#endif

/*
 * Helium tiles of whole kernel rows, the accumulators in a buffer: the generator writes, per layer,
 * one assembly loop over groups of four filters (its ``_tiles`` functions: every chunk unrolled,
 * the first one VMLADAV so that no accumulator is initialised, the eight (or four) accumulators
 * pinned to the even registers and stored with one STM per tile) that leaves, per group g,
 * ``acc[g * 4 * npx ..]`` = pixel 0's four sums, then pixel 1's; cg_tile_epilogue_mve then adds
 * the biases and requantizes four lanes at a time.  cg_tiles_c is that loop in C (hosts: the same
 * sums, so the host tests check the generator's weight walk).  The interleaved weights
 * (cg_conv_2x4_mvei's table) start at ``w``; ``skip`` bytes follow each group's ``rows`` rows.
 */
CG_INLINE void cg_tiles_c(const int8_t *x, int32_t xs, int32_t x_row, const int8_t *w, int32_t rows, int32_t chunks,
                          int32_t tail, int32_t skip, int32_t groups, int npx, int32_t *acc)
{
    const int32_t row_bytes = 64 * (chunks + (tail ? 1 : 0)), run = 16 * chunks + tail;
    int32_t g, f, px, r, i;
    for (g = 0; g < groups; g++) {
        for (px = 0; px < npx; px++) {
            for (f = 0; f < 4; f++) {
                int32_t a = 0;
                for (r = 0; r < rows; r++) {
                    for (i = 0; i < run; i++) {
                        a += x[px * xs + r * x_row + i] * w[r * row_bytes + (i / 16) * 64 + f * 16 + i % 16];
                    }
                }
                acc[(g * npx + px) * 4 + f] = a;
            }
        }
        w += rows * row_bytes + skip;
    }
}

/** The epilogue of ``groups`` tiles of cg_tiles_c's layout: bias, requantize, clamp, store (y1: pixel 1). */
#ifdef CG_HAVE_MVE
CG_INLINE void cg_tile_epilogue_mve(const int32_t *acc, int32_t groups, int npx, const int32_t *bias, const int32_t *q,
                                    int32_t c_total, int flags, int32_t out_offset, int32_t act_min, int32_t act_max,
                                    int8_t *y0, int8_t *y1)
{
    int32_t g;
    for (g = 0; g < groups; g++) {
        const int32x4_t b = vldrwq_s32(bias + 4 * g);
        const int32x4_t va = cg_requant4_mve(vaddq_s32(vldrwq_s32(acc + g * 4 * npx), b), q + 4 * g, c_total, flags,
                                             out_offset, act_min, act_max);
        if (npx == 2) {
            const int32x4_t vb = cg_requant4_mve(vaddq_s32(vldrwq_s32(acc + g * 8 + 4), b), q + 4 * g, c_total,
                                                 flags, out_offset, act_min, act_max);
            vstrbq_s32(y1 + 4 * g, vb);
        }
        vstrbq_s32(y0 + 4 * g, va);
    }
}
#else
CG_INLINE void cg_tile_epilogue_mve(const int32_t *acc, int32_t groups, int npx, const int32_t *bias, const int32_t *q,
                                    int32_t c_total, int flags, int32_t out_offset, int32_t act_min, int32_t act_max,
                                    int8_t *y0, int8_t *y1)
{
    int32_t g, f, px;
    (void)flags;
    for (g = 0; g < groups; g++) {
        for (px = 0; px < npx; px++) {
            for (f = 0; f < 4; f++) {
                const int32_t c = 4 * g + f;
                int32_t qc[4];
                qc[0] = q[c];
                qc[1] = -q[2 * c_total + c];
                qc[2] = q[3 * c_total + c];
                qc[3] = q[c_total + c];
                (px ? y1 : y0)[c] = cg_output(acc[(g * npx + px) * 4 + f] + bias[c], qc, 2, out_offset, act_min,
                                              act_max);
            }
        }
    }
}
#endif

/* ------------------------------------------------------------------ four int32 lanes */
/*
 * cg_v4: four int32 lanes for the generated Helium depthwise segments - the MVE intrinsics on
 * Helium cores, the same values in C elsewhere (host tests of the "mve" path's C):
 * cg_v4_ld8 (four int8 -> int32, VLDRB.S32), cg_v4_ld32 (VLDRW), cg_v4_mla (acc + x * w: VMUL, VADD),
 * cg_v4_st8 (narrowing store, VSTRB.32), cg_v4_out (the short epilogue, cg_requant4_mve).
 */
#ifdef CG_HAVE_MVE
typedef int32x4_t cg_v4;
#define cg_v4_ld8(p) vldrbq_s32(p)
#define cg_v4_ld32(p) vldrwq_s32(p)
#define cg_v4_mla(acc, x, w) vaddq_s32((acc), vmulq_s32((x), (w))) /* (no vector x vector VMLA in MVE) */
#define cg_v4_st8(p, v) vstrbq_s32((p), (v))
#define cg_v4_out(acc, q, c_total, has_left, out_offset, act_min, act_max)                                    \
    cg_requant4_mve((acc), (q), (c_total), (has_left), (out_offset), (act_min), (act_max))
#else
typedef struct {
    int32_t v[4];
} cg_v4;
CG_INLINE cg_v4 cg_v4_ld8(const int8_t *p)
{
    cg_v4 r;
    int k;
    for (k = 0; k < 4; k++) {
        r.v[k] = p[k];
    }
    return r;
}
CG_INLINE cg_v4 cg_v4_ld32(const int32_t *p)
{
    cg_v4 r;
    memcpy(r.v, p, sizeof r.v);
    return r;
}
CG_INLINE cg_v4 cg_v4_mla(cg_v4 acc, cg_v4 x, cg_v4 w)
{
    int k;
    for (k = 0; k < 4; k++) {
        acc.v[k] += x.v[k] * w.v[k];
    }
    return acc;
}
CG_INLINE void cg_v4_st8(int8_t *p, cg_v4 v)
{
    int k;
    for (k = 0; k < 4; k++) {
        p[k] = (int8_t)v.v[k];
    }
}
CG_INLINE cg_v4 cg_v4_out(cg_v4 acc, const int32_t *q, int32_t c_total, int has_left, int32_t out_offset,
                          int32_t act_min, int32_t act_max)
{
    int k;
    (void)has_left;
    for (k = 0; k < 4; k++) {
        int32_t qc[4];
        qc[0] = q[k];
        qc[1] = -q[2 * c_total + k];
        qc[2] = q[3 * c_total + k];
        qc[3] = q[c_total + k];
        acc.v[k] = cg_output(acc.v[k], qc, 2, out_offset, act_min, act_max);
    }
    return acc;
}
#endif

/* ------------------------------------------------------------------ sixteen channels */
/*
 * The Helium depthwise rows of 16 channels per step (C % 16 == 0, at most 9 taps in the window):
 * the generator writes each as an assembly function (``_dw16``: per tap one VLDRB.8 of 16 inputs
 * through the tap's own pointer, the widened products VMULLB/VMULLT.S8 -> int16 (exact), VMOVLB/
 * VMOVLT.S16 into four int32 accumulators; the epilogue on the four vectors, saturating narrows
 * to int16, the output offset added saturating, narrows to int8, one VSTRB.8).  The accumulators
 * hold the channels in the order of CG_DW16_LANE (0 4 8 12, 2 6 10 14, 1 5 9 13, 3 7 11 15), and so
 * do the bias rows and the epilogue table ({multiplier, -right, [left]} x 16 per group of 16).
 * cg_dw16_c is the same function in C (hosts; tap_x: the taps' input offsets from x, tap_w: their
 * indices in the kernel, whose ``kernel_taps`` x 16 weights follow per group).
 */
CG_INLINE void cg_dw16_c(const int8_t *x, int8_t *y, int32_t n, const int8_t *w, const int32_t *q, const int32_t *bias,
                         int32_t c, int32_t x_step, const int32_t *tap_x, const int32_t *tap_w, int32_t taps,
                         int32_t kernel_taps, int32_t q_rows, int32_t out_offset, int32_t act_min, int32_t act_max)
{
    static const int32_t lane_of[16] = {0, 8, 4, 12, 1, 9, 5, 13, 2, 10, 6, 14, 3, 11, 7, 15}; /* channel -> lane */
    int32_t px, ch, t;
    for (px = 0; px < n; px++) {
        for (ch = 0; ch < c; ch++) {
            const int32_t g = ch / 16, l = lane_of[ch % 16];
            const int32_t *qg = q + g * 16 * q_rows;
            int32_t acc = bias[g * 16 + l], qc[4];
            for (t = 0; t < taps; t++) {
                acc += x[px * x_step + tap_x[t] + ch] * w[(g * kernel_taps + tap_w[t]) * 16 + ch % 16];
            }
            qc[0] = qg[l];
            qc[1] = -qg[16 + l];
            qc[2] = (int32_t)((uint32_t)1u << qc[1]);
            qc[3] = q_rows > 2 ? qg[32 + l] : 0;
            y[px * c + ch] = cg_output(acc, qc, 2, out_offset, act_min, act_max);
        }
    }
}

/* ------------------------------------------------------------------ depthwise */
/*
 * cg_dw4_dsp(x, w, acc): one tap of a depthwise convolution for four channels:
 * acc[k] += x[k] * w[k], k = 0..3, the weights pre-widened to int16 pairs in SXTB16 order,
 * (w0, w2) then (w1, w3), laid out by the generator (other cores run the C loops).
 */
CG_INLINE void cg_dw4_dsp(const int8_t *x, const int16_t *w, int32_t *acc)
{
    const int32_t xv = cg_read32(x);
    const int32_t xa = cg_sxtb16(xv), xb = cg_sxtb16_ror8(xv);
    int32_t wa, wb;
    memcpy(&wa, w, 4);
    memcpy(&wb, w + 2, 4);
    acc[0] = cg_smlabb(xa, wa, acc[0]);
    acc[2] = cg_smlatt(xa, wa, acc[2]);
    acc[1] = cg_smlabb(xb, wb, acc[1]);
    acc[3] = cg_smlatt(xb, wb, acc[3]);
}

/*
 * CG_DW4_TAP(XR, WG, XOFF, WOFF, A0, A1, A2, A3): cg_dw4_dsp for the tap whose four input values
 * are at byte XOFF of XR and whose widened weights at byte WOFF of WG (integer literals, XOFF <
 * 4096, WOFF < 1024): three LDRs (input word first, then the two weight words: 2 + 1 + 1 cycles on a
 * Cortex-M4, where one LDRD and one LDR take 3 + 2), two SXTB16, four SMLAxy on DSP cores (gcc
 * interleaves the taps of C code badly and spills; the accumulators stay in registers here).
 */
#ifdef CG_HAVE_DSP
#define CG_DW4_TAP(XR, WG, XOFF, WOFF, A0, A1, A2, A3)                                               \
    do {                                                                                             \
        int32_t cg_wa, cg_wb, cg_t1, cg_t2;                                                          \
        __asm__("ldr %[t1], [%[x], #" #XOFF "]\n\t"                                                   \
                "ldr %[wa], [%[w], #" #WOFF "]\n\t"                                                   \
                "ldr %[wb], [%[w], #" #WOFF " + 4]\n\t"                                               \
                "sxtb16 %[t2], %[t1]\n\t"                                                            \
                "sxtb16 %[t1], %[t1], ror #8\n\t"                                                    \
                "smlabb %[a0], %[t2], %[wa], %[a0]\n\t"                                              \
                "smlatt %[a2], %[t2], %[wa], %[a2]\n\t"                                              \
                "smlabb %[a1], %[t1], %[wb], %[a1]\n\t"                                              \
                "smlatt %[a3], %[t1], %[wb], %[a3]"                                                    \
                : [a0] "+r"(A0), [a1] "+r"(A1), [a2] "+r"(A2), [a3] "+r"(A3), [wa] "=&r"(cg_wa),       \
                  [wb] "=&r"(cg_wb), [t1] "=&r"(cg_t1), [t2] "=&r"(cg_t2)                              \
                : [x] "r"(XR), [w] "r"(WG)                                                           \
                : "memory");                                                                         \
    } while (0)
#else
#define CG_DW4_TAP(XR, WG, XOFF, WOFF, A0, A1, A2, A3)                                               \
    do {                                                                                             \
        int32_t cg_acc[4];                                                                           \
        cg_acc[0] = (A0);                                                                            \
        cg_acc[1] = (A1);                                                                            \
        cg_acc[2] = (A2);                                                                            \
        cg_acc[3] = (A3);                                                                            \
        cg_dw4_dsp((XR) + (XOFF), (WG) + (WOFF) / 2, cg_acc);                                        \
        (A0) = cg_acc[0];                                                                            \
        (A1) = cg_acc[1];                                                                            \
        (A2) = cg_acc[2];                                                                            \
        (A3) = cg_acc[3];                                                                            \
    } while (0)
#endif

/*
 * CG_DW4_TAP2(XR, WG, XOFF, XS, WOFF, A0..A3, B0..B3): CG_DW4_TAP for two output pixels whose inputs
 * are XS bytes apart (the next output column: stride x C), the tap's widened weights loaded once for
 * both (XOFF + XS < 4096): 3 + 1 LDRs, 4 SXTB16, 8 SMLAxy - 18 cycles for 8 MACs on a Cortex-M4
 * against 2 x 10.  On DSP cores a window's taps go into one assembly statement (gcc shuffles eight
 * accumulators between separate ones): __asm__(CG_DW2_STEP(XOFF, XS, WOFF) ... CG_DW2_OPERANDS(XR, WG,
 * A0..A3, B0..B3)), which the generator writes under #ifdef CG_HAVE_DSP, CG_DW4_TAP2 (C) elsewhere.
 */
#ifdef CG_HAVE_DSP
#define CG_DW2_STEP(XOFF, XS, WOFF)                                                                  \
    "ldr %[wa], [%[w], #" #WOFF "]\n\t"                                                               \
    "ldr %[wb], [%[w], #" #WOFF " + 4]\n\t"                                                           \
    "ldr %[t1], [%[x], #" #XOFF "]\n\t"                                                               \
    "sxtb16 %[t2], %[t1]\n\t"                                                                        \
    "sxtb16 %[t1], %[t1], ror #8\n\t"                                                                \
    "smlabb %[a0], %[t2], %[wa], %[a0]\n\t"                                                          \
    "smlatt %[a2], %[t2], %[wa], %[a2]\n\t"                                                          \
    "smlabb %[a1], %[t1], %[wb], %[a1]\n\t"                                                          \
    "smlatt %[a3], %[t1], %[wb], %[a3]\n\t"                                                          \
    "ldr %[t1], [%[x], #" #XOFF " + " #XS "]\n\t"                                                     \
    "sxtb16 %[t2], %[t1]\n\t"                                                                        \
    "sxtb16 %[t1], %[t1], ror #8\n\t"                                                                \
    "smlabb %[b0], %[t2], %[wa], %[b0]\n\t"                                                          \
    "smlatt %[b2], %[t2], %[wa], %[b2]\n\t"                                                          \
    "smlabb %[b1], %[t1], %[wb], %[b1]\n\t"                                                          \
    "smlatt %[b3], %[t1], %[wb], %[b3]\n\t"
#define CG_DW2_OPERANDS(XR, WG, A0, A1, A2, A3, B0, B1, B2, B3)                                      \
    : [a0] "+r"(A0), [a1] "+r"(A1), [a2] "+r"(A2), [a3] "+r"(A3), [b0] "+r"(B0), [b1] "+r"(B1),         \
      [b2] "+r"(B2), [b3] "+r"(B3), [wa] "=&r"(cg_wa), [wb] "=&r"(cg_wb), [t1] "=&r"(cg_t1),           \
      [t2] "=&r"(cg_t2)                                                                              \
    : [x] "r"(XR), [w] "r"(WG)                                                                       \
    : "memory"
#endif
#define CG_DW4_TAP2(XR, WG, XOFF, XS, WOFF, A0, A1, A2, A3, B0, B1, B2, B3)                          \
    do {                                                                                             \
        CG_DW4_TAP((XR), WG, XOFF, WOFF, A0, A1, A2, A3);                                            \
        CG_DW4_TAP((XR) + (XS), WG, XOFF, WOFF, B0, B1, B2, B3);                                     \
    } while (0)

/*
 * Channel-planar 3x3 depthwise convolution at stride 1 (generated.py, _dw_planar; DSP cores): per group
 * of G = 2 or 4 channels the layer gathers each input row once, widened to int16, into one of three
 * row slots of a stack buffer (G planes of ``rs`` elements; the padding columns and rows hold the input
 * zero point, so every output takes the interior folded bias), then slides each channel's three rows
 * along the output row, four outputs per step: a kernel row's weights are two int16 pairs (w0, w1) and
 * (w1, w2) in registers, its input words (x0, x1), (x2, x3), (x4, x5) loaded once for the four outputs,
 * two SMLAxy per output and kernel row:
 *   out0 += (x0, x1).(w0, w1) + x2 w2       SMLAD, SMLABT      out1 += x1 w0 + (x2, x3).(w1, w2)  SMLATB, SMLAD
 *   out2 += (x2, x3).(w0, w1) + x4 w2       SMLAD, SMLABT      out3 += x3 w0 + (x4, x5).(w1, w2)  SMLATB, SMLAD
 */
/** ``n`` words ``v`` at ``d`` (the buffer's zero-point fill). */
CG_INLINE void cg_dwp_fill(int16_t *d, int32_t n, int32_t v)
{
    int32_t i;
    for (i = 0; i < n; i++) {
        memcpy(d + 2 * i, &v, 4);
    }
}

/** Elements [e0, e0 + n) of ``g`` int16 rows ``rs`` apart at ``d`` set to ``v`` (a padding row). */
CG_INLINE void cg_dwp_pad_row(int16_t *d, int32_t rs, int32_t e0, int32_t n, int g, int32_t v)
{
    int32_t i, k;
    for (k = 0; k < g; k++) {
        for (i = 0; i < n; i++) {
            d[k * rs + e0 + i] = (int16_t)v;
        }
    }
}

/** ``n`` pixels of ``g`` (2 or 4) channels (``x``: the first pixel's first channel, pixels ``c`` bytes
 *  apart) widened into ``g`` int16 rows ``rs`` apart at ``d``, elements [e0, e0 + n) (``d``, ``rs`` even:
 *  the pixel pairs at even elements are stored as words, two pixels' words repacked by PKHBT/PKHTB). */
CG_INLINE void cg_dwp_gather(const int8_t *x, int32_t c, int16_t *d, int32_t rs, int32_t e0, int32_t n, int g)
{
    int32_t i = 0, k;
    if (e0 & 1) { /* an odd first element: its pixel alone */
        for (k = 0; k < g; k++) {
            d[k * rs + e0] = x[k];
        }
        i = 1;
    }
    for (; i + 1 < n; i += 2) {
        const int8_t *p = x + i * c;
        int16_t *o = d + e0 + i;
        uint32_t v0, v1;
        int32_t lo, w;
        if (g == 4) {
            memcpy(&v0, p, 4);
            memcpy(&v1, p + c, 4);
        } else {
            uint16_t h0, h1;
            memcpy(&h0, p, 2);
            memcpy(&h1, p + c, 2);
            v0 = h0;
            v1 = h1;
        }
        lo = corten_u32_to_i32((v0 & 0xFFFFu) | (v1 << 16)); /* (a0, a1, b0, b1): PKHBT */
        w = cg_sxtb16(lo);
        memcpy(o, &w, 4);
        w = cg_sxtb16_ror8(lo);
        memcpy(o + rs, &w, 4);
        if (g == 4) {
            const int32_t hi = corten_u32_to_i32((v1 & 0xFFFF0000u) | (v0 >> 16)); /* (a2, a3, b2, b3): PKHTB */
            w = cg_sxtb16(hi);
            memcpy(o + 2 * rs, &w, 4);
            w = cg_sxtb16_ror8(hi);
            memcpy(o + 3 * rs, &w, 4);
        }
    }
    if (i < n) { /* an odd last pixel alone */
        for (k = 0; k < g; k++) {
            d[k * rs + e0 + i] = x[i * c + k];
        }
    }
}

/** One kernel row of four outputs (see above): ``r`` the row at the first output's first tap. */
#define CG_DWP_KROW(R, WA, WB, A0, A1, A2, A3)                                                       \
    do {                                                                                             \
        int32_t cg_x0, cg_x1, cg_x2;                                                                 \
        memcpy(&cg_x0, (R), 4);                                                                      \
        memcpy(&cg_x1, (R) + 2, 4);                                                                  \
        memcpy(&cg_x2, (R) + 4, 4);                                                                  \
        (A0) = cg_smlad(cg_x0, (WA), (A0));                                                          \
        (A1) = cg_smlatb(cg_x0, (WA), (A1));                                                         \
        (A0) = cg_smlabt(cg_x1, (WB), (A0));                                                         \
        (A1) = cg_smlad(cg_x1, (WB), (A1));                                                          \
        (A2) = cg_smlad(cg_x1, (WA), (A2));                                                          \
        (A3) = cg_smlatb(cg_x1, (WA), (A3));                                                         \
        (A2) = cg_smlabt(cg_x2, (WB), (A2));                                                         \
        (A3) = cg_smlad(cg_x2, (WB), (A3));                                                          \
    } while (0)

/** One output row of one channel: ``n`` outputs (``y``, ``ys`` bytes apart) from its three input rows
 *  ``r0..r2`` (int16, 4-byte aligned, element 0 under the first output's first tap, roundup(n, 4) + 2
 *  elements); ``wb``: the channel's pairs (w0, w1), (w1, w2) of kernel rows 0, 1, 2, then its bias;
 *  ``q`` its epilogue constants, the rest cg_output's arguments. */
CG_INLINE void cg_dwp_row(const int16_t *r0, const int16_t *r1, const int16_t *r2, const int32_t *wb,
                          const int32_t *q, int8_t *y, int32_t ys, int32_t n, int epilogue, int32_t out_offset,
                          int32_t act_min, int32_t act_max)
{
    const int32_t wa0 = wb[0], wb0 = wb[1], wa1 = wb[2], wb1 = wb[3], wa2 = wb[4], wb2 = wb[5], bias = wb[6];
    const int32_t qv[4] = {q[0], q[1], q[2], q[3]};
    int32_t i;
    for (i = 0; i < n; i += 4, r0 += 4, r1 += 4, r2 += 4, y += 4 * ys) {
        int32_t a0 = bias, a1 = bias, a2 = bias, a3 = bias;
        CG_DWP_KROW(r0, wa0, wb0, a0, a1, a2, a3);
        CG_DWP_KROW(r1, wa1, wb1, a0, a1, a2, a3);
        CG_DWP_KROW(r2, wa2, wb2, a0, a1, a2, a3);
        {
            const int8_t v0 = cg_output(a0, qv, epilogue, out_offset, act_min, act_max);
            const int8_t v1 = cg_output(a1, qv, epilogue, out_offset, act_min, act_max);
            const int8_t v2 = cg_output(a2, qv, epilogue, out_offset, act_min, act_max);
            const int8_t v3 = cg_output(a3, qv, epilogue, out_offset, act_min, act_max);
            if (i + 4 <= n) {
                y[0] = v0;
                y[ys] = v1;
                y[2 * ys] = v2;
                y[3 * ys] = v3;
            } else {
                y[0] = v0;
                if (i + 1 < n) {
                    y[ys] = v1;
                }
                if (i + 2 < n) {
                    y[2 * ys] = v2;
                }
            }
        }
    }
}

/** cg_dwp_row at stride 2: output k reads the pairs P_k = (x_2k, x_2k+1) and P_k+1 of each row,
 *  P_k . (w0, w1) + P_k+1.lo w2 (SMLAD, SMLABT); rows of 2 roundup(n, 4) + 2 elements. */
CG_INLINE void cg_dwp_row_s2(const int16_t *r0, const int16_t *r1, const int16_t *r2, const int32_t *wb,
                             const int32_t *q, int8_t *y, int32_t ys, int32_t n, int epilogue, int32_t out_offset,
                             int32_t act_min, int32_t act_max)
{
    const int16_t *rows[3];
    const int32_t qv[4] = {q[0], q[1], q[2], q[3]};
    int32_t i, r;
    rows[0] = r0;
    rows[1] = r1;
    rows[2] = r2;
    for (i = 0; i < n; i++) {
        int32_t acc = wb[6];
        for (r = 0; r < 3; r++) {
            int32_t p0, p1;
            memcpy(&p0, rows[r] + 2 * i, 4);
            memcpy(&p1, rows[r] + 2 * i + 2, 4);
            acc = cg_smlad(p0, wb[2 * r], acc);
            acc = cg_smlabt(p1, wb[2 * r + 1], acc);
        }
        y[i * ys] = cg_output(acc, qv, epilogue, out_offset, act_min, act_max);
    }
}

#ifdef CG_HAVE_MVE
/**
 * One output pixel of a depthwise convolution on Helium, all channels, four per vector:
 * acc = bias + sum over the rows x cols taps, then the short epilogue on four lanes
 * (q planar: multiplier[c], left[c], -right[c], 2**right[c] at c, c + C, c + 2C, c + 3C).
 */
CG_INLINE void cg_dw_pixel_mve(const int8_t *x, int32_t row_stride, const int8_t *w, int32_t w_row_stride,
                               int32_t rows, int32_t cols, int32_t c_total, const int32_t *bias, const int32_t *q,
                               int32_t out_offset, int32_t act_min, int32_t act_max, int8_t *out)
{
    int32_t c;
    for (c = 0; c < c_total; c += 4) {
        const mve_pred16_t p = vctp32q((uint32_t)(c_total - c));
        int32x4_t acc = vldrwq_z_s32(bias + c, p);
        int32_t r, j;
        for (r = 0; r < rows; r++) {
            for (j = 0; j < cols; j++) {
                const int32x4_t xv = vldrbq_z_s32(x + r * row_stride + j * c_total + c, p);
                const int32x4_t wv = vldrbq_z_s32(w + r * w_row_stride + j * c_total + c, p);
                acc = vaddq_s32(acc, vmulq_s32(xv, wv));
            }
        }
        {
            const int32x4_t mult = vldrwq_z_s32(q + c, p);
            const int32x4_t left = vldrwq_z_s32(q + c_total + c, p);
            const int32x4_t neg_right = vldrwq_z_s32(q + 2 * c_total + c, p);
            const int32x4_t pow2 = vldrwq_z_s32(q + 3 * c_total + c, p);
            int32x4_t v = vqrdmulhq_s32(vshlq_s32(acc, left), mult);
            int32x4_t t = vaddq_s32(pow2, vshrq_n_s32(v, 31));
            v = vaddq_s32(v, vshrq_n_s32(t, 1));
            v = vshlq_s32(v, neg_right);
            v = vaddq_n_s32(v, out_offset);
            v = vmaxq_s32(v, vdupq_n_s32(act_min));
            v = vminq_s32(v, vdupq_n_s32(act_max));
            vstrbq_p_s32(out + c, v, p);
        }
    }
}
#else
CG_INLINE void cg_dw_pixel_mve(const int8_t *x, int32_t row_stride, const int8_t *w, int32_t w_row_stride,
                               int32_t rows, int32_t cols, int32_t c_total, const int32_t *bias, const int32_t *q,
                               int32_t out_offset, int32_t act_min, int32_t act_max, int8_t *out)
{
    int32_t c;
    for (c = 0; c < c_total; c++) {
        int32_t acc = bias[c], r, j, qc[4];
        for (r = 0; r < rows; r++) {
            for (j = 0; j < cols; j++) {
                acc += x[r * row_stride + j * c_total + c] * w[r * w_row_stride + j * c_total + c];
            }
        }
        qc[0] = q[c];
        qc[1] = -q[2 * c_total + c];
        qc[2] = q[3 * c_total + c];
        qc[3] = q[c_total + c];
        out[c] = cg_output(acc, qc, 2, out_offset, act_min, act_max);
    }
}
#endif

#endif /* CORTEN_GEN_H */
