"""Output-aware weight rounding (``rounding="adaptive"``) and the int4 weight range search: the math
against naive models (tests/naive_rounding.py), the compiled programs byte-exact in C, and adaptive
rounding never worse than nearest on a trained model."""
from __future__ import annotations

import warnings

import naive_rounding as naive
import numpy as np
import pytest
import torch
from conftest import needs_gcc
from torch import nn

import corten
from corten.errors import UsageError
from corten.quantizer import rounding as R
from corten.quantizer.observers import WEIGHT_CLIP_FLOOR, WEIGHT_CLIP_STEPS, best_clip_scale


def _psd(k: int, g: torch.Generator, rank: int | None = None) -> torch.Tensor:
    x = torch.randn(rank or 2 * k, k, generator=g, dtype=torch.float64)
    x += torch.randn(1, k, generator=g, dtype=torch.float64)  # a mean: H far from diagonal
    return x.T @ x


# ----------------------------------------------------------------------------- the math
@pytest.mark.parametrize("seed", range(12))
def test_round_adaptive_is_the_naive_coordinate_descent(seed):
    g = torch.Generator().manual_seed(seed)
    channels, k = 3, 1 + seed % 6
    qmin, qmax = (-7, 7) if seed % 2 else (-127, 127)
    w = torch.randn(channels, k, generator=g, dtype=torch.float64) * (3 if qmax == 7 else 40)
    w[0, 0] = 9.3 if qmax == 7 else 130.2  # beyond the range: both candidates clamp to qmax
    h = _psd(k, g, rank=1 + seed % 3).unsqueeze(0)
    group = torch.zeros(channels, dtype=torch.long)
    q = R.round_adaptive(w, h, group, qmin, qmax)
    hl = h[0].tolist()
    for c in range(channels):
        wc = w[c].tolist()
        assert q[c].tolist() == naive.descend(wc, hl, qmin, qmax)
        near = [min(max(round(v), qmin), qmax) for v in wc]
        err = naive.output_error(q[c].tolist(), wc, hl)
        assert err <= naive.output_error(near, wc, hl) + 1e-9
        assert err >= naive.best_rounding(wc, hl, qmin, qmax) - 1e-9  # (the brute-force optimum bounds it)
        for v, qi in zip(wc, q[c].tolist()):
            assert qi in naive.candidates(v, qmin, qmax)  # up or down, never further
    assert torch.allclose(R.channel_losses(q, w, h, group),
                          torch.tensor([naive.output_error(q[c].tolist(), w[c].tolist(), hl) for c in range(channels)],
                                       dtype=torch.float64))


def test_round_adaptive_with_one_matrix_per_group_and_a_diagonal_matrix():
    g = torch.Generator().manual_seed(7)
    groups, per_group, k = 3, 2, 4
    w = torch.randn(groups * per_group, k, generator=g, dtype=torch.float64) * 5
    h = torch.stack([_psd(k, g) for _ in range(groups)])
    group = torch.arange(groups * per_group) // per_group
    q = R.round_adaptive(w, h, group, -7, 7)
    for c in range(len(w)):
        assert q[c].tolist() == naive.descend(w[c].tolist(), h[group[c]].tolist(), -7, 7)
    # uncorrelated inputs (diagonal H): every weight on its own, nearest is the optimum
    diag = torch.diag_embed(torch.rand(1, k, generator=g, dtype=torch.float64) + 0.1)
    w = torch.randn(5, k, generator=g, dtype=torch.float64) * 5
    assert torch.equal(R.round_adaptive(w, diag, torch.zeros(5, dtype=torch.long), -7, 7),
                       torch.clamp(torch.round(w), -7, 7))


def test_guard_keeps_nearest_where_the_held_out_error_is_not_lower():
    w = torch.tensor([[0.4, 0.4], [0.4, -0.4]], dtype=torch.float64)
    near = torch.zeros(2, 2, dtype=torch.float64)
    adapt = torch.tensor([[1.0, 0.0], [1.0, 0.0]], dtype=torch.float64)
    h = torch.ones(1, 2, 2, dtype=torch.float64)  # the held-out rows are (1, 1): the sum matters
    q, keep, e_near, e_chosen = R.guarded(near, adapt, w, h, torch.zeros(2, dtype=torch.long))
    # channel 0: r = (0.6, -0.4) -> 0.04 < 0.64; channel 1: r = (0.6, 0.4) -> 1.0 > 0
    assert keep.tolist() == [True, False] and torch.equal(q, torch.tensor([[1.0, 0.0], [0.0, 0.0]], dtype=torch.float64))
    assert e_near.tolist() == pytest.approx([0.64, 0.0]) and e_chosen.tolist() == pytest.approx([0.04, 0.0])


