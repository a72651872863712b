"""Metric computation from raw samples, with fake timings (no clock involved)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from harness.base.drivers import KINDS, StepTimes
from harness.base.metrics import Work, timing_rows
from harness.base.stats import block_medians, block_sums, paired_ratio, ratio_of_sums, rep_levels


def fake(step_ns: list[float], alloc=0.0, free=0.0, lookup=0.0, regions=2.0) -> StepTimes:
    n = len(step_ns)
    ns = np.zeros((n, len(KINDS)))
    ns[:, KINDS.index("alloc")] = alloc / n
    ns[:, KINDS.index("free")] = free / n
    ns[:, KINDS.index("lookup")] = lookup / n
    ns[:, KINDS.index("decode")] = step_ns
    return StepTimes(ns, np.zeros(n, dtype=np.int64), np.array(step_ns, dtype=float), regions, "fake")


WORK = Work.uniform(steps=4, seqs_per_step=100, alloc_blocks=10, free_blocks=30)


def rows_by_metric(rows):
    return {r.metric: r for r in rows}


def test_per_unit_figures_use_the_right_denominators() -> None:
    samples = [fake([100.0, 100.0, 100.0, 100.0], alloc=50.0, free=90.0, lookup=800.0)]
    rows = rows_by_metric(timing_rows(("s", "i", "batched"), WORK, samples, samples, 2000, 10.0, "test"))
    assert rows["seq_step_ns"].value == pytest.approx(400 / 400)
    assert rows["alloc_ns"].value == pytest.approx(50 / 10)
    assert rows["free_ns"].value == pytest.approx(90 / 30)
    assert rows["alloc_free_ns"].value == pytest.approx(140 / 40)
    assert rows["lookup_ns"].value == pytest.approx(800 / 400)
    assert rows["cpu_share_pct"].value == pytest.approx(100 * 2000 / 1e9 * 100)
    assert rows["cpu_share_pct"].step_rate == 2000
    assert rows["harness_overhead_ns"].value == pytest.approx(20.0)
    assert rows["harness_overhead_pct"].value == pytest.approx(20.0)
    assert all(r.source == "fake" for r in rows.values() if r.metric.endswith("_ns") and "overhead" not in r.metric)
    assert rows["seq_step_ns"].reps == 1 and rows["seq_step_ns"].steps == 4 and rows["seq_step_ns"].seqs == 100


def test_percentiles_and_max() -> None:
    steps = [float(x) for x in range(1, 101)]
    work = Work.uniform(100, 1, 1, 1)
    rows = rows_by_metric(timing_rows(("s", "i", "r"), work, [fake(steps)], [fake(steps)], 2000, 0, ""))
    assert rows["step_p50_ns"].value == pytest.approx(50.5)
    assert rows["step_p99_ns"].value == pytest.approx(np.percentile(steps, 99))
    assert rows["step_max_ns"].value == 100.0


def test_a_step_slow_in_one_repetition_only_is_dropped() -> None:
    """Each step's median over repetitions: a one-off stall (a preemption) does not move the figure, a step
    that is slow in every repetition (real work) does."""
    reps = [fake([10.0, 10.0, 10.0, 10.0]), fake([10.0, 5000.0, 10.0, 10.0]), fake([10.0, 10.0, 10.0, 10.0])]
    rows = rows_by_metric(timing_rows(("s", "i", "r"), WORK, reps, reps, 2000, 0, ""))
    assert rows["step_mean_ns"].value == 10.0
    slow = [fake([10.0, 500.0, 10.0, 10.0])] * 3
    assert rows_by_metric(timing_rows(("s", "i", "r"), WORK, slow, slow, 2000, 0, ""))["step_mean_ns"].value == 132.5


def test_intervals_come_from_slices_and_bracket_the_figure() -> None:
    work = Work.uniform(40, 10)
    rng = np.random.default_rng(1)
    samples = [fake(list(100 + rng.normal(0, 10, 40))) for _ in range(3)]
    rows = rows_by_metric(timing_rows(("s", "i", "r"), work, samples, samples, 2000, 0, "",
                                      [(lo, lo + 4) for lo in range(0, 40, 4)]))
    row = rows["seq_step_ns"]
    assert row.ci_low < row.value < row.ci_high
    assert row.ci_high - row.ci_low < 2  # ten slices of a 10 % noise around 10 ns per seq-step


def test_missing_work_is_skipped_not_zero() -> None:
    no_pool = Work.uniform(steps=4, seqs_per_step=100)
    rows = rows_by_metric(timing_rows(("s", "i", "r"), no_pool, [fake([1.0] * 4)], [fake([1.0] * 4)], 2000, 0, ""))
    for metric in ("alloc_ns", "free_ns", "alloc_free_ns"):
        assert rows[metric].status == "skipped" and math.isnan(rows[metric].value)


def test_paired_ratio_cancels_drift_that_hits_both() -> None:
    drift = np.array([1.0, 3.0, 1.0, 5.0, 1.0, 2.0, 4.0, 1.0])  # the machine's speed, slice by slice
    a, b = 7.0 * drift, 1.0 * drift
    paired = paired_ratio(a, b)
    assert paired.value == pytest.approx(7.0) and paired.low == pytest.approx(7.0) and paired.high == pytest.approx(7.0)
    alone = ratio_of_sums(a, np.ones_like(a))
    assert alone.high - alone.low > 5  # the same drift, unpaired: a wide interval
    assert paired_ratio(b, b).contains(1.0)


def _managers(factors: list[float], steps: int = 400, seed: int = 1) -> np.ndarray:
    """Per-step times of repetitions whose managers run at ``factors`` of the true speed, with step noise."""
    rng = np.random.default_rng(seed)
    return np.array([f * (100.0 + rng.normal(0, 2, steps)) for f in factors])


def test_an_interval_includes_the_spread_between_repetitions_managers() -> None:
    """Two identical cells: the copy's managers landed slow in two repetitions of three (a layout effect that
    lasts a whole repetition). Blocks alone give a tight interval that excludes 1; drawing the repetitions
    too gives one that holds it."""
    slices = [(lo, lo + 20) for lo in range(0, 400, 20)]
    copy, orig = _managers([1.08, 1.10, 0.95]), _managers([1.0, 1.0, 1.0], seed=2)
    blocks_only = paired_ratio(block_sums(np.median(copy, axis=0), slices), block_sums(np.median(orig, axis=0), slices))
    both = paired_ratio(block_medians(copy, slices), block_medians(orig, slices))
    assert both.value == pytest.approx(blocks_only.value) and blocks_only.value == pytest.approx(1.08, abs=0.01)
    assert not blocks_only.contains(1.0)
    assert both.contains(1.0) and both.low < 0.97 and both.high > 1.07


def test_one_repetition_leaves_the_blocks_interval() -> None:
    slices = [(lo, lo + 20) for lo in range(0, 400, 20)]
    one = _managers([1.0])
    rows = block_medians(one, slices)
    assert rows.shape == (2001, 20) and np.all(rows == rows[0])
    alone = ratio_of_sums(block_sums(one[0], slices), np.ones(20))
    assert ratio_of_sums(rows, np.ones(20)) == alone


def test_block_medians_first_row_is_the_per_step_median_and_resamples_scale_it() -> None:
    slices = [(0, 2), (2, 4), (4, 6)]
    per_rep = np.array([[1.0, 90.0, 1.0, 1.0, 1.0, 1.0], [2.0] * 6, [3.0] * 6])
    rows = block_medians(per_rep, slices)
    assert rows[0].tolist() == [2.0 + 3.0, 2.0 + 2.0, 2.0 + 2.0]  # the 90 (one slow step) drops out
    assert rep_levels(per_rep, slices).tolist() == [0.5, 1.0, 1.5]
    ratios = rows[1:] / rows[0]
    assert np.allclose(ratios, ratios[:, :1])  # a resample scales the figure as a whole
    assert set(np.round(ratios[:, 0], 6)) <= {0.5, 1.0, 1.5}  # a median of three drawn levels
    assert ratios.max() == 1.5 and ratios.min() == 0.5  # never the 90: a preempted step stays out
    with pytest.raises(ValueError, match="resamples"):
        ratio_of_sums(rows[:10], np.ones(3))
    assert rep_levels(np.zeros((3, 6)), slices).tolist() == [1.0, 1.0, 1.0]  # no work in any step
