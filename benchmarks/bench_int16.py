"""int8 vs int16 activations (TFLite's 16x8 scheme, ``corten.compile(precision="int16")``): accuracy of
autoencoders and instruction counts on QEMU (the README's 16x8 tables).

    .venv/bin/python benchmarks/bench_int16.py [--inputs 20] [--calibration 1024] [--no-qemu] [--markdown]
        [--write-readme README.md]

Accuracy: the relative reconstruction error ||program - float|| / ||float|| of each autoencoder
(mean / max over ``--inputs`` random N(0, 1) inputs, as benchmarks/agreement.py measures it), the
default calibration (8 random samples), and the same error with the int8 weights alone (float
activations: the floor round-to-nearest int8 weights leave).  int16 with output-aware weight
rounding (``rounding="adaptive"``): on the default calibration and on ``--calibration`` random
N(0, 1) samples (drawn from their own seed, none of them an evaluation input), next to
round-to-nearest on the same samples: adaptive rounding fits each layer on its calibration rows, and
8 samples are far fewer than a 640-input layer's weights per channel.  Autoencoders: ``deep-ae`` (the zoo's MLPerf Tiny
model), ``ae-small`` (the same architecture, 128 inputs, hidden 64, 3 layers each side) and
``conv-ae`` (a conv/depthwise/pool encoder, linear decoder).

Tabular (``--tabular``): ``cancer-raw`` of benchmarks/accuracy.py (an MLP on unscaled features whose
ranges differ 487,103x) in int8, int16, ``precision="auto"`` and with only its first layer int16; and the
float model with only the first layer's weights rounded to int8 (the A16W8 ceiling).

Instructions: one inference of ``deep-ae`` and ``ds-cnn`` on QEMU Cortex-M55 and Cortex-M4 in int8
and int16, portable kernels, and CMSIS-NN's when ``CMSIS_NN_PATH`` names a CMSIS-NN tree; every
run byte-compared with the reference kernels.
"""
from __future__ import annotations

import argparse
import copy
import os
import warnings

import torch
from readme_block import replace_block  # (benchmarks/ is the script directory)
from torch import nn


class ConvAE(nn.Module):
    """A small conv autoencoder on 1x16x16 maps: conv/depthwise/pool encoder, linear decoder."""

    def __init__(self, generator: torch.Generator):
        super().__init__()
        self.encoder = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                                     nn.Conv2d(8, 8, 3, stride=2, padding=1, groups=8), nn.ReLU(),
                                     nn.Conv2d(8, 16, 1), nn.ReLU(), nn.AvgPool2d(2))
        self.decoder = nn.Sequential(nn.Linear(16 * 4 * 4, 64), nn.ReLU(), nn.Linear(64, 256))
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(torch.randn(p.shape, generator=generator) * (0.5 if p.dim() == 1 else 1.0)
                        / max(1.0, float(p[0].numel()) ** 0.5))

    def forward(self, x):
        return self.decoder(self.encoder(x).flatten(1)).reshape(x.shape)


def autoencoder(name: str):
    from corten.zoo import get_model
    from corten.zoo.mlperf_tiny import DeepAutoEncoder

    if name == "deep-ae":
        return get_model("deep-ae")
    g = torch.Generator().manual_seed(1)
    if name == "ae-small":
        m = DeepAutoEncoder(input_dim=128, hidden=64, bottleneck=8, depth=3, generator=g)
        from corten.zoo.batch_norm_stats import randomize_batch_norm
        randomize_batch_norm(m, torch.randn(64, 128, generator=g), g)
        return m.eval(), (torch.randn(1, 128, generator=g),)
    if name == "conv-ae":
        m = ConvAE(g)
        with torch.no_grad():  # running statistics of the BatchNorm from a few batches
            m.train()
            for _ in range(4):
                m(torch.randn(16, 1, 16, 16, generator=g))
        return m.eval(), (torch.randn(1, 1, 16, 16, generator=g),)
    raise KeyError(name)


