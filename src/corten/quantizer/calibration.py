"""Calibration data in the forms users have it, and the warnings about calibrating badly.

:func:`calibration_batches` turns what ``corten.compile(..., calibration=...)`` accepts into input
tuples shaped like the example inputs:

* ``None``                 - 8 seeded standard-normal samples (with a :class:`QuantizationWarning`:
  random data rarely has the ranges of real inputs);
* a tensor ``[N, ...]``    - N samples along dim 0 (one-input models), split into chunks of the
  example batch size;
* a ``DataLoader`` or any iterable of batches - each batch a tensor or a tuple/list of the inputs
  (from a ``DataLoader`` the first ``len(example_inputs)`` entries, so ``(x, y)`` pairs work);
  a batch larger than the example batch is split into example-sized chunks;
* a callable           - ``calibration(model)`` runs the prepared model itself (torchao's
  ``calibrate(model)`` convention); Corten does not see the samples.

:func:`input_range_warnings` flags inputs whose features differ in range by more than
:data:`FEATURE_RANGE_RATIO` (one input scale then flattens the small features to a constant).
"""
from __future__ import annotations

import warnings
from typing import Any, Callable, Iterable, Iterator

import torch

from corten.errors import QuantizationWarning, UsageError

__all__ = ["QuantizationWarning", "calibration_batches", "default_calibration", "input_range_warnings", "warn"]

FEATURE_RANGE_RATIO = 100.0


def warn(message: str) -> None:
    warnings.warn(message, QuantizationWarning, stacklevel=3)


def default_calibration(example_inputs: tuple[torch.Tensor, ...], n: int = 8, seed: int = 0) -> list[tuple]:
    """``n`` standard-normal samples shaped like ``example_inputs`` (seeded)."""
    g = torch.Generator().manual_seed(seed)
    return [tuple(torch.randn(x.shape, generator=g, dtype=x.dtype) for x in example_inputs) for _ in range(n)]


def _as_tuple(batch: Any, arity: int, index: int, labelled: bool) -> tuple:
    """One batch as an input tuple; ``labelled`` (a DataLoader): extra items such as labels are dropped."""
    if isinstance(batch, torch.Tensor):
        return (batch,)
    if isinstance(batch, (tuple, list)):
        if len(batch) < arity:
            raise UsageError(f"calibration sample {index} has {len(batch)} tensor(s); the model takes "
                             f"{arity} input(s)")
        return tuple(batch[:arity]) if labelled else tuple(batch)
    if isinstance(batch, dict):
        raise UsageError(f"calibration batch {index} is a dict; pass tuples of input tensors in the "
                         "order forward() takes them")
    raise UsageError(f"calibration sample {index} is a {type(batch).__name__}; pass tensors or tuples "
                     "of tensors")


def _split(sample: tuple, example_inputs: tuple, index: int) -> Iterator[tuple]:
    """Chunks of ``sample`` with the example inputs' batch size (a larger batch is split)."""
    if not all(isinstance(t, torch.Tensor) for t in sample):
        yield sample  # the shape check (validation) reports it
        return
    ex = example_inputs[0]
    b = sample[0].shape[0] if sample[0].dim() > 0 else None
    eb = ex.shape[0] if ex.dim() > 0 else None
    same_rank = all(t.dim() == e.dim() for t, e in zip(sample, example_inputs))
    if b is None or eb is None or not same_rank or b == eb or b % eb or \
            any(t.shape[0] != b for t in sample):
        yield sample
        return
    for start in range(0, b, eb):
        yield tuple(t[start:start + eb] for t in sample)


def calibration_batches(calibration: Any, example_inputs: tuple[torch.Tensor, ...],
                        seed: int = 0) -> list[tuple] | Callable:
    """What :func:`corten.compile` calibrates on: a list of input tuples, or the user's callable."""
    if calibration is None:
        warn("calibration=None: Corten calibrates on 8 random normal samples, whose ranges are rarely "
             "those of real inputs (a CNN on [0, 1] images loses accuracy this way); pass ~64 real "
             "samples as calibration=")
        return default_calibration(example_inputs, 8, seed)
    if callable(calibration) and not isinstance(calibration, (torch.Tensor, torch.utils.data.DataLoader)):
        return calibration
    if isinstance(calibration, torch.Tensor):
        if len(example_inputs) != 1:
            raise UsageError(f"calibration is one tensor but the model takes {len(example_inputs)} inputs; "
                             "pass an iterable of input tuples")
        batches: Iterable = [calibration]
    else:
        try:
            batches = iter(calibration)
        except TypeError:
            raise UsageError(f"calibration must be None, a tensor, a DataLoader, an iterable of input tuples "
                             f"or a callable, got {type(calibration).__name__}") from None
    labelled = isinstance(calibration, torch.utils.data.DataLoader)
    out = []
    for i, batch in enumerate(batches):
        out.extend(_split(_as_tuple(batch, len(example_inputs), i, labelled), example_inputs, i))
    return out


def _feature_ranges(samples: list[tuple], index: int) -> torch.Tensor | None:
    """Per-feature (max - min) of input ``index`` over the samples: features along dim 1 of 2-D
    and 4-D inputs (channels), the last dim of 3-D sequences ``[N, T, C]``."""
    xs = [s[index] for s in samples if index < len(s) and isinstance(s[index], torch.Tensor)]
    if not xs or xs[0].dim() < 2 or not all(x.shape[1:] == xs[0].shape[1:] for x in xs):
        return None
    x = torch.cat([t.detach().float() for t in xs], 0)
    feat_dim = x.dim() - 1 if x.dim() == 3 else 1
    x = x.movedim(feat_dim, 0).reshape(x.shape[feat_dim], -1)
    if x.shape[0] < 2:
        return None
    return x.amax(1) - x.amin(1)


def input_range_warnings(samples: list[tuple], input_names: list[str] | None = None) -> list[str]:
    """Warn (and return the messages) when an input's features span ranges more than
    :data:`FEATURE_RANGE_RATIO` apart: one int8 scale per tensor then makes the small ones constant."""
    messages = []
    arity = len(samples[0]) if samples else 0
    for i in range(arity):
        ranges = _feature_ranges(samples, i)
        if ranges is None:
            continue
        nonzero = ranges[ranges > 0]
        if nonzero.numel() < 2:
            continue
        ratio = float(nonzero.max() / nonzero.min())
        if ratio <= FEATURE_RANGE_RATIO:
            continue
        step = float(ranges.max()) / 255.0
        flat = int((ranges < step).sum())
        name = input_names[i] if input_names and i < len(input_names) else f"input {i}"
        msg = (f"{name}: feature ranges differ by {ratio:.0f}x (from {float(nonzero.min()):.3g} to "
               f"{float(nonzero.max()):.3g}); one int8 scale covers the widest, so {flat} of "
               f"{ranges.numel()} features span less than one int8 step. Normalise the features in "
               "preprocessing (e.g. standardise each to mean 0, std 1) before the model")
        warn(msg)
        messages.append(msg)
    return messages
