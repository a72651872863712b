"""Intervals for timed figures: a paired block bootstrap over the blocks of interleaved replays.

A run replays each trace in short slices of steps, rotating the implementations from slice to slice, so that a
slow phase of the machine falls on every implementation alike (see :mod:`harness.measure.interleave`). A block
is one slice (each step's time in it being the step's median over repetitions, :mod:`harness.measure.metrics`).
A figure is a ratio of sums over blocks (time over work: nanoseconds over sequence-steps, lookups or blocks),
and its 95 % interval is the percentile interval of the same ratio over blocks drawn with replacement. A
ratio between two implementations draws the *same* blocks for both (the blocks were measured side by side),
which is what makes it stable while absolute times drift.

Hand-written rather than ``scipy.stats.bootstrap`` (scipy is not a dependency): it is twenty lines of NumPy,
and the pairing across implementations and the ratio-of-sums statistic are ours to state.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

RESAMPLES = 2000
CONFIDENCE = 0.95
SEED = 20261130  # fixed: the same measurements always give the same interval


@dataclass(frozen=True)
class Estimate:
    """A figure and its 95 % interval (NaN bounds when there are too few blocks to resample)."""

    value: float
    low: float
    high: float

    def contains(self, x: float) -> bool:
        """Whether ``x`` lies within the interval."""
        return bool(self.low <= x <= self.high)


def _draws(blocks: int, resamples: int = RESAMPLES) -> np.ndarray:
    """Block indices of every resample: ``[resamples, blocks]``, the same for every call with this shape."""
    return np.random.default_rng(SEED).integers(0, blocks, size=(resamples, blocks))


def _interval(samples: np.ndarray) -> tuple[float, float]:
    samples = samples[np.isfinite(samples)]
    if samples.size == 0:
        return float("nan"), float("nan")
    tail = (1 - CONFIDENCE) / 2 * 100
    low, high = np.percentile(samples, [tail, 100 - tail])
    return float(low), float(high)


def ratio_of_sums(num: np.ndarray, den: np.ndarray) -> Estimate:
    """``sum(num) / sum(den)`` over blocks, with its bootstrap interval."""
    num, den = np.asarray(num, dtype=float), np.asarray(den, dtype=float)
    value = float(num.sum() / den.sum()) if den.sum() else float("nan")
    if num.size < 2:
        return Estimate(value, float("nan"), float("nan"))
    idx = _draws(num.size)
    with np.errstate(divide="ignore", invalid="ignore"):
        boot = num[idx].sum(axis=1) / den[idx].sum(axis=1)
    return Estimate(value, *_interval(boot))


def paired_ratio(num_a: np.ndarray, num_b: np.ndarray, den_a: np.ndarray | None = None,
                 den_b: np.ndarray | None = None) -> Estimate:
    """``(sum(num_a)/sum(den_a)) / (sum(num_b)/sum(den_b))`` with the same blocks drawn for a and b.

    Without denominators (same work for both) it is ``sum(num_a) / sum(num_b)``.
    """
    num_a, num_b = np.asarray(num_a, dtype=float), np.asarray(num_b, dtype=float)
    den_a = np.ones_like(num_a) if den_a is None else np.asarray(den_a, dtype=float)
    den_b = np.ones_like(num_b) if den_b is None else np.asarray(den_b, dtype=float)
    if num_a.shape != num_b.shape:
        raise ValueError(f"paired blocks differ in number: {num_a.shape} and {num_b.shape}")

    def ratio(na, nb, da, db):
        with np.errstate(divide="ignore", invalid="ignore"):
            return (na / da) / (nb / db)

    value = float(ratio(num_a.sum(), num_b.sum(), den_a.sum(), den_b.sum()))
    if num_a.size < 2:
        return Estimate(value, float("nan"), float("nan"))
    idx = _draws(num_a.size)
    boot = ratio(num_a[idx].sum(axis=1), num_b[idx].sum(axis=1), den_a[idx].sum(axis=1), den_b[idx].sum(axis=1))
    return Estimate(value, *_interval(boot))


def block_sums(per_step: np.ndarray, slices: list[tuple[int, int]]) -> np.ndarray:
    """Per-step values summed over each slice: ``[len(slices)]``."""
    per_step = np.asarray(per_step, dtype=float)
    return np.array([per_step[lo:hi].sum() for lo, hi in slices])


def median_estimate(samples: np.ndarray) -> Estimate:
    """The median of independent samples with its bootstrap interval (for studies timing one operation at a
    time, where there are no slices to pair)."""
    samples = np.asarray(samples, dtype=float)
    value = float(np.median(samples))
    if samples.size < 2:
        return Estimate(value, float("nan"), float("nan"))
    return Estimate(value, *_interval(np.median(samples[_draws(samples.size)], axis=1)))
