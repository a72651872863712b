"""The observed CPU share: an open-loop run paced at the target step rate. Design: docs/measurement.md#paced."""

from __future__ import annotations

import time
from dataclasses import dataclass
from functools import partial
from typing import NamedTuple

import numpy as np
from numba import njit

from harness.base.drivers import Prepared, step_runner, whole_step_runner
from harness.base.replay import ReplayError, check_end_state
from impls.core.compiled import exact_step_kernel


@dataclass
class PacedResult:
    cpu_share_pct: float
    deadline_misses: int
    steps: int
    wall_s: float
    pacing_cpu_ns: int


class Paced(NamedTuple):
    """Thread CPU ns of a paced loop, its wall ns, deadline misses, and the thread CPU ns inside its calls."""

    cpu_ns: int
    wall_ns: int
    misses: int
    callee_ns: int


def paced_loop(run_step, rate: float, steps: int) -> Paced:
    """Run ``steps`` steps at ``rate`` (``run_step=None``: pacing only, the clock read alike)."""
    period = 1e9 / rate
    misses = callee = 0
    cpu0, t0 = time.thread_time_ns(), time.perf_counter_ns()
    for s in range(steps):
        due = t0 + s * period
        wait = due - time.perf_counter_ns()
        if wait > 0:
            time.sleep(wait / 1e9)
        before = time.thread_time_ns()
        if run_step is not None:
            run_step(s, s + 1)
        callee += time.thread_time_ns() - before
        if time.perf_counter_ns() > due + period:
            misses += 1
    return Paced(time.thread_time_ns() - cpu0, time.perf_counter_ns() - t0, misses, callee)


def paced_run(prep: Prepared, make_mgr, regime: str, rate: float, steps: int | None = None) -> PacedResult:
    """Observed CPU share of one implementation at ``rate`` steps/s over ``steps`` steps, via ``regime``'s path."""
    steps = min(steps or prep.num_steps, prep.num_steps)
    run, check = paced_runner(prep, make_mgr, regime)
    idle, loop = paced_loop(None, rate, steps), paced_loop(run, rate, steps)
    check(steps)
    share = (loop.cpu_ns - idle.cpu_ns) / loop.wall_ns * 100  # not clamped: a negative figure shows the noise floor
    return PacedResult(share, loop.misses, steps, loop.wall_ns / 1e9, idle.cpu_ns)


def _checked_inside(steps: int) -> None:
    """The per-call and batched loops check each pool op's answer as they go: nothing is left to check."""


def paced_runner(prep: Prepared, make_mgr, regime: str):
    """``(run, check)`` over a fresh manager through the path ``regime`` names; ``ValueError`` for an unknown one."""
    if regime == "step":
        return whole_step_paced(prep, make_mgr)
    return step_runner(prep, make_mgr(), regime), _checked_inside


def whole_step_paced(prep: Prepared, make_mgr):
    """``(run, check)`` over a fresh manager, ``run`` making unchecked ``step`` calls."""
    mgr = make_mgr()
    cows = np.zeros(prep.num_steps, dtype=np.int64)
    return whole_step_runner(prep, mgr, cows, check=False), _step_check(prep, mgr, cows, "step()")


def kernel_paced(prep: Prepared, make_mgr):
    """``(run, check)``, ``run`` calling a fresh compiled manager's step kernel straight: ``step()`` less its work."""
    mgr = make_mgr()
    state = mgr.state
    kernel = partial(exact_step_kernel(mgr.kernels, state), state)
    args, buffers, limits = step_arguments(prep)
    cows = np.zeros(prep.num_steps, dtype=np.int64)

    def run(lo: int, hi: int) -> None:
        for s in range(lo, hi):
            cows[s], _ = kernel(*args[s], *buffers, *limits)

    return run, _step_check(prep, mgr, cows, "the step kernel")


def _step_check(prep: Prepared, mgr, cows: np.ndarray, what: str):
    """``check(steps)``: the copy-on-writes ``what`` returned, and after the last step the end state, are right."""

    def check(steps: int) -> None:
        bad = np.flatnonzero(cows[:steps] != prep.trace.step_cows[:steps])
        if bad.size:
            s = int(bad[0])
            raise ReplayError(f"step {s}: {what} returned {cows[s]}, the trace expects {prep.trace.step_cows[s]}")
        if steps == prep.num_steps:
            check_end_state(prep.trace, mgr)

    return check


def paced_whole_step_run(prep: Prepared, make_mgr, rate: float, steps: int | None = None) -> PacedResult:
    """Observed CPU share of one ``step`` call per step at ``rate`` steps/s over ``steps`` steps."""
    steps = min(steps or prep.num_steps, prep.num_steps)
    run, check = whole_step_paced(prep, make_mgr)
    idle, loop = paced_loop(None, rate, steps), paced_loop(run, rate, steps)
    check(steps)
    return PacedResult((loop.cpu_ns - idle.cpu_ns) / loop.wall_ns * 100, loop.misses, steps, loop.wall_ns / 1e9,
                       idle.cpu_ns)


@njit  # not cached: the scripts that import it run as __main__
def noop_step(ops, a0, a1, seq_ids, status_out, cow_out, slot_out, rows, max_tokens, num_blocks):
    """Takes what a compiled design's step kernel takes and does nothing: one crossing, its arguments unboxed."""
    return 0, -1


def step_arguments(prep: Prepared) -> tuple[list[tuple[np.ndarray, ...]], tuple[np.ndarray, ...], tuple[int, ...]]:
    """What a step kernel is called with, for every step of the trace."""
    op, a0, a1 = prep.arrays64
    args = [(op[f:m], a0[f:m], a1[f:m], prep.decode_ids[s]) for s, (f, m, _) in enumerate(prep.bounds)]
    status = np.zeros(max((m - f for f, m, _ in prep.bounds), default=0) + 2, dtype=np.int64)
    buffers = (status, np.zeros((prep.max_batch, 2), dtype=np.int64), np.zeros(prep.max_batch, dtype=np.int64))
    cfg = prep.trace.config
    limits = (int(cfg["max_seqs"]), int(cfg["block_size"]) * int(cfg["max_blocks_per_seq"]), int(cfg["num_blocks"]))
    return args, buffers, limits


def floor_runner(prep: Prepared):
    """``run(lo, hi)``: :func:`noop_step` once per step with the step's own arguments (the floor)."""
    args, buffers, limits = step_arguments(prep)

    def run(lo: int, hi: int) -> None:
        for s in range(lo, hi):
            noop_step(*args[s], *buffers, *limits)

    return run
