"""Corten's model zoo: small, self-contained model definitions with seeded random weights.

``get_model(name, seed=0)`` returns ``(model in eval mode, example_inputs)``; the example inputs
are a tuple holding one batch-1 float32 tensor, ready for :func:`corten.capture.capture`.
Weights are random but seeded (no downloads); BatchNorm layers get non-trivial parameters and
running statistics measured on a calibration batch (see :mod:`corten.zoo.batch_norm_stats`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn

from corten.zoo.batch_norm_stats import randomize_batch_norm
from corten.zoo.kws import KWS1D
from corten.zoo.kwt import KWTTiny
from corten.zoo.lstm_kws import LSTMKWS
from corten.zoo.mlperf_tiny import DSCNN, DeepAutoEncoder, MobileNetV1, ResNet8
from corten.zoo.mobilenet_v2 import MobileNetV2, make_divisible
from corten.zoo.mobilenet_v3 import MobileNetV3

__all__ = ["MODELS", "ZooEntry", "get_model", "list_models", "MobileNetV2", "MobileNetV3", "DSCNN",
           "ResNet8", "MobileNetV1", "DeepAutoEncoder", "KWS1D", "LSTMKWS", "KWTTiny", "make_divisible"]

CALIBRATION_BATCH = 2  # default number of samples used to measure BatchNorm running statistics


@dataclass(frozen=True)
class ZooEntry:
    """One zoo model: how to build it (from a seeded generator) and its input shape (batch 1)."""

    name: str
    description: str
    build: Callable[[torch.Generator], nn.Module]
    input_shape: tuple[int, ...]
    # samples used to measure BatchNorm statistics; BatchNorm1d on [N, C] sees only N values per channel
    calibration_batch: int = CALIBRATION_BATCH


def _mobilenet_v2(width_mult: float) -> Callable[[torch.Generator], nn.Module]:
    return lambda gen: MobileNetV2(num_classes=1000, width_mult=width_mult, generator=gen)


MODELS: dict[str, ZooEntry] = {
    e.name: e
    for e in (
        ZooEntry("mv2", "MobileNetV2 width 1.0, 224x224x3 input, 1000 classes (torchvision architecture)",
                 _mobilenet_v2(1.0), (1, 3, 224, 224)),
        ZooEntry("mv2-0.35-96", "MobileNetV2 width 0.35, 96x96x3 input, 1000 classes",
                 _mobilenet_v2(0.35), (1, 3, 96, 96)),
        ZooEntry("mv3-small", "MobileNetV3-Small width 1.0, 224x224x3 input, 1000 classes (torchvision architecture)",
                 lambda gen: MobileNetV3(num_classes=1000, generator=gen), (1, 3, 224, 224)),
        ZooEntry("ds-cnn", "MLPerf Tiny keyword spotting DS-CNN, 49x10 MFCC input, 12 classes",
                 lambda gen: DSCNN(generator=gen), (1, 1, 49, 10)),
        ZooEntry("resnet8", "MLPerf Tiny image classification ResNet-8, CIFAR-10 32x32x3 input, 10 classes",
                 lambda gen: ResNet8(generator=gen), (1, 3, 32, 32)),
        ZooEntry("mv1-0.25-96", "MLPerf Tiny visual wake words MobileNetV1 width 0.25, 96x96x3 input, 2 classes",
                 lambda gen: MobileNetV1(num_classes=2, alpha=0.25, generator=gen), (1, 3, 96, 96)),
        ZooEntry("deep-ae", "MLPerf Tiny anomaly detection deep autoencoder, 640 inputs (5 x 128 log-mel)",
                 lambda gen: DeepAutoEncoder(generator=gen), (1, 640), calibration_batch=64),
        ZooEntry("kws-1d", "keyword spotting on 1-D convolutions, 40 MFCC x 49 frames input, 12 classes",
                 lambda gen: KWS1D(generator=gen), (1, 40, 49)),
        ZooEntry("lstm-kws", "keyword spotting LSTM: 2 layers of 64 units over 49 frames x 10 MFCC, last hidden "
                 "state -> 12 classes", lambda gen: LSTMKWS(generator=gen), (1, 49, 10)),
        ZooEntry("kwt-tiny", "keyword transformer: 49 frames x 10 MFCC, linear frame embedding, 2 attention blocks "
                 "(LayerNorm, 2 heads, GELU MLP), mean pooling, 12 classes",
                 lambda gen: KWTTiny(generator=gen), (1, 49, 10)),
    )
}


def list_models() -> list[tuple[str, str]]:
    """``[(name, description), ...]`` for every zoo model."""
    return [(e.name, e.description) for e in MODELS.values()]


def get_model(name: str, seed: int = 0) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """Build zoo model ``name`` with weights drawn from ``seed``.

    Returns the model in eval mode and its example inputs (a tuple of batch-1 float32 tensors
    drawn from N(0, 1), like normalised images).  The same ``name`` and ``seed`` always give the
    same weights and inputs; the global torch RNG is neither used nor changed.
    """
    if name not in MODELS:
        raise KeyError(f"unknown zoo model {name!r}; available: {', '.join(MODELS)}")
    entry = MODELS[name]
    gen = torch.Generator().manual_seed(seed)
    with torch.random.fork_rng(devices=[]):  # nn layers' default init draws from the global RNG
        model = entry.build(gen)
    calibration = torch.randn((entry.calibration_batch, *entry.input_shape[1:]), generator=gen)
    randomize_batch_norm(model, calibration, gen)
    example = torch.randn(entry.input_shape, generator=gen)
    return model.eval(), (example,)
