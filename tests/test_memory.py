"""Memory planning: CMSIS-NN scratch formulas, static plans checked independently, budgets.

Plans are verified two ways, both independent of the planner's own bookkeeping:

* :func:`check_plan` recomputes lifetimes from the graph and checks that no two tensors whose
  lifetimes overlap share a byte (unless one is a reshape alias of the other, or an add writing
  over an input that dies at that add), that scratch never overlaps a tensor live at its step,
  that everything is inside the arena and aligned, and recomputes the lower bound;
* :func:`simulate` runs the program through the reference kernels on byte buffers laid out as
  planned (the arena starts with, and every scratch is refilled with, garbage) and must reproduce
  ``ep.module()(x)`` bit for bit.
"""
from __future__ import annotations

import dataclasses
import random

import pytest
import torch

import corten  # noqa: F401  (registers the ops)
from corten.fixed_point import quantize_multiplier
from corten.memory import (BudgetError, MemoryPlanError, TensorAlloc, check_budget, constant_tensor,
                           plan_memory, reshape_is_alias)
from corten.memory.placement import Buffer, arena_size, best_fit, lower_bound, pack, visiting_orders
from corten.ops import conv, linear, pool  # noqa: F401
from corten.providers import cmsis_nn
from corten.ops.registry import Hook, hook_for, op_name_of
from corten.providers import CMSIS_NN, choose_provider, resolve_providers
from corten.targets import get_target

ISAS = {"plain": "cortex-m3", "dsp": "cortex-m4", "mve": "cortex-m55"}
RESHAPE = torch.ops.aten.reshape.default


# ============================================================================ scratch formulas
# Expected values are worked out by hand from the C formulas (comments show the arithmetic).

def conv_bytes(isa, nhwc, k, out_hw, stride=(1, 1), pad=(0, 0), dil=(1, 1), compiler="any"):
    return cmsis_nn.conv2d_scratch_bytes(isa, nhwc, k, out_hw, stride, pad, dil, compiler)


@pytest.mark.parametrize("case, variant, expected", [
    # 1x1, stride 1, no padding: arm_convolve_1x1_s8_fast; DSP+armclang: 2 * C_in int16 = 4 * 24
    (dict(nhwc=(1, 56, 56, 24), k=(1, 1), out_hw=(56, 56)), "1x1_fast",
     {"plain": 0, "dsp": 96, "mve": 0}),
    # strided 1x1: arm_convolve_1x1_s8, no buffer
    (dict(nhwc=(1, 56, 56, 24), k=(1, 1), out_hw=(28, 28), stride=(2, 2)), "1x1", {"plain": 0, "dsp": 0, "mve": 0}),
    # 1x1 kernel with padding is not the 1x1 path: im2col of 24 columns; 2*2*24 | 4*16*ceil(24/16)
    (dict(nhwc=(1, 8, 8, 24), k=(1, 1), out_hw=(10, 10), pad=(1, 1)), "im2col", {"plain": 96, "dsp": 96, "mve": 128}),
    # MobileNetV2's stem 3x3 on 3 channels: 27 cols -> 28; 2*2*28 = 112 | 4*16*2 = 128
    (dict(nhwc=(1, 224, 224, 3), k=(3, 3), out_hw=(112, 112), stride=(2, 2), pad=(1, 1)), "im2col",
     {"plain": 112, "dsp": 112, "mve": 128}),
    # 3x3 on 32 channels: 288 cols; 2*2*288 = 1152 | 4*16*18 = 1152
    (dict(nhwc=(1, 20, 20, 32), k=(3, 3), out_hw=(20, 20), pad=(1, 1)), "im2col",
     {"plain": 1152, "dsp": 1152, "mve": 1152}),
    # dilated 1x1 is not the 1x1 path either: 5 cols -> 8 -> 32 | 64
    (dict(nhwc=(1, 8, 8, 5), k=(1, 1), out_hw=(8, 8), dil=(2, 2)), "im2col", {"plain": 32, "dsp": 32, "mve": 64}),
    # 1xN (H = 1, stride*C % 4 == 0): plain/DSP use the im2col size, 40 cols -> 160;
    # MVE: pads 2 and 2, no asymmetry: max(5*8 + 2*8, 4*8 + 2*8) = 56
    (dict(nhwc=(1, 1, 50, 8), k=(1, 5), out_hw=(1, 50), pad=(0, 2)), "1xn", {"plain": 160, "dsp": 160, "mve": 56}),
    # 1xN with stride 2, no padding, C = 2 (2*2 % 4 == 0): 3*2 = 6 cols -> 8 -> 32 | MVE:
    # out 7, total_pad = 6*2 + 3 - 16 = -1, C's -1 % 2 = -1 -> right 1, left 0, middle 6;
    # max(6 + 0, 4 + 1*2) = 6
    (dict(nhwc=(1, 1, 16, 2), k=(1, 3), out_hw=(1, 7), stride=(2, 2)), "1xn", {"plain": 32, "dsp": 32, "mve": 6}),
    # H = 1 but stride*C = 3 not a multiple of 4: im2col, 15 cols -> 16 -> 64 | 4*16*1 = 64
    (dict(nhwc=(1, 1, 20, 3), k=(1, 5), out_hw=(1, 16)), "im2col", {"plain": 64, "dsp": 64, "mve": 64}),
])
def test_conv2d_scratch_formulas(case, variant, expected):
    args = dict(stride=(1, 1), pad=(0, 0), dil=(1, 1)) | case
    assert cmsis_nn.conv2d_kernel_variant(args["nhwc"], args["k"], args["stride"], args["pad"], args["dil"]) == variant
    for isa, want in expected.items():
        assert conv_bytes(isa, **args) == want, isa


def test_conv2d_1x1_fast_buffer_is_armclang_only():
    # arm_convolve_1x1_s8_fast_get_buffer_size_dsp: 2*C_in int16 with armclang, 0 with gcc
    args = ((1, 7, 7, 320), (1, 1), (7, 7))
    assert conv_bytes("dsp", *args, compiler="gcc") == 0
    assert conv_bytes("dsp", *args, compiler="armclang") == 1280
    assert conv_bytes("dsp", *args) == 1280  # "any": the larger, valid for both compilers


def test_c_integer_helpers():
    assert [cmsis_nn._c_div(a, 2) for a in (-3, -1, 0, 1, 3)] == [-1, 0, 0, 0, 1]
    assert [cmsis_nn._c_mod(a, 2) for a in (-3, -1, 0, 1, 3)] == [-1, -1, 0, 1, 1]


def dw_bytes(isa, nhwc, k, out_hw, c_out, stride=(1, 1), pad=(0, 0), dil=(1, 1), compiler="any"):
    return cmsis_nn.depthwise_scratch_bytes(isa, nhwc, k, out_hw, c_out, stride, pad, dil, compiler)


