"""``quantized_matmul``: batched int8 matrix products (``torch.matmul`` / ``bmm`` / ``mm`` / ``@``),
CMSIS-NN's ``arm_batch_matmul_s8``.

Activation x activation (attention's ``q @ k.transpose(-2, -1)`` and ``weights @ v``) and
activation x constant (``x @ W``, ``W @ x`` with ``W`` a parameter quantized per tensor).  For each
output element, in int32 exactly as CMSIS-NN's ``arm_nn_vec_mat_mult_t_s8`` (``K`` the inner size)::

    acc = sum_k (lhs[..., m, k] + lhs_offset) * (rhs[..., k, n] + rhs_offset)        (int32, wraps)
    y   = clamp(requantize(acc, output_multiplier, output_shift) + output_offset, act_min, act_max)

With ``rhs_transposed`` the right operand is stored ``[..., N, K]`` and the op computes
``lhs @ rhs.transpose(-1, -2)``: that is the layout ``arm_batch_matmul_s8`` reads (its RHS is
"transposed", rows of the RHS are the output's columns), so the lowering folds a
``k.transpose(-2, -1)`` feeding the right operand into the call instead of moving bytes, and
stores a constant right operand transposed ahead of time.

Batch dimensions (up to two: operands of rank 2 to 4) broadcast as ``torch.matmul`` does (aligned
on the right, size 1 repeated).  One multiplier/shift (per-tensor scales, TFLite's
``s_lhs * s_rhs / s_out``).

C: the portable ``corten_matmul_s8`` reads all three tensors through element strides (a 4-D
activation is NHWC in memory, so multi-head ``[B, H, T, d]`` operands are read in place, no layout
copy).  The CMSIS-NN flavour calls ``arm_batch_matmul_s8`` when the operands are row-major
``[batch, rows, cols]`` in memory (2-D and 3-D tensors, 4-D ones with one head, constants); a right
operand that is not already transposed is transposed into the scratch buffer first
(``arm_transpose_s8``).  Other layouts (4-D multi-head activations) run the portable kernel in
both flavours.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from corten.errors import LoweringError
from corten.fixed_point import clamp_activation, requantize, wrap_int32_t
from corten.ops import checks
from corten.ops._broadcast import is_constant, is_dense, storage_strides
from corten.ops._common import effective_multiplier, output_format
from corten.ops._qparams import QParams
from corten.ops._rules import DQ_PER_TENSOR, Match
from corten.fx_nodes import node_arg
from corten.ops.registry import Cost, Hook, OpFamily, annotates, lowers, node_shape, op_name_of, register_family
from corten.providers import CMSIS_NN, PORTABLE

FAMILY = "matmul"
MIN_RANK, MAX_RANK = 2, 4
MAX_BATCH_DIMS = MAX_RANK - 2


def output_shape(op: str, lhs_shape: Sequence[int], rhs_shape: Sequence[int], rhs_transposed: bool) -> tuple[int, ...]:
    """``torch.matmul``'s output shape (both ranks 2 to 4); errors name ``op`` and the argument."""
    for name, s in (("lhs", lhs_shape), ("rhs", rhs_shape)):
        if not MIN_RANK <= len(s) <= MAX_RANK:
            checks.fail(op, name, f"rank {len(s)} (shape {tuple(s)}) is not {MIN_RANK} to {MAX_RANK}")
    m, k = int(lhs_shape[-2]), int(lhs_shape[-1])
    if rhs_transposed:
        n, k2 = int(rhs_shape[-2]), int(rhs_shape[-1])
    else:
        k2, n = int(rhs_shape[-2]), int(rhs_shape[-1])
    if k != k2:
        checks.fail(op, "rhs", f"inner sizes differ: lhs {tuple(lhs_shape)} has {k} columns, rhs {tuple(rhs_shape)} "
                               f"{'(transposed) ' if rhs_transposed else ''}has {k2} rows")
    try:
        batch = torch.broadcast_shapes(tuple(lhs_shape[:-2]), tuple(rhs_shape[:-2]))
    except RuntimeError:
        checks.fail(op, "rhs", f"batch dims of {tuple(rhs_shape)} do not broadcast with lhs {tuple(lhs_shape)}")
    return (*[int(d) for d in batch], m, n)


