/*
 * lstm.c - Corten portable unidirectional LSTM layer, TFLite's int8 LSTM arithmetic (the arithmetic
 * of CMSIS-NN's arm_lstm_unidirectional_s8): int8 input, hidden state and weights, int16 gates
 * (Q3.12 pre-activations, Q0.15 sigmoid/tanh outputs) and an int16 cell state with a power-of-two
 * scale.  Bit-exact with the reference kernel corten.ops.lstm.quantized_lstm.
 *
 * Per time step, for every batch b and hidden unit j:
 *   gate_k = act_k(sat16(R(x.Wx_k + ebx_k) + R(h_prev.Wh_k + ebh_k)))  (no hidden term at t = 0)
 *   c = sat16(R(f * c)); c = clamp(R(i * g) + c, -cell_clip, cell_clip)
 *   h = clamp(R(o * tanh16(c)) + output_offset, -128, 127)
 * where R is arm_nn_requantize and act_k is arm_nn_activation_s16 (sigmoid for i, f, o; tanh for g)
 * on the given 256-entry table.
 */
#include <stddef.h>

#include "corten_kernels.h"

#define LSTM_Q15_MIN (-32768)
#define LSTM_Q15_MAX 32767

static int32_t lstm_clamp(int32_t v, int32_t lo, int32_t hi)
{
    return v < lo ? lo : (v > hi ? hi : v);
}

/* (int16_t) of a uint32: its low 16 bits, two's complement. */
static int16_t lstm_low16(uint32_t v)
{
    const int32_t low = (int32_t)(v & 0xFFFFu);
    return (int16_t)(low >= 0x8000 ? low - 0x10000 : low);
}

/* arm_nn_activation_s16 on one value: sigmoid (is_sigmoid) or tanh, table interpolation. */
static int16_t lstm_activation_s16(int32_t in, int32_t left_shift, int32_t is_sigmoid, const int32_t *table)
{
    const uint32_t abs_input_shift = is_sigmoid ? 9u : 8u;
    const uint32_t max_saturation = is_sigmoid ? (0x7FFFu << 10) : (0xFFFFu << 8);
    const int32_t input_multiplier = left_shift < 0 ? 3 : 3 * (1 << left_shift);
    const int32_t abs_left_shift = left_shift < 0 ? -left_shift : 0;
    const int32_t rounding = abs_left_shift > 0 ? (1 << (abs_left_shift - 1)) : 0;
    const int32_t data = corten_asr32(in * input_multiplier + rounding, abs_left_shift);
    const uint32_t abs_data = data > 0 ? (uint32_t)data : (uint32_t)(-data);
    const uint32_t uh = abs_data >> abs_input_shift;
    uint32_t result;
    if (uh >= 255u) {
        result = max_saturation;
    } else {
        const uint32_t ua = (uint32_t)table[uh];
        const uint32_t ub = (uint32_t)table[uh + 1u];
        const uint32_t ut = abs_data & (is_sigmoid ? 0x1FFu : 0xFFu);
        result = (ua << abs_input_shift) + ut * (ub - ua);
    }
    if (is_sigmoid) {
        result = (data >= 0) ? (result + (1u << 9)) : ((1u << 25) - result + (1u << 9) - 1u);
        result >>= 10;
    } else {
        result = (data >= 0) ? (result - (1u << 23) + (1u << 7)) : ((0u - result + (1u << 23)) + (1u << 7) - 1u);
        result >>= 8;
    }
    return lstm_low16(result);
}

static int32_t lstm_dot(const int8_t *a, const int8_t *w, int32_t n, int32_t bias)
{
    int64_t acc = bias;
    int32_t k;
    for (k = 0; k < n; k++) {
        acc += (int32_t)a[k] * (int32_t)w[k];
    }
    return corten_wrap_i32(acc);
}

static int lstm_check(const corten_lstm_params *p, const void *output, const void *scratch)
{
    if (p == NULL || output == NULL || scratch == NULL || p->input_weights == NULL || p->hidden_weights == NULL ||
        p->input_effective_bias == NULL || p->hidden_effective_bias == NULL || p->gate_multipliers == NULL ||
        p->gate_shifts == NULL || p->sigmoid_table == NULL) {
        return CORTEN_ERROR_ARGUMENT;
    }
    if (p->batches < 1 || p->time_steps < 1 || p->input_size < 1 || p->hidden_size < 1 ||
        p->cell_scale_power + 12 > 13) {
        return CORTEN_ERROR_ARGUMENT;
    }
    return CORTEN_OK;
}

static int32_t lstm_row(const corten_lstm_params *p, int32_t t, int32_t b)
{
    return p->time_major ? (t * p->batches + b) : (b * p->time_steps + t);
}

const int8_t *corten_lstm_input_row(const corten_lstm_params *p, const int8_t *input, int32_t t, int32_t b)
{
    return input + lstm_row(p, t, b) * p->input_size;
}

const int8_t *corten_lstm_hidden_in(const corten_lstm_params *p, const int8_t *output, const void *scratch, int32_t t,
                                    int32_t b)
{
    const int32_t bh = p->batches * p->hidden_size;
    if (t == 0) {
        return NULL;
    }
    if (p->last_only) {
        return (const int8_t *)((const int16_t *)scratch + 5 * bh) + b * p->hidden_size;
    }
    return output + lstm_row(p, t - 1, b) * p->hidden_size;
}

