"""The corpus (tests/corpus_models.py): small models written the way PyTorch users write them -
CNNs, MLPs, residuals with ``+=``, SiLU nets, sequence models ``[N, T, C]``, batch 1/2/4, ranks 1 to 5,
in-place ops, activation chains, degenerate programs.

Every one compiles fully lowered and its C library (portable kernels) computes on the host exactly
the bytes ``prog.run`` computes; a subset also runs on QEMU Cortex-M55 and Cortex-M4.  This is also
the check that "lowered" means one thing: every program with ``unlowered_ops() == []`` plans its
memory, emits C and runs.
"""
from __future__ import annotations

import pytest
import torch

import corten
from corpus_models import CORPUS

CASES = {name: (factory, shapes) for name, factory, shapes in CORPUS}
# QEMU runs cost ~1-2 s each: a spread of the corpus (every kind of model, batch > 1, ranks 1-5)
M55_CASES = [
    "tiny_cnn_b2", "lenet_b1", "dw_separable_b4", "basic_block_b2", "basic_block_down_b1", "bottleneck_b1",
    "inverted_residual_b2", "mbv3_block_b1", "silu_net_b4", "silu_by_hand_b2", "mlp_b4", "seq_linear_b2",
    "temporal_conv_b2", "residual_mlp_b1", "iadd_b4", "identity_b2", "strided_b2", "upsample_b1",
    "squeeze_excite_b2", "gated_conv_b1", "sigmoid_then_conv_b2", "seq_softmax_b2", "conv_x*sigmoid(x)",
    "inplace_hardswish_", "rank1_add_relu", "rank3_channel_broadcast", "rank5_add_b2", "rank5_plus_sigmoid",
    "unused_input", "two_outputs", "clone", "reshape_only", "rank5_gate_mul", "rank5_where",
]
M4_CASES = [
    "tiny_cnn_b4", "basic_block_b1", "mbv3_block_b2", "silu_by_hand_b1", "seq_residual_b2", "conv_x+sigmoid(x)",
    "inplace_iadd", "rank1_gate", "rank5_add", "rank5_channel_broadcast_add", "unused_input_b1", "same_output_twice",
]

_PROGRAMS: dict[str, tuple] = {}


def _compiled(name: str):
    """(program, inputs) of a corpus model, compiled once per test session."""
    if name not in _PROGRAMS:
        factory, shapes = CASES[name]
        torch.manual_seed(0)
        model = factory().eval()
        g = torch.Generator().manual_seed(1)
        with torch.no_grad():  # non-trivial BatchNorm statistics
            for m in model.modules():
                if isinstance(m, torch.nn.modules.batchnorm._BatchNorm):
                    m.running_mean.uniform_(-0.2, 0.2, generator=g)
                    m.running_var.uniform_(0.5, 1.5, generator=g)
        inputs = tuple(torch.randn(s, generator=g) for s in shapes)
        calibration = [tuple(torch.randn(s, generator=g) for s in shapes) for _ in range(3)]
        prog = corten.compile(model, inputs, calibration=calibration, name="corpus")
        _PROGRAMS[name] = (prog, inputs)
    return _PROGRAMS[name]


def _outputs(x):
    return list(torch.utils._pytree.tree_leaves(x))


def test_corpus_size_and_coverage():
    assert len(CASES) >= 150
    assert len(M55_CASES) >= 30 and len(M4_CASES) >= 10
    assert set(M55_CASES) <= set(CASES) and set(M4_CASES) <= set(CASES)
    batches = {shapes[0][0] for _, shapes in CASES.values() if len(shapes[0]) >= 2}
    ranks = {len(s) for _, shapes in CASES.values() for s in shapes}
    assert {1, 2, 4} <= batches and {1, 2, 3, 4, 5} <= ranks


@pytest.mark.parametrize("name", list(CASES))
def test_corpus_model_is_lowered_and_byte_exact_on_host(name):
    prog, inputs = _compiled(name)
    assert prog.unlowered_ops() == [], prog.operator_table()
    expected = _outputs(prog.run_int8(*inputs))
    got = _outputs(prog.run_c(*inputs, on="host", int8=True))
    assert len(got) == len(expected)
    for e, g in zip(expected, got):
        assert e.shape == g.shape and torch.equal(e.contiguous(), g.contiguous()), name
    # the float outputs are the dequantized bytes, shaped as the model's
    ref = _outputs(prog.run(*inputs))
    assert [tuple(r.shape) for r in ref] == [tuple(e.shape) for e in expected]


@pytest.mark.parametrize("target,name", [
    (t, n) for t, names in (("cortex-m55", M55_CASES), ("cortex-m4", M4_CASES)) for n in names])
def test_corpus_model_is_byte_exact_on_qemu(target, name):
    prog, inputs = _compiled(name)
    expected = _outputs(prog.run_int8(*inputs))
    got = _outputs(prog.run_c(*inputs, on="qemu", target=target, int8=True))
    for e, g in zip(expected, got):
        assert torch.equal(e.contiguous(), g.contiguous()), (target, name)
