"""Metric computation from raw samples, with fake timings (no clock involved)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from harness.measure.drivers import KINDS, StepTimes
from harness.measure.metrics import Work, timing_rows


def fake(step_ns: list[float], alloc=0.0, free=0.0, lookup=0.0, regions=2.0) -> StepTimes:
    n = len(step_ns)
    ns = np.zeros((n, len(KINDS)))
    ns[:, KINDS.index("alloc")] = alloc / n
    ns[:, KINDS.index("free")] = free / n
    ns[:, KINDS.index("lookup")] = lookup / n
    ns[:, KINDS.index("decode")] = step_ns
    return StepTimes(ns, np.zeros(n, dtype=np.int64), np.array(step_ns, dtype=float), regions, "fake")


WORK = Work(seq_steps=400, steps=4, blocks_allocated=10, blocks_freed=30)


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
    assert rows["harness_overhead_ns"].value == pytest.approx(20.0)
    assert rows["harness_overhead_pct"].value == pytest.approx(20.0)
    assert all(r.source == "fake" for r in rows.values() if r.metric.endswith("_ns") and "overhead" not in r.metric)


def test_percentiles_and_max() -> None:
    steps = [float(x) for x in range(1, 101)]
    rows = rows_by_metric(timing_rows(("s", "i", "r"), Work(100, 100, 1, 1), [fake(steps)], [fake(steps)], 2000, 0, ""))
    assert rows["step_p50_ns"].value == pytest.approx(50.5)
    assert rows["step_p99_ns"].value == pytest.approx(np.percentile(steps, 99))
    assert rows["step_max_ns"].value == 100.0


def test_median_over_repetitions() -> None:
    reps = [fake([10.0] * 4), fake([1000.0] * 4), fake([20.0] * 4)]
    rows = rows_by_metric(timing_rows(("s", "i", "r"), WORK, reps, reps, 2000, 0, ""))
    assert rows["step_mean_ns"].value == 20.0  # the outlier repetition does not move the median
    assert "median of 3 rep(s)" in rows["step_mean_ns"].how


def test_missing_work_is_skipped_not_zero() -> None:
    no_pool = Work(seq_steps=400, steps=4, blocks_allocated=0, blocks_freed=0)
    rows = rows_by_metric(timing_rows(("s", "i", "r"), no_pool, [fake([1.0] * 4)], [fake([1.0] * 4)], 2000, 0, ""))
    for metric in ("alloc_ns", "free_ns", "alloc_free_ns"):
        assert rows[metric].status == "skipped" and math.isnan(rows[metric].value)
