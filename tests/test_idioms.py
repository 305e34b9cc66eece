"""Real-world idioms (tests/idiom_models.py), written by an outsider the way people write PyTorch: each
either compiles fully lowered, runs byte-exact in C on the host and agrees with the float model
(cosine >= 0.95).  (The last refusals - a class-token cat, dict outputs - lower now; an op Corten
refuses is pinned in tests/test_refusals.py, with the clean CortenError naming it.)
"""
from __future__ import annotations

import pytest
import torch

import corten
from conftest import HOST_CFLAGS
from corten.codegen.generated import GEN_OPS
from idiom_models import IDIOMS
from model_checks import leaves, seeded_samples

CASES = {name: (factory, shapes) for name, factory, shapes in IDIOMS}


def _compile(name):
    factory, shapes = CASES[name]
    torch.manual_seed(0)
    model = factory().eval()
    inputs, calibration = seeded_samples(shapes, 3)
    return model, inputs, corten.compile(model, inputs, calibration=calibration, name="idiom")


def test_idiom_corpus_size():
    assert len(CASES) >= 80 and len(CASES) == len(IDIOMS)


@pytest.mark.parametrize("name", list(CASES))
def test_idiom_is_lowered_byte_exact_and_close_to_float(name):
    model, inputs, prog = _compile(name)
    assert prog.unlowered_ops() == [], prog.operator_table()
    expected = leaves(prog.run_int8(*inputs))
    got = leaves(prog.run_c(*inputs, on="host", int8=True))
    assert len(got) == len(expected)
    for e, c in zip(expected, got):
        assert e.shape == c.shape and torch.equal(e.contiguous(), c.contiguous())
    if set(prog.op_counts()) & set(GEN_OPS):  # Corten's generated kernels (the DSP path's C), same bytes
        gen = leaves(prog.run_c(*inputs, on="host", int8=True, kernels="generated", target="cortex-m4",
                                 cflags=HOST_CFLAGS))
        for e, c in zip(expected, gen):
            assert e.shape == c.shape and torch.equal(e.contiguous(), c.contiguous())
    with torch.no_grad():
        ref = leaves(model(*inputs))
    for f, q in zip(ref, leaves(prog.run(*inputs))):
        cos = torch.nn.functional.cosine_similarity(f.flatten().double(), q.flatten().double(), dim=0)
        assert cos >= 0.95, (name, float(cos))
