"""argmax / argmin as the program's output (issue 9 item 6): ``quantized_argmax`` (ops/reduce.py) returns int32
indices - the first index of the largest (smallest) int8 value, as torch breaks ties - and the C library writes
them as int32 values into the caller's output buffer (``<NAME>_OUTPUT_INT32``)."""
from __future__ import annotations

import itertools
import subprocess
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import corten
from conftest import needs_qemu
from corten.errors import CaptureError, CortenOpError, UnsupportedOpsError

STRICT = ("-std=c99", "-Wall", "-Wextra", "-Wpedantic", "-Wshadow", "-Wconversion", "-Wsign-conversion", "-Werror")


def naive_argmax(x: torch.Tensor, dim: int, keepdim: bool, mode: int) -> torch.Tensor:
    """Independent loops: the first position along ``dim`` holding the max (mode 0) / min (mode 1)."""
    d = dim % x.dim()
    moved = x.movedim(d, -1)
    flat = moved.reshape(-1, x.shape[d]).tolist()
    out = []
    for row in flat:
        best, at = row[0], 0
        for i, v in enumerate(row):
            if (v > best) if mode == 0 else (v < best):
                best, at = v, i
        out.append(at)
    res = torch.tensor(out, dtype=torch.int32).reshape(moved.shape[:-1])
    return res.unsqueeze(d) if keepdim else res


SHAPES = [(7,), (3, 5), (2, 3, 4), (2, 3, 4, 5), (2, 1, 3, 2, 4)]


@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_reference_matches_naive_with_many_ties(shape):
    g = torch.Generator().manual_seed(len(shape))
    for trial, (mode, keepdim) in enumerate(itertools.product((0, 1), (False, True))):
        # few distinct values: ties everywhere (int8 logits after softmax tie often)
        x = torch.randint(-2, 2, shape, generator=g, dtype=torch.int8)
        if trial == 0:
            x[..., :] = 127  # all equal: index 0
        for dim in range(-len(shape), len(shape)):
            got = torch.ops.corten.quantized_argmax(x, dim, keepdim, mode)
            want = naive_argmax(x, dim, keepdim, mode)
            assert got.dtype == torch.int32
            assert torch.equal(got.contiguous(), want.contiguous()), (shape, dim, keepdim, mode)


def test_reference_refuses_bad_arguments():
    x = torch.zeros(2, 3, dtype=torch.int8)
    with pytest.raises(CortenOpError, match="dim"):
        torch.ops.corten.quantized_argmax(x, 2, False, 0)
    with pytest.raises(CortenOpError, match="mode"):
        torch.ops.corten.quantized_argmax(x, 1, False, 2)
    with pytest.raises(CortenOpError, match="int8"):
        torch.ops.corten.quantized_argmax(x.float(), 1, False, 0)
    with pytest.raises(CortenOpError, match="rank"):
        torch.ops.corten.quantized_argmax(torch.zeros((), dtype=torch.int8), 0, False, 0)


