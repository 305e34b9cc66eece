"""Deliberately naive plain-Python models of the broadcasting elementwise ops (mul, sub, minimum,
maximum), written from the TFLite/CMSIS-NN formulas with explicit index arithmetic and the C-level
helpers of ``naive.py``.  Tensors are nested lists in logical (row-major) order."""
from __future__ import annotations

import itertools

from naive import clamp, i8, i32, requantize


def flatten(nested) -> list[int]:
    if isinstance(nested, list):
        return [v for item in nested for v in flatten(item)]
    return [nested]


def shape_of(nested) -> tuple[int, ...]:
    shape = []
    while isinstance(nested, list):
        shape.append(len(nested))
        nested = nested[0]
    return tuple(shape)


def broadcast_shape(s1: tuple[int, ...], s2: tuple[int, ...]) -> tuple[int, ...]:
    """numpy's rule, spelled out: right-align, equal sizes or one of them 1."""
    rank = max(len(s1), len(s2))
    a = (1,) * (rank - len(s1)) + tuple(s1)
    b = (1,) * (rank - len(s2)) + tuple(s2)
    out = []
    for x, y in zip(a, b):
        if x != y and x != 1 and y != 1:
            raise ValueError(f"shapes {s1} and {s2} do not broadcast")
        out.append(max(x, y))
    return tuple(out)


def _source_index(out_index: tuple[int, ...], shape: tuple[int, ...]) -> int:
    """Row-major flat index into a tensor of ``shape`` read at the broadcast ``out_index``."""
    lead = len(out_index) - len(shape)
    flat = 0
    for d, size in enumerate(shape):
        i = out_index[lead + d] if size != 1 else 0
        flat = flat * size + i
    return flat


def binary(fn, x1, x2) -> tuple[tuple[int, ...], list[int]]:
    """Apply ``fn(v1, v2)`` over the broadcast of two nested lists: (output shape, flat row-major values)."""
    s1, s2 = shape_of(x1), shape_of(x2)
    f1, f2 = flatten(x1), flatten(x2)
    out_shape = broadcast_shape(s1, s2)
    out = []
    for idx in itertools.product(*(range(d) for d in out_shape)):
        out.append(fn(f1[_source_index(idx, s1)], f2[_source_index(idx, s2)]))
    return out_shape, out


def mul(x1, x2, in1_offset, in2_offset, out_offset, out_mult, out_shift, act_min, act_max):
    """arm_elementwise_mul_s8 per element, broadcast."""
    def one(a, b):
        prod = (a + in1_offset) * (b + in2_offset)
        acc = i32(requantize(prod, out_mult, out_shift) + out_offset)
        return i8(clamp(acc, act_min, act_max))
    return binary(one, x1, x2)


def sub(x1, x2, in1_offset, in1_mult, in1_shift, in2_offset, in2_mult, in2_shift, left_shift,
        out_offset, out_mult, out_shift, act_min, act_max):
    """TFLite int8 SUB: the add arithmetic with input2's multiplier negated, broadcast."""
    def one(a, b):
        p = requantize(i32((a + in1_offset) << left_shift), in1_mult, in1_shift)
        q = requantize(i32((b + in2_offset) << left_shift), -in2_mult, in2_shift)
        acc = requantize(i32(p + q), out_mult, out_shift)
        return i8(clamp(i32(acc + out_offset), act_min, act_max))
    return binary(one, x1, x2)


def maximum(x1, x2):
    return binary(lambda a, b: a if a >= b else b, x1, x2)


def minimum(x1, x2):
    return binary(lambda a, b: a if a <= b else b, x1, x2)


