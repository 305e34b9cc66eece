"""Softmax over any dim and ``quantized_log_softmax`` (TFLite's int8 reference LogSoftmax): reference
kernels against ``naive_softmax.py``, the strided portable C kernels against the references (host),
the lowering (any dim, 2-D to 4-D) and the emitted C on the host and QEMU Cortex-M55/M4 (one
program, one run per board); CMSIS-NN's arm_softmax_s8 where rows are contiguous when
CMSIS_NN_PATH is set."""
from __future__ import annotations

import ctypes
import math
import random
import shutil
import subprocess
import warnings

import pytest
import torch
from torch import nn
from conftest import CMSIS_NN_PATH

import corten.ops  # noqa: F401
import naive_softmax as naive
from corten.codegen import KERNELS_DIR
from corten.ops.checks import CortenOpError
from corten.ops.softmax import MAX_ROW_SIZE, log_softmax_params, row_geometry, softmax_params
from corten.testing.tester import Tester
from test_softmax import random_row, random_row_size

softmax = torch.ops.corten.quantized_softmax
log_softmax = torch.ops.corten.quantized_log_softmax
GCC = shutil.which("gcc")
HAVE_QEMU = shutil.which("qemu-system-arm") is not None and shutil.which("arm-none-eabi-gcc") is not None


def _scale(rng: random.Random) -> float:
    return math.exp(rng.uniform(math.log(2e-3), math.log(4.0)))


def _lp(scale: float) -> tuple[int, int, int, int, int]:
    p = log_softmax_params(scale)
    return p.input_multiplier, p.input_left_shift, p.reverse_multiplier, p.reverse_shift, p.diff_min


# ----------------------------------------------------------------------------- log_softmax reference
def test_params_match_tflite_preparation():
    rng = random.Random(1)
    for _ in range(300):
        s = _scale(rng)
        assert _lp(s) == naive.tflite_log_softmax_params(s), s


def test_log_x_matches_naive_on_every_sum_shape():
    """log_x_for_x_greater_than_or_equal_to_1 over sums from the smallest (one term) to the largest."""
    from corten.ops.softmax import log_x_ge_1

    rng = random.Random(2)
    values = [1 << 19, (1 << 19) + 1, (1 << 31) - 1, 1 << 30, 3 << 27] + [rng.randint(1 << 19, (1 << 31) - 1)
                                                                           for _ in range(3000)]
    got = log_x_ge_1(torch.tensor(values, dtype=torch.int64)).tolist()
    assert got == [naive.log_x_ge_1(v) for v in values]


def test_reference_matches_naive_rows():
    rng = random.Random(3)
    for _ in range(120):
        n = random_row_size(rng) if rng.random() < 0.3 else rng.randint(1, 64)
        params = _lp(_scale(rng))
        rows = [random_row(rng, n) for _ in range(rng.randint(1, 3))]
        got = log_softmax(torch.tensor(rows, dtype=torch.int8), *params).tolist()
        assert got == [naive.log_softmax_row(r, *params) for r in rows], (params, rows)


def test_log_softmax_close_to_float():
    """Within one output step (1/16) of the float log-softmax (clamped at -255/16)."""
    rng = random.Random(4)
    for _ in range(40):
        s = _scale(rng)
        x = torch.randint(-128, 128, (4, rng.randint(2, 50)), dtype=torch.int8)
        got = (log_softmax(x, *_lp(s)).double() - 127) / 16
        want = torch.log_softmax(x.double() * s, dim=-1).clamp(min=-255 / 16)
        assert float((got - want).abs().max()) <= 1 / 16 + 1e-9, s


@pytest.mark.parametrize("op,params", [(softmax, (1 << 30, 22, -60)), (log_softmax, (1 << 30, 22, 1 << 30, -20, -60))])
def test_any_dim_equals_rows_of_moved_dim(op, params):
    for shape in ((3, 4, 5), (2, 3, 4, 5), (6, 7)):
        x = torch.randint(-128, 128, shape, dtype=torch.int8)
        if len(shape) == 4:
            x = x.contiguous(memory_format=torch.channels_last)
        for dim in range(-len(shape), len(shape)):
            got = op(x, *params, dim)
            moved = x.movedim(dim, -1)
            want = op(moved.reshape(-1, moved.shape[-1]), *params).reshape(moved.shape).movedim(-1, dim)
            assert torch.equal(got, want), (shape, dim)
            if len(shape) == 4:
                assert got.is_contiguous(memory_format=torch.channels_last)


@pytest.mark.parametrize("arg,value", [("reverse_shift", 1), ("reverse_multiplier", 7), ("dim", 2),
                                       ("input", torch.zeros((1, MAX_ROW_SIZE + 1), dtype=torch.int8))])
def test_log_softmax_bad_arguments(arg, value):
    args = dict(input=torch.zeros((2, 5), dtype=torch.int8), input_multiplier=1 << 30, input_left_shift=20,
                reverse_multiplier=1 << 30, reverse_shift=-3, diff_min=-100, dim=-1)
    args[arg] = value
    with pytest.raises(CortenOpError, match=rf"quantized_log_softmax.*'{arg}'"):
        log_softmax(**args)


def test_opcheck():
    x = torch.randint(-128, 128, (2, 3, 4, 5), dtype=torch.int8).contiguous(memory_format=torch.channels_last)
    torch.library.opcheck(log_softmax.default, (x, *_lp(0.1), 1))
    torch.library.opcheck(softmax.default, (x, 1 << 30, 22, -60, 2))


