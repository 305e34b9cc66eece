"""``corten.quantized_cat``: reference kernel vs a naive oracle, the storage-order copy geometry,
opcheck, argument errors, the lowering of ``torch.cat`` (a list argument, shared quantization:
dialect tests), the portable C kernel byte for byte, and two branches -> cat -> conv on the host
and QEMU.

Case counts: CAT_CASES random concatenations (1 to 4 inputs of 1-D to 4-D tensors, any dim) vs the
oracle; C_CAT_CASES through ``corten_concat_s8``.
"""
from __future__ import annotations

import ctypes
import os
import random
import shutil
import subprocess

import pytest
import torch
from torch import nn
from conftest import needs_cmsis_nn

import naive_data_movement as naive
import op_cases as oc
from corten.codegen import KERNELS_DIR
from corten.ops import CortenOpError
from corten.ops.concat import concat_geometry, concat_position
from corten.testing import Tester

CAT_CASES = 1500
C_CAT_CASES = 300
cat = torch.ops.corten.quantized_cat


def _random_case(rng: random.Random) -> tuple[list[torch.Tensor], int]:
    rank = rng.randint(1, 4)
    dim = rng.randrange(rank)
    base = [rng.randint(1, 4) for _ in range(rank)]
    tensors = []
    for _ in range(rng.randint(1, 4)):
        shape = list(base)
        shape[dim] = rng.randint(1, 4)
        t = oc.int8_tensor(rng, shape)
        tensors.append(oc.maybe_channels_last(rng, t) if rank == 4 else t)
    return tensors, dim


def _naive(tensors, dim):
    return naive.cat([t.contiguous().flatten().tolist() for t in tensors], [list(t.shape) for t in tensors], dim)


# ----------------------------------------------------------------------------- reference kernel
def test_cat_matches_naive():
    rng = random.Random(9300)
    for i in range(CAT_CASES):
        tensors, dim = _random_case(rng)
        out = cat(tensors, dim)
        want, want_shape = _naive(tensors, dim)
        assert list(out.shape) == want_shape and out.dtype == torch.int8
        assert out.flatten().tolist() == want, f"case {i}: dim {dim}, shapes {[tuple(t.shape) for t in tensors]}"
        if out.dim() == 4:
            assert oc.is_channels_last(out)


def _apply_geometry(tensors, dim) -> list[int]:
    """Run the byte copies of concat_geometry on the inputs' storage bytes, as the C kernel does."""
    chunks = concat_geometry([list(t.shape) for t in tensors], dim)
    out = [None] * sum(t.numel() for t in tensors)
    for t, c in zip(tensors, chunks):
        src = naive.storage_bytes(t.contiguous().flatten().tolist(), list(t.shape))
        for o in range(c.outer):
            out[o * c.output_inner + c.offset: o * c.output_inner + c.offset + c.inner] = \
                src[o * c.inner:(o + 1) * c.inner]
    return out


def test_geometry_reproduces_storage_bytes():
    rng = random.Random(9301)
    for i in range(600):
        tensors, dim = _random_case(rng)
        want, shape = _naive(tensors, dim)
        assert _apply_geometry(tensors, dim) == naive.storage_bytes(want, shape), f"case {i}"


def test_channel_concat_interleaves_pixels():
    """NHWC channel concat: per pixel, input 0's channels then input 1's (outer = N*H*W)."""
    a = torch.zeros((1, 2, 2, 3), dtype=torch.int8)
    b = torch.ones((1, 1, 2, 3), dtype=torch.int8)
    chunks = concat_geometry([list(a.shape), list(b.shape)], 1)
    assert [(c.outer, c.inner, c.output_inner, c.offset) for c in chunks] == [(6, 2, 3, 0), (6, 1, 3, 2)]
    assert concat_position(4, 1) == 3 and concat_position(2, 1) == 1 and concat_position(4, 0) == 0
    out = cat([a, b], 1)
    assert out.permute(0, 2, 3, 1).flatten().tolist() == [0, 0, 1] * 6


