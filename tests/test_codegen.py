"""emit_c end to end: small hand-built lowered programs -> C library -> gcc -> bytes equal to the
reference kernels' int8 output; determinism; warning-free cross-compiles; the CMSIS-NN flavour
(only when CMSIS_NN_PATH points at a CMSIS-NN tree)."""
from __future__ import annotations

import random
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
from conftest import CMSIS_NN_PATH, needs_arm_gcc, needs_cmake, needs_cmsis_nn, needs_gcc, needs_qemu

import corten.ops  # noqa: F401
from corten.codegen import CodegenError, emit_c
from corten.fixed_point import quantize_multiplier
from corten.memory import plan_memory
from corten.ops.linear import kernel_sum
from corten.targets import get_target

OPS = torch.ops.corten
GCC = shutil.which("gcc")
ARM_GCC = shutil.which("arm-none-eabi-gcc")
WARN = ["-std=c99", "-Wall", "-Wextra", "-Werror"]

pytestmark = needs_gcc

DRIVER = r"""
#include <stdio.h>
#include <stdlib.h>
#include MODEL_HEADER
static int8_t in_buf[MODEL_INPUT_BYTES];
static int8_t out_buf[MODEL_OUTPUT_BYTES];
static uint8_t arena[MODEL_ARENA_BYTES + 16] __attribute__((aligned(16)));
int main(int argc, char **argv)
{
    int status;
    uint8_t *a = arena + (argc > 1 ? atoi(argv[1]) : 0); /* misalign on request */
    if (fread(in_buf, 1, sizeof in_buf, stdin) != sizeof in_buf) return 90;
    status = MODEL_RUN(in_buf, out_buf, a);
    if (status != 0) return 100 - status;
    if (fwrite(out_buf, 1, sizeof out_buf, stdout) != sizeof out_buf) return 91;
    return 0;
}
"""


# ----------------------------------------------------------------------------- program builders
def _scale_for(rng: random.Random, depth: int) -> tuple[torch.Tensor, torch.Tensor]:
    m, s = quantize_multiplier(rng.uniform(0.5, 2.0) / (depth * 48))
    return torch.tensor([m], dtype=torch.int32), torch.tensor([s], dtype=torch.int32)


def _per_channel(rng: random.Random, depth: int, channels: int):
    pairs = [quantize_multiplier(rng.uniform(0.5, 2.0) / (depth * 48)) for _ in range(channels)]
    return (torch.tensor([p[0] for p in pairs], dtype=torch.int32),
            torch.tensor([p[1] for p in pairs], dtype=torch.int32))


def _w(rng_t: torch.Generator, *shape) -> torch.Tensor:
    return torch.randint(-127, 128, shape, generator=rng_t, dtype=torch.int8)


def _bias(rng_t: torch.Generator, n: int) -> torch.Tensor:
    return torch.randint(-3000, 3000, (n,), generator=rng_t, dtype=torch.int32)


class ResidualNet(torch.nn.Module):
    """quantize -> conv 3x3/s2 -> depthwise 3x3 -> add (residual) -> avgpool 2x2 -> global avgpool ->
    reshape [1, C] -> per-channel linear -> dequantize."""

    def __init__(self, seed=0, c=8, classes=10):
        super().__init__()
        rng, g = random.Random(seed), torch.Generator().manual_seed(seed)
        self.register_buffer("conv_w", _w(g, c, 3, 3, 3))
        self.register_buffer("conv_b", _bias(g, c))
        self.register_buffer("conv_m", _per_channel(rng, 27, c)[0])
        self.register_buffer("conv_s", _per_channel(rng, 27, c)[1])
        self.register_buffer("dw_w", _w(g, 1, 3, 3, c))
        self.register_buffer("dw_b", _bias(g, c))
        m, s = _scale_for(rng, 9)
        self.register_buffer("dw_m", m)
        self.register_buffer("dw_s", s)
        self.register_buffer("fc_w", _w(g, classes, c))
        self.register_buffer("fc_ks", kernel_sum(self.fc_w, _bias(g, classes), 5))
        self.register_buffer("fc_m", _per_channel(rng, c, classes)[0])
        self.register_buffer("fc_s", _per_channel(rng, c, classes)[1])
        self.add_q = [quantize_multiplier(0.5), quantize_multiplier(0.4), quantize_multiplier(2.0 / (1 << 20) / 0.9)]

    def forward(self, x):
        q = OPS.quantize_per_tensor(x, 0.02, 3)
        a = OPS.quantized_conv2d(q, self.conv_w, self.conv_b, [2, 2], [1, 1], [1, 1], -3, -5,
                                 self.conv_m, self.conv_s, -5, 127)
        d = OPS.quantized_depthwise_conv2d(a, self.dw_w, self.dw_b, [1, 1], [1, 1], [1, 1], 1, 5, 2,
                                           self.dw_m, self.dw_s, -128, 127)
        (m1, s1), (m2, s2), (mo, so) = self.add_q
        r = OPS.quantized_add(d, a, -2, m1, s1, 5, m2, s2, 20, -5, mo, so, -128, 127)
        p = OPS.quantized_avg_pool2d(r, [2, 2], [2, 2], [0, 0], -128, 127)
        gp = OPS.quantized_avg_pool2d(p, [4, 4], [4, 4], [0, 0], -128, 127)
        f = torch.reshape(gp, (1, gp.shape[1]))
        y = OPS.quantized_linear(f, self.fc_w, self.fc_ks, 5, 1, self.fc_m, self.fc_s, -128, 127)
        return OPS.dequantize_per_tensor(y, 0.1, 1)


