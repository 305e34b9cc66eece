"""Independent naive int4 (A8W4) kernels: the weights come as CMSIS-NN's packed s4 bytes (element
2k in the low nibble of byte k, two's complement nibbles), unpacked here bit by bit, then the int8
naive kernels of :mod:`naive` (the arithmetic is the int8 kernels', only the weight storage differs)."""
from __future__ import annotations

import naive


def unpack_s4(packed: list[int], count: int) -> list[int]:
    """``count`` int4 values from packed bytes (ints in [-128, 255], as C arrays spell them)."""
    out = []
    for k in range(count):
        byte = packed[k // 2] & 0xFF
        nib = (byte >> 4) if k % 2 else (byte & 0x0F)
        out.append(nib - 16 if nib & 0x8 else nib)
    return out


def pack_s4(values: list[int]) -> list[int]:
    """The inverse (the last high nibble 0 for an odd count), bytes as uint8."""
    out = []
    for k in range(0, len(values), 2):
        lo = values[k] & 0xF
        hi = (values[k + 1] & 0xF) if k + 1 < len(values) else 0
        out.append(lo | (hi << 4))
    return out


def _nest(flat: list[int], shape: tuple[int, ...]):
    if len(shape) == 1:
        return list(flat)
    step = len(flat) // shape[0]
    return [_nest(flat[i * step:(i + 1) * step], shape[1:]) for i in range(shape[0])]


def conv2d_s4(x, packed, filter_shape, bias, stride, padding, dilation, input_offset, output_offset, mult, shift,
              act_min, act_max):
    """arm_convolve_s4: ``packed`` OHWI ``filter_shape`` = (C_out, kH, kW, C_in) int4 weights."""
    n = filter_shape[0] * filter_shape[1] * filter_shape[2] * filter_shape[3]
    w = _nest(unpack_s4(packed, n), filter_shape)
    return naive.conv2d(x, w, bias, stride, padding, dilation, input_offset, output_offset, mult, shift, act_min,
                        act_max)


def depthwise_conv2d_s4(x, packed, kh, kw, c_out, bias, stride, padding, dilation, ch_mult, input_offset,
                        output_offset, mult, shift, act_min, act_max):
    """arm_depthwise_conv_s4: ``packed`` [kH, kW, C_out] int4 weights."""
    w = _nest(unpack_s4(packed, kh * kw * c_out), (kh, kw, c_out))
    return naive.depthwise_conv2d(x, w, bias, stride, padding, dilation, ch_mult, input_offset, output_offset, mult,
                                  shift, act_min, act_max)


def fully_connected_s4(x, packed, out_features, in_features, bias, input_offset, output_offset, mult, shift,
                       act_min, act_max):
    """arm_fully_connected_s4: ``packed`` [out, in] int4 weights (rows may start mid-byte)."""
    w = _nest(unpack_s4(packed, out_features * in_features), (out_features, in_features))
    return naive.fully_connected(x, w, bias, input_offset, output_offset, mult, shift, act_min, act_max)
