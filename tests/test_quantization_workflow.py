"""Quantization a user can trust: QAT, calibration data forms, observers, warnings, per-layer compare.

The accuracy checks use a model trained on scikit-learn's digits (shipped with the package)."""
from __future__ import annotations

import importlib.util
import math
import sys
import warnings
from pathlib import Path

import pytest
import torch
from torch import nn

import corten
from corten.quantizer.calibration import QuantizationWarning, calibration_batches
from corten.quantizer.observers import OBSERVERS

BENCH = Path(__file__).resolve().parent.parent / "benchmarks" / "accuracy.py"


def _accuracy_module():
    """benchmarks/accuracy.py as a module, imported as running the script does: with its own
    directory on ``sys.path`` (it imports ``readme_block`` from there)."""
    spec = importlib.util.spec_from_file_location("corten_bench_accuracy", BENCH)
    mod = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(BENCH.parent))
    try:
        spec.loader.exec_module(mod)
    finally:
        sys.path.remove(str(BENCH.parent))
    return mod


class SmallCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)
        self.fc = nn.Linear(4 * 8 * 8, 10)

    def forward(self, x):
        return self.fc(torch.relu(self.bn(self.conv(x))).flatten(1))


def _quantization_warnings(fn):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = fn()
    return result, [str(w.message) for w in caught if issubclass(w.category, QuantizationWarning)]


@pytest.fixture(scope="module")
def data():
    g = torch.Generator().manual_seed(0)
    return torch.rand(32, 1, 8, 8, generator=g)


# ----------------------------------------------------------------------------- calibration forms
def test_calibration_forms_give_the_same_samples(data):
    ex = (data[:1],)
    as_tensor = calibration_batches(data, ex)
    as_tuples = calibration_batches([(data[i:i + 1],) for i in range(len(data))], ex)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(data, torch.zeros(len(data))), batch_size=8)
    as_loader = calibration_batches(loader, ex)  # (x, y) batches of 8: x taken, split into samples
    as_batches = calibration_batches([data[i:i + 4] for i in range(0, 32, 4)], ex)
    for samples in (as_tensor, as_tuples, as_loader, as_batches):
        assert len(samples) == 32
        assert all(len(s) == 1 and s[0].shape == (1, 1, 8, 8) for s in samples)
        assert torch.equal(torch.cat([s[0] for s in samples]), data)


def test_calibration_callable_and_programs_agree(data):
    model = SmallCNN().eval()
    ex = (data[:1],)
    p_tensor = corten.compile(model, ex, calibration=data)
    seen = []

    def calibrate(m):
        for i in range(len(data)):
            seen.append(i)
            m(data[i:i + 1])

    p_callable = corten.compile(model, ex, calibration=calibrate)
    assert len(seen) == 32
    x = data[:1]
    assert torch.equal(p_tensor.run(x), p_callable.run(x))
    assert p_tensor.info["calibration_samples"] == 32


def test_calibration_refusals(data):
    ex = (data[:1],)
    with pytest.raises(ValueError, match="dict"):
        calibration_batches([{"x": data[:1]}], ex)
    with pytest.raises(ValueError, match="2 input"):
        calibration_batches([(data[:1],)], (data[:1], data[:1]))
    with pytest.raises(ValueError, match="must be None, a tensor"):
        calibration_batches(3.5, ex)


@pytest.mark.parametrize("observer", OBSERVERS)
def test_every_observer_compiles_byte_exact(observer, data):
    model = SmallCNN().eval()
    prog = corten.compile(model, (data[:1],), calibration=data, observer=observer)
    assert prog.unlowered_ops() == [] and prog.info["observer"] == observer
    x = data[3:4]
    ref = prog.run_int8(x)[0]
    got = prog.run_c(x, on="host", int8=True)[0]
    assert torch.equal(ref.contiguous(), got.contiguous())