class PoolNet(torch.nn.Module):
    """quantize -> 1x1 conv (per-tensor, no bias) -> maxpool 3x3/s2/p1 -> depthwise x2 multiplier with
    dilation 2 and stride 2 -> dequantize (4-D output)."""

    def __init__(self, seed=1):
        super().__init__()
        rng, g = random.Random(seed), torch.Generator().manual_seed(seed)
        self.register_buffer("conv_w", _w(g, 6, 1, 1, 5))
        m, s = _scale_for(rng, 5)
        self.register_buffer("conv_m", m)
        self.register_buffer("conv_s", s)
        self.register_buffer("dw_w", _w(g, 1, 3, 3, 12))
        self.register_buffer("dw_b", _bias(g, 12))
        self.register_buffer("dw_m", _per_channel(rng, 9, 12)[0])
        self.register_buffer("dw_s", _per_channel(rng, 9, 12)[1])

    def forward(self, x):
        q = OPS.quantize_per_tensor(x, 0.03, -128)
        a = OPS.quantized_conv2d(q, self.conv_w, None, [1, 1], [0, 0], [1, 1], 128, -10,
                                 self.conv_m, self.conv_s, -128, 127)
        p = OPS.quantized_max_pool2d(a, [3, 3], [2, 2], [1, 1], -100, 100)
        d = OPS.quantized_depthwise_conv2d(p, self.dw_w, self.dw_b, [2, 2], [2, 2], [2, 2], 2, 10, 0,
                                           self.dw_m, self.dw_s, -128, 127)
        return OPS.dequantize_per_tensor(d, 0.05, 0)


class FlattenNet(torch.nn.Module):
    """quantize -> conv -> reshape [1, C*H*W] (NHWC -> NCHW copy) -> per-tensor linear ->
    reshape [1, 4, 2, 2] (NCHW -> NHWC copy) -> conv 1x1 -> dequantize."""

    def __init__(self, seed=2):
        super().__init__()
        rng, g = random.Random(seed), torch.Generator().manual_seed(seed)
        self.register_buffer("conv_w", _w(g, 4, 3, 3, 2))
        self.register_buffer("conv_b", _bias(g, 4))
        m, s = _scale_for(rng, 18)
        self.register_buffer("conv_m", m)
        self.register_buffer("conv_s", s)
        self.register_buffer("fc_w", _w(g, 16, 4 * 5 * 5))
        self.register_buffer("fc_ks", kernel_sum(self.fc_w, _bias(g, 16), 7))
        m, s = _scale_for(rng, 100)
        self.register_buffer("fc_m", m)
        self.register_buffer("fc_s", s)
        self.register_buffer("pw_w", _w(g, 3, 1, 1, 4))
        self.register_buffer("pw_m", _per_channel(rng, 4, 3)[0])
        self.register_buffer("pw_s", _per_channel(rng, 4, 3)[1])

    def forward(self, x):
        q = OPS.quantize_per_tensor(x, 0.05, 0)
        a = OPS.quantized_conv2d(q, self.conv_w, self.conv_b, [1, 1], [0, 0], [1, 1], 0, -7,
                                 self.conv_m, self.conv_s, -128, 127)
        f = torch.reshape(a, (1, 100))
        y = OPS.quantized_linear(f, self.fc_w, self.fc_ks, 7, 3, self.fc_m, self.fc_s, -128, 127)
        u = torch.reshape(y, (1, 4, 2, 2))
        z = OPS.quantized_conv2d(u, self.pw_w, None, [1, 1], [0, 0], [1, 1], -3, 0, self.pw_m, self.pw_s,
                                 -128, 127)
        return OPS.dequantize_per_tensor(z, 0.05, 0)


