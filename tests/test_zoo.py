"""The model zoo: every model builds and runs, MobileNetV2 matches torchvision's architecture,
weights are seeded, and BatchNorm layers are not identities."""
import pytest
import torch
from torch import nn

from corten.zoo import MODELS, get_model, list_models, make_divisible
from corten.zoo.mobilenet_v2 import InvertedResidual

MV2_MODELS = ["mv2", "mv2-0.35-96"]  # the other zoo models are covered by test_zoo_architectures.py


@pytest.fixture(scope="module")
def models():
    return {name: get_model(name) for name in MV2_MODELS}


@pytest.fixture(scope="module")
def forward_passes(models):
    """One forward pass per model: ``(logits, features before pooling, every BN output)``."""
    runs = {}
    for name, (model, inputs) in models.items():
        bn_outputs = []
        hooks = [bn.register_forward_hook(lambda m, i, o: bn_outputs.append(o)) for bn in _bns(model)]
        features = []
        hooks.append(model.features.register_forward_hook(lambda m, i, o: features.append(o)))
        with torch.no_grad():
            logits = model(*inputs)
        for h in hooks:
            h.remove()
        runs[name] = (logits, features[0], bn_outputs)
    return runs


def _convs(model):
    return [m for m in model.modules() if isinstance(m, nn.Conv2d)]


def _bns(model):
    return [m for m in model.modules() if isinstance(m, nn.BatchNorm2d)]


def test_list_models_names_every_entry():
    listed = list_models()
    assert [name for name, _ in listed] == list(MODELS)
    assert {"mv2", "mv2-0.35-96"} <= set(MODELS)
    assert all(desc for _, desc in listed)


def test_unknown_model_is_refused_with_the_available_names():
    with pytest.raises(KeyError, match="mv2-0.35-96"):
        get_model("resnet9000")


@pytest.mark.parametrize("name", MV2_MODELS)
def test_model_builds_runs_in_eval_mode(models, forward_passes, name):
    model, inputs = models[name]
    assert not any(m.training for m in model.modules())
    assert isinstance(inputs, tuple) and len(inputs) == 1
    x = inputs[0]
    assert x.dtype == torch.float32 and x.shape[0] == 1
    y = forward_passes[name][0]
    assert y.shape == (1, 1000)
    assert torch.isfinite(y).all()


def test_make_divisible_matches_torchvision_rounding():
    assert make_divisible(32 * 0.35, 8) == 16  # 11.2 -> 8 would lose > 10%, so 16
    assert make_divisible(24 * 0.35, 8) == 8
    assert make_divisible(96 * 0.35, 8) == 32  # 33.6 -> 32
    assert make_divisible(1280 * 1.0, 8) == 1280
    assert make_divisible(17, 8) == 16 and make_divisible(14, 8) == 16


@pytest.mark.parametrize("name", MV2_MODELS)
def test_mobilenet_v2_layer_counts(models, name):
    model, _ = models[name]
    convs = _convs(model)
    depthwise = [c for c in convs if c.groups == c.in_channels == c.out_channels and c.groups > 1]
    blocks = [m for m in model.modules() if isinstance(m, InvertedResidual)]
    assert len(convs) == 52
    assert len(depthwise) == 17
    assert all(c.kernel_size == (3, 3) for c in depthwise)
    assert all(c.bias is None for c in convs)
    assert len(_bns(model)) == 52
    assert len(blocks) == 17
    assert sum(b.use_res_connect for b in blocks) == 10
    assert sum(isinstance(m, nn.ReLU6) for m in model.modules()) == 35
    linear = model.classifier[1]
    assert (linear.in_features, linear.out_features) == (1280, 1000)
    assert isinstance(model.classifier[0], nn.Dropout) and model.classifier[0].p == 0.2


def test_mobilenet_v2_parameter_count_is_torchvision(models):
    model, _ = models["mv2"]
    assert sum(p.numel() for p in model.parameters()) == 3_504_872


