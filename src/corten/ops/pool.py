"""Pooling: ``quantized_avg_pool2d`` (``arm_avgpool_s8``), ``quantized_max_pool2d``
(``arm_max_pool_s8``) and the adaptive pools ``quantized_adaptive_avg_pool2d`` /
``quantized_adaptive_max_pool2d`` (PyTorch's windows, which need not be uniform).

All keep the input's quantization parameters (the quantizer shares them), so there is no
requantization: the kernels work on the raw int8 values.  Layout: NCHW logical, channels_last
memory, any batch N.

Strided pools follow PyTorch's geometry.  ``padding`` is ``[pad_h, pad_w]`` (symmetric) or
``[top, left, bottom, right]``; with ``ceil_mode`` the output size rounds up (PyTorch's
``pooling_output_shape``: a last window must start inside the input or the leading padding) and a
last window may overhang the padding.  Window ``(oy, ox)`` of an average pool starts at
``hs = oy * stride_h - top`` and sums the input elements of ``[hs, hs + kernel_h)`` (x the same);
its divisor is ``divisor_override`` when > 0, else with ``count_include_pad`` the window clipped to
the padded input ``(min(hs + kernel_h, H + bottom) - hs) * (...)`` (PyTorch's ``pool_size``), else
the number of input elements it covers.  The average rounds the CMSIS-NN (C) way::

    avg = (sum > 0 ? sum + divisor / 2 : sum - divisor / 2) / divisor      (C division truncates)

With the divisor the element count (CMSIS-NN's case) ``sum`` is the sum of the raw int8 values (the
zero point cancels).  With ``count_include_pad`` or ``divisor_override`` it does not: then ``sum``
is ``sum(q - zero_point)`` over the input elements (padding is the real 0) and the result is
``avg + zero_point`` - the op takes the input's ``zero_point`` for that.

Max pool windows take taps ``hs + ky * dilation_h``; padding never wins.

Adaptive pools (output ``[OH, OW]``): window ``i`` along a dim of size ``L`` covers
``[floor(i * L / O), ceil((i + 1) * L / O))``; the average divides by the window's size.  When every
window has one size and the windows tile the input, the lowering uses the strided op instead
(CMSIS-NN's kernels apply).

A global average pool (MobileNetV2's ``adaptive_avg_pool2d(1)``, or ``mean`` over H, W, lowered by
:mod:`corten.ops.reduce`) is the average pool with the kernel covering the whole input.  CMSIS-NN runs a strided pool when its
semantics agree: symmetric padding, floor-mode output size, and every divisor equal to the number
of input elements in the window (see :func:`cmsis_compatible`); otherwise the portable kernel.
"""
from __future__ import annotations


import torch
import torch.nn.functional as F

from corten.errors import LoweringError
from corten.fx_nodes import node_arg
from corten.fixed_point import clamp_activation
from corten.ops import checks
from corten.ops._common import as_4d_view, back_to_3d, optional_arg, pads4, pool_window
from corten.ops._rules import Match
from corten.ops.registry import A8W8, A16W8, Hook, OpFamily, Window, annotates, lowers, register_family
from corten.providers import CMSIS_NN, PORTABLE, NodeView, kernel_suffix

FAMILY = "pool"


# ----------------------------------------------------------------------------- geometry (shared)
def pool_out_size(size: int, k: int, stride: int, before: int, after: int, dilation: int = 1,
                  ceil_mode: bool = False) -> int:
    """PyTorch's ``pooling_output_shape`` with separate leading/trailing padding."""
    span = size + before + after - dilation * (k - 1) - 1
    o = (span + (stride - 1 if ceil_mode else 0)) // stride + 1
    if ceil_mode and (o - 1) * stride >= size + before:
        o -= 1
    return o


def _check(op, input, kernel_size, stride, padding, activation_min, activation_max, dilation=(1, 1),
           ceil_mode=False, divisor_override=0):
    wide = isinstance(input, torch.Tensor) and input.dtype == torch.int16  # 16x8: arm_{avg,max}pool_s16
    checks.dtype(op, "input", input, torch.int16 if wide else torch.int8)
    checks.ndim(op, "input", input, 4)
    kh, kw = checks.pair(op, "kernel_size", kernel_size, 1)
    sh, sw = checks.pair(op, "stride", stride, 1)
    dh, dw = checks.pair(op, "dilation", dilation, 1)
    if len(padding) not in (2, 4):
        checks.fail(op, "padding", f"expected [pad_h, pad_w] or [top, left, bottom, right], got {list(padding)}")
    top, left, bottom, right = pads4(padding)
    if min(top, left, bottom, right) < 0:
        checks.fail(op, "padding", f"negative padding {list(padding)}")
    if max(top, bottom) >= dh * (kh - 1) + 1 or max(left, right) >= dw * (kw - 1) + 1:
        checks.fail(op, "padding", f"padding {list(padding)} must be smaller than the kernel {list(kernel_size)}")
    checks.in_range(op, "divisor_override", int(divisor_override), 0, 2**24)
    checks.activation(op, activation_min, activation_max, input.dtype)
    if wide and kh * kw >= 65536:
        checks.fail(op, "kernel_size", f"a {kh}x{kw} window of int16 values overflows the int32 sum")
    ho = pool_out_size(int(input.shape[2]), kh, sh, top, bottom, dh, ceil_mode)
    wo = pool_out_size(int(input.shape[3]), kw, sw, left, right, dw, ceil_mode)
    if ho < 1 or wo < 1:
        checks.fail(op, "input", f"spatial size {tuple(input.shape[2:])} too small for kernel {list(kernel_size)} "
                                 f"(dilation {list(dilation)}, padding {list(padding)})")
    return ho, wo