@pytest.mark.parametrize("seed", range(3))
def test_opcheck_cat(seed):
    tensors, dim = _random_case(random.Random(seed))
    torch.library.opcheck(cat.default, (tensors, dim))


@pytest.mark.parametrize("inputs, dim, arg", [
    ([], 0, "inputs"),
    ([torch.zeros((1, 2), dtype=torch.int8), torch.zeros((1, 2), dtype=torch.int16)], 1, r"inputs\[1\]"),
    ([torch.zeros((1, 2), dtype=torch.int8), torch.zeros((2, 2), dtype=torch.int8)], 1, r"inputs\[1\]"),
    ([torch.zeros((1, 2), dtype=torch.int8), torch.zeros((1, 2, 1), dtype=torch.int8)], 1, r"inputs\[1\]"),
    ([torch.zeros((1, 2), dtype=torch.int8)], 2, "dim"),
    ([torch.zeros((1, 2), dtype=torch.int8)], -1, "dim"),
])
def test_cat_bad_arguments(inputs, dim, arg):
    with pytest.raises(CortenOpError, match=rf"quantized_cat.*'{arg}'"):
        cat(inputs, dim)


def test_cat_good_arguments_are_accepted():
    assert cat([torch.zeros((1, 2), dtype=torch.int8), torch.zeros((1, 3), dtype=torch.int8)], 1).shape == (1, 5)


# ----------------------------------------------------------------------------- lowering (dialect)
class BranchCatConv(nn.Module):
    """Two conv branches with different ranges -> channel cat -> conv."""

    def __init__(self, dim=1):
        super().__init__()
        self.a, self.b = nn.Conv2d(3, 4, 1), nn.Conv2d(3, 5 if dim == 1 else 4, 3, padding=1)
        self.c = nn.Conv2d(9 if dim == 1 else 4, 4, 1)
        self.dim = dim

    def forward(self, x):
        return self.c(torch.cat([self.a(x), torch.relu(self.b(x))], self.dim))


LOWERED = {"quantize_per_tensor": 1, "quantized_conv2d": 3, "quantized_cat": 1, "dequantize_per_tensor": 1}


@pytest.mark.parametrize("dim", [1, 2, 3, -1], ids=["C", "H", "W", "neg"])
def test_dialect_branches_cat_conv(dim):
    torch.manual_seed(0)
    t = Tester(BranchCatConv(dim).eval(), (torch.randn(1, 3, 5, 6),))
    t.test_dialect({"aten.cat.default": 1, "aten.conv2d.default": 3}, LOWERED, qtol=1)
    (node,) = [n for n in t.program.ep.graph.nodes if n.target == cat.default]
    assert node.args[1] == dim % 4 and len(node.args[0]) == 2


def test_quantizer_shares_one_observer_across_cat():
    """All cat inputs and its output end up with one scale/zero point, the producers' outputs too."""
    torch.manual_seed(0)
    t = Tester(BranchCatConv(1).eval(), (torch.randn(1, 3, 5, 6),)).quantize()
    dq = torch.ops.quantized_decomposed.dequantize_per_tensor.default
    (cat_node,) = [n for n in t.converted.graph.nodes if n.target == torch.ops.aten.cat.default]
    qparams = {(float(a.args[1]), int(a.args[2])) for a in cat_node.args[0]}
    assert all(a.target == dq for a in cat_node.args[0]) and len(qparams) == 1


def test_dialect_linear_cat_last_dim_and_program_input():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b, self.c = nn.Linear(6, 3), nn.Linear(6, 5), nn.Linear(14, 2)

        def forward(self, x):
            return self.c(torch.cat([self.a(x), x, self.b(x)], dim=-1))

    torch.manual_seed(4)
    t = Tester(Net().eval(), (torch.randn(1, 6),))
    t.test_dialect({"aten.cat.default": 1}, {"quantize_per_tensor": 1, "quantized_linear": 3, "quantized_cat": 1,
                                            "dequantize_per_tensor": 1}, qtol=1)


