"""The layering of docs/architecture.md, checked on the source: import directions (parsed with ast,
function-local imports included), one definition of shared tables and constants, typed hooks and
one error hierarchy."""
from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
import re
from pathlib import Path

import pytest

import corten
from corten.errors import CortenError

SRC = Path(corten.__file__).resolve().parent

# Allowed import directions between the units of src/corten (docs/architecture.md, "Layers").  A unit
# is a top-level module or package of corten; ops/ is split into its infrastructure (registry,
# checks and the underscore modules: the rule API and shared helpers) and its family modules.
# ``errors``, ``_quiet`` (silencing torchao's import-time log lines) and ``fx_nodes`` (arguments by
# schema name, get_attr targets) import nothing from Corten and every unit may import them.
BOTTOM = {"errors", "_quiet", "fx_nodes"}
ALLOWED: dict[str, set[str]] = {
    "errors": set(),
    "_quiet": set(),
    "fx_nodes": set(),
    "fixed_point": {"errors"},
    "targets": {"errors"},
    "providers": {"errors", "targets"},  # the kernel-provider API: below the families that register kernels
    "deployment": {"errors", "targets", "providers"},  # core + providers + board + budgets
    "ops.infra": {"errors", "fixed_point", "targets", "providers"},
    "ops.family": {"errors", "fixed_point", "targets", "ops.infra", "providers"},
    "ops": {"errors", "ops.infra", "ops.family"},  # the package: imports every family
    "capture": {"errors"},
    "validation": {"errors", "fixed_point", "ops.infra"},
    "outdir": {"errors"},
    "aten_passes": {"errors", "capture"},
    "quantizer": {"errors", "fixed_point", "targets", "ops", "ops.infra", "capture", "aten_passes"},
    "lowering": {"errors", "fixed_point", "ops", "ops.infra", "validation"},
    "memory": {"errors", "targets", "ops", "ops.infra", "providers", "deployment"},
    "codegen": {"errors", "targets", "fixed_point", "ops", "ops.infra", "memory", "providers", "deployment"},
    "runners": {"errors", "targets", "codegen", "memory", "providers", "deployment"},
    "compare": {"errors", "ops", "ops.infra", "capture", "aten_passes"},
    "program": {"errors", "targets", "ops", "ops.infra", "capture", "lowering", "memory", "codegen", "runners",
                "outdir", "compare", "providers", "deployment", "program_reports", "program_c"},
    # the Program's reports and its C library (mixins of corten.program.Program)
    "program_reports": {"errors", "ops", "ops.infra", "lowering", "codegen"},
    "program_c": {"errors", "codegen", "runners"},
    "zoo": {"errors"},
    # model files: TFLite -> a Program of Corten ops (a family's TFLite preparation math, e.g. softmax_params);
    # ONNX -> a torch module for the compiler (called from corten/__init__ and the CLI)
    "frontends": {"errors", "fixed_point", "targets", "ops", "ops.infra", "ops.family", "program"},
    "compiler": {"errors", "targets", "ops", "ops.infra", "capture", "aten_passes", "quantizer", "lowering",
                 "program", "validation", "compare", "deployment"},
    "testing": {"errors", "targets", "ops", "ops.infra", "capture", "aten_passes", "quantizer", "lowering",
                "program", "compiler", "memory", "codegen", "runners", "validation", "providers", "deployment"},
}
# The front ends may import anything but the test helpers.
TOP = {"corten", "cli", "demo"}


def _module_name(path: Path) -> str:
    parts = ("corten",) + path.relative_to(SRC).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _unit(module: str) -> str:
    parts = module.split(".")
    if len(parts) == 1:
        return "corten"
    if parts[1] != "ops":
        return parts[1]
    if len(parts) == 2:
        return "ops"
    return "ops.infra" if parts[2] in ("registry", "checks") or parts[2].startswith("_") else "ops.family"


def _imports(path: Path) -> list[tuple[int, str]]:
    """(line, imported corten module) for every import in ``path``, at any depth."""
    module = _module_name(path)
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                pkg = package.split(".")
                pkg = pkg[: len(pkg) - (node.level - 1)]
                base = ".".join(pkg + ([node.module] if node.module else []))
            for a in node.names:  # ``from corten.ops import checks`` imports the submodule
                sub = f"{base}.{a.name}"
                is_module = (SRC.parent / Path(*sub.split("."))).with_suffix(".py").exists() or \
                    (SRC.parent / Path(*sub.split("."))).is_dir()
                out.append((node.lineno, sub if is_module else base))
    return [(line, m) for line, m in out if m == "corten" or m.startswith("corten.")]


