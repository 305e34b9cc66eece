"""C side of the grouped / transposed / 1-D convolutions.

* the portable kernels ``corten_grouped_conv2d_s8`` and ``corten_conv_transpose2d_s8`` against the
  reference ops byte for byte (gcc -O2 -Werror shared library through ctypes, seeded random cases
  from ``test_conv_variants``);
* ``Tester.test_implementation`` on the host and on QEMU (Cortex-M55) for a small keyword-spotting-
  like 1-D net, a grouped conv net and a transposed conv net (portable kernels);
* the same nets with ``kernels="cmsis-nn"`` when ``CMSIS_NN_PATH`` points at a CMSIS-NN tree
  (``arm_convolve_s8`` with groups, ``arm_transpose_conv_s8``).
"""
from __future__ import annotations

import ctypes
import random
import subprocess

import pytest
import torch
from torch import nn
from conftest import needs_cmsis_nn, needs_gcc, needs_qemu

import corten.ops  # noqa: F401  (registers the ops)
import op_cases as oc
from corten.codegen import KERNELS_DIR
from corten.fixed_point import quantize_multiplier
from corten.testing.tester import Tester
from test_conv_variants_dialect import KwsLike
from test_conv_variants import _random_grouped, _random_transpose

C_CASES = 400


class Dims(ctypes.Structure):
    _fields_ = [("n", ctypes.c_int32), ("h", ctypes.c_int32), ("w", ctypes.c_int32), ("c", ctypes.c_int32)]


class Quant(ctypes.Structure):
    _fields_ = [("multiplier", ctypes.POINTER(ctypes.c_int32)), ("shift", ctypes.POINTER(ctypes.c_int32)),
                ("per_channel", ctypes.c_int32)]


def _int_struct(name, fields):
    return type(name, (ctypes.Structure,), {"_fields_": [(f, ctypes.c_int32) for f in fields]})


ConvParams = _int_struct("ConvParams", ["stride_h", "stride_w", "pad_h", "pad_w", "dilation_h", "dilation_w",
                                        "depth_multiplier", "input_offset", "output_offset", "activation_min",
                                        "activation_max"])
TransposeParams = _int_struct("TransposeParams", ["stride_h", "stride_w", "pad_h", "pad_w", "output_pad_h",
                                                  "output_pad_w", "dilation_h", "dilation_w", "input_offset",
                                                  "output_offset", "activation_min", "activation_max"])


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    out = tmp_path_factory.mktemp("conv_more") / "libconv_more.so"
    sources = [str(KERNELS_DIR / "conv.c"), str(KERNELS_DIR / "conv_transpose.c")]
    subprocess.run(["gcc", "-std=c99", "-O2", "-Wall", "-Wextra", "-Werror", "-shared", "-fPIC", "-I",
                    str(KERNELS_DIR), *sources, "-o", str(out)], check=True, capture_output=True, text=True)
    return ctypes.CDLL(str(out))


def _buf(t: torch.Tensor):
    if t.dim() == 4:
        t = t.permute(0, 2, 3, 1)
    t = t.contiguous()
    ctype = {torch.int8: ctypes.c_int8, torch.int32: ctypes.c_int32}[t.dtype]
    arr = (ctype * t.numel())()
    ctypes.memmove(arr, t.numpy().tobytes(), t.numel() * t.element_size())
    return arr


def _weight_buf(w: torch.Tensor):
    """OHWI weights are already in C order: no NHWC permute."""
    return _buf(w.reshape(-1))


def _c_range_quant(rng: random.Random, case: dict) -> dict:
    """Multipliers/shifts as tests/test_kernels_c.py draws them (realistic, plus 2**31 - 1 with
    shifts <= 2).  The reference ops wrap ``requantized + output_offset`` in int32 the way CMSIS-NN
    does; the portable kernels' ``corten_offset_clamp`` clamps first, so the two differ only when
    that sum overflows (left shifts near 30 with a full multiplier), which these draws avoid."""
    c_out = case["weight"].shape[0]
    pairs = [(2**31 - 1, rng.randint(-31, 2)) if rng.random() < 0.1 else quantize_multiplier(rng.uniform(1e-5, 0.05))
             for _ in range(c_out)]
    return {**case, "mult": [m for m, _ in pairs], "shift": [s for _, s in pairs]}


def _common(case):
    """(quant, bias, input, weight buffers, kept alive) for a case of test_conv_variants."""
    c_out = case["weight"].shape[0]
    mult = torch.tensor(oc.expand(case["mult"], c_out), dtype=torch.int32)
    shift = torch.tensor(oc.expand(case["shift"], c_out), dtype=torch.int32)
    keep = [_buf(mult), _buf(shift)]
    quant = Quant(ctypes.cast(keep[0], ctypes.POINTER(ctypes.c_int32)),
                  ctypes.cast(keep[1], ctypes.POINTER(ctypes.c_int32)), 1)
    bias = _buf(torch.tensor(case["bias"], dtype=torch.int32)) if case["bias"] is not None else None
    return quant, bias, _buf(case["input"]), _weight_buf(case["weight"]), keep


