"""Helpers shared by several op families (they never import one another; they import this).

* byte layout: 4-D activations are NCHW tensors whose bytes are NHWC (``channels_last``), every
  other rank is row-major;
* the checks and int32 -> int8 output stage every convolution shares;
* 1-D ops lowered through their 2-D op on an ``[N, C, 1, L]`` view;
* the operands of elementwise binary ops (ranks, a constant or Python-number operand).

Like :mod:`corten.ops._rules` this module sits below the families: it imports no family module.
"""
from __future__ import annotations

import math
from typing import Sequence

import torch

from corten.errors import LoweringError
from corten.fixed_point import (
    REDUCED_SHIFT_MAX,
    clamp_activation,
    quantize_multiplier,
    reduce_multiplier_t,
    requantize,
    requantize_s64,
    wrap_int32_t,
)
from corten.ops import checks
from corten.ops._qparams import ADD_LEFT_SHIFT, ADD_LEFT_SHIFT_S16, QParams, add_params
from corten.ops._rules import DQ_PER_TENSOR, Int8Value, Match

MAX_RANK = 4  # elementwise ops: the C kernels loop over 4 dims
# Elementwise operands and outputs may have rank 5 when the broadcast collapses to MAX_RANK loops
# (adjacent dims that every operand walks contiguously merge into one; see collapse_loops).
MAX_ELEMENTWISE_RANK = 5

aten = torch.ops.aten

# Shape-only ATen ops, lowered by the shape family (to ``aten.reshape``) and recognised by others.
RESHAPES = (aten.flatten.using_ints, aten.view.default, aten.reshape.default, aten._unsafe_view.default,
            aten.squeeze.dim, aten.squeeze.dims, aten.squeeze.default, aten.unsqueeze.default,
            aten.squeeze_.dim, aten.squeeze_.dims, aten.squeeze_.default, aten.unsqueeze_.default,
            aten.unflatten.int, aten.atleast_1d.default, aten.atleast_2d.default, aten.atleast_3d.default,
            aten.ravel.default)


# ----------------------------------------------------------------------------- byte layout
def storage_dim_order(rank: int) -> tuple[int, ...]:
    """The logical dimension held at each storage (byte-order) position, outermost first:
    ``(0, 2, 3, 1)`` for a 4-D NCHW activation stored NHWC, ``(0, 1, ..., rank - 1)`` otherwise."""
    return (0, 2, 3, 1) if rank == 4 else tuple(range(rank))


def storage_shape(shape: Sequence[int]) -> list[int]:
    """Sizes of a tensor's storage dimensions, outermost first (NHWC for 4-D)."""
    return [int(shape[d]) for d in storage_dim_order(len(shape))]


def output_format(rank: int) -> torch.memory_format:
    """The memory format of a rank-``rank`` int8 activation: ``channels_last`` (NHWC) for 4-D."""
    return torch.channels_last if rank == 4 else torch.contiguous_format


def storage_strides(shape: Sequence[int], row_major: bool = False) -> list[int]:
    """Element stride of each logical dim of a tensor's C bytes (``row_major``: a constant array,
    which the emitter writes in logical order whatever its rank)."""
    strides, step = [0] * len(shape), 1
    for d in reversed(range(len(shape)) if row_major else storage_dim_order(len(shape))):
        strides[d] = step
        step *= int(shape[d])
    return strides


def broadcast_loops(out_shape: Sequence[int], in_shape: Sequence[int],
                    row_major: bool = False) -> tuple[list[int], list[int], list[int]]:
    """``(output dims, input dims, input strides)`` in the output's storage order, one value per
    output dim (unpadded): the input aligned on the right (numpy broadcasting), stride 0 and dim 1
    where it is broadcast."""
    out_shape, in_shape = [int(d) for d in out_shape], [int(d) for d in in_shape]
    in_strides = storage_strides(in_shape, row_major)
    lead = len(out_shape) - len(in_shape)
    dims, idims, strides = [], [], []
    for d in storage_dim_order(len(out_shape)):
        j = d - lead
        size = in_shape[j] if j >= 0 else 1
        dims.append(out_shape[d])
        idims.append(size)
        strides.append(in_strides[j] if size != 1 else 0)
    return dims, idims, strides


