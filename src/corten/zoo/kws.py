"""A keyword-spotting network on 1-D (temporal) convolutions.

The MFCC coefficients are the channels and time is the convolution axis, as in temporal-convolution
KWS models (Choi et al., "Temporal Convolution for Real-time Keyword Spotting on Mobile Devices",
Interspeech 2019): ``[N, 40, 49]`` = 40 MFCCs x 49 frames (1 s of audio, 20 ms hop), 12 classes (the
Speech Commands v0.02 10 keywords + silence + unknown, as in MLPerf Tiny).
"""
from __future__ import annotations

import torch
from torch import nn

from corten.zoo.mlperf_tiny import conv_bn_act, init_weights


class KWS1D(nn.Module):
    """``Conv1d(40, 64, 3, pad 1) + BN + ReLU``, ``MaxPool1d(2)``, two more ``Conv1d(64, 64, 3, pad 1)
    + BN + ReLU``, mean over time, ``Linear(64, 12)``."""

    def __init__(self, num_mfcc: int = 40, channels: int = 64, num_classes: int = 12,
                 generator: torch.Generator | None = None) -> None:
        super().__init__()
        self.features = nn.Sequential(
            conv_bn_act(nn.Conv1d(num_mfcc, channels, 3, padding=1)),
            nn.MaxPool1d(2),
            conv_bn_act(nn.Conv1d(channels, channels, 3, padding=1)),
            conv_bn_act(nn.Conv1d(channels, channels, 3, padding=1)),
        )
        self.classifier = nn.Linear(channels, num_classes)
        init_weights(self, generator)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x).mean(-1))
