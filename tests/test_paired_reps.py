"""NEW/BASE from repetitions replayed side by side (harness.base.stats.paired_reps): what `ab` decides by."""

from __future__ import annotations

import numpy as np
import pytest

from harness.base.stats import SPIKE_FACTOR, clipped_totals, paired_reps


def _side(rng: np.random.Generator, reps: int, steps: int, cost: np.ndarray, manager_sd: float,
          load: np.ndarray) -> np.ndarray:
    """Per repetition and step: the step's cost, times a level of the repetition's own manager (its layout), times
    the load of its window of time (shared by both sides), times a little noise of each step's own."""
    managers = np.exp(rng.normal(0, manager_sd, size=(reps, 1)))
    return cost[None, :] * managers * load * np.exp(rng.normal(0, 0.05, size=(reps, steps)))


def test_the_interval_covers_the_truth_when_managers_differ_as_well_as_the_load() -> None:
    """Each repetition's manager is 10 % faster or slower than another (a layout), the load drifts 2x between
    windows, the same for both sides: the 95 % interval holds the true ratio in about 95 of 100 pairs of runs."""
    rng = np.random.default_rng(11)
    reps, steps, held = 9, 200, 0
    cost = rng.uniform(1, 3, size=steps)
    for truth in np.repeat([1.0, 1.15], 100):
        load = np.exp(rng.uniform(0, np.log(2), size=(reps, 1)))
        est = paired_reps(_side(rng, reps, steps, cost * truth, 0.1, load), _side(rng, reps, steps, cost, 0.1, load))
        held += est.low <= truth <= est.high
    assert 180 <= held <= 198, held


def test_a_load_shared_by_both_sides_cancels() -> None:
    """Windows of time 2x apart in load, managers alike: the interval of the same code is narrow around 1, and a
    15 % slower NEW lies wholly beyond 10 %."""
    rng = np.random.default_rng(5)
    cost = rng.uniform(1, 3, size=400)
    load = np.exp(rng.uniform(0, np.log(2), size=(9, 1)))
    same = paired_reps(_side(rng, 9, 400, cost, 0.0, load), _side(rng, 9, 400, cost, 0.0, load))
    assert abs(same.value - 1) < 0.01 and same.high / same.low < 1.02, same
    slowed = paired_reps(_side(rng, 9, 400, cost * 1.15, 0.0, load), _side(rng, 9, 400, cost, 0.0, load))
    assert slowed.low > 1.1, slowed


def test_a_preempted_step_is_clipped_and_a_slowdown_of_few_steps_is_kept() -> None:
    """A step 1000x its cost in one repetition (a preemption) moves nothing; NEW twice as slow in one step of
    seven (a boundary path) is a real slowdown of the total, and the estimate keeps it (a median would not)."""
    rng = np.random.default_rng(2)
    cost = np.ones(700)
    load = np.ones((9, 1))
    base = _side(rng, 9, 700, cost, 0.0, load)
    new = base * np.exp(rng.normal(0, 0.01, size=base.shape))
    spiked = new.copy()
    spiked[4, 100] *= 1000
    assert paired_reps(spiked, base).value == pytest.approx(paired_reps(new, base).value, rel=1e-3)
    assert clipped_totals(spiked)[4] <= new[4].sum() + SPIKE_FACTOR * np.median(new[:, 100])
    boundary = new.copy()
    boundary[:, ::7] *= 2
    est = paired_reps(boundary, base)
    assert est.value == pytest.approx(1 + 1 / 7, rel=0.02) and est.low > 1.1, est


def test_per_unit_of_work_unequal_shapes_and_empty_work() -> None:
    """Work scales the ratio; repetitions that do not pair are refused; a zero total is no figure (NaN)."""
    times = np.ones((3, 10))
    assert paired_reps(2 * times, times, work_a=np.full(10, 2.0), work_b=np.ones(10)).value == pytest.approx(1.0)
    with pytest.raises(ValueError, match="differ in shape"):
        paired_reps(np.ones((3, 10)), np.ones((4, 10)))
    assert np.isnan(paired_reps(np.zeros((3, 10)), times).value)
    single = paired_reps(np.ones((1, 10)), np.ones((1, 10)))
    assert single.value == 1.0 and np.isnan(single.low)


def test_one_pair_whose_process_ran_apart_moves_neither_the_figure_nor_its_interval() -> None:
    """One repetition of eight on one side 30 % slower throughout (seen under the noisy neighbour: a process apart
    from its twin, in every figure): the trimmed estimate stays within 1 % and its interval narrow; a second such
    pair of eight is beyond what the trimming absorbs, and the interval widens rather than the figure moving."""
    rng = np.random.default_rng(3)
    cost, load = rng.uniform(1, 3, size=300), np.exp(rng.uniform(0, np.log(2), size=(8, 1)))
    base, new = _side(rng, 8, 300, cost, 0.01, load), _side(rng, 8, 300, cost, 0.01, load)
    clean = paired_reps(new, base)
    apart = base.copy()
    apart[5] *= 1.3
    est = paired_reps(new, apart)
    assert abs(est.value / clean.value - 1) < 0.01 and est.high / est.low < 1.03, (clean, est)
    apart[2] *= 1.3
    twice = paired_reps(new, apart)
    assert twice.low < clean.low and twice.high / twice.low > est.high / est.low, twice


def test_below_eight_pairs_the_mean_is_not_trimmed() -> None:
    """Five pairs: the plain mean log ratio and its Student-t interval (trimming would leave 2 degrees of freedom)."""
    from scipy.stats import t as student_t

    rng = np.random.default_rng(4)
    base = rng.uniform(1, 2, size=(5, 50))
    logs = rng.normal(0.05, 0.03, size=5)
    est = paired_reps(base * np.exp(logs)[:, None], base)
    half = student_t.ppf(0.975, 4) * logs.std(ddof=1) / np.sqrt(5)
    assert est.value == pytest.approx(np.exp(logs.mean())) and est.low == pytest.approx(np.exp(logs.mean() - half))
