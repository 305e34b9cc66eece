"""``quantized_matmul``: the reference kernel against ``naive_matmul.py``, the strided portable C kernel
against the reference (host), the lowering of matmul/bmm/mm/@ (attention, constants, broadcasting,
folded transposes), the emitted C on the host and QEMU Cortex-M55/M4 (one program holding every
idiom: one QEMU run per board), and - when CMSIS_NN_PATH is set - ``arm_batch_matmul_s8`` itself and
CMSIS-NN's own ``batch_matmul_*_s8`` unit-test vectors read from that tree."""
from __future__ import annotations

import ctypes
import random
import re
import shutil
import subprocess
import warnings
from pathlib import Path

import pytest
import torch
from torch import nn
from conftest import CMSIS_NN_PATH, needs_gcc, needs_qemu

import corten.ops  # noqa: F401
import naive_matmul as naive
from corten.codegen import KERNELS_DIR
from corten.ops.checks import CortenOpError
from corten.ops.matmul import cmsis_plan, cmsis_scratch_bytes, geometry
from corten.testing.tester import Tester

matmul = torch.ops.corten.quantized_matmul
GCC = shutil.which("gcc")
needs_cmsis = pytest.mark.skipif(not CMSIS_NN_PATH, reason="set CMSIS_NN_PATH to a CMSIS-NN source tree")


# ----------------------------------------------------------------------------- random cases
def _random_case(rng: random.Random):
    m, n, k = rng.randint(1, 6), rng.randint(1, 6), rng.randint(1, 9)
    nb = rng.randint(0, 2)
    batch = [rng.randint(1, 3) for _ in range(nb)]
    lb = [d if rng.random() < 0.7 else 1 for d in batch][rng.randint(0, nb):] if nb else []
    rb = [d if rng.random() < 0.7 else 1 for d in batch][rng.randint(0, nb):] if nb else []
    rhs_t = rng.random() < 0.5
    lhs = torch.randint(-128, 128, (*lb, m, k), dtype=torch.int8, generator=torch.Generator().manual_seed(rng.randint(0, 1 << 30)))
    rhs_shape = (*rb, n, k) if rhs_t else (*rb, k, n)
    rhs = torch.randint(-128, 128, rhs_shape, dtype=torch.int8, generator=torch.Generator().manual_seed(rng.randint(0, 1 << 30)))
    lo, ro = rng.randint(-127, 128), rng.randint(-127, 128)
    oo = rng.randint(-128, 127)
    mult = rng.choice([0, rng.randint(1 << 30, (1 << 31) - 1)])
    shift = rng.randint(-31, 5) if rng.random() < 0.3 else rng.randint(-16, -6)
    amin = rng.randint(-128, 0)
    amax = rng.randint(amin, 127)
    return lhs, rhs, (lo, ro, oo, mult, shift, amin, amax, rhs_t)


def _naive(lhs, rhs, params):
    lo, ro, oo, mult, shift, amin, amax, rhs_t = params
    out, shape = naive.matmul(lhs.flatten().tolist(), rhs.flatten().tolist(), list(lhs.shape), list(rhs.shape),
                              lo, ro, oo, mult, shift, amin, amax, rhs_t)
    return torch.tensor(out, dtype=torch.int8).reshape(shape)


def test_reference_matches_naive():
    rng = random.Random(5)
    for _ in range(150):
        lhs, rhs, params = _random_case(rng)
        got = matmul(lhs, rhs, *params)
        assert torch.equal(got, _naive(lhs, rhs, params)), (lhs.shape, rhs.shape, params)


def test_reference_accumulator_wraps_like_int32():
    """K = 40000 products of 255 * 255 overflow int32: the reference wraps as the C accumulator does."""
    lhs = torch.full((1, 40000), 127, dtype=torch.int8)
    rhs = torch.full((40000, 1), 127, dtype=torch.int8)
    got = matmul(lhs, rhs, 128, 128, 0, 1 << 30, -20, -128, 127)
    acc = (255 * 255 * 40000 + 2**31) % 2**32 - 2**31
    assert int(got) == max(-128, min(127, naive.requantize(acc, 1 << 30, -20)))