PROGRAMS = {
    "residual": (ResidualNet, (1, 3, 16, 16)),
    "pool": (PoolNet, (1, 5, 9, 11)),
    "flatten": (FlattenNet, (1, 2, 7, 7)),
}


def _export(kind: str):
    cls, shape = PROGRAMS[kind]
    x = torch.randn(shape, generator=torch.Generator().manual_seed(42)) * 2.0
    ep = torch.export.export(cls().eval(), (x,))
    return ep, x


def _quantized_io(ep, x) -> tuple[bytes, bytes]:
    """The int8 input bytes (after quantize) and expected int8 output bytes (before dequantize)."""
    q_node = next(n for n in ep.graph.nodes if n.op == "call_function" and "quantize_per_tensor" in str(n.target)
                  and "dequantize" not in str(n.target))
    dq_node = next(n for n in ep.graph.nodes if n.op == "call_function" and "dequantize_per_tensor" in str(n.target))
    q = OPS.quantize_per_tensor(x, q_node.args[1], q_node.args[2])
    y = ep.module()(x)
    scale, zp = dq_node.args[1], dq_node.args[2]
    yq = torch.round(y / scale).to(torch.int32) + zp  # exact inverse of dequantize for int8 values
    return _c_bytes(q), _c_bytes(yq.to(torch.int8))


def _c_bytes(t: torch.Tensor) -> bytes:
    if t.dim() == 4:
        t = t.permute(0, 2, 3, 1)
    return t.contiguous().numpy().tobytes()


def _build(lib, work: Path, extra_sources=(), cflags=("-O2",), include_dirs=()) -> Path:
    driver = work / "driver.c"
    driver.write_text(DRIVER)
    exe = work / "model"
    m = lib.name.upper()
    defines = [f'-DMODEL_HEADER="{lib.name}.h"', f"-DMODEL_RUN={lib.name}_run",
               f"-DMODEL_INPUT_BYTES={m}_INPUT_BYTES", f"-DMODEL_OUTPUT_BYTES={m}_OUTPUT_BYTES",
               f"-DMODEL_ARENA_BYTES={m}_ARENA_BYTES"]
    cmd = [GCC, *WARN, *cflags, *defines, "-I", str(lib.out_dir), *[f"-I{d}" for d in include_dirs],
           str(driver), *map(str, lib.sources), *map(str, extra_sources), "-o", str(exe)]
    res = subprocess.run(cmd, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-4000:]
    return exe


def _run(exe: Path, data: bytes, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(exe), *args], input=data, capture_output=True, timeout=60)


# ----------------------------------------------------------------------------- portable flavour
@pytest.mark.parametrize("kind", sorted(PROGRAMS))
def test_portable_library_matches_reference(kind, tmp_path):
    ep, x = _export(kind)
    target = get_target("cortex-m55")
    plan = plan_memory(ep, target)
    lib = emit_c(ep, plan, tmp_path / "lib", f"net_{kind}", target)
    in_bytes, want = _quantized_io(ep, x)
    assert lib.input_bytes == len(in_bytes) and lib.output_bytes == len(want)
    exe = _build(lib, tmp_path)
    res = _run(exe, in_bytes)
    assert res.returncode == 0, res.stderr
    assert res.stdout == want
    # only the kernels this model uses are copied
    copied = {p.name for p in lib.kernel_files if p.suffix == ".c"}
    expected = {"residual": {"conv.c", "add.c", "pool.c", "linear.c"}, "pool": {"conv.c", "pool.c"},
                "flatten": {"conv.c", "linear.c", "layout.c"}}[kind]
    assert copied == expected