def test_unknown_observer_is_refused(data):
    with pytest.raises(ValueError, match="observer='median' is not one of"):
        corten.compile(SmallCNN().eval(), (data[:1],), calibration=data, observer="median")


def test_program_outputs_are_not_clipped(data):
    """Outputs use min/max whatever the observer: the largest calibration logit is representable."""
    model = SmallCNN().eval()
    prog = corten.compile(model, (data[:1],), calibration=data, observer="percentile")
    with torch.no_grad():
        logits = model(data)
    spec = prog.outputs[0]
    hi = spec.scale * (127 - spec.zero_point)
    lo = spec.scale * (-128 - spec.zero_point)
    assert float(logits.max()) <= hi + spec.scale / 2 and float(logits.min()) >= lo - spec.scale / 2


# ----------------------------------------------------------------------------- warnings
def test_random_calibration_warns(data):
    _, msgs = _quantization_warnings(lambda: corten.compile(SmallCNN().eval(), (data[:1],)))
    assert any("calibration=None" in m and "random" in m for m in msgs)


def test_real_calibration_does_not_warn(data):
    _, msgs = _quantization_warnings(lambda: corten.compile(SmallCNN().eval(), (data[:1],), calibration=data))
    assert msgs == []


def test_raw_feature_ranges_warn():
    g = torch.Generator().manual_seed(0)
    feats = torch.rand(64, 6, generator=g) * torch.tensor([1e-3, 1e-2, 1.0, 10.0, 100.0, 1e3])
    mlp = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 2)).eval()
    _, msgs = _quantization_warnings(lambda: corten.compile(mlp, (feats[:1],), calibration=feats))
    assert any("feature ranges differ" in m and "Normalise" in m for m in msgs), msgs
    std = (feats - feats.mean(0)) / feats.std(0)
    _, msgs = _quantization_warnings(lambda: corten.compile(mlp, (std[:1],), calibration=std))
    assert not any("feature ranges differ" in m for m in msgs)


def test_low_sqnr_layer_warns_by_name(data):
    model = SmallCNN().eval()
    prog = corten.compile(model, (data[:1],), calibration=data)
    report, msgs = _quantization_warnings(lambda: prog.compare(model, [data[:1]], threshold_db=200.0))
    assert msgs and any("module 'fc'" in m for m in msgs)


# ----------------------------------------------------------------------------- QAT
def test_qat_end_to_end_byte_exact(data):
    torch.manual_seed(0)
    qat = corten.prepare_qat(SmallCNN(), (data[:1],))
    assert corten.quantizer.qat.is_qat_module(qat)
    qat.train()  # train()/eval() work on the prepared module
    opt = torch.optim.SGD(qat.parameters(), lr=0.01)
    for i in range(0, 32, 8):  # mini-batches of 8 (the QAT graph has a dynamic batch)
        loss = qat(data[i:i + 8]).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    _, msgs = _quantization_warnings(lambda: corten.compile(qat, (data[:1],), calibration=data))
    assert any("ignored for a QAT module" in m for m in msgs)
    prog = corten.compile(qat, (data[:1],))
    assert prog.unlowered_ops() == []
    assert prog.op_counts()["quantized_conv2d"] == 1 and prog.info["qat"] is True
    for i in (0, 5):
        x = data[i:i + 1]
        assert torch.equal(prog.run_int8(x)[0].contiguous(), prog.run_c(x, int8=True)[0].contiguous())
    # the fake-quantized QAT module and the int8 program agree closely
    qat.eval()
    with torch.no_grad():
        fq = qat(data[:1])
    assert torch.nn.functional.cosine_similarity(fq.flatten(), prog.run(data[:1]).flatten(), dim=0) > 0.99


def test_prepare_qat_refuses_bad_inputs():
    from corten.capture import CaptureError

    with pytest.raises(CaptureError, match="float32"):
        corten.prepare_qat(SmallCNN(), (torch.zeros(1, 1, 8, 8, dtype=torch.int32),))
    with pytest.raises(ValueError, match="prepare_qat returned"):
        corten.convert_qat(SmallCNN())


