"""A deliberately naive, independent model of CMSIS-NN's 16x8 kernels (int16 activations, int8
weights, int64 bias), for testing Corten's s16 ops.

Written from the C of ``arm_fully_connected_s16`` / ``arm_nn_vec_mat_mult_t_s16`` and the helpers
``REDUCE_MULTIPLIER`` and ``arm_nn_requantize_s64`` in ``arm_nnsupportfunctions.h``, and TFLite's
Requantize (int8 <-> int16, ``MultiplyByQuantizedMultiplier``), with nothing shared with
:mod:`corten`: plain Python ints, the C loops, explicit wraps where the C code narrows.
"""
from __future__ import annotations

from naive import i32, requantize  # (the int8 helpers: C semantics of arm_nn_requantize)


def reduce_multiplier(m: int) -> int:
    """``REDUCE_MULTIPLIER(_mult) ((_mult < 0x7FFF0000) ? ((_mult + (1 << 15)) >> 16) : 0x7FFF)``."""
    return (m + (1 << 15)) // (1 << 16) if m < 0x7FFF0000 else 0x7FFF


def requantize_s64(val: int, reduced_multiplier: int, shift: int) -> int:
    """``arm_nn_requantize_s64``: ``int32_t result = new_val >> (14 - shift); (result + 1) >> 1``."""
    new_val = val * reduced_multiplier  # int64 in C (no overflow for the values tested)
    result = i32(new_val // (1 << (14 - shift)))  # arithmetic shift = floor division; the cast wraps
    return (result + 1) // 2


def linear_s16(x, w, bias, multiplier, shift, act_min, act_max):
    """``x[batch][k]`` int16, ``w[out][k]`` int8, ``bias[out]`` int64 or None; per-channel
    ``multiplier[out]`` / ``shift[out]`` (or one entry)."""
    out = []
    for row in x:
        y = []
        for o, wr in enumerate(w):
            acc = 0
            for a, b in zip(row, wr):
                acc += a * b
            if bias is not None:
                acc += bias[o]
            q = o if len(multiplier) > 1 else 0
            v = requantize_s64(acc, reduce_multiplier(multiplier[q]), shift[q])
            y.append(min(max(v, act_min), act_max))
        out.append(y)
    return out


def requantize_width(values, input_offset, output_offset, multiplier, shift, bits):
    """TFLite Requantize between int8 and int16 grids, elementwise on a flat list."""
    lo, hi = (-128, 127) if bits == 8 else (-32768, 32767)
    return [min(max(i32(requantize(v + input_offset, multiplier, shift) + output_offset), lo), hi) for v in values]
