"""Runners: a hand-written model library runs bit-exactly on the host and on every QEMU board."""
from __future__ import annotations

import shutil
import struct
from pathlib import Path

import numpy as np
import pytest

from corten.runners import (
    BOARDS,
    CBuildError,
    CRunError,
    CRunTimeout,
    UnsupportedTargetError,
    board_for,
    harness_defines,
    run_on_host,
    run_on_qemu,
)
from corten.runners.common import complete_defines, parse_harness_report
from conftest import needs_qemu

HAVE_ARM_TOOLS = shutil.which("arm-none-eabi-gcc") is not None and shutil.which(
    "qemu-system-arm"
) is not None
TARGETS = sorted(BOARDS)
QUIET = None  # progress sink for tests

# ---------------------------------------------------------------------------------------------
# A tiny model library: out[i] = in[i] + 1 (int8 wrap-around), then a little-endian int32
# dot product of the incremented bytes with a 4 KiB const table; the bytes go through a 64 KiB
# arena at scattered offsets so that the arena and the const table are really used.
TINY_IN = 64
TINY_OUT = TINY_IN + 4
TINY_ARENA = 64 * 1024
TINY_ARENA_ALIGN = 64
TABLE_SIZE = 4096


def tiny_table() -> np.ndarray:
    return ((np.arange(TABLE_SIZE, dtype=np.int64) * 37 + 11) % 256 - 128).astype(np.int8)


def tiny_expected(inp: bytes) -> bytes:
    x = np.frombuffer(inp, dtype=np.int8).astype(np.int64)
    y = ((x + 1 + 128) % 256 - 128).astype(np.int64)
    table = tiny_table().astype(np.int64)
    dot = int(sum(int(y[i]) * int(table[(i * 61) % TABLE_SIZE]) for i in range(TINY_IN)))
    return y.astype(np.int8).tobytes() + struct.pack("<i", dot)


def write_tiny_library(directory: Path, status: int = 0) -> Path:
    table = ", ".join(str(int(v)) for v in tiny_table())
    (directory / "tiny.h").write_text(
        "#include <stdint.h>\n"
        "int tiny_run(const int8_t *input, int8_t *output, uint8_t *arena);\n"
    )
    source = directory / "tiny.c"
    source.write_text(
        f"""#include "tiny.h"
static const int8_t tiny_table[{TABLE_SIZE}] = {{{table}}};
int tiny_run(const int8_t *input, int8_t *output, uint8_t *arena)
{{
    int32_t dot = 0;
    uint32_t udot;
    int i;
    if (((uintptr_t)arena % {TINY_ARENA_ALIGN}u) != 0u) {{
        return -2; /* the harness must honour CORTEN_ARENA_ALIGN */
    }}
    for (i = 0; i < {TINY_IN}; ++i) {{
        arena[(i * 1021) % {TINY_ARENA}] = (uint8_t)(int8_t)(input[i] + 1);
    }}
    for (i = 0; i < {TINY_IN}; ++i) {{
        int8_t y = (int8_t)arena[(i * 1021) % {TINY_ARENA}];
        output[i] = y;
        dot += (int32_t)y * tiny_table[(i * 61) % {TABLE_SIZE}];
    }}
    udot = (uint32_t)dot;
    for (i = 0; i < 4; ++i) {{
        output[{TINY_IN} + i] = (int8_t)(uint8_t)(udot >> (8 * i));
    }}
    return {status};
}}
"""
    )
    return source


