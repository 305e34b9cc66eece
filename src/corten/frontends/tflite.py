"""A ``.tflite`` int8 model -> a Corten :class:`~corten.program.Program`, without re-quantization.

The model's own quantization becomes the arguments of Corten ops: each operator's scales, zero
points, per-channel weights and int32 biases are turned into multipliers and shifts exactly as
TFLite's kernels prepare them (``Prepare`` of lite/kernels/*.cc), its fused activation into
``activation_min/max`` (``CalculateActivationRangeQuantized``), its padding into explicit
``[top, left, bottom, right]`` pads (``ComputePaddingHeightWidth``).  The result is the same kind of
program :func:`corten.compile` produces from PyTorch (a ``torch.export`` program of ``corten::`` ops
with a float input quantized at the edge and float outputs dequantized at the edge), so memory
planning, banding, C emission, QEMU runs, profiles and save/load work unchanged.

Layout: TFLite tensors are NHWC; a 4-D TFLite tensor ``[N, H, W, C]`` is the graph tensor of
logical shape ``[N, C, H, W]`` whose bytes are NHWC (Corten's convention), so every tensor's bytes
are the TFLite tensor's bytes.  Data movement (RESHAPE, TRANSPOSE, STRIDED_SLICE, ...) is computed
on those bytes (``quantized_strided_copy``; a reshape is a view).

Where TFLite's reference kernel and CMSIS-NN could differ, the TFLite arithmetic is what the
program computes (the oracle is LiteRT's ``BUILTIN_REF`` interpreter):

* FULLY_CONNECTED requantizes with one rounding (``(acc * m + 2**(30 - shift)) >> (31 - shift)``,
  TFLite's ``TFLITE_SINGLE_ROUNDING`` form), where CMSIS-NN's ``arm_fully_connected_s8`` rounds twice
  (``arm_nn_requantize``); measured on LiteRT's reference FULLY_CONNECTED (per-tensor and per-channel
  weights: 0 of 24,000 outputs differ with one rounding, 15 with two), while its CONV_2D and
  DEPTHWISE_CONV_2D round twice.  The program's ``quantized_linear`` steps carry
  ``single_rounding=True`` and use Corten's portable kernel in both C flavours.
* RELU / RELU6 / RELU_N1_TO_1 / LEAKY_RELU / HARD_SWISH / QUANTIZE (int8 -> int8) run as 256-entry
  tables of TFLite's integer reference arithmetic on each int8 value; LOGISTIC / TANH as the float32
  tables TFLite's int8 kernels populate (``LUTPopulate``).

16x8 (int16 activations, zero point 0, int64 biases): CONV_2D and DEPTHWISE_CONV_2D (Corten's s16
kernels: the reduced Q15 multiplier, as TFLite's 16x8 convolutions), the model's int16 inputs and
outputs and RESHAPEs that keep the layout; other int16 operators are refused (FULLY_CONNECTED: LiteRT
rounds the int64 accumulator once with the full Q31 multiplier, not CMSIS-NN's reduced one).
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from corten.errors import ModelFileError
from corten.fixed_point import quantize_multiplier, requantize_scalar, round_half_away
from corten.frontends.tflite_file import FUSED_ACTIVATIONS, PADDING, Operator, Tensor, TfliteModel, read_tflite

OPS = torch.ops.corten
INT8 = 9
INT16 = 7
FLOAT32 = 0
INT32 = 2
INT64 = 4


class Unsupported(ModelFileError):
    """Raised by an operator's converter: why this operator cannot be converted (collected)."""


# ----------------------------------------------------------------------------- TFLite's preparation math
def tfl_quantize(f: float, scale: float, zero_point: int) -> int:
    """``zero_point + TfLiteRound(f / scale)`` with TFLite's float32 division."""
    return int(zero_point) + round_half_away(float(np.float32(f) / np.float32(scale)))


def activation_range(act: str, out: Tensor, where: str) -> tuple[int, int]:
    """``CalculateActivationRangeQuantized`` of a fused activation on ``out``'s int8 (int16) grid."""
    qmin, qmax = (-32768, 32767) if out.type == INT16 else (-128, 127)
    s, zp = out.scale, out.zero_point
    if act == "NONE":
        return qmin, qmax
    if act == "RELU":
        return max(qmin, tfl_quantize(0.0, s, zp)), qmax
    if act == "RELU6":
        return max(qmin, tfl_quantize(0.0, s, zp)), min(qmax, tfl_quantize(6.0, s, zp))
    if act == "RELU_N1_TO_1":
        return max(qmin, tfl_quantize(-1.0, s, zp)), min(qmax, tfl_quantize(1.0, s, zp))
    raise Unsupported(f"fused activation {act} (Corten fuses NONE, RELU, RELU6, RELU_N1_TO_1)")


def same_padding(in_size: int, filter_size: int, stride: int, dilation: int, padding: str) -> tuple[int, int, int]:
    """``(out_size, before, after)`` of TFLite's ``ComputePaddingHeightWidth`` for one dimension."""
    eff = (filter_size - 1) * dilation + 1
    out = (in_size + stride - 1) // stride if padding == "SAME" else (in_size + stride - eff) // stride
    total = max(0, (out - 1) * stride + eff - in_size)
    return out, total // 2, total // 2 + total % 2


def _multipliers(scales) -> tuple[torch.Tensor, torch.Tensor]:
    pairs = [quantize_multiplier(float(s)) for s in scales]
    return (torch.tensor([m for m, _ in pairs], dtype=torch.int32),
            torch.tensor([s for _, s in pairs], dtype=torch.int32))


# ----------------------------------------------------------------------------- layout
def graph_shape(shape) -> list[int]:
    """The graph's logical shape of a TFLite tensor (NHWC 4-D -> NCHW; other ranks as they are)."""
    shape = [int(d) for d in shape]
    if len(shape) == 4:
        n, h, w, c = shape
        return [n, c, h, w]
    return shape


