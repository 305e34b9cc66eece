"""Corten's static memory plan: one arena, every int8 activation and kernel scratch at a fixed offset.

Model (what the C generator implements):

* **Steps.**  The C code runs the program's nodes in graph order.  A *step* is a node that does
  work in C: a Corten compute op, or a reshape that needs a copy (see :mod:`corten.memory.views`).
  Quantize/dequantize run in the caller; views (aliasing reshapes, slices that are one contiguous
  run of their input's bytes) cost nothing: they are placed at their input's offset plus the
  view's byte offset.
* **Regions.**  The int8 program input (the output of a ``quantize_per_tensor``) lives in the
  caller's input buffer (region ``"input"``, ``index`` = user-input number), the int8 tensor fed to
  a ``dequantize_per_tensor`` program output lives in the caller's output buffer (region
  ``"output"``, ``index`` = output number), everything else in the arena (region ``"arena"``).
  Offsets in ``"input"``/``"output"`` are from the start of that caller buffer (always 0).
* **A program output that other ops also read** stays in the caller's output buffer: that
  buffer exists for the whole run, so later steps read it there and the arena saves its bytes.
  The caller's buffers are assumed distinct from each other and from the arena.  When one set of
  bytes would have to be in two caller buffers (an output that *is* the program input, possibly
  through reshape aliases, or one tensor returned as two outputs) it stays in the first, and
  ``MemoryPlan.copies`` lists ``(tensor, output index)`` pairs the C code copies once all steps
  have run.
* **Lifetimes.**  A tensor is live from the step that writes it to the last step that reads it
  or any reshape alias of it, inclusive.  Scratch (``ctx.buf``) is live during its step only.
* **In place.**  The elementwise ops whose family declares it (hook ``in_place_inputs``: add, sub,
  mul, div, maximum/minimum, the LUT activations) may write their output over an input that dies
  at that step (``in_place=True``, :func:`in_place_merges`).  A step whose provider has an
  in-place kernel for it (:meth:`corten.providers.Provider.in_place_scratch`: the portable
  depthwise conv, channel by channel through a channel-sized temporary) writes its output over
  its dying first input (from its first byte) where that makes the arena smaller
  (:func:`in_place_kernel_candidates`, tried greedily from the most crowded step;
  ``plan.in_place_kernels``); its temporary is that step's scratch.  The output of a banded segment
  (an in-place ``quantized_cat``) may trail the segment input it consumes: placed ``shift`` bytes
  after that input's first byte (``shift <= 0``), each band writes its rows where input rows no
  later band reads were (:func:`cat_over_input_candidates`; ``plan.cats_over_inputs``), kept where
  the arena does not grow (several segments may share the peak).  No other op writes over its input.
* **Lower bound.**  ``max over steps of (arena tensors live at the step + its scratch)`` with every
  input and output of the step counted separately, i.e. without in-place sharing: no plan without
  in-place can go below it, and with in-place the arena may.
* **Alignment.**  Every arena offset is a multiple of ``alignment`` (16: safe for Helium 128-bit
  and DSP word accesses); sizes are rounded up to it for packing.
* **Memory regions.**  With a deployment's ``memory`` (:class:`corten.deployment.ArenaRegion`:
  DTCM, SRAM banks, ... fastest first) the arena is one buffer per region: every arena buffer
  (a tensor's storage, merged in-place chains included, or a step's scratch) lives in exactly one
  region (``TensorAlloc.memory``), offsets are from the start of that region's arena, and each
  region is packed on its own.  Hot, small buffers (scratch, then the smallest activations) take
  the fastest region first (:func:`corten.memory.placement.assign_regions`); ``plan.regions``
  gives each region's bytes, and a region over its size is named by :func:`check_budget`.
  ``arena_bytes`` is then the sum over the regions.
* ``constant_bytes``: every constant tensor the program reads (weights, biases, multipliers,
  shifts, kernel sums): the flash the model's data needs.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch.export import ExportedProgram

from corten.memory.placement import Buffer, align_up, assign_regions, pack
from corten.memory.tensors import CAT, MemoryPlanError, ProgramTensors, analyse
from corten.errors import UsageError
from corten.deployment import Deployment
from corten.providers import choose_provider
from corten.targets import Target

ALIGNMENT = 16
REGIONS = ("arena", "input", "output")


@dataclass(frozen=True)
class TensorAlloc:
    region: str  # "arena" | "input" | "output"
    offset: int  # bytes from the start of the region (arena, or caller buffer ``index``)
    nbytes: int
    index: int = 0  # caller buffer number for "input" / "output" (user input / output position)
    memory: str = ""  # the memory region of an "arena" buffer ("": the one arena of a plan without regions)


@dataclass(frozen=True)
class RegionPlan:
    """One memory region's arena: its planned bytes, its capacity (None: no limit), linker section."""

    name: str
    nbytes: int
    capacity: int | None
    section: str
    memory: str  # the linker MEMORY region of the generated fragment
    rank: int

    @property
    def over(self) -> int:
        """Bytes over the capacity (0 when it fits)."""
        return max(0, self.nbytes - self.capacity) if self.capacity is not None else 0


