"""The observed CPU share: an open-loop run paced at the target step rate.

A Python scheduler loop issues each step at its deadline (``t0 + step / rate``), sleeping in between, as an
engine's host thread would between GPU steps. The block manager's CPU share is the thread CPU time of the
run minus that of an identical paced run that does no block-manager work (the pacing's own cost), divided by
the wall time. A deadline miss is a step whose work ends after the next step was due. Compiled designs are
called from Python here (one ``decode_step`` call per step, dispatch included): that is how an engine would
call them. :func:`paced_whole_step_run` paces the whole-step entry point instead: one ``step`` call per step,
pool operations included, as an engine using it would call it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from harness.measure.drivers import Prepared, step_runner, whole_step_runner
from harness.measure.replay import ReplayError, check_end_state


@dataclass
class PacedResult:
    cpu_share_pct: float
    deadline_misses: int
    steps: int
    wall_s: float
    pacing_cpu_ns: int


def _paced_loop(run_step, rate: float, steps: int) -> tuple[int, int, int]:
    """Run ``steps`` steps at ``rate``; returns (thread CPU ns, wall ns, misses). ``run_step=None``: pacing only."""
    period = 1e9 / rate
    misses = 0
    cpu0, t0 = time.thread_time_ns(), time.perf_counter_ns()
    for s in range(steps):
        due = t0 + s * period
        wait = due - time.perf_counter_ns()
        if wait > 0:
            time.sleep(wait / 1e9)
        if run_step is not None:
            run_step(s, s + 1)
        if time.perf_counter_ns() > due + period:
            misses += 1
    return time.thread_time_ns() - cpu0, time.perf_counter_ns() - t0, misses


def paced_run(prep: Prepared, make_mgr, regime: str, rate: float, steps: int | None = None) -> PacedResult:
    """Observed CPU share of one implementation at ``rate`` steps/s over the first ``steps`` steps."""
    steps = min(steps or prep.num_steps, prep.num_steps)
    idle_cpu, _, _ = _paced_loop(None, rate, steps)
    cpu, wall, misses = _paced_loop(step_runner(prep, make_mgr(), regime), rate, steps)
    share = (cpu - idle_cpu) / wall * 100  # not clamped: a negative figure would show the noise floor
    return PacedResult(share, misses, steps, wall / 1e9, idle_cpu)


def paced_whole_step_run(prep: Prepared, make_mgr, rate: float, steps: int | None = None) -> PacedResult:
    """Observed CPU share of one implementation's whole-step entry point (one ``step`` call per step) at
    ``rate`` steps/s over the first ``steps`` steps. Copy-on-write counts (and, over the whole trace, the end
    state) are checked after the paced loop, outside the measured thread time."""
    steps = min(steps or prep.num_steps, prep.num_steps)
    mgr = make_mgr()
    cows = np.zeros(prep.num_steps, dtype=np.int64)
    run = whole_step_runner(prep, mgr, cows, check=False)
    idle_cpu, _, _ = _paced_loop(None, rate, steps)
    cpu, wall, misses = _paced_loop(run, rate, steps)
    bad = np.flatnonzero(cows[:steps] != prep.trace.step_cows[:steps])
    if bad.size:
        s = int(bad[0])
        raise ReplayError(f"step {s}: step() returned {cows[s]}, the trace expects {prep.trace.step_cows[s]}")
    if steps == prep.num_steps:
        check_end_state(prep.trace, mgr)
    return PacedResult((cpu - idle_cpu) / wall * 100, misses, steps, wall / 1e9, idle_cpu)
