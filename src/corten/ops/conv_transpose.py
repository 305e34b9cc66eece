"""Transposed convolution: ``quantized_conv_transpose2d`` (``arm_transpose_conv_s8``).

Layout: activations NHWC in memory (logical NCHW, ``channels_last`` in the torch graph); weights
OHWI ``[C_out, kH, kW, C_in]`` (PyTorch's ``[C_in, C_out, kH, kW]`` permuted, not flipped).

Arithmetic (scatter form, as CMSIS-NN and PyTorch define it): input pixel ``(iy, ix)`` adds
``(x + input_offset) * w[o, ky, kx, c]`` to the full-resolution position
``(iy*stride_h + ky*dilation_h, ix*stride_w + kx*dilation_w)``; the output is that full-resolution
image cropped by ``padding`` on each side (and extended by ``output_padding`` rows/columns at the
bottom/right that receive no products)::

    H_out = (H - 1) * stride_h - 2 * padding_h + dilation_h * (kH - 1) + output_padding_h + 1

then ``requantize(bias[o] + acc, multiplier[o], shift[o]) + output_offset`` clamped to
``[activation_min, activation_max]``, all in int32 with wrap-around, like ``quantized_conv2d``.
Equivalently (gather form, what the portable C kernel computes) output ``(oy, ox)`` reads input
``iy = (oy + padding_h - ky*dilation_h) / stride_h`` for the taps where that division is exact and
``0 <= iy < H``.
"""
from __future__ import annotations

import torch

from corten.errors import LoweringError
from corten.fixed_point import MAX_ACCUMULATOR_TAPS
from corten.fx_nodes import node_arg
from corten.ops import checks
from corten.ops._common import (as_4d_view, back_to_3d, check_conv_common, cmsis_conv_structs, conv_op,
                                per_channel_const, portable_conv_block)
from corten.ops._qparams import per_channel_multipliers
from corten.ops._rules import Match
from corten.ops.registry import Cost, Hook, OpFamily, annotates, lowers, node_shape, register_family, weighted_cost
from corten.providers import CMSIS_NN, PORTABLE

FAMILY = "conv_transpose"
OP = "quantized_conv_transpose2d"


def transpose_out_size(size: int, k: int, stride: int, padding: int, output_padding: int, dilation: int) -> int:
    """PyTorch's ``conv_transpose2d`` output size along one dimension."""
    return (size - 1) * stride - 2 * padding + dilation * (k - 1) + output_padding + 1


def _check(input, weight, bias, stride, padding, output_padding, dilation, input_offset, output_offset,
           output_multiplier, output_shift, activation_min, activation_max) -> tuple[int, int]:
    check_conv_common(OP, input, weight, bias, stride, padding, dilation, input_offset, output_offset,
                      output_multiplier, output_shift, activation_min, activation_max, weight.shape[0])
    oph, opw = checks.pair(OP, "output_padding", output_padding, 0)
    if oph >= max(stride[0], dilation[0]) or opw >= max(stride[1], dilation[1]):
        checks.fail(OP, "output_padding", f"{list(output_padding)} must be smaller than stride or dilation")
    if weight.shape[3] != input.shape[1]:
        checks.fail(OP, "weight", f"OHWI weight has C_in={weight.shape[3]} but input has {input.shape[1]} channels")
    kh, kw = int(weight.shape[1]), int(weight.shape[2])
    if kh * kw * int(weight.shape[3]) > MAX_ACCUMULATOR_TAPS:
        checks.fail(OP, "weight", f"{kh}x{kw}x{int(weight.shape[3])} products per output may overflow int32 sums")
    ho = transpose_out_size(input.shape[2], kh, stride[0], padding[0], oph, dilation[0])
    wo = transpose_out_size(input.shape[3], kw, stride[1], padding[1], opw, dilation[1])
    if ho < 1 or wo < 1:
        checks.fail(OP, "padding", f"padding {list(padding)} leaves an empty {ho}x{wo} output")
    return ho, wo


