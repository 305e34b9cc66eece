"""``Tester``: the compiler's own pipeline stage by stage, and the two checks every lowering rule gets.

    Tester(model, example_inputs).quantize().export().lower()
    tester.test_dialect(ops_before, ops_after, qtol=1)    # graph + numerics in Python
    tester.test_implementation()                          # the C library on host and QEMU, byte for byte

The stages are those of :class:`corten.compiler.Pipeline`, which :func:`corten.compile` runs:
``quantize`` = capture + prepare + calibrate + convert (with shape propagation), ``lower`` = the
lowering passes + the export to a :class:`~corten.program.Program`; ``export`` is kept for
existing callers and does nothing more (the converted graph already carries its shapes).  A test of
the Tester is therefore a test of the compiler (``tests/test_architecture.py`` checks that both
give the same program for every zoo model).

``test_dialect`` checks the op counts of the quantized graph before lowering (the keys given)
and of the lowered program (exactly), and that the int8 program's outputs stay within ``qtol``
output quantization steps of the PT2E-converted (fake-quantized) model; it returns a
:class:`DialectReport` with the agreement observed against the float model as well.
"""
from __future__ import annotations

import collections
import types
from dataclasses import dataclass, field

import torch

from corten.capture.outputs import tensor_leaves
from corten.compiler import Pipeline
from corten.lowering import CortenPassManager
from corten.lowering.pass_manager import op_display_name
from corten.program import Program
from corten.targets import get_target


@dataclass
class DialectReport:
    ops_before: dict[str, int]
    ops_after: dict[str, int]
    max_steps_vs_quantized: float  # max |int8 program - fake-quantized model| in output steps
    max_abs_vs_float: float
    cosine_vs_float: float
    top1_agreement: float | None
    n_inputs: int
    notes: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        top1 = "n/a" if self.top1_agreement is None else f"{self.top1_agreement:.0%}"
        return (f"int8 vs fake-quantized: max {self.max_steps_vs_quantized:g} step(s); int8 vs float: max abs err "
                f"{self.max_abs_vs_float:.4g}, cosine {self.cosine_vs_float:.5f}, top-1 agreement {top1} "
                f"over {self.n_inputs} input(s)")


def count_ops(graph) -> dict[str, int]:
    c: collections.Counter = collections.Counter()
    for n in graph.nodes:
        if n.op == "call_function":
            c[op_display_name(n.target)] += 1
    return dict(c)


class Tester:
    __test__ = False  # not a pytest test class

    def __init__(self, model: torch.nn.Module, example_inputs: tuple, target: str = "cortex-m55",
                 calibration=None, seed: int = 0, name: str = "tested"):
        self.model = model.eval()
        self.example_inputs = tuple(example_inputs)
        self.target = get_target(target)
        self.seed = seed
        self.calibration = calibration
        self.name = name
        self.pipeline: Pipeline | None = None
        self.program: Program | None = None

    # ------------------------------------------------------------------ what the stages produced
    @property
    def converted(self) -> torch.fx.GraphModule | None:
        """The quantized (PT2E-converted) ATen graph, with ``meta["val"]`` shapes."""
        return None if self.pipeline is None else self.pipeline.converted

    @property
    def quantized(self) -> torch.fx.GraphModule | None:
        """The graph the lowering reads (the converted graph)."""
        return self.converted

    @property
    def quantized_ep(self):
        """For older callers: the converted graph where an ExportedProgram used to be
        (``.graph``, ``.graph_module``)."""
        gm = self.converted
        return None if gm is None else types.SimpleNamespace(graph=gm.graph, graph_module=gm)

    @property
    def pass_manager(self) -> CortenPassManager | None:
        return None if self.pipeline is None else self.pipeline.pass_manager

    # ------------------------------------------------------------------ stages
    def quantize(self, calibration=None) -> "Tester":
        self.pipeline = Pipeline(self.model, self.example_inputs, self.target.name, self.calibration, self.seed,
                                 name=self.name)
        self.pipeline.capture().prepare().calibrate(calibration or None).convert()
        return self

    def export(self) -> "Tester":
        if self.pipeline is None:
            self.quantize()
        return self

    def lower(self) -> "Tester":
        if self.pipeline is None:
            self.quantize()
        self.program = self.pipeline.lower(keep_converted=True).export(allow_unlowered=True)
        return self

    # ------------------------------------------------------------------ checks
    def _inputs(self, n: int) -> list[tuple]:
        g = torch.Generator().manual_seed(self.seed + 1000)
        return [self.example_inputs] + [tuple(torch.randn(x.shape, generator=g) for x in self.example_inputs)
                                        for _ in range(n - 1)]

    def test_dialect(self, ops_before: dict[str, int], ops_after: dict[str, int], qtol: float = 1,
                     inputs: list[tuple] | None = None, n_inputs: int = 4) -> DialectReport:
        if self.program is None:
            self.lower()
        before = count_ops(self.quantized.graph)
        wrong = {k: (v, before.get(k, 0)) for k, v in ops_before.items() if before.get(k, 0) != v}
        assert not wrong, f"ops before lowering (expected, got): {wrong}\nall: {before}"
        after = self.program.op_counts()
        assert after == dict(ops_after), f"ops after lowering: expected {dict(ops_after)}, got {after}"
        assert not self.program.unlowered_ops(), f"unlowered: {[str(u) for u in self.program.unlowered_ops()]}"

        inputs = inputs or self._inputs(n_inputs)
        steps, abs_err, cosines, top1 = 0.0, 0.0, [], []
        for inp in inputs:
            with torch.no_grad():
                got = _as_list(self.program.run(*inp))
                fq = _as_list(self.converted(*inp))
                ref = _as_list(self.model(*inp))
            for g, q, r, spec in zip(got, fq, ref, self.program.outputs):
                # a difference of k steps is k * scale in float32: round off the float32 noise
                steps = max(steps, round(float(((g - q).abs() / spec.scale).max()), 3))
                abs_err = max(abs_err, float((g - r).abs().max()))
                cosines.append(float(torch.nn.functional.cosine_similarity(g.flatten(), r.flatten(), dim=0)))
                if g.dim() == 2 and g.shape[1] > 1:
                    top1.append(float((g.argmax(1) == r.argmax(1)).float().mean()))
        report = DialectReport(before, after, round(steps, 6), abs_err, sum(cosines) / len(cosines),
                               (sum(top1) / len(top1)) if top1 else None, len(inputs))
        assert steps <= qtol, f"int8 program differs from the fake-quantized model by {steps} steps > {qtol}"
        return report

    def test_implementation(self, on: tuple[str, ...] = ("host", "qemu"), kernels: str = "portable",
                            inputs: list[tuple] | None = None, n_inputs: int = 2, targets=None) -> list:
        """Emit C, run it on the host and/or QEMU, and assert byte equality with the reference."""
        if self.program is None:
            self.lower()
        results = []
        for inp in inputs or self._inputs(n_inputs):
            expected = self.program.run_int8(*inp)
            for where in on:
                for tgt in (targets or [self.target.name]) if where == "qemu" else [None]:
                    run = self.program.c_run(*inp, on=where, kernels=kernels, target=tgt)
                    for e, g in zip(expected, run.outputs):
                        assert torch.equal(e, g), (f"C output on {where} {tgt or ''} differs from the reference in "
                                                   f"{int((e != g).sum())} of {e.numel()} bytes")
                    results.append((where, tgt, run))
        return results


def _as_list(x) -> list[torch.Tensor]:
    """The output tensors of a model / program run, in order (dicts, NamedTuples, nested tuples)."""
    return tensor_leaves(x)
