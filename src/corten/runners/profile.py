"""Per-layer profile of a generated model library: what each step of ``<name>_run`` costs.

The profile build compiles the model with ``-DCORTEN_PROFILE``: the generated ``<name>_run`` then
calls ``<name>_profile_step(k)`` before the first step (k = 0) and after every step k, and the
harness (``harness/main.c``) stores the timer there - SysTick under QEMU ``-icount`` (instructions,
see :mod:`corten.runners.qemu`), ``CLOCK_MONOTONIC`` on the host (nanoseconds).  A step's cost is
the timer delta since the previous hook minus the hook's own cost, which the harness measures
before the run as the delta of 32 back-to-back hook calls.  Outside the hooks nothing changes: the
model's kernels, arguments and memory are those of the normal build, and the outputs are checked
against the reference like any C run.

Error of a QEMU row: one SysTick tick (31.25 instructions on the M55 board, 40 on the 25 MHz
boards, 50 on mps2-an505) either way, plus the few instructions by which a step's hook call differs
from the calibration calls (argument setup); the sum of the rows is the run between the first and
the last hook, i.e. the uninstrumented run without ``<name>_run``'s argument checks and return.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from corten.errors import CRunError

_OVERHEAD_RE = re.compile(r"CORTEN_PROFILE overhead=(\d+) calls=(\d+)")
_STEP_RE = re.compile(r"CORTEN_STEP (\d+) (\d+)")


@dataclass(frozen=True)
class ProfileRow:
    """One step of ``<name>_run``."""

    step: int  # 1-based step number (the "Step k" comment in <name>.c)
    module: str  # PyTorch module path ("" for the root module's forward)
    op: str  # Corten op (or "reshape (layout copy)", "output_copy")
    kernel: str  # the (first) function the step calls: arm_* (CMSIS-NN), corten_* (portable), ...
    macs: int  # multiply-accumulates (0 for data movement)
    cost: float  # instructions (QEMU) or nanoseconds (host), hook cost subtracted
    source: str = ""  # file.py:line in fn
    node: str = ""  # graph node name
    provider: str = "portable"  # the kernel provider running the step ("" for the generator's own copy)
    cycles: float | None = None  # estimated cycles (profile(..., cycles=True); corten.runners.cycles)
    why: str = ""  # how the kernel computes the step and why the providers before it do not (StepInfo)

    @property
    def portable(self) -> bool:
        return self.provider in ("portable", "")

    @property
    def per_mac(self) -> float | None:
        return self.cost / self.macs if self.macs else None


@dataclass
class Profile:
    """Rows of one instrumented run (``Program.profile``), plus the uninstrumented run's total when
    it was measured (``baseline``) and whether both runs' outputs equal the reference bytes."""

    model: str
    on: str  # "qemu" or "host"
    target: str | None
    kernels: str
    unit: str  # "instructions" (QEMU) or "ns" (host)
    rows: list[ProfileRow] = field(default_factory=list)
    hook_cost: float = 0.0  # per hook call, subtracted from every row
    baseline: float | None = None  # the uninstrumented run (instructions, or ns on the host)
    outputs_match: bool | None = None  # both runs byte-identical to Program.run_int8
    cycles_core: str | None = None  # the timing table of the rows' cycle estimates (None: not estimated)

    @property
    def total_cycles(self) -> float | None:
        if self.cycles_core is None:
            return None
        return float(sum(r.cycles or 0.0 for r in self.rows))

    @property
    def total(self) -> float:
        return float(sum(r.cost for r in self.rows))

    @property
    def ratio(self) -> float | None:
        """Sum of the rows / the uninstrumented run (1.0 = identical)."""
        return self.total / self.baseline if self.baseline else None

    def table(self, mhz: float | None = None) -> str:
        """The rows as text; with cycle estimates, also cycles and, at ``mhz`` MHz, milliseconds."""
        unit = "instr" if self.unit == "instructions" else "ns"
        where = f"QEMU {self.target}" if self.on == "qemu" else "host"
        cyc = self.cycles_core is not None
        extra = (f" {'est. cycles':>13}" + (f" {'ms @' + format(mhz, 'g') + 'MHz':>11}" if mhz else "")) if cyc else ""
        head = (f"{'#':>4}  {'module':<28} {'op':<26} {'kernel':<34} {'MACs':>11} {unit:>13} {'share':>6} "
                f"{unit + '/MAC':>10}" + extra)
        lines = [f"Per-step profile of {self.model} on {where}, {self.kernels} kernels "
                 f"(hook cost {self.hook_cost:.1f} {unit} per step subtracted)", head, "-" * len(head)]
        total = self.total or 1.0
        for r in self.rows:
            per = f"{r.per_mac:.2f}" if r.per_mac is not None else "-"
            tail = ""
            if cyc:
                tail = f" {r.cycles or 0:>13,.0f}" + (f" {(r.cycles or 0) / (mhz * 1e3):>11.3f}" if mhz else "")
            lines.append(f"{r.step:>4}  {(r.module or '(forward)')[:28]:<28} {r.op[:26]:<26} {r.kernel[:34]:<34} "
                         f"{r.macs:>11,} {r.cost:>13,.0f} {100 * r.cost / total:>5.1f}% {per:>10}{tail}")
        lines.append("-" * len(head))
        macs = sum(r.macs for r in self.rows)
        per = f"{self.total / macs:.2f}" if macs else "-"
        tail = ""
        if cyc:
            tc = self.total_cycles or 0.0
            tail = f" {tc:>13,.0f}" + (f" {tc / (mhz * 1e3):>11.3f}" if mhz else "")
        lines.append(f"{'':>4}  {'total':<28} {'':<26} {'':<34} {macs:>11,} {self.total:>13,.0f} {'100.0%':>6} "
                     f"{per:>10}{tail}")
        if cyc:
            lines.append(f"estimated cycles: the executed instruction mix costed with the {self.cycles_core} timing "
                         "table (corten.runners.cycles; conservative, no caches or wait states)")
        if self.baseline is not None:
            lines.append(f"uninstrumented run: {self.baseline:,.0f} {unit}; sum of the steps = "
                         f"{100 * self.ratio:.2f}% of it")
        portable = [r for r in self.rows if r.portable and r.cost]  # steps that ran portable kernel code
        if self.kernels != "portable" and portable:
            cost = sum(r.cost for r in portable)
            lines.append(f"portable kernels in this {_build_title(self.kernels)} build: {len(portable)} compute "
                         "step(s), "
                         f"{100 * cost / total:.1f}% of the total")
        chosen = [r for r in self.rows if r.why and (r.macs or r.provider not in ("portable", ""))]
        if chosen and self.kernels != "portable":  # which library (and generated strategy) ran each layer, why
            lines.append(f"kernel choices ({self.kernels}):")
            lines += [f"  step {r.step:>3}  {r.provider or 'portable':<10} {r.kernel[:34]:<34} {r.why}" for r in chosen]
        if self.outputs_match is not None:
            lines.append(f"outputs byte-identical to the Python reference: {'YES' if self.outputs_match else 'NO'}")
        return "\n".join(lines)

    def top(self, k: int = 5) -> list[ProfileRow]:
        return sorted(self.rows, key=lambda r: -r.cost)[:k]

    def plot(self, path: str | Path) -> Path:
        """Bar chart of every step's cost (PNG; CMSIS-NN and portable kernels in two colours)."""
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        path = Path(path)
        scale, unit = (1e6, "M instructions") if self.unit == "instructions" else (1e3, "µs")
        labels = [f"{r.step}: {r.module or r.op}"[:40] for r in self.rows]
        fig, ax = plt.subplots(figsize=(max(6.0, 0.22 * len(self.rows) + 2), 4.8))
        xs = list(range(len(self.rows)))
        colours = ["tab:orange" if r.portable else "tab:blue" for r in self.rows]
        ax.bar(xs, [r.cost / scale for r in self.rows], color=colours)
        ax.set_xticks(xs)
        ax.set_xticklabels(labels, rotation=80, ha="right", fontsize=6)
        ax.set_ylabel(unit)
        where = f"QEMU {self.target}" if self.on == "qemu" else "host"
        ax.set_title(f"{self.model} on {where}, {self.kernels} kernels: {self.total / scale:,.2f} {unit}")
        if self.kernels != "portable":
            from matplotlib.patches import Patch

            ax.legend(handles=[Patch(color="tab:blue", label=_build_title(self.kernels)),
                               Patch(color="tab:orange", label="portable")])
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)
        return path


