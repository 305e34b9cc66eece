"""``quantized_linear``: CMSIS-NN's ``arm_fully_connected_s8`` / ``_per_channel_s8``.

Weights are ``[out_features, in_features]`` int8 (row-major, as CMSIS-NN reads them).  There is
no bias argument: the compiler folds it into ``kernel_sum``, computed ahead of time exactly as
CMSIS-NN's ``arm_vector_sum_s8`` fills the context buffer of the Helium path::

    kernel_sum[o] = bias[o] + input_offset * sum_k weight[o, k]      (weight offset 0)

so that ``acc[o] = kernel_sum[o] + sum_k x[k] * weight[o, k]`` equals
``bias[o] + sum_k (x[k] + input_offset) * weight[o, k]``.  The op holds no state and does no
first-inference work.  ``output_multiplier``/``output_shift`` have one entry (per-tensor weights)
or one per output feature (per-channel weights).

16x8 (TFLite's int16 activations, ``arm_fully_connected_s16``): an int16 input (zero point 0) gives
an int16 output; ``kernel_sum`` is then the int64 bias (input offset 0), the accumulator is int64
and the requantization is ``arm_nn_requantize_s64`` with CMSIS-NN's reduced (Q15) multiplier.
"""
from __future__ import annotations

import torch

from corten.errors import LoweringError
from corten.fx_nodes import node_arg
from corten.fixed_point import (REDUCED_SHIFT_MAX, clamp_activation, reduce_multiplier_t, requantize, requantize_s64,
                                wrap_int32_t)
from corten.ops import checks
from corten.ops._common import check_weight_bits
from corten.ops._qparams import per_channel_multipliers
from corten.ops._rules import Match
from corten.ops.registry import (A8W4, A8W8, A16W8, Cost, Hook, OpFamily, annotates, lowers, node_shape,
                                 register_family, weighted_cost)
from corten.providers import CMSIS_NN, PORTABLE, NodeView, kernel_suffix, weight_dtype

FAMILY = "linear"


def kernel_sum(weight: torch.Tensor, bias: torch.Tensor | None, input_offset: int) -> torch.Tensor:
    """``arm_vector_sum_s8`` with ``rhs_offset = 0``: int32 ``bias + input_offset * rowsum(weight)``."""
    s = weight.to(torch.int64).sum(dim=1) * input_offset
    if bias is not None:
        s = s + bias.to(torch.int64)
    return s.to(torch.int32)


def _check(input, weight, kernel_sum, input_offset, output_offset, output_multiplier, output_shift,
           activation_min, activation_max):
    op = "quantized_linear"
    wide = isinstance(input, torch.Tensor) and input.dtype == torch.int16
    checks.dtype(op, "input", input, torch.int16 if wide else torch.int8)
    checks.dtype(op, "weight", weight, torch.int8)
    checks.ndim(op, "weight", weight, 2)
    if input.dim() < 1 or input.shape[-1] != weight.shape[1]:
        checks.fail(op, "input", f"last dimension of shape {tuple(input.shape)} must equal in_features {weight.shape[1]}")
    checks.dtype(op, "kernel_sum", kernel_sum, torch.int64 if wide else torch.int32)
    checks.shape(op, "kernel_sum", kernel_sum, (weight.shape[0],))
    checks.multipliers(op, output_multiplier, output_shift, weight.shape[0])
    if wide:  # 16x8: symmetric, the reduced-multiplier requantization shifts by 14 - shift
        checks.in_range(op, "input_offset", input_offset, 0, 0)
        checks.in_range(op, "output_offset", output_offset, 0, 0)
        checks.activation(op, activation_min, activation_max, torch.int16)
        if checks._has_values(output_shift) and output_shift.numel():
            checks.in_range(op, "output_shift", int(output_shift.max()), -31, REDUCED_SHIFT_MAX)
        return
    checks.input_offset(op, "input_offset", input_offset)
    checks.output_offset(op, "output_offset", output_offset)
    checks.activation(op, activation_min, activation_max)


