"""Vision models and blocks for microcontrollers, written the way public code writes them (from the
patterns of torchvision, timm, the RepVGG / MobileOne / GhostNetV2 / CoordAttention / DeepLab /
YOLOv5 / Pytorch-UNet / pix2pix / ESPCN sources), not copied: train-time multi-branch blocks,
``x.size()`` arithmetic, ``torch.flatten`` / ``.view(x.size(0), -1)`` / ``.mean((2, 3))`` heads,
module lists walked in ``forward``, helper functions (``autopad``, ``_make_divisible``,
``channel_shuffle``, ``drop_path``), tuple / dict outputs.

``VISION`` lists ``(name, factory, input shape)``; every model is small (batch 1, 16x16 .. 32x32)
so that it compiles in about a second.  Used by tests/test_outsider_vision.py.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.ao.quantization import DeQuantStub, QuantStub


# ----------------------------------------------------------------------------- shared helpers
def autopad(k, p=None, d=1):  # YOLOv5's "same" padding
    if d > 1:
        k = d * (k - 1) + 1 if isinstance(k, int) else [d * (x - 1) + 1 for x in k]
    if p is None:
        p = k // 2 if isinstance(k, int) else [x // 2 for x in k]
    return p


def _make_divisible(v, divisor=8, min_value=None):  # torchvision / timm
    if min_value is None:
        min_value = divisor
    new_v = max(min_value, int(v + divisor / 2) // divisor * divisor)
    if new_v < 0.9 * v:
        new_v += divisor
    return new_v


class Conv(nn.Module):
    """YOLOv5 Conv: conv (no bias) + BN + SiLU, ``autopad``."""
    default_act = nn.SiLU()

    def __init__(self, c1, c2, k=1, s=1, p=None, g=1, d=1, act=True):
        super().__init__()
        self.conv = nn.Conv2d(c1, c2, k, s, autopad(k, p, d), groups=g, dilation=d, bias=False)
        self.bn = nn.BatchNorm2d(c2)
        self.act = self.default_act if act is True else act if isinstance(act, nn.Module) else nn.Identity()

    def forward(self, x):
        return self.act(self.bn(self.conv(x)))


def conv_bn(in_channels, out_channels, kernel_size, stride, padding, groups=1):
    """RepVGG's conv_bn: a Sequential with named children."""
    result = nn.Sequential()
    result.add_module("conv", nn.Conv2d(in_channels=in_channels, out_channels=out_channels,
                                        kernel_size=kernel_size, stride=stride, padding=padding,
                                        groups=groups, bias=False))
    result.add_module("bn", nn.BatchNorm2d(num_features=out_channels))
    return result


def randomize_bn(model, seed=0):
    """Non-trivial BatchNorm statistics, as a trained model has (eval mode folds them)."""
    g = torch.Generator().manual_seed(seed)
    for m in model.modules():
        if isinstance(m, (nn.BatchNorm2d, nn.BatchNorm1d)) and m.track_running_stats and m.affine:
            n = m.num_features
            m.running_mean.copy_(torch.randn(n, generator=g) * 0.1)
            m.running_var.copy_(torch.rand(n, generator=g) * 0.5 + 0.75)
            m.weight.data.copy_(torch.rand(n, generator=g) * 0.5 + 0.75)
            m.bias.data.copy_(torch.randn(n, generator=g) * 0.1)
    return model


def drop_path(x, drop_prob: float = 0.0, training: bool = False, scale_by_keep: bool = True):
    """timm's drop_path: the identity in eval."""
    if drop_prob == 0.0 or not training:
        return x
    keep_prob = 1 - drop_prob
    shape = (x.shape[0],) + (1,) * (x.ndim - 1)
    random_tensor = x.new_empty(shape).bernoulli_(keep_prob)
    if keep_prob > 0.0 and scale_by_keep:
        random_tensor.div_(keep_prob)
    return x * random_tensor


class DropPath(nn.Module):
    def __init__(self, drop_prob=None):
        super().__init__()
        self.drop_prob = drop_prob

    def forward(self, x):
        return drop_path(x, self.drop_prob, self.training)


def channel_shuffle(x, groups):
    """torchvision's ShuffleNetV2 channel_shuffle."""
    batchsize, num_channels, height, width = x.size()
    channels_per_group = num_channels // groups
    x = x.view(batchsize, groups, channels_per_group, height, width)
    x = torch.transpose(x, 1, 2).contiguous()
    x = x.view(batchsize, -1, height, width)
    return x


