"""``quantized_layer_norm``: ``nn.LayerNorm`` / ``F.layer_norm`` as one exact integer kernel.

CMSIS-NN has no layer norm; Corten computes it in integer arithmetic (int32/int64 intermediates,
no float, no table), identically in the reference kernel and in the portable C kernel.  For each
row of ``n`` int8 values ``x_i`` (the normalized dims)::

    S  = sum x_i,  Q = sum x_i**2                                   (int32; n <= 4095)
    V  = (n * Q - S**2) * 2**20 + eps_q                             (int64: n**2 * variance, in steps**2 / 2**20)
    d_i = n * x_i - S                                               (n * (x_i - mean), exact)
    z_i = round_half_away(d_i * 2**(16 + 10) / sqrt(V))             (Q16 normalized value, see below)
    acc = requantize(z_i, multiplier_i, shift_i) + bias_i           (units of s_out / 256)
    y_i = clamp(DIV_POW2(acc, 8) + output_offset, act_min, act_max)

The input zero point cancels in ``d_i`` and ``V`` and the input scale cancels in ``d_i / sqrt(V)``;
it only enters ``eps_q = round(eps * n**2 * 2**20 / s_in**2)`` (the float ``eps`` on the integer
scale, computed ahead of time; the 20 fractional bits keep a small eps against a tiny variance).  ``sqrt(V)`` is exact to 2**-30 relative: ``V`` is normalised to
``V * 4**e`` in [2**60, 2**62) and its integer square root ``r = isqrt(V * 4**e)`` (floor) taken,
so ``z_i = round(d_i * 2**(26 + e) / r)`` - one int64 division; ``|d_i| * 2**10 <= sqrt(n * V)``
keeps the dividend below 2**54.  ``V < 2**58`` (rows of at most 4095 values).  ``V == 0`` (a constant row and ``eps_q == 0``) gives ``z = 0``.

``multiplier_i * 2**(shift_i - 31) = gamma_i / (256 * s_out)`` (negative for negative gamma:
``arm_nn_requantize`` arithmetic is odd-symmetric up to its ties) and ``bias_i =
round(256 * beta_i / s_out)``; the final rounding shift by 8 leaves at most half an output step
plus 2**-8 step of error against the exact affine layer norm of the int8 input.

Rows are the normalized (trailing) dims: contiguous for 2-D/3-D tensors; for a 4-D (NHWC in memory)
tensor only ``normalized_shape = [W]`` (the last dim; rows ``C`` bytes apart, as softmax's strided
rows) is supported.
"""
from __future__ import annotations

import math

import torch

from corten.errors import LoweringError
from corten.fixed_point import (
    clamp_activation, divide_by_power_of_two, quantize_multiplier, requantize, round_half_away, round_half_away_t,
    wrap_int32_t,
)
from corten.ops import checks
from corten.ops._common import output_format
from corten.ops._rules import Match
from corten.ops.registry import OpFamily, annotates, lowers, register_family
from corten.providers import CMSIS_NN, PORTABLE

FAMILY = "layer_norm"
Z_BITS = 16  # fractional bits of the normalized value z
V_BITS = 20  # fractional bits of V (so that a small eps is not rounded away against a tiny variance)
OUT_BITS = 8  # fractional bits (of an output step) of the accumulator before the final rounding shift
MAX_ROW = 4095
EPS_Q_MAX = 1 << 61


def isqrt_t(v: torch.Tensor) -> torch.Tensor:
    """floor(sqrt(v)) of int64 values in [0, 2**62), exact (float estimate, then corrected)."""
    r = torch.sqrt(v.to(torch.float64)).floor().to(torch.int64)
    for _ in range(2):
        r = torch.where(r * r > v, r - 1, r)
        r = torch.where((r + 1) * (r + 1) <= v, r + 1, r)
    return r


def _bit_length(v: torch.Tensor) -> torch.Tensor:
    """Bit length of int64 values in [0, 2**62) (exact: frexp of the float64 would round)."""
    out = torch.zeros_like(v)
    for b in range(62, -1, -1):
        out = torch.where((out == 0) & ((v >> b) != 0), b + 1, out)
    return out