def conv_transpose2d_accumulators(input, weight, stride, padding, output_padding, dilation, input_offset):
    """int32 accumulators (held in int64), NHWC ``[N, H_out, W_out, C_out]``, without bias.

    Scatter form, one filter tap at a time: a tap's contribution is the matrix product of the
    ``[N*H*W, C_in]`` offset input with the tap's ``[C_in, C_out]`` weights in float64, exact because
    every partial sum is an integer below ``C_in * 2**15 < 2**53``; taps are then summed in int64.
    """
    n, c_in, h, w = input.shape
    c_out, kh, kw, _ = weight.shape
    (sh, sw), (ph, pw), (dh, dw) = stride, padding, dilation
    ho = transpose_out_size(h, kh, sh, ph, output_padding[0], dh)
    wo = transpose_out_size(w, kw, sw, pw, output_padding[1], dw)
    full_h = max((h - 1) * sh + dh * (kh - 1) + 1, ph + ho)
    full_w = max((w - 1) * sw + dw * (kw - 1) + 1, pw + wo)
    x = (input.permute(0, 2, 3, 1).to(torch.float64) + input_offset).reshape(n * h * w, c_in)
    wt = weight.to(torch.float64)
    full = torch.zeros((n, full_h, full_w, c_out), dtype=torch.int64)
    for ky in range(kh):
        for kx in range(kw):
            part = (x @ wt[:, ky, kx, :].T).to(torch.int64).reshape(n, h, w, c_out)
            r0, c0 = ky * dh, kx * dw
            full[:, r0:r0 + (h - 1) * sh + 1:sh, c0:c0 + (w - 1) * sw + 1:sw, :] += part
    return full[:, ph:ph + ho, pw:pw + wo, :]


quantized_conv_transpose2d = conv_op(
    OP, "SymInt[] stride, SymInt[] padding, SymInt[] output_padding, SymInt[] dilation", _check,
    conv_transpose2d_accumulators, channel_axis=0)


family = register_family(OpFamily(FAMILY, (OP,), doc=__doc__))


@family.provides(Hook.ACCUMULATOR_TAPS)
def _taps(node) -> int:
    """At most kH * kW * C_in products per output (OHWI weight)."""
    _, kh, kw, c_in = node_shape(node_arg(node, "weight"))
    return kh * kw * c_in


@family.provides(Hook.COST)
def _cost(node) -> Cost:
    """Every input value times every weight of its output channel: numel(input) * C_out * kH * kW."""
    c_out, kh, kw, _ = node_shape(node_arg(node, "weight"))
    n_in = 1
    for d in node_shape(node_arg(node, "input")):
        n_in *= d
    return Cost(n_in * c_out * kh * kw, weighted_cost(node, 0).weight_bytes)


# ----------------------------------------------------------------------------- lowering

_aten = torch.ops.aten

# PyTorch's transposed weights are [C_in, C_out / groups, kH, kW]: output channels on axis 1.
annotates("weighted", _aten.conv_transpose2d.input, _aten.conv_transpose1d.default, weight_axis=1)


def _transpose_args(node) -> dict:
    """``aten.conv_transpose2d.input(input, weight, bias, stride, padding, output_padding, groups,
    dilation)`` with defaults."""
    names = ("input", "weight", "bias", "stride", "padding", "output_padding", "groups", "dilation")
    defaults = (None, None, None, [1, 1], [0, 0], [0, 0], 1, [1, 1])
    vals = list(node.args) + [node.kwargs.get(k, d) for k, d in zip(names[len(node.args):],
                                                                    defaults[len(node.args):])]
    return dict(zip(names, vals))


def _pair(v) -> list[int]:
    v = list(v) if isinstance(v, (list, tuple)) else [v]
    return [int(v[0]), int(v[-1])]


@lowers(_aten.conv_transpose2d.input)
def lower_conv_transpose2d(m: Match):
    """``aten.conv_transpose2d`` with groups 1 -> ``quantized_conv_transpose2d`` (OHWI weights)."""
    a = _transpose_args(m.node)
    weight, w_scales = _transpose_weight(m, a)
    return _lower_transpose(m, m.inputs[0].node, weight, w_scales, a, _pair(a["stride"]), _pair(a["padding"]),
                            _pair(a["output_padding"]), _pair(a["dilation"]))


