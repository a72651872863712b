"""Timed replays of a trace on one BlockManager, and their untimed twins. Design: docs/measurement.md#drivers."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import partial

import numpy as np
from numba import njit

from harness.base.clock import genuine, ns_per_tick, perf_ns, ticks
from harness.base.hook import untimed_hook
from harness.base.oncpu import thread_ns
from harness.base.replay import (
    INT64,
    ReplayError,
    answered,
    answered_shown,
    check_replayable,
    check_step_hits,
    hash_args,
)
from harness.base.steptimes import KINDS, StepTimes, concat
from impls.contract import blocks_for
from impls.core.base import step_by_calls
from impls.core.jit import specialise, spread_state
from impls.core.ops import POOL_OPS, call_args
from scenarios.trace import ALLOCATE, ALLOCATE_CACHED, APPEND, CAN_ALLOCATE, FREE, SEAL, Trace, trace_uses_caching

__all__ = ["KINDS", "Prepared", "StepTimes", "compiled_driver", "concat", "run_compiled", "run_interpreted",
           "step_runner", "whole_step_runner"]
_ALLOC, _FREE, _OTHER, _DECODE, _LOOKUP = range(5)
_COLUMN = {"alloc": _ALLOC, "free": _FREE, "other": _OTHER}


@dataclass
class Prepared:
    """A trace in the shapes the drivers want, built once, outside any timed region."""

    trace: Trace
    op: list[int]
    a0: list[int]
    a1: list[int]
    bounds: list[tuple[int, int, int]]
    decode_ids: list[np.ndarray]
    op_blocks: np.ndarray
    seq_ids: np.ndarray
    arrays64: tuple[np.ndarray, np.ndarray, np.ndarray]
    max_batch: int
    slot_digests: np.ndarray
    hashes: np.ndarray = field(default_factory=lambda: np.zeros(0, np.uint64), repr=False)
    hash_args: dict[int, np.ndarray | int] = field(default_factory=dict, repr=False)
    step_hits: list[int] = field(default_factory=list, repr=False)
    calls: list[tuple] = field(default_factory=list, repr=False)
    methods: tuple[str, ...] = field(default=(), repr=False)  # the manager methods ``calls`` name, once

    @classmethod
    def from_trace(cls, trace: Trace) -> Prepared:
        so, do = trace.step_offsets.tolist(), trace.decode_offsets.tolist()
        seq_ids = trace.a0.astype(np.int64)
        op_blocks, digests = op_block_counts(trace)
        prep = cls(
            trace=trace,
            op=trace.op.tolist(),
            a0=trace.a0.tolist(),
            a1=trace.a1.tolist(),
            bounds=[(so[s], do[s], so[s + 1]) for s in range(trace.num_steps)],
            decode_ids=[],
            op_blocks=op_blocks,
            seq_ids=seq_ids,
            arrays64=(trace.op.astype(np.int64), seq_ids, trace.a1.astype(np.int64)),
            max_batch=max(1, int(trace.running_per_step().max(initial=0))),
            slot_digests=digests,
            hashes=np.array(trace.arrays.get("hashes", np.zeros(0, np.uint64)), dtype=np.uint64),
            step_hits=trace.step_hits.tolist(),
        )
        return prep._with_views()

    def _with_views(self) -> Prepared:
        """Fill the views of the arrays: decode ids per step, hash chains and each pool op's call."""
        self.decode_ids = [self.seq_ids[mid:end] for _, mid, end in self.bounds]
        self.hash_args = hash_args(self.trace, self.hashes)
        self.calls = [None] * len(self.op)
        for s_first, mid, _ in self.bounds:
            for i in range(s_first, mid):
                o = self.op[i]
                spec = POOL_OPS[o]
                self.calls[i] = (spec.method, call_args(o, self.a0[i], self.a1[i], self.hash_args.get(i)),
                                 spec.result, _COLUMN[spec.kind])
        self.methods = tuple(sorted({call[0] for call in self.calls if call is not None}))
        return self

    def private(self) -> Prepared:
        """The same trace with private copies of every array a manager is handed (ids, op arrays, hashes), so that a
        design writing into its inputs changes nothing for another cell."""
        op64, seq_ids, a1 = (a.copy() for a in self.arrays64)
        return replace(self, seq_ids=seq_ids, arrays64=(op64, seq_ids, a1), hashes=self.hashes.copy())._with_views()

    def changed_inputs(self, original: Prepared, lo: int, hi: int) -> str:
        """What of steps ``[lo, hi)``'s inputs differs from ``original``'s ("" when nothing)."""
        first, end = self.bounds[lo][0] if lo < len(self.bounds) else 0, self.bounds[hi - 1][2] if hi > lo else 0
        for name, mine, theirs in (("op", self.arrays64[0], original.arrays64[0]),
                                   ("seq_ids", self.seq_ids, original.seq_ids),
                                   ("a1", self.arrays64[2], original.arrays64[2])):
            if not np.array_equal(mine[first:end], theirs[first:end]):
                return f"the trace's {name} of steps {lo}-{hi - 1}"
        if not np.array_equal(self.hashes, original.hashes):
            return "the trace's hash chains"
        return ""

    @property
    def num_steps(self) -> int:
        return self.trace.num_steps

    @property
    def caching(self) -> bool:
        """Whether the trace holds prefix-caching ops (:func:`scenarios.trace.trace_uses_caching`)."""
        return trace_uses_caching(self.trace)


