"""One pipeline: ``corten.compile`` runs the stages of ``corten.compiler.Pipeline`` in order, and the
``Tester`` drives the same stages one by one, so both give the same program for every zoo model
(graph text and every constant, bit for bit).  Also: compiling touches no global state."""
from __future__ import annotations

import pytest
import torch

import corten
from corten.compiler import Pipeline, default_calibration
from corten.testing import Tester
from corten.zoo import MODELS, get_model

CALIBRATION = 2  # the equality holds for any calibration; 2 samples keep the test short


def _constants(program) -> dict[str, torch.Tensor]:
    ep = program.ep
    return {**ep.state_dict, **ep.constants}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(MODELS))
def test_tester_and_compile_give_the_same_program(name):
    model, example = get_model(name)
    samples = default_calibration(example, CALIBRATION, seed=0)
    compiled = corten.compile(model, example, calibration=samples)
    tester = Tester(model, example, calibration=samples).lower()
    tested = tester.program
    assert tested.stages["lowered"] == compiled.stages["lowered"]
    assert tested.stages["quantized"] == compiled.stages["quantized"]
    a, b = _constants(compiled), _constants(tested)
    assert a.keys() == b.keys() and a
    for key in a:
        assert a[key].dtype == b[key].dtype and torch.equal(a[key], b[key]), key
    assert tested.op_counts() == compiled.op_counts() and not compiled.unlowered_ops()
    # the Tester keeps the quantized ATen graph (the lowering ran on a copy of it)
    assert any(n.target == torch.ops.aten.conv2d.default or n.target == torch.ops.aten.linear.default
               for n in tester.converted.graph.nodes)


def test_stages_are_individually_callable_and_inspectable():
    model, example = get_model("ds-cnn")
    p = Pipeline(model, example, "cortex-m4", calibration=default_calibration(example, 1, 0))
    assert p.capture().exported is not None and "conv2d" in p.graphs["exported"]
    assert p.prepare().prepared is not None and "bn_fused" in p.graphs
    assert p.calibrate().calibration_samples == 1
    p.convert()
    assert all("val" in n.meta for n in p.converted.graph.nodes if n.op != "output")
    p.lower()
    assert p.lowered is p.converted and not p.unlowered  # lowered in place unless keep_converted
    prog = p.export()
    assert prog.target.name == "cortex-m4" and prog.info["calibration_samples"] == 1
    assert set(prog.info["timings_s"]) == {"capture", "quantize", "lower"}
    assert set(prog.stages) == {"exported", "bn_fused", "quantized", "lowered"}


def test_compile_leaves_the_global_rng_alone():
    model, example = get_model("deep-ae")
    torch.manual_seed(1234)
    expected = torch.rand(4)
    torch.manual_seed(1234)
    corten.compile(model, example, calibration=None, seed=7)
    assert torch.equal(torch.rand(4), expected)