def _expected_bytes(out: torch.Tensor) -> bytes:
    return out.permute(0, 2, 3, 1).contiguous().numpy().tobytes()


@needs_gcc
def test_grouped_kernel_matches_reference(lib):
    rng = random.Random(11)
    for i in range(C_CASES):
        case = _c_range_quant(rng, _random_grouped(rng))
        m, s = oc.qparam_tensors(case["mult"], case["shift"])
        want = torch.ops.corten.quantized_grouped_conv2d(
            case["input"], case["weight"], oc.bias_tensor(case["bias"]), case["stride"], case["padding"],
            case["dilation"], case["groups"], case["input_offset"], case["output_offset"], m, s, *case["act"])
        quant, bias, x, w, _keep = _common(case)
        n, c_in, h, wd = case["input"].shape
        c_out, kh, kw, ck = case["weight"].shape
        out = (ctypes.c_int8 * want.numel())()
        params = ConvParams(*case["stride"], *case["padding"], *case["dilation"], 1, case["input_offset"],
                            case["output_offset"], *case["act"])
        rc = lib.corten_grouped_conv2d_s8(ctypes.byref(params), ctypes.byref(quant), ctypes.byref(Dims(n, h, wd, c_in)),
                                          x, ctypes.byref(Dims(c_out, kh, kw, ck)), w, bias,
                                          ctypes.byref(Dims(n, want.shape[2], want.shape[3], c_out)), out)
        assert rc == 0
        assert bytes(out) == _expected_bytes(want), f"case {i}"


@needs_gcc
def test_transpose_kernel_matches_reference(lib):
    rng = random.Random(12)
    for i in range(C_CASES):
        case = _c_range_quant(rng, _random_transpose(rng))
        m, s = oc.qparam_tensors(case["mult"], case["shift"])
        want = torch.ops.corten.quantized_conv_transpose2d(
            case["input"], case["weight"], oc.bias_tensor(case["bias"]), case["stride"], case["padding"],
            case["output_padding"], case["dilation"], case["input_offset"], case["output_offset"], m, s, *case["act"])
        quant, bias, x, w, _keep = _common(case)
        n, c_in, h, wd = case["input"].shape
        c_out, kh, kw, _ = case["weight"].shape
        out = (ctypes.c_int8 * want.numel())()
        params = TransposeParams(*case["stride"], *case["padding"], *case["output_padding"], *case["dilation"],
                                 case["input_offset"], case["output_offset"], *case["act"])
        rc = lib.corten_conv_transpose2d_s8(ctypes.byref(params), ctypes.byref(quant),
                                            ctypes.byref(Dims(n, h, wd, c_in)), x,
                                            ctypes.byref(Dims(c_out, kh, kw, c_in)), w, bias, ctypes.byref(Dims(n, want.shape[2], want.shape[3], c_out)), out)
        assert rc == 0
        assert bytes(out) == _expected_bytes(want), f"case {i}"


@needs_gcc
def test_kernels_reject_inconsistent_dims(lib):
    case = _random_transpose(random.Random(3))
    quant, bias, x, w, _keep = _common(case)
    n, c_in, h, wd = case["input"].shape
    c_out, kh, kw, _ = case["weight"].shape
    out = (ctypes.c_int8 * 4096)()
    params = TransposeParams(*case["stride"], *case["padding"], *case["output_padding"], *case["dilation"],
                             case["input_offset"], case["output_offset"], *case["act"])
    wrong_out = Dims(n, 1000, 1, c_out)  # not the transposed-conv output size
    assert lib.corten_conv_transpose2d_s8(ctypes.byref(params), ctypes.byref(quant), ctypes.byref(Dims(n, h, wd, c_in)),
                                          x, ctypes.byref(Dims(c_out, kh, kw, c_in)), w, bias,
                                          ctypes.byref(wrong_out), out) != 0
    conv = ConvParams(1, 1, 0, 0, 1, 1, 1, 0, 0, -128, 127)
    grouped_w = _weight_buf(torch.zeros((4, 1, 1, 3), dtype=torch.int8))
    assert lib.corten_grouped_conv2d_s8(ctypes.byref(conv), ctypes.byref(quant), ctypes.byref(Dims(1, 2, 2, 4)),
                                        x, ctypes.byref(Dims(4, 1, 1, 3)), grouped_w, None,  # 3 does not divide 4
                                        ctypes.byref(Dims(1, 2, 2, 4)), out) != 0
    assert lib.corten_grouped_conv2d_s8(ctypes.byref(conv), ctypes.byref(quant), ctypes.byref(Dims(1, 2, 2, 0)),
                                        x, ctypes.byref(Dims(4, 1, 1, 3)), grouped_w, None,  # no input channels:
                                        ctypes.byref(Dims(1, 2, 2, 4)), out) != 0  # refused, no division by 0


