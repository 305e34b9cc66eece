"""``corten_lut_s8`` (src/corten/codegen/kernels/lut.c) byte for byte against ``quantized_lut``,
and a model with table activations run as C on the host and on QEMU (Cortex-M55), in both kernel
flavours (CMSIS-NN has no table kernel: its flavour runs Corten's portable one too)."""
from __future__ import annotations

import ctypes
import random
import subprocess
import warnings

import pytest
import torch
from torch import nn
from conftest import needs_cmsis_nn, needs_gcc

import op_cases as oc
from corten.codegen import KERNELS_DIR
from corten.testing import Tester

pytestmark = needs_gcc
C_CASES = 2000

lut = torch.ops.corten.quantized_lut


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    out = tmp_path_factory.mktemp("lut") / "liblut.so"
    subprocess.run(["gcc", "-std=c99", "-O2", "-Wall", "-Wextra", "-Werror", "-fsanitize=undefined",
                    "-fno-sanitize-recover", "-shared", "-fPIC", "-I", str(KERNELS_DIR),
                    str(KERNELS_DIR / "lut.c"), "-o", str(out)], check=True, capture_output=True, text=True)
    so = ctypes.CDLL(str(out))
    so.corten_lut_s8.restype = ctypes.c_int
    so.corten_lut_s8.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int32]
    return so


def _c_bytes(t: torch.Tensor) -> bytes:
    """The tensor's bytes as the C side holds them (4-D activations: NHWC)."""
    if t.dim() == 4:
        t = t.permute(0, 2, 3, 1)
    return t.contiguous().numpy().tobytes()


def _run_c(lib, x: torch.Tensor, table: torch.Tensor, in_place: bool = False) -> bytes:
    data = _c_bytes(x)
    inp = ctypes.create_string_buffer(data, len(data))
    tab = ctypes.create_string_buffer(table.numpy().tobytes(), 256)
    out = inp if in_place else ctypes.create_string_buffer(len(data))
    assert lib.corten_lut_s8(inp, tab, out, len(data)) == 0
    return out.raw[:len(data)]


def test_c_kernel_matches_reference(lib):
    rng = random.Random(9300)
    for i in range(C_CASES):
        shape = tuple(rng.randint(1, 6) for _ in range(rng.choice((1, 2, 4, 4))))
        x = oc.int8_tensor(rng, shape)
        if x.dim() == 4:
            x = x.contiguous(memory_format=torch.channels_last)  # graph activations are channels_last
        table = torch.tensor([rng.randint(-128, 127) for _ in range(256)], dtype=torch.int8)
        want = _c_bytes(lut(x, table))
        assert _run_c(lib, x, table, in_place=rng.random() < 0.3) == want, f"case {i}"


def test_c_kernel_all_256_inputs(lib):
    x = torch.arange(-128, 128, dtype=torch.int8)
    table = torch.tensor([(7 * k + 3) % 256 - 128 for k in range(256)], dtype=torch.int8)
    assert _run_c(lib, x, table) == _c_bytes(lut(x, table))


def test_c_kernel_rejects_bad_arguments(lib):
    buf = ctypes.create_string_buffer(256)
    assert lib.corten_lut_s8(None, buf, buf, 4) == -1
    assert lib.corten_lut_s8(buf, None, buf, 4) == -1
    assert lib.corten_lut_s8(buf, buf, None, 4) == -1
    assert lib.corten_lut_s8(buf, buf, buf, -1) == -1
    assert lib.corten_lut_s8(buf, buf, buf, 0) == 0


# ----------------------------------------------------------------------------- whole programs
class ConvHardswishPoolLinearSigmoid(nn.Module):
    """conv -> hardswish -> avg pool -> flatten -> linear -> sigmoid."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.pool = nn.AvgPool2d(2)
        self.fc = nn.Linear(8 * 4 * 4, 6)

    def forward(self, x):
        y = self.pool(nn.functional.hardswish(self.conv(x)))
        return torch.sigmoid(self.fc(torch.flatten(y, 1)))


@pytest.fixture(scope="module")
def tester():
    warnings.simplefilter("ignore")
    torch.manual_seed(0)
    t = Tester(ConvHardswishPoolLinearSigmoid().eval(), (torch.randn(1, 3, 8, 8),)).lower()
    assert t.program.op_counts() == {"quantize_per_tensor": 1, "quantized_conv2d": 1, "quantized_lut": 2,
                                     "quantized_avg_pool2d": 1, "quantized_linear": 1, "dequantize_per_tensor": 1}
    return t


def test_model_byte_exact_on_host_and_qemu_m55(tester):
    results = tester.test_implementation(on=("host", "qemu"), n_inputs=2)
    assert {(r[0], r[1]) for r in results} == {("host", None), ("qemu", "cortex-m55")}


def test_cmsis_nn_flavour_runs_the_portable_kernel(tester, tmp_path):
    """The "cmsis-nn" library calls corten_lut_s8 and ships lut.c with the Corten headers."""
    lib = tester.program.emit_c(tmp_path, kernels="cmsis-nn")
    source = lib.source.read_text()
    assert source.count("corten_lut_s8(") == 2 and '#include "corten_kernels/corten_kernels.h"' in source
    assert "arm_convolve_wrapper_s8" in source or "arm_convolve" in source
    names = {p.name for p in lib.kernel_files}
    assert {"lut.c", "corten_kernels.h", "corten_fixed_point.h"} <= names
    assert "conv.c" not in names  # the convolution still runs CMSIS-NN's kernel
    assert all(p.exists() for p in lib.kernel_files)


@needs_cmsis_nn
def test_cmsis_nn_flavour_byte_exact_on_host_and_qemu_m55(tester):
    tester.test_implementation(on=("host", "qemu"), kernels="cmsis-nn", n_inputs=2)
