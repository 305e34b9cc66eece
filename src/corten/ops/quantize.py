"""Edge ops: float <-> int8 / int16 at the program's inputs and outputs, and ``quantized_requantize``
between an int8 and an int16 region (TFLite's 16x8 scheme; CMSIS-NN has no such kernel: the portable
``corten_requantize`` runs in both flavours).

``bits`` = 8 (default) or 16: int16 edges are symmetric (zero point 0), range [-32768, 32767].

Rounding (checked against TFLite's ``AffineQuantize``, which CMSIS-NN based runtimes use):
``q = clamp(round_half_away(x / scale) + zero_point, -128, 127)`` with the division done
in float32, as TFLite does.  (PyTorch's ``quantize_per_tensor`` multiplies by ``1/scale`` and
rounds half to even; the two differ only on exact ties and by one ulp of the quotient.)
Dequantize is ``(q - zero_point) * scale`` in float32.

A quantized 4-D program input is ``channels_last``: its bytes are the C input buffer's (NHWC), like
every other 4-D int8 tensor of a lowered program (so ``conv(x) + x`` adds two NHWC tensors).
"""
from __future__ import annotations

import torch

from corten.fixed_point import requantize, round_half_away_t, wrap_int32_t
from corten.ops import checks
from corten.ops.registry import OpFamily, register_family
from corten.providers import CMSIS_NN, PORTABLE

FAMILY = "quantize"


def _range(op: str, bits: int) -> tuple[int, int, torch.dtype]:
    if bits == 8:
        return -128, 127, torch.int8
    if bits == 16:
        return -32768, 32767, torch.int16
    checks.fail(op, "bits", f"must be 8 or 16, got {bits}")


def _check(op: str, x: torch.Tensor, scale: float, zero_point: int, want: torch.dtype, bits: int) -> None:
    checks.dtype(op, "input", x, want)
    if not scale > 0.0:
        checks.fail(op, "scale", f"must be > 0, got {scale}")
    lo, hi, _ = _range(op, bits)
    checks.in_range(op, "zero_point", zero_point, -128 if bits == 8 else 0, 127 if bits == 8 else 0)


@torch.library.custom_op("corten::quantize_per_tensor", mutates_args=())
def quantize_per_tensor(input: torch.Tensor, scale: float, zero_point: int, bits: int = 8) -> torch.Tensor:
    _check("quantize_per_tensor", input, scale, zero_point, torch.float32, bits)
    lo, hi, dtype = _range("quantize_per_tensor", bits)
    q = round_half_away_t(input / torch.tensor(scale, dtype=torch.float32)) + zero_point
    return q.clamp(lo, hi).to(dtype).contiguous(memory_format=_edge_format(input))


def _edge_format(x: torch.Tensor) -> torch.memory_format:
    """A 4-D program input is NHWC in the C library's input buffer: its int8 tensor is channels_last,
    like every other 4-D activation (so e.g. ``conv(x) + x`` adds two tensors of one layout)."""
    return torch.channels_last if x.dim() == 4 else torch.contiguous_format


@quantize_per_tensor.register_fake
def _(input, scale, zero_point, bits=8):
    _check("quantize_per_tensor", input, scale, zero_point, torch.float32, bits)
    return torch.empty_like(input, dtype=_range("quantize_per_tensor", bits)[2], memory_format=_edge_format(input))


@torch.library.custom_op("corten::dequantize_per_tensor", mutates_args=())
def dequantize_per_tensor(input: torch.Tensor, scale: float, zero_point: int, bits: int = 8) -> torch.Tensor:
    _check("dequantize_per_tensor", input, scale, zero_point, _range("dequantize_per_tensor", bits)[2], bits)
    return (input.to(torch.int32) - zero_point).to(torch.float32) * torch.tensor(scale, dtype=torch.float32)


@dequantize_per_tensor.register_fake
def _(input, scale, zero_point, bits=8):
    _check("dequantize_per_tensor", input, scale, zero_point, _range("dequantize_per_tensor", bits)[2], bits)
    return torch.empty_like(input, dtype=torch.float32)


def _check_requantize(input, input_offset, output_offset, multiplier, shift, bits):
    op = "quantized_requantize"
    if input.dtype not in (torch.int8, torch.int16):
        checks.fail(op, "input", f"expected dtype torch.int8 or torch.int16, got {input.dtype}")
    lo, hi, dtype = _range(op, bits)
    if (input.dtype == torch.int16) == (bits == 16):
        checks.fail(op, "bits", f"{bits}-bit output of a {input.dtype} input: a requantize changes the width")
    in_zero = input.dtype == torch.int16
    checks.in_range(op, "input_offset", input_offset, 0 if in_zero else -127, 0 if in_zero else 128)
    checks.in_range(op, "output_offset", output_offset, lo if bits == 8 else 0, hi if bits == 8 else 0)
    checks.scalar_multiplier(op, "multiplier", multiplier)
    checks.scalar_shift(op, "shift", shift)
    return dtype


def _like_input(x: torch.Tensor) -> torch.memory_format:
    return torch.channels_last if x.dim() == 4 and not x.is_contiguous() else torch.contiguous_format


@torch.library.custom_op("corten::quantized_requantize", mutates_args=())
def quantized_requantize(input: torch.Tensor, input_offset: int, output_offset: int, multiplier: int, shift: int,
                         bits: int) -> torch.Tensor:
    """``out = clamp(output_offset + arm_nn_requantize(q + input_offset, multiplier, shift))`` on the
    output's int8 / int16 range (elementwise; the bytes keep the input's layout)."""
    dtype = _check_requantize(input, input_offset, output_offset, multiplier, shift, bits)
    lo, hi, _ = _range("quantized_requantize", bits)
    acc = input.to(torch.int64) + input_offset
    out = wrap_int32_t(requantize(acc, multiplier, shift) + output_offset)
    return out.clamp(lo, hi).to(dtype).contiguous(memory_format=_like_input(input))


@quantized_requantize.register_fake
def _(input, input_offset, output_offset, multiplier, shift, bits):
    dtype = _check_requantize(input, input_offset, output_offset, multiplier, shift, bits)
    return torch.empty_like(input, dtype=dtype, memory_format=_like_input(input))


family = register_family(OpFamily(FAMILY, ("quantize_per_tensor", "dequantize_per_tensor", "quantized_requantize"),
                                  doc=__doc__))


# ----------------------------------------------------------------------------- requantize: memory and C
@PORTABLE.kernel("quantized_requantize")
def _emit_requantize_c(ctx) -> str:
    """``corten_requantize_s8_s16`` in both flavours (CMSIS-NN has no requantize kernel)."""
    x_node = ctx.arg("input")
    size = 1
    for d in ctx.shape(x_node):
        size *= int(d)
    x, out = ctx.typed_input("input"), ctx.typed_out()
    in8, in16 = ("NULL", x) if ctx.dtype("input") == torch.int16 else (x, "NULL")
    out8, out16 = (out, "NULL") if in8 == "NULL" else ("NULL", out)
    return ctx.call("corten_requantize_s8_s16", in8, in16, int(ctx.arg("input_offset")), int(ctx.arg("output_offset")),
                    ctx.int_(int(ctx.arg("multiplier"))), int(ctx.arg("shift")), out8, out16, size)


CMSIS_NN.declines("quantized_requantize", reason="CMSIS-NN has no int8 <-> int16 requantize kernel")
