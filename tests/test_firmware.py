"""The firmware engineer's view of the generated C: several models in one program, the build files."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import torch
from torch import nn
from conftest import needs_qemu

import corten
from corten.runners import run_on_host, run_on_qemu
from corten.runners.program_runner import c_bytes_to_tensor, tensor_to_c_bytes

ARM_GCC = shutil.which("arm-none-eabi-gcc")
QEMU = shutil.which("qemu-system-arm")


class Head(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.dw = nn.Conv2d(8, 8, 3, padding=1, groups=8)
        self.fc = nn.Linear(8, 4)

    def forward(self, x):
        y = torch.relu(self.conv(x))
        y = torch.relu(self.dw(y)) + y
        return self.fc(nn.functional.adaptive_avg_pool2d(y, 1).flatten(1))


class Mlp(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(20, 16)
        self.fc2 = nn.Linear(16, 6)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


MULTI_MAIN = r"""
/* Two generated models in one program: runs head then mlp, input.bin holds both inputs, output.bin
 * receives both outputs (each model's bytes one after the other). */
#include <stdint.h>
#include <stdio.h>

#include "head.h"
#include "mlp.h"

#define MAX(a, b) ((a) > (b) ? (a) : (b))
static int8_t in_head[HEAD_INPUT_BYTES];
static int8_t in_mlp[MLP_INPUT_BYTES];
static int8_t out_head[HEAD_OUTPUT_BYTES];
static int8_t out_mlp[MLP_OUTPUT_BYTES];
/* One arena serves both models: they run one after the other. */
static uint8_t arena[MAX(HEAD_ARENA_BYTES, MLP_ARENA_BYTES)] __attribute__((aligned(16)));

int main(void)
{
    FILE *f = fopen("input.bin", "rb");
    int s1;
    int s2;
    if (f == NULL || fread(in_head, 1, sizeof in_head, f) != sizeof in_head ||
        fread(in_mlp, 1, sizeof in_mlp, f) != sizeof in_mlp) {
        printf("CORTEN_ERROR input\n");
        return 2;
    }
    fclose(f);
    s1 = head_run(in_head, out_head, arena);
    s2 = mlp_run(in_mlp, out_mlp, arena);
    f = fopen("output.bin", "wb");
    if (f == NULL || fwrite(out_head, 1, sizeof out_head, f) != sizeof out_head ||
        fwrite(out_mlp, 1, sizeof out_mlp, f) != sizeof out_mlp || fclose(f) != 0) {
        printf("CORTEN_ERROR output\n");
        return 2;
    }
    printf("CORTEN_RESULT status=%d elapsed=0 unit=ns\n", s1 != 0 ? s1 : s2);
    return 0;
}
"""


@pytest.fixture(scope="module")
def two_models():
    torch.manual_seed(0)
    x, v = torch.randn(1, 3, 8, 8), torch.randn(1, 20)
    head = corten.compile(Head().eval(), (x,), name="head", target="cortex-m4")
    mlp = corten.compile(Mlp().eval(), (v,), name="mlp", target="cortex-m4")
    return (head, x), (mlp, v)


def _emit_both(two_models, out: Path):
    (head, x), (mlp, v) = two_models
    libs = [head.emit_c(out), mlp.emit_c(out)]
    data = tensor_to_c_bytes(head.quantize_inputs(x)[0]) + tensor_to_c_bytes(mlp.quantize_inputs(v)[0])
    want = [head.run_int8(x)[0], mlp.run_int8(v)[0]]
    return libs, data, want


def _sources(libs) -> list[Path]:
    """Each model's own sources plus one copy of the shared kernels (the union of what they call)."""
    kernels = sorted({k.name: k for lib in libs for k in lib.kernel_sources}.values())
    return [s for lib in libs for s in lib.model_sources] + kernels


