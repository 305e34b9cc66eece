"""Kernel providers (corten.providers): the build's ordered providers choose, plan and emit each node.

A toy provider defined here - outside corten/ops, with no edit to any op family - claims the int8
``quantized_add`` nodes whose operands have the same shape, with a C kernel of its own (a source
file it adds to the library) and a scratch buffer of its own; every other node falls back to the
portable kernels.  The program still runs byte for byte as the Python reference on the host."""
from __future__ import annotations

import re

import pytest
import torch
from torch import nn

import corten
from conftest import needs_gcc
from corten.errors import UsageError
from corten.providers import (
    PORTABLE,
    KernelProvider,
    NodeView,
    chain_label,
    provider_names,
    register_provider,
    resolve_providers,
    unregister_provider,
)

TOY_SCRATCH = 32
TOY_C = r"""/* toy_add.c - a toy kernel provider's add (tests/test_providers.py). */
#include <stdint.h>

static int32_t toy_floor_shift(int64_t v, int n)  /* floor(v / 2**n) */
{
    return (int32_t)(v < 0 ? ~(~v >> n) : v >> n);
}

/* arm_nn_requantize: doubling high multiply rounding ties up, then a right shift rounding ties away from 0 */
static int32_t toy_requantize(int32_t v, int32_t multiplier, int32_t shift)
{
    const int32_t left = shift > 0 ? shift : 0, right = shift < 0 ? -shift : 0;
    const int32_t high = toy_floor_shift((int64_t)(int32_t)((uint32_t)v << left) * multiplier + ((int64_t)1 << 30), 31);
    const int32_t mask = (int32_t)((1u << right) - 1u), rem = high & mask;
    const int32_t q = toy_floor_shift(high, right);
    return q + (rem > (mask >> 1) + (q < 0) ? 1 : 0);
}

int toy_add_s8(const int8_t *x1, const int8_t *x2, int8_t *out, int32_t n, const int32_t *p, void *scratch)
{
    /* p: input1 offset, multiplier, shift, input2 offset, multiplier, shift, left shift, output
       offset, multiplier, shift, activation min, max (corten.ops._broadcast.PARAM_NAMES) */
    int32_t i;
    if (scratch == 0) {
        return -1;
    }
    for (i = 0; i < n; i++) {
        const int32_t a = toy_requantize((x1[i] + p[0]) * (1 << p[6]), p[1], p[2]);
        const int32_t b = toy_requantize((x2[i] + p[3]) * (1 << p[6]), p[4], p[5]);
        int32_t y = toy_requantize((int32_t)((uint32_t)a + (uint32_t)b), p[8], p[9]) + p[7];
        out[i] = (int8_t)(y < p[10] ? p[10] : (y > p[11] ? p[11] : y));
    }
    return 0;
}
"""
PARAMS = ("input1_offset", "input1_multiplier", "input1_shift", "input2_offset", "input2_multiplier",
          "input2_shift", "left_shift", "output_offset", "output_multiplier", "output_shift", "activation_min",
          "activation_max")


class ToyProvider(KernelProvider):
    """Adds two same-shape int8 tensors with its own C kernel; its source file joins the library."""

    def sources(self, name, steps):
        return {f"{name}_toy_add.c": TOY_C} if steps else {}


def _same_shape(node, target):
    v = NodeView(node, target)
    shapes = {v.shape(v.arg("input1")), v.shape(v.arg("input2")), v.shape()}
    consts = [a for a in (v.arg("input1"), v.arg("input2")) if a.op == "placeholder"]
    return None if len(shapes) == 1 and not consts else "toy: operands must be two activations of one shape"


def make_toy() -> ToyProvider:
    toy = ToyProvider("toy", "Toy", includes=(
        "int toy_add_s8(const int8_t *x1, const int8_t *x2, int8_t *out, int32_t n, const int32_t *p, "
        "void *scratch);",))

    @toy.kernel("quantized_add", act=(torch.int8,), supports=_same_shape, scratch=lambda node, target: TOY_SCRATCH)
    def _toy_add(ctx):
        params = ", ".join(str(int(ctx.arg(k))) for k in PARAMS)
        buf, nbytes = ctx.scratch()
        assert nbytes == TOY_SCRATCH
        n = 1
        for d in ctx.shape():
            n *= d
        return ctx.block(f"const int32_t p[12] = {{{params}}};",
                         ctx.call("toy_add_s8", ctx.input("input1"), ctx.input("input2"), ctx.out(), n, "p", buf))

    return toy


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bias = nn.Parameter(torch.randn(8, 1, 1))

    def forward(self, x, y):
        a = self.conv(x)
        s = a + self.conv(y)  # same shape: the toy's
        s = s + a  # same shape again (in place over an input)
        return torch.relu(s + self.bias)  # a broadcast constant: portable