def test_damping_adds_the_weights_own_error():
    h = torch.tensor([[[4.0, 1.0], [1.0, 2.0]]], dtype=torch.float64)
    assert torch.allclose(R.damped(h, 0.5), torch.tensor([[[5.5, 1.0], [1.0, 3.5]]], dtype=torch.float64))


def test_damping_grows_as_the_fitted_rows_get_fewer_than_the_weights():
    """With fewer fitted rows than weights per channel, H has low rank and the descent fits the rows'
    noise: on isotropic inputs (the true H is the identity, nearest is optimal) adaptive rounding from
    4-16 rows of 64 inputs adds 28-42% to nearest's expected error with the floor damping alone, at
    most 15% with the damping :func:`damping` gives (it is the floor with many rows)."""
    assert R.damping(64, 64) == R.damping(64, 10_000) == R.DAMPING
    assert R.damping(64, 8) == pytest.approx(R.SHRINKAGE * 7)
    k, channels = 64, 32
    for rows in (4, 8, 16):
        ratio = {}
        for floor_only in (True, False):
            err_adapt = err_near = 0.0
            for seed in range(6):
                g = torch.Generator().manual_seed(seed)
                w = torch.randn(channels, k, generator=g, dtype=torch.float64) * 30
                x = torch.randn(rows, k, generator=g, dtype=torch.float64)
                d = R.DAMPING if floor_only else R.damping(k, rows)
                q = R.round_adaptive(w, R.damped((x.T @ x).unsqueeze(0), d), torch.zeros(channels, dtype=torch.long),
                                     -127, 127)
                err_adapt += float(((q - w) ** 2).sum())  # (the expected output error on N(0, I) inputs)
                err_near += float(((torch.round(w) - w) ** 2).sum())
            ratio[floor_only] = err_adapt / err_near
        assert ratio[True] > 1.25 and ratio[False] < 1.15, (rows, ratio)


@pytest.mark.parametrize("stride,padding,dilation,groups", [((1, 1), (1, 1), (1, 1), 1), ((2, 1), (0, 2), (1, 2), 1),
                                                            ((1, 2), (1, 0), (2, 1), 2), ((1, 1), (1, 1), (1, 1), 4)])