def slot_digest(slots, block_size: int) -> int:
    """A digest of a step's slot mapping that every correct manager produces, whatever its block ids: the sum of (offset
    in block + 1)."""
    return int(((np.asarray(slots, dtype=np.int64) & (block_size - 1)) + 1).sum())


def op_block_counts(trace: Trace) -> tuple[np.ndarray, np.ndarray]:
    """Blocks each ALLOCATE(_CACHED) puts in its table and each FREE releases, and each step's expected slot digest."""
    bs, op, lens = trace.config["block_size"], trace.op, trace.op_lengths()
    counted = (op == ALLOCATE) | (op == ALLOCATE_CACHED) | (op == FREE)
    out = np.where(counted, blocks_for(lens, bs), 0).astype(np.int64)
    appends = np.flatnonzero(op == APPEND)
    step = np.searchsorted(trace.step_offsets, appends, side="right") - 1
    offsets = ((lens[appends] - 1) & (bs - 1)) + 1
    digests = np.bincount(step, weights=offsets, minlength=trace.num_steps).astype(np.int64)
    return out, digests


def _bound(mgr, prep: Prepared) -> dict:
    """The manager's methods the trace's pool ops call, looked up once (not inside a timed region; their names are
    the trace's, found once: a replay step by step, as the calibration meters one, costs no scan of the trace)."""
    return {name: getattr(mgr, name) for name in prep.methods}


def _check_result(prep: Prepared, s: int, i: int, result: str, got) -> int:
    """A pool op's result against the trace (outside the timed regions); the prompt tokens it served."""
    if result == "hits":
        return got if type(got) is int else answered(got, prep.calls[i][0], s)
    try:
        truth = bool(got)
    except Exception:
        truth = None
    if truth != bool(prep.a1[i]):
        method, args = prep.calls[i][:2]
        shown = ", ".join(str(a) if isinstance(a, int) else "<chain>" for a in args)
        raise ReplayError(f"step {s}: {method}({shown}) answered {got}, the trace expects {bool(prep.a1[i])}")
    return 0


