"""Convolutions: ``quantized_conv2d`` and ``quantized_depthwise_conv2d``.

Layouts (the C side's, which are CMSIS-NN's):

* activations are NHWC in memory.  In the torch graph they keep PyTorch's logical NCHW shape and
  the reference kernels return them in ``torch.channels_last`` memory format, so the bytes of a
  graph tensor are exactly the bytes of the C buffer;
* ``quantized_conv2d`` weights are OHWI ``[C_out, kH, kW, C_in]`` (``arm_convolve_s8``);
* ``quantized_depthwise_conv2d`` weights are ``[1, kH, kW, C_out]`` with
  ``C_out = C_in * depth_multiplier`` and output channel ``c * depth_multiplier + m`` reading input
  channel ``c`` (``arm_depthwise_conv_s8``).

Arithmetic (CMSIS-NN / TFLite int8): ``acc = bias[o] + sum((x + input_offset) * w)`` in int32,
padding contributing 0 (CMSIS-NN pads im2col with ``-input_offset``), then
``requantize(acc, multiplier[o], shift[o]) + output_offset`` clamped to
``[activation_min, activation_max]``.  ``input_offset`` is the negated input zero point.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from corten.errors import LoweringError
from corten.fixed_point import MAX_ACCUMULATOR_TAPS
from corten.fx_nodes import node_arg
from corten.ops import checks
from corten.ops._common import (
    cmsis_conv_structs,
    per_channel_const,
    portable_conv_block,
    as_4d_view,
    back_to_3d,
    check_conv_common,
    conv_op,
    pads4,
)
from corten.ops._qparams import per_channel_multipliers
from corten.ops._rules import Match
from corten.ops.registry import (A8W4, A8W8, A16W8, Cost, Hook, OpFamily, Window, annotates, lowers, node_shape,
                                 op_name_of, register_family, weighted_cost)
from corten.providers import CMSIS_NN, PORTABLE, NodeView, kernel_suffix, weight_dtype
from corten.providers.cmsis_nn import (  # noqa: F401  (re-exported: the formulas moved to the provider)
    conv2d_kernel_variant,
    conv2d_s4_scratch_bytes,
    conv2d_s16_scratch_bytes,
    conv2d_scratch_bytes,
    depthwise_kernel_variant,
    depthwise_s4_scratch_bytes,
    depthwise_s16_scratch_bytes,
    depthwise_scratch_bytes,
    im2col_bytes,
)

FAMILY = "conv"
# The window arguments of the three ops' schemas (:data:`corten.ops._common.CONV_SCHEMA`); the
# depthwise op adds ``depth_multiplier``, the grouped one ``groups``.
WINDOW = "SymInt[] stride, SymInt[] padding, SymInt[] dilation"


# ----------------------------------------------------------------------------- shared checks
def _out_hw(op, input, kh, kw, stride, padding, dilation):
    """Output height and width; ``padding`` is ``[pad_h, pad_w]`` or ``[top, left, bottom, right]``
    (the kernels take the leading padding; the trailing one only shapes the output)."""
    h, w = int(input.shape[2]), int(input.shape[3])
    top, left, bottom, right = pads4(padding)
    # checks.out_size pads both sides by ``pad``: the sum top + bottom over an input grown by the odd row
    return (checks.out_size(op, h + (top + bottom) % 2, kh, stride[0], (top + bottom) // 2, dilation[0]),
            checks.out_size(op, w + (left + right) % 2, kw, stride[1], (left + right) // 2, dilation[1]))


# ----------------------------------------------------------------------------- shared arithmetic
def _offset_padded_nhwc(input: torch.Tensor, input_offset: int, padding, dtype) -> torch.Tensor:
    """NHWC view of ``input + input_offset`` with zero padding (zero = the real value 0)."""
    x = input.permute(0, 2, 3, 1).to(dtype) + input_offset
    top, left, bottom, right = pads4(padding)
    if top or left or bottom or right:
        x = F.pad(x, (0, 0, left, right, top, bottom))
    return x.contiguous()


def _windows(x: torch.Tensor, kh, kw, ho, wo, stride, dilation) -> torch.Tensor:
    """``[N, Ho, Wo, kH, kW, C]`` strided view of the sliding windows of an NHWC tensor."""
    n, _, _, c = x.shape
    sn, sh, sw, sc = x.stride()
    return x.as_strided((n, ho, wo, kh, kw, c),
                        (sn, sh * stride[0], sw * stride[1], sh * dilation[0], sw * dilation[1], sc))


# ----------------------------------------------------------------------------- conv2d
def conv2d_accumulators(input, weight, stride, padding, dilation, input_offset) -> torch.Tensor:
    """int32 accumulators (held in int64), NHWC, without bias.

    Exactness: every product is ``(x + input_offset) * w`` with ``|x + input_offset| <= 255`` and
    ``|w| <= 128``, so ``|product| <= 32640 < 2**15``; a sum of ``K = kH*kW*C_in`` such integers is
    below ``K * 2**15``, under 2**53 for any ``K < 2**38``.  Every partial sum of the float64
    matrix product is therefore an integer that float64 represents exactly, whatever order BLAS
    adds them in, and the result converts to int64 without rounding.
    """
    c_out, kh, kw, c_in = weight.shape
    ho, wo = _out_hw("quantized_conv2d", input, kh, kw, stride, padding, dilation)
    x = _offset_padded_nhwc(input, input_offset, padding, torch.float64)
    n = x.shape[0]
    if kh == kw == 1 and tuple(stride) == (1, 1):
        cols = x.reshape(n * ho * wo, c_in)
    else:
        cols = _windows(x, kh, kw, ho, wo, stride, dilation).reshape(n * ho * wo, kh * kw * c_in)
    acc = cols @ weight.reshape(c_out, kh * kw * c_in).to(torch.float64).T
    return acc.to(torch.int64).reshape(n, ho, wo, c_out)


def _check_conv2d(input, weight, bias, stride, padding, dilation, input_offset, output_offset,
                  output_multiplier, output_shift, activation_min, activation_max):
    op = "quantized_conv2d"
    check_conv_common(op, input, weight, bias, stride, padding, dilation, input_offset, output_offset,
                      output_multiplier, output_shift, activation_min, activation_max, weight.shape[0],
                      asymmetric=True, s16=True)
    if weight.shape[3] != input.shape[1]:
        checks.fail(op, "weight", f"OHWI weight has C_in={weight.shape[3]} but input has {input.shape[1]} channels")
    return _out_hw(op, input, weight.shape[1], weight.shape[2], stride, padding, dilation)


quantized_conv2d = conv_op("quantized_conv2d", WINDOW, _check_conv2d, conv2d_accumulators, channel_axis=0,
                           weights=(torch.int8, torch.int4))


# ----------------------------------------------------------------------------- depthwise
def depthwise_accumulators(input, weight, stride, padding, dilation, depth_multiplier, input_offset):
    """int32 accumulators (held in int64), NHWC, without bias.

    Summed in int32 tap by tap: ``|product| <= 32640`` and there are ``kH*kW`` taps, so no partial
    sum overflows int32 for kernels of fewer than 65,793 taps (checked).
    """
    _, kh, kw, c_out = weight.shape
    if kh * kw > MAX_ACCUMULATOR_TAPS:
        checks.fail("quantized_depthwise_conv2d", "weight", f"kernel of {kh}x{kw} taps overflows int32 sums")
    ho, wo = _out_hw("quantized_depthwise_conv2d", input, kh, kw, stride, padding, dilation)
    # (16x8: |product| <= 2**22, summed in int64)
    acc_dtype = torch.int64 if input.dtype == torch.int16 else torch.int32
    x = _offset_padded_nhwc(input, input_offset, padding, acc_dtype)
    if depth_multiplier > 1:
        x = x.repeat_interleave(depth_multiplier, dim=3)
    w = weight.to(acc_dtype)
    acc = torch.zeros((x.shape[0], ho, wo, c_out), dtype=acc_dtype)
    for i in range(kh):
        for j in range(kw):
            r0, c0 = i * dilation[0], j * dilation[1]
            tap = x[:, r0:r0 + stride[0] * (ho - 1) + 1:stride[0], c0:c0 + stride[1] * (wo - 1) + 1:stride[1], :]
            acc += tap * w[0, i, j]
    return acc.to(torch.int64)


def _check_depthwise(input, weight, bias, stride, padding, dilation, depth_multiplier, input_offset,
                     output_offset, output_multiplier, output_shift, activation_min, activation_max):
    op = "quantized_depthwise_conv2d"
    check_conv_common(op, input, weight, bias, stride, padding, dilation, input_offset, output_offset,
                      output_multiplier, output_shift, activation_min, activation_max, weight.shape[3],
                      asymmetric=True, s16=True)
    if depth_multiplier < 1:
        checks.fail(op, "depth_multiplier", f"must be >= 1, got {depth_multiplier}")
    if weight.shape[0] != 1:
        checks.fail(op, "weight", f"expected [1, kH, kW, C_out] weights, got shape {tuple(weight.shape)}")
    if weight.shape[3] != input.shape[1] * depth_multiplier:
        checks.fail(op, "weight", f"C_out={weight.shape[3]} != C_in {input.shape[1]} x depth_multiplier {depth_multiplier}")
    return _out_hw(op, input, weight.shape[1], weight.shape[2], stride, padding, dilation)


quantized_depthwise_conv2d = conv_op("quantized_depthwise_conv2d", WINDOW + ", SymInt depth_multiplier",
                                     _check_depthwise, depthwise_accumulators, channel_axis=3,
                                     weights=(torch.int8, torch.int4))


# ----------------------------------------------------------------------------- grouped conv2d
def grouped_conv2d_accumulators(input, weight, stride, padding, dilation, groups, input_offset) -> torch.Tensor:
    """int32 accumulators (held in int64), NHWC, without bias, of a grouped convolution.

    Group ``g`` convolves input channels ``[g*CK, (g+1)*CK)`` with output channels
    ``[g*M, (g+1)*M)`` (weights OHWI ``[C_out, kH, kW, CK]``, ``M = C_out / groups``): each group is
    an ordinary convolution, exact for the reason :func:`conv2d_accumulators` gives.
    """
    ck, m = weight.shape[3], weight.shape[0] // groups
    parts = [conv2d_accumulators(input[:, g * ck:(g + 1) * ck], weight[g * m:(g + 1) * m], stride, padding,
                                 dilation, input_offset) for g in range(groups)]
    return torch.cat(parts, dim=3)


def _check_grouped(input, weight, bias, stride, padding, dilation, groups, input_offset, output_offset,
                   output_multiplier, output_shift, activation_min, activation_max):
    op = "quantized_grouped_conv2d"
    check_conv_common(op, input, weight, bias, stride, padding, dilation, input_offset, output_offset,
                      output_multiplier, output_shift, activation_min, activation_max, weight.shape[0])
    if groups < 1:
        checks.fail(op, "groups", f"must be >= 1, got {groups}")
    if weight.shape[0] % groups:
        checks.fail(op, "weight", f"C_out={weight.shape[0]} is not a multiple of groups={groups}")
    if weight.shape[3] * groups != input.shape[1]:
        checks.fail(op, "weight", f"OHWI weight has {weight.shape[3]} channels per group; x groups={groups} "
                                  f"!= the input's {input.shape[1]} channels")
    return _out_hw(op, input, weight.shape[1], weight.shape[2], stride, padding, dilation)


# Grouped convolution: ``arm_convolve_s8`` with filter C = C_in / groups.
quantized_grouped_conv2d = conv_op("quantized_grouped_conv2d", WINDOW + ", SymInt groups", _check_grouped,
                                   grouped_conv2d_accumulators, channel_axis=0)


family = register_family(OpFamily(
    FAMILY, ("quantized_conv2d", "quantized_depthwise_conv2d", "quantized_grouped_conv2d"), doc=__doc__))


# ----------------------------------------------------------------------------- metadata
@family.provides(Hook.ACCUMULATOR_TAPS)
def _taps(node) -> int:
    """OHWI weight (grouped: I = C_in / groups): kH * kW * I products; depthwise ``[1, kH, kW, C]``: kH * kW."""
    _, kh, kw, c = node_shape(node_arg(node, "weight"))
    return kh * kw * (1 if op_name_of(node.target) == "quantized_depthwise_conv2d" else c)


@family.provides(Hook.COST)
def _cost(node) -> Cost:
    return weighted_cost(node, _taps(node))


@family.provides(Hook.WINDOW, "quantized_conv2d", "quantized_depthwise_conv2d")  # (the kernels take band pads)
def _window(node) -> Window:
    return Window(node_shape(node_arg(node, "weight"))[1], int(node_arg(node, "stride")[0]),
                  int(node_arg(node, "dilation")[0]), pads4(node_arg(node, "padding")), "padding")


# ----------------------------------------------------------------------------- lowering

def _int4_capable(node) -> bool:
    """Convolutions of 1 group or of C_in groups (depthwise) have int4 kernels; grouped ones not."""
    groups = int(node_arg(node, "groups", 1))
    x = node.args[0]
    val = x.meta.get("val") if isinstance(x, torch.fx.Node) else None
    return groups == 1 or (val is not None and val.dim() >= 2 and groups == int(val.shape[1]))


def _s16_capable(node) -> bool:
    """The 16x8 kernels are those of 1 group and of C_in groups (depthwise), and pad symmetrically: a
    grouped convolution or an asymmetric ``padding="same"`` (an even kernel) keeps the conv int8."""
    if not _int4_capable(node):
        return False
    padding = node_arg(node, "padding")
    if not isinstance(padding, str):
        return True
    w = node.args[1]
    val = w.meta.get("val") if isinstance(w, torch.fx.Node) else None
    if val is None:
        return False
    return len(explicit_padding(padding, tuple(val.shape[2:]), _pair(node_arg(node, "dilation")))) == 2


annotates("weighted", torch.ops.aten.conv2d.default, torch.ops.aten.conv2d.padding, torch.ops.aten.conv1d.default,
          torch.ops.aten.conv1d.padding)


def _conv_args(node):
    """``aten.conv2d(input, weight, bias, stride, padding, dilation, groups)`` with the schema's defaults."""
    return {n: node_arg(node, n) for n in ("input", "weight", "bias", "stride", "padding", "dilation", "groups")}


