"""int4 weights (A8W4): reference kernels vs the independent naive ones (packed weights unpacked in
Python), CMSIS-NN's int4 unit-test vectors (``CMSIS_NN_PATH``), the compile API (``weights=``:
"int4", dicts, "auto" with ``max_flash``, QAT), the flash count and int4 programs byte-exact in C on
the host and QEMU Cortex-M4/M55."""
from __future__ import annotations

import random
import re
import warnings
from pathlib import Path

import pytest
import torch
from torch import nn

import naive_int4
from conftest import CMSIS_NN_PATH, needs_cmsis_nn, needs_gcc, needs_qemu
import corten
from corten.codegen.emitter import pack_nibbles
from corten.errors import CortenOpError, UsageError
from corten.ops.registry import weight_bits

conv = torch.ops.corten.quantized_conv2d
dw = torch.ops.corten.quantized_depthwise_conv2d
linear = torch.ops.corten.quantized_linear


def _packed(w: torch.Tensor) -> list[int]:
    return pack_nibbles(w.reshape(-1)).view(torch.uint8).tolist()


def _nhwc(x: torch.Tensor) -> list:
    return x.permute(0, 2, 3, 1).tolist()


def _quant(rng, c):
    mult = [rng.randint(1 << 30, (1 << 31) - 1) for _ in range(c)]
    shift = [rng.randint(-12, 2) for _ in range(c)]
    return torch.tensor(mult, dtype=torch.int32), torch.tensor(shift, dtype=torch.int32)


