"""An LSTM keyword spotter on MFCC frames.

``[N, 49, 10]`` = 49 frames of 10 MFCCs (1 s of audio, 40 ms window, 20 ms hop, as in the MLPerf
Tiny / "Hello Edge" KWS front end), two stacked ``nn.LSTM`` layers of 64 units (batch_first), the
last layer's final hidden state ``h_n[-1]`` through ``Linear(64, 12)`` (the 10 Speech Commands
keywords + silence + unknown).  Close to Hello Edge's LSTM models (Zhang et al., 2017: one or two
layers of 64-118 units).
"""
from __future__ import annotations

import torch
from torch import nn


class LSTMKWS(nn.Module):
    """``nn.LSTM(10, 64, num_layers=2, batch_first=True)`` -> ``h_n[-1]`` -> ``Linear(64, 12)``."""

    def __init__(self, num_mfcc: int = 10, hidden: int = 64, layers: int = 2, num_classes: int = 12,
                 generator: torch.Generator | None = None) -> None:
        super().__init__()
        self.lstm = nn.LSTM(num_mfcc, hidden, num_layers=layers, batch_first=True)
        self.classifier = nn.Linear(hidden, num_classes)
        # PyTorch's LSTM initialisation, U(-1/sqrt(H), 1/sqrt(H)), drawn from ``generator`` only;
        # the classifier N(0, 1/fan_in) with a zero bias, as the other zoo models.
        bound = hidden ** -0.5
        with torch.no_grad():
            for p in self.lstm.parameters():
                p.uniform_(-bound, bound, generator=generator)
            nn.init.normal_(self.classifier.weight, 0.0, hidden ** -0.5, generator=generator)
            nn.init.zeros_(self.classifier.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _, (h, _) = self.lstm(x)
        return self.classifier(h[-1])
