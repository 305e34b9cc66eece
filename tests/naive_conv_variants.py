"""Deliberately naive models of grouped and transposed int8 convolutions (nested lists, NHWC), for
``tests/test_conv_variants.py``.  Same conventions as :mod:`naive`: plain Python ints, an explicit
int32 wrap after every C ``int32_t`` addition, nothing shared with :mod:`corten`.

* ``grouped_conv2d``: ``arm_convolve_s8`` with filter C = C_in / groups: output channel ``o`` is in
  group ``o // (C_out // groups)`` and reads input channels ``[g*CK, (g+1)*CK)``;
* ``conv_transpose2d``: the scatter definition (every input pixel adds its products into a
  full-resolution int32 image, which is then cropped by ``padding``), as
  ``torch.nn.functional.conv_transpose2d`` defines it; OHWI weights ``w[o][ky][kx][c]``.
"""
from __future__ import annotations

from naive import clamp, i8, i32, requantize


def _finish(acc, o, mult, shift, output_offset, act_min, act_max):
    acc = requantize(acc, mult[o], shift[o])
    acc = i32(acc + output_offset)
    return i8(clamp(acc, act_min, act_max))


def grouped_conv2d(x, w, bias, stride, padding, dilation, input_offset, output_offset, mult, shift,
                   act_min, act_max):
    n_batch, in_h, in_w, in_c = len(x), len(x[0]), len(x[0][0]), len(x[0][0][0])
    out_c, ker_h, ker_w, ker_c = len(w), len(w[0]), len(w[0][0]), len(w[0][0][0])
    groups = in_c // ker_c
    per_group = out_c // groups
    out_h = (in_h + 2 * padding[0] - dilation[0] * (ker_h - 1) - 1) // stride[0] + 1
    out_w = (in_w + 2 * padding[1] - dilation[1] * (ker_w - 1) - 1) // stride[1] + 1
    out = []
    for b in range(n_batch):
        plane = []
        for oy in range(out_h):
            row = []
            for ox in range(out_w):
                pixel = []
                for o in range(out_c):
                    g = o // per_group
                    acc = bias[o] if bias is not None else 0
                    for ky in range(ker_h):
                        for kx in range(ker_w):
                            iy = oy * stride[0] - padding[0] + dilation[0] * ky
                            ix = ox * stride[1] - padding[1] + dilation[1] * kx
                            if not (0 <= iy < in_h and 0 <= ix < in_w):
                                continue  # padding: (-input_offset + input_offset) * w = 0
                            for c in range(ker_c):
                                acc = i32(acc + (x[b][iy][ix][g * ker_c + c] + input_offset) * w[o][ky][kx][c])
                    pixel.append(_finish(acc, o, mult, shift, output_offset, act_min, act_max))
                row.append(pixel)
            plane.append(row)
        out.append(plane)
    return out


def conv_transpose2d(x, w, bias, stride, padding, output_padding, dilation, input_offset, output_offset,
                     mult, shift, act_min, act_max):
    n_batch, in_h, in_w, in_c = len(x), len(x[0]), len(x[0][0]), len(x[0][0][0])
    out_c, ker_h, ker_w = len(w), len(w[0]), len(w[0][0])
    out_h = (in_h - 1) * stride[0] - 2 * padding[0] + dilation[0] * (ker_h - 1) + output_padding[0] + 1
    out_w = (in_w - 1) * stride[1] - 2 * padding[1] + dilation[1] * (ker_w - 1) + output_padding[1] + 1
    out = []
    for b in range(n_batch):
        # full-resolution accumulators, indexed by output coordinate + padding
        full_h, full_w = out_h + 2 * padding[0], out_w + 2 * padding[1]
        acc = [[[bias[o] if bias is not None else 0 for o in range(out_c)] for _ in range(full_w)]
               for _ in range(full_h)]
        for iy in range(in_h):
            for ix in range(in_w):
                for ky in range(ker_h):
                    for kx in range(ker_w):
                        fy = iy * stride[0] + ky * dilation[0]
                        fx = ix * stride[1] + kx * dilation[1]
                        if fy >= full_h or fx >= full_w:
                            continue
                        for o in range(out_c):
                            for c in range(in_c):
                                product = (x[b][iy][ix][c] + input_offset) * w[o][ky][kx][c]
                                acc[fy][fx][o] = i32(acc[fy][fx][o] + product)
        out.append([[[_finish(acc[oy + padding[0]][ox + padding[1]][o], o, mult, shift, output_offset, act_min,
                              act_max) for o in range(out_c)] for ox in range(out_w)] for oy in range(out_h)])
    return out
