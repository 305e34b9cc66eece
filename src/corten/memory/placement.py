"""Static offset assignment: pack buffers with known lifetimes into one arena.

A buffer is ``(key, size, first, last)``: it occupies ``size`` bytes from step ``first`` through step
``last`` inclusive.  Two buffers conflict when their step ranges intersect; conflicting buffers
must not share bytes.  Finding the smallest arena is NP-hard (dynamic storage allocation), so
:func:`pack` runs greedy best-fit (each buffer goes into the tightest gap left among the buffers
already placed that conflict with it, else on top of them) under a few visiting orders and keeps
the smallest result:

* ``"size"``: largest first (TFLite Micro's ``GreedyMemoryPlanner`` order);
* ``"breadth"``: buffers alive at the most crowded steps first, then by size (Pisarchyk & Lee,
  "Efficient Memory Management for Deep Neural Net Inference", greedy by breadth);
* ``"duration"``: longest-lived first, then by size;
* ``"first"``: in order of first use, then by size.

When the best of them is above the lower bound (the most bytes live at one step), each order is
*lifted* a few rounds: the buffers that reach the arena's top move halfway to the front of the
order and it is packed again (``"<order>+lift"``; banded schedules' many short-lived band buffers
leave gaps greedy orders alone do not close).
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Buffer:
    """``size`` bytes from step ``first`` through ``last``; with ``parts``, only those
    ``(byte, size, first, last)`` rectangles of it are busy (a chain of tensors at fixed places in
    one buffer, each live for its own steps)."""

    key: str
    size: int  # bytes, already rounded up to the alignment
    first: int
    last: int
    parts: tuple[tuple[int, int, int, int], ...] = ()

    def conflicts(self, other: "Buffer") -> bool:
        return self.first <= other.last and other.first <= self.last

    def rectangles(self) -> tuple[tuple[int, int, int, int], ...]:
        return self.parts or ((0, self.size, self.first, self.last),)


def align_up(n: int, alignment: int) -> int:
    return -(-n // alignment) * alignment


def _step_load(buffers: list[Buffer]) -> dict[int, int]:
    load: dict[int, int] = {}
    for b in buffers:
        for s in range(b.first, b.last + 1):
            busy = b.size if not b.parts else \
                max((o + n for o, n, f, l in b.parts if f <= s <= l), default=0) - \
                min((o for o, n, f, l in b.parts if f <= s <= l), default=0)
            load[s] = load.get(s, 0) + busy
    return load


def visiting_orders(buffers: list[Buffer]) -> dict[str, list[Buffer]]:
    load = _step_load(buffers)
    crowd = {b.key: max(load[s] for s in range(b.first, b.last + 1)) for b in buffers}
    return {
        "size": sorted(buffers, key=lambda b: (-b.size, -(b.last - b.first), b.first, b.key)),
        "breadth": sorted(buffers, key=lambda b: (-crowd[b.key], -b.size, b.first, b.key)),
        "duration": sorted(buffers, key=lambda b: (-(b.last - b.first), -b.size, b.first, b.key)),
        "first": sorted(buffers, key=lambda b: (b.first, -b.size, b.key)),
    }


def fit_offset(placed: list[tuple[int, Buffer]], buf: Buffer) -> int:
    """Best-fit offset of ``buf`` among the ``(offset, buffer)`` pairs already placed: the tightest
    gap between the buffers it conflicts with, else on top of them."""
    if buf.parts or any(other.parts for _, other in placed):
        return _lowest_offset(placed, buf)
    busy = sorted(((off, other) for off, other in placed if other.conflicts(buf)), key=lambda p: (p[0], p[1].size))
    best_off, best_gap, top = None, None, 0
    for off, other in busy:
        gap = off - top
        if gap >= buf.size and (best_gap is None or gap < best_gap):
            best_off, best_gap = top, gap
        top = max(top, off + other.size)
    return top if best_off is None else best_off


def _lowest_offset(placed: list[tuple[int, Buffer]], buf: Buffer) -> int:
    """The lowest offset at which no rectangle of ``buf`` overlaps a rectangle of a placed buffer
    live at the same steps (buffers with ``parts``)."""
    banned = []  # open intervals of offsets
    for off, other in placed:
        if not other.conflicts(buf):
            continue
        for qo, qn, qf, ql in other.rectangles():
            for po, pn, pf, pl in buf.rectangles():
                if qf <= pl and pf <= ql:
                    banned.append((off + qo - po - pn, off + qo + qn - po))
    for cand in sorted({0} | {b for _, b in banned if b > 0}):
        if not any(a < cand < b for a, b in banned):
            return cand
    raise AssertionError("unreachable: the top of every placed rectangle is free")


def best_fit(order: list[Buffer]) -> dict[str, int]:
    """Place the buffers in ``order``; each offset is a sum of (aligned) sizes."""
    placed: list[tuple[int, Buffer]] = []
    offsets: dict[str, int] = {}
    for buf in order:
        offset = fit_offset(placed, buf)
        offsets[buf.key] = offset
        placed.append((offset, buf))
    return offsets


def arena_size(buffers: list[Buffer], offsets: dict[str, int]) -> int:
    return max((offsets[b.key] + b.size for b in buffers), default=0)


LIFT_WORK = 4_000_000  # buffer pairs (rounds x n^2) the lifting may spend per visiting order
LIFT_ROUNDS = 16


def lower_bound(buffers: list[Buffer]) -> int:
    """The most bytes live at one step: no packing is smaller."""
    return max(_step_load(buffers).values(), default=0)


def lifted(order: list[Buffer], rounds: int, floor: int) -> tuple[int, dict[str, int]]:
    """Pack ``order``, then ``rounds`` times move each buffer ending at the arena's top halfway to
    the front of the order and pack again (stopping at ``floor``); the smallest packing seen."""
    order = list(order)
    best: tuple[int, dict[str, int]] | None = None
    for _ in range(rounds):
        offsets = best_fit(order)
        size = arena_size(order, offsets)
        if best is None or size < best[0]:
            best = (size, offsets)
        if size <= floor:
            break
        for i, buf in enumerate(list(order)):
            if i and offsets[buf.key] + buf.size == size:
                order.insert(i // 2, order.pop(i))
    assert best is not None
    return best


def pack(buffers: list[Buffer]) -> tuple[dict[str, int], str]:
    """The smallest packing found, and the name of the visiting order that found it."""
    best: tuple[int, dict[str, int], str] | None = None
    orders = visiting_orders(buffers)
    for name, order in orders.items():
        offsets = best_fit(order)
        size = arena_size(buffers, offsets)
        if best is None or size < best[0]:
            best = (size, offsets, name)
    if best is None:
        return {}, "size"
    floor = lower_bound(buffers)
    rounds = min(LIFT_ROUNDS, LIFT_WORK // max(1, len(buffers) ** 2))
    if best[0] > floor and rounds > 1:
        for name, order in orders.items():
            size, offsets = lifted(order, rounds, floor)
            if size < best[0]:
                best = (size, offsets, f"{name}+lift")
            if best[0] <= floor:
                break
    return best[1], best[2]


def hot_first(buffers: list[Buffer]) -> list[Buffer]:
    """The order buffers claim the fastest memory region: kernel scratch first (read and written
    over and over by its kernel), then activations from the smallest (small buffers give the most
    accesses per byte of fast memory), ties by first use."""
    return sorted(buffers, key=lambda b: (not b.key.startswith("scratch:"), b.size, b.first, b.key))


def assign_regions(buffers: list[Buffer], capacities: list[int | None]) -> tuple[list[int], dict[str, int], str]:
    """Split ``buffers`` over memory regions (``capacities`` in bytes, fastest first; None: no limit).

    Each buffer, in :func:`hot_first` order, goes into the fastest region where it fits at its
    best-fit offset; a buffer that fits nowhere goes into the last region (over its capacity: the
    caller's budget check names it).  Each region is then repacked with :func:`pack` and keeps the
    smaller of the two packings.  Returns (region index of each buffer, offsets within their
    region, the packing strategy)."""
    placed: list[list[tuple[int, Buffer]]] = [[] for _ in capacities]
    where: dict[str, int] = {}
    offsets: dict[str, int] = {}
    for buf in hot_first(buffers):
        for r, cap in enumerate(capacities):
            off = fit_offset(placed[r], buf)
            if cap is None or off + buf.size <= cap or r == len(capacities) - 1:
                placed[r].append((off, buf))
                where[buf.key], offsets[buf.key] = r, off
                break
    strategies = []
    for r in range(len(capacities)):
        members = [b for _, b in placed[r]]
        repacked, strategy = pack(members)
        if arena_size(members, repacked) <= arena_size(members, {b.key: o for o, b in placed[r]}):
            offsets.update(repacked)
            strategies.append(strategy)
        else:
            strategies.append("hot-first")
    return [where[b.key] for b in buffers], offsets, "/".join(strategies)
