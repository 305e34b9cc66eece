"""Per-step profile of a zoo model's C library on QEMU (``Program.profile``, ``corten profile``).

    python benchmarks/bench_profile.py [--model mv2-0.35-96] [--target cortex-m55] [--kernels portable cmsis-nn]
        [--plot-dir build/profile] [--write-readme README.md]

For each kernel flavour (``cmsis-nn`` only when ``CMSIS_NN_PATH`` points at a CMSIS-NN tree) it
prints the profile table, checks the acceptance of issue 11 (one row per step of ``<name>_run``,
the rows' sum within 2% of the uninstrumented run, outputs byte-identical to the Python reference),
draws the bar chart (``--plot-dir``) and, with ``--write-readme``, puts one summary row per
flavour into the README's table between the ``bench_profile`` markers.
"""
from __future__ import annotations

import argparse
import os
import warnings
from pathlib import Path
from readme_block import replace_block  # (benchmarks/ is the script directory)

TABLE_HEAD = "| what | number | command |\n|---|---|---|"

README_BEGIN, README_END = "<!-- bench_profile: begin (generated) -->", "<!-- bench_profile: end -->"


def summary_row(prof, model: str, steps: int) -> str:
    top = prof.top(3)
    total = prof.total or 1.0
    tops = "; ".join(f"step {r.step} `{r.module or r.op}` ({r.op.replace('quantized_', '')}, `{r.kernel}`) "
                     f"{100 * r.cost / total:.1f}%" + (f", {r.per_mac:.2f}/MAC" if r.per_mac is not None else "")
                     for r in top)
    portable = [r for r in prof.rows if r.portable]
    fallback = (f"; {len(portable)} step(s) on portable kernels" if prof.kernels == "cmsis-nn" and portable
                else ("; every step on CMSIS-NN" if prof.kernels == "cmsis-nn" else ""))
    return (f"| `corten profile` {model}, QEMU {prof.target}, {prof.kernels} | {len(prof.rows)} rows for {steps} "
            f"steps; sum {prof.total:,.0f} instructions = {100 * prof.ratio:.2f}% of the uninstrumented run "
            f"({prof.baseline:,.0f}); outputs byte-identical: {'yes' if prof.outputs_match else 'NO'}{fallback}; "
            f"top: {tops} | `python benchmarks/bench_profile.py --kernels {prof.kernels}` |")


def write_readme(path: str, block: str) -> None:
    replace_block(path, README_BEGIN, README_END, block, "the profile rows")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="mv2-0.35-96")
    ap.add_argument("--target", default="cortex-m55")
    ap.add_argument("--kernels", nargs="*", default=["portable", "cmsis-nn"])
    ap.add_argument("--plot-dir", default="build/profile")
    ap.add_argument("--write-readme", default=None, metavar="README.md")
    args = ap.parse_args(argv)
    warnings.simplefilter("ignore")

    import corten
    from corten.zoo import get_model

    model, example = get_model(args.model)
    prog = corten.compile(model, example, target=args.target, name=args.model.replace("-", "_").replace(".", "_"))
    rows, ok = [], True
    for kernels in args.kernels:
        if kernels == "cmsis-nn" and not os.environ.get("CMSIS_NN_PATH"):
            print("cmsis-nn: skipped (CMSIS_NN_PATH is not set)")
            continue
        prof = prog.profile(on="qemu", target=args.target, kernels=kernels)
        steps = len(prog.kernel_choices(kernels, args.target))
        print(prof.table())
        Path(args.plot_dir).mkdir(parents=True, exist_ok=True)
        png = prof.plot(Path(args.plot_dir) / f"{prog.name}-{kernels}-{args.target}.png")
        print(f"plot: {png}\n")
        holds = len(prof.rows) == steps and abs(prof.ratio - 1.0) <= 0.02 and prof.outputs_match and png.is_file()
        print(f"acceptance (one row per step, sum within 2%, bytes identical, PNG written): "
              f"{'holds' if holds else 'FAILS'}\n")
        ok = ok and holds
        rows.append(summary_row(prof, args.model, steps))
    if args.write_readme and rows:
        write_readme(args.write_readme, "\n".join([TABLE_HEAD, *rows]))
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
