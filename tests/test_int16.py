"""16x8 (int16 activations, int8 weights, int64 bias; TFLite's scheme on CMSIS-NN's s16 kernels).

* fixed point: ``reduce_multiplier`` / ``requantize_s64`` vs ``naive_s16``;
* ``quantized_linear`` on int16 and ``quantized_requantize`` (int8 <-> int16) vs ``naive_s16``;
* ``corten.compile(precision=...)``: int16 everywhere, per module path / type, refusals; the C library
  (portable kernels, host) byte-identical to the reference, int16 edges included;
* CMSIS-NN's own s16 unit-test vectors (TFLite-generated) as an external oracle (``CMSIS_NN_PATH``).
"""
from __future__ import annotations

import random
import re
from pathlib import Path

import pytest
import torch
from torch import nn

import naive_s16
from conftest import CMSIS_NN_PATH, needs_cmsis_nn, needs_gcc, needs_qemu
from corten.errors import CortenOpError, UsageError
from corten.fixed_point import reduce_multiplier, reduce_multiplier_t, requantize_s64, requantize_s64_scalar

linear = torch.ops.corten.quantized_linear
requant = torch.ops.corten.quantized_requantize


# ----------------------------------------------------------------------------- fixed point
def test_reduce_multiplier_and_requantize_s64_match_naive():
    rng = random.Random(0)
    edge_mults = [0, 1 << 30, (1 << 31) - 1, 0x7FFF0000 - 1, 0x7FFF0000, 0x7FFF8000]
    mults = edge_mults + [rng.randint(1 << 30, (1 << 31) - 1) for _ in range(200)]
    for m in mults:
        assert reduce_multiplier(m) == naive_s16.reduce_multiplier(m)
    t = torch.tensor(mults, dtype=torch.int64)
    assert reduce_multiplier_t(t).tolist() == [naive_s16.reduce_multiplier(m) for m in mults]
    vals = [0, 1, -1, 2**40, -(2**40), 12345, -12345] + [rng.randint(-(2**44), 2**44) for _ in range(2000)]
    for v in vals:
        m, s = naive_s16.reduce_multiplier(rng.choice(mults)), rng.randint(-31, 14)
        want = naive_s16.requantize_s64(v, m, s)
        assert requantize_s64_scalar(v, m, s) == want
        assert int(requantize_s64(torch.tensor([v]), m, s)[0]) == want


# ----------------------------------------------------------------------------- reference kernels
def _random_linear_s16(rng: random.Random):
    batch, k, n_out = rng.randint(1, 3), rng.randint(1, 40), rng.randint(1, 9)
    x = [[rng.randint(-32768, 32767) for _ in range(k)] for _ in range(batch)]
    w = [[rng.randint(-127, 127) for _ in range(k)] for _ in range(n_out)]
    per_channel = rng.random() < 0.7
    n_q = n_out if per_channel else 1
    mult = [rng.choice([rng.randint(1 << 30, (1 << 31) - 1), 0x7FFF0000 + 5]) for _ in range(n_q)]
    shift = [rng.randint(-22, -8) for _ in range(n_q)]
    bias = [rng.randint(-(2**30), 2**30) for _ in range(n_out)]
    lo = rng.choice([-32768, rng.randint(-32768, 0)])
    hi = rng.choice([32767, rng.randint(lo, 32767)])
    return x, w, bias, mult, shift, lo, hi


def test_linear_s16_matches_naive():
    rng = random.Random(1)
    for _ in range(400):
        x, w, bias, mult, shift, lo, hi = _random_linear_s16(rng)
        got = linear(torch.tensor(x, dtype=torch.int16), torch.tensor(w, dtype=torch.int8),
                     torch.tensor(bias, dtype=torch.int64), 0, 0, torch.tensor(mult, dtype=torch.int32),
                     torch.tensor(shift, dtype=torch.int32), lo, hi)
        assert got.dtype == torch.int16
        assert got.tolist() == naive_s16.linear_s16(x, w, bias, mult, shift, lo, hi)


def test_linear_s16_refuses_offsets_wide_shifts_and_int32_bias():
    x, w = torch.zeros(1, 4, dtype=torch.int16), torch.zeros(2, 4, dtype=torch.int8)
    m, s, b = torch.full((2,), 1 << 30, dtype=torch.int32), torch.zeros(2, dtype=torch.int32), torch.zeros(2, dtype=torch.int64)
    with pytest.raises(CortenOpError, match="input_offset"):
        linear(x, w, b, 3, 0, m, s, -32768, 32767)
    with pytest.raises(CortenOpError, match="output_shift"):
        linear(x, w, b, 0, 0, m, s + 15, -32768, 32767)
    with pytest.raises(CortenOpError, match="kernel_sum"):
        linear(x, w, b.to(torch.int32), 0, 0, m, s, -32768, 32767)


def test_requantize_matches_naive():
    rng = random.Random(2)
    for _ in range(300):
        wide_in = rng.random() < 0.5
        n = rng.randint(1, 50)
        if wide_in:
            vals, in_off = [rng.randint(-32768, 32767) for _ in range(n)], 0
            out_off, bits = rng.randint(-128, 127), 8
            mult, shift = rng.randint(1 << 30, (1 << 31) - 1), rng.randint(-16, -4)
            x = torch.tensor(vals, dtype=torch.int16)
        else:
            vals, in_off = [rng.randint(-128, 127) for _ in range(n)], rng.randint(-127, 128)
            out_off, bits = 0, 16
            mult, shift = rng.randint(1 << 30, (1 << 31) - 1), rng.randint(0, 10)
            x = torch.tensor(vals, dtype=torch.int8)
        got = requant(x, in_off, out_off, mult, shift, bits)
        assert got.dtype == (torch.int8 if bits == 8 else torch.int16)
        assert got.tolist() == naive_s16.requantize_width(vals, in_off, out_off, mult, shift, bits)
    with pytest.raises(CortenOpError, match="bits"):
        requant(torch.zeros(3, dtype=torch.int8), 0, 0, 1 << 30, 0, 8)


def test_edge_ops_int16():
    x = torch.tensor([0.0, 0.5, -0.5, 1.5, 1e9, -1e9, 123.25])
    q = torch.ops.corten.quantize_per_tensor(x, 0.5, 0, 16)
    assert q.dtype == torch.int16 and q.tolist() == [0, 1, -1, 3, 32767, -32768, 247]  # ties away from zero
    assert torch.ops.corten.dequantize_per_tensor(q, 0.5, 0, 16).tolist() == [0.0, 0.5, -0.5, 1.5, 16383.5, -16384.0, 123.5]
    with pytest.raises(CortenOpError, match="zero_point"):
        torch.ops.corten.quantize_per_tensor(x, 0.5, 3, 16)


