"""Comparisons and selection: ``quantized_compare`` (eq, ne, lt, le, gt, ge) and ``quantized_where``.

**How a comparison result is represented**: a ``torch.bool`` tensor - one byte per element, 0 or 1,
in the same storage order as an int8 activation (NHWC for 4-D) - read by a ``quantized_where`` or
returned by the program as it is (never dequantized: a ``uint8_t`` output of 0s and 1s in C, the
header's ``<NAME>_OUTPUT<i>_BOOL`` macro marks it; ``run``/``run_c`` give a ``torch.bool`` tensor).  ``mode``: 0 eq, 1 ne, 2 lt,
3 le, 4 gt, 5 ge, comparing the int8 values ``input1 OP input2`` with numpy broadcasting.

* tensor OP tensor: the quantizer puts both operands on one grid (shared qparams, as TFLite's
  comparisons require for an exact result), so comparing the int8 values compares the real values;
* tensor OP number ``c``: exact on ``x``'s grid - ``x_real OP c`` iff ``q OP' t`` with the integer
  threshold ``t`` from ``r = zero_point + c / scale`` (``gt``: ``q > floor(r)``, ``ge``: ``q >= ceil(r)``,
  ``lt``: ``q < ceil(r)``, ``le``: ``q <= floor(r)``, ``eq``/``ne``: ``q == r`` only for an integer
  ``r``); thresholds outside int8 become always-true / always-false comparisons.

``quantized_where(condition, input1, input2)`` selects int8 bytes (``condition ? input1 : input2``,
numpy broadcasting of the three): ``torch.where`` shares one grid between its two value operands and
its output, so selection is exact; a Python number operand is quantized on that grid.
``clamp(x, min=t1, max=t2)`` with tensor bounds is ``minimum(maximum(x, t1), t2)`` on the shared grid.
C: ``corten_compare_s8`` / ``corten_where_s8`` (portable; CMSIS-NN has neither).
"""
from __future__ import annotations

import math
from fractions import Fraction

import torch

from corten.errors import LoweringError
from corten.ops import checks
from corten.ops._broadcast import broadcast_shape, broadcast_struct, operand_expr, operands_geometry, output_layout
from corten.ops._common import MAX_ELEMENTWISE_RANK, binary_operands, broadcast_fits, check_ranks, \
    is_activation_operand
from corten.ops._qparams import quantize_value
from corten.ops._rules import Match
from corten.ops.registry import OpFamily, annotates, lowers, register_family
from corten.providers import CMSIS_NN, PORTABLE

FAMILY = "compare"
MODES = ("eq", "ne", "lt", "le", "gt", "ge")
_FNS = (torch.eq, torch.ne, torch.lt, torch.le, torch.gt, torch.ge)


def _check_compare(input1, input2, mode):
    op = "quantized_compare"
    checks.dtype(op, "input1", input1, torch.int8)
    checks.dtype(op, "input2", input2, torch.int8)
    checks.in_range(op, "mode", mode, 0, 5)
    return broadcast_shape(op, input1, input2)


@torch.library.custom_op("corten::quantized_compare", mutates_args=())
def quantized_compare(input1: torch.Tensor, input2: torch.Tensor, mode: int) -> torch.Tensor:
    shape = _check_compare(input1, input2, mode)
    return _FNS[mode](input1, input2).contiguous(memory_format=output_layout(shape))


@quantized_compare.register_fake
def _(input1, input2, mode):
    shape = _check_compare(input1, input2, mode)
    return torch.empty(shape, dtype=torch.bool, device=input1.device, memory_format=output_layout(shape))


def _check_where(condition, input1, input2):
    op = "quantized_where"
    checks.dtype(op, "condition", condition, torch.bool)
    checks.dtype(op, "input1", input1, torch.int8)
    checks.dtype(op, "input2", input2, torch.int8)
    for name, t in (("condition", condition), ("input1", input1), ("input2", input2)):
        if not 1 <= t.dim() <= MAX_ELEMENTWISE_RANK:
            checks.fail(op, name, f"rank {t.dim()} is not 1 to {MAX_ELEMENTWISE_RANK}")
    try:
        return tuple(int(d) for d in torch.broadcast_shapes(condition.shape, input1.shape, input2.shape))
    except RuntimeError:
        checks.fail(op, "condition", f"shapes {tuple(condition.shape)}, {tuple(input1.shape)}, "
                                     f"{tuple(input2.shape)} do not broadcast")


