"""The compiled int8 program: a lowered ``ExportedProgram`` of Corten ops plus what surrounds it.

A :class:`Program` runs itself with the reference kernels (:meth:`Program.run`), plans its memory,
saves to / loads from a directory (``manifest.json`` + ``program.pt2``), and is what the memory
planner and the C generator consume.  Its reports (operator table, memory, kernel choices, flash
per weight width) are :class:`corten.program_reports.ProgramReports`, its C library (emit, run,
profile) :class:`corten.program_c.ProgramC`: two mixins of the one class, so ``prog.<method>``
is unchanged.
"""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import torch

import corten.ops  # noqa: F401  (the corten:: ops must exist to load a saved program)
from corten.errors import ProgramFileError, ProgramNotFoundError, UnsupportedOpsError, UsageError
from corten.lowering.pass_manager import UnloweredNode, unlowered_nodes
from corten.ops.registry import op_name_of
from corten.program_c import ProgramC
from corten.program_reports import ProgramReports, weight_layers, weights_report  # noqa: F401  (re-exported)
from corten.targets import Target, get_target

FORMAT_VERSION = 1
MANIFEST = "manifest.json"
PROGRAM_FILE = "program.pt2"


@dataclass(frozen=True)
class TensorSpec:
    """A program input or output: its float shape and int8 quantization."""

    shape: tuple[int, ...]
    scale: float
    zero_point: int
    bits: int = 8  # 16: an int16 edge (TFLite's 16x8 scheme, zero point 0)

    def to_json(self) -> dict:
        d = {"shape": list(self.shape), "scale": self.scale, "zero_point": self.zero_point}
        if self.bits != 8:
            d["bits"] = self.bits
        return d

    @staticmethod
    def from_json(d: dict) -> "TensorSpec":
        return TensorSpec(tuple(d["shape"]), float(d["scale"]), int(d["zero_point"]), int(d.get("bits", 8)))


def _graph_output_tree(ep: torch.export.ExportedProgram, name: str, n: int):
    """The structure the program graph itself returns (a program built without a recorded one, or
    saved by an older Corten): its ``out_spec``, else ``n`` flat tensors."""
    from corten.capture import CaptureError
    from corten.capture.outputs import OutputTree, output_tree

    try:
        return output_tree(ep.call_spec.out_spec, list(ep.graph.output_node().args[0]), name)
    except (CaptureError, AttributeError, TypeError):
        return OutputTree.flat(n)


def _edge_bits(node: torch.fx.Node) -> int:
    return int(node.args[3]) if len(node.args) > 3 else int(node.kwargs.get("bits", 8))


def _io_specs(ep: torch.export.ExportedProgram) -> tuple[list[TensorSpec], list[TensorSpec]]:
    q_op, dq_op = torch.ops.corten.quantize_per_tensor.default, torch.ops.corten.dequantize_per_tensor.default
    user_inputs = set(ep.graph_signature.user_inputs)
    inputs, outputs = [], []
    for node in ep.graph.nodes:
        if node.op == "placeholder" and node.name in user_inputs:
            qs = [u for u in node.users if u.target == q_op]
            if len(qs) == 1:
                inputs.append(TensorSpec(tuple(node.meta["val"].shape), float(qs[0].args[1]), int(qs[0].args[2]),
                                         _edge_bits(qs[0])))
            else:  # an input the program never reads: any valid quantization (its bytes are ignored)
                inputs.append(TensorSpec(tuple(node.meta["val"].shape), 1.0, 0))
    for node in ep.graph.output_node().args[0]:
        if isinstance(node, torch.fx.Node) and node.target == dq_op:
            outputs.append(TensorSpec(tuple(node.meta["val"].shape), float(node.args[1]), int(node.args[2]),
                                      _edge_bits(node)))
        else:
            outputs.append(TensorSpec(tuple(node.meta["val"].shape), 0.0, 0))
    return inputs, outputs