@pytest.mark.parametrize("case, variants, expected", [
    # MobileNetV2 3x3 stride 2: 3x3 kernel on plain/DSP (no buffer); MVE opt: 4*124*9 = 4464
    (dict(nhwc=(1, 112, 112, 96), k=(3, 3), out_hw=(56, 56), c_out=96, stride=(2, 2), pad=(1, 1)),
     ("3x3", "3x3", "opt"), {"plain": 0, "dsp": 0, "mve": 4464}),
    # 5x5: opt kernel; DSP 8*25 int16 = 400; MVE 4*124*25 = 12400; plain opt falls back: 0
    (dict(nhwc=(1, 10, 10, 8), k=(5, 5), out_hw=(10, 10), c_out=8, pad=(2, 2)),
     ("opt", "opt", "opt"), {"plain": 0, "dsp": 400, "mve": 12400}),
    # 3x3 with padding 2 leaves the 3x3 kernel: DSP 8*9*2 = 144
    (dict(nhwc=(1, 10, 10, 8), k=(3, 3), out_hw=(12, 12), c_out=8, pad=(2, 2)),
     ("opt", "opt", "opt"), {"plain": 0, "dsp": 144, "mve": 4464}),
    # depth multiplier 2: generic arm_depthwise_conv_s8, no buffer
    (dict(nhwc=(1, 10, 10, 8), k=(3, 3), out_hw=(10, 10), c_out=16, pad=(1, 1)),
     ("generic", "generic", "generic"), {"plain": 0, "dsp": 0, "mve": 0}),
    # dilation 2: generic
    (dict(nhwc=(1, 10, 10, 8), k=(3, 3), out_hw=(6, 6), c_out=8, dil=(2, 2)),
     ("generic", "generic", "generic"), {"plain": 0, "dsp": 0, "mve": 0}),
    # batch 2: generic
    (dict(nhwc=(2, 10, 10, 8), k=(3, 3), out_hw=(10, 10), c_out=8, pad=(1, 1)),
     ("generic", "generic", "generic"), {"plain": 0, "dsp": 0, "mve": 0}),
    # one input channel, 4 outputs: MVE (gcc) converts to a conv: im2col 9 cols -> 4*16 = 64,
    # plus the transposed weights 4*9 = 36
    (dict(nhwc=(1, 10, 10, 1), k=(3, 3), out_hw=(10, 10), c_out=4, pad=(1, 1)),
     ("generic", "generic", "to_conv"), {"plain": 0, "dsp": 0, "mve": 100}),
    # one input channel, 16 outputs, 1x1: the conv is 1x1 fast (no MVE buffer) + 16 weight bytes
    (dict(nhwc=(1, 10, 10, 1), k=(1, 1), out_hw=(10, 10), c_out=16),
     ("generic", "generic", "to_conv"), {"plain": 0, "dsp": 0, "mve": 16}),
    # one channel in and out, 3x3: 3x3 kernel on plain/DSP, opt on MVE
    (dict(nhwc=(1, 10, 10, 1), k=(3, 3), out_hw=(10, 10), c_out=1, pad=(1, 1)),
     ("3x3", "3x3", "opt"), {"plain": 0, "dsp": 0, "mve": 4464}),
])
def test_depthwise_scratch_formulas(case, variants, expected):
    args = dict(stride=(1, 1), pad=(0, 0), dil=(1, 1)) | case
    for isa, variant in zip(("plain", "dsp", "mve"), variants):
        got = cmsis_nn.depthwise_kernel_variant(isa, args["nhwc"], args["k"], args["c_out"], args["pad"], args["dil"])
        assert got == variant, isa
    for isa, want in expected.items():
        assert dw_bytes(isa, **args) == want, isa


def test_depthwise_one_input_channel_threshold_depends_on_compiler():
    # armclang converts only above 8 output channels: 4 outputs stay generic (no buffer)
    args = ((1, 10, 10, 1), (3, 3), (10, 10), 4, (1, 1), (1, 1), (1, 1))
    assert cmsis_nn.depthwise_kernel_variant("mve", args[0], args[1], args[3], args[5], args[6], "armclang") == "generic"
    assert cmsis_nn.depthwise_scratch_bytes("mve", *args, compiler="armclang") == 0
    assert cmsis_nn.depthwise_scratch_bytes("mve", *args, compiler="gcc") == 100
    # 12 outputs: both convert; 64 + 12*9
    args12 = ((1, 10, 10, 1), (3, 3), (10, 10), 12, (1, 1), (1, 1), (1, 1))
    assert cmsis_nn.depthwise_scratch_bytes("mve", *args12, compiler="armclang") == 64 + 108


def test_linear_and_pool_formulas():
    assert [linear.cmsis_fully_connected_buffer_bytes(isa, 1000) for isa in ("plain", "dsp", "mve")] == [0, 0, 4000]
    assert [pool.avgpool_scratch_bytes(isa, 1280) for isa in ("plain", "dsp", "mve")] == [0, 5120, 0]
    with pytest.raises(ValueError, match="isa"):
        pool.avgpool_scratch_bytes("neon", 8)


# ============================================================================ building programs
def _requant(scale: float, n: int = 1):
    m, s = quantize_multiplier(scale)
    return torch.full((n,), m, dtype=torch.int32), torch.full((n,), s, dtype=torch.int32)


