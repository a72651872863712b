"""Compiled and C++ whole steps replayed alone, warm and cold. Design: docs/measurement.md#cache_state."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from harness.base.failures import blamed_on
from harness.base.interleave import Driver, frozen_gc, slice_bounds
from harness.base.replay import check_end_state
from harness.base.rows import Row
from harness.base.stats import median_estimate
from harness.base.steptimes import StepTimes, concat
from harness.errors import DesignFailure

REPS = 7
EVICT_BYTES = 64 << 20  # twice the largest last-level cache we run on
KINDS = ("compiled", "native")
METRICS = {"warm": "seq_step_alone_warm_ns", "cold": "seq_step_alone_cold_ns"}
HOW = {"warm": "the whole trace replayed in one call per repetition, alone in the design's worker after the run's "
               "timings, repetitions back to back: the caches as the design's own steps left them",
       "cold": "the trace replayed in the run's slices, alone in the design's worker after the run's timings, a "
               f"{EVICT_BYTES >> 20} MiB buffer read and written before every slice: every slice starts with "
               "nothing of the design in the caches, whichever designs shared the run"}


@dataclass
class Evictor:
    """A buffer whose every cache line :meth:`evict` reads and writes."""

    buffer: np.ndarray

    @classmethod
    def make(cls, nbytes: int = EVICT_BYTES) -> Evictor:
        return cls(np.ones(nbytes, dtype=np.uint8))

    def evict(self) -> None:
        self.buffer[::64] += 1


def replay(driver: Driver, cold: Evictor | None) -> tuple[object, StepTimes]:
    """One repetition on a fresh manager: whole (``cold`` None) or slice by slice after an eviction each."""
    mgr = driver.new()
    n = driver.prep.num_steps
    parts = []
    for lo, hi in slice_bounds(n) if cold is not None else [(0, n)]:
        if cold is not None:
            cold.evict()
        parts.append(driver.timed(mgr, False, lo, hi))
    return mgr, concat(parts)


def check_replay(driver: Driver, mgr: object, samples: StepTimes) -> None:
    """:class:`ReplayError` unless a whole replay's copy-on-writes, slots and end state are the trace's."""
    trace = driver.prep.trace
    samples.check(trace.step_cows, driver.prep.slot_digests)
    check_end_state(trace, mgr)


def per_seq_step(driver: Driver, cold: Evictor | None, reps: int) -> np.ndarray:
    """ns per sequence-step of ``reps`` repetitions after one left out, every replay checked after the last."""
    work = float(driver.prep.trace.running_per_step().sum())
    with frozen_gc():
        done = [replay(driver, cold) for _ in range(reps + 1)]
    for mgr, samples in done:
        check_replay(driver, mgr, samples)
    return np.array([float(samples.step_ns.sum()) / work for _, samples in done[1:]])


def cell_rows(scenario: str, driver: Driver, evictor: Evictor, reps: int = REPS) -> list[Row]:
    """The cell's warm and cold rows (failed ones, with the reason, when the design fails)."""
    rows = []
    for state, metric in METRICS.items():
        try:
            with blamed_on(driver.impl, driver.cls):
                per_rep = per_seq_step(driver, evictor if state == "cold" else None, reps)
        except DesignFailure as exc:
            rows.append(Row(scenario, driver.impl, driver.regime, metric, float("nan"), "ns", "rdtsc",
                            "failed", exc.reason, driver=driver.kind))
            continue
        est = median_estimate(per_rep)
        rows.append(Row(scenario, driver.impl, driver.regime, metric, est.value, "ns", "rdtsc", "ok",
                        f"{HOW[state]}; {driver.how()}; median of {reps} repetitions, 95 % bootstrap interval",
                        reps=reps, steps=driver.prep.num_steps, ci_low=est.low, ci_high=est.high,
                        driver=driver.kind))
    return rows


def cache_state_rows(scenario: str, drivers: list[Driver], evictor: Evictor | None = None,
                     enter: Callable[[tuple[str, str] | None], None] = lambda cell: None) -> list[Row]:
    """Warm and cold rows of every batched cell among ``drivers`` whose replay runs compiled or in C++ (``enter``
    is told the cell whose code is about to run, None after the last)."""
    timed = [d for d in drivers if d.regime == "batched" and d.kind in KINDS]
    if not timed:
        return []
    evictor = evictor or Evictor.make()
    rows = []
    for driver in timed:
        enter((driver.impl, driver.regime))
        rows += cell_rows(scenario, driver, evictor)
    enter(None)
    return rows
