"""The ExecuTorch Cortex-M (CMSIS-NN) backend's quantize + lower flow, timed stage by stage.

This is the peer that ``bench_compile_mv2.py`` compares Corten's compile time against.  It is
imported only when ``executorch`` is installed (it is not a Corten dependency)::

    python3 -m venv /work/peer-venv
    echo torch==2.13.0 > constraints.txt        # keep the CPU torch; never let pip replace it
    /work/peer-venv/bin/pip install -c constraints.txt torch==2.13.0
    /work/peer-venv/bin/pip install -c constraints.txt executorch==1.5.1 tosa-tools==2026.5.0 torchao==0.18.0
    /work/peer-venv/bin/pip install -e . --no-deps && /work/peer-venv/bin/pip install numpy

The flow is the backend's documented one: ``CortexMQuantizer`` -> ``torch.export`` ->
``prepare_pt2e`` -> calibration -> ``convert_pt2e`` -> ``torch.export`` ->
``to_edge_transform_and_lower`` with the backend's edge compile config, then ``CortexMPassManager``
(which rewrites the quantized ATen ops into ``cortex_m::`` ops), as the backend's AOT compiler does.  ``to_executorch`` (serialising
the program) is timed separately: the peer's published number covers quantize + lower only.
"""
from __future__ import annotations

import importlib.util
import logging
import time
import warnings
from dataclasses import dataclass, field
from typing import Callable, Iterable

import torch

INSTALL_HINT = ("pip install executorch==1.5.1 tosa-tools==2026.5.0 torchao==0.18.0 "
                "(in a separate venv, with a constraints file pinning torch==2.13.0)")

# Stages that make up the peer's "quantize + lower" total, in execution order.
QUANTIZE_LOWER_STAGES = ("capture", "prepare", "calibrate", "convert", "re-export", "to_edge", "cortex_m passes")

# ATen compute ops that, left in the peer's lowered graph, mean a layer was not lowered to CMSIS-NN.
FLOAT_COMPUTE_OPS = ("convolution", "linear", "addmm", "mm", "add", "hardtanh", "relu", "clamp", "mean",
                     "avg_pool2d", "max_pool2d", "_adaptive_avg_pool2d")


def peer_available() -> bool:
    """True when the ``executorch`` package (with its Cortex-M backend) can be imported."""
    if importlib.util.find_spec("executorch") is None:
        return False
    return importlib.util.find_spec("executorch.backends.cortex_m") is not None


def peer_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("executorch")
    except PackageNotFoundError:
        return "unknown"


@dataclass
class StageClock:
    """Wall-clock (``perf_counter``) and CPU (``process_time``) seconds per named stage."""

    wall: dict[str, float] = field(default_factory=dict)
    cpu: dict[str, float] = field(default_factory=dict)

    def time(self, stage: str, fn: Callable[[], object]):
        w0, c0 = time.perf_counter(), time.process_time()
        result = fn()
        self.wall[stage] = self.wall.get(stage, 0.0) + time.perf_counter() - w0
        self.cpu[stage] = self.cpu.get(stage, 0.0) + time.process_time() - c0
        return result

    def total(self, stages: Iterable[str], clock: str = "wall") -> float:
        table = self.wall if clock == "wall" else self.cpu
        return sum(table[s] for s in stages if s in table)


@dataclass
class PeerResult:
    clock: StageClock
    cortex_m_ops: dict[str, int]   # cortex_m:: op name -> count in the lowered edge graph
    other_compute_ops: dict[str, int]  # non-cortex_m call_function targets left (views, portable ops)

    def float_compute_ops(self) -> dict[str, int]:
        """Compute ops the peer left as float ATen ops (portable kernels), e.g. unlowered convolutions."""
        def is_float_compute(name: str) -> bool:
            parts = name.split(".")
            return len(parts) >= 2 and parts[0] == "aten" and parts[1] in FLOAT_COMPUTE_OPS

        return {k: v for k, v in self.other_compute_ops.items() if is_float_compute(k)}


