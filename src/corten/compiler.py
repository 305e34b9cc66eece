"""``corten.compile``: nn.Module + example inputs -> a fully lowered int8 :class:`~corten.program.Program`.

    capture (torch.export) -> ATen passes (inside the quantizer's transform_for_annotation)
    -> prepare_pt2e + calibration + convert_pt2e -> shape propagation -> CortenPassManager -> export
"""
from __future__ import annotations

import sys
import time
import warnings
from typing import Callable, Iterable

import torch

from corten.capture import capture, remove_guards_fn
from corten.errors import UsageError
from corten.lowering import CortenPassManager, unlowered_nodes
from corten.program import Program, UnsupportedOpsError
from corten.quantizer import CortenQuantizer
from corten.targets import get_target


def unguarded_module(ep: torch.export.ExportedProgram) -> torch.fx.GraphModule:
    """``ep.module()`` without torch's ``_guards_fn`` input check (static shapes here)."""
    gm = ep.module()
    remove_guards_fn(gm)
    return gm


def propagate_shapes(gm: torch.fx.GraphModule, example_inputs) -> None:
    """Give every node ``meta["val"]`` (a FakeTensor) as export would, without re-exporting:
    the lowering rules read shapes from it.  (Re-exporting the converted model gives the same graph
    and costs three times as long.)"""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp

    FakeTensorProp(gm, FakeTensorMode(allow_non_fake_inputs=True)).propagate(*example_inputs)


def graph_text(gm_or_ep) -> str:
    gm = getattr(gm_or_ep, "graph_module", gm_or_ep)
    return gm.print_readable(print_output=False, include_stride=False, include_device=False)


def default_calibration(example_inputs: tuple[torch.Tensor, ...], n: int = 8, seed: int = 0) -> list[tuple]:
    """``n`` standard-normal samples shaped like ``example_inputs`` (seeded)."""
    g = torch.Generator().manual_seed(seed)
    return [tuple(torch.randn(x.shape, generator=g, dtype=x.dtype) for x in example_inputs) for _ in range(n)]


def _progress_printer(enabled: bool | Callable[[str], None]) -> Callable[[str], None]:
    if callable(enabled):
        return enabled
    if enabled:
        return lambda msg: print(msg, file=sys.stderr, flush=True)
    return lambda msg: None


def _calibrate(prepared: torch.fx.GraphModule, samples: list[tuple], say: Callable[[str], None],
               float_gm: torch.fx.GraphModule, model_name: str) -> int:
    """Run the (already validated) samples through the observers; a failure inside torch (e.g. a
    histogram of NaNs) is explained by the first float node that goes non-finite."""
    from corten.validation import explain_calibration_failure

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


def compile(
    model: torch.nn.Module,
    example_inputs: tuple[torch.Tensor, ...],
    target: str = "cortex-m55",
    calibration: Iterable[tuple] | None = None,
    seed: int = 0,
    *,
    name: str = "model",
    allow_unlowered: bool = False,
    progress: bool | Callable[[str], None] = False,
) -> Program:
    """Compile ``model`` to a Corten int8 program for ``target``.

    ``calibration``: an iterable of input tuples; None means 8 random samples shaped like the
    example inputs (seeded by ``seed``).  A model with ops Corten cannot lower raises
    :class:`UnsupportedOpsError` (naming each op, its count and source location) unless
    ``allow_unlowered=True``, which returns a partly lowered program whose ``unlowered_ops()``
    lists them.
    """
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    from corten.validation import (as_input_tuple, check_example_inputs, check_exported, check_lowered,
                                   check_observers, check_samples)

    tgt = get_target(target)
    say = _progress_printer(progress)
    example_inputs = as_input_tuple(example_inputs)
    check_example_inputs(example_inputs)
    model_name = type(model).__name__
    # every calibration sample checked against the example inputs before anything runs
    samples = default_calibration(example_inputs, 8, seed) if calibration is None else \
        check_samples(calibration, example_inputs)
    stages: dict[str, str] = {}
    timings: dict[str, float] = {}
    torch.manual_seed(seed)

    t0 = time.perf_counter()
    say(f"corten: capturing {type(model).__name__} with torch.export")
    exported = capture(model, example_inputs)
    check_exported(exported, model_name)
    stages["exported"] = graph_text(exported)
    gm = unguarded_module(exported)
    timings["capture"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    quantizer = CortenQuantizer()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        prepared = prepare_pt2e(gm, quantizer)
    stages["bn_fused"] = quantizer.transformed_graph_text or ""
    say("corten: calibrating")
    with torch.no_grad():
        n_calib = _calibrate(prepared, samples, say, gm, model_name)
    check_observers(prepared, model_name)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        converted = convert_pt2e(prepared)
    timings["quantize"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    say("corten: lowering to Corten ops")
    propagate_shapes(converted, example_inputs)
    stages["quantized"] = graph_text(converted)
    pm = CortenPassManager()
    lowered = pm(converted)
    check_lowered(lowered, model_name)
    unlowered = unlowered_nodes(lowered, pm.refusals)
    if unlowered and not allow_unlowered:
        raise UnsupportedOpsError(model_name, unlowered)
    program_ep = torch.export.export(lowered, tuple(example_inputs))
    node_sources = _node_sources(lowered, program_ep)
    stages["lowered"] = graph_text(program_ep)
    timings["lower"] = time.perf_counter() - t0

    return Program(program_ep, tgt, name=name, stages=stages, unlowered=unlowered,
                   info={"calibration_samples": n_calib, "seed": seed, "timings_s": timings,
                         "node_sources": node_sources})


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
