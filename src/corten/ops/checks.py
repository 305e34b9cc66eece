"""Argument checks shared by the op kernels: every error names the op and the argument."""
from __future__ import annotations

from typing import Sequence

import torch

from corten.errors import CortenOpError
from corten.fixed_point import INT32_MAX, SHIFT_MAX, SHIFT_MIN


def fail(op: str, arg: str, msg: str) -> None:
    raise CortenOpError(f"corten.{op}: argument '{arg}': {msg}")


def dtype(op: str, arg: str, t: torch.Tensor, want: torch.dtype) -> None:
    if not isinstance(t, torch.Tensor):
        fail(op, arg, f"expected a tensor, got {type(t).__name__}")
    if t.dtype != want:
        fail(op, arg, f"expected dtype {want}, got {t.dtype}")


def ndim(op: str, arg: str, t: torch.Tensor, want: int) -> None:
    if t.dim() != want:
        fail(op, arg, f"expected a {want}-D tensor, got shape {tuple(t.shape)}")


def shape(op: str, arg: str, t: torch.Tensor, want: Sequence[int]) -> None:
    if tuple(t.shape) != tuple(want):
        fail(op, arg, f"expected shape {tuple(want)}, got {tuple(t.shape)}")


def in_range(op: str, arg: str, v: int, lo: int, hi: int) -> None:
    if not lo <= v <= hi:
        fail(op, arg, f"{v} is outside [{lo}, {hi}]")


def input_offset(op: str, arg: str, v: int) -> None:
    # CMSIS-NN passes the negated input zero point: zp in [-128, 127] -> offset in [-127, 128].
    in_range(op, arg, v, -127, 128)


def output_offset(op: str, arg: str, v: int) -> None:
    in_range(op, arg, v, -128, 127)


def activation(op: str, lo: int, hi: int, dtype: torch.dtype = torch.int8) -> None:
    qmin, qmax = (-128, 127) if dtype == torch.int8 else (-32768, 32767)
    in_range(op, "activation_min", lo, qmin, qmax)
    in_range(op, "activation_max", hi, qmin, qmax)
    if lo > hi:
        fail(op, "activation_min", f"activation_min {lo} > activation_max {hi}")


def multipliers(op: str, mult: torch.Tensor, shift: torch.Tensor, channels: int | None) -> None:
    """Per-channel (length ``channels``) or per-tensor (length 1) int32 multiplier/shift tensors."""
    dtype(op, "output_multiplier", mult, torch.int32)
    dtype(op, "output_shift", shift, torch.int32)
    ndim(op, "output_multiplier", mult, 1)
    ndim(op, "output_shift", shift, 1)
    if mult.shape != shift.shape:
        fail(op, "output_shift", f"length {shift.numel()} differs from output_multiplier's {mult.numel()}")
    if channels is not None and mult.numel() not in (1, channels):
        fail(op, "output_multiplier", f"length {mult.numel()}: expected 1 or {channels} (one per output channel)")
    if _has_values(mult) and mult.numel():
        scalar_multiplier(op, "output_multiplier", int(mult.min()))
        scalar_multiplier(op, "output_multiplier", int(mult.max()))
        in_range(op, "output_shift", int(shift.min()), SHIFT_MIN, SHIFT_MAX)
        in_range(op, "output_shift", int(shift.max()), SHIFT_MIN, SHIFT_MAX)


def _has_values(t: torch.Tensor) -> bool:
    """False for meta and fake tensors (shape-only tracing, e.g. ``torch.export``): no values to check."""
    from torch._subclasses.fake_tensor import is_fake

    return t.device.type != "meta" and not is_fake(t)


def scalar_multiplier(op: str, arg: str, m: int) -> None:
    # quantize_multiplier yields 0 (underflowed scale) or a Q31 value in [2**30, 2**31 - 1].
    if m != 0 and not (1 << 30) <= m <= INT32_MAX:
        fail(op, arg, f"{m} is not 0 or a Q31 multiplier in [2**30, 2**31 - 1]")


def scalar_shift(op: str, arg: str, s: int) -> None:
    in_range(op, arg, s, SHIFT_MIN, SHIFT_MAX)


def pair(op: str, arg: str, v: Sequence[int], minimum: int) -> tuple[int, int]:
    if len(v) != 2:
        fail(op, arg, f"expected 2 values (height, width), got {list(v)}")
    if min(v) < minimum:
        fail(op, arg, f"values must be >= {minimum}, got {list(v)}")
    return int(v[0]), int(v[1])


def out_size(op: str, size: int, k: int, stride: int, pad: int, dilation: int, arg: str = "input") -> int:
    o = (size + 2 * pad - dilation * (k - 1) - 1) // stride + 1
    if o < 1:
        fail(op, arg, f"spatial size {size} too small for kernel {k} (dilation {dilation}, padding {pad})")
    return o


def requantized_binary(op: str, names: tuple[str, str], a, b, a_offset: int, b_offset: int, out_offset: int,
                       out_multiplier: int, out_shift: int, act_min: int, act_max: int) -> None:
    """The operands and 7 scalar parameters of the product-style ops (mul, div, matmul): two int8
    tensors ``names``, their offsets, the output offset, one requantization, the activation range."""
    for name, t in zip(names, (a, b)):
        dtype(op, name, t, torch.int8)
    input_offset(op, f"{names[0]}_offset", a_offset)
    input_offset(op, f"{names[1]}_offset", b_offset)
    output_offset(op, "output_offset", out_offset)
    scalar_multiplier(op, "output_multiplier", out_multiplier)
    scalar_shift(op, "output_shift", out_shift)
    activation(op, act_min, act_max)


def rescaled_binary_s16(op: str, *params: int) -> None:
    """The 12 parameters of the 16x8 add (``arm_elementwise_add_s16``): offsets 0 (symmetric int16),
    left shift <= 15 (``32767 << 15`` fits in int32), int16 activation bounds."""
    (in1_off, in1_mult, in1_shift, in2_off, in2_mult, in2_shift, left_shift, out_off, out_mult, out_shift,
     act_min, act_max) = params
    for name, v in (("input1_offset", in1_off), ("input2_offset", in2_off), ("output_offset", out_off)):
        in_range(op, name, v, 0, 0)
    for name, m, s in (("input1", in1_mult, in1_shift), ("input2", in2_mult, in2_shift), ("output", out_mult, out_shift)):
        scalar_multiplier(op, f"{name}_multiplier", m)
        scalar_shift(op, f"{name}_shift", s)
    in_range(op, "left_shift", left_shift, 0, 15)
    activation(op, act_min, act_max, torch.int16)


def rescaled_binary(op: str, *params: int) -> None:
    """The 12 scalar parameters of the add-style ops, in schema order (``arm_elementwise_add_s8``
    convention: input1/2 offset, multiplier, shift; left shift; output offset, multiplier, shift;
    activation min, max)."""
    (in1_off, in1_mult, in1_shift, in2_off, in2_mult, in2_shift, left_shift, out_off, out_mult, out_shift,
     act_min, act_max) = params
    input_offset(op, "input1_offset", in1_off)
    input_offset(op, "input2_offset", in2_off)
    output_offset(op, "output_offset", out_off)
    for name, m, s in (("input1", in1_mult, in1_shift), ("input2", in2_mult, in2_shift), ("output", out_mult, out_shift)):
        scalar_multiplier(op, f"{name}_multiplier", m)
        scalar_shift(op, f"{name}_shift", s)
    in_range(op, "left_shift", left_shift, 0, 22)  # (255 << 22) still fits in int32
    activation(op, act_min, act_max)