@torch.library.custom_op("corten::quantized_where", mutates_args=())
def quantized_where(condition: torch.Tensor, input1: torch.Tensor, input2: torch.Tensor) -> torch.Tensor:
    shape = _check_where(condition, input1, input2)
    return torch.where(condition, input1, input2).contiguous(memory_format=output_layout(shape))


@quantized_where.register_fake
def _(condition, input1, input2):
    shape = _check_where(condition, input1, input2)
    return torch.empty(shape, dtype=torch.int8, device=input1.device, memory_format=output_layout(shape))


family = register_family(OpFamily(FAMILY, ("quantized_compare", "quantized_where"), doc=__doc__))


# ----------------------------------------------------------------------------- lowering
_aten = torch.ops.aten
_COMPARE = {}
for _i, _name in enumerate(MODES):
    for _ov in ("Tensor", "Scalar"):
        _COMPARE[getattr(getattr(_aten, _name), _ov)] = _i
annotates("shared", *_COMPARE, _aten.where.self, _aten.where.ScalarOther, _aten.where.ScalarSelf,
          _aten.clamp.Tensor)


def scalar_threshold(mode: int, c: float, scale: float, zero_point: int) -> tuple[int, int]:
    """``(mode', t)``: ``q mode' t`` on int8 ``q`` is exactly ``scale * (q - zero_point) mode c``."""
    r = zero_point + Fraction(c) / Fraction(scale)  # exact: no float rounding at the threshold
    fl, ce = math.floor(r), math.ceil(r)
    always_true, always_false = (5, -128), (2, -128)  # q >= -128, q < -128
    name = MODES[mode]
    if name in ("eq", "ne"):
        if fl != ce or not -128 <= fl <= 127:
            return always_false if name == "eq" else always_true
        return mode, int(fl)
    if name == "gt":
        return always_false if fl >= 127 else always_true if fl < -128 else (mode, int(fl))
    if name == "ge":
        return always_false if ce > 127 else always_true if ce <= -128 else (mode, int(ce))
    if name == "lt":
        return always_false if ce <= -128 else always_true if ce > 127 else (mode, int(ce))
    return always_false if fl < -128 else always_true if fl >= 127 else (mode, int(fl))  # le


_SWAP = {0: 0, 1: 1, 2: 4, 3: 5, 4: 2, 5: 3}  # c OP x == x SWAP(OP) c


@lowers(*_COMPARE)
def lower_compare(m: Match):
    """``x OP y`` (one grid) or ``x OP c`` -> ``quantized_compare`` (a bool tensor)."""
    mode = _COMPARE[m.node.target]
    what = MODES[mode]
    other = m.node.args[1] if len(m.node.args) > 1 else None
    if len(m.inputs) == 1 and isinstance(other, (int, float)) and not isinstance(other, bool):
        check_ranks(m, what)
        x = m.inputs[0]
        if not is_activation_operand(m.node.args[0], x):
            mode = _SWAP[mode]
        mode, t = scalar_threshold(mode, float(other), float(x.qparams.scale), int(x.qparams.zero_point))
        const = m.add_constant(torch.tensor([t], dtype=torch.int8), "threshold")
        return m.call("quantized_compare", x.node, const, mode)
    a, b = binary_operands(m, what)
    if a.qparams != b.qparams:
        raise LoweringError(f"{what} needs both operands on one quantization grid (CortenQuantizer shares them); "
                            f"got {a.qparams} and {b.qparams}")
    return m.call("quantized_compare", a.node, b.node, mode)


def _corten_bool(node) -> bool:
    from corten.ops.registry import op_name_of

    return isinstance(node, torch.fx.Node) and op_name_of(node.target) == "quantized_compare"


