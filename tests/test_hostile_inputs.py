"""Hostile inputs, round 3 (issue 14): models that raise, mutate state or hide Python numbers,
tensors on the wrong device or layout, calibration that never runs, wrapped modules, odd memory
layouts, symlinked / protected / unicode output directories, broken model files and program
directories.  Each ends in a Corten error of the right type naming the problem (or in a correct,
byte-exact program), and nothing on disk is lost or left behind.  Models are tiny; the CLI runs
in-process."""
from __future__ import annotations

import os
import shutil
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

import corten
from corten.cli import main as cli_main
from corten.errors import (
    CaptureError, CmsisNnNotFoundError, CortenError, ProgramFileError, UnsupportedOpsError, UsageError,
)
from corten.program import MANIFEST, PROGRAM_FILE

X = torch.randn(1, 3, 8, 8, generator=torch.Generator().manual_seed(3))
CALIB = [(torch.randn(1, 3, 8, 8, generator=torch.Generator().manual_seed(s)),) for s in (1, 2)]


def conv_net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU()).eval()


def build(model, inputs=(X,), calibration=CALIB, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return corten.compile(model, inputs, calibration=calibration, **kw)


def raises(exc_type, *words, call):
    with pytest.raises(exc_type) as info:
        call()
    assert isinstance(info.value, CortenError), type(info.value)
    for w in words:
        assert w.lower() in str(info.value).lower(), f"{w!r} not in: {info.value}"


def byte_exact(prog, *xs) -> bool:
    return all(torch.equal(c, r) for c, r in zip(prog.run_c(*xs, int8=True), prog.run_int8(*xs)))


def listing(d: Path) -> dict[str, bytes]:
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def prog():
    return build(conv_net(), name="hostile")


# ============================================================================ models
class Raises(nn.Module):
    def forward(self, x):
        raise RuntimeError("sensor unplugged")


class ReadsItem(nn.Module):
    def forward(self, x):
        return x * x.max().item()


class CountsCalls(nn.Module):
    """A buffer mutated in forward (a call counter): state the program must not depend on."""

    def __init__(self):
        super().__init__()
        self.c = nn.Conv2d(3, 4, 3, padding=1)
        self.register_buffer("calls", torch.zeros(1))

    def forward(self, x):
        self.calls += 1
        return self.c(x)


class CachesActivation(nn.Module):
    """A buffer overwritten with an activation and read back in the same forward."""

    def __init__(self):
        super().__init__()
        self.c = nn.Conv2d(3, 4, 3, padding=1)
        self.register_buffer("cache", torch.zeros(1, 4, 8, 8))

    def forward(self, x):
        y = self.c(x)
        self.cache.copy_(y)
        return y + self.cache


class NamedTupleOut(nn.Module):
    def forward(self, x):
        from collections import namedtuple

        return namedtuple("Out", "a b")(torch.relu(x), -x)


class VarArgs(nn.Module):
    def __init__(self):
        super().__init__()
        self.c = nn.Conv2d(3, 4, 3, padding=1)

    def forward(self, *xs):
        return self.c(xs[0])


class Hooked(nn.Module):
    """A forward hook that rescales the conv output: part of what the model computes."""

    def __init__(self):
        super().__init__()
        self.c = nn.Conv2d(3, 4, 3, padding=1)
        self.c.register_forward_hook(lambda mod, inp, out: out * 0.5)

    def forward(self, x):
        return self.c(x)


class NoGradForward(nn.Module):
    """forward decorated with @torch.no_grad() (exported as a grad-mode region by torch)."""

    def __init__(self):
        super().__init__()
        self.c = nn.Conv2d(3, 4, 3, padding=1)

    @torch.no_grad()
    def forward(self, x):
        return self.c(x)


class InferenceModeForward(NoGradForward):
    @torch.inference_mode()
    def forward(self, x):
        return self.c(x)


class Identity(nn.Module):
    def forward(self, x):
        return x


class ReluOfInputInPlace(nn.Module):
    def forward(self, x):
        return torch.relu_(x) + 1


class AutocastForward(NoGradForward):
    def forward(self, x):
        with torch.autocast("cpu", dtype=torch.bfloat16):  # (a disabled one vanishes: test_external_idioms)
            return self.c(x)


class CheckpointedForward(NoGradForward):
    def forward(self, x):
        from torch.utils.checkpoint import checkpoint

        return checkpoint(self.c, x, use_reentrant=False)


def scaled_conv(w_scale: float, bias: float | None = None):
    m = conv_net()
    with torch.no_grad():
        m[0].weight.mul_(w_scale)
        if bias is not None:
            m[0].bias.fill_(bias)
    return m


def on_meta():
    return conv_net().to("meta")


@pytest.mark.parametrize("make, inputs, exc, words", [
    (Raises, (X,), CaptureError, ["could not capture Raises", "RuntimeError", "sensor unplugged"]),
    (ReadsItem, (X,), UnsupportedOpsError, ["item", "Python number", "keep it a tensor"]),
    (on_meta, (X,), CaptureError, ["parameter '0.weight'", "device meta", "model.cpu()"]),
    (lambda: torch.jit.script(conv_net()), (X,), CaptureError, ["ScriptModule"]),
    (lambda: torch.jit.trace(conv_net(), X), (X,), CaptureError, ["ScriptModule"]),
    (lambda: nn.DataParallel(conv_net()), (X,), CaptureError, ["DataParallel", "eval()"]),
    (conv_net, (X.to_sparse(),), CaptureError, ["sparse", "to_dense"]),
    (conv_net, (torch.empty(1, 3, 8, 8, device="meta"),), CaptureError, ["example_inputs[0]", "device meta"]),
    (conv_net, (torch.quantize_per_tensor(X, 0.1, 0, torch.qint8),), CaptureError, ["torch.qint8", "float32"]),
    (conv_net, ({"x": X},), CaptureError, ["example_inputs[0] is a dict"]),
    (conv_net, ([X, X],), CaptureError, ["example_inputs[0] is a list"]),
    (nn.Conv2d, (X,), CaptureError, ["torch.nn.Module", "type"]),
    (AutocastForward, (X,), UnsupportedOpsError, ["wrap_with_autocast", "remove the autocast context",
                                                  "test_hostile_inputs.py:"]),
], ids=["raises-in-forward", "item", "meta-weights", "script-module", "traced-module",
        "data-parallel", "sparse-input", "meta-input", "quantized-input", "dict-input", "list-input",
        "class-not-instance", "autocast-region"])
def test_hostile_models_and_inputs_are_refused_by_name(make, inputs, exc, words):
    model = make if make is nn.Conv2d else make()
    if isinstance(model, nn.Module) and not isinstance(model, nn.DataParallel):  # (a fresh wrapper trains)
        model.eval()
    raises(exc, *words, call=lambda: build(model, inputs))


@pytest.mark.parametrize("make, inputs", [
    (CountsCalls, (X,)),
    (CachesActivation, (X,)),
    (VarArgs, (X,)),
    (Hooked, (X,)),
    (conv_net, (X.transpose(2, 3).contiguous().transpose(2, 3),)),      # a non-contiguous example input
    (conv_net, (X.to(memory_format=torch.channels_last),)),             # channels_last example input
    (conv_net, (X.clone().requires_grad_(),)),                           # an input that requires grad
    (conv_net, (nn.Parameter(X.clone()),)),                              # a Parameter as the input
    (NoGradForward, (X,)),
    (CheckpointedForward, (X,)),
    (InferenceModeForward, (X,)),
    (Identity, (X,)),
    (ReluOfInputInPlace, (X,)),
    (lambda: scaled_conv(1e-39), (X,)),                                  # denormal weights
    (lambda: scaled_conv(0.0, 0.0), (X,)),                               # all-zero weights and bias
], ids=["buffer-counter", "buffer-cache", "varargs", "forward-hook", "non-contiguous", "channels-last",
        "requires-grad", "parameter-input", "no-grad-forward", "checkpointed-forward", "inference-mode-forward", "identity",
        "inplace-relu-of-input", "denormal-weights", "zero-weights"])
def test_unusual_models_and_example_layouts_compile_byte_exact(make, inputs):
    model = make().eval()
    p = build(model, inputs)
    with torch.no_grad():
        float_out = model(X.clone())
    assert p.run(X).shape == float_out.shape
    assert byte_exact(p, X)


def test_a_namedtuple_made_inside_forward_is_returned_with_its_fields():
    # (was refused: "returns a namedtuple"); the class is made anew on every call: the program's
    # outputs are a namedtuple of the same name and fields
    model = NamedTupleOut().eval()
    p = build(model)
    out, ref = p.run(X), model(X)
    assert type(out).__name__ == "Out" and out._fields == ("a", "b")
    assert out.a.shape == ref.a.shape and out.b.shape == ref.b.shape
    assert p.output_names == ["a", "b"]
    assert byte_exact(p, X)


# ============================================================================ calibration
def test_calibration_from_an_exhausted_generator_is_refused():
    gen = (s for s in CALIB)
    list(gen)
    raises(UsageError, "calibration is empty", call=lambda: build(conv_net(), calibration=gen))


def test_calibration_from_a_live_generator_is_used():
    assert byte_exact(build(conv_net(), calibration=(s for s in CALIB)), X)


def test_a_calibration_callable_that_never_runs_the_model_is_refused():
    def forgot(model):
        _ = [torch.randn(1, 3, 8, 8) for _ in range(2)]  # builds the data, never calls model

    raises(UsageError, "forgot(model)", "without running the model", call=lambda: build(conv_net(),
                                                                                       calibration=forgot))


def test_a_generator_function_as_calibration_callable_is_run_to_the_end():
    seen = []

    def feed(model):
        for (x,) in CALIB:
            seen.append(x)
            yield model(x)

    p = build(conv_net(), calibration=feed)
    assert len(seen) == len(CALIB) and p.info["calibration_samples"] == 0
    assert p.inputs[0].scale == build(conv_net(), calibration=CALIB).inputs[0].scale  # same ranges as the samples
    assert byte_exact(p, X)


def test_calibration_values_beyond_float32_histograms_are_refused():
    raises(CortenError, "input", "calibrat", "rescale",
           call=lambda: build(conv_net(), calibration=[(x * 1e30,) for (x,) in CALIB]))


def test_nan_in_one_late_calibration_sample_is_named():
    samples = CALIB + [(torch.full((1, 3, 8, 8), float("nan")),), CALIB[0]]
    raises(UsageError, "sample 2", "NaN", call=lambda: build(conv_net(), calibration=samples))


@pytest.mark.parametrize("transform", [
    lambda x: x.clone().requires_grad_(),
    lambda x: x.transpose(2, 3).contiguous().transpose(2, 3),
], ids=["requires-grad", "non-contiguous"])
def test_calibration_samples_that_require_grad_or_are_strided_give_the_same_program(transform):
    p = build(conv_net(), calibration=[(transform(x),) for (x,) in CALIB])
    ref = build(conv_net(), calibration=CALIB)
    assert torch.equal(p.run_int8(X)[0], ref.run_int8(X)[0])


# ============================================================================ Program.run / run_c
@pytest.mark.parametrize("transform", [
    lambda x: x.permute(0, 2, 3, 1).contiguous().permute(0, 3, 1, 2),  # NHWC memory, NCHW view
    lambda x: x.to(memory_format=torch.channels_last),
    lambda x: x.clone().requires_grad_(),
    lambda x: torch.stack([x, -x], -1)[..., 0],                         # a strided view (stride 2)
], ids=["nhwc-view", "channels-last", "requires-grad", "strided-view"])
def test_run_c_reads_any_memory_layout_by_value(prog, transform):
    x = transform(X)
    assert torch.equal(prog.run_c(x, int8=True)[0], prog.run_int8(X)[0])
    assert torch.equal(prog.run(x), prog.run(X))


@pytest.mark.parametrize("args, words", [
    ((X.numpy(),), ["ndarray"]),
    ((torch.randn(1, 3, 8, 9),), ["(1, 3, 8, 8)", "(1, 3, 8, 9)"]),
    ((torch.randn(2, 3, 8, 8),), ["(2, 3, 8, 8)"]),
    (([X],), ["list"]),
    ((X.to(torch.int8),), ["torch.int8"]),
    ((torch.tensor(1.0),), ["got ()"]),
], ids=["numpy", "shape", "batch", "list", "int8", "0-d"])
def test_run_c_refuses_wrong_inputs_before_building(prog, args, words):
    raises(UsageError, *words, call=lambda: prog.run_c(*args))


def test_run_c_with_a_missing_cmsis_nn_tree_is_a_corten_error(prog, tmp_path):
    raises(CmsisNnNotFoundError, str(tmp_path), "not a CMSIS-NN tree",
           call=lambda: prog.run_c(X, kernels="cmsis-nn", cmsis_nn_path=str(tmp_path)))
    assert issubclass(CmsisNnNotFoundError, FileNotFoundError)  # `except FileNotFoundError` still works


@pytest.mark.parametrize("target", ["Cortex-M55", "m55", "cortex-m99"])
def test_misspelled_targets_are_refused_listing_the_valid_ones(prog, target):
    raises(UsageError, f"unknown target {target!r}", "cortex-m55",
           call=lambda: build(conv_net(), target=target))
    raises(UsageError, f"unknown target {target!r}", call=lambda: prog.run_c(X, on="qemu", target=target))


def test_emit_c_never_overwrites_the_users_own_build_files(prog, tmp_path):
    (tmp_path / "Makefile").write_text("all:\n\tmy-firmware-build\n")
    (tmp_path / "notes.txt").write_text("mine")
    before = listing(tmp_path)
    raises(CortenError, "Makefile", "not written by Corten", "directory of its own",
           call=lambda: prog.emit_c(tmp_path))
    assert listing(tmp_path) == before  # nothing written, nothing lost
    lib = prog.emit_c(tmp_path / "c")
    assert prog.emit_c(tmp_path / "c").header == lib.header  # re-emitting over Corten's own files is fine
    (tmp_path / "c" / "Makefile").write_text("# my own\n")
    raises(CortenError, "not written by Corten", call=lambda: prog.emit_c(tmp_path / "c"))


# ============================================================================ CLI
NET = '''
import torch
from torch import nn
def make():
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU()).eval(), (torch.randn(1, 3, 8, 8),)
def boom():
    raise RuntimeError("no weights file")
'''


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("hostile-models")
    (d / "net.py").write_text(NET)
    (d / "syntax.py").write_text("import torch\ndef make(:\n    pass\n")
    (d / "imports.py").write_text("import corten_no_such_module_xyz\n")
    return d


@pytest.fixture(scope="module")
def compiled(models, tmp_path_factory):
    out = tmp_path_factory.mktemp("hostile-cli") / "net"
    assert cli_main(["compile", f"{models / 'net.py'}:make", "--out", str(out), "--calib", "2"]) == 0
    return out


def cli(capsys, *argv) -> tuple[int, str]:
    code = cli_main([str(a) for a in argv])
    captured = capsys.readouterr()
    return code, captured.err


def test_cli_out_with_spaces_and_unicode(models, tmp_path, capsys):
    out = tmp_path / "my models" / "ünïcødé net"
    code, _ = cli(capsys, "compile", f"{models / 'net.py'}:make", "--out", out, "--calib", "2")
    assert code == 0 and corten.load(out).name == "net"
    assert cli_main(["run", str(out)]) == 0
    assert "equal to the Python reference: YES" in capsys.readouterr().out


def test_cli_out_symlink_writes_through_the_link_and_keeps_it(models, tmp_path, capsys):
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "link").symlink_to(real)
    (tmp_path / "dangling").symlink_to(tmp_path / "later")
    for link, target in (("link", real), ("dangling", tmp_path / "later")):
        code, err = cli(capsys, "compile", f"{models / 'net.py'}:make", "--out", tmp_path / link, "--calib", "2")
        assert code == 0, err
        assert (tmp_path / link).is_symlink() and (target / MANIFEST).is_file()
        assert corten.load(tmp_path / link).name == "net"
    assert sorted(os.listdir(tmp_path)) == ["dangling", "later", "link", "real"]  # no temporary left