def collapse_loops(dims: Sequence[int], strides: Sequence[Sequence[int]]) -> tuple[list[int], list[list[int]]]:
    """The same walk over fewer loops: size-1 dims dropped, and an outer dim merged into the loop
    inside it when every operand steps over the inner loop's whole extent (``stride_outer ==
    stride_inner * dim_inner``, also 0 == 0 for an operand broadcast along both).  Returns
    ``(dims, strides per operand)``, at least one loop."""
    keep = [i for i, d in enumerate(dims) if int(d) != 1]
    out_dims: list[int] = []
    out_strides: list[list[int]] = [[] for _ in strides]
    for i in reversed(keep):
        d = int(dims[i])
        if out_dims and all(int(s[i]) == o[0] * out_dims[0] for s, o in zip(strides, out_strides)):
            out_dims[0] *= d
            continue
        out_dims.insert(0, d)
        for s, o in zip(strides, out_strides):
            o.insert(0, int(s[i]))
    if not out_dims:
        return [1], [[0] for _ in strides]
    return out_dims, out_strides


def broadcast_fits(out_shape: Sequence[int], operands: Sequence[tuple[Sequence[int], bool]]) -> bool:
    """True when the C kernels' 4 loops can walk ``operands`` (``(shape, row_major)`` each) broadcast
    to ``out_shape``: ranks 1 to 4, or rank 5 collapsing to 4 loops (:func:`collapse_loops`)."""
    ranks = [len(out_shape)] + [len(s) for s, _ in operands]
    if not all(1 <= r <= MAX_ELEMENTWISE_RANK for r in ranks):
        return False
    if len(out_shape) <= MAX_RANK:
        return True
    geo = [broadcast_loops(out_shape, s, rm) for s, rm in operands]
    dims, _ = collapse_loops(geo[0][0], [g[2] for g in geo])
    return len(dims) <= MAX_RANK


def layout_of(t: torch.Tensor) -> torch.memory_format:
    """The memory format ``t`` is in (an elementwise op's output keeps its input's)."""
    if t.dim() == 4 and t.is_contiguous(memory_format=torch.channels_last) and not t.is_contiguous():
        return torch.channels_last
    return torch.contiguous_format


# ----------------------------------------------------------------------------- convolutions
def pads4(padding) -> tuple[int, int, int, int]:
    """``[ph, pw]`` or ``[top, left, bottom, right]`` -> ``(top, left, bottom, right)``."""
    p = [int(v) for v in padding]
    if len(p) == 2:
        return p[0], p[1], p[0], p[1]
    return p[0], p[1], p[2], p[3]


def check_conv_common(op, input, weight, bias, stride, padding, dilation, input_offset, output_offset,
                      output_multiplier, output_shift, activation_min, activation_max, c_out,
                      asymmetric: bool = False, s16: bool = False):
    """The checks conv2d, depthwise, grouped and transposed convolutions share (names ``op``).
    ``asymmetric``: ``padding`` may also be ``[top, left, bottom, right]`` (conv2d and depthwise:
    the row bands of a banded schedule, see :mod:`corten.memory.banding`).  ``s16``: int16 inputs
    are the 16x8 variant (int64 bias, no offsets)."""
    # 16x8 (s16 kernels: conv2d and depthwise, ``s16=True``); every other convolution is int8 only
    wide = s16 and isinstance(input, torch.Tensor) and input.dtype == torch.int16
    checks.dtype(op, "input", input, torch.int16 if wide else torch.int8)
    checks.ndim(op, "input", input, 4)
    checks.dtype(op, "weight", weight, torch.int8)
    checks.ndim(op, "weight", weight, 4)
    if bias is not None:
        checks.dtype(op, "bias", bias, torch.int64 if wide else torch.int32)
        checks.shape(op, "bias", bias, (c_out,))
    checks.pair(op, "stride", stride, 1)
    if asymmetric and len(padding) == 4:
        if min(padding) < 0:
            checks.fail(op, "padding", f"values must be >= 0, got {list(padding)}")
    else:
        checks.pair(op, "padding", padding, 0)
    checks.pair(op, "dilation", dilation, 1)
    checks.multipliers(op, output_multiplier, output_shift, c_out)
    if wide:
        check_s16_stage(op, input_offset, output_offset, output_shift, activation_min, activation_max)
        return
    checks.input_offset(op, "input_offset", input_offset)
    checks.output_offset(op, "output_offset", output_offset)
    checks.activation(op, activation_min, activation_max)