def graph_dim(axis: int, rank: int) -> int:
    """The graph dimension of TFLite axis ``axis`` of a rank-``rank`` tensor."""
    axis = axis + rank if axis < 0 else axis
    return [0, 2, 3, 1][axis] if rank == 4 else axis


def _to_graph_layout(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a.transpose(0, 3, 1, 2)) if a.ndim == 4 else a


# ----------------------------------------------------------------------------- the builder
class _Builder:
    """Builds the FX graph of Corten ops from the TFLite operators, in model order."""

    def __init__(self, model: TfliteModel):
        self.model = model
        self.graph = torch.fx.Graph()
        self.root = torch.nn.Module()
        self.values: dict[int, torch.fx.Node] = {}  # TFLite tensor index -> int8 graph node
        self.sources: list[tuple[torch.fx.Node, Operator]] = []
        self.n_const = 0
        self.op: Operator | None = None

    # -- graph helpers
    def const(self, tensor: torch.Tensor, what: str) -> torch.fx.Node:
        name = f"_tfl_{what}_{self.n_const}"
        self.n_const += 1
        self.root.register_buffer(name, tensor.contiguous())
        return self.graph.get_attr(name)

    def call(self, op, *args) -> torch.fx.Node:
        node = self.graph.call_function(op, tuple(args))
        if self.op is not None:
            self.sources.append((node, self.op))
        return node

    def tensor(self, i: int) -> Tensor:
        return self.model.tensors[i]

    def value(self, i: int) -> torch.fx.Node:
        """The graph node of activation tensor ``i`` (a constant activation operand: a constant node)."""
        if i in self.values:
            return self.values[i]
        t = self.tensor(i)
        if t.data is not None and t.type == INT8:
            node = self.const(torch.from_numpy(_to_graph_layout(t.data.astype(np.int8))).clone(), "operand")
            self.values[i] = node
            return node
        raise Unsupported(f"tensor {t.describe()} is read before any operator writes it")

    def view(self, node: torch.fx.Node, tfl_in: tuple, tfl_out: tuple) -> torch.fx.Node:
        """TFLite's RESHAPE (bytes unchanged) of ``node``: an ``aten.reshape`` where the graph shapes keep
        the bytes, else a ``quantized_strided_copy`` that reads them in order (a view in C)."""
        from corten.ops._movement import shapes_share_bytes

        gin, gout = graph_shape(tfl_in), graph_shape(tfl_out)
        if gin == gout:
            return node
        if shapes_share_bytes(gin, gout):
            return self.call(torch.ops.aten.reshape.default, node, gout)
        n = int(np.prod(gout))
        return self.call(OPS.quantized_strided_copy.default, node, gout, [n], [1], 0, None, -1)

    def movement(self, node: torch.fx.Node, tfl_in: tuple, fn: Callable[[np.ndarray], np.ndarray]) -> tuple:
        """A TFLite data-movement op ``fn`` (numpy, on the TFLite shape) as one strided copy of bytes;
        returns ``(node, TFLite output shape)``."""
        from corten.ops._movement import fit_copy_plan

        table = np.asarray(fn(np.arange(int(np.prod(tfl_in)), dtype=np.int64).reshape(tfl_in)))
        out_shape = tuple(int(d) for d in table.shape)
        if table.size == 0:
            raise Unsupported(f"the output is empty (shape {list(out_shape)})")
        flat = table.reshape(-1)
        if flat.size == int(np.prod(tfl_in)) and np.array_equal(flat, np.arange(flat.size)):
            return self.view(node, tfl_in, out_shape), out_shape
        plan = fit_copy_plan(flat)
        index = None if plan.index is None else self.const(torch.tensor(plan.index, dtype=torch.int32), "index")
        return self.call(OPS.quantized_strided_copy.default, node, graph_shape(out_shape) or [1], list(plan.dims),
                         list(plan.strides), plan.offset, index, plan.index_dim), out_shape


# ----------------------------------------------------------------------------- checks
def _int8_or_16(b: _Builder, i: int, what: str) -> Tensor:
    """An activation of a layer that also has a 16x8 form (int16 activations, zero point 0)."""
    t = b.tensor(i)
    if t.type == INT16 and t.quantized and len(t.scales) == 1:
        if t.zero_point != 0:
            raise Unsupported(f"{what} {t.describe()} is int16 with zero point {t.zero_point}; the 16x8 scheme is "
                              "symmetric")
        return t
    return _int8(b, i, what)


def _same_width(x: Tensor, y: Tensor) -> bool:
    """True for a 16x8 layer (int16 in and out); refuses mixed widths."""
    if (x.type == INT16) != (y.type == INT16):
        raise Unsupported(f"input {x.describe()} and output {y.describe()} differ in width")
    return x.type == INT16


def _int8(b: _Builder, i: int, what: str) -> Tensor:
    t = b.tensor(i)
    if t.type == INT16:
        raise Unsupported(f"{what} {t.describe()} is int16 (the 16x8 scheme); Corten converts int8 TFLite models")
    if t.type != INT8:
        raise Unsupported(f"{what} {t.describe()} is {t.type_name}; Corten converts int8 (fully quantized) models")
    if not t.quantized or len(t.scales) != 1:
        raise Unsupported(f"{what} {t.describe()} has no per-tensor quantization")
    return t


def _same_qparams(a: Tensor, b: Tensor, what: str) -> None:
    if a.scale != b.scale or a.zero_point != b.zero_point:
        raise Unsupported(f"{what}: input {a.describe()} (scale {a.scale:g}, zero point {a.zero_point}) and output "
                          f"{b.describe()} (scale {b.scale:g}, zero point {b.zero_point}) must share quantization")