# ----------------------------------------------------------------------------- the op
def _check(lhs, rhs, lhs_offset, rhs_offset, output_offset, output_multiplier, output_shift,
           activation_min, activation_max, rhs_transposed) -> tuple[int, ...]:
    op = "quantized_matmul"
    checks.requantized_binary(op, ("lhs", "rhs"), lhs, rhs, lhs_offset, rhs_offset, output_offset, output_multiplier,
                              output_shift, activation_min, activation_max)
    return output_shape(op, lhs.shape, rhs.shape, rhs_transposed)


@torch.library.custom_op("corten::quantized_matmul", mutates_args=())
def quantized_matmul(
    lhs: torch.Tensor,
    rhs: torch.Tensor,
    lhs_offset: int,
    rhs_offset: int,
    output_offset: int,
    output_multiplier: int,
    output_shift: int,
    activation_min: int,
    activation_max: int,
    rhs_transposed: bool = False,
) -> torch.Tensor:
    shape = _check(lhs, rhs, lhs_offset, rhs_offset, output_offset, output_multiplier, output_shift,
                   activation_min, activation_max, rhs_transposed)
    a = lhs.to(torch.float64) + lhs_offset
    b = rhs.to(torch.float64) + rhs_offset
    if rhs_transposed:
        b = b.transpose(-1, -2)
    # Exact in float64: every product is an integer of magnitude <= 255 * 255 < 2**16 and K < 2**37,
    # so every partial sum is an integer below 2**53.  The C accumulator is int32 and wraps.
    acc = wrap_int32_t(torch.matmul(a, b).to(torch.int64))
    out = wrap_int32_t(requantize(acc, output_multiplier, output_shift) + output_offset)
    return clamp_activation(out, activation_min, activation_max).reshape(shape).contiguous(
        memory_format=output_format(len(shape)))


@quantized_matmul.register_fake
def _(lhs, rhs, lhs_offset, rhs_offset, output_offset, output_multiplier, output_shift, activation_min,
      activation_max, rhs_transposed=False):
    shape = _check(lhs, rhs, lhs_offset, rhs_offset, output_offset, output_multiplier, output_shift,
                   activation_min, activation_max, rhs_transposed)
    return lhs.new_empty(shape).contiguous(memory_format=output_format(len(shape)))


family = register_family(OpFamily(FAMILY, ("quantized_matmul",), doc=__doc__))


@family.provides(Hook.COST)
def _cost(node) -> Cost:
    """K products per output value (both operands are activations: no weight bytes counted)."""
    out = 1
    for d in node_shape(node):
        out *= d
    return Cost(out * node_shape(node_arg(node, "lhs"))[-1])


# ----------------------------------------------------------------------------- C geometry (pure functions)
@dataclass(frozen=True)
class MatmulGeometry:
    """What the C kernels need: two output batch dims, M, N, K and each tensor's element strides as
    ``[batch0, batch1, row, col]`` (lhs rows m / cols k; rhs rows k / cols n; out rows m / cols n).
    A broadcast batch dim has stride 0."""

    batch: tuple[int, int]
    m: int
    n: int
    k: int
    lhs: tuple[int, int, int, int]
    rhs: tuple[int, int, int, int]
    out: tuple[int, int, int, int]
    lhs_batch: tuple[int, int]  # the operands' own batch sizes (1 where broadcast)
    rhs_batch: tuple[int, int]


def _batch_strides(shape, strides, out_batch) -> tuple[list[int], list[int]]:
    """Batch strides/sizes of an operand, aligned on the right with the output's (padded) batch dims."""
    own = list(shape[:-2])
    own_strides = list(strides[:-2])
    pad = len(out_batch) - len(own)
    sizes = [1] * pad + [int(d) for d in own]
    st = [0] * pad + [int(s) for s in own_strides]
    st = [0 if sz == 1 else s for sz, s in zip(sizes, st)]
    return sizes, st


def geometry(lhs_shape, rhs_shape, out_shape, rhs_transposed: bool, lhs_const: bool = False,
             rhs_const: bool = False) -> MatmulGeometry:
    """:class:`MatmulGeometry` of ``lhs @ rhs`` (``rhs_transposed``: rhs is stored ``[..., N, K]``)."""
    ls = storage_strides(lhs_shape, row_major=lhs_const)  # constants are row-major arrays, 4-D activations NHWC
    rs = storage_strides(rhs_shape, row_major=rhs_const)
    os_ = storage_strides(out_shape)
    out_batch = [int(d) for d in out_shape[:-2]]
    pad = MAX_BATCH_DIMS - len(out_batch)
    batch = [1] * pad + out_batch
    out_b = [0] * pad + [s if d != 1 else 0 for d, s in zip(out_batch, os_[:-2])]
    lb_sizes, lb = _batch_strides(lhs_shape, ls, batch)
    rb_sizes, rb = _batch_strides(rhs_shape, rs, batch)
    m, k = int(lhs_shape[-2]), int(lhs_shape[-1])
    if rhs_transposed:
        n = int(rhs_shape[-2])
        r_row, r_col = rs[-1], rs[-2]  # rhs element (k, n) is stored at n * rs[-2] + k * rs[-1]
    else:
        n = int(rhs_shape[-1])
        r_row, r_col = rs[-2], rs[-1]
    return MatmulGeometry((batch[0], batch[1]), m, n, k, (lb[0], lb[1], ls[-2], ls[-1]), (rb[0], rb[1], r_row, r_col),
                          (out_b[0], out_b[1], os_[-2], os_[-1]), (lb_sizes[0], lb_sizes[1]),
                          (rb_sizes[0], rb_sizes[1]))


