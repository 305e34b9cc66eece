"""The four MLPerf Tiny (v1.x) reference models, written in plain ``torch.nn``.

Reference: MLPerf Tiny benchmark, ``mlcommons/tiny`` repository, ``benchmark/training/``
(Banbury et al., "MLPerf Tiny Benchmark", NeurIPS 2021 datasets track):

* :class:`DSCNN` -- keyword spotting (``keyword_spotting/keras_model.py``, DS-CNN from Zhang et
  al., "Hello Edge: Keyword Spotting on Microcontrollers", 2017);
* :class:`ResNet8` -- image classification on CIFAR-10 (``image_classification/keras_model.py``,
  ``resnet_v1_eembc``);
* :class:`MobileNetV1` -- visual wake words (``visual_wake_words/vww_model.py``, MobileNetV1 of
  Howard et al. 2017 at width 0.25 on 96x96 images);
* :class:`DeepAutoEncoder` -- anomaly detection on ToyADMOS (``anomaly_detection/keras_model.py``).

Like the Keras originals, every conv / dense layer has a bias (Keras' default) even when a
BatchNorm follows; Corten folds both away.  Two differences are inherent to PyTorch: "same"
padding of strided convolutions is symmetric here (TensorFlow pads the bottom / right more), and
feature maps are NCHW.  Weights are random (seeded); see :func:`init_weights`.
"""
from __future__ import annotations

from typing import Callable

import torch
from torch import nn

_CONV_TYPES = (nn.Conv1d, nn.Conv2d)
_BN_TYPES = (nn.BatchNorm1d, nn.BatchNorm2d)


def init_weights(model: nn.Module, generator: torch.Generator | None) -> None:
    """Seeded He initialisation drawn from ``generator`` only (never the global RNG).

    Convolutions: kaiming-normal, fan_in (the Keras references' ``he_normal``, untruncated; unlike
    fan_out it gives depthwise convs unit-gain weights too); linear layers: N(0, 1/fan_in), so a
    layer without a BatchNorm after it (a classifier, the autoencoder's output) keeps its input's
    scale; biases zero; BatchNorm identity (:mod:`corten.zoo.batch_norm_stats` randomises
    it afterwards).
    """
    for m in model.modules():
        if isinstance(m, _CONV_TYPES):
            nn.init.kaiming_normal_(m.weight, mode="fan_in", nonlinearity="relu", generator=generator)
        elif isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, 0.0, m.in_features ** -0.5, generator=generator)
        elif isinstance(m, _BN_TYPES):
            nn.init.ones_(m.weight)
        else:
            continue
        if m.bias is not None:
            nn.init.zeros_(m.bias)


def conv_bn_act(conv: nn.Conv1d | nn.Conv2d, activation: Callable[[], nn.Module] = nn.ReLU) -> nn.Sequential:
    """``conv -> BatchNorm -> activation`` (BatchNorm1d after a Conv1d, BatchNorm2d after a Conv2d)."""
    bn = nn.BatchNorm1d if isinstance(conv, nn.Conv1d) else nn.BatchNorm2d
    return nn.Sequential(conv, bn(conv.out_channels), activation())


def depthwise_separable(in_channels: int, out_channels: int, stride: int = 1,
                        activation: Callable[[], nn.Module] = nn.ReLU) -> nn.Sequential:
    """3x3 depthwise conv (+ BN + activation) then 1x1 pointwise conv (+ BN + activation)."""
    return nn.Sequential(
        conv_bn_act(nn.Conv2d(in_channels, in_channels, 3, stride, 1, groups=in_channels), activation),
        conv_bn_act(nn.Conv2d(in_channels, out_channels, 1), activation),
    )


def _conv_out(size: int, kernel: int, stride: int, padding: int) -> int:
    return (size + 2 * padding - kernel) // stride + 1


class PooledClassifier(nn.Module):
    """The classifier head DS-CNN and ResNet-8 share: ``features`` (the subclass's), an average pool
    over the whole remaining map, flatten, ``Linear(channels, num_classes)``."""

    def add_head(self, map_size: int | tuple[int, int], channels: int, num_classes: int,
                 generator: torch.Generator | None) -> None:
        """``pool`` and ``classifier`` after the subclass's ``features``, then every weight seeded
        (:func:`init_weights`, drawn in that module order)."""
        self.pool = nn.AvgPool2d(map_size)
        self.classifier = nn.Linear(channels, num_classes)
        init_weights(self, generator)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool(self.features(x))
        return self.classifier(torch.flatten(x, 1))


class DSCNN(PooledClassifier):
    """MLPerf Tiny keyword spotting DS-CNN on ``[N, 1, 49, 10]`` MFCCs (49 frames x 10 coefficients).

    ``Conv2d(1, 64, (10, 4), stride 2, padding (4, 1))`` + BN + ReLU + Dropout(0.2), four
    depthwise-separable blocks (3x3 depthwise, 1x1 pointwise to 64, each + BN + ReLU),
    Dropout(0.4), average pool over the whole remaining 24x5 map, flatten, ``Linear(64, 12)``.
    """

    STEM_KERNEL = (10, 4)
    STEM_STRIDE = (2, 2)
    STEM_PADDING = (4, 1)

    def __init__(self, num_classes: int = 12, channels: int = 64, num_blocks: int = 4,
                 input_size: tuple[int, int] = (49, 10), generator: torch.Generator | None = None) -> None:
        super().__init__()
        stem = nn.Conv2d(1, channels, self.STEM_KERNEL, self.STEM_STRIDE, self.STEM_PADDING)
        self.features = nn.Sequential(
            conv_bn_act(stem),
            nn.Dropout(0.2),
            *(depthwise_separable(channels, channels) for _ in range(num_blocks)),
            nn.Dropout(0.4),
        )
        self.map_size = tuple(_conv_out(size, k, s, p) for size, k, s, p in
                              zip(input_size, self.STEM_KERNEL, self.STEM_STRIDE, self.STEM_PADDING))
        self.add_head(self.map_size, channels, num_classes, generator)


