/*
 * mul.c - Corten portable elementwise multiply with broadcasting (arm_elementwise_mul_s8 /
 * arm_elementwise_mul_s16 arithmetic; see corten/ops/mul.py), written once for int8 and 16x8
 * (CORTEN_MUL; 16x8 has no offsets).
 *
 * The output is written in storage order; each input is read through its strides in
 * corten_broadcast (0 along a broadcast dimension), so [N, H, W, C] * [N, 1, 1, C] (a
 * squeeze-and-excitation gate) and same-shape operands take the same loop.
 */
#include <stddef.h>

#include "corten_internal.h"
#include "corten_kernels.h"

/* (x1 + offset1) * (x2 + offset2) requantized, offset and clamped (`offsets`: CORTEN_S8_OFFSETS or
 * CORTEN_S16_OFFSETS): |x + offset| <= 255 (int8) and |x1 * x2| <= 2^30 (int16), so the product fits
 * in int32 exactly. */
static inline int32_t corten_mul_one(const corten_mul_params *params, int32_t x1, int32_t x2, int offsets)
{
    const int32_t y = corten_requantize((x1 + (offsets ? params->input1_offset : 0)) *
                                            (x2 + (offsets ? params->input2_offset : 0)),
                                        params->output_multiplier, params->output_shift);
    return corten_offset_clamp_i32(y, offsets ? params->output_offset : 0, params->activation_min,
                                   params->activation_max);
}

#define CORTEN_MUL(name, type, offsets)                                                                    \
    int name(const corten_mul_params *params, const corten_broadcast *shape, const type *input1,          \
             const type *input2, type *output)                                                             \
    {                                                                                                      \
        if (params == NULL || shape == NULL || input1 == NULL || input2 == NULL || output == NULL ||       \
            !corten_broadcast_ok(shape)) {                                                                 \
            return CORTEN_ERROR_ARGUMENT;                                                                  \
        }                                                                                                  \
        {   /* a local copy: the stores through `type *` cannot change it, so it is read once */           \
            const corten_mul_params p = *params;                                                           \
            CORTEN_BROADCAST_EACH(shape, type, input1, input2, output, (type)corten_mul_one(&p, x1, x2, offsets)); \
        }                                                                                                  \
        return CORTEN_OK;                                                                                  \
    }

CORTEN_MUL(corten_mul_s8, int8_t, CORTEN_S8_OFFSETS)
CORTEN_MUL(corten_elementwise_mul_s16, int16_t, CORTEN_S16_OFFSETS)
