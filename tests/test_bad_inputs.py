"""The bad-input corpus (issue 14): every hostile or mistaken input ends in a Corten error of the
right type whose message names the problem (or in a correct program), and nothing is left behind or
lost on disk.  Models are tiny; programs that several cases share are compiled once per module."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn
from torch.nn import functional as F

import corten
from corten.cli import main as cli_main
from corten.errors import (
    CaptureError, CBuildError, CortenError, ProgramFileError, ProgramNotFoundError, QuantizationError, UsageError,
)
from corten.outdir import OutputDirError
from corten.program import MANIFEST, PROGRAM_FILE
from corten.validation import QuantizationWarning

X = torch.randn(1, 3, 8, 8, generator=torch.Generator().manual_seed(0))
SRC = str(Path(__file__).resolve().parent.parent / "src")


def conv_net(w_scale: float = 1.0, bias: float | None = None) -> nn.Module:
    torch.manual_seed(0)
    m = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU()).eval()
    with torch.no_grad():
        m[0].weight.mul_(w_scale)
        if bias is not None:
            m[0].bias.fill_(bias)
    return m


def compile_quiet(model, inputs, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return corten.compile(model, inputs, **kw)


def raises(exc_type, *words, call):
    """``call()`` raises ``exc_type`` (a CortenError) whose message holds every word of ``words``."""
    with pytest.raises(exc_type) as info:
        call()
    assert isinstance(info.value, CortenError), type(info.value)
    msg = str(info.value)
    for w in words:
        assert w.lower() in msg.lower(), f"{w!r} not in: {msg}"
    return msg


def listing(d: Path) -> dict[str, bytes]:
    """Every file under ``d`` (relative path -> bytes), hidden temporary directories included."""
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def prog():
    return compile_quiet(conv_net(), (X,), name="small")


@pytest.fixture(scope="module")
def saved_dir(prog, tmp_path_factory):
    return prog.save(tmp_path_factory.mktemp("saved") / "small")


# ============================================================================ 1. numeric guards
class Holder(nn.Module):
    """conv -> add of a constant buffer: exercises non-finite buffers used in forward."""

    def __init__(self, buf):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.register_buffer("offset", buf)

    def forward(self, x):
        return self.conv(x) + self.offset


@pytest.mark.parametrize("where, value, words", [
    ("weight", float("nan"), ["weight", "module '0'", "NaN"]),
    ("weight", float("inf"), ["weight", "module '0'", "Inf"]),
    ("bias", float("nan"), ["bias", "module '0'", "NaN"]),
    ("bias", float("-inf"), ["bias", "Inf"]),
])
def test_non_finite_parameters_are_refused_naming_the_tensor(where, value, words):
    m = conv_net()
    with torch.no_grad():
        getattr(m[0], where).view(-1)[0] = value
    raises(QuantizationError, *words, "finite", call=lambda: compile_quiet(m, (X,)))


@pytest.mark.parametrize("stat, value, words", [
    ("running_mean", float("nan"), ["running_mean", "module '1'", "NaN"]),
    ("running_var", float("inf"), ["running_var", "Inf"]),
    ("running_var", -1.0, ["BatchNorm '1'", "running_var -1", "positive"]),
])
def test_bad_batch_norm_statistics_are_refused(stat, value, words):
    m = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4)).eval()
    getattr(m[1], stat).fill_(value)
    raises(QuantizationError, *words, call=lambda: compile_quiet(m, (X,)))


def test_non_finite_buffer_used_in_forward_is_refused():
    buf = torch.zeros(1, 4, 1, 1)
    buf[0, 2] = float("nan")
    raises(QuantizationError, "offset", "NaN", call=lambda: compile_quiet(Holder(buf).eval(), (X,)))


def test_huge_weights_are_refused_not_silently_zero():
    raises(QuantizationError, "reaches", "calibrat", "rescale", call=lambda: compile_quiet(conv_net(1e30), (X,)))


def test_float_overflow_inside_the_network_is_refused():
    m = nn.Sequential(nn.Conv2d(3, 4, 3), nn.Conv2d(4, 4, 1)).eval()
    with torch.no_grad():
        m[0].weight.fill_(1e20)
        m[1].weight.fill_(1e20)
    raises(QuantizationError, "calibration", "rescale", call=lambda: compile_quiet(m, (X,)))


@pytest.mark.parametrize("w_scale, bias", [(1e-6, 1e6), (1e-6, 1e9)], ids=["bias-1e6", "bias-1e9-underflow"])
def test_bias_that_does_not_fit_int32_is_refused(w_scale, bias):
    raises(QuantizationError, "bias does not fit int32", "module '0'", "conv2d",
           call=lambda: compile_quiet(conv_net(w_scale, bias), (X,)))


@pytest.mark.parametrize("value", [0.0, 1.0, -2.5])
def test_constant_calibration_is_refused(value):
    cal = [(torch.full_like(X, value),), (torch.full_like(X, value),)]
    raises(QuantizationError, "constant", "input 0", "representative",
           call=lambda: compile_quiet(conv_net(), (X,), calibration=cal))


def test_accumulator_overflow_risk_is_refused_at_compile_not_at_emit():
    m = nn.Conv2d(4096, 2, 5).eval()
    xs = torch.randn(1, 4096, 5, 5)
    raises(QuantizationError, "102,400", "int32 accumulator", "split",
           call=lambda: compile_quiet(m, (xs,), calibration=[(xs,)]))


def test_linear_accumulator_overflow_risk_is_refused():
    m = nn.Linear(70000, 2).eval()
    xs = torch.randn(1, 70000)
    raises(QuantizationError, "70,000", "int32 accumulator", call=lambda: compile_quiet(m, (xs,)))


class Dead(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 1)
        with torch.no_grad():
            self.conv.bias.fill_(-100.0)

    def forward(self, x):
        return torch.relu(self.conv(x))


def test_a_tensor_constant_during_calibration_warns_and_the_program_stays_correct():
    with pytest.warns(QuantizationWarning, match="constant value"):
        p = corten.compile(Dead().eval(), (X,))
    assert torch.equal(p.run(X), torch.zeros(1, 4, 8, 8))


# ============================================================================ 2. input validation
def test_bare_tensor_example_input_is_taken_as_a_one_tuple(prog):
    p = compile_quiet(conv_net(), X, name="small")
    assert p.op_counts() == prog.op_counts()
    assert torch.equal(p.run_int8(X)[0], prog.run_int8(X)[0])


def test_list_example_inputs_are_accepted(prog):
    assert compile_quiet(conv_net(), [X]).op_counts() == prog.op_counts()


@pytest.mark.parametrize("inputs, words", [
    ({"x": X}, ["tuple", "dict"]),
    ((), ["empty"]),
    (("image",), ["example_inputs[0]", "str", "not a tensor"]),
    ((X.double(),), ["float64", "float32"]),
    ((X.long(),), ["int64"]),
    ((torch.full_like(X, float("nan")),), ["NaN", "finite"]),
    ((torch.randn(1, 3, 0, 8),), ["zero-size"]),
    ((torch.randn(1, 0),), ["zero-size"]),
], ids=["dict", "empty", "string", "float64", "int64", "nan", "zero-size-conv", "zero-size-2d"])
def test_bad_example_inputs_are_refused(inputs, words):
    raises(CaptureError, *words, call=lambda: compile_quiet(conv_net(), inputs))


LIN = nn.Linear(8, 4).eval()
XL = torch.randn(1, 8)


@pytest.mark.parametrize("model, inputs, calibration, words", [
    (LIN, (XL,), [(torch.randn(1, 9),)], ["sample 0", "shape (1, 9)", "(1, 8)"]),
    ("conv", (X,), [(X,), (torch.randn(1, 3, 16, 16),)], ["sample 1", "(1, 3, 16, 16)"]),
    (LIN, (XL,), [(XL, XL)], ["2 tensor(s)", "1 input"]),
    (LIN, (XL,), [(XL * float("nan"),)], ["NaN", "finite"]),
    (LIN, (XL,), [(XL,), (XL.masked_fill(XL > 0, float("inf")),)], ["sample 1", "Inf"]),
    (LIN, (XL,), [(XL.double(),)], ["dtype torch.float64"]),
    (LIN, (XL,), ["data.npy"], ["sample 0", "str"]),
    (LIN, (XL,), [(XL, "x")], ["2 tensor(s)"]),
    (LIN, (XL,), [("x",)], ["not a tensor"]),
    (LIN, (XL,), [], ["empty"]),
    (LIN, (XL,), 5, ["iterable", "int"]),
], ids=["linear-shape", "conv-shape", "arity", "nan", "inf", "float64", "filename", "arity-str", "str-tensor",
        "empty", "int"])
def test_bad_calibration_is_refused_before_anything_runs(model, inputs, calibration, words):
    model = conv_net() if model == "conv" else model
    raises(UsageError, *words, call=lambda: compile_quiet(model, inputs, calibration=calibration))


def test_calibration_as_one_tensor_of_samples_is_accepted():
    """A tensor [N, ...] is N samples (issue 12: calibration in the forms users have it)."""
    p = compile_quiet(LIN, (XL,), calibration=torch.randn(6, 8))
    assert p.info["calibration_samples"] == 6
    raises(UsageError, "(1, 9)", "(1, 8)", call=lambda: compile_quiet(LIN, (XL,), calibration=torch.randn(6, 9)))


def test_calibration_of_bare_tensors_is_accepted_for_a_one_input_model():
    p = compile_quiet(LIN, (XL,), calibration=[torch.randn(1, 8), torch.randn(1, 8)])
    assert p.info["calibration_samples"] == 2


class ReturnsNone(nn.Module):
    def forward(self, x):
        return None


class ReturnsDict(nn.Module):
    def forward(self, x):
        return {"y": torch.relu(x)}


class ReturnsInt(nn.Module):
    def forward(self, x):
        return torch.relu(x), 3


class TwoInputs(nn.Module):
    def forward(self, x, y):
        return x + y


class Empty(nn.Module):
    def forward(self, x):
        return torch.relu(x[:, :0])


@pytest.mark.parametrize("model, words", [
    (ReturnsNone(), ["returns None as output 0", "tensor"]),
    (ReturnsInt(), ["returns int as output 1", "output[1] = 3"]),
    (TwoInputs(), ["TwoInputs"]),
    (Empty(), ["no elements"]),
], ids=["none", "int", "arity", "zero-size-intermediate"])
def test_bad_model_signatures_are_refused(model, words):
    raises(CaptureError, *words, call=lambda: compile_quiet(model.eval(), (X,)))


def test_a_dict_output_compiles_and_runs_as_a_dict():
    # (was refused: "ReturnsDict.forward returns a dict"; tests/test_structured_outputs.py covers the rest)
    p = compile_quiet(ReturnsDict().eval(), (X,))
    out = p.run(X)
    assert isinstance(out, dict) and list(out) == ["y"] and out["y"].shape == X.shape
    assert p.output_names == ["y"]
    assert torch.equal(p.run_c(X, int8=True)[0], p.run_int8(X)[0])


def test_not_a_module_and_training_mode_are_refused():
    raises(CaptureError, "nn.Module", call=lambda: compile_quiet(lambda x: x, (X,)))
    raises(CaptureError, "training mode", "eval()", call=lambda: compile_quiet(nn.Conv2d(3, 4, 3), (X,)))


class ConvPlusInput(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 3, 3, padding=1)

    def forward(self, x):
        return self.conv(x) + x


class PoolPlusInput(nn.Module):
    def forward(self, x):
        return F.max_pool2d(x, 3, 1, 1) + x


@pytest.mark.parametrize("model", [ConvPlusInput(), PoolPlusInput()], ids=["conv", "max_pool"])
def test_residual_add_of_the_model_input_runs_byte_exact_in_c(model):
    torch.manual_seed(0)
    p = compile_quiet(model.eval(), (X,))
    assert torch.equal(p.run_c(X, int8=True)[0], p.run_int8(X)[0])


@pytest.mark.parametrize("args, words", [
    ((torch.randn(1, 3, 9, 9),), ["input 0", "(1, 3, 8, 8)", "(1, 3, 9, 9)"]),
    ((X, X), ["expected 1 input", "got 2"]),
    ((), ["expected 1 input", "got 0"]),
    ((X.double(),), ["float32", "float64"]),
    ((X.numpy(),), ["ndarray"]),
    ((torch.full_like(X, float("nan")),), ["NaN"]),
], ids=["shape", "two", "none", "float64", "numpy", "nan"])
def test_program_run_refuses_bad_inputs(prog, args, words):
    raises(UsageError, *words, call=lambda: prog.run(*args))
    raises(UsageError, *words, call=lambda: prog.run_c(*args))


def test_program_run_accepts_infinities_saturating(prog):
    x = X.clone()
    x[0, 0, 0, 0] = float("inf")
    assert torch.equal(prog.run_c(x, int8=True)[0], prog.run_int8(x)[0])


@pytest.mark.parametrize("kw, exc, words", [
    (dict(on="gpu"), UsageError, ["on must be", "gpu"]),
    (dict(kernels="fast"), UsageError, ["kernels", "fast"]),
    (dict(cflags=["-O1", 3]), UsageError, ["cflags"]),
    (dict(cflags="-fno-such-option-corten"), CBuildError, ["-fno-such-option-corten"]),
], ids=["on", "kernels", "cflags-type", "cflags-bad-flag"])
def test_run_c_refuses_bad_arguments(prog, kw, exc, words):
    raises(exc, *words, call=lambda: prog.run_c(X, **kw))


def test_run_c_under_address_and_undefined_behaviour_sanitizers_is_byte_exact(prog):
    flags = "-O1 -g -fsanitize=address,undefined -fno-sanitize-recover=all"
    assert torch.equal(prog.run_c(X, int8=True, cflags=flags)[0], prog.run_int8(X)[0])


# ============================================================================ 3. saving
class Cumprod(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)

    def forward(self, x):
        return torch.cumprod(self.conv(x), 1)


def test_a_partly_lowered_program_loads_in_a_fresh_process(tmp_path):
    p = compile_quiet(Cumprod().eval(), (X,), allow_unlowered=True, name="partial")
    assert p.unlowered_ops()
    d = p.save(tmp_path / "partial")
    code = ("import corten, json; p = corten.load(%r); "
            "print(json.dumps([p.op_counts(), len(p.unlowered_ops())]))" % str(d))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": SRC})
    assert out.returncode == 0, out.stderr[-2000:]
    counts, n_unlowered = json.loads(out.stdout.strip().splitlines()[-1])
    assert counts == p.op_counts() and n_unlowered == len(p.unlowered_ops())


def test_save_into_a_file_is_refused_and_the_file_kept(prog, tmp_path):
    f = tmp_path / "out"
    f.write_text("keep me")
    raises(OutputDirError, "not a directory", call=lambda: prog.save(f))
    assert f.read_text() == "keep me" and listing(tmp_path) == {"out": b"keep me"}


def test_save_over_another_program_is_refused_unless_forced(prog, tmp_path):
    other = compile_quiet(conv_net(), (X,), name="other")
    d = other.save(tmp_path / "p")
    (d / "notes.txt").write_text("mine")
    before = listing(tmp_path)
    raises(OutputDirError, "another Corten program", "'other'", "force", call=lambda: prog.save(d))
    assert listing(tmp_path) == before
    prog.save(d, force=True)
    assert corten.load(d).name == "small" and not (d / "notes.txt").exists()
    assert sorted(os.listdir(tmp_path)) == ["p"]


def test_save_over_the_same_program_replaces_it_whole(prog, tmp_path):
    d = prog.save(tmp_path / "p")
    (d / "stale.txt").write_text("old")
    prog.save(d)
    assert sorted(os.listdir(d)) == [MANIFEST, PROGRAM_FILE]
    assert sorted(os.listdir(tmp_path)) == ["p"]


def test_save_into_a_foreign_non_empty_directory_is_refused(prog, tmp_path):
    d = tmp_path / "docs"
    d.mkdir()
    (d / "thesis.tex").write_text("precious")
    raises(OutputDirError, "not empty", "force", call=lambda: prog.save(d))
    assert listing(tmp_path) == {"docs/thesis.tex": b"precious"}


def test_save_where_nothing_can_be_written_is_refused(prog):
    raises(OutputDirError, "/proc/corten-test-out", "writable", call=lambda: prog.save("/proc/corten-test-out"))


def test_save_under_a_file_is_refused(prog, tmp_path):
    (tmp_path / "f").write_text("x")
    raises(OutputDirError, "not a directory", call=lambda: prog.save(tmp_path / "f" / "p"))


# ============================================================================ 4. manifest and files
def _copy(saved_dir, tmp_path) -> Path:
    d = tmp_path / "prog"
    shutil.copytree(saved_dir, d)
    return d


def _edit(d: Path, fn) -> None:
    man = json.loads((d / MANIFEST).read_text())
    fn(man)
    (d / MANIFEST).write_text(json.dumps(man))


@pytest.mark.parametrize("edit, words", [
    (lambda m: m.pop("target"), ["no 'target'"]),
    (lambda m: m.pop("name"), ["no 'name'"]),
    (lambda m: m.pop("inputs"), ["no 'inputs'"]),
    (lambda m: m.update(target=55), ["'target' must be a str", "int"]),
    (lambda m: m.update(target="cortex-a53"), ["'target'", "cortex-a53"]),
    (lambda m: m.update(name="my model"), ["C identifier"]),
    (lambda m: m.update(inputs="x"), ["'inputs' must be a list"]),
    (lambda m: m.update(inputs=[]), ["non-empty"]),
    (lambda m: m["inputs"][0].update(shape=["1", 3]), ["inputs[0]"]),
    (lambda m: m["outputs"][0].update(scale="big"), ["outputs[0]"]),
    (lambda m: m["inputs"][0].update(shape=[1, 3, 9, 9]), ["do not match"]),
    (lambda m: m.update(program_file="../../etc/passwd"), ["program_file", "file name"]),
    (lambda m: m.update(program_sha256=17), ["'program_sha256' must be a str"]),
    (lambda m: m.update(info=[1]), ["'info' must be a dict"]),
    (lambda m: m.update(format_version="1"), ["format version"]),
    (lambda m: m.update(format=None), ["not a Corten program manifest"]),
], ids=["no-target", "no-name", "no-inputs", "target-int", "target-unknown", "name", "inputs-str", "inputs-empty",
        "shape-str", "scale-str", "shape-mismatch", "program-file-path", "sha-int", "info-list", "version-str",
        "format"])
def test_load_refuses_a_wrong_manifest_naming_the_file(saved_dir, tmp_path, edit, words):
    d = _copy(saved_dir, tmp_path)
    _edit(d, edit)
    before = listing(d)
    raises(ProgramFileError, *words, call=lambda: corten.load(d))
    assert listing(d) == before


@pytest.mark.parametrize("content, words", [
    (b"\xff\xfe{\x00", ["UTF-8", MANIFEST]),
    (b'{"format": "corten-program", "format_vers', ["JSON", MANIFEST]),
    (b"[1, 2, 3]", ["not a Corten program manifest"]),
    (b"", ["JSON"]),
], ids=["utf8", "truncated", "list", "empty"])
def test_load_refuses_a_corrupt_manifest(saved_dir, tmp_path, content, words):
    d = _copy(saved_dir, tmp_path)
    (d / MANIFEST).write_bytes(content)
    raises(ProgramFileError, *words, call=lambda: corten.load(d))


def test_load_refuses_a_missing_or_garbage_program_file(saved_dir, tmp_path):
    d = _copy(saved_dir, tmp_path)
    (d / PROGRAM_FILE).unlink()
    raises(ProgramFileError, PROGRAM_FILE, "missing", call=lambda: corten.load(d))
    (d / PROGRAM_FILE).write_bytes(b"not a zip")
    raises(ProgramFileError, "sha256", call=lambda: corten.load(d))
    _edit(d, lambda m: m.pop("program_sha256"))
    raises(ProgramFileError, "torch.export.load cannot read", call=lambda: corten.load(d))


def test_load_of_nothing_is_refused(tmp_path):
    raises(ProgramNotFoundError, MANIFEST, call=lambda: corten.load(tmp_path / "nowhere"))


# ============================================================================ CLI: out dirs and --input
NET = '''
import torch
from torch import nn
def make():
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU()).eval(), torch.randn(1, 3, 8, 8)
def other():
    torch.manual_seed(1)
    return nn.Sequential(nn.Conv2d(3, 2, 1)).eval(), (torch.randn(1, 3, 8, 8),)
'''


@pytest.fixture(scope="module")
def net_file(tmp_path_factory):
    p = tmp_path_factory.mktemp("models") / "net.py"
    p.write_text(NET)
    return p


@pytest.fixture(scope="module")
def compiled_dir(net_file, tmp_path_factory):
    out = tmp_path_factory.mktemp("cli") / "net"
    assert cli_main(["compile", f"{net_file}:make", "--out", str(out), "--calib", "2", "--emit-c"]) == 0
    return out


def cli(capsys, *argv) -> tuple[int, str]:
    code = cli_main([str(a) for a in argv])
    return code, capsys.readouterr().err


@pytest.mark.parametrize("flags, words", [
    # (one conv: its portable plan has no arena at all; CMSIS-NN's convolution needs scratch)
    (["--max-arena", "10", "--kernels", "cmsis-nn"], ["arena", "max_arena is 10"]),
    (["--max-flash", "1"], ["flash"]),
], ids=["arena", "flash"])
def test_cli_budget_failure_leaves_no_program(net_file, tmp_path, capsys, flags, words):
    code, err = cli(capsys, "compile", f"{net_file}:make", "--out", tmp_path / "o", "--calib", "2", *flags)
    assert code == 2 and all(w in err for w in words)
    assert os.listdir(tmp_path) == []


def test_cli_refused_emit_c_leaves_no_program(net_file, tmp_path, capsys, monkeypatch):
    from corten.errors import CodegenError
    from corten.program import Program

    def refuse(self, *a, **k):
        raise CodegenError("refused for the test")

    monkeypatch.setattr(Program, "emit_c", refuse)
    code, err = cli(capsys, "compile", f"{net_file}:make", "--out", tmp_path / "o", "--calib", "2", "--emit-c")
    assert code == 2 and "refused for the test" in err
    assert os.listdir(tmp_path) == []


def test_cli_refuses_another_program_in_out_unless_forced(net_file, compiled_dir, tmp_path, capsys):
    d = tmp_path / "net"
    shutil.copytree(compiled_dir, d)
    before = listing(tmp_path)
    code, err = cli(capsys, "compile", f"{net_file}:other", "--out", d, "--calib", "2")
    assert code == 2 and "another Corten program" in err and "--force" in err
    assert listing(tmp_path) == before
    code, _ = cli(capsys, "compile", f"{net_file}:other", "--out", d, "--calib", "2", "--force")
    assert code == 0
    assert not (d / "c").exists()  # the old program's C library went with it
    assert corten.load(d).outputs[0].shape == (1, 2, 8, 8)
    assert sorted(os.listdir(tmp_path)) == ["net"]


def test_cli_recompiling_the_same_model_replaces_it_whole(net_file, compiled_dir, tmp_path, capsys):
    d = tmp_path / "net"
    shutil.copytree(compiled_dir, d)
    code, _ = cli(capsys, "compile", f"{net_file}:make", "--out", d, "--calib", "2")
    assert code == 0 and not (d / "c").exists()
    assert sorted(os.listdir(tmp_path)) == ["net"]


def _write(path: Path, text: str, result: Path | None = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return result if result is not None else path


@pytest.mark.parametrize("make_out, words", [
    (lambda t: _write(t / "f", "x"), ["not a directory"]),
    (lambda t: _write(t / "f", "x", t / "f" / "sub"), ["not a directory"]),
    (lambda t: Path("/proc/corten-cli-out"), ["writable"]),
    (lambda t: _write(t / "d" / "keep.txt", "k", t / "d"), ["not empty"]),
], ids=["file", "under-file", "unwritable", "foreign-dir"])
def test_cli_bad_out_is_refused_before_compiling(net_file, tmp_path, capsys, make_out, words):
    out = make_out(tmp_path)
    before = listing(tmp_path)
    code, err = cli(capsys, "compile", f"{net_file}:make", "--out", out, "--calib", "2")
    assert code == 2 and all(w in err for w in words), err
    assert "Traceback" not in err and listing(tmp_path) == before


def test_cli_name_must_be_a_c_identifier(net_file, tmp_path, capsys):
    code, err = cli(capsys, "compile", f"{net_file}:make", "--out", tmp_path / "o", "--name", "1net")
    assert code == 2 and "C identifier" in err and os.listdir(tmp_path) == []


def _np_savez(path: Path) -> Path:
    np.savez(path, a=np.zeros(3))
    return path


def _np_save(path: Path, arr) -> Path:
    np.save(path, arr)
    return path


@pytest.mark.parametrize("make_input, words", [
    (lambda t: _write(t / "x.npy", "1 2 3\n"), ["not a .npy"]),
    (lambda t: _np_save(t / "c.npy", np.zeros((1, 3, 8, 8), np.complex64)), ["complex"]),
    (lambda t: _np_save(t / "s.npy", np.zeros((1, 3, 9, 9), np.float32)), ["shape (1, 3, 9, 9)"]),
    (lambda t: _np_save(t / "o.npy", np.array([{"a": 1}], dtype=object)), ["not a .npy"]),
    (lambda t: _np_save(t / "u.npy", np.array(["a"] * 192).reshape(1, 3, 8, 8)), ["text"]),
    (lambda t: _np_save(t / "n.npy", np.full((1, 3, 8, 8), np.nan, np.float32)), ["NaN"]),
    (lambda t: t / "missing.npy", ["no such file"]),
    (lambda t: _np_savez(t / "z.npz"), ["several arrays"]),
], ids=["text", "complex", "shape", "object", "unicode", "nan", "missing", "npz"])
def test_cli_run_refuses_a_bad_input_file(compiled_dir, tmp_path, capsys, make_input, words):
    path = make_input(tmp_path)
    code, err = cli(capsys, "run", compiled_dir, "--input", path)
    assert code == 2 and str(path.name) in err and all(w in err for w in words), err
    assert "Traceback" not in err


def test_cli_run_accepts_a_float64_input_and_sanitizer_flags(compiled_dir, tmp_path, capsys):
    x = _np_save(tmp_path / "x.npy", np.random.RandomState(0).randn(1, 3, 8, 8))
    code = cli_main(["run", str(compiled_dir), "--input", str(x),
                     "--cflags=-O1 -g -fsanitize=address,undefined -fno-sanitize-recover=all"])
    assert code == 0 and "equal to the Python reference: YES" in capsys.readouterr().out


@pytest.mark.parametrize("corrupt, words", [
    (lambda d: (d / MANIFEST).write_bytes(b"\x80\x81"), ["UTF-8"]),
    (lambda d: (d / MANIFEST).unlink(), [MANIFEST]),
    (lambda d: _edit(d, lambda m: m.pop("target")), ["'target'"]),
], ids=["utf8", "missing", "key"])
def test_cli_run_refuses_a_corrupt_program_dir(compiled_dir, tmp_path, capsys, corrupt, words):
    d = tmp_path / "net"
    shutil.copytree(compiled_dir, d)
    corrupt(d)
    code, err = cli(capsys, "run", d)
    assert code == 2 and all(w in err for w in words) and "Traceback" not in err


# ============================================================================ 5. more hostile inputs (issue 14, round 2)
class Fn(nn.Module):
    """``fn(self, x, ...)`` around a 1x1 conv: one-line hostile models."""

    def __init__(self, fn):
        super().__init__()
        self.fn, self.c = fn, nn.Conv2d(3, 4, 1)
        self.eval()

    def forward(self, *args, **kwargs):
        return self.fn(self, *args, **kwargs)


@pytest.mark.parametrize("inputs, words", [
    ((X > 0,), ["torch.bool", "float32"]),
    ((X.to(torch.int8),), ["torch.int8"]),
    ((X.half(),), ["torch.float16"]),
    ((X.bfloat16(),), ["torch.bfloat16"]),
    ((X.to(torch.complex64),), ["complex64"]),
    ((torch.tensor(1.0),), ["rank 0", "reshape(1)"]),
    ((torch.randn(1, 2, 2, 2, 2, 2),), ["rank 6"]),
    ((1.0,), ["float, not a tensor"]),
    ((None,), ["NoneType"]),
    (((X, X),), ["tuple, not a tensor"]),
], ids=["bool", "int8", "float16", "bfloat16", "complex", "rank0", "rank6", "python-float", "none", "nested"])
def test_more_bad_example_inputs_are_refused(inputs, words):
    raises(CaptureError, *words, call=lambda: compile_quiet(Fn(lambda s, x: s.c(x) * 2), inputs))


@pytest.mark.parametrize("kw, words", [
    (dict(seed="a"), ["seed", "'a'"]),
    (dict(seed=2**70), ["seed"]),
    (dict(seed=1.5), ["seed", "1.5"]),
    (dict(name="int"), ["not a C identifier"]),
    (dict(name=""), ["not a C identifier"]),
    (dict(name="n\u00e4t"), ["not a C identifier"]),
    (dict(name=5), ["must be a str"]),
    (dict(name="corten_net"), ["starts with 'corten'"]),
    (dict(target=None), ["unknown target None"]),
    (dict(target=55), ["unknown target 55"]),
    (dict(calibration=True), ["calibration must be", "bool"]),
    (dict(calibration=[{"x": X}]), ["dict", "tuples"]),
    (dict(calibration=np.zeros((2, 1, 3, 8, 8), np.float32)), ["ndarray"]),
    (dict(calibration=torch.randn(0, 3, 8, 8)), ["empty"]),
    (dict(calibration=lambda m: 1 / 0), ["calibration callable", "ZeroDivisionError"]),
], ids=["seed-str", "seed-huge", "seed-float", "name-keyword", "name-empty", "name-unicode", "name-int",
        "name-corten", "target-none", "target-int", "calib-bool", "calib-dict", "calib-numpy", "calib-zero", "calib-raises"])
def test_bad_compile_arguments_are_refused_before_anything_runs(kw, words):
    raises(UsageError, *words, call=lambda: compile_quiet(conv_net(), (X,), **kw))


@pytest.mark.parametrize("fn, exc, words", [
    (lambda s, x: (s.c(x) > 0).sum(), CaptureError, ["torch.int64", "output 0"]),  # (bool outputs are returned)
    (lambda s, x: (s.c(x), torch.ones(3)), CortenError, ["ones"]),
    (lambda s, x: s.c(x) + torch.rand_like(s.c(x)), CortenError, ["rand_like"]),
    (lambda s, x: s.c(x) if x.sum() > 0 else -s.c(x), CaptureError, ["could not capture", "data-dependent"]),
    (lambda s, x, *, y: s.c(x) + y, CaptureError, ["keyword-only argument", "'y'"]),
    (lambda s, x: s.c(x) * float("nan"), QuantizationError, ["non-finite", "mul"]),
    (lambda s, x: s.c(x) + float("inf"), QuantizationError, ["non-finite", "add"]),
    (lambda s, x: torch.log(s.c(x)), QuantizationError, ["NaN", "log"]),
    (lambda s, x: s.c(x) / 0.0, QuantizationError, ["non-finite", "div"]),
    (lambda s, x: s.c(x) * torch.tensor(3), CortenError, ["unquantized constant"]),
], ids=["int64-out", "const-out", "rand", "data-dependent-if",
        "kw-only-input", "nan-in-forward", "inf-in-forward", "log-negative", "div-by-zero", "int-constant"])
def test_hostile_forwards_are_refused_naming_the_problem(fn, exc, words):
    raises(exc, *words, call=lambda: compile_quiet(Fn(fn), (X,)))


@pytest.mark.parametrize("fn, n_in", [
    (lambda s, x: [s.c(x), torch.relu(x)], 1),              # a list of outputs
    (lambda s, x: ((s.c(x), x + 1), s.c(x)), 1),            # nested tuples
    (lambda s, x: (s.c(x), s.c(x)), 1),                     # the same output twice
    (lambda s, x: (s.c(x), x), 1),                          # the input itself as an output
    (lambda s, x: x[:, :2], 1),                             # a view of the input
    (lambda s, x, scale=2.0: s.c(x) * scale, 1),            # a defaulted keyword argument
    (lambda s, x, y: s.c(x), 2),                            # an unused input
    (lambda s, x: s.c(x) * 0.0, 1),                         # an all-zero output
    (lambda s, x: {"a": s.c(x)}, 1),                        # a dict (was refused; test_structured_outputs.py)
], ids=["list", "nested", "twice", "input-out", "input-view", "kw-default", "unused-input", "zero", "dict"])
def test_unusual_but_valid_models_run_byte_exact_in_c(fn, n_in):
    inputs = (X,) * n_in
    p = compile_quiet(Fn(fn), inputs)
    ref, got = p.run_int8(*inputs), p.run_c(*inputs, int8=True)
    assert len(ref) == len(got) and all(torch.equal(a, b) for a, b in zip(ref, got))


def test_float64_or_float16_models_are_refused_naming_the_dtype():
    raises(CaptureError, "double", call=lambda: compile_quiet(conv_net().double(), (X,)))
    raises(CaptureError, "Half", call=lambda: compile_quiet(conv_net().half(), (X,)))


@pytest.mark.parametrize("call, exc, words", [
    (lambda p, t: p.save(None), UsageError, ["directory path", "None"]),
    (lambda p, t: p.save(3), UsageError, ["directory path", "3"]),
    (lambda p, t: corten.load(5), UsageError, ["directory path", "5"]),
    (lambda p, t: p.emit_c(None), CortenError, ["out_dir", "None"]),
    (lambda p, t: p.emit_c(_write(t / "f", "x")), CortenError, ["cannot write the C library"]),
    (lambda p, t: p.emit_c("/proc/corten-emit"), CortenError, ["cannot write the C library"]),
    (lambda p, t: p.compare("model", [X]), UsageError, ["nn.Module", "str"]),
    (lambda p, t: p.compare(conv_net(), X), UsageError, ["list of input tuples", "Tensor"]),
    (lambda p, t: p.compare(conv_net(), [torch.randn(1, 3, 9, 9)]), UsageError, ["sample 0", "(1, 3, 9, 9)"]),
    (lambda p, t: p.run_c(X, on=3), UsageError, ["on must be"]),
    (lambda p, t: p.memory_for("fast"), CortenError, ["kernels", "fast"]),
    (lambda p, t: p.memory_for("portable", "cortex-a9"), UsageError, ["cortex-a9"]),
], ids=["save-none", "save-int", "load-int", "emit-none", "emit-file", "emit-unwritable", "compare-str",
        "compare-tensor", "compare-shape", "run-on-int", "memory-kernels", "memory-target"])
def test_program_methods_refuse_bad_arguments(prog, tmp_path, call, exc, words):
    raises(exc, *words, call=lambda: call(prog, tmp_path))
