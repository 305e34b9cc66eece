"""Corten's generated kernels against CMSIS-NN and the portable kernels, on QEMU Cortex-M4 and M55.

    python benchmarks/bench_kernels.py [--models ds-cnn resnet8 mv1-0.25-96 deep-ae mv2-0.35-96] [--mv2]
        [--targets cortex-m4 cortex-m55] [--flavours portable cmsis-nn generated] [--write-readme README.md]
        [--save rows.json] [--load rows_of_an_earlier_run.json ...] [--layers]

For every model and target it compiles the zoo model once, runs each kernel flavour's C library
on QEMU in this one process - ``portable``, ``cmsis-nn`` (only when ``CMSIS_NN_PATH`` points at a
CMSIS-NN tree), ``generated`` (Corten's per-layer kernels; the layers it does not generate run
CMSIS-NN's kernels when the tree is there - the provider chain ``("generated", "cmsis-nn")`` -, else
the portable ones) - checks
that every run's output bytes equal the Python reference, and prints the instructions (QEMU
``-icount``), the estimated cycles (``run.cycles_estimate``: the instruction mix of the run costed
with the core's timing table, ``corten.runners.cycles``) and the ratios of both to the CMSIS-NN
build.  ``--mv2`` adds MobileNetV2-1.0 at 224x224 (slow: minutes per run).  The published
MLPerf Tiny cycles (X-CUBE-AI 10.2 on a NUCLEO-L4R5ZI Cortex-M4 at 120 MHz) are printed next to
the M4 rows of the four MLPerf Tiny models.  ``--layers`` also prints, for every run, the per-layer
profile (``Program.profile`` with ``cycles=True``, as ``corten profile --mhz 120``: instructions,
estimated cycles and milliseconds per step, and the kernel each step used) from one more QEMU run.
"""
from __future__ import annotations

import argparse
import json
import os
import time
import warnings
from pathlib import Path
from readme_block import replace_block  # (benchmarks/ is the script directory)

MODELS = ["ds-cnn", "resnet8", "mv1-0.25-96", "deep-ae", "mv2-0.35-96"]
# mlcommons/tiny_results v1.1-v1.3, Cortex-M4 NUCLEO-L4R5ZI at 120 MHz: X-CUBE-AI 10.2 latency x 120 MHz
XCUBE_AI_M4_CYCLES = {"ds-cnn": 5.21e6, "resnet8": 19.9e6, "mv1-0.25-96": 10.7e6, "deep-ae": 0.58e6}

README_BEGIN, README_END = "<!-- bench_kernels: begin (generated) -->", "<!-- bench_kernels: end -->"


def _fmt_m(v) -> str:
    return "-" if v is None else f"{v / 1e6:.2f} M"


def _num(v) -> str:
    return "-" if v is None else f"{v:.2f}"


def run_model(name: str, targets, flavours, cmsis: str | None, layers: bool = False) -> list[dict]:
    import torch

    import corten
    from corten.zoo import get_model

    model, example = get_model(name)
    prog = corten.compile(model, example, calibration=None, seed=0)
    want = prog.run_int8(*example)
    rows = []
    for target in targets:
        base = None
        for flavour in flavours:
            kernels = flavour
            if flavour == "cmsis-nn" and not cmsis:
                continue
            if flavour == "generated" and cmsis:
                kernels = ("generated", "cmsis-nn")  # CMSIS-NN for what the generator does not take
            t0 = time.perf_counter()
            run = prog.c_run(*example, on="qemu", kernels=kernels, target=target, cmsis_nn_path=cmsis,
                             cycles=True)
            equal = len(run.outputs) == len(want) and all(torch.equal(a, b) for a, b in zip(run.outputs, want))
            row = dict(model=name, target=target, kernels=run.kernels, instructions=run.instructions,
                       cycles=run.cycles_estimate, equal=equal, wall=time.perf_counter() - t0)
            if flavour == "cmsis-nn":
                base = row
            rows.append(row)
            print(f"  {name:<12} {target:<11} {run.kernels:<28} {run.instructions:>13,} instr "
                  f"{(run.cycles_estimate or 0):>13,.0f} cycles  bytes {'equal' if equal else 'DIFFER'} "
                  f"({row['wall']:.0f} s)", flush=True)
            if layers:
                prof = prog.profile(*example, on="qemu", target=target, kernels=kernels, cmsis_nn_path=cmsis,
                                    cycles=True, baseline=False)
                print(prof.table(mhz=120), flush=True)
        for row in rows:
            if row["target"] == target and base is not None:
                row["instr_ratio"] = row["instructions"] / base["instructions"]
                row["cycle_ratio"] = (row["cycles"] / base["cycles"]) if row["cycles"] and base["cycles"] else None
    return rows


