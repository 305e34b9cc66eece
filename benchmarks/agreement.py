"""int8-vs-float agreement of every zoo model on random inputs (the table in the README).

    .venv/bin/python benchmarks/agreement.py [--inputs 20] [--models mv2 ds-cnn ...] [--markdown]

Classifiers: top-1 agreement of the int8 program (reference kernels) with the float model, and the
mean cosine similarity of the outputs. Autoencoders (outputs shaped like the input): the relative
error ||int8 - float|| / ||float|| of the reconstruction, mean and max.
"""
from __future__ import annotations

import argparse
import time
import warnings

import torch


def evaluate(name: str, n_inputs: int, seed: int = 0) -> dict:
    import corten
    from corten.zoo import get_model

    model, example = get_model(name, seed=seed)
    t0 = time.perf_counter()
    prog = corten.compile(model, example, name=name.replace("-", "_").replace(".", "_"))
    compile_s = time.perf_counter() - t0
    g = torch.Generator().manual_seed(10_000 + seed)
    top1, cos, rel = [], [], []
    for _ in range(n_inputs):
        x = tuple(torch.randn(e.shape, generator=g) for e in example)
        with torch.no_grad():
            ref = model(*x)
        got = prog.run(*x)
        ref, got = ref.flatten(1), got.flatten(1)
        cos.append(float(torch.nn.functional.cosine_similarity(ref, got).mean()))
        rel.append(float((got - ref).norm() / ref.norm().clamp_min(1e-12)))
        top1.append(float((ref.argmax(1) == got.argmax(1)).float().mean()))
    is_ae = tuple(prog.outputs[0].shape) == tuple(example[0].shape)
    return {"model": name, "kind": "autoencoder" if is_ae else "classifier", "classes": ref.shape[1],
            "top1": sum(top1) / len(top1), "cos": sum(cos) / len(cos), "rel_mean": sum(rel) / len(rel),
            "rel_max": max(rel), "n": n_inputs, "compile_s": compile_s, "ops": sum(prog.op_counts().values())}


def main() -> None:
    from corten.zoo import MODELS

    ap = argparse.ArgumentParser()
    ap.add_argument("--inputs", type=int, default=20)
    ap.add_argument("--models", nargs="*", default=list(MODELS))
    args = ap.parse_args()
    warnings.simplefilter("ignore")
    print(f"| model | kind | inputs | top-1 agreement | mean cosine | relative error (mean / max) | Corten ops |")
    print("|---|---|---|---|---|---|---|")
    for name in args.models:
        r = evaluate(name, args.inputs)
        top1 = "n/a" if r["kind"] == "autoencoder" else f"{r['top1'] * r['n']:.0f}/{r['n']} ({r['top1']:.0%})"
        print(f"| {r['model']} | {r['kind']} ({r['classes']} outputs) | {r['n']} | {top1} | {r['cos']:.4f} | "
              f"{r['rel_mean']:.3f} / {r['rel_max']:.3f} | {r['ops']} |", flush=True)


if __name__ == "__main__":
    main()
