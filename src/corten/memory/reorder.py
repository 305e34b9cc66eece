"""Operator reordering: the execution order of a branched program that needs the smallest arena.

A program's steps run in graph order, which is the order the model's ``forward`` wrote them in.
Where the graph branches (residual blocks with a projection, inception or squeeze-excitation
branches, attention heads), another topological order can keep fewer tensors alive at once: run
the branch that ends in a small tensor first, and the big tensor it frees is gone before the other
branch starts.

The search works on the *live-byte model* of :mod:`corten.memory.plan` (every arena storage class
is live from the step that writes it to the last step that reads it; a step also needs its scratch
buffer): executing step ``s`` after the set ``S`` of steps needs

    live(S) + bytes(output of s) + scratch(s)

where ``live(S)`` are the arena classes written by ``S`` and still read by a step outside it.  The
peak of an order is the largest of these terms.

* :func:`min_peak_order` finds the order with the smallest peak exactly, by a dynamic program over
  the sets of steps already run (the down-sets of the step graph; a chain has ``n + 1`` of them,
  ``b`` parallel branches of lengths ``l_i`` about ``prod(l_i + 1)``), memoised on a bit mask.
* Where the down-sets are too many (``max_states``), :func:`greedy_order` runs instead: at each
  point the ready step that needs the least memory now, then the one that frees the most.  Its gap
  to the exact order is measured by ``tests/test_reorder.py`` on random branched graphs.

:func:`reordered_program` applies an order to a lowered program by moving its graph's nodes (names,
metadata and constants unchanged, no second ``torch.export``): every output element is computed by
the same op from the same inputs, so the bytes are the program's.  The real memory plan (packing,
in-place ops) then decides whether the new order is kept (:func:`corten.memory.banding.fit`).
"""
from __future__ import annotations

import copy
import sys
from dataclasses import dataclass

import torch

from corten.memory.tensors import analyse

MAX_STATES = 200_000  # down-sets the exact search may visit before it hands over to the greedy order


@dataclass(frozen=True)
class StepGraph:
    """The live-byte model of a program's steps (indices in program order)."""

    preds: tuple[int, ...]  # bit mask of the steps each step depends on
    writes: tuple[int, ...]  # arena bytes each step's output class adds (0: view, caller buffer)
    scratch: tuple[int, ...]  # scratch bytes of each step
    readers: tuple[tuple[int, int], ...]  # per arena class: (bit mask of its writer, bit mask of its readers)
    sizes: tuple[int, ...]  # per arena class: bytes
    forever: int  # bit mask of the classes (indices into readers/sizes) live until the end

    @property
    def n(self) -> int:
        return len(self.preds)

    def live_after(self, done: int) -> int:
        """Arena bytes held after the steps in ``done``: written by one of them, still to be read."""
        total = 0
        for c, (writer, readers) in enumerate(self.readers):
            if writer & done and (readers & ~done or self.forever >> c & 1):
                total += self.sizes[c]
        return total

    def need(self, done: int, s: int) -> int:
        """Bytes live while step ``s`` runs after the steps in ``done``."""
        return self.live_after(done) + self.writes[s] + self.scratch[s]

    def peak(self, order: list[int]) -> int:
        done, peak = 0, 0
        for s in order:
            peak = max(peak, self.need(done, s))
            done |= 1 << s
        return peak

    def ready(self, done: int) -> list[int]:
        return [s for s in range(self.n) if not done >> s & 1 and self.preds[s] & ~done == 0]


def step_graph(ep, scratch: list[int]) -> StepGraph:
    """The :class:`StepGraph` of the lowered program ``ep`` with ``scratch[s]`` bytes per step."""
    prog = analyse(ep)
    index = {node.name: s for s, node in enumerate(prog.steps)}
    arena = [c for c in prog.classes.values() if c.region == "arena"]
    position = {c.root: k for k, c in enumerate(arena)}
    writer_of = {c.root: index[c.root] for c in arena if c.root in index}
    readers = [0] * len(arena)
    preds = [0] * len(prog.steps)
    for s, node in enumerate(prog.steps):
        for arg in node.all_input_nodes:
            root = prog.class_of.get(arg.name)
            if root is None:
                continue
            if root in position:
                readers[position[root]] |= 1 << s
            w = index.get(root)
            if w is not None and w != s:
                preds[s] |= 1 << w
    writes = [0] * len(prog.steps)
    for root, s in writer_of.items():
        writes[s] += prog.classes[root].nbytes
    forever = 0
    for k, c in enumerate(arena):
        if c.last >= len(prog.steps):  # read by a dequantize at the end (a program output's bytes)
            forever |= 1 << k
    return StepGraph(tuple(preds), tuple(writes), tuple(scratch), tuple((1 << writer_of[c.root] if c.root in writer_of
                                                                        else 0, readers[k]) for k, c in enumerate(arena)),
                     tuple(c.nbytes for c in arena), forever)