def test_row_geometry():
    assert row_geometry((2, 3, 4, 5), 1) == (40, 3, 1)  # channels innermost in NHWC
    assert row_geometry((2, 3, 4, 5), 3) == (8, 5, 3)
    assert row_geometry((2, 3, 4, 5), 2) == (2, 4, 15)
    assert row_geometry((3, 4, 5), 1) == (3, 4, 5)
    assert row_geometry((3, 4, 5), -1) == (12, 5, 1)


# ----------------------------------------------------------------------------- portable C kernels (host)
@pytest.fixture(scope="module")
def portable(tmp_path_factory):
    if GCC is None:
        pytest.skip("needs gcc")
    out = tmp_path_factory.mktemp("lsm") / "libsoftmax.so"
    subprocess.run([GCC, "-std=c99", "-O2", "-shared", "-fPIC", "-Wall", "-Wextra", "-Werror", f"-I{KERNELS_DIR}",
                    str(KERNELS_DIR / "softmax.c"), "-o", str(out)], check=True, capture_output=True, text=True)
    return ctypes.CDLL(str(out))


def _storage(t: torch.Tensor) -> bytes:
    return (t.permute(0, 2, 3, 1) if t.dim() == 4 else t).contiguous().numpy().tobytes()


def test_portable_strided_kernels_match_reference(portable):
    rng = random.Random(6)
    for _ in range(150):
        rank = rng.randint(2, 4)
        shape = [rng.randint(1, 5) for _ in range(rank)]
        dim = rng.randrange(rank)
        shape[dim] = rng.choice([1, 2, 7, 33, 130])
        x = torch.randint(-128, 128, shape, dtype=torch.int8)
        outer, n, inner = row_geometry(shape, dim)
        src = _storage(x)
        dst = (ctypes.c_int8 * x.numel())()
        s = _scale(rng)
        p = softmax_params(s)
        assert portable.corten_softmax_strided_s8(src, outer, n, inner, p.input_multiplier, p.input_left_shift,
                                                  p.diff_min, dst) == 0
        assert bytes(dst) == _storage(softmax(x, p.input_multiplier, p.input_left_shift, p.diff_min, dim))
        lp = _lp(s)
        assert portable.corten_log_softmax_s8(src, outer, n, inner, *lp, dst) == 0
        assert bytes(dst) == _storage(log_softmax(x, *lp, dim)), (shape, dim, s)


def test_portable_log_softmax_long_rows(portable):
    rng = random.Random(7)
    for n in (511, 1000, MAX_ROW_SIZE):
        x = torch.tensor([[rng.choice((126, 127)) for _ in range(n)], [rng.randint(-128, 127) for _ in range(n)]],
                         dtype=torch.int8)
        lp = _lp(0.02)
        dst = (ctypes.c_int8 * x.numel())()
        assert portable.corten_log_softmax_s8(_storage(x), 2, n, 1, *lp, dst) == 0
        assert bytes(dst) == _storage(log_softmax(x, *lp))


def test_portable_log_softmax_rejects_bad_arguments(portable):
    buf = (ctypes.c_int8 * 8)()
    assert portable.corten_log_softmax_s8(buf, 1, 4, 1, 1 << 30, 20, 1 << 30, 1, -10, buf) != 0  # reverse_shift > 0
    assert portable.corten_log_softmax_s8(buf, 1, 4, 0, 1 << 30, 20, 1 << 30, -3, -10, buf) != 0  # inner 0
    assert portable.corten_softmax_strided_s8(None, 1, 4, 1, 1 << 30, 20, -10, buf) != 0


# ----------------------------------------------------------------------------- through the compiler
class AnyDim(nn.Module):
    """softmax / log_softmax over several dims of 2-D, 3-D and 4-D activations, in one program."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(12, 10)
        self.conv = nn.Conv2d(3, 6, 1)

    def forward(self, x, img):  # x [1, 5, 12], img [1, 3, 4, 4]
        y = self.fc(x)
        c = self.conv(img)
        return (y.softmax(dim=1), torch.log_softmax(y, dim=-1), torch.log_softmax(y, dim=1),
                c.softmax(dim=1), c.softmax(dim=-1), torch.log_softmax(c, dim=1), y.view(5, 10).log_softmax(0))


def _tester(target="cortex-m55") -> Tester:
    warnings.simplefilter("ignore")
    torch.manual_seed(0)
    model = AnyDim()
    return Tester(model.eval(), (torch.randn(1, 5, 12), torch.randn(1, 3, 4, 4)), target=target)


def test_dialect_any_dim():
    t = _tester()
    report = t.test_dialect(ops_before={"aten.softmax.int": 3, "aten.log_softmax.int": 4},
                            ops_after={"quantize_per_tensor": 2, "quantized_linear": 1, "quantized_conv2d": 1,
                                       "quantized_softmax": 3, "quantized_log_softmax": 4, "dequantize_per_tensor": 7},
                            qtol=1)
    assert report.cosine_vs_float > 0.99
    outs = t.program.outputs
    assert [(o.scale, o.zero_point) for o in outs[1:3]] == [(1 / 16, 127)] * 2


def test_implementation_host_and_qemu():
    on = ("host", "qemu") if HAVE_QEMU else ("host",)
    _tester().test_implementation(on=on, n_inputs=1, targets=["cortex-m55", "cortex-m4"])


@pytest.mark.skipif(not (CMSIS_NN_PATH and HAVE_QEMU), reason="set CMSIS_NN_PATH to a CMSIS-NN source tree")
def test_implementation_cmsis_nn():
    """arm_softmax_s8 for the rows contiguous in memory (channel softmax of NHWC, last dim of 3-D);
    the strided portable kernels for the others."""
    t = _tester()
    t.test_implementation(on=("host", "qemu"), kernels="cmsis-nn", n_inputs=1, targets=["cortex-m55", "cortex-m4"])
