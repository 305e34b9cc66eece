"""Structured outputs: forward returning dicts, nested tuples/lists, NamedTuples and None leaves.

The program computes the flat list of the output tensors (memory plan, C library, runners); the
output structure (corten.capture.outputs.OutputTree) is recorded at capture, kept by save/load,
and gives ``run`` / ``run_c`` their return structure and the C library its output names."""
from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
import warnings
from pathlib import Path
from typing import NamedTuple

import pytest
import torch
from torch import nn
from conftest import needs_gcc

import corten
from corten.capture.outputs import OutputTree, tensor_leaves
from corten.cli import main as cli_main
from corten.codegen.context import output_field_names
from corten.errors import CaptureError, ProgramFileError
from corten.program import MANIFEST
from corten.runners import run_on_host
from corten.runners.program_runner import c_bytes_to_tensor, tensor_to_c_bytes

G = torch.Generator().manual_seed(7)
X = torch.randn(1, 3, 8, 8, generator=G)
CALIB = [(torch.randn(1, 3, 8, 8, generator=G),) for _ in range(4)]


class Out(NamedTuple):
    logits: torch.Tensor
    feat: torch.Tensor
    score: torch.Tensor


class Trunk(nn.Module):
    """One network, returned in several structures: the flat tuple (logits, feat, score) is the reference."""

    def __init__(self, kind: str):
        super().__init__()
        torch.manual_seed(0)
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.fc = nn.Linear(8, 5)
        self.kind = kind

    def forward(self, x):
        feat = torch.relu(self.conv(x))
        logits = self.fc(feat.mean((2, 3)))
        score = torch.tanh(logits)
        if self.kind == "flat":
            return logits, feat, score
        if self.kind == "dict":
            return {"logits": logits, "aux": (feat, score)}
        if self.kind == "nested":
            return ((logits,), [feat, (score,)])
        if self.kind == "namedtuple":
            return Out(logits, feat, score)
        if self.kind == "none":
            return {"logits": logits, "loss": None, "aux": [feat, score]}
        raise AssertionError(self.kind)


KINDS = ["dict", "nested", "namedtuple", "none"]
NAMES = {"dict": ["logits", "aux_0", "aux_1"], "nested": ["output0", "output1", "output2"],
         "namedtuple": ["logits", "feat", "score"], "none": ["logits", "aux_0", "aux_1"]}
PATHS = {"dict": ['output["logits"]', 'output["aux"][0]', 'output["aux"][1]'],
         "nested": ["output[0][0]", "output[1][0]", "output[1][1][0]"],
         "namedtuple": ["output.logits", "output.feat", "output.score"],
         "none": ['output["logits"]', 'output["aux"][0]', 'output["aux"][1]']}


