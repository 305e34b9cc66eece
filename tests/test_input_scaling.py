"""Per-feature input scaling (``compile(..., input_scaling="per_feature")``): features spanning
1e-3 ... 1e3 keep their information where one int8 grid loses the small ones; the map is folded into
the first linear layer (no extra op), the program is byte-exact in C, the header's
``<name>_scale_input`` + ``<name>_quantize_input`` give the bytes Python quantizes, and it survives
save/load.  Bad uses are refused with what to do."""
from __future__ import annotations

import shutil
import subprocess
import warnings

import pytest
import torch
from torch import nn

import corten
from corten.errors import UsageError
from corten.quantizer.input_scaling import feature_affine, scale_input

needs_gcc = pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")
SPANS = torch.logspace(-3, 3, 12)  # feature k takes values of size SPANS[k]


def _data(n: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.rand(n, 12, generator=g) * 2 - 1) * SPANS + SPANS  # [0, 2 * span]


def _model() -> nn.Module:
    """A small MLP whose first layer undoes the feature scales (as a trained one would)."""
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(12, 16), nn.ReLU(), nn.Linear(16, 3))
    with torch.no_grad():
        m[0].weight /= SPANS
    return m.eval()


def _compile(mode: str, **kw):
    warnings.simplefilter("ignore")
    calib = [(x.unsqueeze(0),) for x in _data(64, 1)]
    return corten.compile(_model(), calib[0], calibration=calib, input_scaling=mode, **kw)


def test_feature_affine_maps_each_range_onto_int8():
    x = _data(200, 3)
    s, o = feature_affine(x)
    y = scale_input(x, s, o)
    assert torch.allclose(y.amin(0), torch.full((12,), -128.0), atol=1e-3)
    assert torch.allclose(y.amax(0), torch.full((12,), 127.0), atol=1e-3)
    s, o = feature_affine(torch.ones(5, 3))  # a constant feature maps onto 0
    assert torch.equal(scale_input(torch.ones(2, 3), s, o), torch.zeros(2, 3))


def test_per_feature_scaling_keeps_small_features_and_folds_into_the_linear():
    model = _model()
    x = _data(32, 2)
    want = model(x)
    err = {}
    for mode in ("per_tensor", "per_feature"):
        prog = _compile(mode)
        assert prog.op_counts() == {"quantize_per_tensor": 1, "quantized_linear": 2, "dequantize_per_tensor": 1}
        got = torch.cat([prog.run(r.unsqueeze(0)) for r in x])
        err[mode] = float((got - want).abs().max() / want.abs().max())
    assert err["per_feature"] < 0.05 < 0.2 < err["per_tensor"], err
    assert prog.inputs[0].scale == 1.0 and prog.inputs[0].zero_point == 0


@needs_gcc
def test_scaled_input_is_byte_exact_in_c_and_the_header_helper_quantizes_alike(tmp_path):
    prog = _compile("per_feature")
    x = _data(3, 5)
    for r in x:
        r = r.unsqueeze(0)
        assert torch.equal(prog.run_int8(r)[0], prog.c_run(r).outputs[0])
    lib = prog.emit_c(tmp_path / "lib")
    values = ", ".join(f"{float(v)!r}f" for v in x.flatten())
    (tmp_path / "q.c").write_text(f"""#include <stdio.h>
#include "model.h"
int main(void) {{
    static const float x[] = {{{values}}};
    for (int i = 0; i < {x.numel()}; i++) printf("%d\\n", model_quantize_input(model_scale_input(x[i], i % 12)));
    return 0;
}}
""")
    exe = tmp_path / "q"
    subprocess.run(["gcc", "-std=c99", "-Wall", "-Wextra", "-Werror", f"-I{lib.out_dir}", str(tmp_path / "q.c"),
                    "-o", str(exe)], check=True)
    got = [int(v) for v in subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout.split()]
    want = torch.cat([prog.quantize_inputs(r.unsqueeze(0))[0] for r in x]).flatten().tolist()
    assert got == want


def test_scaling_survives_save_and_load(tmp_path):
    prog = _compile("per_feature")
    prog.save(tmp_path / "p")
    back = corten.load(tmp_path / "p")
    x = _data(2, 9)[:1]
    assert torch.equal(back.run_int8(x)[0], prog.run_int8(x)[0])


@pytest.mark.parametrize("case, words", [
    ("no_calibration", "pass calibration="),
    ("conv_input", "read by nothing else"),
    ("bad_mode", "input_scaling must be one of"),
])
def test_bad_uses_are_refused_with_what_to_do(case, words):
    warnings.simplefilter("ignore")
    x = torch.rand(1, 3, 4, 4)
    with pytest.raises(UsageError) as info:
        if case == "no_calibration":
            corten.compile(_model(), (_data(1, 0),), input_scaling="per_feature")
        elif case == "conv_input":
            corten.compile(nn.Conv2d(3, 2, 1).eval(), (x,), calibration=[(torch.rand(1, 3, 4, 4),)] * 2,
                           input_scaling="per_feature")
        else:
            corten.compile(_model(), (_data(1, 0),), input_scaling="feature")
    assert words in str(info.value), str(info.value)
