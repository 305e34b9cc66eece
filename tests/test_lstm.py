"""``quantized_lstm``: the reference kernel against the naive CMSIS-NN LSTM (tests/naive_lstm.py), the
portable C kernel (kernels/lstm.c) byte for byte against the reference, nn.LSTM idioms through
``corten.compile`` (dialect), and C on the host and on QEMU Cortex-M55 / Cortex-M4."""
from __future__ import annotations

import ctypes
import math
import random
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
from torch import nn

import corten
import corten.ops  # noqa: F401
import naive_lstm
from corten.codegen import KERNELS_DIR
from corten.fixed_point import quantize_multiplier
from corten.ops.lstm import activation_s16, cell_scale_power, sigmoid_table
from corten.testing.tester import Tester

GCC = shutil.which("gcc")
lstm_op = torch.ops.corten.quantized_lstm
# The fake-quantized model runs each LSTM layer in float (only its input and output are
# fake-quantized), so the int8 program may differ from it by a few output steps.
QTOL = 6
Q, DQ, LSTM, LINEAR = "quantize_per_tensor", "dequantize_per_tensor", "quantized_lstm", "quantized_linear"


# ----------------------------------------------------------------------------- random cases
def _table(rng: random.Random) -> torch.Tensor:
    """Corten's table, or a perturbed monotone one (the kernels take any table)."""
    t = sigmoid_table()
    if rng.random() < 0.5:
        return t
    noise = torch.tensor([rng.randint(-2, 2) for _ in range(256)], dtype=torch.int32)
    t = (t + noise).clamp(32768, 65535)
    return torch.cummax(t, 0).values.to(torch.int32)


def random_case(rng: random.Random) -> dict:
    b, t, i, h = rng.randint(1, 3), rng.randint(1, 5), rng.randint(1, 9), rng.randint(1, 7)
    time_major = rng.random() < 0.5
    shape = (t, b, i) if time_major else (b, t, i)
    x = torch.randint(-128, 128, shape, generator=torch.Generator().manual_seed(rng.randint(0, 2**31)),
                      dtype=torch.int8)
    g = torch.Generator().manual_seed(rng.randint(0, 2**31))
    wx = torch.randint(-127, 128, (4, h, i), generator=g, dtype=torch.int8)
    wh = torch.randint(-127, 128, (4, h, h), generator=g, dtype=torch.int8)
    ebx = torch.randint(-40000, 40000, (4, h), generator=g, dtype=torch.int32)
    ebh = torch.randint(-20000, 20000, (4, h), generator=g, dtype=torch.int32)
    mults, shifts = [], []
    for _ in range(4):
        row_m, row_s = [], []
        for _ in range(2):
            m, s = quantize_multiplier(rng.uniform(2**-9, 2.0))
            row_m.append(m)
            row_s.append(s)
        mults.append(row_m)
        shifts.append(row_s)
    p = rng.randint(-15, -3)
    f2c = quantize_multiplier(2.0**-15)
    i2c = quantize_multiplier(2.0 ** (-30 - p))
    out_scale = rng.uniform(1 / 256, 1 / 64)
    out_m, out_s = quantize_multiplier(2.0**-30 / out_scale)
    return dict(input=x, input_weights=wx, hidden_weights=wh, input_effective_bias=ebx,
                hidden_effective_bias=ebh, gate_multipliers=torch.tensor(mults, dtype=torch.int32),
                gate_shifts=torch.tensor(shifts, dtype=torch.int32), sigmoid_table=_table(rng),
                output_offset=rng.randint(-20, 20), output_multiplier=out_m, output_shift=out_s,
                forget_to_cell_multiplier=f2c[0], forget_to_cell_shift=f2c[1],
                input_to_cell_multiplier=i2c[0], input_to_cell_shift=i2c[1],
                cell_clip=rng.choice([32767, 32767, rng.randint(1000, 32767)]), cell_scale_power=p,
                time_major=time_major, last_only=rng.random() < 0.3)


def _reference(case: dict) -> torch.Tensor:
    return lstm_op(*case.values())


