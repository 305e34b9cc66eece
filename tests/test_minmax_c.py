"""``corten_maximum_s8`` / ``corten_minimum_s8`` (src/corten/codegen/kernels/minmax.c) byte for byte
against the reference ops through ctypes, and models with maximum/minimum through the pipeline:
dialect (Tester.test_dialect; the quantizer shares one grid between inputs and output), then C on
the host and on QEMU (Cortex-M55); with CMSIS_NN_PATH set also the CMSIS-NN flavour
(arm_maximum_s8 / arm_minimum_s8, broadcasting included)."""
from __future__ import annotations

import ctypes
import random
import warnings

import pytest
import torch
from torch import nn
from conftest import needs_cmsis_nn, needs_gcc, needs_qemu

import naive_elementwise as ne
import op_cases as oc
from corten.testing import Tester

OPS = {"maximum": torch.ops.corten.quantized_maximum, "minimum": torch.ops.corten.quantized_minimum}
C_CASES = 400


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    return ne.build_kernel_library(tmp_path_factory.mktemp("minmax"), "minmax")


@needs_gcc
@pytest.mark.parametrize("name", sorted(OPS))
def test_minmax_kernel_matches_reference(lib, name):
    rng = random.Random(63 + len(name))
    fn = getattr(lib, f"corten_{name}_s8")
    for i in range(C_CASES):
        s1, s2 = ne.random_broadcast_shapes(rng)
        x1, x2 = oc.int8_tensor(rng, s1), oc.int8_tensor(rng, s2)
        want = OPS[name](x1, x2)
        out = (ctypes.c_int8 * want.numel())()
        shape = ne.broadcast_struct(want.shape, s1, s2)
        assert fn(ctypes.byref(shape), ne.c_buffer(x1), ne.c_buffer(x2), out) == 0
        assert bytes(out) == ne.c_bytes(want), f"case {i}: {name}({s1}, {s2})"


@needs_gcc
def test_minmax_kernel_rejects_null(lib):
    x = (ctypes.c_int8 * 4)()
    shape = ne.broadcast_struct((4,), (4,), (4,))
    assert lib.corten_maximum_s8(ctypes.byref(shape), x, x, x) == 0
    assert lib.corten_maximum_s8(None, x, x, x) == -1
    assert lib.corten_minimum_s8(ctypes.byref(shape), x, None, x) == -1


# ----------------------------------------------------------------------------- models
class ConvMinMax(nn.Module):
    """max(a - b, min(a, b)) of two conv outputs: same-shape operands, sub feeding maximum."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Conv2d(3, 6, 3, padding=1), nn.Conv2d(3, 6, 3, padding=1)

    def forward(self, x):
        a, b = self.a(x), self.b(x)
        return torch.maximum(a - b, torch.minimum(a, b))


class FloorAtChannelMean(nn.Module):
    """max(y, mean_hw(y)) with y = conv(x): [1, C, H, W] vs [1, C, 1, 1] (broadcast)."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 6, 3, padding=1)
        self.pool = nn.AdaptiveAvgPool2d(1)

    def forward(self, x):
        y = self.conv(x)
        return torch.maximum(y, self.pool(y))


class RowMin(nn.Module):
    """2-D: min of a [1, 8] linear output and the model input [1, 8] (one grid shared with the input)."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        return torch.minimum(self.fc(x), x)


class CortenGuardShape(nn.Module):
    """[1, C, H, W] vs [1, 1, H, 1]: a broadcast arm_maximum_s8 walks wrongly (portable kernel used)."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Conv2d(3, 4, 3, padding=1), nn.Conv2d(3, 1, (3, 5), padding=(1, 0))

    def forward(self, x):
        return torch.maximum(self.a(x), self.b(x))