@pytest.fixture(scope="module")
def tiny_lib(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("tiny_lib")
    write_tiny_library(directory)
    return directory


@pytest.fixture(scope="module")
def tiny_input() -> bytes:
    rng = np.random.default_rng(7)
    data = rng.integers(-128, 128, size=TINY_IN, dtype=np.int64).astype(np.int8)
    data[:3] = [127, -128, -1]  # wrap-around cases
    return data.tobytes()


def tiny_defines() -> dict[str, str]:
    return harness_defines("tiny.h", "tiny_run", TINY_IN, TINY_OUT, TINY_ARENA, TINY_ARENA_ALIGN)


def test_tiny_on_host(tiny_lib, tiny_input, tmp_path):
    result = run_on_host(
        [tiny_lib / "tiny.c"], [tiny_lib], tiny_defines(), tiny_input, TINY_OUT, tmp_path,
        progress=QUIET,
    )
    assert result.status == 0
    assert result.output == tiny_expected(tiny_input)
    assert result.instructions is None
    assert 0.0 <= result.wall_s < 1.0


@needs_qemu
@pytest.mark.parametrize("target", TARGETS)
def test_tiny_on_qemu(target, tiny_lib, tiny_input, tmp_path):
    result = run_on_qemu(
        [tiny_lib / "tiny.c"], [tiny_lib], tiny_defines(), tiny_input, TINY_OUT, target,
        tmp_path, timeout_s=60, progress=QUIET,
    )
    assert result.status == 0
    assert result.output == tiny_expected(tiny_input)
    # 128 loop iterations of a handful of instructions each, plus the tail
    assert 4 * TINY_IN < result.instructions < 60 * TINY_IN
    assert BOARDS[target].machine in result.where
    assert result.wall_s > 0


# ---------------------------------------------------------------------------------------------
# Instruction counting against a busy loop of exactly 2 * SPIN_N instructions.
SPIN_N = 100_000
SPIN_SOURCE = """#include <stdint.h>
int spin_run(const int8_t *input, int8_t *output, uint8_t *arena);
int spin_run(const int8_t *input, int8_t *output, uint8_t *arena)
{
    uint32_t n = SPIN_N;
    (void)arena;
    __asm__ volatile("1: subs %0, %0, #1\\n\\tbne 1b" : "+r"(n));
    output[0] = (int8_t)(input[0] + 1);
    return 0;
}
"""


def run_spin(target: str, directory: Path, extra_defines: dict[str, str]) -> int:
    (directory / "spin.h").write_text(
        "#include <stdint.h>\nint spin_run(const int8_t *input, int8_t *output, uint8_t *arena);\n"
    )
    (directory / "spin.c").write_text(SPIN_SOURCE)
    defines = harness_defines("spin.h", "spin_run", 1, 1, 16) | {"SPIN_N": str(SPIN_N)}
    result = run_on_qemu(
        [directory / "spin.c"], [directory], defines | extra_defines, b"\x05", 1, target,
        directory / "run", timeout_s=60, progress=QUIET,
    )
    assert result.output == b"\x06"
    return result.instructions


@needs_qemu
@pytest.mark.parametrize("target", TARGETS)
def test_instruction_count_matches_known_loop(target, tmp_path):
    instructions = run_spin(target, tmp_path, {})
    # one tick of quantisation (<= 40 instructions) + call and timer-read overhead
    tick = BOARDS[target].instructions_per_tick
    assert 2 * SPIN_N - tick <= instructions <= 2 * SPIN_N + 120, instructions


@needs_qemu
@pytest.mark.parametrize("target", TARGETS)
def test_instruction_count_across_systick_wraps(target, tmp_path):
    reload = 0x1FF  # wrap every 512 ticks: the 200k-instruction loop wraps 7-12 times
    instructions = run_spin(target, tmp_path, {"CORTEN_SYSTICK_RELOAD": hex(reload)})
    wraps = 2 * SPIN_N / BOARDS[target].instructions_per_tick / (reload + 1)
    assert wraps > 4
    # each wrap adds the few instructions of the SysTick handler
    tick = BOARDS[target].instructions_per_tick
    assert 2 * SPIN_N - tick <= instructions <= 2 * SPIN_N + 120 + 10 * (wraps + 1), instructions


# ---------------------------------------------------------------------------------------------
# MobileNetV2-224 needs ~3.5 MB of const weights and a ~1.6 MB arena: 4 MiB + 2 MiB must fit.
BIG_CONST = 4 * 1024 * 1024
BIG_ARENA = 2 * 1024 * 1024
BIG_SOURCE = f"""#include "big.h"
static const int8_t big_weights[{BIG_CONST}] = {{
    [0] = 1, [{BIG_CONST // 2}] = 2, [{BIG_CONST} - 4096] = 3, [{BIG_CONST} - 1] = 4}};
int big_run(const int8_t *input, int8_t *output, uint8_t *arena)
{{
    long i;
    uint32_t weight_sum = 0;
    uint32_t arena_sum = 0;
    for (i = 0; i < {BIG_CONST}; i += 4096) {{
        weight_sum += (uint32_t)(big_weights[i] * (i / 4096 + 1));
    }}
    for (i = 0; i < {BIG_ARENA}; i += 4096) {{
        arena[i] = (uint8_t)(i / 4096 + input[0]);
    }}
    arena[{BIG_ARENA} - 1] = 0x5a;
    for (i = 0; i < {BIG_ARENA}; i += 4096) {{
        arena_sum += arena[i];
    }}
    output[0] = (int8_t)(weight_sum & 0xff);
    output[1] = (int8_t)((weight_sum >> 8) & 0xff);
    output[2] = (int8_t)(arena_sum & 0xff);
    output[3] = (int8_t)((arena_sum >> 8) & 0xff);
    output[4] = (int8_t)arena[{BIG_ARENA} - 1];
    output[5] = big_weights[{BIG_CONST} - 1 - (input[0] & 0)];
    return 0;
}}
"""


def big_expected(first_input: int) -> bytes:
    pages = BIG_CONST // 4096
    weight_sum = 1 * 1 + 2 * (pages // 2 + 1) + 3 * pages
    arena_sum = sum((p + first_input) & 0xFF for p in range(BIG_ARENA // 4096))
    return bytes([weight_sum & 0xFF, (weight_sum >> 8) & 0xFF, arena_sum & 0xFF,
                  (arena_sum >> 8) & 0xFF, 0x5A, 4])


@pytest.fixture(scope="module")
def big_lib(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("big_lib")
    (directory / "big.h").write_text(
        "#include <stdint.h>\nint big_run(const int8_t *input, int8_t *output, uint8_t *arena);\n"
    )
    (directory / "big.c").write_text(BIG_SOURCE)
    return directory


@needs_qemu
@pytest.mark.parametrize("target", TARGETS)
def test_large_const_and_arena_fit_every_board(target, big_lib, tmp_path):
    defines = harness_defines("big.h", "big_run", 1, 6, BIG_ARENA)
    result = run_on_qemu(
        [big_lib / "big.c"], [big_lib], defines, b"\x03", 6, target, tmp_path,
        timeout_s=60, progress=QUIET,
    )
    assert result.output == big_expected(3)
    elf_map = (tmp_path / "corten_harness.map").read_text()
    assert "big_weights" in elf_map  # the 4 MiB table was linked, not folded away


@needs_qemu
def test_arena_larger_than_board_ram_is_a_link_error(big_lib, tmp_path):
    defines = harness_defines("big.h", "big_run", 1, 6, 5 * 1024 * 1024)
    with pytest.raises(CBuildError, match=r"cortex-m4 on QEMU mps2-an386(.|\n)*does not fit(.|\n)*ZBT SSRAM2/3"):
        run_on_qemu([big_lib / "big.c"], [big_lib], defines, b"\x03", 6, "cortex-m4", tmp_path,
                    progress=QUIET)


def test_large_const_and_arena_on_host(big_lib, tmp_path):
    defines = harness_defines("big.h", "big_run", 1, 6, BIG_ARENA)
    result = run_on_host([big_lib / "big.c"], [big_lib], defines, b"\x03", 6, tmp_path, progress=QUIET)
    assert result.output == big_expected(3)


# ---------------------------------------------------------------------------------------------
# Error paths
@pytest.fixture(scope="module")
def failing_lib(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("failing_lib")
    write_tiny_library(directory, status=3)
    return directory


@needs_qemu
@pytest.mark.parametrize("target", TARGETS)
def test_nonzero_model_status_is_an_error_naming_the_board(target, failing_lib, tiny_input, tmp_path):
    args = ([failing_lib / "tiny.c"], [failing_lib], tiny_defines(), tiny_input, TINY_OUT, target)
    machine = BOARDS[target].machine
    with pytest.raises(CRunError, match=rf"{target} on QEMU {machine}.*status 3"):
        run_on_qemu(*args, tmp_path, timeout_s=60, progress=QUIET)
    result = run_on_qemu(*args, tmp_path, timeout_s=60, check=False, progress=QUIET)
    assert result.status == 3 and result.output == b""


def test_nonzero_model_status_on_host(failing_lib, tiny_input, tmp_path):
    args = ([failing_lib / "tiny.c"], [failing_lib], tiny_defines(), tiny_input, TINY_OUT, tmp_path)
    with pytest.raises(CRunError, match=r"host.*status 3"):
        run_on_host(*args, progress=QUIET)
    assert run_on_host(*args, check=False, progress=QUIET).status == 3


@needs_qemu
def test_fault_is_reported_with_fault_registers(tmp_path):
    (tmp_path / "bad.h").write_text(
        "#include <stdint.h>\nint bad_run(const int8_t *input, int8_t *output, uint8_t *arena);\n"
    )
    (tmp_path / "bad.c").write_text(
        '#include "bad.h"\n'
        "int bad_run(const int8_t *input, int8_t *output, uint8_t *arena)\n{\n"
        "    (void)arena;\n"
        "    output[0] = *(volatile const int8_t *)(uintptr_t)(0xF0000000u + (uint8_t)input[0]);\n"
        "    return 0;\n}\n"
    )
    defines = harness_defines("bad.h", "bad_run", 1, 1, 16)
    with pytest.raises(CRunError, match=r"cortex-m3 on QEMU mps2-an385(.|\n)*CORTEN_FAULT"):
        run_on_qemu([tmp_path / "bad.c"], [tmp_path], defines, b"\x00", 1, "cortex-m3", tmp_path,
                    timeout_s=60, progress=QUIET)


@needs_qemu
def test_warnings_are_build_errors_naming_the_board(tmp_path):
    (tmp_path / "warn.h").write_text(
        "#include <stdint.h>\nint warn_run(const int8_t *input, int8_t *output, uint8_t *arena);\n"
    )
    (tmp_path / "warn.c").write_text(
        '#include "warn.h"\nint warn_run(const int8_t *input, int8_t *output, uint8_t *arena)\n'
        "{\n    int unused;\n    (void)input; (void)output; (void)arena;\n    return 0;\n}\n"
    )
    defines = harness_defines("warn.h", "warn_run", 1, 1, 16)
    with pytest.raises(CBuildError, match=r"cortex-m55 on QEMU mps3-an547(.|\n)*unused"):
        run_on_qemu([tmp_path / "warn.c"], [tmp_path], defines, b"\x00", 1, "cortex-m55", tmp_path,
                    progress=QUIET)


@pytest.mark.parametrize("target", ["cortex-m0", "cortex-m0plus", "cortex-m85"])
def test_target_without_board_names_the_runnable_targets(target, tmp_path):
    with pytest.raises(UnsupportedTargetError, match=r"cortex-m3, cortex-m4, cortex-m7, cortex-m33, cortex-m55"):
        run_on_qemu([], [], tiny_defines(), bytes(TINY_IN), TINY_OUT, target, tmp_path, progress=QUIET)


def test_unknown_target_is_rejected():
    with pytest.raises(ValueError, match="unknown target"):
        board_for("cortex-a53")


def test_defines_must_agree_with_io_sizes():
    with pytest.raises(ValueError, match="CORTEN_OUTPUT_BYTES=68.*5 bytes"):
        complete_defines(tiny_defines(), TINY_IN, 5)
    with pytest.raises(ValueError, match="missing CORTEN_RUN"):
        complete_defines({"CORTEN_MODEL_HEADER": "x.h", "CORTEN_ARENA_BYTES": "1"}, 1, 1)
    filled = complete_defines({"CORTEN_MODEL_HEADER": "x.h", "CORTEN_RUN": "x_run",
                               "CORTEN_ARENA_BYTES": "16"}, 3, 4)
    assert filled["CORTEN_MODEL_HEADER"] == '"x.h"'
    assert (filled["CORTEN_INPUT_BYTES"], filled["CORTEN_OUTPUT_BYTES"]) == ("3", "4")


def test_parse_harness_report_takes_the_last_result_line():
    text = "noise\nCORTEN_RESULT status=0 elapsed=12 unit=ticks\nCORTEN_RESULT status=-2 elapsed=7 unit=ns\n"
    report = parse_harness_report(text)
    assert (report.status, report.elapsed, report.unit) == (-2, 7, "ns")
    assert parse_harness_report("CORTEN_FAULT icsr=0") is None


@needs_qemu
def test_timeout_kills_qemu_and_names_the_board(tmp_path):
    (tmp_path / "hang.h").write_text(
        "#include <stdint.h>\nint hang_run(const int8_t *input, int8_t *output, uint8_t *arena);\n"
    )
    (tmp_path / "hang.c").write_text(
        '#include "hang.h"\nint hang_run(const int8_t *input, int8_t *output, uint8_t *arena)\n{\n'
        "    (void)input; (void)output; (void)arena;\n"
        '    for (;;) {\n        __asm__ volatile("nop");\n    }\n}\n'
    )
    defines = harness_defines("hang.h", "hang_run", 1, 1, 16)
    with pytest.raises(CRunTimeout, match=r"cortex-m7 on QEMU mps2-an500.*within 1 s"):
        run_on_qemu([tmp_path / "hang.c"], [tmp_path], defines, b"\x00", 1, "cortex-m7", tmp_path,
                    timeout_s=1, progress=QUIET)


def build_helper_archive(directory: Path, cc: str, flags: list[str]) -> Path:
    """A prebuilt static library providing helper_add(), as a CMSIS-NN archive would be."""
    import subprocess

    (directory / "helper.c").write_text(
        "#include <stdint.h>\nint8_t helper_add(int8_t a, int8_t b);\n"
        "int8_t helper_add(int8_t a, int8_t b) { return (int8_t)(a + b); }\n"
    )
    obj, archive = directory / "helper.o", directory / "libhelper.a"
    subprocess.run([cc, *flags, "-c", str(directory / "helper.c"), "-o", str(obj)], check=True)
    subprocess.run([cc.replace("gcc", "ar"), "rcs", str(archive), str(obj)], check=True)
    return archive


def write_archive_user(directory: Path) -> Path:
    (directory / "user.h").write_text(
        "#include <stdint.h>\nint user_run(const int8_t *input, int8_t *output, uint8_t *arena);\n"
    )
    (directory / "user.c").write_text(
        '#include "user.h"\nint8_t helper_add(int8_t a, int8_t b);\n'
        "int user_run(const int8_t *input, int8_t *output, uint8_t *arena)\n{\n"
        "    (void)arena;\n    output[0] = helper_add(input[0], input[1]);\n    return 0;\n}\n"
    )
    return directory / "user.c"


@pytest.mark.parametrize("where", ["host", "cortex-m3"])
def test_prebuilt_archives_are_linked_after_the_sources(where, tmp_path):
    if where != "host" and not HAVE_ARM_TOOLS:
        pytest.skip("arm-none-eabi-gcc/qemu-system-arm missing")
    user = write_archive_user(tmp_path)
    defines = harness_defines("user.h", "user_run", 2, 1, 16)
    if where == "host":
        archive = build_helper_archive(tmp_path, "gcc", ["-O2"])
        result = run_on_host([archive, user], [tmp_path], defines, b"\x05\x07", 1, tmp_path / "run",
                             progress=QUIET)
    else:
        archive = build_helper_archive(tmp_path, "arm-none-eabi-gcc", ["-O2", "-mcpu=cortex-m3", "-mthumb"])
        result = run_on_qemu([archive, user], [tmp_path], defines, b"\x05\x07", 1, where, tmp_path / "run",
                             timeout_s=60, progress=QUIET)
    assert result.output == b"\x0c"


MVE_SOURCE = """#include "mve.h"
#include <arm_mve.h>
int mve_run(const int8_t *input, int8_t *output, uint8_t *arena)
{
    int8x16_t x = vldrbq_s8(input);
    int8x16_t y = vqaddq_s8(x, vdupq_n_s8(100)); /* saturating add: needs the MVE unit */
    (void)arena;
    vstrbq_s8(output, y);
    return 0;
}
"""


@needs_qemu
def test_helium_instructions_run_on_cortex_m55(tmp_path):
    """startup.c must enable CP10/CP11 before MVE code runs (else a NOCP UsageFault)."""
    (tmp_path / "mve.h").write_text(
        "#include <stdint.h>\nint mve_run(const int8_t *input, int8_t *output, uint8_t *arena);\n"
    )
    (tmp_path / "mve.c").write_text(MVE_SOURCE)
    x = np.arange(-128, 128, 16, dtype=np.int64).astype(np.int8)
    defines = harness_defines("mve.h", "mve_run", 16, 16, 16)
    result = run_on_qemu([tmp_path / "mve.c"], [tmp_path], defines, x.tobytes(), 16, "cortex-m55",
                         tmp_path / "run", timeout_s=60, progress=QUIET)
    assert result.output == np.clip(x.astype(np.int64) + 100, -128, 127).astype(np.int8).tobytes()
    assert 0 < result.instructions < 100