def _edge_op_counts(edge_manager) -> tuple[dict[str, int], dict[str, int]]:
    """Count ``cortex_m::`` ops vs everything else in the lowered edge program (a sanity check that
    the peer really lowered the model, not fell back to float portable kernels)."""
    cortex_m: dict[str, int] = {}
    other: dict[str, int] = {}
    for node in edge_manager.exported_program().graph.nodes:
        if node.op != "call_function":
            continue
        name = str(getattr(node.target, "__name__", node.target))
        bucket = cortex_m if "cortex_m" in str(node.target) else other
        bucket[name] = bucket.get(name, 0) + 1
    return cortex_m, other


def _channels_last(x):
    return x.to(memory_format=torch.channels_last) if isinstance(x, torch.Tensor) and x.dim() == 4 else x


def compile_with_peer(model: torch.nn.Module, example_inputs: tuple[torch.Tensor, ...],
                      calibration: list[tuple[torch.Tensor, ...]], *, target: str = "cortex-m55",
                      channels_last: bool = True, to_executorch: bool = True) -> PeerResult:
    """Quantize ``model`` with ``CortexMQuantizer`` on ``calibration`` and lower it with
    ``CortexMPassManager`` for ``target``, timing each stage.

    Follows the backend's own AOT compiler (``executorch.backends.arm.scripts.aot_arm_compiler``,
    ``_to_edge_cortex_m``, default dim-order layout): the model and every input are made
    channels-last, exported, quantized, re-exported, taken to edge with the backend's compile
    config, then the pass manager rewrites the edge program into ``cortex_m::`` ops.  (The AOT
    compiler exports once more before the channels-last conversion; that export is skipped here,
    which only makes the peer faster.)  ``model`` is modified (pass a deep copy).

    ``channels_last=False`` runs the flow on the contiguous (NCHW) model instead, as the backend's
    SKILL.md example does: it is about twice as fast, but the backend then leaves every
    convolution (and the activations after them) as float ATen ops, so it is no real lowering.
    """
    from executorch.backends.cortex_m.target_config import CortexMTargetConfig

    target_config = CortexMTargetConfig.from_target_string(target)
    layout = _channels_last if channels_last else (lambda x: x)
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
    example_inputs = tuple(layout(x) for x in example_inputs)
    samples = [tuple(layout(x) for x in sample) for sample in calibration]
    previous_disable = logging.root.manager.disable
    logging.disable(logging.WARNING)  # the peer logs deprecation and per-layer fusion notices
    try:
        return _run_stages(model, example_inputs, samples, target_config, to_executorch)
    finally:
        logging.disable(previous_disable)


def _run_stages(model, example_inputs, samples, target_config, to_executorch: bool) -> PeerResult:
    from executorch.backends.cortex_m.edge_compile_config import cortex_m_edge_compile_config
    from executorch.backends.cortex_m.passes.cortex_m_pass_manager import CortexMPassManager
    from executorch.backends.cortex_m.quantizer.quantizer import CortexMQuantizer
    from executorch.exir import to_edge_transform_and_lower
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    clock = StageClock()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        captured = clock.time("capture", lambda: torch.export.export(model, example_inputs).module())
        prepared = clock.time("prepare", lambda: prepare_pt2e(captured, CortexMQuantizer()))

        def calibrate():
            with torch.no_grad():
                for sample in samples:
                    prepared(*sample)

        clock.time("calibrate", calibrate)
        quantized = clock.time("convert", lambda: convert_pt2e(prepared))
        exported = clock.time("re-export", lambda: torch.export.export(quantized, example_inputs))
        edge = clock.time("to_edge", lambda: to_edge_transform_and_lower(
            exported, compile_config=cortex_m_edge_compile_config()))

        def lower():
            # What the AOT compiler and CortexMTester do: replace the edge program in place.
            edge._edge_programs["forward"] = CortexMPassManager(
                edge.exported_program(), target_config=target_config).transform()

        clock.time("cortex_m passes", lower)
        cortex_m_ops, other = _edge_op_counts(edge)
        if to_executorch:
            clock.time("to_executorch", lambda: edge.to_executorch().buffer)
    return PeerResult(clock, cortex_m_ops, other)