# One flat loop on purpose: a helper call per operation would put interpreter work between timer reads.
def run_interpreted(prep: Prepared, mgr, regime: str, lo: int = 0, hi: int | None = None) -> StepTimes:  # noqa: C901
    """Time steps ``[lo, hi)`` (default: all) issued from Python, on a manager already at step ``lo``."""
    perf, thread = perf_ns, thread_ns  # bound at import, before any design (harness.base.clock, .oncpu)
    check_clocks(perf, thread)
    hi = prep.num_steps if hi is None else hi
    check_replayable(prep.trace, mgr)
    calls, methods, step_hits = prep.calls, _bound(mgr, prep), prep.step_hits
    span, cpu = np.zeros(hi - lo), np.zeros(hi - lo)
    mask = prep.trace.config["block_size"] - 1
    ns = np.zeros((hi - lo, len(KINDS)))
    cows = np.zeros(hi - lo, dtype=np.int64)
    digests = np.zeros(hi - lo, dtype=np.int64)
    cow_out = np.zeros((prep.max_batch, 2), dtype=np.int64)
    slot_out = np.zeros(prep.max_batch, dtype=np.int64)
    batched = regime == "batched"
    regions = 0
    after = untimed_hook(mgr)  # refused for designs not allowed it (harness.base.hook)
    for s in range(lo, hi):
        c0 = thread()
        w0 = perf()
        first, mid, end = prep.bounds[s]
        row = ns[s - lo]
        hits = 0
        for i in range(first, mid):
            method, args, result, column = calls[i]
            call = methods[method]
            t0 = perf()
            got = call(*args)
            t1 = perf()
            row[column] += t1 - t0
            if result:
                hits += _check_result(prep, s, i, result, got)
        if hits != step_hits[s]:
            check_step_hits(prep.trace, s, hits)
        ids = prep.decode_ids[s]
        n = end - mid
        if batched:
            slot_out[:n] = -1  # a step that skips its slot writes must not pass on the previous step's
            t0 = perf()
            rc = mgr.decode_step(ids, cow_out, slot_out)
            t1 = perf()
            if type(rc) is not int or not -INT64 <= rc < INT64:
                rc = answered(rc, "decode_step", s)
            cows[s - lo] = rc
            digests[s - lo] = ((slot_out[:n] & mask) + 1).sum()
            slot_out[:n] = -1
            t1b = perf()
            mgr.lookup(ids, slot_out)
            t2 = perf()
            if ((slot_out[:n] & mask) + 1).sum() != digests[s - lo]:
                digests[s - lo] = -1
            row[_LOOKUP] = t2 - t1b
        else:
            count = 0
            append = mgr.append_slot
            last_slot = mgr.last_slot
            seqs = prep.a0[mid:end]
            t0 = perf()
            for seq in seqs:
                if append(seq) is not None:
                    count += 1
            t1 = perf()
            slots = [last_slot(seq) for seq in seqs]
            t2 = perf()
            cows[s - lo] = count
            digests[s - lo] = _slots_digest(slots, mask, s)
            row[_LOOKUP] = t2 - t1
        row[_DECODE] = t1 - t0
        regions += mid - first + (1 if batched else 2)
        w1 = perf()
        span[s - lo], cpu[s - lo] = w1 - w0, thread() - c0
        if after is not None:
            after(s)
    check_clocks(perf, thread)
    step_ns = ns[:, _ALLOC] + ns[:, _FREE] + ns[:, _OTHER] + ns[:, _DECODE]
    if not batched:
        step_ns = step_ns + ns[:, _LOOKUP]
    return StepTimes(ns, cows, step_ns, regions / max(1, hi - lo), "perf_counter_ns", digests, span,
                     on_cpu(span, cpu))


def check_clocks(perf, thread) -> None:
    """:class:`ReplayError` unless the clocks a timed loop holds are ``time``'s own (a design rebound them)."""
    if not (genuine(perf, "perf_counter_ns") and genuine(thread, "thread_time_ns")):
        raise ReplayError("the design rebound the harness's timing code (its clock is not time.perf_counter_ns / "
                          "time.thread_time_ns): its figures cannot be trusted")


