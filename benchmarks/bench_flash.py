"""Flash of the zoo models with int8, int4 and ``weights="auto"`` weights (issue 24).

    python benchmarks/bench_flash.py [--models mv2 ds-cnn ...] [--budget-ratio 0.75] [--inputs 16]
        [--write-readme README.md]

For each zoo model it compiles three programs in this process - int8 weights, ``weights="int4"``
(every conv / depthwise / linear layer with an int4 kernel) and ``weights="auto"`` with
``max_flash`` = the budget (``--budget-ratio`` x the int8 constants; MobileNetV2-224: 2,000,000 B,
issue 24's acceptance) - and prints the constant (flash) bytes of each plan, the weight bytes, the
ratios to int8, how many layers auto put in int4 and the cosine similarity of each program's float
outputs with the int8 program's on ``--inputs`` random N(0, 1) inputs (reference kernels; the
smallest per-input cosine).  ``--write-readme`` puts the table between the ``bench_flash`` markers.
"""
from __future__ import annotations

import argparse
import re
import time
import warnings
from pathlib import Path

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


def measure(name: str, budget_ratio: float, n_inputs: int) -> dict:
    import torch

    import corten
    from corten.program import weight_layers
    from corten.zoo import get_model

    model, example = get_model(name)
    t0 = time.perf_counter()
    p8 = corten.compile(model, example, name="m")
    p4 = corten.compile(model, example, name="m", weights="int4")
    f8, f4 = p8.memory.constant_bytes, p4.memory.constant_bytes
    budget = MV2_BUDGET if name == "mv2" else int(budget_ratio * f8)
    pa = corten.compile(model, example, name="m", weights="auto", max_flash=budget)
    g = torch.Generator().manual_seed(123)
    inputs = [tuple(torch.randn(x.shape, generator=g) for x in example) for _ in range(n_inputs)]
    auto = (pa.info.get("weights") or {}).get("auto") or {}
    layers = sum(1 for _, bits, _ in weight_layers(pa) if bits == 4)
    total = len(weight_layers(p8))
    return dict(model=name, flash8=f8, flash4=f4, w8=weight_bytes(p8), w4=weight_bytes(p4), budget=budget,
                flash_auto=pa.memory.constant_bytes, auto_layers=layers, layers=total,
                cos4=cosine_min(p4, p8, inputs), cos_auto=cosine_min(pa, p8, inputs),
                fits=pa.memory.constant_bytes <= budget, tried=len(auto.get("tried", [])),
                seconds=time.perf_counter() - t0)


def table(rows: list[dict], n_inputs: int) -> str:
    head = ("| model | int8 flash (B) | int4 flash (B) | int4 / int8 | weight bytes int8 -> int4 | auto budget (B) "
            "| auto flash (B) | auto: int4 layers | cosine vs int8, int4 / auto (min of "
            f"{n_inputs}) |\n|---|---|---|---|---|---|---|---|---|")
    lines = [head]
    for r in rows:
        lines.append(f"| {r['model']} | {r['flash8']:,} | {r['flash4']:,} | {r['flash4'] / r['flash8']:.3f} | "
                     f"{r['w8']:,} -> {r['w4']:,} ({r['w4'] / max(r['w8'], 1):.3f}) | {r['budget']:,} | "
                     f"{r['flash_auto']:,}{'' if r['fits'] else ' (does not fit)'} | {r['auto_layers']} of "
                     f"{r['layers']} | {r['cos4']:.4f} / {r['cos_auto']:.4f} |")
    return "\n".join(lines)


def write_readme(path: str, block: str) -> None:
    text = Path(path).read_text()
    pattern = re.compile(re.escape(README_BEGIN) + r".*?" + re.escape(README_END), re.S)
    if not pattern.search(text):
        raise SystemExit(f"{path}: no {README_BEGIN} ... {README_END} block to replace")
    Path(path).write_text(pattern.sub(lambda _: f"{README_BEGIN}\n{block}\n{README_END}", text))
    print(f"wrote the flash table into {path}")


def main(argv: list[str] | None = None) -> int:
    from corten.zoo import list_models

    ap = argparse.ArgumentParser()
    ap.add_argument("--models", nargs="*", default=None)
    ap.add_argument("--budget-ratio", type=float, default=0.75)
    ap.add_argument("--inputs", type=int, default=16)
    ap.add_argument("--write-readme", default=None, metavar="README.md")
    args = ap.parse_args(argv)
    warnings.simplefilter("ignore")
    rows = []
    for name in args.models or [n for n, _ in list_models()]:
        r = measure(name, args.budget_ratio, args.inputs)
        print(f"{name}: int8 {r['flash8']:,} B, int4 {r['flash4']:,} B, auto {r['flash_auto']:,} B within "
              f"{r['budget']:,} B ({r['auto_layers']} of {r['layers']} layers int4); cosine vs int8 int4 "
              f"{r['cos4']:.4f}, auto {r['cos_auto']:.4f} ({r['seconds']:.1f} s)", flush=True)
        rows.append(r)
    text = table(rows, args.inputs)
    print(text)
    if args.write_readme:
        write_readme(args.write_readme, text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