# ----------------------------------------------------------------------------- reference vs naive
def test_reference_kernels_match_naive_on_packed_int4_weights():
    rng = random.Random(4)
    for _ in range(30):
        n, h, w, c = rng.randint(1, 2), rng.randint(2, 6), rng.randint(2, 6), rng.randint(1, 5)
        kh, kw = rng.randint(1, 3), rng.randint(1, 3)
        stride, dil = [rng.randint(1, 2), rng.randint(1, 2)], [rng.randint(1, 2), 1]
        pad = [rng.randint(0, kh // 2), rng.randint(0, kw // 2)]
        if h + 2 * pad[0] < dil[0] * (kh - 1) + 1 or w + 2 * pad[1] < kw:
            continue
        x = torch.randint(-128, 128, (n, c, h, w), dtype=torch.int8)
        in_off, out_off = rng.randint(-127, 128), rng.randint(-128, 127)
        lo = rng.choice([-128, rng.randint(-128, 0)])
        hi = rng.choice([127, rng.randint(max(lo, 0), 127)])
        c_out = rng.randint(1, 5)
        wt = torch.randint(-8, 8, (c_out, kh, kw, c), dtype=torch.int8)
        bias = torch.randint(-5000, 5000, (c_out,), dtype=torch.int32)
        m, s = _quant(rng, c_out)
        got = conv(x, wt, bias, stride, pad, dil, in_off, out_off, m, s, lo, hi, 4)
        assert _nhwc(got) == naive_int4.conv2d_s4(_nhwc(x), _packed(wt), tuple(wt.shape), bias.tolist(), stride, pad,
                                                  dil, in_off, out_off, m.tolist(), s.tolist(), lo, hi)
        cm = rng.randint(1, 2)
        wd = torch.randint(-8, 8, (1, kh, kw, c * cm), dtype=torch.int8)
        bias = torch.randint(-5000, 5000, (c * cm,), dtype=torch.int32)
        m, s = _quant(rng, c * cm)
        got = dw(x, wd, bias, stride, pad, dil, cm, in_off, out_off, m, s, lo, hi, 4)
        assert _nhwc(got) == naive_int4.depthwise_conv2d_s4(_nhwc(x), _packed(wd), kh, kw, c * cm, bias.tolist(),
                                                            stride, pad, dil, cm, in_off, out_off, m.tolist(),
                                                            s.tolist(), lo, hi)
        in_f, out_f = rng.randint(1, 9), rng.randint(1, 6)
        xl = torch.randint(-128, 128, (n, in_f), dtype=torch.int8)
        wl = torch.randint(-8, 8, (out_f, in_f), dtype=torch.int8)
        bias = torch.randint(-5000, 5000, (out_f,), dtype=torch.int32)
        m, s = _quant(rng, out_f)
        ksum = bias.to(torch.int64) + in_off * wl.to(torch.int64).sum(1)
        got = linear(xl, wl, ksum.to(torch.int32), in_off, out_off, m, s, lo, hi, False, 4)
        assert got.tolist() == naive_int4.fully_connected_s4(xl.tolist(), _packed(wl), out_f, in_f, bias.tolist(),
                                                             in_off, out_off, m.tolist(), s.tolist(), lo, hi)


def test_int4_weights_outside_the_nibble_range_are_refused():
    x = torch.zeros(1, 2, 3, 3, dtype=torch.int8)
    m, s = torch.tensor([1 << 30], dtype=torch.int32), torch.tensor([0], dtype=torch.int32)
    w = torch.full((1, 1, 1, 2), 8, dtype=torch.int8)
    with pytest.raises(CortenOpError, match=r"\[-8, 7\]"):
        conv(x, w, None, [1, 1], [0, 0], [1, 1], 0, 0, m, s, -128, 127, 4)
    with pytest.raises(CortenOpError, match="weight_bits"):
        conv(x, w, None, [1, 1], [0, 0], [1, 1], 0, 0, m, s, -128, 127, 2)
    assert conv(x, w, None, [1, 1], [0, 0], [1, 1], 0, 0, m, s, -128, 127).shape == (1, 1, 3, 3)  # int8: fine


# ----------------------------------------------------------------------------- CMSIS-NN's vectors
def _to_s8(v: int) -> int:
    return (v + 128) % 256 - 128


def _vectors(case: str) -> tuple[dict, dict]:
    """Arrays (pointer aliases resolved) and defines of the headers ``test_data.h`` includes, the
    case's prefix stripped."""
    d = Path(CMSIS_NN_PATH) / "Tests/UnitTest/TestCases/TestData" / case
    arrays, cfg, aliases = {}, {}, {}
    for inc in re.findall(r'#include "(\w+\.h)"', (d / "test_data.h").read_text()):
        text = (d / inc).read_text()
        for m in re.finditer(r"const\s+\w+\s+(\w+)\[\d*\]\s*=\s*\{([^}]*)\}", text):
            arrays[m.group(1)] = [int(v) for v in re.findall(r"-?\d+", m.group(2))]
        for m in re.finditer(r"const\s+\w+\s*\*\s*const\s+(\w+)\s*=\s*(\w+)\s*;", text):
            aliases[m.group(1)] = m.group(2)
        cfg.update({k: int(v) for k, v in re.findall(r"#define\s+(\w+)\s+(-?\d+)", text)})
    for a, target in aliases.items():
        arrays.setdefault(a, arrays.get(target))
    p = case + "_"
    arrays = {k[len(p):]: v for k, v in arrays.items() if k.startswith(p) and v is not None}
    cfg = {k[len(p):]: v for k, v in cfg.items() if k.startswith(p.upper())}
    return arrays, cfg


def _first(arrays, *names):
    return next((arrays[n] for n in names if n in arrays), None)  # (a NULL pointer alias: None)


def _pads(cfg, h, w, kh, kw, sy, sx, dy, dx):
    ho, wo = cfg["OUTPUT_H"], cfg["OUTPUT_W"]
    top, left = cfg["PAD_Y"], cfg["PAD_X"]
    return [top, left, max(0, (ho - 1) * sy + dy * (kh - 1) + 1 - h - top),
            max(0, (wo - 1) * sx + dx * (kw - 1) + 1 - w - left)]


def _cases(prefix_re: str) -> list[str]:
    if not CMSIS_NN_PATH:
        return []
    root = Path(CMSIS_NN_PATH) / "Tests/UnitTest/TestCases/TestData"
    return sorted(p.name for p in root.iterdir() if re.fullmatch(prefix_re, p.name))


CONV_CASES = _cases(r"(basic|basic_2|conv_.*|kernel1x1.*|stride2pad1)_int4(_\d+)?")
DW_CASES = _cases(r"depthwise_int4.*")
FC_CASES = _cases(r"fully_connected_int4.*")


def _conv_vector(case, depthwise: bool):
    a, cfg = _vectors(case)
    n, h, w, c = cfg["INPUT_BATCHES"], cfg["INPUT_H"], cfg["INPUT_W"], cfg["IN_CH"]
    kh, kw, c_out = cfg["FILTER_Y"], cfg["FILTER_X"], cfg["OUT_CH"]
    sy, sx, dy, dx = cfg["STRIDE_Y"], cfg["STRIDE_X"], cfg.get("DILATION_Y", 1), cfg.get("DILATION_X", 1)
    x = torch.tensor([_to_s8(v) for v in a["input"]], dtype=torch.int8).reshape(n, h, w, c).permute(0, 3, 1, 2)
    count = kh * kw * c_out * (1 if depthwise else c)
    wt = torch.tensor(naive_int4.unpack_s4(_first(a, "weights", "input_weights"), count), dtype=torch.int8)
    bias = _first(a, "biases", "bias", "input_bias")
    bias = torch.tensor(bias, dtype=torch.int32) if bias is not None else None
    mult = torch.tensor(_first(a, "output_mult", "output_multiplier"), dtype=torch.int32)
    shift = torch.tensor(a["output_shift"], dtype=torch.int32)
    tail = (cfg["INPUT_OFFSET"], cfg["OUTPUT_OFFSET"], mult, shift, cfg["OUT_ACTIVATION_MIN"],
            cfg["OUT_ACTIVATION_MAX"], 4)
    pads = _pads(cfg, h, w, kh, kw, sy, sx, dy, dx)
    if depthwise:
        got = dw(x, wt.reshape(1, kh, kw, c_out), bias, [sy, sx], pads, [dy, dx], cfg["CH_MULT"], *tail)
    else:
        got = conv(x, wt.reshape(c_out, kh, kw, c), bias, [sy, sx], pads, [dy, dx], *tail)
    want = [_to_s8(v) for v in _first(a, "output_ref", "output")]
    return got.permute(0, 2, 3, 1).reshape(-1).tolist(), want


@needs_cmsis_nn
@pytest.mark.parametrize("case", CONV_CASES)
def test_conv_s4_matches_cmsis_nn_test_vectors(case):
    got, want = _conv_vector(case, depthwise=False)
    assert got == want


@needs_cmsis_nn
@pytest.mark.parametrize("case", DW_CASES)
def test_depthwise_s4_matches_cmsis_nn_test_vectors(case):
    got, want = _conv_vector(case, depthwise=True)
    assert got == want


@needs_cmsis_nn
@pytest.mark.parametrize("case", FC_CASES)
def test_fully_connected_s4_matches_cmsis_nn_test_vectors(case):
    a, cfg = _vectors(case)
    batches, depth, out_ch = cfg["INPUT_BATCHES"], cfg["ACCUMULATION_DEPTH"], cfg["OUT_CH"]
    x = torch.tensor([_to_s8(v) for v in a["input"]], dtype=torch.int8).reshape(batches, depth)
    w = torch.tensor(naive_int4.unpack_s4(_first(a, "weights", "input_weights"), out_ch * depth),
                     dtype=torch.int8).reshape(out_ch, depth)
    bias = torch.tensor(_first(a, "biases", "bias", "input_bias") or [0] * out_ch, dtype=torch.int64)
    in_off = cfg["INPUT_OFFSET"]
    ksum = (bias + in_off * w.to(torch.int64).sum(1)).to(torch.int32)
    if not -128 <= cfg["OUTPUT_OFFSET"] <= 127:
        # (fully_connected_int4_6: output offset 128, not an int8 zero point - no Corten program has it)
        with pytest.raises(CortenOpError, match="output_offset"):
            linear(x, w, ksum, in_off, cfg["OUTPUT_OFFSET"], torch.tensor([1 << 30], dtype=torch.int32),
                   torch.tensor([0], dtype=torch.int32), -128, 127, False, 4)
        return
    got = linear(x, w, ksum, in_off, cfg["OUTPUT_OFFSET"], torch.tensor([cfg["OUTPUT_MULTIPLIER"]], dtype=torch.int32),
                 torch.tensor([cfg["OUTPUT_SHIFT"]], dtype=torch.int32), cfg["OUT_ACTIVATION_MIN"],
                 cfg["OUT_ACTIVATION_MAX"], False, 4)
    assert got.reshape(-1).tolist() == [_to_s8(v) for v in _first(a, "output_ref", "output")]


# ----------------------------------------------------------------------------- compile API
class Net(nn.Module):
    """Every int4 kernel: 3x3 conv, depthwise (multiplier 1 and 2), 1x1 conv, linear (even and odd
    features); a grouped conv (no int4 kernel) stays int8."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 6, 3, padding=1)
        self.dw = nn.Conv2d(6, 6, 3, stride=2, padding=1, groups=6)
        self.dw2 = nn.Conv2d(6, 12, 3, padding=1, groups=6)
        self.pw = nn.Conv2d(12, 6, 1)
        self.grouped = nn.Conv2d(6, 4, 1, groups=2)
        self.fc = nn.Linear(4 * 3 * 3, 5)
        self.fc2 = nn.Linear(5, 3)

    def forward(self, x):
        x = torch.relu(self.stem(x))
        x = torch.relu(self.dw2(torch.relu(self.dw(x))))
        x = self.grouped(self.pw(x))
        return self.fc2(torch.relu(self.fc(x.flatten(1))))


def _net():
    torch.manual_seed(0)
    return Net().eval(), torch.randn(1, 3, 6, 6)


def _compile(model, x, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return corten.compile(model, (x,), calibration=torch.randn(8, *x.shape[1:]), **kw)


def _widths(prog) -> dict[str, int]:
    tensors = prog.info["tensors"]
    return {tensors[n.name]["module"]: weight_bits(n) for n in prog.module().graph.nodes
            if n.op == "call_function" and n.name in tensors and weight_bits(n)}


@pytest.fixture(scope="module")
def programs():
    model, x = _net()
    return model, x, _compile(model, x), _compile(model, x, weights="int4")


def test_weights_int4_gives_int4_layers_and_halves_their_flash(programs):
    model, x, p8, p4 = programs
    assert _widths(p8) == {"stem": 8, "dw": 8, "dw2": 8, "pw": 8, "grouped": 8, "fc": 8, "fc2": 8}
    # every conv/depthwise/linear with an int4 kernel goes int4; the grouped conv (none) stays int8
    assert _widths(p4) == {"stem": 4, "dw": 4, "dw2": 4, "pw": 4, "grouped": 8, "fc": 4, "fc2": 4}
    assert len(p4.info["weights"]["int4_nodes"]) == 6
    w8 = {n: p.numel() for n, p in model.named_parameters() if n.endswith("weight")}
    packed = sum((v + 1) // 2 for k, v in w8.items() if not k.startswith("grouped"))
    saved = sum(v for k, v in w8.items() if not k.startswith("grouped")) - packed
    assert p8.memory.constant_bytes - p4.memory.constant_bytes == saved
    report = corten.weights_report(p4)
    assert report in p4.memory_report() and "int4" not in p8.memory_report()  # (int8 programs: unchanged)
    assert "int4 weights" in report and re.search(r"fc2\s+int4\s+8\b", report)  # ceil(3 * 5 / 2)
    rows = {r.module: r.weight_bits for r in p4.compare(model, [x]).rows if r.weight_bits}
    assert rows["stem"] == 4 and rows["grouped"] == 8
    assert "int4" in p4.compare(model, [x]).table()


def test_weights_dict_by_path_and_type():
    model, x = _net()
    p = _compile(model, x, weights={"": "int8", "fc": "int4", nn.Conv2d: "int8"})
    assert _widths(p)["fc"] == 4 and _widths(p)["stem"] == 8
    p = _compile(model, x, weights={nn.Conv2d: "int4"})
    assert _widths(p)["fc"] == 8 and _widths(p)["dw2"] == 4


def test_weights_refusals():
    model, x = _net()
    with pytest.raises(UsageError, match="weights must be"):
        _compile(model, x, weights="int2")
    with pytest.raises(UsageError, match="max_flash"):
        _compile(model, x, weights="auto")
    with pytest.raises(UsageError, match=r"weights\['fc'\]"):
        _compile(model, x, weights={"fc": "int3"})


def test_weights_auto_fits_max_flash_with_the_fewest_int4_layers(programs):
    model, x, p8, p4 = programs
    flash8, flash4 = p8.memory.constant_bytes, p4.memory.constant_bytes
    same = _compile(model, x, weights="auto", max_flash=flash8)
    assert set(_widths(same).values()) == {8}  # fits as int8: nothing changes
    budget = flash8 - 100  # (the stem alone saves 81 B, fc 90 B)
    p = _compile(model, x, weights="auto", max_flash=budget)
    auto = p.info["weights"]["auto"]
    assert p.memory.constant_bytes <= budget < flash8
    assert 0 < len(auto["int4_layers"]) < 5 and sum(v == 4 for v in _widths(p).values()) == len(auto["int4_layers"])
    cost = [10 ** (-d["op_sqnr_db_int4"] / 10) / d["saved_bytes"] for d in auto["int4_layers"]]
    assert cost == sorted(cost)  # least int4 rounding error per byte saved first
    with pytest.raises(corten.BudgetError):
        _compile(model, x, weights="auto", max_flash=flash4 - 1)


def test_prepare_qat_with_int4_weights_compiles_to_int4():
    model, x = _net()
    qat = corten.prepare_qat(model, (x,), weights={"fc": "int4"})
    opt = torch.optim.SGD(qat.parameters(), lr=1e-3)
    for _ in range(2):
        opt.zero_grad()
        qat(torch.randn(4, 3, 6, 6)).square().mean().backward()
        opt.step()
    prog = corten.compile(qat, (x,))
    assert _widths(prog)["fc"] == 4 and _widths(prog)["stem"] == 8
    with pytest.raises(UsageError, match="auto"):
        corten.prepare_qat(model, (x,), weights="auto")


def test_int4_program_saves_and_loads(programs, tmp_path):
    model, x, _, p4 = programs
    p4.save(tmp_path / "p")
    back = corten.load(tmp_path / "p")
    assert _widths(back) == _widths(p4)
    assert torch.equal(back.run_int8(x)[0], p4.run_int8(x)[0])


# ----------------------------------------------------------------------------- C, byte for byte
@needs_gcc
def test_int4_program_is_byte_exact_in_portable_c_on_the_host(programs):
    model, x, _, p4 = programs
    run = p4.c_run(x, on="host", kernels="portable")
    assert torch.equal(run.outputs[0], p4.run_int8(x)[0])
    kernels = {s.kernel for s in p4.kernel_choices(kernels="portable")}
    assert {"corten_conv2d_s4", "corten_depthwise_conv2d_s4", "corten_linear_s4", "corten_grouped_conv2d_s8"} <= kernels


@needs_qemu
@pytest.mark.parametrize("target", ["cortex-m4", "cortex-m55"])
def test_int4_program_is_byte_exact_on_qemu(programs, target):
    model, x, _, p4 = programs
    run = p4.c_run(x, on="qemu", target=target, kernels="portable")
    assert torch.equal(run.outputs[0], p4.run_int8(x)[0])


def test_generated_and_cmsis_nn_providers_choose_by_weight_dtype(programs):
    """The generator has no int4 kernels: those layers fall through to the next provider (reason
    given); CMSIS-NN takes them with its s4 kernels (Helium's optimised depthwise excepted)."""
    _, _, _, p4 = programs
    steps = {s.module: s for s in p4.kernel_choices(kernels=("generated", "cmsis-nn"), target="cortex-m4")}
    assert steps["stem"].kernel == "arm_convolve_wrapper_s4" and "int4" in steps["stem"].reason
    assert steps["fc"].kernel == "arm_fully_connected_s4"  # per channel: one call per output feature
    assert steps["fc2"].kernel == "corten_linear_s4"  # per channel, 5 features: rows start mid-byte
    assert steps["dw"].kernel == "arm_depthwise_conv_wrapper_s4"
    m55 = {s.module: s for s in p4.kernel_choices(kernels="cmsis-nn", target="cortex-m55")}
    assert m55["dw"].kernel == "corten_depthwise_conv2d_s4" and m55["dw2"].kernel == "arm_depthwise_conv_wrapper_s4"


@needs_cmsis_nn
@needs_qemu
@pytest.mark.parametrize("target", ["cortex-m4", "cortex-m55"])
def test_int4_program_is_byte_exact_with_cmsis_nn(programs, target):
    model, x, _, p4 = programs
    assert torch.equal(p4.c_run(x, on="host", kernels="cmsis-nn", cmsis_nn_path=CMSIS_NN_PATH).outputs[0],
                       p4.run_int8(x)[0])
    run = p4.c_run(x, on="qemu", target=target, kernels="cmsis-nn", cmsis_nn_path=CMSIS_NN_PATH)
    assert torch.equal(run.outputs[0], p4.run_int8(x)[0])


def test_cli_weights_auto(tmp_path, capsys):
    from corten.cli import main as cli_main

    net = tmp_path / "net.py"
    net.write_text("import torch, sys\nsys.path.insert(0, %r)\nfrom test_int4 import _net\n\n"
                   "def make():\n    m, x = _net()\n    return m, (x,)\n" % str(Path(__file__).parent))
    out = tmp_path / "o"
    rc = cli_main(["compile", f"{net}:make", "--out", str(out), "--calib", "2", "--weights", "auto",
                   "--max-flash", "1000"])
    text = capsys.readouterr().out
    assert rc == 0, text
    report = (out / "report.txt").read_text()
    assert "weights=auto" in report and re.search(r"\sint4\s+\d", report)  # (a layer row)
    assert corten.load(out).memory.constant_bytes <= 1000  # (int8: 1,107 B)


def test_auto_keeps_int8_the_noisiest_set_that_fits():
    """weights="auto"'s choice: the layers left int8 are those with the largest total int4 noise whose
    savings fit the flash all-int4 leaves (checked against every subset)."""
    import itertools

    from corten.compiler import _keep_int8, _noise_per_byte

    g = torch.Generator().manual_seed(3)
    for trial in range(20):
        cands = [{"module": f"m{i}", "op_sqnr_db_int4": float(torch.rand(1, generator=g)) * 30,
                  "saved_bytes": int(torch.randint(1, 60, (1,), generator=g))} for i in range(7)]
        slack = int(torch.randint(0, 150, (1,), generator=g))
        noise = {d["module"]: _noise_per_byte(d) * d["saved_bytes"] for d in cands}
        saved = {d["module"]: d["saved_bytes"] for d in cands}
        best = max((sum(noise[m] for m in s) for r in range(len(cands) + 1)
                    for s in itertools.combinations(noise, r) if sum(saved[m] for m in s) <= slack), default=0.0)
        keep = _keep_int8(cands, slack)
        assert sum(saved[m] for m in keep) <= slack
        assert sum(noise[m] for m in keep) == pytest.approx(best)
