"""A corpus of small models written the way PyTorch users write them (see tests/test_corpus.py).

Each entry of :data:`CORPUS` is ``(name, factory, input shapes)``; ``factory()`` returns a fresh
model.  Shapes are tiny so the whole corpus compiles, builds and runs in C in a few minutes.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


# ----------------------------------------------------------------------------- CNNs
class ConvBNReLU(nn.Sequential):
    def __init__(self, cin, cout, k=3, stride=1, groups=1):
        super().__init__(nn.Conv2d(cin, cout, k, stride, k // 2, groups=groups, bias=False),
                         nn.BatchNorm2d(cout), nn.ReLU(inplace=True))


class TinyCNN(nn.Module):
    def __init__(self, classes=5):
        super().__init__()
        self.features = nn.Sequential(ConvBNReLU(3, 8), nn.MaxPool2d(2), ConvBNReLU(8, 16), nn.AdaptiveAvgPool2d(1))
        self.classifier = nn.Linear(16, classes)

    def forward(self, x):
        x = self.features(x)
        x = torch.flatten(x, 1)
        return self.classifier(x)


class LeNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 4, 3)
        self.conv2 = nn.Conv2d(4, 8, 3)
        self.fc1 = nn.Linear(8 * 2 * 2, 16)
        self.fc2 = nn.Linear(16, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = x.view(x.size(0), -1)
        x = F.relu(self.fc1(x))
        return self.fc2(x)


class DepthwiseSeparable(nn.Module):
    def __init__(self, cin=4, cout=8, stride=1):
        super().__init__()
        self.dw = ConvBNReLU(cin, cin, 3, stride, groups=cin)
        self.pw = ConvBNReLU(cin, cout, 1)

    def forward(self, x):
        return self.pw(self.dw(x))


class StridedNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(3, 6, 3, stride=2, padding=1)
        self.c2 = nn.Conv2d(6, 6, 3, stride=2, padding=1, groups=2)
        self.pool = nn.AvgPool2d(2)

    def forward(self, x):
        return self.pool(F.relu6(self.c2(F.relu6(self.c1(x)))))


class DilatedNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.c = nn.Conv2d(2, 4, 3, padding=2, dilation=2)

    def forward(self, x):
        return F.leaky_relu(self.c(x), 0.1)


class UpsampleNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.down = nn.Conv2d(3, 4, 3, stride=2, padding=1)
        self.up = nn.ConvTranspose2d(4, 3, 2, stride=2)

    def forward(self, x):
        return torch.tanh(self.up(F.relu(self.down(x))))


class PaddedConv(nn.Module):
    def __init__(self):
        super().__init__()
        self.c = nn.Conv2d(3, 4, 3)

    def forward(self, x):
        return self.c(F.pad(x, (1, 1, 1, 1)))


class SameConv(nn.Module):
    def __init__(self):
        super().__init__()
        self.c = nn.Conv2d(3, 5, 3, padding="same")
        self.bn = nn.BatchNorm2d(5)

    def forward(self, x):
        return F.hardtanh(self.bn(self.c(x)), -2.0, 2.0)


class GlobalMeanHead(nn.Module):
    def __init__(self):
        super().__init__()
        self.c = nn.Conv2d(3, 8, 3, padding=1)
        self.fc = nn.Linear(8, 3)

    def forward(self, x):
        x = F.relu(self.c(x))
        x = x.mean(dim=(2, 3))
        return F.softmax(self.fc(x), dim=-1)


class MaxPoolHead(nn.Module):
    def __init__(self):
        super().__init__()
        self.c = nn.Conv2d(3, 4, 3, padding=1)

    def forward(self, x):
        return F.max_pool2d(F.relu(self.c(x)), kernel_size=x.shape[-1]).flatten(1)


class TwoBranchCat(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Conv2d(3, 4, 1)
        self.b = nn.Conv2d(3, 4, 3, padding=1)

    def forward(self, x):
        return torch.cat([F.relu(self.a(x)), F.relu(self.b(x))], dim=1)


# ----------------------------------------------------------------------------- residuals
class BasicBlock(nn.Module):
    """torchvision's ResNet BasicBlock: ``out += identity`` and in-place ReLUs."""

    def __init__(self, c=4, downsample=False):
        super().__init__()
        stride = 2 if downsample else 1
        self.conv1 = nn.Conv2d(c, c, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(c)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(c, c, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(c)
        self.downsample = nn.Sequential(nn.Conv2d(c, c, 1, stride, bias=False), nn.BatchNorm2d(c)) if downsample else None

    def forward(self, x):
        identity = x
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        if self.downsample is not None:
            identity = self.downsample(x)
        out += identity
        out = self.relu(out)
        return out


class Bottleneck(nn.Module):
    def __init__(self, c=8, mid=4):
        super().__init__()
        self.conv1 = nn.Conv2d(c, mid, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(mid)
        self.conv2 = nn.Conv2d(mid, mid, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(mid)
        self.conv3 = nn.Conv2d(mid, c, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(c)
        self.relu = nn.ReLU(inplace=True)

    def forward(self, x):
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        out += x
        return self.relu(out)


class InvertedResidual(nn.Module):
    """MobileNetV2's block with ReLU6 (in place) and a residual add."""

    def __init__(self, c=4, expand=2):
        super().__init__()
        h = c * expand
        self.conv = nn.Sequential(
            nn.Conv2d(c, h, 1, bias=False), nn.BatchNorm2d(h), nn.ReLU6(inplace=True),
            nn.Conv2d(h, h, 3, 1, 1, groups=h, bias=False), nn.BatchNorm2d(h), nn.ReLU6(inplace=True),
            nn.Conv2d(h, c, 1, bias=False), nn.BatchNorm2d(c))

    def forward(self, x):
        return x + self.conv(x)


class SqueezeExcite(nn.Module):
    def __init__(self, c=8, r=4):
        super().__init__()
        self.fc1 = nn.Conv2d(c, c // r, 1)
        self.fc2 = nn.Conv2d(c // r, c, 1)

    def forward(self, x):
        s = F.adaptive_avg_pool2d(x, 1)
        s = F.relu(self.fc1(s))
        s = F.hardsigmoid(self.fc2(s))
        return x * s


class MBv3Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.expand = nn.Sequential(nn.Conv2d(4, 8, 1, bias=False), nn.BatchNorm2d(8), nn.Hardswish(inplace=True))
        self.dw = nn.Sequential(nn.Conv2d(8, 8, 3, padding=1, groups=8, bias=False), nn.BatchNorm2d(8),
                                nn.Hardswish(inplace=True))
        self.se = SqueezeExcite(8)
        self.project = nn.Sequential(nn.Conv2d(8, 4, 1, bias=False), nn.BatchNorm2d(4))

    def forward(self, x):
        out = self.project(self.se(self.dw(self.expand(x))))
        out += x
        return out


class ResidualMLP(nn.Module):
    def __init__(self, d=8):
        super().__init__()
        self.fc1 = nn.Linear(d, d)
        self.fc2 = nn.Linear(d, d)

    def forward(self, x):
        h = F.relu(self.fc1(x))
        h = self.fc2(h)
        h += x
        return F.relu(h)


# ----------------------------------------------------------------------------- activation chains
class ConvAct(nn.Module):
    """conv followed by an activation written in one of the usual ways."""

    def __init__(self, act, cin=3, cout=4):
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, 3, padding=1)
        self.act = act

    def forward(self, x):
        return self.act(self.conv(x))


def silu_by_hand(y):
    return y * torch.sigmoid(y)


def swish_tanh(y):
    return y * torch.tanh(y)


def x_plus_sigmoid(y):
    return y + torch.sigmoid(y)


def mish_like(y):
    return y * torch.tanh(F.softplus(y)) if False else y * torch.tanh(torch.sigmoid(y))


class SigmoidThenConv(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)

    def forward(self, x):
        return self.conv(torch.sigmoid(x))


class TanhThenLinear(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 4)

    def forward(self, x):
        return self.fc(torch.tanh(x))


class SiLUNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.act = nn.SiLU(inplace=True)
        self.c2 = nn.Conv2d(8, 4, 1)

    def forward(self, x):
        return self.c2(self.act(self.bn(self.c1(x))))


class GatedConv(nn.Module):
    def __init__(self):
        super().__init__()
        self.f = nn.Conv2d(3, 4, 3, padding=1)
        self.g = nn.Conv2d(3, 4, 3, padding=1)

    def forward(self, x):
        return torch.tanh(self.f(x)) * torch.sigmoid(self.g(x))


class ActivationStack(nn.Module):
    def forward(self, x):
        x = F.gelu(x)
        x = torch.sigmoid(x)
        x = F.hardswish(x)
        return torch.tanh(x)


class SigmoidPoolConv(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 1)

    def forward(self, x):
        return self.conv(F.max_pool2d(torch.sigmoid(x), 2))


class ELUMLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 16), nn.ELU(), nn.Linear(16, 8), nn.GELU(), nn.Linear(8, 2))

    def forward(self, x):
        return self.net(x)


# ----------------------------------------------------------------------------- in-place forms
class InPlace(nn.Module):
    """One in-place op applied to a conv output."""

    def __init__(self, op, cin=3, cout=3):
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, 3, padding=1)
        self.op = op

    def forward(self, x):
        y = self.conv(x)
        self.op(y, x)
        return y


def iadd(y, x):
    y += x


def isub(y, x):
    y -= x


def imul(y, x):
    y *= x


def add_(y, x):
    y.add_(x)


def mul_(y, x):
    y.mul_(x)


def sub_(y, x):
    y.sub_(x)


def relu_(y, x):
    y.relu_()


def torch_relu_(y, x):
    torch.relu_(y)


def hardtanh_(y, x):
    F.hardtanh_(y, -1.0, 1.0)


def clamp_(y, x):
    y.clamp_(min=-0.5, max=0.5)


def sigmoid_(y, x):
    y.sigmoid_()


def tanh_(y, x):
    y.tanh_()


def hardsigmoid_(y, x):
    F.hardsigmoid(y, inplace=True)


def hardswish_(y, x):
    F.hardswish(y, inplace=True)


def silu_(y, x):
    F.silu(y, inplace=True)


def leaky_relu_(y, x):
    F.leaky_relu_(y, 0.2)


def imul_scalar(y, x):
    y *= 0.5


class InPlaceThenReuse(nn.Module):
    """An in-place op whose written tensor is read again afterwards."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)

    def forward(self, x):
        y = self.conv(x)
        z = y.clone()
        y.relu_()
        return y + z


# ----------------------------------------------------------------------------- MLPs and sequences
class MLP(nn.Module):
    def __init__(self, d_in=8, hidden=16, d_out=4, act=nn.ReLU, dropout=0.0, softmax=False):
        super().__init__()
        self.fc1 = nn.Linear(d_in, hidden)
        self.act = act()
        self.drop = nn.Dropout(dropout)
        self.fc2 = nn.Linear(hidden, d_out)
        self.softmax = softmax

    def forward(self, x):
        x = self.fc2(self.drop(self.act(self.fc1(x))))
        return F.softmax(x, dim=-1) if self.softmax else x


class SeqLinear(nn.Module):
    """A per-timestep MLP over ``[N, T, C]``."""

    def __init__(self, c=8):
        super().__init__()
        self.proj = nn.Linear(c, 16)
        self.out = nn.Linear(16, c)

    def forward(self, x):
        return self.out(F.gelu(self.proj(x)))


class SeqResidual(nn.Module):
    def __init__(self, c=8):
        super().__init__()
        self.ff = nn.Sequential(nn.Linear(c, 2 * c), nn.SiLU(), nn.Linear(2 * c, c))

    def forward(self, x):
        return x + self.ff(x)


class SeqSoftmax(nn.Module):
    def __init__(self, c=8):
        super().__init__()
        self.score = nn.Linear(c, 4)

    def forward(self, x):
        return torch.softmax(self.score(x), dim=-1)


class TemporalConv(nn.Module):
    """Conv1d keyword-spotting style over ``[N, C, T]``."""

    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv1d(4, 8, 3, padding=1)
        self.bn = nn.BatchNorm1d(8)
        self.c2 = nn.Conv1d(8, 8, 3, stride=2)
        self.fc = nn.Linear(8, 3)

    def forward(self, x):
        x = F.relu(self.bn(self.c1(x)))
        x = F.relu(self.c2(x))
        x = x.mean(dim=2)
        return self.fc(x)


class Conv1dPool(nn.Module):
    def __init__(self):
        super().__init__()
        self.c = nn.Conv1d(2, 4, 5, padding=2)

    def forward(self, x):
        return F.max_pool1d(F.relu(self.c(x)), 2)


class SeqGate(nn.Module):
    def __init__(self, c=8):
        super().__init__()
        self.a = nn.Linear(c, c)
        self.b = nn.Linear(c, c)

    def forward(self, x):
        return self.a(x) * torch.sigmoid(self.b(x))


# ----------------------------------------------------------------------------- elementwise, ranks 1..5
class Elementwise(nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *xs):
        return self.fn(*xs)


def add_relu(x, y):
    return F.relu(x + y)


def sub_abs_free(x, y):
    return x - y


def mul2(x, y):
    return x * y


def maxi(x, y):
    return torch.maximum(x, y)


def mini(x, y):
    return torch.minimum(x, y)


def double_and_gate(x):
    return (x + x) * torch.sigmoid(x)


def plus_sigmoid(x):
    return F.relu(x + torch.sigmoid(x))


def scale_shift(x):
    return x * 0.25


def relu6_only(x):
    return F.relu6(x)


def softmax_last(x):
    return F.softmax(x, dim=-1)


def hardswish_only(x):
    return F.hardswish(x)


def three_way(x, y, z):
    return (x + y) * z


def two_outputs(x, y):
    return x + y, x * y


# ----------------------------------------------------------------------------- degenerate programs
class Identity(nn.Module):
    def forward(self, x):
        return x


class Clone(nn.Module):
    def forward(self, x):
        return x.clone()


class DetachContiguous(nn.Module):
    def forward(self, x):
        return x.detach().contiguous()


class EvalDropout(nn.Module):
    def __init__(self):
        super().__init__()
        self.drop = nn.Dropout(0.3)

    def forward(self, x):
        return self.drop(x)


class NNIdentity(nn.Module):
    def __init__(self):
        super().__init__()
        self.id = nn.Identity()

    def forward(self, x):
        return self.id(x)


class UnusedInput(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 4)

    def forward(self, x, unused):
        return self.fc(x)


class ReturnInputAndResult(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        return x, self.fc(x)


class SameOutputTwice(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 4)

    def forward(self, x):
        y = self.fc(x)
        return y, y


class FlattenOnly(nn.Module):
    def forward(self, x):
        return torch.flatten(x, 1)


class ReshapeOnly(nn.Module):
    def forward(self, x):
        return x.reshape(x.shape[0], -1, 4)


class PermuteOnly(nn.Module):
    def forward(self, x):
        return x.permute(0, 2, 1)


class DictOutput(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 4)

    def forward(self, x):
        return [self.fc(x), F.softmax(self.fc(x), -1)]


# ----------------------------------------------------------------------------- the corpus
def _e(fn):
    return lambda: Elementwise(fn)


CORPUS: list[tuple[str, object, list[tuple[int, ...]]]] = []


def add(name, factory, *shapes):
    CORPUS.append((name, factory, [tuple(s) for s in shapes]))


for b in (1, 2, 4):
    add(f"tiny_cnn_b{b}", TinyCNN, (b, 3, 8, 8))
    add(f"lenet_b{b}", LeNet, (b, 1, 14, 14))
    add(f"dw_separable_b{b}", DepthwiseSeparable, (b, 4, 6, 6))
    add(f"basic_block_b{b}", BasicBlock, (b, 4, 6, 6))
    add(f"basic_block_down_b{b}", lambda: BasicBlock(4, True), (b, 4, 6, 6))
    add(f"bottleneck_b{b}", Bottleneck, (b, 8, 4, 4))
    add(f"inverted_residual_b{b}", InvertedResidual, (b, 4, 5, 5))
    add(f"mbv3_block_b{b}", MBv3Block, (b, 4, 4, 4))
    add(f"silu_net_b{b}", SiLUNet, (b, 3, 6, 6))
    add(f"silu_by_hand_b{b}", lambda: ConvAct(silu_by_hand), (b, 3, 6, 6))
    add(f"mlp_b{b}", MLP, (b, 8))
    add(f"seq_linear_b{b}", SeqLinear, (b, 5, 8))
    add(f"temporal_conv_b{b}", TemporalConv, (b, 4, 12))
    add(f"residual_mlp_b{b}", ResidualMLP, (b, 8))
    add(f"iadd_b{b}", lambda: InPlace(iadd), (b, 3, 5, 5))
    add(f"identity_b{b}", Identity, (b, 3, 4, 4))

for b in (1, 2):
    add(f"strided_b{b}", StridedNet, (b, 3, 8, 8))
    add(f"dilated_b{b}", DilatedNet, (b, 2, 6, 6))
    add(f"upsample_b{b}", UpsampleNet, (b, 3, 6, 6))
    add(f"padded_conv_b{b}", PaddedConv, (b, 3, 5, 5))
    add(f"same_conv_b{b}", SameConv, (b, 3, 5, 5))
    add(f"global_mean_head_b{b}", GlobalMeanHead, (b, 3, 6, 6))
    add(f"maxpool_head_b{b}", MaxPoolHead, (b, 3, 6, 6))
    add(f"two_branch_cat_b{b}", TwoBranchCat, (b, 3, 5, 5))
    add(f"squeeze_excite_b{b}", SqueezeExcite, (b, 8, 4, 4))
    add(f"gated_conv_b{b}", GatedConv, (b, 3, 5, 5))
    add(f"sigmoid_then_conv_b{b}", SigmoidThenConv, (b, 3, 5, 5))
    add(f"seq_residual_b{b}", SeqResidual, (b, 6, 8))
    add(f"seq_softmax_b{b}", SeqSoftmax, (b, 6, 8))
    add(f"seq_gate_b{b}", SeqGate, (b, 4, 8))
    add(f"conv1d_pool_b{b}", Conv1dPool, (b, 2, 16))
    add(f"elu_mlp_b{b}", ELUMLP, (b, 8))
    add(f"in_place_reuse_b{b}", InPlaceThenReuse, (b, 3, 5, 5))

for name, act in [("relu", nn.ReLU()), ("relu6", nn.ReLU6()), ("silu", nn.SiLU()), ("F.silu", F.silu),
                  ("gelu", nn.GELU()), ("gelu_tanh", nn.GELU("tanh")), ("sigmoid", nn.Sigmoid()),
                  ("tanh", nn.Tanh()), ("hardswish", nn.Hardswish()), ("hardsigmoid", nn.Hardsigmoid()),
                  ("elu", nn.ELU()), ("leaky_relu", nn.LeakyReLU(0.05)), ("x*sigmoid(x)", silu_by_hand),
                  ("x*tanh(x)", swish_tanh), ("x+sigmoid(x)", x_plus_sigmoid), ("x*tanh(sigmoid(x))", mish_like),
                  ("hardtanh", nn.Hardtanh(-0.5, 0.5)), ("clamp", lambda y: y.clamp(-1, 1))]:
    add(f"conv_{name}", (lambda a: lambda: ConvAct(a))(act), (1, 3, 5, 5))

for name, op in [("iadd", iadd), ("isub", isub), ("imul", imul), ("add_", add_), ("mul_", mul_), ("sub_", sub_),
                 ("relu_", relu_), ("torch.relu_", torch_relu_), ("hardtanh_", hardtanh_), ("clamp_", clamp_),
                 ("sigmoid_", sigmoid_), ("tanh_", tanh_), ("hardsigmoid_", hardsigmoid_),
                 ("hardswish_", hardswish_), ("silu_", silu_), ("leaky_relu_", leaky_relu_),
                 ("imul_scalar", imul_scalar)]:
    add(f"inplace_{name}", (lambda o: lambda: InPlace(o))(op), (2, 3, 4, 4))

add("tanh_then_linear", TanhThenLinear, (2, 8))
add("activation_stack", lambda: Elementwise(ActivationStack()), (1, 3, 4, 4))
add("sigmoid_pool_conv", SigmoidPoolConv, (1, 3, 6, 6))
add("mlp_dropout_softmax", lambda: MLP(dropout=0.2, softmax=True), (4, 8))
add("mlp_hardswish", lambda: MLP(act=nn.Hardswish), (2, 8))
add("mlp_silu", lambda: MLP(act=nn.SiLU), (2, 8))
add("mlp_tanh", lambda: MLP(act=nn.Tanh), (1, 8))

# ranks 1..5 (elementwise and linear)
add("rank1_add_relu", _e(add_relu), (16,), (16,))
add("rank1_gate", _e(double_and_gate), (16,))
add("rank1_linear", lambda: MLP(d_in=8), (8,))
add("rank1_softmax", _e(softmax_last), (10,))
add("rank1_scale", _e(scale_shift), (12,))
add("rank2_mul", _e(mul2), (4, 8), (4, 8))
add("rank2_row_broadcast", _e(mul2), (4, 8), (4, 1))
add("rank2_max", _e(maxi), (3, 8), (3, 8))
add("rank3_add", _e(add_relu), (2, 5, 8), (2, 5, 8))
add("rank3_sub", _e(sub_abs_free), (2, 5, 8), (2, 5, 8))
add("rank3_channel_broadcast", _e(mul2), (2, 5, 8), (1, 1, 8))
add("rank3_min", _e(mini), (2, 3, 4), (2, 3, 4))
add("rank3_hardswish", _e(hardswish_only), (2, 5, 8))
add("rank4_add", _e(add_relu), (2, 3, 4, 4), (2, 3, 4, 4))
add("rank4_se_broadcast", _e(mul2), (2, 3, 4, 4), (2, 3, 1, 1))
add("rank4_relu6", _e(relu6_only), (1, 3, 4, 4))
add("rank5_add", _e(add_relu), (1, 2, 3, 4, 5), (1, 2, 3, 4, 5))
add("rank5_add_b2", _e(add_relu), (2, 2, 2, 3, 4), (2, 2, 2, 3, 4))
add("rank5_plus_sigmoid", _e(plus_sigmoid), (2, 2, 3, 2, 4))
add("rank5_hardswish", _e(hardswish_only), (1, 2, 3, 4, 5))
add("rank5_identity", Identity, (1, 2, 3, 4, 5))
add("three_inputs", _e(three_way), (2, 8), (2, 8), (2, 8))
add("two_outputs", _e(two_outputs), (2, 8), (2, 8))

# degenerate programs
add("clone", Clone, (1, 3, 4, 4))
add("detach_contiguous", DetachContiguous, (2, 8))
add("eval_dropout", EvalDropout, (2, 8))
add("nn_identity", NNIdentity, (4, 6))
add("identity_rank1", Identity, (7,))
add("identity_seq", Identity, (2, 5, 3))
add("unused_input", UnusedInput, (2, 8), (2, 3))
add("unused_input_b1", UnusedInput, (1, 8), (1, 3, 4, 4))
add("return_input_and_result", ReturnInputAndResult, (2, 8))
add("same_output_twice", SameOutputTwice, (2, 8))
add("flatten_only", FlattenOnly, (2, 3, 4, 4))
add("reshape_only", ReshapeOnly, (2, 8))
add("list_output", DictOutput, (2, 8))

# rank-5 elementwise with broadcasting (the 4-loop C kernels walk the collapsed broadcast)
def sub5(x, y):
    return x - y


def div5(x, y):
    return x / (y.abs() + 1.0) if False else x / (torch.sigmoid(y) + 0.5)


def where5(x, y):
    return torch.where(x > y, x, y * 0.5)


class Rank5Bias(nn.Module):
    def __init__(self, c=3):
        super().__init__()
        self.bias = nn.Parameter(torch.randn(c, 1, 1, 1))

    def forward(self, x):
        return x * self.bias + 0.5


add("rank5_channel_broadcast_add", _e(add_relu), (2, 3, 2, 3, 4), (1, 3, 1, 1, 1))
add("rank5_gate_mul", _e(mul2), (2, 3, 2, 3, 4), (2, 3, 1, 1, 1))
add("rank5_sub_rank3", _e(sub5), (1, 2, 3, 4, 5), (3, 4, 5))
add("rank5_max_broadcast", _e(maxi), (2, 2, 3, 4, 2), (2, 2, 1, 1, 1))
add("rank5_div", _e(div5), (1, 2, 3, 2, 4), (1, 2, 3, 2, 4))
add("rank5_where", _e(where5), (2, 2, 3, 2, 4), (1, 2, 1, 1, 1))
add("rank5_const_bias", Rank5Bias, (2, 3, 2, 2, 4))


class Rank5Reduce(nn.Module):
    """A video/3-D feature map ``[N, C, T, H, W]`` pooled the usual ways."""

    def forward(self, x):
        a = x.mean(dim=(2, 3, 4), keepdim=True)
        b = x.amax(dim=1, keepdim=True)
        return (x - a) * torch.sigmoid(b), x.sum(-1)


add("rank5_reductions", Rank5Reduce, (2, 3, 2, 3, 4))
