"""Reductions: ``quantized_reduce`` - max, min, sum and mean over any dims, with or without keepdim
(``amax``, ``amin``, ``max.dim`` / ``min.dim`` values, ``sum``, ``mean``).

``mode`` 0 (max) and 1 (min) keep the input's quantization (the quantizer shares it): the int8
values are compared, no arithmetic.  ``mode`` 2 (sum, also mean) is TFLite's int8 SUM/MEAN::

    y = clamp(requantize(sum(x + input_offset), multiplier, shift) + output_offset, act_min, act_max)

with the multiplier of ``s_in / s_out`` (sum) or ``s_in / (s_out * count)`` (mean); the int32 sum
of up to 2**23 int8 values cannot overflow.  A mean over H and W of NCHW (a global average pool)
and over L of NCL keep lowering to ``quantized_avg_pool2d`` (CMSIS-NN's ``arm_avgpool_s8``).

``quantized_argmax`` (``torch.argmax`` / ``argmin`` over one dim, with or without keepdim, as the
program's output) returns **int32** indices: the first index of the largest (smallest) int8 value,
as torch breaks ties.  The C library writes them as int32 values into the caller's output buffer
(``<NAME>_OUTPUT_INT32``); no other integer output is produced.

C: ``corten_reduce_s8`` walks the kept dims of the input's storage (NHWC for 4-D) and, for each
output element, the reduced dims; the output's storage strides place it (row-major for ranks < 4,
NHWC for 4-D).  No scratch.  CMSIS-NN has no reduction kernel.
"""
from __future__ import annotations

from typing import Sequence

import torch

from corten.errors import LoweringError
from corten.fixed_point import clamp_activation, requantize, wrap_int32_t
from corten.fx_nodes import node_arg
from corten.ops import checks
from corten.ops._common import (MAX_ELEMENTWISE_RANK, MAX_RANK, as_4d_view, effective_multiplier, output_format,
                                storage_dim_order)
from corten.ops._rules import Match
from corten.ops.registry import Hook, OpFamily, annotates, lowers, register_family
from corten.providers import CMSIS_NN, PORTABLE

FAMILY = "reduce"
MODES = {"max": 0, "min": 1, "sum": 2}


def _out_shape(shape, dims, keepdim) -> list[int]:
    return [1 if d in dims else int(s) for d, s in enumerate(shape)] if keepdim else \
        [int(s) for d, s in enumerate(shape) if d not in dims]


def _check(input, dims, keepdim, mode, input_offset, output_offset, multiplier, shift, activation_min,
           activation_max) -> tuple[list[int], list[int]]:
    op = "quantized_reduce"
    checks.dtype(op, "input", input, torch.int8)
    if not 1 <= input.dim() <= MAX_ELEMENTWISE_RANK:
        checks.fail(op, "input", f"rank {input.dim()} is not 1 to {MAX_ELEMENTWISE_RANK}")
    norm = sorted({int(d) % input.dim() for d in dims})
    if not dims or any(not -input.dim() <= int(d) < input.dim() for d in dims):
        checks.fail(op, "dims", f"{list(dims)} are not dims of a {input.dim()}-D tensor")
    if not keepdim and len(norm) == input.dim():
        checks.fail(op, "dims", "reducing every dim without keepdim gives a 0-D tensor; use keepdim=True")
    checks.in_range(op, "mode", mode, 0, 2)
    checks.input_offset(op, "input_offset", input_offset)
    checks.output_offset(op, "output_offset", output_offset)
    # any non-negative int32: TFLite's MEAN divides its Q31 multiplier by the element count (frontends/tflite.py)
    checks.in_range(op, "multiplier", multiplier, 0, 2**31 - 1)
    checks.scalar_shift(op, "shift", shift)
    checks.activation(op, activation_min, activation_max)
    return norm, _out_shape(input.shape, norm, keepdim)


@torch.library.custom_op("corten::quantized_reduce", mutates_args=())
def quantized_reduce(input: torch.Tensor, dims: list[int], keepdim: bool, mode: int, input_offset: int,
                     output_offset: int, multiplier: int, shift: int, activation_min: int,
                     activation_max: int) -> torch.Tensor:
    norm, shape = _check(input, dims, keepdim, mode, input_offset, output_offset, multiplier, shift,
                         activation_min, activation_max)
    x = input.to(torch.int64)
    if mode == 0:
        out = x.amax(dim=norm, keepdim=keepdim)
    elif mode == 1:
        out = x.amin(dim=norm, keepdim=keepdim)
    else:
        total = wrap_int32_t((x + input_offset).sum(dim=norm, keepdim=keepdim))
        out = wrap_int32_t(requantize(total, multiplier, shift) + output_offset)
    out = clamp_activation(out, activation_min, activation_max).reshape(shape)
    return out.contiguous(memory_format=output_format(len(shape)))