@torch.library.custom_op("corten::quantized_linear", mutates_args=())
def quantized_linear(
    input: torch.Tensor,
    weight: torch.Tensor,
    kernel_sum: torch.Tensor,
    input_offset: int,
    output_offset: int,
    output_multiplier: torch.Tensor,
    output_shift: torch.Tensor,
    activation_min: int,
    activation_max: int,
    single_rounding: bool = False,
    weight_bits: int = 8,
) -> torch.Tensor:
    """``single_rounding``: requantize with one rounding (``(acc * m + 2**(30 - shift)) >> (31 - shift)``,
    TFLite's reference FULLY_CONNECTED as LiteRT runs it) instead of CMSIS-NN's default two (int8 only;
    the C library then uses the portable kernel in both flavours).  ``weight_bits=4``: int4 weights
    (values in [-8, 7], packed two per byte in C; ``arm_fully_connected_s4``), the same arithmetic."""
    _check(input, weight, kernel_sum, input_offset, output_offset, output_multiplier, output_shift,
           activation_min, activation_max)
    check_weight_bits("quantized_linear", input, weight, weight_bits)
    if single_rounding and input.dtype != torch.int8:
        checks.fail("quantized_linear", "single_rounding", "applies to int8 inputs only")
    if input.dtype == torch.int16:
        # Exact in float64: |x * w| <= 2**22 and in_features < 2**31 keep all partial sums < 2**53.
        dots = (input.to(torch.float64) @ weight.to(torch.float64).T).to(torch.int64)
        acc = dots + kernel_sum  # int64 in CMSIS-NN (int32 over the first 512 columns: exact, |sum| < 2**31)
        out = requantize_s64(acc, reduce_multiplier_t(output_multiplier), output_shift.to(torch.int64))
        return clamp_activation(out, activation_min, activation_max, torch.int16)
    # Exact in float64: |x * w| <= 2**14 and in_features < 2**39 keep all partial sums < 2**53.
    dots = (input.to(torch.float64) @ weight.to(torch.float64).T).to(torch.int64)
    acc = wrap_int32_t(dots + kernel_sum.to(torch.int64))  # the C accumulator is int32 and wraps
    out = requantize(acc, output_multiplier.to(torch.int64), output_shift.to(torch.int64),
                     single_rounding=bool(single_rounding))
    out = wrap_int32_t(out + output_offset)  # int32 addition in C: wraps before the clamp
    return clamp_activation(out, activation_min, activation_max)


@quantized_linear.register_fake
def _(input, weight, kernel_sum, input_offset, output_offset, output_multiplier, output_shift,
      activation_min, activation_max, single_rounding=False, weight_bits=8):
    _check(input, weight, kernel_sum, input_offset, output_offset, output_multiplier, output_shift,
           activation_min, activation_max)
    check_weight_bits("quantized_linear", input, weight, weight_bits)
    return input.new_empty((*input.shape[:-1], weight.shape[0]))  # (int16 in, int16 out)


family = register_family(OpFamily(FAMILY, ("quantized_linear",), doc=__doc__))


@family.provides(Hook.ACCUMULATOR_TAPS)
def _taps(node) -> int:
    """``[out, in]`` weight: ``in`` products per output."""
    return node_shape(node_arg(node, "weight"))[-1]


@family.provides(Hook.COST)
def _cost(node) -> Cost:
    return weighted_cost(node, _taps(node))


# ----------------------------------------------------------------------------- lowering

annotates("weighted", torch.ops.aten.linear.default)


