"""The public API: ``corten.compile``, :class:`corten.program.Program`, ``corten.load`` and the
``corten`` command line, including how unsupported models are refused."""
from __future__ import annotations

import inspect
import json

import pytest
import torch
from torch import nn

import corten
from corten.capture import CaptureError
from corten.cli import STAGE_FILES, main
from corten.compiler import default_calibration
from corten.program import MANIFEST, PROGRAM_FILE, Program, UnsupportedOpsError
from corten.targets import TARGETS
from corten.zoo import MODELS

SMALL_OPS = {"quantize_per_tensor": 1, "quantized_conv2d": 1, "quantized_avg_pool2d": 1,
             "quantized_linear": 1, "dequantize_per_tensor": 1}


class Small(nn.Module):
    """conv-bn-relu -> global average pool -> flatten -> linear."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(8)
        self.fc = nn.Linear(8, 5)

    def forward(self, x):
        y = torch.relu(self.bn(self.conv(x)))
        return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(y, 1), 1))


def small_model(seed: int = 0) -> tuple[nn.Module, tuple[torch.Tensor]]:
    torch.manual_seed(seed)
    model = Small()
    with torch.no_grad():
        model.bn.running_mean.uniform_(-0.2, 0.2)
        model.bn.running_var.uniform_(0.5, 1.5)
    return model.eval(), (torch.randn(1, 3, 8, 8),)


class TwoCumprods(nn.Module):
    """Two ops Corten does not lower (cumprod; cumsum and sigmoid were the examples before they got lowerings)."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)

    def forward(self, x):
        y = torch.cumprod(self.conv(x), 1)  # line marker: cumprod-1
        return torch.cumprod(y, 1)  # line marker: cumprod-2


class CeilModePoolLayer(nn.Module):
    """A layer (nn.Module) whose op Corten has no rule for: the refusal must name this file's line.
    (Named after the ceil-mode average pool it used before pools learned ceil_mode.)"""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(4, 6, 3)
        self.pool = nn.MaxPool3d(2)  # (Hardshrink, Threshold lower as tables now; bicubic Upsample as matrices)

    def forward(self, x):
        return self.pool(self.conv(x))  # line marker: pool-layer


class CeilModePool(nn.Module):
    """An op whose lowering rule refuses it with a reason (add with alpha)."""

    def forward(self, x):
        return torch.add(x, x, alpha=2)  # line marker: ceil-pool


def source_line(cls: type, marker: str) -> str:
    """``this_file:line`` of the line of ``cls`` carrying ``# line marker: <marker>``."""
    lines, first = inspect.getsourcelines(cls)
    (offset,) = [i for i, text in enumerate(lines) if f"line marker: {marker}" in text]
    return f"{__file__}:{first + offset}"


def one_sample(shape) -> list[tuple[torch.Tensor]]:
    return [(torch.randn(shape, generator=torch.Generator().manual_seed(7)),)]


@pytest.fixture(scope="module")
def small():
    """The small model compiled with the default (random, seed 0) calibration."""
    model, inputs = small_model()
    return model, inputs, corten.compile(model, inputs)


# ----------------------------------------------------------------------------- refusals
def test_unsupported_op_is_named_with_count_and_user_source():
    with pytest.raises(UnsupportedOpsError) as info:
        corten.compile(TwoCumprods().eval(), (torch.randn(1, 3, 6, 6),), calibration=one_sample((1, 3, 6, 6)))
    message = str(info.value)
    assert "aten.cumprod.default x2" in message
    assert "TwoCumprods" in message
    assert source_line(TwoCumprods, "cumprod-1") in message
    assert source_line(TwoCumprods, "cumprod-2") in message
    assert "allow_unlowered=True" in message and "Workarounds" in message
    assert [n.op for n in info.value.nodes] == ["aten.cumprod.default"] * 2


def test_allow_unlowered_lists_the_unlowered_ops():
    prog = corten.compile(TwoCumprods().eval(), (torch.randn(1, 3, 6, 6),), calibration=one_sample((1, 3, 6, 6)),
                          allow_unlowered=True)
    unlowered = prog.unlowered_ops()
    assert [u.op for u in unlowered] == ["aten.cumprod.default"] * 2
    assert {u.location.rsplit(" in ", 1)[0] for u in unlowered} == {
        source_line(TwoCumprods, "cumprod-1"), source_line(TwoCumprods, "cumprod-2")}
    assert prog.op_counts()["quantized_conv2d"] == 1
    assert "NOT LOWERED" in prog.operator_table() and "aten.cumprod.default" in prog.operator_table()