def test_four_d_output_is_channels_last_and_opcheck():
    lhs = torch.randint(-128, 128, (2, 3, 4, 5), dtype=torch.int8)
    rhs = torch.randint(-128, 128, (3, 6, 5), dtype=torch.int8)
    args = (lhs, rhs, 3, -2, 1, 1 << 30, -8, -128, 127, True)
    out = matmul(*args)
    assert out.shape == (2, 3, 4, 6) and out.is_contiguous(memory_format=torch.channels_last)
    torch.library.opcheck(matmul.default, args)


@pytest.mark.parametrize("change,msg", [
    ({"rhs": torch.zeros(4, 3, dtype=torch.int8)}, "inner sizes differ"),
    ({"lhs": torch.zeros(5, dtype=torch.int8)}, "rank 1"),
    ({"rhs": torch.zeros(2, 2, 2, 2, 5, 3, dtype=torch.int8)}, "rank 6"),
    ({"lhs": torch.zeros(2, 4, 5, dtype=torch.int8), "rhs": torch.zeros(3, 5, 3, dtype=torch.int8)}, "broadcast"),
    ({"lhs_offset": 129}, "lhs_offset"),
    ({"output_shift": 31}, "output_shift"),
    ({"output_multiplier": 5}, "output_multiplier"),
    ({"activation_min": 10, "activation_max": 0}, "activation_min"),
])
def test_bad_arguments(change, msg):
    args = dict(lhs=torch.zeros(4, 5, dtype=torch.int8), rhs=torch.zeros(5, 3, dtype=torch.int8), lhs_offset=0,
                rhs_offset=0, output_offset=0, output_multiplier=1 << 30, output_shift=-3, activation_min=-128,
                activation_max=127)
    args.update(change)
    with pytest.raises(CortenOpError, match=msg):
        matmul(**args)


# ----------------------------------------------------------------------------- geometry / CMSIS-NN plan
def test_geometry_of_multi_head_attention_reads_nhwc_in_place():
    """q [1, H=2, T=5, d=8] is stored NHWC (1, 5, 8, 2): element (h, t, k) at t*16 + k*2 + h."""
    g = geometry((1, 2, 5, 8), (1, 2, 5, 8), (1, 2, 5, 5), rhs_transposed=True)
    assert g.lhs == (0, 1, 16, 2) and g.rhs == (0, 1, 2, 16) and g.out == (0, 1, 10, 2)
    assert cmsis_plan(g) is None  # heads innermost in memory: the portable kernel runs
    assert cmsis_scratch_bytes("mve", g) == 0


def test_cmsis_plan_3d_with_and_without_transpose():
    g = geometry((4, 5, 8), (4, 6, 8), (4, 5, 6), rhs_transposed=True)
    plan = cmsis_plan(g)
    assert plan.lhs_dims == (1, 4, 5, 8) and plan.rhs_dims == (1, 4, 6, 8) and not plan.transpose_rhs
    assert cmsis_scratch_bytes("mve", g) == 24 and cmsis_scratch_bytes("dsp", g) == 0
    g = geometry((4, 5, 8), (1, 8, 6), (4, 5, 6), rhs_transposed=False)
    plan = cmsis_plan(g)
    assert plan.transpose_rhs and plan.rhs_dims == (1, 1, 6, 8)
    assert cmsis_scratch_bytes("dsp", g) == 48 and cmsis_scratch_bytes("mve", g) == 48 + 24


# ----------------------------------------------------------------------------- portable C kernel (host)
class _Params(ctypes.Structure):
    _fields_ = [(f, ctypes.c_int32) for f in ("lhs_offset", "rhs_offset", "output_offset", "output_multiplier",
                                              "output_shift", "activation_min", "activation_max")]