def parse_profile(log: str, steps, per_tick: float, where: str) -> tuple[list[float], float]:
    """(cost of every step, hook cost) from the harness output of a profile build; ``per_tick``
    converts timer units (SysTick ticks: instructions per tick; host ns: 1)."""
    m = _OVERHEAD_RE.search(log)
    stamps = {int(k): int(t) for k, t in _STEP_RE.findall(log)}
    if m is None or sorted(stamps) != list(range(len(steps) + 1)):
        raise CRunError(f"{where}: the profile build printed no complete step record (expected steps 0..{len(steps)}, "
                        f"got {len(stamps)} line(s)); was the model emitted by this Corten?")
    hook = int(m.group(1)) * per_tick / int(m.group(2))
    costs = [(stamps[k] - stamps[k - 1]) * per_tick - hook for k in range(1, len(steps) + 1)]
    return costs, hook


def profile_rows(steps, costs, cycles=None) -> list[ProfileRow]:
    """One row per step; ``cycles``: the estimated cycles of each step (a profile build's estimate)."""
    cyc = list(cycles) if cycles is not None else [None] * len(steps)
    cyc += [None] * (len(steps) - len(cyc))
    return [ProfileRow(s.step, s.module, s.op, s.kernel, s.macs, c, s.source, s.node, s.provider, k,
                       "; ".join(x for x in (getattr(s, "note", ""), s.reason) if x))
            for s, c, k in zip(steps, costs, cyc)]


def _build_title(kernels: str) -> str:
    """How reports name a build's leading provider ("CMSIS-NN" for "cmsis-nn")."""
    from corten.providers import get_provider, provider_names

    lead = kernels.split("+")[0]
    return get_provider(lead).title if lead in provider_names() else lead