@quantized_reduce.register_fake
def _(input, dims, keepdim, mode, input_offset, output_offset, multiplier, shift, activation_min, activation_max):
    _, shape = _check(input, dims, keepdim, mode, input_offset, output_offset, multiplier, shift, activation_min,
                      activation_max)
    return torch.empty(shape, dtype=torch.int8, device=input.device).contiguous(
        memory_format=output_format(len(shape)))


def _check_argmax(input, dim, keepdim, mode) -> tuple[int, list[int]]:
    op = "quantized_argmax"
    checks.dtype(op, "input", input, torch.int8)
    if not 1 <= input.dim() <= MAX_ELEMENTWISE_RANK:
        checks.fail(op, "input", f"rank {input.dim()} is not 1 to {MAX_ELEMENTWISE_RANK}")
    if not -input.dim() <= int(dim) < input.dim():
        checks.fail(op, "dim", f"{dim} is not a dim of a {input.dim()}-D tensor")
    checks.in_range(op, "mode", mode, 0, 1)
    d = int(dim) % input.dim()
    return d, _out_shape(input.shape, [d], keepdim)


@torch.library.custom_op("corten::quantized_argmax", mutates_args=())
def quantized_argmax(input: torch.Tensor, dim: int, keepdim: bool, mode: int) -> torch.Tensor:
    """int32 index of the first maximum (mode 0) / minimum (mode 1) of the int8 ``input`` along ``dim``."""
    d, shape = _check_argmax(input, dim, keepdim, mode)
    x = input.to(torch.int64)
    best = x.amax(dim=d, keepdim=True) if mode == 0 else x.amin(dim=d, keepdim=True)
    n = int(input.shape[d])
    index = torch.arange(n, dtype=torch.int64).reshape([n if k == d else 1 for k in range(input.dim())])
    first = torch.where(x == best, index, torch.full_like(x, n)).amin(dim=d, keepdim=keepdim)
    return first.to(torch.int32).reshape(shape).contiguous(memory_format=output_format(len(shape)))


@quantized_argmax.register_fake
def _(input, dim, keepdim, mode):
    _, shape = _check_argmax(input, dim, keepdim, mode)
    return torch.empty(shape, dtype=torch.int32, device=input.device).contiguous(
        memory_format=output_format(len(shape)))


family = register_family(OpFamily(FAMILY, ("quantized_reduce", "quantized_argmax"), doc=__doc__))


@family.provides(Hook.UNUSED_ARGS, "quantized_reduce")
def _unused_args(node) -> tuple[str, ...]:
    """A max/min (modes 0, 1) reads int8 values on the shared grid: no offsets, no requantization."""
    return ("input_offset", "output_offset", "multiplier", "shift") if int(node_arg(node, "mode")) in (0, 1) else ()


# ----------------------------------------------------------------------------- lowering
_aten = torch.ops.aten
annotates("shared", _aten.amax.default, _aten.amin.default, _aten.max.dim, _aten.min.dim, _aten.mean.dim)
annotates("unary", _aten.sum.dim_IntList)
annotates("shared", _aten.argmax.default, _aten.argmin.default)  # int64 output: no qparams


def _dims_arg(node, i: int, rank: int) -> list[int]:
    v = node.args[i] if len(node.args) > i else node.kwargs.get("dim")
    if v is None or (isinstance(v, (list, tuple)) and len(v) == 0):
        return list(range(rank))
    v = list(v) if isinstance(v, (list, tuple)) else [v]
    return sorted({int(d) % rank for d in v})


def _keepdim(node, i: int) -> bool:
    return bool(node.args[i] if len(node.args) > i else node.kwargs.get("keepdim", False))


def lower_reduction(m: Match, kind: str, dims: Sequence[int], keepdim: bool):
    """A max/min/sum/mean of ``m.inputs[0]`` over ``dims`` -> ``quantized_reduce``."""
    x = m.inputs[0]
    val = x.node.meta["val"]
    rank = val.dim()
    if not 1 <= rank <= MAX_ELEMENTWISE_RANK:
        raise LoweringError(f"{kind} of a rank-{rank} tensor is not supported (ranks 1 to {MAX_ELEMENTWISE_RANK})")
    if len(reduce_geometry(val.shape, dims, keepdim)[0]) > MAX_RANK:
        raise LoweringError(f"{kind} over dims {list(dims)} of a rank-5 tensor alternates reduced and kept dims more "
                            f"than the C kernel's {MAX_RANK} loops allow (reduce adjacent dims, or reshape first)")
    if not keepdim and len(dims) == rank:
        raise LoweringError(f"{kind} over every dim without keepdim (a 0-D result) is not supported; "
                            "use keepdim=True")
    lo, hi = m.activation_bounds
    if kind in ("max", "min"):
        if x.qparams != m.output:
            raise LoweringError(f"{kind} needs the same input and output quantization (CortenQuantizer shares them)")
        return m.call("quantized_reduce", x.node, list(dims), keepdim, MODES[kind], 0, 0, 0, 0, lo, hi)
    count = 1
    for d in dims:
        count *= int(val.shape[d])
    scale = float(x.qparams.scale) / float(m.output.scale) / (count if kind == "mean" else 1)
    mult, shift = effective_multiplier(scale, f"{kind}: effective scale {scale:g}")
    return m.call("quantized_reduce", x.node, list(dims), keepdim, MODES["sum"], x.qparams.offset,
                  m.output.zero_point, mult, shift, lo, hi)