def test_cli_never_replaces_the_current_directory_or_its_parents(models, tmp_path, capsys, monkeypatch):
    work = tmp_path / "project" / "src"
    work.mkdir(parents=True)
    (work / "train.py").write_text("precious")
    monkeypatch.chdir(work)
    before = listing(tmp_path)
    for out in (".", "..", str(tmp_path / "project")):
        code, err = cli(capsys, "compile", f"{models / 'net.py'}:make", "--out", out, "--calib", "2", "--force")
        assert code == 2 and "never replaces" in err and "current directory" in err, err
    assert listing(tmp_path) == before


def test_cli_program_directory_gets_normal_permissions(compiled):
    mode = compiled.stat().st_mode & 0o777
    umask = os.umask(0)
    os.umask(umask)
    assert mode == 0o777 & ~umask


@pytest.mark.parametrize("spec, words", [
    ("syntax.py:make", ["syntax.py:2", "SyntaxError"]),
    ("imports.py:make", ["imports.py", "ModuleNotFoundError", "corten_no_such_module_xyz", "imports.py:1"]),
    ("net.py:boom", ["net.py:boom() raised RuntimeError", "no weights file", "net.py:8"]),
], ids=["syntax-error", "import-error", "factory-raises"])
def test_cli_broken_model_files_are_named_without_a_traceback(models, tmp_path, capsys, spec, words):
    code, err = cli(capsys, "compile", f"{models / spec}", "--out", tmp_path / "o")
    assert code == 2 and "Traceback" not in err and all(w in err for w in words), err
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("calib", ["0", "-3"])
def test_cli_calib_must_be_positive(models, tmp_path, capsys, calib):
    code, err = cli(capsys, "compile", f"{models / 'net.py'}:make", "--out", tmp_path / "o", "--calib", calib)
    assert code == 2 and f"--calib {calib}" in err and os.listdir(tmp_path) == []