@dataclass(frozen=True)
class CmsisPlan:
    """How ``arm_batch_matmul_s8`` runs one node: its dims (n, h, w, c) and whether the right
    operand is first transposed into the scratch buffer (``[b0, b1, K, N] -> [b0, b1, N, K]``)."""

    lhs_dims: tuple[int, int, int, int]
    rhs_dims: tuple[int, int, int, int]
    out_dims: tuple[int, int, int, int]
    transpose_rhs: bool


def cmsis_plan(g: MatmulGeometry) -> CmsisPlan | None:
    """The ``arm_batch_matmul_s8`` call for geometry ``g``, or None when a tensor's bytes are not
    row-major ``[batch0, batch1, rows, cols]`` (e.g. a 4-D NHWC activation with several heads)."""
    lb, rb = g.lhs_batch, g.rhs_batch
    if not is_dense((*lb, g.m, g.k), (*g.lhs[:2], g.lhs[2], g.lhs[3])):
        return None
    if not is_dense((*g.batch, g.m, g.n), g.out):
        return None
    if is_dense((*rb, g.n, g.k), (*g.rhs[:2], g.rhs[3], g.rhs[2])):
        transpose = False
    elif is_dense((*rb, g.k, g.n), g.rhs):
        transpose = True
    else:
        return None
    return CmsisPlan((lb[0], lb[1], g.m, g.k), (rb[0], rb[1], g.n, g.k), (g.batch[0], g.batch[1], g.m, g.n),
                     transpose)


def transpose_plan(g: MatmulGeometry) -> tuple[list[int], list[int]]:
    """``(dims, perm)`` (``cmsis_nn_dims`` order) of the ``arm_transpose_s8`` call turning the dense
    right operand ``[batch, K, N]`` into ``[batch, N, K]``: a 4-D swap of the last two dims."""
    return [1, g.rhs_batch[0] * g.rhs_batch[1], g.k, g.n], [0, 1, 3, 2]


def cmsis_scratch_bytes(isa: str, g: MatmulGeometry) -> int:
    """Scratch of the CMSIS-NN call: on Helium the int32 vector sums of the right operand's rows
    (``arm_fully_connected_s8_get_buffer_size`` of the RHS, N * 4 bytes, which
    ``arm_batch_matmul_s8`` requires non-NULL), plus - when the right operand must be transposed
    first - its N * K * batch bytes.  Nothing when the portable kernel runs."""
    if isa not in ("plain", "dsp", "mve"):
        raise ValueError(f"isa must be 'plain', 'dsp' or 'mve', got {isa!r}")
    plan = cmsis_plan(g)
    if plan is None:
        return 0
    vector_sums = 4 * g.n if isa == "mve" else 0
    transposed = g.rhs_batch[0] * g.rhs_batch[1] * g.n * g.k if plan.transpose_rhs else 0
    return vector_sums + transposed


# ----------------------------------------------------------------------------- lowering
_aten = torch.ops.aten
MATMULS = (_aten.matmul.default, _aten.bmm.default, _aten.mm.default)
annotates("binary", *MATMULS)


def _operand(m: Match, arg, what: str) -> tuple[torch.fx.Node | torch.Tensor, QParams, bool]:
    """(int8 node or constant int8 tensor, qparams, is_constant) of the matmul argument ``arg``."""
    if not isinstance(arg, torch.fx.Node) or arg.target not in DQ_PER_TENSOR:
        raise LoweringError(f"matmul: the {what} operand is not an int8 tensor (quantize the model with "
                            "CortenQuantizer)")
    src = arg.args[0]
    scale, zp = arg.args[1], arg.args[2]
    if not isinstance(scale, float) or not isinstance(zp, int):
        raise LoweringError(f"matmul: the {what} operand's quantization parameters are not constants")
    if src.op == "get_attr":
        values = m.constant(src)
        if values.dtype != torch.int8:
            raise LoweringError(f"matmul: the constant {what} operand is not int8")
        return values, QParams(float(scale), int(zp)), True
    return src, QParams(float(scale), int(zp)), False