def _naive(case: dict) -> torch.Tensor:
    c = case
    out = naive_lstm.lstm(
        c["input"].tolist(), c["input_weights"].tolist(), c["hidden_weights"].tolist(),
        c["input_effective_bias"].tolist(), c["hidden_effective_bias"].tolist(), c["gate_multipliers"].tolist(),
        c["gate_shifts"].tolist(), c["sigmoid_table"].tolist(), c["output_offset"], c["output_multiplier"],
        c["output_shift"], (c["forget_to_cell_multiplier"], c["forget_to_cell_shift"]),
        (c["input_to_cell_multiplier"], c["input_to_cell_shift"]), c["cell_clip"], c["cell_scale_power"],
        c["time_major"], c["last_only"])
    return torch.tensor(out, dtype=torch.int8)


# ----------------------------------------------------------------------------- reference vs naive
def test_reference_matches_naive_lstm():
    rng = random.Random(7)
    for _ in range(60):
        case = random_case(rng)
        assert torch.equal(_reference(case), _naive(case)), {k: v for k, v in case.items() if not torch.is_tensor(v)}


@pytest.mark.parametrize("sigmoid", [True, False])
def test_activation_s16_matches_naive(sigmoid):
    table = sigmoid_table()
    rng = random.Random(3)
    values = [-32768, -32767, -1, 0, 1, 32767] + [rng.randint(-32768, 32767) for _ in range(1500)]
    for shift in (-3, -1, 0, 1, 3, 13) if not sigmoid else (0,):
        got = activation_s16(torch.tensor(values, dtype=torch.int64), shift, sigmoid, table).tolist()
        assert got == [naive_lstm.activation_s16(v, shift, sigmoid, table.tolist()) for v in values]


def test_sigmoid_table_is_the_rounded_sigmoid():
    t = sigmoid_table().tolist()
    assert t[0] == 32768 and 65534 <= t[-1] <= 65535 and all(a <= b for a, b in zip(t, t[1:]))
    for k in (1, 24, 100, 200):
        assert abs(t[k] - 65536 / (1 + math.exp(-k / 24))) <= 0.5


def test_activation_s16_is_sigmoid_and_tanh():
    """Q3.12 in, Q0.15 out: within a few units of the real function."""
    x = torch.arange(-32768, 32768, 7, dtype=torch.int64)
    real = x.double() / 4096
    sig = activation_s16(x, 0, True, sigmoid_table()).double() / 32768
    tanh = activation_s16(x, 0, False, sigmoid_table()).double() / 32768
    assert float((sig - torch.sigmoid(real)).abs().max()) < 4e-4
    assert float((tanh - torch.tanh(real)).abs().max()) < 8e-4


def test_cell_scale_power():
    assert cell_scale_power(0.0) == -11
    assert cell_scale_power(1.0) == -15 and cell_scale_power(1.5) == -14 and cell_scale_power(3.9) == -13
    assert cell_scale_power(1e9) == -3


def test_fake_kernel_shapes():
    rng = random.Random(1)
    for _ in range(10):
        case = random_case(rng)
        from torch._subclasses.fake_tensor import FakeTensorMode

        with FakeTensorMode(allow_non_fake_inputs=True):
            fake = lstm_op(*case.values())
        assert fake.shape == _reference(case).shape


def test_reference_refuses_bad_arguments():
    case = random_case(random.Random(2))
    case["input_weights"] = case["input_weights"][:, :, :0]
    with pytest.raises(Exception, match="input_weights"):
        _reference(case)


# ----------------------------------------------------------------------------- C kernel on the host
class Params(ctypes.Structure):
    _fields_ = [(n, ctypes.c_int32) for n in (
        "time_major", "last_only", "batches", "time_steps", "input_size", "hidden_size", "output_offset",
        "output_multiplier", "output_shift", "forget_to_cell_multiplier", "forget_to_cell_shift",
        "input_to_cell_multiplier", "input_to_cell_shift", "cell_clip", "cell_scale_power")] + [
        (n, ctypes.c_void_p) for n in ("input_weights", "hidden_weights", "input_effective_bias",
                                       "hidden_effective_bias", "gate_multipliers", "gate_shifts",
                                       "sigmoid_table")]


