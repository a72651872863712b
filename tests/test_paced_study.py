"""The paced study: every paced loop repeated and interleaved, medians with intervals, the floor in the same run
(structure and bookkeeping only: no figure's size is asserted)."""

from __future__ import annotations

import pytest

from harness.base.drivers import Prepared
from harness.studies.paced import paced_loop
from harness.studies.paced_study import PacedCells, PacedHooks, PacedKind, above, paced_study_rows, run_interleaved
from impls import REGISTRY
from scenarios import generate

RATE = 20_000.0  # steps/s: 30 steps take 1.5 ms of pacing, so the study runs in a blink


@pytest.fixture(scope="module")
def prep() -> Prepared:
    return Prepared.from_trace(generate("paper", steps=30, running=32, num_blocks=2048))


def makers(prep: Prepared, cells):
    return {c: (lambda impl=c[0]: REGISTRY[impl](**prep.trace.config)) for c in cells}


def test_every_loop_is_repeated_with_an_interval_and_the_floor_is_its_own_row(prep: Prepared) -> None:
    cells = [("flat", "batched"), ("dict", "per-call")]
    rows = paced_study_rows(PacedCells("paper", prep, makers(prep, cells), {c: REGISTRY[c[0]] for c in cells}, RATE,
                                       False, reps=3))
    by = {(r.impl, r.regime, r.metric): r for r in rows}
    assert set(by) == {("flat", "batched", "cpu_share_observed_pct"), ("flat", "batched", "deadline_misses"),
                       ("flat", "batched", "cpu_share_observed_whole_step_pct"),
                       ("flat", "batched", "deadline_misses_whole_step"), ("flat", "batched", "paced_above_floor_pct"),
                       ("flat", "batched", "paced_step_over_kernel_pct"),
                       ("dict", "per-call", "cpu_share_observed_pct"), ("dict", "per-call", "deadline_misses"),
                       ("-", "-", "paced_floor_pct")}
    assert all(r.status == "ok" and r.reps == 3 and r.steps == 30 for r in rows)
    shares = [r for r in rows if r.unit == "%"]
    assert all(r.ci_low is not None and r.ci_low <= r.value <= r.ci_high and r.step_rate == RATE for r in shares)
    assert all(r.driver == "python" for r in rows)


def test_the_loops_rotate_from_repetition_to_repetition() -> None:
    log: list[str] = []

    def kind(name: str) -> PacedKind:
        def start():
            return (lambda lo, hi: log.append(name) if lo == 0 and hi > 0 else None), (lambda steps: None)
        return PacedKind(name, "-", "calls", start)

    kinds = [kind("a"), kind("b"), kind("c")]
    reps_done: list[int] = []
    run_interleaved(kinds, 1e6, 1, 3, PacedHooks(on_repetition=reps_done.append))
    assert log[:3] == ["a", "b", "c"]  # the first calls, outside every measurement
    assert log[3:] == ["a", "b", "c", "b", "c", "a", "c", "a", "b"]
    assert reps_done == [0, 1, 2] and all(len(k.cpu_ns) == 3 for k in kinds)


def test_a_failing_loop_is_a_failed_row_and_the_others_go_on(prep: Prepared) -> None:
    cells = [("flat", "batched"), ("dict", "batched")]
    make = makers(prep, cells)

    class Broken(REGISTRY["dict"]):  # the design's own code fails: its cell, not the run
        def __init__(self, *args, **kwargs) -> None:
            raise KeyError("no such manager")

    make[("dict", "batched")] = lambda: Broken(**prep.trace.config)
    classes = {**{c: REGISTRY[c[0]] for c in cells}, ("dict", "batched"): Broken}
    rows = paced_study_rows(PacedCells("paper", prep, make, classes, RATE, False, reps=2))
    failed = [r for r in rows if r.status == "failed"]
    assert {(r.impl, r.metric) for r in failed} == {("dict", "cpu_share_observed_pct"),
                                                   ("dict", "cpu_share_observed_whole_step_pct")}
    assert all("KeyError" in r.how for r in failed)
    assert {r.metric for r in rows if r.impl == "flat" and r.status == "ok"} >= {"cpu_share_observed_pct",
                                                                                  "paced_above_floor_pct"}


def test_on_a_caching_trace_the_whole_step_is_unsupported_not_guessed(prep: Prepared) -> None:
    cells = [("flat", "batched")]
    rows = paced_study_rows(PacedCells("paper", prep, makers(prep, cells), {c: REGISTRY[c[0]] for c in cells}, RATE,
                                       True, reps=2))
    whole = [r for r in rows if r.metric == "cpu_share_observed_whole_step_pct"]
    assert [(w.status, w.how) for w in whole] == [("unsupported", "step() does not take the prefix-caching ops yet")]
    assert not [r for r in rows if r.metric in ("paced_above_floor_pct", "paced_step_over_kernel_pct")]


def test_above_the_floor_compares_the_cpu_inside_the_calls_only() -> None:
    # Whole loops that differ by a lot (the wake-ups' noise) and calls that differ by exactly 0.5 % of the wall time:
    # the figure is the calls' difference, paired repetition by repetition.
    step = PacedKind("flat", "batched", "step", lambda: (None, lambda steps: None),
                     cpu_ns=[9_000_000, 1_000_000], wall_ns=[1_000_000_000, 2_000_000_000],
                     callee_ns=[7_000_000, 12_000_000])
    floor = PacedKind("-", "-", "floor", lambda: (None, lambda steps: None),
                      cpu_ns=[1_000_000, 8_000_000], wall_ns=[1_000_000_000, 2_000_000_000],
                      callee_ns=[2_000_000, 2_000_000])
    assert above(step, floor).tolist() == pytest.approx([0.5, 0.5])


def test_a_paced_loop_reads_the_time_inside_its_calls_within_its_whole_time() -> None:
    work = paced_loop(lambda lo, hi: sum(range(20_000)), 20_000.0, 40)
    idle = paced_loop(None, 20_000.0, 40)
    assert 0 < work.callee_ns <= work.cpu_ns and 0 <= idle.callee_ns <= idle.cpu_ns
    assert work.callee_ns > idle.callee_ns  # the calls' work is inside; the idle loop only read the clock