def _swaps_last_two(node: torch.fx.Node) -> bool:
    """A ``quantized_transpose`` (no reshape) that swaps exactly the last two dims."""
    if op_name_of(node.target) != "quantized_transpose" or (len(node.args) > 2 and node.args[2] is not None):
        return False
    perm = list(node.args[1])
    r = len(perm)
    return r >= 2 and perm == [*range(r - 2), r - 1, r - 2]


def _shape(v) -> list[int]:
    t = v if isinstance(v, torch.Tensor) else v.meta["val"]
    return [int(d) for d in t.shape]


@lowers(*MATMULS)
def lower_matmul(m: Match):
    """``aten.matmul`` / ``bmm`` / ``mm`` of int8 tensors (ranks 2 to 4, batch broadcasting) or of an
    int8 tensor and a quantized constant -> ``quantized_matmul``.  A transpose of the last two dims
    feeding the right operand is folded into the call (``rhs_transposed``)."""
    lhs, lq, lconst = _operand(m, m.node.args[0], "left")
    rhs, rq, rconst = _operand(m, m.node.args[1], "right")
    if lconst and rconst:
        raise LoweringError("matmul of two constants: compute it in the model (it is a constant)")
    for what, v in (("left", lhs), ("right", rhs)):
        if not MIN_RANK <= len(_shape(v)) <= MAX_RANK:
            raise LoweringError(f"matmul: the {what} operand has shape {tuple(_shape(v))}; ranks {MIN_RANK} to "
                                f"{MAX_RANK} are supported (merge leading batch dims with a reshape)")
    if len(_shape(m.node.meta["val"])) > MAX_RANK:
        raise LoweringError(f"matmul output of rank > {MAX_RANK} is not supported")
    rhs_transposed = False
    if rconst:
        # Stored as [..., N, K]: the layout arm_batch_matmul_s8 reads.
        rhs = m.add_constant(rhs.transpose(-1, -2).contiguous(), "rhs_t")
        rhs_transposed = True
    elif _swaps_last_two(rhs):
        rhs, rhs_transposed = rhs.args[0], True
    if lconst:
        lhs = m.add_constant(lhs.contiguous(), "lhs")
    scale = float(lq.scale) * float(rq.scale) / float(m.output.scale)
    mult, shift = effective_multiplier(scale, f"matmul: effective scale s_lhs * s_rhs / s_out = {scale:g}")
    act_min, act_max = m.activation_bounds
    return m.call("quantized_matmul", lhs, rhs, lq.offset, rq.offset, m.output.zero_point, mult, shift,
                  act_min, act_max, rhs_transposed)


# ----------------------------------------------------------------------------- scratch memory
def _is_constant_arg(node) -> bool:
    return isinstance(node, torch.fx.Node) and node.op in ("placeholder", "get_attr")


def node_geometry(node) -> MatmulGeometry:
    lhs, rhs = node.args[0], node.args[1]
    rhs_t = bool(node.args[9]) if len(node.args) > 9 else bool(node.kwargs.get("rhs_transposed", False))
    return geometry(_shape(lhs), _shape(rhs), _shape(node), rhs_t, _is_constant_arg(lhs), _is_constant_arg(rhs))


def _matmul_scratch(node, target) -> int:
    """:func:`cmsis_scratch_bytes` for the target's ISA (the portable kernel needs none)."""
    return cmsis_scratch_bytes(target.isa, node_geometry(node))


def _cmsis_supports(node, target) -> str | None:
    if cmsis_plan(node_geometry(node)) is None:
        return ("operands not row-major [batch, rows, cols] in memory (e.g. NHWC heads): arm_batch_matmul_s8 cannot "
                "read them")
    return None


# ----------------------------------------------------------------------------- C emission
def _c_list(values) -> str:
    return "{" + ", ".join(str(int(v)) for v in values) + "}"


