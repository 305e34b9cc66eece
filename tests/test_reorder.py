"""Operator reordering (corten.memory.reorder): the exact min-peak order against brute force over
every topological order, the greedy order's measured gap, and a branched model whose min-peak
order fits a budget that program order misses, byte-exact in Python, on planned bytes and in C."""
from __future__ import annotations

import itertools
import random

import pytest
import torch

import corten
from corten.memory.reorder import StepGraph, best_order, greedy_order, min_peak_order, step_graph

from conftest import needs_gcc, needs_qemu
from test_banding import replay_on_planned_bytes


def random_graph(rng: random.Random, n: int) -> StepGraph:
    """A random DAG of ``n`` steps (edges only forwards), one output class per step of random size,
    the last step's output held to the end, random scratch."""
    preds = [0] * n
    readers = [0] * n
    for s in range(1, n):
        for p in rng.sample(range(s), k=rng.randint(1, min(2, s))):
            preds[s] |= 1 << p
            readers[p] |= 1 << s
    sizes = [rng.choice([1, 2, 4, 8, 16, 32]) for _ in range(n)]
    return StepGraph(tuple(preds), tuple(sizes), tuple(rng.choice([0, 0, 3]) for _ in range(n)),
                     tuple((1 << s, readers[s]) for s in range(n)), tuple(sizes), 1 << (n - 1))


def naive_peak(g: StepGraph, order) -> int:
    """Peak of an order by direct simulation of which tensors are held (independent of StepGraph.need)."""
    held: dict[int, int] = {}  # class -> bytes
    peak = 0
    done: set[int] = set()
    for s in order:
        peak = max(peak, sum(held.values()) + g.writes[s] + g.scratch[s])
        done.add(s)
        held[s] = g.sizes[s]
        for c in list(held):
            readers = {r for r in range(g.n) if g.readers[c][1] >> r & 1}
            if readers <= done and not g.forever >> c & 1:
                del held[c]
    return peak


def topological_orders(g: StepGraph):
    for perm in itertools.permutations(range(g.n)):
        pos = {s: i for i, s in enumerate(perm)}
        if all(pos[p] < pos[s] for s in range(g.n) for p in range(g.n) if g.preds[s] >> p & 1):
            yield list(perm)


@pytest.mark.parametrize("seed", range(40))
def test_exact_order_has_the_smallest_peak_of_all_topological_orders(seed):
    rng = random.Random(seed)
    g = random_graph(rng, rng.randint(2, 7))
    best = min(naive_peak(g, o) for o in topological_orders(g))
    order = min_peak_order(g)
    assert sorted(order) == list(range(g.n))
    assert order in list(topological_orders(g))
    assert g.peak(order) == naive_peak(g, order) == best
    assert g.peak(best_order(g)) <= g.peak(list(range(g.n)))


def test_greedy_gap_on_random_graphs():
    """The greedy order (graphs too big for the exact search) is a valid order; its measured gap to
    the exact peak on 200 random 12-step graphs stays small on average."""
    rng = random.Random(0)
    ratios = []
    for _ in range(200):
        g = random_graph(rng, 12)
        exact, greedy = min_peak_order(g), greedy_order(g)
        pos = {s: i for i, s in enumerate(greedy)}
        assert all(pos[p] < pos[s] for s in range(g.n) for p in range(g.n) if g.preds[s] >> p & 1)
        assert g.peak(greedy) >= g.peak(exact)
        ratios.append(g.peak(greedy) / g.peak(exact))
    assert sum(ratios) / len(ratios) < 1.15, sum(ratios) / len(ratios)


def test_state_limit_hands_over():
    g = random_graph(random.Random(1), 10)
    assert min_peak_order(g, max_states=2) is None
    assert sorted(best_order(g, max_states=2)) == list(range(10))


class TwoBranches(torch.nn.Module):
    """Program order runs the small branch first and holds its output while the wide branch runs;
    the wide branch first peaks lower."""

    def __init__(self):
        super().__init__()
        self.small = torch.nn.Conv2d(8, 8, 1)
        self.wide = torch.nn.Conv2d(8, 64, 3, padding=1)
        self.narrow = torch.nn.Conv2d(64, 8, 1)

    def forward(self, x):
        a = torch.relu(self.small(x))
        b = self.narrow(torch.relu(self.wide(x)))
        return a + b


@pytest.fixture(scope="module")
def branched():
    torch.manual_seed(0)
    x = torch.randn(1, 8, 16, 16)
    prog = corten.compile(TwoBranches().eval(), (x,), target="cortex-m4", name="branches",
                          calibration=torch.randn(16, 8, 16, 16))
    return prog, prog.fit_budget(prog.memory.arena_bytes - 1)


def test_min_peak_order_fits_where_program_order_does_not(branched):
    prog, fitted = branched
    assert fitted is not prog and fitted.schedule.reordered and not fitted.schedule.segments
    assert fitted.memory.arena_bytes < prog.memory.arena_bytes
    assert "min-peak order" in fitted.memory.report()
    steps = [n for n in fitted.memory.step_nodes]
    assert steps != list(prog.memory.step_nodes) and sorted(steps) == sorted(prog.memory.step_nodes)
    g = step_graph(prog.ep, [0] * len(steps))
    assert best_order(g) != list(range(g.n))
    x = torch.randn(1, 8, 16, 16, generator=torch.Generator().manual_seed(3))
    want = prog.run_int8(x)
    assert all(torch.equal(a, b) for a, b in zip(want, fitted.run_int8(x)))
    for kernels in ("cmsis-nn", "portable"):
        outs = replay_on_planned_bytes(fitted.ep, fitted.memory_for(kernels), [x])
        assert torch.equal(outs[0], prog.run(x))


@needs_gcc
def test_reordered_program_c_byte_exact_and_saved(branched, tmp_path):
    prog, fitted = branched
    x = torch.randn(1, 8, 16, 16, generator=torch.Generator().manual_seed(4))
    run = fitted.c_run(x, kernels="portable")
    assert all(torch.equal(a, b) for a, b in zip(prog.run_int8(x), run.outputs))
    fitted.save(tmp_path / "p")
    again = corten.load(tmp_path / "p")
    assert again.schedule.reordered and again.memory.step_nodes == fitted.memory.step_nodes
    assert again.memory.arena_bytes == fitted.memory.arena_bytes


@needs_qemu
def test_reordered_program_on_qemu_m4_byte_exact(branched):
    prog, fitted = branched
    x = torch.randn(1, 8, 16, 16, generator=torch.Generator().manual_seed(6))
    run = fitted.c_run(x, on="qemu", kernels="portable", target="cortex-m4")
    assert all(torch.equal(a, b) for a, b in zip(prog.run_int8(x), run.outputs))


def test_chain_keeps_program_order():
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.ReLU(), torch.nn.Conv2d(8, 4, 3)).eval()
    prog = corten.compile(m, (torch.randn(1, 3, 12, 12),), calibration=torch.randn(8, 3, 12, 12))
    g = step_graph(prog.ep, [0] * len(prog.memory.step_nodes))
    assert best_order(g) == list(range(g.n))
