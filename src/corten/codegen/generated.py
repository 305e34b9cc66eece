"""Corten's generated kernels (``kernels="generated"``): one C function per layer, every constant known.

For the hot ops - ``quantized_conv2d`` (1x1 / pointwise and general, the first layer included),
``quantized_depthwise_conv2d`` (any kernel, stride and padding; depth multiplier 1) and
``quantized_linear`` - the generator writes a C function specialised for the layer (and for the
same-shape int8 add / sub and the unpadded average pool, :mod:`corten.codegen.generated_elementwise`): shapes,
strides, padding, zero points and the activation clamp are literals; the blocks it calls
(``codegen/kernels/corten_gen.h``) are always inlined, so the compiler sees fixed trip counts and
immediate offsets.  What is done ahead of time:

* **Zero point folded into the bias.**  ``acc = bias + sum (x + input_offset) * w`` over the taps
  inside the input equals ``bias_k + sum x * w`` with ``bias_k = bias + input_offset * sum w`` over
  those taps.  The output is split into *segments* (runs of rows x runs of columns) whose windows
  see the same kernel taps inside the input; each segment has its own folded-bias table
  (``_bias``, one row of ``C_out`` per segment class), so padding costs nothing in the inner loop
  and no window is copied (no im2col, also none for depthwise) - except small windows (first layers,
  C_in 1..3), gathered into a stack buffer with the input zero point where they leave the input.
* **Weights in inner-loop order.**  Dense layers keep CMSIS-NN's OHWI int8 rows (a window row
  ``kW * C_in`` is contiguous in NHWC, so each kernel row is one dot product of constant length);
  the DSP depthwise path reads weights pre-widened to int16 pairs in ``SXTB16`` order
  (``(w0, w2), (w1, w3)`` per four channels, ``_w16``), one word per two channels.
* **Epilogue tables in the order the epilogue reads them**: ``_q`` holds per output channel
  ``{multiplier, right shift, 2**right, left shift}`` (short epilogue; the scalar one with the output
  offset folded into the rounding constant where :func:`offset_folds` allows) or ``{multiplier, shift}``
  (general), interleaved for the scalar epilogues, planar for the Helium one.  DSP layers whose
  products all read widened weights store them and the biases doubled (:func:`doubles`), so the
  short epilogue's ``SMMULR(2a, m)`` needs no shift.
* **Register tiles**: 2 pixels x 2 output channels per dense dot product (4 accumulators: 13 live
  registers on a Cortex-M4, no spill), 3 pixels x 2 output channels over inputs widened once per tile
  for the DSP pointwise layers (:func:`_pointwise_asm`), 2 pixels x 4 filters over windows gathered
  widened into a stack buffer for DSP layers with small windows (first layers, :func:`_windows_dsp`),
  four channels per depthwise step (DSP) or per vector (MVE);
  on Helium 2 pixels x 4 filters per VMLADAVA tile (a per-layer assembly loop over the filter groups,
  ``mve_tile_asm``) and 16 depthwise channels per step (a per-layer assembly row function,
  ``dw16_function``), both requantizing whole vectors after the sums.
* **ISA paths**: ``plain`` scalar C (Cortex-M0/M3), ``dsp`` (``__sxtb16``/``__smlad``/``__smlabb``,
  Cortex-M4/M7/M33), ``mve`` (``vmladavaq_s8``, ``vldrbq_s32``/``vmulq_s32``, ``VMULLB/T.S8``, a
  4-lane epilogue; Cortex-M55/M85).  On a host, ``corten_gen.h`` defines the DSP primitives in C, so
  the DSP path's C is tested byte for byte on the host too; the MVE blocks' C equivalents
  (``cg_tiles_c``, ``cg_dw16_c``) run there with the same tables, the MVE blocks on QEMU.

Exactness.  The requantization is CMSIS-NN's ``arm_nn_requantize`` (``corten_requantize``).  The
*short* epilogue (``cg_requant_short``: one 32x32->64 multiply-add, three ALU operations) is used
only when :func:`short_epilogue_ok` proves it equal: multipliers >= 0 and every accumulator
``|acc| * 2**left < 2**30`` (bounded from the weights and the folded biases: ``|acc| <= |bias_k| +
128 * sum |w|``); then ``doubling_high_mult_no_sat`` is ``(a*m + 2**30) >> 31`` and the rounding
right shift cannot overflow.  Otherwise the layer uses the general function.  A layer whose
accumulator bound reaches 2**31 is not generated at all (the reference wraps int32; the SIMD
instructions would too, but C may not), and falls back.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch

from corten.codegen.generated_elementwise import ADD_OPS, POOL_OPS
from corten.errors import CodegenError
from corten.providers import KernelStep, Provider, register_provider

LAYER_OPS = ("quantized_conv2d", "quantized_depthwise_conv2d", "quantized_linear")
GEN_OPS = LAYER_OPS + ADD_OPS + POOL_OPS
ISAS = ("plain", "dsp", "mve")
INT32_LIMIT = 2**31
SHORT_LIMIT = 2**30
HEADER = "corten_gen.h"


@dataclass
class LayerSpec:
    """Everything the generator needs about one layer (all integers known at compile time).

    ``kind``: "conv" (``weight`` OHWI ``[C_out, kH, kW, C_in]``; linear layers are 1x1 convs over
    ``W = batches`` pixels) or "depthwise" (``weight`` ``[kH, kW, C]``).  ``bias`` int64 ``[C_out]``
    (zeros when the op has none).  ``padding`` is the leading (top, left) padding; the output size
    gives the rest."""

    kind: str
    n: int
    h: int
    w: int
    c_in: int
    ho: int
    wo: int
    c_out: int
    kh: int
    kw: int
    stride: tuple[int, int]
    padding: tuple[int, int]
    weight: torch.Tensor
    bias: torch.Tensor
    input_offset: int
    output_offset: int
    multiplier: torch.Tensor
    shift: torch.Tensor
    act_min: int
    act_max: int

    @property
    def macs(self) -> int:
        per = self.kh * self.kw * (self.c_in if self.kind == "conv" else 1)
        return self.n * self.ho * self.wo * self.c_out * per


@dataclass(frozen=True)
class Segment:
    """Output rows ``[oy0, oy1)`` x columns ``[ox0, ox1)`` whose windows see kernel rows ``[i0, i1)`` and
    columns ``[j0, j1)`` inside the input; ``cls`` indexes the folded-bias table."""

    oy0: int
    oy1: int
    ox0: int
    ox1: int
    i0: int
    i1: int
    j0: int
    j1: int
    cls: int


@dataclass
class GeneratedLayer:
    """The C of one layer: ``functions`` (defined before ``<name>_steps``), the ``call`` statement,
    and ``what`` (strategy, for the report)."""

    functions: str
    call: str
    what: str
    short_epilogue: bool
    arrays: dict[str, str] = field(default_factory=dict)  # suffix -> C name


def _runs(n_out: int, k: int, stride: int, pad: int, size: int) -> list[tuple[int, int, int, int]]:
    """Maximal runs ``(o0, o1, t0, t1)`` of outputs whose window taps ``[t0, t1)`` are inside the input."""
    runs: list[list[int]] = []
    for o in range(n_out):
        t0 = max(0, pad - o * stride)
        t1 = min(k, size + pad - o * stride)
        t1 = max(t0, t1)
        if runs and runs[-1][2:] == [t0, t1]:
            runs[-1][1] = o + 1
        else:
            runs.append([o, o + 1, t0, t1])
    return [tuple(r) for r in runs]  # type: ignore[misc]


def segments(spec: LayerSpec) -> tuple[list[Segment], list[tuple[int, int, int, int]]]:
    """The output segments and the distinct tap boxes ``(i0, i1, j0, j1)`` (one bias class each)."""
    rows = _runs(spec.ho, spec.kh, spec.stride[0], spec.padding[0], spec.h)
    cols = _runs(spec.wo, spec.kw, spec.stride[1], spec.padding[1], spec.w)
    boxes: list[tuple[int, int, int, int]] = []
    segs = []
    for oy0, oy1, i0, i1 in rows:
        for ox0, ox1, j0, j1 in cols:
            box = (i0, i1, j0, j1)
            if box not in boxes:
                boxes.append(box)
            segs.append(Segment(oy0, oy1, ox0, ox1, i0, i1, j0, j1, boxes.index(box)))
    return segs, boxes


def folded_biases(spec: LayerSpec, boxes) -> torch.Tensor:
    """int64 ``[classes, C_out]``: ``bias + input_offset * sum(w over the box's taps)``."""
    w = spec.weight.to(torch.int64)
    out = []
    for i0, i1, j0, j1 in boxes:
        if spec.kind == "conv":
            s = w[:, i0:i1, j0:j1, :].sum(dim=(1, 2, 3))
        else:
            s = w[i0:i1, j0:j1, :].sum(dim=(0, 1))
        out.append(spec.bias.to(torch.int64) + spec.input_offset * s)
    return torch.stack(out)


def accumulator_bound(spec: LayerSpec, biases: torch.Tensor) -> int:
    """Largest |partial sum| any output channel can reach: ``max |bias_k| + 128 * sum |w|``."""
    w = spec.weight.to(torch.int64).abs()
    per = w.sum(dim=(1, 2, 3)) if spec.kind == "conv" else w.sum(dim=(0, 1))
    return int((biases.abs().max(dim=0).values + 128 * per).max())


def short_epilogue_ok(bound: int, multiplier: torch.Tensor, shift: torch.Tensor) -> bool:
    """Whether ``cg_requant_short`` equals ``arm_nn_requantize`` on every accumulator ``|acc| <= bound``
    (module docstring): multipliers >= 0, shifts in [-30, 31], ``bound * 2**left < 2**30``."""
    # (a right shift of 31 would need the rounding constant 2**31, which int32 tables cannot hold)
    if bool((multiplier < 0).any()) or bool((shift > 31).any()) or bool((shift < -30).any()):
        return False
    left = int(shift.clamp(min=0).max())
    return bound * (1 << left) < SHORT_LIMIT


def offset_folds(short: bool, shift: torch.Tensor, out_offset: int) -> bool:
    """Whether the scalar short epilogue adds the output offset inside its rounding constant
    (``cg_output``'s CG_OFFSET_IN_ROUNDING: ``q[2] = 2**right + out_offset * 2**(right + 1)``, one
    addition less per output).  Exact because ``(t + 2k) >> 1 = (t >> 1) + k`` and ``(u + k * 2**r) >> r
    = (u >> r) + k``; no int32 wrap-around while ``(2 |out_offset| + 2) * 2**right <= 2**30`` (then
    ``|q[2]| + 1 < 2**31`` and ``|v| + |q[2] >> 1| < 2**31`` for the short epilogue's ``|v| <= 2**30``)."""
    if not short:
        return False
    right = int((-shift.to(torch.int64)).clamp(min=0).max())
    return (2 * abs(int(out_offset)) + 2) << right <= SHORT_LIMIT


def epilogue_table(multiplier: torch.Tensor, shift: torch.Tensor, short: bool, planar: bool = False,
                   fold_offset: int = 0) -> torch.Tensor:
    """int32 epilogue constants per output channel, in the order the epilogue reads them
    (``fold_offset``: the output offset folded into the short interleaved table's rounding constant,
    where :func:`offset_folds` allows it)."""
    m, s = multiplier.to(torch.int64), shift.to(torch.int64)
    if short:
        left, right = s.clamp(min=0), (-s).clamp(min=0)
        pow2 = torch.ones_like(right) << right
        if fold_offset and not planar:
            pow2 = pow2 + (int(fold_offset) << (right + 1))
        cols = [m, left, -right, pow2] if planar else [m, right, pow2, left]
    else:
        cols = [m, s, torch.zeros_like(s), torch.zeros_like(s)]
    t = torch.stack(cols, dim=0 if planar else 1)
    return t.to(torch.int32).contiguous()


def epilogue_mode(short: bool, shift: torch.Tensor) -> int:
    """``cg_output``'s ``epilogue`` argument: 0 general, 1 short, 2 short with left shifts."""
    return 0 if not short else (2 if bool((shift > 0).any()) else 1)


OFFSET_IN_ROUNDING = 4  # cg_output's epilogue flag CG_OFFSET_IN_ROUNDING
DOUBLED_ACC = 8  # cg_output's epilogue flag CG_DOUBLED_ACC
SIGN_FROM_ACC = 16  # cg_output's epilogue flag CG_SIGN_FROM_ACC


def sign_from_acc(short: bool, shift: torch.Tensor) -> bool:
    """Whether the scalar short epilogue may take its rounding's sign from the accumulator and add its
    halved rounding constant inside one SMMLAR (``cg_requant_short``'s CG_SIGN_FROM_ACC): every channel
    shifts right by at least one (then the sign of a zero product cannot change the result)."""
    return short and bool((shift <= -1).all())


def scalar_epilogue(multiplier: torch.Tensor, shift: torch.Tensor, short: bool, out_offset: int, act_min: int,
                    act_max: int, doubled: bool = False, smmlar: bool = False) -> tuple[torch.Tensor, str]:
    """The interleaved epilogue table of ``cg_output`` and its arguments after ``q`` (``epilogue,
    out_offset, act_min, act_max``): the output offset in the rounding constant where
    :func:`offset_folds` proves it exact; ``doubled``: the layer's accumulators are doubled (its
    widened weights and biases stored doubled: short epilogue only, see :func:`doubles`); ``smmlar``
    (DSP cores): the SMMLAR form where :func:`sign_from_acc` allows it (the table's rounding column
    halved)."""
    if doubled and not short:
        raise CodegenError("doubled accumulators need the short epilogue")
    fold = offset_folds(short, shift, out_offset)
    table = epilogue_table(multiplier, shift, short, fold_offset=out_offset if fold else 0)
    signed = smmlar and sign_from_acc(short, shift)
    if signed:  # (every right shift >= 1: the rounding constant is even)
        table[:, 2] = table[:, 2] // 2
    mode = (epilogue_mode(short, shift) | (OFFSET_IN_ROUNDING if fold else 0) | (DOUBLED_ACC if doubled else 0)
            | (SIGN_FROM_ACC if signed else 0))
    return table, f"{mode}, {_c(out_offset)}, {act_min}, {act_max}"


def doubles(short: bool, widened_only: bool) -> int:
    """The factor (2 or 1) of a layer's stored weights and biases: 2 when the short epilogue is proven
    (its SMMULR takes ``2a``; ``|2 * acc| < 2**31`` there) and every product of the layer reads the
    pre-widened int16 tables (``2w`` fits int16, not int8): the epilogue's doubling costs nothing."""
    return 2 if short and widened_only else 1


def widened_weights(weight: torch.Tensor) -> torch.Tensor:
    """int16 ``[C_out, K]`` of OHWI int8 rows (``K`` a multiple of 4): per four weights ``(w0, w2, w1, w3)``,
    the order of ``SXTB16`` (``cg_dot_2x2_dspw`` reads two words per four weights)."""
    co = weight.shape[0]
    w = weight.reshape(co, -1, 4).to(torch.int16)
    return w[:, :, [0, 2, 1, 3]].reshape(co, -1).contiguous()


def paired_weights(weight: torch.Tensor) -> torch.Tensor:
    """int16 flat array for ``CG_DOT_2X2_PAIR``: per pair of filters ``(2p, 2p + 1)`` a block of
    ``2K`` values, per four inputs the widened four of filter 2p then those of filter 2p + 1; an odd
    last filter follows alone (``K`` widened values)."""
    co = weight.shape[0]
    wide = widened_weights(weight)  # [C_out, K]
    k = wide.shape[1]
    pairs = co // 2
    body = wide[:2 * pairs].reshape(pairs, 2, k // 4, 4).permute(0, 2, 1, 3).reshape(-1)
    return torch.cat([body, wide[2 * pairs:].reshape(-1)]).contiguous()


def widened_depthwise_weights(weight: torch.Tensor) -> torch.Tensor:
    """int16 ``[C//4, kH*kW, 4]``: per group of four channels, its taps in order, each as ``(w0, w2,
    w1, w3)`` (the order of ``SXTB16``): a group's window is one block of 8-byte words."""
    kh, kw, c = weight.shape
    full = c - c % 4
    w = weight.reshape(kh * kw, c)[:, :full].reshape(kh * kw, full // 4, 4).to(torch.int16)
    return w[:, :, [0, 2, 1, 3]].permute(1, 0, 2).contiguous()


def why_not(spec: LayerSpec | None, reason: str | None = None) -> str | None:
    """Why the generator declines ``spec`` (None when it generates it)."""
    if spec is None:
        return reason
    segs, boxes = segments(spec)
    if accumulator_bound(spec, folded_biases(spec, boxes)) >= INT32_LIMIT:
        return "the int32 accumulator may wrap (weights/bias too large): the general kernel keeps C's wrap-free arithmetic"
    return None


def isa_path(target) -> str:
    return {"mve": "mve", "dsp": "dsp"}.get(getattr(target, "isa", "plain"), "plain")


# ----------------------------------------------------------------------------- C text
def _c(v: int) -> str:
    v = int(v)
    return "(-2147483647 - 1)" if v == -(2**31) else str(v)


def generate(spec: LayerSpec, isa: str, fname: str, array: Callable[[str, torch.Tensor], str],
             x_expr: str = "in", y_expr: str = "out") -> GeneratedLayer:
    """C of one layer for ``isa`` ("plain", "dsp", "mve"); ``array(suffix, tensor)`` registers a
    constant array and returns its C name; the function is ``fname`` and the call reads ``x_expr``,
    writes ``y_expr``."""
    if isa not in ISAS:
        raise CodegenError(f"unknown ISA path {isa!r}; one of {ISAS}")
    problem = why_not(spec)
    if problem:
        raise CodegenError(f"{fname}: {problem}")
    segs, boxes = segments(spec)
    biases = folded_biases(spec, boxes)
    bound = accumulator_bound(spec, biases)
    short = short_epilogue_ok(bound, spec.multiplier, spec.shift)
    if spec.kind == "depthwise":
        return _depthwise(spec, isa, fname, array, segs, biases, short, x_expr, y_expr)
    return _dense(spec, isa, fname, array, segs, biases, short, x_expr, y_expr)


MAX_SPECIALISED_SEGMENTS = 32  # more segments: the border ones share one out-of-line copy


def _interior(spec: LayerSpec, s: Segment) -> bool:
    return s.i1 - s.i0 == spec.kh and s.j1 - s.j0 == spec.kw


def _specialised(spec: LayerSpec, s: Segment, segs: list[Segment]) -> bool:
    """Whether segment ``s`` gets its own inlined copy (constant taps: loops unrolled, dead paths
    dropped): the interior one always, every one when there are few."""
    return _interior(spec, s) or len(segs) <= MAX_SPECIALISED_SEGMENTS


def _driver(spec: LayerSpec, fname: str, segs: list[Segment], bias_name: str, n_out: int, inline=None) -> str:
    """The layer function: batches x segments, each through ``inline(segment)`` (the segment's own C
    block, or None where the path writes none for it) or else the segment function."""
    calls = []
    for s in segs:
        block = inline(s) if inline is not None else None
        if block is not None:
            calls.append(block)
            continue
        seg_fn = f"{fname}_segf" if _specialised(spec, s, segs) else f"{fname}_seg"
        calls.append(f"        {seg_fn}(x, y, {s.oy0}, {s.oy1}, {s.ox0}, {s.ox1}, {s.i0}, {s.i1}, {s.j0}, {s.j1}, "
                     f"{bias_name} + {s.cls * n_out});")
    in_size, out_size = spec.h * spec.w * spec.c_in, spec.ho * spec.wo * spec.c_out
    return (f"void {fname}(const int8_t *in, int8_t *out)\n{{\n"
            f"    int32_t b;\n"
            f"    for (b = 0; b < {spec.n}; b++) {{\n"
            f"        const int8_t *x = in + b * {in_size};\n"
            f"        int8_t *y = out + b * {out_size};\n" + "\n".join(calls) + "\n    }\n}\n")


def _seg_functions(fname: str, body: str, need_general: bool) -> str:
    """The segment body as an always-inlined function (constant taps: unrolled) and, for border
    segments, one out-of-line copy."""
    sig = ("(const int8_t *in, int8_t *out, int32_t oy0, int32_t oy1, int32_t ox0, int32_t ox1, "
           "int32_t i0, int32_t i1, int32_t j0, int32_t j1, const int32_t *bias)")
    text = f"CG_INLINE void {fname}_segf{sig}\n{{\n{body}}}\n"
    if need_general:
        text += (f"\nstatic __attribute__((noinline)) void {fname}_seg{sig}\n{{\n"
                 f"    {fname}_segf(in, out, oy0, oy1, ox0, ox1, i0, i1, j0, j1, bias);\n}}\n")
    return text


def _split_by_view(spec: LayerSpec, segs: list[Segment], paired: bool) -> list[tuple[Segment, object]]:
    """Each segment with the weight view its runs read (splitting segments whose columns need
    different views): ``"full"`` (the paired table, runs aligned to groups of four), ``(j0, j1, d)``
    (an extended table: each kernel row's run of ``(j1 - j0) * C_in`` bytes read as ``L`` bytes,
    rounded up to four, starting ``d`` bytes early, the extra bytes with weight 0 and inside the
    input row for every column of the segment) or ``"bytes"`` (int8 rows, any alignment)."""
    c, row = spec.c_in, spec.w * spec.c_in
    out = []
    for s in segs:
        run = (s.j1 - s.j0) * c
        if not paired:
            out.append((s, "bytes"))
            continue
        if (spec.kw * c) % 4 == 0 and (s.j0 * c) % 4 == 0 and run % 4 == 0:
            out.append((s, "full"))
            continue
        length = -(-run // 4) * 4
        views = []
        for ox in range(s.ox0, s.ox1):
            start = (ox * spec.stride[1] - spec.padding[1] + s.j0) * c
            d = max(0, start + length - row)
            views.append((s.j0, s.j1, d) if d <= min(length - run, start) else "bytes")
        k = s.ox0
        for v in _groups(views):
            n = len(v)
            out.append((Segment(s.oy0, s.oy1, k, k + n, s.i0, s.i1, s.j0, s.j1, s.cls), v[0]))
            k += n
    return out


def _groups(items: list) -> list[list]:
    groups: list[list] = []
    for it in items:
        if groups and groups[-1][0] == it:
            groups[-1].append(it)
        else:
            groups.append([it])
    return groups


def extended_weights(spec: LayerSpec, j0: int, j1: int, d: int) -> torch.Tensor:
    """int8 ``[C_out, kH * L]``: each kernel row's taps ``j0..j1-1`` at byte ``d`` of an ``L``-byte row
    (``L`` = the run rounded up to four), zeros around them."""
    c, co = spec.c_in, spec.c_out
    run = (j1 - j0) * c
    length = -(-run // 4) * 4
    w = torch.zeros(co, spec.kh, length, dtype=torch.int8)
    w[:, :, d:d + run] = spec.weight[:, :, j0:j1, :].reshape(co, spec.kh, run)
    return w.reshape(co, -1)


MATVEC_ROWS = 4  # filters per pass of the matrix-vector kernel (CG_MATVEC4)


def is_matvec(spec: LayerSpec) -> bool:
    """A dense layer with one output pixel per batch (a linear layer over one row, a 1x1 conv of a
    1x1 image) whose row length is a multiple of 4: the matrix-vector kernel's shape."""
    return (spec.kind == "conv" and spec.kh == spec.kw == 1 and spec.ho * spec.wo == 1 and spec.h * spec.w == 1
            and spec.c_in % 4 == 0)


def matvec_weights(weight: torch.Tensor) -> torch.Tensor:
    """int16 flat array for ``CG_MATVEC4``: filters in groups of four (zero filters pad the last
    group), per four inputs the widened four of each filter of the group (``(w0, w2), (w1, w3)``)."""
    co = weight.shape[0]
    rows = -(-co // MATVEC_ROWS) * MATVEC_ROWS
    wide = widened_weights(weight)  # [C_out, K]
    k = wide.shape[1]
    wide = torch.cat([wide, torch.zeros(rows - co, k, dtype=wide.dtype)])
    return wide.reshape(rows // MATVEC_ROWS, MATVEC_ROWS, k // 4, 4).permute(0, 2, 1, 3).reshape(-1).contiguous()


def _matvec(spec, fname, array, biases, short, x_expr, y_expr) -> GeneratedLayer:
    """A DSP matrix-vector layer: four filters per pass over the input row (CG_MATVEC4), the
    epilogue of the four values before their stores; the last pass of C_out % 4 filters runs on
    zero-padded weights, biases and epilogue constants and stores only its real outputs."""
    co, k, r = spec.c_out, spec.c_in, MATVEC_ROWS
    rows = -(-co // r) * r
    pad = rows - co
    f = doubles(short, True)
    w16 = array("gen_weight16", f * matvec_weights(spec.weight.to(torch.int8).reshape(co, k)))
    bias = torch.cat([f * biases[0].to(torch.int32), torch.zeros(pad, dtype=torch.int32)])
    b_name = array("gen_bias", bias.contiguous())
    mult = torch.cat([spec.multiplier.to(torch.int64), torch.zeros(pad, dtype=torch.int64)])
    shift = torch.cat([spec.shift.to(torch.int64), -torch.ones(pad, dtype=torch.int64)])  # (never stored)
    table, ep = scalar_epilogue(mult, shift, short, spec.output_offset, spec.act_min, spec.act_max, f == 2, True)
    q_name = array("gen_q", table)

    def pass_(o: str, stores: int, ind: str) -> list[str]:
        lines = ["{",
                 "    int32_t acc[4];",
                 f"    acc[0] = {b_name}[{o}]; acc[1] = {b_name}[{o} + 1]; acc[2] = {b_name}[{o} + 2]; "
                 f"acc[3] = {b_name}[{o} + 3];",
                 f"    CG_MATVEC4(x, {w16} + {o} * {k}, {k}, acc);",
                 "    {"]
        lines += [f"        const int8_t v{i} = cg_output(acc[{i}], {q_name} + 4 * ({o} + {i}), {ep});"
                  for i in range(stores)]
        lines += [f"        y[{o} + {i}] = v{i};" for i in range(stores)]
        lines += ["    }", "}"]
        return [ind + ln for ln in lines]

    body = [f"void {fname}(const int8_t *in, int8_t *out)", "{", "    int32_t b;",
            f"    for (b = 0; b < {spec.n * spec.h * spec.w}; b++) {{",
            f"        const int8_t *x = in + b * {k};",
            f"        int8_t *y = out + b * {co};",
            "        int32_t o;",
            f"        for (o = 0; o < {co - co % r}; o += {r}) "]
    body[-1] += "\n".join(pass_("o", r, "        ")).lstrip()
    if co % r:
        body += pass_(str(co - co % r), co % r, "        ")
    body += ["    }", "}", ""]
    what = (f"generated dsp matrix-vector: {r} filters per pass over pre-widened interleaved weights, "
            f"{'short' if short else 'general'} epilogue")
    return GeneratedLayer("\n".join(body), f"{fname}({x_expr}, {y_expr});", what, short,
                          {"gen_weight16": w16, "gen_bias": b_name, "gen_q": q_name})


def mve_interleaved_weights(weight: torch.Tensor) -> torch.Tensor:
    """int8 flat array for ``cg_conv_2x4_mvei``: OHWI filters in groups of four (C_out % 4 == 0), per
    group and kernel row, per 16 inputs of the row (``kW * C_in``, the last chunk zero-padded) 16
    bytes of each of the four filters."""
    co, kh, kw, ci = weight.shape
    run = kw * ci
    chunks = -(-run // 16)
    w = torch.zeros(co, kh, chunks * 16, dtype=torch.int8)
    w[:, :, :run] = weight.reshape(co, kh, run)
    return w.reshape(co // 4, 4, kh, chunks, 16).permute(0, 2, 3, 1, 4).reshape(-1).contiguous()


def mve_epilogue_flags(shift: torch.Tensor) -> int:
    """``cg_requant4_mve``'s ``flags``: CG_LEFT (1) when a channel shifts left, CG_ALL_RIGHT (2) when every
    channel shifts right by at least one bit."""
    return (1 if bool((shift > 0).any()) else 0) | (2 if bool((shift < 0).all()) else 0)


MVE_TILE_GROUPS = 16  # groups of four filters per pass of a Helium tile loop (its accumulators: 512 stack bytes)
THUMB_IMM12 = 4095  # largest ADDW/SUBW immediate


def mve_tile_asm(npx: int, rows: int, chunks: int, tail: int, x_row: int, row_bytes: int, skip: int,
                 groups: int) -> str | None:
    """The assembly of one Helium tile loop: ``groups`` groups of four filters times ``npx`` pixels
    (``%[xa]``, ``%[xb]``) over ``rows`` kernel rows of ``chunks`` full 16-byte chunks and a
    ``tail``-byte predicated one, every chunk unrolled, the first VMLADAV (no accumulator to
    initialise), the accumulators pinned to r0, r2, r4, r6 (pixel 0) and r8, r10, r12, lr (pixel 1)
    and stored with one STM per group; ``%[n]`` holds the tail on entry (VCTP), then counts groups.
    None when a pointer step does not fit an ADDW/SUBW immediate."""
    adv = 16 * chunks
    back = (rows - 1) * x_row + adv
    if max(x_row - adv if rows > 1 else 0, back, skip) > THUMB_IMM12:
        return None
    a, b = ["r0", "r2", "r4", "r6"], ["r8", "r10", "r12", "lr"]
    ptrs = ["%[xa]", "%[xb]"][:npx]
    lines = ["vctp.8 %[n]"] if tail else []
    lines += [f"mov %[n], #{groups}", "1:"]
    first = True
    for r in range(rows):
        for k in range(chunks + (1 if tail else 0)):
            if k == chunks:  # the row's last inputs: lanes past the tail load zeros (their weights are zero too)
                lines.append("vpst" + "t" * (npx - 1))
                lines += [f"vldrbt.8 q{p}, [{ptr}]" for p, ptr in enumerate(ptrs)]
            else:
                lines += [f"vldrb.8 q{p}, [{ptr}], #16" for p, ptr in enumerate(ptrs)]
            op = "vmladav.s8" if first else "vmladava.s8"
            first = False
            lines += ["vldrb.8 q2, [%[w], #16]", "vldrb.8 q3, [%[w]], #64"]
            for f, wq in ((0, "q3"), (1, "q2")):
                lines += [f"{op} {acc[f]}, q{p}, {wq}" for p, acc in enumerate((a, b)[:npx])]
            lines += ["vldrb.8 q2, [%[w], #-32]", "vldrb.8 q3, [%[w], #-16]"]
            for f, wq in ((2, "q2"), (3, "q3")):
                lines += [f"{op} {acc[f]}, q{p}, {wq}" for p, acc in enumerate((a, b)[:npx])]
        if r < rows - 1 and x_row != adv:
            lines += [f"add {ptr}, {ptr}, #{x_row - adv}" for ptr in ptrs]
    if back:
        lines += [f"sub {ptr}, {ptr}, #{back}" for ptr in ptrs]
    if skip:
        lines.append(f"add %[w], %[w], #{skip}")
    lines += ["stmia %[acc]!, {" + ", ".join(a + b[:4 * (npx - 1)]) + "}", "subs %[n], %[n], #1", "bne 1b"]
    return "".join(f'"{ln}\\n\\t"' for ln in lines)


def mve_tile_function(fname: str, npx: int, rows: int, chunks: int, tail: int, x_row: int, xs: int, row_bytes: int,
                      skip: int, co: int, q_name: str, flags: int, spec: LayerSpec) -> str | None:
    """``fname(x, w, bias, y0, y1)``: all ``co`` output channels of ``npx`` pixels (``x``, ``x + xs``)
    over ``rows`` whole kernel rows (interleaved weights from ``w``), in passes of
    MVE_TILE_GROUPS groups of four filters - the assembly tile loop (``mve_tile_asm``; C on hosts)
    into a stack buffer, then ``cg_tile_epilogue_mve``.  None when the loop cannot be written."""
    groups = co // 4
    sizes = [MVE_TILE_GROUPS] * (groups // MVE_TILE_GROUPS) + ([groups % MVE_TILE_GROUPS] if groups % MVE_TILE_GROUPS else [])
    asms = {g: mve_tile_asm(npx, rows, chunks, tail, x_row, row_bytes, skip, g) for g in set(sizes)}
    if any(v is None for v in asms.values()):
        return None
    regs = '"r0", "r2", "r4", "r6", ' + ('"r8", "r10", "r12", "lr", ' if npx == 2 else "")
    ops = ('[xa] "+r"(xa), ' + ('[xb] "+r"(xb), ' if npx == 2 else "") + '[w] "+r"(w), [n] "+r"(n), [acc] "+r"(acc)')
    helpers = []
    for g in sorted(asms):  # (the loop alone in its function: gcc finds no registers for it inside a C loop)
        helpers += [
            f"static __attribute__((noinline, unused)) const int8_t *{fname}_g{g}(const int8_t *x, const int8_t *w, "
            "int32_t *acc)",
            "{",
            "#ifdef CG_HAVE_MVE",
            "    const int8_t *xa = x;" + (f" const int8_t *xb = x + {xs};" if npx == 2 else ""),
            f"    int32_t n = {tail};",
            f"    __asm__ volatile({asms[g]}",
            f"                     : {ops}",
            "                     :",
            f"                     : {regs}\"q0\", \"q1\", \"q2\", \"q3\", \"memory\", \"cc\");",
            "    return w;",
            "#else",
            f"    cg_tiles_c(x, {xs}, {x_row}, w, {rows}, {chunks}, {tail}, {skip}, {g}, {npx}, acc);",
            f"    return w + {g * (rows * row_bytes + skip)};",
            "#endif",
            "}",
        ]

    def batch(g: int, o: str) -> list[str]:
        return [f"    w = {fname}_g{g}(x, w, acc);",
                f"    cg_tile_epilogue_mve(acc, {g}, {npx}, bias + {o}, {q_name} + {o}, {co}, {flags}, "
                f"{spec.output_offset}, {spec.act_min}, {spec.act_max}, y0 + {o}, y1 + {o});"]

    full = groups - groups % MVE_TILE_GROUPS
    lines = helpers + [
        f"static __attribute__((noinline, unused)) void {fname}(const int8_t *x, const int8_t *w, const int32_t *bias, "
        "int8_t *y0, int8_t *y1)",
             "{", f"    int32_t acc[{4 * npx * min(groups, MVE_TILE_GROUPS)}] __attribute__((aligned(8)));"]
    if npx == 1:
        lines.append("    (void)y1;")
    if full:
        lines += ["    int32_t o;", f"    for (o = 0; o < {4 * full}; o += {4 * MVE_TILE_GROUPS}) {{"]
        lines += ["    " + ln for ln in batch(MVE_TILE_GROUPS, "o")]
        lines.append("    }")
    if groups % MVE_TILE_GROUPS:
        lines += batch(groups % MVE_TILE_GROUPS, str(4 * full))
    lines.append("}")
    return "\n".join(lines) + "\n"


MVE_WINDOW_MAX = 256  # bytes of a window the Helium path gathers into a stack buffer (narrow rows)


def mve_gathers_windows(spec: LayerSpec, isa: str, short: bool) -> bool:
    """Whether a Helium dense layer copies each window into a buffer (rows narrower than one 16-byte
    vector - the first layer: C_in 1..3 - would leave most lanes of every row's load empty)."""
    k = spec.kh * spec.kw * spec.c_in
    return (isa == "mve" and short and spec.c_out % 4 == 0 and spec.kind == "conv" and spec.kh > 1
            and spec.kw * spec.c_in < 16 and k <= MVE_WINDOW_MAX)


def _windows_mve(spec, fname, array, segs, biases, x_expr, y_expr) -> GeneratedLayer:
    """A Helium dense layer with narrow kernel rows: per pair of output pixels, the window's rows
    inside the input are copied into a zeroed stack buffer of two windows (zeros where the window leaves the
    input: the segment's folded bias accounts for those taps), then one dot product of ``kH * kW *
    C_in`` inputs per filter (cg_conv_2x4_mvei over one row: 16 inputs per vector)."""
    c, co, kw, k = spec.c_in, spec.c_out, spec.kw, spec.kh * spec.kw * spec.c_in
    sh, sw = spec.stride
    ph, pw = spec.padding
    chunks, tail = divmod(k, 16)
    kp = 16 * (chunks + (1 if tail else 0))
    wi = array("gen_weight_mve", mve_interleaved_weights(spec.weight.to(torch.int8).reshape(co, 1, 1, k)))
    b_name = array("gen_bias", biases.to(torch.int32).contiguous())
    q_name = array("gen_q", epilogue_table(spec.multiplier, spec.shift, True, planar=True))
    ep = f"{co}, {mve_epilogue_flags(spec.shift)}, {spec.output_offset}, {spec.act_min}, {spec.act_max}"
    blocks = []
    for s in segs:
        run = (s.j1 - s.j0) * c
        copies = []
        for r in range(s.i1 - s.i0):
            src = (r * spec.w) * c
            dst = ((s.i0 + r) * kw + s.j0) * c
            copies.append(f"memcpy(win + {dst}, xp + {src}, {run});")
            copies.append(f"memcpy(win + {kp + dst}, xp + {src} + xs, {run});")
        blocks.append("\n".join([
            f"/* rows {s.oy0}..{s.oy1 - 1}, columns {s.ox0}..{s.ox1 - 1}: taps {s.i0}..{s.i1 - 1} x {s.j0}..{s.j1 - 1} */",
            "{",
            f"    const int32_t *bias = {b_name} + {s.cls * co};",
            "    int32_t oy, ox, o;",
            "    memset(win, 0, sizeof win);",
            f"    for (oy = {s.oy0}; oy < {s.oy1}; oy++) {{",
            f"        for (ox = {s.ox0}; ox < {s.ox1}; ox += 2) {{",
            f"            const int32_t xs = ox + 1 < {s.ox1} ? {sw * c} : 0;",
            f"            const int8_t *xp = x + ((oy * {sh} - {ph - s.i0}) * {spec.w} + (ox * {sw} - {pw - s.j0})) * {c};",
            f"            int8_t *yp = y + (oy * {spec.wo} + ox) * {co};",
            *("            " + cp for cp in (copies or ["(void)xp;  /* the window is all padding */"])),
            f"            for (o = 0; o < {co}; o += 4) {{",
            f"                cg_conv_2x4_mvei(win, {kp}, 0, {wi} + o * {kp}, 1, {chunks}, {tail}, bias + o, "
            f"{q_name} + o, {ep}, yp + o, yp + (xs ? {co} : 0) + o);",
            "            }",
            "        }",
            "    }",
            "}"]))
    in_size, out_size = spec.h * spec.w * c, spec.ho * spec.wo * co
    body = "\n".join("        " + ln for b in blocks for ln in b.split("\n"))
    fns = (f"void {fname}(const int8_t *in, int8_t *out)\n{{\n"
           f"    int8_t win[{2 * kp}] __attribute__((aligned(16)));  /* two windows */\n"
           "    int32_t b;\n"
           f"    for (b = 0; b < {spec.n}; b++) {{\n"
           f"        const int8_t *x = in + b * {in_size};\n"
           f"        int8_t *y = out + b * {out_size};\n" + body + "\n    }\n}\n")
    what = (f"generated mve {spec.kh}x{spec.kw} conv, narrow rows: each window copied into a buffer, 2 px x 4 ch "
            f"tiles over {k} inputs, {len(biases)} bias class(es), short epilogue")
    return GeneratedLayer(fns, f"{fname}({x_expr}, {y_expr});", what, True,
                          {"gen_weight_mve": wi, "gen_bias": b_name, "gen_q": q_name})


def is_pointwise(spec: LayerSpec, isa: str, short: bool) -> bool:
    """A DSP 1x1 convolution without padding (any stride: each output pixel reads one input pixel), C_in %
    4 == 0, an even C_out, whose scalar short epilogue takes the SMMLAR form with the output offset folded
    and clamps to the int8 range only: the shape of the per-layer assembly loop (:func:`_pointwise`)."""
    sh, sw = spec.stride
    return (isa == "dsp" and spec.kind == "conv" and spec.kh == spec.kw == 1 and tuple(spec.padding) == (0, 0)
            and spec.ho == (spec.h - 1) // sh + 1 and spec.wo == (spec.w - 1) // sw + 1
            and spec.c_in % 4 == 0 and spec.c_out % 2 == 0 and 8 * spec.c_in + 32 < 4096 and 2 * spec.c_out + 8 < 4096
            and sign_from_acc(short, spec.shift) and offset_folds(short, spec.shift, spec.output_offset)
            and (spec.act_min, spec.act_max) == (-128, 127))


def pointwise_stream(spec: LayerSpec, biases: torch.Tensor) -> tuple[torch.Tensor, str]:
    """int16 stream of a pointwise layer (``cg_pointwise_c``): per pair of filters the two doubled int32
    biases, the doubled paired widened weights, ``{multiplier, right, K}`` of each filter (int32 as two
    int16 halves, little-endian); and cg_output's arguments after ``q``."""
    co, k = spec.c_out, spec.c_in
    table, ep = scalar_epilogue(spec.multiplier, spec.shift, True, spec.output_offset, -128, 127, True, True)
    wide = (2 * paired_weights(spec.weight.to(torch.int8))).reshape(co // 2, 2 * k)
    bias = (2 * biases[0].to(torch.int32)).reshape(co // 2, 2).contiguous().view(torch.int16)
    q = table[:, :3].reshape(co // 2, 6).contiguous().view(torch.int16)
    return torch.cat([bias, wide, q], dim=1).reshape(-1).contiguous(), ep


PW_PIXELS = 3  # pixels per pointwise tile (corten_gen.h's CG_PW_PIXELS)
PW_ACC = ("r0", "r1", "r2", "r3", "r4", "r5")  # accumulator of pixel p, filter f: PW_ACC[2 * p + f]
PW_DATA = ("r9", "r10", "r11", "r12", "lr")  # (r7 is left alone: the frame pointer of unoptimised builds)


PW_UNROLL_BUDGET = 512  # instructions of a pointwise loop body: filter pairs unrolled up to it (small C_in)
PW_STRAIGHT_BUDGET = 768  # ... and of a layer's whole walk over its filter pairs written out (no loop)


def pointwise_unroll(k: int, co: int) -> int:
    """Filter pairs per iteration of the pointwise loop (:func:`_pointwise_asm`): 4 or 2 where they divide
    the pairs, their body (about ``11 k / 2 + 40`` instructions a pair) fits :data:`PW_UNROLL_BUDGET` and
    their stream (``4 k + 32`` bytes a pair) the LDR offsets; each pair more in an iteration saves the
    loop's step, test, taken branch and output-pointer update (~9 cycles on a Cortex-M4); all the pairs
    (no loop: each right shift an immediate of its SSAT) where they fit :data:`PW_STRAIGHT_BUDGET`."""
    pairs = co // 2
    if pairs * (11 * k // 2 + 40) <= PW_STRAIGHT_BUDGET and pairs * (4 * k + 32) < 4096:
        return pairs
    for u in (4, 2):
        if (co // 2) % u == 0 and u * (11 * k // 2 + 40) <= PW_UNROLL_BUDGET and u * (4 * k + 32) < 4096:
            return u
    return 1


def _pointwise_asm(k: int, co: int, right: list[int]) -> str:
    """The assembly loop over a pointwise stream for one tile of :data:`PW_PIXELS` pixels whose inputs
    are widened (``cg_widen_words``: pixel p's ``k`` inputs at ``%[x] + 2 k p`` bytes; outputs at
    ``y + co p``): per pair of filters, per two inputs five LDRs at literal offsets (the three pixels'
    words and the two filters' weight words: one cycle each after the first on a Cortex-M4, where LDM
    and LDRD do not pipeline) and six SMLADs into the 3 x 2 accumulators (the first two inputs add the
    biases, loaded into the last pixel's accumulators); the epilogue constants of each filter by three
    LDRs, the SMMLAR epilogue of its three outputs and their stores; :func:`pointwise_unroll` pairs per
    iteration (all of them: no loop, the SSATs shift by ``right``, each channel's right shift, and the
    table's shifts are not read); the output pointer and the stream's end and its start in the three
    words after the widened inputs (13 registers, r0-r6, r8-r12 and lr, no memory operand: an
    unoptimised build has no register left to address one)."""
    q = "\\n\\t"
    a, (x0, x1, x2, w0, w1) = PW_ACC, PW_DATA
    y, m, r, kk, t = PW_DATA
    xs = (x0, x1, x2)
    n, blk, ys = PW_PIXELS, 4 * k + 32, 2 * k * PW_PIXELS  # (ys: the output pointer's word)
    unroll = pointwise_unroll(k, co)
    straight = unroll == co // 2
    lines = [f'"ldr r6, [%[x], #{ys + 8}]{q}"'] + ([] if straight else ['"1:' + q + '"'])
    for u in range(unroll):
        b = u * blk
        lines += [f'"ldr {a[2 * n - 2]}, [r6, #{b}]{q}"', f'"ldr {a[2 * n - 1]}, [r6, #{b + 4}]{q}"']
        for c in range(k // 2):
            wo = b + 8 + 16 * (c // 2) + 4 * (c % 2)
            lines += [f'"ldr {w0}, [r6, #{wo}]{q}"', f'"ldr {w1}, [r6, #{wo + 8}]{q}"',
                      *(f'"ldr {xs[p]}, [%[x], #{2 * k * p + 4 * c}]{q}"' for p in range(n))]
            for p in range(n):
                for f, wr in enumerate((w0, w1)):
                    acc = a[2 * n - 2 + f] if c == 0 else a[2 * p + f]  # (the biases, first two inputs)
                    lines.append(f'"smlad {a[2 * p + f]}, {xs[p]}, {wr}, {acc}{q}"')
        o = b + 8 + 4 * k  # m0, right0, K0, m1, right1, K1
        lines.append(f'"ldr {y}, [%[x], #{ys}]{q}"')
        for f in range(2):
            lines += [f'"ldr {reg}, [r6, #{o + 12 * f + 4 * i}]{q}"' for i, reg in enumerate((m, r, kk))
                      if not (straight and reg == r)]
            for p in range(n):
                v = a[2 * p + f]
                lines += [f'"add {t}, {kk}, {v}, asr #31{q}"', f'"smmlar {v}, {v}, {m}, {t}{q}"']
                lines += ([f'"ssat {v}, #8, {v}, asr #{right[2 * u + f]}{q}"'] if straight else
                          [f'"asr {v}, {v}, {r}{q}"', f'"ssat {v}, #8, {v}{q}"'])
                lines.append(f'"strb {v}, [{y}, #{co * p + 2 * u + f}]{q}"')
    if straight:
        return "\n                ".join(lines)
    lines += [f'"adds {y}, {y}, #{2 * unroll}{q}"', f'"str {y}, [%[x], #{ys}]{q}"', f'"ldr {t}, [%[x], #{ys + 4}]{q}"',
              f'"add r6, r6, #{unroll * blk}{q}"', f'"cmp r6, {t}{q}"', '"bne 1b"']
    return "\n                ".join(lines)


def _pointwise_widen(spec: LayerSpec, npx: int, t: str) -> str:
    """C widening the inputs of output pixels ``t .. t + npx - 1`` of a pointwise layer into ``cg_s``: one
    run when the stride is 1 (the pixels are contiguous), else pixel by pixel from its input pixel."""
    k = spec.c_in
    if tuple(spec.stride) == (1, 1):
        return f"        cg_widen_words(in + {t} * {k}, cg_s, {npx * k // 4});"
    sh, sw = spec.stride
    row = f"r * {sh}" if spec.n == 1 else f"(r / {spec.ho}) * {spec.h} + (r % {spec.ho}) * {sh}"
    return f"""        {{
            int32_t j;
            for (j = 0; j < {npx}; j++) {{
                const int32_t q = {t} + j, r = q / {spec.wo}, c = q % {spec.wo};
                cg_widen_words(in + (({row}) * {spec.w} + c * {sw}) * {k}, cg_s + j * {k // 2}, {k // 4});
            }}
        }}"""


def _pointwise(spec, fname, array, biases, x_expr, y_expr) -> GeneratedLayer:
    """A pointwise DSP layer (:func:`is_pointwise`): its pixels in tiles of :data:`PW_PIXELS`, each tile's
    inputs widened once into a stack buffer (``cg_widen_words``), then one assembly loop per tile over the
    layer's stream (biases, weights and epilogue constants of each pair of filters in the order it reads
    them), a strided layer's pixels gathered by the widening; the last tile overlaps the one before it
    when the pixel count is not a multiple of the tile
    (its outputs written twice, the same bytes; the output never aliases the input of a convolution), a
    layer of fewer pixels than a tile runs one tile through a stack copy of its outputs."""
    k, co, n = spec.c_in, spec.c_out, PW_PIXELS
    stream, ep = pointwise_stream(spec, biases)
    name = array("gen_pw", stream)
    mode, out_off = ep.split(", ")[:2]
    npx = spec.n * spec.ho * spec.wo
    words = n * k // 2
    body = f"""#ifdef CG_HAVE_DSP
        {{
            register int32_t *cg_x __asm__("r8") = cg_s;
            cg_s[{words}] = (int32_t)(uintptr_t)cg_y;
            __asm__ volatile({_pointwise_asm(k, co, [-int(v) for v in spec.shift])}
                : [x] "+r"(cg_x)
                :
                : "r0", "r1", "r2", "r3", "r4", "r5", "r6", "r9", "r10", "r11", "r12", "lr", "memory", "cc");
        }}
#else
        cg_pointwise_c(cg_s, cg_y, {co}, {name}, {co // 2}, {k}, {mode}, {out_off});
#endif"""
    stream_words = f"""#ifdef CG_HAVE_DSP
    cg_s[{words + 1}] = (int32_t)(uintptr_t)({name} + {stream.numel()});
    cg_s[{words + 2}] = (int32_t)(uintptr_t){name};
#endif
"""
    if npx >= n:
        loop = f"""    int32_t p;
{stream_words}    for (p = 0; p < {npx}; p += {n}) {{
        const int32_t t = p + {n} <= {npx} ? p : {npx - n};
        int8_t *cg_y = out + t * {co};
{_pointwise_widen(spec, n, "t")}
{body}
    }}
"""
    else:  # (fewer pixels than a tile: the tile's other rows zero, its outputs through a stack copy)
        loop = f"""    int8_t cg_out[{n * co}];
    int8_t *cg_y = cg_out;
    memset(cg_s, 0, sizeof cg_s);
{stream_words}{_pointwise_widen(spec, npx, "0")}
    {{
{body}
    }}
    memcpy(out, cg_out, {npx * co});
"""
    fns = f"void {fname}(const int8_t *in, int8_t *out)\n{{\n    int32_t cg_s[{words + 3}];\n{loop}}}\n"
    what = (f"generated dsp 1x1 pointwise conv: {n} px x 2 ch tiles over widened inputs, one assembly loop "
            f"per tile over an interleaved bias/weight/epilogue stream, short epilogue")
    return GeneratedLayer(fns, f"{fname}({x_expr}, {y_expr});", what, True, {"gen_pw": name})


WINDOW_PAIRS_MAX = 64  # int16 pairs of one window the DSP path gathers (two windows: a 512-byte stack buffer)


def window_pairs(spec: LayerSpec) -> list[tuple]:
    """The int16 pairs of a gathered window (``dsp_gathers_windows``) in buffer order: per kernel row of
    ``L = kW * C_in`` bytes, per whole word ``("w", r, off, rot)`` - ``SXTB16`` of the word at byte ``off``,
    rotated by ``rot`` (0: bytes 0 and 2, 8: bytes 1 and 3) -, then the rows' last ``L % 4`` bytes as
    ``("h", (r, j), (r', j') or None)``, two single bytes (the second lane of a lone one has weight 0)."""
    length = spec.kw * spec.c_in
    items: list[tuple] = []
    halves = []
    for r in range(spec.kh):
        for q in range(length // 4):
            items += [("w", r, 4 * q, 0), ("w", r, 4 * q, 8)]
        halves += [(r, j) for j in range(length - length % 4, length)]
    for i in range(0, len(halves), 2):
        items.append(("h", halves[i], halves[i + 1] if i + 1 < len(halves) else None))
    return items


def _lanes(item: tuple) -> tuple:
    """The two taps ``(row, byte)`` (or None) of a window pair."""
    if item[0] == "w":
        _, r, off, rot = item
        return (r, off + rot // 8), (r, off + rot // 8 + 2)
    return item[1], item[2]


def full_window_bias(spec: LayerSpec) -> torch.Tensor:
    """int64 ``[C_out]``: the bias with the input offset folded over every tap (a gathered window's
    taps outside the input hold ``-input_offset``, whose products with the offset added are zero)."""
    return folded_biases(spec, [(0, spec.kh, 0, spec.kw)])[0]


def dsp_gathers_windows(spec: LayerSpec, isa: str, short: bool) -> bool:
    """Whether a DSP dense layer gathers each window (small windows: the first layer of an image or
    audio network) into an int16 stack buffer, filled with the input zero point outside the input,
    and runs 2 px x 4 filters per step over the pairs (:func:`_windows_dsp`): C_out % 4 == 0, at most
    WINDOW_PAIRS_MAX pairs, and the pointwise loop's epilogue (SMMLAR, output offset folded, no clamp
    inside the int8 range), proven for the full-window bias too."""
    if not (isa == "dsp" and spec.kind == "conv" and (spec.kh, spec.kw) != (1, 1) and spec.c_out % 4 == 0
            and spec.c_out + 4 < 4096  # (the second pixel's output offsets: STRB immediates)
            and -128 <= -spec.input_offset <= 127 and len(window_pairs(spec)) <= WINDOW_PAIRS_MAX
            and sign_from_acc(short, spec.shift) and offset_folds(short, spec.shift, spec.output_offset)
            and (spec.act_min, spec.act_max) == (-128, 127)):
        return False
    w = spec.weight.to(torch.int64).abs().sum(dim=(1, 2, 3))
    bound = int((full_window_bias(spec).abs() + 128 * w).max())
    return short_epilogue_ok(bound, spec.multiplier, spec.shift)


def _word(lo, hi) -> int:
    """Two int16 values as one int32 word (``lo`` in the low half)."""
    v = (int(lo) & 0xFFFF) | ((int(hi) & 0xFFFF) << 16)
    return v - (1 << 32) if v >= 1 << 31 else v


def window_stream(spec: LayerSpec, items: list[tuple]) -> tuple[torch.Tensor, str]:
    """int32 stream of a gathered-window layer (``cg_windows_c``): per group of four filters their four
    doubled full-window biases, per window pair the four filters' doubled weight pairs, then ``{multiplier,
    right, K}`` of each filter; and cg_output's arguments after ``q``."""
    co, length = spec.c_out, spec.kw * spec.c_in
    table, ep = scalar_epilogue(spec.multiplier, spec.shift, True, spec.output_offset, -128, 127, True, True)
    w = spec.weight.to(torch.int64).reshape(co, spec.kh, length)
    bias = 2 * full_window_bias(spec)
    out: list[int] = []
    for g in range(0, co, 4):
        out += [int(bias[g + f]) for f in range(4)]
        for it in items:
            a, b = _lanes(it)
            for f in range(g, g + 4):
                out.append(_word(2 * w[f, a[0], a[1]] if a else 0, 2 * w[f, b[0], b[1]] if b else 0))
        for f in range(g, g + 4):
            out += [int(v) for v in table[f, :3]]
    return torch.tensor(out, dtype=torch.int32), ep


def _ins(s: str) -> str:
    return f'"{s}\\n\\t"'


WIN_ACC = ("r0", "r1", "r2", "r3", "r4", "r5", "r6", "r8")  # pixel 0's filters 0..3, then pixel 1's
WIN_TMP = ("r9", "r10", "r11", "lr")
WIN_W = "r12"  # the stream pointer (the input pointer during a gather)
# (r7 is left alone: the frame pointer of unoptimised builds; no memory operand: none left to address it)


WINDOW_UNROLL_MAX = 64  # groups x pairs of a row loop written out (no group loop; the shifts immediates)


def _window_groups_asm(pairs: int, xs: int, ys: int, slot: dict, shifts: list[int] | None = None) -> list[str]:
    """The groups of four filters of a gathered-window stream for the pixel pair whose windows are at sp
    and sp + ``xs`` (``ys``: the second pixel's output offset; 0, 0 for a lone pixel): the biases' LDRs
    pipelined with the first step's, per window pair two input words and four weight words by LDRs (one
    cycle each after the first on a Cortex-M4), 8 SMLAD (the first step's start from the biases: no
    copies), the SMMLAR epilogue of eight outputs and their stores; the output pointer (and the stream's
    end) in the frame's ``slot``.  A loop over the groups, one pointer step each (the output pointer
    advanced by four), or with ``shifts`` (each channel's right shift) the groups written out at
    immediate stream offsets, each shift an immediate of the SSAT (the output pointer unchanged)."""
    ins, a, (t0, t1, t2, t3), w = _ins, WIN_ACC, WIN_TMP, WIN_W
    size = 16 + 16 * pairs + 48  # (one group's words in bytes)
    lines = [] if shifts else ['"1:\\n\\t"']
    for g in range(len(shifts) // 4 if shifts else 1):
        base, yo = (size * g, 4 * g) if shifts else (0, 0)
        lines += [ins(f"ldr {a[f]}, [{w}, #{base + 4 * f}]") for f in range(4)]
        for p in range(pairs):
            o = base + 16 + 16 * p
            lines += [ins(f"ldr {t0}, [sp, #{4 * p}]"), ins(f"ldr {t1}, [sp, #{xs + 4 * p}]")]
            for half in (0, 1):
                lines += [ins(f"ldr {t2}, [{w}, #{o + 8 * half}]"), ins(f"ldr {t3}, [{w}, #{o + 8 * half + 4}]")]
                for f, t in ((2 * half, t2), (2 * half + 1, t3)):
                    src = a[f] if p == 0 else a[f + 4]  # (step 0: the second pixel starts from the bias too)
                    lines += [ins(f"smlad {a[f + 4]}, {t1}, {t}, {src}"), ins(f"smlad {a[f]}, {t0}, {t}, {a[f]}")]
        o = base + 16 + 16 * pairs  # m, right, K of each filter
        for f in range(4):
            u, v = a[f], a[f + 4]
            lines += [ins(f"ldr {t0}, [{w}, #{o + 12 * f}]"), ins(f"ldr {t1}, [{w}, #{o + 12 * f + 8}]")]
            if not shifts:
                lines.append(ins(f"ldr {t3}, [{w}, #{o + 12 * f + 4}]"))
            lines += [ins(f"add {t2}, {t1}, {u}, asr #31"), ins(f"smmlar {u}, {u}, {t0}, {t2}"),
                      ins(f"add {t2}, {t1}, {v}, asr #31"), ins(f"smmlar {v}, {v}, {t0}, {t2}")]
            if shifts:
                r = shifts[4 * g + f]
                lines += [ins(f"ssat {u}, #8, {u}, asr #{r}"), ins(f"ssat {v}, #8, {v}, asr #{r}")]
            else:
                lines += [ins(f"asr {u}, {u}, {t3}"), ins(f"asr {v}, {v}, {t3}"),
                          ins(f"ssat {u}, #8, {u}"), ins(f"ssat {v}, #8, {v}")]
            if f == 0:  # (the output pointer into a free register; the first accumulator's holds it after the stores)
                lines += [ins(f"ldr {t0}, [sp, #{slot['y']}]"), ins(f"strb {u}, [{t0}, #{yo}]"),
                          ins(f"strb {v}, [{t0}, #{ys + yo}]"), ins(f"mov {a[0]}, {t0}")]
            else:
                lines += [ins(f"strb {u}, [{a[0]}, #{yo + f}]"), ins(f"strb {v}, [{a[0]}, #{ys + yo + f}]")]
    if not shifts:
        lines += [ins(f"adds {a[0]}, {a[0]}, #4"), ins(f"str {a[0]}, [sp, #{slot['y']}]"),
                  ins(f"add {w}, {w}, #{size}"), ins(f"ldr {t0}, [sp, #{slot['end']}]"), ins(f"cmp {w}, {t0}"),
                  ins("bne 1b")]
    return lines


def _window_gather_asm(spec: LayerSpec, items: list[tuple], xs: int, pairs: int) -> list[str]:
    """The gather of two interior windows (at WIN_W and WIN_W + ``xs``) into the frame's buffer (at sp;
    the second window ``4 * pairs`` bytes on): whole words six at a time (six pipelined LDRs, 12 SXTB16,
    12 STR), then the single bytes four pairs at a time (LDRSB, PKHBT, STR)."""
    ins, row, x = _ins, spec.w * spec.c_in, WIN_W
    words, halves = [], []
    for d, base in ((0, 0), (xs, 4 * pairs)):
        for p, it in enumerate(items):
            if it[0] == "w" and it[3] == 0:
                words.append((d + it[1] * row + it[2], base + 4 * p))
            elif it[0] == "h":
                a, b = it[1], it[2]
                halves.append((d + a[0] * row + a[1], d + b[0] * row + b[1] if b else None, base + 4 * p))
    lines = []
    regs = WIN_ACC + WIN_TMP
    for k in range(0, len(words), 6):
        batch = words[k:k + 6]
        lines += [ins(f"ldr {regs[i]}, [{x}, #{off}]") for i, (off, _) in enumerate(batch)]
        for i in range(len(batch)):
            lines += [ins(f"sxtb16 {regs[6 + i]}, {regs[i]}, ror #8"), ins(f"sxtb16 {regs[i]}, {regs[i]}")]
        for i, (_, dst) in enumerate(batch):
            lines += [ins(f"str {regs[i]}, [sp, #{dst}]"), ins(f"str {regs[6 + i]}, [sp, #{dst + 4}]")]
    for k in range(0, len(halves), 4):
        batch = halves[k:k + 4]
        for i, (a, b, _) in enumerate(batch):
            lines.append(ins(f"ldrsb {regs[2 * i]}, [{x}, #{a}]"))
            if b is not None:
                lines.append(ins(f"ldrsb {regs[2 * i + 1]}, [{x}, #{b}]"))
        for i, (a, b, dst) in enumerate(batch):
            if b is not None:
                lines.append(ins(f"pkhbt {regs[2 * i]}, {regs[2 * i]}, {regs[2 * i + 1]}, lsl #16"))
            lines.append(ins(f"str {regs[2 * i]}, [sp, #{dst}]"))
    return lines


def _window_copy_asm(words: int) -> list[str]:
    """The copy of ``words`` gathered words from r3 into the frame's buffer (at sp), eight per LDM / STM."""
    regs = ("r4", "r5", "r6", "r8", "r9", "r10", "r11", "lr")
    lines = [_ins("mov r2, sp")]
    for k in range(0, words, 8):
        lst = "{" + ", ".join(regs[:min(8, words - k)]) + "}"
        lines += [_ins(f"ldm r3!, {lst}"), _ins(f"stm r2!, {lst}")]
    return lines


def window_row_ok(spec: LayerSpec, pairs: int) -> bool:
    """Whether a gathered-window layer's frame offsets, gather offsets and pointer steps are all
    immediates of their instructions."""
    span = (spec.kh - 1) * spec.w * spec.c_in + (spec.kw + spec.stride[1]) * spec.c_in
    return span < 4096 and 8 * pairs + 24 < 4096 and 2 * spec.stride[1] * spec.c_in < 4096 and 2 * spec.c_out < 4096


def _window_function(fname: str, suffix: str, args: str, lines: list[str], name: str, size: int,
                     host: str) -> str:
    """A gathered-window function: the assembly ``lines`` on DSP cores (inputs: r0 the output pointer,
    r1 the count, r2 the stream's end, r3 the input, r12 the stream), ``host`` (C) elsewhere."""
    text = "\n                ".join(lines)
    return f"""static __attribute__((noinline)) void {fname}_{suffix}({args})
{{
#ifdef CG_HAVE_DSP
    register int32_t cg_y __asm__("r0") = (int32_t)(uintptr_t)y;
    register int32_t cg_n __asm__("r1") = n;
    register int32_t cg_end __asm__("r2") = (int32_t)(uintptr_t)({name} + {size});
    register int32_t cg_x __asm__("r3") = (int32_t)(uintptr_t)x;
    register int32_t cg_w __asm__("r12") = (int32_t)(uintptr_t){name};
    __asm__ volatile({text}
                : "+r"(cg_y), "+r"(cg_n), "+r"(cg_end), "+r"(cg_x), "+r"(cg_w)
                :
                : "r4", "r5", "r6", "r8", "r9", "r10", "r11", "lr", "memory", "cc");
#else
{host}#endif
}}
"""


def _window_functions(spec: LayerSpec, fname: str, items: list[tuple], name: str, size: int, mode: str,
                      out_off: str) -> dict[str, Callable[[str], str]]:
    """The per-layer gathered-window functions, by suffix (each written only where the layer calls it):
    ``row(x, y, n)``: ``n`` pairs of interior pixels along a row (windows at ``x``, ``x + stride * C_in``,
    ...) in one assembly loop - the two windows' gather into the frame's buffer, the loop over the
    stream's groups, the pointer steps -, its state (input and output pointers, count, stream start and
    end) in stack slots after the buffer; ``win2`` / ``win2v`` / ``win1`` ``(x, y, n)``: one pixel pair
    whose windows the C gathered into ``x`` (copied into the frame), the second pixel the next in the row
    / the one below / none (a lone pixel: the first window twice, its outputs stored twice)."""
    c, co, sw = spec.c_in, spec.c_out, spec.stride[1]
    pairs = len(items)
    shifts = [int(-v) for v in spec.shift]  # (every one >= 1: dsp_gathers_windows)
    slot = {k: 8 * pairs + 4 * i for i, k in enumerate(("x", "y", "n", "w", "end"))}
    frame = 8 * pairs + 24
    ins, t0, w = _ins, WIN_TMP[0], WIN_W
    enter = [ins(f"sub sp, sp, #{frame}"), ins(f"str r3, [sp, #{slot['x']}]"), ins(f"str r0, [sp, #{slot['y']}]"),
             ins(f"str r1, [sp, #{slot['n']}]"), ins(f"str {w}, [sp, #{slot['w']}]"),
             ins(f"str r2, [sp, #{slot['end']}]")]
    leave = [ins(f"add sp, sp, #{frame}")]

    def row(gather: str) -> str:
        lines = enter + ['"2:\\n\\t"', ins(f"ldr {w}, [sp, #{slot['x']}]")]
        lines += _window_gather_asm(spec, items, sw * c, pairs)
        lines.append(ins(f"ldr {w}, [sp, #{slot['w']}]"))
        unroll = co * pairs <= 4 * WINDOW_UNROLL_MAX and (co // 4) * (64 + 16 * pairs) < 4096
        lines += _window_groups_asm(pairs, 4 * pairs, co, slot, shifts if unroll else None)
        step = 2 * co if unroll else co  # (the group loop advanced the output pointer by C_out)
        lines += [ins(f"ldr {t0}, [sp, #{slot['y']}]"), ins(f"add {t0}, {t0}, #{step}"),
                  ins(f"str {t0}, [sp, #{slot['y']}]"),
                  ins(f"ldr {t0}, [sp, #{slot['x']}]"), ins(f"add {t0}, {t0}, #{2 * sw * c}"),
                  ins(f"str {t0}, [sp, #{slot['x']}]"), ins(f"ldr {t0}, [sp, #{slot['n']}]"),
                  ins(f"subs {t0}, {t0}, #1"), ins(f"str {t0}, [sp, #{slot['n']}]"), ins("bne 2b")] + leave
        host = (f"    int32_t buf[{2 * pairs}];\n    int32_t i;\n"
                f"    for (i = 0; i < n; i++, x += {2 * sw * c}, y += {2 * co}) {{\n"
                f"        {gather}(x, 0, buf);\n        {gather}(x, {sw * c}, buf + {pairs});\n"
                f"        cg_windows_c(buf, {pairs}, y, {co}, {name}, {co // 4}, {pairs}, {mode}, {out_off});\n    }}\n")
        return _window_function(fname, "row", "const int8_t *x, int8_t *y, int32_t n", lines, name, size, host)

    def pair(suffix: str, ys: int) -> str:
        two = ys != 0
        lines = enter + _window_copy_asm(2 * pairs if two else pairs)
        lines += _window_groups_asm(pairs, 4 * pairs if two else 0, ys, slot) + leave
        host = (f"    (void)n;\n    cg_windows_c(x, {pairs if two else 0}, y, {ys}, {name}, {co // 4}, {pairs}, {mode}, "
                f"{out_off});\n")
        return _window_function(fname, suffix, "const int32_t *x, int8_t *y, int32_t n", lines, name, size, host)

    return {"row": row, "win2": lambda _: pair("win2", co), "win2v": lambda _: pair("win2v", spec.wo * co),
            "win1": lambda _: pair("win1", 0)}


def _gather(spec: LayerSpec, items: list[tuple], box: tuple[int, int, int, int], fn: str) -> str:
    """The gather of one window whose taps inside the input are ``box`` (kernel rows ``[i0, i1)`` x
    columns ``[j0, j1)``): ``in[o + ...]`` the window's bytes (``o`` the offset of its top-left tap, the
    only ones read are inside), the input zero point elsewhere; whole words by one load and two SXTB16."""
    i0, i1, j0, j1 = box
    c, row = spec.c_in, spec.w * spec.c_in
    zp = -spec.input_offset

    def inside(t) -> bool:
        return t is not None and i0 <= t[0] < i1 and j0 <= t[1] // c < j1

    def lane(t) -> str:
        return f"in[o + {t[0] * row + t[1]}]" if inside(t) else str(zp)

    lines = []
    for p, it in enumerate(items):
        a, b = _lanes(it)
        if it[0] == "w" and all(inside((it[1], it[2] + k)) for k in range(4)):
            if it[3] == 0:  # (the word's rot-8 pair follows it)
                lines += [f"    {{", f"        const int32_t v = cg_read32(in + o + {it[1] * row + it[2]});",
                          f"        buf[{p}] = cg_sxtb16(v);", f"        buf[{p + 1}] = cg_sxtb16_ror8(v);", "    }"]
        elif b is None:
            lines.append(f"    buf[{p}] = {lane(a)};")
        else:
            lines.append(f"    buf[{p}] = cg_pair16({lane(a)}, {lane(b)});")
    return (f"CG_INLINE void {fn}(const int8_t *in, int32_t o, int32_t *buf)\n{{\n"
            + ("    (void)in;\n    (void)o;\n" if not any(inside(t) for it in items for t in _lanes(it)) else "")
            + "\n".join(lines) + "\n}\n")


def _windows_dsp(spec, fname, array, x_expr, y_expr) -> GeneratedLayer:
    """A DSP dense layer with small windows (:func:`dsp_gathers_windows`): output pixels in pairs (along
    a row, across segments: the windows' taps outside the input hold the input zero point, one
    full-window bias serves every pixel; an odd width's last column in pairs of rows), both windows
    gathered into an int16 buffer in the pair order of :func:`window_pairs` (whole words by SXTB16: the
    weights are stored in that order), then per-layer assembly over the layer's stream (per group of
    four filters: biases, weights, epilogue constants): 2 px x 4 filters, eight accumulators in
    registers, each input word loaded once per group.  The interior pixel pairs of a row run in one
    assembly loop that gathers too (``row``), the others gather in C (:func:`_window_functions`)."""
    c, co = spec.c_in, spec.c_out
    sh, sw = spec.stride
    ph, pw = spec.padding
    items = window_pairs(spec)
    pairs = len(items)
    stream, ep = window_stream(spec, items)
    name = array("gen_win", stream)
    mode, out_off = ep.split(", ")[:2]
    rows = _runs(spec.ho, spec.kh, sh, ph, spec.h)
    cols = _runs(spec.wo, spec.kw, sw, pw, spec.w)
    col_run = [k for k, (o0, o1, _, _) in enumerate(cols) for _ in range(o0, o1)]
    row_run = [k for k, (o0, o1, _, _) in enumerate(rows) for _ in range(o0, o1)]
    makers = _window_functions(spec, fname, items, name, stream.numel(), mode, out_off)
    boxes: dict[tuple, str] = {}
    used: dict[str, str] = {}
    fns = []

    def gather(kr: int, kc: int) -> str:
        box = (rows[kr][2], rows[kr][3], cols[kc][2], cols[kc][3])
        if box not in boxes:
            boxes[box] = f"{fname}_g{len(boxes)}"
            fns.append(_gather(spec, items, box, boxes[box]))
        return boxes[box]

    def call(suffix: str, args: str, interior: str = "") -> str:
        if suffix not in used:
            used[suffix] = makers[suffix](interior)
        return f"{fname}_{suffix}({args});"

    def paired(runs: list[int], n: int) -> list[tuple[tuple[int, int], int, int]]:
        """Pairs (k, k + 1) of ``0..n-1`` in loops: (the two runs, first k, end)."""
        groups: list[list] = []
        for k in range(0, n - 1, 2):
            sig = (runs[k], runs[k + 1])
            if groups and groups[-1][0] == sig:
                groups[-1][2] = k + 2
            else:
                groups.append([sig, k, k + 2])
        return [(g[0], g[1], g[2]) for g in groups]

    full = (0, spec.kh, 0, spec.kw) if window_row_ok(spec, pairs) else None  # (None: every pair gathers in C)
    vertical = spec.wo % 2 == 1 and spec.ho > 1 and spec.wo * co + 4 < 4096  # (the last column in pairs of rows)
    width = spec.wo - 1 if vertical else spec.wo
    body = []
    for kr, (oy0, oy1, i0, i1) in enumerate(rows):
        loops = []
        for (ka, kb), s, e in paired(col_run, width):
            ga, gb = gather(kr, ka), gather(kr, kb)
            if ka == kb and (i0, i1, cols[ka][2], cols[ka][3]) == full:
                loops.append(f"            " + call("row", f"x + orow + {(s * sw - pw) * c}, yr + {s * co}, {(e - s) // 2}", ga))
                continue
            loops += [f"            for (ox = {s}; ox < {e}; ox += 2) {{",
                      f"                {ga}(x, orow + (ox * {sw} - {pw}) * {c}, buf);",
                      f"                {gb}(x, orow + (ox * {sw} + {sw - pw}) * {c}, buf + {pairs});",
                      "                " + call("win2", f"buf, yr + ox * {co}, 1"),
                      "            }"]
        if width % 2:
            ox = width - 1
            loops += [f"            {gather(kr, col_run[ox])}(x, orow + {(ox * sw - pw) * c}, buf);",
                      "            " + call("win1", f"buf, yr + {ox * co}, 1")]
        if loops:
            body += [f"        for (oy = {oy0}; oy < {oy1}; oy++) {{  /* kernel rows {i0}..{i1 - 1} inside */",
                     f"            const int32_t orow = (oy * {sh} - {ph}) * {spec.w * c};",
                     f"            int8_t *yr = y + oy * {spec.wo * co};",
                     "            int32_t ox;",
                     "            (void)ox;", *loops, "        }"]
    if vertical:  # the last column: pixels (oy, oy + 1)
        ox = spec.wo - 1
        kc, xo = col_run[ox], (ox * sw - pw) * c
        for (ka, kb), s, e in paired(row_run, spec.ho):
            body += [f"        for (oy = {s}; oy < {e}; oy += 2) {{  /* the last column, two rows */",
                     f"            {gather(ka, kc)}(x, (oy * {sh} - {ph}) * {spec.w * c} + {xo}, buf);",
                     f"            {gather(kb, kc)}(x, (oy * {sh} + {sh - ph}) * {spec.w * c} + {xo}, buf + {pairs});",
                     "            " + call("win2v", f"buf, y + (oy * {spec.wo} + {ox}) * {co}, 1"),
                     "        }"]
        if spec.ho % 2:
            oy = spec.ho - 1
            body += [f"        {gather(row_run[oy], kc)}(x, {(oy * sh - ph) * spec.w * c + xo}, buf);",
                     "        " + call("win1", f"buf, y + {(oy * spec.wo + ox) * co}, 1")]
    fns += list(used.values())
    in_size, out_size = spec.h * spec.w * c, spec.ho * spec.wo * co
    fns.append(f"void {fname}(const int8_t *in, int8_t *out)\n{{\n"
               f"    int32_t buf[{2 * pairs}] __attribute__((aligned(8)));  /* two gathered windows */\n"
               "    int32_t b, oy;\n"
               "    (void)buf;\n"
               f"    for (b = 0; b < {spec.n}; b++) {{\n"
               f"        const int8_t *x = in + b * {in_size};\n"
               f"        int8_t *y = out + b * {out_size};\n" + "\n".join(body) + "\n    }\n}\n")
    what = (f"generated dsp {spec.kh}x{spec.kw} conv, small windows: each gathered into an int16 buffer "
            f"({pairs} pairs), 2 px x 4 ch in per-layer assembly over an interleaved bias/weight/epilogue stream, "
            "short epilogue")
    return GeneratedLayer("\n".join(fns), f"{fname}({x_expr}, {y_expr});", what, True, {"gen_win": name})


def _dense(spec, isa, fname, array, segs, biases, short, x_expr, y_expr) -> GeneratedLayer:
    if isa == "dsp" and is_matvec(spec):
        return _matvec(spec, fname, array, biases, short, x_expr, y_expr)
    if is_pointwise(spec, isa, short):
        return _pointwise(spec, fname, array, biases, x_expr, y_expr)
    if mve_gathers_windows(spec, isa, short):
        return _windows_mve(spec, fname, array, segs, biases, x_expr, y_expr)
    if dsp_gathers_windows(spec, isa, short):
        return _windows_dsp(spec, fname, array, x_expr, y_expr)
    c, co, kw, k = spec.c_in, spec.c_out, spec.kw, spec.kh * spec.kw * spec.c_in
    sh, sw = spec.stride
    ph, pw = spec.padding
    # DSP: pre-widened int16 weights in SXTB16 order, filter pairs interleaved (one LDM per four
    # inputs: CG_DOT_2X2_PAIR) for runs aligned to groups of four - all of them when C_in % 4 == 0;
    # misaligned runs (small C_in: the first layer) read extended tables, int8 rows otherwise
    paired = isa == "dsp" and sw * c < 4096
    views = _split_by_view(spec, segs, paired)
    arrays: dict[str, str] = {}
    tables: dict[object, str] = {}
    f = doubles(short, paired and all(v != "bytes" for _, v in views))
    for _, v in views:
        if v in tables:
            continue
        if v == "full":
            tables[v] = array("gen_weight16", f * paired_weights(spec.weight.to(torch.int8)))
        elif v == "bytes":
            tables[v] = array("gen_weight", spec.weight.to(torch.int8).reshape(co, -1).contiguous())
        else:
            j0, j1, d = v
            tables[v] = array(f"gen_weight16_c{j0}_{j1}_{d}", f * paired_weights(extended_weights(spec, j0, j1, d)))
    arrays.update({name: name for name in tables.values()})
    arrays["gen_bias"] = b_name = array("gen_bias", (f * biases.to(torch.int32)).contiguous())
    mve4 = isa == "mve" and short and co % 4 == 0  # 2 px x 4 filters, a 4-lane epilogue
    if mve4:
        table, ep = epilogue_table(spec.multiplier, spec.shift, short, planar=True), ""
    else:
        table, ep = scalar_epilogue(spec.multiplier, spec.shift, short, spec.output_offset, spec.act_min,
                                    spec.act_max, f == 2, isa == "dsp")
    arrays["gen_q"] = q_name = array("gen_q", table)
    dot = f"cg_dot_2x2_{isa}"
    xr = f"xp + r * {spec.w * c}"

    def dots(xs: str, two_px: bool, pair: bool) -> list[str]:
        """The row loop of one tile (pair: two filters; else the last, odd one)."""
        if pair:  # (a one-pixel tile reads its own pixel twice, XS 0: the second sums are dropped)
            # (the wide loop where a kernel row has 8 groups of four inputs or more, in the hot copy)
            unroll = "unroll" if kw * c >= 32 else "0"
            wide = f"CG_DOT_2X2_PAIR({xr} - xback, {xs if two_px else 0}, wp + r * 2 * wrow, runp, acc, {unroll});"
            narrow = f"{dot}({xr}, {xs}, w8 + r * {kw * c}, {k}, run, acc);"
        else:
            wide = f"cg_dot_2x2_dspw({xr} - xback, {xs}, wp + r * wrow, 0, runp, acc);"
            narrow = f"{dot}({xr}, {xs}, w8 + r * {kw * c}, 0, run, acc);"
        return ["#pragma GCC unroll 16", "    for (r = 0; r < rows; r++) {", "        if (wt != NULL) {", f"            {wide}",
                "        } else {", f"            {narrow}", "        }", "    }"]

    tiles: dict[tuple[int, int], str] = {}  # (rows, pixels) -> the layer's Helium tile function
    if mve4:  # whole kernel rows read the interleaved table (the tile loops), border segments the int8 rows
        arrays["gen_weight_mve"] = wi = array("gen_weight_mve", mve_interleaved_weights(spec.weight.to(torch.int8)))
        chunks, tail = divmod(kw * c, 16)
        row_bytes = 64 * (chunks + (1 if tail else 0))
        flags = mve_epilogue_flags(spec.shift)
        for rows in sorted({s.i1 - s.i0 for s, _ in views if s.j0 == 0 and s.j1 == kw and s.i1 > s.i0}):
            for npx in (1, 2):
                fn = mve_tile_function(f"{fname}_tiles_{rows}_{npx}", npx, rows, chunks, tail, spec.w * c, sw * c,
                                       row_bytes, (spec.kh - rows) * row_bytes, co, q_name, flags, spec)
                if fn is not None:
                    tiles[(rows, npx)] = fn

    def tile_mve4(two_px: bool) -> str:
        xs = f"{sw * c}" if two_px else "0"
        tail_args = (f"bias + o, {q_name} + o, {co}, {mve_epilogue_flags(spec.shift)}, {spec.output_offset}, "
                     f"{spec.act_min}, {spec.act_max}, yp + o, yp + {co if two_px else 0} + o);")
        fast = []  # (the rows of the segment select its tile function; constant once the segment is inlined)
        for (rows, npx) in tiles:
            if npx == (2 if two_px else 1):
                fast += [f"if (rows == {rows}) {{",
                         f"    {fname}_tiles_{rows}_{npx}(xp, {wi} + i0 * {row_bytes}, bias, yp, yp + {co});",
                         "} else"]
        lines = [
            "int32_t o;",
            "(void)wt; (void)woff; (void)wrow; (void)wk; (void)xback; (void)runp;",
            f"if (j0 == 0 && j1 == {kw}) {{",
            *("    " + ln for ln in fast),
            "    {",
            f"        for (o = 0; o < {co}; o += 4) {{",
            f"            cg_conv_2x4_mvei(xp, {xs}, {spec.w * c}, {wi} + (o / 4) * {spec.kh * row_bytes} + i0 * {row_bytes}, "
            f"rows, {chunks}, {tail}, " + tail_args,
            "        }",
            "    }",
            "} else {",
            f"    for (o = 0; o < {co}; o += 4) {{",
            f"        cg_conv_2x4_mve(xp, {xs}, {spec.w * c}, w8base + o * {k} + (i0 * {kw} + j0) * {c}, {k}, {kw * c}, "
            "rows, run, " + tail_args,
            "    }",
            "}",
        ]
        return "\n".join("            " + ln for ln in lines) + "\n"

    def tile(two_px: bool, vertical: bool = False) -> str:
        """One tile: one pixel, or two - the next column's (``xs`` = stride * C_in), or the next row's
        (``vertical``: the last column of a segment of odd width pairs its rows)."""
        if mve4:
            return tile_mve4(two_px)
        xs = ("0" if not two_px else f"{sh * spec.w * c}" if vertical else f"{sw * c}")
        ys = spec.wo * co if vertical else co
        lines = [
            "const int16_t *wp = wt != NULL ? wt + 2 * woff : NULL;",
            f"const int8_t *w8 = w8base + (i0 * {kw} + j0) * {c};",
            f"const int32_t *qp = {q_name};",
            "int32_t o;",
            f"for (o = 0; o + 1 < {co}; o += 2) {{",
            "    int32_t acc[4], r;",
            "    acc[0] = bias[o]; acc[1] = bias[o + 1]; acc[2] = acc[0]; acc[3] = acc[1];",
            *dots(xs, two_px, True),
            "    {",
            f"        const int8_t v0 = cg_output(acc[0], qp, {ep});",  # (all values before the stores:
            f"        const int8_t v1 = cg_output(acc[1], qp + 4, {ep});",  # int8 stores may alias the tables)
        ]
        if two_px:
            lines += [f"        const int8_t v2 = cg_output(acc[2], qp, {ep});",
                      f"        const int8_t v3 = cg_output(acc[3], qp + 4, {ep});",
                      f"        yp[{ys} + o] = v2;",
                      f"        yp[{ys} + o + 1] = v3;"]
        lines += ["        yp[o] = v0;", "        yp[o + 1] = v1;", "    }",
                  "    if (wt != NULL) {", "        wp += 2 * wk;", "    }", f"    w8 += {2 * k};",
                  "    qp += 8;", "}"]
        if co % 2:
            lines += ["if (wt != NULL) {", f"    wp = wt + {co // 2} * 2 * wk + woff;", "}",
                      "{",
                      "    int32_t acc[4], r;",
                      f"    acc[0] = bias[{co - 1}]; acc[1] = acc[0]; acc[2] = acc[0]; acc[3] = acc[0];",
                      *dots(xs, two_px, False),
                      f"    yp[{co - 1}] = cg_output(acc[0], qp, {ep});"]
            if two_px:
                lines.append(f"    yp[{ys + co - 1}] = cg_output(acc[2], qp, {ep});")
            lines.append("}")
        return "\n".join("            " + ln for ln in lines) + "\n"

    # DSP: an odd-width segment's last column (the first layer's narrow outputs: 5 columns) pairs its
    # rows instead of running one-pixel tiles (which compute a second pixel's sums and drop them)
    vertical_ok = isa == "dsp" and sh * spec.w * c < 4096
    body = (f"    const int32_t rows = i1 - i0, run = (j1 - j0) * {c};\n"
            f"    const int vertical = {int(vertical_ok)} && ((ox1 - ox0) & 1) && oy1 - oy0 > 1;\n"
            "    int32_t oy;\n"
            "    (void)run;\n"
            "    (void)w8base;\n"
            "    (void)unroll;\n"
            "    for (oy = oy0; oy < oy1; oy++) {\n"
            f"        const int8_t *xp = in + ((oy * {sh} - {ph} + i0) * {spec.w} + (ox0 * {sw} - {pw} + j0)) * {c};\n"
            f"        int8_t *yp = out + (oy * {spec.wo} + ox0) * {co};\n"
            "        int32_t ox;\n"
            f"        for (ox = ox0; ox + 1 < ox1; ox += 2, xp += {2 * sw * c}, yp += {2 * co}) {{\n"
            + tile(True) +
            "        }\n"
            "        if (ox < ox1 && !vertical) {\n" + tile(False) + "        }\n"
            "    }\n")
    if vertical_ok:  # the last column of an odd-width segment: its pixels in pairs of rows
        last = (f"        const int8_t *xp = in + ((oy * {sh} - {ph} + i0) * {spec.w} + ((ox1 - 1) * {sw} - {pw} + j0)) * {c};\n"
                f"        int8_t *yp = out + (oy * {spec.wo} + ox1 - 1) * {co};\n")
        body += ("    if (vertical) {\n"
                 "        for (oy = oy0; oy + 1 < oy1; oy += 2) {\n" + last + tile(True, vertical=True) + "        }\n"
                 "        if (oy < oy1) {\n" + last + tile(False) + "        }\n"
                 "    }\n")

    def view_args(v, s: Segment) -> str:
        """wt, woff, wrow, wk, xback, runp, w8base of a segment's weight view."""
        w8 = tables.get("bytes", "NULL")
        if v == "bytes":
            return f"NULL, 0, 0, 0, 0, 0, {w8}"
        if v == "full":
            return f"{tables[v]}, {(s.i0 * kw + s.j0) * c}, {kw * c}, {k}, 0, {(s.j1 - s.j0) * c}, {w8}"
        j0, j1, d = v
        length = -(-((j1 - j0) * c) // 4) * 4
        return f"{tables[v]}, {s.i0 * length}, {length}, {spec.kh * length}, {d}, {length}, {w8}"

    split = [s for s, _ in views]
    view_of = {id(s): v for s, v in views}
    sig = ("(const int8_t *in, int8_t *out, int32_t oy0, int32_t oy1, int32_t ox0, int32_t ox1, int32_t i0, "
           "int32_t i1, int32_t j0, int32_t j1, const int32_t *bias, const int16_t *wt, int32_t woff, "
           "int32_t wrow, int32_t wk, int32_t xback, int32_t runp, const int8_t *w8base, int unroll)")
    need_general = any(not _specialised(spec, s, split) for s in split)
    fns = "".join(tiles[key] + "\n" for key in sorted(tiles))
    fns += f"CG_INLINE void {fname}_segf{sig}\n{{\n{body}}}\n"
    if need_general:
        fns += (f"\nstatic __attribute__((noinline)) void {fname}_seg{sig}\n{{\n"
                f"    (void)unroll;  /* (border segments: the short loop) */\n"
                f"    {fname}_segf(in, out, oy0, oy1, ox0, ox1, i0, i1, j0, j1, bias, wt, woff, wrow, wk, xback, "
                "runp, w8base, 0);\n}\n")
    calls = []
    for s in split:
        fn = f"{fname}_segf" if _specialised(spec, s, split) else f"{fname}_seg"
        unroll = int(fn.endswith("_segf") and _interior(spec, s))  # (the wide loop only in the hot copy)
        calls.append(f"        {fn}(x, y, {s.oy0}, {s.oy1}, {s.ox0}, {s.ox1}, {s.i0}, {s.i1}, {s.j0}, {s.j1}, "
                     f"{b_name} + {s.cls * co}, {view_args(view_of[id(s)], s)}, {unroll});")
    in_size, out_size = spec.h * spec.w * c, spec.ho * spec.wo * co
    fns += (f"\nvoid {fname}(const int8_t *in, int8_t *out)\n{{\n    int32_t b;\n"
            f"    for (b = 0; b < {spec.n}; b++) {{\n        const int8_t *x = in + b * {in_size};\n"
            f"        int8_t *y = out + b * {out_size};\n" + "\n".join(calls) + "\n    }\n}\n")
    kind = "1x1" if spec.kh == spec.kw == 1 else f"{spec.kh}x{spec.kw}"
    used = sorted({("extended" if isinstance(v, tuple) else v) for _, v in views})
    what = (f"generated {isa} {kind} conv: 2 px x {4 if mve4 else 2} ch tiles, weights {'/'.join(used)}, "
            f"{len(biases)} bias class(es), {'short' if short else 'general'} epilogue")
    return GeneratedLayer(fns, f"{fname}({x_expr}, {y_expr});", what, short, arrays)


DW_PLANAR_BYTES = 1024  # largest stack buffer of a planar depthwise layer's gathered rows
PLANAR_MIN_WIDTH = 4  # narrower output rows (x the stride): the channels-last path (measured: 3 outputs a row
# ran slower planar at stride 1, 6 at stride 2, where the gathers cost twice as much per output)


def planar_group(spec: LayerSpec, isa: str) -> int:
    """Channels per group of the channel-planar depthwise path (:func:`_dw_planar`; 0: not taken): DSP
    cores, 3x3 at stride 1 or 2, leading padding <= 2, C even, output rows of 4 (stride 2: 8) or more,
    three gathered rows of G channels within DW_PLANAR_BYTES (G the largest of 16, 8, 4, 2 dividing C
    that fits), every accumulator below 2**31."""
    if (isa != "dsp" or spec.kind != "depthwise" or (spec.kh, spec.kw) != (3, 3)
            or tuple(spec.stride) not in ((1, 1), (2, 2))
            or max(spec.padding) > 2 or spec.c_in % 2 or spec.wo < PLANAR_MIN_WIDTH * spec.stride[1]):
        return 0
    if planar_bound(spec) >= INT32_LIMIT:
        return 0
    rw = planar_row_elements(spec)
    for g in (16, 8, 4, 2):
        if spec.c_in % g == 0 and 3 * g * rw * 2 <= DW_PLANAR_BYTES:
            return g
    return 0


def planar_row_elements(spec: LayerSpec) -> int:
    """int16 elements of a gathered row: stride x the outputs rounded up to a step of four (or six, see
    :func:`planar_six`), plus two."""
    return max(spec.stride[1] * -(-spec.wo // 4) * 4, -(-spec.wo // 6) * 6 if planar_six(spec) else 0) + 2


# estimated M4 cycles of one channel's output row step (4 outputs, 2 outputs, 6 outputs: the instruction counts
# of planar_row_function's steps with the timing table), to choose the 6-output steps where they pay
_STEP4, _STEP2, _STEP6 = 76, 45, 103


def planar_six(spec: LayerSpec) -> bool:
    """Whether the planar rows take six outputs per step (stride 1; accumulators r3, r5, r8-r11, the
    output pointer on the stack) rather than four: where the estimated row cost is lower."""
    if spec.stride[1] != 1 or 6 * spec.c_in > THUMB_IMM12:
        return False
    n4, t4 = divmod(spec.wo, 4)
    n6, t6 = divmod(spec.wo, 6)
    tail = {0: 0, 1: _STEP2, 2: _STEP2, 3: _STEP4, 4: _STEP4, 5: _STEP6}
    return n6 * _STEP6 + tail[t6] < n4 * _STEP4 + tail[t4]


def planar_bias(spec: LayerSpec) -> torch.Tensor:
    """The interior folded bias (the planar path's padding holds the input zero point: every window is full)."""
    return folded_biases(spec, [(0, spec.kh, 0, spec.kw)])[0]


def planar_bound(spec: LayerSpec) -> int:
    """Largest |partial sum| of the planar path: its bias plus 128 * sum |w| (padding values are int8 too)."""
    w = spec.weight.to(torch.int64).abs().sum(dim=(0, 1))
    return int((planar_bias(spec).abs() + 128 * w).max())


PLANAR_STRAIGHT_STEPS = 3  # output rows of at most this many 4-output steps run them straight (no step loop)
PLANAR_WORDS = 11  # int32 words per channel of the planar table: 6 weight pairs, bias, 4 epilogue constants


def planar_table(spec: LayerSpec, f: int, q: torch.Tensor) -> torch.Tensor:
    """int32 ``[C, 11]``: per channel the int16 pairs (w0, w1), (w1, w2) of kernel rows 0, 1, 2 (w0 / w1
    in the low half), its bias, then its row of ``q`` (cg_output's constants); weights and bias times
    ``f`` (:func:`doubles`)."""
    w = f * spec.weight.to(torch.int64)  # [3, 3, C]

    def pair(lo, hi):
        return (lo & 0xFFFF) | ((hi & 0xFFFF) << 16)

    cols = []
    for r in range(3):
        cols += [pair(w[r, 0], w[r, 1]), pair(w[r, 1], w[r, 2])]
    cols.append(f * planar_bias(spec))
    t = torch.stack(cols, dim=1)
    t = torch.where(t >= 2**31, t - 2**32, t)
    return torch.cat([t, q.to(torch.int64)], dim=1).to(torch.int32).contiguous()


def _imm_mov(cond: str, reg: str, v: int) -> str:
    return f"mov{cond} {reg}, #{v}" if v >= 0 else f"mvn{cond} {reg}, #{~v}"


def _add_const(reg: str, v: int, tmp: str) -> list[str]:
    """``reg += v`` (any int32 ``v``; ``tmp`` may be clobbered)."""
    if v == 0:
        return []
    op, a = ("add", v) if v > 0 else ("sub", -v)
    if a <= THUMB_IMM12:
        return [f"{op} {reg}, {reg}, #{a}"]
    return [f"movw {tmp}, #{a & 0xFFFF}", *([f"movt {tmp}, #{a >> 16}"] if a >> 16 else []), f"{op} {reg}, {reg}, {tmp}"]


def planar_asm_ok(spec: LayerSpec, mode: int) -> bool:
    """Whether the planar rows run as assembly (:func:`planar_row_function`): the SMMLAR epilogue
    (CG_SIGN_FROM_ACC) and the three outputs' store offsets within STRB's immediate."""
    return bool(mode & SIGN_FROM_ACC) and 3 * spec.c_in <= THUMB_IMM12


def planar_row_function(fn: str, spec: LayerSpec, g: int, mode: int) -> str:
    """Assembly ``fn(r0, r1, r2, y, t)``: one output row of ``g`` channels, channel k from int16 rows
    ``r0..r2 + k * rw`` (kernel rows 0..2), its table ``t + 11 k`` (:func:`planar_table`), its outputs at
    ``y + k``, ``C`` bytes apart; four outputs per step (corten_gen.h: CG_DWP_KROW), accumulators
    r8-r11, the kernel row's weight pairs r6, r7, the input words r12, lr."""
    c, wo = spec.c_in, spec.wo
    n4, tail = divmod(wo, 4)
    acc = ["r8", "r9", "r10", "r11"]

    def step(stores: int) -> list[str]:
        """Four outputs (two where at most two are stored: out0, out1 read (x0, x1), (x2, x3) only)."""
        four = stores > 2
        a = [f"ldr {'r11' if four else 'r9'}, [r4, #24]"]
        for r, p in enumerate(("r0", "r1", "r2")):
            first = r == 0
            b = "r11" if four else "r9"
            if spec.stride[1] == 2:  # out_k += P_k . (w0, w1) + P_(k+1).lo w2, P_k the pair (x_2k, x_2k+1)
                a += [f"ldr r6, [r4, #{8 * r}]", f"ldr r7, [r4, #{8 * r + 4}]", f"ldr r12, [{p}], #16",
                      f"ldr lr, [{p}, #-12]", f"smlad r8, r12, r6, {b if first else 'r8'}", "smlabt r8, lr, r7, r8",
                      f"smlad r9, lr, r6, {b if first else 'r9'}", f"ldr r12, [{p}, #-8]", "smlabt r9, r12, r7, r9"]
                if four:
                    a += [f"smlad r10, r12, r6, {'r11' if first else 'r10'}", f"ldr lr, [{p}, #-4]",
                          "smlabt r10, lr, r7, r10", "smlad r11, lr, r6, r11", f"ldr r12, [{p}]",
                          "smlabt r11, r12, r7, r11"]
                continue
            a += [f"ldr r6, [r4, #{8 * r}]", f"ldr r7, [r4, #{8 * r + 4}]", f"ldr r12, [{p}], #8",
                  f"ldr lr, [{p}, #-4]",
                  f"smlad r8, r12, r6, {b if first else 'r8'}", f"smlatb r9, r12, r6, {b if first else 'r9'}"]
            if four:
                a += [f"smlad r10, lr, r6, {'r11' if first else 'r10'}", "smlatb r11, lr, r6, r11"]
            a += ["smlabt r8, lr, r7, r8", "smlad r9, lr, r7, r9"]
            if four:
                a += [f"ldr r12, [{p}]", "smlabt r10, r12, r7, r10", "smlad r11, r12, r7, r11"]
        a += ["ldr r6, [r4, #28]", "ldr r12, [r4, #32]", "ldr r7, [r4, #36]"]
        for k in range(stores):
            a += requant(acc[k]) + [f"strb {acc[k]}, [r3, #{k * c}]"]
        return a

    def requant(v: str) -> list[str]:
        """The SMMLAR epilogue of accumulator ``v`` (m r6, right shift r12, rounding constant r7; lr clobbered)."""
        a = [f"add lr, r7, {v}, asr #31", f"smmlar {v}, {v}, r6, lr", f"asr {v}, {v}, r12"]
        if not mode & OFFSET_IN_ROUNDING and spec.output_offset:
            off = spec.output_offset
            a.append(f"add {v}, {v}, #{off}" if off > 0 else f"sub {v}, {v}, #{-off}")
        a.append(f"ssat {v}, #8, {v}")
        if spec.act_min > -128:
            a += [f"cmp {v}, #{spec.act_min}", "it lt", _imm_mov("lt", v, spec.act_min)]
        if spec.act_max < 127:
            a += [f"cmp {v}, #{spec.act_max}", "it gt", _imm_mov("gt", v, spec.act_max)]
        return a

    if planar_six(spec):
        return _asm_function(fn, _planar_rows6(spec, g, step, requant))

    looped = n4 > PLANAR_STRAIGHT_STEPS  # (else the steps run straight and r5 counts the channels)
    a = ["push {r4-r11, lr}", "ldr r4, [sp, #36]", "sub sp, sp, #4", f"movs r5, #{g}", "str r5, [sp]" if looped else "", "1:"]
    if looped:
        a += [f"movs r5, #{n4}", "2:", *step(4), *_add_const("r3", 4 * c, "r12"), "subs r5, r5, #1", "bne 2b"]
    else:
        for _ in range(n4):
            a += [*step(4), *_add_const("r3", 4 * c, "r12")]
    if tail:
        a += step(tail)
    a += ["add r0, r0, #4", "add r1, r1, #4", "add r2, r2, #4",  # (the next plane: 2 rw = 8 s steps + 4 bytes)
          *_add_const("r3", 1 - 4 * c * n4, "r12"), f"add r4, r4, #{4 * PLANAR_WORDS}",
          *(["ldr r5, [sp]", "subs r5, r5, #1", "str r5, [sp]"] if looped else ["subs r5, r5, #1"]),
          "bne 1b", "add sp, sp, #4", "pop {r4-r11, pc}"]
    return _asm_function(fn, [ln for ln in a if ln])


def _planar_rows6(spec: LayerSpec, g: int, step4, requant) -> list[str]:
    """The lines of a stride-1 planar row function with six outputs per step (:func:`planar_six`):
    accumulators r3, r8-r11, r5 (the bias in r5 until its last use), the output pointer at [sp], the
    channel count at [sp, #4], the step count at [sp, #8]; a row's last 1..4 outputs by the four-output
    step (``step4``, the output pointer in r3), five by a six-output step storing five."""
    c, wo = spec.c_in, spec.wo
    n6, tail = divmod(wo, 6)
    rw = planar_row_elements(spec)
    acc = ["r3", "r8", "r9", "r10", "r11", "r5"]

    def step6(stores: int) -> list[str]:
        a = ["ldr r5, [r4, #24]"]
        for r, p in enumerate(("r0", "r1", "r2")):
            def b(k: int) -> str:
                return "r5" if r == 0 else acc[k]
            a += [f"ldr r6, [r4, #{8 * r}]", f"ldr r7, [r4, #{8 * r + 4}]", f"ldr r12, [{p}], #12", f"ldr lr, [{p}, #-8]",
                  f"smlad r3, r12, r6, {b(0)}", "smlabt r3, lr, r7, r3",
                  f"smlatb r8, r12, r6, {b(1)}", "smlad r8, lr, r7, r8",
                  f"smlad r9, lr, r6, {b(2)}", f"smlatb r10, lr, r6, {b(3)}", f"ldr r12, [{p}, #-4]",
                  "smlabt r9, r12, r7, r9", "smlad r10, r12, r7, r10",
                  f"smlad r11, r12, r6, {b(4)}", "smlatb r5, r12, r6, r5", f"ldr lr, [{p}]",
                  "smlabt r11, lr, r7, r11", "smlad r5, lr, r7, r5"]
        a += ["ldr r6, [r4, #28]", "ldr r12, [r4, #32]", "ldr r7, [r4, #36]"]
        for k in range(stores):
            a += requant(acc[k])
        return a + ["ldr lr, [sp]"] + [f"strb {acc[k]}, [lr, #{k * c}]" for k in range(stores)]

    full = step6(6) + _add_const("lr", 6 * c, "r12") + ["str lr, [sp]"]
    a = ["push {r4-r11, lr}", "sub sp, sp, #12", "ldr r4, [sp, #48]", "str r3, [sp]", f"movs r5, #{g}",
         "str r5, [sp, #4]", "1:"]
    if n6 > PLANAR_STRAIGHT_STEPS:
        a += [f"movs r5, #{n6}", "str r5, [sp, #8]", "2:", *full, "ldr r5, [sp, #8]", "subs r5, r5, #1",
              "str r5, [sp, #8]", "bne 2b"]
    else:
        a += full * n6
    adv = 12 * n6
    if tail == 5:
        a += step6(5)
        adv += 12
    elif tail:
        a += ["ldr r3, [sp]", *step4(tail)]
        adv += 8
    for p in ("r0", "r1", "r2"):  # (the next plane)
        a += _add_const(p, 2 * rw - adv, "r12")
    a += ["ldr lr, [sp]", *_add_const("lr", 1 - 6 * c * n6, "r12"), "str lr, [sp]", f"add r4, r4, #{4 * PLANAR_WORDS}",
          "ldr r5, [sp, #4]", "subs r5, r5, #1", "str r5, [sp, #4]", "bne 1b", "add sp, sp, #12", "pop {r4-r11, pc}"]
    return a


def _asm_function(fn: str, lines: list[str]) -> str:
    """A global Thumb function written as a top-level ``__asm__`` statement."""
    body = "\n".join(f'    "{ln}\\n"' for ln in lines)
    return (f'__asm__(".pushsection .text.{fn}, \\"ax\\", %progbits\\n"\n'
            '    ".balign 4\\n"\n    ".thumb_func\\n"\n'
            f'    ".global {fn}\\n"\n    ".type {fn}, %function\\n"\n    "{fn}:\\n"\n'
            f"{body}\n"
            f'    ".size {fn}, .-{fn}\\n"\n    ".popsection\\n");\n')


GATHER_UNROLL = 4  # pixel pairs per loop step of a planar gather (rows of at most this many run straight)


def planar_gather_asm(spec: LayerSpec, g: int, rw: int, cols: int) -> list[str]:
    """Assembly lines of ``gather(x, d)``: one input row (``x``: column 0 of the group's first channel) of
    ``g`` channels widened into the group's planes at ``d`` (``rw`` int16 elements each), two pixels per
    step (two LDR / LDRH, PKHBT / PKHTB, SXTB16: each channel's pair of pixels one word); a padding column
    beside an odd first or last column is a virtual pixel of zero-point bytes (r2)."""
    c, pw = spec.c_in, spec.padding[1]
    lead = pw & 1
    total = lead + cols
    pairs = -(-total // 2)
    trail = total % 2
    mid = pairs - lead - trail
    four = g >= 4
    zp = -spec.input_offset & 0xFF
    ld = "ldr" if four else "ldrh"

    def pair() -> list[str]:  # v0 r5, v1 r4 -> the planes at r1 (post-incremented by 4)
        a = ["pkhbt r6, r5, r4, lsl #16"]
        if four:
            a.append("pkhtb r7, r4, r5, asr #16")
        a += ["sxtb16 r4, r6", "sxtb16 r6, r6, ror #8"]
        if four:
            a += ["sxtb16 r5, r7", "sxtb16 r7, r7, ror #8", f"str r5, [r1, #{4 * rw}]", f"str r7, [r1, #{6 * rw}]"]
        return a + [f"str r6, [r1, #{2 * rw}]", "str r4, [r1], #4"]

    a = ["push {r4-r7, lr}", f"mov r2, #{zp * 0x01010101}", *_add_const("r1", 2 * (pw - lead), "r12")]
    for j in range(max(1, g // 4)):
        x_adv = 0
        if lead:
            a += ["mov r5, r2", f"{ld} r4, [r0]", *pair()]
            a += _add_const("r0", c, "r12")
            x_adv += c
        step = [f"{ld} r4, [r0, #{c}]"]
        step += [f"{ld} r5, [r0], #{2 * c}"] if 2 * c <= 255 else [f"{ld} r5, [r0]", *_add_const("r0", 2 * c, "r12")]
        step += pair()
        loops, straight = divmod(mid, GATHER_UNROLL) if mid > GATHER_UNROLL else (0, mid)
        a += step * straight
        if loops:
            a += [f"movs r3, #{loops}", "1:", *(step * GATHER_UNROLL), "subs r3, r3, #1", "bne 1b"]
        x_adv += 2 * c * mid
        if trail:
            a += [f"{ld} r5, [r0]", "mov r4, r2", *pair()]
        if j + 1 < g // 4:  # the next four channels: column 0, their first plane
            a += _add_const("r0", 4 - x_adv, "r12") + _add_const("r1", 4 * 2 * rw - 4 * pairs, "r12")
    return a + ["pop {r4-r7, pc}"]


def _dw_planar(spec: LayerSpec, g: int, fname: str, array, x_expr: str, y_expr: str) -> GeneratedLayer:
    """A 3x3 stride-1 or stride-2 depthwise layer on DSP cores, channel-planar (corten_gen.h, cg_dwp_*): per group of
    ``g`` channels each input row gathered once, widened, into a ring of three row slots on the stack,
    then per output row the row function (assembly where :func:`planar_asm_ok`) over the group's channels."""
    c, h, w = spec.c_in, spec.h, spec.w
    ph, pw = spec.padding
    st = spec.stride[0]
    bound = planar_bound(spec)
    short = short_epilogue_ok(bound, spec.multiplier, spec.shift)
    f = doubles(short, True)
    q, ep = scalar_epilogue(spec.multiplier, spec.shift, short, spec.output_offset, spec.act_min, spec.act_max,
                            f == 2, True)
    mode = int(ep.split(",")[0])
    tbl = array("gen_wdwp", planar_table(spec, f, q))
    arrays = {"gen_wdwp": tbl}
    rw = planar_row_elements(spec)
    cols = min(w, (spec.wo - 1) * st + 3 - pw)  # (input columns some output reads)
    zp = -spec.input_offset
    slot = g * rw
    row_fn = f"{fname}_row"
    proto = (f"void {row_fn}(const int16_t *r0, const int16_t *r1, const int16_t *r2, int8_t *y, "
             "const int32_t *t)")
    c_row = (f"{proto}\n{{\n    int32_t k;\n    for (k = 0; k < {g}; k++) {{\n"
             f"        cg_dwp_row{'' if st == 1 else '_s2'}(r0 + k * {rw}, r1 + k * {rw}, r2 + k * {rw}, t + {PLANAR_WORDS} * k, "
             f"t + {PLANAR_WORDS} * k + 7, y + k, {c}, {spec.wo}, {ep});\n    }}\n}}\n")
    asm = planar_asm_ok(spec, mode)
    if asm:
        row_text = (f"{proto};\n#ifdef CG_HAVE_DSP\n/* {g} channels x {spec.wo} outputs, 4 per step */\n"
                    f"{planar_row_function(row_fn, spec, g, mode)}#else\n{c_row}#endif\n\n")
    else:
        row_text = f"{proto};\n{c_row}\n"

    gather_fn = f"{fname}_gather"
    gproto = f"void {gather_fn}(const int8_t *x, int16_t *d)"
    c_gather = (f"{gproto}\n{{\n"
                + "".join(f"    cg_dwp_gather(x + {4 * j}, {c}, d + {4 * j * rw}, {rw}, {pw}, {cols}, {min(g, 4)});\n"
                          for j in range(max(1, g // 4))) + "}\n")
    if (pw % 2 + cols) // 2 - 1 >= GATHER_UNROLL:  # (narrower rows: the inlined C gathers, no call, ran faster)
        row_text += (f"{gproto};\n#ifdef CG_HAVE_DSP\n{_asm_function(gather_fn, planar_gather_asm(spec, g, rw, cols))}"
                     f"#else\n{c_gather}#endif\n\n")
    else:
        row_text += f"CG_INLINE {c_gather}\n"

    def row(iy: str, dst: str, ind: str, known: int | None = None) -> list[str]:
        gather = [f"{gather_fn}(x + ({iy}) * {w * c} + g, {dst});"]
        pad = [f"cg_dwp_pad_row({dst}, {rw}, {pw}, {cols}, {g}, {zp});"]
        if known is not None:
            return [ind + t for t in (gather if 0 <= known < h else pad)]
        return ([ind + f"if ({iy} >= 0 && {iy} < {h}) {{"] + [ind + "    " + t for t in gather] + [ind + "} else {"]
                + [ind + "    " + t for t in pad] + [ind + "}"])

    if st == 1:  # (the next output row: one new input row, the ring turned by one)
        prime = [*row(str(-ph), "s0", " " * 12, -ph), *row(str(1 - ph), "s1", " " * 12, 1 - ph)]
        fresh = row(f"oy + {2 - ph}", "s2", " " * 16)
        turn = ["t = s0;", "s0 = s1;", "s1 = s2;", "s2 = t;"]
    else:  # (two new input rows; the last one becomes the next row's first)
        prime = row(str(-ph), "s0", " " * 12, -ph)
        fresh = row(f"2 * oy + {1 - ph}", "s1", " " * 16) + row(f"2 * oy + {2 - ph}", "s2", " " * 16)
        turn = ["t = s0;", "s0 = s2;", "s2 = t;"]

    lines = [
        f"void {fname}(const int8_t *in, int8_t *out)",
        "{",
        f"    int16_t buf[{3 * slot}] __attribute__((aligned(4)));",
        "    int32_t b, g, oy;",
        f"    cg_dwp_fill(buf, {3 * slot // 2}, {_c(corten_pair(zp))});",
        f"    for (b = 0; b < {spec.n}; b++) {{",
        f"        const int8_t *x = in + b * {h * w * c};",
        f"        int8_t *y = out + b * {spec.ho * spec.wo * c};",
        f"        for (g = 0; g < {c}; g += {g}) {{",
        f"            int16_t *s0 = buf, *s1 = buf + {slot}, *s2 = buf + {2 * slot};",
        *prime,
        f"            for (oy = 0; oy < {spec.ho}; oy++) {{",
        "                int16_t *t;",
        *fresh,
        f"                {row_fn}(s0, s1, s2, y + oy * {spec.wo * c} + g, {tbl} + g * {PLANAR_WORDS});",
        *("                " + t for t in turn),
        "            }",
        "        }",
        "    }",
        "}",
    ]
    what = (f"generated dsp 3x3 stride-{st} depthwise, channel-planar: rows of {g} channels gathered widened once "
            f"({3 * slot * 2} stack bytes), 4 outputs per step from register weights, "
            f"{'assembly rows, ' if asm else ''}{'short' if short else 'general'} epilogue")
    return GeneratedLayer(row_text + "\n".join(lines) + "\n", f"{fname}({x_expr}, {y_expr});", what, short,
                          arrays)


def corten_pair(v: int) -> int:
    """Two int16 ``v`` as one int32 word (a fill value)."""
    u = (v & 0xFFFF) * 0x10001
    return u - 2**32 if u >= 2**31 else u


def _depthwise(spec, isa, fname, array, segs, biases, short, x_expr, y_expr) -> GeneratedLayer:
    g = planar_group(spec, isa)
    if g:
        return _dw_planar(spec, g, fname, array, x_expr, y_expr)
    c, kw = spec.c_out, spec.kw
    sh, sw = spec.stride
    ph, pw = spec.padding
    if isa == "mve" and not short:
        isa = "dsp"  # the Helium epilogue is the short one only
    arrays = {}
    c0 = c - c % 4 if isa == "dsp" else 0
    if isa != "dsp" or c0 < c:  # (the DSP path reads the int8 weights only for the last C % 4 channels)
        arrays["gen_weight"] = w8 = array("gen_weight", spec.weight.to(torch.int8).reshape(-1).contiguous())
    all16 = isa == "mve" and all(dw16_ok(spec, s) for s in segs)  # (then no segment reads the plain bias table)
    f = doubles(short, isa == "dsp" and c0 == c)  # (every product then reads the widened weights)
    b_name = "NULL" if all16 else array("gen_bias", (f * biases.to(torch.int32)).contiguous())
    if isa == "mve":  # (the Helium epilogues read the planar table; no scalar epilogue runs)
        table, ep = epilogue_table(spec.multiplier, spec.shift, short, planar=True), ""
    else:
        table, ep = scalar_epilogue(spec.multiplier, spec.shift, short, spec.output_offset, spec.act_min,
                                    spec.act_max, f == 2, isa == "dsp")
    q_name = array("gen_q", table)
    arrays.update(gen_q=q_name, **({} if all16 else {"gen_bias": b_name}))
    head = (f"    const int32_t rows = i1 - i0, cols = j1 - j0;\n"
            "    int32_t oy, ox;\n"
            "    for (oy = oy0; oy < oy1; oy++) {\n"
            "        for (ox = ox0; ox < ox1; ox++) {\n"
            f"            const int8_t *xp = in + ((oy * {sh} - {ph} + i0) * {spec.w} + (ox * {sw} - {pw} + j0)) * {c};\n"
            f"            int8_t *yp = out + (oy * {spec.wo} + ox) * {c};\n")
    tail = "        }\n    }\n"
    scalar_tail = ""
    if isa != "mve" and c0 < c:
        scalar_tail = (f"            for (ch = {c0}; ch < {c}; ch++) {{\n"
                       "                int32_t acc = bias[ch], r, j;\n"
                       "                for (r = 0; r < rows; r++) {\n"
                       "                    for (j = 0; j < cols; j++) {\n"
                       f"                        acc += xp[(r * {spec.w} + j) * {c} + ch] * "
                       f"{w8}[((i0 + r) * {kw} + j0 + j) * {c} + ch];\n"
                       "                    }\n"
                       "                }\n"
                       f"                yp[ch] = cg_output(acc, {q_name} + 4 * ch, {ep});\n"
                       "            }\n")
    if isa == "mve":
        inner = (f"            cg_dw_pixel_mve(xp, {spec.w * c}, {w8} + (i0 * {kw} + j0) * {c}, {kw * c}, rows, cols, "
                 f"{c}, bias, {q_name}, {spec.output_offset}, {spec.act_min}, {spec.act_max}, yp);\n")
    elif isa == "dsp":
        inner = "            int32_t ch;\n"
        if c0:
            w16 = array("gen_weight16", f * widened_depthwise_weights(spec.weight.to(torch.int8)))
            arrays["gen_weight16"] = w16
            inner += (f"            for (ch = 0; ch < {c0}; ch += 4) {{\n"
                      "                int32_t acc[4], r, j;\n"
                      "                acc[0] = bias[ch]; acc[1] = bias[ch + 1]; acc[2] = bias[ch + 2]; "
                      "acc[3] = bias[ch + 3];\n"
                      "                for (r = 0; r < rows; r++) {\n"
                      "                    for (j = 0; j < cols; j++) {\n"
                      f"                        cg_dw4_dsp(xp + (r * {spec.w} + j) * {c} + ch, "
                      f"{w16} + ((ch / 4) * {spec.kh * kw} + (i0 + r) * {kw} + j0 + j) * 4, acc);\n"
                      "                    }\n"
                      "                }\n"
                      f"                yp[ch] = cg_output(acc[0], {q_name} + 4 * ch, {ep});\n"
                      f"                yp[ch + 1] = cg_output(acc[1], {q_name} + 4 * ch + 4, {ep});\n"
                      f"                yp[ch + 2] = cg_output(acc[2], {q_name} + 4 * ch + 8, {ep});\n"
                      f"                yp[ch + 3] = cg_output(acc[3], {q_name} + 4 * ch + 12, {ep});\n"
                      "            }\n")
        inner += scalar_tail
    else:
        inner = "            int32_t ch;\n" + scalar_tail
    body = head + inner + tail
    inline = None
    if isa == "dsp" and c0 and spec.kh * kw * 8 <= 1024:
        def inline(seg):
            if _specialised(spec, seg, segs) and _dw_offsets_ok(spec, seg):
                return _dw_dsp_segment(spec, seg, w16, q_name, b_name, ep, scalar_tail)
            return None
    if isa == "mve" and c % 4 == 0:
        dw16: dict[tuple[int, int, int, int], str] = {}  # tap box -> its assembly row function

        def inline(seg):  # (every segment its own loop nest; each table written once a segment reads it)
            box = (seg.i0, seg.i1, seg.j0, seg.j1)
            if dw16_ok(spec, seg):
                if "gen_weight_dw16" not in arrays:
                    wt, qt, bt = dw16_tables(spec, biases)
                    arrays.update(gen_weight_dw16=array("gen_weight_dw16", wt), gen_q_dw16=array("gen_q_dw16", qt),
                                  gen_bias_dw16=array("gen_bias_dw16", bt))
                if box not in dw16:
                    dw16[box] = dw16_function(f"{fname}_dw16_{len(dw16)}", spec, seg)
                return _dw16_segment(spec, seg, dw16[box], arrays)
            if "gen_weight_mve" not in arrays:
                arrays["gen_weight_mve"] = array("gen_weight_mve", grouped_depthwise_weights(spec.weight.to(torch.int8)))
            return _dw_mve_segment(spec, seg, arrays["gen_weight_mve"], q_name, b_name)
    need_general = any(not _specialised(spec, s, segs) for s in segs) and not (isa == "mve" and c % 4 == 0)
    driver = _driver(spec, fname, segs, b_name, c, inline if inline else None)
    rows16 = "".join(text for _, text in (dw16.values() if isa == "mve" and c % 4 == 0 else ()))
    fns = rows16 + _seg_functions(fname, body, need_general) + "\n" + driver
    what = (f"generated {isa} {spec.kh}x{spec.kw} depthwise: no im2col, {len(biases)} bias class(es), "
            f"{'short' if short else 'general'} epilogue")
    return GeneratedLayer(fns, f"{fname}({x_expr}, {y_expr});", what, short, arrays)


def grouped_depthwise_weights(weight: torch.Tensor, lanes: int = 4) -> torch.Tensor:
    """int8 ``[C//lanes, kH*kW, lanes]`` (C % lanes == 0): per group of ``lanes`` channels its taps in
    order, so a group's window is one short block (``VLDRB.S32`` immediate offsets; 16: ``VLDRW``)."""
    kh, kw, c = weight.shape
    return weight.reshape(kh * kw, c // lanes, lanes).permute(1, 0, 2).contiguous()


DW16_LANES = (0, 4, 8, 12, 2, 6, 10, 14, 1, 5, 9, 13, 3, 7, 11, 15)  # channel of each accumulator lane (CG_DW16)
DW16_MAX_TAPS = 9  # one pointer register per tap (r0..r8)
VLDRW_MAX = 508  # largest VLDRW immediate offset
MOVW_MAX = 65535  # largest MOVW immediate


def dw16_ok(spec: LayerSpec, s: Segment) -> bool:
    """Whether a Helium depthwise segment runs as 16-channel assembly rows (``dw16_function``): C % 16
    == 0, 1..9 taps, the kernel's weights within VLDRW's offsets, the input steps within MOVW's."""
    taps = (s.i1 - s.i0) * (s.j1 - s.j0)
    span = ((s.i1 - s.i0 - 1) * spec.w + s.j1 - s.j0 - 1) * spec.c_in
    return (spec.c_in % 16 == 0 and 0 < taps <= DW16_MAX_TAPS and spec.kh * spec.kw * 16 <= VLDRW_MAX + 16
            and max(span, spec.stride[1] * spec.c_in) <= MOVW_MAX)


def dw16_tables(spec: LayerSpec, biases: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The tables of the 16-channel rows: int8 weights ``[C/16, kH*kW, 16]`` (channel order), int32
    epilogue ``[C/16, rows, 16]`` (rows multiplier, -right and, when a channel shifts left, left) and
    folded biases ``[classes, C]``, both in the accumulators' lane order (DW16_LANES per 16)."""
    c = spec.c_in
    order = torch.tensor([16 * g + k for g in range(c // 16) for k in DW16_LANES], dtype=torch.long)
    s = spec.shift.to(torch.int64)
    rows = [spec.multiplier.to(torch.int64), -(-s).clamp(min=0)]
    if bool((s > 0).any()):
        rows.append(s.clamp(min=0))
    q = torch.stack([r[order].reshape(c // 16, 16) for r in rows], dim=1).to(torch.int32).contiguous()
    return (grouped_depthwise_weights(spec.weight.to(torch.int8), 16), q,
            biases[:, order].to(torch.int32).contiguous())


def _vec_imm(kind: str, reg: str, value: int) -> str:
    """VMOV/VMVN of an integer in [-256, 255] into every lane of ``reg`` (``kind``: i8 or i16)."""
    return f"vmov.{kind} {reg}, #{value & 0xFF}" if value >= 0 or kind == "i8" else f"vmvn.{kind} {reg}, #{~value}"


def dw16_function(fn: str, spec: LayerSpec, s: Segment) -> tuple[str, str]:
    """``(name, C)`` of the assembly row function of segment ``s``'s tap box: ``fn(x, y, n, w, q, bias)``
    computes ``n`` output pixels (inputs from ``x``, the window's first tap, stepping stride * C;
    outputs from ``y``) over all channels, 16 per step (see corten_gen.h, cg_dw16_c: the C of hosts)."""
    c, kw = spec.c_in, spec.kw
    taps = [(r, j) for r in range(s.i1 - s.i0) for j in range(s.j1 - s.j0)]
    tap_x = [(r * spec.w + j) * c for r, j in taps]
    tap_w = [(s.i0 + r) * kw + s.j0 + j for r, j in taps]
    ktaps, groups = spec.kh * kw, c // 16
    q_rows = 3 if bool((spec.shift > 0).any()) else 2
    flags = mve_epilogue_flags(spec.shift)
    x_step = spec.stride[1] * c
    a = ["push {r4-r11, lr}", "sub sp, sp, #16", "str r0, [sp]", "str r2, [sp, #4]", "str r3, [sp, #8]",
         "mov r11, r1", "2:", "ldr r0, [sp]"]
    for t, off in enumerate(tap_x[1:], start=1):
        a += ([f"add r{t}, r0, #{off}"] if off <= THUMB_IMM12 else [f"movw r{t}, #{off}", f"add r{t}, r0, r{t}"])
    a += ["ldr r9, [sp, #8]", "ldr r10, [sp, #52]", "ldr r12, [sp, #56]", f"mov lr, #{groups}", "dls lr, lr", "1:"]
    for t, idx in enumerate(tap_w):
        a += [f"vldrb.8 q4, [r{t}], #16", f"vldrw.32 q5, [r9, #{idx * 16}]", "vmullb.s8 q6, q4, q5",
              "vmullt.s8 q7, q4, q5"]
        if t == 0:
            a += ["vmovlb.s16 q0, q6", "vmovlt.s16 q1, q6", "vmovlb.s16 q2, q7", "vmovlt.s16 q3, q7"]
        else:
            a += ["vmovlb.s16 q4, q6", "vadd.i32 q0, q0, q4", "vmovlt.s16 q6, q6", "vadd.i32 q1, q1, q6",
                  "vmovlb.s16 q4, q7", "vadd.i32 q2, q2, q4", "vmovlt.s16 q7, q7", "vadd.i32 q3, q3, q7"]
    a.append(f"add r9, r9, #{ktaps * 16}")
    for i in range(4):
        a += [f"vldrw.32 q4, [r12, #{16 * i}]", f"vadd.i32 q{i}, q{i}, q4"]
        if q_rows == 3:
            a += [f"vldrw.32 q4, [r10, #{128 + 16 * i}]", f"vshl.s32 q{i}, q{i}, q4"]
        a += [f"vldrw.32 q4, [r10, #{16 * i}]", f"vqrdmulh.s32 q{i}, q{i}, q4", f"vldrw.32 q5, [r10, #{64 + 16 * i}]"]
        a += ([f"vshr.s32 q4, q{i}, #31"] if flags & 2 else [f"vand q4, q{i}, q5", "vshr.s32 q4, q4, #31"])
        a += [f"vadd.i32 q{i}, q{i}, q4", f"vrshl.s32 q{i}, q{i}, q5"]
    a += ["add r12, r12, #64", f"add r10, r10, #{64 * q_rows}",
          "vqmovnb.s32 q4, q0", "vqmovnt.s32 q4, q1", "vqmovnb.s32 q5, q2", "vqmovnt.s32 q5, q3"]
    if spec.output_offset:
        a += [_vec_imm("i16", "q6", spec.output_offset), "vqadd.s16 q4, q4, q6", "vqadd.s16 q5, q5, q6"]
    a += ["vqmovnb.s16 q6, q4", "vqmovnt.s16 q6, q5"]
    if spec.act_min > -128:
        a += [_vec_imm("i8", "q7", spec.act_min), "vmax.s8 q6, q6, q7"]
    if spec.act_max < 127:
        a += [_vec_imm("i8", "q7", spec.act_max), "vmin.s8 q6, q6, q7"]
    a += ["vstrb.8 q6, [r11], #16", "le lr, 1b", "ldr r0, [sp]"]
    a += ([f"add r0, r0, #{x_step}"] if x_step <= THUMB_IMM12 else [f"movw r1, #{x_step}", "add r0, r0, r1"])
    a += ["str r0, [sp]", "ldr r1, [sp, #4]", "subs r1, r1, #1", "str r1, [sp, #4]", "bne 2b",
          "add sp, sp, #16", "pop {r4-r11, pc}"]
    body = "\n".join(f'    "{ln}\\n"' for ln in a)
    proto = (f"void {fn}(const int8_t *x, int8_t *y, int32_t n, const int8_t *w, const int32_t *q, "
             "const int32_t *bias)")
    text = (f"{proto};\n#ifdef CG_HAVE_MVE\n"
            f"/* {len(taps)} taps x 16 channels per step, {groups} steps per pixel (the C: cg_dw16_c) */\n"
            f'__asm__(".pushsection .text.{fn}, \\"ax\\", %progbits\\n"\n'
            '    ".balign 4\\n"\n    ".thumb_func\\n"\n'
            f'    ".global {fn}\\n"\n    ".type {fn}, %function\\n"\n    "{fn}:\\n"\n'
            f"{body}\n"
            f'    ".size {fn}, .-{fn}\\n"\n    ".popsection\\n");\n'
            "#else\n"
            f"{proto}\n{{\n"
            f"    static const int32_t tap_x[{len(taps)}] = {{{', '.join(map(str, tap_x))}}};\n"
            f"    static const int32_t tap_w[{len(taps)}] = {{{', '.join(map(str, tap_w))}}};\n"
            f"    cg_dw16_c(x, y, n, w, q, bias, {c}, {x_step}, tap_x, tap_w, {len(taps)}, {ktaps}, {q_rows}, "
            f"{spec.output_offset}, {spec.act_min}, {spec.act_max});\n}}\n#endif\n\n")
    return fn, text


def _dw16_segment(spec: LayerSpec, s: Segment, row_fn: tuple[str, str], arrays: dict[str, str]) -> str:
    """One segment of a Helium depthwise layer through its 16-channel assembly rows: one call per output row."""
    c = spec.c_in
    sh, sw = spec.stride
    ph, pw = spec.padding
    body = [
        f"/* rows {s.oy0}..{s.oy1 - 1}, columns {s.ox0}..{s.ox1 - 1}: taps {s.i0}..{s.i1 - 1} x {s.j0}..{s.j1 - 1} */",
        "{",
        "    int32_t oy;",
        f"    for (oy = {s.oy0}; oy < {s.oy1}; oy++) {{",
        f"        {row_fn[0]}(x + ((oy * {sh} - {ph - s.i0}) * {spec.w} + ({s.ox0 * sw} - {pw - s.j0})) * {c}, "
        f"y + (oy * {spec.wo} + {s.ox0}) * {c}, {s.ox1 - s.ox0}, {arrays['gen_weight_dw16']}, {arrays['gen_q_dw16']}, "
        f"{arrays['gen_bias_dw16']} + {s.cls * c});",
        "    }",
        "}",
    ]
    return "\n".join("        " + ln for ln in body)


DW_MVE_PIXELS = 2  # output pixels per Helium depthwise step (each tap's weights loaded once for them)


def _dw_mve_segment(spec: LayerSpec, s: Segment, wm: str, q_name: str, b_name: str) -> str:
    """One segment of a Helium depthwise layer (C % 4 == 0) as its own loop nest: per four channels,
    per tap one widening weight load shared by two output pixels, one widening input load, VMUL and
    VADD per pixel (literal offsets), then the 4-lane short epilogue and narrowing stores."""
    c, kw, ntaps = spec.c_in, spec.kw, spec.kh * spec.kw
    sh, sw = spec.stride
    ph, pw = spec.padding
    ep = f"{c}, {mve_epilogue_flags(spec.shift)}, {spec.output_offset}, {spec.act_min}, {spec.act_max}"
    taps = [(r, j) for r in range(s.i1 - s.i0) for j in range(s.j1 - s.j0)]

    def step(npx: int) -> list[str]:
        lines = [f"for (ch = 0; ch < {c}; ch += 4, wg += {ntaps * 4}) {{",
                 "    const cg_v4 b = cg_v4_ld32(bias + ch);"]
        lines += [f"    cg_v4 acc{p} = b;" for p in range(npx)]
        for r, j in taps:
            lines.append(f"    {{ const cg_v4 wv = cg_v4_ld8(wg + {((s.i0 + r) * kw + s.j0 + j) * 4});")
            for p in range(npx):
                lines.append(f"      acc{p} = cg_v4_mla(acc{p}, cg_v4_ld8(xp + ch + {(r * spec.w + j + p * sw) * c}), wv);")
            lines.append("    }")
        lines += [f"    acc{p} = cg_v4_out(acc{p}, {q_name} + ch, {ep});" for p in range(npx)]
        lines += [f"    cg_v4_st8(yp + ch + {p * c}, acc{p});" for p in range(npx)]
        lines.append("}")
        return lines

    n = DW_MVE_PIXELS
    body = [
        f"/* rows {s.oy0}..{s.oy1 - 1}, columns {s.ox0}..{s.ox1 - 1}: taps {s.i0}..{s.i1 - 1} x {s.j0}..{s.j1 - 1} */",
        "{",
        f"    const int32_t *bias = {b_name} + {s.cls * c};",
        "    int32_t oy, ox;",
        f"    for (oy = {s.oy0}; oy < {s.oy1}; oy++) {{",
        f"        const int8_t *xp = x + ((oy * {sh} - {ph - s.i0}) * {spec.w} + ({s.ox0 * sw} - {pw - s.j0})) * {c};",
        f"        int8_t *yp = y + (oy * {spec.wo} + {s.ox0}) * {c};",
        f"        for (ox = {s.ox0}; ox + {n - 1} < {s.ox1}; ox += {n}, xp += {n * sw * c}, yp += {n * c}) {{",
        f"            const int8_t *wg = {wm};",
        "            int32_t ch;",
        *("            " + ln for ln in step(n)),
        "        }",
        f"        for (; ox < {s.ox1}; ox++, xp += {sw * c}, yp += {c}) {{",
        f"            const int8_t *wg = {wm};",
        "            int32_t ch;",
        *("            " + ln for ln in step(1)),
        "        }",
        "    }",
        "}",
    ]
    return "\n".join("        " + ln for ln in body)


def _dw_offsets_ok(spec: LayerSpec, s: Segment, xs: int = 0) -> bool:
    """The segment's tap offsets (plus ``xs``, a second pixel's) fit CG_DW4_TAP's immediates."""
    return ((s.i1 - s.i0 - 1) * spec.w + (s.j1 - s.j0 - 1)) * spec.c_in + xs < 4096


def _dw_dsp_segment(spec: LayerSpec, s: Segment, w16: str, q_name: str, b_name: str, ep: str,
                    scalar_tail: str) -> str:
    """One segment of a DSP depthwise layer as its own loop nest: every tap one CG_DW4_TAP with
    literal offsets, four channels at a time, the epilogue channel by channel (each channel's values
    before its stores: int8 stores may alias the tables, so nothing is read twice); without
    a scalar tail (C % 4 == 0) two output columns per step (CG_DW4_TAP2: each tap's weights and each
    channel's epilogue constants loaded once for both), the last one of an odd count alone."""
    c, kw, ntaps = spec.c_in, spec.kw, spec.kh * spec.kw
    c0 = c - c % 4
    sh, sw = spec.stride
    ph, pw = spec.padding
    xs = sw * c
    pairs = not scalar_tail and s.ox1 - s.ox0 > 1 and _dw_offsets_ok(spec, s, xs)
    offsets = [((r * spec.w + j) * c, (r * kw + j) * 8) for r in range(s.i1 - s.i0) for j in range(s.j1 - s.j0)]

    def step(npx: int, ind: str) -> list[str]:
        """The channel loop of ``npx`` (1 or 2) output pixels at xp / yp."""
        accs = "a0, a1, a2, a3" + (", b0, b1, b2, b3" if npx == 2 else "")
        if npx == 2 and offsets:  # (one assembly statement for the window on DSP cores)
            taps = ["#ifdef CG_DSP_ASM", "int32_t cg_wa, cg_wb, cg_t1, cg_t2;", "__asm__(",
                    *(f"    CG_DW2_STEP({xo}, {xs}, {wo})" for xo, wo in offsets),
                    f"    CG_DW2_OPERANDS(xr, wg, {accs}));", "#else",
                    *(f"CG_DW4_TAP2(xr, wg, {xo}, {xs}, {wo}, {accs});" for xo, wo in offsets), "#endif"]
        else:
            taps = [f"CG_DW4_TAP(xr, wg, {xo}, {wo}, {accs});" for xo, wo in offsets]
        if not taps:  # a window entirely in the padding: the folded bias alone
            taps.append("(void)xr;")
        lines = [
            f"const int16_t *wg = {w16} + {(s.i0 * kw + s.j0) * 4};",
            f"const int32_t *qp = {q_name};",
            "int32_t ch;",
            f"for (ch = 0; ch < {c0}; ch += 4, wg += {ntaps * 4}, qp += 16) {{",
            "    const int8_t *xr = xp + ch;",
            "    int32_t a0 = bias[ch], a1 = bias[ch + 1], a2 = bias[ch + 2], a3 = bias[ch + 3];",
            *(["    int32_t b0 = a0, b1 = a1, b2 = a2, b3 = a3;"] if npx == 2 else []),
            *("    " + t for t in taps),
            *(ln for k in range(4) for ln in (
                "    {",
                f"        const int8_t va = cg_output(a{k}, qp + {4 * k}, {ep});",
                *([f"        const int8_t vb = cg_output(b{k}, qp + {4 * k}, {ep});"] if npx == 2 else []),
                f"        yp[ch + {k}] = va;",
                *([f"        yp[{c} + ch + {k}] = vb;"] if npx == 2 else []),
                "    }")),
            "}",
        ]
        return [ind + ln for ln in lines]

    ind = " " * 12
    lines = [
        f"/* rows {s.oy0}..{s.oy1 - 1}, columns {s.ox0}..{s.ox1 - 1}: taps {s.i0}..{s.i1 - 1} x {s.j0}..{s.j1 - 1} */",
        "{",
        f"    const int32_t *bias = {b_name} + {s.cls * c};",
        "    int32_t oy, ox;",
        f"    for (oy = {s.oy0}; oy < {s.oy1}; oy++) {{",
        f"        const int8_t *xp = x + ((oy * {sh} - {ph + (-s.i0)}) * {spec.w} + ({s.ox0 * sw} - {pw - s.j0})) * {c};",
        f"        int8_t *yp = y + (oy * {spec.wo} + {s.ox0}) * {c};",
    ]
    if pairs:
        lines += [f"        for (ox = {s.ox0}; ox + 1 < {s.ox1}; ox += 2, xp += {2 * xs}, yp += {2 * c}) {{",
                  *step(2, ind), "        }",
                  f"        if (ox < {s.ox1}) {{", *step(1, ind), "        }"]
    else:
        lines += [f"        for (ox = {s.ox0}; ox < {s.ox1}; ox++, xp += {xs}, yp += {c}) {{", *step(1, ind)]
        if scalar_tail:  # the last C % 4 channels: the generic loop, with this segment's taps
            lines += ["            {",
                      f"                const int32_t rows = {s.i1 - s.i0}, cols = {s.j1 - s.j0}, i0 = {s.i0}, j0 = {s.j0};",
                      *("    " + ln for ln in scalar_tail.rstrip("\n").split("\n")),
                      "            }"]
        lines.append("        }")
    lines += ["    }", "}"]
    return "\n".join(" " * 8 + ln for ln in lines)


# ----------------------------------------------------------------------------- from graph nodes
def structural_reason(view) -> str | None:
    """Why the generator does not handle the node of ``view`` (a ``NodeView`` or ``EmitContext``:
    arguments and shapes only, no constant values), or None."""
    op = view.op_name
    if op not in GEN_OPS:
        return f"no generated kernel for {op}"
    if op in ADD_OPS:
        from corten.ops._broadcast import same_dense_shape

        if any(view.dtype(name) != torch.int8 for name in ("input1", "input2")):
            return "16x8 (int16) adds keep the s16 kernels"
        return None if same_dense_shape(view) else "broadcast operands keep the library kernel"
    x = view.arg("input")
    if x.meta["val"].dtype != torch.int8:
        return "16x8 (int16) layers keep the s16 kernels"
    if op in POOL_OPS:
        from corten.codegen.generated_elementwise import avg_pool_reason
        from corten.ops._common import pool_window

        return avg_pool_reason(pool_window(view))
    from corten.providers import weight_dtype

    if weight_dtype(view.node) == torch.int4:
        return "no generated kernel for int4 weights (A8W4): the next provider's s4 kernel runs it"
    if op == "quantized_linear":
        try:
            single = bool(view.arg("single_rounding"))
        except Exception:  # (an op schema without the argument)
            single = False
        if single:
            return "a single-rounding (TFLite FULLY_CONNECTED) layer keeps its library kernel"
        val = x.meta["val"]
        if val.dim() == 4 and not val.is_contiguous():
            return "channels-last 4-D input"
        return None
    if tuple(int(d) for d in view.arg("dilation")) != (1, 1):
        return "dilated convolutions keep the library kernel"
    if op == "quantized_depthwise_conv2d" and int(view.arg("depth_multiplier")) != 1:
        return "depth multiplier > 1 keeps the library kernel"
    return None


def layer_class(view) -> str:
    """The shape class of a node the generator supports (a ``NodeView``): ``"matvec"`` (one output
    row per batch: a linear layer over one row, a 1x1 conv of a 1x1 image), ``"pointwise"`` (1x1,
    stride 1, no padding), ``"conv"`` (other dense convolutions, the first layer), ``"depthwise"``;
    the per-layer preference table :data:`YIELDS_TO` is keyed by it."""
    op = view.op_name
    if op in ADD_OPS:
        return "add"
    if op in POOL_OPS:
        return "pool"
    if op == "quantized_depthwise_conv2d":
        return "depthwise"
    if op == "quantized_linear":
        val = view.arg("input").meta["val"]
        return "matvec" if int(val.numel()) == int(val.shape[-1]) else "pointwise"
    n, h, w, _ = view.nhwc(view.arg("input"))
    _, ho, wo, _ = view.nhwc()
    weight = view.arg("weight").meta["val"]
    kh, kw = int(weight.shape[1]), int(weight.shape[2])
    if ho * wo == 1 and h * w == 1 and kh == kw == 1:
        return "matvec"
    from corten.ops._common import pads4

    pointwise = (kh == kw == 1 and tuple(int(s) for s in view.arg("stride")) == (1, 1)
                 and not any(int(p) for p in pads4(view.arg("padding"))))
    return "pointwise" if pointwise else "conv"


# The per-layer preference rule (Provider.yields_to): on an ISA path, the layer classes for which a
# later provider of the chain has the faster kernel, so the generator lets it run them when it is
# in the chain and supports the node - measured per layer with `corten profile` on QEMU
# (benchmarks/bench_kernels.py gives the totals).  A class not listed is generated.
YIELDS_TO: dict[tuple[str, str], tuple[str, ...]] = {}


def spec_of(ctx) -> tuple[LayerSpec | None, str | None]:
    """The :class:`LayerSpec` of a node being emitted (an ``EmitContext``), or ``(None, reason)``
    when the generator does not handle it."""
    op = ctx.op_name
    reason = structural_reason(ctx)
    if reason is not None:
        return None, reason
    x = ctx.arg("input")
    mult = ctx.tensor("output_multiplier").to(torch.int64)
    shift = ctx.tensor("output_shift").to(torch.int64)
    act = (int(ctx.arg("activation_min")), int(ctx.arg("activation_max")))
    out_off = int(ctx.arg("output_offset"))
    if op == "quantized_linear":
        weight = ctx.tensor("weight")
        co, ci = int(weight.shape[0]), int(weight.shape[1])
        val = x.meta["val"]
        batches = int(val.numel()) // ci
        return _spec("conv", 1, 1, batches, ci, 1, batches, co, 1, 1, (1, 1), (0, 0),
                     weight.reshape(co, 1, 1, ci), ctx.tensor("kernel_sum"), 0, out_off, mult, shift, *act), None
    n, h, w, ci = ctx.nhwc(x)
    _, ho, wo, co = ctx.nhwc()
    from corten.ops._common import pads4

    ph, pw = (int(p) for p in pads4(ctx.arg("padding"))[:2])
    stride = tuple(int(s) for s in ctx.arg("stride"))
    weight = ctx.tensor("weight")
    bias_node = ctx.arg("bias")
    bias = ctx.tensor("bias") if bias_node is not None else torch.zeros(co, dtype=torch.int64)
    in_off = int(ctx.arg("input_offset"))
    if op == "quantized_depthwise_conv2d":
        _, kh, kw, _ = (int(d) for d in weight.shape)
        return _spec("depthwise", n, h, w, ci, ho, wo, co, kh, kw, stride, (ph, pw), weight[0], bias, in_off,
                     out_off, mult, shift, *act), None
    _, kh, kw, _ = (int(d) for d in weight.shape)
    return _spec("conv", n, h, w, ci, ho, wo, co, kh, kw, stride, (ph, pw), weight, bias, in_off, out_off,
                 mult, shift, *act), None


def _spec(kind, n, h, w, ci, ho, wo, co, kh, kw, stride, padding, weight, bias, in_off, out_off, mult, shift,
          act_min, act_max) -> LayerSpec:
    if mult.numel() == 1 and co > 1:
        mult, shift = mult.expand(co).clone(), shift.expand(co).clone()
    if kind == "conv" and kh == kw == 1 and stride == (1, 1) and padding == (0, 0) and (h, w) == (ho, wo):
        h, w, ho, wo = 1, h * w, 1, ho * wo  # pointwise: all pixels are one row
    return LayerSpec(kind, n, h, w, ci, ho, wo, co, kh, kw, stride, padding, weight, bias.to(torch.int64),
                     in_off, out_off, mult, shift, act_min, act_max)


# ----------------------------------------------------------------------------- the provider
@dataclass(frozen=True)
class GeneratedStep(KernelStep):
    """A generated layer's step: the call, plus the C function written for it (``<name>_generated.c``)."""

    functions: str = ""
    prototype: str = ""


class GeneratedProvider(Provider):
    """``kernels="generated"``: Corten's per-layer kernels (see the module docstring), first in the
    chain; ``("generated", "cmsis-nn")`` keeps CMSIS-NN for the layers the generator does not take
    or does not win on (:meth:`yields_to`, :data:`YIELDS_TO`), the portable kernels end every chain."""

    name = "generated"
    title = "Corten's generated kernels"
    own_constant_layouts = True  # pre-widened DSP weights, Helium chunks, border crops' copies

    def supports(self, node, target) -> str | None:
        from corten.providers import NodeView

        return structural_reason(NodeView(node, target))

    def scratch_bytes(self, node, target) -> int:
        return 0

    def yields_to(self, node, target, later) -> str | None:
        from corten.providers import NodeView

        isa, cls = isa_path(target), layer_class(NodeView(node, target))
        for name in YIELDS_TO.get((isa, cls), ()):
            for p in later:
                if p.name == name and p.supports(node, target) is None:
                    return (f"yields to {p.title}: its kernel is faster for {cls} layers on the {isa} path "
                            "(generated.YIELDS_TO, measured)")
        return None

    def emit(self, ctx) -> KernelStep:
        import dataclasses

        from corten.providers import PORTABLE

        if ctx.op_name in ADD_OPS + POOL_OPS:
            return self._emit_elementwise(ctx)
        spec, reason = spec_of(ctx)
        reason = reason or why_not(spec)
        if reason is not None:  # (a value-dependent refusal: the accumulator bound) - the portable kernel
            step = PORTABLE.emit(ctx)
            return dataclasses.replace(step, uses_portable=True, note=f"generated kernel declined: {reason}")
        fname = f"{ctx.emitter.name}_gen_{ctx.emitter.node_prefix(ctx.node)}"
        layer = generate(spec, isa_path(ctx.target), fname, ctx.derived_const, ctx.input("input"), ctx.out())
        code = ctx.invoke(fname, ctx.input("input"), ctx.out()) + ";"
        return GeneratedStep(self.name, tuple(ctx.calls), f"/* {layer.what} */\n{code}", note=layer.what,
                             functions=f"/* {ctx.node.name}: {layer.what} */\n{layer.functions}",
                             prototype=f"void {fname}(const int8_t *in, int8_t *out);")

    def _emit_elementwise(self, ctx) -> KernelStep:
        """An add / sub (two inputs) or an average pool: :mod:`corten.codegen.generated_elementwise`."""
        from corten.codegen import generated_elementwise as ge

        fname = f"{ctx.emitter.name}_gen_{ctx.emitter.node_prefix(ctx.node)}"
        if ctx.op_name in ADD_OPS:
            from corten.ops._broadcast import numel, rescaled_operands

            v, x1, x2, out = rescaled_operands(ctx)
            ta, tb = ge.add_tables(v, -1 if ctx.op_name == "quantized_sub" else 1)
            bound = int(ta.abs().max()) + int(tb.abs().max())
            short = short_epilogue_ok(bound, torch.tensor([v["output_multiplier"]]),
                                      torch.tensor([v["output_shift"]]))
            functions, what = ge.add_function(fname, numel(ctx.shape()), v,
                                              ctx.derived_const("gen_a", ta.to(torch.int32)),
                                              ctx.derived_const("gen_b", tb.to(torch.int32)), bound, short)
            args, proto = (x1, x2, out), f"void {fname}(const int8_t *in1, const int8_t *in2, int8_t *out);"
        else:
            from corten.ops._common import optional_arg, pool_window

            g = pool_window(ctx)
            zp = int(optional_arg(ctx, "zero_point", 0))
            functions, what = ge.avg_pool_function(fname, g, zp, isa_path(ctx.target) != "plain")
            args, proto = (ctx.input("input"), ctx.out()), f"void {fname}(const int8_t *in, int8_t *out);"
        code = ctx.invoke(fname, *args) + ";"
        return GeneratedStep(self.name, tuple(ctx.calls), f"/* {what} */\n{code}", note=what,
                             functions=f"/* {ctx.node.name}: {what} */\n{functions}", prototype=proto)

    def includes(self, name: str) -> tuple[str, ...]:
        return (f'#include "{name}_generated.h"',)

    def sources(self, name: str, steps) -> dict[str, str]:
        funcs = [s.functions for s in steps if isinstance(s, GeneratedStep) and s.functions]
        protos = [s.prototype for s in steps if isinstance(s, GeneratedStep) and s.prototype]
        guard = f"{name.upper()}_GENERATED_H"
        header = (f"/* {name}_generated.h - the kernels Corten generated for {name}'s layers (generated file). */\n"
                  f"#ifndef {guard}\n#define {guard}\n\n#include <stdint.h>\n\n" + "\n".join(protos)
                  + f"\n\n#endif /* {guard} */\n")
        if not funcs:  # (the library includes the lead provider's header even when no step is generated)
            return {f"{name}_generated.h": header}
        body = "\n".join(funcs)
        source = (f"/* {name}_generated.c - one kernel per convolution / depthwise / linear / add / average-pool step\n"
                  f" * of {name}, every shape and constant known (Corten's generated kernels, corten/codegen/generated.py).\n"
                  " * Generated file: do not edit. */\n"
                  f'#include "{name}_generated.h"\n#include "{name}_constants.h"\n'
                  '#include "corten_kernels/corten_gen.h"\n\n' + body)
        return {f"{name}_generated.h": header, f"{name}_generated.c": source}


GENERATED = register_provider(GeneratedProvider())