def on_cpu(span: np.ndarray, cpu: np.ndarray) -> np.ndarray:
    """Per interval, the share of its wall time the thread ran (1 where its CPU clock read more)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(span > 0, np.minimum(1.0, cpu / np.maximum(span, 1.0)), 1.0)


def _slots_digest(slots: list, mask: int, s: int) -> int:
    """The digest of ``last_slot``'s answers at step ``s`` (:class:`ReplayError` for one that is no slot)."""
    try:
        return int(sum((slot & mask) + 1 for slot in slots))
    except (TypeError, ValueError, OverflowError):
        bad = next((x for x in slots if type(x) is not int), None)
        raise ReplayError(f"step {s}: last_slot returned {answered_shown(bad)}, not a slot") from None


def apply_calls(prep: Prepared, mgr, s: int, methods: dict | None = None) -> None:
    """Step ``s``'s pool operations as contract calls on ``mgr``, each result checked against the trace."""
    methods = _bound(mgr, prep) if methods is None else methods
    first, mid, _ = prep.bounds[s]
    hits = 0
    for i in range(first, mid):
        method, args, result, _ = prep.calls[i]
        got = methods[method](*args)
        if result:
            hits += _check_result(prep, s, i, result, got)
    if hits != prep.step_hits[s]:
        check_step_hits(prep.trace, s, hits)


def step_runner(prep: Prepared, mgr, regime: str, cows: np.ndarray | None = None, check: bool = True):
    """An untimed ``run(lo, hi)`` replaying steps ``[lo, hi)`` from Python through the path ``regime`` names."""
    if regime == "step":
        return whole_step_runner(prep, mgr, cows, check)
    if regime not in ("batched", "per-call"):
        raise ValueError(f"unknown regime {regime!r}; choose from per-call, batched, step")
    check_replayable(prep.trace, mgr)
    cows = np.zeros(prep.num_steps, dtype=np.int64) if cows is None else cows
    return (_batched_runner if regime == "batched" else _per_call_runner)(prep, mgr, cows)


def _batched_runner(prep: Prepared, mgr, cows: np.ndarray):
    """:func:`step_runner`'s batched loop: pool operations per call, then one ``decode_step`` per step."""
    decode_ids, methods, decode_step = prep.decode_ids, _bound(mgr, prep), mgr.decode_step
    cow_out = np.zeros((prep.max_batch, 2), dtype=np.int64)
    slot_out = np.zeros(prep.max_batch, dtype=np.int64)
    after = untimed_hook(mgr)  # refused for designs not allowed it (harness.base.hook)

    def run(lo: int, hi: int) -> None:
        for s in range(lo, hi):
            apply_calls(prep, mgr, s, methods)
            rc = decode_step(decode_ids[s], cow_out, slot_out)
            try:
                cows[s] = rc
            except (TypeError, ValueError, OverflowError):
                answered(rc, "decode_step", s)
                raise
            if after is not None:
                after(s)

    return run


def _per_call_runner(prep: Prepared, mgr, cows: np.ndarray):
    """:func:`step_runner`'s per-call loop: pool operations, ``append_slot`` then ``last_slot`` per sequence."""
    a0, bounds, methods, append, last_slot = prep.a0, prep.bounds, _bound(mgr, prep), mgr.append_slot, mgr.last_slot
    after = untimed_hook(mgr)  # refused for designs not allowed it (harness.base.hook)

    def run(lo: int, hi: int) -> None:
        for s in range(lo, hi):
            apply_calls(prep, mgr, s, methods)
            _, mid, end = bounds[s]
            n = 0
            for i in range(mid, end):
                if append(a0[i]) is not None:
                    n += 1
            for i in range(mid, end):
                last_slot(a0[i])
            cows[s] = n
            if after is not None:
                after(s)

    return run


