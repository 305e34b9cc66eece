"""``corten.quantized_maximum`` / ``quantized_minimum`` reference kernels vs ``naive_elementwise``
(``arm_maximum_s8`` / ``arm_minimum_s8`` with numpy broadcasting), opcheck, argument errors, and the
shapes for which the emitter may call CMSIS-NN's broadcasting kernels.

Case count: MINMAX_CASES random broadcastable shape pairs of ranks 1 to 4 per op.
"""
from __future__ import annotations

import itertools
import os
import random
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

import naive_elementwise as ne
import op_cases as oc
from corten.ops import CortenOpError
from corten.ops.minmax import cmsis_broadcast_supported

MINMAX_CASES = 1500
OPS = {"maximum": (torch.ops.corten.quantized_maximum, ne.maximum),
       "minimum": (torch.ops.corten.quantized_minimum, ne.minimum)}


@pytest.mark.parametrize("name", sorted(OPS))
def test_minmax_matches_naive(name):
    op, naive_fn = OPS[name]
    rng = random.Random(6300 + len(name))
    for i in range(MINMAX_CASES):
        s1, s2 = ne.random_broadcast_shapes(rng)
        x1, x2 = oc.int8_tensor(rng, s1), oc.int8_tensor(rng, s2)
        if x2.dim() == 4:
            x2 = oc.maybe_channels_last(rng, x2)
        out = op(x1, x2)
        shape, want = naive_fn(x1.tolist(), x2.tolist())
        assert out.dtype == torch.int8 and tuple(out.shape) == shape
        assert out.flatten().tolist() == want, f"case {i}: {s1} vs {s2}"
        assert oc.is_channels_last(out) if out.dim() == 4 else out.is_contiguous()


@pytest.mark.parametrize("name", sorted(OPS))
def test_opcheck_minmax(name):
    op, _ = OPS[name]
    rng = random.Random(1)
    for _ in range(3):
        s1, s2 = ne.random_broadcast_shapes(rng)
        torch.library.opcheck(op.default, (oc.int8_tensor(rng, s1), oc.int8_tensor(rng, s2)))


@pytest.mark.parametrize("name", sorted(OPS))
@pytest.mark.parametrize("arg, x1, x2", [
    ("input1", torch.zeros((2, 3), dtype=torch.int16), torch.zeros((2, 3), dtype=torch.int8)),
    ("input2", torch.zeros((2, 3), dtype=torch.int8), torch.zeros((2, 3), dtype=torch.float32)),
    ("input2", torch.zeros((2, 3), dtype=torch.int8), torch.zeros((2, 2), dtype=torch.int8)),
    ("input1", torch.zeros((1, 1, 1, 1, 1, 2), dtype=torch.int8), torch.zeros((2,), dtype=torch.int8)),  # rank 6
])
def test_minmax_bad_arguments(name, arg, x1, x2):
    op, _ = OPS[name]
    with pytest.raises(CortenOpError, match=rf"quantized_{name}.*'{arg}'"):
        op(x1, x2)


# ----------------------------------------------------------------------------- CMSIS-NN broadcast guard
def test_cmsis_broadcast_guard_examples():
    assert cmsis_broadcast_supported((1, 4, 4, 8), (1, 1, 1, 8))  # SE gate
    assert cmsis_broadcast_supported((1, 4, 4, 8), (1, 4, 4, 8))
    assert cmsis_broadcast_supported((1, 4, 4, 8), (1, 1, 1, 1))
    assert not cmsis_broadcast_supported((1, 4, 1, 1), (1, 4, 4, 8))  # [1,1,H,1] vs [1,C,H,W] in torch order
    assert not cmsis_broadcast_supported((2, 4, 4, 8), (2, 4, 1, 1))  # either operand order
    assert cmsis_broadcast_supported((1, 1, 6, 5), (1, 1, 1, 5))  # 2-D [6, 5] vs [1, 5]
    assert cmsis_broadcast_supported((1, 4, 1, 1), (1, 4, 1, 8))  # the other operand has W == 1


@pytest.mark.skipif(not os.environ.get("CMSIS_NN_PATH") or shutil.which("gcc") is None,
                    reason="needs CMSIS_NN_PATH (a CMSIS-NN source tree) and gcc")
