"""Activation observers a user can choose with ``corten.compile(..., observer=...)``.

All four see every calibration value through a histogram and differ only in how they pick the
quantization range from it:

* ``"histogram"`` - torch's ``HistogramObserver`` (an approximate L2-error search over bins; the
  default for intermediate activations, as in PT2E's x86/XNNPACK recipes);
* ``"minmax"``    - the observed minimum and maximum (never clips);
* ``"percentile"``- the 0.01 % and 99.99 % quantiles of the histogram (:data:`PERCENTILE`);
* ``"mse"``       - the range ``[a * min, a * max]`` whose int8 grid has the least mean squared
  error over the histogram, for ``a`` on a grid of 100 shrink factors.

Program outputs always use min/max (see :func:`corten.quantizer.quantizer.CortenQuantizer`):
clipping the logits changes which class wins.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import torch

from corten.errors import UsageError
from torchao.quantization.pt2e.observer import HistogramObserver, MinMaxObserver, PerChannelMinMaxObserver

OBSERVERS = ("histogram", "minmax", "percentile", "mse")
PERCENTILE = 99.99
MSE_STEPS = 100
WEIGHT_CLIP_FLOOR = 0.4  # the int4 weight range search tries max|w| * a for a in [WEIGHT_CLIP_FLOOR, 1]
WEIGHT_CLIP_STEPS = 31


class _HistogramRangeObserver(HistogramObserver):
    """A histogram observer whose range rule is :meth:`_range` (subclasses)."""

    def _bin_centres(self) -> torch.Tensor:
        width = (self.max_val - self.min_val) / self.bins
        return self.min_val + width * (torch.arange(self.bins, dtype=torch.float32) + 0.5)

    def _non_linear_param_search(self) -> tuple[torch.Tensor, torch.Tensor]:
        if float(self.histogram.sum()) == 0.0 or float(self.max_val) <= float(self.min_val):
            return self.min_val, self.max_val
        lo, hi = self._range()
        return torch.as_tensor(lo, dtype=torch.float32), torch.as_tensor(hi, dtype=torch.float32)

    def _range(self) -> tuple[float, float]:  # pragma: no cover - abstract
        raise NotImplementedError


class PercentileObserver(_HistogramRangeObserver):
    """Range = the [100 - p, p] percentiles of the calibration values (p = :data:`PERCENTILE`)."""

    def _range(self) -> tuple[float, float]:
        cdf = torch.cumsum(self.histogram.to(torch.float64), 0) / float(self.histogram.sum())
        edges = torch.linspace(float(self.min_val), float(self.max_val), self.bins + 1, dtype=torch.float64)
        q = PERCENTILE / 100.0
        lo_bin = int(torch.searchsorted(cdf, torch.tensor(1.0 - q, dtype=torch.float64)))
        hi_bin = int(torch.searchsorted(cdf, torch.tensor(q, dtype=torch.float64)))
        lo = float(edges[lo_bin])
        hi = float(edges[min(hi_bin + 1, self.bins)])
        return min(lo, 0.0), max(hi, 0.0)


class MSEObserver(_HistogramRangeObserver):
    """Range = ``[a * min, a * max]`` minimising the int8 mean squared error over the histogram."""

    def _range(self) -> tuple[float, float]:
        x = self._bin_centres().to(torch.float64)
        counts = self.histogram.to(torch.float64)
        lo0, hi0 = min(float(self.min_val), 0.0), max(float(self.max_val), 0.0)
        qmin, qmax = int(self.quant_min), int(self.quant_max)
        best, best_err = (lo0, hi0), float("inf")
        for i in range(MSE_STEPS):
            a = 1.0 - i / MSE_STEPS
            lo, hi = lo0 * a, hi0 * a
            scale = max((hi - lo) / (qmax - qmin), float(self.eps))
            zp = qmin - round(lo / scale)
            q = torch.clamp(torch.round(x / scale) + zp, qmin, qmax)
            err = float((((q - zp) * scale - x) ** 2 * counts).sum())
            if err < best_err:
                best, best_err = (lo, hi), err
        return best


class PerChannelMseWeightObserver(PerChannelMinMaxObserver):
    """Symmetric per-channel weights whose range is, per output channel, ``a * max|w|`` with the ``a``
    in ``[WEIGHT_CLIP_FLOOR, 1]`` (:data:`WEIGHT_CLIP_STEPS` values) that gives the smallest squared
    error of the round-to-nearest weights: clipping the few largest weights buys a finer grid for the
    rest.  Used for int4 weights, where the grid has 15 levels and max-abs wastes most of them on
    the tails (int8 weights keep max-abs: their grid is fine enough)."""

    def forward(self, x_orig):
        self.weight, self.searched = x_orig.detach(), None  # (a weight is observed once; the search needs it)
        return self._forward(x_orig)

    def calculate_qparams(self):
        scale, zero_point = super().calculate_qparams()
        w = getattr(self, "weight", None)
        if w is None or self.qscheme != torch.per_channel_symmetric or w.dim() == 0:
            return scale, zero_point
        if self.searched is None:  # (asked again for the bias's derived scale: the same answer)
            self.searched = best_clip_scale(w.movedim(self.ch_axis, 0).reshape(w.shape[self.ch_axis], -1), scale,
                                            self.quant_min, self.quant_max, self.eps)
        return self.searched.clone(), zero_point


def best_clip_scale(w: torch.Tensor, scale: torch.Tensor, qmin: int, qmax: int, eps) -> torch.Tensor:
    """Per row of ``w`` (``[C, K]``), the scale ``a * scale`` (``scale``: the max-abs one) whose
    round-to-nearest quantization in ``[qmin, qmax]`` has the least squared error, ``a`` on the grid
    of :class:`PerChannelMseWeightObserver`; ties keep the larger range."""
    w = w.to(torch.float32)
    best = scale.to(torch.float32).clone()
    best_err = torch.full_like(best, float("inf"))
    for i in range(WEIGHT_CLIP_STEPS):
        a = 1.0 - i * (1.0 - WEIGHT_CLIP_FLOOR) / (WEIGHT_CLIP_STEPS - 1)
        s = torch.clamp(scale.to(torch.float32) * a, min=float(eps))[:, None]
        err = torch.square(torch.clamp(torch.round(w / s), qmin, qmax).mul_(s).sub_(w)).sum(1)
        better = err < best_err
        best, best_err = torch.where(better, s[:, 0], best), torch.where(better, err, best_err)
    return best.to(scale.dtype)


def observer_class(name: str) -> type:
    """The observer class for ``name`` (one of :data:`OBSERVERS`)."""
    classes = {"histogram": HistogramObserver, "minmax": MinMaxObserver,
               "percentile": PercentileObserver, "mse": MSEObserver}
    if name not in classes:
        raise UsageError(f"observer={name!r} is not one of {', '.join(OBSERVERS)}")
    return classes[name]


_TORCH_SEARCH = HistogramObserver._non_linear_param_search


def l2_range_search(obs: HistogramObserver) -> tuple[torch.Tensor, torch.Tensor]:
    """``HistogramObserver._non_linear_param_search`` computed on Python numbers: the same range,
    bit for bit, about 20x faster.  torch's loop walks the two quantile bounds inward in steps of
    1e-5 (up to 10^5 steps, each indexing and comparing 0-d tensors) until the L2 error of the
    clipped histogram (``_compute_quantization_error``, still torch's, called at each move) grows.
    Its tests ``cSum[l] < next_alpha * total`` compare a float32 element with a Python float that
    torch first rounds to float32 (a wrapped scalar takes the tensor's dtype): here the cumulative
    sums are the same float32 values as doubles and each bound is rounded to float32 the same way
    (``tests/test_quantizer.py`` checks the ranges equal torch's on random and degenerate histograms)."""
    import numpy as np

    assert obs.histogram.size()[0] == obs.bins, "bins mismatch"
    bin_width = (obs.max_val - obs.min_val) / obs.bins
    total = torch.sum(obs.histogram).item()
    c_sum = torch.cumsum(obs.histogram, dim=0).tolist()
    f32 = np.float32
    stepsize, alpha, beta = 1e-5, 0.0, 1.0
    start_bin, end_bin = 0, obs.bins - 1
    norm_min = float("inf")
    while alpha < beta:
        next_alpha, next_beta = alpha + stepsize, beta - stepsize
        lo_bound, hi_bound = float(f32(next_alpha * total)), float(f32(next_beta * total))
        left, right = start_bin, end_bin
        while left < end_bin and c_sum[left] < lo_bound:
            left += 1
        while right > start_bin and c_sum[right] > hi_bound:
            right -= 1
        next_start, next_end = start_bin, end_bin
        if (left - start_bin) > (end_bin - right):
            next_start, alpha = left, next_alpha
        else:
            next_end, beta = right, next_beta
        if next_start == start_bin and next_end == end_bin:
            continue
        norm = obs._compute_quantization_error(next_start, next_end)
        if norm > norm_min:
            break
        norm_min, start_bin, end_bin = norm, next_start, next_end
    return obs.min_val + bin_width * start_bin, obs.min_val + bin_width * (end_bin + 1)


class _SearchOnce:
    """One histogram observer's range search (``_non_linear_param_search``), remembered with the
    histogram and min/max it was computed from: asked again with the same ones, the same range
    (copies of the same tensors) without searching again."""

    def __init__(self, observer: HistogramObserver) -> None:
        self.observer = observer
        self.seen: tuple[torch.Tensor, ...] | None = None
        self.found: tuple[torch.Tensor, torch.Tensor] | None = None

    def __call__(self) -> tuple[torch.Tensor, torch.Tensor]:
        obs = self.observer
        state = (obs.histogram, obs.min_val, obs.max_val)
        if self.seen is None or not all(torch.equal(a, b) for a, b in zip(self.seen, state)):
            search = type(obs)._non_linear_param_search
            self.found = l2_range_search(obs) if search is _TORCH_SEARCH else search(obs)
            self.seen = tuple(t.clone() for t in state)
        return self.found[0].clone(), self.found[1].clone()


@contextmanager
def range_search_once(gm: torch.nn.Module, memo: dict | None = None) -> Iterator[None]:
    """While in the block, each histogram observer of ``gm`` (all four rules of :data:`OBSERVERS`
    but minmax) searches its range once per histogram.  ``convert_pt2e`` asks every activation
    observer for its qparams, and the bias of every conv/linear asks its input's observer again
    (``_derive_bias_qparams``): 53 of MobileNetV2's 118 searches repeat one already done.  The
    observers keep their class; the memo is an instance attribute, removed on exit.  ``memo`` (a
    dict the caller keeps) carries the searches from one block to the next: the compiler's
    calibration checks (the lookup tables' saturation warning) and ``convert_pt2e`` search once."""
    memo = {} if memo is None else memo
    observers = [m for m in gm.modules() if isinstance(m, HistogramObserver)]
    for obs in observers:
        obs._non_linear_param_search = memo.setdefault(id(obs), _SearchOnce(obs))
    try:
        yield
    finally:
        for obs in observers:
            del obs._non_linear_param_search


class DeclaredRangeObserver(MinMaxObserver):
    """The range the user declared for a program input (``corten.compile(..., input_ranges=)``):
    fixed at construction, not moved by calibration; the qparams are those a min/max observer gives
    for that range (int8 affine, int16 symmetric), so a declared input quantizes exactly as one
    calibrated on data spanning ``[lo, hi]``."""

    def __init__(self, lo: float = 0.0, hi: float = 0.0, **kwargs):
        super().__init__(**kwargs)
        self.min_val.copy_(torch.tensor(float(lo)))
        self.max_val.copy_(torch.tensor(float(hi)))

    def forward(self, x_orig):
        return x_orig  # calibration data does not move a declared range


def check_input_ranges(input_ranges, names: list[str]) -> dict[int, tuple[float, float]]:
    """``{input index | forward argument name: (lo, hi)}`` -> ``{index: (lo, hi)}``; anything else
    is a :class:`UsageError` saying what is expected (``names``: the forward's input names)."""
    import math

    if input_ranges is None:
        return {}
    if not isinstance(input_ranges, dict):
        raise UsageError(f"input_ranges must be a dict {{input index or name: (lo, hi)}}, got "
                         f"{type(input_ranges).__name__}")
    out: dict[int, tuple[float, float]] = {}
    for key, rng in input_ranges.items():
        if isinstance(key, bool) or not isinstance(key, (int, str)):
            raise UsageError(f"input_ranges key {key!r}: use an input index (0..{len(names) - 1}) or a name of "
                             f"forward's inputs ({', '.join(names)})")
        if isinstance(key, str):
            if key not in names:
                raise UsageError(f"input_ranges names input {key!r}, but forward's inputs are {', '.join(names)}")
            idx = names.index(key)
        else:
            idx = key + len(names) if key < 0 else key
            if not 0 <= idx < len(names):
                raise UsageError(f"input_ranges names input {key}, but the model takes {len(names)} input(s)")
        try:
            lo, hi = (float(v) for v in rng)
        except (TypeError, ValueError):
            raise UsageError(f"input_ranges[{key!r}] must be a pair (lo, hi) of numbers, got {rng!r}") from None
        if not (math.isfinite(lo) and math.isfinite(hi)) or not lo < hi:
            raise UsageError(f"input_ranges[{key!r}] = ({lo:g}, {hi:g}): need finite lo < hi (the real values "
                             "the input takes; int8 spreads 256 levels over the range, 0 included)")
        if idx in out:
            raise UsageError(f"input_ranges declares input {idx} ({names[idx]}) twice")
        out[idx] = (lo, hi)
    return out
