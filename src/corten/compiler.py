"""``corten.compile``: nn.Module + example inputs -> a fully lowered int8 :class:`~corten.program.Program`.

    capture (torch.export) -> ATen passes (inside the quantizer's transform_for_annotation)
    -> prepare_pt2e + calibration + convert_pt2e -> shape propagation -> CortenPassManager -> export

as the stages of :class:`Pipeline`, which :func:`compile` runs in order and
:class:`corten.testing.Tester` drives one by one.
"""
from __future__ import annotations

import copy
import operator
import sys
import time
import warnings
from typing import Any, Callable, Iterable

import torch

from corten.capture import capture, remove_guards_fn
from corten.capture.outputs import OutputTree, flatten_outputs, output_tree, tensor_leaves
from corten.errors import UnsupportedOpsError, UsageError
from corten.fx_nodes import get_attr, node_arg
from corten.lowering import CortenPassManager, unlowered_nodes
from corten.program import Program, check_program_name
from corten.compare import record_provenance
from corten.quantizer import CortenQuantizer
from corten.quantizer.calibration import default_calibration  # noqa: F401  (re-exported: tests, CLI)
from corten.quantizer.calibration import calibration_batches, input_range_warnings
from corten.quantizer.calibration import warn as warn_quantization
from corten.quantizer.observers import observer_class, range_search_once
from corten.quantizer.qat import convert_qat, is_qat_module
from corten.quantizer.rounding import adaptive_rounding, float_weights, rounding_summary
from corten.targets import get_target

# the program outputs that are not float: argmax/argmin indices (int32 in the C library, ops/reduce.py)
# and comparison results (bool: uint8_t 0/1 in the C library, ops/compare.py)
INDEX_OUTPUT_OPS = (torch.ops.aten.argmax.default, torch.ops.aten.argmin.default,
                    torch.ops.corten.max_pool2d_indices.default)


def unguarded_module(ep: torch.export.ExportedProgram) -> torch.fx.GraphModule:
    """``ep.module()`` without torch's ``_guards_fn`` input check (static shapes here)."""
    gm = ep.module()
    remove_guards_fn(gm)
    return gm


