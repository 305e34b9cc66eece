"""How far can weight rounding take an autoencoder's int8-weight error?  The floor study behind issue
24's deep-ae line (int16, adaptive rounding, relative error <= 0.05).

    .venv/bin/python benchmarks/rounding_floor.py [--model deep-ae] [--inputs 2000]
        [--calibration 1024 4096 16384] [--steps 6000] [--markdown] [--write-readme README.md]

The relative error ``||program - float|| / ||float||`` (mean over ``--inputs`` random N(0, 1) inputs,
drawn one by one from seed 10_000 as ``benchmarks/bench_int16.py`` draws its 20) of:

* **each layer alone**: the float model with only that layer's weights rounded to int8
  (round-to-nearest, per output channel, BatchNorm folded), every other layer float.  The squares
  of these add up to the square of all layers rounded: each row is that layer's share of the error.
* for each ``--calibration`` count of random N(0, 1) calibration samples (seed 20_000, as
  bench_int16's):
  - Corten's int16 program (``precision="int16"``) with ``rounding="nearest"`` and ``"adaptive"``
    (the layer-by-layer output-aware rounding of :mod:`corten.quantizer.rounding`);
  - **joint rounding**: every weight's up/down choice fitted at once against the float model's
    *final* output on the calibration samples (AdaRound's rectified-sigmoid relaxation through the
    whole network, Nagel et al. 2020, Adam for ``--steps`` steps on batches of 256, the rounding
    regulariser's exponent annealed from 20 to 2; float activations, float64): the error on the
    evaluation inputs and on the calibration samples it was fitted on.  No rounding method chooses
    from more information than this one, so its held-out error is what rounding can reach from that
    many samples; the gap to its fitted error is what the samples do not determine.

The model must be a chain of ``Linear`` layers, each optionally followed by ``BatchNorm1d`` and a
``ReLU`` (the MLPerf Tiny deep autoencoder and bench_int16's ``ae-small``).
"""
from __future__ import annotations

import argparse
import sys
import time
import warnings

import torch
from bench_int16 import autoencoder  # (benchmarks/ is the script directory)
from readme_block import replace_block
from torch import nn

README_BEGIN, README_END = "<!-- rounding_floor: begin (generated) -->", "<!-- rounding_floor: end -->"


# ----------------------------------------------------------------------------- the float chain
def folded_layers(model: nn.Module) -> list[tuple[torch.Tensor, torch.Tensor, bool]]:
    """``[(weight, bias, relu after)]`` in float64, each BatchNorm1d folded into the Linear before it."""
    mods = [m for m in model.modules() if not isinstance(m, nn.Sequential) and m is not model]
    out = []
    for i, m in enumerate(mods):
        if isinstance(m, nn.Linear):
            w, b = m.weight.detach().double(), m.bias.detach().double()
            nxt = mods[i + 1] if i + 1 < len(mods) else None
            if isinstance(nxt, nn.BatchNorm1d):
                k = (nxt.weight / torch.sqrt(nxt.running_var + nxt.eps)).detach().double()
                w, b = w * k[:, None], (b - nxt.running_mean.double()) * k + nxt.bias.detach().double()
                nxt = mods[i + 2] if i + 2 < len(mods) else None
            out.append((w, b, isinstance(nxt, nn.ReLU)))
        elif not isinstance(m, (nn.BatchNorm1d, nn.ReLU)):
            raise SystemExit(f"rounding_floor: a chain of Linear (+ BatchNorm1d) (+ ReLU) only, got {type(m).__name__}")
    return out


def chain(x: torch.Tensor, layers, weights) -> torch.Tensor:
    for (_, b, relu), w in zip(layers, weights):
        x = x @ w.T + b
        x = torch.relu(x) if relu else x
    return x


def weight_scale(w: torch.Tensor) -> torch.Tensor:
    """Symmetric int8 per output channel, as Corten quantizes weights."""
    return w.abs().amax(1).clamp_min(1e-12) / 127


def nearest(w: torch.Tensor) -> torch.Tensor:
    s = weight_scale(w)[:, None]
    return torch.clamp(torch.round(w / s), -127, 127) * s


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    return float(((got - want).norm(dim=1) / want.norm(dim=1).clamp_min(1e-12)).mean())


def draw(shape: tuple, n: int, seed: int) -> torch.Tensor:
    """``n`` N(0, 1) samples drawn one by one (the first 20 of seed 10_000 are bench_int16's inputs)."""
    g = torch.Generator().manual_seed(seed)
    return torch.cat([torch.randn(shape, generator=g) for _ in range(n)])


# ----------------------------------------------------------------------------- joint rounding
ZETA, GAMMA = 1.1, -0.1  # AdaRound's rectified sigmoid stretch


def soft_step(v: torch.Tensor) -> torch.Tensor:
    return torch.clamp(torch.sigmoid(v) * (ZETA - GAMMA) + GAMMA, 0, 1)