# ----------------------------------------------------------------------------- compile(precision=...)
class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.enc = nn.Sequential(nn.Linear(12, 16), nn.ReLU(), nn.Linear(16, 6))
        self.mid = nn.Linear(6, 10)
        self.dec = nn.Sequential(nn.ReLU(), nn.Linear(10, 12))
        for p in self.parameters():
            with torch.no_grad():
                p.copy_(torch.randn(p.shape, generator=g) * 0.5)

    def forward(self, x):
        return self.dec(self.mid(self.enc(x)))


def _compile(precision, **kw):
    import corten

    m = MLP().eval()
    x = torch.randn(2, 12, generator=torch.Generator().manual_seed(1))
    calib = torch.randn(16, 2, 12, generator=torch.Generator().manual_seed(2))
    return m, x, corten.compile(m, (x,), calibration=list((c,) for c in calib), precision=precision, **kw)


@pytest.fixture(scope="module")
def int16_program():
    return _compile("int16")


def test_int16_program_is_int16_end_to_end_and_closer_to_float(int16_program):
    m, x, prog16 = int16_program
    _, _, prog8 = _compile("int8")
    assert prog16.op_counts() == {"quantize_per_tensor": 1, "quantized_linear": 4, "dequantize_per_tensor": 1}
    assert prog16.inputs[0].bits == 16 and prog16.outputs[0].bits == 16
    assert prog16.run_int8(x)[0].dtype == torch.int16
    assert prog16.memory.tensors  # planned with 2-byte elements
    with torch.no_grad():
        ref = m(x)
    err16 = float((prog16.run(x) - ref).norm() / ref.norm())
    err8 = float((prog8.run(x) - ref).norm() / ref.norm())
    assert err16 < err8 / 1.5, (err16, err8)  # (what is left is the int8 weights' rounding)


def test_precision_by_path_and_type_inserts_requantize():
    _, _, prog = _compile({"": "int16", "mid": "int8"})
    assert prog.op_counts()["quantized_requantize"] == 2  # int16 -> int8 before mid, int8 -> int16 after
    _, _, prog = _compile({nn.Linear: "int16", "": "int8"})
    assert "quantized_requantize" not in prog.op_counts()
    _, x, prog = _compile({"enc": "int16"})
    assert prog.op_counts()["quantized_requantize"] == 1 and prog.outputs[0].bits == 8 and prog.inputs[0].bits == 16
    assert prog.info["precision"]["int16_nodes"]


@pytest.mark.parametrize("bad", ["int4", "fp16", {"enc": "int32"}, {3: "int16"}, ["int16"]])
def test_bad_precision_is_refused(bad):
    import corten

    with pytest.raises(UsageError, match="precision"):
        corten.compile(MLP(), (torch.randn(1, 12),), precision=bad)


class ConvFlatten(nn.Module):
    def __init__(self, act=torch.relu):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.fc = nn.Linear(4 * 6 * 6, 5)
        self.act = act

    def forward(self, x):
        return self.fc(self.act(self.conv(x)).flatten(1))


def test_ops_without_int16_kernels_stay_int8():
    """(sigmoid was the example until it got its 16x8 kernel; log_softmax has none.)"""
    import corten

    x = torch.randn(1, 3, 8, 8)
    prog = corten.compile(ConvFlatten(lambda t: torch.log_softmax(t, dim=1)).eval(), (x,), precision="int16")
    ops = prog.op_counts()
    assert not prog.unlowered_ops() and ops["quantized_log_softmax"] == 1  # int8 between int16 layers
    assert ops["quantized_requantize"] == 2


class ConvPoolHead(nn.Module):
    """conv -> relu -> pool -> tanh (int16 between) -> linear: the conv or the pool has no 16x8 kernel."""

    def __init__(self, conv: nn.Module, pool: nn.Module):
        super().__init__()
        self.conv, self.pool, self.head = conv, pool, nn.Linear(8 * 9, 4)

    def forward(self, x):
        return self.head(torch.tanh(self.pool(torch.relu(self.conv(x)))).flatten(1))


@needs_gcc
@pytest.mark.parametrize("conv,pool,int8_op", [
    (lambda: nn.Conv2d(4, 8, 3, padding=1, groups=2), lambda: nn.AdaptiveAvgPool2d(3), "quantized_grouped_conv2d"),
    (lambda: nn.Conv2d(4, 8, 2, padding="same"), lambda: nn.AdaptiveAvgPool2d(3), "quantized_pad"),
    (lambda: nn.Conv2d(4, 8, 3, padding=1), lambda: nn.AdaptiveAvgPool2d(3), "quantized_adaptive_avg_pool2d"),
    (lambda: nn.Conv2d(4, 8, 3, padding=1), lambda: nn.AdaptiveMaxPool2d(3), "quantized_adaptive_max_pool2d"),
], ids=["grouped-conv", "same-even-kernel", "adaptive-avg-7to3", "adaptive-max-7to3"])
def test_convs_and_pools_without_16x8_kernels_stay_int8_in_an_int16_program(conv, pool, int8_op):
    """A grouped conv, an asymmetric "same" padding (16x8 convs pad symmetrically) and an adaptive
    pool of non-uniform windows have no 16x8 kernel: with precision="int16" they run int8 between
    requantizes (they were refused), fully lowered and byte-exact in C."""
    import corten

    torch.manual_seed(0)
    model = ConvPoolHead(conv(), pool()).eval()
    calib = [(torch.randn(1, 4, 7, 7),) for _ in range(4)]
    x = torch.randn(1, 4, 7, 7)
    prog = corten.compile(model, (x,), precision="int16", calibration=calib)
    assert not prog.unlowered_ops()
    assert prog.op_counts()["quantized_requantize"] >= 1 and int8_op in prog.op_counts()
    assert torch.int16 in _dtypes(prog, "quantized_activation_s16")  # the tanh stays int16
    want = prog.run_int8(x)
    assert all(torch.equal(a, b) for a, b in zip(want, prog.run_c(x, on="host", int8=True)))
    with torch.no_grad():
        assert float((prog.run(x) - model(x)).abs().max()) < 0.05


def _dtypes(prog, op: str) -> list[torch.dtype]:
    return [n.meta["val"].dtype for n in prog.ep.graph.nodes
            if n.op == "call_function" and getattr(n.target, "__name__", "").split(".")[0] == op]


def test_int16_sigmoid_between_int16_layers_needs_no_requantize():
    import corten

    x = torch.randn(1, 3, 8, 8)
    prog = corten.compile(ConvFlatten(torch.sigmoid).eval(), (x,), precision="int16")
    ops = prog.op_counts()
    assert not prog.unlowered_ops() and "quantized_requantize" not in ops
    assert ops["quantized_activation_s16"] == 1 and _dtypes(prog, "quantized_activation_s16") == [torch.int16]


@needs_gcc
def test_int16_flatten_of_nhwc_is_a_layout_copy_in_c():
    import corten

    x = torch.randn(1, 3, 8, 8, generator=torch.Generator().manual_seed(7))
    prog = corten.compile(ConvFlatten().eval(), (x,), precision="int16")
    assert "quantized_requantize" not in prog.op_counts() and prog.inputs[0].bits == 16
    assert torch.equal(prog.c_run(x, on="host", kernels="portable").outputs[0], prog.run_int8(x)[0])


