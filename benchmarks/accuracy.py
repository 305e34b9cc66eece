"""Int8 accuracy on trained models: float vs PTQ vs QAT, and the C library byte for byte.

Trains small models on data scikit-learn ships (no download), with fixed seeds, on one core:

* ``digits-cnn``   - 8x8 digits in [0, 1], two conv+BN+ReLU blocks, linear head;
* ``digits-mlp``   - the 64 pixels, 64-32-10 MLP;
* ``digits-mnv``   - a tiny MobileNet: depthwise-separable blocks, hardswish, squeeze-excitation;
* ``cancer-mlp``   - breast cancer, 30 standardised features;
* ``wine-mlp``     - wine, 13 standardised features;
* ``cancer-raw``   - breast cancer on the raw features (1e-3 ... 1e3): the pitfall Corten warns about.

For each it prints float accuracy, int8 PTQ accuracy (64 real calibration samples) and top-1
agreement with float, the PTQ accuracy with output-aware weight rounding (``rounding="adaptive"``)
and with int4 weights (``weights="int4"``, nearest and adaptive rounding), QAT accuracy after a
short fine-tune (``corten.prepare_qat``), and whether the C library (portable kernels, host) gives
the reference bytes on ``--c-images`` test samples (of the int8 program and of the int4 adaptive
one).  With the ExecuTorch Cortex-M quantizer installed (``executorch``), its fake-quant accuracy is
shown too.

    python benchmarks/accuracy.py                 # all models (~1-2 min of training on one core)
    python benchmarks/accuracy.py --models digits-cnn --c-images 100
    python benchmarks/accuracy.py --markdown --write-readme README.md   # the README's table
"""
from __future__ import annotations

import argparse
import sys
import time
import warnings

import numpy as np
import torch
from readme_block import replace_block  # (benchmarks/ is the script directory)
from torch import nn

CALIBRATION = 64
README_BEGIN, README_END = "<!-- accuracy: begin (generated) -->", "<!-- accuracy: end -->"
# the (weights, rounding) columns besides int8 nearest (the "int8 PTQ" column)
VARIANTS = {"int8_adaptive": ("int8", "adaptive"), "int4_nearest": ("int4", "nearest"),
            "int4_adaptive": ("int4", "adaptive")}


# ----------------------------------------------------------------------------- data
def load_dataset(name: str, standardise: bool = True):
    """(x_train, y_train, x_test, y_test) float32/int64 tensors, a fixed 70/30 split."""
    from sklearn import datasets
    from sklearn.model_selection import train_test_split

    if name == "digits":
        d = datasets.load_digits()
        x = d.data.astype(np.float32) / 16.0
    elif name == "cancer":
        d = datasets.load_breast_cancer()
        x = d.data.astype(np.float32)
    elif name == "wine":
        d = datasets.load_wine()
        x = d.data.astype(np.float32)
    else:
        raise ValueError(name)
    xtr, xte, ytr, yte = train_test_split(x, d.target, test_size=0.3, random_state=0, stratify=d.target)
    if standardise and name != "digits":
        mu, sd = xtr.mean(0), xtr.std(0) + 1e-6
        xtr, xte = (xtr - mu) / sd, (xte - mu) / sd
    t = lambda a: torch.from_numpy(np.ascontiguousarray(a))  # noqa: E731
    return t(xtr), t(ytr).long(), t(xte), t(yte).long()


# ----------------------------------------------------------------------------- models
class DigitsCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.block1 = nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU())
        self.block2 = nn.Sequential(nn.Conv2d(16, 32, 3, padding=1, stride=2), nn.BatchNorm2d(32), nn.ReLU())
        self.head = nn.Linear(32 * 4 * 4, 10)

    def forward(self, x):
        return self.head(self.block2(self.block1(x)).flatten(1))