def check_s16_stage(op, input_offset, output_offset, output_shift, activation_min, activation_max) -> None:
    """The output stage of a 16x8 kernel: no offsets (symmetric int16), int16 activation bounds,
    shifts <= 14 (``arm_nn_requantize_s64``)."""
    checks.in_range(op, "input_offset", input_offset, 0, 0)
    checks.in_range(op, "output_offset", output_offset, 0, 0)
    checks.activation(op, activation_min, activation_max, torch.int16)
    if checks._has_values(output_shift) and output_shift.numel():
        checks.in_range(op, "output_shift", int(output_shift.max()), -31, REDUCED_SHIFT_MAX)


def empty_nchw(n, c, h, w, device, dtype: torch.dtype = torch.int8):
    return torch.empty((n, c, h, w), dtype=dtype, device=device).contiguous(memory_format=torch.channels_last)


# Elements per block of the output stage: a block's int64 temporaries (~10 of them) stay in the
# L2 cache instead of streaming whole-layer tensors through memory once per arithmetic step.
FINISH_BLOCK_ELEMENTS = 1 << 17


def finish_accumulators(acc: torch.Tensor, bias, output_multiplier, output_shift, output_offset,
                        activation_min, activation_max, s16: bool = False) -> torch.Tensor:
    """int64 NHWC accumulators -> int8 NCHW (channels_last) output, block of rows by block.  ``s16``
    (16x8: int64 ``bias``): ``arm_nn_requantize_s64`` with the reduced multiplier, int16 output."""
    n, ho, wo, c = acc.shape
    rows = acc.reshape(n * ho * wo, c)
    wide = s16
    out = torch.empty((n, ho, wo, c), dtype=torch.int16 if wide else torch.int8)
    out_rows = out.view(n * ho * wo, c)
    mult, shift = output_multiplier.to(torch.int64), output_shift.to(torch.int64)
    bias = bias.to(torch.int64) if bias is not None else None
    step = max(1, FINISH_BLOCK_ELEMENTS // c)
    if wide:
        reduced = reduce_multiplier_t(mult)
        for r0 in range(0, rows.shape[0], step):
            block = rows[r0:r0 + step]
            block = requantize_s64(block + bias if bias is not None else block, reduced, shift)  # int64: no wrap
            out_rows[r0:r0 + step] = clamp_activation(block, activation_min, activation_max, torch.int16)
        return out.permute(0, 3, 1, 2)
    for r0 in range(0, rows.shape[0], step):
        block = rows[r0:r0 + step]
        if bias is not None:
            block = wrap_int32_t(block + bias)  # the C accumulator is int32 and wraps
        block = requantize(block, mult, shift)
        block = wrap_int32_t(block + output_offset)  # int32 addition in C: wraps before the clamp
        out_rows[r0:r0 + step] = clamp_activation(block, activation_min, activation_max)
    return out.permute(0, 3, 1, 2)


# The schema every convolution op shares; ``{geometry}`` is the op's own window arguments.
CONV_SCHEMA = ("(Tensor input, Tensor weight, Tensor? bias, {geometry}, SymInt input_offset, SymInt output_offset, "
               "Tensor output_multiplier, Tensor output_shift, SymInt activation_min, SymInt activation_max) -> Tensor")


# int4 weights (A8W4): ops that take them end their schema with this argument; 8 (the default, so
# an int8 graph never spells it) or 4: the weight tensor is int8 holding values in [-8, 7], written
# to C packed two per byte (CMSIS-NN's s4 layout).  The arithmetic is the int8 kernel's.
WEIGHT_BITS_ARG = "int weight_bits=8"
WEIGHT_BITS = (4, 8)


def check_weight_bits(op, input, weight, weight_bits) -> None:
    """``weight_bits`` is 4 or 8; int4 weights hold values in [-8, 7] and take int8 activations."""
    if weight_bits not in WEIGHT_BITS:
        checks.fail(op, "weight_bits", f"must be one of {WEIGHT_BITS}, got {weight_bits!r}")
    if weight_bits == 4:
        if isinstance(input, torch.Tensor) and input.dtype != torch.int8:
            checks.fail(op, "weight_bits", "int4 weights take int8 activations (A8W4); keep int16 layers int8")
        if checks._has_values(weight) and weight.numel() and (int(weight.min()) < -8 or int(weight.max()) > 7):
            checks.fail(op, "weight", f"int4 weights must lie in [-8, 7], got [{int(weight.min())}, "
                                      f"{int(weight.max())}]")


def conv_op(name: str, geometry: str, check, accumulate, channel_axis: int,
            weights: Sequence[torch.dtype] = (torch.int8,)):
    """Define ``corten::<name>``, a convolution: schema :data:`CONV_SCHEMA` with ``geometry`` (e.g.
    ``"SymInt[] stride, SymInt[] padding, SymInt[] dilation"``, plus ``groups``, ``depth_multiplier``
    or ``output_padding``), reference kernel and fake kernel.  Every convolution (conv2d, depthwise,
    grouped, transposed) shares this one definition:

    * ``check(input, weight, bias, *rest)`` validates all arguments (naming ``name``) and returns
      the output's ``(H, W)``;
    * ``accumulate(input, weight, *geometry, input_offset)`` gives the int64 NHWC accumulators
      without bias, which :func:`finish_accumulators` turns into the output (16x8 when the input is
      int16, which ``check`` allows only to the ops that have an s16 kernel);
    * the output has ``weight.shape[channel_axis]`` channels, NCHW shape, ``channels_last`` bytes;
    * ``weights``: the weight element types the op takes; with ``torch.int4`` among them the schema
      ends with :data:`WEIGHT_BITS_ARG` (int4 weights, the same arithmetic).
    """
    n_geometry = geometry.count(",") + 1
    n_args = n_geometry + 6

    def split(input, weight, args):
        bits = args[n_args] if len(args) > n_args else 8
        check_weight_bits(name, input, weight, bits)
        return args[:n_args]

    def kernel(input, weight, bias, *args):
        args = split(input, weight, args)
        check(input, weight, bias, *args)
        input_offset, output_offset, output_multiplier, output_shift, activation_min, activation_max = \
            args[n_geometry:]
        acc = accumulate(input, weight, *args[:n_geometry], input_offset)
        return finish_accumulators(acc.contiguous(), bias, output_multiplier, output_shift, output_offset,
                                   activation_min, activation_max, s16=input.dtype == torch.int16)

    kernel.__name__ = kernel.__qualname__ = name
    schema = CONV_SCHEMA.format(geometry=geometry)
    if torch.int4 in weights:
        schema = schema.replace(") -> Tensor", f", {WEIGHT_BITS_ARG}) -> Tensor")
    op = torch.library.custom_op(f"corten::{name}", kernel, mutates_args=(), schema=schema)

    @op.register_fake
    def _(input, weight, bias, *args):
        ho, wo = check(input, weight, bias, *split(input, weight, args))
        return empty_nchw(input.shape[0], weight.shape[channel_axis], ho, wo, input.device, input.dtype)

    return op


# ----------------------------------------------------------------------------- 1-D ops via 2-D
# A 1-D op on ``[N, C, L]`` runs as its 2-D op on the ``[N, C, 1, L]`` view.  The reshapes are not
# free in C (a 3-D tensor's bytes are NCL, the 4-D view's are NHWC = [N, 1, L, C]): the generator
# copies.  A chain of 1-D ops (conv1d -> max_pool1d -> conv1d ...) keeps the 4-D tensor: the
# reshape back to 3-D records its 4-D source, and the next 1-D op reads that source directly.
VIEW_4D_SOURCE = "corten_view_4d_source"  # on a 3-D reshape: the [N, C, 1, L] node it reshapes
VIEW_4D_SHAPE = "corten_view_4d_shape"  # on a 4-D node made by a 1-D lowering: its shape


def effective_multiplier(scale: float, what: str) -> tuple[int, int]:
    """``quantize_multiplier(scale)`` of a lowering; a scale it cannot represent refuses the op with
    ``"<what> cannot be requantized (<why>)"``."""
    try:
        return quantize_multiplier(scale)
    except ValueError as e:
        raise LoweringError(f"{what} cannot be requantized ({e})") from None


def portable_conv_block(ctx, fn: str, params: str, g: dict, filter_dims: Sequence[int], x: str | None = None,
                        out: str | None = None) -> str:
    """The C block calling one of Corten's portable convolution kernels (conv, depthwise, grouped,
    transposed): the kernel's ``params`` struct (declared by the caller), ``corten_quant``, the
    input / filter / output dims of the geometry ``g`` and ``fn(&params, &quant, &input_dims, x,
    &filter_dims, weight, bias, &output_dims, out)`` (``x`` / ``out``: ``g["x"]`` / ``g["out"]``
    unless given)."""
    per_channel = int(ctx.tensor("output_multiplier").numel() > 1)
    return ctx.block(
        params,
        ctx.params("corten_quant", "quant", dict(multiplier=ctx.const("output_multiplier"),
                                                 shift=ctx.const("output_shift"), per_channel=per_channel)),
        ctx.dims("input_dims", "corten_dims", g["n"], g["h"], g["w"], g["c_in"]),
        ctx.dims("filter_dims", "corten_dims", *filter_dims),
        ctx.dims("output_dims", "corten_dims", g["n"], g["ho"], g["wo"], g["c_out"]),
        ctx.call(fn, "&params", "&quant", "&input_dims", g["x"] if x is None else x, "&filter_dims", g["wname"],
                 ctx.const("bias"), "&output_dims", g["out"] if out is None else out))


def per_channel_const(ctx, arg: str, c_out: int) -> str:
    """CMSIS-NN conv kernels take one multiplier/shift per output channel: expand per-tensor ones."""
    t = ctx.tensor(arg)
    if t.numel() == c_out:
        return ctx.const(arg)
    return ctx.derived_const(f"{arg}_per_channel", t.expand(c_out).contiguous())


def cmsis_conv_structs(ctx, g: dict, mults: str, shifts: str, filter_dims: Sequence[int],
                       extra: Sequence[str] = ()) -> list[str]:
    """The structs of a CMSIS-NN convolution call after its context and params: the per-channel
    ``quant`` (``mults`` / ``shifts``: :func:`per_channel_const` arrays), ``extra`` and the input /
    filter / bias / output dims of the geometry ``g``."""
    c_out = g["c_out"]
    return [ctx.params("cmsis_nn_per_channel_quant_params", "quant",
                       dict(multiplier=f"(int32_t *){mults}", shift=f"(int32_t *){shifts}")),
            *extra,
            ctx.dims("input_dims", "cmsis_nn_dims", g["n"], g["h"], g["w"], g["c_in"]),
            ctx.dims("filter_dims", "cmsis_nn_dims", *filter_dims),
            ctx.dims("bias_dims", "cmsis_nn_dims", 1, 1, 1, c_out),
            ctx.dims("output_dims", "cmsis_nn_dims", g["n"], g["ho"], g["wo"], c_out)]


def fake_like(m: Match, shape, channels_last: bool):
    """A FakeTensor of ``shape`` (int8) for a node the rule creates, from the graph's fake mode."""
    val = m.out_q.meta.get("val")
    mode = getattr(val, "fake_mode", None)
    if mode is None:
        return None
    with mode:
        t = torch.empty(list(shape), dtype=torch.int8)
        return t.contiguous(memory_format=torch.channels_last) if channels_last else t


def as_4d_view(m: Match, x_node, shape3) -> torch.fx.Node:
    """``x_node`` (int8 ``[N, C, L]``) as ``[N, C, 1, L]``: the 4-D tensor it was made from when a
    1-D lowering produced it, else a new ``aten.reshape``."""
    n, c, length = (int(d) for d in shape3)
    shape4 = [n, c, 1, length]
    source = x_node.meta.get(VIEW_4D_SOURCE)
    if source is not None and list(source.meta.get(VIEW_4D_SHAPE, ())) == shape4:
        return source
    view = m.call_aten(torch.ops.aten.reshape.default, x_node, shape4)
    view.meta["val"] = fake_like(m, shape4, channels_last=False)
    view.meta[VIEW_4D_SHAPE] = shape4
    return view


def back_to_3d(m: Match, y4, shape4) -> torch.fx.Node:
    """The 4-D result ``y4`` of shape ``[N, C, 1, L]`` reshaped to the op's ``[N, C, L]`` output."""
    n, c, _, length = (int(d) for d in shape4)
    y4.meta["val"] = fake_like(m, shape4, channels_last=True)
    y4.meta[VIEW_4D_SHAPE] = list(shape4)
    out = m.call_aten(torch.ops.aten.reshape.default, y4, [n, c, length])
    out.meta[VIEW_4D_SOURCE] = y4
    return out


# ----------------------------------------------------------------------------- binary operands
def check_lowerable_shapes(m: Match, what: str) -> None:
    """Both operands int8 activations of rank <= 4 (broadcasting allowed)."""
    if len(m.inputs) != 2:
        raise LoweringError(f"{what} of a tensor and a constant or Python scalar is not supported: both operands "
                            "must be int8 activations (compute the constant part in the model, or fold it into "
                            "a neighbouring conv/linear)")
    check_ranks(m, what)


def _shape_of(node) -> tuple[int, ...]:
    val = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
    return tuple(int(d) for d in val.shape) if isinstance(val, torch.Tensor) else (1,)


def check_ranks(m: Match, what: str, constants: Sequence[torch.Tensor] = ()) -> None:
    """The activation operands (and ``constants``, row-major arrays) and the output have ranks 1 to
    4, or rank 5 with a broadcast that collapses to the C kernels' 4 loops."""
    out_shape = _shape_of(m.node)
    operands = [(_shape_of(v.node), False) for v in m.inputs] + [(tuple(c.shape), True) for c in constants]
    for shape in [out_shape] + [s for s, _ in operands]:
        if not 1 <= len(shape) <= MAX_ELEMENTWISE_RANK:
            raise LoweringError(f"{what} of rank-{len(shape)} tensors is not supported (ranks 1 to "
                                f"{MAX_ELEMENTWISE_RANK})")
    if not broadcast_fits(out_shape, operands):
        shapes = " and ".join(str(list(s)) for s, _ in operands)
        raise LoweringError(f"{what} of rank-5 tensors {shapes} broadcasts over more than {MAX_RANK} separate loops "
                            "(the C kernels walk 4): reshape so that broadcast dims are adjacent, or use rank 4")


def constant_operand(m: Match, x) -> tuple[torch.Tensor, QParams]:
    """The constant operand of ``x * c`` (or ``x - c``, ``c - x``) as an int8 tensor and its qparams.

    * a Python number ``k``: the one-element tensor ``[sign(k)]`` with scale ``|k|`` and zero
      point 0, so that ``|k|`` folds into the requantization (``s_x * |k| / s_out``) exactly;
    * a constant tensor the quantizer quantized (``dequantize(int8 constant)``): its int8 values
      and per-tensor qparams; it is read in place of an activation, broadcast like one."""
    others = [a for a in m.node.args[:2]
              if not (isinstance(a, torch.fx.Node) and a.target in DQ_PER_TENSOR and a.args[0] is x.node)]
    what = m.node.target.__name__.split(".")[0]
    if len(others) != 1:
        raise LoweringError(f"{what}: expected one int8 activation operand and one constant")
    c = others[0]
    if isinstance(c, (int, float)) and not isinstance(c, bool):
        if not math.isfinite(c):
            raise LoweringError(f"{what} with {c!r}: the constant must be finite")
        return torch.tensor([-1 if c < 0 else 1], dtype=torch.int8), QParams(abs(float(c)), 0)
    if isinstance(c, torch.fx.Node) and c.target in DQ_PER_TENSOR and c.args[0].op == "get_attr":
        values = m.constant(c.args[0])
        scale, zero_point = c.args[1], c.args[2]
        if values.dtype != torch.int8 or not isinstance(scale, float) or not isinstance(zero_point, int):
            raise LoweringError(f"{what}: the constant operand is not an int8 per-tensor quantized constant")
        if values.dim() == 0:  # torch.tensor(0.5): one element, broadcast like a Python number
            values = values.reshape(1)
        if not 1 <= values.dim() <= MAX_ELEMENTWISE_RANK:
            raise LoweringError(f"{what}: a rank-{values.dim()} constant operand is not supported "
                                f"(ranks 1 to {MAX_ELEMENTWISE_RANK})")
        check_ranks(m, what, constants=[values])
        return values, QParams(float(scale), int(zero_point))
    raise LoweringError(f"{what} of a tensor and an unquantized constant is not supported: both operands must be "
                        "int8 activations, quantized constants (CortenQuantizer) or a Python number")


def is_activation_operand(arg, x: Int8Value) -> bool:
    """True when the ATen argument ``arg`` reads the int8 activation ``x`` (through its dequantize)."""
    return isinstance(arg, torch.fx.Node) and arg.target in DQ_PER_TENSOR and arg.args[0] is x.node


# ----------------------------------------------------------------------------- add-style ops
# The scalar parameters of quantized_add / quantized_sub, in schema order (``arm_elementwise_add_s8``
# convention), and their one op schema: ``(input1, input2, *RESCALED_BINARY_PARAMS) -> Tensor``.
RESCALED_BINARY_PARAMS = ("input1_offset", "input1_multiplier", "input1_shift", "input2_offset", "input2_multiplier",
                          "input2_shift", "left_shift", "output_offset", "output_multiplier", "output_shift",
                          "activation_min", "activation_max")
RESCALED_BINARY_SCHEMA = ("(Tensor input1, Tensor input2, " + ", ".join(f"SymInt {p}" for p in RESCALED_BINARY_PARAMS)
                          + ") -> Tensor")


def rescaled_binary(input1: torch.Tensor, input2: torch.Tensor, params, negate_input2: bool) -> torch.Tensor:
    """``arm_elementwise_add_s8``'s arithmetic, per element in int32 exactly as the C kernels (numpy
    broadcasting between the inputs); ``negate_input2``: input2's multiplier negated (TFLite's SUB)::

        a = requantize((x1 + input1_offset) << left_shift, input1_multiplier, input1_shift)
        b = requantize((x2 + input2_offset) << left_shift, +-input2_multiplier, input2_shift)
        y = clamp(requantize(a + b, output_multiplier, output_shift) + output_offset, act_min, act_max)
    """
    (in1_offset, in1_multiplier, in1_shift, in2_offset, in2_multiplier, in2_shift, left_shift, out_offset,
     out_multiplier, out_shift, act_min, act_max) = params
    a = requantize((input1.to(torch.int64) + in1_offset) << left_shift, in1_multiplier, in1_shift)
    b = requantize((input2.to(torch.int64) + in2_offset) << left_shift,
                   -in2_multiplier if negate_input2 else in2_multiplier, in2_shift)
    out = wrap_int32_t(requantize(wrap_int32_t(a + b), out_multiplier, out_shift) + out_offset)
    return clamp_activation(out, act_min, act_max)
def binary_operands(m: Match, what: str) -> tuple[Int8Value, Int8Value]:
    """The two int8 operands of a binary elementwise op in argument order: two activations
    (broadcasting), or an activation and a constant - a Python number or a quantized constant tensor,
    which becomes an int8 constant operand (:func:`constant_operand`)."""
    if len(m.inputs) == 1:
        check_ranks(m, what)
        x = m.inputs[0]
        values, qparams = constant_operand(m, x)
        const = Int8Value(m.add_constant(values, "operand"), qparams)
        return (x, const) if is_activation_operand(m.node.args[0], x) else (const, x)
    check_lowerable_shapes(m, what)
    return m.inputs[0], m.inputs[1]


def lower_rescaled_binary(m: Match, what: str, op: str, alpha_hint: str = ""):
    """The lowering of ``aten.add``/``aten.sub`` (alpha 1): both operands rescaled to a common
    scale (:func:`corten.ops._qparams.add_params`), then ``op`` (``quantized_add``/``_sub``)."""
    if m.node.kwargs.get("alpha", 1) != 1:
        raise LoweringError(f"{what} with alpha != 1 is not supported{alpha_hint}")
    a, b = binary_operands(m, what)
    wide = m.output.dtype == torch.int16  # 16x8 (the quantizer gives int16 only to adds of two activations)
    if wide and not (a.qparams.dtype == b.qparams.dtype == torch.int16):
        raise LoweringError(f"an int16 {what} needs two int16 operands (a constant operand or an int8 one: keep "
                            "the op int8 with precision=)")
    try:
        p = add_params(a.qparams.scale, b.qparams.scale, m.output.scale,
                       ADD_LEFT_SHIFT_S16 if wide else ADD_LEFT_SHIFT)
    except ValueError as e:
        raise LoweringError(f"{what}: the input/output scales cannot be requantized ({e})") from None
    act_min, act_max = m.activation_bounds
    return m.call(op, a.node, b.node, a.qparams.offset, p.input1_multiplier, p.input1_shift,
                  b.qparams.offset, p.input2_multiplier, p.input2_shift, p.left_shift, m.output.zero_point,
                  p.output_multiplier, p.output_shift, act_min, act_max)


# ----------------------------------------------------------------------------- pooling windows
def optional_arg(ctx, name: str, default):
    """Argument ``name`` of a node (an emission context or ``NodeView``), ``default`` when the op
    has no such argument (an older program) or it is None."""
    try:
        v = ctx.arg(name)
    except Exception:  # noqa: BLE001  (an older program without the argument)
        return default
    return default if v is None else v


def pool_window(ctx) -> dict:
    """The window arguments of a strided pool node (an emission context or ``NodeView``: the
    providers' view, the generated kernels' too)."""
    is_avg = ctx.op_name == "quantized_avg_pool2d"
    n, h, w, c = ctx.nhwc(ctx.arg("input"))
    _, ho, wo, _ = ctx.nhwc()
    return dict(is_avg=is_avg, n=n, h=h, w=w, c=c, ho=ho, wo=wo, kernel=ctx.arg("kernel_size"),
                stride=ctx.arg("stride"), padding=ctx.arg("padding"),
                act_min=int(ctx.arg("activation_min")), act_max=int(ctx.arg("activation_max")),
                ceil_mode=bool(optional_arg(ctx, "ceil_mode", False)),
                include_pad=bool(optional_arg(ctx, "count_include_pad", False)) if is_avg else False,
                divisor=int(optional_arg(ctx, "divisor_override", 0)) if is_avg else 0,
                dilation=[1, 1] if is_avg else [int(v) for v in (optional_arg(ctx, "dilation", None) or [1, 1])])