def weight_only(model: nn.Module) -> nn.Module:
    """``model`` with its conv/linear weights rounded to int8 per output channel (float activations),
    BatchNorms folded first as Corten folds them."""
    m = copy.deepcopy(model).eval()
    mods = list(m.modules())
    for i, mod in enumerate(mods):
        if isinstance(mod, (nn.Linear, nn.Conv2d)):
            nxt = mods[i + 1] if i + 1 < len(mods) else None
            w = mod.weight.detach().clone()
            b = mod.bias.detach().clone() if mod.bias is not None else torch.zeros(w.shape[0])
            if isinstance(nxt, (nn.BatchNorm1d, nn.BatchNorm2d)):
                k = nxt.weight / torch.sqrt(nxt.running_var + nxt.eps)
                w = w * k.reshape(-1, *([1] * (w.dim() - 1)))
                b = (b - nxt.running_mean) * k + nxt.bias
                nxt.weight.data.fill_(1.0), nxt.bias.data.zero_(), nxt.running_mean.zero_()
                nxt.running_var.fill_(1.0 - nxt.eps)
            s = w.abs().flatten(1).amax(1).clamp_min(1e-12) / 127
            s = s.reshape(-1, *([1] * (w.dim() - 1)))
            mod.weight.data = torch.round(w / s).clamp(-127, 127) * s
            mod.bias = nn.Parameter(b.detach())
    return m


def rel_errors(model, prog_or_fn, example, n: int) -> list[float]:
    g = torch.Generator().manual_seed(10_000)
    out = []
    for _ in range(n):
        x = torch.randn(example[0].shape, generator=g)
        with torch.no_grad():
            ref = model(x).flatten(1)
            got = prog_or_fn(x).flatten(1)
        out.append(float((got - ref).norm() / ref.norm().clamp_min(1e-12)))
    return out


def calibration_samples(example, n: int) -> list[tuple]:
    """``n`` random N(0, 1) inputs from their own seed (the evaluation inputs use 10_000)."""
    g = torch.Generator().manual_seed(20_000)
    return [(torch.randn(example[0].shape, generator=g),) for _ in range(n)]


def accuracy_rows(n: int, calibration: int) -> list[dict]:
    import corten

    rows = []
    for name in ("deep-ae", "ae-small", "conv-ae"):
        model, example = autoencoder(name)
        row = {"model": name}
        many = calibration_samples(example, calibration)
        for key, prec, rounding, calib in (("int8", "int8", "nearest", None), ("int16", "int16", "nearest", None),
                                           ("int16_adaptive", "int16", "adaptive", None),
                                           ("int16_many", "int16", "nearest", many),
                                           ("int16_many_adaptive", "int16", "adaptive", many)):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                prog = corten.compile(model, example, name=name.replace("-", "_"), precision=prec,
                                      rounding=rounding, calibration=calib)
            e = rel_errors(model, prog.run, example, n)
            row[key] = (sum(e) / len(e), max(e))
            row[key + "_arena"] = prog.memory.arena_bytes
        wo = weight_only(model)
        e = rel_errors(model, wo, example, n)
        row["weights"] = (sum(e) / len(e), max(e))
        rows.append(row)
        print(row, flush=True)
    return rows


def instruction_rows() -> list[dict]:
    import corten
    from corten.zoo import get_model

    cmsis = os.environ.get("CMSIS_NN_PATH")
    rows = []
    for name in ("deep-ae", "ds-cnn"):
        model, example = get_model(name)
        x = torch.randn(example[0].shape, generator=torch.Generator().manual_seed(3))
        for prec in ("int8", "int16"):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                prog = corten.compile(model, example, name=name.replace("-", "_"), precision=prec)
            expected = prog.run_int8(x)
            for target in ("cortex-m55", "cortex-m4"):
                for kernels in ("portable", "cmsis-nn") if cmsis else ("portable",):
                    run = prog.c_run(x, on="qemu", target=target, kernels=kernels, cmsis_nn_path=cmsis)
                    same = all(torch.equal(a, b) for a, b in zip(expected, run.outputs))
                    row = {"model": name, "precision": prec, "target": target, "kernels": kernels,
                           "instructions": run.instructions, "bytes_equal": same,
                           "arena": prog.memory_for(kernels, target=target).arena_bytes}
                    rows.append(row)
                    print(row, flush=True)
    return rows