class Net(nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fc = nn.Linear(8, 6)
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.fn = fn

    def forward(self, x):
        return self.fn(self, x)


MODELS = {
    "logits_argmax": (lambda s, x: s.fc(x).argmax(1), (4, 8)),
    "softmax_argmax_keepdim": (lambda s, x: torch.softmax(s.fc(x), -1).argmax(-1, keepdim=True), (2, 8)),
    "argmin": (lambda s, x: torch.argmin(s.fc(x), dim=1), (1, 8)),
    "logits_and_class": (lambda s, x: (s.fc(x), s.fc(x).argmax(-1)), (2, 8)),
    "class_then_probs": (lambda s, x: (s.fc(x).argmax(-1, keepdim=True), torch.softmax(s.fc(x), -1)), (3, 8)),
    "segmentation": (lambda s, x: s.conv(x).argmax(1), (2, 3, 5, 5)),
    "segmentation_keepdim": (lambda s, x: s.conv(x).argmax(1, keepdim=True), (1, 3, 5, 5)),
    "argmax_over_h": (lambda s, x: s.conv(x).argmax(2), (2, 3, 5, 5)),
    "sequence_argmax": (lambda s, x: s.fc(x).argmax(-1), (2, 5, 8)),
    "sequence_argmax_time": (lambda s, x: s.fc(x).argmax(1), (2, 5, 8)),
    # the indices of max/min(dim) returned by the program are argmax/argmin (the values stay max.dim)
    "max_dim_indices": (lambda s, x: s.fc(x).max(dim=1)[1], (2, 8)),
    "torch_max_values_and_indices": (lambda s, x: tuple(torch.max(s.fc(x), -1, keepdim=True)), (3, 8)),
    "min_dim_indices_named": (lambda s, x: s.conv(x).min(1).indices, (1, 3, 5, 5)),
    # no dim: the index into the flattened tensor (0-D), of a vector and of a feature map (NCHW order)
    "argmin_of_a_vector": (lambda s, x: s.fc(x)[0].argmin(0), (2, 8)),
    "map_argmax_of_all": (lambda s, x: s.conv(x).argmax(), (1, 3, 5, 5)),
}
_PROGS: dict = {}


def _compiled(name):
    if name not in _PROGS:
        fn, shape = MODELS[name]
        torch.manual_seed(0)
        model = Net(fn).eval()
        g = torch.Generator().manual_seed(1)
        x = torch.randn(shape, generator=g)
        prog = corten.compile(model, (x,), calibration=[torch.randn(shape, generator=g) for _ in range(3)],
                              name="am")
        _PROGS[name] = (model, prog, x)
    return _PROGS[name]


def _leaves(x):
    return list(torch.utils._pytree.tree_leaves(x))


@pytest.mark.parametrize("name", list(MODELS))
def test_argmax_program_is_lowered_and_byte_exact_on_host(name):
    model, prog, x = _compiled(name)
    assert prog.unlowered_ops() == [] and prog.op_counts()["quantized_argmax"] >= 1
    expected = _leaves(prog.run_int8(x))
    got = _leaves(prog.run_c(x, on="host", int8=True))
    assert len(got) == len(expected)
    for e, c in zip(expected, got):
        assert e.dtype == c.dtype and e.shape == c.shape and torch.equal(e.contiguous(), c.contiguous())
    floats = _leaves(prog.run(x))
    for r, c in zip(floats, _leaves(prog.run_c(x, on="host"))):  # the float API returns the indices too
        assert r.dtype == c.dtype and torch.equal(r, c)
    idx = [t for t in floats if t.dtype == torch.int32]
    with torch.no_grad():
        ref = [t for t in _leaves(model(x)) if t.dtype == torch.int64]
    assert idx and len(idx) == len(ref)
    for i, r in zip(idx, ref):
        assert i.shape == r.shape
        assert float((i.long() == r).float().mean()) >= 0.5  # int8 agrees with float on most positions


def test_indices_are_the_first_argmax_of_the_int8_logits():
    _, prog, x = _compiled("logits_and_class")
    logits, idx = prog.run_int8(x)
    assert torch.equal(idx, naive_argmax(logits, -1, False, 0))


def test_header_declares_int32_outputs_and_builds_strict(tmp_path):
    _, prog, _ = _compiled("logits_and_class")
    lib = prog.emit_c(tmp_path / "c", kernels="portable")
    header = Path(lib.header).read_text()
    assert "#define AM_OUTPUT1_INT32 1" in header and "int32_t *output1;" in header
    assert "am_dequantize_output1" not in header and "am_dequantize_output0" in header
    assert "#define AM_OUTPUT1_OFFSET 12" in header  # 10 int8 logits, then the indices on a multiple of 4
    sources = [str(lib.source)] + sorted(str(p) for p in (Path(lib.out_dir) / "corten_kernels").glob("reduce.c"))
    res = subprocess.run(["gcc", *STRICT, f"-I{lib.out_dir}", "-c", *sources], cwd=tmp_path, capture_output=True,
                         text=True)
    assert res.returncode == 0, res.stderr[-3000:]


def test_saved_program_keeps_int32_outputs(tmp_path):
    _, prog, x = _compiled("class_then_probs")
    prog.save(tmp_path / "p")
    again = corten.load(tmp_path / "p")
    for a, b in zip(_leaves(prog.run(x)), _leaves(again.run(x))):
        assert a.dtype == b.dtype and torch.equal(a, b)


@needs_qemu
@pytest.mark.parametrize("target", ["cortex-m55", "cortex-m4"])  # Helium and DSP builds of the kernels
def test_argmax_on_qemu(target):
    _, prog, x = _compiled("segmentation")
    got = prog.run_c(x, on="qemu", target=target, int8=True)
    assert torch.equal(_leaves(got)[0], _leaves(prog.run_int8(x))[0])


REFUSED = {
    "argmax_without_dim_keepdim": (lambda s, x: s.fc(x).argmax(keepdim=True), UnsupportedOpsError, "flatten first"),
    "argmax_feeding_an_op": (lambda s, x: s.fc(x).argmax(1).float(), UnsupportedOpsError,
                             "can only be a program output"),
    "bool_count_output": (lambda s, x: (s.fc(x) > 0).sum(1), CaptureError, "torch.int64"),
    "pool_indices_arithmetic": (lambda s, x: F.max_pool1d(s.fc(x).unsqueeze(1), 2, return_indices=True)[1] + 1,
                                CaptureError, "torch.int64"),
    "sort_indices_output": (lambda s, x: s.fc(x).sort(1)[1], CaptureError, "torch.int64"),
    "max_indices_arithmetic": (lambda s, x: s.fc(x).max(1)[1] * 2, CaptureError, "torch.int64"),
}


@pytest.mark.parametrize("name", list(REFUSED))
def test_other_integer_outputs_are_refused_clearly(name):
    fn, exc, text = REFUSED[name]
    with pytest.raises(exc) as info:
        corten.compile(Net(fn).eval(), (torch.randn(2, 8),))
    assert text in str(info.value) and "test_argmax.py:" in str(info.value)