def _window_view(x: torch.Tensor, kernel_size, stride, ho, wo, dilation=(1, 1)) -> torch.Tensor:
    n, _, _, c = x.shape
    sn, sh, sw, sc = x.stride()
    return x.as_strided((n, ho, wo, kernel_size[0], kernel_size[1], c),
                        (sn, sh * stride[0], sw * stride[1], sh * dilation[0], sw * dilation[1], sc))


def _nhwc_padded(input, kernel_size, stride, padding, ho, wo, value, dtype, dilation=(1, 1)):
    """NHWC ``input`` padded with ``value``: the leading padding, and after it as much as the last
    window reaches (the trailing padding plus any ceil-mode overhang; extra rows never used)."""
    top, left, _, _ = pads4(padding)
    h, w = int(input.shape[2]), int(input.shape[3])
    need_h = (ho - 1) * stride[0] + dilation[0] * (kernel_size[0] - 1) + 1
    need_w = (wo - 1) * stride[1] + dilation[1] * (kernel_size[1] - 1) + 1
    bottom, right = max(0, need_h - h - top), max(0, need_w - w - left)
    x = input.permute(0, 2, 3, 1).to(dtype)
    if top or left or bottom or right:
        x = F.pad(x, (0, 0, left, right, top, bottom), value=value)
    return x.contiguous()


def _empty(input, ho, wo):
    return torch.empty((input.shape[0], input.shape[1], ho, wo), dtype=input.dtype,
                       device=input.device).contiguous(memory_format=torch.channels_last)


def rounded_average(total: torch.Tensor, count: torch.Tensor) -> torch.Tensor:
    """CMSIS-NN's ``sum > 0 ? (sum + count/2) / count : (sum - count/2) / count`` (truncating)."""
    half = count // 2
    return torch.div(torch.where(total > 0, total + half, total - half), count, rounding_mode="trunc")


def avg_divisors(h: int, w: int, kernel_size, stride, padding, ho: int, wo: int, count_include_pad: bool,
                 divisor_override: int) -> torch.Tensor:
    """``[1, ho, wo, 1]`` int64 divisor of each window (see the module docstring)."""
    if divisor_override:
        return torch.full((1, ho, wo, 1), int(divisor_override), dtype=torch.int64)
    top, left, bottom, right = pads4(padding)
    hs = torch.arange(ho, dtype=torch.int64) * stride[0] - top
    ws = torch.arange(wo, dtype=torch.int64) * stride[1] - left
    he, we = hs + kernel_size[0], ws + kernel_size[1]
    if count_include_pad:
        rows, cols = he.clamp(max=h + bottom) - hs, we.clamp(max=w + right) - ws
    else:
        rows, cols = he.clamp(max=h) - hs.clamp(min=0), we.clamp(max=w) - ws.clamp(min=0)
    return (rows[:, None] * cols[None, :]).reshape(1, ho, wo, 1)


@torch.library.custom_op("corten::quantized_avg_pool2d", mutates_args=())
def quantized_avg_pool2d(
    input: torch.Tensor,
    kernel_size: list[int],
    stride: list[int],
    padding: list[int],
    activation_min: int,
    activation_max: int,
    ceil_mode: bool = False,
    count_include_pad: bool = False,
    divisor_override: int = 0,
    zero_point: int = 0,
) -> torch.Tensor:
    ho, wo = _check("quantized_avg_pool2d", input, kernel_size, stride, padding, activation_min, activation_max,
                    ceil_mode=ceil_mode, divisor_override=divisor_override)
    checks.output_offset("quantized_avg_pool2d", "zero_point", zero_point)
    pytorch_divisor = bool(count_include_pad or divisor_override)
    zp = int(zero_point) if pytorch_divisor else 0
    x = _nhwc_padded(input.to(torch.int64) - zp, kernel_size, stride, padding, ho, wo, 0, torch.int64)
    total = _window_view(x, kernel_size, stride, ho, wo).sum(dim=(3, 4))
    count = avg_divisors(int(input.shape[2]), int(input.shape[3]), kernel_size, stride, padding, ho, wo,
                         count_include_pad, divisor_override)
    out = rounded_average(total, count) + zp
    return clamp_activation(out, activation_min, activation_max, input.dtype).permute(0, 3, 1, 2)