def test_cmsis_broadcast_guard_against_cmsis_nn(tmp_path):
    """Every NHWC shape pair (dims 1..3) that the guard accepts is broadcast correctly by the real
    arm_maximum_s8 / arm_minimum_s8 (host build), and the guard rejects only pairs they get wrong."""
    root = Path(os.environ["CMSIS_NN_PATH"])
    pairs = [(a, b) for a in itertools.product((1, 2, 3), repeat=4) for b in itertools.product((1, 2, 3), repeat=4)
             if all(x == y or 1 in (x, y) for x, y in zip(a, b))]
    driver = tmp_path / "drv.c"
    driver.write_text(_DRIVER)
    exe = tmp_path / "drv"
    sources = [str(root / "Source/BasicMathFunctions" / f) for f in ("arm_maximum_s8.c", "arm_minimum_s8.c")]
    subprocess.run(["gcc", "-O1", "-I", str(root / "Include"), str(driver), *sources, "-o", str(exe)],
                   check=True, capture_output=True)
    stdin = "".join(" ".join(map(str, (*a, *b))) + "\n" for a, b in pairs)
    results = subprocess.run([str(exe)], input=stdin, capture_output=True, text=True, check=True).stdout.split()
    wrong = {pair for pair, ok in zip(pairs, results) if ok != "1"}
    accepted_but_wrong = [p for p in pairs if cmsis_broadcast_supported(*p) and p in wrong]
    assert not accepted_but_wrong
    rejected = [p for p in pairs if not cmsis_broadcast_supported(*p)]
    # the guard is tight: almost all it rejects are really wrong (others pass by luck of the data)
    assert len([p for p in rejected if p in wrong]) >= 0.9 * len(rejected) > 0


_DRIVER = r"""
#include <stdio.h>
#include <string.h>
#include "arm_nnfunctions.h"

/* Reads shape pairs (n h w c n h w c), prints 1 when both kernels match numpy broadcasting. */
static int check(int is_max, const int *d1, const int *d2)
{
    int8_t in1[128], in2[128], out[128], ref[128];
    int o[4], i, n, h, w, c, idx = 0;
    int n1 = d1[0] * d1[1] * d1[2] * d1[3], n2 = d2[0] * d2[1] * d2[2] * d2[3];
    for (i = 0; i < 4; i++) o[i] = d1[i] > d2[i] ? d1[i] : d2[i];
    memset(in1, 0, sizeof in1);
    memset(in2, 0, sizeof in2);
    for (i = 0; i < n1; i++) in1[i] = (int8_t)((i * 37) % 251 - 120);
    for (i = 0; i < n2; i++) in2[i] = (int8_t)((i * 53) % 241 - 110);
    for (n = 0; n < o[0]; n++) for (h = 0; h < o[1]; h++) for (w = 0; w < o[2]; w++) for (c = 0; c < o[3]; c++) {
        int i1 = (((d1[0] > 1 ? n : 0) * d1[1] + (d1[1] > 1 ? h : 0)) * d1[2] + (d1[2] > 1 ? w : 0)) * d1[3]
                 + (d1[3] > 1 ? c : 0);
        int i2 = (((d2[0] > 1 ? n : 0) * d2[1] + (d2[1] > 1 ? h : 0)) * d2[2] + (d2[2] > 1 ? w : 0)) * d2[3]
                 + (d2[3] > 1 ? c : 0);
        int8_t a = in1[i1], b = in2[i2];
        ref[idx++] = is_max ? (a >= b ? a : b) : (a <= b ? a : b);
    }
    {
        cmsis_nn_dims x = {d1[0], d1[1], d1[2], d1[3]}, y = {d2[0], d2[1], d2[2], d2[3]}, z = {o[0], o[1], o[2], o[3]};
        cmsis_nn_context ctx = {NULL, 0};
        memset(out, 0x55, sizeof out);
        if (is_max) arm_maximum_s8(&ctx, in1, &x, in2, &y, out, &z);
        else arm_minimum_s8(&ctx, in1, &x, in2, &y, out, &z);
    }
    return memcmp(out, ref, (size_t)idx) == 0;
}

int main(void)
{
    int d[8];
    while (scanf("%d %d %d %d %d %d %d %d", &d[0], &d[1], &d[2], &d[3], &d[4], &d[5], &d[6], &d[7]) == 8) {
        printf("%d\n", check(1, d, d + 4) && check(0, d, d + 4));
    }
    return 0;
}
"""