def _np(path: Path, arr) -> Path:
    np.save(path, arr)
    return path


@pytest.mark.parametrize("make, words", [
    (lambda t: _np(t / "nan.npy", np.full((4, 3, 8, 8), np.nan, np.float32)), ["sample 0", "NaN"]),
    (lambda t: _np(t / "flat.npy", np.zeros((4, 3), np.float32)), ["flat.npy", "(3, 8, 8)"]),
    (lambda t: _np(t / "empty.npy", np.zeros((0, 3, 8, 8), np.float32)), ["empty"]),
    (lambda t: _np(t / "ones.npy", np.ones((2, 3, 8, 8), np.int64)), ["constant"]),
    (lambda t: _np(t / "bool.npy", np.ones((2, 3, 8, 8), bool)), ["bool.npy", "bool"]),
], ids=["nan", "flat", "empty", "constant", "bool"])
def test_cli_bad_calib_data_is_refused_before_compiling(models, tmp_path, capsys, make, words):
    data = make(tmp_path)
    code, err = cli(capsys, "compile", f"{models / 'net.py'}:make", "--out", tmp_path / "o", "--calib-data", data)
    assert code == 2 and "Traceback" not in err and all(w in err for w in words), err
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("corrupt, words", [
    (lambda d: (d / PROGRAM_FILE).write_bytes((d / PROGRAM_FILE).read_bytes()[:1000]), ["sha256", "corrupt"]),
    (lambda d: ((d / PROGRAM_FILE).unlink(), (d / PROGRAM_FILE).mkdir()), [PROGRAM_FILE]),
    (lambda d: ((d / MANIFEST).unlink(), (d / MANIFEST).mkdir()), [MANIFEST, "cannot read"]),
], ids=["truncated-pt2", "pt2-is-a-directory", "manifest-is-a-directory"])
def test_cli_run_refuses_a_damaged_program_dir(compiled, tmp_path, capsys, corrupt, words):
    d = tmp_path / "net"
    shutil.copytree(compiled, d)
    corrupt(d)
    code, err = cli(capsys, "run", d)
    assert code == 2 and "Traceback" not in err and all(w in err for w in words), err
    raises(ProgramFileError, *words, call=lambda: corten.load(d))