class SqueezeExcite(nn.Module):
    def __init__(self, c: int, r: int = 4):
        super().__init__()
        self.fc1 = nn.Conv2d(c, c // r, 1)
        self.fc2 = nn.Conv2d(c // r, c, 1)

    def forward(self, x):
        s = nn.functional.adaptive_avg_pool2d(x, 1)
        return x * nn.functional.hardsigmoid(self.fc2(torch.relu(self.fc1(s))))


class TinyMobileNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.BatchNorm2d(16), nn.Hardswish())
        self.dw = nn.Sequential(nn.Conv2d(16, 16, 3, padding=1, groups=16), nn.BatchNorm2d(16), nn.Hardswish())
        self.se = SqueezeExcite(16)
        self.pw = nn.Sequential(nn.Conv2d(16, 32, 1), nn.BatchNorm2d(32), nn.Hardswish())
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.head = nn.Linear(32, 10)

    def forward(self, x):
        return self.head(self.pool(self.pw(self.se(self.dw(self.stem(x))))).flatten(1))


def mlp(n_in: int, hidden: tuple[int, ...], n_out: int) -> nn.Module:
    layers, prev = [], n_in
    for h in hidden:
        layers += [nn.Linear(prev, h), nn.ReLU()]
        prev = h
    return nn.Sequential(*layers, nn.Linear(prev, n_out))


# name -> (dataset, standardise, model factory, input shape of one sample, epochs)
MODELS = {
    "digits-cnn": ("digits", True, DigitsCNN, (1, 8, 8), 30),
    "digits-mlp": ("digits", True, lambda: mlp(64, (64, 32), 10), (64,), 40),
    "digits-mnv": ("digits", True, TinyMobileNet, (1, 8, 8), 40),
    "cancer-mlp": ("cancer", True, lambda: mlp(30, (32, 16), 2), (30,), 60),
    "wine-mlp": ("wine", True, lambda: mlp(13, (32,), 3), (13,), 80),
    "cancer-raw": ("cancer", False, lambda: mlp(30, (32, 16), 2), (30,), 60),
}


def train(model: nn.Module, x: torch.Tensor, y: torch.Tensor, epochs: int, lr: float = 3e-3, seed: int = 0,
          batch: int = 32) -> nn.Module:
    g = torch.Generator().manual_seed(seed)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    loss_fn = nn.CrossEntropyLoss()
    model.train()
    for _ in range(epochs):
        perm = torch.randperm(len(x), generator=g)
        for i in range(0, len(x), batch):
            idx = perm[i:i + batch]
            opt.zero_grad()
            loss_fn(model(x[idx]), y[idx]).backward()
            opt.step()
    return model.eval()


def shaped(x: torch.Tensor, sample_shape: tuple[int, ...]) -> torch.Tensor:
    return x.reshape(len(x), *sample_shape)


def predict_float(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(x).argmax(-1)


def predict_program(prog, x: torch.Tensor) -> torch.Tensor:
    return torch.stack([prog.run(x[i:i + 1]).reshape(-1).argmax() for i in range(len(x))])


def c_byte_exact(prog, x: torch.Tensor, n: int) -> tuple[int, int]:
    """(samples whose C output bytes equal the reference's, samples checked)."""
    ok = 0
    n = min(n, len(x))
    for i in range(n):
        ref = prog.run_int8(x[i:i + 1])
        got = prog.run_c(x[i:i + 1], on="host", int8=True)
        ok += all(torch.equal(a.contiguous(), b.contiguous()) for a, b in zip(ref, got))
    return ok, n


# ----------------------------------------------------------------------------- experiment
def evaluate(name: str, c_images: int = 100, qat_epochs: int = 3, seed: int = 0, epochs: int | None = None,
             log=print) -> dict:
    import corten

    dataset, standardise, factory, sample_shape, default_epochs = MODELS[name]
    xtr, ytr, xte, yte = load_dataset(dataset, standardise)
    xtr, xte = shaped(xtr, sample_shape), shaped(xte, sample_shape)
    torch.manual_seed(seed)
    model = train(factory(), xtr, ytr, epochs or default_epochs, seed=seed)
    example = (xtr[:1],)
    f_pred = predict_float(model, xte)
    row = {"model": name, "float": float((f_pred == yte).float().mean())}

    calib = xtr[torch.randperm(len(xtr), generator=torch.Generator().manual_seed(seed))[:CALIBRATION]]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        prog = corten.compile(model, example, calibration=calib, name=name.replace("-", "_"))
    row["warnings"] = [str(w.message) for w in caught if issubclass(w.category, corten.QuantizationWarning)]
    q_pred = predict_program(prog, xte)
    row["ptq"] = float((q_pred == yte).float().mean())
    row["agree"] = float((q_pred == f_pred).float().mean())
    for key, (weights, rounding) in VARIANTS.items():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            t0 = time.perf_counter()
            vprog = corten.compile(model, example, calibration=calib, name=f"{name.replace('-', '_')}_{key}",
                                   weights=weights, rounding=rounding)
            row[f"{key}_s"] = time.perf_counter() - t0
        row[key] = float((predict_program(vprog, xte) == yte).float().mean())
        if key == "int4_adaptive" and c_images:
            ok, n = c_byte_exact(vprog, xte, c_images)
            row["c_exact_int4"] = f"{ok}/{n}"
    if not standardise:  # raw features: the same PTQ with per-feature input scales (input_scaling=)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            fprog = corten.compile(model, example, calibration=calib, name=name.replace("-", "_") + "_pf",
                                   input_scaling="per_feature")
            aprog = corten.compile(model, example, calibration=calib, name=name.replace("-", "_") + "_pfa",
                                   input_scaling="per_feature", rounding="adaptive")
        row["per_feature"] = float((predict_program(fprog, xte) == yte).float().mean())
        row["per_feature_adaptive"] = float((predict_program(aprog, xte) == yte).float().mean())

    if qat_epochs:
        qat = corten.prepare_qat(model, example)
        train(qat, xtr, ytr, qat_epochs, lr=5e-4, seed=seed + 1)
        qprog = corten.compile(qat, example, name=name.replace("-", "_") + "_qat")
        qa_pred = predict_program(qprog, xte)
        row["qat"] = float((qa_pred == yte).float().mean())
    if c_images:
        ok, n = c_byte_exact(prog, xte, c_images)
        row["c_exact"] = f"{ok}/{n}"
    peer = _peer_fake_quant_accuracy(model, example, calib, xte, yte)
    if peer is not None:
        row["executorch"] = peer
    log(_format_row(row))
    return row


def _peer_fake_quant_accuracy(model, example, calib, xte, yte) -> float | None:
    """The ExecuTorch Cortex-M quantizer's fake-quant accuracy, when executorch is installed."""
    try:
        from executorch.backends.cortex_m.quantizer.quantizer import CortexMQuantizer  # type: ignore
    except Exception:
        return None
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    gm = torch.export.export(model, example).module()
    prepared = prepare_pt2e(gm, CortexMQuantizer())
    for i in range(len(calib)):
        prepared(calib[i:i + 1])
    converted = convert_pt2e(prepared)
    with torch.no_grad():
        pred = torch.stack([converted(xte[i:i + 1]).reshape(-1).argmax() for i in range(len(xte))])
    return float((pred == yte).float().mean())


HEADER = (f"{'model':<12} {'float':>7} {'int8 PTQ':>9} {'agree':>7} {'int8 ada':>9} {'int4':>7} {'int4 ada':>9} "
          f"{'per-feat':>9} {'QAT':>7} {'C exact':>9}  warnings")


def _format_row(r: dict) -> str:
    pct = lambda v: f"{100 * v:.2f}" if isinstance(v, float) else "-"  # noqa: E731
    warn = "; ".join(w[:60] for w in r.get("warnings", [])) or "-"
    peer = f"  (ExecuTorch fake-quant {pct(r['executorch'])})" if "executorch" in r else ""
    return (f"{r['model']:<12} {pct(r['float']):>7} {pct(r['ptq']):>9} {pct(r['agree']):>7} "
            f"{pct(r.get('int8_adaptive')):>9} {pct(r.get('int4_nearest')):>7} {pct(r.get('int4_adaptive')):>9} "
            f"{pct(r.get('per_feature')):>9} {pct(r.get('qat')):>7} {r.get('c_exact', '-'):>9}  {warn}{peer}")


def markdown(rows: list[dict]) -> str:
    pct = lambda v: f"{100 * v:.2f}" if isinstance(v, float) else "-"  # noqa: E731
    lines = ["| model | float | int8 PTQ (64 samples) | top-1 agreement | int8 adaptive rounding | int4 weights "
             "| int4 adaptive rounding | per-feature input scales (nearest / adaptive) | QAT "
             "| C bytes equal (int8 / int4 adaptive) | warning |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        warn = "; ".join(w.split(";")[0][:70] for w in r.get("warnings", [])) or ""
        lines.append(f"| {r['model']} | {pct(r['float'])} | {pct(r['ptq'])} | {pct(r['agree'])} "
                     f"| {pct(r.get('int8_adaptive'))} | {pct(r.get('int4_nearest'))} | {pct(r.get('int4_adaptive'))} "
                     f"| {pct(r.get('per_feature'))} / {pct(r.get('per_feature_adaptive'))} | {pct(r.get('qat'))} "
                     f"| {r.get('c_exact', '-')} / {r.get('c_exact_int4', '-')} | {warn} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="*", default=list(MODELS), choices=list(MODELS))
    ap.add_argument("--c-images", type=int, default=100, help="test samples checked byte for byte in C (100)")
    ap.add_argument("--qat-epochs", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--markdown", action="store_true", help="also print the table as Markdown (the README's)")
    ap.add_argument("--write-readme", default=None, metavar="README.md",
                    help="put the Markdown table between the accuracy markers of this file")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    print("accuracy on the test split (%), int8 = Corten program (reference kernels), "
          f"PTQ with {CALIBRATION} real calibration samples; QAT = {args.qat_epochs} fine-tune epochs")
    print(HEADER)
    t0 = time.perf_counter()
    rows = [evaluate(name, args.c_images, args.qat_epochs, args.seed) for name in args.models]
    print(f"total {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    if args.markdown or args.write_readme:
        text = markdown(rows)
        print("\n" + text)
        if args.write_readme:
            replace_block(args.write_readme, README_BEGIN, README_END, text, "the accuracy table")
    return 0


if __name__ == "__main__":
    sys.exit(main())