def _check(libs, res, want):
    off = 0
    for lib, w in zip(libs, want):
        got = c_bytes_to_tensor(res.output[off:off + lib.output_bytes], lib.output_shape)
        assert torch.equal(got, w), lib.name
        off += lib.output_bytes


def test_kernels_directory_is_shared_and_symbols_are_prefixed(two_models, tmp_path):
    libs, _, _ = _emit_both(two_models, tmp_path)
    kdir = tmp_path / "corten_kernels"
    assert all(lib.kernels_dir == kdir for lib in libs)
    # the kernel directory is identical whatever model wrote it
    other = tmp_path / "other"
    two_models[1][0].emit_c(other)
    for p in kdir.iterdir():
        assert (other / "corten_kernels" / p.name).read_bytes() == p.read_bytes(), p.name
    # every external symbol of a model's objects is <name>_* (the kernels are corten_*)
    for lib in libs:
        for src in lib.model_sources:
            obj = tmp_path / f"{src.stem}.o"
            subprocess.run(["gcc", "-std=c99", "-c", str(src), "-o", str(obj)], check=True)
            nm = subprocess.run(["nm", "-g", "--defined-only", str(obj)], capture_output=True, text=True, check=True)
            names = [line.split()[-1] for line in nm.stdout.splitlines() if line.strip()]
            assert names and all(n.startswith(f"{lib.name}_") for n in names), names


def test_two_models_link_into_one_host_program(two_models, tmp_path):
    libs, data, want = _emit_both(two_models, tmp_path / "fw")
    main = tmp_path / "multi_main.c"
    main.write_text(MULTI_MAIN)
    out_bytes = sum(lib.output_bytes for lib in libs)
    res = run_on_host(_sources(libs), [tmp_path / "fw"], {}, data, out_bytes, tmp_path / "run", main=main,
                      progress=None)
    _check(libs, res, want)