def test_layer_rows_are_the_naive_im2col_and_give_the_conv(stride, padding, dilation, groups):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 4, 6, 5, generator=g)
    weight = torch.randn(8, 4 // groups, 3, 2, generator=g)
    rows = R.layer_rows(x, "conv2d", tuple(weight.shape), stride, padding, dilation, groups)
    per_group = 4 // groups
    for gi in range(groups):
        expect = [r for n in range(2) for r in naive.im2col(x[n, gi * per_group:(gi + 1) * per_group].tolist(),
                                                             (3, 2), stride, padding, dilation)]
        assert np.allclose(rows[gi].numpy(), np.array(expect, dtype=np.float32))
    # rows times each group's weights are the convolution (so r^T H r is the output's squared error)
    out = torch.nn.functional.conv2d(x, weight, None, stride, padding, dilation, groups)
    wg = weight.reshape(groups, 8 // groups, -1)
    via_rows = torch.einsum("grk,gck->grc", rows, wg)  # [G, N * L, C_out / G]
    assert torch.allclose(via_rows.permute(1, 0, 2).reshape(2, -1, 8),
                          out.permute(0, 2, 3, 1).reshape(2, -1, 8), atol=1e-5)


def test_channel_losses_are_the_output_squared_error():
    g = torch.Generator().manual_seed(2)
    x = torch.randn(3, 5, 7, generator=g)  # conv1d [N, C, L]
    w = torch.randn(4, 5, 3, generator=g, dtype=torch.float64)
    s = torch.rand(4, generator=g, dtype=torch.float64) * 0.2 + 0.05
    w_scaled = (w / s[:, None, None]).reshape(4, -1)
    q = torch.clamp(torch.round(w_scaled), -7, 7)
    h = R.gram(R.layer_rows(x, "conv1d", tuple(w.shape), (2,), (1,), (1,), 1))
    loss = s ** 2 * R.channel_losses(q, w_scaled, h, torch.zeros(4, dtype=torch.long))
    xd = x.to(torch.float64)
    diff = (torch.nn.functional.conv1d(xd, (q * s[:, None]).reshape(w.shape), stride=2, padding=1)
            - torch.nn.functional.conv1d(xd, w, stride=2, padding=1))
    assert torch.allclose(loss, (diff ** 2).sum((0, 2)), rtol=1e-5)
    lin = R.layer_rows(torch.randn(2, 3, 6, generator=g), "linear", (4, 6))
    assert lin.shape == (1, 6, 6)
    # with the bias moved by -s u, u = m . r (m: the mean row of other samples), the error left
    rows = R.layer_rows(x, "conv1d", tuple(w.shape), (2,), (1,), (1,), 1)
    mean_fit = torch.rand(1, 15, generator=g, dtype=torch.float64)
    u = (mean_fit * (q - w_scaled)).sum(1)
    got = s ** 2 * R.corrected_losses(q, w_scaled, h, torch.zeros(4, dtype=torch.long), rows.sum(1).double(),
                                      rows.shape[1], mean_fit)
    moved = diff - (s * u)[None, :, None]
    assert torch.allclose(got, (moved ** 2).sum((0, 2)), rtol=1e-5)
    # the centred Gram matrix is the rows' covariance times their count
    centred = R.centred(h, rows.sum(1).double(), rows.shape[1])
    xc = rows[0].double() - rows[0].double().mean(0)
    assert torch.allclose(centred[0], xc.T @ xc, atol=1e-6)


@pytest.mark.parametrize("seed", range(6))
def test_int4_weight_range_search_is_the_naive_one(seed):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(4, 3 + 5 * seed, generator=g)
    w[1, 0] = 8.0  # an outlier
    w[3] = 0.0  # an all-zero channel keeps eps
    eps = 2 ** -12
    max_scale = torch.clamp(w.abs().amax(1) / 7, min=eps).to(torch.float32)
    got = best_clip_scale(w, max_scale, -7, 7, eps)
    for c in range(4):
        wc = w[c].tolist()
        expect = naive.best_clip_scale(wc, float(max_scale[c]), -7, 7, WEIGHT_CLIP_FLOOR, WEIGHT_CLIP_STEPS, eps)
        # (float32 sums: a near-tie may pick the neighbouring scale, of the same error)
        assert naive.clip_error(wc, float(got[c]), -7, 7) <= naive.clip_error(wc, expect, -7, 7) * (1 + 1e-5) + 1e-12
        assert float(got[c]) in [pytest.approx(naive.grid_scale(float(max_scale[c]), i, WEIGHT_CLIP_FLOOR,
                                                                  WEIGHT_CLIP_STEPS, eps), rel=1e-6)
                                 for i in range(WEIGHT_CLIP_STEPS)]
    assert float(got[3]) == pytest.approx(eps)
    gauss = torch.randn(1, 1000, generator=g)  # a Gaussian channel: its tails are clipped
    top = gauss.abs().amax(1) / 7
    assert 0.6 * float(top) < float(best_clip_scale(gauss, top, -7, 7, eps)) < 0.95 * float(top)


# ----------------------------------------------------------------------------- compiled programs
class Net(nn.Module):
    """conv, depthwise, 1x1 conv, linear: each layer kind adaptive rounding re-rounds."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1)
        self.dw = nn.Conv2d(8, 8, 3, stride=2, padding=1, groups=8)
        self.pw = nn.Conv2d(8, 12, 1)
        self.fc = nn.Linear(12 * 3 * 3, 6)

    def forward(self, x):
        x = torch.relu(self.dw(torch.relu(self.stem(x))))
        return self.fc(torch.relu(self.pw(x)).flatten(1))


def _compile(model, x, calib, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return corten.compile(model, (x,), calibration=calib, **kw)


@pytest.fixture(scope="module")
def net_programs():
    torch.manual_seed(0)
    model = Net().eval()
    calib = torch.rand(16, 3, 6, 6) + 0.5  # positive inputs with a mean: a non-diagonal H
    x = calib[:1]
    return model, x, calib, {(w, r): _compile(model, x, calib, weights=w, rounding=r)
                             for w in ("int8", "int4") for r in ("nearest", "adaptive")}


def test_adaptive_rounding_changes_only_the_weight_constants(net_programs):
    model, x, calib, progs = net_programs
    for width in ("int8", "int4"):
        near, adapt = progs[(width, "nearest")], progs[(width, "adaptive")]
        info = adapt.info["rounding"]
        assert info["layers"] == 4 and info["weights_changed"] > 0
        assert near.op_counts() == adapt.op_counts()
        assert near.memory.constant_bytes == adapt.memory.constant_bytes
        cn, ca = dict(near.ep.named_buffers()) | dict(near.ep.constants), \
            dict(adapt.ep.named_buffers()) | dict(adapt.ep.constants)
        differ = {k for k in cn if not torch.equal(cn[k], ca[k])}
        # only the weights (int8 tensors of int8 or int4 values), the biases (the mean error moved into
        # them) and what the lowering derives from them: a linear's kernel sums (bias + input offset *
        # row sums)
        assert {k for k in differ if cn[k].dtype != torch.int8} <= \
            {k for k in cn if k.endswith("kernel_sum") or k.endswith("bias")}
        differ = {k for k in differ if cn[k].dtype == torch.int8}
        assert differ
        assert sum(int((cn[k] != ca[k]).sum()) for k in differ) == info["weights_changed"]
        for k in differ:  # up or down: at most one step from nearest
            assert int((cn[k].to(torch.int32) - ca[k].to(torch.int32)).abs().max()) == 1


@needs_gcc
def test_adaptive_rounding_programs_are_byte_exact_in_c(net_programs):
    model, x, calib, progs = net_programs
    for width in ("int8", "int4"):
        prog = progs[(width, "adaptive")]
        for i in (0, 5):
            ref = prog.run_int8(calib[i:i + 1])
            got = prog.run_c(calib[i:i + 1], on="host", int8=True)
            assert all(torch.equal(a.contiguous(), b.contiguous()) for a, b in zip(ref, got))


def test_adaptive_rounding_refusals(net_programs):
    model, x, calib, _ = net_programs
    with pytest.raises(UsageError, match="rounding must be one of"):
        _compile(model, x, calib, rounding="stochastic")
    with pytest.raises(UsageError, match="calibration samples"):
        _compile(model, x, lambda m: m(calib), rounding="adaptive")
    qat = corten.prepare_qat(model, (x,))
    with pytest.raises(UsageError, match="post-training"):
        _compile(qat, x, None, rounding="adaptive")


@pytest.mark.slow
def test_adaptive_rounding_is_not_worse_than_nearest_on_a_trained_model():
    """A 64-32-10 MLP trained on scikit-learn's digits: with int4 and int8 weights, adaptive rounding
    gives a smaller output error against the float model on the test split than nearest, and no
    lower accuracy."""
    from sklearn.datasets import load_digits

    d = load_digits()
    x = torch.tensor(d.data, dtype=torch.float32) / 16
    y = torch.tensor(d.target)
    perm = torch.randperm(len(x), generator=torch.Generator().manual_seed(0))
    train, test = perm[:1200], perm[1200:1500]
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    for _ in range(15):
        for i in range(0, 1200, 32):
            idx = train[i:i + 32]
            opt.zero_grad()
            nn.functional.cross_entropy(model(x[idx]), y[idx]).backward()
            opt.step()
    model.eval()
    with torch.no_grad():
        ref = model(x[test])
    calib = x[train[:64]]
    for width in ("int4", "int8"):
        err, acc = {}, {}
        for r in ("nearest", "adaptive"):
            prog = _compile(model, x[:1], calib, weights=width, rounding=r)
            out = torch.cat([prog.run(x[i:i + 1]) for i in test.tolist()])
            err[r] = float(((out - ref) ** 2).mean())
            acc[r] = float((out.argmax(1) == y[test]).float().mean())
        assert err["adaptive"] < err["nearest"], (width, err)
        assert acc["adaptive"] >= acc["nearest"], (width, acc)


def test_cli_rounding_adaptive(tmp_path, capsys):
    from pathlib import Path

    from corten.cli import main as cli_main

    net = tmp_path / "net.py"
    net.write_text("import torch, sys\nsys.path.insert(0, %r)\nfrom test_rounding import Net\n\n"
                   "def make():\n    torch.manual_seed(0)\n    return Net().eval(), (torch.rand(1, 3, 6, 6),)\n"
                   % str(Path(__file__).parent))
    out = tmp_path / "o"
    rc = cli_main(["compile", f"{net}:make", "--out", str(out), "--calib", "8", "--weights", "int4",
                   "--rounding", "adaptive"])
    assert rc == 0, capsys.readouterr().out
    assert corten.load(out).info["rounding"]["layers"] == 4


@pytest.mark.parametrize("width", ["int8", "int4"])
def test_each_layer_is_rounded_on_the_inputs_the_re_rounded_layers_before_it_give(width):
    """Layers are rounded in order, each on its inputs from the already re-rounded layers: every
    layer's final integer weights and bias equal one layer-alone rounding (descent on the centred,
    damped Gram matrix of the fitted samples from nearest, kept per channel where the held-out error
    is lower) of the inputs the *final* program gives that layer."""
    from corten.compiler import Pipeline
    from corten.fx_nodes import get_attr

    torch.manual_seed(0)
    model = Net().eval()
    calib = torch.rand(16, 3, 6, 6) + 0.5
    samples = [(calib[i:i + 1],) for i in range(16)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        near = Pipeline(model, (calib[:1],), calibration=samples, weights=width).convert().converted
        adapt = Pipeline(model, (calib[:1],), calibration=samples, weights=width, rounding="adaptive")
        adapt.calibrate()
        weights = R.float_weights(adapt.prepared)
        adapt = adapt.convert().converted
    inputs: dict[str, list] = {}

    class Recorder(torch.fx.Interpreter):
        def run_node(self, n):
            if n.name in weights and n.op == "call_function":
                inputs.setdefault(n.name, []).append(self.env[n.args[0]])
            return super().run_node(n)

    with torch.no_grad():
        for s in samples:
            Recorder(adapt).run(*s)
    layers = {n.name: n for n in adapt.graph.nodes if n.name in weights and n.op == "call_function"}
    assert len(layers) == 4
    changed_after_first = 0
    for k, (name, node) in enumerate(layers.items()):
        q_target, scale, qmin, qmax = R._int_weight(node, adapt)
        b_target, b_scale = R._int_bias(node, adapt)
        q_near = get_attr(near, q_target).reshape(len(scale), -1).double()
        b_near = get_attr(near, b_target).double()
        w = weights[name].double()
        w_scaled = w.reshape(len(scale), -1) / scale[:, None]
        kind = R._layer_kind(node)
        rows = [R.layer_rows(x, kind, tuple(w.shape), **R._geometry(node)) for x in inputs[name]]
        fit, test = rows[:12], rows[12:]  # (the Gram matrices summed per sample, in float64)
        group = torch.arange(len(scale)) // (len(scale) // fit[0].shape[0])
        h_fit, h_test = (sum(R.gram(r) for r in part) for part in (fit, test))
        sum_fit, sum_test = (sum(r.sum(1).double() for r in part) for part in (fit, test))
        n_fit, n_test = (sum(r.shape[1] for r in part) for part in (fit, test))
        damp = R.damping(w_scaled.shape[1], n_fit)
        q_adapt = R.round_adaptive(w_scaled, R.damped(R.centred(h_fit, sum_fit, n_fit), damp), group, qmin, qmax,
                                   start=q_near)
        mean_fit = sum_fit / n_fit
        keep = R.corrected_losses(q_adapt, w_scaled, h_test, group, sum_test, n_test, mean_fit) < \
            R.channel_losses(q_near, w_scaled, h_test, group)
        expect_q = torch.where(keep[:, None], q_adapt, q_near)
        shift = scale * (mean_fit[group] * (q_adapt - w_scaled)).sum(1)
        expect_b = b_near + torch.where(keep, torch.round(-shift / b_scale), torch.zeros_like(shift))
        got_q = get_attr(adapt, q_target).reshape(len(scale), -1).double()
        assert torch.equal(got_q, expect_q), name
        assert torch.equal(get_attr(adapt, b_target).double(), expect_b), name
        if k:
            changed_after_first += int((got_q != q_near).sum())
    assert changed_after_first > 0
