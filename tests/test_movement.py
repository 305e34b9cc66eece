"""Exact data movement (``corten.quantized_strided_copy``, :mod:`corten.ops.movement`).

* the byte map of every movement op, the copy plan fitted to it and the reference kernel against an
  independent numpy implementation on the logical tensor (batch 1-3, ranks 1-5, NHWC bytes for 4-D);
* copy plans: examples (slice of H is one contiguous run, flip a negative stride, expand a zero
  stride, index_select one indexed level), random tables, opcheck, argument errors;
* the portable C kernel ``corten_strided_copy_s8`` byte for byte on the host (ctypes) and on QEMU
  Cortex-M55 and Cortex-M4 (many cases per run);
* the lowering (dialect tests) and views in the memory plan;
* user-style models (slices, chunks, stacks, flips, pixel shuffles, expands, permutes as outputs,
  ...) compiled with ``corten.compile``, fully lowered, the C library byte-equal to ``prog.run``.
"""
from __future__ import annotations

import ctypes
import random
import shutil
import subprocess

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import corten
from corten.codegen import KERNELS_DIR
from corten.ops import CortenOpError
from corten.ops._movement import MAX_DIMS, CopyPlan, byte_map, fit_copy_plan, to_storage
from corten.testing import Tester

copy = torch.ops.corten.quantized_strided_copy
aten = torch.ops.aten
needs_gcc = pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")
needs_qemu = pytest.mark.skipif(shutil.which("qemu-system-arm") is None or shutil.which("arm-none-eabi-gcc") is None,
                                reason="needs qemu-system-arm and arm-none-eabi-gcc")
PROPERTY_CASES = 1000
C_CASES = 400


# ----------------------------------------------------------------------------- random movement cases
def _shape(rng: random.Random, rank: int) -> list[int]:
    return [rng.randint(1, 3)] + [rng.randint(1, 4) for _ in range(rank - 1)]


