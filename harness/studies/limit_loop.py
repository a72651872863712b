"""The minimal decode loop, replayed beside `flat` in its worker. Design: docs/measurement.md#limit_loop."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import numpy as np
from numba import njit

from harness.base.failures import blamed_on
from harness.base.interleave import Driver, frozen_gc, slice_bounds
from harness.base.rows import Row
from harness.base.stats import median_estimate
from harness.base.steptimes import StepTimes, concat
from harness.errors import DesignFailure
from harness.studies.cache_state import EVICT_BYTES, REPS, Evictor, check_replay
from impls.core.compiled import Kernels
from impls.designs import flat
from impls.designs.flat import BLOCK_SHIFT, HEADER, LEN, NUM_BLOCKS, ROW, TOP

IMPL = "limit-loop"  # the driver's name (its compiled replay loop is cached by it); its rows carry impl "-"
METRICS = {"warm": "seq_step_limit_warm_ns", "cold": "seq_step_limit_cold_ns"}
RATIOS = {"warm": "seq_step_alone_warm_vs_limit", "cold": "seq_step_alone_cold_vs_limit"}
LOOP = ("the minimal decode loop (per sequence: length + 1, slot = table[seq, length >> shift] << shift "
        "| offset, a block from the stack at a boundary), with only the checks that keep its writes inside its "
        "arrays and none of the contract's (duplicates, inactive rows, copy-on-write, rollback), over flat's "
        "state and flat's own pool operations")
PAIRS = {"warm": "nothing between the slices: each starts in the caches the other's slice left",
         "cold": f"a {EVICT_BYTES >> 20} MiB buffer read and written before every slice"}
_u = np.uint64
T = TypeVar("T")


@njit(cache=True, _nrt=False)
def decode_step(table, ints, seq_ids, cow_out, slot_out):
    n = seq_ids.shape[0]
    if slot_out.shape[0] < n:
        return -1, n
    rows, cols = _u(table.shape[0]), _u(table.shape[1])
    sh = ints[BLOCK_SHIFT]
    mask = (1 << sh) - 1
    refs = HEADER + ROW * table.shape[0]
    stack = refs + ints[NUM_BLOCKS]
    top = ints[TOP]
    for i in range(n):
        seq = seq_ids[_u(i)]
        if _u(seq) >= rows:
            ints[TOP] = top
            return -2, i
        rec = HEADER + ROW * seq
        length = ints[_u(rec + LEN)]
        j = _u(length >> sh)
        if j >= cols or length < 0:
            ints[TOP] = top
            return -3, i
        if (length & mask) == 0:
            if top <= 0:
                ints[TOP] = top
                return -4, i
            top -= 1
            block = ints[_u(stack + top)]
            ints[_u(refs + block)] = 1
            table[_u(seq), j] = block
        slot_out[_u(i)] = (np.int64(table[_u(seq), j]) << sh) | (length & mask)
        ints[_u(rec + LEN)] = length + 1
    ints[TOP] = top
    return 0, 0


class LimitLoopManager(flat.FlatBlockManager):
    """``flat`` with :func:`decode_step` as its batched step: a yardstick for traces without copy-on-write, not a
    design (it does not keep the contract)."""

    kernels = Kernels(*flat.KERNELS[:5], decode_step, *flat.KERNELS[6:])


def _blamed(driver: Driver, fn: Callable[..., T], *args: object) -> T:
    """``fn(*args)``, a failure inside it the driver's design's (:func:`blamed_on`)."""
    with blamed_on(driver.impl, driver.cls):
        return fn(*args)


def repetition(drivers: list[Driver], cold: Evictor | None, rep: int) -> list[tuple[object, StepTimes]]:
    """Fresh managers replaying the trace slice by slice, the drivers in turn on each slice (the order swapped from
    one slice to the next), the caches flushed before every slice when ``cold`` is given."""
    n = drivers[0].prep.num_steps
    mgrs = [_blamed(d, d.new) for d in drivers]
    parts: list[list[StepTimes]] = [[] for _ in drivers]
    for k, (lo, hi) in enumerate(slice_bounds(n)):
        for i in (range(len(drivers)) if (rep + k) % 2 == 0 else reversed(range(len(drivers)))):
            if cold is not None:
                cold.evict()
            parts[i].append(_blamed(drivers[i], drivers[i].timed, mgrs[i], False, lo, hi))
    return [(mgr, concat(p)) for mgr, p in zip(mgrs, parts, strict=True)]


def paired(flat_driver: Driver, limit: Driver, cold: Evictor | None, reps: int) -> tuple[np.ndarray, np.ndarray]:
    """Per repetition (one left out first): the loop's ns per sequence-step, and the median over the trace's slices
    of ``flat``'s time over the loop's on the same slice. Every replay is checked against the trace after the last."""
    prep, drivers = flat_driver.prep, [flat_driver, limit]
    with frozen_gc():
        done = [repetition(drivers, cold, rep) for rep in range(reps + 1)]
    for results in done:  # the repetition left out too
        for driver, (mgr, samples) in zip(drivers, results, strict=True):
            _blamed(driver, check_replay, driver, mgr, samples)
    done, work, bounds = done[1:], float(prep.trace.running_per_step().sum()), slice_bounds(prep.num_steps)
    loop_ns = np.array([float(r[1][1].step_ns.sum()) / work for r in done])
    ratios = np.array([np.median([r[0][1].step_ns[lo:hi].sum() / r[1][1].step_ns[lo:hi].sum() for lo, hi in bounds])
                       for r in done])
    return loop_ns, ratios


def limit_rows(scenario: str, flat_driver: Driver, evictor: Evictor, reps: int = REPS) -> list[Row]:
    """The minimal loop's warm and cold figures (impl ``-``) and ``flat``'s time over it, slice by slice (``flat``'s
    rows); none for a trace with copy-on-write, which the loop cannot replay."""
    prep = flat_driver.prep
    if prep.trace.step_cows.any():
        return []
    limit = Driver(prep, LimitLoopManager, "batched", flat_driver.compiled_loops, IMPL)
    rows: list[Row] = []
    for state, metric in METRICS.items():
        common = {"reps": reps, "steps": prep.num_steps, "driver": limit.kind}
        try:
            loop_ns, ratios = paired(flat_driver, limit, evictor if state == "cold" else None, reps)
        except DesignFailure as exc:
            rows += [Row(scenario, "-", "-", metric, float("nan"), "ns", "rdtsc", "failed", exc.reason, **common),
                     Row(scenario, flat_driver.impl, "batched", RATIOS[state], float("nan"), "x", "rdtsc", "failed",
                         exc.reason, **common)]
            continue
        how = (f"alone in the worker after the run's timings, `{flat_driver.impl}` and the loop replaying the trace "
               f"in the run's slices, in turn on each slice, {PAIRS[state]}; {reps} repetitions")
        est, ratio = median_estimate(loop_ns), median_estimate(ratios)
        rows += [Row(scenario, "-", "-", metric, est.value, "ns", "rdtsc", "ok",
                     f"{LOOP}; {how}; median, 95 % bootstrap interval", ci_low=est.low, ci_high=est.high, **common),
                 Row(scenario, flat_driver.impl, "batched", RATIOS[state], ratio.value, "x", "rdtsc", "ok",
                     f"`{flat_driver.impl}`'s time over the minimal loop's on the same slice; {how}; per repetition "
                     "the median over its slices, then the median of the repetitions, 95 % bootstrap interval",
                     ci_low=ratio.low, ci_high=ratio.high, **common)]
    return rows