@lowers(torch.ops.aten.linear.default, formats=(A8W8, A16W8, A8W4))
def lower_linear(m: Match):
    """``aten.linear`` (kept whole by export: no addmm/permute) -> ``quantized_linear``."""
    x = m.inputs[0]
    shape = tuple(int(d) for d in x.node.meta["val"].shape)
    if len(shape) == 4 and not (shape[1] == 1 or shape[2] * shape[3] == 1):
        # (the same rule as corten.memory.views.storage_is_logical; the C emission checks it too)
        raise LoweringError(f"linear over the last dim of a 4-D tensor {list(shape)}: 4-D activations are "
                            "channels-last (NHWC) in C, so the features are not contiguous; reshape to 3-D "
                            "(x.flatten(1, 2)) or permute to put the features last first")
    weight, w_scales, axis = m.quantized_constant(m.node.args[1])
    if axis not in (None, 0):
        raise LoweringError(f"weights quantized along axis {axis}; expected per-output-feature (axis 0)")
    bias_arg = m.node.args[2] if len(m.node.args) > 2 else m.node.kwargs.get("bias")
    mult, shift = per_channel_multipliers(x.qparams.scale, w_scales, m.output.scale)
    weight = weight.to(torch.int8).contiguous()
    if x.qparams.dtype == torch.int16 or m.output.dtype == torch.int16:
        if x.qparams.dtype != m.output.dtype:
            raise LoweringError("a linear layer reads and writes one activation width (int8 or int16)")
        bias = m.bias_int64(bias_arg, x.qparams.scale, w_scales, weight.shape[0])
        act_min, act_max = m.activation_bounds
        return m.call("quantized_linear", x.node, m.add_constant(weight, "weight"), m.add_constant(bias, "kernel_sum"),
                      0, 0, m.add_constant(mult, "multiplier"), m.add_constant(m.reduced_shift(shift), "shift"),
                      act_min, act_max)
    bias = m.bias_int32(bias_arg, x.qparams.scale, w_scales)
    ksum = kernel_sum(weight, bias, x.qparams.offset)
    act_min, act_max = m.activation_bounds
    bits = (False, 4) if m.weight_bits(m.node.args[1]) == 4 else ()  # (single_rounding, weight_bits): A8W4
    return m.call("quantized_linear", x.node, m.add_constant(weight, "weight"), m.add_constant(ksum, "kernel_sum"),
                  x.qparams.offset, m.output.zero_point, m.add_constant(mult, "multiplier"),
                  m.add_constant(shift, "shift"), act_min, act_max, *bits)


# ----------------------------------------------------------------------------- scratch memory
def cmsis_fully_connected_buffer_bytes(isa: str, out_features: int) -> int:
    """``arm_fully_connected_s8_get_buffer_size``: the int32 kernel-sum vector the Helium kernel
    reads through ``ctx.buf`` (MVE), nothing on plain/DSP cores."""
    if isa not in ("plain", "dsp", "mve"):
        raise ValueError(f"isa must be 'plain', 'dsp' or 'mve', got {isa!r}")
    return 4 * out_features if isa == "mve" else 0


def cmsis_fully_connected_s16_buffer_bytes(isa: str, out_features: int) -> int:
    """``arm_fully_connected_s16_get_buffer_size``: 0 on every ISA (the kernel ignores ``ctx``)."""
    return 0


# No arena scratch on any ISA: the only buffer CMSIS-NN asks for (:func:`cmsis_fully_connected_buffer_bytes`,
# MVE) is the kernel-sum vector, which Corten precomputes as the constant ``kernel_sum`` argument;
# the C code points ``ctx.buf`` at that flash array (counted in the plan's constant bytes) instead
# of filling RAM at run time.


# ----------------------------------------------------------------------------- kernels
def _operands(ctx) -> dict:
    """Sizes and C operands of a linear node (both providers' view)."""
    shape = ctx.shape(ctx.arg("input"))
    weight = ctx.tensor("weight")
    out_f, in_f = int(weight.shape[0]), int(weight.shape[1])
    batches = 1
    for d in shape[:-1]:
        batches *= int(d)
    val = ctx.arg("input").meta["val"]
    if val.dim() == 4 and not val.is_contiguous():
        ctx.fail("the input is a channels-last 4-D tensor; a linear layer needs its features contiguous "
                 "(flatten the input first)")
    mult_t, shift_t = ctx.tensor("output_multiplier"), ctx.tensor("output_shift")
    g = dict(batches=batches, in_f=in_f, out_f=out_f, out_off=int(ctx.arg("output_offset")),
             act_min=int(ctx.arg("activation_min")), act_max=int(ctx.arg("activation_max")), mult_t=mult_t,
             shift_t=shift_t, per_channel=mult_t.numel() > 1, x=ctx.typed_input("input"), out=ctx.typed_out())
    g["int4"] = weight_dtype(ctx.node) == torch.int4  # (A8W4: the weights written packed two per byte)
    g["suffix"] = kernel_suffix(torch.int4 if g["int4"] else val.dtype)  # the kernels' element type: s8, s16, s4
    g.update(w=ctx.const("weight", bits=4 if g["int4"] else 0), ks=ctx.const("kernel_sum"))
    return g