def test_imports_follow_the_documented_layers():
    bad = []
    for path in sorted(SRC.rglob("*.py")):
        src_unit = _unit(_module_name(path))
        if src_unit in TOP:
            if any(_unit(m) == "testing" for _, m in _imports(path)):
                bad.append(f"{path.relative_to(SRC)}: the front ends do not import corten.testing")
            continue
        if src_unit not in ALLOWED:
            bad.append(f"{path.relative_to(SRC)}: unit {src_unit!r} has no place in the layers: add it to ALLOWED "
                       "here and to docs/architecture.md")
            continue
        for line, m in _imports(path):
            dst_unit = _unit(m)
            if dst_unit != src_unit and dst_unit not in ALLOWED[src_unit] | BOTTOM:
                bad.append(f"{path.relative_to(SRC)}:{line}: {src_unit} imports {m} ({dst_unit})")
            if src_unit == dst_unit == "ops.family" and m != _module_name(path):
                bad.append(f"{path.relative_to(SRC)}:{line}: op family imports another family ({m}); "
                           "move the shared helper to corten/ops/_common.py")
    assert not bad, "import directions broken (docs/architecture.md, 'Layers'):\n" + "\n".join(bad)


def test_the_checker_sees_violations(tmp_path):
    """The parser resolves the forms the families use (absolute, ``from corten.ops import x``)."""
    conv = SRC / "ops" / "conv.py"
    assert any(m == "corten.ops.checks" for _, m in _imports(conv))
    assert _unit("corten.ops.mul") == "ops.family" and _unit("corten.ops._common") == "ops.infra"
    assert "lowering" not in ALLOWED["ops.family"] and "ops.family" not in ALLOWED["ops.family"]


def test_op_modules_import_at_the_top():
    hits = [f"{p.relative_to(SRC)}:{i}" for p in sorted((SRC / "ops").glob("*.py"))
            for i, line in enumerate(p.read_text().splitlines(), 1) if "noqa: E402" in line]
    assert not hits, hits


def _definitions(pattern: str) -> list[str]:
    rx = re.compile(pattern, re.MULTILINE)
    return [str(p.relative_to(SRC)) for p in sorted(SRC.rglob("*.py")) if rx.search(p.read_text())]


def test_shared_constants_and_tables_are_defined_once():
    assert _definitions(r"^INT8_MIN\b.*=") == ["fixed_point.py"]
    assert _definitions(r"^INT8_MAX\b.*=|INT8_MIN, INT8_MAX = ") == ["fixed_point.py"]
    assert _definitions(r"^def _?layout(_of)?\(") == ["ops/_common.py"]
    assert _definitions(r"^def _?storage_(dim_)?order\(rank") == ["ops/_common.py"]
    assert _definitions(r"^def _?output_format\(") == ["ops/_common.py"]
    assert _definitions(r"^(ACTIVATIONS|ACTIVATION_OPS)\s*=") == ["ops/_rules.py"]
    from corten.ops import _rules
    from corten.quantizer import quantizer

    assert quantizer.ACTIVATIONS is _rules.ACTIVATIONS  # the quantizer fuses what the lowering folds


MISSPELLED_HOOK = '''
from corten.ops.registry import OpFamily

family = OpFamily("typo_family", ("typo_op",))


@family.provides("in_place_input", "typo_op")  # the hook is "in_place_inputs"
def _hook(node):
    return (0,)
'''


def test_a_misspelled_hook_kind_fails_at_import(tmp_path, monkeypatch):
    (tmp_path / "typo_family_module.py").write_text(MISSPELLED_HOOK)
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ValueError, match="unknown hook kind 'in_place_input'.*'in_place_inputs'"):
        importlib.import_module("typo_family_module")