class ResidualBlock(nn.Module):
    """ResNet v1 basic block: ``relu(shortcut(x) + bn2(conv2(relu(bn1(conv1(x))))))``.

    The shortcut is the identity, or -- when the stride or channel count changes -- a strided
    1x1 conv without BatchNorm (as in the MLPerf Tiny ResNet-8).
    """

    def __init__(self, in_channels: int, out_channels: int, stride: int = 1) -> None:
        super().__init__()
        self.residual = nn.Sequential(
            conv_bn_act(nn.Conv2d(in_channels, out_channels, 3, stride, 1)),
            nn.Conv2d(out_channels, out_channels, 3, 1, 1),
            nn.BatchNorm2d(out_channels),
        )
        self.residual[-1].corten_residual_branch = True  # see corten.zoo.batch_norm_stats
        needs_projection = stride != 1 or in_channels != out_channels
        self.shortcut = nn.Conv2d(in_channels, out_channels, 1, stride) if needs_projection else nn.Identity()
        self.relu = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.relu(self.shortcut(x) + self.residual(x))


class ResNet8(PooledClassifier):
    """MLPerf Tiny image classification ResNet-8 on CIFAR-10 ``[N, 3, 32, 32]``.

    3x3 conv to 16 + BN + ReLU, three stacks of one :class:`ResidualBlock` each (16; 32 stride 2;
    64 stride 2), 8x8 average pool, flatten, ``Linear(64, 10)``.
    """

    STACKS: tuple[tuple[int, int], ...] = ((16, 1), (32, 2), (64, 2))  # (channels, stride)

    def __init__(self, num_classes: int = 10, input_size: int = 32,
                 generator: torch.Generator | None = None) -> None:
        super().__init__()
        layers: list[nn.Module] = [conv_bn_act(nn.Conv2d(3, self.STACKS[0][0], 3, 1, 1))]
        channels, size = self.STACKS[0][0], input_size
        for out_channels, stride in self.STACKS:
            layers.append(ResidualBlock(channels, out_channels, stride))
            channels, size = out_channels, _conv_out(size, 3, stride, 1)
        self.features = nn.Sequential(*layers)
        self.add_head(size, channels, num_classes, generator)


class MobileNetV1(nn.Module):
    """MobileNetV1 (Howard et al. 2017) with width multiplier ``alpha``; MLPerf Tiny visual wake
    words uses ``alpha=0.25`` on ``[N, 3, 96, 96]`` with 2 classes.

    3x3 conv stride 2 (+ BN + ReLU6), the paper's 13 depthwise-separable blocks (ReLU6, as in the
    TensorFlow MobileNetV1), global average pool, flatten, Linear.  Channels are
    ``int(c * alpha)`` like Keras' MobileNet.
    """

    STEM_CHANNELS = 32
    # (pointwise output channels at alpha 1, depthwise stride) of the 13 blocks, from the paper's Table 1
    BLOCKS: tuple[tuple[int, int], ...] = (
        (64, 1), (128, 2), (128, 1), (256, 2), (256, 1), (512, 2),
        (512, 1), (512, 1), (512, 1), (512, 1), (512, 1), (1024, 2), (1024, 1),
    )

    def __init__(self, num_classes: int = 2, alpha: float = 0.25,
                 generator: torch.Generator | None = None) -> None:
        super().__init__()
        channels = int(self.STEM_CHANNELS * alpha)
        layers: list[nn.Module] = [conv_bn_act(nn.Conv2d(3, channels, 3, 2, 1), nn.ReLU6)]
        for width, stride in self.BLOCKS:
            layers.append(depthwise_separable(channels, int(width * alpha), stride, nn.ReLU6))
            channels = int(width * alpha)
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Linear(channels, num_classes)
        init_weights(self, generator)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = nn.functional.adaptive_avg_pool2d(self.features(x), 1)
        return self.classifier(torch.flatten(x, 1))


def linear_bn_relu(in_features: int, out_features: int) -> nn.Sequential:
    """``Linear -> BatchNorm1d -> ReLU``, the autoencoder's dense layer."""
    return nn.Sequential(nn.Linear(in_features, out_features), nn.BatchNorm1d(out_features), nn.ReLU())


class DeepAutoEncoder(nn.Module):
    """MLPerf Tiny anomaly detection deep autoencoder on ``[N, 640]`` (5 frames x 128 log-mel bins).

    Encoder: four ``Linear(·, 128) + BatchNorm1d + ReLU`` then a ``Linear(128, 8) + BN + ReLU``
    bottleneck; decoder: ``Linear(8, 128) + BN + ReLU`` and three more 128-wide, then
    ``Linear(128, 640)`` reconstructing the input (no activation).
    """

    def __init__(self, input_dim: int = 640, hidden: int = 128, bottleneck: int = 8, depth: int = 4,
                 generator: torch.Generator | None = None) -> None:
        super().__init__()
        widths_in = [input_dim] + [hidden] * (depth - 1)
        self.encoder = nn.Sequential(*(linear_bn_relu(n, hidden) for n in widths_in),
                                     linear_bn_relu(hidden, bottleneck))
        widths_in = [bottleneck] + [hidden] * (depth - 1)
        self.decoder = nn.Sequential(*(linear_bn_relu(n, hidden) for n in widths_in),
                                     nn.Linear(hidden, input_dim))
        init_weights(self, generator)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.decoder(self.encoder(x))