@PORTABLE.kernel("quantized_linear")
def _linear_portable(ctx) -> str:
    """One ``corten_linear_s8`` call (``corten_linear_s16`` on int16 activations, int64 bias;
    ``corten_linear_s4`` on int4 weights)."""
    g = _operands(ctx)
    s16 = g["suffix"] == "s16"
    quant = dict(multiplier=ctx.const("output_multiplier"), shift=ctx.const("output_shift"),
                 per_channel=int(g["per_channel"]))
    if not s16 and bool(ctx.arg("single_rounding")):  # TFLite's reference FULLY_CONNECTED rounds once
        quant["single_rounding"] = 1
    return ctx.block(
        ctx.params("corten_linear_params", "params",
                   dict(output_offset=0 if s16 else g["out_off"], activation_min=g["act_min"],
                        activation_max=g["act_max"])),
        ctx.params("corten_quant", "quant", quant),
        ctx.call(f"corten_linear_{g['suffix']}", "&params", "&quant", g["batches"], g["in_f"], g["out_f"], g["x"],
                 g["w"], g["ks"], g["out"]))


def _cmsis_supports(node, target) -> str | None:
    if bool(NodeView(node, target).arg("single_rounding")):
        return ("CMSIS-NN's fully connected layer rounds twice (arm_nn_requantize); this layer rounds once, as "
                "TFLite's reference FULLY_CONNECTED does")
    return None


@CMSIS_NN.kernel("quantized_linear", act=(torch.int8,), weight=(torch.int8,), supports=_cmsis_supports)
def _linear_cmsis(ctx) -> str:
    """``arm_fully_connected[_per_channel]_s8``.

    CMSIS-NN computes ``kernel_sum[o] + sum x*w`` on Helium (kernel sums read from ``ctx.buf``,
    bias and input offset ignored) but ``bias[o] + sum (x + input_offset) * w`` on the other ISAs.
    Passing the precomputed kernel sums as *both* ``ctx.buf`` and the bias, with input offset 0,
    makes every ISA compute the same accumulator.
    """
    g = _operands(ctx)
    batches, in_f, out_f, ks = g["batches"], g["in_f"], g["out_f"], g["ks"]
    if g["per_channel"]:
        quant = ctx.params("cmsis_nn_per_channel_quant_params", "quant",
                           dict(multiplier=f"(int32_t *){ctx.const('output_multiplier')}",
                                shift=f"(int32_t *){ctx.const('output_shift')}"))
        fn = "arm_fully_connected_per_channel_s8"
    else:
        quant = ctx.params("cmsis_nn_per_tensor_quant_params", "quant",
                           dict(multiplier=int(g["mult_t"][0]), shift=int(g["shift_t"][0])))
        fn = "arm_fully_connected_s8"
    return ctx.block(
        ctx.params("cmsis_nn_context", "nn_ctx", dict(buf=f"(void *){ks}", size=4 * out_f)),
        ctx.params("cmsis_nn_fc_params", "params", dict(input_offset=0, filter_offset=0, output_offset=g["out_off"],
                                                        activation=dict(min=g["act_min"], max=g["act_max"]))),
        quant,
        ctx.dims("input_dims", "cmsis_nn_dims", batches, 1, 1, in_f),
        ctx.dims("filter_dims", "cmsis_nn_dims", in_f, 1, 1, out_f),
        ctx.dims("bias_dims", "cmsis_nn_dims", 1, 1, 1, out_f),
        ctx.dims("output_dims", "cmsis_nn_dims", batches, 1, 1, out_f),
        ctx.call(fn, "&nn_ctx", "&params", "&quant", "&input_dims", g["x"], "&filter_dims", g["w"], "&bias_dims", ks,
                 "&output_dims", g["out"]))