@pytest.mark.parametrize("model, shape, op, reason", [
    (CeilModePoolLayer, (1, 4, 9, 9), "aten.max_pool3d.default x1", ""),
    (CeilModePool, (1, 3, 8, 8), "aten.add.Tensor x1", "alpha"),
], ids=["layer_without_rule", "add_alpha"])
def test_refused_rule_says_why(model, shape, op, reason):
    with pytest.raises(UnsupportedOpsError) as info:
        corten.compile(model().eval(), (torch.randn(shape),), calibration=one_sample(shape))
    message = str(info.value)
    assert op in message and reason in message
    prog = corten.compile(model().eval(), (torch.randn(shape),), calibration=one_sample(shape), allow_unlowered=True)
    (node,) = prog.unlowered_ops()
    assert node.op == op.split(" ")[0] and reason in node.reason


class Fn(nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, x):
        return self.fn(x)


class ConvThen(nn.Module):
    """``then(conv(x), conv2(x))``: the refused op gets int8 operands from convs."""

    def __init__(self, then):
        super().__init__()
        self.conv, self.conv2, self.then = nn.Conv2d(3, 4, 3), nn.Conv2d(3, 4, 3), then

    def forward(self, x):
        return self.then(self.conv(x), self.conv2(x))


def _pool_all(y):
    return nn.functional.adaptive_avg_pool2d(y, 1)


@pytest.mark.parametrize("model, op, reason", [
    (lambda: Fn(lambda x: x.reshape(1, 1, 3, 5, 5) @ x.reshape(1, 1, 3, 5, 5)), "aten.matmul.default",
     "ranks 2 to 4"),
    (lambda: Fn(lambda x: torch.cumprod(x, 3)), "aten.cumprod.default", ""),
], ids=["matmul_rank5", "cumprod"])
def test_each_refusal_names_op_reason_and_line(model, op, reason):
    shape = (1, 3, 5, 5)
    with pytest.raises(UnsupportedOpsError) as info:
        corten.compile(model().eval(), (torch.randn(shape),), calibration=one_sample(shape))
    (node,) = info.value.nodes
    assert node.op == op and reason in node.reason
    assert node.location.startswith(f"{__file__}:"), node.location
    assert f"{op} x1" in str(info.value)