@lowers(_aten.amax.default, _aten.amin.default)
def lower_amax_amin(m: Match):
    """``x.amax(dim, keepdim)`` / ``x.amin(...)`` (no dim: all dims)."""
    rank = m.node.args[0].meta["val"].dim()
    kind = "max" if m.node.target == _aten.amax.default else "min"
    return lower_reduction(m, kind, _dims_arg(m.node, 1, rank), _keepdim(m.node, 2))


@lowers(_aten.max.dim, _aten.min.dim)
def lower_max_min_dim(m: Match):
    """``x.max(dim, keepdim).values`` / ``x.min(...)`` (the indices unused) -> the reduction."""
    rank = m.node.args[0].meta["val"].dim()
    kind = "max" if m.node.target == _aten.max.dim else "min"
    if any(u.users for u in m.node.users if u.args[1] == 1):
        raise LoweringError(f"{kind}.dim with the indices used is not supported (use argmax for indices)")
    return lower_reduction(m, kind, _dims_arg(m.node, 1, rank), _keepdim(m.node, 2))


@lowers(_aten.sum.dim_IntList)
def lower_sum(m: Match):
    """``x.sum(dim, keepdim)`` -> ``quantized_reduce`` (TFLite SUM arithmetic)."""
    if m.node.kwargs.get("dtype") is not None:
        raise LoweringError("sum with a dtype is not supported")
    rank = m.node.args[0].meta["val"].dim()
    return lower_reduction(m, "sum", _dims_arg(m.node, 1, rank), _keepdim(m.node, 2))


@lowers(_aten.mean.dim)
def lower_mean(m: Match):
    """``mean`` over H and W of NCHW -> a global ``quantized_avg_pool2d`` (``arm_avgpool_s8``; + a free
    reshape without keepdim); over L of NCL -> the same on the ``[N, C, 1, L]`` view; over any other
    dims -> ``quantized_reduce`` (sum with the multiplier of ``s_in / (s_out * count)``)."""
    x = m.inputs[0]
    if x.qparams != m.output:
        raise LoweringError("mean needs the same input and output quantization (CortenQuantizer shares them)")
    val = m.node.args[0].meta["val"]
    dims = _dims_arg(m.node, 1, val.dim())
    keepdim = _keepdim(m.node, 2)
    lo, hi = m.activation_bounds
    if val.dim() == 4 and dims == [2, 3]:
        n, c, h, w = (int(d) for d in val.shape)
        pooled = m.call("quantized_avg_pool2d", x.node, [h, w], [h, w], [0, 0], lo, hi)
        return pooled if keepdim else m.call_aten(_aten.reshape.default, pooled, [n, c])
    if val.dim() == 3 and dims == [2]:
        n, c, length = (int(d) for d in val.shape)
        x4 = as_4d_view(m, x.node, val.shape)
        pooled = m.call("quantized_avg_pool2d", x4, [1, length], [1, length], [0, 0], lo, hi)
        return m.call_aten(_aten.reshape.default, pooled, [n, c, 1] if keepdim else [n, c])
    return lower_reduction(m, "mean", dims, keepdim)


@lowers(_aten.argmax.default, _aten.argmin.default)
def lower_argmax(m: Match):
    """``x.argmax(dim, keepdim)`` / ``argmin`` -> ``quantized_argmax`` (int32 indices).  No dim: the index
    into the flattened tensor, the argmax of ``x.reshape(-1)`` over dim 0 (a 0-D result)."""
    val = m.node.args[0].meta["val"]
    kind = "argmax" if m.node.target == _aten.argmax.default else "argmin"
    dim = m.node.args[1] if len(m.node.args) > 1 else m.node.kwargs.get("dim")
    keepdim = _keepdim(m.node, 2)
    if not 1 <= val.dim() <= MAX_ELEMENTWISE_RANK:
        raise LoweringError(f"{kind} of a rank-{val.dim()} tensor is not supported (ranks 1 to {MAX_ELEMENTWISE_RANK})")
    if any(u.op != "output" for u in m.node.users):
        raise LoweringError(f"{kind} feeding other ops is not supported: its int32 indices can only be a "
                            "program output (do index arithmetic in the caller)")
    x = m.inputs[0].node
    if dim is None:  # the index into the flattened tensor: the argmax of x.reshape(-1) over dim 0 (0-D)
        if keepdim and val.dim() > 1:
            raise LoweringError(f"{kind} without dim with keepdim=True is not supported; flatten first, e.g. "
                                f"x.flatten().{kind}(0, keepdim=True)")
        if val.dim() > 1:
            x = m.call_aten(_aten.reshape.default, x, [val.numel()])
        dim = 0
    return m.call("quantized_argmax", x, int(dim) % val.dim(), keepdim, 0 if kind == "argmax" else 1)