@needs_gcc
def test_int16_c_bytes_equal_reference_on_host(int16_program):
    m, x, prog = int16_program
    got = prog.c_run(x, on="host", kernels="portable")
    exp = prog.run_int8(x)
    assert got.outputs[0].dtype == torch.int16 and torch.equal(got.outputs[0], exp[0])


@needs_gcc
def test_mixed_program_c_bytes_equal_reference_on_host():
    _, x, prog = _compile({"": "int16", "mid": "int8"})
    assert torch.equal(prog.c_run(x, on="host", kernels="portable").outputs[0], prog.run_int8(x)[0])


@needs_gcc
def test_int16_header_helpers_take_int16(tmp_path, int16_program):
    _, _, prog = int16_program
    prog.emit_c(tmp_path, kernels="portable")
    header = (tmp_path / "model.h").read_text()
    assert "static inline int16_t model_quantize_input(float x)" in header
    assert "static inline float model_dequantize_output(int16_t q)" in header


@needs_qemu
def test_deep_ae_int16_on_qemu_m4_portable():
    """The MLPerf Tiny autoencoder in 16x8 on Cortex-M4 (portable kernels), bytes identical."""
    import corten
    from corten.zoo import get_model

    model, example = get_model("deep-ae")
    prog = corten.compile(model, example, name="deep_ae", precision="int16")
    x = torch.randn(example[0].shape, generator=torch.Generator().manual_seed(3))
    run = prog.c_run(x, on="qemu", target="cortex-m4", kernels="portable")
    assert torch.equal(run.outputs[0], prog.run_int8(x)[0])
    g, rel = torch.Generator().manual_seed(10_000), []
    for _ in range(10):  # as benchmarks/agreement.py measures it (int8: ~0.19; int8 weights alone ~0.063)
        x = torch.randn(example[0].shape, generator=g)
        with torch.no_grad():
            ref = model(x)
        rel.append(float((prog.run(x) - ref).norm() / ref.norm()))
    assert sum(rel) / len(rel) < 0.08, rel


@needs_cmsis_nn
def test_cmsis_nn_path_int16_linear_bytes_equal_on_host(int16_program):
    m, x, prog = int16_program
    got = prog.c_run(x, on="host", kernels="cmsis-nn", cmsis_nn_path=CMSIS_NN_PATH)
    assert torch.equal(got.outputs[0], prog.run_int8(x)[0])


# ----------------------------------------------------------------------------- CMSIS-NN's TFLite vectors
def _c_arrays(path: Path) -> dict[str, list[int]]:
    text = path.read_text()
    return {m.group(1): [int(v) for v in re.findall(r"-?\d+", m.group(2))]
            for m in re.finditer(r"const\s+\w+\s+(\w+)\[\d+\]\s*=\s*\{([^}]*)\}", text)}


def _c_defines(path: Path) -> dict[str, int]:
    return {k: int(v) for k, v in re.findall(r"#define\s+(\w+)\s+(-?\d+)", path.read_text())}


@needs_cmsis_nn
@pytest.mark.parametrize("case", ["fully_connected_int16", "fully_connected_int16_big", "fc_int16_slow"])
def test_linear_s16_matches_cmsis_nn_test_vectors(case):
    d = Path(CMSIS_NN_PATH) / "Tests/UnitTest/TestCases/TestData" / case
    cfg, P = _c_defines(d / "config_data.h"), case.upper()
    arrays = {}
    for f in ("input_data.h", "weights_data.h", "biases_data.h", "output_ref_data.h"):
        arrays.update(_c_arrays(d / f))
    depth, out_ch, batches = cfg[f"{P}_ACCUMULATION_DEPTH"], cfg[f"{P}_OUT_CH"], cfg[f"{P}_INPUT_BATCHES"]
    x = torch.tensor(arrays[f"{case}_input"], dtype=torch.int16).reshape(batches, depth)
    w = torch.tensor(arrays[f"{case}_weights"], dtype=torch.int8).reshape(out_ch, depth)
    b = torch.tensor(arrays[f"{case}_biases"], dtype=torch.int64)
    got = linear(x, w, b, 0, 0, torch.tensor([cfg[f"{P}_OUTPUT_MULTIPLIER"]], dtype=torch.int32),
                 torch.tensor([cfg[f"{P}_OUTPUT_SHIFT"]], dtype=torch.int32),
                 cfg[f"{P}_OUT_ACTIVATION_MIN"], cfg[f"{P}_OUT_ACTIVATION_MAX"])
    assert got.reshape(-1).tolist() == arrays[f"{case}_output_ref"]


# ----------------------------------------------------------------------------- conv, depthwise, pools (s16)
def _rand_nhwc(rng, n, h, w, c, lo=-32768, hi=32767):
    return [[[[rng.randint(lo, hi) for _ in range(c)] for _ in range(w)] for _ in range(h)] for _ in range(n)]


def _nchw(x, dtype=torch.int16):
    return torch.tensor(x, dtype=dtype).permute(0, 3, 1, 2)


def _nhwc_list(t):
    return t.permute(0, 2, 3, 1).tolist()


def _rand_quant(rng, c_out):
    mult = [rng.randint(1 << 30, (1 << 31) - 1) for _ in range(c_out)]
    shift = [rng.randint(-22, -10) for _ in range(c_out)]
    lo = rng.choice([-32768, rng.randint(-32768, 0)])
    return mult, shift, lo, rng.choice([32767, rng.randint(max(lo, 0), 32767)])