def whole_step_runner(prep: Prepared, mgr, cows: np.ndarray | None = None, check: bool = True):
    """An untimed ``run(lo, hi)``: one ``mgr.step`` call per step, its arguments views of the trace's arrays."""
    op, a0, a1 = prep.arrays64
    steps = [(op[f:m], a0[f:m], a1[f:m], prep.decode_ids[s]) for s, (f, m, _) in enumerate(prep.bounds)]
    status_out = np.zeros(max((m - f for f, m, _ in prep.bounds), default=0) + 2, dtype=np.int64)
    cow_out = np.zeros((prep.max_batch, 2), dtype=np.int64)
    slot_out = np.zeros(prep.max_batch, dtype=np.int64)
    cows = np.zeros(prep.num_steps, dtype=np.int64) if cows is None else cows
    step = step_entry(mgr)
    after = untimed_hook(mgr)  # refused for designs not allowed it (harness.base.hook)

    def run(lo: int, hi: int) -> None:
        for s in range(lo, hi):
            ops, x, y, ids = steps[s]
            rc = step(ops, x, y, ids, status_out, cow_out, slot_out)
            try:
                cows[s] = rc
            except (TypeError, ValueError, OverflowError):
                answered(rc, "step", s)
                raise
            if check:
                _check_statuses(prep, s, status_out, int(cows[s]))
            if after is not None:
                after(s)

    return run


def step_entry(mgr) -> Callable:
    """``mgr.step``, or for a design without one (the contract's one optional method)
    :func:`impls.core.base.step_by_calls` over its per-call methods."""
    step = getattr(mgr, "step", None)
    return step if callable(step) else partial(step_by_calls, mgr)


def run_whole_steps(prep: Prepared, mgr, lo: int = 0, hi: int | None = None) -> StepTimes:
    """Time steps ``[lo, hi)`` (default: all), one :func:`step_entry` call per step timed as one region (``decode``)."""
    perf, thread = perf_ns, thread_ns  # bound at import, before any design (harness.base.clock, .oncpu)
    check_clocks(perf, thread)
    hi = prep.num_steps if hi is None else hi
    check_replayable(prep.trace, mgr, "step")
    span, cpu = np.zeros(hi - lo), np.zeros(hi - lo)
    step, (op, a0, a1) = step_entry(mgr), prep.arrays64
    mask = prep.trace.config["block_size"] - 1
    ns = np.zeros((hi - lo, len(KINDS)))
    cows = np.zeros(hi - lo, dtype=np.int64)
    digests = np.zeros(hi - lo, dtype=np.int64)
    status_out = np.zeros(max((m - f for f, m, _ in prep.bounds), default=0) + 2, dtype=np.int64)
    cow_out = np.zeros((prep.max_batch, 2), dtype=np.int64)
    slot_out = np.zeros(prep.max_batch, dtype=np.int64)
    after = untimed_hook(mgr)  # refused for designs not allowed it (harness.base.hook)
    for s in range(lo, hi):
        first, mid, end = prep.bounds[s]
        ops, x, y, ids = op[first:mid], a0[first:mid], a1[first:mid], prep.decode_ids[s]
        slot_out[: end - mid] = -1
        c0 = thread()
        t0 = perf()
        rc = step(ops, x, y, ids, status_out, cow_out, slot_out)
        t1 = perf()
        span[s - lo], cpu[s - lo] = t1 - t0, thread() - c0
        ns[s - lo, _DECODE] = t1 - t0
        if type(rc) is not int or not -INT64 <= rc < INT64:
            rc = answered(rc, "step", s)
        _check_statuses(prep, s, status_out, rc)
        cows[s - lo] = rc
        digests[s - lo] = ((slot_out[: end - mid] & mask) + 1).sum()
        if after is not None:
            after(s)
    check_clocks(perf, thread)
    return StepTimes(ns, cows, ns[:, _DECODE].copy(), 1.0, "perf_counter_ns", digests, span, on_cpu(span, cpu))


def _check_statuses(prep: Prepared, s: int, status_out: np.ndarray, rc: int) -> None:
    """The statuses a whole step reported must be the trace's (can_allocate's answers, else 0)."""
    first, mid, _ = prep.bounds[s]
    op, _, a1 = prep.arrays64
    expected = np.where(op[first:mid] == CAN_ALLOCATE, a1[first:mid], 0)
    got = status_out[: mid - first + 1]
    if rc < 0 or not np.array_equal(got[:-1], expected) or got[-1] != 0:
        raise ReplayError(f"step {s}: step() reported statuses {got.tolist()} and {rc}, the trace expects "
                          f"{expected.tolist()}, 0 and {prep.trace.step_cows[s]}")


