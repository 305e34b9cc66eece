"""Banded schedules: run chains of ops in row bands so the arena fits a budget (MCUNetV2-style
patch-based inference on row tiles; issue 10).

Layer by layer, the arena cannot go below the live-set lower bound (a layer's input + output +
scratch).  A *segment* is a run of consecutive steps (convolutions, depthwise convolutions,
same-shape adds and LUT activations on ``N == 1`` NHWC tensors) whose intermediate tensors are
read only inside it.  It runs as ``B`` *bands*: band ``b`` computes output rows ``[r_b, r_b+1)`` of
the segment's last op, and every op of the segment only the rows that band needs (the halo rows
of stacked 3x3 windows are recomputed by the neighbouring bands).  Only the segment's inputs and
its output exist as whole tensors; the band intermediates are a few rows each.

**Graph rewrite.**  :func:`apply_schedule` rewrites the lowered program itself: each segment is
replaced by its bands (H slices of the inputs, which are contiguous bytes in NHWC with N == 1 and
so free views; each op with the band's own top/bottom padding, ``[top, left, bottom, right]``)
and one ``quantized_cat`` along H of the band outputs, which the memory planner places in place
(each band writes its rows of the segment output; no copy, see ``in_place_cats`` in
:mod:`corten.memory.tensors`).  So ``prog.run``, ``run_int8``, the planner and the C generator all
execute the same schedule, and since every output element is computed by the same arithmetic on
the same inputs, the output is byte-identical to the unbanded program.

**Search.**  :func:`search` is a dynamic program over the cut points between steps: a step runs
unbanded (its live bytes must fit) or is the last step of a segment ``[i, j]`` run in bands of
``R`` output rows (its estimated peak: the whole tensors live across the segment + the band
tensors live at each band step + that step's scratch, must fit), minimising the recomputed MACs.
When nothing fits, a min-max variant gives the smallest peak reachable and the step that sets it.
"""
from __future__ import annotations

import copy
import functools
from dataclasses import dataclass, field

import torch

from corten.errors import BudgetError
from corten.fx_nodes import arg_position
from corten.memory.plan import ALIGNMENT
from corten.memory.tensors import ProgramTensors, analyse
from corten.ops.registry import Window, op_cost, op_window

MAX_SEGMENT_STEPS = 40
BAND_ROWS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32)


@dataclass(frozen=True)
class Segment:
    first: int  # step numbers in the unbanded program, inclusive
    last: int
    rows: int  # output rows per band (the last band may have fewer)
    bands: int
    nodes: tuple[str, ...]  # the unbanded step nodes
    out_shape: tuple[int, ...]  # NCHW of the segment output
    halo_rows: int  # extra input rows a middle band reads beyond its share (recomputed)
    extra_macs: int
    peak_bytes: int  # estimated arena bytes at the segment's busiest band step

    def to_json(self) -> dict:
        d = dict(self.__dict__)
        d["nodes"] = list(self.nodes)
        d["out_shape"] = list(self.out_shape)
        return d


@dataclass
class Schedule:
    """A banded schedule: the segments (may be empty: today's layer-by-layer plan)."""

    segments: list[Segment] = field(default_factory=list)
    total_macs: int = 0
    budget: int | None = None
    arena_before: int = 0
    arena_after: int = 0
    reordered: bool = False  # the steps run in a min-peak order (:mod:`corten.memory.reorder`), not program order
    origins: dict = field(default_factory=dict, repr=False)  # banded node -> unbanded node (after fit)

    @property
    def extra_macs(self) -> int:
        return sum(s.extra_macs for s in self.segments)

    @property
    def extra_macs_pct(self) -> float:
        return 100.0 * self.extra_macs / self.total_macs if self.total_macs else 0.0

    def to_json(self) -> dict:
        return {"segments": [s.to_json() for s in self.segments], "total_macs": self.total_macs,
                "budget": self.budget, "arena_before": self.arena_before, "arena_after": self.arena_after, "reordered": self.reordered}

    @staticmethod
    def from_json(d: dict) -> "Schedule":
        segs = [Segment(**{**s, "nodes": tuple(s["nodes"]), "out_shape": tuple(s["out_shape"])})
                for s in d.get("segments", [])]
        return Schedule(segs, d.get("total_macs", 0), d.get("budget"), d.get("arena_before", 0),
                        d.get("arena_after", 0), d.get("reordered", False))

    def report_lines(self) -> list[str]:
        lines = [f"  schedule           {len(self.segments)} banded segment(s), extra MACs "
                 f"{self.extra_macs:,} ({self.extra_macs_pct:.2f}% of {self.total_macs:,}); arena "
                 f"{self.arena_before:,} B layer by layer -> {self.arena_after:,} B"
                 + (f" (budget {self.budget:,} B)" if self.budget is not None else "")
                 + ("; steps in min-peak order" if self.reordered else "")]
        for s in self.segments:
            n, c, h, w = s.out_shape
            lines.append(f"    steps {s.first:>3}..{s.last:<3} {len(s.nodes):>2} ops -> [{n}, {c}, {h}, {w}]  "
                         f"{s.bands:>3} bands of {s.rows} rows, halo {s.halo_rows} rows, extra MACs "
                         f"{s.extra_macs:,}, est. peak {s.peak_bytes:,} B  ({s.nodes[0]} .. {s.nodes[-1]})")
        return lines