class Program(torch.nn.Module):
    """A lowered program from a list of layer specs (``values[0]`` is the quantized input).

    Specs: ``("conv", src, c_out, k, stride, pad)``, ``("dw", src, k, stride, pad, mult)``,
    ``("add", a, b)``, ``("avgpool", src, k)``, ``("maxpool", src, k, stride)``,
    ``("reshape", src, shape)``, ``("linear", src, out)``, the elementwise ``("sub" | "mul" | "max" |
    "min", a, b)`` and ``("row0", src)`` (a view of H row 0 of ``src``: a ``quantized_strided_copy``
    that is one contiguous run of its bytes).  ``outputs``: value indices to return.
    """

    def __init__(self, input_shape, specs, outputs=(-1,), seed=0):
        super().__init__()
        gen = torch.Generator().manual_seed(seed)
        self.input_shape = tuple(input_shape)
        self.specs = specs
        self.outputs = tuple(outputs)
        shapes = [self.input_shape]
        for i, spec in enumerate(specs):
            kind, src = spec[0], spec[1]
            shape = shapes[src]
            if kind == "conv":
                _, _, c_out, k, stride, pad = spec
                c_in = shape[1]
                self._consts(i, w=torch.randint(-20, 21, (c_out, k, k, c_in), generator=gen, dtype=torch.int8),
                             b=torch.randint(-500, 500, (c_out,), generator=gen, dtype=torch.int32),
                             **dict(zip("ms", _requant(1.0 / (8 * k * k * c_in), c_out))))
                ho = (shape[2] + 2 * pad - k) // stride + 1
                wo = (shape[3] + 2 * pad - k) // stride + 1
                shape = (shape[0], c_out, ho, wo)
            elif kind == "dw":
                _, _, k, stride, pad, mult = spec
                c_out = shape[1] * mult
                self._consts(i, w=torch.randint(-20, 21, (1, k, k, c_out), generator=gen, dtype=torch.int8),
                             b=torch.randint(-500, 500, (c_out,), generator=gen, dtype=torch.int32),
                             **dict(zip("ms", _requant(1.0 / (8 * k * k), c_out))))
                ho = (shape[2] + 2 * pad - k) // stride + 1
                wo = (shape[3] + 2 * pad - k) // stride + 1
                shape = (shape[0], c_out, ho, wo)
            elif kind == "linear":
                out = spec[2]
                w = torch.randint(-20, 21, (out, shape[-1]), generator=gen, dtype=torch.int8)
                self._consts(i, w=w, ks=linear.kernel_sum(w, torch.zeros(out, dtype=torch.int32), 3),
                             **dict(zip("ms", _requant(1.0 / (8 * shape[-1])))))
                shape = (*shape[:-1], out)
            elif kind == "avgpool":
                k = spec[2]
                shape = (shape[0], shape[1], shape[2] // k, shape[3] // k)
            elif kind == "maxpool":
                _, _, k, stride = spec
                shape = (shape[0], shape[1], (shape[2] - k) // stride + 1, (shape[3] - k) // stride + 1)
            elif kind == "reshape":
                shape = tuple(spec[2])
            elif kind == "row0":
                shape = (shape[0], shape[1], 1, shape[3])
            elif kind in ("add", "sub", "mul", "max", "min"):
                shape = tuple(torch.broadcast_shapes(shape, shapes[spec[2]]))
            else:
                raise ValueError(kind)
            shapes.append(shape)

    def _consts(self, i, **tensors):
        for name, t in tensors.items():
            self.register_buffer(f"l{i}_{name}", t)

    def forward(self, x):
        c = torch.ops.corten
        values = [c.quantize_per_tensor(x, 0.05, -3)]
        for i, spec in enumerate(self.specs):
            kind, v = spec[0], values[spec[1]]
            b = lambda n: getattr(self, f"l{i}_{n}")  # noqa: E731
            if kind == "conv":
                _, _, _, k, stride, pad = spec
                y = c.quantized_conv2d(v, b("w"), b("b"), [stride] * 2, [pad] * 2, [1, 1], 3, -2, b("m"), b("s"),
                                       -128, 127)
            elif kind == "dw":
                _, _, k, stride, pad, mult = spec
                y = c.quantized_depthwise_conv2d(v, b("w"), b("b"), [stride] * 2, [pad] * 2, [1, 1], mult, 3, -2,
                                                 b("m"), b("s"), -128, 127)
            elif kind == "add":
                m1, s1 = quantize_multiplier(0.5)
                m2, s2 = quantize_multiplier(0.4)
                mo, so = quantize_multiplier(1.0 / (2**20 * 0.8))
                y = c.quantized_add(v, values[spec[2]], 3, m1, s1, 2, m2, s2, 20, -1, mo, so, -128, 127)
            elif kind == "sub":
                m1, s1 = quantize_multiplier(0.5)
                m2, s2 = quantize_multiplier(0.4)
                mo, so = quantize_multiplier(1.0 / (2**20 * 0.8))
                y = c.quantized_sub(v, values[spec[2]], 3, m1, s1, 2, m2, s2, 20, -1, mo, so, -128, 127)
            elif kind == "mul":
                mo, so = quantize_multiplier(1.0 / 200)
                y = c.quantized_mul(v, values[spec[2]], 3, -2, 1, mo, so, -128, 127)
            elif kind in ("max", "min"):
                y = (c.quantized_maximum if kind == "max" else c.quantized_minimum)(v, values[spec[2]])
            elif kind == "row0":
                n_, c_, _, w_ = v.shape
                y = c.quantized_strided_copy(v, [n_, c_, 1, w_], [w_ * c_], [1], 0)
            elif kind == "linear":
                y = c.quantized_linear(v, b("w"), b("ks"), 3, -2, b("m"), b("s"), -128, 127)
            elif kind == "avgpool":
                y = c.quantized_avg_pool2d(v, [spec[2]] * 2, [spec[2]] * 2, [0, 0], -128, 127)
            elif kind == "maxpool":
                y = c.quantized_max_pool2d(v, [spec[2]] * 2, [spec[3]] * 2, [0, 0], -128, 127)
            else:  # reshape
                y = torch.reshape(v, spec[2])
            values.append(y)
        outs = tuple(c.dequantize_per_tensor(values[i], 0.1, 1) for i in self.outputs)
        return outs if len(outs) > 1 else outs[0]


def export(program: Program):
    return torch.export.export(program, (torch.randn(program.input_shape),))


def node_named(ep, name):
    return next(n for n in ep.graph.nodes if n.name == name)


def nodes_of(ep, op_name):
    return [n for n in ep.graph.nodes if n.op == "call_function" and op_name_of(n.target) == op_name]


# ============================================================================ independent checks
def c_bytes(t: torch.Tensor) -> torch.Tensor:
    """The bytes of a graph tensor in the C buffer (NHWC for 4-D)."""
    if t.dim() == 4:
        t = t.permute(0, 2, 3, 1)
    return t.contiguous().reshape(-1)


def from_c_bytes(buf: torch.Tensor, shape) -> torch.Tensor:
    if len(shape) == 4:
        n, c, h, w = shape
        return buf.reshape(n, h, w, c).permute(0, 3, 1, 2)
    return buf.reshape(shape)


def shares_bytes_by_values(in_shape, out_shape) -> bool:
    """Checker's own alias rule: do the input's and the output's C bytes hold the same values?"""
    t = torch.arange(torch.Size(in_shape).numel(), dtype=torch.int64).reshape(in_shape)
    return torch.equal(c_bytes(t), c_bytes(t.reshape(out_shape)))


def graph_lifetimes(ep):
    """Independent lifetimes: {tensor: (storage, first, last)}, steps, and in-place candidates."""
    steps, storage = [], {}
    for n in ep.graph.nodes:
        if n.op != "call_function":
            continue
        name = op_name_of(n.target)
        if name == "quantize_per_tensor":
            storage[n.name] = n.name
        elif n.target == RESHAPE:
            src = n.args[0]
            if shares_bytes_by_values(tuple(src.meta["val"].shape), tuple(n.meta["val"].shape)):
                storage[n.name] = storage[src.name]
            else:
                storage[n.name] = n.name
                steps.append(n)
        elif name != "dequantize_per_tensor":
            storage[n.name] = n.name
            steps.append(n)
    index = {n.name: i for i, n in enumerate(steps)}
    span = {s: [index.get(s, -1), index.get(s, -1)] for s in set(storage.values())}
    for n in ep.graph.nodes:
        for a in n.all_input_nodes:
            if a.name in storage:
                st = storage[a.name]
                if n.op == "call_function" and op_name_of(n.target) == "dequantize_per_tensor":
                    span[st][1] = len(steps)
                elif n.name in index:
                    span[st][1] = max(span[st][1], index[n.name])
    return {t: (s, *span[s]) for t, s in storage.items()}, steps


def overlap(a0, a1, b0, b1):
    return a0 < b1 and b0 < a1


ELEMENTWISE = {"quantized_add", "quantized_sub", "quantized_mul", "quantized_div", "quantized_maximum",
               "quantized_minimum", "quantized_lut"}  # ops whose output byte k reads only operand byte k


def flat(plan, a: TensorAlloc) -> TensorAlloc:
    """An arena buffer at its address in the memory regions laid end to end (each region's arena
    after the previous ones'), so that buffers of different regions never share an address; the
    offset as it is without regions."""
    base = {r.name: sum(q.nbytes for q in plan.regions[:k]) for k, r in enumerate(plan.regions)}
    return dataclasses.replace(a, offset=a.offset + base.get(a.memory, 0)) if a.region == "arena" else a


def check_plan(ep, plan, target):
    """With memory regions: every arena buffer inside its region's arena (within its capacity), and
    the checks below on the regions laid end to end (:func:`flat`)."""
    life, steps = graph_lifetimes(ep)
    assert plan.step_nodes == [n.name for n in steps]
    assert set(plan.tensors) == set(life)
    al = plan.alignment
    assert al == 16
    if plan.regions:
        size = {r.name: r.nbytes for r in plan.regions}
        assert sum(size.values()) == plan.arena_bytes
        for r in plan.regions:
            assert r.nbytes % al == 0 and (r.capacity is None or r.nbytes <= r.capacity), r
        for t, a in [*plan.tensors.items(), *plan.scratch.items()]:
            if a.region == "arena":
                assert a.memory in size and a.offset + a.nbytes <= size[a.memory], (t, a)
        plan = dataclasses.replace(plan, tensors={t: flat(plan, a) for t, a in plan.tensors.items()},
                                   scratch={t: flat(plan, a) for t, a in plan.scratch.items()})
    arena = {t: a for t, a in plan.tensors.items() if a.region == "arena"}
    for t, a in list(arena.items()) + list(plan.scratch.items()):
        assert a.offset % al == 0 and a.offset >= 0 and a.offset + a.nbytes <= plan.arena_bytes, (t, a)
    assert plan.arena_bytes % al == 0
    # program inputs live in the caller's input buffer, outputs in the caller's output buffer
    for n in nodes_of(ep, "quantize_per_tensor"):
        assert plan.tensors[n.name].region == "input"
    for n in nodes_of(ep, "dequantize_per_tensor"):
        src = n.args[0].name
        assert plan.tensors[src].region in ("output", "input") or (src, 0) in plan.copies
    # pairs of storage groups: overlap in time and bytes only for documented aliases / in-place adds
    groups = {}
    for t, (st, first, last) in life.items():
        if t in arena:
            groups.setdefault(st, (arena[st].offset, arena[st].nbytes, first, last))
            assert (arena[t].offset, arena[t].nbytes) == (arena[st].offset, arena[st].nbytes), t  # alias
    in_place_ok = set()  # (input storage, op) pairs whose family declares the kernel may write in place
    for n in steps:
        name = op_name_of(n.target)
        in_place = hook_for(name, Hook.IN_PLACE_INPUTS) if name is not None else None
        for i in (in_place(n) if in_place else ()):
            a = n.args[i]
            if isinstance(a, torch.fx.Node) and a.name in life:
                st = life[a.name][0]
                if st in groups and life[a.name][2] == steps.index(n):
                    in_place_ok.add(frozenset((st, n.name)))
    # the checker's own rule for in-place kernels (plan.in_place_kernels): a depthwise conv of depth
    # multiplier 1, channel by channel (output byte p * C + c overwrites input byte p * C + c of the
    # already copied channel c), output starting at its input's first byte, no larger, the input
    # dying at that step; its temporary (scratch) holds one input channel of every batch
    in_place_dw = set()
    for n in steps:
        if n.name not in getattr(plan, "in_place_kernels", ()):
            continue
        a, out = n.args[0], plan.tensors[n.name]
        assert op_name_of(n.target) == "quantized_depthwise_conv2d" and int(n.args[6]) == 1, n.name
        assert a.meta["val"].shape[1] == n.meta["val"].shape[1] and out.nbytes <= arena[a.name].nbytes, n.name
        assert arena[a.name].offset == out.offset and life[a.name][2] == steps.index(n), n.name
        assert plan.in_place.get(n.name) in (a.name, life[a.name][0]), n.name
        in_place_dw.add(frozenset((life[a.name][0], n.name)))
    # the checker's own rule for in-place steps: only elementwise ops whose output byte k is computed
    # from byte k of the overwritten operand (same bytes, same shape); no other operand of the step
    # may read the overwritten bytes through a view (it would see output bytes)
    for n in steps:
        out = plan.tensors.get(n.name)
        if out is None or out.region != "arena":
            continue
        args = [a for a in n.args if isinstance(a, torch.fx.Node) and a.name in arena]
        hit = [a for a in args if overlap(arena[a.name].offset, arena[a.name].offset + arena[a.name].nbytes,
                                          out.offset, out.offset + out.nbytes)
               and life[a.name][2] >= steps.index(n) >= life[a.name][1]]
        if n.name in getattr(plan, "in_place_kernels", ()):
            assert [a.name for a in hit] == [n.args[0].name], (n.name, [a.name for a in hit])
            continue
        for a in hit:
            assert op_name_of(n.target) in ELEMENTWISE, (n.name, a.name)
            assert (arena[a.name].offset, arena[a.name].nbytes) == (out.offset, out.nbytes), (n.name, a.name)
            assert tuple(a.meta["val"].shape) == tuple(n.meta["val"].shape), (n.name, a.name)
            assert all(b.name == a.name for b in hit), (n.name, [b.name for b in hit])
    names = sorted(groups)
    for i, x in enumerate(names):
        ox, nx, fx, lx = groups[x]
        for y in names[i + 1:]:
            oy, ny, fy, ly = groups[y]
            if fx <= ly and fy <= lx and overlap(ox, ox + nx, oy, oy + ny):
                pair = frozenset((x, y))
                assert (pair in in_place_ok and (ox, nx) == (oy, ny)) or (pair in in_place_dw and ox == oy), (x, y)
    # scratch overlaps nothing live at its step
    for s, n in enumerate(steps):
        want = 0
        if n.name in getattr(plan, "in_place_kernels", ()):  # one input channel of every batch
            b, _, h, w = n.args[0].meta["val"].shape
            want = b * h * w
        elif n.target != RESHAPE:  # the scratch of the provider running the step (the plan's kernels)
            want = choose_provider(resolve_providers(plan.kernels), n, target)[0].scratch_bytes(n, target)
        got = plan.scratch.get(n.name)
        assert (got.nbytes if got else 0) == want
        if got:
            for st, (o, nb, f, l) in groups.items():
                if f <= s <= l:
                    assert not overlap(got.offset, got.offset + got.nbytes, o, o + nb), (n.name, st)
    # the lower bound, recomputed
    live = [sum(nb for (o, nb, f, l) in groups.values() if f <= s <= l)
            + (plan.scratch[n.name].nbytes if n.name in plan.scratch else 0) for s, n in enumerate(steps)]
    assert plan.steps == live
    assert plan.lower_bound_bytes == max(live, default=0)


def simulate(ep, plan, x, seed=0):
    """Run the program on the planned byte buffers; return the dequantized outputs."""
    gen = torch.Generator().manual_seed(seed)
    garbage = lambda n: torch.randint(-128, 128, (n,), generator=gen, dtype=torch.int8)  # noqa: E731
    if plan.regions:  # one buffer per memory region's arena
        buffers = {("arena", r.name): garbage(r.nbytes) for r in plan.regions}
    else:
        buffers = {("arena", ""): garbage(plan.arena_bytes)}
    for a in plan.tensors.values():
        if a.region != "arena":
            key = (a.region, a.index)
            buffers[key] = garbage(max(a.nbytes, buffers[key].numel() if key in buffers else 0))

    def region(a: TensorAlloc):
        return buffers[(a.region, a.index if a.region != "arena" else a.memory)]

    def read(node):
        a = plan.tensors[node.name]
        return from_c_bytes(region(a)[a.offset:a.offset + a.nbytes].clone(), tuple(node.meta["val"].shape))

    def write(node, value):
        a = plan.tensors[node.name]
        region(a)[a.offset:a.offset + a.nbytes] = c_bytes(value)

    env, outputs = {}, []
    user_inputs = list(ep.graph_signature.user_inputs)
    for n in ep.graph.nodes:
        if n.op == "placeholder":
            const = constant_tensor(ep, n)
            env[n.name] = const if const is not None else x[user_inputs.index(n.name)]
        elif n.op == "output":
            outputs = [env[a.name] for a in n.args[0]]
        elif n.target == RESHAPE:
            if not reshape_is_alias(n):
                write(n, torch.reshape(read(n.args[0]), n.args[1]))
        else:
            if n.name in plan.scratch:
                s = plan.scratch[n.name]
                buffers[("arena", s.memory)][s.offset:s.offset + s.nbytes] = garbage(s.nbytes)
            if n.name in getattr(plan, "in_place_kernels", ()):  # channel by channel, as the C kernel
                inp, y = read(n.args[0]), None
                a_in, a_out = plan.tensors[n.args[0].name], plan.tensors[n.name]
                y = n.target(*[read(a) if isinstance(a, torch.fx.Node) and a.name in plan.tensors
                               else env[a.name] if isinstance(a, torch.fx.Node) else a for a in n.args])
                buf, want_in, got_out = region(a_in), c_bytes(inp), c_bytes(y)
                ch = inp.shape[1]
                for c in range(ch):  # input channel c must still be intact when its turn comes
                    assert torch.equal(buf[a_in.offset + c:a_in.offset + a_in.nbytes:ch], want_in[c::ch]), (n.name, c)
                    buf[a_out.offset + c:a_out.offset + a_out.nbytes:ch] = got_out[c::ch]
                continue
            args = [read(a) if isinstance(a, torch.fx.Node) and a.name in plan.tensors
                    else env[a.name] if isinstance(a, torch.fx.Node) else a for a in n.args]
            y = n.target(*args)
            if n.name in plan.tensors:
                write(n, y)
            else:
                env[n.name] = y
    return outputs


def check_deployment_plan(program: Program, deployment, in_place=True, seed=1):
    """Plan ``program`` for a :class:`corten.deployment.Deployment` (memory regions, kernels), check
    the plan (:func:`check_plan`) and re-run it on its bytes (:func:`simulate`); (ep, plan)."""
    ep = export(program)
    plan = plan_memory(ep, deployment, in_place=in_place)
    check_plan(ep, plan, deployment.target)
    x = torch.randn(program.input_shape, generator=torch.Generator().manual_seed(seed))
    want = ep.module()(x)
    want = list(want) if isinstance(want, tuple) else [want]
    assert all(torch.equal(g, w) for g, w in zip(simulate(ep, plan, [x], seed), want))
    return ep, plan


def check_program(program: Program, target="cortex-m55", in_place=True, seed=0):
    ep = export(program)
    target = get_target(target)
    plan = plan_memory(ep, target, in_place=in_place)
    check_plan(ep, plan, target)
    x = torch.randn(program.input_shape, generator=torch.Generator().manual_seed(seed))
    want = ep.module()(x)
    want = list(want) if isinstance(want, tuple) else [want]
    got = simulate(ep, plan, [x], seed)
    for g, w in zip(got, want):
        assert torch.equal(g, w)
    return ep, plan


# ============================================================================ plans of small programs
RESIDUAL = [
    ("conv", 0, 8, 3, 1, 1),  # 1: [1, 8, 8, 8]
    ("conv", 1, 16, 1, 1, 0),  # 2: expand
    ("dw", 2, 3, 1, 1, 1),  # 3
    ("conv", 3, 8, 1, 1, 0),  # 4: project
    ("add", 4, 1),  # 5: residual; both inputs die here
    ("conv", 5, 8, 3, 2, 1),  # 6: [1, 8, 4, 4]
    ("avgpool", 6, 4),  # 7: [1, 8, 1, 1]
    ("reshape", 7, (1, 8)),  # 8: alias (H*W == 1)
    ("linear", 8, 10),  # 9
]


@pytest.mark.parametrize("isa", sorted(ISAS))
def test_residual_program_plan_is_valid_on_every_isa(isa):
    ep, plan = check_program(Program((1, 3, 8, 8), RESIDUAL), ISAS[isa])
    add = nodes_of(ep, "quantized_add")[0]
    assert plan.in_place == {add.name: add.args[0].name}  # the project conv's output
    assert plan.tensors[add.name].offset == plan.tensors[add.args[0].name].offset
    assert plan.arena_bytes <= plan.lower_bound_bytes
    assert plan.isa == isa


def test_in_place_add_reuses_input_and_can_be_disabled():
    program = Program((1, 3, 8, 8), RESIDUAL)
    ep, with_in_place = check_program(program, in_place=True)
    _, without = check_program(program, in_place=False)
    add = nodes_of(ep, "quantized_add")[0]
    assert without.in_place == {}
    conv_out = add.args[0].name
    assert without.tensors[add.name].offset != without.tensors[conv_out].offset
    assert with_in_place.lower_bound_bytes == without.lower_bound_bytes


def test_add_does_not_overwrite_an_input_still_needed_later():
    # value 1 feeds the add and a later conv: the add must not write over it; value 2 dies at the add
    specs = [("conv", 0, 8, 3, 1, 1), ("conv", 1, 8, 1, 1, 0), ("add", 1, 2), ("add", 3, 1)]
    ep, plan = check_program(Program((1, 3, 6, 6), specs))
    first_add, second_add = nodes_of(ep, "quantized_add")
    assert plan.in_place.get(first_add.name) == first_add.args[1].name
    assert plan.tensors[first_add.name].offset != plan.tensors[first_add.args[0].name].offset
    # the second add feeds the program output: it is written to the caller's output buffer
    assert plan.tensors[second_add.name].region == "output"
    assert second_add.name not in plan.in_place


def test_add_of_the_program_input_is_never_in_place():
    specs = [("conv", 0, 3, 1, 1, 0), ("add", 0, 1), ("conv", 2, 4, 1, 1, 0)]
    ep, plan = check_program(Program((1, 3, 4, 4), specs))
    assert plan.in_place != {} and all(src != "quantize_per_tensor" for src in plan.in_place.values())
    assert plan.tensors["quantize_per_tensor"].region == "input"


@pytest.mark.parametrize("kind", ["sub", "mul", "max", "min"])
def test_elementwise_ops_write_in_place_over_an_input_that_dies(kind):
    # value 2 dies at the op (same shape as the output), value 1 is read later: the op takes 2's bytes
    specs = [("conv", 0, 8, 3, 1, 1), ("conv", 1, 8, 1, 1, 0), (kind, 1, 2), ("add", 3, 1), ("conv", 4, 4, 1, 1, 0)]
    ep, plan = check_program(Program((1, 3, 6, 6), specs))
    op = next(n for n in ep.graph.nodes if n.op == "call_function" and op_name_of(n.target) ==
              {"sub": "quantized_sub", "mul": "quantized_mul", "max": "quantized_maximum",
               "min": "quantized_minimum"}[kind])
    assert plan.in_place.get(op.name) == op.args[1].name
    assert plan.tensors[op.name].offset == plan.tensors[op.args[1].name].offset
    _, without = check_program(Program((1, 3, 6, 6), specs), in_place=False)
    assert plan.arena_bytes < without.arena_bytes


@pytest.mark.parametrize("kind", ["mul", "max"])
def test_broadcast_operand_decides_in_place(kind):
    # the SE gate [1, 8, 1, 1] dies at the op but is smaller than the output: not in place; the
    # full operand dies too and is taken
    specs = [("conv", 0, 8, 3, 1, 1), ("avgpool", 1, 6), ("conv", 1, 8, 1, 1, 0), (kind, 3, 2),
             ("conv", 4, 4, 1, 1, 0)]
    ep, plan = check_program(Program((1, 3, 6, 6), specs))
    op = nodes_of(ep, {"mul": "quantized_mul", "max": "quantized_maximum"}[kind])[0]
    assert plan.in_place.get(op.name) == op.args[0].name


def test_operand_reading_the_same_bytes_through_a_view_blocks_in_place():
    # x * x[:, :, 0:1, :]: x dies at the mul, but its row 0 (a view, read for every output row)
    # would be overwritten by the first output row: the mul must get bytes of its own
    # (graph_lifetimes does not model strided-copy views: plan + byte simulation only)
    program = Program((1, 3, 6, 6), [("conv", 0, 8, 3, 1, 1), ("row0", 1), ("mul", 1, 2), ("conv", 3, 4, 1, 1, 0)])
    ep = export(program)
    plan = plan_memory(ep, get_target("cortex-m55"))
    mul = nodes_of(ep, "quantized_mul")[0]
    row0 = mul.args[1]
    assert plan.tensors[row0.name].offset == plan.tensors[mul.args[0].name].offset  # a view indeed
    assert mul.name not in plan.in_place
    assert not overlap(plan.tensors[mul.name].offset, plan.tensors[mul.name].offset + plan.tensors[mul.name].nbytes,
                       plan.tensors[row0.name].offset, plan.tensors[row0.name].offset + plan.tensors[row0.name].nbytes)
    x = torch.randn(program.input_shape, generator=torch.Generator().manual_seed(0))
    assert torch.equal(simulate(ep, plan, [x])[0], ep.module()(x))
    # same full operand twice (x * x) is fine
    ep, plan = check_program(Program((1, 3, 6, 6), [("conv", 0, 8, 3, 1, 1), ("mul", 1, 1), ("conv", 2, 4, 1, 1, 0)]))
    mul = nodes_of(ep, "quantized_mul")[0]
    assert plan.in_place.get(mul.name) == mul.args[0].name


def test_reshape_alias_and_copy():
    specs = [
        ("conv", 0, 4, 3, 1, 1),  # 1: [1, 4, 5, 5]
        ("reshape", 1, (1, 100)),  # 2: NHWC -> NCHW order: copy
        ("linear", 2, 36),  # 3
        ("reshape", 3, (1, 4, 3, 3)),  # 4: NCHW order -> NHWC: copy
        ("conv", 4, 8, 3, 1, 0),  # 5: [1, 8, 1, 1]
        ("reshape", 5, (1, 8)),  # 6: alias
        ("reshape", 6, (1, 8, 1, 1)),  # 7: alias
        ("reshape", 7, (1, 1, 2, 4)),  # 8: alias (C == 1)
    ]
    ep, plan = check_program(Program((1, 3, 5, 5), specs))
    reshapes = [n for n in ep.graph.nodes if n.target == RESHAPE]
    assert [reshape_is_alias(n) for n in reshapes] == [False, False, True, True, True]
    assert plan.step_ops.count("reshape_copy") == 2
    copy1 = reshapes[0]
    assert plan.tensors[copy1.name].offset != plan.tensors[copy1.args[0].name].offset
    # the aliases of the last conv's output all sit in the caller's output buffer with it
    conv_out = reshapes[2].args[0].name
    assert {plan.tensors[n.name].region for n in reshapes[2:]} == {"output"}
    assert plan.tensors[conv_out].region == "output"


def test_reshape_alias_rule_on_shapes():
    from corten.memory.views import shapes_share_bytes
    cases = {((1, 16, 5, 5), (1, 400)): False, ((1, 400), (1, 16, 5, 5)): False,
             ((1, 1280, 1, 1), (1, 1280)): True, ((1, 1, 5, 5), (1, 25)): True,
             ((1, 8, 4, 4), (1, 8, 16, 1)): True, ((1, 8, 4, 4), (1, 8, 2, 8)): True, ((1, 8, 4, 4), (1, 4, 8, 4)): False,
             ((2, 3, 1, 1), (6,)): True, ((1, 10), (2, 5)): True}
    for (a, b), want in cases.items():
        assert shapes_share_bytes(a, b) == want == shares_bytes_by_values(a, b), (a, b)


def test_output_also_consumed_later_stays_in_output_buffer():
    # value 1 is a program output and feeds a later conv
    specs = [("conv", 0, 4, 1, 1, 0), ("conv", 1, 4, 1, 1, 0)]  # 1x1 convs: no scratch on MVE
    ep, plan = check_program(Program((1, 3, 5, 5), specs, outputs=(1, 2)))
    convs = nodes_of(ep, "quantized_conv2d")
    assert plan.tensors[convs[0].name] == TensorAlloc("output", 0, 100, 0)
    assert plan.tensors[convs[1].name] == TensorAlloc("output", 0, 100, 1)
    assert plan.arena_bytes == 0 and plan.copies == []


def test_input_returned_as_output_and_duplicate_outputs_are_copied():
    specs = [("reshape", 0, (1, 1, 3, 3)), ("conv", 0, 2, 1, 1, 0)]
    ep, plan = check_program(Program((1, 1, 9, 1), specs, outputs=(1, 2, 2)))
    conv_node = nodes_of(ep, "quantized_conv2d")[0]
    assert plan.tensors["quantize_per_tensor"].region == "input"
    assert plan.copies == [("quantize_per_tensor", 0), (conv_node.name, 2)]
    assert plan.tensors[conv_node.name].region == "output" and plan.tensors[conv_node.name].index == 1


def test_max_pool_and_strided_program_on_dsp():
    specs = [("conv", 0, 8, 3, 1, 1), ("maxpool", 1, 2, 2), ("dw", 2, 5, 1, 2, 1), ("dw", 3, 3, 1, 1, 2),
             ("conv", 4, 4, 1, 2, 0)]
    ep, plan = check_program(Program((1, 3, 10, 10), specs), "cortex-m4")
    dws = nodes_of(ep, "quantized_depthwise_conv2d")
    assert plan.scratch[dws[0].name].nbytes == 8 * 25 * 2  # DSP opt kernel
    assert dws[1].name not in plan.scratch  # depth multiplier 2: generic kernel


def test_unlowered_program_is_refused():
    class Float(torch.nn.Module):
        def forward(self, x):
            return torch.relu(x)

    ep = torch.export.export(Float(), (torch.randn(2, 3),))
    with pytest.raises(MemoryPlanError, match="not lowered"):
        plan_memory(ep, "cortex-m4")


# ============================================================================ hooks on exported nodes
def test_scratch_hooks_read_node_shapes():
    specs = [("conv", 0, 8, 3, 2, 1), ("dw", 1, 3, 1, 1, 1), ("conv", 2, 16, 1, 1, 0), ("avgpool", 3, 4),
             ("reshape", 4, (1, 16)), ("linear", 5, 10)]
    ep = export(Program((1, 3, 8, 8), specs))
    expected = {  # plain, dsp, mve
        "quantized_conv2d": [(112, 112, 128), (0, 32, 0)],  # stem 3x3x3; 1x1 on 8 channels (armclang DSP)
        "quantized_depthwise_conv2d": [(0, 0, 4464)],
        "quantized_avg_pool2d": [(0, 64, 0)],
        "quantized_linear": [(0, 0, 0)],  # kernel sums are a constant: no arena scratch
    }
    for op_name, rows in expected.items():
        for node, row in zip(nodes_of(ep, op_name), rows):
            got = tuple(CMSIS_NN.scratch_bytes(node, get_target(ISAS[isa])) for isa in ("plain", "dsp", "mve"))
            assert got == row, (op_name, node.name)


# ============================================================================ placement
def test_best_fit_takes_the_tightest_gap():
    bufs = [Buffer("a", 32, 0, 0), Buffer("b", 16, 0, 5), Buffer("c", 48, 0, 0), Buffer("d", 16, 1, 1),
            Buffer("e", 32, 2, 2)]
    offs = best_fit(bufs)
    assert offs == {"a": 0, "b": 32, "c": 48, "d": 0, "e": 0}
    offsets, _ = pack(bufs)
    for i, x in enumerate(bufs):
        for y in bufs[i + 1:]:
            if x.conflicts(y):
                assert not overlap(offsets[x.key], offsets[x.key] + x.size, offsets[y.key], offsets[y.key] + y.size)


def _assert_no_overlap(bufs, offsets):
    for i, x in enumerate(bufs):
        for y in bufs[i + 1:]:
            if x.conflicts(y):
                assert not overlap(offsets[x.key], offsets[x.key] + x.size, offsets[y.key], offsets[y.key] + y.size)


def test_pack_lifts_the_top_buffers_to_the_lower_bound():
    # every greedy visiting order leaves a gap here (208 B); lifting the buffers that reach the top
    # towards the front of the order closes it: the packing meets the lower bound (176 B live at step 2)
    bufs = [Buffer("a", 64, 2, 4), Buffer("b", 64, 4, 5), Buffer("c", 32, 2, 3), Buffer("d", 32, 0, 1),
            Buffer("e", 48, 1, 2), Buffer("f", 48, 3, 4), Buffer("g", 16, 2, 2), Buffer("h", 64, 1, 1)]
    greedy = min(arena_size(bufs, best_fit(order)) for order in visiting_orders(bufs).values())
    offsets, strategy = pack(bufs)
    assert greedy == 208 and arena_size(bufs, offsets) == lower_bound(bufs) == 176 and strategy.endswith("+lift")
    _assert_no_overlap(bufs, offsets)
    rng = random.Random(3)  # random buffer sets: never worse than the greedy orders, never overlapping
    for _ in range(300):
        bufs = [Buffer(str(k), 16 * rng.randrange(1, 5), f, f + rng.randrange(0, 3))
                for k, f in enumerate(rng.randrange(0, 6) for _ in range(rng.randrange(2, 10)))]
        offsets, _ = pack(bufs)
        _assert_no_overlap(bufs, offsets)
        greedy = min(arena_size(bufs, best_fit(order)) for order in visiting_orders(bufs).values())
        assert lower_bound(bufs) <= arena_size(bufs, offsets) <= greedy


def test_random_programs_plans_are_valid():
    rng = random.Random(7)
    for trial in range(3):
        specs, channels = [], [3]
        for i in range(8):
            src = rng.randrange(len(channels))
            kind = rng.choice(["conv", "conv", "dw", "add"])
            if kind == "add":
                same = [j for j, c in enumerate(channels) if c == channels[src] and j != src]
                if not same:
                    kind = "conv"
                else:
                    specs.append(("add", src, rng.choice(same)))
                    channels.append(channels[src])
                    continue
            if kind == "conv":
                c, k = rng.choice([4, 8]), rng.choice([1, 3])
                specs.append(("conv", src, c, k, 1, (k - 1) // 2))
                channels.append(c)
            else:
                specs.append(("dw", src, 3, 1, 1, 1))
                channels.append(channels[src])
        check_program(Program((1, 3, 6, 6), specs, seed=trial), rng.choice(list(ISAS.values())), seed=trial)


# ============================================================================ budgets
def test_budget_errors_name_what_does_not_fit():
    ep, plan = check_program(Program((1, 3, 8, 8), RESIDUAL))
    check_budget(plan, plan.arena_bytes, plan.constant_bytes)  # fits exactly
    check_budget(plan, None, None)
    with pytest.raises(BudgetError) as err:
        check_budget(plan, plan.arena_bytes - 100, None)
    msg = str(err.value)
    assert "over by 100 B" in msg and f"step {plan.peak_step}" in msg and plan.peak_node in msg
    for t in plan.live_tensors(plan.peak_step):
        assert t in msg
    with pytest.raises(BudgetError, match=r"of flash.*over by 1 B"):
        check_budget(plan, None, plan.constant_bytes - 1)


def test_constant_bytes_count_every_constant_tensor():
    ep, plan = check_program(Program((1, 3, 8, 8), RESIDUAL))
    want = sum(t.numel() * t.element_size() for t in ep.state_dict.values())
    assert plan.constant_bytes == want
    # conv 3x3 3->8: w 216 + b 32 + mult 32 + shift 32
    assert want > 216 + 96


def test_report_and_summary():
    ep, plan = check_program(Program((1, 3, 8, 8), RESIDUAL))
    text = plan.report()
    assert f"{plan.arena_bytes:,}" in text and f"{plan.lower_bound_bytes:,}" in text
    assert plan.peak_node in text and "constant (flash)" in text
    s = plan.summary()
    assert s["arena_bytes"] == plan.arena_bytes and s["peak_node"] == plan.peak_node
    assert s["ratio"] == round(plan.arena_bytes / plan.lower_bound_bytes, 4)


# ============================================================================ MobileNetV2-224
MV2_SETTINGS = [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2),
                (6, 320, 1, 1)]


def mobilenet_v2_specs(width: float = 1.0, resolution: int = 224):
    """MobileNetV2's op sequence (torchvision architecture) as Program specs."""
    def ch(c):  # torchvision's _make_divisible(c * width, 8)
        v = max(8, int(c * width + 4) // 8 * 8)
        return v + 8 if v < 0.9 * c * width else v

    specs = [("conv", 0, ch(32), 3, 2, 1)]
    c_in = ch(32)
    for t, c, n, s in MV2_SETTINGS:
        c = ch(c)
        for i in range(n):
            x = len(specs)
            stride = s if i == 0 else 1
            if t != 1:
                specs.append(("conv", len(specs), c_in * t, 1, 1, 0))
            specs.append(("dw", len(specs), 3, stride, 1, 1))
            specs.append(("conv", len(specs), c, 1, 1, 0))
            if stride == 1 and c_in == c:
                specs.append(("add", len(specs), x))
            c_in = c
    last = ch(1280) if width > 1.0 else 1280
    specs += [("conv", len(specs), last, 1, 1, 0), ("avgpool", len(specs) + 1, resolution // 32),
              ("reshape", len(specs) + 2, (1, last)), ("linear", len(specs) + 3, 1000)]
    return specs


@pytest.fixture(scope="module")
def mobilenet_v2():
    program = Program((1, 3, 224, 224), mobilenet_v2_specs())
    return program, export(program)


MV2_ACTIVATION_PEAK = 112 * 112 * 96 + 56 * 56 * 96  # block 2's depthwise: 1,505,280 B


@pytest.mark.parametrize("isa", sorted(ISAS))
def test_mobilenet_v2_arena_within_lower_bound(mobilenet_v2, isa):
    program, ep = mobilenet_v2
    target = get_target(ISAS[isa])
    ops = [op_name_of(n.target) for n in ep.graph.nodes if n.op == "call_function"]
    assert ops.count("quantized_conv2d") == 35 and ops.count("quantized_depthwise_conv2d") == 17
    assert ops.count("quantized_add") == 10
    plan = plan_memory(ep, target)
    check_plan(ep, plan, target)
    dw_scratch = 4 * 124 * 9 if isa == "mve" else 0
    assert plan.lower_bound_bytes == MV2_ACTIVATION_PEAK + dw_scratch
    assert plan.arena_bytes <= plan.lower_bound_bytes
    assert len(plan.in_place) == 10
    assert plan.tensors["quantize_per_tensor"] == TensorAlloc("input", 0, 224 * 224 * 3, 0)
    print(f"\nMobileNetV2-224 on {target.name} ({isa}): arena {plan.arena_bytes:,} B, lower bound "
          f"{plan.lower_bound_bytes:,} B, ratio {plan.ratio:.4f}, constants {plan.constant_bytes:,} B, "
          f"order {plan.strategy}\n{plan.report()}")


def test_small_mobilenet_v2_runs_bit_exact_on_its_plan():
    """The whole MobileNetV2 chain (width 0.35, 64x64) executed on the planned bytes."""
    program = Program((1, 3, 64, 64), mobilenet_v2_specs(0.35, 64))
    ep, plan = check_program(program, "cortex-m4")
    assert len(plan.in_place) == 10 and plan.arena_bytes <= plan.lower_bound_bytes


def test_program_input_read_without_quantize_is_refused():
    class Raw(torch.nn.Module):
        def forward(self, x):
            return torch.ops.corten.quantized_max_pool2d(x, [2, 2], [2, 2], [0, 0], -128, 127)

    ep = torch.export.export(Raw(), (torch.zeros(1, 2, 4, 4, dtype=torch.int8),))
    with pytest.raises(MemoryPlanError, match="reads program input 'x' directly"):
        plan_memory(ep, "cortex-m0")