def test_makefile_builds_every_model_and_the_kernels_once(two_models, tmp_path):
    if shutil.which("make") is None:
        pytest.skip("needs make")
    libs, data, want = _emit_both(two_models, tmp_path / "fw")
    res = subprocess.run(["make", "-s", "-j2", "CFLAGS=-std=c99 -O1 -Wall -Wextra -Werror"], cwd=tmp_path / "fw",
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    build = tmp_path / "fw" / "build"
    archives = [build / "libhead.a", build / "libmlp.a", build / "libcorten_kernels.a"]
    assert all(a.exists() for a in archives)
    main = tmp_path / "multi_main.c"
    main.write_text(MULTI_MAIN)
    out_bytes = sum(lib.output_bytes for lib in libs)
    run = run_on_host(archives, [tmp_path / "fw"], {}, data, out_bytes, tmp_path / "run", main=main, progress=None)
    _check(libs, run, want)


@needs_qemu
def test_two_models_link_into_one_qemu_m4_program(two_models, tmp_path):
    libs, data, want = _emit_both(two_models, tmp_path / "fw")
    main = tmp_path / "multi_main.c"
    main.write_text(MULTI_MAIN)
    out_bytes = sum(lib.output_bytes for lib in libs)
    res = run_on_qemu(_sources(libs), [tmp_path / "fw"], {}, data, out_bytes, "cortex-m4", tmp_path / "run",
                      main=main, progress=None)
    _check(libs, res, want)


def test_models_from_another_corten_version_are_refused_at_compile_time(two_models, tmp_path):
    libs, _, _ = _emit_both(two_models, tmp_path)
    version = tmp_path / "corten_kernels" / "corten_kernels_version.h"
    version.write_text(version.read_text().replace("#define CORTEN_KERNELS_VERSION 0x", "#define CORTEN_KERNELS_VERSION 0x1"))
    res = subprocess.run(["gcc", "-std=c99", "-fsyntax-only", str(libs[0].source)], capture_output=True, text=True)
    assert res.returncode != 0 and "another Corten version" in res.stderr


# ----------------------------------------------------------------------------- readable, checkable C
def test_designated_initialisers_module_path_names_and_step_comments(two_models, tmp_path):
    import re

    (head, _), _ = two_models
    lib = head.emit_c(tmp_path)
    src, consts = lib.source.read_text(), lib.constants.read_text()
    structs = re.findall(r"const \w+ \w+ = \{.*", src)
    assert structs and all(s.split("= {", 1)[1].startswith(".") for s in structs), structs
    for name in ("head_conv_weight", "head_conv_bias", "head_dw_weight", "head_fc_weight", "head_fc_kernel_sum"):
        assert f"{name}[" in consts, name
    assert re.search(r"/\* Step 1: conv - quantized_conv2d \(test_firmware\.py:\d+ in forward\)", src)
    assert re.search(r"Step \d+: dw - quantized_depthwise_conv2d", src)
    assert [s.step for s in lib.steps] == list(range(1, len(lib.steps) + 1))
    assert f"#define HEAD_NUM_STEPS {len(lib.steps)}" in lib.header.read_text()
    header = lib.header.read_text()
    for macro in ("HEAD_INPUT_DIM_N 1", "HEAD_INPUT_DIM_H 8", "HEAD_INPUT_DIM_W 8", "HEAD_INPUT_DIM_C 3",
                  "HEAD_OUTPUT_RANK 2", "HEAD_OUTPUT_DIM1 4"):
        assert f"#define {macro}" in header, macro


STATUS_MAIN = r"""
#include <stdint.h>
#include <stdio.h>
#include "head.h"

static int8_t in[HEAD_INPUT_BYTES];
static int8_t out[HEAD_OUTPUT_BYTES];
static uint8_t arena[HEAD_ARENA_BYTES] __attribute__((aligned(16)));

int main(void)
{
    printf("short=%d\n", head_run_checked(in, out, arena, (size_t)HEAD_ARENA_BYTES - 1u));
    printf("null=%d\n", head_run_checked(NULL, out, arena, sizeof arena));
    printf("misaligned=%d\n", head_run(in, out, arena + 1));
    fclose(fopen("output.bin", "wb"));
    printf("CORTEN_RESULT status=%d elapsed=0 unit=ns\n", head_run_checked(in, out, arena, sizeof arena));
    return 0;
}
"""


def test_run_reports_the_failing_step_and_refuses_a_short_arena(two_models, tmp_path):
    (head, _), _ = two_models
    lib = head.emit_c(tmp_path / "lib")
    main = tmp_path / "status_main.c"
    main.write_text(STATUS_MAIN)
    res = run_on_host(lib.sources, lib.include_dirs, {}, b"", 0, tmp_path / "run", main=main, progress=None,
                      check=False)
    assert "short=-4" in res.log and "null=-1" in res.log and "misaligned=-2" in res.log
    assert res.status == 0
    # break the linear layer's call (negative in_features): _run returns that step's number
    linear = next(s for s in lib.steps if s.op == "quantized_linear")
    src = lib.source.read_text()
    broken = src.replace("corten_linear_s8(&params, &quant, 1, 8,", "corten_linear_s8(&params, &quant, 1, -8,")
    assert broken != src
    lib.source.write_text(broken)
    res = run_on_host(lib.sources, lib.include_dirs, {}, b"", 0, tmp_path / "run2", main=main, progress=None,
                      check=False)
    assert res.status == linear.step > 1


QUANT_MAIN = r"""
#include <stdint.h>
#include <stdio.h>
#include "head.h"

int main(void)
{
    static float x[QN];
    static int8_t q[QN];
    static float back[QN];
    FILE *f = fopen("input.bin", "rb");
    size_t i;
    if (f == NULL || fread(x, sizeof x[0], QN, f) != QN) {
        return 2;
    }
    fclose(f);
    for (i = 0; i < QN; i++) {
        q[i] = head_quantize_input(x[i]);
        back[i] = head_dequantize_output(q[i]);
    }
    f = fopen("output.bin", "wb");
    fwrite(q, 1, QN, f);
    fwrite(back, sizeof back[0], QN, f);
    fclose(f);
    printf("CORTEN_RESULT status=0 elapsed=0 unit=ns\n");
    return 0;
}
"""


def test_header_quantize_helpers_compute_what_python_computes(two_models, tmp_path):
    import numpy as np

    (head, _), _ = two_models
    lib = head.emit_c(tmp_path / "lib")
    s_in, z_in = head.inputs[0].scale, head.inputs[0].zero_point
    s32 = float(np.float32(s_in))
    ties = [(k + 0.5) * s32 for k in range(-140, 140)]  # exact .5 quotients (and their float32 neighbours)
    x = torch.tensor(ties + [1e30, -1e30, 0.0, -0.0, 3.4e38] + torch.randn(500).mul(4).tolist(), dtype=torch.float32)
    x = torch.cat([x, torch.nextafter(x, torch.full_like(x, 1e38)), torch.nextafter(x, torch.full_like(x, -1e38))])
    n = x.numel()
    main = tmp_path / "quant_main.c"
    main.write_text(QUANT_MAIN.replace("QN", str(n)))
    res = run_on_host(lib.sources, lib.include_dirs, {}, x.numpy().tobytes(), n * 5, tmp_path / "run", main=main,
                      progress=None)
    got_q = torch.from_numpy(np.frombuffer(res.output[:n], dtype=np.int8).copy())
    want_q = torch.ops.corten.quantize_per_tensor(x, s_in, z_in)
    assert torch.equal(got_q, want_q)
    got_back = torch.from_numpy(np.frombuffer(res.output[n:], dtype=np.float32).copy())
    o = head.outputs[0]
    assert torch.equal(got_back, torch.ops.corten.dequantize_per_tensor(got_q, o.scale, o.zero_point))


class TwoInTwoOut(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Conv2d(3, 8, 3, 1, 1)
        self.b = nn.Conv2d(3, 8, 3, 1, 1)
        self.fc = nn.Linear(8, 5)

    def forward(self, image, extra):
        z = torch.relu(self.a(image)) + self.b(extra)
        return self.fc(nn.functional.adaptive_avg_pool2d(z, 1).flatten(1)), z


IO_MAIN = r"""
#include <stdint.h>
#include <stdio.h>
#include "two_io.h"

static int8_t image[TWO_IO_INPUT0_BYTES];
static int8_t extra[TWO_IO_INPUT1_BYTES];
static int8_t logits[TWO_IO_OUTPUT0_BYTES];
static int8_t features[TWO_IO_OUTPUT1_BYTES];
static uint8_t arena[TWO_IO_ARENA_BYTES] __attribute__((aligned(16)));

int main(void)
{
    const two_io_inputs in = {.image = image, .extra = extra};
    const two_io_outputs out = {.output0 = logits, .output1 = features};
    FILE *f = fopen("input.bin", "rb");
    int status;
    if (f == NULL || fread(image, 1, sizeof image, f) != sizeof image || fread(extra, 1, sizeof extra, f) != sizeof extra) {
        return 2;
    }
    fclose(f);
    status = two_io_run_io(&in, &out, arena, sizeof arena);
    f = fopen("output.bin", "wb");
    fwrite(logits, 1, sizeof logits, f);
    fwrite(features, 1, sizeof features, f);
    fclose(f);
    printf("CORTEN_RESULT status=%d elapsed=0 unit=ns\n", status);
    return 0;
}
"""


def test_named_input_and_output_pointers(tmp_path):
    torch.manual_seed(1)
    x, y = torch.randn(1, 3, 8, 8), torch.randn(1, 3, 8, 8)
    prog = corten.compile(TwoInTwoOut().eval(), (x, y), name="two_io")
    lib = prog.emit_c(tmp_path / "lib")
    main = tmp_path / "io_main.c"
    main.write_text(IO_MAIN)
    data = b"".join(tensor_to_c_bytes(q) for q in prog.quantize_inputs(x, y))
    res = run_on_host(lib.sources, lib.include_dirs, {}, data, lib.output_bytes, tmp_path / "run", main=main,
                      progress=None)
    want = prog.run_int8(x, y)
    for t, w in zip(lib.outputs, want):
        assert torch.equal(c_bytes_to_tensor(res.output[t.offset:t.offset + t.nbytes], t.shape), w)


class OneInOneOut(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, 1, 1), nn.ReLU())
        self.block = nn.Conv2d(8, 8, 3, 1, 1, groups=8)
        self.head = nn.Linear(8, 4)

    def forward(self, image):
        z = self.block(self.stem(image)) + self.stem(image)
        return self.head(nn.functional.adaptive_avg_pool2d(z, 1).flatten(1))


ONE_IO_MAIN = r"""
#include <stdint.h>
#include <stdio.h>
#include "one_io.h"

static int8_t image[ONE_IO_INPUT_BYTES];
static int8_t logits[ONE_IO_OUTPUT_BYTES];
static uint8_t arena[ONE_IO_ARENA_BYTES] __attribute__((aligned(16)));

int main(void)
{
    const one_io_inputs in = {.image = image};
    const one_io_outputs out = {.output0 = logits};
    FILE *f = fopen("input.bin", "rb");
    int status;
    if (f == NULL || fread(image, 1, sizeof image, f) != sizeof image) {
        return 2;
    }
    fclose(f);
    status = one_io_run_io(&in, &out, arena, sizeof arena);
    f = fopen("output.bin", "wb");
    fwrite(logits, 1, sizeof logits, f);
    fclose(f);
    printf("CORTEN_RESULT status=%d elapsed=0 unit=ns\n", status);
    return 0;
}
"""


def test_a_single_tensor_model_has_typed_io_and_named_arena_pointers(tmp_path):
    """<name>_inputs / <name>_outputs / <name>_run_io for a one-input one-output model too, and every
    arena tensor of <name>.c is a named pointer (act_<module path>) instead of an (act + offset)."""
    torch.manual_seed(2)
    x = torch.randn(1, 3, 8, 8)
    prog = corten.compile(OneInOneOut().eval(), (x,), name="one_io")
    lib = prog.emit_c(tmp_path / "lib")
    header, source = (tmp_path / "lib" / "one_io.h").read_text(), (tmp_path / "lib" / "one_io.c").read_text()
    assert "} one_io_inputs;" in header and "} one_io_outputs;" in header and "one_io_run_io(" in header
    # offsets appear only in the pointer declarations
    assert [line for line in source.splitlines() if "act + " in line] == \
           [line for line in source.splitlines() if line.lstrip().startswith("int8_t *const ") and "= act + " in line]
    assert not [line for line in source.splitlines() if "(act + " in line or "(act)" in line]
    declared = [line.split("=")[0].split()[-1] for line in source.splitlines() if "int8_t *const act_" in line]
    assert {"act_stem_0", "act_block"} <= set(declared) and len(declared) == len(set(declared))
    main = tmp_path / "io_main.c"
    main.write_text(ONE_IO_MAIN)
    data = tensor_to_c_bytes(prog.quantize_inputs(x)[0])
    res = run_on_host(lib.sources, lib.include_dirs, {}, data, lib.output_bytes, tmp_path / "run", main=main,
                      progress=None)
    t = lib.outputs[0]
    assert torch.equal(c_bytes_to_tensor(res.output[:t.nbytes], t.shape), prog.run_int8(x)[0])
    assert torch.equal(prog.run_c(x, on="host", int8=True)[0], prog.run_int8(x)[0])  # <name>_run unchanged
