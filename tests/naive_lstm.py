"""A deliberately naive int8 LSTM layer (CMSIS-NN's ``arm_lstm_unidirectional_s8`` scalar path, i.e.
TFLite's 8x8_16 integer LSTM) in plain Python ints.

Written from the C (``arm_nn_lstm_step_s8``, ``arm_nn_lstm_calculate_gate_s8_s16``,
``arm_nn_vec_mat_mul_result_acc_s8_s16``, ``arm_nn_activation_s16``, ``arm_elementwise_mul_s16``,
``arm_elementwise_mul_acc_s16``, ``arm_elementwise_mul_s16_s8``), independently of
``corten.ops.lstm`` and ``corten.fixed_point``: one batch, one step, one unit at a time, nested
lists, CMSIS-NN's own call order (batch-major: one batch after the other).
"""
from __future__ import annotations

Q15_MIN, Q15_MAX = -32768, 32767


def i32(v: int) -> int:
    v &= 0xFFFFFFFF
    return v - (1 << 32) if v & 0x80000000 else v


def u32(v: int) -> int:
    return v & 0xFFFFFFFF


def doubling_high_mult_no_sat(m1: int, m2: int) -> int:
    return i32((m1 * m2 + (1 << 30)) >> 31)


def divide_by_power_of_two(dividend: int, exponent: int) -> int:
    mask = (1 << exponent) - 1
    remainder = dividend & mask
    result = dividend >> exponent
    threshold = (mask >> 1) + (1 if result < 0 else 0)
    return result + (1 if remainder > threshold else 0)


def requantize(val: int, multiplier: int, shift: int) -> int:
    """arm_nn_requantize (double rounding)."""
    left = shift if shift > 0 else 0
    right = -shift if shift < 0 else 0
    return divide_by_power_of_two(doubling_high_mult_no_sat(i32(val << left), multiplier), right)


def activation_s16(value: int, left_shift: int, sigmoid: bool, table: list[int]) -> int:
    """arm_nn_activation_s16, one element."""
    if sigmoid:
        abs_input_shift, max_saturation = 9, 0x7FFF << 10
    else:
        abs_input_shift, max_saturation = 8, 0xFFFF << 8
    input_multiplier = 3 if left_shift < 0 else 3 << left_shift
    abs_left_shift = -left_shift if left_shift < 0 else 0
    rounding = 1 << (abs_left_shift - 1) if abs_left_shift > 0 else 0
    input_data = (value * input_multiplier + rounding) >> abs_left_shift
    abs_input_data = abs(input_data)
    uh = abs_input_data >> abs_input_shift
    if uh >= 255:
        result = max_saturation
    else:
        ua, ub = table[uh], table[uh + 1]
        ut = abs_input_data & (0x1FF if sigmoid else 0x0FF)
        result = u32((ua << abs_input_shift) + ut * u32(ub - ua))
    if sigmoid:
        result = u32(result + (1 << 9)) if input_data >= 0 else u32((1 << 25) - result + (1 << 9) - 1)
        result >>= 10
    else:
        result = u32(result - (1 << 23) + (1 << 7)) if input_data >= 0 else u32(-result + (1 << 23) + (1 << 7) - 1)
        result >>= 8
    low = result & 0xFFFF
    return low - 0x10000 if low >= 0x8000 else low


def lstm(x, wx, wh, ebx, ebh, mults, shifts, table, output_offset, output_multiplier, output_shift,
         f2c, i2c, cell_clip, cell_scale_power, time_major, last_only):
    """``x``: nested lists [T][B][I] (time_major) or [B][T][I]; ``wx[k][j][i]``, ``wh[k][j][i]``,
    ``ebx[k][j]``, ``ebh[k][j]`` for gates k = input, forget, cell, output; ``mults[k] = (input,
    hidden)``; ``f2c``/``i2c`` = (multiplier, shift).  Returns nested lists in the input's layout
    ([B][H] when ``last_only``)."""
    if time_major:
        steps, batches = len(x), len(x[0])
        at = lambda t, b: x[t][b]  # noqa: E731
    else:
        batches, steps = len(x), len(x[0])
        at = lambda t, b: x[b][t]  # noqa: E731
    hidden = len(wx[0])
    out = [[None] * batches for _ in range(steps)]  # [T][B][H]
    for b in range(batches):
        cell = [0] * hidden
        h_prev = None
        for t in range(steps):
            data = at(t, b)

            def gate(k):
                res = []
                for j in range(hidden):
                    acc = ebx[k][j] + sum(data[i] * wx[k][j][i] for i in range(len(data)))
                    v = requantize(i32(acc), mults[k][0], shifts[k][0]) + 0
                    v = max(Q15_MIN, min(Q15_MAX, v))
                    if h_prev is not None:
                        acc = ebh[k][j] + sum(h_prev[i] * wh[k][j][i] for i in range(hidden))
                        v = requantize(i32(acc), mults[k][1], shifts[k][1]) + v
                        v = max(Q15_MIN, min(Q15_MAX, v))
                    res.append(activation_s16(v, 0, k != 2, table))
                return res

            f = gate(1)
            cell = [max(Q15_MIN, min(Q15_MAX, requantize(f[j] * cell[j], *f2c))) for j in range(hidden)]
            i = gate(0)
            g = gate(2)
            lo = -cell_clip if cell_clip > 0 else Q15_MIN
            hi = cell_clip if cell_clip > 0 else Q15_MAX
            cell = [max(lo, min(hi, requantize(i[j] * g[j], *i2c) + cell[j])) for j in range(hidden)]
            o = gate(3)
            th = [activation_s16(c, cell_scale_power + 12, False, table) for c in cell]
            h = [max(-128, min(127, requantize(o[j] * th[j], output_multiplier, output_shift) + output_offset))
                 for j in range(hidden)]
            out[t][b] = h
            h_prev = h
    if last_only:
        return [out[steps - 1][b] for b in range(batches)]
    if time_major:
        return out
    return [[out[t][b] for t in range(steps)] for b in range(batches)]