@dataclass
class Program(ProgramReports, ProgramC):
    ep: torch.export.ExportedProgram
    target: Target
    name: str = "model"
    stages: dict[str, str] = field(default_factory=dict)
    unlowered: list[UnloweredNode] | None = None
    info: dict[str, Any] = field(default_factory=dict)
    last_c_run: Any = None
    # what forward returns (corten.capture.outputs.OutputTree): the program computes the flat list of its
    # tensors (``outputs``); run / run_c return this structure.  None: the program graph's own structure.
    output_tree: Any = None

    def __post_init__(self) -> None:
        # input index -> (s, o): the per-feature map x / s + o applied before the quantize
        # (corten.quantizer.input_scaling; compile(..., input_scaling="per_feature"))
        self.input_scaling = {int(i): (torch.tensor(v["scales"], dtype=torch.float32),
                                       torch.tensor(v["offsets"], dtype=torch.float32))
                              for i, v in self.info.get("input_scaling", {}).items()}
        self._module = None
        self._int8_module = None
        self._memory = None
        self.inputs, self.outputs = _io_specs(self.ep)
        if self.unlowered is None:
            self.unlowered = unlowered_nodes(self.ep.graph)
        if self.output_tree is None:
            self.output_tree = _graph_output_tree(self.ep, self.name, len(self.outputs))
        if self.output_tree.num_tensors != len(self.outputs):
            raise UsageError(f"{self.name}: the output structure has {self.output_tree.num_tensors} tensor(s) "
                             f"({', '.join(self.output_tree.paths)}) but the program computes {len(self.outputs)}")

    @property
    def output_names(self) -> list[str]:
        """The C names of the outputs (``<name>_outputs`` fields, manifest): ``output0``, ``output1``, ... or,
        for outputs returned in a dict / NamedTuple, their keys' path (``logits``, ``aux_0``, ``aux_1``)."""
        from corten.codegen.context import output_field_names

        return output_field_names(self.output_tree.keys, self.output_tree.keyed)

    def structure(self, outputs: Sequence[torch.Tensor]):
        """``outputs`` (one tensor per program output, e.g. ``c_run(...).outputs``) in the structure
        forward returns (dict, NamedTuple, nested tuples; ``None`` leaves restored)."""
        return self.output_tree.unflatten(outputs)

    def _returned(self, outputs: Sequence[torch.Tensor]):
        """What :meth:`run` / :meth:`run_c` return: :meth:`structure`, except that a forward
        returning a tuple or list of one tensor gives that tensor (as always)."""
        out = self.structure(outputs)
        if type(out) in (tuple, list) and len(out) == 1 and isinstance(out[0], torch.Tensor):
            return out[0]
        return out

    # ------------------------------------------------------------------ inspection
    def op_counts(self) -> dict[str, int]:
        """Lowered op name (no namespace) -> count, in first-appearance order."""
        counts: dict[str, int] = {}
        for node in self.ep.graph.nodes:
            name = op_name_of(node.target) if node.op == "call_function" else None
            if name is not None:
                counts[name] = counts.get(name, 0) + 1
        return counts

    def unlowered_ops(self) -> list[UnloweredNode]:
        """The float compute ops left (empty when fully lowered), each with its source location."""
        return list(self.unlowered)

    def check_emittable(self) -> None:
        """:class:`LoweringError` for a lowered node the C emitter cannot write, at compile time rather
        than at emission: a reshape whose both sides are channels-last tensors (no layout copy does it;
        an int8 region's lowering makes such a reshape a strided copy)."""
        from corten.codegen.emitter import RESHAPE, emittable_reshape
        from corten.errors import LoweringError

        for node in self.ep.graph.nodes:
            if node.op == "call_function" and node.target == RESHAPE and not emittable_reshape(node):
                shapes = [list(n.meta["val"].shape) for n in (node.args[0], node)]
                where = (self.info.get("node_sources") or {}).get(node.name, {})
                at = " at ".join(v for v in (where.get("module"), where.get("source")) if v)
                raise LoweringError(f"reshape {node.name!r} {shapes[0]} -> {shapes[1]}{' (' + at + ')' if at else ''}"
                                    " moves channels-last bytes on both sides, which no layout copy does (it "
                                    "happens where int16 activations meet an int8-only op): compile that part "
                                    "int8 (precision={'<module path>': 'int8'}) or flatten to 2-D before it")

    # ------------------------------------------------------------------ running
    def module(self) -> torch.fx.GraphModule:
        if self._module is None:
            from corten.capture import remove_guards_fn

            self._module = self.ep.module()
            remove_guards_fn(self._module)
        return self._module

    def _check_inputs(self, inputs: tuple) -> None:
        if len(inputs) == 1 and isinstance(inputs[0], (tuple, list)) and len(self.inputs) != 1:
            inputs = tuple(inputs[0])  # run((x1, x2)) as well as run(x1, x2)
        if len(inputs) != len(self.inputs):
            raise UsageError(f"{self.name}: expected {len(self.inputs)} input(s), got {len(inputs)}")
        for i, (x, spec) in enumerate(zip(inputs, self.inputs)):
            if not isinstance(x, torch.Tensor) or tuple(x.shape) != spec.shape or x.dtype != torch.float32:
                got = f"{tuple(x.shape)} {x.dtype}" if isinstance(x, torch.Tensor) else type(x).__name__
                raise UsageError(f"{self.name}: input {i} must be a float32 tensor of shape {spec.shape}, got {got}")
            if bool(torch.isnan(x).any()):
                raise UsageError(f"{self.name}: input {i} holds {int(torch.isnan(x).sum())} NaN value(s); "
                                 "NaN has no int8 value: pass finite inputs (infinities saturate)")
        return inputs

    def _program_inputs(self, inputs: tuple) -> tuple:
        """The checked float inputs as the program graph takes them (per-feature scaled ones mapped)."""
        from corten.ops._qparams import scale_input

        inputs = self._check_inputs(inputs)
        return tuple(scale_input(x, *self.input_scaling[i]) if i in self.input_scaling else x
                     for i, x in enumerate(inputs))

    def run(self, *inputs: torch.Tensor):
        """Float outputs computed by the int8 program with the reference kernels, in the structure
        forward returns them (a tensor, a tuple, a dict, a NamedTuple, ...)."""
        from corten.capture.outputs import tensor_leaves

        inputs = self._program_inputs(inputs)
        with torch.no_grad():
            out = self.module()(*inputs)
        return self._returned(tensor_leaves(out))

    def int8_module(self) -> torch.fx.GraphModule:
        """A copy of the program whose outputs are the int8 tensors before each final dequantize."""
        if self._int8_module is None:
            import copy
            import warnings

            with warnings.catch_warnings():  # torch's pytree specs warn about their own deprecations when copied
                warnings.simplefilter("ignore", FutureWarning)
                gm = copy.deepcopy(self.module())
            out = gm.graph.output_node()
            dq = torch.ops.corten.dequantize_per_tensor.default
            new = [a.args[0] if isinstance(a, torch.fx.Node) and a.target == dq else a for a in out.args[0]]
            out.args = (tuple(new),)
            gm.graph.eliminate_dead_code()
            gm.recompile()
            self._int8_module = gm
        return self._int8_module

    def run_int8(self, *inputs: torch.Tensor) -> list[torch.Tensor]:
        """The int8 output tensors (NHWC bytes for 4-D) the C library must reproduce byte for byte: a
        flat list in output order (``output_names``; :meth:`structure` gives forward's structure)."""
        inputs = self._program_inputs(inputs)
        with torch.no_grad():
            out = self.int8_module()(*inputs)
        return list(torch.utils._pytree.tree_leaves(out))  # (a dict or nested outputs: in output order)

    def quantize_inputs(self, *inputs: torch.Tensor) -> list[torch.Tensor]:
        """The int8 program inputs, as the program's quantize computes them."""
        inputs = self._program_inputs(inputs)
        return [torch.ops.corten.quantize_per_tensor(x, s.scale, s.zero_point, s.bits)
                for x, s in zip(inputs, self.inputs)]

    def compare(self, model: torch.nn.Module, samples, threshold_db: float | None = None):
        """Per-layer int8 error against the float ``model`` on ``samples`` (input tuples): one row
        per quantized tensor (see :mod:`corten.compare`); ``threshold_db`` also warns about the
        layers whose accumulated SQNR falls below it."""
        from corten.compare import compare

        if not isinstance(model, torch.nn.Module):
            raise UsageError(f"compare(model, ...): model must be the float torch.nn.Module this program was "
                             f"compiled from, got {type(model).__name__}")
        if isinstance(samples, torch.Tensor) or not hasattr(samples, "__iter__"):
            raise UsageError(f"compare(model, samples): samples must be a list of input tuples (or of tensors for a "
                             f"one-input model), got {type(samples).__name__}")
        checked = []
        for k, sample in enumerate(samples):
            try:
                checked.append(self._check_inputs(tuple(sample) if isinstance(sample, (tuple, list)) else (sample,)))
            except UsageError as e:
                raise UsageError(f"compare: sample {k}: {e}") from None
        return compare(self, model, checked, threshold_db)

    # ------------------------------------------------------------------ memory and C
    def deployment(self, kernels=None, target: str | None = None, *, deployment=None,
                   default_kernels="cmsis-nn") -> "Deployment":
        """The :class:`corten.deployment.Deployment` the conveniences stand for: ``deployment`` if
        given (``kernels`` / ``target`` then override its providers / core), else the program's target
        (or ``target``) with ``kernels`` (a provider name or chain; ``default_kernels`` without)."""
        from corten.deployment import Deployment

        if deployment is not None:
            d = Deployment.coerce(deployment, kernels)
            return d.with_target(target) if target is not None and target != d.core else d
        # the memory regions and weights sections of corten.compile(memory=, weights_section=)
        return Deployment.of(self.target if target is None else get_target(target),
                             default_kernels if kernels is None else kernels, memory=self.info.get("memory"),
                             weights_section=self.info.get("weights_section"))

    def with_memory(self, memory=None, weights_section=None) -> "Program":
        """This program for another memory map: the arena's regions (``memory=``, see
        :func:`corten.deployment.parse_memory`; None: one arena) and the weights' linker sections
        (:func:`corten.deployment.parse_weights_section`).  The same graph; new plans and C."""
        from corten.deployment import parse_memory, parse_weights_section

        info = dict(self.info)
        info.pop("memory", None)
        info.pop("weights_section", None)
        regions = parse_memory(memory)
        if regions:
            info["memory"] = [r.to_json() for r in regions]
        if weights_section is not None:
            info["weights_section"] = dict(parse_weights_section(weights_section))
        return Program(self.ep, self.target, name=self.name, stages=dict(self.stages), unlowered=self.unlowered,
                       info=info, output_tree=self.output_tree)

    @property
    def memory(self):
        """The static memory plan for the program's target with CMSIS-NN kernels (their scratch
        included; ``memory.kernels`` says so); :meth:`memory_for` gives the portable one."""
        return self.memory_for("cmsis-nn")

    def memory_for(self, kernels=None, target: str | None = None, *, deployment=None):
        """The memory plan of the C library for a deployment (:meth:`deployment`: ``kernels`` -
        "portable" has no CMSIS-NN scratch - and the program's target, or ``target``); its
        ``constant_bytes`` are the bytes of the constant arrays that library defines (the program's
        constant tensors, or with a provider of ``own_constant_layouts`` the arrays it writes)."""
        from corten.codegen.emitter import library_constant_bytes
        from corten.memory import plan_memory

        self._require_lowered("plan memory")
        d = self.deployment(kernels, target, deployment=deployment)
        if not isinstance(self._memory, dict):
            self._memory = {}
        if d.key not in self._memory:
            schedule = self.schedule
            banded = schedule is not None and bool(schedule.segments)
            plan = plan_memory(self.ep, d, in_place_cats=banded)
            plan.schedule = schedule
            # the flash is what the deployment's library stores: a provider's own weight layouts count
            if any(p.own_constant_layouts for p in d.providers):
                plan.constant_bytes = library_constant_bytes(self.ep, plan, d)
            self._memory[d.key] = plan
        return self._memory[d.key]

    @property
    def schedule(self):
        """The banded schedule this program runs (:mod:`corten.memory.banding`), or None."""
        from corten.memory.banding import Schedule

        d = self.info.get("schedule")
        return Schedule.from_json(d) if d else None

    def fit_budget(self, max_arena: int | None = None, max_flash: int | None = None, kernels=None, *,
                   deployment=None) -> "Program":
        """This program (or its banded copy, :meth:`fit_arena`) within ``max_arena`` bytes of arena and
        ``max_flash`` bytes of constants (default: the deployment's budgets), else :class:`BudgetError`."""
        from corten.memory import check_budget

        d = self.deployment(kernels, deployment=deployment)
        max_arena = d.max_arena if max_arena is None else max_arena
        max_flash = d.max_flash if max_flash is None else max_flash
        check_budget(self.memory_for(deployment=d), None, max_flash)  # no schedule changes the weights
        return self.fit_arena(int(max_arena), deployment=d) if max_arena is not None else self

    def fit_arena(self, max_arena: int, kernels=None, *, deployment=None) -> "Program":
        """This program, or a banded copy of it, whose arena (for the deployment's kernels) is at most
        ``max_arena`` bytes with the fewest recomputed MACs (:func:`corten.memory.banding.fit`);
        :class:`BudgetError` names the smallest arena found when none fits."""
        from corten.memory import plan_memory
        from corten.memory.banding import fit

        self._require_lowered("plan memory")
        d = self.deployment(kernels, deployment=deployment)
        ep, schedule, plan = fit(self.ep, int(max_arena),
                                 lambda e, banded: plan_memory(e, d, in_place_cats=banded),
                                 d.core, None if self.schedule else self.memory_for(deployment=d))
        if not schedule.segments and not schedule.reordered:
            return self
        origins = schedule.origins
        sources = self.info.get("node_sources") or {}
        info = {**self.info, "schedule": schedule.to_json(),
                "node_sources": {new: sources[old] for new, old in origins.items() if old in sources}}
        prog = Program(ep, self.target, name=self.name, stages=dict(self.stages), unlowered=[], info=info,
                       output_tree=self.output_tree)
        plan.schedule = prog.schedule
        prog._memory = {d.key: plan}  # the plan the search checked
        return prog

    def _require_lowered(self, what: str) -> None:
        if self.unlowered:
            raise UnsupportedOpsError(self.name, self.unlowered)

    # ------------------------------------------------------------------ persistence
    def manifest(self) -> dict:
        return {
            "format": "corten-program",
            "format_version": FORMAT_VERSION,
            "corten_version": __import__("corten").__version__,
            "torch_version": torch.__version__,
            "name": self.name,
            "target": self.target.name,
            "inputs": [s.to_json() for s in self.inputs],
            "outputs": [{**s.to_json(), "name": name, "path": path}
                        for s, name, path in zip(self.outputs, self.output_names, self.output_tree.paths)],
            "output_tree": self.output_tree.to_json(),
            "op_counts": self.op_counts(),
            "unlowered": [str(n) for n in self.unlowered],
            "info": self.info,
            "program_file": PROGRAM_FILE,
        }

    def save(self, path: str | Path, *, force: bool = False) -> Path:
        """Write ``manifest.json`` and ``program.pt2`` (constants inside) as directory ``path``.

        The files are written into a temporary directory beside ``path`` that replaces ``path``
        only once complete.  ``path`` may be new, empty, or hold this program (same name) from an
        earlier save; another program or other files there are replaced only with ``force=True``.
        A program a fresh process could not load (ops outside the aten/corten/quantized_decomposed
        namespaces) is refused with the reason."""
        from corten.outdir import staged_dir

        self._check_saveable()
        with staged_dir(path, self.name, force) as tmp:
            self.write_files(tmp)
        return Path(path)

    def write_files(self, d: Path) -> None:
        """``program.pt2`` and ``manifest.json`` into the existing directory ``d`` (no staging)."""
        d = Path(d)
        save_exported(self.ep, d / PROGRAM_FILE)
        man = self.manifest()
        man["program_sha256"] = hashlib.sha256((d / PROGRAM_FILE).read_bytes()).hexdigest()
        (d / MANIFEST).write_text(json.dumps(man, indent=2, sort_keys=True) + "\n", encoding="utf-8")

    def _check_saveable(self) -> None:
        for node in self.ep.graph.nodes:
            if node.op != "call_function":
                continue
            ns = getattr(node.target, "namespace", None)
            if ns is not None and ns not in LOADABLE_NAMESPACES:
                raise ProgramFileError(
                    f"{self.name}: node {node.name!r} calls {ns}::{getattr(node.target, '__name__', node.target)}, "
                    f"an op a fresh process cannot load (only {', '.join(sorted(LOADABLE_NAMESPACES))} ops are); "
                    "the program cannot be saved: lower or remove that op")