class AddAlpha(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Conv2d(3, 4, 1), nn.Conv2d(3, 4, 1)

    def forward(self, x):
        return torch.add(self.a(x), self.b(x), alpha=2)


def test_add_with_alpha_refusal_names_alpha():
    with pytest.raises(UnsupportedOpsError, match="alpha"):
        corten.compile(AddAlpha().eval(), (torch.randn(1, 3, 5, 5),), calibration=one_sample((1, 3, 5, 5)))


class SamePadding(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding="same")

    def forward(self, x):
        return self.conv(x)


def test_conv_with_same_padding_lowers():
    prog = corten.compile(SamePadding().eval(), (torch.randn(1, 3, 6, 6),), calibration=one_sample((1, 3, 6, 6)))
    assert prog.op_counts()["quantized_conv2d"] == 1


def test_ceil_mode_pool_names_the_user_line():
    with pytest.raises(UnsupportedOpsError, match=source_line(CeilModePool, "ceil-pool")):
        corten.compile(CeilModePool().eval(), (torch.randn(1, 3, 8, 8),), calibration=one_sample((1, 3, 8, 8)))


def test_refused_layer_names_the_user_line():
    with pytest.raises(UnsupportedOpsError, match=source_line(CeilModePoolLayer, "pool-layer")):
        corten.compile(CeilModePoolLayer().eval(), (torch.randn(1, 4, 9, 9),), calibration=one_sample((1, 4, 9, 9)))


def test_training_mode_model_is_refused():
    model, inputs = small_model()
    model.train()
    with pytest.raises(CaptureError, match=r"training mode.*model\.eval\(\)"):
        corten.compile(model, inputs)


def test_batch_two_compiles_and_calibrates_on_batched_samples():
    model, _ = small_model()
    x = torch.randn(2, 3, 8, 8)
    prog = corten.compile(model, (x,), calibration=[(torch.randn(2, 3, 8, 8),) for _ in range(3)])
    assert prog.unlowered_ops() == [] and prog.inputs[0].shape == (2, 3, 8, 8)
    out = prog.run(x)
    assert out.shape[0] == 2
    # each sample of the batch is computed as it would be alone
    one = corten.compile(model, (x[:1],), calibration=[(torch.randn(1, 3, 8, 8),)])
    assert one.inputs[0].shape == (1, 3, 8, 8)


@pytest.mark.parametrize("inputs, message", [
    ((torch.randn(1, 3, 8, 8).double(),), "float32"),
    ((3,), "not a tensor"),
], ids=["float64", "int"])
def test_bad_example_inputs_are_refused(inputs, message):
    model, _ = small_model()
    with pytest.raises(CaptureError, match=message):
        corten.compile(model, inputs)


def test_program_shapes_are_static(small):
    """A program is compiled for its example input shape; other shapes are refused by name."""
    _, _, prog = small
    with pytest.raises(ValueError, match=r"input 0 must be a float32 tensor of shape \(1, 3, 8, 8\), got \(1, 3, 9, 9\)"):
        prog.run(torch.randn(1, 3, 9, 9))
    with pytest.raises(ValueError, match="expected 1 input"):
        prog.run(torch.randn(1, 3, 8, 8), torch.randn(1, 3, 8, 8))


# ----------------------------------------------------------------------------- the API
def test_compile_returns_a_fully_lowered_program(small):
    model, inputs, prog = small
    assert isinstance(prog, Program)
    assert prog.op_counts() == SMALL_OPS
    assert prog.unlowered_ops() == []
    assert prog.target.name == "cortex-m55"
    assert prog.info["calibration_samples"] == 8 and prog.info["seed"] == 0
    y = prog.run(*inputs)
    assert y.shape == (1, 5) and y.dtype == torch.float32
    with torch.no_grad():
        ref = model(*inputs)
    assert torch.nn.functional.cosine_similarity(y.flatten(), ref.flatten(), dim=0) > 0.97
    (int8,) = prog.run_int8(*inputs)
    assert int8.dtype == torch.int8 and int8.shape == (1, 5)
    out = prog.outputs[0]
    assert torch.equal((int8.float() - out.zero_point) * out.scale, y)


def _constants(prog: Program) -> list[torch.Tensor]:
    """The program's constant tensors in the order the graph reads them."""
    sig = prog.ep.graph_signature
    tables = dict(prog.ep.state_dict) | dict(prog.ep.constants)
    by_placeholder = {**sig.inputs_to_buffers, **sig.inputs_to_parameters, **sig.inputs_to_lifted_tensor_constants}
    return [tables[by_placeholder[n.name]] for n in prog.ep.graph.nodes if n.name in by_placeholder]


def _same_constants(a: Program, b: Program) -> bool:
    ca, cb = _constants(a), _constants(b)
    return len(ca) == len(cb) and all(x.dtype == y.dtype and torch.equal(x, y) for x, y in zip(ca, cb))


def test_random_calibration_is_seeded(small):
    model, inputs, prog = small
    again = corten.compile(model, inputs)
    assert _constants(prog) and _same_constants(prog, again)
    assert again.inputs == prog.inputs and again.outputs == prog.outputs
    other_seed = corten.compile(model, inputs, seed=1)
    assert not _same_constants(prog, other_seed)


def test_recompiling_gives_an_identical_program(small):
    model, inputs, prog = small
    again = corten.compile(model, inputs)
    assert list(again.ep.state_dict) == list(prog.ep.state_dict)


def test_explicit_calibration_is_used(small):
    model, inputs, prog = small
    wide = [(3 * x,) for (x,) in default_calibration(inputs, 2, seed=3)]
    calibrated = corten.compile(model, inputs, calibration=wide)
    assert calibrated.info["calibration_samples"] == 2
    assert calibrated.op_counts() == SMALL_OPS
    assert calibrated.inputs[0].scale > 2 * prog.inputs[0].scale  # the input range follows the samples
    with pytest.raises(ValueError, match="calibration is empty"):
        corten.compile(model, inputs, calibration=[])


def test_save_and_load_run_identically(small, tmp_path):
    _, inputs, prog = small
    out = prog.save(tmp_path / "prog")
    assert (out / MANIFEST).is_file() and (out / PROGRAM_FILE).is_file()
    manifest = json.loads((out / MANIFEST).read_text())
    assert manifest["op_counts"] == SMALL_OPS and manifest["target"] == "cortex-m55"
    loaded = corten.load(out)
    assert loaded.op_counts() == prog.op_counts()
    assert loaded.inputs == prog.inputs and loaded.outputs == prog.outputs
    for x in [inputs[0], torch.randn(1, 3, 8, 8)]:
        assert torch.equal(loaded.run(x), prog.run(x))
        assert torch.equal(loaded.run_int8(x)[0], prog.run_int8(x)[0])


def test_program_file_is_what_torch_export_save_writes(small, tmp_path):
    """Program.save skips the serializer's discarded canonical-form self-test (program.save_exported):
    the file is torch.export.save's, member by member (but the random serialization id)."""
    import zipfile

    from torch._export.serde import serialize

    from corten.program import save_exported

    ep = small[2].ep
    check = serialize.canonicalize
    (tmp_path / "fast").mkdir()
    (tmp_path / "torch").mkdir()
    save_exported(ep, tmp_path / "fast" / PROGRAM_FILE)  # (the archive's folder is named after the file)
    assert serialize.canonicalize is check
    torch.export.save(ep, tmp_path / "torch" / PROGRAM_FILE)
    fast, ref = (zipfile.ZipFile(tmp_path / d / PROGRAM_FILE) for d in ("fast", "torch"))
    assert fast.namelist() == ref.namelist()
    for name in ref.namelist():
        if not name.endswith("serialization_id"):
            assert fast.read(name) == ref.read(name), name


@pytest.fixture
def saved(small, tmp_path):
    return small[2].save(tmp_path / "prog")


def test_load_refuses_a_changed_program_file(saved):
    data = bytearray((saved / PROGRAM_FILE).read_bytes())
    data[len(data) // 2] ^= 0xFF
    (saved / PROGRAM_FILE).write_bytes(bytes(data))
    with pytest.raises(ValueError, match="sha256"):
        corten.load(saved)


@pytest.mark.parametrize("edit, message", [
    (lambda m: m.update(format="something-else"), "not a Corten program manifest"),
    (lambda m: m.update(format_version=99), "format version 99"),
], ids=["format", "version"])
def test_load_refuses_a_wrong_manifest(saved, edit, message):
    manifest = json.loads((saved / MANIFEST).read_text())
    edit(manifest)
    (saved / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(ValueError, match=message):
        corten.load(saved)


def test_load_refuses_a_corrupt_manifest_naming_it(saved):
    (saved / MANIFEST).write_text('{"format": "corten-program", "format_vers')
    with pytest.raises(ValueError, match=MANIFEST):
        corten.load(saved)


def test_load_of_a_directory_without_manifest_is_refused(tmp_path):
    with pytest.raises(FileNotFoundError, match="manifest.json"):
        corten.load(tmp_path)


def test_every_target_is_accepted():
    model, inputs = small_model()
    calibration = one_sample((1, 3, 8, 8))
    for name, target in TARGETS.items():
        prog = corten.compile(model, inputs, target=name, calibration=calibration)
        assert prog.target == target and prog.op_counts() == SMALL_OPS
        assert f"target {name} ({target.isa})" in prog.operator_table()


def test_unknown_target_is_refused_with_the_choices():
    model, inputs = small_model()
    with pytest.raises(ValueError, match="unknown target 'cortex-a53'.*cortex-m55"):
        corten.compile(model, inputs, target="cortex-a53")


# ----------------------------------------------------------------------------- the command line
@pytest.fixture(scope="module")
def cli_mv2(tmp_path_factory):
    out = tmp_path_factory.mktemp("cli") / "mv2"
    code = main(["compile", "mv2-0.35-96", "--out", str(out), "--calib", "2"])
    return code, out


def test_cli_compile_writes_program_report_and_graphs(cli_mv2, capsys):
    code, out = cli_mv2
    assert code == 0
    assert {p.name for p in out.iterdir()} >= {MANIFEST, PROGRAM_FILE, "report.txt", "graphs"}
    assert sorted(p.name for p in (out / "graphs").iterdir()) == sorted(STAGE_FILES.values()) == [
        "01_exported.txt", "02_bn_fused.txt", "03_quantized.txt", "04_lowered.txt"]
    graphs = {p.name: p.read_text() for p in (out / "graphs").iterdir()}
    assert "aten.batch_norm" in graphs["01_exported.txt"]
    assert "aten.batch_norm" not in graphs["02_bn_fused.txt"] and "aten.conv2d" in graphs["02_bn_fused.txt"]
    assert "quantized_decomposed.quantize_per_tensor" in graphs["03_quantized.txt"]
    assert "corten.quantized_depthwise_conv2d" in graphs["04_lowered.txt"]
    assert "aten.conv2d" not in graphs["04_lowered.txt"]
    report = (out / "report.txt").read_text()
    assert "| corten.quantized_conv2d " in report and "|    35 | lowered" in report
    assert "0 not lowered" in report and "cortex-m55" in report
    manifest = json.loads((out / MANIFEST).read_text())
    assert manifest["op_counts"]["quantized_depthwise_conv2d"] == 17
    assert manifest["info"]["calibration_samples"] == 2 and manifest["name"] == "mv2_0_35_96"


def test_cli_output_loads(cli_mv2):
    _, out = cli_mv2
    prog = corten.load(out)
    assert prog.op_counts()["quantized_add"] == 10 and not prog.unlowered_ops()
    from corten.zoo import get_model

    _, (x,) = get_model("mv2-0.35-96")
    y = prog.run(x)
    assert y.shape == (1, 1000) and torch.isfinite(y).all()


def test_cli_models_lists_the_zoo(capsys):
    assert main(["models"]) == 0
    listed = capsys.readouterr().out
    for name, entry in MODELS.items():
        assert name in listed and entry.description in listed


FACTORY = '''
import torch
from torch import nn


def make():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU6(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                          nn.Linear(4, 3))
    return model.eval(), torch.randn(1, 3, 6, 6)


def not_a_pair():
    return 42


class Cumprod(nn.Module):
    def forward(self, x):
        return torch.cumprod(x, 1)


def cumprod_model():
    return nn.Sequential(Cumprod()).eval(), (torch.randn(1, 3, 4, 4),)
'''


@pytest.fixture
def factory_file(tmp_path):
    path = tmp_path / "my_models.py"
    path.write_text(FACTORY)
    return path


def test_cli_compiles_a_factory_spec(factory_file, tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["compile", f"{factory_file}:make", "--out", str(out), "--calib", "1", "--target", "cortex-m4"]) == 0
    prog = corten.load(out)
    assert prog.name == "my_models" and prog.target.name == "cortex-m4"
    assert prog.op_counts() == {"quantize_per_tensor": 1, "quantized_conv2d": 1, "quantized_avg_pool2d": 1,
                                "quantized_linear": 1, "dequantize_per_tensor": 1}
    assert "quantized_linear" in capsys.readouterr().out


@pytest.mark.parametrize("spec, message", [
    ("resnet9000", "unknown model 'resnet9000'"),
    ("{dir}/missing.py:make", "no such file"),
    ("{file}:nothing", "has no function 'nothing'"),
    ("{file}:not_a_pair", "must return (model, example_inputs)"),
    ("{file}:cumprod_model", "aten.cumprod.default x1"),
], ids=["unknown_name", "missing_file", "missing_function", "bad_return", "unsupported_op"])
def test_cli_bad_spec_exits_2_with_a_message(factory_file, tmp_path, capsys, spec, message):
    spec = spec.format(dir=tmp_path, file=factory_file)
    assert main(["compile", spec, "--out", str(tmp_path / "out"), "--calib", "1"]) == 2
    err = capsys.readouterr().err
    assert "corten: error:" in err and message in err


def test_cli_unknown_target_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as info:
        main(["compile", "mv2-0.35-96", "--out", "unused", "--target", "cortex-a53"])
    assert info.value.code == 2
    assert "cortex-a53" in capsys.readouterr().err


def test_corten_error_is_exported():
    """``except corten.CortenError`` catches every refusal without knowing ``corten.errors``."""
    from corten import errors

    assert corten.CortenError is errors.CortenError
    for name in ("UsageError", "UnsupportedOpsError", "BudgetError", "QuantizationError"):
        assert issubclass(getattr(corten, name), corten.CortenError)
    with pytest.raises(corten.CortenError, match="target"):
        corten.compile(nn.Linear(2, 2).eval(), (torch.randn(1, 2),), target="cortex-a53")
