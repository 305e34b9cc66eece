"""In-place depthwise (issue 25 item 3): a depthwise conv of depth multiplier 1 writes its output over
its dying input, channel by channel through a channel-sized temporary (TinyEngine's trick), where
that lowers the peak, when the provider running it has such a kernel (the portable one; CMSIS-NN
has none).  The plan is checked by test_memory's independent checker (its own in-place rule, and
a re-run that writes the output channel by channel and requires each input channel intact when
its turn comes); the C kernel is byte-exact with the reference on the host and on QEMU.  Every zoo
model's plans pass the same checker in tests/test_zoo_firmware.py.
"""
from __future__ import annotations

import warnings

import pytest
import torch

import corten
from corten.deployment import Deployment

from conftest import needs_gcc, needs_qemu
from test_memory import Program, check_deployment_plan, check_plan, simulate

# an inverted residual block: the depthwise step (expand output + depthwise output) is the peak
INVERTED = [
    ("conv", 0, 8, 3, 1, 1),  # 1: [1, 8, 8, 8]
    ("conv", 1, 48, 1, 1, 0),  # 2: expand
    ("dw", 2, 3, 1, 1, 1),  # 3: depthwise, stride 1
    ("conv", 3, 8, 1, 1, 0),  # 4: project
]
STRIDED = INVERTED[:2] + [("dw", 2, 3, 2, 1, 1), ("conv", 3, 8, 1, 1, 0)]  # stride-2 depthwise: smaller output
GROWING = INVERTED[:2] + [("dw", 2, 3, 1, 2, 1), ("conv", 3, 8, 1, 1, 0)]  # padding 2: output larger than input


def _checked(specs, kernels="portable", target="cortex-m4", in_place=True, shape=(1, 3, 8, 8)):
    return check_deployment_plan(Program(shape, specs), Deployment.of(target, kernels), in_place=in_place)


@pytest.mark.parametrize("specs", [INVERTED, STRIDED], ids=["stride1", "stride2"])
def test_depthwise_writes_over_its_input_where_it_lowers_the_peak(specs):
    ep, plan = _checked(specs)
    _, without = _checked(specs, in_place=False)
    dw = next(n for n in ep.graph.nodes if n.name.startswith("quantized_depthwise"))
    assert plan.in_place_kernels == (dw.name,)
    assert plan.tensors[dw.name].offset == plan.tensors[dw.args[0].name].offset
    b, _, h, w = dw.args[0].meta["val"].shape
    assert plan.scratch[dw.name].nbytes == b * h * w  # one channel
    assert plan.arena_bytes < without.arena_bytes
    assert plan.arena_bytes < plan.tensors[dw.name].nbytes + plan.tensors[dw.args[0].name].nbytes


def test_no_in_place_depthwise_where_it_cannot_or_need_not():
    ep, plan = _checked(GROWING)  # the output is larger than the input
    assert plan.in_place_kernels == ()
    _, plan = _checked(INVERTED, kernels="cmsis-nn")  # CMSIS-NN's depthwise has no in-place form
    assert plan.in_place_kernels == ()
    # a depthwise that is not at the peak (the stem conv's step dominates): not used, no slowdown
    _, plan = _checked([("conv", 0, 32, 3, 1, 1), ("conv", 1, 4, 1, 1, 0), ("dw", 2, 3, 1, 1, 1), ("conv", 3, 4, 1, 1, 0)])
    assert plan.in_place_kernels == ()


class _Blocks(torch.nn.Module):
    """Inverted residual blocks with stride-1, stride-2 and dilated depthwise convs (ReLU6 fused)."""

    def __init__(self):
        super().__init__()
        nn = torch.nn

        def block(cin, cout, stride, dil):
            return nn.Sequential(nn.Conv2d(cin, cin * 6, 1), nn.ReLU6(),
                                 nn.Conv2d(cin * 6, cin * 6, 3, stride, dil, dilation=dil, groups=cin * 6), nn.ReLU6(),
                                 nn.Conv2d(cin * 6, cout, 1))

        self.stem = nn.Conv2d(3, 4, 3, padding=1)
        self.b1, self.b2, self.b3 = block(4, 4, 1, 2), block(4, 6, 2, 1), block(6, 6, 1, 1)
        self.head = nn.Linear(6 * 5 * 5, 3)

    def forward(self, x):
        return self.head(self.b3(self.b2(self.b1(self.stem(x)))).flatten(1))


@pytest.fixture(scope="module")
def blocks():
    torch.manual_seed(0)
    x = torch.randn(2, 3, 10, 10)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        prog = corten.compile(_Blocks().eval(), (x,), target="cortex-m4", name="dw_in_place")
    plan = prog.memory_for("portable")
    assert plan.in_place_kernels, plan.report()
    check_plan(prog.ep, plan, prog.target)
    assert all(torch.equal(a, b) for a, b in zip(simulate(prog.ep, plan, [x]), [prog.run(x)]))
    return prog, x


@needs_gcc
def test_in_place_depthwise_host_c_byte_exact(blocks, tmp_path):
    prog, x = blocks
    lib = prog.emit_c(tmp_path / "c", kernels="portable")
    assert lib.source.read_text().count("corten_depthwise_conv2d_s8_in_place(") == \
        len(prog.memory_for("portable").in_place_kernels)
    run = prog.c_run(x, kernels="portable")
    assert all(torch.equal(a, b) for a, b in zip(prog.run_int8(x), run.outputs))


@needs_qemu
def test_in_place_depthwise_on_qemu_m4_byte_exact(blocks):
    prog, x = blocks
    run = prog.c_run(x, on="qemu", kernels="portable", target="cortex-m4")
    assert all(torch.equal(a, b) for a, b in zip(prog.run_int8(x), run.outputs))