def table(rows: list[dict]) -> str:
    head = ("| model | target | kernels | instructions | est. cycles | instr / CMSIS-NN | cycles / CMSIS-NN "
            "| X-CUBE-AI 10.2 (M4, published cycles) | bytes equal |\n|---|---|---|---|---|---|---|---|---|")
    lines = [head]
    for r in rows:
        xcube = XCUBE_AI_M4_CYCLES.get(r["model"]) if r["target"] == "cortex-m4" else None
        lines.append(f"| {r['model']} | {r['target'].replace('cortex-', '').upper()} | {r['kernels']} | "
                     f"{_fmt_m(r['instructions'])} | {_fmt_m(r['cycles'])} | "
                     f"{_num(r.get('instr_ratio'))} | {_num(r.get('cycle_ratio'))} | "
                     f"{_fmt_m(xcube) if xcube else '-'} | {'yes' if r['equal'] else 'NO'} |")
    return "\n".join(lines)


def write_readme(path: str, block: str) -> None:
    replace_block(path, README_BEGIN, README_END, block, "the table")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", nargs="*", default=MODELS)
    ap.add_argument("--mv2", action="store_true", help="also MobileNetV2-1.0 224x224 (slow)")
    ap.add_argument("--targets", nargs="*", default=["cortex-m4", "cortex-m55"])
    ap.add_argument("--flavours", nargs="*", default=["portable", "cmsis-nn", "generated"])
    ap.add_argument("--write-readme", default=None, metavar="README.md")
    ap.add_argument("--save", default=None, metavar="ROWS.json", help="also write the measured rows as JSON")
    ap.add_argument("--load", nargs="*", default=[], metavar="ROWS.json",
                    help="rows measured by earlier runs (--save), put before this run's in the table; with "
                         "--models (nothing) only those (e.g. M4 and M55 measured in two processes)")
    ap.add_argument("--layers", action="store_true",
                    help="also print each run's per-layer profile (instructions, estimated cycles, kernels)")
    args = ap.parse_args(argv)
    warnings.simplefilter("ignore")
    cmsis = os.environ.get("CMSIS_NN_PATH")
    if cmsis and not Path(cmsis, "Include", "arm_nnfunctions.h").exists():
        raise SystemExit(f"CMSIS_NN_PATH={cmsis} is not a CMSIS-NN tree")
    if not cmsis:
        print("CMSIS_NN_PATH not set: no CMSIS-NN baseline (ratios need it)")
    models = list(args.models) + (["mv2"] if args.mv2 else [])
    rows = [r for path in args.load for r in json.loads(Path(path).read_text())]
    for name in models:
        rows += run_model(name, args.targets, args.flavours, cmsis, args.layers)
    if args.save:
        Path(args.save).write_text(json.dumps(rows, indent=1))
    order = {m: i for i, m in enumerate(MODELS + ["mv2"])}
    rows.sort(key=lambda r: (order.get(r["model"], len(order)), r["target"]))  # (stable: flavours keep their order)
    text = table(rows)
    print(text)
    bad = [r for r in rows if not r["equal"]]
    if bad:
        print(f"BYTES DIFFER: {[(r['model'], r['target'], r['kernels']) for r in bad]}")
    if args.write_readme:
        write_readme(args.write_readme, text)
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