def test_program_checks_arguments(tmp_path):
    ep, x = _export("residual")
    target = get_target("cortex-m4")
    lib = emit_c(ep, plan_memory(ep, target), tmp_path / "lib", "net", target)
    exe = _build(lib, tmp_path)
    in_bytes, _ = _quantized_io(ep, x)
    assert _run(exe, in_bytes, "4").returncode == 100 - (-2)  # misaligned arena -> NET_ERROR_ARENA_ALIGNMENT
    header = lib.header.read_text()
    for macro in ("NET_INPUT_BYTES 768", "NET_OUTPUT_BYTES 10", "NET_ARENA_ALIGN 16", "NET_INPUT_DIM_H 16",
                  "NET_INPUT_DIM_C 3", "NET_INPUT_RANK 4",
                  "NET_INPUT_ZERO_POINT 3", "NET_OUTPUT_SCALE 0.1f", "NET_PROGRAM_HASH", "NET_ERROR_NULL_POINTER",
                  "int net_run(const int8_t *input, int8_t *output, uint8_t *arena);"):
        assert macro in header
    assert f"NET_ARENA_BYTES {lib.arena_bytes}" in header
    src = lib.source.read_text()
    assert "float" not in src and "malloc" not in src
    assert "- quantized_depthwise_conv2d" in src and "node 'quantized_depthwise_conv2d'" in src


def test_emission_is_deterministic_and_hash_tracks_constants(tmp_path):
    ep, _ = _export("residual")
    target = get_target("cortex-m55")
    a = emit_c(ep, plan_memory(ep, target), tmp_path / "a", "net", target)
    b = emit_c(ep, plan_memory(ep, target), tmp_path / "b", "net", target)
    files_a = sorted(str(p.relative_to(tmp_path / "a")) for p in (tmp_path / "a").rglob("*") if p.is_file())
    assert files_a == sorted(str(p.relative_to(tmp_path / "b")) for p in (tmp_path / "b").rglob("*") if p.is_file())
    for name in files_a:
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name
    other = torch.export.export(ResidualNet(seed=5).eval(), (torch.zeros(1, 3, 16, 16),))
    c = emit_c(other, plan_memory(other, target), tmp_path / "c", "net", target)
    assert a.program_hash == b.program_hash != c.program_hash
    assert a.constant_bytes == plan_memory(ep, target).constant_bytes


def test_rejects_bad_names_and_flavours(tmp_path):
    ep, _ = _export("pool")
    plan = plan_memory(ep, "cortex-m4")
    with pytest.raises(CodegenError, match="C identifier"):
        emit_c(ep, plan, tmp_path, "my-net", "cortex-m4")
    with pytest.raises(CodegenError, match="starts with 'corten'"):
        emit_c(ep, plan, tmp_path, "corten_kernels", "cortex-m4")
    with pytest.raises(CodegenError, match="kernels must be"):
        emit_c(ep, plan, tmp_path, "net", "cortex-m4", kernels="fast")


@needs_arm_gcc
@pytest.mark.parametrize("target_name", ["cortex-m4", "cortex-m55"])
def test_cross_compiles_warning_free(target_name, tmp_path):
    target = get_target(target_name)
    cpu = [f"-mcpu={target.cpu}", "-mthumb"]
    if target_name == "cortex-m4":
        cpu += ["-mfloat-abi=hard", "-mfpu=fpv4-sp-d16"]
    for kind in ("residual", "flatten"):
        ep, _ = _export(kind)
        lib = emit_c(ep, plan_memory(ep, target), tmp_path / kind, f"net_{kind}", target)
        for src in lib.sources:
            res = subprocess.run([ARM_GCC, *WARN, "-O2", *cpu, "-I", str(lib.out_dir), "-c", str(src),
                                  "-o", str(tmp_path / (src.stem + ".o"))], capture_output=True, text=True)
            assert res.returncode == 0, res.stderr[-3000:]


