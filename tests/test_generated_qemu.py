"""Corten's generated kernels on QEMU: random conv / depthwise / linear layers compiled for the
Cortex-M3 (plain C), M4 (DSP intrinsics) and M55 (Helium intrinsics), byte for byte against the
reference ops (the same layers as tests/test_generated_kernels.py, whose helpers build the C)."""
from __future__ import annotations

import numpy as np
import pytest

from conftest import needs_qemu
from corten.codegen.emitter import KERNELS_DIR
from corten.runners.common import harness_defines
from corten.runners.qemu import run_on_qemu
from test_generated_kernels import (expected_bytes, helium_specs, layer_inputs, layers_source,
                                    matvec_specs, narrow_specs, planar_specs, pointwise_specs, random_specs,
                                    window_specs)


@needs_qemu
@pytest.mark.parametrize("target, isa", [("cortex-m4", "dsp"), ("cortex-m55", "mve"), ("cortex-m3", "plain")])
def test_generated_layers_on_qemu(target, isa, tmp_path):
    # (matrix-vector on M4; windows, depthwise rows of 16 channels and dense tile loops on M55)
    # (and the pointwise and gathered-window assembly loops on M4)
    helium, pointwise = helium_specs(), pointwise_specs() + window_specs()
    specs = random_specs(11, 24) + matvec_specs() + narrow_specs() + helium + pointwise
    narrow, tail = len(narrow_specs()), len(helium) + len(pointwise)
    xs = (layer_inputs(specs[:24], seed=5) + layer_inputs(specs[24:-narrow - tail], seed=5, last_at_minimum=True)
          + layer_inputs(specs[-narrow - tail:-tail], seed=9) + layer_inputs(helium, seed=3)
          + layer_inputs(pointwise, seed=6, last_at_minimum=True))
    (tmp_path / "layers.c").write_text(layers_source(specs, isa))
    (tmp_path / "layers.h").write_text("#include <stdint.h>\nint layers_run(const int8_t *in, int8_t *out, uint8_t *arena);\n")
    in_bytes = b"".join(x.numpy().tobytes() for x in xs)
    want = expected_bytes(specs, xs)
    defines = harness_defines("layers.h", "layers_run", len(in_bytes), want.size, 16)
    res = run_on_qemu([tmp_path / "layers.c"], [tmp_path, KERNELS_DIR], defines, in_bytes, want.size, target,
                      tmp_path / "run", progress=None)
    assert np.array_equal(np.frombuffer(res.output, dtype=np.int8), want)


@needs_qemu
def test_planar_depthwise_on_qemu_m4(tmp_path):
    """The channel-planar 3x3 depthwise layers (assembly rows, C gathers) on the Cortex-M4."""
    specs = planar_specs()
    xs = layer_inputs(specs, seed=12) + layer_inputs(specs, seed=13, last_at_minimum=True)
    specs = specs + specs
    (tmp_path / "layers.c").write_text(layers_source(specs, "dsp"))
    assert "smlatb r9" in (tmp_path / "layers.c").read_text()
    (tmp_path / "layers.h").write_text("#include <stdint.h>\nint layers_run(const int8_t *in, int8_t *out, uint8_t *arena);\n")
    in_bytes = b"".join(x.numpy().tobytes() for x in xs)
    want = expected_bytes(specs, xs)
    defines = harness_defines("layers.h", "layers_run", len(in_bytes), want.size, 16)
    res = run_on_qemu([tmp_path / "layers.c"], [tmp_path, KERNELS_DIR], defines, in_bytes, want.size, "cortex-m4",
                      tmp_path / "run", progress=None)
    assert np.array_equal(np.frombuffer(res.output, dtype=np.int8), want)


@needs_qemu
def test_generated_layers_in_a_debug_build_on_qemu_m4(tmp_path):
    """An unoptimised build (-O0: r7 is the frame pointer) of a few layers of every DSP family - dense,
    depthwise (segments and channel-planar rows), matrix-vector, pointwise, gathered windows - compiles
    (the 14-register assembly blocks are C there: CG_DSP_ASM) and gives the reference bytes."""
    specs = (random_specs(11, 6) + matvec_specs()[:2] + pointwise_specs()[:2] + window_specs()[:2]
             + planar_specs()[:2])
    xs = layer_inputs(specs, seed=7, last_at_minimum=True)
    (tmp_path / "layers.c").write_text(layers_source(specs, "dsp"))
    (tmp_path / "layers.h").write_text("#include <stdint.h>\nint layers_run(const int8_t *in, int8_t *out, uint8_t *arena);\n")
    in_bytes = b"".join(x.numpy().tobytes() for x in xs)
    want = expected_bytes(specs, xs)
    defines = harness_defines("layers.h", "layers_run", len(in_bytes), want.size, 16)
    res = run_on_qemu([tmp_path / "layers.c"], [tmp_path, KERNELS_DIR], defines, in_bytes, want.size, "cortex-m4",
                      tmp_path / "run", cflags=("-O0",), progress=None)
    assert np.array_equal(np.frombuffer(res.output, dtype=np.int8), want)