def _operands(ctx) -> dict:
    lhs_node, rhs_node = ctx.arg("lhs"), ctx.arg("rhs")
    g = geometry(ctx.shape(lhs_node), ctx.shape(rhs_node), ctx.shape(), bool(ctx.arg("rhs_transposed")),
                 is_constant(lhs_node), is_constant(rhs_node))
    lhs = ctx.const("lhs", torch.int8) if is_constant(lhs_node) else ctx.input("lhs")
    rhs = ctx.const("rhs", torch.int8) if is_constant(rhs_node) else ctx.input("rhs")
    return dict(g=g, lhs=lhs, rhs=rhs, out=ctx.out(), lo=int(ctx.arg("lhs_offset")), ro=int(ctx.arg("rhs_offset")),
                oo=int(ctx.arg("output_offset")), mult=ctx.int_(int(ctx.arg("output_multiplier"))),
                shift=int(ctx.arg("output_shift")), amin=int(ctx.arg("activation_min")),
                amax=int(ctx.arg("activation_max")))


@PORTABLE.kernel("quantized_matmul")
def _matmul_portable(ctx) -> str:
    """``corten_matmul_s8`` (strided operands, any layout)."""
    o = _operands(ctx)
    g = o["g"]
    return ctx.block(
        f"const corten_matmul_params params = {{.lhs_offset = {o['lo']}, .rhs_offset = {o['ro']}, "
        f".output_offset = {o['oo']}, .output_multiplier = {o['mult']}, .output_shift = {o['shift']}, "
        f".activation_min = {o['amin']}, .activation_max = {o['amax']}}};",
        f"const corten_matmul_dims dims = {{.batch = {_c_list(g.batch)}, .m = {g.m}, .n = {g.n}, .k = {g.k}, "
        f".lhs_stride = {_c_list(g.lhs)}, .rhs_stride = {_c_list(g.rhs)}, .out_stride = {_c_list(g.out)}}};",
        ctx.call("corten_matmul_s8", "&params", "&dims", o["lhs"], o["rhs"], o["out"]))


@CMSIS_NN.kernel("quantized_matmul", act=(torch.int8,), supports=_cmsis_supports, scratch=_matmul_scratch)
def _matmul_cmsis(ctx) -> str:
    """``arm_batch_matmul_s8`` (when :func:`cmsis_plan` finds row-major operands), after an
    ``arm_transpose_s8`` of the right operand into the scratch when the plan needs one."""
    o = _operands(ctx)
    g, rhs = o["g"], o["rhs"]
    plan = cmsis_plan(g)
    scratch, nbytes = ctx.scratch()
    want = cmsis_scratch_bytes(ctx.target.isa, g)
    if nbytes < want:
        ctx.fail(f"the memory plan gives {nbytes} scratch bytes, arm_batch_matmul_s8 needs {want}")
    sums = 4 * g.n if ctx.target.isa == "mve" else 0
    lines = []
    if plan.transpose_rhs:
        dims, perm = transpose_plan(g)
        lines += [
            f"int8_t *rhs_t = (int8_t *){scratch} + {sums};",
            ctx.dims("t_in_dims", "cmsis_nn_dims", *dims),
            ctx.dims("t_out_dims", "cmsis_nn_dims", *[dims[p] for p in perm]),
            f"const uint32_t perm[4] = {_c_list(perm)};",
            "const cmsis_nn_transpose_params t_params = {.num_dims = 4, .permutations = perm};",
            ctx.call("arm_transpose_s8", rhs, "rhs_t", "&t_in_dims", "&t_out_dims", "&t_params"),
        ]
        rhs = "rhs_t"
    buf = scratch if sums else "NULL"
    lines += [
        f"const cmsis_nn_context nn_ctx = {{.buf = {buf}, .size = {sums}}};",
        f"const cmsis_nn_bmm_params params = {{.adj_x = false, .adj_y = false, .fc_params = {{.input_offset = "
        f"{o['lo']}, .filter_offset = {o['ro']}, .output_offset = {o['oo']}, .activation = {{.min = {o['amin']}, "
        f".max = {o['amax']}}}}}}};",
        f"const cmsis_nn_per_tensor_quant_params quant = {{.multiplier = {o['mult']}, .shift = {o['shift']}}};",
        ctx.dims("lhs_dims", "cmsis_nn_dims", *plan.lhs_dims),
        ctx.dims("rhs_dims", "cmsis_nn_dims", *plan.rhs_dims),
        ctx.dims("out_dims", "cmsis_nn_dims", *plan.out_dims),
        ctx.call("arm_batch_matmul_s8", "&nn_ctx", "&params", "&quant", "&lhs_dims", o["lhs"], "&rhs_dims", rhs,
                 "&out_dims", o["out"]),
    ]
    return ctx.block(*lines)
