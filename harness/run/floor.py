"""The harness's own work per slice, for the supervisor's bound: a do-nothing design replayed like a cell.

The oracle answers a trace's replay from the trace itself and manages no blocks; Python regimes are floored on
it (before a job imports any design), the compiled and C++ drivers on a registered design of theirs.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable, Iterable

import numpy as np

from harness.base import clock
from harness.base.drivers import Prepared
from harness.base.interleave import Driver, Hooks, Turns, interleaved, slice_bounds
from impls import registry
from impls.contract import blocks_for
from scenarios.trace import ALLOCATE_CACHED, APPEND, CAN_ALLOCATE

FLOOR_REPS = 2  # repetitions of the floor's replay (its CPU time per slice is their mean)
FAST_FLOOR = {"compiled": ("flat", "flat-pc"), "native": ("cpp-flat", "")}  # per driver: plain, caching trace
WARM_STEPS = 5


class _Answers:
    """Per op and per step, what a conforming manager answers on one trace."""

    def __init__(self, prep: Prepared) -> None:
        t = prep.trace
        bs, op, lens = t.config["block_size"], t.op, t.op_lengths()
        self.a1 = prep.a1
        appends = np.flatnonzero(op == APPEND)
        self.slot = ((lens[appends] - 1) & (bs - 1)).astype(np.int64)  # block 0, the append's offset
        self.first_append = [*np.searchsorted(appends, t.decode_offsets).tolist(), appends.size]  # per step; the end
        self.cows = t.step_cows.tolist()
        step_of_op = np.searchsorted(t.step_offsets, np.arange(len(op)), side="right") - 1
        first_cached = {}
        for i in np.flatnonzero(op == ALLOCATE_CACHED).tolist():
            first_cached.setdefault(int(step_of_op[i]), i)
        self.hits = {i: int(t.step_hits[s]) for s, i in first_cached.items()} if prep.caching else {}
        self.pool_ops = [i for first, mid, _ in prep.bounds for i in range(first, mid)]
        op64, _, a164 = prep.arrays64
        self.statuses = [np.where(op64[f:m] == CAN_ALLOCATE, a164[f:m], 0) for f, m, _ in prep.bounds]
        starts = np.concatenate([[0], np.cumsum(blocks_for(t.final_lens, bs))]).astype(int)
        self.tables = {r: t.final_canon[starts[r]:starts[r + 1]].tolist() for r in range(len(t.final_lens))}
        self.final_free, self.final_lens = t.header["final_free"], t.final_lens.tolist()


class Oracle:
    """A manager that answers one trace's replay from :attr:`answers` and manages no blocks (make it with
    :func:`oracle_class`)."""

    answers: _Answers
    prefix_caching = False

    def __init__(self, **config) -> None:
        self.op = self.step_no = self.append_no = self.slot_no = 0

    def _next_op(self) -> int:
        i = self.answers.pool_ops[self.op]
        self.op += 1
        return i

    def can_allocate(self, seq_id):
        return self.answers.a1[self._next_op()]

    def seal(self, seq_id, block_hash):
        return self.answers.a1[self._next_op()]

    def allocate_cached(self, seq_id, num_tokens, hashes):
        return self.answers.hits.get(self._next_op(), 0)

    def allocate(self, seq_id, num_blocks=0):
        self._next_op()

    free = fork = allocate

    def _step(self, slot_out) -> int:
        s = self.step_no
        self.step_no += 1
        lo, hi = self.answers.first_append[s], self.answers.first_append[s + 1]
        slot_out[: hi - lo] = self.answers.slot[lo:hi]
        self.append_no = self.slot_no = lo
        return self.answers.cows[s]

    def decode_step(self, seq_ids, cow_out, slot_out):
        return self._step(slot_out)

    def lookup(self, seq_ids, slot_out):
        slot_out[: len(seq_ids)] = self.answers.slot[self.slot_no : self.slot_no + len(seq_ids)]

    def step(self, ops, a0, a1, seq_ids, status_out, cow_out, slot_out):
        statuses = self.answers.statuses[self.step_no]
        status_out[: len(statuses)] = statuses
        status_out[len(statuses)] = 0
        self.op += len(statuses)
        return self._step(slot_out)

    def append_slot(self, seq_id):
        j = self.append_no
        self.append_no += 1
        s = bisect_right(self.answers.first_append, j) - 1
        return (0, 0) if j - self.answers.first_append[s] < self.answers.cows[s] else None

    def last_slot(self, seq_id):
        self.slot_no += 1
        return int(self.answers.slot[self.slot_no - 1])

    def num_free_blocks(self):
        return self.answers.final_free

    def seq_len(self, row):
        return self.answers.final_lens[row]

    def block_table(self, row):
        return self.answers.tables[row]


def oracle_class(prep: Prepared) -> type:
    """An :class:`Oracle` class for ``prep``'s trace."""
    return type("Oracle", (Oracle,), {"answers": _Answers(prep), "prefix_caching": prep.caching})


Mark = Callable[[tuple | None], None]


def measure_floor(prep: Prepared, regimes: Iterable[str], mark: Mark,
                  enter: Mark = lambda key: None) -> dict[str, float]:
    """Replay the oracle through the Python driver of each regime (the whole-step one not on a prefix-caching
    trace, which it cannot replay), every slice marked ``("floor", regime)``; ``enter(None)`` before each slice,
    as a cell's tells the main process where it is. Returns the nanoseconds its timed regions claimed, per regime
(the oracle's own calls, which are not the harness's work). ``RuntimeError`` (ours) if its replay fails."""
    cls = oracle_class(prep)
    return _replay({("floor", r, ""): Driver(prep, cls, r, {}, "floor") for r in sorted(set(regimes))
             if not (prep.caching and r == "step")}, prep, mark, enter)


def measure_fast_floor(prep: Prepared, kinds: Iterable[str], loops: dict, mark: Mark,
                       enter: Mark = lambda key: None) -> dict[str, float]:
    """For the compiled and C++ drivers among ``kinds``: the same on a registered design of that driver
    (:data:`FAST_FLOOR`), whose own work is small beside the harness's per slice; marked ``("floor", kind)``."""
    drivers = {}
    if "compiled" in kinds:
        clock.ns_per_tick()  # calibrated once per process: not in the floor's first slice
    for kind in sorted(set(kinds) & set(FAST_FLOOR)):
        name = FAST_FLOOR[kind][prep.caching]
        try:
            cls = registry.BY_NAME[name].load() if name else None
        except Exception:  # not built or not importable here: that driver's cells are not bounded
            cls = None
        if cls is not None:
            driver = Driver(prep, cls, "batched", loops, name)
            driver.warm_up()  # compile or load first
            drivers[("floor", kind, "")] = driver
    return _replay(drivers, prep, mark, enter, details=True)


def _replay(drivers: dict, prep: Prepared, mark: Mark, enter: Mark, details: bool = False) -> dict[str, float]:
    """The floor's replays; the nanoseconds each key's timed regions claimed, by its floor name."""
    slices, claimed = slice_bounds(prep.num_steps), {}
    for detail in (False, True) if details else (False,):
        out = interleaved(drivers, Turns(FLOOR_REPS, slices), detail,
                          Hooks(enter=lambda key: enter(None), mark=lambda key: mark(key[:2] if key else None)))
        if out.failed:
            raise RuntimeError(f"the floor's replay failed: {out.failed}")
        for key, samples in out.samples.items():
            claimed[key[1]] = claimed.get(key[1], 0.0) + sum(float(times.ns.sum()) for times in samples)
    return claimed
