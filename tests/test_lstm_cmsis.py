"""``quantized_lstm`` against CMSIS-NN's own ``arm_lstm_unidirectional_s8`` (its plain-C path, built on
the host from the tree at CMSIS_NN_PATH; skipped without it).

Corten's default sigmoid table is its own (see corten/ops/lstm.py); CMSIS-NN ships a table that
differs in a few entries by one unit of 2**-16.  The op takes the table as an argument, so this test
reads CMSIS-NN's ``sigmoid_table_uint16`` from the tree at run time and checks that, with it, the
reference kernel computes exactly what CMSIS-NN computes, byte for byte, on random layers: the
arithmetic (gate requantization and saturation, int16 sigmoid/tanh, cell update and clip, output)
is CMSIS-NN's."""
from __future__ import annotations

import ctypes
import random
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
from conftest import CMSIS_NN_PATH

from test_lstm import random_case

GCC = shutil.which("gcc")
pytestmark = pytest.mark.skipif(GCC is None or not CMSIS_NN_PATH, reason="needs gcc and CMSIS_NN_PATH")

SOURCES = ["LSTMFunctions/arm_lstm_unidirectional_s8.c", "NNSupportFunctions/arm_nn_lstm_step_s8.c",
           "NNSupportFunctions/arm_nn_lstm_calculate_gate_s8_s16.c",
           "NNSupportFunctions/arm_nn_vec_mat_mul_result_acc_s8_s16.c", "ActivationFunctions/arm_nn_activation_s16.c",
           "BasicMathFunctions/arm_elementwise_mul_s16.c", "BasicMathFunctions/arm_elementwise_mul_acc_s16.c",
           "BasicMathFunctions/arm_elementwise_mul_s16_s8.c", "NNSupportFunctions/arm_nntables.c"]
ARM_SIGMOID, ARM_TANH = 0, 1


class Gate(ctypes.Structure):
    _fields_ = [("input_multiplier", ctypes.c_int32), ("input_shift", ctypes.c_int32),
                ("input_weights", ctypes.c_void_p), ("input_effective_bias", ctypes.c_void_p),
                ("hidden_multiplier", ctypes.c_int32), ("hidden_shift", ctypes.c_int32),
                ("hidden_weights", ctypes.c_void_p), ("hidden_effective_bias", ctypes.c_void_p),
                ("bias", ctypes.c_void_p), ("activation_type", ctypes.c_int)]


class Params(ctypes.Structure):
    _fields_ = [(n, ctypes.c_int32) for n in (
        "time_major", "batch_size", "time_steps", "input_size", "hidden_size", "input_offset",
        "forget_to_cell_multiplier", "forget_to_cell_shift", "input_to_cell_multiplier", "input_to_cell_shift",
        "cell_clip", "cell_scale_power", "output_multiplier", "output_shift", "output_offset")] + [
        (g, Gate) for g in ("forget_gate", "input_gate", "cell_gate", "output_gate")]


class Context(ctypes.Structure):
    _fields_ = [(n, ctypes.c_void_p) for n in ("temp1", "temp2", "cell_state", "hidden_state")]


@pytest.fixture(scope="module")
def cmsis(tmp_path_factory):
    root = Path(CMSIS_NN_PATH)
    out = tmp_path_factory.mktemp("cmsis_lstm") / "libcmsislstm.so"
    subprocess.run([GCC, "-std=c99", "-O2", "-shared", "-fPIC", f"-I{root / 'Include'}",
                    *(str(root / "Source" / s) for s in SOURCES), "-o", str(out)],
                   check=True, capture_output=True, text=True)
    lib = ctypes.CDLL(str(out))
    lib.arm_lstm_unidirectional_s8.restype = ctypes.c_int
    lib.arm_lstm_unidirectional_s8.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.POINTER(Params),
                                               ctypes.POINTER(Context)]
    return lib