def test_cli_run_on_a_file_or_with_cmsis_nn_but_no_tree(compiled, models, tmp_path, capsys, monkeypatch):
    code, err = cli(capsys, "run", models / "net.py")
    assert code == 2 and "net.py" in err and "Traceback" not in err
    monkeypatch.delenv("CMSIS_NN_PATH", raising=False)
    code, err = cli(capsys, "run", compiled, "--kernels", "cmsis-nn")
    assert code == 2 and "CMSIS_NN_PATH" in err
    monkeypatch.setenv("CMSIS_NN_PATH", str(tmp_path))
    code, err = cli(capsys, "run", compiled, "--kernels", "cmsis-nn")
    assert code == 2 and "not a CMSIS-NN tree" in err and "Traceback" not in err


def test_cli_run_raises_no_foreign_warnings(compiled, capsys):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        code, err = cli(capsys, "run", compiled)
    assert code == 0, err
    assert [str(w.message) for w in caught if not issubclass(w.category, corten.QuantizationWarning)] == []


def test_the_command_exits_fast_with_its_code_and_complete_output(models, tmp_path):
    """Run as a command, the CLI ends with os._exit after the work (no interpreter teardown): the
    exit code and every line of output must survive that, on a pipe as on a terminal."""
    import subprocess
    import sys

    env = dict(os.environ, PYTHONPATH=str(Path(corten.__file__).resolve().parent.parent))
    done = subprocess.run([sys.executable, "-m", "corten.cli", "models"], env=env, capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout.splitlines()[0].startswith("mv2") and "kwt-tiny" in done.stdout
    bad = subprocess.run([sys.executable, "-m", "corten.cli", "compile", "no-such-model", "--out", str(tmp_path / "o")],
                         env=env, capture_output=True, text=True)
    assert bad.returncode == 2 and "unknown model 'no-such-model'" in bad.stderr and "Traceback" not in bad.stderr
    assert not (tmp_path / "o").exists()