def tabular_rows() -> list[dict]:
    import sys
    from pathlib import Path

    import corten
    from corten.compiler import auto_report

    sys.path.insert(0, str(Path(__file__).parent))
    import accuracy as A

    dataset, standardise, factory, sample_shape, epochs = A.MODELS["cancer-raw"]
    xtr, ytr, xte, yte = A.load_dataset(dataset, standardise)
    xtr, xte = A.shaped(xtr, sample_shape), A.shaped(xte, sample_shape)
    torch.manual_seed(0)
    model = A.train(factory(), xtr, ytr, epochs, seed=0)
    calib = xtr[torch.randperm(len(xtr), generator=torch.Generator().manual_seed(0))[:A.CALIBRATION]]
    rows = [{"what": "float", "accuracy": float((A.predict_float(model, xte) == yte).float().mean())}]
    first = copy.deepcopy(model)
    lin = next(m for m in first.modules() if isinstance(m, nn.Linear))
    with torch.no_grad():
        s = lin.weight.abs().amax(1, keepdim=True) / 127
        lin.weight.copy_(torch.round(lin.weight / s).clamp(-127, 127) * s)
    rows.append({"what": "float, first layer's weights int8", "accuracy":
                 float((A.predict_float(first, xte) == yte).float().mean())})
    for prec in ("int8", "int16", {"0": "int16"}, "auto"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            prog = corten.compile(model, (xtr[:1],), calibration=calib, name="cancer_raw", precision=prec)
        acc = float((A.predict_program(prog, xte) == yte).float().mean())
        rows.append({"what": f"precision={prec!r}", "accuracy": acc, "arena": prog.memory.arena_bytes,
                     "report": auto_report(prog) if prec == "auto" else ""})
        print(rows[-1], flush=True)
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--inputs", type=int, default=20)
    ap.add_argument("--calibration", type=int, default=1024,
                    help="random calibration samples of the int16 nearest / adaptive rounding columns (1024)")
    ap.add_argument("--no-qemu", action="store_true")
    ap.add_argument("--markdown", action="store_true")
    ap.add_argument("--write-readme", metavar="README", help="put the tables between the README's bench_int16 markers")
    ap.add_argument("--tabular", action="store_true", help="only the cancer-raw rows")
    args = ap.parse_args(argv)
    if args.tabular:
        rows = tabular_rows()
        print("\n| cancer-raw | test accuracy % | arena B |\n|---|---|---|")
        for r in rows:
            print(f"| {r['what']} | {100 * r['accuracy']:.2f} | {r.get('arena', '')} |")
        for r in rows:
            if r.get("report"):
                print("\n" + r["report"])
        return 0
    acc = accuracy_rows(args.inputs, args.calibration)
    ins = [] if args.no_qemu else instruction_rows()
    if args.markdown or args.write_readme:
        acc_table, ins_table = markdown_tables(acc, ins, args.calibration)
        print("\n" + acc_table + ("\n\n" + ins_table if ins_table else ""))
        if args.write_readme:
            replace_block(args.write_readme, "<!-- bench_int16: begin -->", "<!-- bench_int16: end -->", acc_table,
                          "the int16 error table")
            if ins_table:
                replace_block(args.write_readme, "<!-- bench_int16 qemu: begin -->", "<!-- bench_int16 qemu: end -->",
                              ins_table, "the int16 instruction table")
    return 0


def markdown_tables(acc, ins, calibration: int) -> tuple[str, str]:
    """The README's two tables: relative errors and arenas, QEMU instructions ('' without QEMU rows)."""
    def pair(e):
        return f"{e[0]:.3f} / {e[1]:.3f}"

    lines = ["| autoencoder | int8 rel. error (mean / max) | int16 (mean / max) | int16 adaptive rounding | "
             f"int16, {calibration} calibration samples: nearest | int16, {calibration} samples: adaptive rounding | "
             "int8 weights alone | arena int8 / int16 |",
             "|---|---|---|---|---|---|---|---|"]
    for r in acc:
        lines.append(f"| {r['model']} | {pair(r['int8'])} | {pair(r['int16'])} | {pair(r['int16_adaptive'])} | "
                     f"{pair(r['int16_many'])} | {pair(r['int16_many_adaptive'])} | {pair(r['weights'])} | "
                     f"{r['int8_arena']:,} / {r['int16_arena']:,} B |")
    if not ins:
        return "\n".join(lines), ""
    qemu = ["| model | target | kernels | int8 instructions | int16 instructions | int16 / int8 | bytes equal |",
            "|---|---|---|---|---|---|---|"]
    key = {(r["model"], r["target"], r["kernels"], r["precision"]): r for r in ins}
    for (m, t, k, p), r in key.items():
        if p != "int8":
            continue
        r16 = key[(m, t, k, "int16")]
        qemu.append(f"| {m} | {t} | {k} | {r['instructions']:,} | {r16['instructions']:,} | "
                    f"{r16['instructions'] / r['instructions']:.2f} | {r['bytes_equal'] and r16['bytes_equal']} |")
    return "\n".join(lines), "\n".join(qemu)


if __name__ == "__main__":
    raise SystemExit(main())