# ----------------------------------------------------------------------------- scratch memory
# ----------------------------------------------------------------------------- C emission
def reduce_geometry(in_shape: Sequence[int], dims: Sequence[int], keepdim: bool):
    """``(storage dims, reduce flags, output strides)`` of the input, 4 values each in the input's
    storage order (leading 1s): the output's element stride along each kept storage dim, 0 along a
    reduced one."""
    rank = len(in_shape)
    order = storage_dim_order(rank)
    out_shape = _out_shape(in_shape, dims, keepdim)
    out_rank = len(out_shape)
    out_order = storage_dim_order(out_rank)
    step, out_stride = 1, [0] * out_rank
    for d in reversed(out_order):
        out_stride[d] = step
        step *= int(out_shape[d])
    kept = [d for d in range(rank) if d not in dims]
    out_dim_of = {d: (d if keepdim else kept.index(d)) for d in kept}
    sdims = [int(in_shape[d]) for d in order]
    flags = [1 if d in dims else 0 for d in order]
    strides = [0 if d in dims else out_stride[out_dim_of[d]] for d in order]
    if rank > MAX_RANK:  # rank 5: drop size-1 dims, merge neighbours the kernel walks as one
        keep = [i for i in range(rank) if sdims[i] != 1] or [rank - 1]
        cd, cf, cs = [], [], []
        for i in reversed(keep):
            if cd and flags[i] == cf[0] and (flags[i] or strides[i] == cs[0] * cd[0]):
                cd[0] *= sdims[i]
                continue
            cd.insert(0, sdims[i])
            cf.insert(0, flags[i])
            cs.insert(0, strides[i])
        sdims, flags, strides = cd, cf, cs
    pad = MAX_RANK - len(sdims)
    return [1] * pad + sdims, [0] * pad + flags, [0] * pad + strides


@PORTABLE.kernel("quantized_reduce")
def _emit_reduce_c(ctx) -> str:
    """``corten_reduce_s8`` (portable, in both flavours)."""
    in_shape = ctx.shape(ctx.arg("input"))
    rank = len(in_shape)
    dims = sorted({int(d) % rank for d in ctx.arg("dims")})
    sdims, flags, strides = reduce_geometry(in_shape, dims, bool(ctx.arg("keepdim")))
    fmt = lambda v: "{" + ", ".join(str(int(x)) for x in v) + "}"  # noqa: E731
    fields = {"dims": fmt(sdims), "reduce": fmt(flags), "out_strides": fmt(strides)}
    fields.update({k: int(ctx.arg(k)) for k in ("mode", "input_offset", "output_offset", "multiplier", "shift",
                                                "activation_min", "activation_max")})
    return ctx.block(
        ctx.params("corten_reduce_params", "params", fields),
        ctx.call("corten_reduce_s8", "&params", ctx.input('input'), ctx.out()))


@PORTABLE.kernel("quantized_argmax")
def _emit_argmax_c(ctx) -> str:
    """``corten_argmax_s8`` (portable, in both flavours): the reduce walk with int32 index outputs."""
    in_shape = ctx.shape(ctx.arg("input"))
    rank = len(in_shape)
    dim = int(ctx.arg("dim")) % rank
    sdims, flags, strides = reduce_geometry(in_shape, [dim], bool(ctx.arg("keepdim")))
    fmt = lambda v: "{" + ", ".join(str(int(x)) for x in v) + "}"  # noqa: E731
    fields = {"dims": fmt(sdims), "reduce": fmt(flags), "out_strides": fmt(strides), "mode": int(ctx.arg("mode")),
              "input_offset": 0, "output_offset": 0, "multiplier": 0, "shift": 0, "activation_min": -128,
              "activation_max": 127}
    return ctx.block(
        ctx.params("corten_reduce_params", "params", fields),
        ctx.call("corten_argmax_s8", "&params", ctx.input('input'), ctx.out()))


CMSIS_NN.declines("quantized_reduce", reason="CMSIS-NN has no max/min/sum reduction over arbitrary dims")


CMSIS_NN.declines("quantized_argmax", reason="CMSIS-NN has no argmax kernel")
