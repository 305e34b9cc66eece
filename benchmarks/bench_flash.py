"""Flash of the zoo models with int8, int4 and ``weights="auto"`` weights (issue 24).

    python benchmarks/bench_flash.py [--models mv2 ds-cnn ...] [--budget-ratio 0.75] [--inputs 16]
        [--rounding nearest adaptive] [--cache build/bench_flash] [--write-readme README.md]

For each zoo model it compiles three programs in this process - int8 weights, ``weights="int4"``
(every conv / depthwise / linear layer with an int4 kernel) and ``weights="auto"`` with
``max_flash`` = the budget (``--budget-ratio`` x the int8 constants; MobileNetV2-224: 2,000,000 B,
issue 24's acceptance) - and prints the constant (flash) bytes of each plan, the weight bytes, the
ratios to int8, how many layers auto put in int4 and the cosine similarity of each program's float
outputs with the int8 program's on ``--inputs`` random N(0, 1) inputs (reference kernels; the
smallest per-input cosine).  ``--rounding`` lists the weight roundings the int4 and auto programs
are compiled with (``nearest`` and/or ``adaptive``, a pair of cosine columns each; the int8
reference is always round-to-nearest).  A model whose constants do not fit the budget even with every layer
int4 (weights that are a small share of its constants, or layers without int4 kernels such as
LSTM cells) shows the ``BudgetError``'s verdict in the auto columns.  ``--cache DIR`` keeps each
model's row as JSON and reuses it (delete the directory to measure again).  ``--write-readme`` puts
the table between the ``bench_flash`` markers.
"""
from __future__ import annotations

import argparse
import json
import time
import warnings
from pathlib import Path
from readme_block import replace_block  # (benchmarks/ is the script directory)


README_BEGIN, README_END = "<!-- bench_flash: begin (generated) -->", "<!-- bench_flash: end -->"
MV2_BUDGET = 2_000_000  # issue 24: mv2 with weights="auto", max_flash=2_000_000


def cosine_min(a_prog, b_prog, inputs) -> float:
    """The smallest cosine similarity, over ``inputs``, of the two programs' flattened float outputs."""
    import torch

    worst = 1.0
    for x in inputs:
        a = torch.cat([t.reshape(-1).double() for t in _leaves(a_prog.run(*x))])
        b = torch.cat([t.reshape(-1).double() for t in _leaves(b_prog.run(*x))])
        worst = min(worst, float(torch.nn.functional.cosine_similarity(a, b, dim=0)))
    return worst


def _leaves(out):
    import torch

    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, dict):
        return [t for v in out.values() for t in _leaves(v)]
    return [t for v in out for t in _leaves(v)]


def weight_bytes(prog) -> int:
    from corten.program import weight_layers

    return sum(b for _, _, b in weight_layers(prog))


def measure(name: str, budget_ratio: float, n_inputs: int, roundings=("nearest",)) -> dict:
    import torch

    import corten
    from corten.program import weight_layers
    from corten.zoo import get_model

    model, example = get_model(name)
    t0 = time.perf_counter()
    p8 = corten.compile(model, example, name="m")
    g = torch.Generator().manual_seed(123)
    inputs = [tuple(torch.randn(x.shape, generator=g) for x in example) for _ in range(n_inputs)]
    f8 = p8.memory.constant_bytes
    budget = MV2_BUDGET if name == "mv2" else int(budget_ratio * f8)
    row = dict(model=name, flash8=f8, w8=weight_bytes(p8), budget=budget, layers=len(weight_layers(p8)))
    for rounding in roundings:
        p4 = corten.compile(model, example, name="m", weights="int4", rounding=rounding)
        try:
            pa = corten.compile(model, example, name="m", weights="auto", max_flash=budget, rounding=rounding)
        except corten.BudgetError:  # (even all-int4 constants exceed the budget)
            pa = None
        layers = sum(1 for _, bits, _ in weight_layers(pa) if bits == 4) if pa is not None else 0
        row.update(flash4=p4.memory.constant_bytes, w4=weight_bytes(p4),
                   flash_auto=pa.memory.constant_bytes if pa is not None else None, auto_layers=layers,
                   fits=pa is not None and pa.memory.constant_bytes <= budget)
        row[f"cos4_{rounding}"] = cosine_min(p4, p8, inputs)
        row[f"cos_auto_{rounding}"] = cosine_min(pa, p8, inputs) if pa is not None else None
    row["seconds"] = time.perf_counter() - t0
    return row