LOADABLE_NAMESPACES = frozenset({"aten", "corten", "quantized_decomposed"})


def save_exported(ep: torch.export.ExportedProgram, path: Path) -> None:
    """``torch.export.save(ep, path)``, the same file byte for byte, without the serializer's
    self-test: ``ExportedProgramSerializer.serialize`` calls ``canonicalize`` on the serialized
    program only to check that its canonical form is well defined and drops the result, after a
    deep copy of the whole serialized program (~0.15 s of MobileNetV2's ~0.3 s save).  The check is
    skipped for this call only (``tests/test_compile_api.py`` checks the file is unchanged)."""
    from torch._export.serde import serialize

    check = serialize.canonicalize
    serialize.canonicalize = _skip_canonical_form_check
    try:
        torch.export.save(ep, path)
    finally:
        serialize.canonicalize = check


def _skip_canonical_form_check(ep, constants=None):
    return ep


def _register_loadable_namespaces() -> None:
    """``quantized_decomposed`` ops (left in a partly lowered program) exist only once imported."""
    from torch.ao.quantization.fx._decomposed import quantized_decomposed_lib  # noqa: F401


def _manifest_error(path: Path, problem: str):
    return ProgramFileError(f"{path}: {problem}; recompile the model or re-save the program")


def _check_spec_list(man_path: Path, man: dict, key: str) -> None:
    specs = man[key]
    if not isinstance(specs, list) or not specs:
        raise _manifest_error(man_path, f"'{key}' must be a non-empty list of tensor specs, got {specs!r:.80}")
    for i, d in enumerate(specs):
        ok = (isinstance(d, dict) and isinstance(d.get("shape"), list) and d["shape"]
              and all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in d["shape"])
              and isinstance(d.get("scale"), (int, float)) and not isinstance(d.get("scale"), bool)
              and isinstance(d.get("zero_point"), int) and not isinstance(d.get("zero_point"), bool))
        if not ok:
            raise _manifest_error(man_path, f"{key}[{i}] must be {{'shape': [positive ints], 'scale': number, "
                                            f"'zero_point': int}}, got {d!r:.120}")