# ----------------------------------------------------------------------------- whole programs
def _grouped_net():
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 12, 3, padding=1, groups=4), nn.ReLU6(),
                         nn.Conv2d(12, 6, 1, groups=2))


def _transpose_net():
    return nn.Sequential(nn.Conv2d(3, 8, 3, stride=2, padding=1), nn.ReLU(),
                         nn.ConvTranspose2d(8, 6, 3, stride=2, padding=1, output_padding=1), nn.ReLU(),
                         nn.ConvTranspose2d(6, 4, 3))


def _transpose_fallback_net():
    """output_padding > padding and dilation 2: arm_transpose_conv_s8 cannot, the portable kernel runs."""
    return nn.Sequential(nn.ConvTranspose2d(3, 5, 3, stride=2, output_padding=1), nn.ReLU(),
                         nn.ConvTranspose2d(5, 4, 2, dilation=2))


def _transpose1d_net():
    """A 1-D decoder: conv1d, then conv_transpose1d upsampling (the [N, C, 1, L] view of the 2-D kernel)."""
    return nn.Sequential(nn.Conv1d(4, 8, 3, padding=1), nn.ReLU(), nn.ConvTranspose1d(8, 6, 4, stride=2, padding=1),
                         nn.ReLU(), nn.ConvTranspose1d(6, 3, 3))


NETS = {
    "kws_like": (KwsLike, (1, 10, 24)),
    "transpose1d": (_transpose1d_net, (2, 4, 6)),
    "grouped": (_grouped_net, (1, 3, 8, 8)),
    "transpose": (_transpose_net, (1, 3, 8, 8)),
    "transpose_fallback": (_transpose_fallback_net, (1, 3, 4, 4)),
}


def _tester(name: str) -> Tester:
    build, shape = NETS[name]
    torch.manual_seed(0)
    return Tester(build(), (torch.randn(shape),))


@needs_gcc
@needs_qemu
@pytest.mark.parametrize("name", sorted(NETS))
def test_implementation_portable(name):
    _tester(name).test_implementation(on=("host", "qemu"), n_inputs=2)


@needs_qemu
@needs_cmsis_nn
@pytest.mark.parametrize("name", ["grouped", "transpose", "transpose_fallback", "transpose1d"])
def test_implementation_cmsis_nn(name):
    """arm_convolve_s8 (groups) and arm_transpose_conv_s8 (or the portable fallback) on QEMU (Helium)
    and the host (plain C)."""
    _tester(name).test_implementation(on=("host", "qemu"), kernels="cmsis-nn", n_inputs=1)


def test_cmsis_semantics_match():
    from corten.ops.conv_transpose import cmsis_semantics_match

    assert cmsis_semantics_match((3, 3), (1, 1), (0, 0), (0, 0), (1, 1))
    assert cmsis_semantics_match((3, 3), (2, 2), (1, 1), (1, 1), (1, 1))
    assert not cmsis_semantics_match((3, 3), (2, 2), (0, 0), (1, 0), (1, 1))  # output_padding beyond the crop
    assert not cmsis_semantics_match((3, 3), (1, 1), (0, 0), (0, 0), (2, 1))  # dilation ignored by CMSIS-NN
    assert not cmsis_semantics_match((1, 3), (2, 1), (0, 0), (0, 0), (1, 1))  # kernel smaller than the stride


def test_emitted_calls(tmp_path):
    """The cmsis-nn flavour calls arm_transpose_conv_s8 / arm_convolve_s8 where CMSIS-NN computes the
    op, and Corten's portable kernels (with their source file) where it cannot."""
    for name, want, absent in (("transpose", "arm_transpose_conv_s8(", "corten_conv_transpose2d_s8("),
                               ("transpose_fallback", "corten_conv_transpose2d_s8(", "arm_transpose_conv_s8("),
                               ("grouped", "arm_convolve_s8(", "corten_grouped_conv2d_s8(")):
        t = _tester(name).lower()
        lib = t.program.emit_c(tmp_path / name, kernels="cmsis-nn")
        source = lib.source.read_text()
        assert want in source and absent not in source, name
        assert (name == "transpose_fallback") == ("conv_transpose.c" in {p.name for p in lib.kernel_files}), name