def _random_case(rng: random.Random):
    """(name, logical input shape, torch function, numpy function): one random movement op."""
    kind = rng.choice(["slice", "select", "narrow", "flip", "expand", "repeat", "roll", "index_select", "gather",
                       "permute", "reshape", "pixel_shuffle", "pixel_unshuffle", "upsample", "channel_shuffle",
                       "chain"])
    rank = rng.randint(1, 5)
    shape = _shape(rng, rank)
    d = rng.randrange(rank)
    if kind == "slice":
        n = shape[d]
        start, stop = rng.randint(-n, n - 1), rng.choice([None, rng.randint(-n, n)])
        step = rng.randint(1, 3)
        sl = slice(start, stop, step)
        if not len(range(*sl.indices(n))):
            sl = slice(None, None, step)
        key = (slice(None),) * d + (sl,)
        return kind, shape, lambda t: aten.slice.Tensor(t, d, sl.start, sl.stop, sl.step), lambda a: a[key]
    if kind == "select":
        if rank == 1:
            shape, d = shape + [3], 1
        i = rng.randint(-shape[d], shape[d] - 1)
        return kind, shape, lambda t: t.select(d, i), lambda a: np.take(a, i, axis=d)
    if kind == "narrow":
        start = rng.randrange(shape[d])
        length = rng.randint(1, shape[d] - start)
        return kind, shape, lambda t: t.narrow(d, start, length), lambda a: np.take(a, range(start, start + length), d)
    if kind == "flip":
        dims = sorted(rng.sample(range(rank), rng.randint(1, rank)))
        return kind, shape, lambda t: t.flip(dims), lambda a: np.flip(a, dims)
    if kind == "expand":
        shape = [1 if rng.random() < 0.5 else s for s in shape]
        lead = [rng.randint(1, 3) for _ in range(rng.randint(0, 5 - rank))]
        target = lead + [rng.randint(2, 3) if s == 1 and rng.random() < 0.7 else s for s in shape]
        return kind, shape, lambda t: t.expand(target), lambda a: np.broadcast_to(a, target)
    if kind == "repeat":
        reps = [rng.randint(1, 2) for _ in range(rank + rng.randint(0, 5 - rank))]
        return kind, shape, lambda t: t.repeat(reps), lambda a: np.tile(a, reps)
    if kind == "roll":
        dims = sorted(rng.sample(range(rank), rng.randint(1, rank)))
        shifts = [rng.randint(-4, 4) for _ in dims]
        return kind, shape, lambda t: t.roll(shifts, dims), lambda a: np.roll(a, shifts, dims)
    if kind == "index_select":
        idx = [rng.randrange(shape[d]) for _ in range(rng.randint(1, 4))]
        return (kind, shape, lambda t: t.index_select(d, torch.tensor(idx)),
                lambda a: np.take(a, idx, axis=d))
    if kind == "gather":
        out = list(shape)
        out[d] = rng.randint(1, 4)
        idx = np.array([rng.randrange(shape[d]) for _ in range(int(np.prod(out)))]).reshape(out)
        return (kind, shape, lambda t: t.gather(d, torch.from_numpy(idx)),
                lambda a: np.take_along_axis(a, idx, axis=d))
    if kind == "permute":
        perm = list(range(rank))
        rng.shuffle(perm)
        return kind, shape, lambda t: t.permute(perm), lambda a: np.transpose(a, perm)
    if kind == "reshape":
        n = int(np.prod(shape))
        dims = []
        while n > 1 and len(dims) < 4:
            f = rng.choice([k for k in range(1, n + 1) if n % k == 0])
            dims.append(f)
            n //= f
        target = dims + [n]
        return kind, shape, lambda t: t.reshape(target), lambda a: np.reshape(a, target)
    n, h, w = rng.randint(1, 3), rng.randint(1, 3), rng.randint(1, 3)
    r = rng.randint(1, 3)
    if kind == "pixel_shuffle":
        c = rng.randint(1, 3)
        return kind, [n, c * r * r, h, w], lambda t: F.pixel_shuffle(t, r), lambda a: _np_pixel_shuffle(a, r)
    if kind == "pixel_unshuffle":
        c = rng.randint(1, 3)
        return (kind, [n, c, h * r, w * r], lambda t: F.pixel_unshuffle(t, r),
                lambda a: _np_pixel_unshuffle(a, r))
    if kind == "upsample":
        c = rng.randint(1, 3)
        return (kind, [n, c, h, w], lambda t: F.interpolate(t, scale_factor=r, mode="nearest"),
                lambda a: a.repeat(r, axis=2).repeat(r, axis=3))
    if kind == "channel_shuffle":
        g, c = rng.randint(1, 3), rng.randint(1, 3)
        return (kind, [n, g * c, h, w], lambda t: F.channel_shuffle(t, g),
                lambda a: a.reshape(n, g, c, h, w).transpose(0, 2, 1, 3, 4).reshape(n, g * c, h, w))
    # chain: a slice, then a flip, then an expand of a size-1 dimension
    shape = [n, 1, h + 1, w]
    return (kind, shape, lambda t: t[:, :, 1:].flip(3).expand(n, 3, h, w),
            lambda a: np.broadcast_to(np.flip(a[:, :, 1:], 3), (n, 3, h, w)))