def check_program_name(name: object) -> str:
    """``name`` if it can name the program's C library (``<name>.h``, ``<name>_run``), else a UsageError."""
    from corten.codegen.context import library_name_problem

    problem = library_name_problem(name)
    if problem is not None:
        raise UsageError(problem.replace("library name", "program name", 1) + " (it names the C library's files "
                         "and symbols)")
    return name


def read_manifest(path: str | Path) -> tuple[Path, dict]:
    """``(manifest path, manifest dict)`` of a saved program, every field checked (type and value):
    every problem is a :class:`ProgramFileError` (or :class:`ProgramNotFoundError`) naming the file."""
    if not isinstance(path, (str, os.PathLike)) or not str(path):
        raise UsageError(f"a saved program is a directory path (str or pathlib.Path), got {path!r}")
    p = Path(path)
    man_path = p / MANIFEST if p.is_dir() else p
    if not man_path.exists():
        raise ProgramNotFoundError(f"{p}: no {MANIFEST} here; expected a directory written by Program.save "
                                "or `corten compile --out DIR`")
    try:
        text = man_path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as e:
        raise _manifest_error(man_path, f"not a valid Corten manifest (not UTF-8 text: byte {e.start})") from None
    except OSError as e:
        raise ProgramFileError(f"{man_path}: cannot read it ({e.strerror or e})") from None
    try:
        man = json.loads(text)
    except json.JSONDecodeError as e:
        raise ProgramFileError(f"{man_path}: not a valid Corten manifest (JSON error: {e}); recompile or "
                               "re-save the program") from None
    if not isinstance(man, dict) or man.get("format") != "corten-program":
        raise ProgramFileError(f"{man_path}: not a Corten program manifest (no \"format\": \"corten-program\")")
    if man.get("format_version") != FORMAT_VERSION:
        raise ProgramFileError(f"{man_path}: format version {man.get('format_version')} is not {FORMAT_VERSION}; "
                               "recompile the model with this Corten")
    for key, types in (("name", str), ("target", str), ("inputs", list), ("outputs", list)):
        if key not in man:
            raise _manifest_error(man_path, f"the manifest has no '{key}' entry")
        if not isinstance(man[key], types):
            raise _manifest_error(man_path, f"'{key}' must be a {types.__name__}, got {type(man[key]).__name__}")
    for key, types in (("program_file", str), ("program_sha256", str), ("info", dict)):
        if key in man and not isinstance(man[key], types):
            raise _manifest_error(man_path, f"'{key}' must be a {types.__name__}, got {type(man[key]).__name__}")
    if not man["name"].isidentifier():
        raise _manifest_error(man_path, f"'name' {man['name']!r} is not a C identifier")
    pf = man.get("program_file", PROGRAM_FILE)
    if Path(pf).name != pf or pf in ("", ".", ".."):
        raise _manifest_error(man_path, f"'program_file' {pf!r} must be a file name in the program directory")
    _check_spec_list(man_path, man, "inputs")
    _check_spec_list(man_path, man, "outputs")
    if "output_tree" in man:  # (older manifests have none: the program file's own structure)
        from corten.capture.outputs import OutputTree

        try:
            tree = OutputTree.from_json(man["output_tree"])
        except ValueError as e:
            raise _manifest_error(man_path, f"'output_tree' is malformed ({e})") from None
        if tree.num_tensors != len(man["outputs"]):
            raise _manifest_error(man_path, f"'output_tree' has {tree.num_tensors} tensor leaves but 'outputs' "
                                            f"lists {len(man['outputs'])}")
    try:
        get_target(man["target"])
    except ValueError as e:
        raise _manifest_error(man_path, f"'target': {e}") from None
    return man_path, man


