"""MobileNetV2 (Sandler et al. 2018), written to match torchvision's ``mobilenet_v2`` layer for layer.

Same block structure, channel rounding (:func:`make_divisible`), weight initialisation scheme,
``Dropout(0.2) + Linear`` classifier and forward (``adaptive_avg_pool2d(x, (1, 1))`` then
``torch.flatten(x, 1)``), so parameter counts and exported graphs are those of torchvision's model.
torchvision itself is not a dependency.
"""
from __future__ import annotations

import torch
from torch import nn

# (expand ratio t, output channels c, repeats n, first stride s) per stage, from the paper's Table 2.
INVERTED_RESIDUAL_SETTING: tuple[tuple[int, int, int, int], ...] = (
    (1, 16, 1, 1),
    (6, 24, 2, 2),
    (6, 32, 3, 2),
    (6, 64, 4, 2),
    (6, 96, 3, 1),
    (6, 160, 3, 2),
    (6, 320, 1, 1),
)


def make_divisible(value: float, divisor: int = 8, min_value: int | None = None) -> int:
    """Round a channel count to a multiple of ``divisor`` without going below 90% of ``value``
    (torchvision's ``_make_divisible``)."""
    if min_value is None:
        min_value = divisor
    rounded = max(min_value, int(value + divisor / 2) // divisor * divisor)
    if rounded < 0.9 * value:
        rounded += divisor
    return rounded


def torchvision_init(model: nn.Module, generator: torch.Generator | None) -> None:
    """torchvision's MobileNet scheme: kaiming-normal (fan_out) convs, unit BN, N(0, 0.01) linear layers."""
    for m in model.modules():
        if isinstance(m, nn.Conv2d):
            nn.init.kaiming_normal_(m.weight, mode="fan_out", generator=generator)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.BatchNorm2d):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, 0, 0.01, generator=generator)
            nn.init.zeros_(m.bias)


class ConvBNReLU6(nn.Sequential):
    """Conv2d (no bias, 'same' padding) -> BatchNorm2d -> ReLU6."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int = 3,
                 stride: int = 1, groups: int = 1) -> None:
        padding = (kernel_size - 1) // 2
        super().__init__(
            nn.Conv2d(in_channels, out_channels, kernel_size, stride, padding, groups=groups, bias=False),
            nn.BatchNorm2d(out_channels),
            nn.ReLU6(inplace=True),
        )
        self.out_channels = out_channels


class InvertedResidual(nn.Module):
    """1x1 expansion (skipped when t == 1) -> 3x3 depthwise -> linear 1x1 projection (+ BN),
    with an identity shortcut when stride is 1 and the channel count is unchanged."""

    def __init__(self, in_channels: int, out_channels: int, stride: int, expand_ratio: int) -> None:
        super().__init__()
        if stride not in (1, 2):
            raise ValueError(f"InvertedResidual stride must be 1 or 2, got {stride}")
        hidden = int(round(in_channels * expand_ratio))
        self.stride = stride
        self.use_res_connect = stride == 1 and in_channels == out_channels
        layers: list[nn.Module] = []
        if expand_ratio != 1:
            layers.append(ConvBNReLU6(in_channels, hidden, kernel_size=1))
        layers += [
            ConvBNReLU6(hidden, hidden, stride=stride, groups=hidden),
            nn.Conv2d(hidden, out_channels, 1, 1, 0, bias=False),
            nn.BatchNorm2d(out_channels),
        ]
        self.conv = nn.Sequential(*layers)
        self.out_channels = out_channels
        if self.use_res_connect:
            self.conv[-1].corten_residual_branch = True  # see corten.zoo.batch_norm_stats

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.use_res_connect:
            return x + self.conv(x)
        return self.conv(x)


class MobileNetV2(nn.Module):
    """MobileNetV2 with width multiplier ``width_mult`` (the input resolution is free)."""

    def __init__(self, num_classes: int = 1000, width_mult: float = 1.0, round_nearest: int = 8,
                 dropout: float = 0.2, generator: torch.Generator | None = None) -> None:
        super().__init__()
        input_channel = make_divisible(32 * width_mult, round_nearest)
        self.last_channel = make_divisible(1280 * max(1.0, width_mult), round_nearest)

        features: list[nn.Module] = [ConvBNReLU6(3, input_channel, stride=2)]
        for t, c, n, s in INVERTED_RESIDUAL_SETTING:
            output_channel = make_divisible(c * width_mult, round_nearest)
            for i in range(n):
                features.append(InvertedResidual(input_channel, output_channel, s if i == 0 else 1, t))
                input_channel = output_channel
        features.append(ConvBNReLU6(input_channel, self.last_channel, kernel_size=1))
        self.features = nn.Sequential(*features)
        self.classifier = nn.Sequential(nn.Dropout(p=dropout), nn.Linear(self.last_channel, num_classes))
        torchvision_init(self, generator)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.features(x)
        x = nn.functional.adaptive_avg_pool2d(x, (1, 1))
        x = torch.flatten(x, 1)
        return self.classifier(x)
