"""Per-layer quantization error: the int8 program against the float model, tensor by tensor.

``report = prog.compare(model, samples)`` runs the float model (after the same ATen passes the
compiler ran, so BatchNorms are folded exactly as in the program) and the int8 program side by
side on each sample and returns one :class:`TensorRow` per quantized tensor of the program:

* ``sqnr_db``        - accumulated: the int8 tensor (dequantized) against the float model's tensor
  computed from the float input (every earlier layer's error included);
* ``op_sqnr_db``     - the op alone: against the float op evaluated on the program's own
  (dequantized int8) inputs, i.e. only this op's rounding and clipping;
* ``max_err_steps``  - the largest difference to that op-alone reference, in int8 steps (scale);
* ``saturated``      - the share of op-alone values outside the int8 range of the tensor
  (clipped by more than half a step).

SQNR is ``10 log10(sum(f^2) / sum((f - q)^2))`` over all samples (``inf`` when exact).
``report.table()`` prints the rows, ``report.plot(path)`` draws both SQNRs per layer as a PNG,
``report.warn(threshold_db)`` raises a :class:`~corten.errors.QuantizationWarning`
for each layer whose accumulated SQNR is below the threshold.

How tensors are matched: each Corten op of the program records at lowering time the name of the
float node whose int8 output it computes and that output's qparams (:func:`record_provenance`
carries them through the final export into ``Program.info["tensors"]``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

import torch

from corten.errors import UsageError

DEFAULT_THRESHOLD_DB = 10.0


# ----------------------------------------------------------------------------- provenance
def record_provenance(lowered: torch.fx.GraphModule, program_graph: torch.fx.Graph) -> dict[str, dict]:
    """``{program node name: {"float": float node name, "scale", "zero_point", "module", "op"}}`` for
    every Corten op of ``program_graph`` (matched in order with the ops of ``lowered``, whose nodes
    carry the lowering's metadata)."""
    from corten.ops.registry import op_name_of

    def ops(graph):
        return [n for n in graph.nodes if n.op == "call_function" and op_name_of(n.target) is not None]

    src, dst = ops(lowered.graph), ops(program_graph)
    if [op_name_of(n.target) for n in src] != [op_name_of(n.target) for n in dst]:
        return {}
    out: dict[str, dict] = {}
    for s, d in zip(src, dst):
        name = op_name_of(s.target)
        entry = None
        if "corten_output_of" in s.meta:
            fname, scale, zp = s.meta["corten_output_of"]
            entry = {"float": fname, "scale": float(scale), "zero_point": int(zp)}
        elif name == "quantize_per_tensor" and isinstance(s.args[0], torch.fx.Node):
            entry = {"float": s.args[0].name, "scale": float(s.args[1]), "zero_point": int(s.args[2])}
        if entry is None or entry["float"] is None:
            continue
        stack = s.meta.get("nn_module_stack") or {}
        entry["module"] = next(reversed(stack.values()))[0] if stack else ""
        entry["op"] = name
        entry["source"] = s.meta.get("corten_source") or ""
        out[d.name] = entry
    return out


# ----------------------------------------------------------------------------- report
@dataclass
class TensorRow:
    step: int
    node: str            # the program's op node
    op: str              # the Corten op
    tensor: str          # the float model's node it stands for
    module: str          # module path in the PyTorch model ("" for the top level)
    sqnr_db: float
    op_sqnr_db: float
    max_err_steps: float
    saturated: float
    scale: float
    zero_point: int
    weight_bits: int = 0  # the op's weight width in the C constants (4: int4, 8: int8; 0: no weights)


@dataclass
class CompareReport:
    model: str
    samples: int
    rows: list[TensorRow] = field(default_factory=list)

    def table(self) -> str:
        head = (f"{'#':>3}  {'tensor':<28} {'module':<24} {'op':<28} {'weights':>7} {'SQNR dB':>8} {'op dB':>8} "
                f"{'max err':>8} {'sat %':>6}")
        lines = [f"Per-layer int8 error of {self.model} on {self.samples} sample(s) "
                 "(SQNR: accumulated / op alone; max err in int8 steps)", head, "-" * len(head)]
        for r in self.rows:
            width = f"int{r.weight_bits}" if r.weight_bits else "-"
            lines.append(f"{r.step:>3}  {r.tensor[:28]:<28} {(r.module or '-')[:24]:<24} {r.op[:28]:<28} "
                         f"{width:>7} {_db(r.sqnr_db):>8} {_db(r.op_sqnr_db):>8} {r.max_err_steps:>8.2f} "
                         f"{100 * r.saturated:>6.2f}")
        worst = self.worst()
        if worst is not None:
            lines.append(f"worst accumulated SQNR: {_db(worst.sqnr_db)} dB at {worst.tensor} "
                         f"({worst.module or worst.op})")
        return "\n".join(lines)

    def worst(self) -> TensorRow | None:
        finite = [r for r in self.rows if not math.isnan(r.sqnr_db)]
        return min(finite, key=lambda r: r.sqnr_db) if finite else None

    def warn(self, threshold_db: float = DEFAULT_THRESHOLD_DB) -> list[str]:
        """A QuantizationWarning for each layer whose accumulated SQNR is below ``threshold_db``."""
        import warnings

        from corten.errors import QuantizationWarning

        messages = []
        for r in self.rows:
            if r.sqnr_db < threshold_db:
                where = f"module '{r.module}'" if r.module else f"tensor {r.tensor}"
                msg = (f"{where} ({r.op}, {r.tensor}): accumulated SQNR {_db(r.sqnr_db)} dB is below "
                       f"{threshold_db:g} dB (op alone {_db(r.op_sqnr_db)} dB, {100 * r.saturated:.1f}% "
                       "saturated); calibrate on more representative data, try observer='minmax' or "
                       "'mse', or fine-tune with corten.prepare_qat")
                warnings.warn(msg, QuantizationWarning, stacklevel=2)
                messages.append(msg)
        return messages

    def plot(self, path: str | Path) -> Path:
        """Bar chart of the accumulated and op-alone SQNR per layer (PNG)."""
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        path = Path(path)
        cap = 80.0  # exact tensors (inf dB) are drawn at the cap
        labels = [f"{r.step}: {r.module or r.tensor}"[:40] for r in self.rows]
        acc = [min(r.sqnr_db, cap) for r in self.rows]
        alone = [min(r.op_sqnr_db, cap) for r in self.rows]
        fig, ax = plt.subplots(figsize=(max(6.0, 0.35 * len(self.rows) + 2), 4.5))
        xs = range(len(self.rows))
        ax.bar([x - 0.2 for x in xs], acc, width=0.4, label="accumulated")
        ax.bar([x + 0.2 for x in xs], alone, width=0.4, label="op alone")
        ax.set_xticks(list(xs))
        ax.set_xticklabels(labels, rotation=75, ha="right", fontsize=7)
        ax.set_ylabel("SQNR (dB)")
        ax.set_title(f"{self.model}: int8 vs float per tensor ({self.samples} samples)")
        ax.legend()
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)
        return path