@quantized_avg_pool2d.register_fake
def _(input, kernel_size, stride, padding, activation_min, activation_max, ceil_mode=False, count_include_pad=False,
      divisor_override=0, zero_point=0):
    ho, wo = _check("quantized_avg_pool2d", input, kernel_size, stride, padding, activation_min, activation_max,
                    ceil_mode=ceil_mode, divisor_override=divisor_override)
    return _empty(input, ho, wo)


@torch.library.custom_op("corten::quantized_max_pool2d", mutates_args=())
def quantized_max_pool2d(input: torch.Tensor, kernel_size: list[int], stride: list[int], padding: list[int],
                         activation_min: int, activation_max: int, dilation: list[int] | None = None,
                         ceil_mode: bool = False) -> torch.Tensor:
    dilation = [1, 1] if dilation is None else dilation
    ho, wo = _check("quantized_max_pool2d", input, kernel_size, stride, padding, activation_min, activation_max,
                    dilation, ceil_mode)
    x = _nhwc_padded(input, kernel_size, stride, padding, ho, wo, -32769, torch.int32, dilation)  # padding never wins
    out = _window_view(x, kernel_size, stride, ho, wo, dilation).amax(dim=(3, 4))
    return clamp_activation(out, activation_min, activation_max, input.dtype).permute(0, 3, 1, 2)


@quantized_max_pool2d.register_fake
def _(input, kernel_size, stride, padding, activation_min, activation_max, dilation=None, ceil_mode=False):
    dilation = [1, 1] if dilation is None else dilation
    ho, wo = _check("quantized_max_pool2d", input, kernel_size, stride, padding, activation_min, activation_max,
                    dilation, ceil_mode)
    return _empty(input, ho, wo)


