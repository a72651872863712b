"""Intervals for timed figures: a paired bootstrap over repetitions and blocks. Design: docs/measurement.md#stats."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

RESAMPLES = 2000
CONFIDENCE = 0.95
SEED = 20261130  # fixed: the same measurements always give the same interval (and the same drawn orders)


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


def rep_draws(reps: int, resamples: int = RESAMPLES) -> np.ndarray:
    """Repetition indices of every resample: ``[resamples, reps]``, the same for every call with this shape."""
    return np.random.default_rng(SEED + 1).integers(0, reps, size=(resamples, reps))


def _interval(samples: np.ndarray) -> tuple[float, float]:
    samples = samples[np.isfinite(samples)]
    if samples.size == 0:
        return float("nan"), float("nan")
    tail = (1 - CONFIDENCE) / 2 * 100
    low, high = np.percentile(samples, [tail, 100 - tail])
    return float(low), float(high)


def _point(x: np.ndarray) -> np.ndarray:
    """The blocks of the figure itself: ``x`` (blocks alone) or its first row (see :func:`block_medians`)."""
    return x if x.ndim == 1 else x[0]


def _resampled(x: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """Per resample, the sum of its drawn blocks (of its drawn repetitions' medians for a 2-D ``x``)."""
    if x.ndim == 1:
        return x[idx].sum(axis=1)
    if x.shape[0] != idx.shape[0] + 1:
        raise ValueError(f"{x.shape[0] - 1} repetition resamples for {idx.shape[0]} block resamples")
    return np.take_along_axis(x[1:], idx, axis=1).sum(axis=1)


def ratio_of_sums(num: np.ndarray, den: np.ndarray) -> Estimate:
    """``sum(num) / sum(den)`` over blocks, with its bootstrap interval."""
    num, den = np.asarray(num, dtype=float), np.asarray(den, dtype=float)
    point = _point(num)
    value = float(point.sum() / den.sum()) if den.sum() else float("nan")
    if point.size < 2:
        return Estimate(value, float("nan"), float("nan"))
    idx = _draws(point.size)
    with np.errstate(divide="ignore", invalid="ignore"):
        boot = _resampled(num, idx) / den[idx].sum(axis=1)
    return Estimate(value, *_interval(boot))


def paired_ratio(num_a: np.ndarray, num_b: np.ndarray, den_a: np.ndarray | None = None,
                 den_b: np.ndarray | None = None) -> Estimate:
    """``(sum(num_a)/sum(den_a)) / (sum(num_b)/sum(den_b))``, the same blocks and repetitions drawn for both."""
    num_a, num_b = np.asarray(num_a, dtype=float), np.asarray(num_b, dtype=float)
    point_a, point_b = _point(num_a), _point(num_b)
    den_a = np.ones_like(point_a) if den_a is None else np.asarray(den_a, dtype=float)
    den_b = np.ones_like(point_b) if den_b is None else np.asarray(den_b, dtype=float)
    if point_a.shape != point_b.shape:
        raise ValueError(f"paired blocks differ in number: {point_a.shape} and {point_b.shape}")

    def ratio(na, nb, da, db):
        with np.errstate(divide="ignore", invalid="ignore"):
            return (na / da) / (nb / db)

    value = float(ratio(point_a.sum(), point_b.sum(), den_a.sum(), den_b.sum()))
    if point_a.size < 2:
        return Estimate(value, float("nan"), float("nan"))
    idx = _draws(point_a.size)
    boot = ratio(_resampled(num_a, idx), _resampled(num_b, idx), den_a[idx].sum(axis=1), den_b[idx].sum(axis=1))
    return Estimate(value, *_interval(boot))


SPIKE_FACTOR = 3.0  # a step over this many times its median over the repetitions was interrupted: clipped there


def clipped_totals(per_rep: np.ndarray, keep: np.ndarray | None = None) -> np.ndarray:
    """Each repetition's total over the samples ``keep`` marks (default: the finite), each step clipped to
    :data:`SPIKE_FACTOR` x its median."""
    per_rep = np.asarray(per_rep, dtype=float)
    keep = np.isfinite(per_rep) if keep is None else keep
    clipped = np.minimum(per_rep, SPIKE_FACTOR * step_medians(per_rep))
    return np.where(keep, clipped, 0.0).sum(axis=1)


def step_medians(per_rep: np.ndarray) -> np.ndarray:
    """Each step's median over its finite samples (0 where it has none)."""
    per_rep = np.asarray(per_rep, dtype=float)
    if np.isfinite(per_rep).all():
        return np.median(per_rep, axis=0)
    finite = np.isfinite(per_rep).any(axis=0)
    out = np.zeros(per_rep.shape[1])
    out[finite] = np.nanmedian(per_rep[:, finite], axis=0)
    return out


TRIM = 0.2  # of the pairs at each end: one pair in five may be a process that ran apart from its twin
TRIM_FROM = 8  # pairs


def pair_logs(time_a: np.ndarray, time_b: np.ndarray, work_a: np.ndarray | float = 1.0,
              work_b: np.ndarray | float = 1.0, groups: np.ndarray | None = None) -> np.ndarray:
    """The log of A/B per unit of work of each pair of repetitions (``[reps, steps]``), one per ``groups`` label."""
    time_a, time_b = np.asarray(time_a, dtype=float), np.asarray(time_b, dtype=float)
    if time_a.shape != time_b.shape:
        raise ValueError(f"paired repetitions differ in shape: {time_a.shape} and {time_b.shape}")
    scale = float(np.sum(work_b)) / float(np.sum(work_a))
    both = np.isfinite(time_a) & np.isfinite(time_b)
    with np.errstate(divide="ignore", invalid="ignore"):
        logs = np.log(clipped_totals(time_a, both) / clipped_totals(time_b, both) * scale)
    if groups is None:
        return logs
    groups = np.asarray(groups)
    return np.array([logs[groups == g].mean() for g in dict.fromkeys(groups.tolist())])


def paired_reps(time_a: np.ndarray, time_b: np.ndarray, work_a: np.ndarray | float = 1.0,
                work_b: np.ndarray | float = 1.0, groups: np.ndarray | None = None) -> Estimate:
    """A/B per unit of work from repetitions replayed side by side: docs/measurement.md#stats."""
    return log_interval(pair_logs(time_a, time_b, work_a, work_b, groups))


def log_interval(logs: np.ndarray) -> Estimate:
    """The ratio of pairs whose logs are ``logs``, with its 95 % interval (docs/measurement.md#stats)."""
    from scipy.stats import mstats
    from scipy.stats import t as student_t

    logs = np.asarray(logs, dtype=float)
    if not np.all(np.isfinite(logs)):
        return Estimate(float("nan"), float("nan"), float("nan"))
    if logs.size < 2:
        return Estimate(float(np.exp(logs.mean())), float("nan"), float("nan"))
    if logs.size >= TRIM_FROM:
        mean = float(mstats.trimmed_mean(logs, limits=(TRIM, TRIM)))
        low, high = mstats.trimmed_mean_ci(logs, limits=(TRIM, TRIM), alpha=1 - CONFIDENCE)
        return Estimate(float(np.exp(mean)), float(np.exp(low)), float(np.exp(high)))
    mean = float(logs.mean())
    half = float(student_t.ppf((1 + CONFIDENCE) / 2, logs.size - 1) * logs.std(ddof=1) / np.sqrt(logs.size))
    return Estimate(float(np.exp(mean)), float(np.exp(mean - half)), float(np.exp(mean + half)))


def block_sums(per_step: np.ndarray, slices: list[tuple[int, int]]) -> np.ndarray:
    """Per-step values summed over each slice: ``[len(slices)]``."""
    per_step = np.asarray(per_step, dtype=float)
    return np.array([per_step[lo:hi].sum() for lo, hi in slices])


def rep_levels(per_rep: np.ndarray, slices: list[tuple[int, int]]) -> np.ndarray:
    """Each repetition's level: the median over blocks of its block time over the figure's (the per-step medians
    summed), blocks without time left out (1 where none is left)."""
    per_rep = np.asarray(per_rep, dtype=float)
    medians = step_medians(per_rep)
    levels = []
    for x in per_rep:
        whole = np.isfinite(x)  # a repetition's level over the steps it ran whole
        mine, figure = block_sums(np.where(whole, x, 0.0), slices), block_sums(np.where(whole, medians, 0.0), slices)
        busy = figure > 0
        levels.append(np.median(mine[busy] / figure[busy]) if busy.any() else 1.0)
    return np.array(levels)


def block_medians(per_rep: np.ndarray, slices: list[tuple[int, int]], resamples: int = RESAMPLES) -> np.ndarray:
    """From per-step values of every repetition (``[reps, steps]``): ``[1 + resamples, blocks]``."""
    per_rep = np.asarray(per_rep, dtype=float)
    point = block_sums(step_medians(per_rep), slices)
    levels = rep_levels(per_rep, slices)
    factor = np.median(levels[rep_draws(per_rep.shape[0], resamples)], axis=1) / np.median(levels)
    return np.vstack([point[None, :], factor[:, None] * point[None, :]])


def median_estimate(samples: np.ndarray) -> Estimate:
    """The median of independent samples with its bootstrap interval (no slices to pair)."""
    samples = np.asarray(samples, dtype=float)
    value = float(np.median(samples))
    if samples.size < 2:
        return Estimate(value, float("nan"), float("nan"))
    return Estimate(value, *_interval(np.median(samples[_draws(samples.size)], axis=1)))


def independent_ratio(num: Estimate, den: Estimate) -> Estimate:
    """``num / den`` of two independently measured figures, its 95 % interval combined from theirs on the log scale
    (MOVER, Zou and Donner: half-widths added in quadrature, so a skewed interval keeps its skew)."""
    value = num.value / den.value if den.value > 0 else float("nan")
    bounds = (num.value, num.low, num.high, den.value, den.low, den.high)
    if not all(np.isfinite(b) and b > 0 for b in bounds):
        return Estimate(value, float("nan"), float("nan"))
    ln_n, ln_nl, ln_nh, ln_d, ln_dl, ln_dh = np.log(bounds)
    below = np.hypot(max(0.0, ln_n - ln_nl), max(0.0, ln_dh - ln_d))
    above = np.hypot(max(0.0, ln_nh - ln_n), max(0.0, ln_d - ln_dl))
    return Estimate(value, float(np.exp(ln_n - ln_d - below)), float(np.exp(ln_n - ln_d + above)))
