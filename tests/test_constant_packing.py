"""The constant writer's packed sub-byte arrays (int4 weights: two per byte, CMSIS-NN's s4 layout)."""
from __future__ import annotations

import subprocess

import pytest
import torch

from conftest import needs_gcc
from corten.codegen.emitter import _Array, _format_array, pack_nibbles
from corten.errors import CodegenError


def naive_unpack(packed: bytes, n: int) -> list[int]:
    """Element 2k is the low nibble of byte k, 2k+1 the high one; nibbles are two's complement."""
    out = []
    for k in range(n):
        nib = (packed[k // 2] >> (4 * (k % 2))) & 0xF
        out.append(nib - 16 if nib >= 8 else nib)
    return out


def test_every_pair_of_int4_values_packs_into_one_byte():
    values = torch.tensor([[a, b] for a in range(-8, 8) for b in range(-8, 8)], dtype=torch.int8)
    packed = pack_nibbles(values)
    assert packed.dtype == torch.int8 and packed.numel() == 256
    assert sorted(packed.view(torch.uint8).tolist()) == list(range(256))  # a bijection
    assert naive_unpack(packed.view(torch.uint8).numpy().tobytes(), 512) == values.reshape(-1).tolist()


def test_cmsis_nn_example_and_odd_counts():
    assert pack_nibbles(torch.tensor([1, 2, 3, 4])).view(torch.uint8).tolist() == [0x21, 0x43]  # arm_nnfunctions.h
    assert pack_nibbles(torch.tensor([-1, 7, -8])).view(torch.uint8).tolist() == [0x7F, 0x08]  # last high nibble 0
    assert pack_nibbles(torch.tensor([], dtype=torch.int8)).numel() == 0
    with pytest.raises(CodegenError, match=r"\[-8, 7\]"):
        pack_nibbles(torch.tensor([8]))


def test_array_of_int4_values_is_half_the_bytes():
    g = torch.Generator().manual_seed(0)
    w = torch.randint(-8, 8, (3, 5, 7), generator=g, dtype=torch.int8)
    arr = _Array("net_w", w, bits=4)
    assert arr.ctype == "int8_t" and arr.length == (w.numel() + 1) // 2 and arr.nbytes == 53
    text = _format_array(arr)
    assert text.startswith("/* 3x5x7 int4, packed 2 per int8_t") and "net_w[53]" in text


@needs_gcc
def test_c_reads_the_packed_array_back(tmp_path):
    """The emitted C array, read by C with CMSIS-NN's nibble order, gives back every value."""
    g = torch.Generator().manual_seed(1)
    w = torch.randint(-8, 8, (37,), generator=g, dtype=torch.int8)
    src = tmp_path / "unpack.c"
    src.write_text("#include <stdint.h>\n#include <stdio.h>\n#define CORTEN_CONST_ALIGNED\n"
                   + _format_array(_Array("w", w, bits=4))
                   + "int main(void) {\n    int k;\n    for (k = 0; k < 37; k++) {\n"
                     "        const int nib = (w[k / 2] >> (4 * (k % 2))) & 0xF;\n"
                     "        printf(\"%d \", nib >= 8 ? nib - 16 : nib);\n    }\n    return 0;\n}\n")
    exe = tmp_path / "unpack"
    subprocess.run(["cc", "-std=c99", "-Wall", "-Werror", str(src), "-o", str(exe)], check=True)
    out = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout
    assert [int(v) for v in out.split()] == w.tolist()