# ----------------------------------------------------------------------------- compare + accuracy
@pytest.fixture(scope="module")
def digits_cnn():
    acc = _accuracy_module()
    xtr, ytr, xte, yte = acc.load_dataset("digits")
    xtr, xte = acc.shaped(xtr, (1, 8, 8)), acc.shaped(xte, (1, 8, 8))
    torch.manual_seed(0)
    model = acc.train(acc.DigitsCNN(), xtr, ytr, epochs=12)
    prog = corten.compile(model, (xtr[:1],), calibration=xtr[:64], name="digits_cnn")
    return acc, model, prog, xtr, xte, yte


def test_digits_cnn_int8_matches_float(digits_cnn):
    acc, model, prog, _, xte, yte = digits_cnn
    f_pred = acc.predict_float(model, xte)
    q_pred = acc.predict_program(prog, xte)
    f_acc, q_acc = float((f_pred == yte).float().mean()), float((q_pred == yte).float().mean())
    assert f_acc > 0.95
    assert q_acc >= f_acc - 0.005
    assert float((f_pred == q_pred).float().mean()) >= 0.99
    ok, n = acc.c_byte_exact(prog, xte, 10)
    assert ok == n == 10


def test_compare_report_on_digits_cnn(digits_cnn, tmp_path):
    _, model, prog, xtr, _, _ = digits_cnn
    report = prog.compare(model, [(xtr[i:i + 1],) for i in range(8)])
    quantized = [n for n in prog.ep.graph.nodes if n.op == "call_function"
                 and n.target._schema.name.split("::")[1] not in ("dequantize_per_tensor",)
                 and n.target.namespace == "corten"]
    assert len(report.rows) == len(quantized)  # one row per quantized tensor
    assert all(math.isfinite(r.sqnr_db) and math.isfinite(r.op_sqnr_db) for r in report.rows)
    assert all(r.sqnr_db > 15 for r in report.rows)
    assert {r.module for r in report.rows} >= {"block1.0", "block2.0", "head"}
    # quantizing the input is exact rounding: at most half a step off (nothing clipped at 64 samples)
    first = report.rows[0]
    assert first.op == "quantize_per_tensor" and first.max_err_steps <= 0.5 + 1e-6
    assert all(math.isfinite(r.max_err_steps) and 0 <= r.saturated <= 1 for r in report.rows)
    text = report.table()
    assert "block2.0" in text and "SQNR" in text
    png = report.plot(tmp_path / "sqnr.png")
    import matplotlib.image

    img = matplotlib.image.imread(png)
    assert img.shape[0] > 100 and img.shape[1] > 100


def test_cli_compare_and_calibration_file(tmp_path, data):
    import numpy as np

    from corten.cli import main

    model_file = tmp_path / "net.py"
    model_file.write_text(
        "import torch\nfrom torch import nn\n"
        "def make():\n"
        "    torch.manual_seed(0)\n"
        "    m = nn.Sequential(nn.Conv2d(1, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(144, 5)).eval()\n"
        "    return m, (torch.rand(1, 1, 8, 8),)\n")
    calib = tmp_path / "calib.npy"
    np.save(calib, data.numpy())
    out = tmp_path / "out"
    rc = main(["compile", f"{model_file}:make", "--out", str(out), "--calib-data", str(calib), "--compare",
               "--compare-plot", str(tmp_path / "c.png"), "--observer", "mse"])
    assert rc == 0
    assert "quantized_linear" in (out / "compare.txt").read_text()
    assert (tmp_path / "c.png").stat().st_size > 1000
    bad = tmp_path / "bad.npy"
    np.save(bad, np.zeros((4, 3), dtype=np.float32))
    assert main(["compile", f"{model_file}:make", "--out", str(tmp_path / "o2"), "--calib-data", str(bad)]) == 2