@lowers(_aten.conv_transpose1d.default)
def lower_conv_transpose1d(m: Match):
    """``aten.conv_transpose1d`` on ``[N, C, L]`` -> the 2-D op on the ``[N, C, 1, L]`` view (weights
    ``[C_in, C_out, K]`` as ``[C_in, C_out, 1, K]``), as :func:`corten.ops.conv.lower_conv1d` does."""
    a = _transpose_args(m.node)
    weight, w_scales = _transpose_weight(m, a)
    in_shape, out_shape = m.node.args[0].meta["val"].shape, m.node.meta["val"].shape
    if len(in_shape) != 3:
        raise LoweringError(f"conv_transpose1d of a {len(in_shape)}-D input is not supported (batch it: [N, C, L])")
    one = lambda v, d: [d, _pair(v)[0]]  # noqa: E731  (k or [k] -> [d, k])
    x4 = as_4d_view(m, m.inputs[0].node, in_shape)
    y4 = _lower_transpose(m, x4, weight.unsqueeze(2), w_scales, a, one(a["stride"], 1), one(a["padding"], 0),
                          one(a["output_padding"], 0), one(a["dilation"], 1))
    return back_to_3d(m, y4, [out_shape[0], out_shape[1], 1, out_shape[2]])


def _transpose_weight(m: Match, a: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """The int8 ``[C_in, C_out, ...]`` weights and their per-output-channel scales."""
    what = m.node.target.__name__.split(".")[0]
    if int(a["groups"]) != 1:
        raise LoweringError(f"{what} with groups={a['groups']} is not supported (groups must be 1)")
    weight, w_scales, axis = m.quantized_constant(a["weight"])
    if axis not in (None, 1):
        raise LoweringError(f"{what} weights quantized along axis {axis}; expected per-output-channel "
                            "(axis 1 of [C_in, C_out, ...])")
    return weight, w_scales


def _lower_transpose(m: Match, x_node, weight, w_scales, a: dict, stride, padding, output_padding, dilation):
    """``quantized_conv_transpose2d`` of the 4-D int8 ``x_node`` with ``[C_in, C_out, kH, kW]`` weights."""
    x = m.inputs[0]
    c_out = int(weight.shape[1])
    bias = m.bias_int32(a["bias"], x.qparams.scale, w_scales)
    mult, shift = per_channel_multipliers(x.qparams.scale, w_scales, m.output.scale)
    if mult.numel() == 1 and c_out > 1:
        mult, shift = mult.expand(c_out).clone(), shift.expand(c_out).clone()
    act_min, act_max = m.activation_bounds
    w = m.add_constant(weight.permute(1, 2, 3, 0).contiguous().to(torch.int8), "weight")  # OHWI
    bias_node = m.add_constant(bias, "bias") if bias is not None else None
    return m.call(OP, x_node, w, bias_node, stride, padding, output_padding, dilation, x.qparams.offset,
                  m.output.zero_point, m.add_constant(mult, "multiplier"), m.add_constant(shift, "shift"), act_min,
                  act_max)


# ----------------------------------------------------------------------------- CMSIS-NN
def cmsis_semantics_match(kernel_hw, stride, padding, output_padding, dilation) -> bool:
    """True when ``arm_transpose_conv_s8`` computes this op: it ignores dilation, and it writes only
    output rows/columns inside the full-resolution image (so ``output_padding`` beyond the crop, or
    a kernel smaller than the stride, would leave bytes unwritten)."""
    return (tuple(dilation) == (1, 1) and all(op <= p for op, p in zip(output_padding, padding))
            and all(k >= s for k, s in zip(kernel_hw, stride)))


def transpose_conv_scratch_bytes(input_nhwc, kernel_hw, stride, c_out: int) -> int:
    """The int32 rolling buffer ``arm_transpose_conv_s8`` keeps: ``max(kH, stride_h)`` rows of
    ``((W - 1) * stride_w + max(kW, stride_w)) * C_out`` accumulators.  (CMSIS-NN's
    ``arm_transpose_conv_s8_get_buffer_size`` writes ``max(kW, stride_h)``; the larger is taken.)"""
    _, _, w, _ = input_nhwc
    kh, kw = kernel_hw
    sh, sw = stride
    row = ((w - 1) * sw + max(kw, sw, sh)) * c_out
    return 4 * max(kh, sh) * row


def _window(node):
    weight = node.args[1]
    c_out, kh, kw, _ = (int(d) for d in weight.meta["val"].shape)
    stride, padding, output_padding, dilation = node.args[3:7]
    return c_out, (kh, kw), stride, padding, output_padding, dilation


def _cmsis_supports(node, target) -> str | None:
    _, kernel_hw, stride, padding, output_padding, dilation = _window(node)
    if cmsis_semantics_match(kernel_hw, stride, padding, output_padding, dilation):
        return None
    return "arm_transpose_conv_s8 ignores dilation and needs output_padding <= padding and kernel >= stride"


def _cmsis_scratch(node, target) -> int:
    c_out, kernel_hw, stride = _window(node)[:3]
    n, c, h, w = (int(d) for d in node.args[0].meta["val"].shape)
    return transpose_conv_scratch_bytes((n, h, w, c), kernel_hw, stride, c_out)


# ----------------------------------------------------------------------------- C emission
def _geometry(ctx) -> dict:
    n, h, w, c_in = ctx.nhwc(ctx.arg("input"))
    _, ho, wo, c_out = ctx.nhwc()
    weight = ctx.tensor("weight")
    (sh, sw), (ph, pw) = ctx.arg("stride"), ctx.arg("padding")
    (oph, opw), (dh, dw) = ctx.arg("output_padding"), ctx.arg("dilation")
    return dict(n=n, h=h, w=w, c_in=c_in, ho=ho, wo=wo, c_out=c_out, kh=int(weight.shape[1]), kw=int(weight.shape[2]),
                sh=sh, sw=sw, ph=ph, pw=pw, oph=oph, opw=opw, dh=dh, dw=dw,
                in_off=int(ctx.arg("input_offset")), out_off=int(ctx.arg("output_offset")),
                act_min=int(ctx.arg("activation_min")), act_max=int(ctx.arg("activation_max")),
                x=ctx.input("input"), out=ctx.out(), wname=ctx.const("weight"))


@PORTABLE.kernel(OP)
def _emit_portable(ctx) -> str:
    """One ``corten_conv_transpose2d_s8`` call."""
    g = _geometry(ctx)
    params = ctx.params("corten_conv_transpose_params", "params", dict(
        stride_h=g["sh"], stride_w=g["sw"], pad_h=g["ph"], pad_w=g["pw"], output_pad_h=g["oph"],
        output_pad_w=g["opw"], dilation_h=g["dh"], dilation_w=g["dw"], input_offset=g["in_off"],
        output_offset=g["out_off"], activation_min=g["act_min"], activation_max=g["act_max"]))
    return portable_conv_block(ctx, "corten_conv_transpose2d_s8", params, g, (g["c_out"], g["kh"], g["kw"], g["c_in"]))


@CMSIS_NN.kernel(OP, act=(torch.int8,), supports=_cmsis_supports, scratch=_cmsis_scratch)
def _emit_cmsis(ctx) -> str:
    """One ``arm_transpose_conv_s8`` call (when :func:`cmsis_semantics_match`)."""
    g = _geometry(ctx)
    c_out = g["c_out"]
    mults, shifts = per_channel_const(ctx, "output_multiplier", c_out), per_channel_const(ctx, "output_shift", c_out)
    buf, size = ctx.scratch()
    # padding_offsets is not read by arm_transpose_conv_s8 (symmetric PyTorch padding); the second
    # context (reverse-conv weights) is only used by arm_transpose_conv_wrapper_s8.
    return ctx.block(
        ctx.params("cmsis_nn_context", "nn_ctx", dict(buf=buf, size=size)),
        ctx.params("cmsis_nn_context", "out_ctx", dict(buf="NULL", size=0)),
        ctx.params("cmsis_nn_transpose_conv_params", "params", dict(
            input_offset=g["in_off"], output_offset=g["out_off"], stride=dict(w=g["sw"], h=g["sh"]),
            padding=dict(w=g["pw"], h=g["ph"]), padding_offsets=dict(w=0, h=0), dilation=dict(w=1, h=1),
            activation=dict(min=g["act_min"], max=g["act_max"]))),
        *cmsis_conv_structs(ctx, g, mults, shifts, (c_out, g["kh"], g["kw"], g["c_in"])),
        ctx.call("arm_transpose_conv_s8", "&nn_ctx", "&out_ctx", "&params", "&quant", "&input_dims", g["x"],
                 "&filter_dims", g["wname"], "&bias_dims", ctx.const("bias"), "&output_dims", g["out"]))
