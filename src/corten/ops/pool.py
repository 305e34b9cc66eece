"""Pooling: ``quantized_avg_pool2d`` (``arm_avgpool_s8``) and ``quantized_max_pool2d``
(``arm_max_pool_s8``).

Both keep the input's quantization parameters (the quantizer shares them), so there is no
requantization: the kernels work on the raw int8 values.  Windows count only the elements inside
the input (padding is excluded, as CMSIS-NN does), and the average rounds the C way::

    avg = (sum > 0 ? sum + count / 2 : sum - count / 2) / count      (C division truncates)

A global average pool (MobileNetV2's ``adaptive_avg_pool2d(1)`` or ``mean`` over H, W) is this op
with the kernel covering the whole input.  Layout: NCHW logical, channels_last memory.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from corten.errors import LoweringError
from corten.fixed_point import clamp_activation
from corten.ops import checks
from corten.ops._common import as_4d_view, back_to_3d
from corten.ops._rules import Match
from corten.ops.registry import OpFamily, annotates, lowers, register_family

FAMILY = "pool"


def _check(op, input, kernel_size, stride, padding, activation_min, activation_max):
    checks.dtype(op, "input", input, torch.int8)
    checks.ndim(op, "input", input, 4)
    kh, kw = checks.pair(op, "kernel_size", kernel_size, 1)
    checks.pair(op, "stride", stride, 1)
    ph, pw = checks.pair(op, "padding", padding, 0)
    if ph >= kh or pw >= kw:
        checks.fail(op, "padding", f"padding {list(padding)} must be smaller than the kernel {list(kernel_size)}")
    checks.activation(op, activation_min, activation_max)
    return (checks.out_size(op, input.shape[2], kh, stride[0], ph, 1),
            checks.out_size(op, input.shape[3], kw, stride[1], pw, 1))


def _window_view(x: torch.Tensor, kernel_size, stride, ho, wo) -> torch.Tensor:
    n, _, _, c = x.shape
    sn, sh, sw, sc = x.stride()
    return x.as_strided((n, ho, wo, kernel_size[0], kernel_size[1], c),
                        (sn, sh * stride[0], sw * stride[1], sh, sw, sc))


def _nhwc_padded(input, padding, value, dtype):
    x = input.permute(0, 2, 3, 1).to(dtype)
    if padding[0] or padding[1]:
        x = F.pad(x, (0, 0, padding[1], padding[1], padding[0], padding[0]), value=value)
    return x.contiguous()


def _empty(input, ho, wo):
    return torch.empty((input.shape[0], input.shape[1], ho, wo), dtype=torch.int8,
                       device=input.device).contiguous(memory_format=torch.channels_last)


def rounded_average(total: torch.Tensor, count: torch.Tensor) -> torch.Tensor:
    """CMSIS-NN's ``sum > 0 ? (sum + count/2) / count : (sum - count/2) / count`` (truncating)."""
    half = count // 2
    return torch.div(torch.where(total > 0, total + half, total - half), count, rounding_mode="trunc")


@torch.library.custom_op("corten::quantized_avg_pool2d", mutates_args=())
def quantized_avg_pool2d(
    input: torch.Tensor,
    kernel_size: list[int],
    stride: list[int],
    padding: list[int],
    activation_min: int,
    activation_max: int,
) -> torch.Tensor:
    ho, wo = _check("quantized_avg_pool2d", input, kernel_size, stride, padding, activation_min, activation_max)
    x = _nhwc_padded(input, padding, 0, torch.int64)
    total = _window_view(x, kernel_size, stride, ho, wo).sum(dim=(3, 4))
    ones = torch.ones((1, input.shape[2], input.shape[3], 1), dtype=torch.int64)
    ones = F.pad(ones, (0, 0, padding[1], padding[1], padding[0], padding[0])).contiguous()
    count = _window_view(ones, kernel_size, stride, ho, wo).sum(dim=(3, 4))
    out = rounded_average(total, count)
    return clamp_activation(out, activation_min, activation_max).permute(0, 3, 1, 2)


@quantized_avg_pool2d.register_fake
def _(input, kernel_size, stride, padding, activation_min, activation_max):
    ho, wo = _check("quantized_avg_pool2d", input, kernel_size, stride, padding, activation_min, activation_max)
    return _empty(input, ho, wo)