@dataclass
class MemoryPlan:
    arena_bytes: int
    lower_bound_bytes: int
    constant_bytes: int
    alignment: int
    peak_step: int  # step with the most live bytes (the lower bound's step); -1 if no steps
    peak_node: str
    tensors: dict[str, TensorAlloc]  # every int8 activation node (reshape aliases included)
    scratch: dict[str, TensorAlloc]  # step node -> its scratch buffer (steps needing none are absent)
    steps: list[int]  # per step: live arena tensor bytes + scratch, counted without in-place sharing
    step_nodes: list[str] = field(default_factory=list)  # node name of each step
    step_ops: list[str] = field(default_factory=list)  # Corten op name (or "reshape_copy") of each step
    lifetimes: dict[str, tuple[int, int]] = field(default_factory=dict)  # tensor -> (first, last) step
    in_place: dict[str, str] = field(default_factory=dict)  # output tensor -> the input whose bytes it reuses (in-place elementwise ops and kernels)
    in_place_kernels: tuple[str, ...] = ()  # steps running their provider's in-place kernel (over their first input)
    cats_over_inputs: dict[str, tuple[str, int]] = field(default_factory=dict)  # banded cat -> (the input whose consumed rows it reuses, byte shift)
    copies: list[tuple[str, int]] = field(default_factory=list)  # (tensor, output index) copied at the end
    target: str = ""
    isa: str = ""
    strategy: str = ""  # the packing order that won (see corten.memory.placement)
    kernels: str = "cmsis-nn"  # the provider chain planned for (corten.providers.chain_label)
    step_providers: list[str] = field(default_factory=list)  # the provider running each step
    placed_cats: tuple[str, ...] = ()  # quantized_cat nodes placed in place (no C code; see tensors.analyse)
    schedule: object = None  # the banded schedule (corten.memory.banding.Schedule) the program runs, if any
    regions: list[RegionPlan] = field(default_factory=list)  # the memory regions' arenas ([]: one arena)

    def region_of(self, name: str) -> RegionPlan | None:
        return next((r for r in self.regions if r.name == name), None)

    @property
    def ratio(self) -> float:
        """arena / lower bound (below 1.0 thanks to in-place elementwise ops)."""
        return self.arena_bytes / self.lower_bound_bytes if self.lower_bound_bytes else 1.0

    def region_bytes(self, region: str) -> int:
        """Total bytes of the caller buffers of ``region`` ("input" or "output")."""
        sizes: dict[int, int] = {}
        for a in self.tensors.values():
            if a.region == region:
                sizes[a.index] = max(sizes.get(a.index, 0), a.nbytes)
        return sum(sizes.values())

    def live_tensors(self, step: int) -> list[str]:
        """Arena tensors live at ``step`` (reshape aliases listed under the tensor they alias)."""
        return [name for name, (first, last) in self.lifetimes.items()
                if first <= step <= last and self.tensors[name].region == "arena"]

    def peak_description(self) -> str:
        if self.peak_step < 0:
            return "no steps"
        live = ", ".join(f"{n} ({self.tensors[n].nbytes:,} B)" for n in self.live_tensors(self.peak_step))
        scratch = self.scratch.get(self.peak_node)
        extra = f"; scratch {scratch.nbytes:,} B" if scratch else ""
        return (f"peak at step {self.peak_step} '{self.peak_node}' ({self.step_ops[self.peak_step]}): "
                f"{self.steps[self.peak_step]:,} B live: {live or 'nothing'}{extra}")

    def summary(self) -> dict:
        return {
            "target": self.target,
            "isa": self.isa,
            "kernels": self.kernels,
            "arena_bytes": self.arena_bytes,
            "lower_bound_bytes": self.lower_bound_bytes,
            "ratio": round(self.ratio, 4),
            "constant_bytes": self.constant_bytes,
            "input_bytes": self.region_bytes("input"),
            "output_bytes": self.region_bytes("output"),
            "alignment": self.alignment,
            "peak_step": self.peak_step,
            "peak_node": self.peak_node,
            "num_steps": len(self.steps),
            "num_tensors": len(self.tensors),
            "max_scratch_bytes": max((a.nbytes for a in self.scratch.values()), default=0),
            "in_place_adds": len(self.in_place),
            "in_place_kernels": len(self.in_place_kernels),
            "strategy": self.strategy,
            **({"regions": {r.name: r.nbytes for r in self.regions}} if self.regions else {}),
        }

    def plot(self, path, budget: int | None = None):
        """The memory timeline as a PNG at ``path`` (:func:`plot_timeline`)."""
        return plot_timeline(self, path, budget if budget is not None else getattr(self.schedule, "budget", None))

    def report(self) -> str:
        lines = [
            f"Corten memory plan ({self.target or '?'}, isa {self.isa or '?'}, {self.kernels} kernels)",
            f"  arena              {self.arena_bytes:>12,} B",
            f"  lower bound        {self.lower_bound_bytes:>12,} B   (arena / lower bound = {self.ratio:.4f})",
            f"  constant (flash)   {self.constant_bytes:>12,} B",
            f"  caller input       {self.region_bytes('input'):>12,} B   output {self.region_bytes('output'):,} B",
            f"  alignment          {self.alignment:>12} B   steps {len(self.steps)}, in-place steps "
            f"{len(self.in_place)}, packing order '{self.strategy}'",
        ]
        for r in self.regions:
            cap = f"of {r.capacity:,} B" if r.capacity is not None else "(no limit)"
            lines.append(f"  region {r.name:<11} {r.nbytes:>12,} B   {cap}, section {r.section} -> {r.memory}"
                         + (f"  OVER by {r.over:,} B" if r.over else ""))
        if self.schedule is not None:
            lines += self.schedule.report_lines()
        if self.copies:
            lines.append("  output copies      " + ", ".join(f"{t} -> output {k}" for t, k in self.copies))
        if self.peak_step < 0:
            lines.append("  no steps: nothing runs in the arena")
            return "\n".join(lines)
        lines.append(f"  peak: step {self.peak_step} '{self.peak_node}' ({self.step_ops[self.peak_step]}), "
                     f"{self.steps[self.peak_step]:,} B live")
        where = (lambda a: f"  {a.memory}") if self.regions else (lambda a: "")
        lines.append(f"    {'tensor':<40} {'offset':>10} {'bytes':>10}  lifetime")
        for name in self.live_tensors(self.peak_step):
            a = self.tensors[name]
            first, last = self.lifetimes[name]
            lines.append(f"    {name:<40} {a.offset:>10,} {a.nbytes:>10,}  steps {first}..{last}{where(a)}")
        scratch = self.scratch.get(self.peak_node)
        if scratch:
            lines.append(f"    {'(scratch)':<40} {scratch.offset:>10,} {scratch.nbytes:>10,}  "
                         f"step {self.peak_step}{where(scratch)}")
        return "\n".join(lines)