# Set per design by compiled_driver(): Numba inlines these globals as constants.
_CACHING = False
_k_can = _k_alloc = _k_fork = _k_free = _k_step = _k_lookup = _k_alloc_cached = _k_seal = None


# One function on purpose: splitting it would add calls (and array ref counting) to the measured step.
def _replay_loop(state, op, a0, a1, seq_ids, step_offsets, decode_offsets, cow_out, slot_out, ticks_out, cows_out,  # noqa: C901
                 detail, digests_out, mask, hashes, op_hash, hits_out):
    t0 = 0
    digest = digests_out.shape[0] > 0
    shift = 0
    while (1 << shift) <= mask:
        shift += 1
    for s in range(decode_offsets.shape[0]):
        t_step = ticks()
        hits = 0
        for i in range(step_offsets[s], decode_offsets[s]):
            o = op[i]
            if detail:
                t0 = ticks()
            kind = _OTHER
            if _CACHING and o == ALLOCATE_CACHED:
                at = op_hash[i]
                rc = _k_alloc_cached(state, a0[i], a1[i], hashes[at : at + (a1[i] >> shift)])
                if rc >= 0:
                    hits += rc
                    rc = 0
                kind = _ALLOC
            elif _CACHING and o == SEAL:
                rc = _k_seal(state, a0[i], hashes[op_hash[i]])
                if rc >= 0:
                    if rc != a1[i]:
                        return 1, s, i
                    rc = 0
            elif o == CAN_ALLOCATE:
                rc = _k_can(state, a0[i])
                if rc != a1[i]:
                    return 1, s, i
                rc = 0
            elif o == ALLOCATE:
                rc = _k_alloc(state, a0[i], a1[i])
                kind = _ALLOC
            elif o == FREE:
                rc = _k_free(state, a0[i])
                kind = _FREE
            else:
                rc = _k_fork(state, a0[i], a1[i])
            if detail:
                ticks_out[s, kind] += ticks() - t0
            if rc != 0:
                return rc, s, i
        ids = seq_ids[decode_offsets[s] : step_offsets[s + 1]]
        if detail:
            t0 = ticks()
        rc, _ = _k_step(state, ids, cow_out, slot_out)
        t1 = ticks()
        if rc < 0:
            return rc, s, decode_offsets[s]
        cows_out[s] = rc
        if _CACHING:
            hits_out[s] = hits
        if digest:
            digests_out[s] = _digest_and_reset(slot_out, ids.shape[0], mask)
        if detail:
            ticks_out[s, _DECODE] = t1 - t0
            t0 = ticks()
            _k_lookup(state, ids, slot_out)
            ticks_out[s, _LOOKUP] = ticks() - t0
            if digest and _digest_and_reset(slot_out, ids.shape[0], mask) != digests_out[s]:
                digests_out[s] = -1
        else:
            ticks_out[s, _DECODE] = t1 - t_step
    return 0, 0, 0


@njit(inline="always")
def _digest_and_reset(slot_out, n, mask):
    """The step's slot digest; the slots are then set to -1 so that a skipped write cannot pass."""
    d = 0
    for j in range(n):
        d += (slot_out[j] & mask) + 1
        slot_out[j] = -1
    return d


COMPILED_DRIVERS: dict[tuple[str, bool], object] = {}
_NO_DIGESTS = np.zeros(0, dtype=np.int64)
_NO_HASHES = np.zeros(0, dtype=np.uint64)


def driver_for(kernels, prep: Prepared):
    """The compiled replay loop over ``kernels`` for ``prep``'s trace (with the prefix-caching ops on a caching one)."""
    return compiled_driver(kernels, caching=prep.caching)