def max_pool_window_argmax(input, kernel_size, stride, padding, dilation, ceil_mode) -> torch.Tensor:
    """``[N, C, OH, OW]`` int64: ``iy * W + ix`` of the first largest tap of each window (taps in
    row-major window order, padding never wins) - torch's ``max_pool2d(..., return_indices=True)``
    indices, on any ordered values (int8 or float)."""
    kh, kw = kernel_size
    top, left, bottom, right = pads4(padding)
    h, w = int(input.shape[2]), int(input.shape[3])
    ho = pool_out_size(h, kh, stride[0], top, bottom, dilation[0], ceil_mode)
    wo = pool_out_size(w, kw, stride[1], left, right, dilation[1], ceil_mode)
    low = torch.finfo(torch.float64).min
    x = _nhwc_padded(input, kernel_size, stride, padding, ho, wo, low, torch.float64, dilation)
    taps = _window_view(x, kernel_size, stride, ho, wo, dilation).reshape(x.shape[0], ho, wo, kh * kw, -1)
    k = taps.argmax(dim=3)  # the first maximum (torch.argmax's tie rule)
    oy = torch.arange(ho).reshape(1, ho, 1, 1) * stride[0] - top
    ox = torch.arange(wo).reshape(1, 1, wo, 1) * stride[1] - left
    index = (oy + (k // kw) * dilation[0]) * w + ox + (k % kw) * dilation[1]
    return index.permute(0, 3, 1, 2)


@torch.library.custom_op("corten::quantized_max_pool2d_indices", mutates_args=())
def quantized_max_pool2d_indices(input: torch.Tensor, kernel_size: list[int], stride: list[int],
                                 padding: list[int], dilation: list[int], ceil_mode: bool) -> torch.Tensor:
    """int32 ``iy * W + ix`` of each window's first largest int8 value (a program output only)."""
    ho, wo = _check("quantized_max_pool2d_indices", input, kernel_size, stride, padding, -128, 127,
                    dilation, ceil_mode)
    index = max_pool_window_argmax(input, kernel_size, stride, padding, dilation, ceil_mode)
    return index.to(torch.int32).contiguous(memory_format=torch.channels_last)


@quantized_max_pool2d_indices.register_fake
def _(input, kernel_size, stride, padding, dilation, ceil_mode):
    ho, wo = _check("quantized_max_pool2d_indices", input, kernel_size, stride, padding, -128, 127,
                    dilation, ceil_mode)
    return torch.empty((input.shape[0], input.shape[1], ho, wo), dtype=torch.int32,
                       device=input.device).contiguous(memory_format=torch.channels_last)


@torch.library.custom_op("corten::max_pool2d_indices", mutates_args=())
def max_pool2d_indices(input: torch.Tensor, kernel_size: list[int], stride: list[int], padding: list[int],
                       dilation: list[int], ceil_mode: bool) -> torch.Tensor:
    """The float graph's spelling of ``max_pool2d(..., return_indices=True)[1]`` returned by the
    program (see :func:`corten.compiler.max_indices_as_argmax`): torch's int64 indices."""
    return F.max_pool2d(input, kernel_size, stride, padding, dilation, ceil_mode, return_indices=True)[1]


@max_pool2d_indices.register_fake
def _(input, kernel_size, stride, padding, dilation, ceil_mode):
    return F.max_pool2d(input, kernel_size, stride, padding, dilation, ceil_mode, return_indices=True)[1]


# ----------------------------------------------------------------------------- adaptive pools
def adaptive_bounds(size: int, out: int) -> list[tuple[int, int]]:
    """PyTorch's adaptive windows along one dim: ``[floor(i * size / out), ceil((i + 1) * size / out))``."""
    return [((i * size) // out, -((-(i + 1) * size) // out)) for i in range(out)]


def _check_adaptive(op, input, output_size, activation_min, activation_max):
    checks.dtype(op, "input", input, torch.int8)
    checks.ndim(op, "input", input, 4)
    oh, ow = checks.pair(op, "output_size", output_size, 1)
    checks.activation(op, activation_min, activation_max)
    return oh, ow


def _adaptive(input, output_size, activation_min, activation_max, is_avg: bool) -> torch.Tensor:
    oh, ow = (int(v) for v in output_size)
    x = input.permute(0, 2, 3, 1).to(torch.int64)
    rows = []
    for hs, he in adaptive_bounds(int(input.shape[2]), oh):
        cols = []
        for ws, we in adaptive_bounds(int(input.shape[3]), ow):
            win = x[:, hs:he, ws:we, :]
            if is_avg:
                count = torch.tensor((he - hs) * (we - ws), dtype=torch.int64)
                cols.append(rounded_average(win.sum(dim=(1, 2)), count))
            else:
                cols.append(win.amax(dim=(1, 2)))
        rows.append(torch.stack(cols, dim=1))
    out = torch.stack(rows, dim=1)  # [N, OH, OW, C]
    return clamp_activation(out, activation_min, activation_max).permute(0, 3, 1, 2)


def _adaptive_op(name: str, average: bool):
    """Define ``corten::<name>``: adaptive average (``average``) or max pooling to ``output_size``."""
    def kernel(input: torch.Tensor, output_size: list[int], activation_min: int,
               activation_max: int) -> torch.Tensor:
        _check_adaptive(name, input, output_size, activation_min, activation_max)
        return _adaptive(input, output_size, activation_min, activation_max, average)

    kernel.__name__ = kernel.__qualname__ = name
    op = torch.library.custom_op(f"corten::{name}", kernel, mutates_args=())

    @op.register_fake
    def _(input, output_size, activation_min, activation_max):
        oh, ow = _check_adaptive(name, input, output_size, activation_min, activation_max)
        return _empty(input, oh, ow)

    return op


quantized_adaptive_avg_pool2d = _adaptive_op("quantized_adaptive_avg_pool2d", True)
quantized_adaptive_max_pool2d = _adaptive_op("quantized_adaptive_max_pool2d", False)


OPS = ("quantized_avg_pool2d", "quantized_max_pool2d", "quantized_adaptive_avg_pool2d",
       "quantized_adaptive_max_pool2d", "quantized_max_pool2d_indices")
family = register_family(OpFamily(FAMILY, OPS, doc=__doc__))


@family.provides(Hook.WINDOW, "quantized_avg_pool2d", "quantized_max_pool2d")
def _window(node) -> Window:
    dilation = node_arg(node, "dilation", None) or [1, 1]
    return Window(int(node_arg(node, "kernel_size")[0]), int(node_arg(node, "stride")[0]), int(dilation[0]),
                  pads4(node_arg(node, "padding")), "padding", bool(node_arg(node, "ceil_mode")))


# ----------------------------------------------------------------------------- lowering

_aten = torch.ops.aten

annotates("shared", _aten.avg_pool2d.default, _aten.adaptive_avg_pool2d.default, _aten.max_pool2d.default,
          _aten.adaptive_max_pool2d.default)


def _same_qparams(m: Match) -> None:
    if m.inputs[0].qparams != m.output:
        raise LoweringError("pooling needs the same input and output quantization (CMSIS-NN pooling does "
                            "not requantize); CortenQuantizer shares them, another quantizer may not")


def _ints(v, n=2):
    v = list(v) if isinstance(v, (list, tuple)) else [v]
    return [int(x) for x in (v * n if len(v) == 1 else v)]


def _avg_call(m: Match, x, kernel, stride, padding, in_hw, ceil_mode=False, include_pad=False, divisor=0):
    """``quantized_avg_pool2d`` with the optional arguments normalised: ``ceil_mode`` only when it
    changes the output size, ``count_include_pad`` only when some window covers padding."""
    top, left, bottom, right = pads4(padding)
    h, w = in_hw
    if ceil_mode and all(pool_out_size(s, k, st, b, a, 1, True) == pool_out_size(s, k, st, b, a)
                         for s, k, st, b, a in ((h, kernel[0], stride[0], top, bottom),
                                                (w, kernel[1], stride[1], left, right))):
        ceil_mode = False
    if not (top or left or bottom or right or ceil_mode):
        include_pad = False
    if divisor and divisor < 1:
        raise LoweringError(f"avg_pool2d divisor_override={divisor} must be positive")
    lo, hi = m.activation_bounds
    extra = []
    if ceil_mode or include_pad or divisor:
        extra = [bool(ceil_mode), bool(include_pad), int(divisor or 0)]
    if include_pad or divisor:
        extra.append(m.inputs[0].qparams.zero_point)
    return m.call("quantized_avg_pool2d", x, kernel, stride, padding, lo, hi, *extra)


def _check_pool_padding(what: str, kernel, padding, dilation=(1, 1)):
    for k, p, d in zip(kernel, padding, dilation):
        if p > (d * (k - 1) + 1) // 2:
            raise LoweringError(f"{what}: padding {list(padding)} must be at most half the kernel {list(kernel)}")


@lowers(_aten.avg_pool2d.default, formats=(A8W8, A16W8))
def lower_avg_pool2d(m: Match):
    """``avg_pool2d(x, kernel, stride, padding, ceil_mode, count_include_pad, divisor_override)``:
    every combination (PyTorch's divisors, see the module docstring)."""
    _same_qparams(m)
    n = m.node
    kernel = _ints(n.args[1])
    stride = _ints(node_arg(n, "stride", None) or kernel)
    padding = _ints(node_arg(n, "padding", 0))
    _check_pool_padding("avg_pool2d", kernel, padding)
    h, w = (int(d) for d in n.args[0].meta["val"].shape[2:])
    return _avg_call(m, m.inputs[0].node, kernel, stride, padding, (h, w), bool(node_arg(n, "ceil_mode", False)),
                     bool(node_arg(n, "count_include_pad", True)), node_arg(n, "divisor_override", None) or 0)


def is_uniform(size: int, out: int) -> bool:
    """True when PyTorch's adaptive windows along a dim tile it with one kernel (= stride)."""
    return size % out == 0


def _uniform_windows(node) -> bool:
    """Whether an adaptive 2-D pool's windows are uniform (a strided pool: the one with an int16 kernel)."""
    val = node.args[0].meta.get("val") if isinstance(node.args[0], torch.fx.Node) else None
    if val is None or val.dim() != 4:
        return False
    h, w = (int(d) for d in val.shape[2:])
    oh, ow = _ints(node.args[1])
    return is_uniform(h, oh or h) and is_uniform(w, ow or w)


@lowers(_aten.adaptive_avg_pool2d.default, _aten.adaptive_max_pool2d.default, formats=(A8W8, A16W8),
        when={A16W8: _uniform_windows})
def lower_adaptive_pool2d(m: Match):
    """Adaptive pools: a strided pool when the windows are uniform (CMSIS-NN applies), else the
    adaptive op with PyTorch's windows."""
    _same_qparams(m)
    is_avg = m.node.target == _aten.adaptive_avg_pool2d.default
    _, _, h, w = (int(d) for d in m.node.args[0].meta["val"].shape)
    oh, ow = _ints(m.node.args[1])
    oh, ow = oh or h, ow or w  # None in output_size keeps the input size
    x = m.inputs[0].node
    lo, hi = m.activation_bounds
    if m.output.dtype == torch.int16 and not (is_uniform(h, oh) and is_uniform(w, ow)):
        raise LoweringError("an adaptive pool with non-uniform windows has no int16 kernel; keep it int8")
    if is_uniform(h, oh) and is_uniform(w, ow):
        kernel = [h // oh, w // ow]
        if is_avg:
            return _avg_call(m, x, kernel, kernel, [0, 0], (h, w))
        return m.call("quantized_max_pool2d", x, kernel, kernel, [0, 0], lo, hi)
    return m.call("quantized_adaptive_avg_pool2d" if is_avg else "quantized_adaptive_max_pool2d", x, [oh, ow], lo, hi)


@lowers(_aten.max_pool2d.default, formats=(A8W8, A16W8))
def lower_max_pool2d(m: Match):
    """``max_pool2d(x, kernel, stride, padding, dilation, ceil_mode)``: any dilation and ceil_mode."""
    _same_qparams(m)
    n = m.node
    kernel = _ints(n.args[1])
    stride = _ints(node_arg(n, "stride", None) or kernel)
    padding = _ints(node_arg(n, "padding", 0))
    dilation = _ints(node_arg(n, "dilation", 1))
    ceil_mode = bool(node_arg(n, "ceil_mode", False))
    _check_pool_padding("max_pool2d", kernel, padding)
    h, w = (int(d) for d in n.args[0].meta["val"].shape[2:])
    if ceil_mode and all(pool_out_size(s, k, st, p, p, d, True) == pool_out_size(s, k, st, p, p, d)
                         for s, k, st, p, d in zip((h, w), kernel, stride, padding, dilation)):
        ceil_mode = False
    lo, hi = m.activation_bounds
    extra = [dilation, ceil_mode] if (dilation != [1, 1] or ceil_mode) else []
    return m.call("quantized_max_pool2d", m.inputs[0].node, kernel, stride, padding, lo, hi, *extra)


annotates("shared", torch.ops.corten.max_pool2d_indices.default)  # int64 output: no qparams


@lowers(torch.ops.corten.max_pool2d_indices.default)
def lower_max_pool2d_indices(m: Match):
    """``max_pool2d(..., return_indices=True)[1]`` returned by the program -> ``quantized_max_pool2d_indices``
    (int32 indices of the int8 maxima: equal to torch's where the int8 values do not tie)."""
    n = m.node
    kernel, stride, padding, dilation = (_ints(v) for v in n.args[1:5])
    if any(u.op != "output" for u in n.users):
        raise LoweringError("max-pool indices feeding other ops are not supported: the int32 indices can only be "
                            "a program output (do index arithmetic in the caller)")
    _check_pool_padding("max_pool2d", kernel, padding)
    return m.call("quantized_max_pool2d_indices", m.inputs[0].node, kernel, stride, padding, dilation,
                  bool(n.args[5]))


# ----------------------------------------------------------------------------- 1-D pooling
# 1-D pools on ``[N, C, L]`` run as the 2-D pools on the ``[N, C, 1, L]`` view (see
# corten.ops._common.as_4d_view: consecutive 1-D ops share the 4-D tensor, no copies in between).

annotates("shared", _aten.max_pool1d.default, _aten.avg_pool1d.default, _aten.adaptive_avg_pool1d.default,
          _aten.adaptive_max_pool1d.default)


def _pool1d(m: Match, op_name: str, *args):
    in_shape = m.node.args[0].meta["val"].shape
    out_shape = m.node.meta["val"].shape
    if isinstance(m.node.meta["val"], (tuple, list)):
        out_shape = m.node.meta["val"][0].shape
    if len(in_shape) != 3:
        raise LoweringError(f"1-D pooling of a {len(in_shape)}-D input is not supported (batch it: [N, C, L])")
    x4 = as_4d_view(m, m.inputs[0].node, in_shape)
    y4 = m.call(op_name, x4, *args)
    return back_to_3d(m, y4, [out_shape[0], out_shape[1], 1, out_shape[2]])


def _window1d(n) -> tuple[int, int, int, bool]:
    """(kernel, stride, padding, ceil_mode) of an ``aten`` 1-D pool (stride defaults to the kernel)."""
    kernel = _ints(n.args[1], 1)[0]
    return (kernel, _ints(node_arg(n, "stride", None) or kernel, 1)[0], _ints(node_arg(n, "padding", 0), 1)[0],
            bool(node_arg(n, "ceil_mode", False)))


@lowers(_aten.max_pool1d.default)
def lower_max_pool1d(m: Match):
    """``aten.max_pool1d(x, kernel, stride, padding, dilation, ceil_mode)`` -> 2-D max pool on [N, C, 1, L]."""
    _same_qparams(m)
    n = m.node
    kernel, stride, padding, ceil_mode = _window1d(n)
    dilation = _ints(node_arg(n, "dilation", 1), 1)[0]
    _check_pool_padding("max_pool1d", [kernel], [padding], [dilation])
    lo, hi = m.activation_bounds
    extra = [[1, dilation], ceil_mode] if (dilation != 1 or ceil_mode) else []
    return _pool1d(m, "quantized_max_pool2d", [1, kernel], [1, stride], [0, padding], lo, hi, *extra)


@lowers(_aten.avg_pool1d.default)
def lower_avg_pool1d(m: Match):
    """``aten.avg_pool1d(x, kernel, stride, padding, ceil_mode, count_include_pad)`` -> 2-D average pool."""
    _same_qparams(m)
    n = m.node
    kernel, stride, padding, ceil_mode = _window1d(n)
    include_pad = bool(node_arg(n, "count_include_pad", True))
    _check_pool_padding("avg_pool1d", [kernel], [padding])
    in_shape = n.args[0].meta["val"].shape
    if len(in_shape) != 3:
        raise LoweringError(f"1-D pooling of a {len(in_shape)}-D input is not supported (batch it: [N, C, L])")
    x4 = as_4d_view(m, m.inputs[0].node, in_shape)
    y4 = _avg_call(m, x4, [1, kernel], [1, stride], [0, padding], (1, int(in_shape[2])), ceil_mode, include_pad)
    out_shape = n.meta["val"].shape
    return back_to_3d(m, y4, [out_shape[0], out_shape[1], 1, out_shape[2]])


@lowers(_aten.adaptive_avg_pool1d.default, _aten.adaptive_max_pool1d.default)
def lower_adaptive_pool1d(m: Match):
    """``adaptive_{avg,max}_pool1d(x, [out])``: uniform -> a strided 1-D pool, else the adaptive op."""
    _same_qparams(m)
    is_avg = m.node.target == _aten.adaptive_avg_pool1d.default
    length = int(m.node.args[0].meta["val"].shape[-1])
    out = _ints(m.node.args[1], 1)[0]
    lo, hi = m.activation_bounds
    if is_uniform(length, out):
        k = length // out
        return _pool1d(m, "quantized_avg_pool2d" if is_avg else "quantized_max_pool2d", [1, k], [1, k], [0, 0],
                       lo, hi)
    return _pool1d(m, "quantized_adaptive_avg_pool2d" if is_avg else "quantized_adaptive_max_pool2d", [1, out],
                   lo, hi)


# ----------------------------------------------------------------------------- scratch memory
def avgpool_scratch_bytes(isa: str, channels: int) -> int:
    """``arm_avgpool_s8_get_buffer_size``: one int32 sum per channel on DSP cores, none on plain
    (scalar loop) or MVE (sums kept in vector registers)."""
    if isa not in ("plain", "dsp", "mve"):
        raise ValueError(f"isa must be 'plain', 'dsp' or 'mve', got {isa!r}")
    return 4 * channels if isa == "dsp" else 0


def _avgpool_scratch(node, target) -> int:
    return avgpool_scratch_bytes(target.isa, int(node.args[0].meta["val"].shape[1]))


# ----------------------------------------------------------------------------- C emission
def cmsis_compatible(in_hw, kernel, stride, padding, ho, wo, ceil_mode, include_pad, divisor, dilation=(1, 1)) -> bool:
    """True when CMSIS-NN's pooling computes this op: symmetric padding, no dilation, floor-mode
    output size and (average) every divisor the count of input elements in its window."""
    top, left, bottom, right = pads4(padding)
    h, w = in_hw
    if (top, left) != (bottom, right) or list(dilation) != [1, 1]:
        return False
    if (pool_out_size(h, kernel[0], stride[0], top, bottom), pool_out_size(w, kernel[1], stride[1], left, right)) \
            != (ho, wo):
        return False
    if divisor or include_pad:
        want = avg_divisors(h, w, kernel, stride, padding, ho, wo, False, 0)
        got = avg_divisors(h, w, kernel, stride, padding, ho, wo, include_pad, divisor)
        return bool(torch.equal(want, got))
    return True


def _buffers(ctx) -> tuple[str, str, str]:
    """(input, output, "s8" | "s16") of a pool node."""
    return ctx.typed_input("input"), ctx.typed_out(), kernel_suffix(ctx.dtype("input"))


def _cmsis_supports(node, target) -> str | None:
    g = pool_window(NodeView(node, target))
    if cmsis_compatible((g["h"], g["w"]), g["kernel"], g["stride"], g["padding"], g["ho"], g["wo"], g["ceil_mode"],
                        g["include_pad"], g["divisor"], g["dilation"]):
        return None
    return ("a pooling variant arm_avgpool_s8 / arm_max_pool_s8 do not compute (ceil_mode, count_include_pad, "
            "divisor_override, dilation or asymmetric padding)")


@CMSIS_NN.kernel("quantized_avg_pool2d", supports=_cmsis_supports, scratch=_avgpool_scratch)
@CMSIS_NN.kernel("quantized_max_pool2d", supports=_cmsis_supports)
def _pool_cmsis(ctx) -> str:
    """``arm_avgpool_s8`` / ``arm_max_pool_s8`` (``_s16``; scratch from the plan) when
    :func:`cmsis_compatible`."""
    g = pool_window(ctx)
    x, out, suffix = _buffers(ctx)
    (kh, kw), (sh, sw) = g["kernel"], g["stride"]
    top, left, _, _ = pads4(g["padding"])
    buf, size = ctx.scratch()
    fn = f"arm_avgpool_{suffix}" if g["is_avg"] else f"arm_max_pool_{suffix}"
    return ctx.block(
        ctx.params("cmsis_nn_context", "nn_ctx", {"buf": buf, "size": size}),
        ctx.params("cmsis_nn_pool_params", "params", {"stride": {"w": sw, "h": sh}, "padding": {"w": left, "h": top},
                                                      "activation": {"min": g["act_min"], "max": g["act_max"]}}),
        ctx.dims("input_dims", "cmsis_nn_dims", g["n"], g["h"], g["w"], g["c"]),
        ctx.dims("filter_dims", "cmsis_nn_dims", 1, kh, kw, 1),
        ctx.dims("output_dims", "cmsis_nn_dims", g["n"], g["ho"], g["wo"], g["c"]),
        ctx.call(fn, "&nn_ctx", "&params", "&input_dims", x, "&filter_dims", "&output_dims", out))


@PORTABLE.kernel("quantized_avg_pool2d", "quantized_max_pool2d")
def _pool_portable(ctx) -> str:
    """``corten_{avg,max}_pool2d_s8`` (``_s16``): every variant."""
    g = pool_window(ctx)
    x, out, suffix = _buffers(ctx)
    (kh, kw), (sh, sw) = g["kernel"], g["stride"]
    top, left, bottom, right = pads4(g["padding"])
    fn = f"corten_avg_pool2d_{suffix}" if g["is_avg"] else f"corten_max_pool2d_{suffix}"
    zp = int(optional_arg(ctx, "zero_point", 0)) if g["is_avg"] else 0
    fields = dict(kernel_h=kh, kernel_w=kw, stride_h=sh, stride_w=sw, pad_h=top, pad_w=left,
                  activation_min=g["act_min"], activation_max=g["act_max"], pad_bottom=bottom, pad_right=right,
                  dilation_h=g["dilation"][0], dilation_w=g["dilation"][1], count_include_pad=int(g["include_pad"]),
                  divisor_override=g["divisor"], zero_point=zp)
    return ctx.block(
        ctx.params("corten_pool_params", "params", {k: int(v) for k, v in fields.items()}),
        ctx.dims("input_dims", "corten_dims", g["n"], g["h"], g["w"], g["c"]),
        ctx.dims("output_dims", "corten_dims", g["n"], g["ho"], g["wo"], g["c"]),
        ctx.call(fn, "&params", "&input_dims", x, "&output_dims", out))


CMSIS_NN.declines("quantized_max_pool2d_indices", reason="CMSIS-NN has no max pool returning indices")


@PORTABLE.kernel("quantized_max_pool2d_indices")
def _max_pool_indices_portable(ctx) -> str:
    """``corten_max_pool2d_indices_s8``: the max pool's window walk, writing int32 ``iy * W + ix``."""
    x = ctx.arg("input")
    n, c, h, w = ctx.shape(x)
    (kh, kw), (sh, sw) = ctx.arg("kernel_size"), ctx.arg("stride")
    top, left, bottom, right = pads4(ctx.arg("padding"))
    dh, dw = ctx.arg("dilation")
    ho, wo = ctx.shape(ctx.node)[2:]
    fields = dict(kernel_h=kh, kernel_w=kw, stride_h=sh, stride_w=sw, pad_h=top, pad_w=left, activation_min=-128,
                  activation_max=127, pad_bottom=bottom, pad_right=right, dilation_h=dh, dilation_w=dw,
                  count_include_pad=0, divisor_override=0, zero_point=0)
    return ctx.block(
        ctx.params("corten_pool_params", "params", {k: int(v) for k, v in fields.items()}),
        ctx.dims("input_dims", "corten_dims", n, h, w, c),
        ctx.dims("output_dims", "corten_dims", n, ho, wo, c),
        ctx.call("corten_max_pool2d_indices_s8", "&params", "&input_dims", ctx.input("input"), "&output_dims",
                 ctx.out()))


CMSIS_NN.declines("quantized_adaptive_avg_pool2d", "quantized_adaptive_max_pool2d",
                  reason="CMSIS-NN has no adaptive pooling with non-uniform windows")


@PORTABLE.kernel("quantized_adaptive_avg_pool2d", "quantized_adaptive_max_pool2d")
def _adaptive_pool_portable(ctx) -> str:
    """``corten_adaptive_{avg,max}_pool2d_s8`` (CMSIS-NN has no adaptive pool; uniform ones were
    lowered to the strided pools)."""
    is_avg = ctx.op_name == "quantized_adaptive_avg_pool2d"
    n, h, w, c = ctx.nhwc(ctx.arg("input"))
    _, ho, wo, _ = ctx.nhwc()
    act_min, act_max = int(ctx.arg("activation_min")), int(ctx.arg("activation_max"))
    fn = "corten_adaptive_avg_pool2d_s8" if is_avg else "corten_adaptive_max_pool2d_s8"
    return ctx.block(
        ctx.dims("input_dims", "corten_dims", n, h, w, c),
        ctx.dims("output_dims", "corten_dims", n, ho, wo, c),
        ctx.call(fn, act_min, act_max, "&input_dims", ctx.input("input"), "&output_dims", ctx.out()))