def build(model, name="model", **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return corten.compile(model.eval(), (X,), calibration=CALIB, name=name, **kw)


@pytest.fixture(scope="module")
def progs():
    return {kind: build(Trunk(kind), name=f"s_{kind}") for kind in ["flat", *KINDS]}


def check_structure(kind: str, out, values: list[torch.Tensor]) -> None:
    """``out`` has ``kind``'s structure (containers, keys, types) and ``values`` at its leaves."""
    logits, feat, score = values
    eq = torch.equal
    if kind == "dict":
        assert type(out) is dict and list(out) == ["logits", "aux"] and type(out["aux"]) is tuple
        assert eq(out["logits"], logits) and eq(out["aux"][0], feat) and eq(out["aux"][1], score)
    elif kind == "nested":
        assert type(out) is tuple and type(out[0]) is tuple and type(out[1]) is list and type(out[1][1]) is tuple
        assert len(out[0]) == 1 and len(out[1]) == 2 and len(out[1][1]) == 1
        assert eq(out[0][0], logits) and eq(out[1][0], feat) and eq(out[1][1][0], score)
    elif kind == "namedtuple":
        assert type(out).__name__ == "Out" and out._fields == ("logits", "feat", "score")
        assert eq(out.logits, logits) and eq(out.feat, feat) and eq(out.score, score)
    else:
        assert type(out) is dict and list(out) == ["logits", "loss", "aux"] and out["loss"] is None
        assert type(out["aux"]) is list and eq(out["logits"], logits)
        assert eq(out["aux"][0], feat) and eq(out["aux"][1], score)


@pytest.mark.parametrize("kind", KINDS)
def test_structured_outputs_run_in_the_module_structure_with_the_flat_programs_values(progs, kind):
    flat, prog = progs["flat"], progs[kind]
    assert prog.unlowered_ops() == []
    assert prog.op_counts() == flat.op_counts()
    assert [s.shape for s in prog.outputs] == [s.shape for s in flat.outputs] == [(1, 5), (1, 8, 8, 8), (1, 5)]
    assert prog.outputs == flat.outputs  # same qparams: the same program, only its outputs' structure differs
    # run: the structure forward returns, with exactly the flat program's values
    check_structure(kind, prog.run(X), list(flat.run(X)))
    # the int8 API stays flat (output order = the structure's leaf order)
    want = flat.run_int8(X)
    got = prog.run_int8(X)
    assert isinstance(got, list) and len(got) == 3 and all(torch.equal(a, b) for a, b in zip(got, want))
    check_structure(kind, prog.structure(got), want)
    assert prog.output_names == NAMES[kind] and prog.output_tree.paths == PATHS[kind]
    # the float model and the program agree leaf by leaf (tensor_leaves drops the None leaf)
    with torch.no_grad():
        ref = tensor_leaves(Trunk(kind).eval()(X))
    assert [r.shape for r in ref] == [q.shape for q in tensor_leaves(prog.run(X))]
    cos = [float(nn.functional.cosine_similarity(r.flatten(), q.flatten(), dim=0))
           for r, q in zip(ref, tensor_leaves(prog.run(X)))]
    assert min(cos) > 0.95, cos


def test_flat_tuple_outputs_keep_their_names_and_types(progs):
    flat = progs["flat"]
    assert flat.output_names == ["output0", "output1", "output2"]
    assert not flat.output_tree.keyed and flat.output_tree.is_flat_tuple
    assert type(flat.run(X)) is tuple and len(flat.run(X)) == 3


@needs_gcc
@pytest.mark.parametrize("kind", KINDS)
def test_host_c_run_is_byte_exact_and_run_c_returns_the_structure(progs, kind):
    prog = progs[kind]
    run = prog.c_run(X, on="host")
    want = prog.run_int8(X)
    assert len(run.outputs) == 3 and all(torch.equal(a, b) for a, b in zip(run.outputs, want))
    assert run.output_names == NAMES[kind]
    check_structure(kind, run.structured, want)
    # run_c: dequantized C outputs, in forward's structure, equal to run's
    check_structure(kind, prog.run_c(X, on="host"), tensor_leaves(prog.run(X)))
    assert all(torch.equal(a, b) for a, b in zip(prog.run_c(X, on="host", int8=True), want))


def test_the_c_header_names_outputs_after_keys(progs, tmp_path):
    lib = progs["dict"].emit_c(tmp_path / "d")
    header = lib.header.read_text()
    for i, name in enumerate(["logits", "aux_0", "aux_1"]):
        assert f"int8_t *{name}; /* S_DICT_OUTPUT{i}_BYTES bytes */" in header
        assert f"/* Output {i} ({name}) */" in header
    assert "*output0;" not in header and "outputs->logits" in lib.source.read_text()
    nt = progs["namedtuple"].emit_c(tmp_path / "n").header.read_text()
    assert "int8_t *logits;" in nt and "int8_t *feat;" in nt and "int8_t *score;" in nt
    nested = progs["nested"].emit_c(tmp_path / "t").header.read_text()
    assert all(f"int8_t *output{i};" in nested for i in range(3))  # no keys: the names of today


DICT_MAIN = r"""
#include <stdint.h>
#include <stdio.h>
#include "s_dict.h"

static int8_t x[S_DICT_INPUT_BYTES];
static int8_t logits[S_DICT_OUTPUT0_BYTES];
static int8_t aux_0[S_DICT_OUTPUT1_BYTES];
static int8_t aux_1[S_DICT_OUTPUT2_BYTES];
static uint8_t arena[S_DICT_ARENA_BYTES] __attribute__((aligned(16)));

int main(void)
{
    const s_dict_inputs in = {.x = x};
    const s_dict_outputs out = {.logits = logits, .aux_0 = aux_0, .aux_1 = aux_1};
    FILE *f = fopen("input.bin", "rb");
    int status;
    if (f == NULL || fread(x, 1, sizeof x, f) != sizeof x) {
        return 2;
    }
    fclose(f);
    status = s_dict_run_io(&in, &out, arena, sizeof arena);
    f = fopen("output.bin", "wb");
    fwrite(logits, 1, sizeof logits, f);
    fwrite(aux_0, 1, sizeof aux_0, f);
    fwrite(aux_1, 1, sizeof aux_1, f);
    fclose(f);
    printf("CORTEN_RESULT status=%d elapsed=0 unit=ns\n", status);
    return 0;
}
"""


@needs_gcc
def test_an_application_uses_the_key_named_output_pointers(progs, tmp_path):
    prog = progs["dict"]
    lib = prog.emit_c(tmp_path / "lib")
    main = tmp_path / "main.c"
    main.write_text(DICT_MAIN)
    data = b"".join(tensor_to_c_bytes(q) for q in prog.quantize_inputs(X))
    res = run_on_host(lib.sources, lib.include_dirs, {}, data, lib.output_bytes, tmp_path / "run", main=main,
                      progress=None)
    want = prog.run_int8(X)
    off = 0
    for t, w in zip(lib.outputs, want):
        assert torch.equal(c_bytes_to_tensor(res.output[off:off + t.nbytes], t.shape), w)
        off += t.nbytes
    assert off == lib.output_bytes


@pytest.mark.parametrize("kind", KINDS)
def test_save_and_load_keep_the_structure(progs, kind, tmp_path):
    prog = progs[kind]
    prog.save(tmp_path / kind)
    man = json.loads((tmp_path / kind / MANIFEST).read_text())
    assert [o["name"] for o in man["outputs"]] == NAMES[kind] and [o["path"] for o in man["outputs"]] == PATHS[kind]
    assert OutputTree.from_json(man["output_tree"]) == prog.output_tree
    loaded = corten.load(tmp_path / kind)
    assert loaded.output_tree == prog.output_tree and loaded.output_names == NAMES[kind]
    check_structure(kind, loaded.run(X), tensor_leaves(prog.run(X)))
    if kind == "namedtuple":  # the class is imported in this process: the same class comes back
        assert type(loaded.run(X)) is Out


def test_a_namedtuple_loaded_in_a_fresh_process_keeps_its_name_and_fields(progs, tmp_path):
    progs["namedtuple"].save(tmp_path / "nt")
    code = ("import torch, corten\n"
            f"p = corten.load({str(tmp_path / 'nt')!r})\n"
            "out = p.run(torch.zeros(1, 3, 8, 8))\n"
            "print(type(out).__name__, out._fields, isinstance(out, tuple), [list(t.shape) for t in out])\n")
    src = str(Path(corten.__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": src + os.pathsep + os.environ.get("PYTHONPATH", "")}
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip().splitlines()[-1] == \
        "Out ('logits', 'feat', 'score') True [[1, 5], [1, 8, 8, 8], [1, 5]]"


def test_a_manifest_without_a_structure_loads_flat_and_a_malformed_one_is_refused(progs, tmp_path):
    d = tmp_path / "p"
    progs["dict"].save(d)
    man_path = d / MANIFEST
    man = json.loads(man_path.read_text())
    old = {k: v for k, v in man.items() if k != "output_tree"}  # a manifest of an older Corten
    man_path.write_text(json.dumps(old))
    out = corten.load(d).run(X)
    assert type(out) is tuple and len(out) == 3  # the program file's own (flat) structure
    for bad, words in [({"kind": "dict", "keys": ["a"], "items": []}, "one str or int key per item"),
                       ({"kind": "tuple", "items": [{"kind": "tensor"}]}, "1 tensor leaves but 'outputs' lists 3"),
                       ({"kind": "set", "items": []}, "unknown node kind 'set'")]:
        man_path.write_text(json.dumps({**man, "output_tree": bad}))
        with pytest.raises(ProgramFileError, match="output_tree") as info:
            corten.load(d)
        assert words in str(info.value)


class Returns(nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn
        self.lin = nn.Linear(4, 3)

    def forward(self, x):
        return self.fn(self.lin(x))


V = torch.randn(2, 4, generator=G)


@pytest.mark.parametrize("fn, words", [
    (lambda y: {"logits": y, "aux": (y.relu(), 3)}, ['returns int as output 2 (output["aux"][1] = 3)',
                                                     "float tensors only", "Python wrapper"]),
    (lambda y: {"logits": y, "scale": 0.5}, ['returns float as output 1 (output["scale"] = 0.5)']),
    (lambda y: {"y": y, "n": (y > 0).sum()}, ['torch.int64 tensor as output 1 (output["n"]', "aten.sum"]),
    (lambda y: {"a": None}, ["returns None as output 0 and no tensor"]),
    (lambda y: {}, ["returns no tensor"]),
    (lambda y: collections.deque([y]), ["returns a collections.deque at output;", "dict or a NamedTuple"]),
    (lambda y: {"a": collections.defaultdict(list, b=y)}, ['collections.defaultdict at output["a"]']),
    (lambda y: {(1, 2): y}, ["the key (1, 2) (tuple) at output", "string keys"]),
], ids=["int-leaf", "float-leaf", "int64-tensor", "only-none", "empty-dict", "deque", "defaultdict", "tuple-key"])
def test_bad_output_leaves_and_containers_are_refused_naming_the_path(fn, words):
    with pytest.raises(CaptureError) as info:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            corten.compile(Returns(fn).eval(), (V,))
    for w in words:
        assert w in str(info.value), str(info.value)
    assert str(info.value).startswith("Returns.forward returns")


def test_other_structures_torch_export_accepts():
    odict = build_small(lambda y: collections.OrderedDict(b=y.relu(), a=y * 2))
    out = odict.run(V)
    assert type(out) is collections.OrderedDict and list(out) == ["b", "a"] and odict.output_names == ["b", "a"]
    intkeys = build_small(lambda y: {1: y.relu(), 0: y * 2})
    out = intkeys.run(V)
    assert type(out) is dict and list(out) == [1, 0] and intkeys.output_names == ["output0", "output1"]
    maxed = build_small(lambda y: y.max(1))  # torch.return_types.max: values and argmax indices
    out = maxed.run(V)
    assert type(out) is torch.return_types.max and out.indices.dtype == torch.int32
    assert maxed.output_names == ["values", "indices"]
    assert all(torch.equal(a, b) for a, b in zip(maxed.run_c(V, int8=True), maxed.run_int8(V)))
    one = build_small(lambda y: (y,))  # a tuple of one tensor: run returns the tensor, as it always did
    assert isinstance(one.run(V), torch.Tensor) and one.output_names == ["output0"]


def build_small(fn):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return corten.compile(Returns(fn).eval(), (V,))


def test_output_field_names_are_unique_c_identifiers():
    keys = [("a-b",), ("a_b",), ("int",), ("3d",), ("aux", 0), ("aux", 1), ("",), ("é",)]
    assert output_field_names(keys, True) == ["a_b", "a_b_2", "output_int", "output3d", "aux_0", "aux_1",
                                              "output6", "_"]
    assert output_field_names([("x",), ("y",)], False) == ["output0", "output1"]


def test_compare_tester_and_auto_precision_read_structured_outputs(progs):
    from corten.compiler import output_agreement, output_sqnr_db
    from corten.testing import Tester

    model = Trunk("dict").eval()
    report = progs["dict"].compare(model, [X])
    assert [r.op for r in report.rows][-1] == "quantized_lut" and len(report.rows) >= 4
    assert output_sqnr_db(progs["dict"], model, CALIB) == output_sqnr_db(progs["flat"], Trunk("flat").eval(), CALIB)
    assert output_agreement(progs["dict"], model, CALIB) == output_agreement(progs["flat"], Trunk("flat").eval(), CALIB)
    t = Tester(Trunk("namedtuple").eval(), (X,))
    rep = t.test_dialect({}, progs["flat"].op_counts())
    assert rep.n_inputs == 4


def test_qat_and_banded_programs_keep_the_structure():
    model = Trunk("dict").eval()
    qat = corten.prepare_qat(model, (X,))
    prog = corten.compile(qat, (X,))
    check_structure("dict", prog.run(X), tensor_leaves(prog.run(X)))
    assert all(torch.equal(a, b) for a, b in zip(prog.run_c(X, int8=True), prog.run_int8(X)))
    assert prog.output_names == NAMES["dict"]
    # a banded schedule (a rewrite of the program graph) keeps the outputs and their structure
    x = torch.randn(1, 3, 16, 16, generator=torch.Generator().manual_seed(2))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        whole = corten.compile(Deep().eval(), (x,))
        banded = corten.compile(Deep().eval(), (x,), max_arena=int(whole.memory.arena_bytes * 0.7))
    assert banded.schedule is not None and banded.memory.arena_bytes < whole.memory.arena_bytes
    out = banded.run(x)
    assert type(out) is dict and list(out) == ["logits", "pooled"] and out["pooled"][1] is None
    assert all(torch.equal(a, b) for a, b in zip(banded.run_int8(x), whole.run_int8(x)))
    assert banded.output_names == ["logits", "pooled_0"]


class Deep(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.c1, self.c2, self.fc = nn.Conv2d(3, 8, 3, padding=1), nn.Conv2d(8, 8, 3, padding=1), nn.Linear(8, 5)

    def forward(self, x):
        pooled = torch.relu(self.c2(torch.relu(self.c1(x)))).mean((2, 3))
        return {"logits": self.fc(pooled), "pooled": (pooled, None)}


def test_cli_run_lists_the_named_outputs(progs, tmp_path, capsys):
    progs["dict"].save(tmp_path / "p")
    assert cli_main(["run", str(tmp_path / "p"), "--on", "host"]) == 0
    out = capsys.readouterr().out
    assert "byte-for-byte equal to the Python reference: YES" in out
    for name, path in zip(NAMES["dict"], PATHS["dict"]):
        line = next(ln for ln in out.splitlines() if ln.split()[:1] == [name])
        assert path in line and line.rstrip().endswith("equal")
