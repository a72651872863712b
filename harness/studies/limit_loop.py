"""Yardsticks replayed beside `flat` in its worker. Design: docs/measurement.md#limit_loop."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import numpy as np
from numba import njit

from harness.base.failures import blamed_on
from harness.base.interleave import Driver, frozen_gc, slice_bounds
from harness.base.rows import Row
from harness.base.stats import SEED, median_estimate
from harness.base.steptimes import StepTimes, concat
from harness.errors import DesignFailure
from harness.studies.cache_state import EVICT_BYTES, REPS, Evictor, check_replay
from harness.studies.unchecked_flat import UncheckedFlatManager, step_frame
from impls.core.compiled import Kernels
from impls.designs import flat
from impls.designs.flat import HEADER, LEN, ROW, TOP

TARGET_NS = 2.5  # flat's target per sequence-step, set a little above a minimal loop's time on another machine
IMPL = "limit-loop"  # the driver's name (its compiled replay loop is cached by it); its rows carry impl "-"
METRICS = {"warm": "seq_step_limit_warm_ns", "cold": "seq_step_limit_cold_ns"}
RATIOS = {"warm": "seq_step_alone_warm_vs_limit", "cold": "seq_step_alone_cold_vs_limit"}
_ONLY_SAFETY = ("with only the checks that keep its writes inside its arrays and none of the contract's (duplicates, "
                "inactive rows, copy-on-write, rollback), over flat's state and flat's own pool operations")
LOOP = ("the minimal decode loop (per sequence: length + 1, slot = table[seq, length >> shift] << shift "
        f"| offset, a block from the stack at a boundary), {_ONLY_SAFETY}")
PAIRS = {"warm": "nothing between the slices: each starts in the caches the previous slice left",
         "cold": f"a {EVICT_BYTES >> 20} MiB buffer read and written before every slice"}

_u = np.uint64
T = TypeVar("T")


@njit(cache=True, _nrt=False)
def decode_step(table, ints, seq_ids, cow_out, slot_out):
    n = seq_ids.shape[0]
    if slot_out.shape[0] < n:
        return -1, n
    rows, cols, sh, mask, refs, stack = step_frame(table, ints)
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


@dataclass(frozen=True)
class Yardstick:
    """A loop replayed beside a design: its words (its rows' how, the design's rows', the report's), its rows' impl
    (``-``: no implementation) and metrics, and the design's ratios over it, per state."""

    name: str
    cls: type
    what: str
    short: str
    label: str
    metrics: dict[str, str]
    ratios: dict[str, str]
    impl: str = "-"


YARDSTICKS = (
    Yardstick(IMPL, LimitLoopManager, LOOP, "the minimal loop",
              "The minimal decode loop (`limit_loop`: a table read per append, none of the contract's checks), "
              "replayed in turn with `flat` on each slice in its worker", METRICS, RATIOS),
    Yardstick("unchecked-flat", UncheckedFlatManager,
              f"`flat`'s own decode loop (NEXT; the length, the table and the stack where NEXT does not hold) "
              f"{_ONLY_SAFETY}", "`flat` without its checks",
              "`flat`'s own loop with the contract's checks taken out (`unchecked-flat`: its NEXT path and its "
              "boundary path, only the checks that keep its writes in its arrays), replayed the same way",
              {"warm": "seq_step_unchecked_warm_ns", "cold": "seq_step_unchecked_cold_ns"},
              {"warm": "seq_step_alone_warm_vs_unchecked", "cold": "seq_step_alone_cold_vs_unchecked"}),
)


def _blamed(driver: Driver, fn: Callable[..., T], *args: object) -> T:
    """``fn(*args)``, a failure inside it the driver's design's (:func:`blamed_on`)."""
    with blamed_on(driver.impl, driver.cls):
        return fn(*args)


def slice_orders(drivers: int, slices: int, rep: int) -> list[list[int]]:
    """The drivers' order on each slice, drawn (seeded by ``rep``): a fixed or reversed order let the first and last
    drivers follow themselves, their data still in the caches, on every other slice, and the middle one never."""
    rng = random.Random(SEED + rep)
    return [rng.sample(range(drivers), drivers) for _ in range(slices)]


