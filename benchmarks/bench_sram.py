"""Issue 10 acceptance numbers in one run: banded schedules under an SRAM budget.

For each zoo model and budget: the arena layer by layer and with ``max_arena`` (Cortex-M55,
CMSIS-NN scratch), the schedule's extra MACs, byte-exactness of the banded program against the
unbanded one (Python reference; host C with the portable kernels and, when CMSIS_NN_PATH is set,
CMSIS-NN), executed instructions on QEMU (M55 and M4; portable kernels, and CMSIS-NN when CMSIS_NN_PATH is
set) and the compile time with and without the budget.

    PYTHONPATH=src python benchmarks/bench_sram.py [--no-qemu | --compile-only] [--models mv2-0.35-96,mv1-0.25-96,mv2]
        [--budget mv2=184320 ...] [--qemu-kernels cmsis-nn]
"""
from __future__ import annotations

import argparse
import os
import time
import warnings

import torch

import corten
from corten.zoo import get_model

BUDGETS = {"mv2-0.35-96": 64 * 1024, "mv1-0.25-96": 32 * 1024, "mv2": 256 * 1024}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="mv2-0.35-96,mv1-0.25-96,mv2")
    ap.add_argument("--no-qemu", action="store_true")
    ap.add_argument("--compile-only", action="store_true", help="arena and compile times only (no C runs)")
    ap.add_argument("--budget", action="append", default=[], metavar="MODEL=BYTES",
                    help="another budget for a model (default: %s)" % BUDGETS)
    ap.add_argument("--qemu-kernels", default=None, help="comma-separated kernel flavours of the QEMU runs")
    args = ap.parse_args()
    for spec in args.budget:
        model_name, _, nbytes = spec.partition("=")
        BUDGETS[model_name] = int(nbytes)
    cmsis = os.environ.get("CMSIS_NN_PATH")
    flavours = ("portable", "cmsis-nn") if cmsis else ("portable",)
    if args.qemu_kernels:
        flavours = tuple(args.qemu_kernels.split(","))
    warnings.simplefilter("ignore")
    for name in args.models.split(","):
        budget = BUDGETS[name]
        model, example = get_model(name)
        cname = name.replace("-", "_").replace(".", "_")
        corten.compile(model, example, target="cortex-m55", name=cname)  # warm-up (imports, first-call costs)
        t0 = time.perf_counter()
        plain = corten.compile(model, example, target="cortex-m55", name=cname)
        t_plain = time.perf_counter() - t0
        t0 = time.perf_counter()
        banded = corten.compile(model, example, target="cortex-m55", name=cname, max_arena=budget)
        t_budget = time.perf_counter() - t0
        sched = banded.schedule
        before, after = plain.memory.arena_bytes, banded.memory.arena_bytes
        print(f"== {name}: budget {budget:,} B (Cortex-M55, CMSIS-NN scratch)")
        print(f"   arena layer by layer {before:,} B -> banded {after:,} B "
              f"({'fits' if after <= budget else 'OVER'}); {len(sched.segments)} segments, extra MACs "
              f"{sched.extra_macs_pct:.2f}%")
        for line in sched.report_lines()[1:]:
            print("  " + line)
        print(f"   portable-kernel arena (no scratch): {banded.memory_for('portable').arena_bytes:,} B; "
              f"on Cortex-M4 (DSP scratch): {banded.memory_for('cmsis-nn', 'cortex-m4').arena_bytes:,} B")
        print(f"   compile time (after a warm-up compile): {t_plain:.1f} s without budget, {t_budget:.1f} s with "
              f"({t_budget / t_plain:.2f}x; machine load {os.getloadavg()[0]:.1f})")
        if args.compile_only:
            continue
        x = torch.randn(plain.inputs[0].shape, generator=torch.Generator().manual_seed(1))
        want = plain.run_int8(x)
        same = lambda outs: all(torch.equal(a, b) for a, b in zip(want, outs))  # noqa: E731
        print(f"   byte-exact: Python reference {same(banded.run_int8(x))}, host C portable "
              f"{same(banded.c_run(x, kernels='portable').outputs)}"
              + (f", host C CMSIS-NN {same(banded.c_run(x, kernels='cmsis-nn').outputs)}" if cmsis else ""))
        if args.no_qemu:
            continue
        for target, qemu_kernels in [(t, k) for k in flavours for t in ("cortex-m55", "cortex-m4")]:
            r0 = plain.c_run(x, on="qemu", kernels=qemu_kernels, target=target)
            r1 = banded.c_run(x, on="qemu", kernels=qemu_kernels, target=target)
            print(f"   QEMU {target} {qemu_kernels}: instructions {r0.instructions:,} -> {r1.instructions:,} "
                  f"(+{100.0 * (r1.instructions / r0.instructions - 1):.2f}%), byte-exact "
                  f"{same(r1.outputs) and same(r0.outputs)}", flush=True)


if __name__ == "__main__":
    main()