def min_peak_order(g: StepGraph, max_states: int = MAX_STATES) -> list[int] | None:
    """The topological order of smallest peak (program order wins ties), or None when the search
    would visit more than ``max_states`` sets of finished steps."""
    full = (1 << g.n) - 1
    best: dict[int, tuple[int, int]] = {full: (0, -1)}  # done -> (peak of the rest, next step)

    def solve(done: int) -> int | None:  # None: over the state limit
        hit = best.get(done)
        if hit is not None:
            return hit[0]
        if len(best) > max_states:
            return None
        live = g.live_after(done)
        choice = (None, -1)
        for s in g.ready(done):
            here = live + g.writes[s] + g.scratch[s]
            if choice[0] is not None and here >= choice[0]:
                continue  # cannot beat the best peak found so far
            rest = solve(done | 1 << s)
            if rest is None:
                return None
            if choice[0] is None or max(here, rest) < choice[0]:
                choice = (max(here, rest), s)
        best[done] = choice
        return choice[0]

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 4 * g.n + 1000))
    try:
        if solve(0) is None:
            return None
    finally:
        sys.setrecursionlimit(limit)
    order, done = [], 0
    while done != full:
        s = best[done][1]
        order.append(s)
        done |= 1 << s
    return order


def greedy_order(g: StepGraph) -> list[int]:
    """A topological order for graphs too big for :func:`min_peak_order`: at each point the ready
    step that needs the least memory now, then the one leaving the least live afterwards, then
    program order."""
    order, done = [], 0
    while len(order) < g.n:
        s = min(g.ready(done), key=lambda s: (g.need(done, s), g.live_after(done | 1 << s), s))
        order.append(s)
        done |= 1 << s
    return order


def best_order(g: StepGraph, max_states: int = MAX_STATES) -> list[int]:
    """The exact order when the search is small enough, else the greedy one; program order when
    neither lowers the peak."""
    program = list(range(g.n))
    order = min_peak_order(g, max_states) or greedy_order(g)
    return order if g.peak(order) < g.peak(program) else program


def reordered_program(ep, order: list[int]):
    """The lowered program ``ep`` with its steps run in ``order`` (indices of its steps in program
    order).  Each step's inputs that are not steps (views, dequantizes) move along with it; the
    graph's nodes keep their names, metadata and constants."""
    from torch.export.exported_program import ExportedProgram

    steps = [n.name for n in analyse(ep).steps]
    gm = copy.deepcopy(ep.graph_module)
    graph = gm.graph
    by_name = {n.name: n for n in graph.nodes}
    placed: set[str] = set()
    sequence: list[torch.fx.Node] = []

    def place(node: torch.fx.Node) -> None:
        if node.name in placed or node.op != "call_function":
            return
        placed.add(node.name)
        for arg in node.all_input_nodes:
            place(arg)
        sequence.append(node)

    for s in order:
        place(by_name[steps[s]])
    for node in list(graph.nodes):
        place(node)
    cursor = [n for n in graph.nodes if n.op == "placeholder"][-1]
    for node in sequence:
        cursor.append(node)
        cursor = node
    graph.lint()
    gm.recompile()
    return ExportedProgram(root=gm, graph=gm.graph, graph_signature=copy.deepcopy(ep.graph_signature),
                           state_dict=ep.state_dict, range_constraints=copy.deepcopy(ep.range_constraints),
                           module_call_graph=copy.deepcopy(ep.module_call_graph), example_inputs=ep.example_inputs,
                           constants=ep.constants, verifiers=ep.verifiers)