def _np_pixel_shuffle(a: np.ndarray, r: int) -> np.ndarray:
    n, crr, h, w = a.shape
    c = crr // (r * r)
    out = np.zeros((n, c, h * r, w * r), dtype=a.dtype)
    for b in range(n):
        for ch in range(c):
            for y in range(h * r):
                for x in range(w * r):
                    out[b, ch, y, x] = a[b, ch * r * r + (y % r) * r + x % r, y // r, x // r]
    return out


def _np_pixel_unshuffle(a: np.ndarray, r: int) -> np.ndarray:
    n, c, hr, wr = a.shape
    out = np.zeros((n, c * r * r, hr // r, wr // r), dtype=a.dtype)
    for b in range(n):
        for ch in range(c * r * r):
            for y in range(hr // r):
                for x in range(wr // r):
                    out[b, ch, y, x] = a[b, ch // (r * r), y * r + (ch % (r * r)) // r, x * r + ch % r]
    return out


def _int8(rng: random.Random, shape) -> torch.Tensor:
    g = torch.Generator().manual_seed(rng.randrange(2**31))
    t = torch.randint(-128, 128, shape, generator=g, dtype=torch.int8)
    return t.contiguous(memory_format=torch.channels_last) if t.dim() == 4 else t


def _plan_args(plan: CopyPlan):
    index = None if plan.index is None else torch.tensor(plan.index, dtype=torch.int32)
    return list(plan.dims), list(plan.strides), plan.offset, index, plan.index_dim


def _lowered_case(rng: random.Random):
    """(name, int8 input, output shape, plan, numpy expectation) of one random case."""
    while True:
        name, shape, fn, np_fn = _random_case(rng)
        out_shape, table = byte_map(fn, shape)
        if out_shape and table.size and len(fit_copy_plan(table).dims) <= MAX_DIMS:
            x = _int8(rng, shape)
            return name, x, out_shape, fit_copy_plan(table), np_fn(x.numpy())


# ----------------------------------------------------------------------------- reference vs numpy
def test_movement_ops_match_numpy_on_the_logical_tensor():
    rng = random.Random(8100)
    seen = set()
    for i in range(PROPERTY_CASES):
        name, x, out_shape, plan, want = _lowered_case(rng)
        got = copy(x, out_shape, *_plan_args(plan))
        assert list(got.shape) == list(want.shape), f"case {i} {name}: {tuple(x.shape)}"
        assert np.array_equal(got.numpy(), want), f"case {i} {name}: {tuple(x.shape)} -> {plan}"
        if got.dim() == 4:
            assert got.is_contiguous(memory_format=torch.channels_last)
        seen.add(name)
    assert len(seen) == 16


@pytest.mark.parametrize("shape, fn, plan", [
    # slice of H of an NHWC tensor (batch 1): one contiguous run of bytes (a view)
    ([1, 4, 6, 5], lambda t: t[:, :, 2:4], CopyPlan((40,), (1,), 40)),
    # ... batch 2: two runs
    ([2, 4, 6, 5], lambda t: t[:, :, 2:4], CopyPlan((2, 40), (120, 1), 40)),
    # every other channel: a stride of 2 bytes
    ([1, 4, 2, 3], lambda t: t[:, ::2], CopyPlan((12,), (2,), 0)),
    # flip of W: negative stride over pixels, channels kept
    ([1, 3, 2, 4], lambda t: t.flip(3), CopyPlan((2, 4, 3), (12, -3, 1), 9)),
    # expand of a size-1 channel: a zero stride
    ([1, 1, 2, 2], lambda t: t.expand(1, 5, 2, 2), CopyPlan((4, 5), (1, 0), 0)),
    # index_select of channels: one indexed level of the 3 chosen channels
    ([1, 4, 2, 2], lambda t: t.index_select(1, torch.tensor([3, 0, 3])), CopyPlan((4, 3), (4, 0), 3, (0, -3, 0), 1)),
    # select of the last dim of a row-major [2, 3, 4]
    ([2, 3, 4], lambda t: t[..., 1], CopyPlan((6,), (4,), 1)),
    # pixel_shuffle r=2 of [1, 8, 2, 3]: (h, i, w, j, c) with channel c*4 + i*2 + j
    ([1, 8, 2, 3], lambda t: F.pixel_shuffle(t, 2), CopyPlan((2, 2, 3, 2, 2), (24, 2, 8, 1, 4), 0)),
])
def test_copy_plan_examples(shape, fn, plan):
    _, table = byte_map(fn, shape)
    assert fit_copy_plan(table) == plan


def test_copy_plan_of_any_table_reproduces_it():
    rng = np.random.default_rng(8101)
    for _ in range(300):
        n = int(rng.integers(1, 40))
        table = rng.integers(0, 50, n)
        plan = fit_copy_plan(table)
        assert np.array_equal(plan.source_bytes(), table)
        assert len(plan.dims) <= 2 or plan.index is None
    assert fit_copy_plan([7]) == CopyPlan((), (), 7)
    assert fit_copy_plan([5, 4, 3, 2]) == CopyPlan((4,), (-1,), 5)


@pytest.mark.parametrize("seed", range(3))
def test_opcheck_strided_copy(seed):
    rng = random.Random(seed)
    _, x, out_shape, plan, _ = _lowered_case(rng)
    torch.library.opcheck(copy.default, (x, out_shape, *_plan_args(plan)))


@pytest.mark.parametrize("args, arg", [
    ((torch.zeros(4, dtype=torch.uint8), [4], [4], [1], 0), "input"),
    ((torch.zeros(4, dtype=torch.int8), [4], [4], [1, 1], 0), "strides"),
    ((torch.zeros(4, dtype=torch.int8), [4], [3], [1], 0), "dims"),
    ((torch.zeros(4, dtype=torch.int8), [4], [4], [1], 1), "strides"),  # reads byte 4 of 4
    ((torch.zeros(4, dtype=torch.int8), [4], [4], [-1], 2), "strides"),  # reads byte -1
    ((torch.zeros(4, dtype=torch.int8), [0], [4], [1], 0), "shape"),
    ((torch.zeros(4, dtype=torch.int8), [2], [2], [1], 0, torch.tensor([0, 1]), 0), "index"),  # int64 table
    ((torch.zeros(4, dtype=torch.int8), [2], [2], [1], 0, torch.tensor([0, 4], dtype=torch.int32), 0), "strides"),
    ((torch.zeros(4, dtype=torch.int8), [2], [2], [1], 0, None, 0), "index_dim"),
])
def test_strided_copy_bad_arguments(args, arg):
    with pytest.raises(CortenOpError, match=rf"quantized_strided_copy.*'{arg}'"):
        copy(*args)


# ----------------------------------------------------------------------------- C kernel, host
class CopyParams(ctypes.Structure):
    _fields_ = [("num_dims", ctypes.c_int32), ("dims", ctypes.POINTER(ctypes.c_int32)),
                ("strides", ctypes.POINTER(ctypes.c_int32)), ("offset", ctypes.c_int32),
                ("index", ctypes.POINTER(ctypes.c_int32)), ("index_dim", ctypes.c_int32),
                ("input_size", ctypes.c_int32)]


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    if shutil.which("gcc") is None:
        pytest.skip("needs gcc")
    out = tmp_path_factory.mktemp("movement") / "libmovement.so"
    subprocess.run(["gcc", "-std=c99", "-O2", "-Wall", "-Wextra", "-Werror", "-Wconversion", "-shared", "-fPIC",
                    "-I", str(KERNELS_DIR), str(KERNELS_DIR / "movement.c"), "-o", str(out)], check=True,
                   capture_output=True)
    return ctypes.CDLL(str(out))


def _i32(values):
    return (ctypes.c_int32 * max(1, len(values)))(*[int(v) for v in values])


def _run_c(lib, dims, strides, offset, index, index_dim, src: bytes, out_bytes: int, output=None):
    keep = [_i32(dims or [1]), _i32(strides or [0])]
    idx = None
    if index is not None:
        keep.append(_i32(index))
        idx = ctypes.cast(keep[-1], ctypes.POINTER(ctypes.c_int32))
    params = CopyParams(max(1, len(dims)), ctypes.cast(keep[0], ctypes.POINTER(ctypes.c_int32)),
                        ctypes.cast(keep[1], ctypes.POINTER(ctypes.c_int32)), int(offset), idx, int(index_dim),
                        len(src))
    inp = (ctypes.c_int8 * max(1, len(src))).from_buffer_copy(src or b"\0")
    out = output if output is not None else (ctypes.c_int8 * max(1, out_bytes))()
    rc = lib.corten_strided_copy_s8(ctypes.byref(params), inp, out)
    return rc, bytes(out)[:out_bytes]


def test_c_strided_copy_matches_reference(lib):
    rng = random.Random(8200)
    for i in range(C_CASES):
        name, x, out_shape, plan, _ = _lowered_case(rng)
        want = copy(x, out_shape, *_plan_args(plan))
        rc, got = _run_c(lib, plan.dims, plan.strides, plan.offset, plan.index, plan.index_dim,
                         to_storage(x).numpy().tobytes(), want.numel())
        assert rc == 0 and got == to_storage(want).numpy().tobytes(), f"case {i} {name}: {tuple(x.shape)} {plan}"


def test_c_strided_copy_any_geometry(lib):
    """Unsimplified geometry: size-1 dims, negative and zero strides, an index table at any level."""
    rng = np.random.default_rng(8201)
    for _ in range(300):
        k = int(rng.integers(1, MAX_DIMS + 1))
        dims = [int(v) for v in rng.integers(1, 4, k)]
        strides = [int(v) for v in rng.integers(-7, 8, k)]
        index_dim, index = -1, None
        if rng.random() < 0.4:
            index_dim = int(rng.integers(0, k))
            index = [int(v) for v in rng.integers(-5, 6, dims[index_dim])]
        src = plan_bytes = CopyPlan(tuple(dims), tuple(strides), 0, None if index is None else tuple(index), index_dim)
        lo, hi = plan_bytes.byte_range()
        offset = -lo
        src = rng.integers(-128, 128, hi - lo + 1 + int(rng.integers(0, 3))).astype(np.int8)
        want = src[CopyPlan(tuple(dims), tuple(strides), offset, plan_bytes.index, index_dim).source_bytes()]
        rc, got = _run_c(lib, dims, strides, offset, index, index_dim, src.tobytes(), want.size)
        assert rc == 0 and got == want.tobytes(), (dims, strides, offset, index, index_dim)


def test_c_strided_copy_rejects_bad_arguments(lib):
    src = bytes(range(8))
    assert _run_c(lib, [8], [1], 0, None, -1, src, 8) == (0, src)
    assert _run_c(lib, [8], [1], 1, None, -1, src, 8)[0] == -1  # reads byte 8
    assert _run_c(lib, [4], [-1], 2, None, -1, src, 4)[0] == -1  # reads byte -1
    assert _run_c(lib, [2], [1], 0, [0, 8], 0, src, 2)[0] == -1  # index past the end
    assert _run_c(lib, [2], [1], 0, [0, 1], 1, src, 2)[0] == -1  # index_dim out of range
    assert _run_c(lib, [0], [1], 0, None, -1, src, 1)[0] == -1
    assert _run_c(lib, [1] * (MAX_DIMS + 1), [0] * (MAX_DIMS + 1), 0, None, -1, src, 1)[0] == -1  # too many dims
    out = (ctypes.c_int8 * 8).from_buffer_copy(src)
    params = CopyParams(1, ctypes.cast(_i32([8]), ctypes.POINTER(ctypes.c_int32)),
                        ctypes.cast(_i32([1]), ctypes.POINTER(ctypes.c_int32)), 0, None, -1, 8)
    assert lib.corten_strided_copy_s8(ctypes.byref(params), out, out) == -1  # in place
    assert lib.corten_strided_copy_s8(None, out, out) == -1


# ----------------------------------------------------------------------------- C kernel, QEMU
def _qemu_cases(seed: int, count: int):
    rng = random.Random(seed)
    cases = []
    for _ in range(count):
        name, x, out_shape, plan, _ = _lowered_case(rng)
        want = copy(x, out_shape, *_plan_args(plan))
        cases.append((plan, to_storage(x).numpy().tobytes(), to_storage(want).numpy().tobytes()))
    return cases


def _qemu_driver(cases) -> str:
    """A harness model whose run function performs every case: inputs and outputs packed."""
    lines = ['#include <stddef.h>', '#include <stdint.h>', '#include "corten_kernels.h"', '#include "cases.h"', ""]
    body = []
    in_off = out_off = 0
    for i, (plan, src, want) in enumerate(cases):
        dims = list(plan.dims) or [1]
        strides = list(plan.strides) or [0]
        lines.append(f"static const int32_t dims_{i}[] = {{{', '.join(map(str, dims))}}};")
        lines.append(f"static const int32_t strides_{i}[] = {{{', '.join(map(str, strides))}}};")
        index = "NULL"
        if plan.index is not None:
            lines.append(f"static const int32_t index_{i}[] = {{{', '.join(map(str, plan.index))}}};")
            index = f"index_{i}"
        body.append(f"    {{\n        const corten_strided_copy_params p = {{.num_dims = {len(dims)}, .dims = dims_{i}, "
                    f".strides = strides_{i}, .offset = {plan.offset}, .index = {index}, .index_dim = {plan.index_dim}, "
                    f".input_size = {len(src)}}};\n"
                    f"        if (corten_strided_copy_s8(&p, input + {in_off}, output + {out_off}) != 0) {{\n"
                    f"            return {i + 1};\n        }}\n    }}")
        in_off += len(src)
        out_off += len(want)
    lines += ["", "int cases_run(const int8_t *input, int8_t *output, uint8_t *arena)", "{", "    (void)arena;",
              *body, "    return 0;", "}", ""]
    return "\n".join(lines)


@needs_qemu
@pytest.mark.parametrize("target", ["cortex-m55", "cortex-m4"])
def test_c_strided_copy_on_qemu(target, tmp_path):
    from corten.runners import harness_defines, run_on_qemu

    cases = _qemu_cases(8300 if target == "cortex-m55" else 8301, 60)
    (tmp_path / "cases.h").write_text("#include <stdint.h>\nint cases_run(const int8_t *input, int8_t *output, "
                                      "uint8_t *arena);\n")
    (tmp_path / "cases.c").write_text(_qemu_driver(cases))
    src = b"".join(c[1] for c in cases)
    want = b"".join(c[2] for c in cases)
    defines = harness_defines("cases.h", "cases_run", len(src), len(want), 16)
    result = run_on_qemu([tmp_path / "cases.c", KERNELS_DIR / "movement.c"], [tmp_path, KERNELS_DIR], defines, src,
                         len(want), target, tmp_path / "run", timeout_s=120, progress=None)
    assert result.status == 0
    assert result.output == want


# ----------------------------------------------------------------------------- lowering and views
class Fn(nn.Module):
    """``f(conv(x))``: a user-style model around one movement expression."""

    def __init__(self, f, c_in: int = 4, c_out: int = 4):
        super().__init__()
        self.conv, self.f = nn.Conv2d(c_in, c_out, 1), f

    def forward(self, x):
        return self.f(self.conv(x))


def test_dialect_slice_flip_index_select():
    torch.manual_seed(0)
    t = Tester(Fn(lambda y: y[:, :, 1::2].flip(-1).index_select(1, torch.tensor([3, 1]))).eval(),
               (torch.randn(1, 4, 6, 5),))
    t.test_dialect({"aten.slice.Tensor": 1, "aten.flip.default": 1, "aten.index_select.default": 1},
                   {"quantize_per_tensor": 1, "quantized_conv2d": 1, "quantized_strided_copy": 1,
                    "dequantize_per_tensor": 1}, qtol=1)


def test_dialect_split_unbind_stack_become_slices_selects_and_cat():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(4, 6, 1)

        def forward(self, x):
            a, b, c = self.conv(x).split([1, 2, 3], dim=1)
            rows = b.unbind(2)
            return torch.stack([rows[0], rows[-1]], dim=1), torch.cat([a, c], 1)

    torch.manual_seed(1)
    t = Tester(Net().eval(), (torch.randn(1, 4, 3, 5),))
    t.test_dialect({"aten.slice.Tensor": 3, "aten.select.int": 2, "aten.cat.default": 2},
                            {"quantize_per_tensor": 1, "quantized_conv2d": 1, "quantized_strided_copy": 5,
                             "quantized_cat": 2, "dequantize_per_tensor": 2}, qtol=1)


def test_slice_of_h_is_a_view_and_a_sliced_output_is_copied():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b, self.c = nn.Conv2d(3, 4, 1), nn.Conv2d(4, 2, 1), nn.Conv2d(4, 2, 1)

        def forward(self, x):
            y = self.a(x)
            top, bottom = y.chunk(2, dim=2)  # rows of NHWC bytes: two views of y
            return self.b(top) + self.c(bottom), y[:, :, 1:2]  # the second output is copied out

    torch.manual_seed(2)
    prog = corten.compile(Net().eval(), (torch.randn(1, 3, 6, 5),), calibration=None)
    assert prog.unlowered_ops() == []
    plan = prog.memory
    copies = [n for n in prog.ep.graph.nodes if n.target == copy.default]
    assert len(copies) == 3
    views = [n.name for n in copies if n.name not in plan.step_nodes]
    assert len(views) == 2
    y = next(n for n in prog.ep.graph.nodes if n.name == copies[0].args[0].name)
    assert {plan.tensors[v].offset - plan.tensors[y.name].offset for v in views} == {0, 60}
    x = torch.randn(1, 3, 6, 5)
    for want, got in zip(prog.run_int8(x), prog.run_c(x, on="host", int8=True)):
        assert torch.equal(want, got)


def test_permute_as_the_program_output():
    """Was an AttributeError in transpose._flattened_shape (the output node is a reader)."""
    torch.manual_seed(3)
    prog = corten.compile(Fn(lambda y: y.permute(0, 2, 3, 1)).eval(), (torch.randn(1, 4, 3, 5),))
    assert prog.op_counts().get("quantized_transpose") == 1 and prog.unlowered_ops() == []


def test_movement_of_a_constant_is_folded_before_quantization():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 4, 1)
            self.register_buffer("order", torch.tensor([3, 2, 1, 0]))

        def forward(self, x):
            return self.conv(x).index_select(1, self.order[torch.tensor([0, 1, 2, 3])].flip(0))

    torch.manual_seed(4)
    prog = corten.compile(Net().eval(), (torch.randn(1, 3, 4, 4),))
    assert prog.unlowered_ops() == []
    x = torch.randn(1, 3, 4, 4)
    assert torch.equal(prog.run_int8(x)[0], prog.run_c(x, on="host", int8=True)[0])


def test_data_dependent_index_is_refused_with_the_reason():
    from corten.compiler import UnsupportedOpsError

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 4, 1)

        def forward(self, x):
            y = self.conv(x)
            return y.gather(1, (y > 0).long())

    with pytest.raises(UnsupportedOpsError, match="aten.gather"):
        corten.compile(Net().eval(), (torch.randn(1, 3, 4, 4),))


# ----------------------------------------------------------------------------- user-style models
def _conv(c_in, c_out):
    return nn.Conv2d(c_in, c_out, 1)


class Seq(nn.Module):
    """``[N, T, C]`` sequences: linear, then ``f``."""

    def __init__(self, f, c: int = 6):
        super().__init__()
        self.fc, self.f = nn.Linear(c, c), f

    def forward(self, x):
        return self.f(self.fc(x))


class Two(nn.Module):
    """Two conv branches combined by ``f(a, b)``."""

    def __init__(self, f):
        super().__init__()
        self.a, self.b, self.f = _conv(4, 4), _conv(4, 4), f

    def forward(self, x):
        return self.f(self.a(x), self.b(x))


class InputFirst(nn.Module):
    """``conv(f(x))``: the movement reads the program input."""

    def __init__(self, f):
        super().__init__()
        self.conv, self.f = _conv(4, 4), f

    def forward(self, x):
        return self.conv(self.f(x))


IMG = (1, 4, 6, 6)
SEQ = (1, 5, 6)
# name -> (model factory, input shape, Corten ops that must appear)
MODELS = {
    "slice_step_w": (lambda: Fn(lambda y: y[:, :, :, 1::2]), IMG, {"quantized_strided_copy"}),
    "slice_step_h": (lambda: Fn(lambda y: y[:, :, 1::2]), IMG, {"quantized_strided_copy"}),
    "slice_negative": (lambda: Fn(lambda y: y[:, :, -3:-1, -4:]), IMG, {"quantized_strided_copy"}),
    "slice_channels": (lambda: Fn(lambda y: y[:, 1:3]), IMG, {"quantized_strided_copy"}),
    "slice_then_conv": (lambda: nn.Sequential(Fn(lambda y: y[:, :, 2:5]), _conv(4, 2)), IMG, {"quantized_conv2d"}),
    "select_channel": (lambda: Fn(lambda y: y[:, 0]), IMG, {"quantized_strided_copy"}),
    "select_last_row": (lambda: Fn(lambda y: y[..., -1]), IMG, {"quantized_strided_copy"}),
    "narrow": (lambda: Fn(lambda y: y.narrow(3, 1, 3)), IMG, {"quantized_strided_copy"}),
    "chunk_add": (lambda: Fn(lambda y: y.chunk(2, dim=1)[0] + y.chunk(2, dim=1)[1]), IMG, {"quantized_add"}),
    "chunk_h_mul": (lambda: Fn(lambda y: (lambda a, b: a * b)(*y.chunk(2, dim=2))), IMG, {"quantized_mul"}),
    "split_sizes": (lambda: Fn(lambda y: torch.split(y, [1, 3], dim=1)[1]), IMG, {"quantized_strided_copy"}),
    "split_max": (lambda: Fn(lambda y: torch.maximum(*y.split(2, 1))), IMG, {"quantized_maximum"}),
    "unbind": (lambda: Fn(lambda y: y.unbind(1)[2]), IMG, {"quantized_strided_copy"}),
    "stack_dim1": (lambda: Two(lambda a, b: torch.stack([a, b], 1)), IMG, {"quantized_cat"}),
    "stack_last": (lambda: Two(lambda a, b: torch.stack([a, b], -1)), (1, 4, 3, 3), {"quantized_cat"}),
    "cat_h": (lambda: Two(lambda a, b: torch.cat([a, b], dim=2)), IMG, {"quantized_cat"}),
    "cat_w": (lambda: Two(lambda a, b: torch.cat((a, b), -1)), IMG, {"quantized_cat"}),
    "expand_channels": (lambda: Fn(lambda y: y[:, :1].expand(-1, 4, -1, -1)), IMG, {"quantized_strided_copy"}),
    "unsqueeze_expand": (lambda: Seq(lambda y: y.unsqueeze(1).expand(1, 3, 5, 6)), SEQ, {"quantized_strided_copy"}),
    "broadcast_to": (lambda: Fn(lambda y: torch.broadcast_to(y.mean((2, 3), keepdim=True), (1, 4, 6, 6))), IMG,
                     {"quantized_strided_copy"}),
    "repeat": (lambda: Fn(lambda y: y.repeat(1, 2, 1, 1)), IMG, {"quantized_strided_copy"}),
    "tile": (lambda: Seq(lambda y: y.tile((1, 2, 1))), SEQ, {"quantized_strided_copy"}),
    "repeat_interleave": (lambda: Seq(lambda y: y.repeat_interleave(2, dim=1)), SEQ, {"quantized_strided_copy"}),
    "flip_w": (lambda: Fn(lambda y: y.flip(-1)), IMG, {"quantized_strided_copy"}),
    "flip_hw_add": (lambda: Fn(lambda y: y + y.flip(2, 3)), IMG, {"quantized_add"}),
    "roll": (lambda: Fn(lambda y: torch.roll(y, shifts=1, dims=2)), IMG, {"quantized_strided_copy"}),
    "unsqueeze_squeeze": (lambda: Seq(lambda y: y.unsqueeze(1).squeeze(1)[:, 1:]), SEQ, {"quantized_strided_copy"}),
    "unsqueeze_inplace": (lambda: Seq(lambda y: (y * 2).unsqueeze_(1)), SEQ, {"quantized_mul"}),
    "squeeze_inplace": (lambda: Seq(lambda y: y[:, :1].mul(2).squeeze_(1)), SEQ, {"quantized_mul"}),
    "view_groups": (lambda: Fn(lambda y: y.view(1, -1, 4)), IMG, set()),
    "flatten_unflatten": (lambda: Fn(lambda y: y.flatten(2).unflatten(2, (3, 12))), IMG, {"quantized_strided_copy"}),
    "reshape_4d_4d": (lambda: Fn(lambda y: y.reshape(1, 2, 12, 6)), IMG, {"quantized_strided_copy"}),
    "permute_output": (lambda: Fn(lambda y: y.permute(0, 2, 3, 1)), IMG, {"quantized_transpose"}),
    "transpose_seq": (lambda: Seq(lambda y: y.transpose(1, 2)), SEQ, {"quantized_transpose"}),
    "t_matrix": (lambda: Seq(lambda y: y[0].t(), c=6), SEQ, {"quantized_transpose"}),
    "movedim": (lambda: Fn(lambda y: y.movedim(1, -1).reshape(1, -1)), IMG, set()),
    "channel_shuffle_view": (lambda: Fn(lambda y: y.view(1, 2, 2, 6, 6).transpose(1, 2).reshape(1, 4, 6, 6)), IMG,
                             {"quantized_strided_copy"}),
    "channel_shuffle": (lambda: Fn(lambda y: F.channel_shuffle(y, 2)), IMG, {"quantized_strided_copy"}),
    "pixel_shuffle": (lambda: Fn(lambda y: F.pixel_shuffle(y, 2), c_out=8), IMG, {"quantized_strided_copy"}),
    "pixel_unshuffle": (lambda: Fn(lambda y: F.pixel_unshuffle(y, 2)), IMG, {"quantized_strided_copy"}),
    "upsample_nearest": (lambda: Fn(lambda y: F.interpolate(y, scale_factor=2)), IMG, {"quantized_strided_copy"}),
    "index_select": (lambda: Fn(lambda y: y.index_select(1, torch.tensor([2, 0, 2]))), IMG,
                     {"quantized_strided_copy"}),
    "fancy_index": (lambda: Fn(lambda y: y[:, [3, 1]]), IMG, {"quantized_strided_copy"}),
    "gather": (lambda: Seq(lambda y: y.gather(2, torch.tensor([[[5, 0]]]).expand(1, 5, 2))), SEQ,
               {"quantized_strided_copy"}),
    "contiguous_clone_detach": (lambda: Fn(lambda y: y.transpose(2, 3).contiguous().clone().detach()), IMG,
                                {"quantized_transpose"}),
    "copy_into_empty": (lambda: Fn(lambda y: torch.empty_like(y).copy_(y[:, :, ::2].flip(1).repeat(1, 1, 2, 1))),
                        IMG, {"quantized_strided_copy"}),
    "input_flip": (lambda: InputFirst(lambda x: x.flip(1)[:, :, 1:]), IMG, {"quantized_strided_copy"}),
}


@pytest.mark.parametrize("name", sorted(MODELS))
def test_model_lowers_and_runs_byte_exact_on_host(name):
    factory, shape, ops = MODELS[name]
    torch.manual_seed(5)
    x = torch.randn(shape)
    prog = corten.compile(factory().eval(), (x,), calibration=[(x,), (torch.randn(shape),)])
    assert prog.unlowered_ops() == [], [str(u) for u in prog.unlowered_ops()]
    assert ops <= set(prog.op_counts()), prog.op_counts()
    inp = torch.randn(shape)
    for w, g in zip(prog.run_int8(inp), prog.run_c(inp, on="host", int8=True)):
        assert torch.equal(w, g), f"{name}: {int((w != g).sum())} of {w.numel()} bytes differ"


@needs_qemu
@pytest.mark.parametrize("name, target", [("pixel_shuffle", "cortex-m55"), ("index_select", "cortex-m4"),
                                          ("flip_hw_add", "cortex-m4")])
def test_model_on_qemu(name, target):
    factory, shape, _ = MODELS[name]
    torch.manual_seed(6)
    t = Tester(factory().eval(), (torch.randn(shape),), target=target)
    t.test_implementation(on=("qemu",), n_inputs=1)