def _weights(b: _Builder, i: int, channels: int, axis: int) -> tuple[Tensor, np.ndarray]:
    w = b.tensor(i)
    if w.data is None:
        raise Unsupported(f"weights {w.describe()} are not a constant")
    if w.type != INT8 or not w.quantized:
        raise Unsupported(f"weights {w.describe()} are {w.type_name}; expected int8 (per-tensor or per-channel)")
    if np.any(w.zero_points != 0):
        raise Unsupported(f"weights {w.describe()} have non-zero zero points; TFLite int8 weights are symmetric")
    scales = w.scales.astype(np.float64)
    if len(scales) == 1:
        scales = np.repeat(scales, channels)
    elif len(scales) != channels or w.quantized_dimension != axis:
        raise Unsupported(f"weights {w.describe()}: {len(w.scales)} scales along dimension {w.quantized_dimension}; "
                          f"expected 1 or {channels} along dimension {axis}")
    return w, scales


def _bias(b: _Builder, ops: Operator, channels: int, wide: bool = False) -> torch.Tensor:
    """The int32 bias (int64 for a 16x8 layer; zeros when omitted)."""
    dtype, kind, np_type = (torch.int64, INT64, np.int64) if wide else (torch.int32, INT32, np.int32)
    i = ops.inputs[2] if len(ops.inputs) > 2 else -1
    if i < 0:
        return torch.zeros(channels, dtype=dtype)
    t = b.tensor(i)
    if t.data is None or t.type != kind:
        raise Unsupported(f"bias {t.describe()} must be a constant {'int64' if wide else 'int32'} tensor")
    return torch.from_numpy(t.data.astype(np_type).reshape(-1)).clone()


def _per_channel_multipliers(in_scale: float, w_scales: np.ndarray, out_scale: float):
    """``PopulateConvolutionQuantizationParams``: ``double(input) * double(filter) / double(output)``."""
    return _multipliers([float(in_scale) * float(ws) / float(out_scale) for ws in w_scales])


def _padding(opt: dict, in_hw, k_hw, stride, dilation, out_hw, where) -> list[int]:
    pad = PADDING.get(int(opt.get("Padding", 1)), "VALID")
    (oh, top, bottom), (ow, left, right) = (same_padding(in_hw[0], k_hw[0], stride[0], dilation[0], pad),
                                            same_padding(in_hw[1], k_hw[1], stride[1], dilation[1], pad))
    if (oh, ow) != tuple(out_hw):
        raise Unsupported(f"{pad} padding gives an {oh}x{ow} output, the model says {out_hw[0]}x{out_hw[1]}")
    return [top, left, bottom, right]


def _act(opt: dict) -> str:
    return FUSED_ACTIVATIONS.get(int(opt.get("FusedActivationFunction", 0)), "?")


# ----------------------------------------------------------------------------- operators
def _check_wide_shift(wide: bool, shift: torch.Tensor) -> None:
    from corten.fixed_point import REDUCED_SHIFT_MAX

    if wide and int(shift.max()) > REDUCED_SHIFT_MAX:
        raise Unsupported(f"a 16x8 requantization shift of {int(shift.max())} (the effective scale is >= 2**14)")