class CatBuffer(nn.Module):
    """CoordConv-style: a conv's output concatenated with a constant buffer along channels."""

    def __init__(self):
        super().__init__()
        self.a, self.c = nn.Conv2d(2, 3, 1), nn.Conv2d(4, 2, 1)
        self.register_buffer("extra", torch.randn(1, 1, 4, 4))

    def forward(self, x):
        return self.c(torch.cat([self.a(x), self.extra], 1))


class ClassToken(nn.Module):
    """ViT-style: a learned class token expanded to the batch, prepended to the tokens, + positions."""

    def __init__(self):
        super().__init__()
        self.cls = nn.Parameter(torch.randn(1, 1, 16))
        self.pos = nn.Parameter(torch.randn(1, 5, 16) * 0.1)
        self.proj, self.head = nn.Linear(16, 16), nn.Linear(16, 5)

    def forward(self, x):
        t = torch.cat([self.cls.expand(x.shape[0], -1, -1), self.proj(x)], dim=1) + self.pos
        return self.head(t[:, 0])


def test_dialect_cat_of_a_constant_buffer():
    torch.manual_seed(5)
    t = Tester(CatBuffer().eval(), (torch.randn(1, 2, 4, 4),))
    t.test_dialect({"aten.cat.default": 1}, {"quantize_per_tensor": 1, "quantized_conv2d": 2, "quantized_cat": 1,
                                            "dequantize_per_tensor": 1}, qtol=1)
    (node,) = [n for n in t.program.ep.graph.nodes if n.target == cat.default]
    assert [a.op for a in node.args[0]] == ["call_function", "placeholder"]  # the buffer is a lifted constant


@pytest.mark.parametrize("batch", [1, 3])
def test_dialect_class_token_cat(batch):
    torch.manual_seed(7)
    t = Tester(ClassToken().eval(), (torch.randn(batch, 4, 16),))
    t.test_dialect({"aten.cat.default": 1}, {"quantize_per_tensor": 1, "quantized_linear": 2, "quantized_cat": 1,
                                            "quantized_add": 1, "quantized_strided_copy": 1,  # t[:, 0]
                                            "dequantize_per_tensor": 1}, qtol=1)


def test_implementation_cat_of_constants_host_and_qemu():
    torch.manual_seed(8)
    Tester(CatBuffer().eval(), (torch.randn(1, 2, 4, 4),)).test_implementation(on=("host", "qemu"), n_inputs=2)
    Tester(ClassToken().eval(), (torch.randn(2, 4, 16),)).test_implementation(on=("host",), n_inputs=2)


@needs_cmsis_nn
def test_implementation_cmsis_nn_cat_of_constants():
    torch.manual_seed(8)
    Tester(CatBuffer().eval(), (torch.randn(1, 2, 4, 4),)).test_implementation(on=("host",), kernels="cmsis-nn",
                                                                               n_inputs=1)
    Tester(ClassToken().eval(), (torch.randn(1, 4, 16),)).test_implementation(on=("host",), kernels="cmsis-nn",
                                                                              n_inputs=1)


# ----------------------------------------------------------------------------- C kernel
@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    if shutil.which("gcc") is None:
        pytest.skip("needs gcc")
    out = tmp_path_factory.mktemp("concat") / "libconcat.so"
    subprocess.run(["gcc", "-std=c99", "-O2", "-Wall", "-Wextra", "-Werror", "-shared", "-fPIC", "-I",
                    str(KERNELS_DIR), str(KERNELS_DIR / "concat.c"), "-o", str(out)], check=True, capture_output=True)
    return ctypes.CDLL(str(out))


