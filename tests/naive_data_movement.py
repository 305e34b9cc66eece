"""Deliberately naive data-movement ops on flat row-major value lists (logical order), one output
element at a time: the property-test oracles of ``quantized_pad``, ``quantized_cat`` and
``quantized_transpose`` (tests/test_pad.py, test_concat.py, test_transpose.py)."""
from __future__ import annotations

import itertools


def strides(shape) -> list[int]:
    """Row-major strides of ``shape``."""
    out, step = [], 1
    for d in reversed(list(shape)):
        out.append(step)
        step *= d
    return list(reversed(out))


def indices(shape):
    """Every index tuple of ``shape`` in row-major order."""
    return itertools.product(*(range(d) for d in shape))


def flat(index, shape) -> int:
    return sum(i * s for i, s in zip(index, strides(shape)))


def pad(values, shape, pre, post, value):
    """Constant pad: output element is the input element it covers, else ``value``."""
    out_shape = [d + a + b for d, a, b in zip(shape, pre, post)]
    out = []
    for idx in indices(out_shape):
        src = [i - a for i, a in zip(idx, pre)]
        inside = all(0 <= s < d for s, d in zip(src, shape))
        out.append(values[flat(src, shape)] if inside else value)
    return out, out_shape


def cat(tensors, shapes, dim):
    """Concatenation: output element at ``dim`` index ``i`` comes from the input whose range holds ``i``."""
    out_shape = list(shapes[0])
    out_shape[dim] = sum(s[dim] for s in shapes)
    out = []
    for idx in indices(out_shape):
        i, k = idx[dim], 0
        while i >= shapes[k][dim]:
            i -= shapes[k][dim]
            k += 1
        src = list(idx)
        src[dim] = i
        out.append(tensors[k][flat(src, shapes[k])])
    return out, out_shape


def permute(values, shape, perm):
    """``permute``: output index ``idx`` reads input index with ``src[perm[j]] = idx[j]``."""
    out_shape = [shape[p] for p in perm]
    out = []
    for idx in indices(out_shape):
        src = [0] * len(shape)
        for j, p in enumerate(perm):
            src[p] = idx[j]
        out.append(values[flat(src, shape)])
    return out, out_shape


def storage_bytes(values, shape) -> list[int]:
    """The C bytes of a graph tensor given by logical row-major ``values``: NHWC for 4-D."""
    if len(shape) != 4:
        return list(values)
    n, c, h, w = shape
    return [values[flat((b, ch, y, x), shape)] for b in range(n) for y in range(h) for x in range(w)
            for ch in range(c)]