def plot_timeline(plan: "MemoryPlan", path, budget: int | None = None):
    """Draw ``plan``'s memory timeline as a PNG: live arena bytes per step (tensors + scratch,
    without in-place sharing), the arena, the layer-by-layer lower bound and ``budget``; banded
    segments shaded.  Returns the path."""
    from pathlib import Path

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = Path(path)
    sched = plan.schedule
    before = sched.arena_before if sched is not None and sched.arena_before else None
    fig, ax = plt.subplots(figsize=(10, 4))
    ax.step(range(len(plan.steps)), [b / 1024 for b in plan.steps], where="mid", label="live bytes per step")
    ax.axhline(plan.arena_bytes / 1024, color="tab:green", ls="-", lw=1, label=f"arena {plan.arena_bytes:,} B")
    for r in plan.regions:  # each region's own live bytes and arena
        live = region_live_bytes(plan, r.name)
        line = ax.step(range(len(live)), [b / 1024 for b in live], where="mid", lw=1,
                       label=f"region {r.name}: live bytes")[0]
        ax.axhline(r.nbytes / 1024, color=line.get_color(), ls="-.", lw=1,
                   label=f"region {r.name} arena {r.nbytes:,} B"
                   + (f" of {r.capacity:,} B" if r.capacity is not None else ""))
    if before:
        ax.axhline(before / 1024, color="tab:red", ls=":", label=f"layer-by-layer lower bound {before:,} B")
    else:
        ax.axhline(plan.lower_bound_bytes / 1024, color="tab:red", ls=":",
                   label=f"lower bound {plan.lower_bound_bytes:,} B")
    if budget is not None:
        ax.axhline(budget / 1024, color="black", ls="--", label=f"budget {budget:,} B")
    if sched is not None and sched.segments:
        ax.text(0.01, 0.95, f"{len(sched.segments)} banded segment(s), +{sched.extra_macs_pct:.2f}% MACs",
                transform=ax.transAxes, va="top")
    ax.set_xlabel("step")
    ax.set_ylabel("KiB")
    ax.set_title(f"Corten memory timeline ({plan.target}, {plan.kernels} kernels)")
    ax.legend(loc="upper right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def region_live_bytes(plan: "MemoryPlan", region: str) -> list[int]:
    """Bytes of ``region``'s arena live at each step (tensors, in-place sharing included, + scratch)."""
    owners: dict[tuple[int, int], tuple[int, int]] = {}
    for name, a in plan.tensors.items():
        if a.region == "arena" and a.memory == region:
            first, last = plan.lifetimes[name]
            span = owners.setdefault((a.offset, a.nbytes), (first, last))
            owners[(a.offset, a.nbytes)] = (min(span[0], first), max(span[1], last))
    live = [sum(nb for (_, nb), (f, l) in owners.items() if f <= s <= l) for s in range(len(plan.steps))]
    for node, a in plan.scratch.items():
        if a.memory == region:
            live[plan.step_nodes.index(node)] += a.nbytes
    return live


def step_scratch_bytes(prog: ProgramTensors, target: Target, providers) -> tuple[list[int], list[str]]:
    """(scratch bytes of each step, the provider running it): each node's first supporting provider
    of the chain (:func:`corten.providers.choose_provider`, the emitter's choice) and its
    ``scratch_bytes`` (CMSIS-NN's ``*_get_buffer_size`` formulas for the target's ISA, ...).
    Layout copies run Corten's portable kernels, which take no scratch."""
    sizes, names = [], []
    for node, op_name in zip(prog.steps, prog.op_names):
        if op_name == "reshape_copy":
            sizes.append(0)
            names.append("portable")
            continue
        try:
            provider, _ = choose_provider(providers, node, target)
        except UsageError as e:
            raise MemoryPlanError(f"memory plan: {e}") from None
        n = int(provider.scratch_bytes(node, target))
        if n < 0:
            raise MemoryPlanError(f"memory plan: scratch_bytes of {node.name!r} ({op_name}) by provider "
                                  f"{provider.name!r} is negative: {n}")
        sizes.append(n)
        names.append(provider.name)
    return sizes, names


def live_bytes_per_step(prog: ProgramTensors, scratch: list[int]) -> list[int]:
    """Arena bytes live at each step without in-place sharing (the lower bound's terms)."""
    arena = [c for c in prog.classes.values() if c.region == "arena"]
    return [sum(c.nbytes for c in arena if c.first <= s <= c.last) + scratch[s] for s in range(len(prog.steps))]


def in_place_merges(prog: ProgramTensors) -> dict[str, str]:
    """``{output root: input root}`` for each op whose family declares (hook ``"in_place_inputs"``)
    that its kernel may write over an input, where that input dies at the op (same size, in the
    arena, written by an earlier step, no other operand of the op reading those bytes through a
    view): quantized_add / sub / mul / div / maximum / minimum, quantized_lut."""
    from corten.ops.registry import all_op_names, hook_for

    corten_ops = set(all_op_names())
    merges: dict[str, str] = {}
    for s, (node, op_name) in enumerate(zip(prog.steps, prog.op_names)):
        hook = hook_for(op_name, "in_place_inputs") if op_name in corten_ops else None
        if hook is None:
            continue
        out = prog.classes[prog.class_of[node.name]]
        if out.region != "arena":
            continue
        allowed = tuple(hook(node))
        for i in allowed:
            arg = node.args[i]
            cls = prog.classes[prog.class_of[arg.name]]
            whole = prog.nbytes[arg.name] == cls.nbytes and not prog.view_offset.get(arg.name)  # not a slice view
            # another operand reading these bytes through a view (e.g. a broadcast slice of the same
            # tensor) would see bytes already overwritten: only the same full operand may repeat
            shared = any(isinstance(a, torch.fx.Node) and a.name in prog.class_of
                         and prog.class_of[a.name] == cls.root and not (j in allowed and a.name == arg.name)
                         for j, a in enumerate(node.args) if j != i)
            if (cls.region == "arena" and cls.last == s and cls.first < s and cls.nbytes == out.nbytes and whole
                    and not shared):
                merges[out.root] = cls.root
                break
    return merges


def in_place_kernel_candidates(prog: ProgramTensors, target: Target, providers: list, merges: dict[str, str],
                               ) -> dict[int, tuple[str, str, int]]:
    """``{step: (output root, input root, temporary bytes)}`` of the steps that could run their
    provider's in-place kernel: the provider has one for the node, the node's output is its own
    arena tensor, and its first input is a whole arena tensor (not a view into a larger one) written
    by an earlier step that dies at this step."""
    found: dict[int, tuple[str, str, int]] = {}
    merged_inputs = set(merges.values())
    for s, (node, provider) in enumerate(zip(prog.steps, providers)):
        if provider is None or not node.args or not isinstance(node.args[0], torch.fx.Node):
            continue
        temp = provider.in_place_scratch(node, target)
        if temp is None or node.name not in prog.class_of or prog.class_of[node.name] != node.name:
            continue
        out = prog.classes[node.name]
        arg = node.args[0]
        if out.region != "arena" or node.name in merges or arg.name not in prog.class_of:
            continue
        cls = prog.classes[prog.class_of[arg.name]]
        whole = prog.nbytes[arg.name] == cls.nbytes and not prog.view_offset.get(arg.name)
        others = any(isinstance(a, torch.fx.Node) and prog.class_of.get(a.name) == cls.root for a in node.args[1:])
        if (cls.region == "arena" and cls.last == s and cls.first < s and whole and not others
                and out.nbytes <= cls.nbytes and cls.root not in merged_inputs):
            found[s] = (out.root, cls.root, int(temp))
    return found


def cat_over_input_candidates(prog: ProgramTensors, merges: dict[str, str], alignment: int,
                              ) -> dict[str, tuple[str, int]]:
    """``{cat root: (input root, shift)}``: an in-place cat (the output of a banded segment, its bands
    written at their steps) may be placed ``shift`` bytes from the first byte of an arena tensor that
    dies while the bands run, when no band writes bytes of that tensor which a later step (or the
    writing step itself) still reads: ``shift`` is the largest multiple of ``alignment``, at most 0,
    with every band's bytes ``[shift + o, shift + o + n)`` below every read of the input from that
    band's step on.  Only tensors written before the first band, not the target of another merge; of
    those, the one live longest while the bands write, then the largest saving.  Cats spanning the
    most steps (segment outputs) choose first; a band's own cat of its carried halo copy and new rows
    is not offered one (the halo copy's source dies a step before it)."""
    step_of = {n.name: i for i, n in enumerate(prog.steps)}
    reads: dict[str, list[tuple[int, int, int]]] = {}  # root -> (step, first byte, end byte) of each read
    for s, node in enumerate(prog.steps):
        for a in node.all_input_nodes:
            root = prog.class_of.get(a.name)
            if root is not None:
                lo = prog.view_offset.get(a.name, 0)
                reads.setdefault(root, []).append((s, lo, lo + prog.nbytes[a.name]))
    taken = set(merges.values())  # (bytes another op writes over in place)
    found: dict[str, tuple[str, int]] = {}
    def span(cat):  # the steps its parts are written over (a segment's output: all its bands)
        w = [step_of[r] for r in prog.placed_cats[cat]]
        return max(w) - min(w)

    for cat, roots in sorted(prog.placed_cats.items(), key=lambda kv: (-span(kv[0]), -prog.classes[kv[0]].nbytes)):
        out = prog.classes[cat]
        if out.region != "arena" or any(prog.op_names[step_of[r]] == CAT for r in roots):
            continue  # (a band's halo copy + its new rows: the halo's source dies a step before)
        writes = [(step_of[r], prog.view_offset.get(r, 0), prog.view_offset.get(r, 0) + prog.nbytes[r]) for r in roots]
        first_w, last_w = min(w for w, _, _ in writes), max(w for w, _, _ in writes)
        best = None
        for root, cls in prog.classes.items():
            if (root == cat or cls.region != "arena" or root in taken or not cls.first < first_w <= cls.last <= last_w
                    or any(step_of.get(r, -1) >= first_w for r in prog.placed_cats.get(root, ()))):
                continue
            shift = min([0] + [lo - end for w, _, end in writes for s, lo, _ in reads.get(root, ()) if s >= w])
            shift = shift // alignment * alignment  # (rounded down)
            saved = cls.nbytes + out.nbytes - (max(cls.nbytes, shift + out.nbytes) - shift)
            along = min(cls.last, last_w) - first_w  # steps it stays live while the bands write
            if saved > 0 and (best is None or (along, saved) > best[2]):
                best = (root, shift, (along, saved))
        if best is not None:
            found[cat] = (best[0], best[1])
            taken.add(best[0])
    return found


@dataclass
class _Layout:
    offsets: dict[str, int]
    memory: dict[str, str]  # buffer key -> its region ("" without regions)
    regions: list[RegionPlan]
    arena_bytes: int
    strategy: str

    @property
    def cost(self) -> tuple[int, int]:
        """What the planner minimises: bytes over the regions' sizes, then arena bytes."""
        return sum(r.over for r in self.regions), self.arena_bytes


def _positions(prog: ProgramTensors, merges: dict[str, str], shifts: dict[str, int]) -> dict[str, tuple[str, int]]:
    """``{arena class root: (owner, byte of the class in the owner's buffer)}``: each in-place chain
    (``merges``: output -> the input whose bytes it reuses, ``shifts``: its byte shift from that
    input's first byte, 0 unless given) is one buffer, starting at its lowest member."""
    pos: dict[str, tuple[str, int]] = {}

    def at(root: str) -> tuple[str, int]:
        if root not in pos:
            if root in merges:
                owner, p = at(merges[root])
                pos[root] = (owner, p + shifts.get(root, 0))
            else:
                pos[root] = (root, 0)
        return pos[root]

    for cls in prog.classes.values():
        if cls.region == "arena":
            at(cls.root)
    low: dict[str, int] = {}
    for root, (owner, p) in pos.items():
        low[owner] = min(low.get(owner, 0), p)
    return {root: (owner, p - low[owner]) for root, (owner, p) in pos.items() if prog.classes[root].region == "arena"}


def _pack_layout(prog: ProgramTensors, merges: dict[str, str], scratch_sizes: list[int], deployment: Deployment,
                 alignment: int, shifts: dict[str, int] | None = None) -> _Layout:
    """Offsets of every arena buffer: the storage classes (each in-place chain one buffer spanning its
    members at their positions, :func:`_positions`) and the scratch buffers, packed into one arena or
    split over the regions."""
    spans: dict[str, list[int]] = {}  # owner -> [first, last, size]
    parts: dict[str, list[tuple[int, int, int, int]]] = {}  # owner -> its members' (byte, size, first, last)
    positions = _positions(prog, merges, shifts or {})
    shifted = {positions[root][0] for root in (shifts or {}) if root in positions}
    for root, (owner, p) in positions.items():
        cls = prog.classes[root]
        span = spans.setdefault(owner, [cls.first, cls.last, 0])
        span[0], span[1] = min(span[0], cls.first), max(span[1], cls.last)
        span[2] = max(span[2], p + cls.nbytes)
        if owner in shifted:  # (a chain with a shifted member is busy only where its members live)
            parts.setdefault(owner, []).append((p, align_up(cls.nbytes, alignment), cls.first, cls.last))
    buffers = [Buffer(key, align_up(size, alignment), first, last, tuple(sorted(parts.get(key, ()))))
               for key, (first, last, size) in spans.items()]
    buffers += [Buffer(f"scratch:{prog.steps[s].name}", align_up(n, alignment), s, s)
                for s, n in enumerate(scratch_sizes) if n > 0]
    memory: dict[str, str] = {}
    regions: list[RegionPlan] = []
    if deployment.memory:
        where, offsets, strategy = assign_regions(buffers, [r.size for r in deployment.memory])
        memory = {b.key: deployment.memory[r].name for b, r in zip(buffers, where)}
        for r in deployment.memory:
            nbytes = max((offsets[b.key] + b.size for b in buffers if memory[b.key] == r.name), default=0)
            regions.append(RegionPlan(r.name, nbytes, r.size, r.section_name, r.memory_name, r.rank))
        arena_bytes = sum(r.nbytes for r in regions)
    else:
        offsets, strategy = pack(buffers)
        arena_bytes = max((offsets[b.key] + b.size for b in buffers), default=0)
    return _Layout(offsets, memory, regions, arena_bytes, strategy)


def plan_memory(ep: ExportedProgram, deployment: "Deployment | Target | str", *, in_place: bool = True,
                alignment: int = ALIGNMENT, kernels=None, in_place_cats: bool = False) -> MemoryPlan:
    """Plan every int8 activation and scratch buffer of the lowered program ``ep`` for a
    :class:`~corten.deployment.Deployment`: its core's ISA and its kernel providers (each step gets
    the scratch of the provider that runs it: CMSIS-NN's ``*_get_buffer_size*`` formulas for the
    ISA; Corten's portable kernels take none but the LSTM's).

    ``ep`` may also be a :class:`corten.program.Program` (its ``.ep`` is planned).  Conveniences: a
    :class:`~corten.targets.Target` or target name with ``kernels`` (a provider name or chain,
    default "cmsis-nn") instead of the deployment.  ``in_place=False`` turns off in-place adds
    (for measurements).  ``in_place_cats``: place the band outputs of a banded schedule straight
    into their ``quantized_cat`` (:func:`corten.memory.tensors.analyse`)."""
    try:
        deployment = Deployment.coerce(deployment, kernels, default_kernels="cmsis-nn")
    except UsageError as e:
        raise MemoryPlanError(f"memory plan: {e}") from None
    providers, target = deployment.providers, deployment.target
    ep = getattr(ep, "ep", ep)
    prog = analyse(ep, in_place_cats=in_place_cats)
    scratch_sizes, step_providers = step_scratch_bytes(prog, target, providers)

    merges = in_place_merges(prog) if in_place else {}
    layout = _pack_layout(prog, merges, scratch_sizes, deployment, alignment)
    kernels_in_place: list[str] = []
    if in_place:  # in-place kernels, from the most crowded step, kept where the arena shrinks
        by_name = {p.name: p for p in providers}
        chosen = [by_name.get(name) if op != "reshape_copy" else None
                  for name, op in zip(step_providers, prog.op_names)]
        candidates = in_place_kernel_candidates(prog, target, chosen, merges)
        crowd = live_bytes_per_step(prog, scratch_sizes)
        for s in sorted(candidates, key=lambda s: (-crowd[s], s)):
            out_root, in_root, temp = candidates[s]
            if in_root in merges.values():  # (another in-place step already reuses those bytes)
                continue
            trial_merges = {**merges, out_root: in_root}
            trial_scratch = scratch_sizes[:s] + [temp] + scratch_sizes[s + 1:]
            trial = _pack_layout(prog, trial_merges, trial_scratch, deployment, alignment)
            if trial.cost < layout.cost:
                merges, scratch_sizes, layout = trial_merges, trial_scratch, trial
                kernels_in_place.append(prog.steps[s].name)
    shifts: dict[str, int] = {}
    cats_over: dict[str, tuple[str, int]] = {}
    if in_place and prog.placed_cats:  # banded segment outputs over the input rows they consumed
        candidates = {cat: c for cat, c in cat_over_input_candidates(prog, merges, alignment).items()
                      if c[0] not in merges.values()}
        all_merges = {**merges, **{cat: root for cat, (root, _) in candidates.items()}}
        all_shifts = {cat: shift for cat, (_, shift) in candidates.items()}
        trial = _pack_layout(prog, all_merges, scratch_sizes, deployment, alignment, all_shifts) if candidates else None
        if trial is not None and trial.cost <= layout.cost:  # all of them at once (one packing), else one by one
            merges, shifts, layout, cats_over, candidates = all_merges, all_shifts, trial, dict(candidates), {}
        for cat, (in_root, shift) in candidates.items():
            trial_merges, trial_shifts = {**merges, cat: in_root}, {**shifts, cat: shift}
            trial = _pack_layout(prog, trial_merges, scratch_sizes, deployment, alignment, trial_shifts)
            if trial.cost <= layout.cost:  # (not worse: several segments may share the peak)
                merges, shifts, layout = trial_merges, trial_shifts, trial
                cats_over[cat] = (in_root, shift)
    live = live_bytes_per_step(prog, scratch_sizes)
    offsets, memory, regions, arena_bytes, strategy = (layout.offsets, layout.memory, layout.regions,
                                                       layout.arena_bytes, layout.strategy)
    position = _positions(prog, merges, shifts)

    tensors: dict[str, TensorAlloc] = {}
    lifetimes: dict[str, tuple[int, int]] = {}
    for name, root in prog.class_of.items():
        cls = prog.classes[root]
        arena = cls.region == "arena"
        owner, at = position[root] if arena else ("", 0)
        offset = (offsets[owner] + at if arena else 0) + prog.view_offset.get(name, 0)
        tensors[name] = TensorAlloc(cls.region, offset, prog.nbytes[name], cls.index,
                                    memory.get(owner, "") if arena else "")
        lifetimes[name] = (cls.first, cls.last)
    scratch = {}
    for s, n in enumerate(scratch_sizes):
        if n > 0:
            key = f"scratch:{prog.steps[s].name}"
            scratch[prog.steps[s].name] = TensorAlloc("arena", offsets[key], n, 0, memory.get(key, ""))

    peak = max(range(len(live)), key=lambda s: (live[s], -s)) if live else -1
    return MemoryPlan(
        arena_bytes=arena_bytes,
        lower_bound_bytes=max(live, default=0),
        constant_bytes=prog.constant_bytes,
        alignment=alignment,
        peak_step=peak,
        peak_node=prog.steps[peak].name if peak >= 0 else "",
        tensors=tensors,
        scratch=scratch,
        steps=live,
        step_nodes=[n.name for n in prog.steps],
        step_ops=list(prog.op_names),
        lifetimes=lifetimes,
        in_place={out: src for out, src in merges.items() if out not in cats_over},
        cats_over_inputs=cats_over,
        in_place_kernels=tuple(n for n in (s.name for s in prog.steps) if n in kernels_in_place),
        copies=list(prog.copies),
        target=target.name,
        isa=target.isa,
        kernels=deployment.kernels,
        step_providers=step_providers,
        strategy=strategy,
        placed_cats=tuple(prog.placed_cats),
        regions=regions,
    )