# ----------------------------------------------------------------------------- RepVGG (train-time form)
class RepVGGBlock(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size=3, stride=1, padding=1, groups=1):
        super().__init__()
        self.nonlinearity = nn.ReLU()
        self.rbr_identity = nn.BatchNorm2d(in_channels) if out_channels == in_channels and stride == 1 else None
        self.rbr_dense = conv_bn(in_channels, out_channels, kernel_size, stride, padding, groups)
        self.rbr_1x1 = conv_bn(in_channels, out_channels, 1, stride, padding - kernel_size // 2, groups)

    def forward(self, inputs):
        if self.rbr_identity is None:
            id_out = 0
        else:
            id_out = self.rbr_identity(inputs)
        return self.nonlinearity(self.rbr_dense(inputs) + self.rbr_1x1(inputs) + id_out)


class RepVGGTiny(nn.Module):
    def __init__(self, num_classes=10):
        super().__init__()
        self.stage0 = RepVGGBlock(3, 8, stride=2)
        self.stage1 = nn.Sequential(RepVGGBlock(8, 8), RepVGGBlock(8, 16, stride=2), RepVGGBlock(16, 16, groups=2))
        self.gap = nn.AdaptiveAvgPool2d(output_size=1)
        self.linear = nn.Linear(16, num_classes)

    def forward(self, x):
        out = self.stage0(x)
        out = self.stage1(out)
        out = self.gap(out)
        out = out.view(out.size(0), -1)
        return self.linear(out)


# ----------------------------------------------------------------------------- MobileOne (train-time form)
class MobileOneBlock(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0, groups=1,
                 num_conv_branches=2):
        super().__init__()
        self.groups = groups
        self.stride = stride
        self.kernel_size = kernel_size
        self.num_conv_branches = num_conv_branches
        self.activation = nn.ReLU()
        self.rbr_skip = nn.BatchNorm2d(num_features=in_channels) \
            if out_channels == in_channels and stride == 1 else None
        rbr_conv = list()
        for _ in range(self.num_conv_branches):
            rbr_conv.append(self._conv_bn(in_channels, out_channels, kernel_size, padding))
        self.rbr_conv = nn.ModuleList(rbr_conv)
        self.rbr_scale = None
        if kernel_size > 1:
            self.rbr_scale = self._conv_bn(in_channels, out_channels, 1, 0)

    def _conv_bn(self, cin, cout, kernel_size, padding):
        mod_list = nn.Sequential()
        mod_list.add_module("conv", nn.Conv2d(cin, cout, kernel_size, self.stride, padding,
                                              groups=self.groups, bias=False))
        mod_list.add_module("bn", nn.BatchNorm2d(num_features=cout))
        return mod_list

    def forward(self, x):
        identity_out = 0
        if self.rbr_skip is not None:
            identity_out = self.rbr_skip(x)
        scale_out = 0
        if self.rbr_scale is not None:
            scale_out = self.rbr_scale(x)
        out = scale_out + identity_out
        for ix in range(self.num_conv_branches):
            out += self.rbr_conv[ix](x)
        return self.activation(out)


class MobileOneTiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = MobileOneBlock(3, 8, 3, stride=2, padding=1)
        self.dw = MobileOneBlock(8, 8, 3, stride=1, padding=1, groups=8)
        self.pw = MobileOneBlock(8, 16, 1, stride=1, padding=0)
        self.dw2 = MobileOneBlock(16, 16, 3, stride=2, padding=1, groups=16)
        self.pw2 = MobileOneBlock(16, 16, 1)
        self.gap = nn.AdaptiveAvgPool2d(output_size=1)
        self.linear = nn.Linear(16, 5)

    def forward(self, x):
        x = self.pw2(self.dw2(self.pw(self.dw(self.stem(x)))))
        x = self.gap(x)
        x = x.view(x.size(0), -1)
        return self.linear(x)


# ----------------------------------------------------------------------------- GhostNetV2 (DFC attention)
class GhostModuleV2(nn.Module):
    def __init__(self, inp, oup, kernel_size=1, ratio=2, dw_size=3, stride=1, relu=True, mode="attn"):
        super().__init__()
        self.mode = mode
        self.gate_fn = nn.Sigmoid()
        self.oup = oup
        init_channels = math.ceil(oup / ratio)
        new_channels = init_channels * (ratio - 1)
        self.primary_conv = nn.Sequential(
            nn.Conv2d(inp, init_channels, kernel_size, stride, kernel_size // 2, bias=False),
            nn.BatchNorm2d(init_channels),
            nn.ReLU(inplace=True) if relu else nn.Sequential(),
        )
        self.cheap_operation = nn.Sequential(
            nn.Conv2d(init_channels, new_channels, dw_size, 1, dw_size // 2, groups=init_channels, bias=False),
            nn.BatchNorm2d(new_channels),
            nn.ReLU(inplace=True) if relu else nn.Sequential(),
        )
        if self.mode == "attn":
            self.short_conv = nn.Sequential(
                nn.Conv2d(inp, oup, kernel_size, stride, kernel_size // 2, bias=False),
                nn.BatchNorm2d(oup),
                nn.Conv2d(oup, oup, kernel_size=(1, 5), stride=1, padding=(0, 2), groups=oup, bias=False),
                nn.BatchNorm2d(oup),
                nn.Conv2d(oup, oup, kernel_size=(5, 1), stride=1, padding=(2, 0), groups=oup, bias=False),
                nn.BatchNorm2d(oup),
            )

    def forward(self, x):
        if self.mode == "original":
            x1 = self.primary_conv(x)
            x2 = self.cheap_operation(x1)
            out = torch.cat([x1, x2], dim=1)
            return out[:, :self.oup, :, :]
        res = self.short_conv(F.avg_pool2d(x, kernel_size=2, stride=2))
        x1 = self.primary_conv(x)
        x2 = self.cheap_operation(x1)
        out = torch.cat([x1, x2], dim=1)
        return out[:, :self.oup, :, :] * F.interpolate(self.gate_fn(res), size=(out.shape[-2], out.shape[-1]),
                                                       mode="nearest")


class GhostBottleneckV2(nn.Module):
    def __init__(self, in_chs=8, mid_chs=16, out_chs=8):
        super().__init__()
        self.ghost1 = GhostModuleV2(in_chs, mid_chs, relu=True, mode="original")
        self.ghost2 = GhostModuleV2(mid_chs, out_chs, relu=False, mode="attn")

    def forward(self, x):
        residual = x
        x = self.ghost1(x)
        x = self.ghost2(x)
        x += residual
        return x


class GhostNetV2Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv_stem = nn.Conv2d(3, 8, 3, 2, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(8)
        self.act1 = nn.ReLU(inplace=True)
        self.blocks = nn.Sequential(GhostBottleneckV2(), GhostBottleneckV2(8, 12, 8))

    def forward(self, x):
        return self.blocks(self.act1(self.bn1(self.conv_stem(x))))


# ----------------------------------------------------------------------------- MnasNet / EfficientNet-lite
class _InvertedResidual(nn.Module):
    """torchvision MnasNet's _InvertedResidual (BN momentum given, 5x5 depthwise), with timm's drop path."""

    def __init__(self, in_ch, out_ch, kernel_size, stride, expansion_factor, bn_momentum=0.0003, drop=0.2):
        super().__init__()
        mid_ch = in_ch * expansion_factor
        self.apply_residual = in_ch == out_ch and stride == 1
        self.layers = nn.Sequential(
            nn.Conv2d(in_ch, mid_ch, 1, bias=False),
            nn.BatchNorm2d(mid_ch, momentum=bn_momentum),
            nn.ReLU(inplace=True),
            nn.Conv2d(mid_ch, mid_ch, kernel_size, padding=kernel_size // 2, stride=stride, groups=mid_ch,
                      bias=False),
            nn.BatchNorm2d(mid_ch, momentum=bn_momentum),
            nn.ReLU(inplace=True),
            nn.Conv2d(mid_ch, out_ch, 1, bias=False),
            nn.BatchNorm2d(out_ch, momentum=bn_momentum),
        )
        self.drop_path = DropPath(drop) if drop > 0.0 else nn.Identity()

    def forward(self, input):
        if self.apply_residual:
            return self.drop_path(self.layers(input)) + input
        return self.layers(input)


class MnasNetTiny(nn.Module):
    def __init__(self, num_classes=4, dropout=0.2):
        super().__init__()
        layers = [
            nn.Conv2d(3, 8, 3, padding=1, stride=2, bias=False),
            nn.BatchNorm2d(8, momentum=0.0003),
            nn.ReLU(inplace=True),
            _InvertedResidual(8, 8, 3, 1, 3),
            _InvertedResidual(8, 12, 5, 2, 3),
            _InvertedResidual(12, 12, 5, 1, 3),
            nn.Conv2d(12, 32, 1, padding=0, stride=1, bias=False),
            nn.BatchNorm2d(32, momentum=0.0003),
            nn.ReLU(inplace=True),
        ]
        self.layers = nn.Sequential(*layers)
        self.classifier = nn.Sequential(nn.Dropout(p=dropout, inplace=True), nn.Linear(32, num_classes))

    def forward(self, x):
        x = self.layers(x)
        x = x.mean([2, 3])  # torchvision MnasNet: global pool as mean over ([2, 3])
        return self.classifier(x)


class SqueezeExcitation(nn.Module):
    """torchvision.ops.SqueezeExcitation."""

    def __init__(self, input_channels, squeeze_channels, activation=nn.ReLU, scale_activation=nn.Sigmoid):
        super().__init__()
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc1 = nn.Conv2d(input_channels, squeeze_channels, 1)
        self.fc2 = nn.Conv2d(squeeze_channels, input_channels, 1)
        self.activation = activation()
        self.scale_activation = scale_activation()

    def _scale(self, input):
        scale = self.avgpool(input)
        scale = self.fc1(scale)
        scale = self.activation(scale)
        scale = self.fc2(scale)
        return self.scale_activation(scale)

    def forward(self, input):
        scale = self._scale(input)
        return scale * input


class ResBottleneckBlockY(nn.Module):
    """torchvision RegNet's ResBottleneckBlock with SE (RegNetY): group width 8."""

    def __init__(self, width_in, width_out, stride, group_width=8, bottleneck_multiplier=1.0, se_ratio=0.25):
        super().__init__()
        self.proj = None
        should_proj = (width_in != width_out) or (stride != 1)
        if should_proj:
            self.proj = nn.Sequential(nn.Conv2d(width_in, width_out, 1, stride, bias=False),
                                      nn.BatchNorm2d(width_out))
        w_b = int(round(width_out * bottleneck_multiplier))
        g = w_b // group_width
        self.a = nn.Sequential(nn.Conv2d(width_in, w_b, 1, bias=False), nn.BatchNorm2d(w_b), nn.ReLU(inplace=True))
        self.b = nn.Sequential(nn.Conv2d(w_b, w_b, 3, stride, 1, groups=g, bias=False), nn.BatchNorm2d(w_b),
                               nn.ReLU(inplace=True))
        width_se_out = int(round(se_ratio * width_in))
        self.se = SqueezeExcitation(w_b, width_se_out)
        self.c = nn.Sequential(nn.Conv2d(w_b, width_out, 1, bias=False), nn.BatchNorm2d(width_out))
        self.activation = nn.ReLU(inplace=True)

    def forward(self, x):
        f = self.c(self.se(self.b(self.a(x))))
        if self.proj is not None:
            x = self.proj(x) + f
        else:
            x = x + f
        return self.activation(x)


class RegNetYTiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, 2, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU(inplace=True))
        self.trunk_output = nn.Sequential(ResBottleneckBlockY(16, 16, 1), ResBottleneckBlockY(16, 24, 2))
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(24, 10)

    def forward(self, x):
        x = self.stem(x)
        x = self.trunk_output(x)
        x = self.avgpool(x)
        x = x.flatten(start_dim=1)
        return self.fc(x)


# ----------------------------------------------------------------------------- DenseNet
class _DenseLayer(nn.Module):
    def __init__(self, num_input_features, growth_rate, bn_size):
        super().__init__()
        self.norm1 = nn.BatchNorm2d(num_input_features)
        self.relu1 = nn.ReLU(inplace=True)
        self.conv1 = nn.Conv2d(num_input_features, bn_size * growth_rate, kernel_size=1, stride=1, bias=False)
        self.norm2 = nn.BatchNorm2d(bn_size * growth_rate)
        self.relu2 = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(bn_size * growth_rate, growth_rate, kernel_size=3, stride=1, padding=1, bias=False)

    def bn_function(self, inputs):
        concated_features = torch.cat(inputs, 1)
        return self.conv1(self.relu1(self.norm1(concated_features)))

    def forward(self, input):
        prev_features = [input] if isinstance(input, torch.Tensor) else input
        bottleneck_output = self.bn_function(prev_features)
        return self.conv2(self.relu2(self.norm2(bottleneck_output)))


class _DenseBlock(nn.ModuleDict):
    def __init__(self, num_layers, num_input_features, bn_size, growth_rate):
        super().__init__()
        for i in range(num_layers):
            layer = _DenseLayer(num_input_features + i * growth_rate, growth_rate=growth_rate, bn_size=bn_size)
            self.add_module("denselayer%d" % (i + 1), layer)

    def forward(self, init_features):
        features = [init_features]
        for name, layer in self.items():
            new_features = layer(features)
            features.append(new_features)
        return torch.cat(features, 1)


class _Transition(nn.Sequential):
    def __init__(self, num_input_features, num_output_features):
        super().__init__()
        self.norm = nn.BatchNorm2d(num_input_features)
        self.relu = nn.ReLU(inplace=True)
        self.conv = nn.Conv2d(num_input_features, num_output_features, kernel_size=1, stride=1, bias=False)
        self.pool = nn.AvgPool2d(kernel_size=2, stride=2)


class DenseNetTiny(nn.Module):
    def __init__(self, growth_rate=4, num_init_features=8, bn_size=2, num_classes=5):
        super().__init__()
        self.features = nn.Sequential()
        self.features.add_module("conv0", nn.Conv2d(3, num_init_features, 3, 1, 1, bias=False))
        self.features.add_module("norm0", nn.BatchNorm2d(num_init_features))
        self.features.add_module("relu0", nn.ReLU(inplace=True))
        self.features.add_module("pool0", nn.MaxPool2d(kernel_size=3, stride=2, padding=1))
        num_features = num_init_features
        block = _DenseBlock(3, num_features, bn_size, growth_rate)
        self.features.add_module("denseblock1", block)
        num_features = num_features + 3 * growth_rate
        self.features.add_module("transition1", _Transition(num_features, num_features // 2))
        num_features = num_features // 2
        self.features.add_module("denseblock2", _DenseBlock(2, num_features, bn_size, growth_rate))
        num_features = num_features + 2 * growth_rate
        self.features.add_module("norm5", nn.BatchNorm2d(num_features))
        self.classifier = nn.Linear(num_features, num_classes)

    def forward(self, x):
        features = self.features(x)
        out = F.relu(features, inplace=True)
        out = F.adaptive_avg_pool2d(out, (1, 1))
        out = torch.flatten(out, 1)
        return self.classifier(out)


# ----------------------------------------------------------------------------- SqueezeNet 1.1
class Fire(nn.Module):
    def __init__(self, inplanes, squeeze_planes, expand1x1_planes, expand3x3_planes):
        super().__init__()
        self.squeeze = nn.Conv2d(inplanes, squeeze_planes, kernel_size=1)
        self.squeeze_activation = nn.ReLU(inplace=True)
        self.expand1x1 = nn.Conv2d(squeeze_planes, expand1x1_planes, kernel_size=1)
        self.expand1x1_activation = nn.ReLU(inplace=True)
        self.expand3x3 = nn.Conv2d(squeeze_planes, expand3x3_planes, kernel_size=3, padding=1)
        self.expand3x3_activation = nn.ReLU(inplace=True)

    def forward(self, x):
        x = self.squeeze_activation(self.squeeze(x))
        return torch.cat([self.expand1x1_activation(self.expand1x1(x)),
                          self.expand3x3_activation(self.expand3x3(x))], 1)


class SqueezeNetTiny(nn.Module):
    def __init__(self, num_classes=6):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 16, kernel_size=3, stride=2),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(kernel_size=3, stride=2, ceil_mode=True),
            Fire(16, 4, 8, 8),
            Fire(16, 4, 8, 8),
            nn.MaxPool2d(kernel_size=3, stride=2, ceil_mode=True),
            Fire(16, 8, 12, 12),
        )
        final_conv = nn.Conv2d(24, num_classes, kernel_size=1)
        self.classifier = nn.Sequential(nn.Dropout(p=0.5), final_conv, nn.ReLU(inplace=True),
                                        nn.AdaptiveAvgPool2d((1, 1)))

    def forward(self, x):
        x = self.features(x)
        x = self.classifier(x)
        return torch.flatten(x, 1)


# ----------------------------------------------------------------------------- ShuffleNetV2
class ShuffleInvertedResidual(nn.Module):
    def __init__(self, inp, oup, stride):
        super().__init__()
        self.stride = stride
        branch_features = oup // 2
        if self.stride > 1:
            self.branch1 = nn.Sequential(
                self.depthwise_conv(inp, inp, kernel_size=3, stride=self.stride, padding=1),
                nn.BatchNorm2d(inp),
                nn.Conv2d(inp, branch_features, kernel_size=1, stride=1, padding=0, bias=False),
                nn.BatchNorm2d(branch_features),
                nn.ReLU(inplace=True),
            )
        else:
            self.branch1 = nn.Sequential()
        self.branch2 = nn.Sequential(
            nn.Conv2d(inp if (self.stride > 1) else branch_features, branch_features, 1, 1, 0, bias=False),
            nn.BatchNorm2d(branch_features),
            nn.ReLU(inplace=True),
            self.depthwise_conv(branch_features, branch_features, kernel_size=3, stride=self.stride, padding=1),
            nn.BatchNorm2d(branch_features),
            nn.Conv2d(branch_features, branch_features, kernel_size=1, stride=1, padding=0, bias=False),
            nn.BatchNorm2d(branch_features),
            nn.ReLU(inplace=True),
        )

    @staticmethod
    def depthwise_conv(i, o, kernel_size, stride=1, padding=0, bias=False):
        return nn.Conv2d(i, o, kernel_size, stride, padding, bias=bias, groups=i)

    def forward(self, x):
        if self.stride == 1:
            x1, x2 = x.chunk(2, dim=1)
            out = torch.cat((x1, self.branch2(x2)), dim=1)
        else:
            out = torch.cat((self.branch1(x), self.branch2(x)), dim=1)
        out = channel_shuffle(out, 2)
        return out


class ShuffleNetV2Tiny(nn.Module):
    def __init__(self, num_classes=5):
        super().__init__()
        self.conv1 = nn.Sequential(nn.Conv2d(3, 8, 3, 2, 1, bias=False), nn.BatchNorm2d(8), nn.ReLU(inplace=True))
        self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        stages = [ShuffleInvertedResidual(8, 16, 2), ShuffleInvertedResidual(16, 16, 1),
                  ShuffleInvertedResidual(16, 16, 1)]
        self.stage2 = nn.Sequential(*stages)
        self.conv5 = nn.Sequential(nn.Conv2d(16, 32, 1, 1, 0, bias=False), nn.BatchNorm2d(32), nn.ReLU(inplace=True))
        self.fc = nn.Linear(32, num_classes)

    def forward(self, x):
        x = self.conv1(x)
        x = self.maxpool(x)
        x = self.stage2(x)
        x = self.conv5(x)
        x = x.mean([2, 3])  # globalpool
        return self.fc(x)


# ----------------------------------------------------------------------------- YOLOv5-style backbone + neck
class Focus(nn.Module):
    def __init__(self, c1, c2, k=1, s=1, p=None, g=1, act=True):
        super().__init__()
        self.conv = Conv(c1 * 4, c2, k, s, p, g, act=act)

    def forward(self, x):  # x(b,c,w,h) -> y(b,4c,w/2,h/2)
        return self.conv(torch.cat((x[..., ::2, ::2], x[..., 1::2, ::2], x[..., ::2, 1::2], x[..., 1::2, 1::2]), 1))


class Bottleneck(nn.Module):
    def __init__(self, c1, c2, shortcut=True, g=1, e=0.5):
        super().__init__()
        c_ = int(c2 * e)
        self.cv1 = Conv(c1, c_, 1, 1)
        self.cv2 = Conv(c_, c2, 3, 1, g=g)
        self.add = shortcut and c1 == c2

    def forward(self, x):
        return x + self.cv2(self.cv1(x)) if self.add else self.cv2(self.cv1(x))


class C3(nn.Module):
    def __init__(self, c1, c2, n=1, shortcut=True, g=1, e=0.5):
        super().__init__()
        c_ = int(c2 * e)
        self.cv1 = Conv(c1, c_, 1, 1)
        self.cv2 = Conv(c1, c_, 1, 1)
        self.cv3 = Conv(2 * c_, c2, 1)
        self.m = nn.Sequential(*(Bottleneck(c_, c_, shortcut, g, e=1.0) for _ in range(n)))

    def forward(self, x):
        return self.cv3(torch.cat((self.m(self.cv1(x)), self.cv2(x)), 1))


class C2f(nn.Module):
    """YOLOv8's C2f: one conv split in two with .chunk / .split, the list extended in a loop."""

    def __init__(self, c1, c2, n=1, shortcut=False, g=1, e=0.5):
        super().__init__()
        self.c = int(c2 * e)
        self.cv1 = Conv(c1, 2 * self.c, 1, 1)
        self.cv2 = Conv((2 + n) * self.c, c2, 1)
        self.m = nn.ModuleList(Bottleneck(self.c, self.c, shortcut, g, e=1.0) for _ in range(n))

    def forward(self, x):
        y = list(self.cv1(x).chunk(2, 1))
        y.extend(m(y[-1]) for m in self.m)
        return self.cv2(torch.cat(y, 1))


class SPPF(nn.Module):
    def __init__(self, c1, c2, k=5):
        super().__init__()
        c_ = c1 // 2
        self.cv1 = Conv(c1, c_, 1, 1)
        self.cv2 = Conv(c_ * 4, c2, 1, 1)
        self.m = nn.MaxPool2d(kernel_size=k, stride=1, padding=k // 2)

    def forward(self, x):
        x = self.cv1(x)
        y1 = self.m(x)
        y2 = self.m(y1)
        return self.cv2(torch.cat((x, y1, y2, self.m(y2)), 1))


class Concat(nn.Module):
    def __init__(self, dimension=1):
        super().__init__()
        self.d = dimension

    def forward(self, x):
        return torch.cat(x, self.d)


class Detect(nn.Module):
    """YOLOv5 Detect head in export form: per level a 1x1 conv, view + permute to (bs, na, ny, nx, no)."""

    def __init__(self, nc=2, ch=(16, 16), na=2):
        super().__init__()
        self.nc, self.no, self.nl, self.na = nc, nc + 5, len(ch), na
        self.m = nn.ModuleList(nn.Conv2d(x, self.no * self.na, 1) for x in ch)

    def forward(self, x):
        z = []
        for i in range(self.nl):
            x[i] = self.m[i](x[i])
            bs, _, ny, nx = x[i].shape
            x[i] = x[i].view(bs, self.na, self.no, ny, nx).permute(0, 1, 3, 4, 2).contiguous()
            y = x[i].sigmoid()
            z.append(y.view(bs, self.na * nx * ny, self.no))
        return torch.cat(z, 1)


class YoloTiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.focus = Focus(3, 8, 3)
        self.down1 = Conv(8, 16, 3, 2)
        self.c3 = C3(16, 16)
        self.down2 = Conv(16, 24, 3, 2)
        self.sppf = SPPF(24, 16)
        self.up = nn.Upsample(None, 2, "nearest")
        self.cat = Concat(1)
        self.c2f = C2f(32, 16)
        self.detect = Detect(ch=(16, 16))

    def forward(self, x):
        p3 = self.c3(self.down1(self.focus(x)))  # /4
        p4 = self.sppf(self.down2(p3))  # /8
        p3 = self.c2f(self.cat([self.up(p4), p3]))
        return self.detect([p3, p4])


# ----------------------------------------------------------------------------- FPN top-down
class TinyFPN(nn.Module):
    """torchvision FeaturePyramidNetwork style: inner (lateral) 1x1 + layer 3x3 blocks, a top-down
    pass with F.interpolate(size=feat_shape, mode="nearest"), an extra max-pool level; a dict output."""

    def __init__(self, in_channels_list=(8, 16, 24), out_channels=8):
        super().__init__()
        self.body = nn.ModuleList([
            nn.Sequential(nn.Conv2d(3, 8, 3, 2, 1), nn.ReLU(inplace=True)),
            nn.Sequential(nn.Conv2d(8, 16, 3, 2, 1), nn.ReLU(inplace=True)),
            nn.Sequential(nn.Conv2d(16, 24, 3, 2, 1), nn.ReLU(inplace=True)),
        ])
        self.inner_blocks = nn.ModuleList(nn.Conv2d(c, out_channels, 1) for c in in_channels_list)
        self.layer_blocks = nn.ModuleList(nn.Conv2d(out_channels, out_channels, 3, padding=1)
                                          for _ in in_channels_list)

    def forward(self, x):
        feats = []
        for stage in self.body:
            x = stage(x)
            feats.append(x)
        last_inner = self.inner_blocks[-1](feats[-1])
        results = [self.layer_blocks[-1](last_inner)]
        for idx in range(len(feats) - 2, -1, -1):
            inner_lateral = self.inner_blocks[idx](feats[idx])
            feat_shape = inner_lateral.shape[-2:]
            inner_top_down = F.interpolate(last_inner, size=feat_shape, mode="nearest")
            last_inner = inner_lateral + inner_top_down
            results.insert(0, self.layer_blocks[idx](last_inner))
        results.append(F.max_pool2d(results[-1], 1, 2, 0))  # LastLevelMaxPool
        return {str(i): r for i, r in enumerate(results)}


# ----------------------------------------------------------------------------- UNet (milesial style)
class DoubleConv(nn.Module):
    def __init__(self, in_channels, out_channels, mid_channels=None):
        super().__init__()
        if not mid_channels:
            mid_channels = out_channels
        self.double_conv = nn.Sequential(
            nn.Conv2d(in_channels, mid_channels, kernel_size=3, padding=1, bias=False),
            nn.BatchNorm2d(mid_channels),
            nn.ReLU(inplace=True),
            nn.Conv2d(mid_channels, out_channels, kernel_size=3, padding=1, bias=False),
            nn.BatchNorm2d(out_channels),
            nn.ReLU(inplace=True),
        )

    def forward(self, x):
        return self.double_conv(x)


class Down(nn.Module):
    def __init__(self, in_channels, out_channels):
        super().__init__()
        self.maxpool_conv = nn.Sequential(nn.MaxPool2d(2), DoubleConv(in_channels, out_channels))

    def forward(self, x):
        return self.maxpool_conv(x)


class Up(nn.Module):
    def __init__(self, in_channels, out_channels, bilinear=False):
        super().__init__()
        if bilinear:
            self.up = nn.Upsample(scale_factor=2, mode="bilinear", align_corners=True)
            self.conv = DoubleConv(in_channels, out_channels, in_channels // 2)
        else:
            self.up = nn.ConvTranspose2d(in_channels, in_channels // 2, kernel_size=2, stride=2)
            self.conv = DoubleConv(in_channels, out_channels)

    def forward(self, x1, x2):
        x1 = self.up(x1)
        diffY = x2.size()[2] - x1.size()[2]
        diffX = x2.size()[3] - x1.size()[3]
        x1 = F.pad(x1, [diffX // 2, diffX - diffX // 2, diffY // 2, diffY - diffY // 2])
        x = torch.cat([x2, x1], dim=1)
        return self.conv(x)


class UNetTiny(nn.Module):
    def __init__(self, n_channels=3, n_classes=2, bilinear=False):
        super().__init__()
        factor = 2 if bilinear else 1
        self.inc = DoubleConv(n_channels, 8)
        self.down1 = Down(8, 16)
        self.down2 = Down(16, 32 // factor)
        self.up1 = Up(32, 16 // factor, bilinear)
        self.up2 = Up(16, 8, bilinear)
        self.outc = nn.Conv2d(8, n_classes, kernel_size=1)

    def forward(self, x):
        x1 = self.inc(x)
        x2 = self.down1(x1)
        x3 = self.down2(x2)
        x = self.up1(x3, x2)
        x = self.up2(x, x1)
        return self.outc(x)


# ----------------------------------------------------------------------------- super-resolution (ESPCN / unshuffle)
class ESPCN(nn.Module):
    def __init__(self, upscale_factor=2):
        super().__init__()
        self.unshuffle = nn.PixelUnshuffle(2)
        self.conv1 = nn.Conv2d(12, 16, (5, 5), (1, 1), (2, 2))
        self.conv2 = nn.Conv2d(16, 8, (3, 3), (1, 1), (1, 1))
        self.conv3 = nn.Conv2d(8, 3 * (upscale_factor * 2) ** 2, (3, 3), (1, 1), (1, 1))
        self.pixel_shuffle = nn.PixelShuffle(upscale_factor * 2)

    def forward(self, x):
        x = self.unshuffle(x)
        x = torch.tanh(self.conv1(x))
        x = torch.tanh(self.conv2(x))
        return torch.sigmoid(self.pixel_shuffle(self.conv3(x)))


# ----------------------------------------------------------------------------- activations zoo
class ActivationCNN(nn.Module):
    """A plain CNN whose layers each use another activation module, as people mix them."""

    def __init__(self):
        super().__init__()
        acts = [nn.Hardswish(), nn.LeakyReLU(0.1, inplace=True), nn.PReLU(12), nn.ELU(alpha=0.5),
                nn.Hardsigmoid(), nn.ReLU6()]
        chans = [3, 8, 12, 12, 16, 16, 16]
        layers = []
        for i, act in enumerate(acts):
            layers += [nn.Conv2d(chans[i], chans[i + 1], 3, 2 if i in (0, 3) else 1, 1), act]
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Sequential(nn.Flatten(), nn.Dropout(0.3), nn.Linear(16 * 4 * 4, 8),
                                        nn.PReLU(), nn.Linear(8, 3))

    def forward(self, x):
        return self.classifier(self.features(x))


# ----------------------------------------------------------------------------- normalisation layers
class GNResBlock(nn.Module):
    """A GroupNorm + SiLU residual block (diffusion-UNet / BiT style) and an InstanceNorm2d (affine=False)
    layer as style-transfer networks use it."""

    def __init__(self, c=16):
        super().__init__()
        self.stem = nn.Conv2d(3, c, 3, padding=1)
        self.norm1 = nn.GroupNorm(4, c)
        self.conv1 = nn.Conv2d(c, c, 3, padding=1)
        self.norm2 = nn.GroupNorm(num_groups=8, num_channels=c, eps=1e-6)
        self.conv2 = nn.Conv2d(c, c, 3, padding=1)
        self.inorm = nn.InstanceNorm2d(c)
        self.out = nn.Conv2d(c, 3, 1)

    def forward(self, x):
        x = self.stem(x)
        h = self.conv1(F.silu(self.norm1(x)))
        h = self.conv2(F.silu(self.norm2(h)))
        x = x + h
        return self.out(F.relu(self.inorm(x)))


# ----------------------------------------------------------------------------- coordinate attention
class h_sigmoid(nn.Module):
    def __init__(self, inplace=True):
        super().__init__()
        self.relu = nn.ReLU6(inplace=inplace)

    def forward(self, x):
        return self.relu(x + 3) / 6


class h_swish(nn.Module):
    def __init__(self, inplace=True):
        super().__init__()
        self.sigmoid = h_sigmoid(inplace=inplace)

    def forward(self, x):
        return x * self.sigmoid(x)


class CoordAtt(nn.Module):
    def __init__(self, inp, oup, reduction=4):
        super().__init__()
        self.pool_h = nn.AdaptiveAvgPool2d((None, 1))
        self.pool_w = nn.AdaptiveAvgPool2d((1, None))
        mip = max(8, inp // reduction)
        self.conv1 = nn.Conv2d(inp, mip, kernel_size=1, stride=1, padding=0)
        self.bn1 = nn.BatchNorm2d(mip)
        self.act = h_swish()
        self.conv_h = nn.Conv2d(mip, oup, kernel_size=1, stride=1, padding=0)
        self.conv_w = nn.Conv2d(mip, oup, kernel_size=1, stride=1, padding=0)

    def forward(self, x):
        identity = x
        n, c, h, w = x.size()
        x_h = self.pool_h(x)
        x_w = self.pool_w(x).permute(0, 1, 3, 2)
        y = torch.cat([x_h, x_w], dim=2)
        y = self.conv1(y)
        y = self.bn1(y)
        y = self.act(y)
        x_h, x_w = torch.split(y, [h, w], dim=2)
        x_w = x_w.permute(0, 1, 3, 2)
        a_h = self.conv_h(x_h).sigmoid()
        a_w = self.conv_w(x_w).sigmoid()
        return identity * a_w * a_h


class CoordAttNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Sequential(nn.Conv2d(3, 16, 3, 1, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU(inplace=True))
        self.ca = CoordAtt(16, 16)

    def forward(self, x):
        return self.ca(self.conv(x))


# ----------------------------------------------------------------------------- CBAM (Linear MLP, expand_as)
class ChannelGate(nn.Module):
    """The CBAM reference ChannelGate: Flatten + Linear MLP over avg- and max-pooled descriptors,
    F.avg_pool2d with the full (H, W) kernel, unsqueeze(2).unsqueeze(3).expand_as(x)."""

    def __init__(self, gate_channels, reduction_ratio=4):
        super().__init__()
        self.mlp = nn.Sequential(nn.Flatten(), nn.Linear(gate_channels, gate_channels // reduction_ratio),
                                 nn.ReLU(), nn.Linear(gate_channels // reduction_ratio, gate_channels))

    def forward(self, x):
        avg_pool = F.avg_pool2d(x, (x.size(2), x.size(3)), stride=(x.size(2), x.size(3)))
        max_pool = F.max_pool2d(x, (x.size(2), x.size(3)), stride=(x.size(2), x.size(3)))
        channel_att_sum = self.mlp(avg_pool) + self.mlp(max_pool)
        scale = torch.sigmoid(channel_att_sum).unsqueeze(2).unsqueeze(3).expand_as(x)
        return x * scale


class ChannelPool(nn.Module):
    def forward(self, x):
        return torch.cat((torch.max(x, 1)[0].unsqueeze(1), torch.mean(x, 1).unsqueeze(1)), dim=1)


class SpatialGate(nn.Module):
    def __init__(self):
        super().__init__()
        kernel_size = 7
        self.compress = ChannelPool()
        self.spatial = nn.Sequential(nn.Conv2d(2, 1, kernel_size, stride=1, padding=(kernel_size - 1) // 2,
                                               bias=False), nn.BatchNorm2d(1, eps=1e-5, momentum=0.01))

    def forward(self, x):
        x_compress = self.compress(x)
        x_out = self.spatial(x_compress)
        scale = torch.sigmoid(x_out)
        return x * scale


class CBAMNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Sequential(nn.Conv2d(3, 16, 3, 2, 1), nn.ReLU(inplace=True))
        self.ChannelGate = ChannelGate(16)
        self.SpatialGate = SpatialGate()
        self.fc = nn.Linear(16, 4)

    def forward(self, x):
        x = self.conv(x)
        x_out = self.SpatialGate(self.ChannelGate(x)) + x
        return self.fc(F.adaptive_avg_pool2d(x_out, 1).view(x_out.size(0), -1))


# ----------------------------------------------------------------------------- DeepLabV3 ASPP
class ASPPConv(nn.Sequential):
    def __init__(self, in_channels, out_channels, dilation):
        modules = [nn.Conv2d(in_channels, out_channels, 3, padding=dilation, dilation=dilation, bias=False),
                   nn.BatchNorm2d(out_channels), nn.ReLU()]
        super().__init__(*modules)


class ASPPPooling(nn.Sequential):
    def __init__(self, in_channels, out_channels, align_corners=False):
        super().__init__(nn.AdaptiveAvgPool2d(1), nn.Conv2d(in_channels, out_channels, 1, bias=False),
                         nn.BatchNorm2d(out_channels), nn.ReLU())
        self.align_corners = align_corners

    def forward(self, x):
        size = x.shape[-2:]
        for mod in self:
            x = mod(x)
        return F.interpolate(x, size=size, mode="bilinear", align_corners=self.align_corners)


class ASPP(nn.Module):
    def __init__(self, in_channels, atrous_rates, out_channels=8, align_corners=False):
        super().__init__()
        modules = [nn.Sequential(nn.Conv2d(in_channels, out_channels, 1, bias=False), nn.BatchNorm2d(out_channels),
                                 nn.ReLU())]
        for rate in tuple(atrous_rates):
            modules.append(ASPPConv(in_channels, out_channels, rate))
        modules.append(ASPPPooling(in_channels, out_channels, align_corners))
        self.convs = nn.ModuleList(modules)
        self.project = nn.Sequential(nn.Conv2d(len(self.convs) * out_channels, out_channels, 1, bias=False),
                                     nn.BatchNorm2d(out_channels), nn.ReLU(), nn.Dropout(0.5))

    def forward(self, x):
        _res = []
        for conv in self.convs:
            _res.append(conv(x))
        res = torch.cat(_res, dim=1)
        return self.project(res)


class DeepLabTiny(nn.Module):
    def __init__(self, align_corners=False, num_classes=3):
        super().__init__()
        self.align_corners = align_corners
        self.backbone = nn.Sequential(nn.Conv2d(3, 8, 3, 2, 1, bias=False), nn.BatchNorm2d(8), nn.ReLU(inplace=True),
                                      nn.Conv2d(8, 16, 3, 2, 1, bias=False), nn.BatchNorm2d(16),
                                      nn.ReLU(inplace=True))
        self.aspp = ASPP(16, [1, 2, 3], align_corners=align_corners)
        self.head = nn.Conv2d(8, num_classes, 1)

    def forward(self, x):
        input_shape = x.shape[-2:]
        x = self.head(self.aspp(self.backbone(x)))
        return F.interpolate(x, size=input_shape, mode="bilinear", align_corners=self.align_corners)


# ---------------------------------------------------------------------------- depthwise multiplier / asymmetric kernels
class DepthMultiplierNet(nn.Module):
    """Depthwise convs with a channel multiplier of 2 (TF's depth_multiplier), one at stride 2 with a 5x5."""

    def __init__(self):
        super().__init__()
        self.conv0 = nn.Conv2d(3, 8, 3, padding=1)
        self.dw1 = nn.Conv2d(8, 16, 3, padding=1, groups=8)
        self.dw2 = nn.Conv2d(16, 32, 5, stride=2, padding=2, groups=16, bias=False)
        self.bn = nn.BatchNorm2d(32)
        self.pw = nn.Conv2d(32, 8, 1)

    def forward(self, x):
        x = F.relu(self.conv0(x))
        x = F.relu6(self.dw1(x))
        x = F.relu6(self.bn(self.dw2(x)))
        return self.pw(x)


class BasicConv2d(nn.Module):
    def __init__(self, in_channels, out_channels, **kwargs):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, bias=False, **kwargs)
        self.bn = nn.BatchNorm2d(out_channels, eps=0.001)

    def forward(self, x):
        x = self.conv(x)
        x = self.bn(x)
        return F.relu(x, inplace=True)


class InceptionC(nn.Module):
    """torchvision Inception-v3's InceptionC: factorised 1x7 / 7x1 branches and an avg-pool branch."""

    def __init__(self, in_channels, channels_7x7):
        super().__init__()
        c7 = channels_7x7
        self.branch1x1 = BasicConv2d(in_channels, 8, kernel_size=1)
        self.branch7x7_1 = BasicConv2d(in_channels, c7, kernel_size=1)
        self.branch7x7_2 = BasicConv2d(c7, c7, kernel_size=(1, 7), padding=(0, 3))
        self.branch7x7_3 = BasicConv2d(c7, 8, kernel_size=(7, 1), padding=(3, 0))
        self.branch7x7dbl_1 = BasicConv2d(in_channels, c7, kernel_size=1)
        self.branch7x7dbl_2 = BasicConv2d(c7, c7, kernel_size=(7, 1), padding=(3, 0))
        self.branch7x7dbl_3 = BasicConv2d(c7, 8, kernel_size=(1, 7), padding=(0, 3))
        self.branch_pool = BasicConv2d(in_channels, 8, kernel_size=1)

    def forward(self, x):
        branch1x1 = self.branch1x1(x)
        branch7x7 = self.branch7x7_3(self.branch7x7_2(self.branch7x7_1(x)))
        branch7x7dbl = self.branch7x7dbl_3(self.branch7x7dbl_2(self.branch7x7dbl_1(x)))
        branch_pool = F.avg_pool2d(x, kernel_size=3, stride=1, padding=1)
        branch_pool = self.branch_pool(branch_pool)
        outputs = [branch1x1, branch7x7, branch7x7dbl, branch_pool]
        return torch.cat(outputs, 1)


class InceptionTiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.Conv2d_1a_3x3 = BasicConv2d(3, 8, kernel_size=3, stride=2)
        self.maxpool1 = nn.MaxPool2d(kernel_size=3, stride=2)
        self.Mixed = InceptionC(8, 6)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.dropout = nn.Dropout(p=0.5)
        self.fc = nn.Linear(32, 7)

    def forward(self, x):
        x = self.maxpool1(self.Conv2d_1a_3x3(x))
        x = self.Mixed(x)
        x = self.avgpool(x)
        x = self.dropout(x)
        x = torch.flatten(x, 1)
        return self.fc(x)


# ----------------------------------------------------------------------------- padding modules (pix2pix ResnetBlock)
class ResnetBlockPad(nn.Module):
    def __init__(self, dim, padding_type):
        super().__init__()
        conv_block = []
        for i in range(2):
            if padding_type == "reflect":
                conv_block += [nn.ReflectionPad2d(1)]
            elif padding_type == "replicate":
                conv_block += [nn.ReplicationPad2d(1)]
            conv_block += [nn.Conv2d(dim, dim, kernel_size=3, padding=0, bias=True), nn.InstanceNorm2d(dim)]
            if i == 0:
                conv_block += [nn.ReLU(True)]
        self.conv_block = nn.Sequential(*conv_block)

    def forward(self, x):
        return x + self.conv_block(x)


class Pix2PixTiny(nn.Module):
    def __init__(self):
        super().__init__()
        model = [nn.ReflectionPad2d(3), nn.Conv2d(3, 8, kernel_size=7, padding=0), nn.InstanceNorm2d(8),
                 nn.ReLU(True),
                 nn.Conv2d(8, 16, kernel_size=3, stride=2, padding=1), nn.InstanceNorm2d(16), nn.ReLU(True),
                 ResnetBlockPad(16, "reflect"), ResnetBlockPad(16, "replicate"),
                 nn.ConvTranspose2d(16, 8, kernel_size=3, stride=2, padding=1, output_padding=1),
                 nn.InstanceNorm2d(8), nn.ReLU(True),
                 nn.ReflectionPad2d(3), nn.Conv2d(8, 3, kernel_size=7, padding=0), nn.Tanh()]
        self.model = nn.Sequential(*model)

    def forward(self, input):
        return self.model(input)


class TFSamePad(nn.Module):
    """TF 'SAME' at stride 2 written as nn.ZeroPad2d((0, 1, 0, 1)) before a padding-0 conv, and YOLOv3-tiny's
    ZeroPad2d + MaxPool2d(2, stride=1) to keep the size."""

    def __init__(self):
        super().__init__()
        self.pad = nn.ZeroPad2d((0, 1, 0, 1))
        self.conv = nn.Conv2d(3, 8, 3, stride=2, padding=0)
        self.act = nn.LeakyReLU(0.1)
        self.pool_pad = nn.ZeroPad2d((0, 1, 0, 1))
        self.pool = nn.MaxPool2d(2, stride=1)
        self.conv2 = nn.Conv2d(8, 8, 3, padding=1)

    def forward(self, x):
        x = self.act(self.conv(self.pad(x)))
        x = self.pool(self.pool_pad(x))
        return self.act(self.conv2(x))


# ----------------------------------------------------------------------------- ResNet-D
class BottleneckD(nn.Module):
    """timm ResNet-D: deep stem, avg-pool (ceil_mode, count_include_pad=False) + 1x1 conv shortcut."""
    expansion = 2

    def __init__(self, inplanes, planes, stride=1, downsample=None):
        super().__init__()
        width = planes
        self.conv1 = nn.Conv2d(inplanes, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.act1 = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(width, width, 3, stride, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.act2 = nn.ReLU(inplace=True)
        self.conv3 = nn.Conv2d(width, planes * self.expansion, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(planes * self.expansion)
        self.act3 = nn.ReLU(inplace=True)
        self.downsample = downsample

    def forward(self, x):
        shortcut = x
        x = self.act1(self.bn1(self.conv1(x)))
        x = self.act2(self.bn2(self.conv2(x)))
        x = self.bn3(self.conv3(x))
        if self.downsample is not None:
            shortcut = self.downsample(shortcut)
        x += shortcut
        x = self.act3(x)
        return x


def downsample_avg(in_channels, out_channels, stride):
    pool = nn.AvgPool2d(2, stride, ceil_mode=True, count_include_pad=False) if stride > 1 else nn.Identity()
    return nn.Sequential(pool, nn.Conv2d(in_channels, out_channels, 1, stride=1, padding=0, bias=False),
                         nn.BatchNorm2d(out_channels))


class ResNetDTiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Sequential(nn.Conv2d(3, 8, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(8),
                                   nn.ReLU(inplace=True), nn.Conv2d(8, 8, 3, padding=1, bias=False),
                                   nn.BatchNorm2d(8), nn.ReLU(inplace=True),
                                   nn.Conv2d(8, 16, 3, padding=1, bias=False))
        self.bn1 = nn.BatchNorm2d(16)
        self.act1 = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        self.layer1 = BottleneckD(16, 8, 1, None)
        self.layer2 = BottleneckD(16, 12, 2, downsample_avg(16, 24, 2))
        self.fc = nn.Linear(24, 5)

    def forward(self, x):
        x = self.maxpool(self.act1(self.bn1(self.conv1(x))))
        x = self.layer2(self.layer1(x))
        x = x.mean((2, 3), keepdim=False)  # timm SelectAdaptivePool2d(flatten) fast path
        return self.fc(x)


# ----------------------------------------------------------------------------- adaptive pooling to non-1 sizes
class VGGAdaptive(nn.Module):
    """torchvision VGG / AlexNet head: AdaptiveAvgPool2d((k, k)) to a size that does not divide the
    feature map (or is larger than it), flatten, an MLP with dropout."""

    def __init__(self, pool=(3, 3), num_classes=4):
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(True), nn.MaxPool2d(2, 2),
                                      nn.Conv2d(8, 8, 3, padding=1), nn.ReLU(True), nn.MaxPool2d(2, 2))
        self.avgpool = nn.AdaptiveAvgPool2d(pool)
        self.classifier = nn.Sequential(nn.Linear(8 * pool[0] * pool[1], 16), nn.ReLU(True), nn.Dropout(p=0.5),
                                        nn.Linear(16, num_classes))

    def forward(self, x):
        x = self.features(x)
        x = self.avgpool(x)
        x = torch.flatten(x, 1)
        return self.classifier(x)


class PyramidPooling(nn.Module):
    """PSPNet's pyramid pooling: F.adaptive_avg_pool2d to 1, 2, 3, 6 bins, 1x1 conv, bilinear back up."""

    def __init__(self, c=8):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, c, 3, 2, 1), nn.ReLU())
        self.bins = (1, 2, 3, 6)
        self.stages = nn.ModuleList([nn.Sequential(nn.Conv2d(c, c // 4, 1, bias=False), nn.BatchNorm2d(c // 4),
                                                   nn.ReLU()) for _ in self.bins])
        self.bottleneck = nn.Conv2d(c + c // 4 * len(self.bins), c, 3, padding=1)

    def forward(self, x):
        x = self.stem(x)
        h, w = x.size(2), x.size(3)
        out = [x]
        for b, stage in zip(self.bins, self.stages):
            y = stage(F.adaptive_avg_pool2d(x, b))
            out.append(F.interpolate(y, size=(h, w), mode="bilinear", align_corners=True))
        return self.bottleneck(torch.cat(out, 1))


# ----------------------------------------------------------------------------- misc deployment idioms


class NormalizedInput(nn.Module):
    """Input normalisation inside the model with (1, 3, 1, 1) mean / std buffers, MNIST-style CNN with
    F.max_pool2d, Dropout2d and log_softmax."""

    def __init__(self):
        super().__init__()
        self.register_buffer("mean", torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1))
        self.register_buffer("std", torch.tensor([0.229, 0.224, 0.225]).view(1, 3, 1, 1))
        self.conv1 = nn.Conv2d(3, 8, 3, 1)
        self.conv2 = nn.Conv2d(8, 16, 3, 1)
        self.dropout1 = nn.Dropout2d(0.25)
        self.fc1 = nn.Linear(16 * 6 * 6, 16)
        self.fc2 = nn.Linear(16, 10)

    def forward(self, x):
        x = (x - self.mean) / self.std
        x = F.relu(self.conv1(x))
        x = F.relu(self.conv2(x))
        x = F.max_pool2d(x, 2)
        x = self.dropout1(x)
        x = torch.flatten(x, 1)
        x = F.relu(self.fc1(x))
        return F.log_softmax(self.fc2(x), dim=1)


class StdConvNet(nn.Module):
    """BiT's StdConv2d: the weight standardised in forward with F.batch_norm over a reshaped parameter."""

    def __init__(self):
        super().__init__()
        self.conv1 = StdConv2d(3, 8, 3, stride=2, padding=1, bias=False)
        self.gn1 = nn.GroupNorm(2, 8)
        self.conv2 = StdConv2d(8, 8, 3, padding=1, bias=False)

    def forward(self, x):
        return self.conv2(F.relu(self.gn1(self.conv1(x))))


class StdConv2d(nn.Conv2d):
    def __init__(self, *args, eps=1e-6, **kwargs):
        super().__init__(*args, **kwargs)
        self.eps = eps

    def forward(self, x):
        weight = F.batch_norm(self.weight.reshape(1, self.out_channels, -1), None, None, training=True,
                              momentum=0.0, eps=self.eps).reshape_as(self.weight)
        return F.conv2d(x, weight, self.bias, self.stride, self.padding, self.dilation, self.groups)


class LayerScaleDilated(nn.Module):
    """Dilated residual stack (padding = dilation), layer scale as a (C, 1, 1) parameter, channels-last
    input conversion inside forward."""

    def __init__(self, c=8):
        super().__init__()
        self.stem = nn.Conv2d(3, c, 3, padding=1)
        self.convs = nn.ModuleList([nn.Conv2d(c, c, 3, padding=d, dilation=d) for d in (1, 2, 4)])
        self.gamma = nn.Parameter(1e-1 * torch.ones(c, 1, 1))
        self.head = nn.Conv2d(c, 2, 1)

    def forward(self, x):
        x = self.stem(x.contiguous(memory_format=torch.channels_last))
        for conv in self.convs:
            x = x + self.gamma * F.gelu(conv(x))
        return self.head(x)


class UpsampleModules(nn.Module):
    """The deprecated upsampling modules and a bilinear align_corners=True on an odd size."""

    def __init__(self):
        super().__init__()
        self.down = nn.Sequential(nn.Conv2d(3, 8, 3, 2, 1), nn.ReLU())
        self.up_nn = nn.UpsamplingNearest2d(scale_factor=2)
        self.up_bl = nn.UpsamplingBilinear2d(scale_factor=2)
        self.out = nn.Conv2d(16, 2, 3, padding=1)

    def forward(self, x):
        y = self.down(x)
        z = torch.cat([self.up_nn(y), self.up_bl(y)], dim=1)
        z = F.interpolate(z, size=(x.shape[2] + 1, x.shape[3] + 1), mode="bilinear", align_corners=True)
        return self.out(z)


VISION = [
    ("repvgg_train_time", RepVGGTiny, (1, 3, 16, 16)),
    ("mobileone_train_time", MobileOneTiny, (1, 3, 16, 16)),
    ("ghostnetv2_dfc_attention", GhostNetV2Tiny, (1, 3, 16, 16)),
    ("mnasnet_drop_path_eval", MnasNetTiny, (1, 3, 16, 16)),
    ("regnety_se_group_conv", RegNetYTiny, (1, 3, 16, 16)),
    ("densenet_concat_growth", DenseNetTiny, (1, 3, 16, 16)),
    ("squeezenet_1_1", SqueezeNetTiny, (1, 3, 32, 32)),
    ("shufflenetv2_chunk_shuffle", ShuffleNetV2Tiny, (1, 3, 32, 32)),
    ("yolo_focus_c3_sppf_c2f_detect", YoloTiny, (1, 3, 32, 32)),
    ("fpn_top_down_dict", TinyFPN, (1, 3, 32, 32)),
    ("unet_convtranspose_pad_cat", UNetTiny, (1, 3, 16, 16)),
    ("espcn_pixel_unshuffle_shuffle", ESPCN, (1, 3, 16, 16)),
    ("activation_mix_cnn", ActivationCNN, (1, 3, 16, 16)),
    ("groupnorm_instancenorm_resblock", GNResBlock, (1, 3, 16, 16)),
    ("coordinate_attention", CoordAttNet, (1, 3, 16, 16)),
    ("cbam_linear_mlp_expand_as", CBAMNet, (1, 3, 16, 16)),
    ("deeplab_aspp_align_false", DeepLabTiny, (1, 3, 32, 32)),
    ("deeplab_aspp_align_true", lambda: DeepLabTiny(align_corners=True), (1, 3, 32, 32)),
    ("depthwise_multiplier_2", DepthMultiplierNet, (1, 3, 16, 16)),
    ("inception_1x7_7x1", InceptionTiny, (1, 3, 32, 32)),
    ("pix2pix_reflect_replicate_pad", Pix2PixTiny, (1, 3, 16, 16)),
    ("tf_same_zeropad_yolov3_tiny_pool", TFSamePad, (1, 3, 16, 16)),
    ("resnet_d_avgpool_shortcut", ResNetDTiny, (1, 3, 32, 32)),
    ("alexnet_adaptive_pool_larger", lambda: VGGAdaptive(pool=(6, 6)), (1, 3, 16, 16)),
    ("pspnet_pyramid_pooling", PyramidPooling, (1, 3, 24, 24)),
    ("normalized_input_mnist_style", NormalizedInput, (1, 3, 16, 16)),
    ("bit_std_conv_weight_standardisation", StdConvNet, (1, 3, 16, 16)),
    ("dilated_layer_scale_channels_last", LayerScaleDilated, (1, 3, 16, 16)),
    ("upsampling_modules_odd_size", UpsampleModules, (1, 3, 16, 16)),
]


def build(name):
    """The seeded model (eval mode, BatchNorm statistics set) of a VISION entry."""
    factory = {n: f for n, f, _ in VISION}[name]
    torch.manual_seed(0)
    return randomize_bn(factory()).eval()


# ============================================================================ batch 2: detectors, attention, odd idioms
class BlazeBlock(nn.Module):
    """MediaPipe BlazeFace's BlazeBlock: F.pad (0, 2, 0, 2) before a stride-2 depthwise conv with
    padding 0, a max-pool shortcut, and the shortcut's missing channels added with F.pad over C."""

    def __init__(self, in_channels, out_channels, kernel_size=3, stride=1):
        super().__init__()
        self.stride = stride
        self.channel_pad = out_channels - in_channels
        padding = 0 if stride == 2 else (kernel_size - 1) // 2
        if stride == 2:
            self.max_pool = nn.MaxPool2d(kernel_size=stride, stride=stride)
        self.convs = nn.Sequential(
            nn.Conv2d(in_channels, in_channels, kernel_size, stride, padding, groups=in_channels, bias=True),
            nn.Conv2d(in_channels, out_channels, 1, 1, 0, bias=True),
        )
        self.act = nn.ReLU(inplace=True)

    def forward(self, x):
        if self.stride == 2:
            h = F.pad(x, (0, 2, 0, 2), "constant", 0)
            x = self.max_pool(x)
        else:
            h = x
        if self.channel_pad > 0:
            x = F.pad(x, (0, 0, 0, 0, 0, self.channel_pad), "constant", 0)
        return self.act(self.convs(h) + x)


class BlazeFaceTiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.backbone = nn.Sequential(
            nn.Conv2d(3, 8, 5, 2, 0, bias=True), nn.ReLU(inplace=True),
            BlazeBlock(8, 8), BlazeBlock(8, 12, 5), BlazeBlock(12, 16, stride=2), BlazeBlock(16, 16, 5),
        )
        self.classifier = nn.Conv2d(16, 2, 1, bias=True)
        self.regressor = nn.Conv2d(16, 2 * 4, 1, bias=True)

    def forward(self, x):
        x = F.pad(x, (1, 2, 1, 2), "constant", 0)
        b = x.shape[0]
        x = self.backbone(x)
        c = self.classifier(x).permute(0, 2, 3, 1).reshape(b, -1, 1)
        r = self.regressor(x).permute(0, 2, 3, 1).reshape(b, -1, 4)
        return [r, c]


class FOMO(nn.Module):
    """Edge Impulse FOMO: a truncated MobileNetV2-ish trunk, a 1x1 logits head, per-cell softmax over the
    classes, the output as NHWC."""

    def __init__(self, classes=3):
        super().__init__()
        self.trunk = nn.Sequential(
            nn.Conv2d(1, 8, 3, 2, 1, bias=False), nn.BatchNorm2d(8), nn.ReLU6(inplace=True),
            nn.Conv2d(8, 8, 3, 1, 1, groups=8, bias=False), nn.BatchNorm2d(8), nn.ReLU6(inplace=True),
            nn.Conv2d(8, 16, 1, bias=False), nn.BatchNorm2d(16),
            nn.Conv2d(16, 16, 3, 2, 1, groups=16, bias=False), nn.BatchNorm2d(16), nn.ReLU6(inplace=True),
            nn.Conv2d(16, 16, 1, bias=False), nn.BatchNorm2d(16))
        self.head = nn.Sequential(nn.Conv2d(16, 16, 1), nn.ReLU(), nn.Conv2d(16, classes, 1))

    def forward(self, x):
        logits = self.head(self.trunk(x))
        return torch.softmax(logits, dim=1).permute(0, 2, 3, 1)


class Integral(nn.Module):
    """NanoDet / GFL's Integral: softmax over the reg_max + 1 bins of each side, then F.linear with a
    linspace projection buffer."""

    def __init__(self, reg_max=7):
        super().__init__()
        self.reg_max = reg_max
        self.register_buffer("project", torch.linspace(0, self.reg_max, self.reg_max + 1))

    def forward(self, x):
        shape = x.size()
        x = F.softmax(x.reshape(*shape[:-1], 4, self.reg_max + 1), dim=-1)
        x = F.linear(x, self.project.type_as(x)).reshape(*shape[:-1], 4)
        return x


class NanoDetHead(nn.Module):
    def __init__(self, num_classes=2, reg_max=7):
        super().__init__()
        self.num_classes = num_classes
        self.reg_max = reg_max
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, 2, 1), nn.BatchNorm2d(16), nn.LeakyReLU(0.1),
                                  nn.Conv2d(16, 16, 3, 2, 1, groups=16), nn.BatchNorm2d(16), nn.LeakyReLU(0.1))
        self.gfl_cls = nn.Conv2d(16, num_classes + 4 * (reg_max + 1), 1)
        self.distribution_project = Integral(reg_max)

    def forward(self, x):
        output = self.gfl_cls(self.stem(x)).flatten(start_dim=2).permute(0, 2, 1)  # (N, HW, C)
        cls_scores, bbox_preds = output.split([self.num_classes, 4 * (self.reg_max + 1)], dim=-1)
        return cls_scores.sigmoid(), self.distribution_project(bbox_preds)


class L2Norm(nn.Module):
    """SSD's L2Norm: x / ||x||_2 over channels, times a per-channel weight."""

    def __init__(self, n_channels, scale):
        super().__init__()
        self.eps = 1e-10
        self.weight = nn.Parameter(torch.full((n_channels,), float(scale)))

    def forward(self, x):
        norm = x.pow(2).sum(dim=1, keepdim=True).sqrt() + self.eps
        x = torch.div(x, norm)
        return self.weight.unsqueeze(0).unsqueeze(2).unsqueeze(3).expand_as(x) * x


class SSDLite(nn.Module):
    def __init__(self, num_classes=3, anchors=(2, 3)):
        super().__init__()
        self.num_classes = num_classes
        self.l1 = nn.Sequential(nn.Conv2d(3, 16, 3, 2, 1), nn.ReLU(inplace=True), nn.Conv2d(16, 16, 3, 2, 1),
                                nn.ReLU(inplace=True))
        self.l2 = nn.Sequential(nn.Conv2d(16, 16, 3, 2, 1), nn.ReLU(inplace=True))
        self.L2Norm = L2Norm(16, 2.0)
        self.loc = nn.ModuleList([nn.Conv2d(16, a * 4, 3, padding=1) for a in anchors])
        self.conf = nn.ModuleList([nn.Conv2d(16, a * num_classes, 3, padding=1) for a in anchors])

    def forward(self, x):
        sources, loc, conf = [], [], []
        x = self.l1(x)
        sources.append(self.L2Norm(x))
        x = self.l2(x)
        sources.append(x)
        for (x, l, c) in zip(sources, self.loc, self.conf):
            loc.append(l(x).permute(0, 2, 3, 1).contiguous())
            conf.append(c(x).permute(0, 2, 3, 1).contiguous())
        loc = torch.cat([o.view(o.size(0), -1) for o in loc], 1)
        conf = torch.cat([o.view(o.size(0), -1) for o in conf], 1)
        return loc.view(loc.size(0), -1, 4), F.softmax(conf.view(conf.size(0), -1, self.num_classes), dim=-1)


# lukemelas EfficientNet-PyTorch idioms
class SwishImplementation(torch.autograd.Function):
    @staticmethod
    def forward(ctx, i):
        result = i * torch.sigmoid(i)
        ctx.save_for_backward(i)
        return result

    @staticmethod
    def backward(ctx, grad_output):
        i = ctx.saved_tensors[0]
        sigmoid_i = torch.sigmoid(i)
        return grad_output * (sigmoid_i * (1 + i * (1 - sigmoid_i)))


class MemoryEfficientSwish(nn.Module):
    def forward(self, x):
        return SwishImplementation.apply(x)


class Conv2dDynamicSamePadding(nn.Conv2d):
    def __init__(self, in_channels, out_channels, kernel_size, stride=1, dilation=1, groups=1, bias=True):
        super().__init__(in_channels, out_channels, kernel_size, stride, 0, dilation, groups, bias)
        self.stride = self.stride if len(self.stride) == 2 else [self.stride[0]] * 2

    def forward(self, x):
        ih, iw = x.size()[-2:]
        kh, kw = self.weight.size()[-2:]
        sh, sw = self.stride
        oh, ow = math.ceil(ih / sh), math.ceil(iw / sw)
        pad_h = max((oh - 1) * self.stride[0] + (kh - 1) * self.dilation[0] + 1 - ih, 0)
        pad_w = max((ow - 1) * self.stride[1] + (kw - 1) * self.dilation[1] + 1 - iw, 0)
        if pad_h > 0 or pad_w > 0:
            x = F.pad(x, [pad_w // 2, pad_w - pad_w // 2, pad_h // 2, pad_h - pad_h // 2])
        return F.conv2d(x, self.weight, self.bias, self.stride, self.padding, self.dilation, self.groups)


def drop_connect(inputs, p, training):
    assert 0 <= p <= 1, "p must be in range of [0,1]"
    if not training:
        return inputs
    batch_size = inputs.shape[0]
    keep_prob = 1 - p
    random_tensor = keep_prob + torch.rand([batch_size, 1, 1, 1], dtype=inputs.dtype, device=inputs.device)
    return inputs / keep_prob * torch.floor(random_tensor)


class MBConvBlockLM(nn.Module):
    def __init__(self, inp, oup, expand_ratio=4, kernel_size=3, stride=1, se_ratio=0.25, id_skip=True):
        super().__init__()
        self.id_skip = id_skip
        self.stride = stride
        self.inp, self.oup = inp, oup
        self._bn_mom, self._bn_eps = 0.01, 1e-3
        hid = inp * expand_ratio
        self._expand_conv = Conv2dDynamicSamePadding(inp, hid, 1, bias=False)
        self._bn0 = nn.BatchNorm2d(hid, momentum=self._bn_mom, eps=self._bn_eps)
        self._depthwise_conv = Conv2dDynamicSamePadding(hid, hid, kernel_size, stride=stride, groups=hid, bias=False)
        self._bn1 = nn.BatchNorm2d(hid, momentum=self._bn_mom, eps=self._bn_eps)
        num_squeezed = max(1, int(inp * se_ratio))
        self._se_reduce = Conv2dDynamicSamePadding(hid, num_squeezed, 1)
        self._se_expand = Conv2dDynamicSamePadding(num_squeezed, hid, 1)
        self._project_conv = Conv2dDynamicSamePadding(hid, oup, 1, bias=False)
        self._bn2 = nn.BatchNorm2d(oup, momentum=self._bn_mom, eps=self._bn_eps)
        self._swish = MemoryEfficientSwish()

    def forward(self, inputs, drop_connect_rate=0.2):
        x = self._swish(self._bn0(self._expand_conv(inputs)))
        x = self._swish(self._bn1(self._depthwise_conv(x)))
        x_squeezed = F.adaptive_avg_pool2d(x, 1)
        x_squeezed = self._se_expand(self._swish(self._se_reduce(x_squeezed)))
        x = torch.sigmoid(x_squeezed) * x
        x = self._bn2(self._project_conv(x))
        if self.id_skip and self.stride == 1 and self.inp == self.oup:
            if drop_connect_rate:
                x = drop_connect(x, p=drop_connect_rate, training=self.training)
            x = x + inputs
        return x


class EfficientNetLM(nn.Module):
    def __init__(self):
        super().__init__()
        self._conv_stem = Conv2dDynamicSamePadding(3, 8, 3, stride=2, bias=False)
        self._bn0 = nn.BatchNorm2d(8, momentum=0.01, eps=1e-3)
        self._blocks = nn.ModuleList([MBConvBlockLM(8, 8, 1), MBConvBlockLM(8, 16, 4, 5, 2), MBConvBlockLM(16, 16)])
        self._avg_pooling = nn.AdaptiveAvgPool2d(1)
        self._dropout = nn.Dropout(0.2)
        self._fc = nn.Linear(16, 4)
        self._swish = MemoryEfficientSwish()

    def forward(self, inputs):
        x = self._swish(self._bn0(self._conv_stem(inputs)))
        for idx, block in enumerate(self._blocks):
            drop_connect_rate = 0.2 * float(idx) / len(self._blocks)
            x = block(x, drop_connect_rate=drop_connect_rate)
        x = self._avg_pooling(x)
        x = x.flatten(start_dim=1)
        x = self._dropout(x)
        return self._fc(x)


@torch.jit.script
def hard_sigmoid_jit(x, inplace: bool = False):
    return F.relu6(x + 3.0).div(6.0)


class JitActivationNet(nn.Module):
    """A timm-style @torch.jit.script activation called from forward."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.conv2 = nn.Conv2d(8, 4, 1)

    def forward(self, x):
        x = self.conv(x)
        return self.conv2(x * hard_sigmoid_jit(x))


class GeM(nn.Module):
    """Generalised mean pooling with a learnable exponent (image retrieval)."""

    def __init__(self, p=3.0, eps=1e-6):
        super().__init__()
        self.p = nn.Parameter(torch.ones(1) * p)
        self.eps = eps

    def forward(self, x):
        return F.avg_pool2d(x.clamp(min=self.eps).pow(self.p), (x.size(-2), x.size(-1))).pow(1.0 / self.p)


class GeMNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(3, 16, 3, 2, 1), nn.ReLU(), nn.Conv2d(16, 16, 3, 2, 1), nn.ReLU())
        self.pool = GeM()
        self.fc = nn.Linear(16, 8)

    def forward(self, x):
        return F.normalize(self.fc(self.pool(self.body(x)).view(x.size(0), -1)), p=2, dim=1)


class AddCoords(nn.Module):
    """CoordConv: x/y coordinate channels made in forward with torch.arange, repeat and cat."""

    def forward(self, input_tensor):
        batch_size, _, x_dim, y_dim = input_tensor.size()
        xx_channel = torch.arange(x_dim).repeat(1, y_dim, 1)
        yy_channel = torch.arange(y_dim).repeat(1, x_dim, 1).transpose(1, 2)
        xx_channel = xx_channel.float() / (x_dim - 1)
        yy_channel = yy_channel.float() / (y_dim - 1)
        xx_channel = xx_channel * 2 - 1
        yy_channel = yy_channel * 2 - 1
        xx_channel = xx_channel.repeat(batch_size, 1, 1, 1).transpose(2, 3)
        yy_channel = yy_channel.repeat(batch_size, 1, 1, 1).transpose(2, 3)
        return torch.cat([input_tensor, xx_channel.type_as(input_tensor), yy_channel.type_as(input_tensor)], dim=1)


class CoordConvNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.add_coords = AddCoords()
        self.conv = nn.Conv2d(5, 8, 3, padding=1)
        self.conv2 = nn.Conv2d(8, 2, 3, stride=2, padding=1)

    def forward(self, x):
        return self.conv2(F.relu(self.conv(self.add_coords(x))))


class BlurPool(nn.Module):
    """Anti-aliased downsampling (Zhang 2019): reflect pad, a fixed [1, 2, 1] x [1, 2, 1] / 16 depthwise
    filter buffer, F.conv2d with stride 2 and groups = channels."""

    def __init__(self, channels, filt_size=3, stride=2):
        super().__init__()
        self.channels = channels
        self.stride = stride
        self.pad = nn.ReflectionPad2d([(filt_size - 1) // 2, filt_size // 2] * 2)
        a = torch.tensor([1.0, 2.0, 1.0])
        filt = a[:, None] * a[None, :]
        filt = filt / torch.sum(filt)
        self.register_buffer("filt", filt[None, None, :, :].repeat((self.channels, 1, 1, 1)))

    def forward(self, inp):
        return F.conv2d(self.pad(inp), self.filt, stride=self.stride, groups=inp.shape[1])


class BlurPoolNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.pool = nn.Sequential(nn.MaxPool2d(kernel_size=2, stride=1), BlurPool(8))
        self.conv2 = nn.Conv2d(8, 8, 3, padding=1)
        self.blur = BlurPool(8)

    def forward(self, x):
        x = self.pool(F.relu(self.conv(x)))
        return self.blur(F.relu(self.conv2(x)))


class SpatialSoftmax(nn.Module):
    """Deep spatial autoencoder keypoints: softmax over H*W per channel (a learned temperature), expected
    x / y with pos buffers made by np.meshgrid-style torch.meshgrid."""

    def __init__(self, height, width, channel):
        super().__init__()
        self.height, self.width, self.channel = height, width, channel
        pos_x, pos_y = torch.meshgrid(torch.linspace(-1.0, 1.0, self.height), torch.linspace(-1.0, 1.0, self.width),
                                      indexing="xy")
        self.register_buffer("pos_x", pos_x.reshape(self.height * self.width))
        self.register_buffer("pos_y", pos_y.reshape(self.height * self.width))
        self.temperature = nn.Parameter(torch.ones(1) * 0.25)

    def forward(self, feature):
        feature = feature.view(-1, self.height * self.width)
        softmax_attention = F.softmax(feature / self.temperature, dim=-1)
        expected_x = torch.sum(self.pos_x * softmax_attention, dim=1, keepdim=True)
        expected_y = torch.sum(self.pos_y * softmax_attention, dim=1, keepdim=True)
        expected_xy = torch.cat([expected_x, expected_y], 1)
        return expected_xy.view(-1, self.channel * 2)


class KeypointNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Sequential(nn.Conv2d(3, 8, 3, 2, 1), nn.ReLU(), nn.Conv2d(8, 4, 3, 1, 1))
        self.ss = SpatialSoftmax(8, 8, 4)

    def forward(self, x):
        return self.ss(self.conv(x))


class NonLocalBlock(nn.Module):
    """Non-local (embedded Gaussian) block: theta/phi/g 1x1 convs, view + permute, matmul, softmax,
    matmul, view back, W conv with BN, residual; the phi / g branches sub-sampled by max-pool."""

    def __init__(self, in_channels=16, inter_channels=8):
        super().__init__()
        self.inter_channels = inter_channels
        self.g = nn.Sequential(nn.Conv2d(in_channels, inter_channels, 1), nn.MaxPool2d(2))
        self.theta = nn.Conv2d(in_channels, inter_channels, 1)
        self.phi = nn.Sequential(nn.Conv2d(in_channels, inter_channels, 1), nn.MaxPool2d(2))
        self.W = nn.Sequential(nn.Conv2d(inter_channels, in_channels, 1), nn.BatchNorm2d(in_channels))

    def forward(self, x):
        batch_size = x.size(0)
        g_x = self.g(x).view(batch_size, self.inter_channels, -1)
        g_x = g_x.permute(0, 2, 1)
        theta_x = self.theta(x).view(batch_size, self.inter_channels, -1)
        theta_x = theta_x.permute(0, 2, 1)
        phi_x = self.phi(x).view(batch_size, self.inter_channels, -1)
        f = torch.matmul(theta_x, phi_x)
        f_div_C = F.softmax(f, dim=-1)
        y = torch.matmul(f_div_C, g_x)
        y = y.permute(0, 2, 1).contiguous()
        y = y.view(batch_size, self.inter_channels, *x.size()[2:])
        return self.W(y) + x


class NonLocalNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, 2, 1), nn.ReLU())
        self.nl = NonLocalBlock()

    def forward(self, x):
        return self.nl(self.stem(x))


class ContextBlock(nn.Module):
    """GCNet's global context block: attention pooling (1x1 conv mask, softmax over HW, matmul), then a
    bottleneck transform with LayerNorm over [C, 1, 1], added to x."""

    def __init__(self, inplanes=16, ratio=0.25):
        super().__init__()
        planes = int(inplanes * ratio)
        self.conv_mask = nn.Conv2d(inplanes, 1, kernel_size=1)
        self.softmax = nn.Softmax(dim=2)
        self.channel_add_conv = nn.Sequential(nn.Conv2d(inplanes, planes, 1), nn.LayerNorm([planes, 1, 1]),
                                              nn.ReLU(inplace=True), nn.Conv2d(planes, inplanes, 1))

    def spatial_pool(self, x):
        batch, channel, height, width = x.size()
        input_x = x.view(batch, channel, height * width).unsqueeze(1)
        context_mask = self.conv_mask(x).view(batch, 1, height * width)
        context_mask = self.softmax(context_mask).unsqueeze(-1)
        context = torch.matmul(input_x, context_mask)
        return context.view(batch, channel, 1, 1)

    def forward(self, x):
        context = self.spatial_pool(x)
        return x + self.channel_add_conv(context)


class GCNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, 2, 1), nn.ReLU())
        self.gc = ContextBlock()

    def forward(self, x):
        return self.gc(self.stem(x))


class SKConv(nn.Module):
    """SKNet selective kernel: two dilated branches, fuse by sum + GAP + fc, softmax over the branch dim."""

    def __init__(self, features=16, M=2, G=4, r=4, L=8):
        super().__init__()
        d = max(int(features / r), L)
        self.M = M
        self.features = features
        self.convs = nn.ModuleList([])
        for i in range(M):
            self.convs.append(nn.Sequential(
                nn.Conv2d(features, features, kernel_size=3, stride=1, padding=1 + i, dilation=1 + i, groups=G,
                          bias=False),
                nn.BatchNorm2d(features), nn.ReLU(inplace=True)))
        self.gap = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Sequential(nn.Conv2d(features, d, kernel_size=1, stride=1, bias=False), nn.BatchNorm2d(d),
                                nn.ReLU(inplace=True))
        self.fcs = nn.ModuleList([nn.Conv2d(d, features, kernel_size=1, stride=1) for _ in range(M)])
        self.softmax = nn.Softmax(dim=1)

    def forward(self, x):
        batch_size = x.shape[0]
        feats = [conv(x) for conv in self.convs]
        feats = torch.cat(feats, dim=1)
        feats = feats.view(batch_size, self.M, self.features, feats.shape[2], feats.shape[3])
        feats_U = torch.sum(feats, dim=1)
        feats_S = self.gap(feats_U)
        feats_Z = self.fc(feats_S)
        attention_vectors = [fc(feats_Z) for fc in self.fcs]
        attention_vectors = torch.cat(attention_vectors, dim=1)
        attention_vectors = attention_vectors.view(batch_size, self.M, self.features, 1, 1)
        attention_vectors = self.softmax(attention_vectors)
        return torch.sum(feats * attention_vectors, dim=1)


class SKNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, 2, 1), nn.ReLU())
        self.sk = SKConv()

    def forward(self, x):
        return self.sk(self.stem(x))


class SqueezeNoDim(nn.Module):
    """``pool(x).squeeze()`` with no dim on batch 1 (drops the batch dim too), a 1-D linear, unsqueeze(0)."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Sequential(nn.Conv2d(3, 8, 3, 2, 1), nn.ReLU())
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(8, 3)

    def forward(self, x):
        x = self.pool(self.conv(x)).squeeze()
        return self.fc(x).unsqueeze(0)


class InterpolateModes(nn.Module):
    """Downsampling with F.interpolate(scale_factor=0.5, bilinear), mode='area', bicubic up, nearest-exact."""

    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(3, 8, 3, padding=1)
        self.c2 = nn.Conv2d(24, 4, 3, padding=1)

    def forward(self, x):
        x = F.relu(self.c1(x))
        a = F.interpolate(x, scale_factor=0.5, mode="bilinear", align_corners=False)
        b = F.interpolate(x, size=(8, 8), mode="area")
        c = F.interpolate(F.max_pool2d(x, 4), scale_factor=2, mode="nearest-exact")
        return self.c2(torch.cat([a, b, c], 1))


class BicubicUp(nn.Module):
    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(3, 4, 3, 2, 1)

    def forward(self, x):
        return F.interpolate(self.c1(x), scale_factor=2, mode="bicubic", align_corners=False)


class SegNetUnpool(nn.Module):
    """SegNet: MaxPool2d(return_indices=True) and MaxUnpool2d with those indices."""

    def __init__(self):
        super().__init__()
        self.enc = nn.Conv2d(3, 8, 3, padding=1)
        self.pool = nn.MaxPool2d(2, 2, return_indices=True)
        self.unpool = nn.MaxUnpool2d(2, 2)
        self.dec = nn.Conv2d(8, 2, 3, padding=1)

    def forward(self, x):
        x = F.relu(self.enc(x))
        size = x.size()
        x, indices = self.pool(x)
        x = self.unpool(x, indices, output_size=size)
        return self.dec(x)


class STN(nn.Module):
    """The PyTorch spatial-transformer tutorial: a localisation net, F.affine_grid, F.grid_sample."""

    def __init__(self):
        super().__init__()
        self.localization = nn.Sequential(nn.Conv2d(1, 4, 5), nn.MaxPool2d(2, stride=2), nn.ReLU(True))
        self.fc_loc = nn.Sequential(nn.Linear(4 * 6 * 6, 8), nn.ReLU(True), nn.Linear(8, 3 * 2))
        self.fc_loc[2].weight.data.zero_()
        self.fc_loc[2].bias.data.copy_(torch.tensor([1, 0, 0, 0, 1, 0], dtype=torch.float))

    def forward(self, x):
        xs = self.localization(x)
        xs = xs.view(-1, 4 * 6 * 6)
        theta = self.fc_loc(xs).view(-1, 2, 3)
        grid = F.affine_grid(theta, x.size(), align_corners=False)
        return F.grid_sample(x, grid, align_corners=False)


class CondConv(nn.Module):
    """Dynamic convolution: the conv weight is a mixture of experts routed by the input."""

    def __init__(self, cin=8, cout=8, experts=3):
        super().__init__()
        self.stem = nn.Conv2d(3, cin, 3, padding=1)
        self.route = nn.Linear(cin, experts)
        self.weight = nn.Parameter(torch.randn(experts, cout * cin * 9) * 0.1)
        self.cin, self.cout = cin, cout

    def forward(self, x):
        x = self.stem(x)
        r = torch.sigmoid(self.route(F.adaptive_avg_pool2d(x, 1).flatten(1)))
        w = (r @ self.weight).view(self.cout, self.cin, 3, 3)
        return F.conv2d(x, w, padding=1)


class LRNNet(nn.Module):
    """AlexNet / GoogLeNet v1: nn.LocalResponseNorm after conv + ReLU + max-pool."""

    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(3, 16, 5, 2, 2), nn.ReLU(inplace=True),
                                      nn.LocalResponseNorm(size=5, alpha=1e-4, beta=0.75, k=2.0),
                                      nn.MaxPool2d(3, 2), nn.Conv2d(16, 8, 3, padding=1), nn.ReLU(inplace=True))

    def forward(self, x):
        return self.features(x)


class SNDiscriminator(nn.Module):
    """A GAN patch discriminator with spectral-norm / weight-norm parametrised convs, LeakyReLU(0.2)."""

    def __init__(self):
        super().__init__()
        sn = torch.nn.utils.parametrizations.spectral_norm
        wn = torch.nn.utils.parametrizations.weight_norm
        self.main = nn.Sequential(sn(nn.Conv2d(3, 8, 4, 2, 1)), nn.LeakyReLU(0.2, inplace=True),
                                  wn(nn.Conv2d(8, 16, 4, 2, 1)), nn.LeakyReLU(0.2, inplace=True),
                                  nn.Conv2d(16, 1, 3, 1, 1))

    def forward(self, x):
        return self.main(x)


class PreActResNet(nn.Module):
    """Pre-activation ResNet with a BatchNorm on the raw input (data_bn) and BN -> ReLU -> conv order."""

    def __init__(self):
        super().__init__()
        self.data_bn = nn.BatchNorm2d(3)
        self.conv1 = nn.Conv2d(3, 16, 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(16)
        self.conv2 = nn.Conv2d(16, 16, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(16)
        self.conv3 = nn.Conv2d(16, 16, 3, 1, 1, bias=False)
        self.bn_final = nn.BatchNorm2d(16)
        self.linear = nn.Linear(16, 10)

    def forward(self, x):
        x = self.conv1(self.data_bn(x))
        out = F.relu(self.bn1(x))
        shortcut = x
        out = self.conv2(out)
        out = self.conv3(F.relu(self.bn2(out)))
        out += shortcut
        out = F.relu(self.bn_final(out))
        out = F.avg_pool2d(out, 4)
        out = out.view(out.size(0), -1)
        return self.linear(F.adaptive_avg_pool1d(out.unsqueeze(1), 16).squeeze(1))


class SamePaddingStrings(nn.Module):
    """padding='same' with an even kernel (asymmetric padding) and padding='valid'."""

    def __init__(self):
        super().__init__()
        self.a = nn.Conv2d(3, 8, 4, padding="same")
        self.b = nn.Conv2d(8, 8, (2, 3), padding="same", dilation=(1, 2))
        self.c = nn.Conv2d(8, 4, 3, padding="valid")

    def forward(self, x):
        return self.c(F.relu(self.b(F.relu(self.a(x)))))


class FCNUpsample(nn.Module):
    """FCN's learned upsampling: a depthwise ConvTranspose2d (groups=C, kernel 4, stride 2, padding 1)
    initialised bilinear, and a crop x[:, :, 1:-1, 1:-1]."""

    def __init__(self, c=4):
        super().__init__()
        self.score = nn.Sequential(nn.Conv2d(3, c, 3, 2, 1), nn.ReLU(), nn.Conv2d(c, c, 1))
        self.up = nn.ConvTranspose2d(c, c, 4, stride=2, padding=1, groups=c, bias=False)
        factor = 2
        center = factor - 0.5
        og = torch.arange(4, dtype=torch.float)
        filt = 1 - torch.abs(og - center) / factor
        w = (filt[:, None] * filt[None, :])[None, None].repeat(c, 1, 1, 1)
        self.up.weight.data.copy_(w)
        self.up2 = nn.ConvTranspose2d(c, 2, 3, stride=2, padding=1, output_padding=1, dilation=1)

    def forward(self, x):
        y = self.up(self.score(x))
        y = y[:, :, 1:-1, 1:-1]
        return self.up2(y)


class AdaptiveMaxOverlap(nn.Module):
    """AdaptiveMaxPool2d((4, 4)) on a 6x6 map (overlapping windows) after a dilated MaxPool2d (8x8 -> 6x6)."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, 2, 1)
        self.pool = nn.AdaptiveMaxPool2d((4, 4))
        self.dpool = nn.MaxPool2d(3, stride=1, padding=1, dilation=2)
        self.fc = nn.Linear(8 * 16, 4)

    def forward(self, x):
        x = self.dpool(F.relu(self.conv(x)))
        return self.fc(self.pool(x).flatten(1))


class MCUNetBlock(nn.Module):
    """MCUNet / ProxylessNAS MBConv with a 7x7 depthwise (expand 6) on a non-square, odd-sized input."""

    def __init__(self):
        super().__init__()
        self.first = nn.Sequential(nn.Conv2d(3, 8, 3, 2, 1, bias=False), nn.BatchNorm2d(8), nn.ReLU6(inplace=True))
        self.mb = nn.Sequential(nn.Conv2d(8, 48, 1, bias=False), nn.BatchNorm2d(48), nn.ReLU6(inplace=True),
                                nn.Conv2d(48, 48, 7, 1, 3, groups=48, bias=False), nn.BatchNorm2d(48),
                                nn.ReLU6(inplace=True), nn.Conv2d(48, 8, 1, bias=False), nn.BatchNorm2d(8))
        self.mb2 = nn.Sequential(nn.Conv2d(8, 24, 1, bias=False), nn.BatchNorm2d(24), nn.ReLU6(inplace=True),
                                 nn.Conv2d(24, 24, 5, 2, 2, groups=24, bias=False), nn.BatchNorm2d(24),
                                 nn.ReLU6(inplace=True), nn.Conv2d(24, 16, 1, bias=False), nn.BatchNorm2d(16))
        self.classifier = nn.Linear(16, 2)

    def forward(self, x):
        x = self.first(x)
        x = x + self.mb(x)
        x = self.mb2(x)
        return self.classifier(x.mean(3).mean(2))


class FxTraced(nn.Module):
    pass


def fx_traced():
    """A torch.fx.symbolic_trace'd GraphModule (what quantization / pruning tools hand over)."""
    m = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
                      nn.Conv2d(8, 4, 3, padding=1))
    return torch.fx.symbolic_trace(randomize_bn(m))


VISION2 = [
    ("blazeface_channel_pad_asym_pad", BlazeFaceTiny, (1, 3, 32, 32)),
    ("fomo_softmax_nhwc", FOMO, (1, 1, 32, 32)),
    ("nanodet_integral_split", NanoDetHead, (1, 3, 16, 16)),
    ("ssd_l2norm_multibox", SSDLite, (1, 3, 32, 32)),
    ("efficientnet_lukemelas_same_pad_autograd_swish", EfficientNetLM, (1, 3, 17, 17)),
    ("jit_script_activation", JitActivationNet, (1, 3, 16, 16)),
    ("gem_pooling_learned_p", GeMNet, (1, 3, 16, 16)),
    ("coordconv_arange_in_forward", CoordConvNet, (1, 3, 16, 16)),
    ("blurpool_fixed_filter", BlurPoolNet, (1, 3, 16, 16)),
    ("spatial_softmax_keypoints", KeypointNet, (1, 3, 16, 16)),
    ("non_local_block", NonLocalNet, (1, 3, 16, 16)),
    ("gcnet_context_block", GCNet, (1, 3, 16, 16)),
    ("sknet_selective_kernel", SKNet, (1, 3, 16, 16)),
    ("squeeze_no_dim_batch1", SqueezeNoDim, (1, 3, 16, 16)),
    ("interpolate_down_area_nearest_exact", InterpolateModes, (1, 3, 16, 16)),
    ("bicubic_upsample", BicubicUp, (1, 3, 16, 16)),
    ("segnet_max_unpool", SegNetUnpool, (1, 3, 16, 16)),
    ("spatial_transformer", STN, (1, 1, 16, 16)),
    ("condconv_dynamic_weights", CondConv, (1, 3, 16, 16)),
    ("alexnet_local_response_norm", LRNNet, (1, 3, 32, 32)),
    ("gan_spectral_weight_norm", SNDiscriminator, (1, 3, 32, 32)),
    ("preact_resnet_input_bn", PreActResNet, (1, 3, 16, 16)),
    ("padding_same_even_kernel_valid", SamePaddingStrings, (1, 3, 16, 16)),
    ("fcn_depthwise_convtranspose_crop", FCNUpsample, (1, 3, 16, 16)),
    ("adaptive_max_overlap_dilated_pool", AdaptiveMaxOverlap, (1, 3, 16, 16)),
    ("mcunet_7x7_non_square_odd", MCUNetBlock, (1, 3, 17, 23)),
    ("fx_symbolic_traced", fx_traced, (1, 3, 16, 16)),
]
VISION += VISION2


# ============================================================================= batch 3: heads, normalisation and inputs


class BNNoStats(nn.Module):
    """BatchNorm2d(track_running_stats=False): in eval it normalises with the statistics of the batch."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8, track_running_stats=False)
        self.out = nn.Conv2d(8, 2, 1)

    def forward(self, x):
        return self.out(F.relu(self.bn(self.conv(x))))


class SegArgmax(nn.Module):
    """A segmentation net returning the class map ``logits.argmax(dim=1)`` (int64)."""

    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 4, 1))

    def forward(self, x):
        logits = self.body(x)
        return logits.argmax(dim=1)


class YoloDecode(nn.Module):
    """YOLOv5 Detect in inference mode: sigmoid, grid + anchor decode on the last dim of a 5-D view, cat."""

    def __init__(self, nc=2, na=2, ch=16):
        super().__init__()
        self.nc, self.no, self.na = nc, nc + 5, na
        self.body = nn.Sequential(nn.Conv2d(3, ch, 3, 2, 1), nn.SiLU(), nn.Conv2d(ch, ch, 3, 2, 1), nn.SiLU())
        self.m = nn.Conv2d(ch, self.no * self.na, 1)
        self.stride = 4.0
        ny = nx = 4
        yv, xv = torch.meshgrid(torch.arange(ny), torch.arange(nx), indexing="ij")
        self.register_buffer("grid", torch.stack((xv, yv), 2).expand(1, na, ny, nx, 2).float() - 0.5)
        anchors = torch.tensor([[10.0, 13.0], [16.0, 30.0]])
        self.register_buffer("anchor_grid", anchors.view(1, na, 1, 1, 2).expand(1, na, ny, nx, 2).clone())

    def forward(self, x):
        x = self.m(self.body(x))
        bs, _, ny, nx = x.shape
        x = x.view(bs, self.na, self.no, ny, nx).permute(0, 1, 3, 4, 2).contiguous()
        xy, wh, conf = x.sigmoid().split((2, 2, self.nc + 1), 4)
        xy = (xy * 2 + self.grid) * self.stride
        wh = (wh * 2) ** 2 * self.anchor_grid
        y = torch.cat((xy, wh, conf), 4)
        return y.view(bs, self.na * nx * ny, self.no)


class MaxPoolSameInf(nn.Module):
    """timm's max_pool2d_same: F.pad with value=-inf, then a padding-0 max pool."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)

    def forward(self, x):
        x = self.conv(x)
        x = F.pad(x, (0, 1, 0, 1), value=-float("inf"))
        return F.max_pool2d(x, 3, 2)


class RGBD(nn.Module):
    """Two inputs (RGB and depth), one stem each, fused by cat + 1x1 conv."""

    def __init__(self):
        super().__init__()
        self.rgb = nn.Sequential(nn.Conv2d(3, 8, 3, 2, 1), nn.ReLU())
        self.depth = nn.Sequential(nn.Conv2d(1, 8, 3, 2, 1), nn.ReLU())
        self.fuse = nn.Conv2d(16, 4, 1)

    def forward(self, rgb, depth):
        return self.fuse(torch.cat([self.rgb(rgb), self.depth(depth)], 1))


class MaskOutput(nn.Module):
    """A binary mask output: ``sigmoid(logits) > 0.5`` (bool)."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 1, 3, padding=1)

    def forward(self, x):
        return torch.sigmoid(self.conv(x)) > 0.5


class FCOSHead(nn.Module):
    """FCOS head: GroupNorm tower, cls / centerness convs, box regression ``exp(scale * reg)`` with a learned scale."""

    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(3, 8, 3, 2, 1), nn.GroupNorm(4, 8), nn.ReLU())
        self.cls = nn.Conv2d(8, 2, 3, padding=1)
        self.reg = nn.Conv2d(8, 4, 3, padding=1)
        self.ctr = nn.Conv2d(8, 1, 3, padding=1)
        self.scale = nn.Parameter(torch.tensor(1.0))

    def forward(self, x):
        f = self.body(x)
        return self.cls(f), torch.exp(self.scale * self.reg(f)), self.ctr(f)


class NHWCInput(nn.Module):
    """A camera-layout [N, H, W, C] input permuted to NCHW in forward."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, 2, 1)
        self.fc = nn.Linear(8, 3)

    def forward(self, x):  # [N, H, W, C] camera layout
        x = x.permute(0, 3, 1, 2)
        x = F.relu(self.conv(x))
        return self.fc(x.mean((2, 3)))


class QuantReady(nn.Module):
    """An eager-mode 'quantization-ready' model: QuantStub / DeQuantStub, FloatFunctional add / cat / mul."""

    def __init__(self):
        super().__init__()
        self.quant = QuantStub()
        self.dequant = DeQuantStub()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(8)
        self.relu1 = nn.ReLU()
        self.conv2 = nn.Conv2d(8, 8, 3, padding=1)
        self.skip_add = nn.quantized.FloatFunctional()
        self.cat = nn.quantized.FloatFunctional()
        self.mul = nn.quantized.FloatFunctional()

    def forward(self, x):
        x = self.quant(x)
        y = self.relu1(self.bn1(self.conv1(x)))
        z = self.skip_add.add(y, self.conv2(y))
        z = self.cat.cat([z, self.mul.mul_scalar(y, 0.5)], 1)
        z = self.skip_add.add_relu(z, z)
        return self.dequant(z)


VISION3 = [
    ("bn_track_running_stats_false", BNNoStats, (1, 3, 16, 16)),
    ("segmentation_argmax_output", SegArgmax, (1, 3, 16, 16)),
    ("yolo_detect_decode_grid_anchors", YoloDecode, (1, 3, 16, 16)),
    ("maxpool_same_pad_neg_inf", MaxPoolSameInf, (1, 3, 16, 16)),
    ("rgbd_two_inputs", RGBD, [(1, 3, 16, 16), (1, 1, 16, 16)]),
    ("bool_mask_output", MaskOutput, (1, 3, 16, 16)),
    ("fcos_head_exp_scale", FCOSHead, (1, 3, 16, 16)),
    ("nhwc_camera_input_permute", NHWCInput, (1, 16, 16, 3)),
    ("quant_ready_stubs_floatfunctional", QuantReady, (1, 3, 16, 16)),
]
VISION += VISION3
