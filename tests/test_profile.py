"""Per-step profile (``Program.profile``, ``corten profile``) and the kernel choices of a CMSIS-NN
build (``Program.kernel_choices``, the fallback section of the compile report).

The profile build calls ``<name>_profile_step(k)`` after every step; these tests check that its
rows are the library's steps (module path, op, kernel called, MACs), that they add up to the
uninstrumented run within 2% on QEMU, and that the instrumented run still reproduces the reference
bytes.  mv2-0.35-96 is profiled by ``benchmarks/bench_profile.py`` (README numbers); CI uses ds-cnn.
"""
from __future__ import annotations

import re

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from conftest import CMSIS_NN_PATH, needs_cmsis_nn, needs_gcc, needs_qemu

import corten
from corten.cli import main as cli_main
from corten.zoo import get_model


@pytest.fixture(scope="module")
def ds_cnn():
    model, example = get_model("ds-cnn")
    return corten.compile(model, example, target="cortex-m55", calibration=None, seed=0, name="ds_cnn")


class _Mixed(nn.Module):
    """Ops with and without CMSIS-NN kernels: conv (CMSIS-NN), hardswish (lookup table: portable),
    a squeeze-excitation gate (row broadcast: arm_elementwise_mul_s8 per pixel), a broadcast over H
    (portable mul), log_softmax (portable)."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.gate = nn.Conv2d(8, 8, 1)
        self.fc = nn.Linear(8 * 6 * 6, 10)

    def forward(self, x):
        y = F.hardswish(self.conv(x))
        y = y * torch.sigmoid(self.gate(y.mean((2, 3), keepdim=True)))  # [N,C,H,W] * [N,C,1,1]
        y = y * y[:, :, :, :1]  # [N,C,H,W] * [N,C,H,1]: not a row broadcast
        return F.log_softmax(self.fc(y.flatten(1)), dim=1)


@pytest.fixture(scope="module")
def mixed():
    torch.manual_seed(0)
    return corten.compile(_Mixed().eval(), (torch.randn(1, 3, 6, 6),), target="cortex-m55", calibration=None,
                          seed=0, name="mixed")


@needs_qemu
def test_profile_qemu_rows_add_up_and_outputs_exact(ds_cnn, tmp_path):
    prof = ds_cnn.profile(on="qemu", kernels="portable")
    steps = ds_cnn.kernel_choices("portable")
    assert [(r.step, r.module, r.op, r.kernel, r.macs) for r in prof.rows] == \
        [(s.step, s.module, s.op, s.kernel, s.macs) for s in steps]
    assert prof.outputs_match is True
    assert prof.unit == "instructions" and prof.baseline > 1e6
    assert abs(prof.ratio - 1.0) <= 0.02, prof.table()
    convs = [r for r in prof.rows if r.op == "quantized_conv2d"]
    assert convs and all(r.macs > 0 and r.cost > r.macs for r in convs)  # portable: > 1 instruction per MAC
    assert all(r.kernel.startswith("corten_") for r in prof.rows)
    assert sum(r.macs for r in prof.rows) == sum(s.macs for s in steps) > 2_000_000
    # the table: one line per step, the share and instructions per MAC
    table = prof.table()
    assert len(re.findall(r"^\s+\d+\s+\S", table, flags=re.M)) == len(prof.rows)
    assert "instr/MAC" in table and "100.0%" in table
    png = prof.plot(tmp_path / "p.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@needs_qemu
def test_cli_profile_prints_table_and_plot(ds_cnn, tmp_path, capsys):
    d = tmp_path / "prog"
    ds_cnn.save(d)
    png = tmp_path / "profile.png"
    assert cli_main(["profile", str(d), "--on", "qemu", "--plot", str(png), "--no-baseline"]) == 0
    out = capsys.readouterr().out
    assert "features.0.0" in out and "corten_conv2d_s8" in out and "instr/MAC" in out
    assert "byte-identical to the Python reference: YES" in out
    assert png.is_file() and png.stat().st_size > 1000


@needs_gcc
def test_profile_host_rows_are_time(mixed):
    prof = mixed.profile(on="host", kernels="portable", baseline=False)
    assert prof.unit == "ns" and prof.outputs_match is True and prof.baseline is None
    assert [r.op for r in prof.rows] == [s.op for s in mixed.kernel_choices("portable")]
    assert prof.total > 0


def test_generated_c_has_profile_hooks_compiled_out_by_default(mixed, tmp_path):
    lib = mixed.emit_c(tmp_path / "c")
    src, header = lib.source.read_text(), lib.header.read_text()
    n = len(lib.steps)
    assert src.count("MIXED_PROFILE_STEP(") == n + 3  # steps 0..n, plus the macro's two definitions
    assert f"MIXED_PROFILE_STEP({n});" in src and "#define MIXED_PROFILE_STEP(k) ((void)0)" in src
    assert "#ifdef CORTEN_PROFILE" in header and "void mixed_profile_step(int step);" in header


def test_kernel_choices_name_every_portable_step_of_a_cmsis_nn_build(mixed):
    steps = mixed.kernel_choices("cmsis-nn")
    by_kernel = {s.kernel: s for s in steps}
    assert by_kernel["arm_convolve_wrapper_s8"].reason == ""
    assert by_kernel["arm_elementwise_mul_s8"].reason == ""  # the SE gate, one call per pixel
    assert "lookup-table" in by_kernel["corten_lut_s8"].reason
    assert "log-softmax" in by_kernel["corten_log_softmax_s8"].reason
    assert "broadcast" in by_kernel["corten_mul_s8"].reason
    # every portable step has a reason, no CMSIS-NN step has one
    assert all(bool(s.reason) == (not s.kernel.startswith("arm_")) for s in steps)
    # a portable build has no fallbacks to explain
    assert not any(s.reason for s in mixed.kernel_choices("portable"))
    report = mixed.fallback_report()
    for s in steps:
        if s.reason:
            assert f"step {s.step:>3}" in report and s.reason in report


def test_kernel_choices_are_the_emitted_ones(mixed, tmp_path):
    """One definition: the emitted library's steps are the ones kernel_choices reports."""
    lib = mixed.emit_c(tmp_path / "c", kernels="cmsis-nn")
    assert lib.steps == mixed.kernel_choices("cmsis-nn")
    src = lib.source.read_text()
    for s in lib.steps:
        assert f"/* Step {s.step}: " in src and f"kernel {s.kernel} */" in src