class _Dims(ctypes.Structure):
    _fields_ = [("batch", ctypes.c_int32 * 2), ("m", ctypes.c_int32), ("n", ctypes.c_int32), ("k", ctypes.c_int32),
                ("lhs_stride", ctypes.c_int32 * 4), ("rhs_stride", ctypes.c_int32 * 4),
                ("out_stride", ctypes.c_int32 * 4)]


@pytest.fixture(scope="module")
def portable(tmp_path_factory):
    if GCC is None:
        pytest.skip("needs gcc")
    out = tmp_path_factory.mktemp("matmul") / "libmatmul.so"
    subprocess.run([GCC, "-std=c99", "-O2", "-shared", "-fPIC", "-Wall", "-Wextra", "-Werror", f"-I{KERNELS_DIR}",
                    str(KERNELS_DIR / "matmul.c"), "-o", str(out)], check=True, capture_output=True, text=True)
    lib = ctypes.CDLL(str(out))
    lib.corten_matmul_s8.restype = ctypes.c_int
    return lib


def _storage_bytes(t: torch.Tensor) -> bytes:
    """A graph tensor's bytes: NHWC for 4-D, row-major otherwise."""
    t = t.permute(0, 2, 3, 1) if t.dim() == 4 else t
    return t.contiguous().numpy().tobytes()


def _run_portable(lib, lhs, rhs, params):
    lo, ro, oo, mult, shift, amin, amax, rhs_t = params
    want = matmul(lhs, rhs, *params)
    g = geometry(tuple(lhs.shape), tuple(rhs.shape), tuple(want.shape), rhs_t)
    p = _Params(lo, ro, oo, mult, shift, amin, amax)
    d = _Dims((ctypes.c_int32 * 2)(*g.batch), g.m, g.n, g.k, (ctypes.c_int32 * 4)(*g.lhs),
              (ctypes.c_int32 * 4)(*g.rhs), (ctypes.c_int32 * 4)(*g.out))
    lb, rb = _storage_bytes(lhs), _storage_bytes(rhs)
    dst = (ctypes.c_int8 * want.numel())()
    assert lib.corten_matmul_s8(ctypes.byref(p), ctypes.byref(d), lb, rb, dst) == 0
    assert bytes(dst) == _storage_bytes(want), (lhs.shape, rhs.shape, params)


def test_portable_kernel_matches_reference(portable):
    rng = random.Random(11)
    for _ in range(300):
        _run_portable(portable, *_random_case(rng))


def test_portable_kernel_four_d_nhwc_operands(portable):
    rng = random.Random(3)
    for _ in range(40):
        h, t, d = rng.randint(1, 3), rng.randint(1, 5), rng.randint(1, 6)
        q = torch.randint(-128, 128, (rng.randint(1, 2), h, t, d), dtype=torch.int8)
        k = torch.randint(-128, 128, (q.shape[0], h, t, d), dtype=torch.int8)
        _run_portable(portable, q, k, (rng.randint(-127, 128), rng.randint(-127, 128), 5, 1 << 30, -9, -128, 127, True))
        v = torch.randint(-128, 128, (q.shape[0], h, d, t), dtype=torch.int8)
        _run_portable(portable, q, v, (rng.randint(-127, 128), 0, -3, 1 << 30, -9, -128, 127, False))


def test_portable_kernel_rejects_bad_arguments(portable):
    p = _Params(0, 0, 0, 1 << 30, -3, -128, 127)
    d = _Dims((ctypes.c_int32 * 2)(1, 1), 1, 1, 0, (ctypes.c_int32 * 4)(), (ctypes.c_int32 * 4)(), (ctypes.c_int32 * 4)())
    buf = (ctypes.c_int8 * 4)()
    assert portable.corten_matmul_s8(ctypes.byref(p), ctypes.byref(d), buf, buf, buf) != 0
    d.k = 1
    assert portable.corten_matmul_s8(ctypes.byref(p), ctypes.byref(d), None, buf, buf) != 0
    p.output_shift = 31
    assert portable.corten_matmul_s8(ctypes.byref(p), ctypes.byref(d), buf, buf, buf) != 0


