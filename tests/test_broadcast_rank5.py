"""Rank-5 elementwise operands: the broadcast walk collapsed into the C kernels' 4 loops
(``corten.ops._common.collapse_loops``) visits exactly the input elements the 5-loop walk visits."""
from __future__ import annotations

import itertools
import random

import pytest

from corten.ops._common import broadcast_fits, broadcast_loops, collapse_loops


def _walk(dims, strides):
    """The input element offset of every output element, in output storage order."""
    return [sum(i * s for i, s in zip(idx, strides)) for idx in itertools.product(*(range(d) for d in dims))]


def _random_case(rng):
    out = [rng.randint(1, 4) for _ in range(5)]
    ins = []
    for _ in range(rng.randint(2, 3)):
        rank = rng.randint(1, 5)
        ins.append(([d if rng.random() < 0.6 else 1 for d in out[5 - rank:]], rng.random() < 0.3))
    return out, ins


@pytest.mark.parametrize("seed", range(200))
def test_collapsed_walk_equals_the_rank5_walk(seed):
    rng = random.Random(seed)
    out, ins = _random_case(rng)
    geo = [broadcast_loops(out, s, rm) for s, rm in ins]
    dims = geo[0][0]
    cdims, cstrides = collapse_loops(dims, [g[2] for g in geo])
    n = 1
    for d in out:
        n *= d
    assert len(cdims) <= 5 and all(d > 1 for d in cdims) or cdims == [1]
    for (_, _, strides), cs in zip(geo, cstrides):
        assert _walk(cdims, cs) == _walk(dims, strides)
    assert broadcast_fits(out, ins) == (len(cdims) <= 4)


def test_examples():
    # same shape: one loop; per-channel [1, C, 1, 1, 1]: 3 loops; alternating broadcast: 5 loops (refused)
    assert collapse_loops([2, 3, 4, 5, 6], [[360, 120, 30, 6, 1]] * 2)[0] == [720]
    g = [broadcast_loops([2, 3, 4, 5, 6], s) for s in ([2, 3, 4, 5, 6], [1, 3, 1, 1, 1])]
    assert collapse_loops(g[0][0], [x[2] for x in g]) == ([2, 3, 120], [[360, 120, 1], [0, 1, 0]])
    assert not broadcast_fits([2, 3, 4, 5, 6], [([2, 3, 4, 5, 6], False), ([1, 3, 1, 5, 1], False)])
    assert broadcast_fits([2, 3, 4, 5, 6], [([2, 3, 4, 5, 6], False), ([2, 3, 1, 1, 1], False)])
