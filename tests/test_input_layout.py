"""A program input that its first layer reads through a layout-changing reshape (Conv1d's
[N, C, L] -> [N, C, 1, L], an un-flatten before a conv) is taken by the C library in that layer's
layout: no layout copy step, the header documents the layout, and the bytes stay exact."""
from __future__ import annotations

import ctypes  # noqa: F401  (conftest helpers)
import warnings

import pytest
import torch
from conftest import needs_gcc

import corten
from corten.runners.program_runner import inputs_to_c_bytes, tensor_to_c_bytes

pytestmark = needs_gcc


class Conv1dNet(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv1d(6, 8, 3, padding=1)
        self.head = torch.nn.Linear(8, 4)

    def forward(self, x):
        return self.head(torch.relu(self.conv(x)).mean(-1))


class UnflattenNet(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 5, 3)

    def forward(self, x):
        return torch.relu(self.conv(x.reshape(x.shape[0], 3, 4, 5)))


class TwoReaders(torch.nn.Module):
    """The input is read by the reshape and by an add: it keeps its own (row-major) layout."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv1d(6, 6, 1)

    def forward(self, x):
        return self.conv(x) + x


def _compile(model, shape, batch=1):
    g = torch.Generator().manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        prog = corten.compile(model.eval(), (torch.randn(batch, *shape, generator=g),),
                              calibration=[(torch.randn(batch, *shape, generator=g),) for _ in range(4)])
    return prog, torch.randn(batch, *shape, generator=g)


@pytest.mark.parametrize("model, shape, first, batch", [
    (Conv1dNet(), (6, 11), (6, 1, 11), 1),
    (Conv1dNet(), (6, 11), (6, 1, 11), 2),
    (UnflattenNet(), (60,), (3, 4, 5), 1),
], ids=["conv1d", "conv1d-batch2", "unflatten"])
def test_input_takes_the_first_layers_layout(model, shape, first, batch, tmp_path):
    torch.manual_seed(0)
    prog, x = _compile(model, shape, batch)
    steps = prog.kernel_choices("portable")
    assert not any(s.op.startswith("reshape") for s in steps), [s.op for s in steps]
    lib = prog.emit_c(tmp_path / "c")
    (t,) = lib.inputs
    assert t.shape == (batch, *first) and t.source_shape == (batch, *shape)
    assert "as its first layer reads it" in lib.header.read_text()
    # the caller's bytes: the input reshaped to the first layer's 4-D tensor, in NHWC order
    q = prog.quantize_inputs(x)[0]
    data = inputs_to_c_bytes(lib, [q])
    assert data == q.reshape(batch, *first).permute(0, 2, 3, 1).contiguous().numpy().tobytes()
    assert data != tensor_to_c_bytes(q)
    expected = prog.run_int8(x)[0]
    assert torch.equal(prog.run_c(x, on="host", int8=True)[0], expected)


def test_input_with_two_readers_keeps_its_layout(tmp_path):
    torch.manual_seed(0)
    prog, x = _compile(TwoReaders(), (6, 7))
    lib = prog.emit_c(tmp_path / "c")
    assert lib.inputs[0].shape == (1, 6, 7) and lib.inputs[0].source_shape is None
    assert any(s.op.startswith("reshape") for s in prog.kernel_choices("portable"))
    assert torch.equal(prog.run_c(x, on="host", int8=True)[0], prog.run_int8(x)[0])
