"""Edge ops: float <-> int8 at the program's inputs and outputs.

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

from corten.fixed_point import round_half_away_t
from corten.ops import checks
from corten.ops.registry import OpFamily, register_family

FAMILY = "quantize"


def _check(op: str, x: torch.Tensor, scale: float, zero_point: int, want: torch.dtype) -> None:
    checks.dtype(op, "input", x, want)
    if not scale > 0.0:
        checks.fail(op, "scale", f"must be > 0, got {scale}")
    checks.in_range(op, "zero_point", zero_point, -128, 127)


@torch.library.custom_op("corten::quantize_per_tensor", mutates_args=())
def quantize_per_tensor(input: torch.Tensor, scale: float, zero_point: int) -> torch.Tensor:
    _check("quantize_per_tensor", input, scale, zero_point, torch.float32)
    q = round_half_away_t(input / torch.tensor(scale, dtype=torch.float32)) + zero_point
    return q.clamp(-128, 127).to(torch.int8).contiguous(memory_format=_edge_format(input))


def _edge_format(x: torch.Tensor) -> torch.memory_format:
    """A 4-D program input is NHWC in the C library's input buffer: its int8 tensor is channels_last,
    like every other 4-D activation (so e.g. ``conv(x) + x`` adds two tensors of one layout)."""
    return torch.channels_last if x.dim() == 4 else torch.contiguous_format


@quantize_per_tensor.register_fake
def _(input, scale, zero_point):
    _check("quantize_per_tensor", input, scale, zero_point, torch.float32)
    return torch.empty_like(input, dtype=torch.int8, memory_format=_edge_format(input))


@torch.library.custom_op("corten::dequantize_per_tensor", mutates_args=())
def dequantize_per_tensor(input: torch.Tensor, scale: float, zero_point: int) -> torch.Tensor:
    _check("dequantize_per_tensor", input, scale, zero_point, torch.int8)
    return (input.to(torch.int32) - zero_point).to(torch.float32) * torch.tensor(scale, dtype=torch.float32)


@dequantize_per_tensor.register_fake
def _(input, scale, zero_point):
    _check("dequantize_per_tensor", input, scale, zero_point, torch.int8)
    return torch.empty_like(input, dtype=torch.float32)


family = register_family(OpFamily(FAMILY, ("quantize_per_tensor", "dequantize_per_tensor"), doc=__doc__))