# ----------------------------------------------------------------------------- geometry
def _shape(node) -> tuple[int, ...]:
    return tuple(int(d) for d in node.meta["val"].shape)


@functools.lru_cache(maxsize=1 << 16)
def _shape_c(node) -> tuple[int, ...]:  # the search's hot path (nodes do not change while it runs)
    return _shape(node)


@functools.lru_cache(maxsize=1 << 16)
def _op(node) -> str:
    from corten.ops.registry import op_name_of

    return op_name_of(node.target) or ""


@functools.lru_cache(maxsize=1 << 16)
def _window(node) -> Window | None:
    """The op's window along H (its family's ``Hook.WINDOW``); None: it cannot run in bands."""
    return op_window(node)


@functools.lru_cache(maxsize=1 << 16)
def _cost_macs(node) -> int:
    return op_cost(node).macs


def _spatial(node) -> bool:
    w = _window(node)
    return w is not None and w.padding_arg is not None


def input_rows(node, lo: int, hi: int, in_h: int) -> tuple[int, int, int, int]:
    """The input rows ``[a, b)`` output rows ``[lo, hi)`` of ``node`` read, and the band's own
    (top, bottom) padding."""
    w = _window(node)
    if w is None or w.padding_arg is None:
        return lo, hi, 0, 0
    a, b = lo * w.stride - w.pads[0], (hi - 1) * w.stride - w.pads[0] + w.dilation * (w.kernel - 1) + 1
    return max(a, 0), min(b, in_h), max(0, -a), max(0, b - in_h)


def _macs(node, rows: int) -> int:
    """MACs of ``rows`` output rows of a bandable (N == 1, NHWC) step: its ``Hook.COST`` share."""
    return _cost_macs(node) * rows // _shape_c(node)[2]


def total_macs(prog: ProgramTensors) -> int:
    """Multiply-accumulates of the unbanded program (every step's ``Hook.COST``)."""
    return sum(_cost_macs(node) for node in prog.steps)