int16_t *corten_lstm_gate_row(const corten_lstm_params *p, void *scratch, int32_t gate, int32_t b)
{
    int16_t *g = (int16_t *)scratch + gate * p->batches * p->hidden_size + b * p->hidden_size;
    int32_t j;
    for (j = 0; j < p->hidden_size; j++) {
        g[j] = 0;
    }
    return g;
}

/* Pre-activations of the four gates of step t (sat16(R(x.Wx + ebx) + R(h.Wh + ebh))), portable. */
static void lstm_gates(const corten_lstm_params *p, int32_t t, const int8_t *input, const int8_t *output, void *scratch)
{
    int32_t b, j, k;
    for (b = 0; b < p->batches; b++) {
        const int8_t *x = corten_lstm_input_row(p, input, t, b);
        const int8_t *h = corten_lstm_hidden_in(p, output, scratch, t, b);
        for (k = 0; k < 4; k++) {
            const int8_t *wx = p->input_weights + k * p->hidden_size * p->input_size;
            const int8_t *wh = p->hidden_weights + k * p->hidden_size * p->hidden_size;
            int16_t *g = corten_lstm_gate_row(p, scratch, k, b);
            for (j = 0; j < p->hidden_size; j++) {
                int32_t r = corten_requantize(
                    lstm_dot(x, wx + j * p->input_size, p->input_size, p->input_effective_bias[k * p->hidden_size + j]),
                    p->gate_multipliers[2 * k], p->gate_shifts[2 * k]);
                r = lstm_clamp(r + g[j], LSTM_Q15_MIN, LSTM_Q15_MAX);
                if (h != NULL) {
                    const int32_t rh = corten_requantize(
                        lstm_dot(h, wh + j * p->hidden_size, p->hidden_size,
                                 p->hidden_effective_bias[k * p->hidden_size + j]),
                        p->gate_multipliers[2 * k + 1], p->gate_shifts[2 * k + 1]);
                    r = lstm_clamp(rh + r, LSTM_Q15_MIN, LSTM_Q15_MAX);
                }
                g[j] = (int16_t)r;
            }
        }
    }
}

int corten_lstm_step_s8(const corten_lstm_params *p, int32_t t, int8_t *output, void *scratch)
{
    int32_t b, j, k;
    int16_t *gates;
    int16_t *cell;
    int8_t *hprev;
    int32_t bh;
    if (lstm_check(p, output, scratch) != CORTEN_OK || t < 0 || t >= p->time_steps) {
        return CORTEN_ERROR_ARGUMENT;
    }
    bh = p->batches * p->hidden_size;
    gates = (int16_t *)scratch;       /* [4][B][H]: input, forget, cell, output */
    cell = gates + 4 * bh;            /* [B][H] */
    hprev = (int8_t *)(cell + bh);    /* [B][H], last_only mode */
    if (t == 0) {
        for (j = 0; j < bh; j++) {
            cell[j] = 0;
        }
    }
    for (k = 0; k < 4; k++) {
        for (j = 0; j < bh; j++) {
            gates[k * bh + j] = lstm_activation_s16(gates[k * bh + j], 0, k != 2, p->sigmoid_table);
        }
    }
    /* Every gate of this step is computed: the previous hidden state may now be overwritten. */
    for (b = 0; b < p->batches; b++) {
        int8_t *hout = p->last_only ? (hprev + b * p->hidden_size) : (output + lstm_row(p, t, b) * p->hidden_size);
        for (j = 0; j < p->hidden_size; j++) {
            const int32_t n = b * p->hidden_size + j;
            const int32_t ig = gates[n], fg = gates[bh + n], cg = gates[2 * bh + n], og = gates[3 * bh + n];
            int32_t c = corten_requantize(fg * (int32_t)cell[n], p->forget_to_cell_multiplier, p->forget_to_cell_shift);
            int32_t th;
            int32_t hv;
            c = lstm_clamp(c, LSTM_Q15_MIN, LSTM_Q15_MAX);
            c = corten_requantize(ig * cg, p->input_to_cell_multiplier, p->input_to_cell_shift) + c;
            c = lstm_clamp(c, -p->cell_clip, p->cell_clip);
            cell[n] = (int16_t)c;
            th = lstm_activation_s16(c, p->cell_scale_power + 12, 0, p->sigmoid_table);
            hv = corten_requantize(og * th, p->output_multiplier, p->output_shift) + p->output_offset;
            hout[j] = (int8_t)lstm_clamp(hv, -128, 127);
        }
    }
    if (p->last_only && t == p->time_steps - 1) {
        for (j = 0; j < bh; j++) {
            output[j] = hprev[j];
        }
    }
    return CORTEN_OK;
}

int corten_lstm_s8(const corten_lstm_params *p, const int8_t *input, int8_t *output, void *scratch)
{
    int32_t t;
    if (input == NULL || lstm_check(p, output, scratch) != CORTEN_OK) {
        return CORTEN_ERROR_ARGUMENT;
    }
    for (t = 0; t < p->time_steps; t++) {
        lstm_gates(p, t, input, output, scratch);
        if (corten_lstm_step_s8(p, t, output, scratch) != CORTEN_OK) {
            return CORTEN_ERROR_ARGUMENT;
        }
    }
    return CORTEN_OK;
}