IO = {"quantize_per_tensor": 1, "dequantize_per_tensor": 1}
MODELS = {
    "conv_min_max": (ConvMinMax, (1, 3, 5, 5), {**IO, "quantized_conv2d": 2, "quantized_sub": 1,
                                                 "quantized_minimum": 1, "quantized_maximum": 1},
                     {"aten.maximum.default": 1, "aten.minimum.default": 1}),
    "max_broadcast": (FloorAtChannelMean, (1, 3, 6, 6),
                      {**IO, "quantized_conv2d": 1, "quantized_avg_pool2d": 1, "quantized_maximum": 1},
                      {"aten.maximum.default": 1}),
    "min_2d": (RowMin, (1, 8), {**IO, "quantized_linear": 1, "quantized_minimum": 1}, {"aten.minimum.default": 1}),
    "guard_shape": (CortenGuardShape, (1, 3, 4, 5), {**IO, "quantized_conv2d": 2, "quantized_maximum": 1},
                    {"aten.maximum.default": 1}),
}
_TESTERS: dict[str, Tester] = {}


def _tester(name: str) -> Tester:
    if name not in _TESTERS:
        factory, shape, _, _ = MODELS[name]
        torch.manual_seed(0)
        _TESTERS[name] = Tester(factory().eval(), (torch.randn(shape),))
    return _TESTERS[name]


@pytest.mark.parametrize("name", sorted(MODELS))
def test_minmax_dialect(name):
    """Shared qparams: max/min of values on one grid is exact, so no step beyond the inputs' own
    one-step conv differences."""
    warnings.simplefilter("ignore")
    _, _, after, before = MODELS[name]
    report = _tester(name).test_dialect(ops_before=before, ops_after=after, qtol=1)
    assert report.cosine_vs_float > 0.99


def test_minmax_lowering_refuses_different_grids():
    """Quantized with different qparams per input (not CortenQuantizer's sharing): refused, named."""
    from corten.errors import LoweringError
    from corten.ops._rules import Int8Value, Match
    from corten.ops._qparams import QParams
    from corten.ops.minmax import lower_minmax

    warnings.simplefilter("ignore")
    t = _tester("max_broadcast").export()
    gm = t.quantized
    node = next(n for n in gm.graph.nodes if n.target == torch.ops.aten.maximum.default)
    match = Match(gm, node, [Int8Value(node.args[0], QParams(0.1, 3)), Int8Value(node.args[1], QParams(0.2, 3))],
                  node, QParams(0.1, 3))
    with pytest.raises(LoweringError, match="one quantization grid"):
        lower_minmax(match)


def test_minmax_cmsis_emission_routes_guard_shape_to_portable(tmp_path):
    from corten.codegen import emit_c
    from corten.memory import plan_memory

    warnings.simplefilter("ignore")
    for name, calls in (("guard_shape", "corten_maximum_s8"), ("max_broadcast", "arm_maximum_s8")):
        prog = _tester(name).lower().program
        ep = prog.ep
        lib = emit_c(ep, plan_memory(ep, prog.target), tmp_path / name, name, prog.target, kernels="cmsis-nn")
        assert calls in lib.source.read_text(), name


@needs_gcc
def test_minmax_implementation_host():
    warnings.simplefilter("ignore")
    _tester("min_2d").test_implementation(on=("host",), n_inputs=2)


@needs_qemu
@pytest.mark.parametrize("name", ["conv_min_max", "max_broadcast"])
def test_minmax_implementation_qemu_m55(name):
    warnings.simplefilter("ignore")
    _tester(name).test_implementation(on=("host", "qemu"), n_inputs=1)


@needs_cmsis_nn
@pytest.mark.parametrize("name", ["conv_min_max", "max_broadcast", "guard_shape"])
def test_minmax_implementation_cmsis_nn(name):
    warnings.simplefilter("ignore")
    _tester(name).test_implementation(on=("host", "qemu"), kernels="cmsis-nn", n_inputs=1,
                                      targets=["cortex-m55", "cortex-m4"])  # MVE and DSP code paths