@torch.library.custom_op("corten::quantized_max_pool2d", mutates_args=())
def quantized_max_pool2d(
    input: torch.Tensor,
    kernel_size: list[int],
    stride: list[int],
    padding: list[int],
    activation_min: int,
    activation_max: int,
) -> torch.Tensor:
    ho, wo = _check("quantized_max_pool2d", input, kernel_size, stride, padding, activation_min, activation_max)
    x = _nhwc_padded(input, padding, -129, torch.int16)  # below every int8: padding never wins
    out = _window_view(x, kernel_size, stride, ho, wo).amax(dim=(3, 4))
    return clamp_activation(out, activation_min, activation_max).permute(0, 3, 1, 2)


@quantized_max_pool2d.register_fake
def _(input, kernel_size, stride, padding, activation_min, activation_max):
    ho, wo = _check("quantized_max_pool2d", input, kernel_size, stride, padding, activation_min, activation_max)
    return _empty(input, ho, wo)


family = register_family(OpFamily(FAMILY, ("quantized_avg_pool2d", "quantized_max_pool2d"), doc=__doc__))


# ----------------------------------------------------------------------------- lowering

_aten = torch.ops.aten

annotates("shared", _aten.avg_pool2d.default, _aten.adaptive_avg_pool2d.default, _aten.max_pool2d.default,
          _aten.mean.dim)


def _same_qparams(m: Match) -> None:
    if m.inputs[0].qparams != m.output:
        raise LoweringError("pooling needs the same input and output quantization (CMSIS-NN pooling does "
                            "not requantize); CortenQuantizer shares them, another quantizer may not")


def _ints(v, n=2):
    v = list(v) if isinstance(v, (list, tuple)) else [v]
    return [int(x) for x in (v * n if len(v) == 1 else v)]


@lowers(_aten.avg_pool2d.default)
def lower_avg_pool2d(m: Match):
    _same_qparams(m)
    args = list(m.node.args) + [None] * 7
    kernel = _ints(args[1])
    stride = _ints(args[2]) if args[2] else kernel
    padding = _ints(args[3] if args[3] is not None else 0)
    ceil_mode = bool(args[4] or m.node.kwargs.get("ceil_mode", False))
    include_pad = args[5] if args[5] is not None else m.node.kwargs.get("count_include_pad", True)
    divisor = args[6] if args[6] is not None else m.node.kwargs.get("divisor_override")
    if ceil_mode:
        raise LoweringError("avg_pool2d with ceil_mode=True is not supported; use ceil_mode=False")
    if divisor is not None:
        raise LoweringError("avg_pool2d with divisor_override is not supported")
    if any(padding) and include_pad:
        raise LoweringError("avg_pool2d with padding must use count_include_pad=False (CMSIS-NN averages the "
                            "elements inside the input only)")
    lo, hi = m.activation_bounds
    return m.call("quantized_avg_pool2d", m.inputs[0].node, kernel, stride, padding, lo, hi)