@pytest.fixture(scope="module")
def cmsis_table() -> torch.Tensor:
    text = (Path(CMSIS_NN_PATH) / "Source" / "NNSupportFunctions" / "arm_nntables.c").read_text()
    body = text[text.index("sigmoid_table_uint16"):]
    body = body[body.index("{") + 1: body.index("}")]
    values = [int(v, 0) for v in re.findall(r"0x[0-9a-fA-F]+|\d+", body)]
    assert len(values) == 256
    return torch.tensor(values, dtype=torch.int32)


def _buf(t: torch.Tensor):
    data = t.contiguous().numpy().tobytes()
    return (ctypes.c_char * max(1, len(data))).from_buffer_copy(data)


def run_cmsis(lib, case: dict) -> torch.Tensor:
    x = case["input"]
    tm = case["time_major"]
    steps, batches = (x.shape[0], x.shape[1]) if tm else (x.shape[1], x.shape[0])
    hidden = case["input_weights"].shape[1]
    keep = []

    def ptr(t):
        b = _buf(t)
        keep.append(b)
        return ctypes.cast(b, ctypes.c_void_p)

    gates = []
    for k, act in ((1, ARM_SIGMOID), (0, ARM_SIGMOID), (2, ARM_TANH), (3, ARM_SIGMOID)):  # forget, input, cell, output
        gates.append(Gate(int(case["gate_multipliers"][k, 0]), int(case["gate_shifts"][k, 0]),
                          ptr(case["input_weights"][k]), ptr(case["input_effective_bias"][k]),
                          int(case["gate_multipliers"][k, 1]), int(case["gate_shifts"][k, 1]),
                          ptr(case["hidden_weights"][k]), ptr(case["hidden_effective_bias"][k]), None, act))
    p = Params(int(tm), batches, steps, x.shape[2], hidden, 0, case["forget_to_cell_multiplier"],
               case["forget_to_cell_shift"], case["input_to_cell_multiplier"], case["input_to_cell_shift"],
               case["cell_clip"], case["cell_scale_power"], case["output_multiplier"], case["output_shift"],
               case["output_offset"], *gates)
    temp1, temp2, cell = ((ctypes.c_int16 * (batches * hidden))() for _ in range(3))
    ctx = Context(ctypes.cast(temp1, ctypes.c_void_p), ctypes.cast(temp2, ctypes.c_void_p),
                  ctypes.cast(cell, ctypes.c_void_p), None)
    out = (ctypes.c_int8 * (steps * batches * hidden))()
    assert lib.arm_lstm_unidirectional_s8(_buf(x), out, ctypes.byref(p), ctypes.byref(ctx)) == 0
    return torch.frombuffer(bytearray(out), dtype=torch.int8).reshape(*x.shape[:2], hidden)


def test_reference_with_cmsis_table_matches_arm_lstm_unidirectional_s8(cmsis, cmsis_table):
    rng = random.Random(5)
    for _ in range(300):
        case = random_case(rng)
        case["last_only"] = False
        case["sigmoid_table"] = cmsis_table
        expected = run_cmsis(cmsis, case)
        assert torch.equal(torch.ops.corten.quantized_lstm(*case.values()), expected)


def test_corten_table_is_close_to_cmsis_table(cmsis_table):
    from corten.ops.lstm import sigmoid_table

    diff = (sigmoid_table() - cmsis_table).abs()
    assert int(diff.max()) <= 1


def test_lstm_program_cmsis_flavour_byte_exact_host_and_qemu():
    """The "cmsis-nn" library of an LSTM program (arm_fully_connected_s8 for the classifier, Corten's
    LSTM kernel for the layers) computes the reference's bytes on the host, M55 and M4."""
    from test_lstm import LSTMNet

    import corten

    model = LSTMNet("h[-1]", 2, hidden=10).eval()
    x = torch.randn(1, 6, 6, generator=torch.Generator().manual_seed(4))
    prog = corten.compile(model, (x,))
    expected = prog.run_int8(x)[0]
    assert torch.equal(prog.run_c(x, on="host", kernels="cmsis-nn", int8=True)[0], expected)
    for target in ("cortex-m55", "cortex-m4"):
        assert torch.equal(prog.run_c(x, on="qemu", target=target, kernels="cmsis-nn", int8=True)[0], expected)