def test_hooks_are_typed_and_every_family_uses_known_kinds():
    import corten.ops  # noqa: F401
    from corten.ops.registry import Hook, OpFamily, families

    fam = OpFamily("probe", ("a", "b"))
    with pytest.raises(ValueError, match="has no op 'c'"):
        fam.provides(Hook.IN_PLACE_INPUTS, "c")
    fam.provides("in_place_inputs", "a")(len)
    assert (fam.hook(Hook.IN_PLACE_INPUTS, "a") is len and fam.hook("in_place_inputs", "a") is len
            and fam.hook("in_place_inputs", "b") is None)
    with pytest.raises(ValueError, match="two 'in_place_inputs' hooks"):
        fam.provides(Hook.IN_PLACE_INPUTS, "a")(len)
    for f in families().values():
        assert all(isinstance(kind, Hook) and name in f.ops for kind, name in f.hooks)


def _corten_modules():
    for info in pkgutil.walk_packages([str(SRC)], "corten."):
        if info.name.startswith(("corten.demo", "corten.testing")):
            continue
        yield importlib.import_module(info.name)


def test_every_error_class_is_a_corten_error():
    classes = {cls for mod in _corten_modules() for _, cls in inspect.getmembers(mod, inspect.isclass)
               if issubclass(cls, Exception) and not issubclass(cls, Warning) and cls.__module__.startswith("corten.")}
    assert len(classes) >= 15
    assert all(issubclass(cls, CortenError) for cls in classes), [c for c in classes if not issubclass(c, CortenError)]


def test_cli_shows_corten_errors_as_messages_and_bugs_with_tracebacks(monkeypatch, capsys):
    from corten import cli
    from corten.errors import LoweringError

    def user_error(args):
        raise LoweringError("conv2d [conv] at m.py:3: padding mode 'circular' is not supported")

    def bug(args):
        raise KeyError("internal")

    monkeypatch.setattr(cli, "cmd_models", user_error)
    assert cli.main(["models"]) == 2
    assert capsys.readouterr().err == "corten: error: conv2d [conv] at m.py:3: padding mode 'circular' is not supported\n"
    monkeypatch.setattr(cli, "cmd_models", bug)
    with pytest.raises(KeyError):
        cli.main(["models"])


def test_program_py_is_the_program_alone():
    """One module named program.py (corten.program, the Program): the memory planner's reading of a
    program is memory/tensors.py, the C runner is runners/program_runner.py."""
    named = sorted(str(p.relative_to(SRC)) for p in SRC.rglob("program.py"))
    assert named == ["program.py"], named
    assert importlib.import_module("corten.memory.tensors").analyse
    assert importlib.import_module("corten.runners.program_runner").ProgramRunner


def _magic_numbers() -> dict[float, set[str]]:
    """Numeric literals of magnitude >= 1000 that are not round (a power of ten, two, or two minus
    one: sizes, masks, Q-format scales), by value -> the modules writing them."""
    def round_number(v: float) -> bool:
        return v.is_integer() and (float(v) in {10.0**k for k in range(3, 25)}
                                   or (int(v) & (int(v) - 1)) == 0 or (int(v) & (int(v) + 1)) == 0)
    seen: dict[float, set[str]] = {}
    for path in sorted(SRC.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Constant) and type(node.value) in (int, float):
                v = abs(float(node.value))
                if v >= 1000 and not round_number(v):
                    seen.setdefault(v, set()).add(str(path.relative_to(SRC)))
    return seen


def test_each_numeric_constant_is_written_in_one_module():
    """A limit such as the int32 accumulator's 65,792 taps is defined once and imported (it was written
    in five places): a non-round literal may repeat within its module, never across modules."""
    repeated = {v: sorted(m) for v, m in _magic_numbers().items() if len(m) > 1}
    assert not repeated, f"numeric literals written in several modules (name them once and import): {repeated}"
    assert _magic_numbers()[65792.0] == {"fixed_point.py"}


def test_the_architecture_document_names_every_unit_and_hook():
    """docs/architecture.md's layer table lists every unit of ALLOWED (a new package gets a row there and
    here), and its hook table every registry.Hook."""
    from corten.ops.registry import Hook

    doc = (SRC.parent.parent / "docs" / "architecture.md").read_text()
    layers = doc.split("## Layers", 1)[1].split("```", 2)[1]
    named = set(re.findall(r"[a-z_]+", layers))
    missing = [u for u in ALLOWED if u not in ("ops.infra", "ops.family") and u not in named]
    assert not missing, f"units missing from docs/architecture.md's layer table: {missing}"
    assert not [h.name for h in Hook if f"`{h.name}`" not in doc], "hooks missing from docs/architecture.md"