def repetition(drivers: list[Driver], cold: Evictor | None, rep: int) -> list[tuple[object, StepTimes]]:
    """Fresh managers replaying the trace slice by slice, the drivers in turn on each slice in :func:`slice_orders`,
    the caches flushed before every slice when ``cold`` is given."""
    n = drivers[0].prep.num_steps
    mgrs = [_blamed(d, d.new) for d in drivers]
    parts: list[list[StepTimes]] = [[] for _ in drivers]
    bounds = slice_bounds(n)
    for (lo, hi), order in zip(bounds, slice_orders(len(drivers), len(bounds), rep), strict=True):
        for i in order:
            if cold is not None:
                cold.evict()
            parts[i].append(_blamed(drivers[i], drivers[i].timed, mgrs[i], False, lo, hi))
    return [(mgr, concat(p)) for mgr, p in zip(mgrs, parts, strict=True)]


def paired(base: Driver, sticks: list[Driver], cold: Evictor | None,
           reps: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per yardstick and repetition (one left out): its ns per sequence-step, ``base``'s median slice ratio over it."""
    prep, drivers = base.prep, [base, *sticks]
    with frozen_gc():
        done = [repetition(drivers, cold, rep) for rep in range(reps + 1)]
    for results in done:  # the repetition left out too
        for driver, (mgr, samples) in zip(drivers, results, strict=True):
            _blamed(driver, check_replay, driver, mgr, samples)
    done, work, bounds = done[1:], float(prep.trace.running_per_step().sum()), slice_bounds(prep.num_steps)
    return [(np.array([float(r[k][1].step_ns.sum()) / work for r in done]),
             np.array([np.median([r[0][1].step_ns[lo:hi].sum() / r[k][1].step_ns[lo:hi].sum() for lo, hi in bounds])
                       for r in done]))
            for k in range(1, len(drivers))]


def _stick_rows(scenario: str, impl: str, stick: Yardstick, kind: str, state: str,
                figures: tuple[np.ndarray, np.ndarray] | str, common: dict) -> list[Row]:
    """A yardstick's row and ``impl``'s ratio over it for one state: measured, or failed for the reason given."""
    metric, ratio_metric = stick.metrics[state], stick.ratios[state]
    own = (stick.impl, "-" if stick.impl == "-" else "batched", metric)
    mine = {**common, "driver": kind}
    if isinstance(figures, str):
        return [Row(scenario, *own, float("nan"), "ns", "rdtsc", "failed", figures, **mine),
                Row(scenario, impl, "batched", ratio_metric, float("nan"), "x", "rdtsc", "failed", figures, **common)]
    how = (f"alone in the worker after the run's timings, `{impl}` and the yardsticks replaying the trace in the run's "
           f"slices, in turn on each slice, {PAIRS[state]}; {common['reps']} repetitions")
    est, ratio = median_estimate(figures[0]), median_estimate(figures[1])
    return [Row(scenario, *own, est.value, "ns", "rdtsc", "ok",
                f"{stick.what}; {how}; median, 95 % bootstrap interval", ci_low=est.low, ci_high=est.high, **mine),
            Row(scenario, impl, "batched", ratio_metric, ratio.value, "x", "rdtsc", "ok",
                f"`{impl}`'s time over that of {stick.short} on the same slice; {how}; per repetition the median "
                "over its slices, then the median of the repetitions, 95 % bootstrap interval",
                ci_low=ratio.low, ci_high=ratio.high, **common)]


def stick_rows(scenario: str, driver: Driver, yardsticks: list[Yardstick], evictor: Evictor, reps: int) -> list[Row]:
    """Each yardstick's warm and cold rows and ``driver``'s design over it, all replayed in turn slice by slice."""
    prep = driver.prep
    sticks = [Driver(prep, stick.cls, "batched", driver.compiled_loops, stick.name) for stick in yardsticks]
    common = {"reps": reps, "steps": prep.num_steps, "driver": driver.kind}
    rows: list[Row] = []
    for state in ("warm", "cold"):
        try:
            figures: list = paired(driver, sticks, evictor if state == "cold" else None, reps)
        except DesignFailure as exc:
            figures = [exc.reason] * len(yardsticks)
        for stick, kind, measured in zip(yardsticks, [s.kind for s in sticks], figures, strict=True):
            rows += _stick_rows(scenario, driver.impl, stick, kind, state, measured, common)
    return rows


def limit_rows(scenario: str, flat_driver: Driver, evictor: Evictor, reps: int = REPS) -> list[Row]:
    """Each yardstick's warm and cold rows and ``flat``'s over it; none for a trace with copy-on-write."""
    if flat_driver.prep.trace.step_cows.any():
        return []
    return stick_rows(scenario, flat_driver, list(YARDSTICKS), evictor, reps)