def test_c_concat_matches_reference(lib):
    rng = random.Random(9400)
    for i in range(C_CAT_CASES):
        tensors, dim = _random_case(rng)
        want = cat(tensors, dim)
        out = (ctypes.c_int8 * want.numel())()
        for t, c in zip(tensors, concat_geometry([list(t.shape) for t in tensors], dim)):
            src = naive.storage_bytes(t.contiguous().flatten().tolist(), list(t.shape))
            assert lib.corten_concat_s8((ctypes.c_int8 * len(src))(*src), c.outer, c.inner, c.output_inner, c.offset,
                                        out) == 0
        assert list(out) == naive.storage_bytes(want.contiguous().flatten().tolist(), list(want.shape)), f"case {i}"


def test_c_concat_rejects_bad_arguments(lib):
    x, out = (ctypes.c_int8 * 8)(), (ctypes.c_int8 * 16)()
    assert lib.corten_concat_s8(x, 4, 2, 4, 2, out) == 0
    assert lib.corten_concat_s8(None, 4, 2, 4, 2, out) == -1
    assert lib.corten_concat_s8(x, 4, 2, 4, 3, out) == -1  # chunk would spill into the next row
    assert lib.corten_concat_s8(x, 4, 2, 4, -1, out) == -1


# ----------------------------------------------------------------------------- C library end to end
def test_implementation_branches_cat_conv_host_and_qemu():
    torch.manual_seed(6)
    t = Tester(BranchCatConv(1).eval(), (torch.randn(1, 3, 5, 6),))
    results = t.test_implementation(on=("host", "qemu"), n_inputs=2)
    assert {(r[0], r[1]) for r in results} == {("host", None), ("qemu", "cortex-m55")}


@needs_cmsis_nn
@pytest.mark.parametrize("dim, variant", [(1, "x"), (2, "z"), (3, "y")])
def test_implementation_cmsis_nn_concatenation(dim, variant, tmp_path):
    torch.manual_seed(6)
    t = Tester(BranchCatConv(dim).eval(), (torch.randn(1, 3, 5, 6),))
    t.test_implementation(on=("host", "qemu"), kernels="cmsis-nn", n_inputs=1)
    assert f"arm_concatenation_s8_{variant}(" in t.program.emit_c(tmp_path, kernels="cmsis-nn").source.read_text()


def test_dialect_cat_of_one_tensor_twice():
    """``cat([y, y])``: the quantizer lists y once (sharing y with itself used to recurse forever)."""

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.c = nn.Conv2d(3, 4, 1), nn.Conv2d(8, 2, 1)

        def forward(self, x):
            y = self.a(x)
            return self.c(torch.cat([y, y], 1))

    torch.manual_seed(7)
    t = Tester(Net().eval(), (torch.randn(1, 3, 4, 4),))
    t.test_dialect({"aten.cat.default": 1}, {"quantize_per_tensor": 1, "quantized_conv2d": 2, "quantized_cat": 1,
                                            "dequantize_per_tensor": 1}, qtol=1)
    t.test_implementation(on=("host",), n_inputs=1)


# ----------------------------------------------------------------------------- CMSIS-NN calls
def test_cmsis_concat_calls_pick_the_axis_variant():
    from corten.ops.concat import cmsis_concat_calls

    ch = cmsis_concat_calls([[1, 4, 5, 6], [1, 5, 5, 6]], 1)  # NHWC channels: x, pixels interleave
    assert [(c.axis, c.x, c.y, c.z, c.w, c.output_size, c.offset) for c in ch] == \
        [("x", 4, 6, 5, 1, 9, 0), ("x", 5, 6, 5, 1, 9, 4)]
    assert [c.axis for c in cmsis_concat_calls([[2, 3, 4, 5]] * 2, 0)] == ["w", "w"]
    assert [c.axis for c in cmsis_concat_calls([[2, 3, 4, 5]] * 2, 2)] == ["z", "z"]
    assert [c.axis for c in cmsis_concat_calls([[2, 3, 4, 5]] * 2, 3)] == ["y", "y"]
    assert [c.axis for c in cmsis_concat_calls([[3, 7], [3, 2]], 1)] == ["x", "x"]
    assert cmsis_concat_calls([[2, 7]] * 2, 0)[1].args("in", "out") == ["in", "7", "2", "1", "1", "out", "4", "2u"]
    with pytest.raises(ValueError, match="uint16_t"):
        cmsis_concat_calls([[1, 40000], [1, 30000]], 1)
    with pytest.raises(ValueError, match="at most 4"):
        cmsis_concat_calls([[1, 2, 2, 2, 2]] * 2, 1)


