"""Give a freshly initialised model non-trivial, but realistic, BatchNorm parameters and statistics.

A randomly initialised network has identity BatchNorms (mean 0, var 1, gamma 1, beta 0), which
would let BatchNorm folding bugs go unnoticed and leaves activations badly scaled for int8.
:func:`randomize_batch_norm` draws gamma/beta at random and then measures the running mean and
variance on a calibration batch, so each BN normalises what its producer actually outputs.
"""
from __future__ import annotations

import torch
from torch import nn

_BN_TYPES = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)

GAMMA_RANGE = (0.6, 1.4)  # BN weight ~ U(GAMMA_RANGE)
BETA_RANGE = (-0.3, 0.3)  # BN bias ~ U(BETA_RANGE)
# A BatchNorm that ends a residual branch (marked ``corten_residual_branch = True`` by the model)
# starts small, as zero-init-residual / SkipInit practice does: a random network with full-size
# residual branches is chaotic (1% input noise already changes MobileNetV2's logits by several
# percent), which no trained network is, and which would drown any int8 accuracy measurement.
RESIDUAL_BRANCH_GAMMA_SCALE = 0.25


def _uniform(shape: torch.Size, low: float, high: float, generator: torch.Generator) -> torch.Tensor:
    return low + (high - low) * torch.rand(shape, generator=generator)


@torch.no_grad()
def randomize_batch_norm(model: nn.Module, calibration_input: torch.Tensor,
                         generator: torch.Generator) -> None:
    """Randomise every BatchNorm's affine parameters, then set its running statistics to the
    mean / variance of its input over ``calibration_input`` (a batch of example inputs).

    Only the BatchNorm layers are switched to training mode while measuring (momentum ``None``
    = exact cumulative average), so dropout and other layers are untouched; afterwards the whole
    model is left in eval mode with the torchvision default momentum restored.
    """
    bns = [m for m in model.modules() if isinstance(m, _BN_TYPES)]
    momenta = [bn.momentum for bn in bns]
    for bn in bns:
        if bn.affine:
            k = RESIDUAL_BRANCH_GAMMA_SCALE if getattr(bn, "corten_residual_branch", False) else 1.0
            bn.weight.copy_(k * _uniform(bn.weight.shape, *GAMMA_RANGE, generator))
            bn.bias.copy_(k * _uniform(bn.bias.shape, *BETA_RANGE, generator))
        bn.reset_running_stats()
        bn.momentum = None
    model.eval()
    for bn in bns:
        bn.train()
    model(calibration_input)
    for bn, momentum in zip(bns, momenta):
        bn.momentum = momentum
        bn.num_batches_tracked.zero_()
    model.eval()