def _convolution(b: _Builder, op: Operator, depthwise: bool) -> None:
    """CONV_2D (weights OHWI, per-channel along 0) and DEPTHWISE_CONV_2D (weights ``[1, kH, kW, C_out]``,
    per-channel along 3): the weights, bias, geometry and output stage as TFLite prepares them."""
    x, y = _int8_or_16(b, op.inputs[0], "input"), _int8_or_16(b, op.outputs[0], "output")
    wide = _same_width(x, y)
    cin, cout = x.shape[3], y.shape[3]
    w, scales = _weights(b, op.inputs[1], cout, 3 if depthwise else 0)
    if depthwise and cout % cin:
        raise Unsupported(f"{cout} output channels for {cin} input channels")
    if not depthwise and w.shape[3] != cin:
        raise Unsupported(f"grouped convolution ({cin} input channels, {w.shape[3]} per filter)")
    o = op.options
    stride = [int(o.get("StrideH", 1)), int(o.get("StrideW", 1))]
    dil = [int(o.get("DilationHFactor", 1)), int(o.get("DilationWFactor", 1))]
    pads = _padding(o, x.shape[1:3], w.shape[1:3], stride, dil, y.shape[1:3], op)
    mult, shift = _per_channel_multipliers(x.scale, scales, y.scale)
    _check_wide_shift(wide, shift)
    amin, amax = activation_range(_act(o), y, op)
    geometry = [stride, pads, dil] + ([cout // cin] if depthwise else [])
    target = OPS.quantized_depthwise_conv2d.default if depthwise else OPS.quantized_conv2d.default
    b.values[op.outputs[0]] = b.call(
        target, b.value(op.inputs[0]), b.const(torch.from_numpy(w.data.copy()), "weight"),
        b.const(_bias(b, op, cout, wide), "bias"), *geometry, -x.zero_point, y.zero_point, b.const(mult, "multiplier"),
        b.const(shift, "shift"), amin, amax)


def _fully_connected(b: _Builder, op: Operator) -> None:
    # (16x8: LiteRT's reference requantizes the int64 accumulator with the full Q31 multiplier and one
    # rounding, Corten's s16 kernels with CMSIS-NN's reduced Q15 one: measured 1 of 180 outputs apart)
    x, y = _int8(b, op.inputs[0], "input"), _int8(b, op.outputs[0], "output")
    wt = b.tensor(op.inputs[1])
    if len(wt.shape) != 2:
        raise Unsupported(f"weights {wt.describe()} are not 2-D")
    if int(op.options.get("WeightsFormat", 0)) != 0:
        raise Unsupported("shuffled weights format")
    cout, cin = wt.shape
    w, scales = _weights(b, op.inputs[1], cout, 0)
    numel = int(np.prod(x.shape))
    if numel % cin:
        raise Unsupported(f"input {x.describe()} does not divide into rows of {cin}")
    rows = numel // cin
    mult, shift = _per_channel_multipliers(x.scale, scales, y.scale)
    bias = _bias(b, op, cout).to(torch.int64)
    rowsum = torch.from_numpy(w.data.astype(np.int64).sum(axis=1))
    kernel_sum = bias - x.zero_point * rowsum
    kernel_sum = ((kernel_sum + 2**31) % 2**32 - 2**31).to(torch.int32)  # int32 arithmetic in TFLite: wraps
    amin, amax = activation_range(_act(op.options), y, op)
    xin = b.view(b.value(op.inputs[0]), x.shape, (rows, cin))
    out = b.call(OPS.quantized_linear.default, xin, b.const(torch.from_numpy(w.data.copy()), "weight"),
                 b.const(kernel_sum, "kernel_sum"), -x.zero_point, y.zero_point, b.const(mult, "multiplier"),
                 b.const(shift, "shift"), amin, amax, True)
    b.values[op.outputs[0]] = b.view(out, (rows, cout), y.shape)


def _broadcast_operands(b: _Builder, op: Operator) -> tuple[torch.fx.Node, torch.fx.Node]:
    """Both operands with the output's rank (TFLite broadcasting aligns trailing dims; the graph's
    NCHW order of 4-D tensors needs the ranks equal first)."""
    rank = len(b.tensor(op.outputs[0]).shape)
    nodes = []
    for i in op.inputs[:2]:
        t = b.tensor(i)
        shape = (1,) * (rank - len(t.shape)) + tuple(t.shape)
        if t.data is not None:
            nodes.append(b.const(torch.from_numpy(_to_graph_layout(t.data.astype(np.int8).reshape(shape))).clone(),
                                 "operand"))
        else:
            nodes.append(b.view(b.value(i), t.shape, shape))
    return nodes[0], nodes[1]


def _add_sub(b: _Builder, op: Operator, sign: int) -> None:
    from corten.ops._qparams import add_params

    a, c = _int8(b, op.inputs[0], "input 1"), _int8(b, op.inputs[1], "input 2")
    y = _int8(b, op.outputs[0], "output")
    p = add_params(a.scale, c.scale, y.scale)
    amin, amax = activation_range(_act(op.options), y, op)
    n1, n2 = _broadcast_operands(b, op)
    target = OPS.quantized_add.default if sign > 0 else OPS.quantized_sub.default
    b.values[op.outputs[0]] = b.call(target, n1, n2, -a.zero_point, p.input1_multiplier, p.input1_shift,
                                     -c.zero_point, p.input2_multiplier, p.input2_shift, p.left_shift, y.zero_point,
                                     p.output_multiplier, p.output_shift, amin, amax)


def _mul(b: _Builder, op: Operator) -> None:
    a, c = _int8(b, op.inputs[0], "input 1"), _int8(b, op.inputs[1], "input 2")
    y = _int8(b, op.outputs[0], "output")
    mult, shift = quantize_multiplier(float(a.scale) * float(c.scale) / float(y.scale))
    amin, amax = activation_range(_act(op.options), y, op)
    n1, n2 = _broadcast_operands(b, op)
    b.values[op.outputs[0]] = b.call(OPS.quantized_mul.default, n1, n2, -a.zero_point, -c.zero_point, y.zero_point,
                                     mult, shift, amin, amax)


def _pool(b: _Builder, op: Operator, average: bool) -> None:
    x, y = _int8(b, op.inputs[0], "input"), _int8(b, op.outputs[0], "output")
    _same_qparams(x, y, op.opcode)
    o = op.options
    k, stride = [int(o["FilterHeight"]), int(o["FilterWidth"])], [int(o.get("StrideH", 1)), int(o.get("StrideW", 1))]
    pads = _padding(o, x.shape[1:3], k, stride, [1, 1], y.shape[1:3], op)
    amin, amax = activation_range(_act(o), y, op)
    target = OPS.quantized_avg_pool2d.default if average else OPS.quantized_max_pool2d.default
    b.values[op.outputs[0]] = b.call(target, b.value(op.inputs[0]), k, stride, pads, amin, amax)


def _softmax(b: _Builder, op: Operator) -> None:
    from corten.ops.softmax import softmax_params

    x, y = _int8(b, op.inputs[0], "input"), _int8(b, op.outputs[0], "output")
    if y.scale != 1.0 / 256 or y.zero_point != -128:
        raise Unsupported(f"output {y.describe()} is not quantized with scale 1/256 and zero point -128 (TFLite's "
                          "int8 softmax output)")
    p = softmax_params(x.scale, float(op.options.get("Beta", 1.0)))
    b.values[op.outputs[0]] = b.call(OPS.quantized_softmax.default, b.value(op.inputs[0]), p.input_multiplier,
                                     p.input_left_shift, p.diff_min, graph_dim(-1, len(x.shape)))


def _reshape(b: _Builder, op: Operator) -> None:
    from corten.ops._movement import shapes_share_bytes

    x, y = _int8_or_16(b, op.inputs[0], "input"), _int8_or_16(b, op.outputs[0], "output")
    _same_qparams(x, y, op.opcode)
    if _same_width(x, y) and not shapes_share_bytes(graph_shape(x.shape), graph_shape(y.shape)):
        raise Unsupported("an int16 reshape of a 4-D NHWC tensor to another layout (Corten's byte copy is int8)")
    b.values[op.outputs[0]] = b.view(b.value(op.inputs[0]), x.shape, y.shape)


def _const_ints(b: _Builder, op: Operator, k: int, what: str) -> np.ndarray:
    if len(op.inputs) <= k or op.inputs[k] < 0 or b.tensor(op.inputs[k]).data is None:
        raise Unsupported(f"{what} must be a constant tensor")
    return b.tensor(op.inputs[k]).data.astype(np.int64)


def _transpose(b: _Builder, op: Operator) -> None:
    x = _int8(b, op.inputs[0], "input")
    _same_qparams(x, _int8(b, op.outputs[0], "output"), op.opcode)
    perm = [int(p) for p in _const_ints(b, op, 1, "the permutation")]
    node, shape = b.movement(b.value(op.inputs[0]), x.shape, lambda t: t.transpose(perm))
    b.values[op.outputs[0]] = node


def _strided_slice(b: _Builder, op: Operator) -> None:
    x, y = _int8(b, op.inputs[0], "input"), _int8(b, op.outputs[0], "output")
    _same_qparams(x, y, op.opcode)
    o = op.options
    if int(o.get("EllipsisMask", 0)) or int(o.get("NewAxisMask", 0)) or bool(o.get("Offset", False)):
        raise Unsupported("ellipsis_mask, new_axis_mask and offset are not supported")
    begin, end, strides = (_const_ints(b, op, k, n) for k, n in ((1, "begin"), (2, "end"), (3, "strides")))
    bm, em, sm = int(o.get("BeginMask", 0)), int(o.get("EndMask", 0)), int(o.get("ShrinkAxisMask", 0))
    index = []
    for d in range(len(x.shape)):
        if sm >> d & 1:
            index.append(int(begin[d]))
            continue
        index.append(slice(None if bm >> d & 1 else int(begin[d]), None if em >> d & 1 else int(end[d]),
                           int(strides[d])))
    node, shape = b.movement(b.value(op.inputs[0]), x.shape, lambda t: t[tuple(index)])
    if tuple(shape) != tuple(y.shape):
        raise Unsupported(f"the slice gives shape {list(shape)}, the model says {list(y.shape)}")
    b.values[op.outputs[0]] = node


def _squeeze_like(b: _Builder, op: Operator) -> None:
    x, y = b.tensor(op.inputs[0]), b.tensor(op.outputs[0])
    _int8(b, op.inputs[0], "input")
    b.values[op.outputs[0]] = b.view(b.value(op.inputs[0]), x.shape, y.shape)


def _concatenation(b: _Builder, op: Operator) -> None:
    y = _int8(b, op.outputs[0], "output")
    if _act(op.options) != "NONE":
        raise Unsupported(f"fused activation {_act(op.options)}")
    nodes = []
    for k, i in enumerate(op.inputs):
        t = b.tensor(i)
        _same_qparams(_int8(b, i, f"input {k}"), y, op.opcode)
        nodes.append(b.value(i))
    axis = int(op.options.get("Axis", 0))
    b.values[op.outputs[0]] = b.call(OPS.quantized_cat.default, nodes, graph_dim(axis, len(y.shape)))


def _pad(b: _Builder, op: Operator) -> None:
    x, y = _int8(b, op.inputs[0], "input"), _int8(b, op.outputs[0], "output")
    _same_qparams(x, y, op.opcode)
    pads = _const_ints(b, op, 1, "the paddings").reshape(-1, 2)
    value = y.zero_point
    if op.opcode == "PADV2" and len(op.inputs) > 2 and op.inputs[2] >= 0:
        value = int(_const_ints(b, op, 2, "the constant value").reshape(-1)[0])
    rank = len(x.shape)
    pre, post = [0] * rank, [0] * rank
    for d in range(rank):
        g = graph_dim(d, rank)
        pre[g], post[g] = int(pads[d, 0]), int(pads[d, 1])
    if min(pre + post) < 0:
        raise Unsupported("negative paddings")
    b.values[op.outputs[0]] = b.call(OPS.quantized_pad.default, b.value(op.inputs[0]), pre, post, value)


def _quantize(b: _Builder, op: Operator) -> None:
    x, y = b.tensor(op.inputs[0]), _int8(b, op.outputs[0], "output")
    if x.type == FLOAT32:
        if op.inputs[0] not in b.model.inputs:
            raise Unsupported("a float -> int8 QUANTIZE inside the model (only at a model input)")
        b.values[op.outputs[0]] = b.call(OPS.quantize_per_tensor.default, b.inputs[op.inputs[0]], y.scale,
                                         y.zero_point, 8)
        return
    _int8(b, op.inputs[0], "input")
    # TFLite's Requantize: zp_out + MultiplyByQuantizedMultiplier(q - zp_in, double(s_in) / double(s_out)),
    # saturated; int8 -> int8 as a table (quantized_requantize changes widths only)
    mult, shift = quantize_multiplier(float(x.scale) / float(y.scale))
    _table(b, op, lambda q: y.zero_point + requantize_scalar(q - x.zero_point, mult, shift))


def _dequantize(b: _Builder, op: Operator) -> None:
    x = _int8(b, op.inputs[0], "input")
    if op.outputs[0] not in b.model.outputs or any(op.outputs[0] in o.inputs for o in b.model.operators):
        raise Unsupported("an int8 -> float DEQUANTIZE inside the model (only at a model output)")
    b.dequantized[op.outputs[0]] = (op.inputs[0], x)


def _table(b: _Builder, op: Operator, fn: Callable[[int], int]) -> None:
    """An elementwise op as a 256-entry table of its TFLite integer arithmetic."""
    table = torch.tensor([max(-128, min(127, int(fn(q)))) for q in range(-128, 128)], dtype=torch.int8)
    b.values[op.outputs[0]] = b.call(OPS.quantized_lut.default, b.value(op.inputs[0]), b.const(table, "table"))


def _relu_like(b: _Builder, op: Operator) -> None:
    """TFLite's ``ReluX`` (RELU, RELU6, RELU_N1_TO_1; activations.cc ``QuantizedReluX``)."""
    x, y = _int8(b, op.inputs[0], "input"), _int8(b, op.outputs[0], "output")
    lo, hi = {"RELU": (0.0, math.inf), "RELU6": (0.0, 6.0), "RELU_N1_TO_1": (-1.0, 1.0),
              "RELU_0_TO_1": (0.0, 1.0)}[op.opcode]
    amin = max(-128, y.zero_point + round_half_away(float(np.float32(lo) / np.float32(y.scale))))
    amax = 127 if math.isinf(hi) else min(127, y.zero_point + round_half_away(float(np.float32(hi) /
                                                                                  np.float32(y.scale))))
    mult, shift = quantize_multiplier(float(np.float32(x.scale) / np.float32(y.scale)))
    _table(b, op, lambda q: max(amin, min(amax, y.zero_point + requantize_scalar(q - x.zero_point, mult, shift))))


def lut_populate(transform: Callable[[np.ndarray], np.ndarray], x: Tensor, y: Tensor) -> Callable[[int], int]:
    """TFLite's ``LUTPopulate<int8_t>`` (float32): ``round(transform(s_in * (q - zp_in)) / s_out) + zp_out``
    with ``1 / s_out`` formed first, as the int8 LOGISTIC and TANH kernels prepare their tables."""
    q = np.arange(-128, 128)
    dequantized = np.float32(x.scale) * (q - x.zero_point).astype(np.float32)
    with np.errstate(over="ignore"):
        transformed = transform(dequantized.astype(np.float32)).astype(np.float32)
    rescaled = transformed * (np.float32(1.0) / np.float32(y.scale))
    values = [round_half_away(float(v)) + y.zero_point if np.isfinite(v) else (127 if v > 0 else -128)
              for v in rescaled]
    return lambda v: values[v + 128]


def _logistic(b: _Builder, op: Operator) -> None:
    x, y = _int8(b, op.inputs[0], "input"), _int8(b, op.outputs[0], "output")
    _table(b, op, lut_populate(lambda v: np.float32(1.0) / (np.float32(1.0) + np.exp(-v)), x, y))


def _tanh(b: _Builder, op: Operator) -> None:
    x, y = _int8(b, op.inputs[0], "input"), _int8(b, op.outputs[0], "output")
    _table(b, op, lut_populate(np.tanh, x, y))


def _leaky_relu(b: _Builder, op: Operator) -> None:
    """TFLite's ``QuantizeLeakyRelu``: the identity or the alpha multiplier by the input's sign."""
    x, y = _int8(b, op.inputs[0], "input"), _int8(b, op.outputs[0], "output")
    alpha = np.float32(op.options.get("Alpha", 0.2))
    m_alpha = quantize_multiplier(float(np.float32(x.scale) * alpha / np.float32(y.scale)))
    m_id = quantize_multiplier(float(np.float32(x.scale) / np.float32(y.scale)))
    _table(b, op, lambda q: y.zero_point + requantize_scalar(q - x.zero_point, *(m_id if q >= x.zero_point
                                                                                  else m_alpha)))


def _srdhm16(a: int, b: int) -> int:
    """gemmlowp ``SaturatingRoundingDoublingHighMul`` on int16."""
    if a == b == -32768:
        return 32767
    ab = a * b
    nudge = (1 << 14) if ab >= 0 else 1 - (1 << 14)
    return int((ab + nudge) / (1 << 15)) if ab + nudge >= 0 else -int(-(ab + nudge) // (1 << 15))


def _rdbpot(x: int, exponent: int) -> int:
    """gemmlowp ``RoundingDivideByPOT``."""
    mask = (1 << exponent) - 1
    remainder = x & mask
    threshold = (mask >> 1) + (1 if x < 0 else 0)
    return (x >> exponent) + (1 if remainder > threshold else 0)


def _sat16(v: int) -> int:
    return max(-32768, min(32767, v))


def _to_int16_multiplier(m: int) -> int:
    """``DownScaleInt32ToInt16Multiplier``."""
    return 32767 if m >= 2**31 - 1 - (1 << 15) else (m + (1 << 15)) >> 16


def _hard_swish(b: _Builder, op: Operator) -> None:
    """TFLite's integer ``reference_ops::HardSwish<int8_t>`` (int16 fixed point) on each int8 value."""
    x, y = _int8(b, op.inputs[0], "input"), _int8(b, op.outputs[0], "output")
    hires = np.float32(1.0 / 128.0) * np.float32(x.scale)
    out_m, out_e = quantize_multiplier(float(hires / np.float32(y.scale)))
    relu_m, relu_e = quantize_multiplier(float(hires / np.float32(3.0 / 32768.0)))
    out_m16, relu_m16 = _to_int16_multiplier(out_m), _to_int16_multiplier(relu_m)

    def fn(q: int) -> int:
        v = _sat16((q - x.zero_point) * 128)
        pre = _srdhm16(v, out_m16)
        r = v
        if relu_e > 0:
            r = _sat16(r * (1 << (relu_e - 1)))
        r = _srdhm16(r, relu_m16)
        if relu_e > 0:
            r = _sat16(r * 2)
        if relu_e < 0:
            r = _rdbpot(r, -relu_e)
        r = (r + (1 << 15)) >> 1
        prod = 32767 if r == pre == -32768 else int(r * pre / (1 << 15))
        return _rdbpot(prod, -out_e) + y.zero_point

    _table(b, op, fn)


def mean_multiplier(in_scale: float, out_scale: float, count: int) -> tuple[int, int]:
    """TFLite's int8 MEAN (``QuantizedMeanOrSum``): the multiplier of ``double(s_in) / double(s_out)``,
    then divided by the element count in integers: shifted left by ``min(floor(log2 count), 32,
    31 + shift)`` and divided (truncating), the shift lowered by as much."""
    mult, shift = quantize_multiplier(float(in_scale) / float(out_scale))
    k = min(count.bit_length() - 1, 32, 31 + shift)
    return (mult << k) // count, shift - k


def _reduce(b: _Builder, op: Operator) -> None:
    x, y = _int8(b, op.inputs[0], "input"), _int8(b, op.outputs[0], "output")
    rank = len(x.shape)
    axes = sorted({int(a) % rank for a in _const_ints(b, op, 1, "the axes").reshape(-1)})
    kept = tuple(1 if d in axes else s for d, s in enumerate(x.shape))
    dims = sorted(graph_dim(a, rank) for a in axes)
    node = b.value(op.inputs[0])
    if op.opcode in ("REDUCE_MAX", "REDUCE_MIN"):
        _same_qparams(x, y, op.opcode)
        out = b.call(OPS.quantized_reduce.default, node, dims, True, 0 if op.opcode == "REDUCE_MAX" else 1, 0, 0,
                     1 << 30, 1, -128, 127)
    else:
        mult, shift = mean_multiplier(x.scale, y.scale, int(np.prod([x.shape[a] for a in axes])))
        out = b.call(OPS.quantized_reduce.default, node, dims, True, 2, -x.zero_point, y.zero_point, mult, shift,
                     -128, 127)
    b.values[op.outputs[0]] = b.view(out, kept, y.shape)


def _batch_matmul(b: _Builder, op: Operator) -> None:
    """BATCH_MATMUL of two int8 tensors of rank 2 or 3 (``adj_x`` moves the left operand's bytes,
    ``adj_y`` is the op's transposed right operand)."""
    x, w, y = _int8(b, op.inputs[0], "lhs"), _int8(b, op.inputs[1], "rhs"), _int8(b, op.outputs[0], "output")
    if not (2 <= len(x.shape) <= 3 and 2 <= len(w.shape) <= 3):
        raise Unsupported(f"operands of ranks {len(x.shape)} and {len(w.shape)}; Corten converts ranks 2 and 3")
    mult, shift = quantize_multiplier(float(x.scale) * float(w.scale) / float(y.scale))
    lhs = b.value(op.inputs[0])
    if op.options.get("AdjX"):
        perm = list(range(len(x.shape) - 2)) + [len(x.shape) - 1, len(x.shape) - 2]
        lhs, _ = b.movement(lhs, x.shape, lambda t: t.transpose(perm))
    b.values[op.outputs[0]] = b.call(OPS.quantized_matmul.default, lhs, b.value(op.inputs[1]), -x.zero_point,
                                     -w.zero_point, y.zero_point, mult, shift, -128, 127,
                                     bool(op.options.get("AdjY", False)))


OPERATORS: dict[str, Callable[[_Builder, Operator], None]] = {
    "CONV_2D": lambda b, op: _convolution(b, op, False),
    "DEPTHWISE_CONV_2D": lambda b, op: _convolution(b, op, True),
    "FULLY_CONNECTED": _fully_connected,
    "ADD": lambda b, op: _add_sub(b, op, 1),
    "SUB": lambda b, op: _add_sub(b, op, -1),
    "MUL": _mul,
    "AVERAGE_POOL_2D": lambda b, op: _pool(b, op, True),
    "MAX_POOL_2D": lambda b, op: _pool(b, op, False),
    "SOFTMAX": _softmax,
    "RESHAPE": _reshape,
    "SQUEEZE": _squeeze_like,
    "EXPAND_DIMS": _squeeze_like,
    "TRANSPOSE": _transpose,
    "STRIDED_SLICE": _strided_slice,
    "CONCATENATION": _concatenation,
    "PAD": _pad,
    "PADV2": _pad,
    "QUANTIZE": _quantize,
    "DEQUANTIZE": _dequantize,
    "RELU": _relu_like,
    "RELU6": _relu_like,
    "RELU_N1_TO_1": _relu_like,
    "LOGISTIC": _logistic,
    "TANH": _tanh,
    "LEAKY_RELU": _leaky_relu,
    "HARD_SWISH": _hard_swish,
    "MEAN": _reduce,
    "BATCH_MATMUL": _batch_matmul,
    "REDUCE_MAX": _reduce,
    "REDUCE_MIN": _reduce,
}


# ----------------------------------------------------------------------------- the program
def convert(model: TfliteModel, target: str = "cortex-m55", name: str | None = None):
    """The :class:`~corten.program.Program` computing ``model`` (a read ``.tflite`` file)."""
    from corten.errors import UsageError
    from corten.program import Program, check_program_name
    from corten.targets import get_target

    tgt = get_target(target)
    name = check_program_name(name or _default_name(model.path))
    b = _Builder(model)
    b.inputs = {}
    b.dequantized = {}
    examples = []
    feeds_quantize = {op.inputs[0] for op in model.operators if op.opcode == "QUANTIZE" and op.inputs}
    for k, i in enumerate(model.inputs):
        t = model.tensors[i]
        ph = b.graph.placeholder(f"input{k}" if len(model.inputs) > 1 else "x")
        b.inputs[i] = ph
        examples.append(torch.zeros(graph_shape(t.shape) or [1], dtype=torch.float32))
        if t.type in (INT8, INT16) and t.quantized:
            b.values[i] = b.graph.call_function(OPS.quantize_per_tensor.default,
                                                (ph, t.scale, t.zero_point, 16 if t.type == INT16 else 8))
        elif not (t.type == FLOAT32 and i in feeds_quantize):
            raise ModelFileError(f"{Path(model.path).name}: input {k} {t.describe()} is {t.type_name}"
                                 f"{'' if t.quantized else ' without quantization'}; Corten takes int8 inputs (or "
                                 "float inputs that a QUANTIZE operator quantizes)")
    if not examples:
        raise UsageError(f"{model.path}: the model has no inputs")
    refused = []
    for op in model.operators:
        fn = OPERATORS.get(op.opcode)
        b.op = op
        if fn is None:
            refused.append((op, "no Corten conversion for this operator"))
            continue
        try:
            fn(b, op)
        except Unsupported as e:
            refused.append((op, str(e)))
    b.op = None
    if refused:
        raise ModelFileError(_refusal_message(model, refused))
    outputs = []
    for k, i in enumerate(model.outputs):
        if i in b.dequantized:
            src, t = b.dequantized[i]
        else:
            src, t = i, model.tensors[i]
            if t.type not in (INT8, INT16) or not t.quantized:
                raise ModelFileError(f"{Path(model.path).name}: output {k} {t.describe()} is {t.type_name}; "
                                     "Corten programs return int8 (int16) outputs (or their DEQUANTIZE)")
        outputs.append(b.graph.call_function(OPS.dequantize_per_tensor.default, (b.values[src], t.scale,
                                                                                   t.zero_point,
                                                                                   16 if t.type == INT16 else 8)))
    b.graph.output(tuple(outputs))
    gm = torch.fx.GraphModule(b.root, b.graph)
    try:
        ep = torch.export.export(gm, tuple(examples))
    except Exception as e:  # noqa: BLE001 - a Corten op refused its arguments: say which operator
        raise ModelFileError(f"{Path(model.path).name}: the converted program does not run: "
                             f"{type(e).__name__}: {e}") from e
    info = {"compiled_from": str(model.path), "tflite": {"version": model.version, "operators": len(model.operators)},
            "node_sources": _node_sources(model, b, ep)}
    return Program(ep, tgt, name=name, stages={"lowered": ep.graph_module.print_readable(print_output=False)},
                   info=info)


def _default_name(path: str) -> str:
    stem = "".join(c if c.isalnum() or c == "_" else "_" for c in Path(path).stem)
    return stem if stem and not stem[0].isdigit() else f"m_{stem}"


def _node_sources(model: TfliteModel, b: _Builder, ep) -> dict:
    """Program step node -> ``{"module": "conv_2d_3", "source": "file.tflite: operator 3 CONV_2D -> 'y'"}``
    (the steps of the built graph and of the exported program match in order)."""
    from corten.ops.registry import op_name_of

    def is_step(n):
        return n.op == "call_function" and (op_name_of(n.target) is not None or
                                            n.target == torch.ops.aten.reshape.default)

    built = dict(b.sources)
    a = [n for n in b.graph.nodes if is_step(n)]
    c = [n for n in ep.graph.nodes if is_step(n)]
    if len(a) != len(c):
        return {}
    out = {}
    fname = Path(model.path).name
    for x, y in zip(a, c):
        op = built.get(x)
        if op is None:
            continue
        outs = ", ".join(repr(model.tensors[i].name) for i in op.outputs)
        out[y.name] = {"module": f"{op.opcode.lower()}_{op.index}",
                       "source": f"{fname}: operator {op.index} {op.opcode} -> {outs}"}
    return out


def _refusal_message(model: TfliteModel, refused: list[tuple[Operator, str]]) -> str:
    lines = [f"{Path(model.path).name}: Corten cannot convert {len(refused)} operator(s):"]
    for op, why in refused[:20]:
        lines.append(f"  {model.where(op)}: {why}")
    if len(refused) > 20:
        lines.append(f"  ... and {len(refused) - 20} more")
    lines.append(f"Supported TFLite operators (int8): {', '.join(sorted(OPERATORS))}. Convert the others "
                 "outside the model, or export the model from PyTorch and compile the nn.Module.")
    return "\n".join(lines)


def compile_tflite(path, target: str = "cortex-m55", name: str | None = None, *, example_inputs=None,
                   calibration=None, max_arena: int | None = None, max_flash: int | None = None,
                   kernels: str = "cmsis-nn", precision="int8", seed: int = 0, observer: str = "histogram",
                   progress=False, allow_unlowered: bool = False):
    """``corten.compile("model.tflite", target=...)``: read and convert (see the module docstring), then
    fit ``max_arena`` / ``max_flash`` as :func:`corten.compile` does (a banded schedule when the arena
    is over budget).  The model keeps its own quantization: ``calibration`` and a ``precision`` other
    than int8 are refused; ``example_inputs``, when given, must have the program's input shapes
    (``[N, C, H, W]`` for a TFLite ``[N, H, W, C]`` input, as every Corten program takes them)."""
    from corten.errors import UsageError

    if calibration is not None:
        raise UsageError(f"{path}: calibration does not apply to a .tflite model: it keeps its own int8 "
                         "quantization (scales and zero points of every tensor)")
    if precision != "int8":
        raise UsageError(f"{path}: precision={precision!r} does not apply to a .tflite model: it keeps its own "
                         "quantization")
    prog = convert(read_tflite(path), target=target, name=name)
    if example_inputs is not None:
        xs = example_inputs if isinstance(example_inputs, (tuple, list)) else (example_inputs,)
        got = [tuple(x.shape) for x in xs]
        want = [spec.shape for spec in prog.inputs]
        if got != want:
            raise UsageError(f"{path}: example inputs of shapes {got} do not match the model's inputs {want} "
                             "(4-D inputs are [N, C, H, W] in Corten, NHWC bytes in C)")
    if max_arena is None and max_flash is None:
        return prog
    return prog.fit_budget(max_arena, max_flash, kernels)


def tflite_input(prog, q, index: int = 0) -> torch.Tensor:
    """The float input ``index`` of ``prog`` whose quantization is the int8 TFLite input ``q`` (numpy or
    tensor, TFLite's NHWC shape): ``(q - zero_point) * scale`` in the program's layout (quantizing it
    gives ``q`` back exactly)."""
    t = torch.as_tensor(np.asarray(q)).to(torch.float32)
    if t.dim() == 4:
        t = t.permute(0, 3, 1, 2)
    spec = prog.inputs[index]
    return ((t - spec.zero_point) * torch.tensor(spec.scale, dtype=torch.float32)).contiguous()


def tflite_output(t: torch.Tensor) -> np.ndarray:
    """A program's int8 output tensor (``run_int8`` / ``c_run``) in TFLite's layout (NHWC for 4-D)."""
    if t.dim() == 4:
        t = t.permute(0, 2, 3, 1)
    return t.contiguous().numpy()
