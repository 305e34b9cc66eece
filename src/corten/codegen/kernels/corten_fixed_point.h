/*
 * corten_fixed_point.h - CMSIS-NN's int8 fixed-point arithmetic (TFLite int8 spec), in portable C99.
 *
 * Mirrors corten/fixed_point.py bit for bit: requantize is CMSIS-NN's default double rounding
 * (a rounding doubling high multiply, ties towards +inf, then a rounding right shift, ties away
 * from zero).  Everything here is well-defined C99 with no implementation-defined behaviour on
 * the arithmetic path: wrap-around is done on unsigned values and converted back with
 * corten_u32_to_i32, arithmetic right shifts of negative values are written as ~(~v >> n)
 * (both compile to single instructions with gcc/clang at -O1 and above).
 */
#ifndef CORTEN_FIXED_POINT_H
#define CORTEN_FIXED_POINT_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/** Two's-complement reinterpretation of a uint32 as int32 (well-defined, no cast of out-of-range values). */
static inline int32_t corten_u32_to_i32(uint32_t u)
{
    return (u <= 0x7FFFFFFFu) ? (int32_t)u : (int32_t)(u - 0x80000000u) - 0x7FFFFFFF - 1;
}

/** Wrap an int64 to int32 (mod 2**32), as a C cast on a two's-complement machine does. */
static inline int32_t corten_wrap_i32(int64_t v)
{
    return corten_u32_to_i32((uint32_t)(uint64_t)v);
}

/** int32 addition with two's-complement wrap-around (no signed overflow). */
static inline int32_t corten_add_wrap(int32_t a, int32_t b)
{
    return corten_u32_to_i32((uint32_t)a + (uint32_t)b);
}

/** floor(v / 2**n) for 0 <= n <= 31 (arithmetic shift right). */
static inline int32_t corten_asr32(int32_t v, int32_t n)
{
    return (v < 0) ? ~(~v >> n) : (v >> n);
}

/** floor(v / 2**n) for 0 <= n <= 63 (arithmetic shift right). */
static inline int64_t corten_asr64(int64_t v, int32_t n)
{
    return (v < 0) ? ~(~v >> n) : (v >> n);
}

/** arm_nn_doubling_high_mult_no_sat: (m1 * m2 + 2**30) >> 31, ties towards +inf. */
static inline int32_t corten_doubling_high_mult_no_sat(int32_t m1, int32_t m2)
{
    const int64_t p = (int64_t)m1 * (int64_t)m2 + ((int64_t)1 << 30);
    return corten_wrap_i32(corten_asr64(p, 31));
}

/** arm_nn_divide_by_power_of_two: rounding right shift by 0..31, ties away from zero. */
static inline int32_t corten_divide_by_power_of_two(int32_t dividend, int32_t exponent)
{
    const int32_t mask = (int32_t)((((uint32_t)1) << exponent) - 1u);
    const int32_t remainder = dividend & mask;
    const int32_t result = corten_asr32(dividend, exponent);
    const int32_t threshold = (mask >> 1) + (result < 0 ? 1 : 0);
    return result + (remainder > threshold ? 1 : 0);
}

/** arm_nn_requantize (default double rounding): val * multiplier * 2**(shift - 31), rounded. */
static inline int32_t corten_requantize(int32_t val, int32_t multiplier, int32_t shift)
{
    const int32_t left = shift > 0 ? shift : 0;
    const int32_t right = shift < 0 ? -shift : 0;
    const int32_t shifted = corten_u32_to_i32((uint32_t)val << left);
    return corten_divide_by_power_of_two(corten_doubling_high_mult_no_sat(shifted, multiplier), right);
}

/** arm_nn_requantize with CMSIS_NN_USE_SINGLE_ROUNDING (TFLite's TFLITE_SINGLE_ROUNDING
 *  MultiplyByQuantizedMultiplier): (val * multiplier + 2**(30 - shift)) >> (31 - shift), one rounding. */
static inline int32_t corten_requantize_single(int32_t val, int32_t multiplier, int32_t shift)
{
    const int64_t r = corten_asr64((int64_t)val * multiplier, 30 - shift);
    return corten_wrap_i32(corten_asr64(r + 1, 1));
}

/** CMSIS-NN's REDUCE_MULTIPLIER: a Q31 multiplier rounded to the Q15 one of the s16 kernels. */
static inline int32_t corten_reduce_multiplier(int32_t multiplier)
{
    return multiplier < 0x7FFF0000 ? (multiplier + (1 << 15)) >> 16 : 0x7FFF;
}

/**
 * arm_nn_requantize_s64: ((int32_t)((val * reduced_multiplier) >> (14 - shift)) + 1) >> 1, shift <= 14
 * (the 64 -> 32 bit narrowing wraps; the final add is done in 64 bits, so INT32_MAX cannot overflow).
 */
static inline int32_t corten_requantize_s64(int64_t val, int32_t reduced_multiplier, int32_t shift)
{
    const int64_t product = val * (int64_t)reduced_multiplier;
    const int32_t n = 14 - shift;
    const int64_t shifted = product < 0 ? ~(~product >> n) : product >> n; /* arithmetic shift */
    const int32_t narrowed = corten_u32_to_i32((uint32_t)(uint64_t)shifted);
    return (int32_t)(((int64_t)narrowed + 1) >> 1);
}

/** Clamp to [act_min, act_max] and narrow to int16 (the s16 kernels have no output offset). */
static inline int16_t corten_clamp_s16(int32_t v, int32_t act_min, int32_t act_max)
{
    return (int16_t)(v < act_min ? act_min : (v > act_max ? act_max : v));
}

/**
 * Add the output offset (with int32 wrap-around) and clamp to [act_min, act_max].
 */
static inline int8_t corten_offset_clamp(int32_t val, int32_t offset, int32_t act_min, int32_t act_max)
{
    /* int32 wrap-around first, exactly as CMSIS-NN and the Python reference kernels compute it. */
    const int32_t v = corten_add_wrap(val, offset);
    return (int8_t)(v < act_min ? act_min : (v > act_max ? act_max : v));
}

/*
 * The same two steps for the kernels written once for every element width: the clamp, and the
 * offset + clamp, as int32 (each instance narrows to its element type).  Not called by the int8
 * ones above: gcc 12 -O2 compiles their callers' loops into more instructions through the extra
 * inline level (measured: corten_conv_store on Cortex-M4).
 */
static inline int32_t corten_clamp_i32(int32_t v, int32_t act_min, int32_t act_max)
{
    return v < act_min ? act_min : (v > act_max ? act_max : v);
}

static inline int32_t corten_offset_clamp_i32(int32_t val, int32_t offset, int32_t act_min, int32_t act_max)
{
    return corten_clamp_i32(corten_add_wrap(val, offset), act_min, act_max);
}

#ifdef __cplusplus
}
#endif

#endif /* CORTEN_FIXED_POINT_H */