def normalized_rows(rows: torch.Tensor, eps_q: int) -> torch.Tensor:
    """``z_i`` (Q16) of int64 rows ``[R, n]`` of int8 values."""
    n = rows.shape[1]
    s = rows.sum(dim=1, keepdim=True)
    q = (rows * rows).sum(dim=1, keepdim=True)
    v = ((n * q - s * s) << V_BITS) + eps_q
    e = torch.where(v > 0, (62 - _bit_length(v)) // 2, 0)
    r = isqrt_t(v << (2 * e))
    d = n * rows - s
    num = d << (Z_BITS + V_BITS // 2 + e)
    mag = torch.div(2 * num.abs() + r, 2 * r.clamp(min=1), rounding_mode="floor")
    return torch.where(r > 0, torch.where(num < 0, -mag, mag), 0)


def _rows_of(input: torch.Tensor, num_dims: int) -> tuple[torch.Tensor, callable]:
    if input.dim() == 4:
        moved = input.movedim(3, -1)
        rows = moved.reshape(-1, moved.shape[-1])
        return rows, lambda out: out.reshape(moved.shape).movedim(-1, 3)
    n = 1
    for d in input.shape[input.dim() - num_dims:]:
        n *= int(d)
    return input.reshape(-1, n), lambda out: out.reshape(input.shape)


# ----------------------------------------------------------------------------- the op
def _check(input, multiplier, shift, bias, eps_q, output_offset, activation_min, activation_max, num_dims) -> int:
    op = "quantized_layer_norm"
    checks.dtype(op, "input", input, torch.int8)
    if not 1 <= num_dims <= input.dim():
        checks.fail(op, "num_dims", f"{num_dims} normalized dims for a {input.dim()}-D input")
    if input.dim() == 4 and num_dims != 1:
        checks.fail(op, "num_dims", "a 4-D (NHWC) input is normalized over its last dim only")
    n = 1
    for d in input.shape[input.dim() - num_dims:]:
        n *= int(d)
    if not 1 <= n <= MAX_ROW:
        checks.fail(op, "input", f"{n} normalized elements per row, outside [1, {MAX_ROW}]")
    for name, t in (("multiplier", multiplier), ("shift", shift), ("bias", bias)):
        checks.dtype(op, name, t, torch.int32)
        checks.shape(op, name, t, (n,))
    if checks._has_values(multiplier) and n:
        for m in (int(multiplier.abs().min()), int(multiplier.abs().max())):
            checks.scalar_multiplier(op, "multiplier", m)
        checks.in_range(op, "shift", int(shift.min()), -31, 30)
        checks.in_range(op, "shift", int(shift.max()), -31, 30)
    checks.in_range(op, "eps_q", eps_q, 0, EPS_Q_MAX)
    checks.output_offset(op, "output_offset", output_offset)
    checks.activation(op, activation_min, activation_max)
    return n


@torch.library.custom_op("corten::quantized_layer_norm", mutates_args=())
def quantized_layer_norm(input: torch.Tensor, multiplier: torch.Tensor, shift: torch.Tensor, bias: torch.Tensor,
                         eps_q: int, output_offset: int, activation_min: int, activation_max: int,
                         num_dims: int = 1) -> torch.Tensor:
    _check(input, multiplier, shift, bias, eps_q, output_offset, activation_min, activation_max, num_dims)
    rows, back = _rows_of(input.to(torch.int64), num_dims)
    z = normalized_rows(rows, eps_q)
    acc = wrap_int32_t(requantize(z, multiplier.to(torch.int64), shift.to(torch.int64)) + bias.to(torch.int64))
    out = wrap_int32_t(divide_by_power_of_two(acc, OUT_BITS) + output_offset)
    return back(clamp_activation(out, activation_min, activation_max)).contiguous(memory_format=output_format(input.dim()))


@quantized_layer_norm.register_fake
def _(input, multiplier, shift, bias, eps_q, output_offset, activation_min, activation_max, num_dims=1):
    _check(input, multiplier, shift, bias, eps_q, output_offset, activation_min, activation_max, num_dims)
    return torch.empty_like(input, memory_format=output_format(input.dim()))


family = register_family(OpFamily(FAMILY, ("quantized_layer_norm",), doc=__doc__))


# ----------------------------------------------------------------------------- compile-time parameters
def layer_norm_params(weight: torch.Tensor, bias: torch.Tensor, eps: float, n: int, input_scale: float,
                      output_scale: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
    """(multiplier, shift, bias, eps_q) of the kernel, from the float affine parameters (float64)."""
    mults, shifts = [], []
    for g in weight.to(torch.float64).tolist():
        m, s = quantize_multiplier(abs(g) / ((1 << OUT_BITS) * float(output_scale)))
        mults.append(-m if g < 0 else m)
        shifts.append(s)
    b = round_half_away_t(bias.to(torch.float64) * (1 << OUT_BITS) / float(output_scale))
    b = b.clamp(-(2**31) + 1, 2**31 - 1)
    eps_q = min(EPS_Q_MAX, max(0, round_half_away(float(eps) * n * n * (1 << V_BITS) / (float(input_scale) ** 2))))
    return (torch.tensor(mults, dtype=torch.int32), torch.tensor(shifts, dtype=torch.int32), b.to(torch.int32), eps_q)


# ----------------------------------------------------------------------------- lowering
_aten = torch.ops.aten
annotates("unary", _aten.layer_norm.default)


@lowers(_aten.layer_norm.default)
def lower_layer_norm(m: Match):
    """``aten.layer_norm(x, normalized_shape, weight, bias, eps)`` -> ``quantized_layer_norm``."""
    x = m.inputs[0]
    args = list(m.node.args) + [None] * 6
    normalized = [int(d) for d in args[1]]
    shape = [int(d) for d in x.node.meta["val"].shape]
    if shape[len(shape) - len(normalized):] != normalized:
        raise LoweringError(f"layer_norm: normalized_shape {normalized} is not the trailing dims of {shape}")
    if len(shape) == 4 and len(normalized) != 1:
        raise LoweringError("layer_norm of a 4-D activation over several dims: only the last dim is supported "
                            "(permute the normalized dims last and flatten them, or use GroupNorm-free code)")
    n = math.prod(normalized)
    if not 1 <= n <= MAX_ROW:
        raise LoweringError(f"layer_norm over {n} elements: at most {MAX_ROW} are supported")
    weight = args[2] if args[2] is not None else m.node.kwargs.get("weight")
    bias = args[3] if args[3] is not None else m.node.kwargs.get("bias")
    eps = args[4] if args[4] is not None else m.node.kwargs.get("eps", 1e-5)
    w = m.constant(weight).reshape(-1) if weight is not None else torch.ones(n)
    b = m.constant(bias).reshape(-1) if bias is not None else torch.zeros(n)
    if not (torch.isfinite(w).all() and torch.isfinite(b).all()):
        raise LoweringError("layer_norm: weight or bias has non-finite values")
    try:
        mult, shift, bq, eps_q = layer_norm_params(w, b, float(eps), n, x.qparams.scale, m.output.scale)
    except ValueError as e:
        raise LoweringError(f"layer_norm: {e}") from None
    act_min, act_max = m.activation_bounds
    return m.call("quantized_layer_norm", x.node, m.add_constant(mult, "multiplier"), m.add_constant(shift, "shift"),
                  m.add_constant(bq, "bias"), eps_q, m.output.zero_point, act_min, act_max, len(normalized))


# ----------------------------------------------------------------------------- scratch memory
# ----------------------------------------------------------------------------- C emission
@PORTABLE.kernel("quantized_layer_norm")
def _emit_layer_norm_c(ctx) -> str:
    """One ``corten_layer_norm_s8`` call in both flavours."""
    shape = ctx.shape(ctx.arg("input"))
    num_dims = int(ctx.arg("num_dims"))
    if len(shape) == 4:
        n_, c, h, w = shape
        outer, n, inner = n_ * h, w, c
    else:
        n = math.prod(shape[len(shape) - num_dims:])
        outer, inner = math.prod(shape) // n, 1
    eps_q = int(ctx.arg("eps_q"))
    return ctx.block(
        f"const corten_layer_norm_params params = {{.eps_q = {eps_q}LL, .output_offset = "
        f"{int(ctx.arg('output_offset'))}, .activation_min = {int(ctx.arg('activation_min'))}, "
        f".activation_max = {int(ctx.arg('activation_max'))}}};",
        ctx.call("corten_layer_norm_s8", "&params", outer, n, inner, ctx.const("multiplier"), ctx.const("shift"),
                 ctx.const("bias"), ctx.input("input"), ctx.out()))


CMSIS_NN.declines("quantized_layer_norm", reason="CMSIS-NN has no int8 LayerNorm")