# ----------------------------------------------------------------------------- test case shapes
def random_broadcast_shapes(rng) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Two shapes that broadcast: same rank 4 or 2 mostly, sometimes mixed ranks 1..4, with each
    dim of each operand either the common size or 1 (and the SE gate [N,C,H,W] * [N,C,1,1])."""
    kind = rng.random()
    if kind < 0.15:
        n, c, h, w = rng.randint(1, 2), rng.randint(1, 5), rng.randint(1, 4), rng.randint(1, 4)
        pair = ((n, c, h, w), (n, c, 1, 1))
        return pair if rng.random() < 0.7 else pair[::-1]
    if kind < 0.55:
        rank1 = rank2 = 4
    elif kind < 0.8:
        rank1 = rank2 = 2
    else:
        rank1, rank2 = rng.randint(1, 4), rng.randint(1, 4)
    rank = max(rank1, rank2)
    full = [rng.randint(1, 4) for _ in range(rank)]

    def operand(r):
        dims = full[rank - r:]
        return tuple(d if rng.random() < 0.6 else 1 for d in dims)

    return operand(rank1), operand(rank2)


# ----------------------------------------------------------------------------- C harness (ctypes)
def build_kernel_library(tmp_dir, family: str):
    """Compile ``<family>.c`` into a shared library (gcc -O2, warnings as errors) and load it."""
    import ctypes
    import subprocess

    from corten.codegen import KERNELS_DIR

    out = tmp_dir / f"lib{family}.so"
    cmd = ["gcc", "-std=c99", "-O2", "-Wall", "-Wextra", "-Werror", "-shared", "-fPIC", "-I", str(KERNELS_DIR),
           str(KERNELS_DIR / f"{family}.c"), "-o", str(out)]
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    return ctypes.CDLL(str(out))


def c_bytes(t) -> bytes:
    """A tensor's C bytes: NHWC for 4-D, row-major otherwise."""
    if t.dim() == 4:
        t = t.permute(0, 2, 3, 1)
    return t.contiguous().numpy().tobytes()


def c_buffer(t):
    import ctypes

    data = c_bytes(t)
    return (ctypes.c_int8 * max(1, len(data))).from_buffer_copy(data + b"\0" * (len(data) == 0))


def broadcast_struct(out_shape, shape1, shape2):
    """The ``corten_broadcast`` of an output and two input shapes (the emitter's geometry)."""
    import ctypes

    from corten.ops.mul import loop_geometry

    class Dims(ctypes.Structure):
        _fields_ = [(f, ctypes.c_int32) for f in ("n", "h", "w", "c")]

    class Broadcast(ctypes.Structure):
        _fields_ = [("output", Dims), ("input1_strides", Dims), ("input2_strides", Dims)]

    dims, _, s1 = loop_geometry(out_shape, shape1)
    _, _, s2 = loop_geometry(out_shape, shape2)
    return Broadcast(Dims(*dims), Dims(*s1), Dims(*s2))


def add(x1, x2, in1_offset, in1_mult, in1_shift, in2_offset, in2_mult, in2_shift, left_shift,
        out_offset, out_mult, out_shift, act_min, act_max):
    """arm_elementwise_add_s8 per element, broadcast (numpy rules)."""
    def one(a, b):
        p = requantize(i32((a + in1_offset) << left_shift), in1_mult, in1_shift)
        q = requantize(i32((b + in2_offset) << left_shift), in2_mult, in2_shift)
        acc = requantize(i32(p + q), out_mult, out_shift)
        return i8(clamp(i32(acc + out_offset), act_min, act_max))
    return binary(one, x1, x2)


def div(x1, x2, in1_offset, in2_offset, out_offset, out_mult, out_shift, act_min, act_max):
    """corten DIV per element, broadcast: the quotient (x1 + off1) / (x2 + off2) in Q16 rounded half
    away from zero (exact rational rounding with Fraction), requantized; division by 0 saturates."""
    from fractions import Fraction

    def one(a, b):
        a, b = a + in1_offset, b + in2_offset
        if b == 0:
            return act_max if a > 0 else act_min if a < 0 else clamp(out_offset, act_min, act_max)
        f = Fraction(a * 65536, b)
        q = int(abs(f) + Fraction(1, 2))  # floor(|f| + 1/2): half away from zero
        q = -q if f < 0 else q
        return i8(clamp(i32(requantize(q, out_mult, out_shift) + out_offset), act_min, act_max))
    return binary(one, x1, x2)
