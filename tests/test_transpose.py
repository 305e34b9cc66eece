"""``corten.quantized_transpose``: reference kernel vs a naive oracle, the logical -> byte
permutation (NHWC bytes of 4-D tensors) and its simplification, opcheck, argument errors, the
lowering of ``permute`` / ``transpose`` / ``t`` (dialect tests; size-1 moves become reshapes), the
portable C kernel byte for byte, and conv -> permute -> reshape -> linear on the host and QEMU.

Case counts: PERMUTE_CASES random permutations of 1-D to 6-D tensors vs the oracle; BYTE_CASES
byte-permutation checks; C_CASES through ``corten_transpose_s8``.
"""
from __future__ import annotations

import ctypes
import os
import random
import shutil
import subprocess

import numpy as np
import pytest
import torch
from torch import nn
from conftest import needs_cmsis_nn

import naive_data_movement as naive
import op_cases as oc
from corten.codegen import KERNELS_DIR
from corten.ops import CortenOpError
from corten.ops.transpose import byte_permutation, keeps_logical_order, simplify_permutation, storage_dim_order
from corten.testing import Tester

PERMUTE_CASES = 1500
BYTE_CASES = 1500
C_CASES = 400
transpose = torch.ops.corten.quantized_transpose


def _random_case(rng: random.Random, max_rank: int = 6) -> tuple[torch.Tensor, list[int]]:
    rank = rng.randint(1, max_rank)
    size_cap = 4 if rank <= 4 else 3
    shape = [rng.choice((1, rng.randint(1, size_cap), rng.randint(2, size_cap))) for _ in range(rank)]
    perm = list(range(rank))
    rng.shuffle(perm)
    x = oc.int8_tensor(rng, shape)
    return (oc.maybe_channels_last(rng, x) if rank == 4 else x), perm


def _storage(t: torch.Tensor) -> list[int]:
    return naive.storage_bytes(t.contiguous().flatten().tolist(), list(t.shape))


# ----------------------------------------------------------------------------- reference kernel
def test_transpose_matches_naive():
    rng = random.Random(9500)
    for i in range(PERMUTE_CASES):
        x, perm = _random_case(rng)
        out = transpose(x, perm)
        want, want_shape = naive.permute(x.contiguous().flatten().tolist(), list(x.shape), perm)
        assert list(out.shape) == want_shape and out.dtype == torch.int8
        assert out.flatten().tolist() == want, f"case {i}: {tuple(x.shape)} {perm}"
        if out.dim() == 4:
            assert oc.is_channels_last(out)


