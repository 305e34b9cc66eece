"""Every zoo model (but the 224x224 ones: batching does not depend on size) also compiles at batch 2,
and its C library (portable kernels) computes on the host exactly the bytes of ``prog.run`` for both
samples."""
from __future__ import annotations

import pytest
import torch

import corten
from conftest import ZOO_224
from corten.zoo import get_model, list_models


@pytest.mark.parametrize("name", [n for n, _ in list_models() if n not in ZOO_224])  # (batching is size-blind)
def test_zoo_model_at_batch_two_is_byte_exact_on_host(name):
    model, inputs = get_model(name)
    g = torch.Generator().manual_seed(7)
    x = tuple(torch.randn((2, *t.shape[1:]), generator=g) for t in inputs)
    calibration = [tuple(torch.randn((2, *t.shape[1:]), generator=g) for t in inputs)]
    prog = corten.compile(model, x, calibration=calibration, name="zoo_b2")
    assert prog.unlowered_ops() == []
    expected = prog.run_int8(*x)
    got = prog.run_c(*x, on="host", int8=True)
    assert len(got) == len(expected)
    for e, c in zip(expected, got):
        assert e.shape[0] == 2 and torch.equal(e.contiguous(), c.contiguous())