def joint_rounding(layers, x: torch.Tensor, steps: int, seed: int = 0, say=print) -> list[torch.Tensor]:
    """Every layer's int8 weights (dequantized), each rounded up or down, fitted at once against the
    float chain's output on ``x`` (see the module docstring)."""
    gen = torch.Generator().manual_seed(seed)
    scales = [weight_scale(w)[:, None] for w, _, _ in layers]
    floors = [torch.floor(w / s) for (w, _, _), s in zip(layers, scales)]
    start = [((w / s - f - GAMMA) / (ZETA - GAMMA)).clamp(0.01, 0.99) for (w, _, _), s, f in zip(layers, scales, floors)]
    v = [torch.log(p / (1 - p)).requires_grad_(True) for p in start]  # soft_step(v) = the fractional part
    opt = torch.optim.Adam(v, lr=1e-2)
    want = chain(x, layers, [w for w, _, _ in layers])
    norm = want.norm(dim=1, keepdim=True).clamp_min(1e-12)
    for step in range(steps):
        idx = torch.randint(0, len(x), (min(256, len(x)),), generator=gen)
        weights = [torch.clamp(f + soft_step(p), -127, 127) * s for f, p, s in zip(floors, v, scales)]
        fit = (((chain(x[idx], layers, weights) - want[idx]) / norm[idx]) ** 2).sum(1).mean()
        warm = step / steps < 0.2
        beta = 20 - 18 * max(0.0, (step / steps - 0.2) / 0.8)
        reg = 0 if warm else 1e-5 * sum((1 - (2 * soft_step(p) - 1).abs() ** beta).sum() for p in v)
        opt.zero_grad()
        (fit + reg).backward()
        opt.step()
        if step % 1000 == 0:
            say(f"    joint rounding step {step}/{steps}: fit {float(fit.detach()):.3g}")
    with torch.no_grad():
        return [torch.clamp(f + (p >= 0).double(), -127, 127) * s for f, p, s in zip(floors, v, scales)]


# ----------------------------------------------------------------------------- the study
def corten_errors(model, example, calibration: list, inputs: torch.Tensor, want: torch.Tensor) -> dict:
    import corten

    out = {}
    for rounding in ("nearest", "adaptive"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            prog = corten.compile(model, example, name="floor", precision="int16", rounding=rounding,
                                  calibration=calibration)
        got = torch.cat([prog.run(inputs[i:i + 1].float()).double() for i in range(len(inputs))])
        out[rounding] = relative_error(got, want)
    return out


def study(name: str, n_inputs: int, counts: list[int], steps: int, say=print) -> dict:
    torch.set_num_threads(1)
    model, example = autoencoder(name)
    layers = folded_layers(model)
    floats = [w for w, _, _ in layers]
    inputs = draw(tuple(example[0].shape), n_inputs, 10_000).double()
    want = chain(inputs, layers, floats)
    rounded = [nearest(w) for w in floats]
    result = {"model": name, "inputs": n_inputs, "steps": steps,
              "all_nearest": relative_error(chain(inputs, layers, rounded), want), "alone": [], "counts": []}
    for i, (w, _, _) in enumerate(layers):
        alone = floats[:i] + [rounded[i]] + floats[i + 1:]
        result["alone"].append((f"{tuple(w.shape[::-1])}", relative_error(chain(inputs, layers, alone), want)))
    for n in counts:
        t0 = time.time()
        calib = draw(tuple(example[0].shape), n, 20_000)
        row = {"n": n, **corten_errors(model, example, [(calib[i:i + 1],) for i in range(n)], inputs, want)}
        joint = joint_rounding(layers, calib.double(), steps, say=say)
        row["joint"] = relative_error(chain(inputs, layers, joint), want)
        row["joint_fit"] = relative_error(chain(calib.double(), layers, joint), chain(calib.double(), layers, floats))
        say(f"  {n} samples ({time.time() - t0:.0f} s): {row}")
        result["counts"].append(row)
    return result


def markdown(r: dict) -> str:
    lines = [f"Each layer alone rounded to int8 (the rest float; all layers: {r['all_nearest']:.4f}):", "",
             "| layer (in, out) | " + " | ".join(f"{i}: {shape}" for i, (shape, _) in enumerate(r["alone"])) + " |",
             "|---|" + "---|" * len(r["alone"]),
             "| rel. error | " + " | ".join(f"{e:.4f}" for _, e in r["alone"]) + " |", "",
             f"| calibration samples | int16 nearest | int16 adaptive rounding (Corten) | joint rounding: held out "
             f"| joint rounding: fitted samples |", "|---|---|---|---|---|"]
    for c in r["counts"]:
        lines.append(f"| {c['n']:,} | {c['nearest']:.4f} | {c['adaptive']:.4f} | {c['joint']:.4f} | {c['joint_fit']:.4f} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="deep-ae", choices=["deep-ae", "ae-small"])
    ap.add_argument("--inputs", type=int, default=2000)
    ap.add_argument("--calibration", type=int, nargs="+", default=[1024, 4096, 16384])
    ap.add_argument("--steps", type=int, default=6000, help="Adam steps of the joint rounding (6000)")
    ap.add_argument("--markdown", action="store_true")
    ap.add_argument("--write-readme", metavar="README", help="put the tables between the README's rounding_floor markers")
    args = ap.parse_args(argv)
    torch.manual_seed(0)
    r = study(args.model, args.inputs, args.calibration, args.steps, say=lambda s: print(s, flush=True))
    table = markdown(r)
    print("\n" + table)
    if args.write_readme:
        replace_block(args.write_readme, README_BEGIN, README_END, table, "the rounding floor tables")
    return 0


if __name__ == "__main__":
    sys.exit(main())
