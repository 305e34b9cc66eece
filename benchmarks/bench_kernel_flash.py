"""Flash of each kernel flavour's library for the zoo models: what the speed of Corten's generated
kernels costs in constant data (issue 22's other side).

    python benchmarks/bench_kernel_flash.py [--models ds-cnn resnet8 ...] [--write-readme README.md]

For each model it compiles one program (``calibration=None, seed=0``, as ``bench_kernels.py``) and
prints the constant (flash) bytes of its library per deployment - the portable and CMSIS-NN
kernels (the int8 weights, biases, requantization constants and kernel sums: one figure for both)
and the generated kernels on a Cortex-M4 (DSP) and a Cortex-M55 (Helium) - from
``Program.memory_for(kernels, target).constant_bytes``: the bytes of the constant arrays that
library defines (the emitter's own arrays; nothing is built or run).  ``--write-readme`` puts the
table between the ``bench_kernel_flash`` markers.
"""
from __future__ import annotations

import argparse
import warnings

from readme_block import replace_block  # (benchmarks/ is the script directory)

README_BEGIN, README_END = "<!-- bench_kernel_flash: begin (generated) -->", "<!-- bench_kernel_flash: end -->"
MODELS = ("ds-cnn", "resnet8", "mv1-0.25-96", "deep-ae", "mv2-0.35-96", "mv2")
DEPLOYMENTS = (("portable or CMSIS-NN", "portable", "cortex-m4"), ("generated M4", "generated", "cortex-m4"),
               ("generated M55", "generated", "cortex-m55"))


def measure(name: str) -> dict:
    import corten
    from corten.zoo import get_model

    model, example = get_model(name)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        prog = corten.compile(model, example, calibration=None, seed=0)
    flash = {label: prog.memory_for(kernels, target).constant_bytes for label, kernels, target in DEPLOYMENTS}
    cmsis = prog.memory_for("cmsis-nn", "cortex-m4").constant_bytes
    if cmsis != flash[DEPLOYMENTS[0][0]]:
        raise SystemExit(f"{name}: the CMSIS-NN library stores {cmsis:,} B, the portable one "
                         f"{flash[DEPLOYMENTS[0][0]]:,} B: the table's first column assumes one figure")
    return dict(model=name, flash=flash)


def table(rows: list[dict]) -> str:
    base = DEPLOYMENTS[0][0]
    head = ("| model | " + " | ".join(f"{label} (B)" for label, _, _ in DEPLOYMENTS)
            + " | " + " | ".join(f"{label} / portable" for label, _, _ in DEPLOYMENTS[1:]) + " |")
    lines = [head, "|" + "---|" * (1 + 2 * len(DEPLOYMENTS) - 1)]
    for r in rows:
        f = r["flash"]
        lines.append(f"| {r['model']} | " + " | ".join(f"{f[label]:,}" for label, _, _ in DEPLOYMENTS) + " | "
                     + " | ".join(f"{f[label] / f[base]:.2f}" for label, _, _ in DEPLOYMENTS[1:]) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", nargs="*", default=list(MODELS))
    ap.add_argument("--write-readme", default=None, metavar="README.md")
    args = ap.parse_args(argv)
    rows = []
    for name in args.models:
        rows.append(measure(name))
        print(f"  {name:<12} " + "  ".join(f"{label} {b:>11,} B" for label, b in rows[-1]["flash"].items()),
              flush=True)
    block = table(rows)
    print(block)
    if args.write_readme:
        replace_block(args.write_readme, README_BEGIN, README_END, block, "the kernel-flash table")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
