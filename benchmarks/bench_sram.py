"""SRAM budgets in one run (issues 10 and 25): banded schedules under an arena budget, in-place depthwise.

For each zoo model and budget: the arena layer by layer and with ``max_arena`` (Cortex-M55,
CMSIS-NN scratch), the reduction against the layer-by-layer plan next to MCUNetV2's published one and
TFLite Micro's arena (the anchors of the README), the schedule's extra MACs, byte-exactness of the
banded program against the unbanded one (Python reference; host C with the portable kernels and, when
CMSIS_NN_PATH is set, CMSIS-NN), executed instructions on QEMU (M55 and M4; portable kernels, and
CMSIS-NN when CMSIS_NN_PATH is set, or the ``--qemu-kernels`` given), the portable-kernel arena
(in-place depthwise included) and the compile time with and without the budget.

    PYTHONPATH=src python benchmarks/bench_sram.py [--no-qemu | --compile-only] [--models mv2-0.35-96,mv1-0.25-96,mv2]
        [--budget mv2=184320 ...] [--qemu-kernels cmsis-nn] [--markdown] [--write-readme README.md]
"""
from __future__ import annotations

import argparse
import os
import time
import warnings

import torch

import corten
from corten.zoo import get_model
from readme_block import replace_block  # (benchmarks/ is the script directory)

# (model, budget) runs: issue 10's budgets and issue 25's lower ones
RUNS = [("mv2", 256 * 1024), ("mv2", 184_320), ("mv2-0.35-96", 64 * 1024), ("mv2-0.35-96", 48 * 1024),
        ("mv1-0.25-96", 32 * 1024), ("mv1-0.25-96", 24 * 1024)]
# TFLite Micro's arena for the same network (README anchors): MobileNetV2-224 measured with TFLite
# Micro's planner (the "memory, MobileNetV2-224" row); the VWW model (MobileNetV1-0.25, 96x96) the
# kTensorArenaSize the MLPerf Tiny reference submission allocates (an allocation, not a minimum).
TFLM_ARENA = {"mv2": 1_665_344, "mv1-0.25-96": 204_800}
MCUNETV2_REDUCTION = 8.0  # MCUNetV2 (Lin et al., 2021): peak SRAM of MobileNetV2 reduced 8x by patch-based inference
LABELS = {"mv2": "`mv2` (MobileNetV2-224)", "mv2-0.35-96": "`mv2-0.35-96`", "mv1-0.25-96": "`mv1-0.25-96` (VWW)"}

README_BEGIN, README_END = "<!-- bench_sram: begin -->", "<!-- bench_sram: end -->"