def test_conv2d_and_depthwise_s16_match_naive():
    conv, dw = torch.ops.corten.quantized_conv2d, torch.ops.corten.quantized_depthwise_conv2d
    rng = random.Random(3)
    for _ in range(25):
        n, h, w, c = rng.randint(1, 2), rng.randint(3, 6), rng.randint(3, 6), rng.randint(1, 5)
        kh, kw = rng.randint(1, 3), rng.randint(1, 3)
        stride, dil = [rng.randint(1, 2), rng.randint(1, 2)], [rng.randint(1, 2), 1]
        pad = [rng.randint(0, kh // 2), rng.randint(0, kw // 2)]
        if h + 2 * pad[0] < dil[0] * (kh - 1) + 1 or w + 2 * pad[1] < kw:
            continue
        x = _rand_nhwc(rng, n, h, w, c)
        c_out = rng.randint(1, 4)
        wt = [[[[rng.randint(-127, 127) for _ in range(c)] for _ in range(kw)] for _ in range(kh)] for _ in range(c_out)]
        bias = [rng.randint(-(2**34), 2**34) for _ in range(c_out)]
        mult, shift, lo, hi = _rand_quant(rng, c_out)
        got = conv(_nchw(x), torch.tensor(wt, dtype=torch.int8), torch.tensor(bias, dtype=torch.int64), stride, pad,
                   dil, 0, 0, torch.tensor(mult, dtype=torch.int32), torch.tensor(shift, dtype=torch.int32), lo, hi)
        assert got.dtype == torch.int16
        assert _nhwc_list(got) == naive_s16.conv2d_s16(x, wt, bias, stride, pad, dil, mult, shift, lo, hi)
        cm = rng.randint(1, 2)
        wd = [[[rng.randint(-127, 127) for _ in range(c * cm)] for _ in range(kw)] for _ in range(kh)]
        bias = [rng.randint(-(2**34), 2**34) for _ in range(c * cm)]
        mult, shift, lo, hi = _rand_quant(rng, c * cm)
        got = dw(_nchw(x), torch.tensor([wd], dtype=torch.int8), torch.tensor(bias, dtype=torch.int64), stride, pad,
                 dil, cm, 0, 0, torch.tensor(mult, dtype=torch.int32), torch.tensor(shift, dtype=torch.int32), lo, hi)
        assert _nhwc_list(got) == naive_s16.depthwise_s16(x, wd, bias, stride, pad, dil, cm, mult, shift, lo, hi)


def test_pools_s16_match_naive():
    rng = random.Random(4)
    for _ in range(60):
        n, h, w, c = rng.randint(1, 2), rng.randint(2, 6), rng.randint(2, 6), rng.randint(1, 4)
        kernel = [rng.randint(1, min(3, h)), rng.randint(1, min(3, w))]
        stride = [rng.randint(1, 2), rng.randint(1, 2)]
        pad = [rng.randint(0, (kernel[0] - 1) // 2), rng.randint(0, (kernel[1] - 1) // 2)]
        x = _rand_nhwc(rng, n, h, w, c)
        lo = rng.choice([-32768, rng.randint(-32768, 0)])
        for is_avg, op in ((True, torch.ops.corten.quantized_avg_pool2d), (False, torch.ops.corten.quantized_max_pool2d)):
            got = op(_nchw(x), kernel, stride, pad, lo, 32767)
            assert got.dtype == torch.int16
            assert _nhwc_list(got) == naive_s16.pool_s16(x, kernel, stride, pad, lo, 32767, is_avg)


class TinyCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(2, 6, 3, padding=1), nn.BatchNorm2d(6), nn.ReLU())
        self.dw = nn.Sequential(nn.Conv2d(6, 6, 3, stride=2, padding=1, groups=6), nn.ReLU(),
                                nn.Conv2d(6, 8, 1), nn.ReLU())
        self.pool = nn.MaxPool2d(2)
        self.head = nn.Linear(8, 4)

    def forward(self, x):
        x = self.pool(self.dw(self.stem(x)))
        return self.head(torch.nn.functional.avg_pool2d(x, 2).flatten(1))


@pytest.fixture(scope="module")
def cnn_programs():
    import corten

    torch.manual_seed(0)
    m = TinyCNN().eval()
    x = torch.randn(1, 2, 8, 8, generator=torch.Generator().manual_seed(5))
    calib = [(torch.randn(1, 2, 8, 8, generator=torch.Generator().manual_seed(6 + i)),) for i in range(8)]
    return x, {p if isinstance(p, str) else "mixed": corten.compile(m, (x,), calibration=calib, precision=p)
               for p in ("int16", {"stem": "int16"})}


def test_cnn_int16_lowers_fully(cnn_programs):
    _, progs = cnn_programs
    ops = progs["int16"].op_counts()
    assert not progs["int16"].unlowered_ops() and "quantized_requantize" not in ops
    assert ops["quantized_depthwise_conv2d"] == 1 and ops["quantized_max_pool2d"] == 1
    assert progs["mixed"].op_counts()["quantized_requantize"] == 1


@needs_gcc
@pytest.mark.parametrize("which", ["int16", "mixed"])
def test_cnn_int16_c_bytes_equal_on_host(cnn_programs, which):
    x, progs = cnn_programs
    prog = progs[which]
    assert torch.equal(prog.c_run(x, on="host", kernels="portable").outputs[0], prog.run_int8(x)[0])


@needs_cmsis_nn
@pytest.mark.parametrize("which", ["int16", "mixed"])
def test_cnn_int16_cmsis_nn_bytes_equal_on_host(cnn_programs, which):
    x, progs = cnn_programs
    prog = progs[which]
    got = prog.c_run(x, on="host", kernels="cmsis-nn", cmsis_nn_path=CMSIS_NN_PATH)
    assert torch.equal(got.outputs[0], prog.run_int8(x)[0])


def _vectors(case: str) -> tuple[dict, dict]:
    d = Path(CMSIS_NN_PATH) / "Tests/UnitTest/TestCases/TestData" / case
    arrays, cfg = {}, {}
    for f in d.glob("*.h"):
        arrays.update(_c_arrays(f))
        cfg.update({k[len(case) + 1:]: v for k, v in _c_defines(f).items() if k.startswith(case.upper() + "_")})
    return {k[len(case) + 1:]: v for k, v in arrays.items()}, cfg


def _pads(cfg, h, w, kh, kw, sy, sx, dy, dx, top, left, prefix="OUTPUT_"):
    """TFLite's padding as ``[top, left, bottom, right]``: the output size is the vectors' (SAME may
    put the extra row/column after the data)."""
    ho, wo = cfg[prefix + "H"], cfg[prefix + "W"]
    bottom = max(0, (ho - 1) * sy + dy * (kh - 1) + 1 - h - top)
    right = max(0, (wo - 1) * sx + dx * (kw - 1) + 1 - w - left)
    return [top, left, bottom, right]


def _first(arrays, *names):
    return next(arrays[n] for n in names if n in arrays)


@needs_cmsis_nn
@pytest.mark.parametrize("case", ["int16xint8", "int16xint8_dilation_1", "int16xint8_dilation_2",
                                  "int16xint8_dilation_3", "int16xint8_spill", "int16xint8_spill2"])
def test_conv_s16_matches_cmsis_nn_test_vectors(case):
    a, cfg = _vectors(case)
    n, h, w, c = cfg["INPUT_BATCHES"], cfg["INPUT_H"], cfg["INPUT_W"], cfg["IN_CH"]
    kh, kw, c_out = cfg["FILTER_Y"], cfg["FILTER_X"], cfg["OUT_CH"]
    x = torch.tensor(a["input"], dtype=torch.int16).reshape(n, h, w, c).permute(0, 3, 1, 2)
    wt = torch.tensor(a["weights"], dtype=torch.int8).reshape(c_out, kh, kw, c)
    got = torch.ops.corten.quantized_conv2d(
        x, wt, torch.tensor(_first(a, "bias", "biases"), dtype=torch.int64), [cfg["STRIDE_Y"], cfg["STRIDE_X"]],
        _pads(cfg, h, w, kh, kw, cfg["STRIDE_Y"], cfg["STRIDE_X"], cfg["DILATION_Y"], cfg["DILATION_X"], cfg["PAD_Y"],
              cfg["PAD_X"]), [cfg["DILATION_Y"], cfg["DILATION_X"]], 0, 0,
        torch.tensor(_first(a, "output_multiplier", "output_mult"), dtype=torch.int32),
        torch.tensor(a["output_shift"], dtype=torch.int32), cfg["OUT_ACTIVATION_MIN"], cfg["OUT_ACTIVATION_MAX"])
    assert got.permute(0, 2, 3, 1).reshape(-1).tolist() == _first(a, "output_ref", "output")


@needs_cmsis_nn
@pytest.mark.parametrize("case", ["dw_int16xint8", "dw_int16xint8_dilation", "dw_int16xint8_mult4",
                                  "dw_int16xint8_fast", "dw_int16xint8_fast_stride", "dw_int16xint8_fast_spill",
                                  "dw_int16xint8_fast_test_bias",
                                  "dw_int16xint8_fast_multiple_batches_uneven_buffers"])
def test_depthwise_s16_matches_cmsis_nn_test_vectors(case):
    a, cfg = _vectors(case)
    n, h, w, c = cfg["INPUT_BATCHES"], cfg["INPUT_H"], cfg["INPUT_W"], cfg["IN_CH"]
    kh, kw, c_out = cfg["FILTER_Y"], cfg["FILTER_X"], cfg["OUT_CH"]
    x = torch.tensor(a["input"], dtype=torch.int16).reshape(n, h, w, c).permute(0, 3, 1, 2)
    got = torch.ops.corten.quantized_depthwise_conv2d(
        x, torch.tensor(a["weights"], dtype=torch.int8).reshape(1, kh, kw, c_out),
        torch.tensor(_first(a, "biases", "bias"), dtype=torch.int64), [cfg["STRIDE_Y"], cfg["STRIDE_X"]],
        _pads(cfg, h, w, kh, kw, cfg["STRIDE_Y"], cfg["STRIDE_X"], cfg.get("DILATION_Y", 1), cfg.get("DILATION_X", 1),
              cfg["PAD_Y"], cfg["PAD_X"]), [cfg.get("DILATION_Y", 1), cfg.get("DILATION_X", 1)], cfg["CH_MULT"], 0, 0,
        torch.tensor(_first(a, "output_mult", "output_multiplier"), dtype=torch.int32),
        torch.tensor(a["output_shift"], dtype=torch.int32), cfg["OUT_ACTIVATION_MIN"], cfg["OUT_ACTIVATION_MAX"])
    assert got.permute(0, 2, 3, 1).reshape(-1).tolist() == _first(a, "output_ref", "output")


@needs_cmsis_nn
@pytest.mark.parametrize("case", ["avgpooling_int16", "avgpooling_int16_1", "avgpooling_int16_2", "avgpooling_int16_3",
                                  "maxpool_int16", "maxpool_int16_1", "maxpool_int16_2"])
def test_pools_s16_match_cmsis_nn_test_vectors(case):
    a, cfg = _vectors(case)
    h, w, c = cfg["INPUT_H"], cfg["INPUT_W"], cfg["INPUT_C"]
    op = torch.ops.corten.quantized_avg_pool2d if case.startswith("avg") else torch.ops.corten.quantized_max_pool2d
    x = torch.tensor(a["input_tensor"], dtype=torch.int16).reshape(-1, h, w, c).permute(0, 3, 1, 2)
    kh, kw, sy, sx = cfg["FILTER_H"], cfg["FILTER_W"], cfg["STRIDE_H"], cfg["STRIDE_W"]
    got = op(x, [kh, kw], [sy, sx], _pads(cfg, h, w, kh, kw, sy, sx, 1, 1, cfg["PADDING_H"], cfg["PADDING_W"]),
             cfg["ACTIVATION_MIN"], cfg["ACTIVATION_MAX"])
    assert got.permute(0, 2, 3, 1).reshape(-1).tolist() == a["output"]


# ----------------------------------------------------------------------------- precision="auto"
def test_auto_precision_moves_worst_layers_until_the_target():
    import corten
    from corten.compiler import auto_report

    m = MLP().eval()
    x = torch.randn(2, 12, generator=torch.Generator().manual_seed(1))
    calib = [(c,) for c in torch.randn(16, 2, 12, generator=torch.Generator().manual_seed(2))]
    prog = corten.compile(m, (x,), calibration=calib, precision="auto", precision_target_db=60.0)
    a = prog.info["precision"]["auto"]
    assert a["int16_layers"] and a["output_sqnr_db"] > a["int8_output_sqnr_db"]
    assert [t["layers"] for t in a["tried"]][:2] == [[a["tried"][0]["layers"][0]], a["tried"][1]["layers"]]
    assert all(len(t["layers"]) in (1, 2, 4) for t in a["tried"])
    moved = [d["module"] for d in a["int16_layers"]]
    assert all(d["extra_activation_bytes"] > 0 and d["macs"] > 0 for d in a["int16_layers"])
    assert "int16:" in auto_report(prog) and moved[0] in auto_report(prog)
    easy = corten.compile(m, (x,), calibration=calib, precision="auto", precision_target_db=-100.0)
    assert easy.info["precision"]["auto"]["int16_layers"] == [] and easy.inputs[0].bits == 8
    budget = easy.memory.arena_bytes  # the int8 arena: every int16 layer needs more
    tight = corten.compile(m, (x,), calibration=calib, precision="auto", precision_target_db=60.0, max_arena=budget)
    assert tight.info["precision"]["auto"]["tried"][-1]["over_budget"] and tight.memory.arena_bytes <= budget


def test_cli_precision_argument():
    from corten.cli import _precision_arg

    assert _precision_arg("int16") == "int16" and _precision_arg("auto") == "auto"
    assert _precision_arg("encoder=int16, decoder.3=int8") == {"": "int8", "encoder": "int16", "decoder.3": "int8"}


@needs_gcc
def test_two_int16_inputs_are_packed_by_bytes():
    import corten

    class Two(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(5, 3), nn.Linear(4, 3)

        def forward(self, x, y):
            return self.a(x), self.b(y)

    g = torch.Generator().manual_seed(8)
    x, y = torch.randn(1, 5, generator=g), torch.randn(1, 4, generator=g)
    import tempfile

    prog = corten.compile(Two().eval(), (x, y), precision="int16")
    lib = prog.emit_c(Path(tempfile.mkdtemp()), kernels="portable")
    assert [t.offset for t in lib.inputs] == [0, 10] and [t.offset for t in lib.outputs] == [0, 6]
    run = prog.c_run(x, y, on="host", kernels="portable")
    assert all(torch.equal(a, b) for a, b in zip(run.outputs, prog.run_int8(x, y)))
    mixed = corten.compile(Two().eval(), (x, y), precision={"b": "int16"})  # int8 5 bytes, then int16 at 6
    lib = mixed.emit_c(Path(tempfile.mkdtemp()), kernels="portable")
    assert [t.offset for t in lib.inputs] == [0, 6] and lib.input_bytes == 14
    run = mixed.c_run(x, y, on="host", kernels="portable")
    assert all(torch.equal(a, b) for a, b in zip(run.outputs, mixed.run_int8(x, y)))


# ----------------------------------------------------------------------------- 16x8 add
def test_add_s16_matches_naive_with_broadcasting():
    rng = random.Random(3)
    add = torch.ops.corten.quantized_add
    for _ in range(60):
        shape = [rng.randint(1, 4) for _ in range(rng.randint(1, 4))]
        other = [d if rng.random() < 0.6 else 1 for d in shape][rng.randint(0, len(shape) - 1):]
        x1 = torch.randint(-32768, 32768, shape, dtype=torch.int16)
        x2 = torch.randint(-32768, 32768, other, dtype=torch.int16)
        m1, m2, mo = (rng.randint(1 << 30, (1 << 31) - 1) for _ in range(3))
        s1, s2, so = rng.randint(-3, 0), rng.randint(-3, 0), rng.randint(-20, -14)
        lo = rng.choice([-32768, rng.randint(-32768, 0)])
        hi = rng.choice([32767, rng.randint(lo, 32767)])
        got = add(x1, x2, 0, m1, s1, 0, m2, s2, 15, 0, mo, so, lo, hi)
        a, b = torch.broadcast_tensors(x1, x2)
        want = naive_s16.add_s16(a.flatten().tolist(), b.flatten().tolist(), m1, s1, m2, s2, 15, mo, so, lo, hi)
        assert got.dtype == torch.int16 and got.flatten().tolist() == want


def test_add_s16_refuses_offsets_and_wide_shifts():
    add = torch.ops.corten.quantized_add
    x = torch.zeros(4, dtype=torch.int16)
    with pytest.raises(CortenOpError):
        add(x, x, 1, 1 << 30, 0, 0, 1 << 30, 0, 15, 0, 1 << 30, -15, -32768, 32767)
    with pytest.raises(CortenOpError):
        add(x, x, 0, 1 << 30, 0, 0, 1 << 30, 0, 16, 0, 1 << 30, -15, -32768, 32767)
    with pytest.raises(CortenOpError, match="input1"):
        add(x, torch.zeros(4, dtype=torch.int8), 0, 1 << 30, 0, 0, 1 << 30, 0, 15, 0, 1 << 30, -15, -32768, 32767)


class Residual(nn.Module):
    """Linear + ReLU blocks with a skip add and a product of two activations (same shapes), and a
    broadcast add and product with [N, 1] branches."""

    def __init__(self):
        super().__init__()
        self.a, self.b, self.c, self.g = nn.Linear(16, 16), nn.Linear(16, 16), nn.Linear(16, 8), nn.Linear(16, 1)
        self.m, self.s = nn.Linear(16, 16), nn.Linear(16, 1)

    def forward(self, x):
        h = torch.relu(self.a(x))
        h = torch.relu(self.b(h) + h)
        h = h * self.m(h)
        return self.c(h + self.g(h)) * self.s(h)


@pytest.fixture(scope="module")
def residual_program():
    import corten

    torch.manual_seed(0)
    x = torch.randn(2, 16, generator=torch.Generator().manual_seed(4))
    return x, corten.compile(Residual().eval(), (x,), precision="int16")


def test_residual_int16_lowers_fully(residual_program):
    _, prog = residual_program
    ops = prog.op_counts()
    assert not prog.unlowered_ops() and "quantized_requantize" not in ops and ops["quantized_add"] == 2
    assert ops["quantized_mul"] == 2
    assert prog.inputs[0].bits == 16


@needs_gcc
def test_residual_int16_c_bytes_equal_on_host(residual_program):
    x, prog = residual_program
    assert torch.equal(prog.c_run(x, on="host", kernels="portable").outputs[0], prog.run_int8(x)[0])


@needs_cmsis_nn
def test_residual_int16_cmsis_nn_bytes_equal_on_host(residual_program):
    x, prog = residual_program
    got = prog.c_run(x, on="host", kernels="cmsis-nn", cmsis_nn_path=CMSIS_NN_PATH)
    assert torch.equal(got.outputs[0], prog.run_int8(x)[0])


@needs_cmsis_nn
@pytest.mark.parametrize("case", ["add_s16", "add_s16_spill"])
def test_add_s16_matches_cmsis_nn_test_vectors(case):
    a, cfg = _vectors(case)
    x1, x2 = (torch.tensor(a[k], dtype=torch.int16) for k in ("input1", "input2"))
    got = torch.ops.corten.quantized_add(
        x1, x2, cfg["INPUT1_OFFSET"], cfg["INPUT1_MULT"], cfg["INPUT1_SHIFT"], cfg["INPUT2_OFFSET"],
        cfg["INPUT2_MULT"], cfg["INPUT2_SHIFT"], cfg["LEFT_SHIFT"], cfg["OUTPUT_OFFSET"], cfg["OUTPUT_MULT"],
        cfg["OUTPUT_SHIFT"], cfg["OUT_ACTIVATION_MIN"], cfg["OUT_ACTIVATION_MAX"])
    assert got.tolist() == a["output_ref"]


def test_mul_s16_matches_naive_with_broadcasting():
    rng = random.Random(4)
    mul = torch.ops.corten.quantized_mul
    for _ in range(60):
        shape = [rng.randint(1, 4) for _ in range(rng.randint(1, 4))]
        other = [d if rng.random() < 0.6 else 1 for d in shape][rng.randint(0, len(shape) - 1):]
        x1 = torch.randint(-32768, 32768, shape, dtype=torch.int16)
        x2 = torch.randint(-32768, 32768, other, dtype=torch.int16)
        mo, so = rng.randint(1 << 30, (1 << 31) - 1), rng.randint(-20, -12)
        lo = rng.choice([-32768, rng.randint(-32768, 0)])
        hi = rng.choice([32767, rng.randint(lo, 32767)])
        got = mul(x1, x2, 0, 0, 0, mo, so, lo, hi)
        a, b = torch.broadcast_tensors(x1, x2)
        want = naive_s16.mul_s16(a.flatten().tolist(), b.flatten().tolist(), mo, so, lo, hi)
        assert got.dtype == torch.int16 and got.flatten().tolist() == want
    x = torch.full((3,), -32768, dtype=torch.int16)  # the largest product, 2**30
    assert mul(x, x, 0, 0, 0, 1 << 30, -14, -32768, 32767).tolist() == [32767] * 3
    with pytest.raises(CortenOpError, match="input1_offset"):
        mul(x, x, 1, 0, 0, 1 << 30, -14, -32768, 32767)


@needs_cmsis_nn
@pytest.mark.parametrize("case", ["mul_s16", "mul_s16_spill"])
def test_mul_s16_matches_cmsis_nn_test_vectors(case):
    a, cfg = _vectors(case)
    x1, x2 = (torch.tensor(a[k], dtype=torch.int16) for k in ("input1", "input2"))
    got = torch.ops.corten.quantized_mul(
        x1, x2, cfg["INPUT1_OFFSET"], cfg["INPUT2_OFFSET"], cfg["OUTPUT_OFFSET"], cfg["OUTPUT_MULT"],
        cfg["OUTPUT_SHIFT"], cfg["OUT_ACTIVATION_MIN"], cfg["OUT_ACTIVATION_MAX"])
    assert got.tolist() == a["output_ref"]


class Gated(nn.Module):
    """x * sigmoid(x) and x + tanh(x) in an int16 model, then a constant scale and shift."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(8, 8), nn.Linear(8, 8)
        self.gate = nn.Sigmoid()

    def forward(self, x):
        h = self.a(x)
        h = h * self.gate(h)
        h = h + torch.tanh(h)
        return self.b(h * 0.5 + 1.0)


@needs_gcc
def test_int16_binary_ops_after_tables_are_int16_with_constants_int8():
    """Since sigmoid/tanh have 16x8 kernels (fixed int16 output 1/32768) the product and sum of
    their outputs are int16 too (a094551 kept them int8 while the tables were int8-only); the ops
    with a constant operand stay int8 (the 16x8 add/mul take two tensors)."""
    import corten

    x = torch.randn(2, 8, generator=torch.Generator().manual_seed(9))
    prog = corten.compile(Gated().eval(), (x,), precision="int16")
    ops = prog.op_counts()
    assert not prog.unlowered_ops() and ops["quantized_mul"] == 2 and ops["quantized_add"] == 2
    assert ops["quantized_activation_s16"] == 2
    assert _dtypes(prog, "quantized_mul") == [torch.int16, torch.int8]
    assert _dtypes(prog, "quantized_add") == [torch.int16, torch.int8]
    assert torch.equal(prog.c_run(x, on="host", kernels="portable").outputs[0], prog.run_int8(x)[0])


@needs_gcc
def test_int8_table_output_feeding_an_int16_product_is_requantized():
    """An int8 sigmoid (its module kept int8) read by an int16 mul: observed and requantized to int16
    on that edge (the fixed int8 grid is not shared into the int16 op)."""
    import corten

    x = torch.randn(2, 8, generator=torch.Generator().manual_seed(10))
    prog = corten.compile(Gated().eval(), (x,), precision={"": "int16", "gate": "int8"})
    ops = prog.op_counts()
    assert not prog.unlowered_ops() and ops["quantized_lut"] == 1 and ops["quantized_activation_s16"] == 1
    assert _dtypes(prog, "quantized_mul")[0] == torch.int16 and ops["quantized_requantize"] >= 2
    assert torch.equal(prog.c_run(x, on="host", kernels="portable").outputs[0], prog.run_int8(x)[0])


# ----------------------------------------------------------------------------- 16x8 nonlinearities end to end
class Nonlinear(nn.Module):
    """sigmoid, tanh, SiLU, GELU and softmax between int16 layers (rows of 6: arm_softmax_s16 in the
    CMSIS-NN flavour; the softmax over a strided dim and over 20 elements run corten_softmax_s16)."""

    def __init__(self):
        super().__init__()
        self.a, self.b, self.c, self.d = nn.Linear(12, 16), nn.Linear(16, 16), nn.Linear(16, 16), nn.Linear(16, 6)
        self.e = nn.Linear(16, 20)

    def forward(self, x):
        h = torch.sigmoid(self.a(x))
        h = torch.tanh(self.b(h))
        h = nn.functional.silu(self.c(h)) + nn.functional.gelu(h)
        e = self.e(h)
        return torch.softmax(self.d(h), dim=-1), torch.softmax(e.reshape(-1, 2, 10), dim=1), torch.softmax(e, dim=-1)


@pytest.fixture(scope="module")
def nonlinear_program():
    import corten

    torch.manual_seed(0)
    m = Nonlinear().eval()
    x = torch.randn(2, 12, generator=torch.Generator().manual_seed(11))
    calib = [(c,) for c in torch.randn(16, 2, 12, generator=torch.Generator().manual_seed(12))]
    return m, x, calib, corten.compile(m, (x,), calibration=calib, precision="int16")


def test_nonlinear_int16_lowers_fully_and_beats_int8(nonlinear_program):
    import corten

    m, x, calib, prog = nonlinear_program
    ops = prog.op_counts()
    assert not prog.unlowered_ops() and "quantized_requantize" not in ops
    assert ops["quantized_activation_s16"] == 2 and ops["quantized_lut"] == 2 and ops["quantized_softmax"] == 3
    assert set(_dtypes(prog, "quantized_softmax")) == {torch.int16}
    assert all(o.bits == 16 for o in prog.outputs)
    prog8 = corten.compile(m, (x,), calibration=calib, precision="int8")
    with torch.no_grad():
        ref = m(x)
    err16 = max(float((a - b).abs().max()) for a, b in zip(prog.run(x), ref))
    err8 = max(float((a - b).abs().max()) for a, b in zip(prog8.run(x), ref))
    assert err16 < err8 / 4, (err16, err8)


@needs_gcc
def test_nonlinear_int16_c_bytes_equal_on_host(nonlinear_program):
    _, x, _, prog = nonlinear_program
    got, want = prog.c_run(x, on="host", kernels="portable").outputs, prog.run_int8(x)
    assert all(torch.equal(a, b) for a, b in zip(got, want))


@needs_cmsis_nn
def test_nonlinear_int16_cmsis_nn_bytes_equal_on_host(nonlinear_program):
    _, x, _, prog = nonlinear_program
    got = prog.c_run(x, on="host", kernels="cmsis-nn", cmsis_nn_path=CMSIS_NN_PATH).outputs
    assert all(torch.equal(a, b) for a, b in zip(got, prog.run_int8(x)))
    kernels = [s.kernel for s in prog.kernel_choices("cmsis-nn")]
    assert kernels.count("arm_softmax_s16") == 1 and kernels.count("corten_softmax_s16") == 2


@needs_qemu
def test_nonlinear_int16_on_qemu_m4(nonlinear_program):
    _, x, _, prog = nonlinear_program
    run = prog.c_run(x, on="qemu", target="cortex-m4", kernels="portable")
    assert all(torch.equal(a, b) for a, b in zip(run.outputs, prog.run_int8(x)))


@needs_qemu
@needs_cmsis_nn
def test_nonlinear_int16_cmsis_nn_on_qemu_m4(nonlinear_program):
    _, x, _, prog = nonlinear_program
    run = prog.c_run(x, on="qemu", target="cortex-m4", kernels="cmsis-nn", cmsis_nn_path=CMSIS_NN_PATH)
    assert all(torch.equal(a, b) for a, b in zip(run.outputs, prog.run_int8(x)))


class SigTanh(nn.Module):
    def forward(self, x):
        return torch.sigmoid(x), torch.tanh(x)


@needs_cmsis_nn
def test_power_of_two_input_scale_calls_arm_nn_activation_s16():
    """min/max calibration on values reaching 65535/32768 gives the input scale 2**-12 exactly (with
    the 4x headroom): sigmoid and tanh then run CMSIS-NN's arm_nn_activation_s16, byte-exact."""
    import corten

    a = 65535 / 32768
    x = torch.tensor([[a, -a, 0.3, -1.2, 0.7, 1.9, -0.01, 1e-3]])
    prog = corten.compile(SigTanh().eval(), (x,), calibration=[(x,)], precision="int16", observer="minmax")
    assert prog.inputs[0].scale == 2.0**-12
    assert [s.kernel for s in prog.kernel_choices("cmsis-nn")] == ["arm_nn_activation_s16"] * 2
    xs = torch.linspace(-2, 2, 64).reshape(8, 8)[:1]
    got = prog.c_run(xs, on="host", kernels="cmsis-nn", cmsis_nn_path=CMSIS_NN_PATH).outputs
    assert all(torch.equal(g, w) for g, w in zip(got, prog.run_int8(xs)))


class Elementwise(nn.Module):
    """The other table functions in an int16 region (each a 513-entry int16 table)."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(8, 8), nn.Linear(8, 8)

    def forward(self, x):
        h = self.a(x)
        y = nn.functional.hardswish(h) + nn.functional.elu(h, alpha=0.7) + nn.functional.leaky_relu(h, 0.1)
        y = y + torch.sqrt(torch.abs(h)) + torch.exp(-h * h) + nn.functional.mish(h) + torch.log1p(torch.abs(h))
        return self.b(y)


@needs_gcc
def test_int16_table_functions_lower_and_run_byte_exact():
    import corten

    m = Elementwise().eval()
    x = torch.randn(3, 8, generator=torch.Generator().manual_seed(13))
    calib = [(c,) for c in torch.randn(16, 3, 8, generator=torch.Generator().manual_seed(14))]
    prog = corten.compile(m, (x,), calibration=calib, precision="int16")
    ops = prog.op_counts()
    assert not prog.unlowered_ops() and "quantized_requantize" not in ops
    assert set(_dtypes(prog, "quantized_lut")) == {torch.int16} and ops["quantized_lut"] >= 9
    prog8 = corten.compile(m, (x,), calibration=calib, precision="int8")
    with torch.no_grad():
        ref = m(x)
    assert float((prog.run(x) - ref).norm()) < float((prog8.run(x) - ref).norm()) / 2
    assert torch.equal(prog.c_run(x, on="host", kernels="portable").outputs[0], prog.run_int8(x)[0])


class Steps(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(8, 8), nn.Linear(8, 8)

    def forward(self, x):
        h = self.a(x)
        return self.b(torch.floor(h * 3.0) + torch.sign(h))


@needs_gcc
def test_int16_step_functions_stay_int8_tables():
    """floor/sign: the interpolated int16 table would smear the jumps (lut.STEP_FUNCTIONS); they run
    as exact int8 tables between requantizes in an int16 model."""
    import corten

    x = torch.randn(3, 8, generator=torch.Generator().manual_seed(15))
    prog = corten.compile(Steps().eval(), (x,), precision="int16")
    ops = prog.op_counts()
    assert not prog.unlowered_ops() and _dtypes(prog, "quantized_lut") == [torch.int8, torch.int8]
    assert ops["quantized_requantize"] >= 2 and prog.inputs[0].bits == 16
    assert torch.equal(prog.c_run(x, on="host", kernels="portable").outputs[0], prog.run_int8(x)[0])


@needs_gcc
def test_run_c_dequantizes_int16_outputs():
    """``prog.run_c(x)`` of a program whose output is int16 dequantizes it at 16 bits (it asked the
    int8 dequantize for it and raised); ``int8=True`` still returns the raw int16 values."""
    import corten

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)).eval()
    x = torch.randn(2, 8)
    prog = corten.compile(model, (x,), precision="int16", calibration=[(torch.randn(2, 8),) for _ in range(3)])
    raw = prog.run_c(x, int8=True)
    assert raw[0].dtype == torch.int16 and torch.equal(raw[0], prog.run_int8(x)[0])
    out = prog.run_c(x)
    assert out.dtype == torch.float32 and torch.equal(out, prog.run(x))


class _MixedReaders(nn.Module):
    """The input read by an op with a 16x8 kernel (linear) and by one without (a comparison + where)."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(6, 4)

    def forward(self, x):
        return self.fc(x), torch.where(x > 0.25, x, torch.zeros_like(x))


@needs_gcc
def test_input_read_by_int16_and_int8_ops_is_quantized_once():
    """``precision="int16"``: the input goes through one int16 quantize; the int8 reader gets a
    ``quantized_requantize`` of it (the C library takes one buffer per input; it was refused at
    emit time).  Byte-exact on the host."""
    import corten

    torch.manual_seed(0)
    model = _MixedReaders().eval()
    x = torch.randn(3, 6)
    prog = corten.compile(model, (x,), precision="int16", calibration=[(torch.randn(3, 6),) for _ in range(3)])
    counts = prog.op_counts()
    assert prog.unlowered_ops() == [] and counts["quantize_per_tensor"] == 1 and counts["quantized_requantize"] >= 1
    y = torch.randn(3, 6)
    want = prog.run_int8(y)
    assert [t.dtype for t in want] == [torch.int16, torch.int8]
    assert all(torch.equal(a, b) for a, b in zip(want, prog.c_run(y, kernels="portable").outputs))


class SumOfSquaresEinsum(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)

    def forward(self, x):
        y = torch.relu(self.conv(x))
        return torch.einsum("bchw,bchw->b", y, y)


def test_a_reshape_no_layout_copy_can_emit_is_refused_at_compile_time():
    """int16 activations meeting an int8-only op (the einsum's matmul) through a reshape of a
    channels-last map into another channels-last shape: no layout copy writes that, so compile
    refuses it naming the reshape and its source line (it used to fail only when emitting C)."""
    import corten
    from corten.errors import LoweringError

    torch.manual_seed(0)
    x = torch.randn(1, 3, 6, 6)
    with pytest.raises(LoweringError, match=r"moves channels-last bytes on both sides.*int8") as info:
        corten.compile(SumOfSquaresEinsum().eval(), (x,), precision="int16",
                       calibration=[(x,)] + [(torch.randn(1, 3, 6, 6),) for _ in range(3)])
    assert "test_int16.py:" in str(info.value)
    prog = corten.compile(SumOfSquaresEinsum().eval(), (x,), calibration=[(x,)])  # int8: a strided copy
    assert prog.unlowered_ops() == []