def compiled_driver(kernels, caching: bool = False):
    """The compiled replay loop over ``kernels`` (see :class:`impls.core.compiled.Kernels`), cached per design."""
    if caching and not hasattr(kernels, "allocate_cached"):
        raise ValueError("these kernels have no prefix-caching operations (allocate_cached, seal)")
    module = kernels.decode_step.py_func.__module__
    if (module, caching) not in COMPILED_DRIVERS:
        extra = {"_k_alloc_cached": spread_state(kernels.allocate_cached, 3),
                 "_k_seal": spread_state(kernels.seal, 2)} if caching else {}
        fn = specialise(_replay_loop, ("caching_" if caching else "") + module, _CACHING=caching,
                        _k_can=spread_state(kernels.can_allocate, 1), _k_alloc=spread_state(kernels.allocate, 2),
                        _k_fork=spread_state(kernels.fork, 2), _k_free=spread_state(kernels.free, 1),
                        _k_step=spread_state(kernels.decode_step, 3), _k_lookup=spread_state(kernels.lookup, 2),
                        **extra)
        COMPILED_DRIVERS[(module, caching)] = njit(cache=True)(fn)
    return COMPILED_DRIVERS[(module, caching)]


def _caching_args(prep: Prepared, hits_out: np.ndarray) -> tuple:
    """The replay loop's last three arguments: the trace's hash pool, where each op's hashes start, hits out."""
    if not prep.caching:
        return _NO_HASHES, _NO_DIGESTS, hits_out
    return prep.hashes, prep.trace.op_hash, hits_out


def compiled_step_runner(prep: Prepared, mgr, drive, cows: np.ndarray | None = None):
    """An untimed ``run(lo, hi)`` through the compiled driver; copy-on-write counts to ``cows`` if given."""
    t = prep.trace
    check_replayable(t, mgr, "compiled")
    op, a0, a1 = prep.arrays64
    cow_out = np.zeros((prep.max_batch, 2), dtype=np.int64)
    slot_out = np.zeros(prep.max_batch, dtype=np.int64)
    ticks_out = np.zeros((prep.num_steps, len(KINDS)), dtype=np.int64)
    cows = np.zeros(prep.num_steps, dtype=np.int64) if cows is None else cows
    hits = np.zeros(prep.num_steps, dtype=np.int64)

    def run(lo: int, hi: int) -> None:
        status, step, index = drive(mgr.state, op, a0, a1, prep.seq_ids, t.step_offsets[lo : hi + 1],
                                    t.decode_offsets[lo:hi], cow_out, slot_out, ticks_out[lo:hi], cows[lo:hi],
                                    False, _NO_DIGESTS, t.config["block_size"] - 1, *_caching_args(prep, hits[lo:hi]))
        if status:
            raise ReplayError(f"compiled replay failed at step {lo + step}, op {index}: status {status}")
        if prep.caching:
            check_hits(hits[lo:hi], t.step_hits, lo)

    return run


def check_hits(hits: np.ndarray, expected: np.ndarray, lo: int = 0) -> None:
    """Prompt tokens served from the cache per step, steps ``[lo, lo + len)``, must be the expected ones (every design
    makes the same choices: hit counts are a correctness check, as copy-on-write counts are)."""
    bad = np.flatnonzero(np.asarray(hits) != np.asarray(expected)[lo : lo + len(hits)])
    if bad.size:
        s = lo + int(bad[0])
        raise ReplayError(f"step {s}: {int(hits[s - lo])} tokens served from the cache, the trace expects "
                          f"{int(expected[s])}")