class _Model:
    """The unbanded program as the search sees it: steps, tensor sizes and lifetimes, scratch."""

    def __init__(self, prog: ProgramTensors, live: list[int], scratch: list[int]):
        self.prog, self.live, self.scratch = prog, live, scratch
        self.steps = prog.steps
        self.index = {n.name: i for i, n in enumerate(prog.steps)}
        self.act_args = [[a for a in n.args if isinstance(a, torch.fx.Node) and a.name in prog.class_of]
                         for n in prog.steps]
        self.bandable = [self._bandable(i) for i in range(len(prog.steps))]
        self.inner_ok = [self._users_are_steps(i) for i in range(len(prog.steps))]
        self._cache: dict = {}

    def _bandable(self, i: int) -> bool:
        node = self.steps[i]
        window = _window(node)
        if window is None:
            return False
        out = _shape_c(node)
        if len(out) != 4 or out[0] != 1 or out[2] < 2:
            return False
        args = self.act_args[i]
        if any(n.meta["val"].dtype != torch.int8 for n in (node, *args)):
            return False  # bands slice int8 bytes (int16 activations stay layer by layer)
        if window.ceil_mode:
            return False  # ceil mode: the last window's overhang depends on the input size
        if window.padding_arg is not None:
            return len(args) == 1 and len(_shape_c(args[0])) == 4
        for a in node.args:  # a constant operand with rows (not an activation) is not sliced: refuse
            val = a.meta.get("val") if isinstance(a, torch.fx.Node) else None
            if isinstance(val, torch.Tensor) and val.dim() == 4 and a.name not in self.prog.class_of:
                return False
        return bool(args) and all(_shape_c(a) == out for a in args)

    def _users_are_steps(self, i: int) -> bool:
        return all(u.name in self.index for u in self.steps[i].users)

    def valid(self, i: int, j: int) -> bool:
        """Steps ``i..j`` form a segment: every op bandable, every intermediate read only inside."""
        if not all(self.bandable[i:j + 1]):
            return False
        for k in range(i, j):
            if not self.inner_ok[k] or any(not i <= self.index[u.name] <= j for u in self.steps[k].users):
                return False
        return True

    def band_need(self, i: int, j: int, lo: int, hi: int) -> dict[str, tuple[int, int]]:
        """Rows of each segment tensor one band computes (``[lo, hi)`` of the segment output)."""
        need = {self.steps[j].name: (lo, hi)}
        for k in range(j, i - 1, -1):
            node = self.steps[k]
            if node.name not in need:
                continue
            a_lo, a_hi = need[node.name]
            for arg in self.act_args[k]:
                r0, r1, _, _ = input_rows(node, a_lo, a_hi, _shape_c(arg)[2])
                if arg.name in self.index and i <= self.index[arg.name] <= j:
                    old = need.get(arg.name)
                    need[arg.name] = (r0, r1) if old is None else (min(old[0], r0), max(old[1], r1))
        return need

    def whole_bytes(self, i: int, j: int) -> int:
        """Arena bytes of the whole tensors live through segment ``i..j``: everything live across its
        start (its inputs, tensors passing over it) and its output."""
        total = 0
        for cls in self.prog.classes.values():
            if cls.region != "arena":
                continue
            if cls.first < i <= cls.last or cls.root == self.steps[j].name:
                total += cls.nbytes
        return total

    def estimate(self, i: int, j: int, rows: int, exact: bool = False) -> tuple[int, int, int]:
        """(estimated peak bytes, extra MACs, halo rows) of segment ``i..j`` in bands of ``rows``.
        The search probes the first two, the middle and the last band and counts every other band's
        MACs as the middle one's (``exact``: every band, for the chosen segments)."""
        key = (i, j, rows, exact)
        if key in self._cache:
            return self._cache[key]
        h = _shape_c(self.steps[j])[2]
        starts = list(range(0, h, rows))
        base = self.whole_bytes(i, j)
        macs = 0
        peak = 0
        halo = 0
        probe = {0, 1, len(starts) // 2, len(starts) - 1}
        visit = range(len(starts)) if exact else sorted(probe)
        mid_macs = 0
        needs = {}
        for bi in visit:
            r0 = starts[bi]
            need = needs[bi] = self.band_need(i, j, r0, min(r0 + rows, h))
            band_macs = 0
            for k in range(i, j + 1):
                nm = self.steps[k].name
                if nm in need:
                    band_macs += _macs(self.steps[k], need[nm][1] - need[nm][0])
            macs += band_macs
            if bi == len(starts) // 2:
                mid_macs = band_macs
            if bi in probe:
                peak = max(peak, base + self._band_peak(i, j, need))
                if bi == len(starts) // 2:
                    first = self.steps[i]
                    a = self.act_args[i][0]
                    lo, hi = need[first.name]
                    r_lo, r_hi, _, _ = input_rows(first, lo, hi, _shape_c(a)[2])
                    share = (r_hi - r_lo)
                    halo = max(0, share - rows * _shape_c(a)[2] // h)
        if not exact:
            macs += mid_macs * (len(starts) - len(probe & set(range(len(starts)))))
        peak -= self.trailing_saving(i, j, rows, needs)
        unbanded = sum(_macs(self.steps[k], _shape_c(self.steps[k])[2]) for k in range(i, j + 1))
        out = (peak, macs - unbanded, halo)
        self._cache[key] = out
        return out

    def trailing_saving(self, i: int, j: int, rows: int, needs: dict[int, dict]) -> int:
        """Bytes the segment output saves by trailing an input that dies inside the segment (the
        planner's ``cats_over_inputs``: band ``b``'s rows written over input rows no later band
        reads); checked at the bands ``needs`` has (every band, or the probes)."""
        h = _shape_c(self.steps[j])[2]
        out = next((c for c in self.prog.classes.values() if c.root == self.steps[j].name), None)
        if out is None or out.region != "arena":
            return 0
        y_row = out.nbytes // h
        best = 0
        for cls in self.prog.classes.values():
            if cls.region != "arena" or not cls.first < i <= cls.last <= j:
                continue
            readers = [(k, a) for k in range(i, j + 1) for a in self.act_args[k]
                       if self.prog.class_of.get(a.name) == cls.root]
            if not readers:
                continue
            x_row = cls.nbytes // _shape_c(readers[0][1])[2]
            shift = 0
            for b, need in needs.items():  # band b - 1 wrote its rows before band b reads; the last op
                for k, a in readers:       # writes band b's rows while it reads
                    if self.steps[k].name in need and (b > 0 or k == j):
                        lo = input_rows(self.steps[k], *need[self.steps[k].name], _shape_c(a)[2])[0]
                        shift = min(shift, lo * x_row - min((b + (k == j)) * rows, h) * y_row)
            shift = shift // ALIGNMENT * ALIGNMENT
            best = max(best, cls.nbytes + out.nbytes - (max(cls.nbytes, shift + out.nbytes) - shift))
        return best

    def _band_peak(self, i: int, j: int, need: dict) -> int:
        """Max over the band's steps of the band tensors live there + the step's scratch (the band's
        last output is in the whole segment output, counted by :meth:`whole_bytes`)."""
        size, last_use = {}, {}
        for k in range(i, j + 1):
            node = self.steps[k]
            n, c, _, w = _shape_c(node)
            lo, hi = need.get(node.name, (0, 0))
            size[node.name] = -(-(hi - lo) * w * c // 16) * 16 if k != j else 0
            for a in self.act_args[k]:
                if a.name in size:
                    last_use[a.name] = k
        peak = 0
        for k in range(i, j + 1):
            live = sum(sz for nm, sz in size.items()
                       if self.index[nm] <= k <= last_use.get(nm, self.index[nm]))
            peak = max(peak, live + self.scratch[k])
        return peak


# ----------------------------------------------------------------------------- search
def search(ep, scratch: list[int], live: list[int], budget: int) -> tuple[Schedule, int, int]:
    """The cheapest schedule (fewest extra MACs) whose estimated peak is at most ``budget``; if none,
    the schedule with the smallest estimated peak.  Returns (schedule, its estimated peak, the step
    that sets the peak)."""
    prog = analyse(ep)
    model = _Model(prog, live, scratch)
    n = len(prog.steps)
    fit = _dp(model, n, budget)
    if fit is None:
        fit = _dp(model, n, None)
    choices, peak, peak_step = fit
    segs = []
    for (i, j, rows) in choices:
        p, extra, halo = model.estimate(i, j, rows, exact=True)
        h = _shape(prog.steps[j])[2]
        segs.append(Segment(i, j, rows, -(-h // rows), tuple(x.name for x in prog.steps[i:j + 1]),
                            _shape(prog.steps[j]), halo, extra, p))
    _clear_caches()
    return Schedule(segs, total_macs(prog), budget), peak, peak_step


def _clear_caches() -> None:
    for f in (_shape_c, _op, _window, _cost_macs):
        f.cache_clear()


def _dp(model: _Model, n: int, budget: int | None):
    """Over the cut points: best[c] = (cost, peak, choices, peak step) covering steps 0..c-1.  With a
    budget: minimise extra MACs with every peak <= budget (None if impossible); without: minimise
    the peak, then the MACs."""
    INF = float("inf")
    best: list = [None] * (n + 1)
    best[0] = (0, 0, (), -1)

    def better(a, b):
        if b is None:
            return True
        if budget is None:
            return (a[1], a[0], len(a[2])) < (b[1], b[0], len(b[2]))
        return (a[0], len(a[2]), a[1]) < (b[0], len(b[2]), b[1])

    for c in range(1, n + 1):
        j = c - 1
        cands = []
        if best[j] is not None and (budget is None or model.live[j] <= budget):
            prev = best[j]
            peak, ps = (prev[1], prev[3]) if prev[1] >= model.live[j] else (model.live[j], j)
            cands.append((prev[0], peak, prev[2], ps))
        if model.bandable[j] and (budget is None or model.live[j] > budget or True):
            for i in range(j, max(-1, j - MAX_SEGMENT_STEPS), -1):
                if best[i] is None:
                    continue
                if not model.valid(i, j):
                    if not model.bandable[i]:
                        break
                    continue
                if budget is not None and max(model.live[i:j + 1]) <= budget:
                    continue  # banding steps that already fit only adds work
                h = _shape(model.steps[j])[2]
                for rows in (BAND_ROWS if budget is None else BAND_ROWS[::-1]):
                    if rows >= h:
                        continue
                    p, extra, _ = model.estimate(i, j, rows)
                    if budget is not None and p > budget:
                        continue
                    prev = best[i]
                    peak, ps = (prev[1], prev[3]) if prev[1] >= p else (p, j)
                    cands.append((prev[0] + extra, peak, prev[2] + ((i, j, rows),), ps))
                    if budget is not None:
                        break  # more rows = fewer recomputed halos; the first that fits is the cheapest... usually
        for cand in cands:
            if better(cand, best[c]):
                best[c] = cand
    if best[n] is None or best[n][0] == INF:
        return None
    cost, peak, choices, ps = best[n]
    return list(choices), peak, ps


# ----------------------------------------------------------------------------- rewrite
def apply_schedule(gm: torch.fx.GraphModule, schedule: Schedule) -> torch.fx.GraphModule:
    """A copy of the program graph module ``gm`` (lifted or not) with each segment replaced by its
    bands and an in-place ``quantized_cat`` of their rows (see the module docstring); the new
    nodes have no ``meta["val"]`` yet (:func:`banded_program` adds them)."""
    gm = copy.deepcopy(gm)
    graph = gm.graph
    origin: dict[str, str] = {}  # band node -> the unbanded node it computes rows of
    nodes = {n.name: n for n in graph.nodes}
    strided = torch.ops.corten.quantized_strided_copy.default
    cat_op = torch.ops.corten.quantized_cat.default
    for seg in schedule.segments:
        seg_nodes = [nodes[nm] for nm in seg.nodes]
        inside = {n.name for n in seg_nodes}
        last = seg_nodes[-1]
        h = seg.out_shape[2]
        outs = []
        with graph.inserting_before(seg_nodes[0]):
            for r0 in range(0, h, seg.rows):
                r1 = min(r0 + seg.rows, h)
                need = {last.name: (r0, r1)}
                for node in reversed(seg_nodes):
                    lo, hi = need[node.name]
                    for a in node.args:
                        if isinstance(a, torch.fx.Node) and a.name in inside:
                            x0, x1, _, _ = input_rows(node, lo, hi, _shape(a)[2])
                            old = need.get(a.name)
                            need[a.name] = (x0, x1) if old is None else (min(old[0], x0), max(old[1], x1))
                env: dict[str, tuple[torch.fx.Node, int]] = {}
                for node in seg_nodes:
                    lo, hi = need[node.name]
                    args = list(node.args)
                    act = _activation_positions(node)
                    for pos in act:
                        a = node.args[pos]
                        a_h = _shape(a)[2]
                        x0, x1, top, bottom = input_rows(node, lo, hi, a_h)
                        src, s0 = env.get(a.name, (a, 0))
                        s1 = s0 + (_shape(a)[2] if a.name not in env else need[a.name][1] - need[a.name][0])
                        if (x0, x1) != (s0, s1):
                            n_, c_, _, w_ = _shape(a)
                            src = graph.call_function(strided, (src, [n_, c_, x1 - x0, w_], [(x1 - x0) * w_ * c_],
                                                                [1], (x0 - s0) * w_ * c_))
                        args[pos] = src
                        if _spatial(node):
                            name = _window(node).padding_arg
                            k = arg_position(node, name)
                            _, left, _, right = _window(node).pads
                            args[k] = [top, left] if (top, left) == (bottom, right) else [top, left, bottom, right]
                    new = graph.call_function(node.target, tuple(args), dict(node.kwargs))
                    origin[new.name] = node.name
                    env[node.name] = (new, lo)
                outs.append(env[last.name][0])
            cat = graph.call_function(cat_op, (outs, 2))
            cat.meta["val"] = last.meta["val"]  # later segments slice it like the tensor it replaces
        last.replace_all_uses_with(cat)
        for node in reversed(seg_nodes):
            graph.erase_node(node)
    graph.lint()
    gm.recompile()
    gm.meta["corten_band_origin"] = origin
    _clear_caches()
    return gm


_COPIED_META = ("stack_trace", "nn_module_stack", "source_fn_stack", "torch_fn", "custom")


def banded_program(ep, schedule: Schedule):
    """The lowered program ``ep`` with ``schedule`` applied (:func:`apply_schedule` on its own
    lifted graph), as a new ``ExportedProgram`` *without* a second ``torch.export``: the band ops'
    ``meta["val"]`` come from their fake kernels in the program's fake mode, their source metadata
    (stack trace, module path) from the op they compute rows of; the constants, state and input
    signature are the program's (the rewrite adds none).  Returns ``(ep, origins)``: origins maps
    each node of the banded program to the unbanded node it comes from."""
    from torch._guards import detect_fake_mode
    from torch.export.exported_program import ExportedProgram
    from torch.export.graph_signature import ExportGraphSignature, InputSpec, OutputSpec, TensorArgument

    gm = apply_schedule(ep.graph_module, schedule)
    origin = gm.meta.pop("corten_band_origin", {})
    nodes = list(gm.graph.nodes)
    unbanded = {n.name: n for n in ep.graph.nodes}
    fake = detect_fake_mode([n.meta["val"] for n in nodes if isinstance(n.meta.get("val"), torch.Tensor)])
    val = lambda a: a.meta["val"]  # noqa: E731
    with fake:
        for n in nodes:
            if n.op != "call_function" or "val" in n.meta:
                continue
            n.meta["val"] = n.target(*torch.fx.node.map_arg(n.args, val), **torch.fx.node.map_arg(n.kwargs, val))
            src = unbanded.get(origin.get(n.name, ""))  # the op this band op computes rows of
            for key in _COPIED_META:
                if src is not None and key in src.meta:
                    n.meta[key] = src.meta[key]
    out_node = next(n for n in reversed(nodes) if n.op == "output")
    out_args = out_node.args[0]
    sig = ep.graph_signature
    outputs = [OutputSpec(spec.kind, TensorArgument(out_args[k].name) if isinstance(spec.arg, TensorArgument)
                          and isinstance(out_args[k], torch.fx.Node) else spec.arg, spec.target)
               for k, spec in enumerate(sig.output_specs)]
    # The copy renames placeholders whose names shadow a builtin (nn.Sequential's ``input`` ->
    # ``input_1``); the specs follow the placeholders by position.
    placeholders = [n for n in nodes if n.op == "placeholder"]
    inputs = [InputSpec(spec.kind, TensorArgument(placeholders[k].name), spec.target, spec.persistent)
              if isinstance(spec.arg, TensorArgument) else spec for k, spec in enumerate(sig.input_specs)]
    new_sig = ExportGraphSignature(input_specs=inputs, output_specs=outputs)
    new_ep = ExportedProgram(root=gm, graph=gm.graph, graph_signature=new_sig, state_dict=ep.state_dict,
                             range_constraints=copy.deepcopy(ep.range_constraints),
                             module_call_graph=copy.deepcopy(ep.module_call_graph), example_inputs=ep.example_inputs,
                             constants=ep.constants, verifiers=ep.verifiers)
    origins = {n.name: origin.get(n.name, n.name) for n in new_ep.graph.nodes if n.op == "call_function"}
    return new_ep, origins


def _activation_positions(node) -> list[int]:
    """Positions of the activation arguments (4-D int8 op outputs; constants are get_attr nodes)."""
    out = []
    for pos, a in enumerate(node.args):
        if isinstance(a, torch.fx.Node) and a.op == "call_function":
            val = a.meta.get("val")
            if isinstance(val, torch.Tensor) and val.dim() == 4 and val.dtype == torch.int8:
                out.append(pos)
    return out


def budget_error(target: str, budget: int, best_arena: int, schedule: Schedule, peak_step_desc: str,
                 arena_before: int, plan) -> BudgetError:
    banded = (f"the smallest found is {best_arena:,} B with {len(schedule.segments)} banded segment(s) "
              f"(+{schedule.extra_macs_pct:.1f}% MACs)" if schedule.segments and best_arena < arena_before
              else "no banded schedule makes it smaller")
    return BudgetError(
        f"model does not fit {target or 'the target'}: arena needs {best_arena:,} B of RAM but max_arena is "
        f"{budget:,} B (over by {best_arena - budget:,} B): layer by layer it needs {arena_before:,} B and "
        f"{banded}. {peak_step_desc}; {plan.peak_description()}. Raise max_arena to at least "
        f"{best_arena:,} B, or shrink that layer (input resolution, width, expansion ratio), or choose a "
        "target with more memory.")


def fit(ep, budget: int, plan_fn, target_name: str = "", plan0=None):
    """Search a banded schedule whose real memory plan fits ``budget`` bytes.

    ``plan_fn(ep, banded)`` plans a program (``banded``: in-place cats on).  Returns ``(ep, schedule,
    plan)``: the unchanged ``ep`` and an empty schedule when the layer-by-layer plan fits, else the
    rewritten program.  Raises :class:`BudgetError` naming the smallest arena found,
    the step that sets it and what to change.  The search works on estimates (whole tensors + band
    tensors + scratch, no packing slack); when the packed arena overshoots, it searches again with
    the budget lowered by half the overshoot (at most 6 rounds).  Each candidate is built by
    :func:`banded_program` (no second ``torch.export``)."""
    plan0 = plan_fn(ep, False) if plan0 is None else plan0  # (the layer-by-layer plan, when known)
    if plan0.arena_bytes <= budget:
        return ep, Schedule([], 0, budget, plan0.arena_bytes, plan0.arena_bytes), plan0
    scratch = [plan0.scratch[nm].nbytes if nm in plan0.scratch else 0 for nm in plan0.step_nodes]
    arena_in_program_order = plan0.arena_bytes
    ep, plan0, reordered = _min_peak_order(ep, plan0, scratch, plan_fn)
    if reordered:
        scratch = [plan0.scratch[nm].nbytes if nm in plan0.scratch else 0 for nm in plan0.step_nodes]
        if plan0.arena_bytes <= budget:  # the order alone fits: no band, no extra MAC
            schedule = Schedule([], 0, budget, arena_in_program_order, plan0.arena_bytes, reordered=True)
            schedule.origins = {n.name: n.name for n in ep.graph.nodes if n.op == "call_function"}
            plan0.schedule = schedule
            return ep, schedule, plan0
    live = list(plan0.steps)
    goal = budget
    best = (plan0.arena_bytes, ep, Schedule([], 0, budget, arena_in_program_order, plan0.arena_bytes,
                                            reordered=reordered), plan0)
    peak_step = -1
    for _ in range(6):
        schedule, est_peak, peak_step = search(ep, scratch, live, goal)
        schedule.arena_before, schedule.budget, schedule.reordered = arena_in_program_order, budget, reordered
        if not schedule.segments:
            break
        new_ep, schedule.origins = banded_program(ep, schedule)  # origins: the node sources (not saved)
        plan = plan_fn(new_ep, True)
        schedule.arena_after = plan.arena_bytes
        if plan.arena_bytes < best[0]:
            best = (plan.arena_bytes, new_ep, schedule, plan)
        if plan.arena_bytes <= budget:
            plan.schedule = schedule
            return new_ep, schedule, plan
        if est_peak > goal:  # even the estimate does not fit: this is the smallest reachable
            break
        goal -= (plan.arena_bytes - budget) // 2 // 16 * 16 + 16
    arena, _, schedule, plan = best
    steps = analyse(ep).steps
    node = steps[peak_step] if 0 <= peak_step < len(steps) else None
    where = (f"The step that sets it: '{node.name}' ({_op(node)}, output {list(_shape(node))}), whose "
             f"input, output and scratch (or band working set) must be live together") if node is not None else ""
    raise budget_error(target_name, budget, arena, schedule, where, arena_in_program_order, plan)


def _min_peak_order(ep, plan, scratch: list[int], plan_fn):
    """``(ep, plan, True)`` with the program's steps in the order of smallest peak
    (:mod:`corten.memory.reorder`) when its real plan is smaller than ``plan``, else the
    arguments and False."""
    from corten.memory.reorder import best_order, reordered_program, step_graph

    order = best_order(step_graph(ep, scratch))
    if order == sorted(order):
        return ep, plan, False
    new_ep = reordered_program(ep, order)
    new_plan = plan_fn(new_ep, False)
    if new_plan.arena_bytes >= plan.arena_bytes:
        return ep, plan, False
    return new_ep, new_plan, True