# ----------------------------------------------------------------------------- through the compiler
class Attention(nn.Module):
    """Hand-written multi-head self-attention: heads reshaped and transposed, q @ k^T * s, softmax, @ v."""

    def __init__(self, dim: int = 16, heads: int = 2):
        super().__init__()
        self.q, self.k, self.v, self.o = (nn.Linear(dim, dim) for _ in range(4))
        self.heads, self.scale = heads, (dim // heads) ** -0.5

    def forward(self, x):
        b, t, d = x.shape
        split = lambda y: y.view(b, t, self.heads, d // self.heads).transpose(1, 2)  # noqa: E731
        q, k, v = split(self.q(x)), split(self.k(x)), split(self.v(x))
        a = ((q @ k.transpose(-2, -1)) * self.scale).softmax(dim=-1)
        return self.o((a @ v).transpose(1, 2).reshape(b, t, d))


class Idioms(nn.Module):
    """Every matmul idiom in one program (one C run per board covers them all)."""

    def __init__(self):
        super().__init__()
        self.attn = Attention()
        self.w = nn.Parameter(torch.randn(16, 6) * 0.3)  # x @ W (constant right operand)
        self.p = nn.Parameter(torch.randn(3, 5) * 0.3)  # P @ x (constant left operand)
        self.fc = nn.Linear(16, 16)
        self.fc8 = nn.Linear(16, 8)

    def forward(self, x):  # x [1, 5, 16]
        y = self.fc(x)
        gram = torch.bmm(x, y.transpose(1, 2))  # folded transpose, 3-D: arm_batch_matmul_s8 as is
        xy = torch.relu(x.transpose(1, 2) @ y)  # rhs not transposed: transposed into scratch for CMSIS-NN
        xw = x @ self.w
        px = torch.matmul(self.p, x)  # [3, 5] @ [1, 5, 16]: batch broadcast, constant lhs
        heads = y.view(1, 5, 2, 8).transpose(1, 2)  # [1, 2, 5, 8] @ [1, 8, 5] -> [1, 2, 5, 5]
        bcast = heads @ self.fc8(x).transpose(1, 2)  # 4-D @ 3-D: the rhs batch broadcasts over the heads
        mm = torch.mm(x.view(5, 16), y.view(5, 16).t())
        return self.attn(x), gram, xy, xw, px, bcast, mm


def _tester(make, shape=(1, 5, 16), target: str = "cortex-m55") -> Tester:
    """The model built by ``make()`` after seeding (weights independent of the tests run before)."""
    warnings.simplefilter("ignore")
    torch.manual_seed(0)
    model = make()
    return Tester(model.eval(), (torch.randn(shape),), target=target)


def test_dialect_attention():
    t = _tester(Attention)
    report = t.test_dialect(ops_before={"aten.matmul.default": 2, "aten.softmax.int": 1},
                            ops_after={"quantize_per_tensor": 1, "quantized_linear": 4, "quantized_transpose": 3,
                                       # k.view(B, T, H, D).transpose(1, 2): the [1, T, C] -> NHWC layout copy
                                       # and the transpose compose into one strided copy (then the
                                       # transpose(-2, -1) folds into the matmul)
                                       "quantized_strided_copy": 1,
                                       "quantized_matmul": 2, "quantized_mul": 1, "quantized_softmax": 1,
                                       "dequantize_per_tensor": 1}, qtol=1)
    assert report.cosine_vs_float > 0.99
    mms = [n for n in t.program.ep.graph.nodes if n.op == "call_function" and "quantized_matmul" in str(n.target)]
    assert [bool(n.args[9]) if len(n.args) > 9 else False for n in mms] == [True, False]  # k.transpose(-2, -1) folded into the first call


def test_dialect_idioms():
    t = _tester(Idioms)
    t.lower()
    assert not t.program.unlowered_ops(), t.program.unlowered_ops()
    counts = t.program.op_counts()
    assert counts["quantized_matmul"] == 8
    report = t.test_dialect(ops_before={"aten.bmm.default": 1, "aten.mm.default": 1},
                            ops_after=counts, qtol=1)
    assert report.cosine_vs_float > 0.98


class SDPA(nn.Module):
    """F.scaled_dot_product_attention: decomposed before quantization into the same ops as above."""

    def __init__(self):
        super().__init__()
        self.q, self.k, self.v = (nn.Linear(16, 16) for _ in range(3))

    def forward(self, x):
        split = lambda y: y.view(1, 5, 2, 8).transpose(1, 2)  # noqa: E731
        y = nn.functional.scaled_dot_product_attention(split(self.q(x)), split(self.k(x)), split(self.v(x)), scale=0.3)
        causal = nn.functional.scaled_dot_product_attention(split(self.q(x)), split(self.k(x)), split(self.v(x)),
                                                            is_causal=True)
        return y, causal


def test_scaled_dot_product_attention_decomposes():
    t = _tester(SDPA)
    t.lower()
    assert t.program.unlowered_ops() == []
    counts = t.program.op_counts()
    # is_causal: the masked softmax softmax(s * keep + amin(s) * (1 - keep)) * keep / sum (constant 0/1 keep
    # and drop, a row minimum, a sum, an exact div)
    assert counts["quantized_matmul"] == 4 and counts["quantized_softmax"] == 2 and counts["quantized_mul"] == 5
    assert counts["quantized_div"] == 1 and counts["quantized_reduce"] == 2 and counts["quantized_add"] == 1


class Vectors(nn.Module):
    """``matmul`` with 1-D operands as PyTorch defines it (a left vector is a row, a right one a column,
    the added dim removed): vector . vector (0-D), vector @ matrix, matrix @ vector, a batch @ vector,
    ``torch.mv`` and ``torch.dot``, of computed tensors and of constants."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.register_buffer("w", torch.randn(8, 5))

    def forward(self, x):
        y = self.fc(x)  # [2, 8]
        v = y[0]
        batch = y.reshape(2, 2, 4)
        return (v @ y[1], v @ self.w, y @ v, batch @ v[:4], torch.mv(self.w.t(), v), torch.dot(v, y[1]) * 2,
                self.w.t() @ v)


@needs_gcc
def test_one_d_operands_lower_and_are_byte_exact():
    import corten

    torch.manual_seed(0)
    model = Vectors().eval()
    x = torch.randn(2, 8)
    prog = corten.compile(model, (x,), calibration=[(x,)] + [(torch.randn(2, 8),) for _ in range(7)])
    assert prog.unlowered_ops() == [] and prog.op_counts()["quantized_matmul"] == 7
    want = prog.run_int8(x)
    assert all(torch.equal(a, b) for a, b in zip(want, prog.run_c(x, on="host", int8=True)))
    with torch.no_grad():
        ref = model(x)
    got = prog.run(x)
    assert [tuple(r.shape) for r in ref] == [tuple(g.shape) for g in got] == \
        [(), (5,), (2,), (2, 2), (5,), (), (5,)]
    for r, g in zip(ref, got):
        assert float((r - g).abs().max()) <= 0.05 * max(1.0, float(r.abs().max())), (r, g)


def test_implementation_host_and_qemu():
    """Portable kernels: host, Cortex-M55 and Cortex-M4, bytes identical to the reference."""
    t = _tester(Idioms)
    on = ("host", "qemu") if shutil.which("qemu-system-arm") and shutil.which("arm-none-eabi-gcc") else ("host",)
    t.test_implementation(on=on, n_inputs=1, targets=["cortex-m55", "cortex-m4"])


@needs_cmsis
@needs_qemu
def test_implementation_cmsis_nn_m55_m4():
    """arm_batch_matmul_s8 (Helium on M55, DSP on M4) where the operands are row-major, the portable
    kernel for multi-head NHWC operands; bytes identical to the reference."""
    t = _tester(Idioms)
    t.test_implementation(on=("host", "qemu"), kernels="cmsis-nn", n_inputs=1, targets=["cortex-m55", "cortex-m4"])
    c = t.program.emit_c(_tmp(), kernels="cmsis-nn").source.read_text()
    assert c.count("arm_batch_matmul_s8(") == 5 and c.count("arm_transpose_s8(") >= 2


def _tmp() -> Path:
    import tempfile

    return Path(tempfile.mkdtemp(prefix="corten_matmul_"))


# ----------------------------------------------------------------------------- CMSIS-NN's own test vectors
def _read_header(path: Path) -> tuple[dict[str, int], list[int]]:
    text = path.read_text()
    defines = {m.group(1): int(m.group(2)) for m in re.finditer(r"#define\s+\w*?_S8_(\w+)\s+(-?\d+)", text)}
    arr = re.search(r"=\s*\{([^}]*)\}", text)
    values = [int(v) for v in arr.group(1).replace("\n", " ").split(",") if v.strip()] if arr else []
    return defines, values


@needs_cmsis
def test_cmsis_nn_batch_matmul_vectors():
    """The reference op reproduces the outputs of CMSIS-NN's batch_matmul_*_s8 unit tests (generated by
    TFLite), read from CMSIS_NN_PATH at test time."""
    root = Path(CMSIS_NN_PATH) / "Tests" / "UnitTest" / "TestCases" / "TestData"
    cases = sorted(p for p in root.glob("batch_matmul_*_s8") if p.is_dir())
    assert cases, f"no batch_matmul_*_s8 test data under {root}"
    for case in cases:
        cfg, _ = _read_header(case / "config_data.h")
        lhs_file = "lhs_transposed_tensor.h" if cfg["ADJ_X"] else "lhs_input_tensor.h"
        rhs_file = "rhs_input_tensor.h" if cfg["ADJ_Y"] else "rhs_transposed_tensor.h"
        _, lhs_v = _read_header(case / lhs_file)
        _, rhs_v = _read_header(case / rhs_file)
        _, want = _read_header(case / "output.h")
        m, n = cfg["OUTPUT_ROWS"], cfg["OUTPUT_COLS"]
        lb, lh, rb, rh = cfg["LHS_BATCH"], cfg["LHS_HEIGHT"], cfg["RHS_BATCH"], cfg["RHS_HEIGHT"]
        k = len(lhs_v) // (lb * lh * m)
        lhs = torch.tensor(lhs_v, dtype=torch.int8).reshape(lb, lh, m, k)
        rhs = torch.tensor(rhs_v, dtype=torch.int8).reshape(rb, rh, n, k)
        got = matmul(lhs, rhs, cfg["LHS_OFFSET"], cfg["RHS_OFFSET"], cfg["OUTPUT_OFFSET"], cfg["OUTPUT_MULTIPLIER"],
                     cfg["OUTPUT_SHIFT"], cfg["ACTIVATION_MIN"], cfg["ACTIVATION_MAX"], True)
        assert got.contiguous().flatten().tolist() == want, case.name


# ----------------------------------------------------------------------------- the zoo's kwt-tiny
def test_kwt_tiny_agrees_with_float():
    """kwt-tiny (2 attention blocks, LayerNorm, GELU MLP): int8 vs float cosine >= 0.98 on 10 random
    inputs; its op counts and byte-exact C runs (host, M3/M4/M7/M55) are in test_zoo_programs.py."""
    from test_zoo_programs import compiled

    from corten.zoo import get_model

    prog, _ = compiled("kwt-tiny")
    model, _ = get_model("kwt-tiny")
    g = torch.Generator().manual_seed(11)
    cosines = []
    for _ in range(10):
        x = torch.randn(1, 49, 10, generator=g)
        with torch.no_grad():
            cosines.append(float(nn.functional.cosine_similarity(prog.run(x).flatten(), model(x).flatten(), dim=0)))
    assert min(cosines) >= 0.98, cosines