def _cmsis_s4_supports(node, target) -> str | None:
    view = NodeView(node, target)
    reason = _cmsis_supports(node, target)
    if reason is None and node_shape(view.arg("output_multiplier"))[0] > 1 and node_shape(view.arg("weight"))[1] % 2:
        reason = ("CMSIS-NN's s4 fully connected layer is per-tensor: per-channel weights run one call per output "
                  "feature, whose packed int4 row starts mid-byte when in_features is odd")
    return reason


@CMSIS_NN.kernel("quantized_linear", act=(torch.int8,), weight=(torch.int4,), supports=_cmsis_s4_supports)
@CMSIS_NN.kernel("quantized_linear", act=(torch.int16,))
def _linear_cmsis_per_tensor(ctx) -> str:
    """``arm_fully_connected_s16`` (int16 activations) / ``arm_fully_connected_s4`` (int4 weights).
    Both have per-tensor quantization only: per-channel weights are one call per output feature
    (``output_dims.c = 1``, that feature's multiplier, shift, weight row and bias) and batch row.
    s4: the row is ``in_features / 2`` packed bytes (in_features even, see :func:`_cmsis_s4_supports`);
    the kernel sums are the bias with input offset 0 (see :func:`_linear_cmsis`).  s16: the int64 bias."""
    g = _operands(ctx)
    batches, in_f, out_f, per_channel = g["batches"], g["in_f"], g["out_f"], g["per_channel"]
    x, out, w, bias = g["x"], g["out"], g["w"], g["ks"]
    s4 = g["int4"]
    fn = f"arm_fully_connected_{g['suffix']}"
    row, out_off = (in_f // 2, g["out_off"]) if s4 else (in_f, 0)
    mult, shift = ctx.const("output_multiplier"), ctx.const("output_shift")
    common = [
        ctx.params("cmsis_nn_context", "nn_ctx", dict(buf="NULL", size=0)),
        ctx.params("cmsis_nn_fc_params", "params", dict(input_offset=0, filter_offset=0, output_offset=out_off,
                                                        activation=dict(min=g["act_min"], max=g["act_max"]))),
        ctx.dims("filter_dims", "cmsis_nn_dims", in_f, 1, 1, 1 if per_channel else out_f),
        ctx.dims("bias_dims", "cmsis_nn_dims", 1, 1, 1, 1 if per_channel else out_f),
    ]
    if not per_channel:
        return ctx.block(*common,
                         ctx.params("cmsis_nn_per_tensor_quant_params", "quant", dict(multiplier=f"{mult}[0]",
                                                                                      shift=f"{shift}[0]")),
                         ctx.dims("input_dims", "cmsis_nn_dims", batches, 1, 1, in_f),
                         ctx.dims("output_dims", "cmsis_nn_dims", batches, 1, 1, out_f),
                         ctx.call(fn, "&nn_ctx", "&params", "&quant", "&input_dims", x,
                                  "&filter_dims", w, "&bias_dims", bias, "&output_dims", out))
    dims = [ctx.dims("input_dims", "cmsis_nn_dims", 1, 1, 1, in_f), ctx.dims("output_dims", "cmsis_nn_dims", 1, 1, 1, 1)]
    loop = ("int32_t b, o;\n"
            f"for (b = 0; b < {batches}; b++) {{\n"
            f"    for (o = 0; o < {out_f}; o++) {{\n"
            f"        const cmsis_nn_per_tensor_quant_params quant = {{.multiplier = {mult}[o], .shift = {shift}[o]}};\n"
            "        " + ctx.call(fn, "&nn_ctx", "&params", "&quant", "&input_dims",
                                  f"{x} + (ptrdiff_t)b * {in_f}", "&filter_dims", f"{w} + (ptrdiff_t)o * {row}",
                                  "&bias_dims", f"{bias} + o", "&output_dims", f"{out} + (ptrdiff_t)b * {out_f} + o"
                                  ).replace("\n", "\n        ") + "\n"
            "    }\n}")
    return ctx.block(*common, *dims, loop)
