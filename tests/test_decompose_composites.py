"""aten_passes/decompose_composites.py: every rewrite computes, in float, what the op it replaces computes
(checked on the captured graph before and after the ATen passes), and leaves none of those ops behind."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from corten.aten_passes import (COMPOSITES, AtenPassError, AtenPassManager, DecomposeCompositesPass, Refusal, Rewrite,
                                RewriteTable, RewriteTablePass)
from corten.capture import capture_module
from corten.fx_nodes import node_arg


class Fn(nn.Module):
    def __init__(self, fn, **mods):
        super().__init__()
        self.fn = fn
        for k, v in mods.items():
            setattr(self, k, v)

    def forward(self, *xs):
        return self.fn(self, *xs)


W = nn.Parameter(torch.randn(5, 4))
CASES = {
    "einsum_bhqk": (lambda s, x: torch.einsum("bhqd,bhkd->bhqk", x, x * 0.5), [(2, 2, 3, 4)], "einsum"),
    "einsum_outer": (lambda s, x: torch.einsum("bi,bj->bij", x, x), [(2, 4)], "einsum"),
    "addmm": (lambda s, x: torch.addmm(s.b, x, s.w.t(), beta=0.5, alpha=2.0), [(3, 4)], "addmm"),
    "baddbmm": (lambda s, x: torch.baddbmm(x @ x.transpose(1, 2), x, x.transpose(1, 2)), [(2, 3, 4)], "baddbmm"),
    "glu": (lambda s, x: F.glu(x, 1), [(2, 6)], "glu"),
    "var_unbiased": (lambda s, x: x.var(1, keepdim=True), [(2, 5)], "var"),
    "std_dims": (lambda s, x: x.std(dim=(1, 2), correction=0), [(2, 3, 4)], "std"),
    "group_norm": (lambda s, x: s.gn(x), [(2, 4, 3, 3)], "group_norm"),
    "instance_norm": (lambda s, x: s.inn(x), [(2, 4, 3, 3)], "instance_norm"),
    "layer_norm_chw": (lambda s, x: s.ln_chw(x), [(2, 4, 3, 3)], "layer_norm"),
    "layer_norm_hw_no_affine": (lambda s, x: F.layer_norm(x, (3, 3)), [(2, 4, 3, 3)], "layer_norm"),
    "outer": (lambda s, x: torch.outer(x[0], x[1]), [(2, 4)], "outer"),
    "unfold": (lambda s, x: F.unfold(x, (2, 3), dilation=(1, 2), padding=1, stride=(2, 1)), [(2, 3, 5, 6)], "im2col"),
    "std_mean": (lambda s, x: sum(torch.std_mean(x, dim=1, keepdim=True)), [(2, 5)], "std_mean"),
    "triu_tril": (lambda s, x: (x @ x.transpose(1, 2)).triu(1) + x[:, :, :3].tril(-1), [(2, 3, 4)], "triu"),
    "new_zeros_full": (lambda s, x: x + x.new_zeros(2, 5) + x.new_full((5,), 0.5) + x.new_ones(x.shape), [(2, 5)],
                       "new_"),
    "inner_rows": (lambda s, x: torch.inner(x, x * 0.5), [(2, 3, 4)], "inner"),
    "linalg_norm_all": (lambda s, x: torch.linalg.norm(x) + torch.linalg.norm(x, dim=1).sum(), [(2, 4)], "linalg_norm"),
    "vector_matmul": (lambda s, x: x[0] @ s.w.t() + torch.mv(s.w, x[1]) + torch.dot(x[0], x[1]), [(2, 4)], "matmul"),
    "logsumexp": (lambda s, x: torch.logsumexp(x, -1), [(2, 5)], "logsumexp"),
    "norm_l2": (lambda s, x: x.norm(dim=-1, keepdim=True), [(2, 5)], "linalg_vector_norm"),
    "norm_l1": (lambda s, x: torch.linalg.vector_norm(x, 1, dim=1), [(2, 5)], "linalg_vector_norm"),
    "normalize": (lambda s, x: F.normalize(x, dim=1), [(2, 5)], "linalg_vector_norm"),
    "prelu": (lambda s, x: s.pr(x), [(2, 4, 3, 3)], "prelu"),
    "bilinear": (lambda s, x: F.interpolate(x, scale_factor=2, mode="bilinear"), [(1, 2, 3, 4)], "upsample_bilinear2d"),
    "bilinear_size_ac": (lambda s, x: F.interpolate(x, size=(5, 7), mode="bilinear", align_corners=True),
                         [(2, 1, 3, 4)], "upsample_bilinear2d"),
    "linear1d": (lambda s, x: F.interpolate(x, scale_factor=1.5, mode="linear"), [(1, 2, 4)], "upsample_linear1d"),
    "reflect": (lambda s, x: F.pad(x, (2, 1, 1, 2), mode="reflect"), [(1, 2, 4, 5)], "pad"),
    "replicate": (lambda s, x: F.pad(x, (1, 3), mode="replicate"), [(1, 2, 4)], "pad"),
    "circular": (lambda s, x: F.pad(x, (1, 2, 2, 1), mode="circular"), [(1, 1, 3, 4)], "pad"),
    "masked_softmax": (lambda s, x: F.softmax((x @ x.transpose(-2, -1)).masked_fill(s.tril == 0, float("-inf")), -1),
                       [(2, 4, 3)], "masked_fill"),
    "sdpa_causal": (lambda s, x: F.scaled_dot_product_attention(x, x, x, is_causal=True), [(2, 2, 4, 3)],
                    "scaled_dot_product_attention"),
    "sdpa_bool_mask": (lambda s, x: F.scaled_dot_product_attention(x, x, x, attn_mask=s.tril.bool()), [(1, 4, 3)],
                       "scaled_dot_product_attention"),
    "gru": (lambda s, x: s.gru(x)[0], [(2, 3, 4)], "gru"),
    "gru_h": (lambda s, x: s.gru2(x)[1], [(3, 2, 4)], "gru"),
    "rnn_relu_bidir": (lambda s, x: s.rnn(x)[0], [(2, 3, 4)], "rnn_relu"),
    "lstm_bidir": (lambda s, x: s.bil(x)[0], [(2, 3, 4)], "lstm"),
    "lstm_c_n": (lambda s, x: s.lstm(x)[1][1], [(2, 3, 4)], "lstm"),
    "gru_cell": (lambda s, x: s.gc(x, s.gc(x)), [(2, 4)], "gru_cell"),
    "lstm_cell": (lambda s, x: s.lc(x, s.lc(x))[1], [(2, 4)], "lstm_cell"),
    "zeros_like_folded": (lambda s, x: x + torch.zeros_like(x) + torch.ones(5), [(2, 5)], "ones"),
    "cumsum_last": (lambda s, x: torch.cumsum(x, -1), [(2, 5)], "cumsum"),
    "cumsum_dim1_rank4": (lambda s, x: x.cumsum(1), [(2, 3, 2, 2)], "cumsum"),
    "cosine_similarity": (lambda s, x: F.cosine_similarity(x, x * x - 0.5, dim=1), [(3, 5)], "cosine_similarity"),
    "cosine_similarity_eps": (lambda s, x: F.cosine_similarity(x, x * 0, dim=-1, eps=1e-3), [(2, 3, 4)],
                              "cosine_similarity"),
    "var_mean": (lambda s, x: torch.var_mean(x, dim=-1)[0] + torch.var_mean(x, dim=-1)[1], [(2, 5)], "var_mean"),
    "var_mean_correction": (lambda s, x: sum(torch.var_mean(x, 1, correction=0, keepdim=True)), [(2, 5)],
                            "var_mean"),
    "lerp_scalar": (lambda s, x: torch.lerp(x, x * x, 0.3), [(2, 5)], "lerp"),
    "lerp_tensor": (lambda s, x: torch.lerp(x, -x, torch.sigmoid(x)), [(2, 5)], "lerp"),
    "addcmul": (lambda s, x: torch.addcmul(x, x, x - 1, value=0.5), [(2, 5)], "addcmul"),
    "addcdiv": (lambda s, x: torch.addcdiv(x, x, x * x + 1, value=2.0), [(2, 5)], "addcdiv"),
    "hypot": (lambda s, x: torch.hypot(x, x - 1), [(2, 5)], "hypot"),
    "pairwise_l2": (lambda s, x: F.pairwise_distance(x, x * 0.5), [(3, 5)], "pairwise_distance"),
    "pairwise_l1_keepdim": (lambda s, x: F.pairwise_distance(x, -x, p=1, keepdim=True), [(3, 5)],
                            "pairwise_distance"),
    "adaptive_max_pool1d": (lambda s, x: F.adaptive_max_pool1d(x, 3), [(2, 3, 7)], "adaptive_max_pool1d"),
    "where_and": (lambda s, x: torch.where((x > 0) & (x < 1), x, -x), [(2, 5)], "__and__"),
    "where_or_not": (lambda s, x: torch.where(~((x > 1) | (x < -1)), x, torch.zeros_like(x)), [(2, 5)],
                     "__or__"),
    "masked_fill_logical_and": (lambda s, x: x.masked_fill(torch.logical_and(x > 0, x < 0.5), 0.0), [(2, 5)],
                                "logical_and"),
    "bicubic_x2": (lambda s, x: F.interpolate(x, scale_factor=2, mode="bicubic"), [(1, 2, 3, 4)], "upsample_bicubic2d"),
    "bicubic_size_ac": (lambda s, x: F.interpolate(x, size=(5, 7), mode="bicubic", align_corners=True),
                        [(2, 1, 4, 3)], "upsample_bicubic2d"),
    "bicubic_down": (lambda s, x: F.interpolate(x, scale_factor=(0.5, 0.75), mode="bicubic"), [(1, 2, 6, 8)],
                     "upsample_bicubic2d"),
    "bilinear_antialias_down": (lambda s, x: F.interpolate(x, scale_factor=0.4, mode="bilinear", antialias=True),
                                [(1, 2, 10, 7)], "_upsample_bilinear2d_aa"),
    "bicubic_antialias_size": (lambda s, x: F.interpolate(x, size=(3, 5), mode="bicubic", antialias=True,
                                                          align_corners=True), [(1, 1, 8, 9)],
                               "_upsample_bicubic2d_aa"),
    "local_response_norm": (lambda s, x: s.lrn(x), [(2, 6, 3, 3)], "avg_pool3d"),
    "batch_norm_batch_statistics": (lambda s, x: s.bn_batch(x), [(2, 4, 3, 3)], "batch_norm"),
    "batch_norm_no_stats_functional": (lambda s, x: F.batch_norm(x, None, None, training=True), [(3, 4, 5)],
                                       "batch_norm"),
    "neg_inf_pad_max_pool": (lambda s, x: F.max_pool2d(F.pad(x, (0, 1, 1, 2), value=-float("inf")), 3, 2),
                             [(1, 2, 6, 7)], "pad"),
}
# rewrites that keep the op's name (checked by what they leave instead)
SAME_NAME = {
    "linear_4d": (lambda s, x: F.linear(x.permute(0, 2, 3, 1), s.w), [(2, 4, 3, 3)]),
    "linear_5d_bias": (lambda s, x: F.linear(x, s.w, s.b), [(2, 1, 2, 3, 4)]),
    "mean_all_output": (lambda s, x: x.mean(), [(2, 5)]),
    "sum_all_output_rank3": (lambda s, x: x.sum() * 2, [(2, 3, 2)]),
    "mean_all_broadcast": (lambda s, x: x - x.mean(), [(2, 5)]),
    "sum_all_feeds_both_sides": (lambda s, x: x.sum() / (x * x), [(3, 2, 2)]),
    "max_all_broadcast": (lambda s, x: x / x.abs().max(), [(2, 5)]),
    "min_all_output": (lambda s, x: x.min(), [(2, 3, 2)]),
    "std_all_broadcast": (lambda s, x: x * x.std(), [(2, 5)]),
    "var_all_output": (lambda s, x: x.var(), [(2, 5)]),
}


def _module():
    torch.manual_seed(0)
    ln_chw = nn.LayerNorm((4, 3, 3))
    with torch.no_grad():
        ln_chw.weight.uniform_(0.5, 1.5), ln_chw.bias.uniform_(-0.5, 0.5)
    return dict(b=nn.Parameter(torch.randn(5)), w=W, gn=nn.GroupNorm(2, 4), inn=nn.InstanceNorm2d(4, affine=True),
                ln_chw=ln_chw,
                pr=nn.PReLU(4), tril=torch.nn.Buffer(torch.tril(torch.ones(4, 4))),
                gru=nn.GRU(4, 6, batch_first=True), gru2=nn.GRU(4, 5, num_layers=2),
                rnn=nn.RNN(4, 3, nonlinearity="relu", batch_first=True, bidirectional=True),
                bil=nn.LSTM(4, 3, batch_first=True, bidirectional=True), lstm=nn.LSTM(4, 3, batch_first=True),
                gc=nn.GRUCell(4, 4), lc=nn.LSTMCell(4, 4), lrn=nn.LocalResponseNorm(3, alpha=0.5, k=1.5),
                bn_batch=nn.BatchNorm2d(4, track_running_stats=False))


@pytest.mark.parametrize("name", list(CASES))
def test_rewrite_computes_the_same_float_values(name):
    fn, shapes, op = CASES[name]
    model = Fn(fn, **_module()).eval()
    g = torch.Generator().manual_seed(3)
    xs = tuple(torch.randn(s, generator=g) for s in shapes)
    gm = capture_module(model, xs)
    with torch.no_grad():
        want = gm(*xs)
        gm = AtenPassManager()(gm)
        got = gm(*xs)
    left = [str(n.target) for n in gm.graph.nodes if n.op == "call_function" and f"aten.{op}." in str(n.target)]
    assert left == [], left
    for w, o in zip(torch.utils._pytree.tree_leaves(want), torch.utils._pytree.tree_leaves(got)):
        torch.testing.assert_close(o, w, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("name", list(SAME_NAME))
def test_rewrite_keeping_the_op_name_computes_the_same_float_values(name):
    fn, shapes = SAME_NAME[name]
    model = Fn(fn, **_module()).eval()
    xs = tuple(torch.randn(s, generator=torch.Generator().manual_seed(4)) for s in shapes)
    gm = capture_module(model, xs)
    with torch.no_grad():
        want = gm(*xs)
        gm = AtenPassManager()(gm)
        got = gm(*xs)
    calls = [n for n in gm.graph.nodes if n.op == "call_function"]
    assert all(n.args[0].meta["val"].dim() == 3 for n in calls if n.target == torch.ops.aten.linear.default)
    aten = torch.ops.aten
    assert not [n for n in calls if n.target in (aten.mean.default, aten.sum.default, aten.max.default,
                                                 aten.min.default, aten.std.default, aten.var.default)]
    if name in ("mean_all_broadcast", "max_all_broadcast", "std_all_broadcast"):  # the broadcast reads the keepdim mean: no 0-D tensor in the graph
        assert all(n.meta["val"].dim() > 0 for n in calls)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)


# ---- the table: refusals are values, errors are not swallowed ----

def test_a_form_a_rewrite_does_not_take_is_refused_with_a_reason():
    model = Fn(lambda s, x: (torch.linalg.vector_norm(x, 3, dim=1), F.pad(x, (1, 1))), **_module()).eval()
    xs = (torch.randn(2, 5),)
    gm = capture_module(model, xs)
    pass_ = DecomposeCompositesPass()
    pass_(gm)
    reasons = list(pass_.refusals.values())
    assert any("ord=3" in r for r in reasons), pass_.refusals
    assert any("mode 'constant'" in r for r in reasons), pass_.refusals
    node = next(n for n in gm.graph.nodes if n.target == torch.ops.aten.linalg_vector_norm.default)
    assert "ord=3" in node.meta["corten_rewrite_refused"]


def test_a_rewrite_that_fails_raises_naming_the_node():
    table = RewriteTable("test")

    @table.rewrites(torch.ops.aten.hypot.default)
    def broken(node):
        return Rewrite(lambda x, y: x.reshape(7, 7) + y, list(node.args[:2]))
    gm = capture_module(Fn(lambda s, x: torch.hypot(x, x)).eval(), (torch.randn(2, 5),))
    with pytest.raises(AtenPassError, match=r"hypot.*failed to trace"):
        RewriteTablePass(table)(gm)


def test_one_rule_per_op():
    with pytest.raises(ValueError, match="already rewritten"):
        COMPOSITES.rewrites(torch.ops.aten.hypot.default)(lambda node: Refusal("no"))


# rewrites that keep the op but change its form: (forward, input shapes, what every op of that kind now is)
_aten = torch.ops.aten
NEW_FORM = {
    "linear_1d_weight": (lambda s, x: F.linear(x, s.proj), [(2, 3, 4, 8)],
                         lambda n: n.target != _aten.linear.default or n.args[1].meta["val"].dim() == 2),
    "linear_1d_weight_type_as": (lambda s, x: F.linear(x, s.proj.type_as(x)), [(3, 8)],
                                      lambda n: n.target != _aten.linear.default or n.args[1].op == "get_attr"),
    "layer_norm_c11": (lambda s, x: s.ln_c11(x.mean((2, 3), keepdim=True)), [(2, 4, 3, 3)],
                       lambda n: n.target != _aten.layer_norm.default or len(n.args[1]) == 1),
    "pow_learned_exponent": (lambda s, x: x.abs().add(0.1).pow(s.p).pow(1.0 / s.p), [(2, 5)],
                             lambda n: n.target != _aten.pow.Tensor_Tensor),
    "grouped_conv_transpose2d": (lambda s, x: s.up(x), [(1, 4, 3, 3)],
                                 lambda n: n.target != _aten.conv_transpose2d.input or node_arg(n, "groups", 1) == 1),
    "grouped_conv_transpose1d": (lambda s, x: s.up1(x), [(2, 4, 5)],
                                 lambda n: n.target != _aten.conv_transpose1d.default or node_arg(n, "groups", 1) == 1),
}


def _new_form_module():
    torch.manual_seed(0)
    return dict(proj=torch.nn.Buffer(torch.linspace(0, 7, 8)),
                ln_c11=nn.LayerNorm([4, 1, 1]), p=nn.Parameter(torch.tensor([2.5])),
                up=nn.ConvTranspose2d(4, 6, 4, stride=2, padding=1, groups=2),
                up1=nn.ConvTranspose1d(4, 4, 3, stride=2, padding=1, output_padding=1, groups=4, bias=False))


@pytest.mark.parametrize("name", list(NEW_FORM))
def test_rewrite_to_a_supported_form_computes_the_same_float_values(name):
    fn, shapes, ok = NEW_FORM[name]
    model = Fn(fn, **_new_form_module()).eval()
    xs = tuple(torch.randn(s, generator=torch.Generator().manual_seed(5)) for s in shapes)
    gm = capture_module(model, xs)
    with torch.no_grad():
        want = gm(*xs)
        gm = AtenPassManager()(gm)
        got = gm(*xs)
    bad = [n.format_node() for n in gm.graph.nodes if n.op == "call_function" and not ok(n)]
    assert bad == []
    torch.testing.assert_close(got[0] if isinstance(got, (tuple, list)) else got,
                               want[0] if isinstance(want, (tuple, list)) else want, atol=1e-5, rtol=1e-4)