def _flat_shape(rng: random.Random, numel: int) -> list[int]:
    """A random non-4-D shape of ``numel`` elements (what a flatten after the permute asks for)."""
    divisors = [d for d in range(1, numel + 1) if numel % d == 0]
    a = rng.choice(divisors)
    return rng.choice(([numel], [1, numel], [a, numel // a], [1, a, numel // a]))


def test_transpose_with_shape_matches_naive():
    """``shape``: the permuted values reshaped (row-major), e.g. a channels-last flatten."""
    rng = random.Random(9502)
    for i in range(PERMUTE_CASES // 3):
        x, perm = _random_case(rng)
        shape = _flat_shape(rng, x.numel())
        out = transpose(x, perm, shape)
        want, _ = naive.permute(x.contiguous().flatten().tolist(), list(x.shape), perm)
        assert list(out.shape) == shape and out.is_contiguous()
        assert out.flatten().tolist() == want, f"case {i}: {tuple(x.shape)} {perm} {shape}"


def test_byte_permutation_moves_storage_bytes():
    """Applying the simplified (dims, perm) to the input's C bytes gives the output's C bytes."""
    rng = random.Random(9501)
    for i in range(BYTE_CASES):
        x, perm = _random_case(rng)
        dims, bperm = byte_permutation(list(x.shape), perm)
        assert all(d > 1 for d in dims) and sorted(bperm) == list(range(len(dims)))
        assert all(bperm[j + 1] != bperm[j] + 1 for j in range(len(bperm) - 1)), "unmerged adjacent dims"
        src = np.array(_storage(x), dtype=np.int8)
        got = src.reshape(dims).transpose(bperm).reshape(-1).tolist() if dims else src.tolist()
        assert got == _storage(transpose(x, perm)), f"case {i}: {tuple(x.shape)} {perm} -> {dims} {bperm}"
        dims, bperm = byte_permutation(list(x.shape), perm, flattened=True)
        got = src.reshape(dims).transpose(bperm).reshape(-1).tolist() if dims else src.tolist()
        assert got == transpose(x, perm, [x.numel()]).tolist(), f"flattened case {i}"


@pytest.mark.parametrize("shape, perm, dims, bperm", [
    ([1, 4, 3, 5], [0, 2, 3, 1], [3, 20], [1, 0]),  # NCHW -> NHWC logical: bytes (H, W*C) -> (W*C, H)
    ([1, 4, 3, 5], [0, 1, 3, 2], [3, 5, 4], [1, 0, 2]),  # swap H and W: pixels transposed, channels kept
    ([2, 3], [1, 0], [2, 3], [1, 0]),
    ([2, 1, 3], [1, 0, 2], [6], [0]),  # only a size-1 dim moves: a copy
    ([1, 4, 1, 1], [0, 2, 3, 1], [4], [0]),
])
def test_byte_permutation_examples(shape, perm, dims, bperm):
    assert byte_permutation(shape, perm) == (dims, bperm)


def test_helpers():
    assert storage_dim_order(4) == (0, 2, 3, 1) and storage_dim_order(3) == (0, 1, 2)
    assert simplify_permutation([2, 3, 4], [0, 1, 2]) == ([24], [0])
    assert simplify_permutation([1, 1], [1, 0]) == ([], [])
    assert keeps_logical_order([1, 4, 1, 1], [0, 2, 3, 1]) and not keeps_logical_order([1, 4, 2, 1], [0, 2, 3, 1])


@pytest.mark.parametrize("seed", range(3))
def test_opcheck_transpose(seed):
    x, perm = _random_case(random.Random(seed), max_rank=4)
    torch.library.opcheck(transpose.default, (x, perm))


@pytest.mark.parametrize("x, perm, arg", [
    (torch.zeros((2, 3), dtype=torch.uint8), [1, 0], "input"),
    (torch.zeros((1,) * 7, dtype=torch.int8), list(range(7)), "input"),
    (torch.zeros((2, 3), dtype=torch.int8), [0], "perm"),
    (torch.zeros((2, 3), dtype=torch.int8), [1, 1], "perm"),
    (torch.zeros((2, 3), dtype=torch.int8), [-1, 0], "perm"),
])
def test_transpose_bad_arguments(x, perm, arg):
    with pytest.raises(CortenOpError, match=rf"quantized_transpose.*'{arg}'"):
        transpose(x, perm)


@pytest.mark.parametrize("shape", [[1, 2, 3, 4], [25], [0, 24]])
def test_transpose_bad_shape(shape):
    with pytest.raises(CortenOpError, match=r"quantized_transpose.*'shape'"):
        transpose(torch.zeros((1, 2, 3, 4), dtype=torch.int8), [0, 2, 3, 1], shape)


def test_transpose_good_arguments_are_accepted():
    assert transpose(torch.zeros((2, 3, 4), dtype=torch.int8), [2, 0, 1]).shape == (4, 2, 3)


# ----------------------------------------------------------------------------- lowering (dialect)
class ConvPermuteLinear(nn.Module):
    """conv -> permute to NHWC logical -> flatten -> linear (a channels-last head)."""

    def __init__(self, h=5, w=4):
        super().__init__()
        self.conv, self.fc = nn.Conv2d(3, 4, 3, padding=1), nn.Linear(4 * h * w, 6)

    def forward(self, x):
        return self.fc(self.conv(x).permute(0, 2, 3, 1).reshape(1, -1))


def test_dialect_conv_permute_reshape_linear():
    torch.manual_seed(0)
    t = Tester(ConvPermuteLinear().eval(), (torch.randn(1, 3, 5, 4),))
    t.test_dialect({"aten.permute.default": 1}, {"quantize_per_tensor": 1, "quantized_conv2d": 1,
                                                 "quantized_transpose": 1, "quantized_linear": 1,
                                                 "dequantize_per_tensor": 1}, qtol=1)
    # the permute and the flatten are one transpose to [1, 80]; on NHWC bytes it is a plain copy
    graph = t.program.ep.graph
    assert not [n for n in graph.nodes if n.target == torch.ops.aten.reshape.default]
    (node,) = [n for n in graph.nodes if n.target == transpose.default]
    assert node.args[1:] == ([0, 2, 3, 1], [1, 80])
    assert byte_permutation([1, 4, 5, 4], [0, 2, 3, 1], flattened=True) == ([80], [0])


def test_permute_read_by_a_conv_and_a_flatten_is_not_fused():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b, self.fc = nn.Conv2d(3, 4, 1), nn.Conv2d(5, 2, 1), nn.Linear(4 * 5 * 3, 2)

        def forward(self, x):
            y = self.a(x).permute(0, 3, 2, 1)  # [1, 5, 3, 4]
            return self.fc(y.reshape(1, -1)) + self.b(y).mean()

    torch.manual_seed(9)
    t = Tester(Net().eval(), (torch.randn(1, 3, 3, 5),)).lower()
    (node,) = [n for n in t.program.ep.graph.nodes if n.target == transpose.default]
    assert len(node.args) == 2 or node.args[2] is None


class TransposeHWTokens(nn.Module):
    """conv -> swap H and W (3-D byte transpose) -> conv -> [1, tokens, features] (2-D) -> linear."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Conv2d(2, 3, 1), nn.Conv2d(3, 4, (1, 3))
        self.fc = nn.Linear(4, 5)

    def forward(self, x):
        y = self.b(self.a(x).transpose(2, 3))  # [1, 4, 6, 3]
        y = y.flatten(2).transpose(1, 2)  # [1, 18, 4]: tokens x features
        return self.fc(y)


def test_dialect_transpose_hw_between_convs_and_3d_t():
    torch.manual_seed(1)
    t = Tester(TransposeHWTokens().eval(), (torch.randn(1, 2, 5, 6),))
    t.test_dialect({"aten.transpose.int": 2}, {"quantize_per_tensor": 1, "quantized_conv2d": 2,
                                               "quantized_transpose": 1, "quantized_strided_copy": 1,
                                               "quantized_linear": 1, "dequantize_per_tensor": 1}, qtol=1)
    # flatten(2) of the NHWC conv output then transpose(1, 2) is [1, H*W, C] row-major: the NHWC bytes
    # themselves, so the flatten and the transpose compose into one strided copy that is a view (no C code)
    from corten.memory.views import alias_offset

    (copy,) = [n for n in t.program.ep.graph.nodes if n.target == torch.ops.corten.quantized_strided_copy.default]
    assert alias_offset(copy) == 0
    assert copy.name not in t.program.memory.step_nodes


def test_dialect_permute_of_size_one_dims_is_a_reshape():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv, self.fc = nn.Conv2d(3, 8, 6), nn.Linear(8, 2)  # conv output [1, 8, 1, 1]

        def forward(self, x):
            return self.fc(self.conv(x).permute(0, 2, 3, 1).squeeze(1).squeeze(1))

    torch.manual_seed(2)
    t = Tester(Net().eval(), (torch.randn(1, 3, 6, 6),))
    t.test_dialect({"aten.permute.default": 1}, {"quantize_per_tensor": 1, "quantized_conv2d": 1, "quantized_linear": 1,
                                                 "dequantize_per_tensor": 1}, qtol=1)


# ----------------------------------------------------------------------------- C kernel
@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    if shutil.which("gcc") is None:
        pytest.skip("needs gcc")
    out = tmp_path_factory.mktemp("transpose") / "libtranspose.so"
    subprocess.run(["gcc", "-std=c99", "-O2", "-Wall", "-Wextra", "-Werror", "-shared", "-fPIC", "-I",
                    str(KERNELS_DIR), str(KERNELS_DIR / "transpose.c"), "-o", str(out)], check=True,
                   capture_output=True)
    return ctypes.CDLL(str(out))


def _i32(values):
    return (ctypes.c_int32 * max(1, len(values)))(*values)


def test_c_transpose_matches_reference(lib):
    rng = random.Random(9600)
    for i in range(C_CASES):
        x, perm = _random_case(rng)
        flattened = rng.random() < 0.3
        want = transpose(x, perm, [x.numel()] if flattened else None)
        dims, bperm = byte_permutation(list(x.shape), perm, flattened)
        dims, bperm = (dims, bperm) if dims else ([1], [0])
        src = _storage(x)
        out = (ctypes.c_int8 * want.numel())()
        assert lib.corten_transpose_s8(len(dims), _i32(dims), _i32(bperm), (ctypes.c_int8 * len(src))(*src), out) == 0
        assert list(out) == _storage(want), f"case {i}: {tuple(x.shape)} {perm}"


def test_c_transpose_unsimplified_permutations(lib):
    """The kernel does not rely on the simplification: raw storage dims with size-1 and mergeable dims."""
    rng = random.Random(9601)
    for _ in range(100):
        rank = rng.randint(1, 6)
        dims = [rng.randint(1, 3) for _ in range(rank)]
        perm = list(range(rank))
        rng.shuffle(perm)
        src = np.array([rng.randint(-128, 127) for _ in range(int(np.prod(dims)))], dtype=np.int8)
        out = (ctypes.c_int8 * src.size)()
        assert lib.corten_transpose_s8(rank, _i32(dims), _i32(perm), (ctypes.c_int8 * src.size)(*src.tolist()),
                                       out) == 0
        assert list(out) == src.reshape(dims).transpose(perm).reshape(-1).tolist()


def test_c_transpose_rejects_bad_arguments(lib):
    x, out = (ctypes.c_int8 * 6)(), (ctypes.c_int8 * 6)()
    assert lib.corten_transpose_s8(2, _i32([2, 3]), _i32([1, 0]), x, out) == 0
    assert lib.corten_transpose_s8(2, _i32([2, 3]), _i32([1, 1]), x, out) == -1
    assert lib.corten_transpose_s8(2, _i32([2, 3]), _i32([2, 0]), x, out) == -1
    assert lib.corten_transpose_s8(0, _i32([2, 3]), _i32([1, 0]), x, out) == -1
    assert lib.corten_transpose_s8(7, _i32([1] * 7), _i32(list(range(7))), x, out) == -1
    assert lib.corten_transpose_s8(2, _i32([2, 3]), _i32([1, 0]), x, x) == -1
    assert lib.corten_transpose_s8(2, _i32([2, 3]), _i32([1, 0]), None, out) == -1


# ----------------------------------------------------------------------------- C library end to end
def test_implementation_conv_permute_reshape_linear_host_and_qemu():
    torch.manual_seed(3)
    t = Tester(ConvPermuteLinear().eval(), (torch.randn(1, 3, 5, 4),))
    results = t.test_implementation(on=("host", "qemu"), n_inputs=2)
    assert {(r[0], r[1]) for r in results} == {("host", None), ("qemu", "cortex-m55")}


@needs_cmsis_nn
@pytest.mark.parametrize("model, shape", [(ConvPermuteLinear, (1, 3, 5, 4)), (TransposeHWTokens, (1, 2, 5, 6))],
                         ids=["2-D", "3-D"])
def test_implementation_cmsis_nn_arm_transpose_s8(model, shape, tmp_path):
    torch.manual_seed(3)
    t = Tester(model().eval(), (torch.randn(*shape),))
    t.test_implementation(on=("host", "qemu"), kernels="cmsis-nn", n_inputs=1)
    assert "arm_transpose_s8(" in t.program.emit_c(tmp_path, kernels="cmsis-nn").source.read_text()


class SixDPermute(nn.Module):
    """linear -> 6-D view -> permute of five dims > 1 -> flatten -> linear."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(4, 48), nn.Linear(48, 3)

    def forward(self, x):
        y = self.a(x).reshape(1, 2, 3, 2, 2, 2).permute(0, 5, 3, 1, 4, 2)
        return self.b(y.reshape(1, 48))


def test_six_dim_permute_portable_on_host_and_in_the_cmsis_nn_flavour(tmp_path):
    """Five byte dims: arm_transpose_s8 takes 4, so the CMSIS-NN library calls Corten's portable kernel."""
    torch.manual_seed(8)
    t = Tester(SixDPermute().eval(), (torch.randn(1, 4),))
    t.test_dialect({"aten.permute.default": 1}, {"quantize_per_tensor": 1, "quantized_linear": 2,
                                                 "quantized_transpose": 1, "dequantize_per_tensor": 1}, qtol=1)
    assert byte_permutation([1, 2, 3, 2, 2, 2], [0, 5, 3, 1, 4, 2]) == ([2, 3, 2, 2, 2], [4, 2, 0, 3, 1])
    t.test_implementation(on=("host",), n_inputs=1)
    lib = t.program.emit_c(tmp_path, kernels="cmsis-nn")
    assert "corten_transpose_s8(5, dims, perm" in lib.source.read_text()
    assert "arm_transpose_s8" not in lib.source.read_text()
    assert tmp_path / "corten_kernels" / "transpose.c" in lib.kernel_files


# ----------------------------------------------------------------------------- CMSIS-NN arm_transpose_s8
class CmsisDims(ctypes.Structure):
    _fields_ = [("n", ctypes.c_int32), ("h", ctypes.c_int32), ("w", ctypes.c_int32), ("c", ctypes.c_int32)]


class CmsisTransposeParams(ctypes.Structure):
    _fields_ = [("num_dims", ctypes.c_int32), ("permutations", ctypes.POINTER(ctypes.c_uint32))]


@pytest.fixture(scope="module")
def cmsis_transpose_lib(tmp_path_factory):
    root = os.environ.get("CMSIS_NN_PATH")
    if not root or shutil.which("gcc") is None:
        pytest.skip("set CMSIS_NN_PATH to a CMSIS-NN source tree (and install gcc)")
    out = tmp_path_factory.mktemp("cmsis_transpose") / "libcmsistranspose.so"
    subprocess.run(["gcc", "-std=c99", "-O1", "-shared", "-fPIC", "-I", os.path.join(root, "Include"),
                    os.path.join(root, "Source", "TransposeFunctions", "arm_transpose_s8.c"), "-o", str(out)],
                   check=True, capture_output=True)
    return ctypes.CDLL(str(out))


def test_cmsis_transpose_plan_examples():
    from corten.ops.transpose import cmsis_transpose_plan

    assert cmsis_transpose_plan([1, 4, 3, 5], [0, 2, 3, 1]) == ([3, 20, 1, 1], [20, 3, 1, 1], [1, 0])
    assert cmsis_transpose_plan([1, 4, 1, 1], [0, 2, 3, 1]) == ([4, 1, 1, 1], [4, 1, 1, 1], [0])
    with pytest.raises(ValueError, match="at most 4"):
        cmsis_transpose_plan([1, 2, 3, 2, 2, 2], [0, 5, 3, 1, 4, 2])


def test_cmsis_arm_transpose_s8_matches_reference(cmsis_transpose_lib):
    """arm_transpose_s8 driven by cmsis_transpose_plan reproduces the reference op's bytes (1 to 4
    byte dims; tensors of up to 5 dimensions)."""
    from corten.ops.transpose import cmsis_transpose_plan

    rng = random.Random(9800)
    checked = 0
    while checked < 300:
        x, perm = _random_case(rng, max_rank=5)
        try:
            in_dims, out_dims, bperm = cmsis_transpose_plan(list(x.shape), perm)
        except ValueError:
            continue
        want = transpose(x, perm)
        src = _storage(x)
        out = (ctypes.c_int8 * want.numel())()
        p = (ctypes.c_uint32 * len(bperm))(*bperm)
        params = CmsisTransposeParams(len(bperm), ctypes.cast(p, ctypes.POINTER(ctypes.c_uint32)))
        assert cmsis_transpose_lib.arm_transpose_s8((ctypes.c_int8 * len(src))(*src), out,
                                                    ctypes.byref(CmsisDims(*in_dims)), ctypes.byref(CmsisDims(*out_dims)),
                                                    ctypes.byref(params)) == 0
        assert list(out) == _storage(want), f"{tuple(x.shape)} {perm} -> {in_dims} {bperm}"
        checked += 1
