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
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Buffer:
    key: str
    size: int  # bytes, already rounded up to the alignment
    first: int
    last: int

    def conflicts(self, other: "Buffer") -> bool:
        return self.first <= other.last and other.first <= self.last


def align_up(n: int, alignment: int) -> int:
    return -(-n // alignment) * alignment


def _step_load(buffers: list[Buffer]) -> dict[int, int]:
    load: dict[int, int] = {}
    for b in buffers:
        for s in range(b.first, b.last + 1):
            load[s] = load.get(s, 0) + b.size
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


def best_fit(order: list[Buffer]) -> dict[str, int]:
    """Place the buffers in ``order``; each offset is a sum of (aligned) sizes."""
    placed: list[tuple[int, Buffer]] = []
    offsets: dict[str, int] = {}
    for buf in order:
        busy = sorted(((off, other) for off, other in placed if other.conflicts(buf)),
                      key=lambda p: (p[0], p[1].size))
        best_off, best_gap, top = None, None, 0
        for off, other in busy:
            gap = off - top
            if gap >= buf.size and (best_gap is None or gap < best_gap):
                best_off, best_gap = top, gap
            top = max(top, off + other.size)
        offset = top if best_off is None else best_off
        offsets[buf.key] = offset
        placed.append((offset, buf))
    return offsets


def arena_size(buffers: list[Buffer], offsets: dict[str, int]) -> int:
    return max((offsets[b.key] + b.size for b in buffers), default=0)


def pack(buffers: list[Buffer]) -> tuple[dict[str, int], str]:
    """The smallest packing found, and the name of the visiting order that found it."""
    best: tuple[int, dict[str, int], str] | None = None
    for name, order in visiting_orders(buffers).items():
        offsets = best_fit(order)
        size = arena_size(buffers, offsets)
        if best is None or size < best[0]:
            best = (size, offsets, name)
    if best is None:
        return {}, "size"
    return best[1], best[2]
