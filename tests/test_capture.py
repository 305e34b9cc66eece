"""corten.capture: torch.export of eval-mode, batch-1 models, with clear refusals."""
import pytest
import torch
from torch import nn

from corten.capture import CaptureError, capture, capture_module, remove_guards_fn


class SmallNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)
        self.drop = nn.Dropout(0.5)

    def forward(self, x):
        return self.drop(torch.relu(self.bn(self.conv(x))))


class DataDependent(nn.Module):
    def forward(self, x):
        if x.sum() > 0:  # data-dependent Python control flow: torch.export refuses it
            return x + 1
        return x - 1


def _net():
    torch.manual_seed(0)
    return SmallNet().eval()


X = torch.randn(1, 3, 8, 8)


def test_capture_returns_exported_program_in_eval_form():
    ep = capture(_net(), (X,))
    assert isinstance(ep, torch.export.ExportedProgram)
    targets = [n.target for n in ep.graph.nodes if n.op == "call_function"]
    assert torch.ops.aten.batch_norm.default in targets
    bn = next(n for n in ep.graph.nodes if n.target == torch.ops.aten.batch_norm.default)
    assert bn.args[5] is False  # training flag
    assert torch.ops.aten.dropout.default in targets
    assert torch.allclose(ep.module()(X), _net()(X))


def test_training_mode_is_refused_naming_the_fix():
    model = _net().train()
    with pytest.raises(CaptureError, match=r"SmallNet is in training mode.*call model\.eval\(\)"):
        capture(model, (X,))


def test_a_submodule_left_in_training_mode_is_named():
    model = _net()
    model.bn.train()
    with pytest.raises(CaptureError, match=r"training mode \(bn\)"):
        capture(model, (X,))


@pytest.mark.parametrize("inputs, message", [
    (X, r"must be a tuple of float32 tensors, got Tensor; wrap a single tensor as \(x,\)"),
    ([X], r"must be a tuple of float32 tensors, got list"),
    ((), r"empty tuple"),
    ((3.0,), r"example_inputs\[0\] is a float, not a tensor"),
    ((X.double(),), r"dtype torch.float64.*pass float32 tensors"),
    ((torch.zeros(1, 3, 8, 8, dtype=torch.int8),), r"dtype torch.int8"),
])
def test_bad_example_inputs_are_refused(inputs, message):
    with pytest.raises(CaptureError, match=message):
        capture(_net(), inputs)


@pytest.mark.parametrize("shape,message", [((0, 3, 8, 8), "no elements"), ((), "rank 0"),
                                           ((1, 1, 1, 1, 1, 1), "rank 6")])
def test_empty_scalar_or_rank6_inputs_are_refused(shape, message):
    with pytest.raises(CaptureError, match=message):
        capture(_net(), (torch.randn(shape),))


@pytest.mark.parametrize("shape", [(2, 3, 8, 8), (4, 3, 8, 8)])
def test_any_batch_size_is_captured(shape):
    ep = capture(_net(), (torch.randn(shape),))
    x = next(n for n in ep.graph.nodes if n.op == "placeholder" and n.name in ep.graph_signature.user_inputs)
    assert tuple(x.meta["val"].shape) == shape


def test_not_a_module_is_refused():
    with pytest.raises(CaptureError, match="expects a torch.nn.Module, got function"):
        capture(lambda x: x, (X,))


def test_export_failure_is_wrapped_with_model_class_and_cause():
    with pytest.raises(CaptureError, match=r"could not capture DataDependent: \w+: .+") as info:
        capture(DataDependent().eval(), (X,))
    message = str(info.value)
    assert "\n" not in message  # only the first line of torch's (long) error
    assert info.value.__cause__ is not None


def test_exported_module_has_guards_fn_and_capture_module_removes_it():
    """On torch 2.13 ``ep.module()`` calls a ``_guards_fn`` submodule on the inputs; check that form
    so a torch upgrade that changes it is noticed, then check capture_module drops it."""
    raw = capture(_net(), (X,)).module()
    guard_nodes = [n for n in raw.graph.nodes if n.op == "call_module"]
    assert [n.target for n in guard_nodes] == ["_guards_fn"]
    assert len(guard_nodes[0].users) == 0

    gm = capture_module(_net(), (X,))
    assert not any(n.op == "call_module" for n in gm.graph.nodes)
    assert not hasattr(gm, "_guards_fn")
    assert "_guards_fn" not in gm.code
    assert torch.equal(gm(X), _net()(X))
    # parameters are get_attr nodes the passes can fold
    attrs = {n.target for n in gm.graph.nodes if n.op == "get_attr"}
    assert {"conv.weight", "conv.bias", "bn.running_mean", "bn.running_var"} <= attrs


def test_remove_guards_fn_is_idempotent():
    gm = capture(_net(), (X,)).module()
    assert remove_guards_fn(gm) is True
    assert remove_guards_fn(gm) is False
    assert torch.equal(gm(X), _net()(X))


def test_capture_module_accepts_several_inputs():
    class Add(nn.Module):
        def forward(self, a, b):
            return a * 2 + b

    a, b = torch.randn(1, 4), torch.randn(1, 4)
    gm = capture_module(Add().eval(), (a, b))
    assert torch.equal(gm(a, b), a * 2 + b)
    assert not any(n.op == "call_module" for n in gm.graph.nodes)
