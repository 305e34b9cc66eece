"""The checks the model-collection tests share (test_idioms, test_outsider_seq, test_outsider_vision):
seeded N(0, 1) example inputs and calibration samples, and a compiled model's C bytes and float
closeness."""
from __future__ import annotations

import torch


def leaves(x) -> list:
    return list(torch.utils._pytree.tree_leaves(x))


def seeded_samples(shapes, calibration: int, seed: int = 1) -> tuple[tuple, list[tuple]]:
    """(example inputs, ``calibration`` samples): N(0, 1) tensors of ``shapes`` (one per model input),
    drawn in that order from one generator seeded ``seed``."""
    g = torch.Generator().manual_seed(seed)
    inputs = tuple(torch.randn(s, generator=g) for s in shapes)
    return inputs, [tuple(torch.randn(s, generator=g) for s in shapes) for _ in range(calibration)]


def assert_c_bytes_equal(prog, inputs, cflags=()) -> None:
    """The host C library (portable kernels) gives the reference kernels' bytes for every output."""
    want = leaves(prog.run_int8(*inputs))
    got = leaves(prog.c_run(*inputs, kernels="portable", cflags=cflags).outputs)
    assert len(got) == len(want)
    for w, g in zip(want, got):
        assert w.shape == g.shape and torch.equal(w.contiguous(), g.contiguous())


def assert_close_to_float(model, inputs, prog, name: str, cosine: float = 0.95) -> None:
    """Every float output within ``cosine`` of the model's; index / truth-value outputs (int32 in the
    program, int64 or bool in the model) agree on 95% of their elements."""
    with torch.no_grad():
        ref = leaves(model(*inputs))
    out = leaves(prog.run(*inputs))
    assert len(ref) == len(out)
    for r, q in zip(ref, out):
        assert r.shape == q.shape and r.is_floating_point() == q.is_floating_point(), (r.dtype, q.dtype)
        if r.is_floating_point():
            cos = torch.nn.functional.cosine_similarity(r.flatten().double(), q.flatten().double(), dim=0)
            assert cos >= cosine, (name, float(cos))
        else:
            assert (r == q).double().mean() >= 0.95, (name, float((r == q).double().mean()))
