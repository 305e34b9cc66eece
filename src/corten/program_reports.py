"""The reports of a :class:`corten.program.Program` (a mixin of it): its operator table, memory
report, kernel choices of a C build and their fallback report, and the flash per weight width.

They read the program and its plans and compute nothing of their own; the Program keeps its state
(graph, plans, runs).
"""
from __future__ import annotations

from corten.lowering.pass_manager import is_lowered, op_display_name
from corten.ops.registry import op_name_of


class ProgramReports:
    """What :class:`corten.program.Program` reports about itself (mixed into it)."""

    def operator_table(self) -> str:
        """The operator table: op, count, lowered or not, with totals."""
        rows: dict[tuple[str, str], int] = {}
        for node in self.ep.graph.nodes:
            if node.op != "call_function":
                continue
            name = op_name_of(node.target)
            if name is not None:
                key = (f"corten.{name}", "lowered")
            elif is_lowered(node):
                key = (op_display_name(node.target), "view (no kernel)")
            else:
                key = (op_display_name(node.target), "NOT LOWERED")
            rows[key] = rows.get(key, 0) + 1
        w = max([len(k[0]) for k in rows] + [8])
        line = f"+-{'-' * w}-+-------+------------------+"
        out = [line, f"| {'operator':<{w}} | count | status           |", line]
        for (op, status), count in rows.items():
            out.append(f"| {op:<{w}} | {count:>5} | {status:<16} |")
        out.append(line)
        lowered = sum(c for (_, s), c in rows.items() if s == "lowered")
        views = sum(c for (_, s), c in rows.items() if s.startswith("view"))
        missing = sum(c for (_, s), c in rows.items() if s == "NOT LOWERED")
        out.append(f"| {'total':<{w}} | {lowered + views + missing:>5} | {f'{missing} not lowered':<16} |")
        out.append(line)
        out.append(f"{lowered} Corten op(s), {views} view(s), {missing} unlowered op(s); target {self.target.name} "
                   f"({self.target.isa})")
        return "\n".join(out)

    def memory_report(self, kernels=None, *, deployment=None) -> str:
        """The memory plan's report; with int4 weights also the flash per width and per layer
        (:func:`weights_report`)."""
        text = self.memory_for(kernels, deployment=deployment).report()
        if "weights" in self.info or any(bits == 4 for _, bits, _ in weight_layers(self)):
            text += "\n" + weights_report(self)
        return text

    def kernel_choices(self, kernels=None, target: str | None = None, *, deployment=None):
        """The steps of the C library for a deployment (tuple of :class:`corten.codegen.StepInfo`:
        module, op, provider, the kernel calls, MACs; ``reason`` says why a step does not run on the
        leading provider, e.g. a portable ``corten_*`` kernel in a CMSIS-NN build).  The emitter's own
        choice: nothing is written."""
        from corten.codegen import kernel_steps

        self._require_lowered("choose kernels")
        d = self.deployment(kernels, target, deployment=deployment)
        return kernel_steps(self.ep, self.memory_for(deployment=d), self.name, d,
                            node_sources=self.info.get("node_sources"))

    def choices_report(self, kernels: str = "generated", target: str | None = None) -> str:
        """Which kernel each step of a generated build (``kernels="generated"`` or
        ``"generated+cmsis-nn"``) runs - the layer's generated kernel or the fallback flavour's - and why."""
        from corten.codegen import choices_report

        return choices_report(self.kernel_choices(kernels, target), kernels)

    def fallback_report(self, target: str | None = None, *, deployment=None) -> str:
        """Which steps of a build (CMSIS-NN by default) fall back to later providers, and why."""
        from corten.codegen import fallback_report

        d = self.deployment(None, target, deployment=deployment)
        return fallback_report(self.kernel_choices(deployment=d), d.providers[0].title)


def weight_layers(prog) -> list[tuple[str, int, int]]:
    """``(module path or node name, weight bits, weight bytes in flash)`` of every weighted step of
    ``prog`` in program order (the cost hook's bytes: packed int4 counts half)."""
    from corten.ops.registry import op_cost, weight_bits

    tensors = prog.info.get("tensors") or {}
    rows = []
    for n in prog.module().graph.nodes:
        bits = weight_bits(n) if n.op == "call_function" else 0
        if bits:
            rows.append((tensors.get(n.name, {}).get("module", "") or n.name, bits, op_cost(n).weight_bytes))
    return rows


def weights_report(prog) -> str:
    """Flash by weight width and per layer: every weighted step's module, width and weight bytes,
    the totals per width and the other constants (biases, multipliers, tables); with the
    ``weights="auto"`` decisions when it chose them."""
    rows = weight_layers(prog)
    per_width: dict[int, int] = {}
    for _, bits, wb in rows:
        per_width[bits] = per_width.get(bits, 0) + wb
    total = int(prog.memory.constant_bytes)
    lines = [f"flash (constants) {total:,} B: " + ", ".join(f"int{b} weights {v:,} B" for b, v in sorted(per_width.items()))
             + f", other constants (biases, multipliers, tables) {total - sum(per_width.values()):,} B"]
    a = (prog.info.get("weights") or {}).get("auto")
    if a:
        lines.append(f"weights=auto: {len(a['int4_layers'])} layer(s) int4 to fit max_flash {a['max_flash']:,} B "
                     f"(int8 {a['int8_constant_bytes']:,} B -> {a['constant_bytes']:,} B), least int4 rounding "
                     "error (op-alone SQNR) per byte saved first")
    lines.append(f"  {'layer':<40} {'weights':>7} {'bytes':>10}")
    lines += [f"  {m[:40]:<40} {'int' + str(w):>7} {b:>10,}" for m, w, b in rows]
    return "\n".join(lines)