@lowers(_aten.where.self, _aten.where.ScalarOther, _aten.where.ScalarSelf)
def lower_where(m: Match):
    """``torch.where(cond, a, b)`` with ``cond`` a lowered comparison and ``a``, ``b`` int8 on the
    output's grid (or Python numbers, quantized on it) -> ``quantized_where``."""
    cond = m.node.args[0]
    if not _corten_bool(cond):
        raise LoweringError("where needs its condition to be a comparison of int8 tensors (eq/ne/lt/le/gt/ge) "
                            "in the compiled model")
    ops = []
    for arg in m.node.args[1:3]:
        if isinstance(arg, (int, float)) and not isinstance(arg, bool):
            ops.append(m.add_constant(torch.tensor([quantize_value(float(arg), m.output)], dtype=torch.int8),
                                      "value"))
            continue
        x = next((v for v in m.inputs if is_activation_operand(arg, v)), None)
        if x is None:
            raise LoweringError("where: a value operand is neither an int8 activation nor a Python number")
        if x.qparams != m.output:
            raise LoweringError("where needs its values and output on one quantization grid (CortenQuantizer "
                                "shares them)")
        ops.append(x.node)
    if m.activation is not None:
        raise LoweringError("where followed by a fused activation is not supported")
    shape = lambda n: tuple(int(d) for d in n.meta["val"].shape) if n.op != "get_attr" else (1,)  # noqa: E731
    out_shape = tuple(int(d) for d in m.node.meta["val"].shape)
    if not broadcast_fits(out_shape, [(shape(cond), False)] + [(shape(n), n.op == "get_attr") for n in ops]):
        raise LoweringError(f"where over shapes {[list(shape(n)) for n in (cond, *ops)]} is not supported: ranks 1 "
                            "to 5, a rank-5 broadcast must collapse to 4 loops (broadcast dims adjacent)")
    return m.call("quantized_where", cond, ops[0], ops[1])


@lowers(_aten.clamp.Tensor)
def lower_clamp_tensor(m: Match):
    """``clamp(x, min=t1, max=t2)`` with tensor bounds -> ``quantized_maximum`` / ``quantized_minimum``
    on the shared grid."""
    x_arg = m.node.args[0]
    lo = m.node.args[1] if len(m.node.args) > 1 else m.node.kwargs.get("min")
    hi = m.node.args[2] if len(m.node.args) > 2 else m.node.kwargs.get("max")
    x = next((v for v in m.inputs if is_activation_operand(x_arg, v)), None)
    if x is None or any(v.qparams != m.output for v in m.inputs):
        raise LoweringError("clamp with tensor bounds needs the tensor and its bounds on one grid")
    out = x.node
    for bound, op in ((lo, "quantized_maximum"), (hi, "quantized_minimum")):
        if bound is None:
            continue
        b = next((v for v in m.inputs if is_activation_operand(bound, v)), None)
        if b is None:
            raise LoweringError("clamp: a tensor bound must be an int8 activation of the compiled model")
        out = m.call(op, out, b.node)
    return out


# ----------------------------------------------------------------------------- scratch memory
# ----------------------------------------------------------------------------- C emission
def _fmt(v) -> str:
    return "{" + ", ".join(str(int(x)) for x in v) + "}"


@PORTABLE.kernel("quantized_compare")
def _emit_compare_c(ctx) -> str:
    """``corten_compare_s8`` (portable in both flavours)."""
    x1, x2 = operand_expr(ctx, "input1"), operand_expr(ctx, "input2")
    return ctx.block(broadcast_struct(ctx),
                     ctx.call("corten_compare_s8", int(ctx.arg('mode')), "&shape", x1, x2, ctx.out()))


@PORTABLE.kernel("quantized_where")
def _emit_where_c(ctx) -> str:
    """``corten_where_s8`` (portable in both flavours): the output dims and the three operands' strides."""
    geo = operands_geometry(ctx, ("condition", "input1", "input2"))
    dims = geo["condition"][0]
    strides = [geo[name][2] for name in ("condition", "input1", "input2")]
    exprs = [ctx.input("condition"), operand_expr(ctx, "input1"), operand_expr(ctx, "input2")]
    return ctx.block(
        f"const corten_dims out_dims = {_fmt(dims)};",
        f"const corten_dims cond_strides = {_fmt(strides[0])};",
        f"const corten_dims a_strides = {_fmt(strides[1])};",
        f"const corten_dims b_strides = {_fmt(strides[2])};",
        ctx.call("corten_where_s8", "&out_dims", "&cond_strides", f"(const int8_t *){exprs[0]}", "&a_strides", exprs[1],
                 "&b_strides", exprs[2], ctx.out()))


CMSIS_NN.declines("quantized_compare", reason="CMSIS-NN has no comparison kernel")


CMSIS_NN.declines("quantized_where", reason="CMSIS-NN has no select (where) kernel")