def test_mobilenet_v2_state_dict_keys_follow_torchvision(models):
    """Same module nesting as torchvision, so its checkpoints would load into this model."""
    state = models["mv2"][0].state_dict()
    assert tuple(state["features.0.0.weight"].shape) == (32, 3, 3, 3)
    assert tuple(state["features.1.conv.0.0.weight"].shape) == (32, 1, 3, 3)  # t=1: depthwise first
    assert tuple(state["features.1.conv.1.weight"].shape) == (16, 32, 1, 1)  # then the projection
    assert tuple(state["features.17.conv.0.0.weight"].shape) == (960, 160, 1, 1)  # expansion
    assert tuple(state["features.17.conv.2.weight"].shape) == (320, 960, 1, 1)
    assert "features.17.conv.3.running_var" in state
    assert tuple(state["features.18.0.weight"].shape) == (1280, 320, 1, 1)
    assert tuple(state["classifier.1.weight"].shape) == (1000, 1280)
    assert len([k for k in state if k.endswith("num_batches_tracked")]) == 52


def test_mobilenet_v2_035_channels(models):
    model, inputs = models["mv2-0.35-96"]
    assert inputs[0].shape == (1, 3, 96, 96)
    assert model.features[0][0].out_channels == 16
    stage_outputs = [b.out_channels for b in model.features if isinstance(b, InvertedResidual)]
    assert sorted(set(stage_outputs)) == [8, 16, 24, 32, 56, 112]
    assert model.features[-1][0].out_channels == 1280  # last_channel never shrinks below 1280


def test_residual_adds_are_where_shapes_allow(models):
    model, _ = models["mv2-0.35-96"]
    for block in model.features:
        if isinstance(block, InvertedResidual):
            first = block.conv[0][0]
            assert block.use_res_connect == (block.stride == 1 and first.in_channels == block.out_channels)


@pytest.mark.parametrize("name", MV2_MODELS)
def test_batch_norm_statistics_are_non_trivial(models, name):
    model, _ = models[name]
    for bn in _bns(model):
        assert not torch.allclose(bn.weight, torch.ones_like(bn.weight), atol=0.05)
        assert not torch.allclose(bn.bias, torch.zeros_like(bn.bias), atol=0.05)
        assert not torch.allclose(bn.running_var, torch.ones_like(bn.running_var), atol=0.05)
        assert (bn.running_var > 0).all()
        assert bn.momentum == 0.1
    # the projection BNs see inputs whose mean is not zero
    assert any(bn.running_mean.abs().max() > 0.05 for bn in _bns(model))


@pytest.mark.parametrize("name", MV2_MODELS)
def test_activations_stay_in_a_quantizable_range(forward_passes, name):
    """Running statistics match what the layers produce, so BN outputs are roughly N(beta, gamma^2)
    and the ReLU6 outputs use their range: neither dead nor saturated."""
    _, features, bn_outputs = forward_passes[name]
    assert len(bn_outputs) == 52
    for out in bn_outputs:
        assert 0.2 < out.std() < 5.0
        assert out.abs().max() < 50
    active = ((features > 0) & (features < 6)).float().mean()
    assert active > 0.2


def test_same_seed_same_model_other_seed_other_model():
    torch.manual_seed(1)
    a, xa = get_model("mv2-0.35-96", seed=3)
    torch.manual_seed(2)  # the global RNG must not matter ...
    rng_before = torch.get_rng_state()
    b, xb = get_model("mv2-0.35-96", seed=3)
    assert torch.equal(rng_before, torch.get_rng_state())  # ... nor be changed
    c, xc = get_model("mv2-0.35-96", seed=4)
    state_a, state_b, state_c = a.state_dict(), b.state_dict(), c.state_dict()
    assert all(torch.equal(state_a[k], state_b[k]) for k in state_a)
    assert torch.equal(xa[0], xb[0])
    assert not torch.equal(state_a["features.0.0.weight"], state_c["features.0.0.weight"])
    assert not torch.equal(xa[0], xc[0])