@pytest.fixture(scope="module")
def cmsis_concat_lib(tmp_path_factory):
    root = os.environ.get("CMSIS_NN_PATH")
    if not root or shutil.which("gcc") is None:
        pytest.skip("set CMSIS_NN_PATH to a CMSIS-NN source tree (and install gcc)")
    out = tmp_path_factory.mktemp("cmsis_concat") / "libcmsisconcat.so"
    sources = [os.path.join(root, "Source", "ConcatenationFunctions", f"arm_concatenation_s8_{a}.c") for a in "xyzw"]
    subprocess.run(["gcc", "-std=c99", "-O1", "-shared", "-fPIC", "-I", os.path.join(root, "Include"), *sources,
                    "-o", str(out)], check=True, capture_output=True)
    return ctypes.CDLL(str(out))


def test_cmsis_concatenation_functions_match_reference(cmsis_concat_lib):
    """Every variant, driven by cmsis_concat_calls, reproduces the reference op's bytes."""
    from corten.ops.concat import cmsis_concat_calls

    rng = random.Random(9700)
    for i in range(300):
        tensors, dim = _random_case(rng)
        want = cat(tensors, dim)
        out = (ctypes.c_int8 * want.numel())()
        for t, c in zip(tensors, cmsis_concat_calls([list(t.shape) for t in tensors], dim)):
            src = naive.storage_bytes(t.contiguous().flatten().tolist(), list(t.shape))
            fn = getattr(cmsis_concat_lib, f"arm_concatenation_s8_{c.axis}")
            sizes = [ctypes.c_uint16(v) for v in (c.x, c.y, c.z, c.w)]
            tail = [] if c.output_size is None else [ctypes.c_uint16(c.output_size)]
            fn((ctypes.c_int8 * len(src))(*src), *sizes, out, *tail, ctypes.c_uint32(c.offset))
        assert list(out) == naive.storage_bytes(want.contiguous().flatten().tolist(), list(want.shape)), f"case {i}"


class _SelfCat(nn.Module):
    """One tensor concatenated with itself at several levels (found by a random model)."""

    def forward(self, x):
        t0 = torch.cat([x, x], 1)
        t1 = torch.cat([t0, x], 1)
        t2 = torch.cat([t1, t0], 1)
        return torch.cat([t2, x * 2], 1), t1


@pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")
def test_tensor_concatenated_with_itself_at_several_levels_byte_exact():
    """The quantizer's sharing groups of ``t1 = cat([t0, x]); cat([t1, t0])`` with ``t0 = cat([x, x])``
    (torchao's union-find recursed without end); every cat shares one scale, byte-exact in C."""
    import corten

    model = _SelfCat().eval()
    x = torch.randn(1, 2, 4, 4)
    prog = corten.compile(model, (x,), calibration=[(torch.randn(1, 2, 4, 4),) for _ in range(3)])
    assert prog.unlowered_ops() == []
    assert prog.op_counts()["quantized_cat"] == 4
    y = torch.randn(1, 2, 4, 4)
    want = prog.run_int8(y)
    assert all(torch.equal(a, b) for a, b in zip(want, prog.c_run(y, kernels="portable").outputs))
    out, t1 = prog.run(y)
    ref_out, ref_t1 = model(y)
    assert (t1 - ref_t1).abs().max() < 0.05 and (out - ref_out).abs().max() < 0.1