def write_readme(path: str, block: str) -> None:
    replace_block(path, README_BEGIN, README_END, block, "the table")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="mv2-0.35-96,mv1-0.25-96,mv2")
    ap.add_argument("--no-qemu", action="store_true")
    ap.add_argument("--compile-only", action="store_true", help="arena and compile times only (no C runs)")
    ap.add_argument("--budget", action="append", default=[], metavar="MODEL=BYTES",
                    help="run these budgets instead of the default ones (%s)" % RUNS)
    ap.add_argument("--qemu-kernels", default=None, help="comma-separated kernel flavours of the QEMU runs")
    ap.add_argument("--markdown", action="store_true", help="print the README table at the end")
    ap.add_argument("--write-readme", default=None, metavar="README.md", help="write the table into README.md")
    args = ap.parse_args()
    runs = [(m, int(b)) for m, _, b in (s.partition("=") for s in args.budget)] or RUNS
    models = args.models.split(",")
    cmsis = os.environ.get("CMSIS_NN_PATH")
    flavours = ("portable", "cmsis-nn") if cmsis else ("portable",)
    if args.qemu_kernels:
        flavours = tuple(args.qemu_kernels.split(","))
    targets = ("cortex-m55", "cortex-m4")
    warnings.simplefilter("ignore")
    rows = []
    for name in models:
        budgets = [b for m, b in runs if m == name]
        if not budgets:
            continue
        model, example = get_model(name)
        cname = name.replace("-", "_").replace(".", "_")
        corten.compile(model, example, target="cortex-m55", name=cname)  # warm-up (imports, first-call costs)
        t0 = time.perf_counter()
        plain = corten.compile(model, example, target="cortex-m55", name=cname)
        t_plain = time.perf_counter() - t0
        x = torch.randn(plain.inputs[0].shape, generator=torch.Generator().manual_seed(1))
        want = plain.run_int8(x)
        same = lambda outs: all(torch.equal(a, b) for a, b in zip(want, outs))  # noqa: E731
        unbanded = {}  # (target, kernels) -> instructions of the unbanded program
        before = plain.memory.arena_bytes
        portable_plain = plain.memory_for("portable")
        print(f"== {name}: layer by layer {before:,} B (Cortex-M55, CMSIS-NN scratch); portable kernels "
              f"{portable_plain.arena_bytes:,} B ({len(portable_plain.in_place_kernels)} in-place depthwise)")
        for budget in budgets:
            t0 = time.perf_counter()
            banded = corten.compile(model, example, target="cortex-m55", name=cname, max_arena=budget)
            t_budget = time.perf_counter() - t0
            sched = banded.schedule
            after = banded.memory.arena_bytes
            segments = len(sched.segments) if sched else 0
            extra = sched.extra_macs_pct if sched else 0.0
            portable = banded.memory_for("portable")
            print(f"== {name}: budget {budget:,} B (Cortex-M55, CMSIS-NN scratch)")
            print(f"   arena layer by layer {before:,} B -> banded {after:,} B "
                  f"({'fits' if after <= budget else 'OVER'}); {segments} segments, extra MACs {extra:.2f}%; "
                  f"reduction {before / after:.2f}x (MCUNetV2 reports {MCUNETV2_REDUCTION:g}x on MobileNetV2)")
            for line in (sched.report_lines()[1:] if sched else []):
                print("  " + line)
            print(f"   portable-kernel arena (no scratch, in-place depthwise): {portable.arena_bytes:,} B "
                  f"({len(portable.in_place_kernels)} in place); on Cortex-M4 (DSP scratch): "
                  f"{banded.memory_for('cmsis-nn', 'cortex-m4').arena_bytes:,} B")
            print(f"   compile time (after a warm-up compile): {t_plain:.1f} s without budget, {t_budget:.1f} s with "
                  f"({t_budget / t_plain:.2f}x; machine load {os.getloadavg()[0]:.1f})")
            row = dict(name=name, budget=budget, before=before, after=after, segments=segments, extra=extra,
                       portable=portable.arena_bytes, qemu={}, exact=True)
            rows.append(row)
            if args.compile_only:
                continue
            exact = [same(banded.run_int8(x)), same(banded.c_run(x, kernels="portable").outputs)]
            if cmsis:
                exact.append(same(banded.c_run(x, kernels="cmsis-nn").outputs))
            row["exact"] = all(exact)
            print(f"   byte-exact: Python reference / host C portable{' / host C CMSIS-NN' if cmsis else ''}: {exact}")
            if args.no_qemu:
                continue
            for qemu_kernels in flavours:
                for target in targets:
                    key = (target, qemu_kernels)
                    if key not in unbanded:
                        r0 = plain.c_run(x, on="qemu", kernels=qemu_kernels, target=target)
                        unbanded[key] = r0.instructions
                        row["exact"] &= same(r0.outputs)
                    r1 = banded.c_run(x, on="qemu", kernels=qemu_kernels, target=target)
                    row["exact"] &= same(r1.outputs)
                    row["qemu"][key] = (unbanded[key], r1.instructions)
                    print(f"   QEMU {target} {qemu_kernels}: instructions {unbanded[key]:,} -> {r1.instructions:,} "
                          f"(+{100.0 * (r1.instructions / unbanded[key] - 1):.2f}%), byte-exact {same(r1.outputs)}",
                          flush=True)
    if args.markdown or args.write_readme:
        keys = [(t, k) for k in flavours for t in targets] if not (args.no_qemu or args.compile_only) else []
        head = ["model, budget", "arena layer by layer -> with the budget", "reduction (MCUNetV2: 8x)",
                "TFLite Micro arena", "extra MACs", "portable-kernel arena"]
        head += [f"QEMU {t.replace('cortex-', '').upper()} {k} instructions, unbanded -> banded" for t, k in keys]
        head.append("byte-exact")
        lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for r in rows:
            tflm = TFLM_ARENA.get(r["name"])
            cells = [f"{LABELS.get(r['name'], r['name'])}, {r['budget'] / 1024:g} KiB",
                     f"{r['before']:,} B -> **{r['after']:,} B** ({r['segments']} segments)",
                     f"{r['before'] / r['after']:.1f}x",
                     f"{tflm:,} B ({tflm / r['after']:.1f}x ours)" if tflm else "-",
                     f"+{r['extra']:.2f}%", f"{r['portable']:,} B"]
            for key in keys:
                a, b = r["qemu"].get(key, (None, None))
                cells.append(f"{a:,} -> {b:,} (**+{100.0 * (b / a - 1):.1f}%**)" if a else "-")
            cells.append("yes" if r["exact"] else "NO")
            lines.append("| " + " | ".join(cells) + " |")
        table = "\n".join(lines)
        print(table)
        if args.write_readme:
            write_readme(args.write_readme, table)


if __name__ == "__main__":
    main()
