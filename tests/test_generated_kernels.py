"""Corten's generated per-layer kernels (``corten.codegen.generated``) byte for byte against the
reference ops, on many random shapes, compiled with the host gcc (the DSP path's primitives are
then C functions with the instructions' semantics; the Helium path is checked on QEMU in
test_generated_qemu.py), and the short epilogue against ``arm_nn_requantize``."""
from __future__ import annotations

import random
import subprocess
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch

import corten  # noqa: F401  (registers the corten ops)
from conftest import needs_gcc
from corten.codegen import generated as gen
from corten.codegen.emitter import KERNELS_DIR
from corten.fixed_point import requantize


def _rand_spec(rng: random.Random, kind: str, big_bias: bool = False) -> gen.LayerSpec:
    n = rng.choice([1, 1, 2])
    if kind == "linear":
        ci, co, batches = rng.randint(1, 70), rng.randint(1, 20), rng.randint(1, 5)
        w = torch.randint(-128, 128, (co, 1, 1, ci), dtype=torch.int8)
        bias = torch.randint(-5000, 5000, (co,), dtype=torch.int64)
        return _finish(rng, "conv", 1, 1, batches, ci, 1, batches, co, 1, 1, (1, 1), (0, 0), w, bias, 0)
    kh, kw = rng.choice([(1, 1), (3, 3), (3, 3), (5, 5), (10, 4), (2, 3), (1, 3)])
    sh, sw = rng.choice([1, 1, 2]), rng.choice([1, 1, 2])
    ph, pw = rng.randint(0, kh // 2 + (1 if rng.random() < 0.2 else 0)), rng.randint(0, kw // 2)
    h, w_ = rng.randint(max(1, kh - 2 * ph), 12), rng.randint(max(1, kw - 2 * pw), 12)
    ho, wo = (h + 2 * ph - kh) // sh + 1, (w_ + 2 * pw - kw) // sw + 1
    if rng.random() < 0.3:  # a band: the trailing padding differs (output size from top padding)
        ho = max(1, ho - rng.randint(0, 1))
    ci = rng.choice([1, 3, 4, 5, 8, 16, 7]) if kind == "conv" else rng.choice([1, 3, 4, 8, 13, 16, 24])
    co = rng.choice([1, 2, 3, 8, 16, 5]) if kind == "conv" else ci
    in_off = rng.randint(-127, 128)
    if kind == "conv":
        w = torch.randint(-128, 128, (co, kh, kw, ci), dtype=torch.int8)
    else:
        w = torch.randint(-128, 128, (kh, kw, co), dtype=torch.int8)
    bias = torch.randint(-(2**20 if big_bias else 5000), 2**20 if big_bias else 5000, (co,), dtype=torch.int64)
    return _finish(rng, kind, n, h, w_, ci, ho, wo, co, kh, kw, (sh, sw), (ph, pw), w, bias, in_off)


def _finish(rng, kind, n, h, w, ci, ho, wo, co, kh, kw, stride, pad, weight, bias, in_off) -> gen.LayerSpec:
    per_channel = rng.random() < 0.7
    m = torch.randint(2**30, 2**31 - 1, (co if per_channel else 1,), dtype=torch.int64)
    s = torch.randint(-14, -3, m.shape, dtype=torch.int64)
    if rng.random() < 0.15:
        s[0] = rng.choice([0, 1, 2])  # left shifts (general epilogue or proven short)
    if not per_channel:
        m, s = m.expand(co).clone(), s.expand(co).clone()
    act_min, act_max = rng.choice([(-128, 127), (-128, 127), (rng.randint(-128, 0), 127), (-20, 60)])
    out_off = rng.randint(-128, 127)
    return gen.LayerSpec(kind, n, h, w, ci, ho, wo, co, kh, kw, stride, pad, weight, bias, in_off, out_off, m, s,
                         act_min, act_max)


def _reference(spec: gen.LayerSpec, x: torch.Tensor) -> torch.Tensor:
    """The Corten reference op on NHWC int8 ``x``; NHWC int8 bytes out."""
    xin = x.permute(0, 3, 1, 2)
    mult, shift = spec.multiplier.to(torch.int32), spec.shift.to(torch.int32)
    bias = spec.bias.to(torch.int32)
    pad = [spec.padding[0], spec.padding[1], max(0, _extra(spec, 0)), max(0, _extra(spec, 1))]
    if spec.kind == "depthwise":
        y = torch.ops.corten.quantized_depthwise_conv2d(
            xin, spec.weight.unsqueeze(0), bias, list(spec.stride), pad, [1, 1], 1, spec.input_offset,
            spec.output_offset, mult, shift, spec.act_min, spec.act_max)
    else:
        y = torch.ops.corten.quantized_conv2d(
            xin, spec.weight, bias, list(spec.stride), pad, [1, 1], spec.input_offset, spec.output_offset, mult,
            shift, spec.act_min, spec.act_max)
    return y.permute(0, 2, 3, 1)[:, :spec.ho, :spec.wo].contiguous()


def _extra(spec, axis) -> int:
    """Trailing padding that makes the reference's output size the spec's (bands: may be negative
    -> crop instead)."""
    size, k, s, p, out = ((spec.h, spec.kh, spec.stride[0], spec.padding[0], spec.ho) if axis == 0 else
                          (spec.w, spec.kw, spec.stride[1], spec.padding[1], spec.wo))
    return (out - 1) * s + k - size - p  # bottom/right padding


def _c_array(ctype: str, name: str, t: torch.Tensor) -> str:
    vals = ", ".join(str(int(v)) for v in t.reshape(-1).tolist()) or "0"
    return f"static const {ctype} {name}[{max(1, t.numel())}] __attribute__((aligned(16))) = {{{vals}}};\n"


CTYPES = {torch.int8: "int8_t", torch.int16: "int16_t", torch.int32: "int32_t"}


def layers_source(specs, isa: str) -> str:
    """C of several layers ``l0``, ``l1``, ... and ``int layers_run(in, out, arena)`` running each on
    its slice of the packed input and output buffers."""
    arrays, fns, calls = [], [], []
    in_off = out_off = 0
    for i, spec in enumerate(specs):
        def array(suffix, t, i=i):
            name = f"l{i}_{suffix}"
            arrays.append(_c_array(CTYPES[t.dtype], name, t))
            return name

        layer = gen.generate(spec, isa, f"l{i}", array, f"in + {in_off}", f"out + {out_off}")
        fns.append(layer.functions)
        calls.append("    " + layer.call)
        in_off += spec.n * spec.h * spec.w * spec.c_in
        out_off += spec.n * spec.ho * spec.wo * spec.c_out
    run = ("int layers_run(const int8_t *in, int8_t *out, uint8_t *arena);\n"
           "int layers_run(const int8_t *in, int8_t *out, uint8_t *arena)\n{\n    (void)arena;\n"
           + "\n".join(calls) + "\n    return 0;\n}\n")
    return f'#include <stdint.h>\n#include "{gen.HEADER}"\n' + "".join(arrays) + "\n".join(fns) + run


def layer_inputs(specs, seed: int = 0, last_at_minimum: bool = False) -> list[torch.Tensor]:
    """Random int8 inputs of the layers (``last_at_minimum``: the last layer's all -128, the accumulator's
    extreme with its extreme weights)."""
    g = torch.Generator().manual_seed(seed)
    xs = [torch.randint(-128, 128, (s.n, s.h, s.w, s.c_in), dtype=torch.int8, generator=g) for s in specs]
    if last_at_minimum:
        xs[-1].fill_(-128)
    return xs


def expected_bytes(specs, xs) -> np.ndarray:
    return np.concatenate([_reference(s, x).numpy().reshape(-1) for s, x in zip(specs, xs)])


HOST_MAIN = r"""
#include <stdint.h>
#include <stdio.h>
int layers_run(const int8_t *in, int8_t *out, uint8_t *arena);
static int8_t in[IN_BYTES], out[OUT_BYTES];
int main(void)
{
    FILE *f = fopen("in.bin", "rb");
    if (!f || fread(in, 1, sizeof in, f) != sizeof in) return 2;
    fclose(f);
    layers_run(in, out, NULL);
    f = fopen("out.bin", "wb");
    fwrite(out, 1, sizeof out, f);
    fclose(f);
    return 0;
}
"""


def run_layers_host(specs, isa: str, xs, tmp: Path) -> np.ndarray:
    (tmp / "layers.c").write_text(layers_source(specs, isa))
    (tmp / "main.c").write_text(HOST_MAIN)
    in_bytes = b"".join(x.numpy().tobytes() for x in xs)
    out_bytes = sum(s.n * s.ho * s.wo * s.c_out for s in specs)
    exe = tmp / "layers"
    res = subprocess.run(["gcc", "-std=c99", "-O2", "-Wall", "-Wextra", "-Werror", "-Wno-unused-function",
                          f"-DIN_BYTES={len(in_bytes)}", f"-DOUT_BYTES={out_bytes}", f"-I{KERNELS_DIR}",
                          str(tmp / "layers.c"), str(tmp / "main.c"), "-o", str(exe)], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-3000:]
    (tmp / "in.bin").write_bytes(in_bytes)
    subprocess.run([str(exe)], cwd=tmp, check=True)
    return np.frombuffer((tmp / "out.bin").read_bytes(), dtype=np.int8)


def random_specs(seed: int, count: int, kinds=("conv", "depthwise", "linear")) -> list[gen.LayerSpec]:
    rng = random.Random(seed)
    return [_rand_spec(rng, kinds[i % len(kinds)], big_bias=i % 7 == 6) for i in range(count)]


@needs_gcc
@pytest.mark.parametrize("isa", ["plain", "dsp", "mve"])
@pytest.mark.parametrize("kind", ["conv", "depthwise", "linear"])
def test_generated_layer_equals_reference(kind, isa, tmp_path):
    # (a stable seed: Python's str hash changes from run to run, and a failure must repeat)
    specs = random_specs(zlib.crc32(f"{kind}/{isa}".encode()) % 1000, 12, (kind,))
    xs = layer_inputs(specs)
    got = run_layers_host(specs, isa, xs, tmp_path)
    assert np.array_equal(got, expected_bytes(specs, xs))


def test_segments_cover_the_output_once():
    rng = random.Random(3)
    for _ in range(50):
        spec = _rand_spec(rng, rng.choice(["conv", "depthwise"]))
        segs, boxes = gen.segments(spec)
        seen = np.zeros((spec.ho, spec.wo), dtype=int)
        for s in segs:
            seen[s.oy0:s.oy1, s.ox0:s.ox1] += 1
            assert boxes[s.cls] == (s.i0, s.i1, s.j0, s.j1)
        assert (seen == 1).all()


def _short(acc: np.ndarray, m: int, s: int) -> np.ndarray:
    """cg_requant_short in numpy int64 (the C's arithmetic, no overflow on the accepted domain)."""
    left, right = max(s, 0), max(-s, 0)
    a = acc << left
    v = (2 * a * m + (1 << 31)) >> 32  # SMMULR(2a, m)
    t = (1 << right) + (v >> 31)
    return (v + (t >> 1)) >> right


def test_short_epilogue_equals_requantize():
    """On every accumulator the generator accepts (|acc| * 2**left < 2**30, m >= 0): the edges of the
    domain, every tie of the rounding shift near them, and random values, for many (m, shift)."""
    rng = np.random.default_rng(0)
    shifts = list(range(-30, 8))
    assert not gen.short_epilogue_ok(1, torch.tensor([2**30]), torch.tensor([-31]))  # (2**31: not an int32)
    mults = [0, 1, 2**30, 2**31 - 1, 1518500250, 1073741824 + 12345] + [int(v) for v in rng.integers(0, 2**31, 20)]
    for s in shifts:
        left = max(s, 0)
        bound = (2**30 - 1) >> left
        for m in mults:
            assert gen.short_epilogue_ok(bound, torch.tensor([m]), torch.tensor([s]))
            assert not gen.short_epilogue_ok(bound + 1, torch.tensor([m]), torch.tensor([s])) or left == 0 and \
                bound + 1 < 2**30
            edges = np.array([0, 1, -1, bound, -bound, bound - 1, -bound + 1], dtype=np.int64)
            rand = rng.integers(-bound, bound + 1, 4000, dtype=np.int64)
            # values whose product lands on a rounding tie of the right shift: v = k * 2**r + 2**(r-1)
            right = max(-s, 0)
            ties = np.array([], dtype=np.int64)
            if right and m:
                k = rng.integers(-2**10, 2**10, 300, dtype=np.int64)
                v = k * (1 << right) + (1 << (right - 1))
                ties = np.clip((v << 31) // m, -bound, bound)
            acc = np.concatenate([edges, rand, ties])
            want = requantize(torch.from_numpy(acc), m, s).numpy()
            assert np.array_equal(_short(acc, m, s), want), (m, s)


def _short_folded(acc: np.ndarray, m: int, s: int, off: int) -> np.ndarray:
    """cg_requant_short with CG_OFFSET_IN_ROUNDING (q[2] = 2**right + off * 2**(right + 1)) in numpy int64,
    asserting that none of the C's int32 values wraps."""
    left, right = max(s, 0), max(-s, 0)
    q2 = (1 << right) + (off << (right + 1))
    assert abs(q2) < 2**31
    a = acc << left
    v = (2 * a * m + (1 << 31)) >> 32
    t = q2 + (v >> 31)
    u = v + (t >> 1)
    assert (np.abs(t) < 2**31).all() and (np.abs(u) < 2**31).all()
    return u >> right


def test_offset_in_rounding_equals_requantize_plus_offset():
    """Where offset_folds accepts (short epilogue, (2|off| + 2) * 2**right <= 2**30), the folded rounding
    constant gives requantize(acc) + off exactly - domain edges, rounding ties, random values - and the
    int32 intermediates cannot wrap even for |v| = 2**30; outside it the fold is refused."""
    rng = np.random.default_rng(1)
    mults = [0, 1, 2**30, 2**31 - 1, 1518500250] + [int(v) for v in rng.integers(0, 2**31, 6)]
    offsets = [0, 1, -1, 127, -128, 255, -255, 1000, -4096]
    tried = 0
    for s in range(-31, 8):
        left, right = max(s, 0), max(-s, 0)
        bound = (2**30 - 1) >> left
        for off in offsets:
            ok = gen.offset_folds(True, torch.tensor([s, min(s, -1)]), off)
            assert ok == ((2 * abs(off) + 2) * 2**max(right, 1) <= 2**30)
            assert not gen.offset_folds(False, torch.tensor([s]), off)
            if not gen.offset_folds(True, torch.tensor([s]), off):
                continue
            # the worst case of the C's values: |v| = 2**30 (SMMULR of |2a| < 2**31)
            q2 = (1 << right) + (off << (right + 1))
            for v in (2**30, -2**30):
                t = q2 + (v >> 31)
                assert abs(t) < 2**31 and abs(v + (t >> 1)) < 2**31
            for m in mults:
                edges = np.array([0, 1, -1, bound, -bound, bound - 1, -bound + 1], dtype=np.int64)
                rand = rng.integers(-bound, bound + 1, 500, dtype=np.int64)
                ties = np.array([], dtype=np.int64)
                if right and m:
                    k = rng.integers(-2**10, 2**10, 100, dtype=np.int64)
                    ties = np.clip(((k * (1 << right) + (1 << (right - 1))) << 31) // m, -bound, bound)
                acc = np.concatenate([edges, rand, ties])
                want = requantize(torch.from_numpy(acc), m, s).numpy().astype(np.int64) + off
                assert np.array_equal(_short_folded(acc, m, s, off), want), (m, s, off)
                tried += 1
    assert tried > 1000
    assert not gen.offset_folds(True, torch.tensor([-23]), 127) and gen.offset_folds(True, torch.tensor([-22]), 127)


def test_sign_from_acc_equals_requantize_plus_offset():
    """CG_SIGN_FROM_ACC (every right shift >= 1): SMMLAR(2a, m, K + (2a >> 31)) >> right with K half the
    rounding constant (the output offset folded in where offset_folds proves it, else added after)
    equals requantize(acc) + off - domain edges, rounding ties, the zero products of negative
    accumulators, random values - with no int32 value wrapping; a shift of 0 refuses it."""
    rng = np.random.default_rng(2)
    mults = [0, 1, 2**30, 2**31 - 1, 1518500250] + [int(v) for v in rng.integers(0, 2**31, 6)]
    tried = 0
    for s in range(-30, 0):
        right, bound = -s, 2**30 - 1
        assert gen.sign_from_acc(True, torch.tensor([s, -1])) and not gen.sign_from_acc(False, torch.tensor([s]))
        for off in (0, 1, -1, 127, -128, 1000):
            fold = gen.offset_folds(True, torch.tensor([s]), off)
            table, ep = gen.scalar_epilogue(torch.tensor([2**30]), torch.tensor([s]), True, off, -128, 127,
                                            smmlar=True)
            k = int(table[0, 2])
            assert int(ep.split(",")[0]) & gen.SIGN_FROM_ACC and k == ((1 << right) + (off << (right + 1)) if fold
                                                                       else 1 << right) // 2
            for m in mults:
                edges = np.array([0, 1, -1, -2, bound, -bound, bound - 1, -bound + 1], dtype=np.int64)
                rand = rng.integers(-bound, bound + 1, 300, dtype=np.int64)
                small = -rng.integers(1, 2**12, 50, dtype=np.int64)  # (products rounding to 0 or -1)
                ties = np.array([], dtype=np.int64)
                if m:
                    j = rng.integers(-2**10, 2**10, 60, dtype=np.int64)
                    ties = np.clip(((j * (1 << right) + (1 << (right - 1))) << 31) // m, -bound, bound)
                acc = np.concatenate([edges, rand, small, ties])
                a2 = 2 * acc
                kk = k + (a2 >> 31)
                v = kk + ((a2 * m + (1 << 31)) >> 32)  # SMMLAR(2a, m, kk)
                assert (np.abs(kk) < 2**31).all() and (np.abs(v) < 2**31).all()
                got = (v >> right) + (0 if fold else off)
                want = requantize(torch.from_numpy(acc), m, s).numpy().astype(np.int64) + off
                assert np.array_equal(got, want), (m, s, off)
                tried += 1
    assert tried > 1000
    assert not gen.sign_from_acc(True, torch.tensor([-3, 0]))
    table, ep = gen.scalar_epilogue(torch.tensor([2**30]), torch.tensor([0]), True, 5, -128, 127, smmlar=True)
    assert not int(ep.split(",")[0]) & gen.SIGN_FROM_ACC


def test_scalar_epilogue_tables_fold_the_offset_where_proven():
    m, s = torch.tensor([2**30, 2**30 + 5]), torch.tensor([-7, -9])
    table, ep = gen.scalar_epilogue(m, s, True, -3, -128, 127)
    assert table[:, 2].tolist() == [2**7 - 3 * 2**8, 2**9 - 3 * 2**10] and ep == "5, -3, -128, 127"
    table, ep = gen.scalar_epilogue(m, s, False, -3, -128, 127)
    assert ep == "0, -3, -128, 127"
    table, ep = gen.scalar_epilogue(m, torch.tensor([-25, -1]), True, 100, -128, 127)
    assert table[:, 2].tolist() == [2**25, 2] and ep == "1, 100, -128, 127"


def test_dsp_layers_store_doubled_weights_where_proven():
    """DSP layers with the short epilogue whose products all read widened weights keep 2w and 2 * bias
    (CG_DOUBLED_ACC): the random layers the byte tests run include such layers, and the tables are
    exactly twice the single ones; a general-epilogue layer keeps them single."""
    seen = 0
    for spec in random_specs(5, 20, ("conv", "depthwise", "linear")):
        got: dict[str, torch.Tensor] = {}
        layer = gen.generate(spec, "dsp", "l", lambda suffix, t: got.setdefault(suffix, t) is t and suffix)
        doubled = "gen_weight" not in got and layer.short_epilogue and (spec.kind == "conv" or spec.c_in % 4 == 0)
        assert gen.doubles(layer.short_epilogue, "gen_weight" not in got) == (2 if doubled else 1)
        if doubled:
            seen += 1
            w16 = next(t for k, t in got.items() if k.startswith("gen_weight16"))
            assert bool((w16 % 2 == 0).all()) and int(w16.abs().max()) <= 256
    assert seen >= 5
    with pytest.raises(Exception):
        gen.scalar_epilogue(torch.tensor([2**30]), torch.tensor([-3]), False, 0, -128, 127, doubled=True)


def test_short_epilogue_refused_outside_its_domain():
    assert not gen.short_epilogue_ok(2**30, torch.tensor([2**30]), torch.tensor([-5]))
    assert not gen.short_epilogue_ok(2**28, torch.tensor([2**30]), torch.tensor([2]))
    assert not gen.short_epilogue_ok(10, torch.tensor([-5]), torch.tensor([-5]))


def test_widened_depthwise_weights_are_in_sxtb16_order():
    w = torch.arange(2 * 3 * 8, dtype=torch.int64).reshape(2, 3, 8).to(torch.int8)
    wide = gen.widened_depthwise_weights(w)
    assert wide.shape == (2, 6, 4) and wide.dtype == torch.int16
    assert wide[0, 0].tolist() == [0, 2, 1, 3] and wide[1, 5].tolist() == [44, 46, 45, 47]


@needs_gcc
@pytest.mark.parametrize("isa", ["plain", "dsp", "mve"])
def test_out_of_line_border_segments(isa, tmp_path, monkeypatch):
    """Layers with more segments than are specialised share one out-of-line border copy."""
    monkeypatch.setattr(gen, "MAX_SPECIALISED_SEGMENTS", 0)
    specs = random_specs(77, 12, ("conv", "depthwise"))
    xs = layer_inputs(specs)
    assert np.array_equal(run_layers_host(specs, isa, xs, tmp_path), expected_bytes(specs, xs))


def _matvec_spec(rng: random.Random, ci: int, co: int, n: int = 1) -> gen.LayerSpec:
    w = torch.randint(-128, 128, (co, 1, 1, ci), dtype=torch.int8)
    bias = torch.randint(-5000, 5000, (co,), dtype=torch.int64)
    return _finish(rng, "conv", n, 1, 1, ci, 1, 1, co, 1, 1, (1, 1), (0, 0), w, bias, rng.randint(-127, 128))


def matvec_specs() -> list[gen.LayerSpec]:
    """Matrix-vector layers (one row per batch, C_in % 4 == 0): every C_out % 4 tail, odd and even
    numbers of four-input groups, batches of 1x1 images, extreme weights (the last one)."""
    rng = random.Random(11)
    specs = [_matvec_spec(rng, ci, co, n) for ci, co, n in
             [(4, 1, 1), (8, 2, 1), (12, 3, 1), (16, 4, 1), (20, 5, 2), (64, 7, 1), (128, 8, 1), (36, 13, 3)]]
    specs.append(_matvec_spec(rng, 16, 6))
    specs[-1].weight.fill_(-128)
    return specs


def pointwise_specs() -> list[gen.LayerSpec]:
    """1x1 unpadded convolutions of the DSP pointwise assembly loop (generated.is_pointwise), strided ones too:
    one and many pairs of filters, C_in from one group of four to 32 groups, pixel counts of every
    remainder modulo the tile of three (the overlapping last tile) and below it (one or two pixels: the
    stack copy), batches, output offsets at the int8 ends, a right shift of one, extreme weights and
    inputs (the last one: the largest accumulators)."""
    rng = random.Random(41)
    out = []
    for n, h, w, ci, co, off, shift, st in [(1, 3, 3, 4, 2, -128, None, 1), (1, 2, 5, 8, 16, 127, None, 1),
                                             (2, 3, 1, 16, 6, 0, -1, 1), (1, 1, 3, 128, 4, -7, None, 1),
                                             (1, 1, 2, 8, 4, 3, None, 1), (1, 2, 1, 4, 2, -100, None, 1),
                                             (1, 1, 5, 20, 34, 90, -1, 1), (1, 5, 4, 16, 8, 2, None, 2),
                                             (2, 4, 5, 8, 4, -3, None, 2), (1, 3, 5, 4, 6, 7, None, (1, 3)),
                                             (1, 3, 2, 8, 2, 1, None, (2, 1)), (1, 3, 1, 8, 4, 0, None, 2),
                                             (1, 2, 4, 8, 24, -9, None, 1), (1, 4, 1, 16, 36, 11, -1, 1),
                                             (1, 4, 4, 12, 8, 5, None, 1)]:
        weight = torch.randint(-128, 128, (co, 1, 1, ci), dtype=torch.int8)
        bias = torch.randint(-5000, 5000, (co,), dtype=torch.int64)
        sh, sw = (st, st) if isinstance(st, int) else st
        ho, wo = (h - 1) // sh + 1, (w - 1) // sw + 1
        spec = _finish(rng, "conv", n, h, w, ci, ho, wo, co, 1, 1, (sh, sw), (0, 0), weight, bias,
                       rng.randint(-127, 128))
        spec.act_min, spec.act_max, spec.output_offset = -128, 127, off
        spec.shift = spec.shift.clamp(max=-1)
        if shift is not None:
            spec.shift[0] = shift
        out.append(spec)
    out[-1].weight.fill_(-128)
    out[-1].input_offset = 128
    return out


@needs_gcc
def test_pointwise_layers_equal_reference(tmp_path):
    specs = pointwise_specs()
    for spec in specs:
        segs, boxes = gen.segments(spec)
        bound = gen.accumulator_bound(spec, gen.folded_biases(spec, boxes))
        assert gen.is_pointwise(spec, "dsp", gen.short_epilogue_ok(bound, spec.multiplier, spec.shift))
        assert not gen.is_pointwise(spec, "plain", True) and not gen.is_pointwise(spec, "mve", True)
    xs = layer_inputs(specs, seed=6, last_at_minimum=True)
    assert np.array_equal(run_layers_host(specs, "dsp", xs, tmp_path), expected_bytes(specs, xs))


@needs_gcc
def test_matvec_layers_equal_reference(tmp_path):
    specs = matvec_specs()
    assert all(gen.is_matvec(s) for s in specs)
    assert "CG_MATVEC4" in layers_source(specs, "dsp")
    xs = layer_inputs(specs, seed=5, last_at_minimum=True)
    got = run_layers_host(specs, "dsp", xs, tmp_path)
    assert np.array_equal(got, expected_bytes(specs, xs))


def test_matvec_weights_interleave_four_filters():
    w = torch.arange(2 * 4 * 8, dtype=torch.int16).reshape(8, 8).to(torch.int8)  # 8 filters of 8 inputs
    flat = gen.matvec_weights(w[:6])  # 6 filters: padded to 8 with zero filters
    assert flat.numel() == 8 * 8
    # group 0, first four inputs: filters 0..3, each (w0, w2, w1, w3)
    assert flat[:16].tolist() == [0, 2, 1, 3, 8, 10, 9, 11, 16, 18, 17, 19, 24, 26, 25, 27]
    # group 1 (filters 4..7), inputs 4..7: filters 6 and 7 are zero
    assert flat[-16:].tolist() == [36, 38, 37, 39, 44, 46, 45, 47] + [0] * 8


def narrow_specs() -> list[gen.LayerSpec]:
    """Dense layers whose kernel rows are narrower than a 16-byte vector (C_in 1..3: first layers),
    with padding, strides and windows of up to 256 bytes: the Helium path copies their windows."""
    rng = random.Random(23)
    out = []
    for ci, (kh, kw), (sh, sw), (ph, pw), co in [(1, (10, 4), (2, 2), (4, 1), 8), (3, (3, 3), (2, 2), (1, 1), 4),
                                                  (2, (5, 5), (1, 1), (2, 2), 12), (1, (3, 3), (1, 2), (0, 1), 16),
                                                  (1, (3, 2), (1, 1), (3, 1), 4)]:  # (windows all in the padding)
        h, w = rng.randint(kh, kh + 6), rng.randint(kw, kw + 5)
        ho, wo = (h + 2 * ph - kh) // sh + 1, (w + 2 * pw - kw) // sw + 1
        weight = torch.randint(-128, 128, (co, kh, kw, ci), dtype=torch.int8)
        bias = torch.randint(-5000, 5000, (co,), dtype=torch.int64)
        spec = _finish(rng, "conv", 1, h, w, ci, ho, wo, co, kh, kw, (sh, sw), (ph, pw), weight, bias,
                       rng.randint(-127, 128))
        spec.multiplier.clamp_(min=0)
        out.append(spec)
    return out


@needs_gcc
def test_narrow_row_windows_equal_reference(tmp_path):
    specs = narrow_specs()
    short = [gen.short_epilogue_ok(gen.accumulator_bound(s, gen.folded_biases(s, gen.segments(s)[1])),
                                   s.multiplier, s.shift) for s in specs]
    assert sum(gen.mve_gathers_windows(s, "mve", ok) for s, ok in zip(specs, short)) >= 2
    xs = layer_inputs(specs, seed=9)
    assert np.array_equal(run_layers_host(specs, "mve", xs, tmp_path), expected_bytes(specs, xs))


def window_specs() -> list[gen.LayerSpec]:
    """Small-window dense layers the DSP path gathers (``gen.dsp_gathers_windows``: first layers of image
    and audio networks), with top/left/all-padding windows, odd widths, batches, row tails of 0..3
    bytes (C_in 1, 2, 3, 5, 6), every tap outside the input (the (3, 2) band) and input rows too wide for
    the row loop's load offsets."""
    rng = random.Random(31)
    out = []
    for ci, (kh, kw), (sh, sw), (ph, pw), co, h, w in [
            (3, (3, 3), (2, 2), (1, 1), 8, 12, 12), (3, (3, 3), (2, 2), (1, 1), 8, 11, 13),
            (1, (10, 4), (2, 2), (4, 1), 8, 15, 10), (3, (3, 3), (1, 1), (1, 1), 16, 7, 9),
            (2, (5, 5), (1, 1), (2, 2), 12, 8, 9), (1, (3, 2), (1, 1), (3, 1), 4, 4, 5),
            (5, (3, 3), (1, 2), (0, 1), 4, 6, 7), (6, (2, 3), (2, 1), (1, 0), 4, 5, 6),
            (1, (10, 4), (2, 2), (4, 1), 4, 11, 460)]:  # (rows too wide for LDR offsets: every pair gathers in C)
        ho, wo = (h + 2 * ph - kh) // sh + 1, (w + 2 * pw - kw) // sw + 1
        weight = torch.randint(-128, 128, (co, kh, kw, ci), dtype=torch.int8)
        bias = torch.randint(-5000, 5000, (co,), dtype=torch.int64)
        spec = _finish(rng, "conv", rng.choice([1, 2]), h, w, ci, ho, wo, co, kh, kw, (sh, sw), (ph, pw), weight,
                       bias, rng.randint(-127, 128))
        spec.multiplier.clamp_(min=0)
        spec.shift.clamp_(max=-1)
        spec.act_min, spec.act_max = -128, 127
        out.append(spec)
    return out


@needs_gcc
def test_gathered_window_layers_equal_reference(tmp_path):
    specs = window_specs()
    for s in specs:
        bound = gen.accumulator_bound(s, gen.folded_biases(s, gen.segments(s)[1]))
        assert gen.dsp_gathers_windows(s, "dsp", gen.short_epilogue_ok(bound, s.multiplier, s.shift))
    for last in (False, True):
        xs = layer_inputs(specs, seed=13, last_at_minimum=last)
        assert np.array_equal(run_layers_host(specs, "dsp", xs, tmp_path), expected_bytes(specs, xs))


def test_window_pairs_cover_each_tap_once():
    for s in window_specs():
        taps = [t for it in gen.window_pairs(s) for t in gen._lanes(it) if t is not None]
        assert sorted(taps) == [(r, j) for r in range(s.kh) for j in range(s.kw * s.c_in)]


def helium_specs() -> list[gen.LayerSpec]:
    """Layers shaped for the Helium paths: depthwise rows of 16 channels (C % 16 == 0; windows of at
    most 9 taps, a 5x5 interior on the 4-lane path beside them; stride 2; a channel without a right
    shift; left shifts; ReLU6-like clamps; output offsets at the int8 ends) and dense tiles of whole
    kernel rows (more than 16 filter groups: a full pass and a shorter one; a last 16-byte chunk
    predicated; kernel rows cut by the padding; an odd pixel count)."""
    g = torch.Generator().manual_seed(31)
    rng = random.Random(31)
    shapes = [  # kind, h, w, C_in, C_out, k, stride, pad, out_offset, (act_min, act_max), shift override
        ("depthwise", 7, 7, 32, 32, 3, 1, 1, -5, (-128, 127), None),
        ("depthwise", 9, 8, 48, 48, 3, 2, 1, 100, (-20, 60), 0),
        ("depthwise", 6, 6, 16, 16, 5, 1, 2, -128, (-128, 127), 1),
        ("depthwise", 1, 5, 16, 16, 3, 1, 1, 127, (-128, 127), None),
        ("depthwise", 5, 6, 64, 64, 3, 1, 1, -128, (-128, -122), None),
        ("conv", 1, 7, 40, 80, 1, 1, 0, 3, (-128, 127), None),
        ("conv", 6, 6, 16, 8, 3, 1, 1, -7, (0, 127), 1),
        ("conv", 7, 9, 8, 12, 3, 2, 1, 20, (-128, 100), 0),
    ]
    out = []
    for kind, h, w, ci, co, k, s, p, out_off, act, shift0 in shapes:
        ho, wo = (h + 2 * p - k) // s + 1, (w + 2 * p - k) // s + 1
        shape = (co, k, k, ci) if kind == "conv" else (k, k, co)
        weight = torch.randint(-128, 128, shape, dtype=torch.int8, generator=g)
        bias = torch.randint(-5000, 5000, (co,), dtype=torch.int64, generator=g)
        m = torch.randint(2**30, 2**31 - 1, (co,), dtype=torch.int64, generator=g)
        sh = torch.randint(-12, -5, (co,), dtype=torch.int64, generator=g)
        if shift0 is not None:
            sh[rng.randrange(co)] = shift0
        out.append(gen.LayerSpec(kind, 1, h, w, ci, ho, wo, co, k, k, (s, s), (p, p), weight, bias,
                                 rng.randint(-127, 128), out_off, m, sh, *act))
    return out


@needs_gcc
def test_helium_shaped_layers_equal_reference(tmp_path):
    specs = helium_specs()
    for s in specs:  # (each takes the short epilogue, which the Helium paths need)
        assert gen.short_epilogue_ok(gen.accumulator_bound(s, gen.folded_biases(s, gen.segments(s)[1])),
                                     s.multiplier, s.shift)
    xs = layer_inputs(specs, seed=3)
    assert np.array_equal(run_layers_host(specs, "mve", xs, tmp_path), expected_bytes(specs, xs))
    text = layers_source(specs, "mve")
    assert "_dw16_" in text and "_tiles_" in text and "cg_v4_mla" in text  # (each Helium path is taken)


def test_dw16_rows_only_within_their_immediates():
    """Depthwise segments go to the 16-channel assembly rows only when their pointer steps and weight
    offsets fit the instructions' immediates (else the 4-lane C path)."""
    spec = helium_specs()[0]
    segs, _ = gen.segments(spec)
    assert all(gen.dw16_ok(spec, s) for s in segs)
    wide = gen.LayerSpec("depthwise", 1, 3, 2100, 32, 3, 2100, 32, 3, 3, (1, 1), (1, 1), spec.weight, spec.bias,
                         0, 0, spec.multiplier, spec.shift, -128, 127)  # (2 rows of 2100 x 32 bytes apart)
    assert not any(gen.dw16_ok(wide, s) for s in gen.segments(wide)[0] if s.i1 - s.i0 == 3)
    big = gen.LayerSpec("depthwise", 1, 9, 9, 16, 9, 9, 16, 7, 7, (1, 1), (3, 3),
                        torch.zeros(7, 7, 16, dtype=torch.int8), torch.zeros(16, dtype=torch.int64), 0, 0,
                        spec.multiplier[:16], spec.shift[:16], -128, 127)  # (49 taps: weights past VLDRW's reach)
    assert not any(gen.dw16_ok(big, s) for s in gen.segments(big)[0])


def planar_specs() -> list[gen.LayerSpec]:
    """3x3 stride-1 and stride-2 depthwise layers for the channel-planar DSP path: groups of 16, 4 and 2
    channels (128 channels: pixels more than 255 bytes apart), leading paddings 0..2, odd and even
    widths (odd first or last gathered columns, output rows ending in a step of 1..3 outputs), bands
    (fewer output rows than the padding gives), several batches, large biases, left shifts and the
    general epilogue, clamps; the last two stay channels-last (rows too wide for the buffer, too narrow)."""
    rng = random.Random(41)
    out = []
    for h, w, c, (ph, pw), n, big, *stride in [
            (6, 7, 8, (1, 1), 1, False), (5, 9, 6, (1, 1), 2, False), (4, 8, 4, (0, 0), 1, False),
            (3, 9, 12, (2, 1), 1, True), (7, 5, 2, (1, 2), 1, False), (1, 5, 4, (1, 1), 1, False),
            (2, 10, 16, (1, 0), 1, True), (3, 6, 128, (1, 1), 1, False),
            (9, 17, 8, (1, 1), 1, False, 2), (8, 18, 4, (0, 0), 2, False, 2), (7, 22, 16, (1, 1), 1, True, 2),
            (11, 14, 2, (2, 2), 1, False, 2), (6, 48, 16, (1, 1), 1, False, 2), (5, 19, 6, (2, 1), 1, False, 2),
            (3, 26, 4, (1, 1), 1, False), (4, 4, 8, (1, 1), 1, False), (3, 10, 4, (1, 1), 1, False),
            (9, 120, 8, (1, 1), 1, False), (5, 3, 4, (1, 1), 1, False)]:
        st = stride[0] if stride else 1
        ho, wo = (h + 2 * ph - 3) // st + 1, (w + 2 * pw - 3) // st + 1
        if rng.random() < 0.3:
            ho = max(1, ho - 1)
        weight = torch.randint(-128, 128, (3, 3, c), dtype=torch.int8)
        weight[0, 0, 0] = -128
        bias = torch.randint(-(2**20 if big else 5000), 2**20 if big else 5000, (c,), dtype=torch.int64)
        out.append(_finish(rng, "depthwise", n, h, w, c, ho, wo, c, 3, 3, (st, st), (ph, pw), weight, bias,
                           rng.randint(-127, 128)))
    out[1].shift[0] = 1  # a left shift: the C rows (no SMMLAR epilogue)
    out[3].bias.mul_(2**9)  # |bias| up to 2**29 with a left shift: the general epilogue
    out[3].shift[0] = 2
    out[6].shift.fill_(-24)  # right shifts too long to fold the output offset into the rounding constant
    out[6].output_offset = 100
    out[9].shift[0] = 1  # (stride 2, C rows)
    out[14].shift.clamp_(max=-1)  # (stride 1, assembly rows with a step loop)
    out[15].shift.clamp_(max=-1)  # (stride 1, four outputs a row: the four-output steps)
    out[16].shift.clamp_(max=-1)  # (stride 1, six outputs and a four-output step)
    return out


@needs_gcc
def test_planar_depthwise_equals_reference(tmp_path):
    specs = planar_specs()
    assert all(gen.planar_group(s, "dsp") for s in specs[:-2]) and not any(gen.planar_group(s, "dsp") for s in specs[-2:])
    assert {gen.planar_group(s, "dsp") for s in specs} >= {2, 4, 16}
    assert not gen.short_epilogue_ok(gen.planar_bound(specs[3]), specs[3].multiplier, specs[3].shift)
    for last in (False, True):
        xs = layer_inputs(specs, seed=11, last_at_minimum=last)
        assert np.array_equal(run_layers_host(specs, "dsp", xs, tmp_path), expected_bytes(specs, xs))