def propagate_shapes(gm: torch.fx.GraphModule, example_inputs) -> None:
    """Give every node ``meta["val"]`` (a FakeTensor) as export would, without re-exporting: the
    lowering rules read shapes from it.  (Re-exporting the converted model gives the same graph and
    costs three times as long.)

    ``convert_pt2e`` keeps the exported compute nodes, with their ``val``; only the q/dq nodes and
    the constants it added lack one.  Those are computed node by node on fake tensors, in the
    fake mode of the existing values; a graph without such values gets a whole fake run."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp

    nodes = [n for n in gm.graph.nodes if n.op != "output"]
    have = [n.meta["val"] for n in nodes if isinstance(n.meta.get("val"), torch.Tensor)]
    modes = {id(v.fake_mode): v.fake_mode for v in have if getattr(v, "fake_mode", None) is not None}
    missing = [n for n in nodes if "val" not in n.meta]
    if len(modes) != 1 or any(n.op not in ("get_attr", "call_function") for n in missing):
        FakeTensorProp(gm, FakeTensorMode(allow_non_fake_inputs=True)).propagate(*example_inputs)
        return
    (mode,) = modes.values()
    val = lambda a: a.meta["val"] if isinstance(a, torch.fx.Node) else a  # noqa: E731
    for n in missing:  # graph order: every argument is done before its user
        if n.op == "get_attr":
            n.meta["val"] = mode.from_tensor(get_attr(gm, n), static_shapes=True)
        else:
            with mode:
                n.meta["val"] = n.target(*torch.fx.node.map_aggregate(n.args, val),
                                         **torch.fx.node.map_aggregate(n.kwargs, val))


def fuse_conv_bn(gm: torch.fx.GraphModule) -> None:
    """Fold every BatchNorm that follows a convolution into it, in place: torchao's own folding
    (``_fuse_conv_bn_``, what ``prepare_pt2e`` starts with), but with one dead-code pass at the end
    instead of one per BatchNorm (each lints the whole graph: 52 of them were ~0.2 s of MobileNetV2's
    compile).  Dead-code elimination only erases nodes, so the folded graph is the same;
    ``prepare_pt2e`` then finds no BatchNorm left to fold.  A BatchNorm that normalises with batch
    statistics (``track_running_stats=False``) is spelled out first: torchao would fold it as if it had
    running statistics (or fail on the missing ones)."""
    from torchao.quantization.pt2e.utils import _fuse_conv_bn_

    from corten.aten_passes.decompose_composites import spell_out_batch_statistics

    spell_out_batch_statistics(gm)
    graph = gm.graph
    graph.eliminate_dead_code = lambda *args, **kwargs: False  # on this graph object only
    try:
        _fuse_conv_bn_(gm)
    finally:
        del graph.eliminate_dead_code
    if graph.eliminate_dead_code():
        gm.recompile()


def graph_text(gm_or_ep) -> str:
    gm = getattr(gm_or_ep, "graph_module", gm_or_ep)
    return gm.print_readable(print_output=False, include_stride=False, include_device=False)


def _clock() -> tuple[float, float]:
    """(wall, process CPU) seconds: the stage timings keep both (CPU time is what a shared
    machine does not inflate by waiting for a core)."""
    return time.perf_counter(), time.process_time()


def _progress_printer(enabled: bool | Callable[[str], None]) -> Callable[[str], None]:
    if callable(enabled):
        return enabled
    if enabled:
        return lambda msg: print(msg, file=sys.stderr, flush=True)
    return lambda msg: None


def _calibrate(prepared: torch.fx.GraphModule, samples, say: Callable[[str], None],
               float_gm: torch.fx.GraphModule, model_name: str) -> int:
    """Run the (already validated) samples, or the user's ``calibrate(model)`` callable, through the
    observers; a failure inside torch (e.g. a histogram of NaNs) is explained by the first float node
    that goes non-finite.  Returns the number of samples (0 for a callable)."""
    from corten.validation import explain_calibration_failure

    if callable(samples):
        import inspect

        from corten.validation import observed_any

        say("  calibrating with the given callable")
        where = getattr(samples, "__qualname__", type(samples).__name__)
        try:
            result = samples(prepared)
            if inspect.isgenerator(result):  # a generator function: its body runs as it is iterated
                for _ in result:
                    pass
        except Exception as exc:  # noqa: BLE001 - the user's code: say where it failed
            if type(exc).__module__.startswith("corten"):
                raise
            raise UsageError(f"the calibration callable {where}(model) raised {type(exc).__name__}: {exc}; it must "
                             "run the prepared model on calibration inputs shaped like the example inputs "
                             "(see the traceback above for where)") from exc
        if not observed_any(prepared):
            raise UsageError(f"the calibration callable {where}(model) returned without running the model: no "
                             "observer saw a value, so every int8 range would be made up; call model(x) on "
                             "calibration inputs shaped like the example inputs inside it")
        return 0
    n = len(samples)
    width = 30
    for i, sample in enumerate(samples, 1):
        try:
            prepared(*sample)
        except Exception as exc:  # noqa: BLE001 - re-raised with the tensor that caused it
            raise explain_calibration_failure(float_gm, sample, i - 1, model_name, exc) from exc
        done = int(width * i / n)
        say(f"\r  calibrating [{'#' * done}{'.' * (width - done)}] {i}/{n}" + ("\n" if i == n else ""))
    return n


def _flat_outputs(graph: torch.fx.Graph) -> list:
    out = graph.output_node().args[0]
    flat: list = []
    stack = [out]
    while stack:
        a = stack.pop(0)
        if isinstance(a, (list, tuple)):
            stack[0:0] = list(a)
        elif isinstance(a, dict):
            stack[0:0] = list(a.values())
        else:
            flat.append(a)
    return flat


def check_exported_ops(exported: torch.export.ExportedProgram, model_name: str) -> OutputTree:
    """Refuse, before quantization, what no later stage can handle: outputs that are not float
    tensors (or None leaves) in tuples, lists, dicts and NamedTuples (:class:`CaptureError` naming
    the output's path), control flow (``torch.cond``, ``while_loop``) and ops whose
    output shape depends on the data (``nonzero``, one-argument ``where``, ``masked_select``,
    ``unique``) (:class:`UnsupportedOpsError`, naming each op, its count and source line).
    Returns the outputs' structure (:class:`~corten.capture.outputs.OutputTree`)."""
    from corten.capture import CaptureError
    from corten.ops._rules import source_location
    from corten.lowering.pass_manager import UnloweredNode, op_display_name

    refused = []
    for node in exported.graph.nodes:
        if node.op != "call_function" or node.target is operator.getitem:
            continue  # (a getitem of a refused op's tuple is reported through that op)
        if isinstance(node.target, torch._ops.HigherOrderOperator):
            refused.append(UnloweredNode(node.name, op_display_name(node.target),
                                         _region_location(exported.graph_module, node),
                                         _higher_order_reason(node.target)))
            continue
        if isinstance(node.meta.get("val"), (torch.SymInt, torch.SymFloat, torch.SymBool)):
            refused.append(UnloweredNode(node.name, op_display_name(node.target), source_location(node),
                                         "it reads a tensor's value into a Python number (.item(), float(t), "
                                         "int(t), .tolist()), which the compiled program cannot do: keep it a "
                                         "tensor (e.g. x * x.max() instead of x * x.max().item())"))
            continue
        if _dynamic(node) and not any(_dynamic(a) for a in node.all_input_nodes):  # where it starts
            refused.append(UnloweredNode(node.name, op_display_name(node.target), source_location(node),
                                         "its output shape depends on the input data; Corten compiles static "
                                         "shapes only (use a fixed-size mask and multiply instead)"))
    if refused:
        raise UnsupportedOpsError(model_name, refused)
    max_indices_as_argmax(exported.graph_module)
    outs = _flat_outputs(exported.graph)
    tree = output_tree(exported.call_spec.out_spec, outs, model_name)  # containers, non-tensor leaves
    paths = iter(tree.paths)
    for i, a in enumerate(outs):
        val = a.meta.get("val") if isinstance(a, torch.fx.Node) else a
        if not isinstance(val, torch.Tensor):
            continue  # a None leaf (output_tree refused the other values)
        path = next(paths)
        if not val.dtype.is_floating_point and not (isinstance(a, torch.fx.Node) and a.op == "call_function"
                                                    and (a.target in INDEX_OUTPUT_OPS or val.dtype == torch.bool)):
            raise CaptureError(f"{model_name}.forward returns a {val.dtype} tensor as output {i} ({path}: "
                               f"{op_display_name(a.target) if a.op == 'call_function' else a.op} at "
                               f"{source_location(a)}); Corten programs return float tensors computed in int8: "
                               "return float tensors, argmax/argmin indices (int32 in C) or comparison results (bool: "
                               "uint8_t 0/1 in C) and do other index computations after the program, in the caller")
    return tree


MAX_WITH_INDICES = {torch.ops.aten.max.dim: torch.ops.aten.argmax.default,
                    torch.ops.aten.min.dim: torch.ops.aten.argmin.default,
                    torch.ops.aten.max_pool2d_with_indices.default: torch.ops.corten.max_pool2d_indices.default}


def _indices_args(src: torch.fx.Node) -> tuple:
    """The arguments of the indices-only op replacing ``src``'s (values, indices)."""
    if src.target == torch.ops.aten.max_pool2d_with_indices.default:
        two = lambda v: [int(x) for x in (list(v) * 2 if len(list(v)) == 1 else v)]  # noqa: E731
        kernel = two(src.args[1])
        stride = two(node_arg(src, "stride") or kernel)
        return (src.args[0], kernel, stride, two(node_arg(src, "padding")), two(node_arg(src, "dilation")),
                bool(node_arg(src, "ceil_mode")))
    keepdim = src.args[2] if len(src.args) > 2 else src.kwargs.get("keepdim", False)
    return (src.args[0], src.args[1], bool(keepdim))


def max_indices_as_argmax(gm: torch.fx.GraphModule) -> bool:
    """``x.max(dim)[1]`` / ``torch.max(x, 1).indices`` (``min`` alike) returned by the program is
    ``argmax(x, dim)``: the same first index of the extreme value, and the one integer output Corten
    returns (int32 in C); ``max_pool2d(x, ..., return_indices=True)[1]`` is ``corten.max_pool2d_indices``
    (int32 in C).  The values, when also used, keep their node."""
    changed = False
    outs = set(a for a in _flat_outputs(gm.graph) if isinstance(a, torch.fx.Node))
    for get in list(outs):
        src = get.args[0] if get.op == "call_function" and get.target is operator.getitem else None
        if not (isinstance(src, torch.fx.Node) and src.target in MAX_WITH_INDICES and get.args[1] == 1):
            continue
        with gm.graph.inserting_after(get):
            arg = gm.graph.call_function(MAX_WITH_INDICES[src.target], _indices_args(src))
        arg.meta.update({k: v for k, v in get.meta.items()})
        arg.meta["stack_trace"] = src.meta.get("stack_trace")
        get.replace_all_uses_with(arg)
        gm.graph.erase_node(get)
        if src.target == torch.ops.aten.max_pool2d_with_indices.default:  # the values: a plain max pool
            for values in [u for u in src.users if u.target is operator.getitem and u.args[1] == 0]:
                with gm.graph.inserting_after(values):
                    pool = gm.graph.call_function(torch.ops.aten.max_pool2d.default, _indices_args(src))
                pool.meta.update(values.meta)
                pool.meta["stack_trace"] = src.meta.get("stack_trace")
                values.replace_all_uses_with(pool)
                gm.graph.erase_node(values)
        if not src.users:
            gm.graph.erase_node(src)
        changed = True
    if changed:
        gm.graph.lint()
        gm.recompile()
    return changed


def _region_location(gm: torch.fx.GraphModule, node: torch.fx.Node) -> str:
    """Where a higher-order op's region is in the user's code: its own source line, else that of
    the first op inside its sub-graph that has one (torch.export records none for the region)."""
    from corten.ops._rules import source_location

    here = source_location(node)
    if here != "<unknown source>":
        return here
    for a in node.args:
        sub = getattr(gm, a.target, None) if isinstance(a, torch.fx.Node) and a.op == "get_attr" else None
        for n in getattr(getattr(sub, "graph", None), "nodes", ()):
            inner = _region_location(sub, n) if isinstance(n.target, torch._ops.HigherOrderOperator) else \
                source_location(n)
            if inner != "<unknown source>":
                return f"{inner} (the first op of the region)"
    return here


def _higher_order_reason(op) -> str:
    """Why a higher-order op (a region torch.export keeps as a sub-graph) is refused."""
    name = getattr(op, "__name__", str(op))
    if "autocast" in name:
        return ("a `with torch.autocast(...)` region that computes in a lower float precision (bfloat16/float16 "
                "on the CPU): Corten quantizes the float32 model itself; remove the autocast context, or disable "
                "it (enabled=False: such a region, like one for another device type, is compiled as plain float32)")
    if "grad" in name:
        return "a grad-mode region in forward: remove the `with torch.set_grad_enabled(...)` around the layers"
    if name in ("cond", "while_loop", "scan", "map_impl", "map"):
        return ("data-dependent control flow cannot be compiled to a fixed sequence of kernels (a cond on a "
                "constant and a loop whose condition reads only constants are: unrolled); compute both "
                "branches and select with arithmetic, or move the control flow outside the model")
    return (f"torch.export kept it as the higher-order op {name!r} (a sub-graph region), which Corten cannot "
            "compile: write the layers inside it as plain calls in forward")


def _dynamic(node: torch.fx.Node) -> bool:
    """True when ``node``'s output shape is symbolic (depends on the data)."""
    vals = node.meta.get("val")
    vals = vals if isinstance(vals, (list, tuple)) else [vals]
    return any(isinstance(v, torch.Tensor) and any(not isinstance(d, int) for d in v.shape) for v in vals)


def _unknown_ops(gm: torch.fx.GraphModule) -> list:
    """The float ops of a captured graph that no op family annotates, lowers or removes."""
    import corten.ops  # noqa: F401
    from corten.aten_passes import is_noop
    from corten.ops._rules import source_location
    from corten.lowering.pass_manager import UnloweredNode, op_display_name
    from corten.ops._rules import ACTIVATIONS
    from corten.ops.registry import annotation_for, lowering_rule

    out = []
    for n in gm.graph.nodes:
        if n.op != "call_function" or n.target in ACTIVATIONS or is_noop(n):
            continue
        if annotation_for(n.target) is None and lowering_rule(n.target) is None:
            out.append(UnloweredNode(n.name, op_display_name(n.target), source_location(n), ""))
    return out
def _input_names(model, n: int) -> list[str]:
    """The names of forward's first ``n`` positional inputs (``input<i>`` where it has none)."""
    import inspect

    try:
        params = [p.name for p in inspect.signature(getattr(model, "forward")).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    except (TypeError, ValueError, AttributeError):  # (not a module: refused by the capture, by name)
        params = []
    return [params[i] if i < len(params) else f"input{i}" for i in range(n)]


def _output_saturation_warnings(prepared: torch.fx.GraphModule, tree: OutputTree | None = None) -> None:
    """Warn when the qparams chosen for a program output clip values seen in calibration."""
    for i, arg in enumerate(a for a in prepared.graph.output_node().args[0] if isinstance(a, torch.fx.Node)):
        label = f"output {i}" + (f" ({tree.paths[i]})" if tree is not None and tree.keyed and i < tree.num_tensors else "")
        obs = getattr(prepared, str(arg.target), None) if arg.op == "call_module" else None
        lo_seen, hi_seen = getattr(obs, "min_val", None), getattr(obs, "max_val", None)
        if obs is None or not isinstance(lo_seen, torch.Tensor) or lo_seen.numel() != 1 or \
                not torch.isfinite(lo_seen) or not torch.isfinite(hi_seen):
            continue
        scale, zp = (float(v) for v in obs.calculate_qparams())
        qmin, qmax = int(getattr(obs, "quant_min", -128)), int(getattr(obs, "quant_max", 127))
        lo, hi = scale * (qmin - zp), scale * (qmax - zp)
        if float(hi_seen) > hi + scale / 2 or float(lo_seen) < lo - scale / 2:
            width = "int16" if qmax > 127 else "int8"
            warn_quantization(
                f"{label}: calibration saw [{float(lo_seen):.4g}, {float(hi_seen):.4g}] but its {width} range "
                f"is [{lo:.4g}, {hi:.4g}]; the program saturates this output (use observer='minmax', or "
                "calibrate longer in QAT)")


class Pipeline:
    """One compilation, stage by stage.  :func:`compile` runs every stage in order; the
    :class:`~corten.testing.Tester` drives the same stages one at a time and inspects what each
    produced (``exported``, ``prepared``, ``converted``, ``lowered``, ``program``).

    Stages, each a method returning ``self``::

        capture()     torch.export of the model (eval, static shapes, any batch)     -> exported
        prepare()     ATen passes + CortenQuantizer annotation + observers          -> prepared
        calibrate()   run the calibration samples through the observers
        convert()     convert_pt2e and shape propagation (``meta["val"]``)          -> converted
        lower()       CortenPassManager: quantized ATen ops -> Corten ops           -> lowered
        export()      the lowered graph as a Program (an ExportedProgram: saveable) -> program

    Nothing here touches global state: no RNG seeding (calibration samples come from an explicit
    ``torch.Generator``), warnings filtered only around the torchao calls that emit them.
    """

    def __init__(self, model: torch.nn.Module, example_inputs: tuple[torch.Tensor, ...],
                 target: str = "cortex-m55", calibration: Any = None, seed: int = 0, *,
                 name: str = "model", progress: bool | Callable[[str], None] = False,
                 observer: str = "histogram", precision="int8", input_ranges=None,
                 input_scaling: str = "per_tensor", weights="int8", rounding: str = "nearest") -> None:
        from corten.quantizer.input_scaling import check_mode
        from corten.quantizer.observers import check_input_ranges
        from corten.quantizer.quantizer import check_precision, check_weights
        from corten.quantizer.rounding import check_rounding
        from corten.validation import as_input_tuple, check_example_inputs, check_samples

        self.precision = check_precision(precision)  # refused before anything runs
        self.weights = check_weights(weights)
        self.rounding = check_rounding(rounding)

        self.model = model
        self.model_name = type(model).__name__
        self.example_inputs = as_input_tuple(example_inputs)
        check_example_inputs(self.example_inputs)
        self.target = get_target(target)
        # input index -> (lo, hi) the user declared: that input is quantized to it, not calibrated
        self.input_ranges = check_input_ranges(input_ranges, _input_names(model, len(self.example_inputs)))
        # calibration in the forms users have it (tensor, DataLoader, tuples, callable); every sample
        # checked against the example inputs before anything runs
        self.calibration = None if calibration is None else calibration_batches(calibration, self.example_inputs)
        if self.calibration is not None and not callable(self.calibration):
            self.calibration = check_samples(self.calibration, self.example_inputs, declared=self.input_ranges)
            if input_scaling == "per_tensor":  # (per-feature scaling is the cure for what this warns about)
                input_range_warnings(self.calibration, [f"input {i}" for i in range(len(self.example_inputs))])
        # input index -> (s, o): the per-feature map x / s + o before the quantize (made in prepare)
        self.input_scaling_mode = check_mode(input_scaling)
        self.input_scaling: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        if self.input_scaling_mode == "per_feature" and (self.calibration is None or callable(self.calibration)):
            raise UsageError("input_scaling='per_feature' takes each feature's range from the calibration samples: "
                             "pass calibration= (a list of samples, a tensor or a DataLoader; ~64 real samples)")
        observer_class(observer)  # an unknown name is refused before anything runs
        self.observer = observer
        if isinstance(seed, bool) or not isinstance(seed, int) or not -(2**63) <= seed < 2**64:
            raise UsageError(f"seed must be an int in [-2**63, 2**64), got {seed!r}")
        self.seed = seed
        self.name = check_program_name(name)
        self.say = _progress_printer(progress)
        self.graphs: dict[str, str] = {}  # stage -> graph text ("exported", "bn_fused", "quantized", "lowered")
        self.timings: dict[str, float] = {}  # stage -> wall seconds
        self.cpu_timings: dict[str, float] = {}  # stage -> this process's CPU seconds
        self.exported: torch.export.ExportedProgram | None = None
        self.float_module: torch.fx.GraphModule | None = None  # the captured graph (explains calibration failures)
        self.quantizer: CortenQuantizer | None = None
        self.prepared: torch.fx.GraphModule | None = None
        self.calibration_samples = 0
        self._calibrated = False
        self._samples: list[tuple] = []  # the calibration input tuples (kept for adaptive rounding)
        self.rounding_report: list = []  # LayerRounding per conv/linear (rounding="adaptive")
        self.converted: torch.fx.GraphModule | None = None
        self.pass_manager: CortenPassManager | None = None
        self.lowered: torch.fx.GraphModule | None = None
        self.unlowered: list = []
        self.program: Program | None = None
        self.output_tree: OutputTree | None = None  # what forward returns (capture); the program's outputs are flat

    def _timed(self, key: str, t0: tuple[float, float]) -> None:
        wall, cpu = _clock()
        self.timings[key] = self.timings.get(key, 0.0) + wall - t0[0]
        self.cpu_timings[key] = self.cpu_timings.get(key, 0.0) + cpu - t0[1]

    # ------------------------------------------------------------------ stages
    def capture(self) -> "Pipeline":
        t0 = _clock()
        self.say(f"corten: capturing {type(self.model).__name__} with torch.export")
        from corten.validation import check_exported

        self.exported = capture(self.model, self.example_inputs)
        # data-dependent shapes, control flow, non-float outputs; the outputs' structure
        self.output_tree = check_exported_ops(self.exported, self.model_name)
        check_exported(self.exported, self.model_name)
        self.graphs["exported"] = graph_text(self.exported)
        self._timed("capture", t0)
        return self

    def prepare(self) -> "Pipeline":
        from torchao.quantization.pt2e.quantize_pt2e import prepare_pt2e

        from corten.validation import check_transformed_constants

        if self.exported is None:
            self.capture()
        t0 = _clock()
        self.float_module = unguarded_module(self.exported)
        flatten_outputs(self.float_module, self.model_name)  # the program computes a flat tuple of tensors
        if self.input_scaling_mode == "per_feature":
            self._scale_inputs_per_feature()
        self.quantizer = CortenQuantizer(observer=self.observer, precision=self.precision, weights=self.weights,
                                         input_ranges=self.input_ranges)
        with _torchao_warnings():
            fuse_conv_bn(self.float_module)
            self.prepared = prepare_pt2e(self.float_module, self.quantizer)
        check_transformed_constants(self.prepared, self.model_name)
        self._range_searches: dict = {}  # each observer's range search, once (observers.range_search_once)
        self.graphs["bn_fused"] = self.quantizer.transformed_graph_text or ""
        self._timed("quantize", t0)
        return self

    def _scale_inputs_per_feature(self) -> None:
        """Fold a per-feature map ``x / s + o`` (:mod:`corten.quantizer.input_scaling`) into the linear
        layer reading each input; those inputs then take the int8 grid of scale 1, zero point 0."""
        from corten.ops._rules import source_location
        from corten.quantizer.input_scaling import SCALED_RANGE, feature_affine, fold_into_linear, linear_reading

        placeholders = [n for n in self.float_module.graph.nodes if n.op == "placeholder"]
        readers = []
        for idx, ph in enumerate(placeholders):
            lin = linear_reading(self.float_module, ph)
            if lin is None:
                readers.append(f"input {idx} ({ph.name}): read by "
                               + (", ".join(f"{u.target} at {source_location(u)}" for u in ph.users) or "nothing"))
                continue
            if idx in self.input_ranges:
                raise UsageError(f"input {idx} has both a declared range (input_ranges) and per-feature scaling; "
                                 "choose one")
            s, o = feature_affine(torch.stack([sample[idx] for sample in self.calibration]))
            fold_into_linear(self.float_module, lin, s, o)
            self.input_scaling[idx] = (s, o)
            self.input_ranges[idx] = SCALED_RANGE
        if not self.input_scaling:
            raise UsageError("input_scaling='per_feature' folds each feature's scale into the nn.Linear that reads "
                             "the input directly (features in the last dim; the input read by nothing else, the "
                             "weight by nothing else); no input is: " + "; ".join(readers))
        self.calibration = self._scaled_samples(self.calibration)

    def _scaled_samples(self, samples):
        from corten.quantizer.input_scaling import scale_input

        if not self.input_scaling:
            return samples
        return [tuple(scale_input(x, *self.input_scaling[i]) if i in self.input_scaling else x
                      for i, x in enumerate(sample)) for sample in samples]

    def calibrate(self, samples: Iterable[tuple] | None = None) -> "Pipeline":
        """Run ``samples`` (default: the pipeline's calibration, else 8 seeded random samples)
        through the observers; then check that every observer saw finite values."""
        from corten.validation import check_observers, check_samples, record_table_batches, table_saturation_warnings

        if self.prepared is None:
            self.prepare()
        t0 = _clock()
        if samples is not None:
            samples = self._scaled_samples(check_samples(samples, self.example_inputs, declared=self.input_ranges))
        elif self.calibration is not None:
            samples = self.calibration
        else:
            samples = calibration_batches(None, self.example_inputs, self.seed)  # random, with a warning
        self.say("corten: calibrating")
        if self.rounding == "adaptive":
            if callable(samples):
                raise UsageError("rounding='adaptive' needs calibration samples (a tensor, tuples or a DataLoader) "
                                 "to measure each layer's output error, not a calibrate(model) callable")
            samples = list(samples)
            self._samples += samples
        with torch.no_grad(), record_table_batches(self.prepared) as tables:
            self.calibration_samples += _calibrate(self.prepared, samples, self.say, self.float_module,
                                                   self.model_name)
        self._calibrated = True
        check_observers(self.prepared, self.model_name)
        with range_search_once(self.prepared, self._range_searches):
            table_saturation_warnings(self.prepared, self.model_name, tables.batches)
        _output_saturation_warnings(self.prepared, self.output_tree)
        self._timed("quantize", t0)
        return self

    def convert(self) -> "Pipeline":
        from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e

        if self.calibration_samples == 0 and not self._calibrated:
            self.calibrate()
        t0 = _clock()
        layer_weights = float_weights(self.prepared) if self.rounding == "adaptive" else {}
        # convert_pt2e draws from torch's global RNG: give it its own seeded stream and leave the
        # caller's generator state as it was.
        with _torchao_warnings(), torch.random.fork_rng(devices=[]), \
                range_search_once(self.prepared, self._range_searches):
            torch.manual_seed(self.seed)
            self.converted = convert_pt2e(self.prepared)
        if self.rounding == "adaptive":
            self.rounding_report = adaptive_rounding(self.converted, layer_weights, self._samples, say=self.say)
        self._timed("quantize", t0)
        t0 = _clock()
        propagate_shapes(self.converted, self.example_inputs)
        self.graphs["quantized"] = graph_text(self.converted)
        self._timed("lower", t0)
        return self

    def lower(self, keep_converted: bool = False) -> "Pipeline":
        """``keep_converted``: lower a copy, so that ``converted`` stays the quantized ATen graph
        (the Tester runs it as the fake-quantized reference); otherwise it is lowered in place."""
        if self.converted is None:
            self.convert()
        t0 = _clock()
        self.say("corten: lowering to Corten ops")
        self.pass_manager = CortenPassManager()
        if keep_converted:
            with warnings.catch_warnings():  # torch's pytree specs warn about their own deprecations when copied
                warnings.simplefilter("ignore", FutureWarning)
                gm = copy.deepcopy(self.converted)
        else:
            gm = self.converted
        self.lowered = self.pass_manager(gm)
        from corten.validation import check_lowered

        check_lowered(self.lowered, self.model_name)
        self.unlowered = unlowered_nodes(self.lowered, self.pass_manager.refusals)
        self._timed("lower", t0)
        return self

    def export(self, allow_unlowered: bool = False) -> Program:
        """The lowered graph as a :class:`Program`; :class:`UnsupportedOpsError` when ops are left
        unlowered (naming each with its count and source), unless ``allow_unlowered``."""
        if self.lowered is None:
            self.lower()
        if self.unlowered and not allow_unlowered:
            raise UnsupportedOpsError(self.model_name, self.unlowered)
        t0 = _clock()
        program_ep = torch.export.export(self.lowered, self.example_inputs)
        node_sources = _node_sources(self.lowered, program_ep)
        self.graphs["lowered"] = graph_text(program_ep)
        self._timed("lower", t0)
        self.program = Program(program_ep, self.target, name=self.name, stages=dict(self.graphs),
                               unlowered=self.unlowered, output_tree=self.output_tree,
                               info={"calibration_samples": self.calibration_samples, "seed": self.seed,
                                     "timings_s": dict(self.timings),
                                     "cpu_timings_s": dict(self.cpu_timings), "node_sources": node_sources,
                                     **({"input_scaling": {str(i): {"scales": s.tolist(), "offsets": o.tolist()}
                                                           for i, (s, o) in self.input_scaling.items()}}
                                        if self.input_scaling else {}),
                                     "observer": self.observer,
                                     **({"precision": _precision_info(self.precision, self.quantizer)}
                                        if self.precision != "int8" else {}),
                                     **({"weights": _weights_info(self.weights, self.quantizer)}
                                        if self.weights != "int8" else {}),
                                     **({"rounding": rounding_summary(self.rounding_report)}
                                        if self.rounding != "nearest" else {}),
                                     "tensors": record_provenance(self.lowered, program_ep.graph)})
        if not self.unlowered:
            self.program.check_emittable()
        return self.program

    def run(self, allow_unlowered: bool = False) -> Program:
        """Every stage in order: the compiled program."""
        return self.capture().prepare().calibrate().convert().lower().export(allow_unlowered)


AUTO_TARGET_DB = 30.0  # precision="auto": the output SQNR (dB) against the float model it aims for
AUTO_CANDIDATE_OPS = ("quantized_linear", "quantized_conv2d", "quantized_depthwise_conv2d")


def _auto_samples(calibration, example_inputs, seed) -> list[tuple]:
    """The samples precision="auto" measures on: the calibration samples (at most 32), the example
    inputs for a calibration callable, or the 8 random ones calibration=None calibrates on."""
    from corten.validation import as_input_tuple

    example = as_input_tuple(example_inputs)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (the compile itself warns about calibration=None)
        batches = calibration_batches(calibration, example, seed) if calibration is not None else \
            calibration_batches(None, example, seed)
    if callable(batches):
        return [example]
    return [tuple(b) for b in list(batches)[:32]]


def output_agreement(prog: Program, model: torch.nn.Module, samples) -> float:
    """Share of the rows of 2-D multi-column outputs (classifier logits) whose argmax the program
    and the float model agree on, over ``samples`` (1.0 without such outputs)."""
    same = total = 0
    for sample in samples:
        with torch.no_grad():
            ref, got = model(*sample), prog.run(*sample)
        for r, g in zip(tensor_leaves(ref), tensor_leaves(got)):
            if r.dim() == 2 and r.shape[1] > 1:
                same += int((r.argmax(1) == g.argmax(1)).sum())
                total += r.shape[0]
    return same / total if total else 1.0


def output_sqnr_db(prog: Program, model: torch.nn.Module, samples) -> float:
    """SQNR (dB) of the program's outputs against the float model's over ``samples``."""
    import math

    signal = noise = 0.0
    for sample in samples:
        with torch.no_grad():
            ref = model(*sample)
            got = prog.run(*sample)
        for r, g in zip(tensor_leaves(ref), tensor_leaves(got)):
            signal += float((r.to(torch.float64) ** 2).sum())
            noise += float(((r.to(torch.float64) - g.to(torch.float64)) ** 2).sum())
    if noise == 0.0:
        return math.inf
    return 10.0 * math.log10(max(signal, 1e-300) / noise)


def _auto_candidates(report) -> list[tuple[str, float]]:
    """Module paths of the int16-capable layers, worst op-alone SQNR first (a program input's own
    quantization counts for the first layer reading it: its int16 input edge is that input)."""
    rows = list(report.rows)
    scores: dict[str, float] = {}
    for i, r in enumerate(rows):
        target = r
        if r.op == "quantize_per_tensor":
            target = next((x for x in rows[i + 1:] if x.op in AUTO_CANDIDATE_OPS), None)
        if target is None or target.op not in AUTO_CANDIDATE_OPS or not target.module:
            continue
        scores[target.module] = min(scores.get(target.module, float("inf")), r.op_sqnr_db)
    return sorted(scores.items(), key=lambda kv: kv[1])


def _program_costs(prog: Program) -> dict:
    plan = prog.memory
    return {"arena_bytes": int(plan.arena_bytes), "constant_bytes": int(getattr(plan, "constant_bytes", 0) or 0)}


def _layer_costs(prog8: Program, prog16: Program, modules: list[str]) -> dict[str, dict]:
    """Per moved layer: its output's extra activation bytes (int16: 2 bytes an element) and MACs."""
    from corten.ops.registry import op_cost

    out: dict[str, dict] = {}
    tensors = prog16.info.get("tensors") or {}
    nodes = {n.name: n for n in prog16.module().graph.nodes}
    for name, t in tensors.items():
        mod = t.get("module", "")
        hit = next((m for m in modules if mod == m or mod.startswith(m + ".")), None)
        if hit is None or t.get("op") not in AUTO_CANDIDATE_OPS or name not in nodes:
            continue
        node = nodes[name]
        val = node.meta.get("val")
        numel = int(val.numel()) if isinstance(val, torch.Tensor) else 0
        out[hit] = {"extra_activation_bytes": numel, "macs": op_cost(node).macs}
    return out


def _compile_auto(model, example_inputs, target, calibration, seed, observer, name, allow_unlowered, progress,
                  max_arena, max_flash, kernels, target_db, rounding="nearest") -> Program:
    """precision="auto" (see :func:`compile`)."""
    samples = _auto_samples(calibration, example_inputs, seed)
    base = _compile(model, example_inputs, target, calibration, seed, observer, name, allow_unlowered, progress,
                    rounding=rounding)
    db8, agree8 = output_sqnr_db(base, model, samples), output_agreement(base, model, samples)
    info = {"target_db": target_db, "int8_output_sqnr_db": db8, "int8_top1_agreement": agree8, "int16_layers": [],
            "tried": [], "int8_costs": _program_costs(base)}
    best, best_db, best_agree = base, db8, agree8
    if db8 < target_db and not base.unlowered_ops():
        report = base.compare(model, samples)
        candidates = _auto_candidates(report)
        n = 1
        while candidates and n <= 2 * len(candidates):
            chosen = [m for m, _ in candidates[:n]]
            prog = _compile(model, example_inputs, target, calibration, seed, observer, name, allow_unlowered,
                            progress, {m: "int16" for m in chosen}, rounding=rounding)
            db, agree = output_sqnr_db(prog, model, samples), output_agreement(prog, model, samples)
            costs = _program_costs(prog)
            over = (max_arena is not None and costs["arena_bytes"] > max_arena) or \
                (max_flash is not None and costs["constant_bytes"] > max_flash)
            info["tried"].append({"layers": chosen, "output_sqnr_db": db, "top1_agreement": agree, **costs,
                                  "over_budget": bool(over)})
            if over:
                break
            # better: more argmax agreement with the float model (classifiers), else a higher output SQNR
            if (agree, db) > (best_agree, best_db):
                best, best_db, best_agree = prog, db, agree
                info["int16_layers"] = [{"module": m, "op_sqnr_db_int8": s} for m, s in candidates[:n]]
            if db >= target_db or n >= len(candidates):
                break
            n *= 2
        costs = _layer_costs(base, best, [d["module"] for d in info["int16_layers"]])
        for d in info["int16_layers"]:
            d.update(costs.get(d["module"], {}))
    info["output_sqnr_db"], info["top1_agreement"] = best_db, best_agree
    info["costs"] = _program_costs(best)
    best.info["precision"] = {**best.info.get("precision", {"requested": "auto"}), "requested": "auto", "auto": info}
    return best


def _int4_candidates(prog4: Program, prog8: Program, model, samples) -> list[dict]:
    """The layers of the all-int4 program ``prog4`` that have int4 weights, least int4 rounding
    error per byte saved first (:func:`_noise_per_byte`): each module path with its op-alone SQNR in
    ``prog4`` (:meth:`Program.compare`, the layer's own rounding on its int8 input) and the flash
    bytes int4 saves there (its weight bytes in ``prog8`` minus those in ``prog4``, from the cost hook)."""
    from corten.program import weight_layers

    def weight_bytes(prog) -> dict[str, int]:
        out: dict[str, int] = {}
        for mod, _, nbytes in weight_layers(prog):
            out[mod] = out.get(mod, 0) + nbytes
        return out

    int4_modules = {mod for mod, bits, _ in weight_layers(prog4) if bits == 4}
    b8, b4 = weight_bytes(prog8), weight_bytes(prog4)
    sqnr: dict[str, float] = {}
    for r in prog4.compare(model, samples).rows:
        if r.weight_bits == 4 and r.module in int4_modules:
            sqnr[r.module] = min(sqnr.get(r.module, float("inf")), r.op_sqnr_db)
    rows = [{"module": m, "op_sqnr_db_int4": sqnr.get(m, float("-inf")), "saved_bytes": b8.get(m, 0) - b4.get(m, 0)}
            for m in int4_modules if m]
    return sorted(rows, key=lambda d: (_noise_per_byte(d), d["module"]))


def _noise_per_byte(d: dict) -> float:
    """The int4 rounding noise a layer adds (its op-alone noise-to-signal ratio, 10^(-SQNR/10)) per
    byte of flash its int4 weights save: the order in which weights="auto" moves layers to int4
    (a greedy knapsack: the most flash for the least error first)."""
    import math

    noise = 1.0 if math.isinf(d["op_sqnr_db_int4"]) and d["op_sqnr_db_int4"] < 0 else 10 ** (-d["op_sqnr_db_int4"] / 10)
    return noise / max(d["saved_bytes"], 1)


def _keep_int8(candidates: list[dict], slack: int) -> set[str]:
    """The modules that stay int8 when every other candidate goes int4: the set with the largest sum
    of int4 noise (:func:`_noise_per_byte`'s noise) whose int4 savings fit ``slack`` bytes (the flash
    all-int4 leaves under the budget), by exact 0/1 knapsack over bytes (in coarser units past
    :data:`KNAPSACK_CELLS`)."""
    if slack <= 0 or not candidates:
        return set()
    unit = -(-slack // KNAPSACK_CELLS)
    cap = slack // unit
    best = torch.zeros(cap + 1, dtype=torch.float64)
    take = torch.zeros(len(candidates), cap + 1, dtype=torch.bool)
    for i, d in enumerate(candidates):
        w = -(-max(d["saved_bytes"], 1) // unit)  # (rounded up: the chosen set always fits)
        if w > cap:
            continue
        gain = best[:cap + 1 - w] + _noise_per_byte(d) * max(d["saved_bytes"], 1)
        better = gain > best[w:]
        take[i, w:] = better
        best[w:] = torch.where(better, gain, best[w:])
    keep, c = set(), cap
    for i in range(len(candidates) - 1, -1, -1):
        if take[i, c]:
            keep.add(candidates[i]["module"])
            c -= -(-max(candidates[i]["saved_bytes"], 1) // unit)
    return keep


KNAPSACK_CELLS = 1 << 20  # weights="auto": the knapsack's capacity in cells at most (bytes, or coarser units)
AUTO_WEIGHTS_SAMPLES = 8  # weights="auto": the calibration samples the per-layer int4 error is measured on


def _compile_weights_auto(model, example_inputs, target, calibration, seed, observer, name, allow_unlowered,
                          progress, precision, max_flash, input_ranges=None, input_scaling="per_tensor",
                          rounding="nearest") -> Program:
    """weights="auto" (see :func:`compile`)."""
    if max_flash is None:
        raise UsageError("weights='auto' moves layers to int4 until the constants fit max_flash: pass max_flash= "
                         "(bytes), or weights='int4' / a dict of module paths or types")
    if is_qat_module(model):
        raise UsageError("weights='auto' applies to post-training quantization; give prepare_qat(..., weights=) "
                         "the int4 layers instead")

    def build(weights):
        return _compile(model, example_inputs, target, calibration, seed, observer, name, allow_unlowered, progress,
                        precision, input_ranges, input_scaling, weights=weights, rounding=rounding)

    base = build("int8")
    flash8 = _program_costs(base)["constant_bytes"]
    info = {"max_flash": max_flash, "int8_constant_bytes": flash8, "int4_layers": [], "tried": []}
    chosen_prog = base
    if flash8 > max_flash and not base.unlowered_ops():
        prog4 = build("int4")
        samples = _auto_samples(calibration, example_inputs, seed)[:AUTO_WEIGHTS_SAMPLES]
        candidates = _int4_candidates(prog4, base, model, samples)
        info["int4_constant_bytes"] = _program_costs(prog4)["constant_bytes"]
        def cover(n: int, deficit: int) -> int:
            """n extended by the next candidates until their savings cover ``deficit`` bytes (one at least)."""
            saved = 0
            while n < len(candidates) and (saved < deficit or saved == 0):
                saved += candidates[n]["saved_bytes"]
                n += 1
            return n

        # first the best set: every layer int4 but the ones whose int4 noise is largest among those the
        # flash left over by all-int4 can hold in int8 (a 0/1 knapsack); if the estimate misses the
        # budget, the greedy order covers what is still over
        flash4 = info["int4_constant_bytes"]
        keep = _keep_int8(candidates, max_flash - flash4) if flash4 <= max_flash else set()
        n, done = len(candidates) - len(keep), False
        if keep:
            layers = [d for d in candidates if d["module"] not in keep]
            prog = build({d["module"]: "int4" for d in layers})
            flash = _program_costs(prog)["constant_bytes"]
            info["tried"].append({"layers": n, "constant_bytes": flash, "knapsack": True})
            if flash <= max_flash:
                chosen_prog, info["int4_layers"], done = prog, layers, True
            else:
                n = cover(0, flash8 - max_flash)
        while not done:
            layers = candidates[:n]
            prog = prog4 if n == len(candidates) else build({d["module"]: "int4" for d in layers})
            flash = _program_costs(prog)["constant_bytes"]
            info["tried"].append({"layers": n, "constant_bytes": flash})
            if flash <= max_flash or n == len(candidates):  # (all of them: the smallest constants there are)
                chosen_prog, info["int4_layers"] = prog, layers
                break
            n = cover(n, flash - max_flash)  # (savings estimated high: cover what is still over)
    info["constant_bytes"] = _program_costs(chosen_prog)["constant_bytes"]
    chosen_prog.info["weights"] = {**chosen_prog.info.get("weights", {}), "requested": "auto", "auto": info}
    return chosen_prog


def auto_report(prog: Program) -> str:
    """The precision="auto" decisions of ``prog`` as text (also in the compile report)."""
    a = (prog.info.get("precision") or {}).get("auto")
    if not a:
        return "precision: not chosen automatically"
    lines = [f"precision=auto: output SQNR {a['int8_output_sqnr_db']:.1f} dB in int8 -> {a['output_sqnr_db']:.1f} dB "
             f"(target {a['target_db']:g} dB), top-1 agreement with float {100 * a['int8_top1_agreement']:.1f}% -> "
             f"{100 * a['top1_agreement']:.1f}%; arena {a['int8_costs']['arena_bytes']} -> {a['costs']['arena_bytes']} B"]
    for d in a["int16_layers"]:
        lines.append(f"  int16: {d['module']:<28} op SQNR in int8 {d['op_sqnr_db_int8']:7.1f} dB, "
                     f"+{d.get('extra_activation_bytes', 0)} activation B, {d.get('macs', 0)} MACs")
    if not a["int16_layers"]:
        lines.append("  every layer stays int8")
    return "\n".join(lines)


def _request_info(request):
    """A width request as saved in ``Program.info``: the string, or the dict with types by name."""
    return request if isinstance(request, str) else {
        (k if isinstance(k, str) else f"{k.__module__}.{k.__qualname__}"): v for k, v in request.items()}


def _weights_info(weights, quantizer) -> dict:
    """What the program records of its weights request: the request and the weighted nodes the
    quantizer gave int4 weights."""
    return {"requested": _request_info(weights), "int4_nodes": list(getattr(quantizer, "int4_nodes", []))}


def _precision_info(precision, quantizer) -> dict:
    """What the program records of its precision request: the request and the compute nodes the
    quantizer made int16."""
    return {"requested": _request_info(precision), "int16_nodes": list(getattr(quantizer, "int16_nodes", []))}


class _torchao_warnings(warnings.catch_warnings):
    """Silence the deprecation/user warnings torchao's PT2E prepare/convert emit about its own
    internals (only around those calls: the user's warnings are not touched)."""

    def __enter__(self):
        out = super().__enter__()
        warnings.simplefilter("ignore")
        return out


def compile(
    model: torch.nn.Module,
    example_inputs: tuple[torch.Tensor, ...],
    target: str = "cortex-m55",
    calibration: Any = None,
    seed: int = 0,
    *,
    observer: str = "histogram",
    name: str = "model",
    allow_unlowered: bool = False,
    progress: bool | Callable[[str], None] = False,
    max_arena: int | None = None,
    max_flash: int | None = None,
    kernels: Any = "cmsis-nn",
    precision: Any = "int8",
    precision_target_db: float = AUTO_TARGET_DB,
    input_ranges: dict | None = None,
    input_scaling: str = "per_tensor",
    deployment: Any = None,
    memory: Any = None,
    weights_section: Any = None,
    weights: Any = "int8",
    rounding: str = "nearest",
) -> Program:
    """Compile ``model`` to a Corten int8 program for ``target`` (runs every :class:`Pipeline` stage).

    ``calibration``: input tuples, a ``DataLoader``, a tensor of N samples, or a callable
    ``calibrate(model)`` (see :mod:`corten.quantizer.calibration`); None means 8 random samples
    shaped like the example inputs (drawn from ``torch.Generator().manual_seed(seed)``; the global
    RNG is not touched; with a ``QuantizationWarning``).  ``observer``: the PTQ range rule of
    intermediate activations (``"histogram"``, ``"minmax"``, ``"percentile"``, ``"mse"``; program
    outputs always use min/max).  ``model`` may also be the module :func:`corten.prepare_qat`
    returned, fine-tuned: it is converted (its fake-quantizers hold the ranges), not calibrated.
    ``precision``: ``"int8"`` (default), ``"int16"`` (TFLite's 16x8 scheme: int16 symmetric
    activations, int8 per-channel weights, int64 biases, on the ops that have int16 kernels; the
    others stay int8 with a requantize between) or ``{module path prefix | nn.Module type: "int8" |
    "int16"}`` (e.g. ``{"": "int8", "encoder": "int16"}``), or ``"auto"``: int8 first; while the
    output SQNR against the float model (on the calibration samples) is below
    ``precision_target_db``, the conv/linear layers with the lowest op-alone SQNR
    (:meth:`Program.compare`) move to int16, 1, 2, 4, ... of them, as long as the arena stays within
    ``max_arena`` and the constants within ``max_flash``; the best configuration tried wins (more
    top-1 agreement with the float model for classifier outputs, then the higher output SQNR);
    ``prog.info["precision"]["auto"]`` says
    which layers went to int16, why, and what it cost (arena bytes, activation bytes, MACs).
    A model with ops Corten cannot lower raises :class:`UnsupportedOpsError` (naming
    each op, its count and source location) unless ``allow_unlowered=True``, which returns a
    partly lowered program whose ``unlowered_ops()`` lists them.

    ``max_arena`` (bytes of RAM for the arena with ``kernels``' scratch): when today's layer-by-layer
    plan is larger, the compiler searches a banded schedule (chains of layers run in row bands,
    halos recomputed, :mod:`corten.memory.banding`) that fits with the fewest extra MACs; the
    program then runs that schedule in Python and C, byte-identical to the unbanded one.
    :class:`BudgetError` names the smallest arena found, the layer that sets it and what to change.
    ``kernels`` (a provider name such as "cmsis-nn" or "portable", or a chain): the kernels whose
    arena (scratch included) ``max_arena`` bounds.
    ``max_flash`` (bytes of constant data): :class:`BudgetError` when the weights do not fit.
    Without either, the plan is today's (no extra compute).
    ``input_ranges``: ``{input index or forward argument name: (lo, hi)}`` fixes those inputs'
    quantization ranges (the qparams a min/max observer gives for ``[lo, hi]``) instead of
    calibrating them - for an input the calibration data holds constant (a zero recurrent state,
    ``torch.ones`` in a test) or whose real range the user knows; such an input may be constant in
    the calibration samples.
    ``input_scaling``: ``"per_tensor"`` (default: one int8 grid per input) or ``"per_feature"``: each
    feature (last dim) of an input read directly by an ``nn.Linear`` gets its own range from the
    calibration samples, mapped onto int8 by ``x / s + o`` before the quantize and folded into that
    layer's weights and bias (:mod:`corten.quantizer.input_scaling`) - for tabular or sensor inputs
    whose features span very different ranges.  ``run``/``run_c`` take float inputs as before; the C
    header's ``<name>_scale_input(x, feature)`` applies the map before ``<name>_quantize_input``.
    ``deployment`` (:class:`corten.deployment.Deployment`): the core, kernels and budgets in one
    value; it replaces ``target`` and ``kernels``, and gives ``max_arena``/``max_flash`` unless they
    are passed.
    ``memory``: the board's RAM regions for the arena, fastest first - ``{"dtcm": 32 * 1024, "sram":
    None}`` (None / "rest": no limit), or :class:`corten.ArenaRegion` s with a speed rank, linker
    section and MEMORY name (:func:`corten.deployment.parse_memory`).  The planner puts scratch and
    small activations in the fastest region, the rest where it fits; the C library declares one
    arena per region in its section; a region that does not fit raises :class:`BudgetError` naming
    it.  ``weights_section``: the linker section of the constant arrays, one for all
    (``".ext_flash"``) or per module path prefix (``{"features": ".ext_flash"}``).  Both also come
    from ``deployment``; the C library's ``<name>_sections.ld`` is the GCC linker-script fragment.
    ``weights``: the weight width of the conv/linear layers - ``"int8"`` (default), ``"int4"`` (A8W4:
    symmetric per-channel int4 weights in [-7, 7], packed two per byte in the C constants, int8
    activations, int32 biases, on conv2d / 1x1 / depthwise / linear; other layers keep int8), a dict
    ``{module path prefix | nn.Module type: "int8" | "int4"}`` as for ``precision``, or ``"auto"`` with
    ``max_flash``: int8 when the constants fit, else every layer int4 but the set whose int4 rounding
    noise (op-alone SQNR of the all-int4 program, :meth:`Program.compare`) sums highest among those the
    flash left under the budget can hold in int8 (0/1 knapsack; then least noise per byte saved first);
    ``prog.info["weights"]["auto"]`` records the choice, :func:`weights_report` the flash per layer.
    ``rounding``: ``"nearest"`` (default) or ``"adaptive"``: each conv/linear's int8 or int4 weights rounded
    up or down to minimise the error of its output on the calibration samples (AdaRound,
    :mod:`corten.quantizer.rounding`; kept per output channel only where it wins on held-out samples;
    ``prog.info["rounding"]`` says where).  It fits each layer on the samples: give it real samples, and
    for a linear layer about as many as it has inputs or more (a conv reads a row per output position);
    on the default 8 random samples it can be worse than nearest.
    """
    from corten.deployment import parse_memory, parse_weights_section

    regions, sections = parse_memory(memory), parse_weights_section(weights_section)
    if input_ranges is not None and (is_qat_module(model) or precision == "auto"):
        raise UsageError("input_ranges applies to post-training int8/int16 compiles (not a QAT module or "
                         "precision='auto')")
    if input_scaling != "per_tensor" and (is_qat_module(model) or precision == "auto"):
        raise UsageError("input_scaling applies to post-training int8/int16 compiles (not a QAT module or "
                         "precision='auto')")
    if deployment is not None:
        from corten.deployment import Deployment

        if not isinstance(deployment, Deployment):
            raise UsageError(f"deployment must be a corten.Deployment, got {type(deployment).__name__}")
        target, kernels = deployment.target.name, deployment.providers
        max_arena = deployment.max_arena if max_arena is None else max_arena
        max_flash = deployment.max_flash if max_flash is None else max_flash
        regions = regions or deployment.memory
        sections = sections or deployment.weights_sections
    if isinstance(weights, str) and weights == "auto":
        if isinstance(precision, str) and precision == "auto":
            raise UsageError("weights='auto' and precision='auto' together are not supported: fix one of them")
        prog = _compile_weights_auto(model, example_inputs, target, calibration, seed, observer, name,
                                     allow_unlowered, progress, precision, max_flash, input_ranges, input_scaling,
                                     rounding)
    elif isinstance(precision, str) and precision == "auto":
        if weights != "int8":
            raise UsageError("precision='auto' compiles int8 weights; combine int16 layers and int4 weights with "
                             "explicit dicts")
        prog = _compile_auto(model, example_inputs, target, calibration, seed, observer, name, allow_unlowered,
                             progress, max_arena, max_flash, kernels, precision_target_db, rounding=rounding)
    else:
        prog = _compile(model, example_inputs, target, calibration, seed, observer, name, allow_unlowered, progress,
                        precision, input_ranges, input_scaling, weights, rounding)
    if regions or sections:
        prog = prog.with_memory([r.to_json() for r in regions] or None, dict(sections) or None)
    if (max_arena is None and max_flash is None and not regions) or prog.unlowered_ops():
        return prog
    return prog.fit_budget(max_arena, max_flash, kernels)  # (BudgetError naming a memory region that does not fit)


def _compile(model, example_inputs, target, calibration, seed, observer, name, allow_unlowered, progress,
             precision="int8", input_ranges=None, input_scaling="per_tensor", weights="int8",
             rounding="nearest") -> Program:
    if is_qat_module(model):
        if precision != "int8":
            raise UsageError("precision= applies to post-training quantization; a prepare_qat module is int8")
        if weights != "int8":
            raise UsageError("weights= of a QAT module are chosen when it is prepared: "
                             "corten.prepare_qat(model, example_inputs, weights=...)")
        if rounding != "nearest":
            raise UsageError("rounding='adaptive' applies to post-training quantization; a prepare_qat module "
                             "learnt its weights for round-to-nearest")
        return _compile_qat(model, example_inputs, target, calibration, seed, name, allow_unlowered, progress)
    pipeline = Pipeline(model, example_inputs, target, calibration, seed, name=name, progress=progress,
                        observer=observer, precision=precision, input_ranges=input_ranges,
                        input_scaling=input_scaling, weights=weights, rounding=rounding)
    try:
        return pipeline.run(allow_unlowered)
    except Exception as e:  # a torch-internal failure on an op Corten does not know: name the op
        if type(e).__module__.startswith("corten") or pipeline.exported is None:
            raise
        unknown = _unknown_ops(unguarded_module(pipeline.exported))
        if unknown:
            raise UnsupportedOpsError(pipeline.model_name, unknown) from e
        raise


def _compile_qat(qat: torch.fx.GraphModule, example_inputs, target, calibration, seed, name, allow_unlowered,
                 progress) -> Program:
    """``corten.compile`` of a fine-tuned :func:`corten.prepare_qat` module: convert, then the
    pipeline's lower and export stages."""
    if calibration is not None:
        warn_quantization("calibration is ignored for a QAT module: its fake-quantizers already hold the "
                          "ranges learnt in fine-tuning")
    p = Pipeline(qat, example_inputs, target, None, seed, name=name, progress=progress)
    p.model_name = qat.meta["corten_qat"].get("model", p.model_name)
    t0 = _clock()
    p.say("corten: converting the QAT module")
    p.converted = convert_qat(qat)
    p.output_tree = flatten_outputs(p.converted, p.model_name)  # (dicts, NamedTuples: a flat tuple from here on)
    for n in p.converted.graph.nodes:  # the QAT graph was traced with a dynamic batch: shapes anew
        n.meta.pop("val", None)
    propagate_shapes(p.converted, p.example_inputs)
    p.graphs["quantized"] = graph_text(p.converted)
    p._timed("quantize", t0)
    program = p.lower().export(allow_unlowered)
    program.info["qat"] = True
    return program


def _node_sources(lowered: torch.fx.GraphModule, program_ep) -> dict[str, dict[str, str]]:
    """Per step node of the exported program (Corten ops and reshapes): the PyTorch module path and
    source line it came from (``{"module": "features.3.conv.1", "source": "file.py:12 in forward"}``).
    Re-exporting drops custom node metadata, so the lowered graph's nodes are matched to the
    program's in graph order (same ops, same order); a mismatch gives ``{}`` (names fall back)."""
    from corten.ops._rules import module_path, source_location
    from corten.ops.registry import op_name_of

    def steps(graph):
        return [n for n in graph.nodes if n.op == "call_function"
                and (op_name_of(n.target) is not None or n.target == torch.ops.aten.reshape.default)]

    a, b = steps(lowered.graph), steps(program_ep.graph)
    if len(a) != len(b) or any(x.target != y.target for x, y in zip(a, b)):
        return {}
    return {y.name: {"module": module_path(x), "source": source_location(x)} for x, y in zip(a, b)}