def test_makefile_builds_static_library(tmp_path):
    if shutil.which("make") is None:
        pytest.skip("needs make")
    ep, _ = _export("pool")
    lib = emit_c(ep, plan_memory(ep, "cortex-m4"), tmp_path, "net", "cortex-m4")
    res = subprocess.run(["make", "-s", "CFLAGS=-std=c99 -O1 -Wall -Wextra -Werror"], cwd=tmp_path,
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    assert (tmp_path / "build" / "libnet.a").exists()
    assert "add_library(net STATIC" in lib.cmake.read_text()


# ----------------------------------------------------------------------------- CMSIS-NN flavour
@needs_cmsis_nn
@pytest.mark.parametrize("kind", sorted(PROGRAMS))
def test_cmsis_nn_library_matches_reference(kind, tmp_path):
    root = Path(CMSIS_NN_PATH)
    ep, x = _export(kind)
    target = get_target("cortex-m3")  # the host runs CMSIS-NN's plain C path: plan plain-ISA scratch
    lib = emit_c(ep, plan_memory(ep, target), tmp_path / "lib", f"net_{kind}", target, kernels="cmsis-nn")
    assert "arm_nnfunctions.h" in lib.source.read_text()
    cmsis_sources = sorted(p for p in root.glob("Source/*/*.c") if not p.stem.endswith(("_f16", "_f32")))
    objs = []
    for src in cmsis_sources:  # CMSIS-NN is not ours: build it without -Werror
        obj = tmp_path / f"{src.parent.name}_{src.stem}.o"
        subprocess.run([GCC, "-std=c99", "-O1", "-I", str(root / "Include"), "-c", str(src), "-o", str(obj)],
                       check=True, capture_output=True)
        objs.append(obj)
    exe = _build(lib, tmp_path, extra_sources=objs, include_dirs=[root / "Include"])
    in_bytes, want = _quantized_io(ep, x)
    res = _run(exe, in_bytes)
    assert res.returncode == 0, res.stderr
    assert res.stdout == want


# ----------------------------------------------------------------------------- on QEMU (Cortex-M)
QEMU = shutil.which("qemu-system-arm")


def _run_qemu(lib, ep, x, target_name, tmp_path, extra_sources=(), include_dirs=()):
    from corten.runners import harness_defines, run_on_qemu

    in_bytes, want = _quantized_io(ep, x)
    defines = harness_defines(lib.header.name, lib.run_symbol, lib.input_bytes, lib.output_bytes, lib.arena_bytes,
                              lib.arena_align)
    res = run_on_qemu([*lib.sources, *extra_sources], [*lib.include_dirs, *include_dirs], defines, in_bytes,
                      lib.output_bytes, target_name, tmp_path / "qemu", progress=None)
    return res.output, want


@needs_qemu
@pytest.mark.parametrize("target_name", ["cortex-m55"])
def test_portable_library_on_qemu(target_name, tmp_path):
    ep, x = _export("residual")
    lib = emit_c(ep, plan_memory(ep, target_name), tmp_path / "lib", "net", target_name)
    got, want = _run_qemu(lib, ep, x, target_name, tmp_path)
    assert got == want


def _cmsis_nn_archive(root: Path, target_name: str, work: Path) -> Path:
    """CMSIS-NN's integer kernels built for ``target_name`` into a static archive (not ours: no -Werror)."""
    from corten.runners.qemu import float_abi_flags

    target = get_target(target_name)
    flags = ["-std=c99", "-O2", f"-mcpu={target.cpu}", "-mthumb", *float_abi_flags(target),
             "-ffunction-sections", "-fdata-sections", "-I", str(root / "Include")]
    work.mkdir(parents=True, exist_ok=True)
    objs = []
    procs = []
    for src in sorted(p for p in root.glob("Source/*/*.c") if not p.stem.endswith(("_f16", "_f32"))):
        obj = work / f"{src.parent.name}_{src.stem}.o"
        procs.append(subprocess.Popen([ARM_GCC, *flags, "-c", str(src), "-o", str(obj)]))
        objs.append(obj)
        if len(procs) >= 4:
            assert procs.pop(0).wait() == 0
    assert all(p.wait() == 0 for p in procs)
    archive = work / "libcmsis-nn.a"
    subprocess.run([ARM_GCC.replace("gcc", "ar"), "rcs", str(archive), *map(str, objs)], check=True)
    return archive


@needs_qemu
@needs_cmsis_nn
@pytest.mark.parametrize("target_name", ["cortex-m4", "cortex-m55", "cortex-m3"])
def test_cmsis_nn_library_on_qemu(target_name, tmp_path):
    """DSP (m4), Helium (m55) and plain (m3) CMSIS-NN paths give the reference bytes (the linear
    layer's kernel sums work on every ISA)."""
    root = Path(CMSIS_NN_PATH)
    archive = _cmsis_nn_archive(root, target_name, tmp_path / "cmsis")
    for kind in sorted(PROGRAMS):
        ep, x = _export(kind)
        lib = emit_c(ep, plan_memory(ep, target_name), tmp_path / kind, f"net_{kind}", target_name,
                     kernels="cmsis-nn")
        got, want = _run_qemu(lib, ep, x, target_name, tmp_path / kind, extra_sources=[archive],
                              include_dirs=[root / "Include"])
        assert got == want, kind


class IdentityNet(torch.nn.Module):
    """quantize -> reshape (alias) -> dequantize: the output bytes are the input bytes (plan copy)."""

    def forward(self, x):
        q = OPS.quantize_per_tensor(x, 0.1, 0)
        return OPS.dequantize_per_tensor(torch.reshape(q, (2, 6)), 0.1, 0)


def test_output_that_is_the_input_is_copied(tmp_path):
    x = torch.randn(1, 12, generator=torch.Generator().manual_seed(3))
    ep = torch.export.export(IdentityNet(), (x,))
    plan = plan_memory(ep, "cortex-m4")
    lib = emit_c(ep, plan, tmp_path / "lib", "ident", "cortex-m4")
    in_bytes, want = _quantized_io(ep, x)
    res = _run(_build(lib, tmp_path), in_bytes)
    assert res.returncode == 0 and res.stdout == want == in_bytes


@needs_cmake
def test_cmake_builds_static_library(tmp_path):
    ep, _ = _export("flatten")
    emit_c(ep, plan_memory(ep, "cortex-m55"), tmp_path / "src", "net", "cortex-m55")
    build = tmp_path / "build"
    for cmd in (["cmake", "-S", str(tmp_path / "src"), "-B", str(build), "-DCMAKE_C_FLAGS=-Werror"],
                ["cmake", "--build", str(build)]):
        res = subprocess.run(cmd, capture_output=True, text=True)
        assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    assert (build / "libnet.a").exists()


def test_every_compute_op_has_a_portable_kernel():
    from corten.ops import all_op_names
    from corten.providers import PORTABLE

    compute = [op for op in all_op_names() if op not in ("quantize_per_tensor", "dequantize_per_tensor")]
    assert compute and set(compute) <= set(PORTABLE.ops()), sorted(set(compute) - set(PORTABLE.ops()))


@pytest.mark.parametrize("compiler", ["gcc", "clang"])
def test_large_int8_arrays_are_strings_of_the_same_bytes(compiler, tmp_path):
    """int8 arrays of BYTE_STRING_MIN_BYTES or more are written as strings of their bytes (gcc
    compiles them ~10x faster than lists); compiled under -Wpedantic, the array holds exactly its
    bytes (every value, 0x00/0x7f/0x80/0xff included, no terminating NUL), smaller arrays stay lists."""
    from types import SimpleNamespace

    from corten.codegen import emitter

    if shutil.which(compiler) is None:
        pytest.skip(f"{compiler} is not installed")
    n = emitter.BYTE_STRING_MIN_BYTES + 3  # not a multiple of a line's 16 bytes
    big = torch.arange(n).remainder(256).sub(128).to(torch.int8)
    arrays = {"big": emitter._Array("t_big", big), "small": emitter._Array("t_small", big[:20])}
    g = SimpleNamespace(name="t", macro="T", arrays=arrays)
    (tmp_path / "t_constants.h").write_text(emitter._constants_header(g))
    source = emitter._constants_source(g)
    (tmp_path / "t_constants.c").write_text(source)
    assert "t_big[4099] CORTEN_CONST_ALIGNED CORTEN_BYTES =" in source and '"\\x80\\x81' in source
    assert "t_small[20] CORTEN_CONST_ALIGNED = {\n    -128, -127," in source
    (tmp_path / "main.c").write_text(
        '#include <stdio.h>\n#include "t_constants.h"\n'
        "int main(void) { fwrite(t_big, 1, sizeof t_big, stdout); fwrite(t_small, 1, sizeof t_small, stdout);"
        " return 0; }\n")
    cmd = [compiler, "-std=c99", "-Wall", "-Wextra", "-Wpedantic", "-Wconversion", "-Werror", "-O1",
           "main.c", "t_constants.c", "-o", "t"]
    subprocess.run(cmd, cwd=tmp_path, check=True, capture_output=True)
    out = subprocess.run([str(tmp_path / "t")], capture_output=True, check=True).stdout
    assert out == big.numpy().tobytes() + big[:20].numpy().tobytes()