def _global_pool(m: Match, h: int, w: int, oh: int, ow: int):
    if h % oh or w % ow:
        raise LoweringError(f"adaptive pooling {h}x{w} -> {oh}x{ow} is not a uniform pool")
    kernel = [h // oh, w // ow]
    lo, hi = m.activation_bounds
    return m.call("quantized_avg_pool2d", m.inputs[0].node, kernel, kernel, [0, 0], lo, hi)


@lowers(_aten.adaptive_avg_pool2d.default)
def lower_adaptive_avg_pool2d(m: Match):
    _same_qparams(m)
    _, _, h, w = m.node.args[0].meta["val"].shape
    oh, ow = _ints(m.node.args[1])
    return _global_pool(m, h, w, oh, ow)


@lowers(_aten.mean.dim)
def lower_mean(m: Match):
    """``mean`` over H and W of an NCHW tensor -> global average pool (+ reshape without keepdim)."""
    _same_qparams(m)
    val = m.node.args[0].meta["val"]
    dims = sorted(d % val.dim() for d in _ints(m.node.args[1], 1))
    keepdim = (m.node.args[2] if len(m.node.args) > 2 else m.node.kwargs.get("keepdim", False))
    if val.dim() == 3 and dims == [2]:
        return _mean_over_time(m, val.shape, keepdim)
    if val.dim() != 4 or dims != [2, 3]:
        raise LoweringError(f"mean over dims {dims} of a {val.dim()}-D tensor is not supported "
                            "(only H and W of NCHW, or L of NCL)")
    pooled = _global_pool(m, val.shape[2], val.shape[3], 1, 1)
    if keepdim:
        return pooled
    return m.call_aten(_aten.reshape.default, pooled, [val.shape[0], val.shape[1]])


@lowers(_aten.max_pool2d.default)
def lower_max_pool2d(m: Match):
    _same_qparams(m)
    args = list(m.node.args) + [None] * 6
    kernel = _ints(args[1])
    stride = _ints(args[2]) if args[2] else kernel
    padding = _ints(args[3] if args[3] is not None else 0)
    dilation = _ints(args[4] if args[4] is not None else 1)
    if dilation != [1, 1]:
        raise LoweringError("max_pool2d with dilation is not supported")
    if args[5]:
        raise LoweringError("max_pool2d with ceil_mode=True is not supported; use ceil_mode=False")
    lo, hi = m.activation_bounds
    return m.call("quantized_max_pool2d", m.inputs[0].node, kernel, stride, padding, lo, hi)


# ----------------------------------------------------------------------------- 1-D pooling
# 1-D pools on ``[N, C, L]`` run as the 2-D pools on the ``[N, C, 1, L]`` view (see
# corten.ops._common.as_4d_view: consecutive 1-D ops share the 4-D tensor, no copies in between).

annotates("shared", _aten.max_pool1d.default, _aten.avg_pool1d.default, _aten.adaptive_avg_pool1d.default)


def _pool1d(m: Match, op_name: str, kernel: int, stride: int, padding: int):
    in_shape = m.node.args[0].meta["val"].shape
    out_shape = m.node.meta["val"].shape
    if len(in_shape) != 3:
        raise LoweringError(f"1-D pooling of a {len(in_shape)}-D input is not supported (batch it: [N, C, L])")
    x4 = as_4d_view(m, m.inputs[0].node, in_shape)
    lo, hi = m.activation_bounds
    y4 = m.call(op_name, x4, [1, kernel], [1, stride], [0, padding], lo, hi)
    return back_to_3d(m, y4, [out_shape[0], out_shape[1], 1, out_shape[2]])


@lowers(_aten.max_pool1d.default)
def lower_max_pool1d(m: Match):
    """``aten.max_pool1d(x, kernel, stride, padding, dilation, ceil_mode)`` -> 2-D max pool on [N, C, 1, L]."""
    _same_qparams(m)
    args = list(m.node.args) + [None] * 6
    kernel = _ints(args[1], 1)[0]
    stride = _ints(args[2], 1)[0] if args[2] else kernel
    padding = _ints(args[3] if args[3] is not None else 0, 1)[0]
    if _ints(args[4] if args[4] is not None else 1, 1)[0] != 1:
        raise LoweringError("max_pool1d with dilation is not supported")
    if args[5] or m.node.kwargs.get("ceil_mode", False):
        raise LoweringError("max_pool1d with ceil_mode=True is not supported; use ceil_mode=False")
    return _pool1d(m, "quantized_max_pool2d", kernel, stride, padding)


@lowers(_aten.avg_pool1d.default)
def lower_avg_pool1d(m: Match):
    """``aten.avg_pool1d(x, kernel, stride, padding, ceil_mode, count_include_pad)`` -> 2-D average pool."""
    _same_qparams(m)
    args = list(m.node.args) + [None] * 6
    kernel = _ints(args[1], 1)[0]
    stride = _ints(args[2], 1)[0] if args[2] else kernel
    padding = _ints(args[3] if args[3] is not None else 0, 1)[0]
    if args[4] or m.node.kwargs.get("ceil_mode", False):
        raise LoweringError("avg_pool1d with ceil_mode=True is not supported; use ceil_mode=False")
    include_pad = args[5] if args[5] is not None else m.node.kwargs.get("count_include_pad", True)
    if padding and include_pad:
        raise LoweringError("avg_pool1d with padding must use count_include_pad=False (CMSIS-NN averages the "
                            "elements inside the input only)")
    return _pool1d(m, "quantized_avg_pool2d", kernel, stride, padding)


@lowers(_aten.adaptive_avg_pool1d.default)
def lower_adaptive_avg_pool1d(m: Match):
    """``adaptive_avg_pool1d(x, [out])`` with ``L`` a multiple of ``out`` -> a uniform 1-D average pool."""
    _same_qparams(m)
    length = int(m.node.args[0].meta["val"].shape[-1])
    out = _ints(m.node.args[1], 1)[0]
    if length % out:
        raise LoweringError(f"adaptive pooling of length {length} -> {out} is not a uniform pool")
    return _pool1d(m, "quantized_avg_pool2d", length // out, length // out, 0)


def _mean_over_time(m: Match, shape3, keepdim: bool):
    """``x.mean(-1)`` of ``[N, C, L]``: a global average pool of the ``[N, C, 1, L]`` view, then a
    reshape of ``[N, C, 1, 1]`` (free in C) to ``[N, C]`` or ``[N, C, 1]``."""
    n, c, length = (int(d) for d in shape3)
    x4 = as_4d_view(m, m.inputs[0].node, shape3)
    lo, hi = m.activation_bounds
    pooled = m.call("quantized_avg_pool2d", x4, [1, length], [1, length], [0, 0], lo, hi)
    return m.call_aten(_aten.reshape.default, pooled, [n, c, 1] if keepdim else [n, c])


# ----------------------------------------------------------------------------- scratch memory
def avgpool_scratch_bytes(isa: str, channels: int) -> int:
    """``arm_avgpool_s8_get_buffer_size``: one int32 sum per channel on DSP cores, none on plain
    (scalar loop) or MVE (sums kept in vector registers)."""
    if isa not in ("plain", "dsp", "mve"):
        raise ValueError(f"isa must be 'plain', 'dsp' or 'mve', got {isa!r}")
    return 4 * channels if isa == "dsp" else 0


@family.provides("scratch_bytes", "quantized_avg_pool2d")
def _avgpool_scratch(node, target) -> int:
    return avgpool_scratch_bytes(target.isa, int(node.args[0].meta["val"].shape[1]))


@family.provides("scratch_bytes", "quantized_max_pool2d")
def _maxpool_scratch(node, target) -> int:
    """``arm_max_pool_s8`` has no buffer."""
    return 0


# ----------------------------------------------------------------------------- C emission
@family.provides("emit_c", "quantized_avg_pool2d", "quantized_max_pool2d")
def _emit_pool_c(ctx) -> str:
    """One ``corten_{avg,max}_pool2d_s8`` (portable) or ``arm_avgpool_s8`` / ``arm_max_pool_s8``
    (CMSIS-NN, scratch from the plan) call."""
    is_avg = ctx.op_name == "quantized_avg_pool2d"
    n, h, w, c = ctx.nhwc(ctx.arg("input"))
    _, ho, wo, _ = ctx.nhwc()
    (kh, kw), (sh, sw), (ph, pw) = ctx.arg("kernel_size"), ctx.arg("stride"), ctx.arg("padding")
    act_min, act_max = int(ctx.arg("activation_min")), int(ctx.arg("activation_max"))
    x, out = ctx.input("input"), ctx.out()
    if ctx.kernels == "portable":
        fn = "corten_avg_pool2d_s8" if is_avg else "corten_max_pool2d_s8"
        return ctx.block(
            ctx.params("corten_pool_params", "params", dict(
                kernel_h=kh, kernel_w=kw, stride_h=sh, stride_w=sw, pad_h=ph, pad_w=pw, activation_min=act_min,
                activation_max=act_max)),
            ctx.dims("input_dims", "corten_dims", n, h, w, c),
            ctx.dims("output_dims", "corten_dims", n, ho, wo, c),
            ctx.call(f"{fn}(&params, &input_dims, {x}, &output_dims, {out})"))
    buf, size = ctx.scratch()
    fn = "arm_avgpool_s8" if is_avg else "arm_max_pool_s8"
    return ctx.block(
        ctx.params("cmsis_nn_context", "nn_ctx", dict(buf=buf, size=size)),
        ctx.params("cmsis_nn_pool_params", "params", dict(stride=dict(w=sw, h=sh), padding=dict(w=pw, h=ph),
                                                          activation=dict(min=act_min, max=act_max))),
        ctx.dims("input_dims", "cmsis_nn_dims", n, h, w, c),
        ctx.dims("filter_dims", "cmsis_nn_dims", 1, kh, kw, 1),
        ctx.dims("output_dims", "cmsis_nn_dims", n, ho, wo, c),
        ctx.call(f"{fn}(&nn_ctx, &params, &input_dims, {x}, &filter_dims, &output_dims, {out})"))