def _db(x: float) -> str:
    return "inf" if math.isinf(x) else ("nan" if math.isnan(x) else f"{x:.1f}")


def _sqnr(signal: float, noise: float) -> float:
    if noise == 0.0:
        return math.inf
    if signal == 0.0:
        return -math.inf
    return 10.0 * math.log10(signal / noise)


class _Recorder(torch.fx.Interpreter):
    """Runs a graph keeping every node's output; ``substitute`` maps node names to values used in
    place of the computed ones (recording what the node computed first)."""

    def __init__(self, gm, substitute: dict[str, torch.Tensor] | None = None):
        super().__init__(gm)
        self.values: dict[str, Any] = {}
        self.substitute = substitute or {}

    def run_node(self, n):
        out = super().run_node(n)
        self.values[n.name] = out
        if n.name in self.substitute:
            sub = self.substitute[n.name]
            if isinstance(out, torch.Tensor) and out.shape == sub.shape:
                return sub.to(out.dtype)
        return out


def float_reference(model: torch.nn.Module, example_inputs: tuple) -> torch.fx.GraphModule:
    """The float graph the program was quantized from: captured, with Corten's ATen passes."""
    from corten.aten_passes import AtenPassManager
    from corten.capture import capture_module

    return AtenPassManager()(capture_module(model, tuple(example_inputs)))


def _module_path(node: torch.fx.Node) -> str:
    """The PyTorch module path of the innermost module that made ``node`` (``features.3.conv.1``)."""
    stack = node.meta.get("nn_module_stack") or {}
    if not stack:
        return ""
    path = next(reversed(stack.values()))[0]
    return path.removeprefix("L['self'].").removeprefix("L__self__.")


