"""The minimal decode loop, replayed beside `flat` in its worker. Design: docs/measurement.md#limit_loop."""

from __future__ import annotations

import numpy as np
from numba import njit

from harness.base.interleave import Driver
from harness.base.rows import Row
from harness.base.stats import median_estimate
from harness.errors import DesignFailure
from harness.studies.cache_state import HOW, REPS, Evictor, interleaved
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
ROUNDS = {"warm": "the whole trace replayed in one call, alone in the worker after the run's timings, rounds back to "
                  "back: each replay starts in the caches the other's left (the order reversed every other round)",
          "cold": HOW["cold"]}
_u = np.uint64


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


def limit_rows(scenario: str, flat_driver: Driver, evictor: Evictor, reps: int = REPS) -> list[Row]:
    """The minimal loop's warm and cold figures (impl ``-``) and ``flat``'s over it per round (``flat``'s rows),
    both replayed in turn, round by round; none for a trace with copy-on-write, which the loop cannot replay."""
    prep = flat_driver.prep
    if prep.trace.step_cows.any():
        return []
    limit = Driver(prep, LimitLoopManager, "batched", flat_driver.compiled_loops, IMPL)
    rows: list[Row] = []
    for state, metric in METRICS.items():
        common = {"reps": reps, "steps": prep.num_steps, "driver": limit.kind}
        try:
            times = interleaved([flat_driver, limit], evictor if state == "cold" else None, reps)
        except DesignFailure as exc:
            rows += [Row(scenario, "-", "-", metric, float("nan"), "ns", "rdtsc", "failed", exc.reason, **common),
                     Row(scenario, flat_driver.impl, "batched", RATIOS[state], float("nan"), "x", "rdtsc", "failed",
                         exc.reason, **common)]
            continue
        how = f"{ROUNDS[state]}; {reps} rounds, each replaying `{flat_driver.impl}` and the loop in turn"
        est, ratio = median_estimate(times[1]), median_estimate(times[0] / times[1])
        rows += [Row(scenario, "-", "-", metric, est.value, "ns", "rdtsc", "ok",
                     f"{LOOP}; {how}; median, 95 % bootstrap interval", ci_low=est.low, ci_high=est.high, **common),
                 Row(scenario, flat_driver.impl, "batched", RATIOS[state], ratio.value, "x", "rdtsc", "ok",
                     f"`{flat_driver.impl}`'s whole step over the minimal loop's, round by round; {how}; median "
                     "of the rounds' ratios, 95 % bootstrap interval", ci_low=ratio.low, ci_high=ratio.high,
                     **common)]
    return rows
