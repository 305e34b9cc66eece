"""16x8 programs on the emulated boards (issue 13): a mixed model (int16 encoder, int8 decoder) and the
residual int16 model (s16 add and mul of two activations) run byte-exact on QEMU Cortex-M55 and Cortex-M4
with the portable kernels, and with CMSIS-NN's when ``CMSIS_NN_PATH`` names a CMSIS-NN tree."""
from __future__ import annotations

import pytest
import torch
from conftest import CMSIS_NN_PATH, needs_cmsis_nn, needs_qemu

import corten
from corten.zoo import get_model
from test_int16 import Residual

BOARDS = ("cortex-m55", "cortex-m4")


@pytest.fixture(scope="module")
def mixed_deep_ae():
    """deep-ae with its encoder in int16 and its decoder in int8 (module-path precision)."""
    model, example = get_model("deep-ae")
    prog = corten.compile(model, example, name="deep_ae_mixed", precision={"": "int8", "encoder": "int16"})
    return prog, torch.randn(example[0].shape, generator=torch.Generator().manual_seed(5))


@pytest.fixture(scope="module")
def residual16():
    torch.manual_seed(0)
    x = torch.randn(2, 16, generator=torch.Generator().manual_seed(4))
    return corten.compile(Residual().eval(), (x,), name="residual16", precision="int16"), x


def test_mixed_deep_ae_is_int16_then_int8(mixed_deep_ae):
    prog, _ = mixed_deep_ae
    ops = prog.op_counts()
    assert not prog.unlowered_ops() and ops["quantized_requantize"] >= 1
    assert prog.inputs[0].bits == 16 and prog.outputs[0].bits == 8


def _exact_on(prog, x, target, kernels):
    run = prog.c_run(x, on="qemu", target=target, kernels=kernels, cmsis_nn_path=CMSIS_NN_PATH)
    expected = prog.run_int8(x)
    assert all(torch.equal(a, b) for a, b in zip(expected, run.outputs)), (target, kernels)
    assert run.instructions > 0


@needs_qemu
@pytest.mark.slow
@pytest.mark.parametrize("target", BOARDS)
def test_mixed_deep_ae_on_qemu_portable(mixed_deep_ae, target):
    _exact_on(*mixed_deep_ae, target, "portable")


@needs_qemu
@pytest.mark.parametrize("target", BOARDS)
def test_residual_int16_on_qemu_portable(residual16, target):
    _exact_on(*residual16, target, "portable")


@needs_qemu
@needs_cmsis_nn
@pytest.mark.parametrize("target", BOARDS)
@pytest.mark.parametrize("which", ["mixed", "residual"])
def test_int16_programs_on_qemu_cmsis_nn(mixed_deep_ae, residual16, which, target):
    _exact_on(*(mixed_deep_ae if which == "mixed" else residual16), target, "cmsis-nn")
