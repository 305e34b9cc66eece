"""softmax in C: the portable kernel (kernels/softmax.c) byte for byte against the reference op, and -
when CMSIS_NN_PATH points at a CMSIS-NN tree - CMSIS-NN's own arm_softmax_s8 (its plain-C path,
built on the host) against the portable kernel on many random rows."""
from __future__ import annotations

import ctypes
import random
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
from conftest import CMSIS_NN_PATH, needs_cmsis_nn, needs_gcc

import corten.ops  # noqa: F401
from corten.codegen import KERNELS_DIR
from corten.ops.softmax import MAX_ROW_SIZE, softmax_params
from test_softmax import random_row, random_row_size, random_scale_beta, raw_params

GCC = shutil.which("gcc")
C_CASES = 800
CMSIS_ROWS = 20000

pytestmark = needs_gcc
softmax = torch.ops.corten.quantized_softmax


def _shared_lib(out: Path, sources: list[Path], includes: list[Path], flags: list[str]) -> ctypes.CDLL:
    cmd = [GCC, "-std=c99", "-O2", "-shared", "-fPIC", *flags, *(f"-I{p}" for p in includes),
           *map(str, sources), "-o", str(out)]
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    return ctypes.CDLL(str(out))


@pytest.fixture(scope="module")
def portable(tmp_path_factory):
    """softmax.c alone (it needs only the shared headers), warnings as errors."""
    lib = _shared_lib(tmp_path_factory.mktemp("softmax") / "libsoftmax.so", [KERNELS_DIR / "softmax.c"],
                      [KERNELS_DIR], ["-Wall", "-Wextra", "-Werror"])
    lib.corten_softmax_s8.restype = ctypes.c_int
    lib.corten_softmax_s8.argtypes = [ctypes.c_void_p, ctypes.c_int32, ctypes.c_int32, ctypes.c_int32,
                                      ctypes.c_int32, ctypes.c_int32, ctypes.c_void_p]
    return lib


def _run(fn, x: torch.Tensor, mult: int, shift: int, diff_min: int, expect_status: bool = True):
    """Call ``fn(input, num_rows, row_size, mult, shift, diff_min, output)`` on an int8 [rows, n] tensor."""
    x = x.contiguous()
    rows, n = x.shape
    src = (ctypes.c_int8 * x.numel()).from_buffer_copy(x.numpy().tobytes())
    dst = (ctypes.c_int8 * x.numel())()
    status = fn(src, rows, n, mult, shift, diff_min, dst)
    if expect_status:
        assert status == 0
    return torch.frombuffer(bytearray(dst), dtype=torch.int8).reshape(rows, n), status


def _case(rng: random.Random) -> tuple[torch.Tensor, tuple[int, int, int]]:
    n = random_row_size(rng)
    if rng.random() < 0.7:
        scale, beta = random_scale_beta(rng)
        p = softmax_params(scale, beta)
        params = (p.input_multiplier, p.input_left_shift, p.diff_min)
    else:
        params = raw_params(rng)
    rows = [random_row(rng, n) for _ in range(rng.randint(1, 8 if n <= 64 else 2))]
    return torch.tensor(rows, dtype=torch.int8), params


def test_portable_kernel_matches_reference(portable):
    rng = random.Random(21)
    for _ in range(C_CASES):
        x, params = _case(rng)
        got, _ = _run(portable.corten_softmax_s8, x, *params)
        assert torch.equal(got, softmax(x, *params)), (params, x.tolist())


def test_portable_kernel_long_tied_rows(portable):
    """Rows whose sum of exponentials reaches 2**28 (final shift > 31) and the longest rows."""
    p = softmax_params(0.02)
    params = (p.input_multiplier, p.input_left_shift, p.diff_min)
    rng = random.Random(4)
    for n in (511, 512, 700, 2048, MAX_ROW_SIZE):
        x = torch.tensor([[rng.choice((126, 127)) for _ in range(n)], [7] * n], dtype=torch.int8)
        got, _ = _run(portable.corten_softmax_s8, x, *params)
        assert torch.equal(got, softmax(x, *params)), n


@pytest.mark.parametrize("rows,n,mult,shift,diff_min", [
    (1, 0, 2**30, 20, -10), (1, MAX_ROW_SIZE + 1, 2**30, 20, -10), (-1, 4, 2**30, 20, -10),
    (1, 4, 2**30, -1, -10), (1, 4, 2**30, 32, -10), (1, 4, 2**30, 20, 1), (1, 4, 2**30, 20, -(2**11) - 1),
])
def test_portable_kernel_rejects_bad_arguments(portable, rows, n, mult, shift, diff_min):
    buf = (ctypes.c_int8 * 16)()
    assert portable.corten_softmax_s8(buf, rows, n, mult, shift, diff_min, buf) != 0
    assert portable.corten_softmax_s8(None, 1, 4, 2**30, 20, -10, buf) != 0


# ----------------------------------------------------------------------------- CMSIS-NN itself
@pytest.fixture(scope="module")
def cmsis(tmp_path_factory):
    root = Path(CMSIS_NN_PATH)
    sources = [root / "Source" / "SoftmaxFunctions" / f for f in ("arm_softmax_s8.c", "arm_nn_softmax_common_s8.c")]
    lib = _shared_lib(tmp_path_factory.mktemp("cmsis") / "libcmsis_softmax.so", sources, [root / "Include"], [])
    lib.arm_softmax_s8.restype = None
    lib.arm_softmax_s8.argtypes = [ctypes.c_void_p, ctypes.c_int32, ctypes.c_int32, ctypes.c_int32,
                                   ctypes.c_int32, ctypes.c_int32, ctypes.c_void_p]
    return lib


@needs_cmsis_nn
def test_cmsis_nn_arm_softmax_s8_matches_portable_kernel(cmsis, portable):
    """arm_softmax_s8 (host, plain C path) == corten_softmax_s8 on CMSIS_ROWS random rows of up to 511
    elements (longer rows of near-equal values make CMSIS-NN shift by >= 32: undefined behaviour)."""
    rng = random.Random(99)
    done = 0
    while done < CMSIS_ROWS:
        x, params = _case(rng)
        if x.shape[1] > 511:
            continue
        want, _ = _run(portable.corten_softmax_s8, x, *params)
        got, _ = _run(cmsis.arm_softmax_s8, x, *params, expect_status=False)
        assert torch.equal(got, want), (params, x.tolist())
        done += x.shape[0]