@pytest.fixture
def toy():
    toy = register_provider(make_toy())
    yield toy
    unregister_provider("toy")


@pytest.fixture(scope="module")
def prog():
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    xs = (torch.randn(1, 3, 6, 6, generator=g), torch.randn(1, 3, 6, 6, generator=g))
    return corten.compile(Net().eval(), xs, calibration=None, seed=0), xs


def test_registered_names_resolve_to_chains(toy):
    assert "toy" in provider_names() and {"portable", "cmsis-nn"} <= set(provider_names())
    assert [p.name for p in resolve_providers("toy")] == ["toy", "portable"]
    assert [p.name for p in resolve_providers("cmsis-nn")] == ["cmsis-nn", "portable"]
    assert resolve_providers("portable") == (PORTABLE,)
    assert [p.name for p in resolve_providers([toy, "cmsis-nn"])] == ["toy", "cmsis-nn", "portable"]
    assert chain_label(resolve_providers("toy")) == "toy"
    assert chain_label(resolve_providers(["toy", "cmsis-nn"])) == "toy+cmsis-nn+portable"
    with pytest.raises(UsageError, match="kernels must be one of"):
        resolve_providers("no-such-provider")
    with pytest.raises(ValueError, match="already registered"):
        register_provider(make_toy())


def test_toy_claims_only_the_nodes_it_supports(toy, prog):
    prog, _ = prog
    steps = prog.kernel_choices(kernels="toy")
    adds = [s for s in steps if s.op == "quantized_add"]
    assert [s.provider for s in adds] == ["toy", "toy", "portable"]
    assert [s.kernel for s in adds] == ["toy_add_s8", "toy_add_s8", "corten_add_broadcast_s8"]
    assert adds[2].reason == "toy: operands must be two activations of one shape"
    assert all(s.provider == "portable" and s.reason.startswith("Toy has no kernel for") for s in steps
               if s.op == "quantized_conv2d")
    # the structured calls: function, arguments and parameter structs, not C text
    call = adds[0].calls[0]
    assert call.function == "toy_add_s8" and call.args[4] == "p" and call.checked
    assert adds[2].calls[0].structs[0].ctype == "corten_add_params"
    # the plan reserves the toy's scratch for its steps only
    plan = prog.memory_for("toy")
    toy_nodes = {s.node for s in adds[:2]}
    assert {k for k, a in plan.scratch.items() if a.nbytes} == toy_nodes
    assert all(plan.scratch[k].nbytes == TOY_SCRATCH for k in toy_nodes)
    assert [plan.step_providers[plan.step_nodes.index(n)] for n in sorted(toy_nodes)] == ["toy", "toy"]
    assert prog.memory_for("portable").scratch == {}


@needs_gcc
def test_toy_provider_runs_byte_exact_on_the_host(toy, prog, tmp_path):
    prog, xs = prog
    lib = prog.emit_c(tmp_path / "c", kernels="toy")
    assert lib.kernels == "toy" and lib.providers == ("toy", "portable")
    assert (tmp_path / "c" / f"{lib.name}_toy_add.c").read_text() == TOY_C
    assert any(p.name.endswith("_toy_add.c") for p in lib.sources)
    source = lib.source.read_text()
    assert source.count("toy_add_s8(") == 3 and "corten_add_broadcast_s8(" in source  # prototype + 2 calls
    assert f"{lib.name}_toy_add.c" in (tmp_path / "c" / f"{lib.name}.mk").read_text()
    want = prog.run_int8(*xs)
    got = prog.run_c(*xs, kernels="toy", int8=True)
    assert all(torch.equal(w, g) for w, g in zip(want, got))
    assert prog.last_c_run.kernels == "toy"
    # same bytes as the portable build; the toy's library differs from it only in the toy's steps
    assert all(torch.equal(w, g) for w, g in zip(want, prog.run_c(*xs, kernels="portable", int8=True)))
    assert re.search(r"kernel toy_add_s8 \*/", source)


def test_no_op_family_names_a_kernel_flavour():
    """Op families register kernels with providers; none branches on the build's kernel library."""
    import pathlib

    import corten.ops

    ops_dir = pathlib.Path(corten.ops.__file__).parent
    hits = [f"{p.name}:{i}" for p in sorted(ops_dir.glob("*.py"))
            for i, line in enumerate(p.read_text().splitlines(), 1) if "kernels ==" in line or "kernels !=" in line]
    assert hits == []
