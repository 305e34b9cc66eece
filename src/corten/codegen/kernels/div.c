/*
 * div.c - Corten portable int8 elementwise division with broadcasting (see corten/ops/div.py).
 *
 * a = x1 + input1_offset, b = x2 + input2_offset (in [-255, 255]); the quotient a / b in Q16,
 * rounded half away from zero, is requantized once.  b == 0 saturates (act_max for a > 0, act_min
 * for a < 0, the clamped output offset for 0 / 0).
 */
#include <stddef.h>

#include "corten_internal.h"
#include "corten_kernels.h"

static int8_t corten_div_one(const corten_mul_params *p, int32_t a, int32_t b)
{
    int32_t num, den, q;
    if (b == 0) {
        const int32_t zero = p->output_offset < p->activation_min
                                 ? p->activation_min
                                 : (p->output_offset > p->activation_max ? p->activation_max : p->output_offset);
        return (int8_t)(a > 0 ? p->activation_max : (a < 0 ? p->activation_min : zero));
    }
    num = (a < 0 ? -a : a) * 65536; /* |a| <= 255: below 2**24 */
    den = b < 0 ? -b : b;
    q = (num + den / 2) / den;
    if ((a < 0) != (b < 0)) {
        q = -q;
    }
    return corten_offset_clamp(corten_requantize(q, p->output_multiplier, p->output_shift), p->output_offset,
                               p->activation_min, p->activation_max);
}

int corten_div_s8(const corten_mul_params *params, const corten_broadcast *shape, const int8_t *input1,
                  const int8_t *input2, int8_t *output)
{
    if (params == NULL || shape == NULL || input1 == NULL || input2 == NULL || output == NULL ||
        !corten_broadcast_ok(shape)) {
        return CORTEN_ERROR_ARGUMENT;
    }
    CORTEN_BROADCAST_EACH(shape, int8_t, input1, input2, output,
                          corten_div_one(params, x1 + params->input1_offset, x2 + params->input2_offset));
    return CORTEN_OK;
}