def compare(program, model: torch.nn.Module, samples: Iterable, threshold_db: float | None = None) -> CompareReport:
    """See the module docstring.  ``samples``: input tuples (or tensors for one-input models)."""
    from corten.ops.registry import op_name_of, weight_bits

    samples = [s if isinstance(s, (tuple, list)) else (s,) for s in samples]
    if not samples:
        raise UsageError("compare needs at least one input sample")
    tensors: dict[str, dict] = program.info.get("tensors") or {}
    if not tensors:
        raise UsageError(f"{program.name}: this program has no tensor provenance (it was compiled by an older "
                         "Corten or from a QAT module); recompile it with corten.compile")
    if isinstance(model, torch.fx.GraphModule) and "corten_qat" in getattr(model, "meta", {}):
        raise UsageError("compare: pass the float model (the nn.Module before prepare_qat), not the QAT module")
    model = model.eval()
    ref = float_reference(model, tuple(samples[0]))
    ref_nodes = {n.name for n in ref.graph.nodes}
    prog_gm = program.module()
    order = [n.name for n in prog_gm.graph.nodes if n.op == "call_function" and n.name in tensors
             and op_name_of(n.target) is not None and tensors[n.name]["float"] in ref_nodes]
    widths = {n.name: weight_bits(n) for n in prog_gm.graph.nodes if n.name in tensors}
    # per-feature scaled inputs (input_scaling="per_feature"): the program reads x / s + o; its
    # quantize row maps back to x for the comparison
    scaling = getattr(program, "input_scaling", {}) or {}
    placeholders = [n for n in prog_gm.graph.nodes if n.op == "placeholder"]
    unscale = {u.name: scaling[i] for i, ph in enumerate(placeholders) if i in scaling for u in ph.users}

    modules = {n.name: _module_path(n) for n in ref.graph.nodes}
    acc = {k: [0.0, 0.0, 0.0, 0.0, 0.0, 0] for k in order}  # signal, noise, op noise, max err, sat, count
    wide: dict[str, bool] = {}  # int16 tensors
    for sample in samples:
        sample = tuple(sample)
        with torch.no_grad():
            p = _Recorder(prog_gm)
            p.run(*program._program_inputs(sample))
            deq = {}
            for k in order:
                t = tensors[k]
                q = p.values[k]
                if not isinstance(q, torch.Tensor):
                    continue
                deq[t["float"]] = (q.to(torch.float64) - t["zero_point"]) * t["scale"]
                if k in unscale:
                    s_f, o_f = (v.to(torch.float64) for v in unscale[k])
                    deq[t["float"]] = (deq[t["float"]] - o_f) * s_f
                wide[k] = q.dtype == torch.int16
            f = _Recorder(ref)
            f.run(*sample)
            alone = _Recorder(ref, {name: v.to(torch.float32).contiguous() for name, v in deq.items()})
            alone.run(*sample)
        for k in order:
            t = tensors[k]
            name = t["float"]
            if name not in deq:
                continue
            qv = deq[name]
            fv, av = f.values.get(name), alone.values.get(name)
            if not isinstance(fv, torch.Tensor) or fv.shape != qv.shape:
                continue
            fv, av = fv.to(torch.float64), av.to(torch.float64)
            a = acc[k]
            a[0] += float((fv ** 2).sum())
            a[1] += float(((fv - qv) ** 2).sum())
            a[2] += float(((av - qv) ** 2).sum())
            if qv.numel():
                a[3] = max(a[3], float((av - qv).abs().max()) / t["scale"])
            qmin, qmax = (-32768, 32767) if wide.get(k) else (-128, 127)  # (16x8 tensors)
            lo = t["scale"] * (qmin - t["zero_point"]) - t["scale"] / 2
            hi = t["scale"] * (qmax - t["zero_point"]) + t["scale"] / 2
            a[4] += float(((av < lo) | (av > hi)).sum())
            a[5] += qv.numel()
    report = CompareReport(getattr(program, "name", "model"), len(samples))
    for step, k in enumerate(order):
        a, t = acc[k], tensors[k]
        if a[5] == 0:
            continue
        report.rows.append(TensorRow(step=step, node=k, op=t["op"], tensor=t["float"], module=modules.get(t.get("source", "")) or modules.get(t["float"]) or t.get("module", ""),
                                     sqnr_db=_sqnr(a[0], a[1]), op_sqnr_db=_sqnr(a[0], a[2]),
                                     max_err_steps=a[3], saturated=a[4] / a[5], scale=t["scale"],
                                     zero_point=t["zero_point"], weight_bits=widths.get(k, 0)))
    if threshold_db is not None:
        report.warn(threshold_db)
    return report