@pytest.fixture(scope="module")
def portable(tmp_path_factory):
    if GCC is None:
        pytest.skip("needs gcc")
    out = tmp_path_factory.mktemp("lstm") / "liblstm.so"
    subprocess.run([GCC, "-std=c99", "-O2", "-shared", "-fPIC", "-Wall", "-Wextra", "-Werror", "-Wconversion",
                    f"-I{KERNELS_DIR}", str(KERNELS_DIR / "lstm.c"), "-o", str(out)],
                   check=True, capture_output=True, text=True)
    lib = ctypes.CDLL(str(out))
    lib.corten_lstm_s8.restype = ctypes.c_int
    lib.corten_lstm_s8.argtypes = [ctypes.POINTER(Params), ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
    return lib


def _buf(t: torch.Tensor):
    data = t.contiguous().numpy().tobytes()
    return (ctypes.c_char * max(1, len(data))).from_buffer_copy(data)


def run_c(lib, case: dict) -> torch.Tensor:
    x = case["input"]
    tm = case["time_major"]
    steps, batches = (x.shape[0], x.shape[1]) if tm else (x.shape[1], x.shape[0])
    hidden = case["input_weights"].shape[1]
    keep = {k: _buf(case[k]) for k in ("input_weights", "hidden_weights", "input_effective_bias",
                                       "hidden_effective_bias", "gate_multipliers", "gate_shifts", "sigmoid_table")}
    p = Params(int(tm), int(case["last_only"]), batches, steps, x.shape[2], hidden, case["output_offset"],
               case["output_multiplier"], case["output_shift"], case["forget_to_cell_multiplier"],
               case["forget_to_cell_shift"], case["input_to_cell_multiplier"], case["input_to_cell_shift"],
               case["cell_clip"], case["cell_scale_power"],
               *(ctypes.cast(keep[k], ctypes.c_void_p) for k in keep))
    out_shape = (batches, hidden) if case["last_only"] else (*x.shape[:2], hidden)
    out = (ctypes.c_int8 * math.prod(out_shape))()
    scratch = (ctypes.c_int16 * (6 * batches * hidden))()
    assert lib.corten_lstm_s8(ctypes.byref(p), _buf(x), out, scratch) == 0
    return torch.frombuffer(bytearray(out), dtype=torch.int8).reshape(out_shape)


def test_portable_kernel_matches_reference(portable):
    rng = random.Random(11)
    for _ in range(150):
        case = random_case(rng)
        assert torch.equal(run_c(portable, case), _reference(case))


def test_portable_kernel_refuses_null(portable):
    p = Params()
    assert portable.corten_lstm_s8(ctypes.byref(p), None, None, None) != 0


# ----------------------------------------------------------------------------- nn.LSTM through compile
class LSTMNet(nn.Module):
    def __init__(self, mode: str, layers: int = 1, batch_first: bool = True, inputs: int = 6, hidden: int = 12,
                 bias: bool = True):
        super().__init__()
        torch.manual_seed(0)
        self.lstm = nn.LSTM(inputs, hidden, num_layers=layers, batch_first=batch_first, bias=bias)
        self.fc = nn.Linear(hidden, 5)
        self.mode = mode

    def forward(self, x):
        y, (h, c) = self.lstm(x)
        if self.mode == "h[-1]":
            return self.fc(h[-1])
        if self.mode == "h.squeeze":
            return self.fc(h.squeeze(0))
        if self.mode == "y[:, -1]":
            return self.fc(y[:, -1])
        if self.mode == "y[:, -1, :]":
            return self.fc(y[:, -1, :])
        if self.mode == "seq":
            return y
        if self.mode == "seq+h":
            return y, self.fc(h[-1])
        if self.mode == "c":
            return self.fc(c[-1])
        raise ValueError(self.mode)


IDIOMS = [
    ("h[-1]", 2, True, {LSTM: 2, LINEAR: 1}),
    ("h.squeeze", 1, True, {LSTM: 1, LINEAR: 1}),
    ("y[:, -1]", 1, True, {LSTM: 1, LINEAR: 1}),
    ("y[:, -1, :]", 2, True, {LSTM: 2, LINEAR: 1}),
    ("seq", 2, True, {LSTM: 2}),
    ("seq+h", 1, True, {LSTM: 2, LINEAR: 1}),
    ("h[-1]", 1, False, {LSTM: 1, LINEAR: 1}),
]


@pytest.mark.parametrize("mode,layers,batch_first,ops", IDIOMS, ids=[f"{i[0]}-{i[1]}-{i[2]}" for i in IDIOMS])
def test_nn_lstm_idioms_lower(mode, layers, batch_first, ops):
    # batch_first=False needs a batch dimension of 1 in front: one time step [T=1, B=1, I]
    shape = (1, 8, 6) if batch_first else (1, 1, 6)
    t = Tester(LSTMNet(mode, layers, batch_first).eval(), (torch.randn(shape),))
    outputs = 2 if mode == "seq+h" else 1
    report = t.test_dialect({}, {Q: 1, **ops, DQ: outputs}, qtol=QTOL)
    assert report.cosine_vs_float >= 0.99, report


def test_lstm_without_bias_lowers():
    t = Tester(LSTMNet("h[-1]", 1, bias=False).eval(), (torch.randn(1, 5, 6),))
    assert t.test_dialect({}, {Q: 1, LSTM: 1, LINEAR: 1, DQ: 1}, qtol=QTOL).cosine_vs_float >= 0.99


@pytest.mark.parametrize("model", [LSTMNet("c"), nn.LSTM(6, 8, batch_first=True, bidirectional=True)],
                         ids=["c_n-used", "bidirectional"])
def test_lstms_the_family_does_not_take_are_unrolled_and_byte_exact(model):
    """c_n read, or bidirectional: unrolled over time into linear/sigmoid/tanh/mul/add (aten_passes/decompose_composites)."""
    x = torch.randn(1, 4, 6)
    prog = corten.compile(model.eval(), (x,), calibration=[torch.randn(1, 4, 6) for _ in range(3)])
    assert prog.unlowered_ops() == [] and "quantized_lstm" not in prog.op_counts()
    assert all(torch.equal(a, b) for a, b in zip(prog.run_int8(x), prog.run_c(x, on="host", int8=True)))


def test_cell_range_is_calibrated():
    """The cell scale follows the calibration data: larger inputs, larger cells, coarser scale."""
    def power(scale):
        g = torch.Generator().manual_seed(0)
        calib = [(scale * torch.randn(1, 10, 6, generator=g),) for _ in range(4)]
        prog = corten.compile(LSTMNet("h[-1]").eval(), (torch.randn(1, 10, 6),), calibration=calib)
        node = next(n for n in prog.ep.graph.nodes if n.op == "call_function" and "quantized_lstm" in str(n.target))
        return node.args[16]

    assert power(0.01) < power(30.0)


def test_lstm_c_byte_exact_host_and_qemu():
    t = Tester(LSTMNet("h[-1]", 2, hidden=10).eval(), (torch.randn(1, 6, 6),))
    t.test_dialect({}, {Q: 1, LSTM: 2, LINEAR: 1, DQ: 1}, qtol=QTOL)
    runs = t.test_implementation(on=("host", "qemu"), targets=["cortex-m55", "cortex-m4"], n_inputs=1)
    assert {(w, tgt) for w, tgt, _ in runs} == {("host", None), ("qemu", "cortex-m55"), ("qemu", "cortex-m4")}


def test_lstm_sequence_c_byte_exact_host():
    t = Tester(LSTMNet("seq+h", 1, hidden=7).eval(), (torch.randn(1, 5, 6),))
    t.test_implementation(on=("host",), n_inputs=2)


# ----------------------------------------------------------------------------- the zoo's lstm-kws
def test_lstm_kws_zoo_model():
    """Architecture, seeded weights, and int8 agreement with float (cosine >= 0.98 on random inputs).
    Op counts and byte-exact C on the host and QEMU boards: tests/test_zoo_programs.py."""
    from corten.zoo import get_model

    model, (x,) = get_model("lstm-kws")
    again, _ = get_model("lstm-kws")
    assert x.shape == (1, 49, 10) and model(x).shape == (1, 12)
    assert sum(p.numel() for p in model.parameters()) == 4 * 64 * (10 + 64 + 2) + 4 * 64 * (64 + 64 + 2) + 64 * 12 + 12
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), again.parameters()))
    prog = corten.compile(model, (x,))
    g = torch.Generator().manual_seed(123)
    cosines = []
    for _ in range(10):
        xi = torch.randn(x.shape, generator=g)
        cosines.append(float(torch.nn.functional.cosine_similarity(prog.run(xi).flatten(), model(xi).flatten(), dim=0)))
    assert min(cosines) >= 0.98, cosines