def _pair(v):
    v = list(v) if isinstance(v, (list, tuple)) else [v]
    return [int(v[0]), int(v[-1])]


def explicit_padding(padding: str, kernel_hw, dilation) -> list[int]:
    """``padding="valid"|"same"`` as explicit padding (PyTorch allows "same" at stride 1 only):
    ``[pad_h, pad_w]`` when both sides get the same, else ``[top, left, bottom, right]`` - an odd
    total ``dilation * (k - 1)`` puts the extra row/column after the data, as PyTorch does."""
    if padding == "valid":
        return [0, 0]
    if padding != "same":
        raise LoweringError(f"padding {padding!r} is not supported")
    before, after = [], []
    for k, d in zip(kernel_hw, dilation):
        total = d * (k - 1)
        before.append(total // 2)
        after.append(total - total // 2)
    return before if before == after else before + after


def _same_pad(m: Match, x_node, padding: list[int]):
    """``(input node, conv padding)``: asymmetric ``[top, left, bottom, right]`` padding becomes an
    exact ``quantized_pad`` with the zero point (the real 0) and an unpadded conv (CMSIS-NN's convs
    pad symmetrically)."""
    if len(padding) == 2:
        return x_node, padding
    top, left, bottom, right = padding
    zp = m.inputs[0].qparams.zero_point
    return m.call("quantized_pad", x_node, [0, 0, top, left], [0, 0, bottom, right], zp), [0, 0]


@lowers(torch.ops.aten.conv2d.default, torch.ops.aten.conv2d.padding, formats=(A8W8, A16W8, A8W4),
        when={A8W4: _int4_capable, A16W8: _s16_capable})
def lower_conv2d(m: Match):
    """``aten.conv2d``: groups 1 -> ``quantized_conv2d``; groups == C_in -> depthwise; other groups ->
    ``quantized_grouped_conv2d``.  String padding (the ``conv2d.padding`` overload) becomes explicit,
    an asymmetric "same" (even kernel) through ``quantized_pad``."""
    a = _conv_args(m.node)
    x_node = m.inputs[0].node
    if isinstance(a["padding"], str):
        kernel_hw = tuple(m.node.args[1].meta["val"].shape[2:]) if "val" in m.node.args[1].meta else None
        if kernel_hw is None:
            kernel_hw = tuple(m.quantized_constant(a["weight"])[0].shape[2:])
        x_node, a["padding"] = _same_pad(m, x_node, explicit_padding(a["padding"], kernel_hw, _pair(a["dilation"])))
    weight, w_scales = _conv_weight(m, a)
    c_in = m.node.args[0].meta["val"].shape[1]
    return _lower_conv(m, x_node, weight, w_scales, a, c_in, _pair(a["stride"]), _pair(a["padding"]),
                       _pair(a["dilation"]))


def _conv_weight(m: Match, a) -> tuple[torch.Tensor, torch.Tensor]:
    weight, w_scales, axis = m.quantized_constant(a["weight"])
    if axis not in (None, 0):
        raise LoweringError(f"weights quantized along axis {axis}; expected per-output-channel (axis 0)")
    return weight, w_scales


def _lower_conv(m: Match, x_node, weight, w_scales, a, c_in: int, stride, padding, dilation):
    """The Corten convolution of the int8 4-D ``x_node`` with the ``[C_out, C_in/groups, kH, kW]``
    integer ``weight`` (PyTorch layout), choosing the op from ``groups``."""
    x = m.inputs[0]
    c_out, c_in_per_group = weight.shape[0], weight.shape[1]
    groups = int(a["groups"])
    s16 = x.qparams.dtype == torch.int16 or m.output.dtype == torch.int16
    mult, shift = per_channel_multipliers(x.qparams.scale, w_scales, m.output.scale)
    if mult.numel() == 1 and c_out > 1:
        mult, shift = mult.expand(c_out).clone(), shift.expand(c_out).clone()
    if s16:  # 16x8: int16 in and out, int64 bias (always present), shifts <= 14
        if x.qparams.dtype != m.output.dtype:
            raise LoweringError("a convolution reads and writes one activation width (int8 or int16)")
        if not (groups == 1 or (groups == c_in and c_in_per_group == 1)):
            raise LoweringError("a grouped convolution has no int16 (16x8) kernel; keep it int8")
        if len(padding) == 4 or x_node is not m.inputs[0].node:
            raise LoweringError("a 16x8 convolution takes symmetric padding only; keep it int8")
        bias = m.bias_int64(a["bias"], x.qparams.scale, w_scales, c_out)
        shift = m.reduced_shift(shift)
    else:
        bias = m.bias_int32(a["bias"], x.qparams.scale, w_scales)
    act_min, act_max = m.activation_bounds
    common_tail = (x.qparams.offset, m.output.zero_point, m.add_constant(mult, "multiplier"),
                   m.add_constant(shift, "shift"), act_min, act_max)
    bias_node = m.add_constant(bias, "bias") if bias is not None else None
    ohwi = weight.permute(0, 2, 3, 1).contiguous().to(torch.int8)
    # int4 weights (A8W4): the op's trailing weight_bits=4; an int8 graph never spells the argument
    bits = () if s16 or m.weight_bits(a["weight"]) == 8 else (4,)
    if groups == 1:
        w = m.add_constant(ohwi, "weight")
        return m.call("quantized_conv2d", x_node, w, bias_node, stride, padding, dilation, *common_tail, *bits)
    if groups == c_in and c_in_per_group == 1:
        w = m.add_constant(weight.permute(1, 2, 3, 0).contiguous().to(torch.int8), "weight")  # [1, kH, kW, C_out]
        return m.call("quantized_depthwise_conv2d", x_node, w, bias_node, stride, padding, dilation,
                      c_out // c_in, *common_tail, *bits)
    # (a grouped convolution has no int4 kernel: int4-rounded weights, if any, run as int8 values)
    w = m.add_constant(ohwi, "weight")  # OHWI with C = C_in / groups, as arm_convolve_s8 takes it
    return m.call("quantized_grouped_conv2d", x_node, w, bias_node, stride, padding, dilation, groups, *common_tail)


# ----------------------------------------------------------------------------- 1-D convolution
# A 1-D op on ``[N, C, L]`` runs as its 2-D op on the ``[N, C, 1, L]`` view.  The reshapes are not
# free in C (a 3-D tensor's bytes are NCL, the 4-D view's are NHWC = [N, 1, L, C]): the generator
# copies.  A chain of 1-D ops (conv1d -> max_pool1d -> conv1d ...) keeps the 4-D tensor: the
# reshape back to 3-D records its 4-D source, and the next 1-D op reads that source directly.
def _single(v, default: int) -> int:
    v = list(v) if isinstance(v, (list, tuple)) else [v if v is not None else default]
    return int(v[0]) if v else default


@lowers(torch.ops.aten.conv1d.default, torch.ops.aten.conv1d.padding, formats=(A8W8, A8W4),
        when={A8W4: _int4_capable})
def lower_conv1d(m: Match):
    """``aten.conv1d`` on ``[N, C, L]`` -> the conv2d lowering on the ``[N, C, 1, L]`` view, weights
    ``[C_out, C_in/groups, K]`` as ``[C_out, C_in/groups, 1, K]`` (OHWI ``[C_out, 1, K, C_in/groups]``)."""
    a = _conv_args(m.node)
    weight, w_scales = _conv_weight(m, a)
    in_shape = m.node.args[0].meta["val"].shape
    out_shape = m.node.meta["val"].shape
    if len(in_shape) != 3:
        raise LoweringError(f"conv1d of a {len(in_shape)}-D input is not supported (batch it: [N, C, L])")
    x4 = as_4d_view(m, m.inputs[0].node, in_shape)
    stride = [1, _single(a["stride"], 1)]
    dilation = [1, _single(a["dilation"], 1)]
    if isinstance(a["padding"], str):
        x4, padding = _same_pad(m, x4, explicit_padding(a["padding"], (1, int(weight.shape[-1])), dilation))
    else:
        padding = [0, _single(a["padding"], 0)]
    y4 = _lower_conv(m, x4, weight.unsqueeze(2), w_scales, a, int(in_shape[1]), stride, padding, dilation)
    return back_to_3d(m, y4, [out_shape[0], out_shape[1], 1, out_shape[2]])


# ----------------------------------------------------------------------------- scratch memory
def _nhwc(node) -> tuple[int, int, int, int]:
    n, c, h, w = node.meta["val"].shape
    return int(n), int(h), int(w), int(c)


def _conv2d_scratch(node, target) -> int:
    # args: input, weight [C_out, kH, kW, C_in], bias, stride, padding, dilation, ...
    inp, weight, _, stride, padding, dilation = node.args[:6]
    _, kh, kw, _ = weight.meta["val"].shape
    _, ho, wo, _ = _nhwc(node)
    return conv2d_scratch_bytes(target.isa, _nhwc(inp), (int(kh), int(kw)), (ho, wo), stride, pads4(padding)[:2],
                                dilation)


def _conv2d_s16_scratch(node, target) -> int:
    inp, weight = node.args[:2]
    _, kh, kw, _ = weight.meta["val"].shape
    return conv2d_s16_scratch_bytes(target.isa, _nhwc(inp)[3], int(kh), int(kw))


def _depthwise_s16_scratch(node, target) -> int:
    inp, weight, _, _, _, dilation = node.args[:6]
    _, kh, kw, _ = weight.meta["val"].shape
    return depthwise_s16_scratch_bytes(target.isa, _nhwc(inp)[3], int(kh), int(kw), int(node.args[6]), dilation)


def _depthwise_scratch(node, target) -> int:
    # args: input, weight [1, kH, kW, C_out], bias, stride, padding, dilation, depth_multiplier, ...
    inp, weight, _, stride, padding, dilation = node.args[:6]
    _, kh, kw, c_out = weight.meta["val"].shape
    _, ho, wo, _ = _nhwc(node)
    return depthwise_scratch_bytes(target.isa, _nhwc(inp), (int(kh), int(kw)), (ho, wo), int(c_out),
                                   stride, pads4(padding)[:2], dilation)


def _conv2d_s4_scratch(node, target) -> int:
    """``arm_convolve_wrapper_s4_get_buffer_size`` (the 1x1 kernels: none)."""
    inp, weight, _, stride, padding, dilation = node.args[:6]
    _, kh, kw, _ = weight.meta["val"].shape
    return conv2d_s4_scratch_bytes(target.isa, _nhwc(inp), (int(kh), int(kw)), stride, pads4(padding)[:2], dilation)


def _depthwise_s4_scratch(node, target) -> int:
    """``arm_depthwise_conv_wrapper_s4_get_buffer_size``."""
    inp, weight, _, _, _, dilation = node.args[:6]
    _, kh, kw, c_out = weight.meta["val"].shape
    return depthwise_s4_scratch_bytes(target.isa, _nhwc(inp), (int(kh), int(kw)), int(c_out), dilation)


def _grouped_scratch(node, target) -> int:
    """``arm_convolve_s8_get_buffer_size`` (CMSIS-NN sizes the im2col columns by the full C_in)."""
    inp, weight = node.args[:2]
    _, kh, kw, _ = weight.meta["val"].shape
    return im2col_bytes(target.isa, _nhwc(inp)[3], int(kh), int(kw))


# ----------------------------------------------------------------------------- C emission
def _check_taps(ctx, taps: int) -> None:
    if taps > MAX_ACCUMULATOR_TAPS:
        ctx.fail(f"a window of {taps} products may overflow the int32 accumulator")


def _conv_geometry(ctx) -> dict:
    """The window and quantization arguments of a conv / depthwise node (both providers' view)."""
    depthwise = ctx.op_name == "quantized_depthwise_conv2d"
    n, h, w, c_in = ctx.nhwc(ctx.arg("input"))
    _, ho, wo, c_out = ctx.nhwc()
    weight = ctx.tensor("weight")
    kh, kw = int(weight.shape[1]), int(weight.shape[2])
    # the kernels take the leading padding (top, left); a band's trailing padding is in its output size
    (sh, sw), (ph, pw), (dh, dw) = ctx.arg("stride"), pads4(ctx.arg("padding"))[:2], ctx.arg("dilation")
    _check_taps(ctx, kh * kw * (1 if depthwise else c_in))
    int4 = weight_dtype(ctx.node) == torch.int4  # (A8W4: the weights written packed two per byte)
    x, out, wname = ctx.typed_input("input"), ctx.typed_out(), ctx.const("weight", bits=4 if int4 else 0)
    suffix = kernel_suffix(torch.int4 if int4 else ctx.dtype("input"))  # the kernels' element type: s8, s16, s4
    return dict(depthwise=depthwise, int4=int4, suffix=suffix, n=n, h=h, w=w, c_in=c_in, ho=ho, wo=wo, c_out=c_out,
                kh=kh, kw=kw, sh=sh, sw=sw,
                ph=ph, pw=pw, dh=dh, dw=dw, mult=int(ctx.arg("depth_multiplier")) if depthwise else 1,
                in_off=int(ctx.arg("input_offset")), out_off=int(ctx.arg("output_offset")),
                act_min=int(ctx.arg("activation_min")), act_max=int(ctx.arg("activation_max")),
                filt=(1, kh, kw, c_out) if depthwise else (c_out, kh, kw, c_in), x=x, out=out, wname=wname)


@PORTABLE.kernel("quantized_conv2d", "quantized_depthwise_conv2d")
def _conv_portable(ctx) -> str:
    """One ``corten_conv2d_s8`` / ``corten_depthwise_conv2d_s8`` call (``_s16`` on int16 activations,
    ``_s4`` on int4 weights)."""
    g = _conv_geometry(ctx)
    fn = f"corten_depthwise_conv2d_{g['suffix']}" if g["depthwise"] else f"corten_conv2d_{g['suffix']}"
    return portable_conv_block(ctx, fn, _portable_params(ctx, g), g, g["filt"])


def _portable_params(ctx, g: dict) -> str:
    """The ``corten_conv_params`` struct of Corten's conv / depthwise kernels."""
    return ctx.params("corten_conv_params", "params", dict(
        stride_h=g["sh"], stride_w=g["sw"], pad_h=g["ph"], pad_w=g["pw"], dilation_h=g["dh"], dilation_w=g["dw"],
        depth_multiplier=g["mult"], input_offset=g["in_off"], output_offset=g["out_off"],
        activation_min=g["act_min"], activation_max=g["act_max"]))


def _depthwise_s4_supports(node, target) -> str | None:
    """``arm_depthwise_conv_wrapper_s4`` picks ``arm_depthwise_conv_s4_opt`` for one image, depth
    multiplier 1 and no dilation; its Helium path gave other bytes than its own C path (and the
    reference) on QEMU's Cortex-M55 for half the outputs (every layer tried), so MVE keeps those
    layers on the portable kernel."""
    view = NodeView(node, target)
    opt = (int(view.arg("depth_multiplier")) == 1 and view.shape(view.arg("input"))[0] == 1
           and tuple(int(d) for d in view.arg("dilation")) == (1, 1))
    if opt and getattr(target, "isa", None) == "mve":
        return ("arm_depthwise_conv_s4_opt's Helium path disagrees with CMSIS-NN's C path on QEMU Cortex-M55 "
                "(measured); the portable s4 kernel runs this layer")
    return None


@CMSIS_NN.kernel("quantized_conv2d", act=(torch.int8,), weight=(torch.int8,), scratch=_conv2d_scratch)
@CMSIS_NN.kernel("quantized_depthwise_conv2d", act=(torch.int8,), weight=(torch.int8,), scratch=_depthwise_scratch)
@CMSIS_NN.kernel("quantized_conv2d", act=(torch.int16,), weight=(torch.int8,), scratch=_conv2d_s16_scratch)
@CMSIS_NN.kernel("quantized_depthwise_conv2d", act=(torch.int16,), weight=(torch.int8,), scratch=_depthwise_s16_scratch)
@CMSIS_NN.kernel("quantized_conv2d", act=(torch.int8,), weight=(torch.int4,), scratch=_conv2d_s4_scratch)
@CMSIS_NN.kernel("quantized_depthwise_conv2d", act=(torch.int8,), weight=(torch.int4,), scratch=_depthwise_s4_scratch,
                 supports=_depthwise_s4_supports)
def _conv_cmsis(ctx) -> str:
    """One ``arm_convolve_wrapper_s8`` / ``arm_depthwise_conv_wrapper_s8`` call (``_s16``: int64 biases;
    ``_s4``: int4 weights packed two per byte, int8 activations)."""
    g = _conv_geometry(ctx)
    s16 = g["suffix"] == "s16"
    c_out = g["c_out"]
    # CMSIS-NN: tiles are {w, h}; quantization is always per channel; bias always present.
    mults = per_channel_const(ctx, "output_multiplier", c_out)
    shifts = per_channel_const(ctx, "output_shift", c_out)
    bias = ctx.const("bias") if ctx.arg("bias") is not None else \
        ctx.derived_const("zero_bias", torch.zeros(c_out, dtype=torch.int64 if s16 else torch.int32))
    buf, size = ctx.scratch()
    window = dict(stride=dict(w=g["sw"], h=g["sh"]), padding=dict(w=g["pw"], h=g["ph"]),
                  dilation=dict(w=g["dw"], h=g["dh"]), activation=dict(min=g["act_min"], max=g["act_max"]))
    offsets = dict(input_offset=0, output_offset=0) if s16 else dict(input_offset=g["in_off"],
                                                                     output_offset=g["out_off"])
    if g["depthwise"]:
        params = ctx.params("cmsis_nn_dw_conv_params", "params", dict(**offsets, ch_mult=g["mult"], **window))
    else:
        params = ctx.params("cmsis_nn_conv_params", "params", dict(**offsets, **window))
    # arm_convolve_wrapper_s16 takes its int64 bias through cmsis_nn_bias_data
    bias_arg = bias
    extra = []
    if s16 and not g["depthwise"]:
        extra = [ctx.params("cmsis_nn_bias_data", "bias_data", dict(data=f"(const void *){bias}", is_int32_bias=0))]
        bias_arg = "&bias_data"
    fn = f"{'arm_depthwise_conv_wrapper' if g['depthwise'] else 'arm_convolve_wrapper'}_{g['suffix']}"
    return ctx.block(
        ctx.params("cmsis_nn_context", "nn_ctx", dict(buf=buf, size=size)),
        params,
        *cmsis_conv_structs(ctx, g, mults, shifts, g["filt"], extra),
        ctx.call(fn, "&nn_ctx", "&params", "&quant", "&input_dims", g["x"], "&filter_dims", g["wname"], "&bias_dims",
                 bias_arg, "&output_dims", g["out"]))


def _grouped_geometry(ctx) -> dict:
    n, h, w, c_in = ctx.nhwc(ctx.arg("input"))
    _, ho, wo, c_out = ctx.nhwc()
    weight = ctx.tensor("weight")
    kh, kw, ck = int(weight.shape[1]), int(weight.shape[2]), int(weight.shape[3])
    (sh, sw), (ph, pw), (dh, dw) = ctx.arg("stride"), ctx.arg("padding"), ctx.arg("dilation")
    _check_taps(ctx, kh * kw * ck)
    return dict(n=n, h=h, w=w, c_in=c_in, ho=ho, wo=wo, c_out=c_out, kh=kh, kw=kw, ck=ck, sh=sh, sw=sw, ph=ph, pw=pw,
                dh=dh, dw=dw, in_off=int(ctx.arg("input_offset")), out_off=int(ctx.arg("output_offset")),
                act_min=int(ctx.arg("activation_min")), act_max=int(ctx.arg("activation_max")),
                x=ctx.input("input"), out=ctx.out(), wname=ctx.const("weight"))


@PORTABLE.kernel("quantized_grouped_conv2d")
def _grouped_portable(ctx) -> str:
    """One ``corten_grouped_conv2d_s8`` call."""
    g = _grouped_geometry(ctx)
    return portable_conv_block(ctx, "corten_grouped_conv2d_s8", _portable_params(ctx, {**g, "mult": 1}), g,
                               (g["c_out"], g["kh"], g["kw"], g["ck"]))


@CMSIS_NN.kernel("quantized_grouped_conv2d", act=(torch.int8,), scratch=_grouped_scratch)
def _grouped_cmsis(ctx) -> str:
    """One ``arm_convolve_s8`` call (groups = C_in / filter C there; not the wrapper, whose 1x1 and
    1xN kernels take no groups)."""
    g = _grouped_geometry(ctx)
    c_out = g["c_out"]
    mults = per_channel_const(ctx, "output_multiplier", c_out)
    shifts = per_channel_const(ctx, "output_shift", c_out)
    bias = ctx.const("bias") if ctx.arg("bias") is not None else \
        ctx.derived_const("zero_bias", torch.zeros(c_out, dtype=torch.int32))
    buf, size = ctx.scratch()
    return ctx.block(
        ctx.params("cmsis_nn_context", "nn_ctx", dict(buf=buf, size=size)),
        ctx.params("cmsis_nn_conv_params", "params", dict(
            input_offset=g["in_off"], output_offset=g["out_off"], stride=dict(w=g["sw"], h=g["sh"]),
            padding=dict(w=g["pw"], h=g["ph"]), dilation=dict(w=g["dw"], h=g["dh"]),
            activation=dict(min=g["act_min"], max=g["act_max"]))),
        *cmsis_conv_structs(ctx, g, mults, shifts, (c_out, g["kh"], g["kw"], g["ck"])),
        ctx.call("arm_convolve_s8", "&nn_ctx", "&params", "&quant", "&input_dims", g["x"], "&filter_dims", g["wname"],
                 "&bias_dims", bias, "NULL", "&output_dims", g["out"]))


# ----------------------------------------------------------------------------- in-place depthwise
def _depthwise_in_place_supports(node, target) -> str | None:
    """The in-place kernel's conditions: int8, depth multiplier 1 (output channel c reads and
    overwrites input channel c only) and an output no larger than the input."""
    inp = node.args[0]
    if int(node.args[6]) != 1:
        return "in-place depthwise needs depth multiplier 1"
    if node.meta["val"].numel() > inp.meta["val"].numel() or node.meta["val"].dtype != torch.int8:
        return "in-place depthwise needs an int8 output no larger than its input"
    return None


def _depthwise_in_place_temp(node, target) -> int:
    """One input channel of every batch: N * H * W bytes."""
    n, h, w, _ = _nhwc(node.args[0])
    return int(n * h * w)


@PORTABLE.in_place_kernel("quantized_depthwise_conv2d", act=(torch.int8,), weight=(torch.int8,),
                          supports=_depthwise_in_place_supports, scratch=_depthwise_in_place_temp)
def _depthwise_in_place_portable(ctx) -> str:
    """``corten_depthwise_conv2d_s8_in_place``: the output over the input, channel by channel through
    a channel-sized temporary (the plan's scratch of this step)."""
    g = _conv_geometry(ctx)
    temp, _ = ctx.scratch()
    return portable_conv_block(ctx, "corten_depthwise_conv2d_s8_in_place", _portable_params(ctx, g), g, g["filt"],
                               x=g["out"], out=f"(int8_t *){temp}")
