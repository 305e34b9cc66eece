"""The example firmware project (examples/cortex-m55-qemu) builds with its Makefile (and CMake when
installed) against a generated model library and runs on the QEMU Cortex-M55 board."""
from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
from torch import nn

import corten
from corten.runners.program_runner import tensor_to_c_bytes
from corten.runners.qemu import BOARDS, qemu_command

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "cortex-m55-qemu"
needs_tools = pytest.mark.skipif(shutil.which("arm-none-eabi-gcc") is None or shutil.which("qemu-system-arm") is None
                                 or shutil.which("make") is None, reason="needs arm-none-eabi-gcc, make, qemu")


class Classifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 8, 3, padding=1)
        self.fc = nn.Linear(8, 5)

    def forward(self, x):
        return self.fc(nn.functional.adaptive_avg_pool2d(torch.relu(self.conv(x)), 1).flatten(1))


def _run_qemu(elf: Path, cwd: Path) -> str:
    res = subprocess.run(qemu_command(BOARDS["cortex-m55"], elf), cwd=cwd, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    return res.stdout + res.stderr


@needs_tools
def test_example_firmware_builds_and_runs_on_qemu(tmp_path):
    torch.manual_seed(0)
    x = torch.randn(1, 1, 6, 6)
    prog = corten.compile(Classifier().eval(), (x,), name="model", target="cortex-m55")
    lib = prog.emit_c(tmp_path / "model")
    # the firmware reads float32 values in the C buffer's order (NHWC)
    (tmp_path / "input.bin").write_bytes(tensor_to_c_bytes(x))
    want = int(torch.argmax(prog.run(x)))
    build = tmp_path / "build"
    res = subprocess.run(["make", "-s", f"MODEL_DIR={lib.out_dir}", f"BUILD={build}"], cwd=EXAMPLE,
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    out = _run_qemu(build / "firmware.elf", tmp_path)
    assert f"class {want} " in out, out
    cycles = int(re.search(r"cycles (\d+)", out).group(1))
    instructions = int(re.search(r"instructions (\d+)", out).group(1))
    assert cycles > 0 and instructions == cycles * 125 // 4

    if shutil.which("cmake") is None:
        return
    cbuild = tmp_path / "cmake-build"
    for cmd in (["cmake", "-S", str(EXAMPLE), "-B", str(cbuild), f"-DMODEL_DIR={lib.out_dir}",
                 f"-DCMAKE_TOOLCHAIN_FILE={EXAMPLE / 'arm-none-eabi.cmake'}"], ["cmake", "--build", str(cbuild)]):
        res = subprocess.run(cmd, capture_output=True, text=True)
        assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert f"class {want} " in _run_qemu(cbuild / "firmware.elf", tmp_path)


@needs_tools
def test_example_firmware_with_memory_regions_and_weights_in_flash(tmp_path):
    """Issue 25: the same project with a two-region arena (DTCM + SRAM) and the weights in a section
    of their own: it links the model's <name>_sections.ld, runs, and its map puts the arenas in the
    board's DTCM and SRAM and the weights in the QSPI flash."""
    torch.manual_seed(0)
    x = torch.randn(1, 1, 6, 6)
    prog = corten.compile(Classifier().eval(), (x,), name="model", target="cortex-m55",
                          memory={"dtcm": 256, "sram": None}, weights_section=".ext_flash")
    plan = prog.memory_for("portable")
    assert all(r.nbytes > 0 for r in plan.regions)
    lib = prog.emit_c(tmp_path / "model")
    (tmp_path / "input.bin").write_bytes(tensor_to_c_bytes(x))
    build = tmp_path / "build"
    res = subprocess.run(["make", "-s", f"MODEL_DIR={lib.out_dir}", f"BUILD={build}"], cwd=EXAMPLE,
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert f"class {int(torch.argmax(prog.run(x)))} " in _run_qemu(build / "firmware.elf", tmp_path)
    text = (build / "firmware.map").read_text()
    where = {m.group(1): int(m.group(2), 16) for m in re.finditer(r"^(\.[\w.]+)\s+(0x[0-9a-f]+)\s+0x[0-9a-f]+",
                                                                    text, re.M)}
    assert where[".bss.corten_dtcm"] == 0x20000000 and where[".bss.corten_sram"] == 0x21000000
    assert where[".ext_flash"] == 0x28000000
    assert re.search(r"\.ext_flash\s+0x0*28000000\s+0x[0-9a-f]+ \S*libmodel\.a", text)  # the model's weights