def run_compiled(prep: Prepared, mgr, drive, detail: bool, lo: int = 0, hi: int | None = None) -> StepTimes:
    """Time steps ``[lo, hi)`` (default: all) of a whole-step compiled replay, ``mgr`` already at step ``lo``."""
    t = prep.trace
    check_replayable(t, mgr, "compiled")
    hi = prep.num_steps if hi is None else hi
    ticks_out = np.zeros((hi - lo, len(KINDS)), dtype=np.int64)
    cows = np.zeros(hi - lo, dtype=np.int64)
    digests = np.zeros(hi - lo, dtype=np.int64)
    cow_out = np.zeros((prep.max_batch, 2), dtype=np.int64)
    slot_out = np.full(prep.max_batch, -1, dtype=np.int64)
    op, a0, a1 = prep.arrays64
    hits = np.zeros(hi - lo, dtype=np.int64)
    status, step, index = drive(mgr.state, op, a0, a1, prep.seq_ids, t.step_offsets[lo : hi + 1],
                                t.decode_offsets[lo:hi], cow_out, slot_out, ticks_out, cows, detail, digests,
                                t.config["block_size"] - 1, *_caching_args(prep, hits))
    if status:
        raise ReplayError(f"compiled replay failed at step {lo + step}, op {index}: status {status}")
    if prep.caching:
        check_hits(hits, t.step_hits, lo)
    ns = ticks_out * ns_per_tick()
    if detail:
        step_ns = ns[:, _ALLOC] + ns[:, _FREE] + ns[:, _OTHER] + ns[:, _DECODE]
        regions = float((t.decode_offsets[lo:hi] - t.step_offsets[lo:hi]).mean()) + 1 if hi > lo else 1.0
    else:
        step_ns = ns[:, _DECODE].copy()
        regions = 1.0
    return StepTimes(ns, cows, step_ns, regions, "rdtsc", digests)


def is_native(cls: type) -> bool:
    """Whether ``cls`` is replayed inside C++ (the ``cpp-*`` designs)."""
    return getattr(cls, "native", False) is True


def _native_replay(prep: Prepared, mgr, detail: bool, lo: int, hi: int):
    from harness.base import native

    check_replayable(prep.trace, mgr, "native")
    try:
        return native.replay(mgr, native_arrays(prep), detail, lo, hi)
    except native.NativeReplayError as exc:
        raise ReplayError(str(exc)) from None


_NATIVE_ARRAYS: dict[int, tuple] = {}


def native_arrays(prep: Prepared):
    """The trace's arrays for the native driver, made once per trace (read-only: C++ only reads them)."""
    from harness.base import native

    key = id(prep.trace)
    if key not in _NATIVE_ARRAYS or _NATIVE_ARRAYS[key][0] is not prep.trace:
        _NATIVE_ARRAYS.clear()
        _NATIVE_ARRAYS[key] = (prep.trace, native.prepare(prep.trace))
    return _NATIVE_ARRAYS[key][1]


def native_step_runner(prep: Prepared, mgr, cows: np.ndarray | None = None):
    """An untimed ``run(lo, hi)`` inside C++; copy-on-write counts per step to ``cows`` when given. Its buffers
    are made once, for every step: a call makes no array."""
    from harness.base import native

    check_replayable(prep.trace, mgr, "native")
    t = native_arrays(prep)
    out = native.buffers(t, prep.num_steps)
    if cows is not None and cows.dtype == np.int64 and cows.flags.c_contiguous and len(cows) == prep.num_steps:
        out = out._replace(cows=cows)  # written in place
    copy_to = None if cows is None or out.cows is cows else cows

    def run(lo: int, hi: int) -> None:
        try:
            native.replay_untimed(mgr, t, lo, hi, out)
        except native.NativeReplayError as exc:
            raise ReplayError(str(exc)) from None
        if copy_to is not None:
            copy_to[lo:hi] = out.cows[lo:hi]

    return run


def run_native(prep: Prepared, mgr, detail: bool, lo: int = 0, hi: int | None = None) -> StepTimes:
    """Time steps ``[lo, hi)`` inside C++: one foreign call, timed as :func:`run_compiled` times the compiled loop."""
    r = _native_replay(prep, mgr, detail, lo, prep.num_steps if hi is None else hi)
    return StepTimes(r.ns, r.cows, r.step_ns, r.timed_regions_per_step, r.clock)