def test_compile_report_lists_fallbacks(tmp_path, capsys):
    out = tmp_path / "ds"
    assert cli_main(["compile", "ds-cnn", "--out", str(out), "--calib", "2"]) == 0
    printed = capsys.readouterr().out
    report = (out / "report.txt").read_text()
    for text in (printed, report):
        assert "Kernels of a CMSIS-NN build:" in text
        assert "none falls back to a portable kernel" in text  # ds-cnn: every step on CMSIS-NN


@needs_cmsis_nn
@needs_qemu
def test_profile_cmsis_nn_on_qemu(mixed):
    prof = mixed.profile(on="qemu", kernels="cmsis-nn", cmsis_nn_path=CMSIS_NN_PATH)
    assert prof.outputs_match is True
    assert abs(prof.ratio - 1.0) <= 0.02, prof.table()
    assert {r.kernel for r in prof.rows if not r.portable} >= {"arm_convolve_wrapper_s8", "arm_elementwise_mul_s8"}
    assert "portable kernels in this CMSIS-NN build" in prof.table()


@needs_qemu
def test_portable_pointwise_conv_cost_on_m55():
    """Regression guard for the portable dot product on Cortex-M55 (issue 8: mv2 must not get
    slower): a 1x1 conv with 64 input channels runs in the plain multiply-accumulate form
    (CORTEN_DOT_BLOCKS=0 on Arm): 5.95 instructions per MAC with the requantization and the
    window loops; the blocked host form, which gcc turns into stack shuffles there, costs 8.56."""
    torch.manual_seed(0)
    prog = corten.compile(nn.Conv2d(64, 64, 1).eval(), (torch.randn(1, 64, 8, 8),), target="cortex-m55",
                          calibration=None, seed=0, name="pointwise")
    prof = prog.profile(on="qemu", kernels="portable", baseline=False)
    (row,) = [r for r in prof.rows if r.op == "quantized_conv2d"]
    assert prof.outputs_match and row.kernel == "corten_conv2d_s8"
    assert row.per_mac < 7.0, prof.table()
