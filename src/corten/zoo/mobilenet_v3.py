"""MobileNetV3-Small (Howard et al., "Searching for MobileNetV3", 2019), written to match
torchvision's ``mobilenet_v3_small`` layer for layer.

Same block configuration (paper Table 2), channel rounding (:func:`make_divisible`), squeeze-and-
excitation layout (``adaptive_avg_pool2d -> 1x1 conv -> ReLU -> 1x1 conv -> hardsigmoid``, squeeze
channels ``make_divisible(expanded // 4, 8)``), BatchNorm ``eps=0.001, momentum=0.01``, weight
initialisation, ``Linear -> Hardswish -> Dropout(0.2) -> Linear`` classifier and module nesting, so
parameter counts (2,542,856 at width 1.0), state-dict keys and exported graphs are torchvision's.
torchvision itself is not a dependency.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Callable

import torch
from torch import nn

from corten.zoo.mobilenet_v2 import make_divisible, torchvision_init

BatchNorm = partial(nn.BatchNorm2d, eps=0.001, momentum=0.01)  # torchvision's MobileNetV3 BatchNorm


@dataclass(frozen=True)
class BlockConfig:
    """One inverted-residual block at width 1.0 (channels are rounded by the width multiplier)."""

    in_channels: int
    kernel: int
    expanded: int
    out_channels: int
    use_se: bool
    use_hardswish: bool  # else ReLU
    stride: int


SMALL_SETTING: tuple[BlockConfig, ...] = (
    BlockConfig(16, 3, 16, 16, True, False, 2),
    BlockConfig(16, 3, 72, 24, False, False, 2),
    BlockConfig(24, 3, 88, 24, False, False, 1),
    BlockConfig(24, 5, 96, 40, True, True, 2),
    BlockConfig(40, 5, 240, 40, True, True, 1),
    BlockConfig(40, 5, 240, 40, True, True, 1),
    BlockConfig(40, 5, 120, 48, True, True, 1),
    BlockConfig(48, 5, 144, 48, True, True, 1),
    BlockConfig(48, 5, 288, 96, True, True, 2),
    BlockConfig(96, 5, 576, 96, True, True, 1),
    BlockConfig(96, 5, 576, 96, True, True, 1),
)
SMALL_LAST_CHANNEL = 1024  # classifier hidden width at width 1.0


class ConvBNActivation(nn.Sequential):
    """Conv2d (no bias, 'same' padding) -> BatchNorm2d -> activation (none when ``activation`` is None);
    torchvision's ``Conv2dNormActivation``."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int = 3, stride: int = 1,
                 groups: int = 1, activation: Callable[..., nn.Module] | None = nn.Hardswish) -> None:
        layers: list[nn.Module] = [
            nn.Conv2d(in_channels, out_channels, kernel_size, stride, (kernel_size - 1) // 2,
                      groups=groups, bias=False),
            BatchNorm(out_channels),
        ]
        if activation is not None:
            layers.append(activation(inplace=True))
        super().__init__(*layers)
        self.out_channels = out_channels


class SqueezeExcitation(nn.Module):
    """``x * hardsigmoid(fc2(relu(fc1(avgpool(x)))))``, the per-channel gate broadcast over H and W."""

    def __init__(self, channels: int, squeeze_channels: int) -> None:
        super().__init__()
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc1 = nn.Conv2d(channels, squeeze_channels, 1)
        self.fc2 = nn.Conv2d(squeeze_channels, channels, 1)
        self.activation = nn.ReLU()
        self.scale_activation = nn.Hardsigmoid()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scale = self.scale_activation(self.fc2(self.activation(self.fc1(self.avgpool(x)))))
        return scale * x


class InvertedResidual(nn.Module):
    """1x1 expansion (skipped when ``expanded == in_channels``) -> kxk depthwise -> optional
    squeeze-excitation -> linear 1x1 projection, with an identity shortcut when stride is 1 and the
    channel count is unchanged."""

    def __init__(self, cnf: BlockConfig, width_mult: float = 1.0) -> None:
        super().__init__()
        if cnf.stride not in (1, 2):
            raise ValueError(f"MobileNetV3 InvertedResidual stride must be 1 or 2, got {cnf.stride}")
        in_channels, expanded, out_channels = (make_divisible(c * width_mult, 8)
                                               for c in (cnf.in_channels, cnf.expanded, cnf.out_channels))
        activation = nn.Hardswish if cnf.use_hardswish else nn.ReLU
        self.stride = cnf.stride
        self.use_res_connect = cnf.stride == 1 and in_channels == out_channels
        layers: list[nn.Module] = []
        if expanded != in_channels:
            layers.append(ConvBNActivation(in_channels, expanded, 1, activation=activation))
        layers.append(ConvBNActivation(expanded, expanded, cnf.kernel, cnf.stride, groups=expanded,
                                       activation=activation))
        if cnf.use_se:
            layers.append(SqueezeExcitation(expanded, make_divisible(expanded // 4, 8)))
        layers.append(ConvBNActivation(expanded, out_channels, 1, activation=None))
        self.block = nn.Sequential(*layers)
        self.out_channels = out_channels
        if self.use_res_connect:
            self.block[-1][1].corten_residual_branch = True  # see corten.zoo.batch_norm_stats

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.use_res_connect:
            return x + self.block(x)
        return self.block(x)


class MobileNetV3(nn.Module):
    """MobileNetV3 built from a block ``setting`` (default: Small) and a width multiplier; the
    input resolution is free."""

    def __init__(self, num_classes: int = 1000, width_mult: float = 1.0,
                 setting: tuple[BlockConfig, ...] = SMALL_SETTING, last_channel: int = SMALL_LAST_CHANNEL,
                 dropout: float = 0.2, generator: torch.Generator | None = None) -> None:
        super().__init__()
        blocks = [InvertedResidual(cnf, width_mult) for cnf in setting]
        stem_channels = make_divisible(setting[0].in_channels * width_mult, 8)
        last_conv_in = blocks[-1].out_channels
        last_conv_out = 6 * last_conv_in
        self.features = nn.Sequential(
            ConvBNActivation(3, stem_channels, 3, stride=2),
            *blocks,
            ConvBNActivation(last_conv_in, last_conv_out, 1),
        )
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        hidden = make_divisible(last_channel * width_mult, 8)
        self.classifier = nn.Sequential(
            nn.Linear(last_conv_out, hidden),
            nn.Hardswish(inplace=True),
            nn.Dropout(p=dropout, inplace=True),
            nn.Linear(hidden, num_classes),
        )
        torchvision_init(self, generator)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.avgpool(self.features(x))
        x = torch.flatten(x, 1)
        return self.classifier(x)