def load(path: str | Path) -> Program:
    """Load a program saved by :meth:`Program.save` or by ``corten compile ... --out DIR``."""
    man_path, man = read_manifest(path)
    prog_file = man_path.parent / man.get("program_file", PROGRAM_FILE)
    if not prog_file.is_file():
        raise _manifest_error(prog_file, "missing (the manifest names it as the program file)")
    data = prog_file.read_bytes()
    if man.get("program_sha256") and hashlib.sha256(data).hexdigest() != man["program_sha256"]:
        raise _manifest_error(prog_file, "contents do not match the manifest's sha256 (file changed or corrupt)")
    _register_loadable_namespaces()
    try:
        ep = torch.export.load(prog_file)
    except Exception as e:  # noqa: BLE001 - torch raises RuntimeError, KeyError, zipfile errors...
        raise _manifest_error(prog_file, f"torch.export.load cannot read it ({type(e).__name__}: "
                                         f"{str(e).strip().splitlines()[0] if str(e).strip() else ''})") from None
    tree = None
    if "output_tree" in man:
        from corten.capture.outputs import OutputTree

        tree = OutputTree.from_json(man["output_tree"])
    want_n, got_n = len(man["outputs"]), sum(1 for a in ep.graph.output_node().args[0] if isinstance(a, torch.fx.Node))
    if want_n != got_n:
        raise _manifest_error(man_path, f"it lists {want_n} output(s) but {prog_file.name} computes {got_n}")
    prog = Program(ep, get_target(man["target"]), name=man["name"], info=man.get("info", {}), output_tree=tree)
    want = [tuple(d["shape"]) for d in man["inputs"]], [tuple(d["shape"]) for d in man["outputs"]]
    got = [s.shape for s in prog.inputs], [s.shape for s in prog.outputs]
    if want != got:
        raise _manifest_error(man_path, f"its input/output shapes {want} do not match {prog_file.name}'s {got}")
    return prog