def table(rows: list[dict], n_inputs: int, roundings=("nearest",)) -> str:
    cos_heads = "".join(f" cosine vs int8, int4 / auto, {r} rounding (min of {n_inputs}) |" for r in roundings)
    head = ("| model | int8 flash (B) | int4 flash (B) | int4 / int8 | weight bytes int8 -> int4 | auto budget (B) "
            "| auto flash (B) | auto: int4 layers |" + cos_heads + "\n|---|---|---|---|---|---|---|---|"
            + "---|" * len(roundings))
    lines = [head]
    for r in rows:
        if r["flash_auto"] is None:
            auto = f"does not fit (all-int4 {r['flash4']:,})"
        else:
            auto = f"{r['flash_auto']:,}"
        cos = "".join(f" {r[f'cos4_{k}']:.4f} / " + (f"{r[f'cos_auto_{k}']:.4f}" if r[f"cos_auto_{k}"] is not None
                                                      else "-") + " |" for k in roundings)
        lines.append(f"| {r['model']} | {r['flash8']:,} | {r['flash4']:,} | {r['flash4'] / r['flash8']:.3f} | "
                     f"{r['w8']:,} -> {r['w4']:,} ({r['w4'] / max(r['w8'], 1):.3f}) | {r['budget']:,} | "
                     f"{auto} | {r['auto_layers']} of {r['layers']} |{cos}")
    return "\n".join(lines)


def write_readme(path: str, block: str) -> None:
    replace_block(path, README_BEGIN, README_END, block, "the flash table")


def main(argv: list[str] | None = None) -> int:
    from corten.zoo import list_models

    ap = argparse.ArgumentParser()
    ap.add_argument("--models", nargs="*", default=None)
    ap.add_argument("--budget-ratio", type=float, default=0.75)
    ap.add_argument("--inputs", type=int, default=16)
    ap.add_argument("--rounding", nargs="+", default=["nearest"], choices=["nearest", "adaptive"])
    ap.add_argument("--cache", default=None, metavar="DIR")
    ap.add_argument("--write-readme", default=None, metavar="README.md")
    args = ap.parse_args(argv)
    warnings.simplefilter("ignore")
    rows = []
    for name in args.models or [n for n, _ in list_models()]:
        cached = Path(args.cache) / f"{name}.json" if args.cache else None
        if cached is not None and cached.is_file():
            r = json.loads(cached.read_text())
        else:
            r = measure(name, args.budget_ratio, args.inputs, tuple(args.rounding))
            if cached is not None:
                cached.parent.mkdir(parents=True, exist_ok=True)
                cached.write_text(json.dumps(r))
        cos = ", ".join(f"{k}: int4 {r[f'cos4_{k}']:.4f} auto {r[f'cos_auto_{k}']}" for k in args.rounding)
        print(f"{name}: int8 {r['flash8']:,} B, int4 {r['flash4']:,} B, auto {r['flash_auto']} B within "
              f"{r['budget']:,} B ({r['auto_layers']} of {r['layers']} layers int4); cosine vs int8 {cos} "
              f"({r['seconds']:.1f} s)", flush=True)
        rows.append(r)
    text = table(rows, args.inputs, tuple(args.rounding))
    print(text)
    if args.write_readme:
        write_readme(args.write_readme, text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
