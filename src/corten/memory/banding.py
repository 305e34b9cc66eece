"""Banded schedules: run chains of ops in row bands so the arena fits a budget (MCUNetV2-style
patch-based inference on row tiles; issue 10).

Layer by layer, the arena cannot go below the live-set lower bound (a layer's input + output +
scratch).  A *segment* is a run of consecutive steps (convolutions, depthwise convolutions,
same-shape adds and LUT activations on ``N == 1`` NHWC tensors) whose intermediate tensors are
read only inside it.  It runs as ``B`` *bands*: band ``b`` computes output rows ``[r_b, r_b+1)`` of
the segment's last op, and every op of the segment only the rows that band needs.  The halo rows
of stacked 3x3 windows are computed once: a band takes the ones the previous band computed (copied,
:func:`band_rows`) and computes only its new rows.  Only the segment's inputs and its output exist
as whole tensors; the band intermediates are a few rows each.

**Graph rewrite.**  :func:`apply_schedule` rewrites the lowered program itself: each segment is
replaced by its bands (H slices of the inputs, which are contiguous bytes in NHWC with N == 1 and
so free views; each op with the band's own top/bottom padding, ``[top, left, bottom, right]``)
and one ``quantized_cat`` along H of the band outputs, which the memory planner places in place
(each band writes its rows of the segment output; no copy, see ``in_place_cats`` in
:mod:`corten.memory.tensors`).  A band tensor with a halo is an in-place ``quantized_cat`` of a
copy of the halo rows and the op's new rows; the copy comes from a one-input ``quantized_cat``
made after the previous band's last reader of that tensor, so only the halo rows stay live between
the bands.  So ``prog.run``, ``run_int8``, the planner and the C generator all
execute the same schedule, and since every output element is computed by the same arithmetic on
the same inputs, the output is byte-identical to the unbanded program.

**Search.**  :func:`search` is a dynamic program over the cut points between steps: a step runs
unbanded (its live bytes must fit) or is the last step of a segment ``[i, j]`` run in bands of
``R`` output rows (its estimated peak: the whole tensors live across the segment + the band
tensors and carried halos live at each band step + that step's scratch, must fit), minimising the
estimated cost: extra MACs (none: rows are computed once) + :data:`CALL_COST` per extra kernel
call + the halo bytes copied.
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
BAND_ROWS = (1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 14, 16, 20, 24, 28, 32)
CALL_COST = 256  # MACs a kernel call's fixed set-up is worth (QEMU M55 CMSIS-NN: ~200-300 instructions a call)
COPY_BYTES_PER_MAC = 4  # bytes of a halo copy that cost about one MAC


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


def band_rows(nodes, r0: int, r1: int, prev: dict | None = None) -> dict[str, tuple[int, int, int]]:
    """The rows of each tensor of a segment (``nodes``, in step order) that the band computing output
    rows ``[r0, r1)`` of its last op works with: ``{name: (lo, new, hi)}``, the band holds rows
    ``[lo, hi)`` of the tensor, computes ``[new, hi)`` and takes ``[lo, new)`` (its halo) from the
    previous band's rows of it (``prev``: that band's ``band_rows``; None: the first band), which
    computed them: no row is computed twice.  Each op reads only the input rows its computed rows
    need, so the halo rows are carried, not recomputed.  The last op computes its own rows."""
    inside = {n.name for n in nodes}
    need: dict[str, tuple[int, int]] = {nodes[-1].name: (r0, r1)}
    out: dict[str, tuple[int, int, int]] = {}
    for k in range(len(nodes) - 1, -1, -1):
        node = nodes[k]
        if node.name not in need:
            continue  # no later op of this band reads it
        lo, hi = need[node.name]
        new = lo
        if k != len(nodes) - 1 and prev is not None and node.name in prev:
            p_lo, _, p_hi = prev[node.name]
            if p_lo <= lo < p_hi:
                new = max(lo, min(p_hi, hi))
        out[node.name] = (lo, new, hi)
        if new >= hi:
            continue  # every row it holds comes from the previous band: it reads nothing
        for a in node.args:
            if isinstance(a, torch.fx.Node) and a.name in inside:
                x0, x1, _, _ = input_rows(node, new, hi, _shape_c(a)[2])
                old = need.get(a.name)
                need[a.name] = (x0, x1) if old is None else (min(old[0], x0), max(old[1], x1))
    return out


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

    def bands(self, i: int, j: int, rows: int, exact: bool) -> tuple[list[int], dict[int, dict], set[int]]:
        """(band start rows, ``{band: band_rows}``, the bands the estimate measures) of segment
        ``i..j`` in bands of ``rows``: every band (``exact``), or the first two, the middle and the
        last band (each from its predecessor's rows) and the band after each (for its carried rows)."""
        nodes = self.steps[i:j + 1]
        h = _shape_c(self.steps[j])[2]
        starts = list(range(0, h, rows))
        span = lambda b: (starts[b], min(starts[b] + rows, h))  # noqa: E731
        out: dict[int, dict] = {}
        if exact:
            prev = None
            for b in range(len(starts)):
                prev = out[b] = band_rows(nodes, *span(b), prev)
            return starts, out, set(out)
        probe = {0, 1, len(starts) // 2, len(starts) - 1} & set(range(len(starts)))
        for b in sorted(probe | {p + 1 for p in probe if p + 1 < len(starts)}):
            out[b] = band_rows(nodes, *span(b), band_rows(nodes, *span(b - 1)) if b else None)
        return starts, out, probe

    def estimate(self, i: int, j: int, rows: int, exact: bool = False) -> tuple[int, int, int, int]:
        """(estimated peak bytes, extra MACs, halo rows, cost) of segment ``i..j`` in bands of
        ``rows``.  The cost (what the search minimises, in MACs) is the extra MACs plus
        :data:`CALL_COST` per kernel call beyond the unbanded program's one per op (every band calls
        its ops again, and each carried halo is copied twice) plus the halo bytes copied
        (:data:`COPY_BYTES_PER_MAC`).  The search measures the bands :meth:`bands` probes and counts
        every other band as the middle one (``exact``: every band, for the chosen segments)."""
        key = (i, j, rows, exact)
        if key in self._cache:
            return self._cache[key]
        starts, bands, visit = self.bands(i, j, rows, exact)
        base = self.whole_bytes(i, j)
        macs = calls = copied = peak = halo = 0
        mid = len(starts) // 2
        for b in sorted(visit):
            cur = bands[b]
            b_macs = b_calls = b_copied = 0
            for k in range(i, j + 1):
                node = self.steps[k]
                if node.name not in cur:
                    continue
                lo, new, hi = cur[node.name]
                if new < hi:
                    b_macs += _macs(node, hi - new)
                    b_calls += 1
                if new > lo:
                    _, c, _, w = _shape_c(node)
                    b_calls += 2
                    b_copied += 2 * (new - lo) * w * c
                    halo = max(halo, new - lo)
            weight = 1 if exact or b != mid else len(starts) - len(visit) + 1
            macs, calls, copied = macs + weight * b_macs, calls + weight * b_calls, copied + weight * b_copied
            peak = max(peak, base + self._band_peak(i, j, cur, bands.get(b + 1)))
        computed = {b: {nm: (new, hi) for nm, (_, new, hi) in r.items() if new < hi} for b, r in bands.items()
                    if b in visit}
        peak -= self.trailing_saving(i, j, rows, computed)
        unbanded = sum(_macs(self.steps[k], _shape_c(self.steps[k])[2]) for k in range(i, j + 1))
        extra = max(0, macs - unbanded)  # (each op's MACs per row rounded down)
        cost = extra + CALL_COST * (calls - (j - i + 1)) + copied // COPY_BYTES_PER_MAC
        out = (peak, extra, halo, cost)
        self._cache[key] = out
        return out

    def trailing_saving(self, i: int, j: int, rows: int, needs: dict[int, dict]) -> int:
        """Bytes the segment output saves by trailing an input that dies inside the segment (the
        planner's ``cats_over_inputs``: band ``b``'s rows written over input rows no later band
        reads); checked at the bands ``needs`` has (every band, or the probes: the rows each op
        computes there)."""
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

    def _band_peak(self, i: int, j: int, cur: dict, nxt: dict | None) -> int:
        """Max over the band's steps of the band tensors live there + the step's scratch: each tensor's
        rows from its producer to its last reader, the halo carried in from the previous band until
        its producer runs, the halo carried on to the next band (``nxt``) after its last reader (the
        band's last output is in the whole segment output, counted by :meth:`whole_bytes`)."""
        size, carry_in, carry_out, last_use = {}, {}, {}, {}
        for k in range(i, j + 1):
            node = self.steps[k]
            if node.name not in cur:
                continue
            n, c, _, w = _shape_c(node)
            lo, new, hi = cur[node.name]
            row = w * c
            size[node.name] = -(-(hi - lo) * row // 16) * 16 if k != j else 0
            carry_in[node.name] = -(-(new - lo) * row // 16) * 16
            if nxt is not None and node.name in nxt and k != j:
                n_lo, n_new, _ = nxt[node.name]
                carry_out[node.name] = -(-(n_new - n_lo) * row // 16) * 16
            if new < hi:
                for a in self.act_args[k]:
                    if a.name in size:
                        last_use[a.name] = k
        peak = 0
        for k in range(i, j + 1):
            live = 0
            for nm, sz in size.items():
                p, last = self.index[nm], last_use.get(nm, self.index[nm])
                live += (sz if p <= k <= last else 0) + (carry_in[nm] if k <= p else 0) + \
                    (carry_out.get(nm, 0) if k > last else 0)
            runs = self.steps[k].name in cur and cur[self.steps[k].name][1] < cur[self.steps[k].name][2]
            peak = max(peak, live + (self.scratch[k] if runs else 0))
        return peak


# ----------------------------------------------------------------------------- search
def search(ep, scratch: list[int], live: list[int], budget: int, model: "_Model | None" = None
           ) -> tuple[Schedule, int, int]:
    """The cheapest schedule (lowest estimated cost) whose estimated peak is at most ``budget``; if
    none, the schedule with the smallest estimated peak.  Returns (schedule, its estimated peak, the
    step that sets the peak).  ``model``: the program as a previous search of the same ``ep`` saw it
    (its estimates are kept)."""
    prog = analyse(ep) if model is None else model.prog
    model = _Model(prog, live, scratch) if model is None else model
    n = len(prog.steps)
    fit = _dp(model, n, budget)
    if fit is None:
        fit = _dp(model, n, None)
    choices, peak, peak_step = fit
    segs = []
    for (i, j, rows) in choices:
        p, extra, halo, _ = model.estimate(i, j, rows, exact=True)
        h = _shape(prog.steps[j])[2]
        segs.append(Segment(i, j, rows, -(-h // rows), tuple(x.name for x in prog.steps[i:j + 1]),
                            _shape(prog.steps[j]), halo, extra, p))
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
                    p, _, _, extra = model.estimate(i, j, rows)
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
        starts = list(range(0, h, seg.rows))
        rows = []
        for r0 in starts:  # every band's rows (band_rows: held, computed, carried)
            rows.append(band_rows(seg_nodes, r0, min(r0 + seg.rows, h), rows[-1] if rows else None))

        def rows_of(src, s0, s1, x0, x1, a):
            """Rows [x0, x1) of ``src`` (rows [s0, s1) of tensor ``a``): itself or a view of them."""
            if (x0, x1) == (s0, s1):
                return src
            n_, c_, _, w_ = _shape(a)
            return graph.call_function(strided, (src, [n_, c_, x1 - x0, w_], [(x1 - x0) * w_ * c_], [1],
                                                 (x0 - s0) * w_ * c_))

        outs = []
        carried: dict[str, torch.fx.Node] = {}  # tensor -> copy of its halo rows for the next band
        with graph.inserting_before(seg_nodes[0]):
            for b, cur in enumerate(rows):
                nxt = rows[b + 1] if b + 1 < len(rows) else {}
                env: dict[str, tuple[torch.fx.Node, int, int]] = {}  # tensor -> (node, its first row, end row)
                readers: dict[str, int] = {}  # tensor -> its last reader in this band
                for k, node in enumerate(seg_nodes):
                    if node.name in cur and cur[node.name][1] < cur[node.name][2]:
                        for a in node.args:
                            if isinstance(a, torch.fx.Node) and a.name in inside:
                                readers[a.name] = k

                def carry_on(name):  # copy the rows the next band takes from this band's tensor
                    if name in nxt and nxt[name][0] < nxt[name][1]:
                        src, s0, s1 = env[name]
                        view = rows_of(src, s0, s1, nxt[name][0], nxt[name][1], nodes[name])
                        carried[name] = graph.call_function(cat_op, ([view], 2))
                        origin[carried[name].name] = name

                for k, node in enumerate(seg_nodes):
                    if node.name not in cur:
                        continue
                    lo, new_lo, hi = cur[node.name]
                    parts = []
                    if new_lo > lo:  # the halo rows the previous band computed, copied next to the new rows
                        halo = carried.pop(node.name)
                        parts.append(graph.call_function(cat_op, ([halo], 2)) if new_lo < hi else halo)
                        origin[parts[-1].name] = node.name
                    if new_lo < hi:
                        args = list(node.args)
                        for pos in _activation_positions(node):
                            a = node.args[pos]
                            x0, x1, top, bottom = input_rows(node, new_lo, hi, _shape(a)[2])
                            src, s0, s1 = env.get(a.name, (a, 0, _shape(a)[2]))
                            args[pos] = rows_of(src, s0, s1, x0, x1, a)
                            if _spatial(node):
                                name = _window(node).padding_arg
                                _, left, _, right = _window(node).pads
                                args[arg_position(node, name)] = [top, left] if (top, left) == (bottom, right) \
                                    else [top, left, bottom, right]
                        parts.append(graph.call_function(node.target, tuple(args), dict(node.kwargs)))
                        origin[parts[-1].name] = node.name
                    if len(parts) > 1:
                        parts = [graph.call_function(cat_op, (parts, 2))]  # in place: no copy
                        origin[parts[0].name] = node.name
                    env[node.name] = (parts[0], lo, hi)
                    if node.name != last.name and readers.get(node.name) is None:
                        carry_on(node.name)
                    for a in dict.fromkeys(a.name for a in node.args if isinstance(a, torch.fx.Node) and a.name in env):
                        if readers.get(a) == k:
                            carry_on(a)
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
    model = _Model(analyse(ep), live, scratch)
    for _ in range(6):
        schedule, est_peak, peak_step = search(ep, scratch, live, goal, model)
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
        # below the estimate (a new schedule), by half the overshoot
        goal = min(goal, est_peak) - (plan.arena_bytes - budget) // 2 // 16 * 16 - 16
    _clear_caches()
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
