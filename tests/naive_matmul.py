"""A deliberately naive batched int8 matmul (``arm_batch_matmul_s8`` arithmetic) in plain Python
ints: loops over logical indices of torch.matmul's broadcast batch, int32 accumulator wrapped,
CMSIS-NN's ``arm_nn_requantize`` written out.  Independent of ``corten.ops.matmul`` and
``corten.fixed_point``."""
from __future__ import annotations

import itertools


def i32(v: int) -> int:
    v &= 0xFFFFFFFF
    return v - (1 << 32) if v & 0x80000000 else v


def requantize(val: int, mult: int, shift: int) -> int:
    left = max(shift, 0)
    right = max(-shift, 0)
    x = i32(val * (1 << left))
    x = i32((x * mult + (1 << 30)) >> 31)  # arm_nn_doubling_high_mult_no_sat
    mask = (1 << right) - 1
    rem = x & mask
    res = x >> right
    thr = (mask >> 1) + (1 if res < 0 else 0)
    return res + (1 if rem > thr else 0)


def matmul(lhs, rhs, lhs_shape, rhs_shape, lo, ro, oo, mult, shift, amin, amax, rhs_transposed=False):
    """``lhs``/``rhs``: flat row-major lists of ints with their logical shapes.  Returns (flat
    row-major output, output shape)."""
    m, k = lhs_shape[-2], lhs_shape[-1]
    n = rhs_shape[-2] if rhs_transposed else rhs_shape[-1]
    lb, rb = list(lhs_shape[:-2]), list(rhs_shape[:-2])
    nb = max(len(lb), len(rb))
    lb, rb = [1] * (nb - len(lb)) + lb, [1] * (nb - len(rb)) + rb
    ob = [max(a, b) for a, b in zip(lb, rb)]
    for a, b, o in zip(lb, rb, ob):
        assert a in (1, o) and b in (1, o)

    def flat_index(idx, shape):
        f = 0
        for i, s in zip(idx, shape):
            f = f * s + i
        return f

    out = []
    for bidx in itertools.product(*[range(o) for o in ob]):
        li = [i if s != 1 else 0 for i, s in zip(bidx, lb)][nb - len(lhs_shape[:-2]):]
        ri = [i if s != 1 else 0 for i, s in zip(bidx, rb)][nb - len(rhs_shape[:-2]):]
        for i in range(m):
            for j in range(n):
                acc = 0
                for t in range(k):
                    a = lhs[flat_index(li + [i, t], lhs_shape)]
                    b = rhs[flat_index(ri + ([j, t] if rhs_transposed else [t, j]), rhs_shape)]
                    acc = i32(acc + (a + lo) * (b + ro))
                v = i32(requantize(acc, mult, shift) + oo)
                out.append(max(amin, min(amax, v)))
    return out, (*ob, m, n)
