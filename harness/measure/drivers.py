"""Timed replays of a trace on one BlockManager.

Two drivers, one result shape (:class:`StepTimes`, nanoseconds per step and per kind of work):

- :func:`run_interpreted` walks the trace in Python, as a Python scheduler would, and times every pool
  operation, the decode phase and the lookup phase with ``perf_counter_ns``. Per-call regime: one contract
  call per operation (``append_slot`` per sequence, then ``last_slot`` per sequence for the slot mapping).
  Batched regime: pool operations per call, then one ``decode_step`` (appends and slot mapping fused) and,
  timed apart and not part of the step, one ``lookup`` for the lookup metric.
- :func:`compiled_driver` builds, for a design with compiled kernels, a Numba replay loop that calls the
  kernels directly: the batched regime with the whole step compiled, no Python and no dispatch per step.
  With ``detail=False`` it times each step as one region (the step-time figures); with ``detail=True`` it
  times each operation (the per-block and per-lookup figures). Ticks are converted with the calibrated TSC.

Every replay reports its copy-on-write count per step; :func:`harness.measure.runner` checks them and the end state.
"""

from __future__ import annotations

import re
import time
import types
from dataclasses import dataclass, field

import numpy as np
from numba import njit

from harness.measure.clock import ns_per_tick, ticks
from harness.measure.replay import ReplayError, apply_pool_op, check_replayable, check_step_hits, hash_args
from impls.contract import blocks_for
from scenarios.trace import ALLOCATE, ALLOCATE_CACHED, CAN_ALLOCATE, FORK, FREE, SEAL, Trace, trace_uses_caching

KINDS = ("alloc", "free", "other", "decode", "lookup")  # "alloc": allocate, allocate_cached; "other": the rest
_ALLOC, _FREE, _OTHER, _DECODE, _LOOKUP = range(5)


@dataclass
class Prepared:
    """A trace in the shapes the drivers want, built once, outside any timed region."""

    trace: Trace
    op: list[int]
    a0: list[int]
    a1: list[int]
    bounds: list[tuple[int, int, int]]  # per step: first pool op, first append, end
    decode_ids: list[np.ndarray]  # per step: int64 row ids of the decode step
    op_blocks: np.ndarray  # per op: blocks taken (allocate) or released (free), else 0
    seq_ids: np.ndarray  # a0 as int64, for the compiled driver's slices
    arrays64: tuple[np.ndarray, np.ndarray, np.ndarray]  # op, a0, a1 as int64 for the compiled driver
    max_batch: int
    slot_digests: np.ndarray  # per step: the digest of the slot mapping every correct manager writes
    hash_args: dict[int, np.ndarray | int] = field(default_factory=dict, repr=False)  # prefix caching: op -> chain/hash
    step_hits: list[int] = field(default_factory=list, repr=False)  # per step: prompt tokens the cache serves
    native_arrays: object = field(default=None, repr=False)  # the trace for the native driver, made on demand

    @classmethod
    def from_trace(cls, trace: Trace) -> Prepared:
        so, do = trace.step_offsets.tolist(), trace.decode_offsets.tolist()
        seq_ids = trace.a0.astype(np.int64)
        op_blocks, digests = op_block_counts(trace)
        return cls(
            trace=trace,
            op=trace.op.tolist(),
            a0=trace.a0.tolist(),
            a1=trace.a1.tolist(),
            bounds=[(so[s], do[s], so[s + 1]) for s in range(trace.num_steps)],
            decode_ids=[seq_ids[do[s] : so[s + 1]] for s in range(trace.num_steps)],
            op_blocks=op_blocks,
            seq_ids=seq_ids,
            arrays64=(trace.op.astype(np.int64), seq_ids, trace.a1.astype(np.int64)),
            max_batch=max(1, int(trace.running_per_step().max(initial=0))),
            slot_digests=digests,
            hash_args=hash_args(trace),
            step_hits=trace.step_hits.tolist(),
        )

    @property
    def num_steps(self) -> int:
        return self.trace.num_steps


def slot_digest(slots, block_size: int) -> int:
    """A digest of a step's slot mapping that every correct manager produces, whatever its block ids: the sum
    of (offset in block + 1). A skipped or stale slot write changes it (offsets advance by one each step)."""
    return int(((np.asarray(slots, dtype=np.int64) & (block_size - 1)) + 1).sum())


def op_block_counts(trace: Trace) -> tuple[np.ndarray, np.ndarray]:
    """Blocks each ALLOCATE or ALLOCATE_CACHED puts in its table (cache hits included) and each FREE releases (the
    freed table's length), and each step's expected slot digest (:func:`slot_digest`), from row lengths tracked
    through the trace."""
    bs = trace.config["block_size"]
    lens = [0] * trace.config["max_seqs"]
    out = np.zeros(len(trace.op), dtype=np.int64)
    digests = np.zeros(trace.num_steps, dtype=np.int64)
    op, a0, a1 = trace.op.tolist(), trace.a0.tolist(), trace.a1.tolist()
    step = np.searchsorted(trace.step_offsets, np.arange(len(op)), side="right") - 1
    for i, (o, x, y) in enumerate(zip(op, a0, a1, strict=True)):
        if o in (ALLOCATE, ALLOCATE_CACHED):
            lens[x] = y
            out[i] = blocks_for(y, bs)
        elif o == FREE:
            out[i] = blocks_for(lens[x], bs)
            lens[x] = 0
        elif o == FORK:
            lens[y] = lens[x]
        elif o not in (CAN_ALLOCATE, SEAL):
            lens[x] += 1
            digests[step[i]] += ((lens[x] - 1) & (bs - 1)) + 1
    return out, digests


@dataclass
class StepTimes:
    """Raw samples of one replay: nanoseconds per step and kind, CoWs per step, and the clock used."""

    ns: np.ndarray  # [steps, 5] float64, columns KINDS
    cows: np.ndarray  # [steps] int64
    step_ns: np.ndarray  # [steps] float64: the step-time figure (what the step cost the engine)
    timed_regions_per_step: float  # timer reads around work, per step (for the overhead figure)
    clock: str
    digests: np.ndarray | None = None  # [steps] slot digest of each step's mapping, None where not taken

    def check(self, prep: Prepared, lo: int = 0) -> None:
        """Copy-on-write counts and slot digests of steps ``[lo, lo + len)`` must be the trace's."""
        hi = lo + len(self.cows)
        bad = np.flatnonzero(self.cows != prep.trace.step_cows[lo:hi])
        if bad.size:
            s = lo + int(bad[0])
            raise ReplayError(f"step {s}: {self.cows[s - lo]} copy-on-writes, the trace expects "
                              f"{prep.trace.step_cows[s]}")
        if self.digests is not None:
            bad = np.flatnonzero(self.digests != prep.slot_digests[lo:hi])
            if bad.size:
                raise ReplayError(f"step {lo + int(bad[0])}: the slot mapping differs from the trace's "
                                  "(a slot not written, or a wrong offset)")


def concat(parts: list[StepTimes]) -> StepTimes:
    """Slices of one replay, in order, as one replay."""
    digests = None if any(p.digests is None for p in parts) else np.concatenate([p.digests for p in parts])
    steps = np.array([len(p.cows) for p in parts], dtype=float)
    regions = float((steps * [p.timed_regions_per_step for p in parts]).sum() / max(1.0, steps.sum()))
    return StepTimes(np.concatenate([p.ns for p in parts]), np.concatenate([p.cows for p in parts]),
                     np.concatenate([p.step_ns for p in parts]), regions, parts[0].clock, digests)


# One flat loop on purpose: this is the timed driver, and a helper call per operation would put interpreter
# work between the timer reads of every region.
def run_interpreted(prep: Prepared, mgr, regime: str, lo: int = 0, hi: int | None = None) -> StepTimes:  # noqa: C901
    """Time steps ``[lo, hi)`` (default: all) issued from Python (both regimes, every implementation), on a
    manager already at step ``lo``. The slot mapping of every step is digested outside the timed regions. With
    prefix caching, ``allocate_cached`` is timed as ``alloc`` and ``seal`` as ``other``; each step's cache hits
    and each seal's answer are checked against the trace (outside the timed regions)."""
    perf = time.perf_counter_ns
    hi = prep.num_steps if hi is None else hi
    check_replayable(prep.trace, mgr)
    op, a0, a1, args, step_hits = prep.op, prep.a0, prep.a1, prep.hash_args, prep.step_hits
    mask = prep.trace.config["block_size"] - 1
    ns = np.zeros((hi - lo, len(KINDS)))
    cows = np.zeros(hi - lo, dtype=np.int64)
    digests = np.zeros(hi - lo, dtype=np.int64)
    cow_out = np.zeros((prep.max_batch, 2), dtype=np.int64)
    slot_out = np.zeros(prep.max_batch, dtype=np.int64)
    batched = regime == "batched"
    regions = 0
    for s in range(lo, hi):
        first, mid, end = prep.bounds[s]
        row = ns[s - lo]
        hits = 0
        for i in range(first, mid):
            o = op[i]
            if o == CAN_ALLOCATE:
                t0 = perf()
                ok = mgr.can_allocate(a0[i])
                t1 = perf()
                if ok != bool(a1[i]):
                    raise ReplayError(f"step {s}: can_allocate({a0[i]}) answered {ok}, the trace expects {bool(a1[i])}")
                row[_OTHER] += t1 - t0
            elif o == ALLOCATE:
                t0 = perf()
                mgr.allocate(a0[i], a1[i])
                t1 = perf()
                row[_ALLOC] += t1 - t0
            elif o == ALLOCATE_CACHED:
                chain = args[i]
                t0 = perf()
                got = mgr.allocate_cached(a0[i], a1[i], chain)
                t1 = perf()
                row[_ALLOC] += t1 - t0
                hits += got
            elif o == SEAL:
                block_hash = args[i]
                t0 = perf()
                ok = mgr.seal(a0[i], block_hash)
                t1 = perf()
                if ok != bool(a1[i]):
                    raise ReplayError(f"step {s}: seal({a0[i]}, {block_hash}) answered {ok}, the trace expects "
                                      f"{bool(a1[i])}")
                row[_OTHER] += t1 - t0
            elif o == FREE:
                t0 = perf()
                mgr.free(a0[i])
                t1 = perf()
                row[_FREE] += t1 - t0
            else:  # FORK
                t0 = perf()
                mgr.fork(a0[i], a1[i])
                t1 = perf()
                row[_OTHER] += t1 - t0
        if hits != step_hits[s]:
            check_step_hits(prep.trace, s, hits)
        ids = prep.decode_ids[s]
        n = end - mid
        if batched:
            slot_out[:n] = -1  # a step that skips its slot writes must not pass on the previous step's
            t0 = perf()
            cows[s - lo] = mgr.decode_step(ids, cow_out, slot_out)
            t1 = perf()
            digests[s - lo] = ((slot_out[:n] & mask) + 1).sum()
            slot_out[:n] = -1
            t1b = perf()
            mgr.lookup(ids, slot_out)
            t2 = perf()
            if ((slot_out[:n] & mask) + 1).sum() != digests[s - lo]:
                digests[s - lo] = -1  # lookup disagrees with the step's own mapping
            row[_LOOKUP] = t2 - t1b
        else:
            count = 0
            append = mgr.append_slot
            last_slot = mgr.last_slot
            seqs = a0[mid:end]
            t0 = perf()
            for seq in seqs:
                if append(seq) is not None:
                    count += 1
            t1 = perf()
            slots = [last_slot(seq) for seq in seqs]  # the scheduler's slot mapping, as it would keep it
            t2 = perf()
            cows[s - lo] = count
            digests[s - lo] = sum((slot & mask) + 1 for slot in slots)
            row[_LOOKUP] = t2 - t1
        row[_DECODE] = t1 - t0
        regions += mid - first + (1 if batched else 2)
    step_ns = ns[:, _ALLOC] + ns[:, _FREE] + ns[:, _OTHER] + ns[:, _DECODE]
    if not batched:  # the per-call scheduler needs its slot mapping from last_slot calls
        step_ns = step_ns + ns[:, _LOOKUP]
    return StepTimes(ns, cows, step_ns, regions / max(1, hi - lo), "perf_counter_ns", digests)


def step_runner(prep: Prepared, mgr, regime: str, cows: np.ndarray | None = None):
    """An untimed ``run(lo, hi)`` that replays steps ``[lo, hi)`` from Python through the same calls as the
    timed interpreted driver (for allocation counts, paced runs and instruction counts); copy-on-write
    counts per step go to ``cows`` when given."""
    check_replayable(prep.trace, mgr)
    op, a0, a1, bounds, decode_ids, args = prep.op, prep.a0, prep.a1, prep.bounds, prep.decode_ids, prep.hash_args
    cow_out = np.zeros((prep.max_batch, 2), dtype=np.int64)
    slot_out = np.zeros(prep.max_batch, dtype=np.int64)
    cows = np.zeros(prep.num_steps, dtype=np.int64) if cows is None else cows
    decode_step, append, last_slot = mgr.decode_step, mgr.append_slot, mgr.last_slot
    batched = regime == "batched"

    def run(lo: int, hi: int) -> None:
        for s in range(lo, hi):
            first, mid, end = bounds[s]
            hits = 0
            for i in range(first, mid):
                hits += apply_pool_op(mgr, op[i], a0[i], a1[i], args.get(i))
            if hits != prep.step_hits[s]:
                check_step_hits(prep.trace, s, hits)
            if batched:
                cows[s] = decode_step(decode_ids[s], cow_out, slot_out)
                continue
            n = 0
            for i in range(mid, end):
                if append(a0[i]) is not None:
                    n += 1
            for i in range(mid, end):
                last_slot(a0[i])
            cows[s] = n

    return run


def whole_step_runner(prep: Prepared, mgr, cows: np.ndarray | None = None, check: bool = True):
    """An untimed ``run(lo, hi)`` that replays steps ``[lo, hi)`` as an engine calls the whole-step entry point:
    one ``mgr.step`` call per step, with the step's pool operations and decode batch as views of the trace's
    arrays (made here, before any step runs). Copy-on-write counts per step go to ``cows`` when given. With
    ``check``, a step whose op statuses disagree with the trace raises :class:`ReplayError`; without it (the
    paced run, whose every instruction is counted) the caller checks ``cows`` and the end state afterwards."""
    op, a0, a1 = prep.arrays64
    steps = [(op[f:m], a0[f:m], a1[f:m], prep.decode_ids[s]) for s, (f, m, _) in enumerate(prep.bounds)]
    status_out = np.zeros(max((m - f for f, m, _ in prep.bounds), default=0) + 2, dtype=np.int64)
    cow_out = np.zeros((prep.max_batch, 2), dtype=np.int64)
    slot_out = np.zeros(prep.max_batch, dtype=np.int64)
    cows = np.zeros(prep.num_steps, dtype=np.int64) if cows is None else cows
    step = mgr.step

    def run(lo: int, hi: int) -> None:
        for s in range(lo, hi):
            ops, x, y, ids = steps[s]
            cows[s] = step(ops, x, y, ids, status_out, cow_out, slot_out)
            if check:
                _check_statuses(prep, s, status_out, int(cows[s]))

    return run


def _check_statuses(prep: Prepared, s: int, status_out: np.ndarray, rc: int) -> None:
    """The statuses a whole step reported must be the trace's: can_allocate's answers, 0 for every other op and
    for the decode batch."""
    first, mid, _ = prep.bounds[s]
    op, _, a1 = prep.arrays64
    expected = np.where(op[first:mid] == CAN_ALLOCATE, a1[first:mid], 0)
    got = status_out[: mid - first + 1]
    if rc < 0 or not np.array_equal(got[:-1], expected) or got[-1] != 0:
        raise ReplayError(f"step {s}: step() reported statuses {got.tolist()} and {rc}, the trace expects "
                          f"{expected.tolist()}, 0 and {prep.trace.step_cows[s]}")


def compiled_step_runner(prep: Prepared, mgr, drive, cows: np.ndarray | None = None):
    """``run(lo, hi)`` replaying steps ``[lo, hi)`` through the compiled driver (untimed use); copy-on-write
    counts per step go to ``cows`` when given."""
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
                                    False, _NO_DIGESTS, t.config["block_size"] - 1, *_caching_args(t, hits[lo:hi]))
        if status:
            raise ReplayError(f"compiled replay failed at step {lo + step}, op {index}: status {status}")
        if trace_uses_caching(t):
            check_hits(hits[lo:hi], t.step_hits, lo)

    return run


def _caching_args(trace: Trace, hits_out: np.ndarray) -> tuple:
    """The caching replay loop's three extra arguments for a caching trace, else none."""
    if not trace_uses_caching(trace):
        return ()
    return trace.hashes, trace.op_hash, hits_out


# Bound per design by compiled_driver(); the loop reads them as Numba globals, so that each design's loop is a
# module-level function of its own that Numba can cache (a closure over the kernels is never found in
# Numba's cache: compiling it costs about 1.5 s per design natively and half a minute under valgrind).
_k_can = _k_alloc = _k_fork = _k_free = _k_step = _k_lookup = None


# One function on purpose: Numba compiles it as the whole-step replay, and splitting it would add calls (and
# reference counting of array arguments) to the measured step.
def _replay_loop(state, op, a0, a1, seq_ids, step_offsets, decode_offsets, cow_out, slot_out, ticks_out, cows_out,  # noqa: C901
                 detail, digests_out, mask):
    t0 = 0
    digest = digests_out.shape[0] > 0  # slot digests, taken outside the timed regions (empty: not taken)
    for s in range(decode_offsets.shape[0]):
        t_step = ticks()
        for i in range(step_offsets[s], decode_offsets[s]):
            o = op[i]
            if detail:
                t0 = ticks()
            if o == CAN_ALLOCATE:
                rc = _k_can(*state, a0[i])
                if rc != a1[i]:
                    return 1, s, i
                rc = 0
                kind = _OTHER
            elif o == ALLOCATE:
                rc = _k_alloc(*state, a0[i], a1[i])
                kind = _ALLOC
            elif o == FREE:
                rc = _k_free(*state, a0[i])
                kind = _FREE
            else:
                rc = _k_fork(*state, a0[i], a1[i])
                kind = _OTHER
            if detail:
                ticks_out[s, kind] += ticks() - t0
            if rc != 0:
                return rc, s, i
        ids = seq_ids[decode_offsets[s] : step_offsets[s + 1]]
        if detail:
            t0 = ticks()
        rc, _ = _k_step(*state, ids, cow_out, slot_out)
        t1 = ticks()
        if rc < 0:
            return rc, s, decode_offsets[s]
        cows_out[s] = rc
        if digest:
            digests_out[s] = _digest_and_reset(slot_out, ids.shape[0], mask)
        if detail:
            ticks_out[s, _DECODE] = t1 - t0
            t0 = ticks()
            _k_lookup(*state, ids, slot_out)
            ticks_out[s, _LOOKUP] = ticks() - t0
            if digest and _digest_and_reset(slot_out, ids.shape[0], mask) != digests_out[s]:
                digests_out[s] = -1  # lookup disagrees with the step's own mapping
        else:
            ticks_out[s, _DECODE] = t1 - t_step  # the whole step as one region
    return 0, 0, 0


@njit(inline="always")
def _digest_and_reset(slot_out, n, mask):
    """The step's slot digest (see :func:`slot_digest`); the slots are then set to -1, so that a next call that
    skipped its writes cannot pass on these."""
    d = 0
    for j in range(n):
        d += (slot_out[j] & mask) + 1
        slot_out[j] = -1
    return d


_DRIVERS: dict[str, object] = {}
_NO_DIGESTS = np.zeros(0, dtype=np.int64)


def driver_for(kernels, trace: Trace):
    """The compiled replay loop for ``trace``: :func:`compiled_caching_driver` for a prefix-caching trace, else
    :func:`compiled_driver`."""
    return compiled_caching_driver(kernels) if trace_uses_caching(trace) else compiled_driver(kernels)


def compiled_driver(kernels):
    """The compiled replay loop over ``kernels`` (see :class:`impls.core.compiled.Kernels`), cached per design.

    ``drive(state, op, a0, a1, seq_ids, step_offsets, decode_offsets, cow_out, slot_out, ticks_out, cows_out,
    detail, digests_out, mask) -> (status, step, op_index)``: status 0 on success, else the failing kernel's
    code (or 1 for a ``can_allocate`` answer that disagrees with the trace). With ``detail`` it times every
    operation, else each whole step as one region (column ``decode`` of ``ticks_out``). A non-empty
    ``digests_out`` receives each step's slot digest (``mask`` = block_size - 1), taken outside timed regions.
    """
    key = kernels.decode_step.py_func.__module__
    if key not in _DRIVERS:
        env = {**_replay_loop.__globals__, "_k_can": kernels.can_allocate, "_k_alloc": kernels.allocate,
               "_k_fork": kernels.fork, "_k_free": kernels.free, "_k_step": kernels.decode_step,
               "_k_lookup": kernels.lookup}
        name = "replay_loop_" + re.sub(r"\W", "_", key)
        fn = types.FunctionType(_replay_loop.__code__, env, name)
        fn.__qualname__ = name
        _DRIVERS[key] = njit(cache=True)(fn)
    return _DRIVERS[key]


# -- the compiled replay of caching traces (designs whose kernels provide allocate_cached and seal) ----------
_k_alloc_cached = _k_seal = None


# A separate loop, so that the non-caching designs' replay stays exactly the code it was. One function on
# purpose, as _replay_loop.
def _replay_loop_caching(state, op, a0, a1, seq_ids, step_offsets, decode_offsets, cow_out, slot_out,  # noqa: C901
                         ticks_out, cows_out, detail, digests_out, mask, hashes, op_hash, hits_out):
    t0 = 0
    digest = digests_out.shape[0] > 0
    shift = 0
    while (1 << shift) <= mask:  # log2(block_size): the chain length is a shift, not a divide
        shift += 1
    for s in range(decode_offsets.shape[0]):
        t_step = ticks()
        hits = 0
        for i in range(step_offsets[s], decode_offsets[s]):
            o = op[i]
            if detail:
                t0 = ticks()
            if o == ALLOCATE_CACHED:
                at = op_hash[i]
                rc = _k_alloc_cached(*state, a0[i], a1[i], hashes[at : at + (a1[i] >> shift)])
                if rc >= 0:
                    hits += rc
                    rc = 0
                kind = _ALLOC
            elif o == SEAL:
                rc = _k_seal(*state, a0[i], hashes[op_hash[i]])
                if rc >= 0:
                    if rc != a1[i]:
                        return 1, s, i
                    rc = 0
                kind = _OTHER
            elif o == CAN_ALLOCATE:
                rc = _k_can(*state, a0[i])
                if rc != a1[i]:
                    return 1, s, i
                rc = 0
                kind = _OTHER
            elif o == ALLOCATE:
                rc = _k_alloc(*state, a0[i], a1[i])
                kind = _ALLOC
            elif o == FREE:
                rc = _k_free(*state, a0[i])
                kind = _FREE
            else:
                rc = _k_fork(*state, a0[i], a1[i])
                kind = _OTHER
            if detail:
                ticks_out[s, kind] += ticks() - t0
            if rc != 0:
                return rc, s, i
        ids = seq_ids[decode_offsets[s] : step_offsets[s + 1]]
        if detail:
            t0 = ticks()
        rc, _ = _k_step(*state, ids, cow_out, slot_out)
        t1 = ticks()
        if rc < 0:
            return rc, s, decode_offsets[s]
        cows_out[s] = rc
        hits_out[s] = hits
        if digest:
            digests_out[s] = _digest_and_reset(slot_out, ids.shape[0], mask)
        if detail:
            ticks_out[s, _DECODE] = t1 - t0
            t0 = ticks()
            _k_lookup(*state, ids, slot_out)
            ticks_out[s, _LOOKUP] = ticks() - t0
            if digest and _digest_and_reset(slot_out, ids.shape[0], mask) != digests_out[s]:
                digests_out[s] = -1
        else:
            ticks_out[s, _DECODE] = t1 - t_step
    return 0, 0, 0


def compiled_caching_driver(kernels):
    """The compiled replay loop of caching traces over ``kernels`` (an :class:`impls.core.compiled.CachingKernels`),
    cached per design: :func:`compiled_driver`'s ``drive`` with three more arguments, ``hashes`` (uint64, the
    trace's hash pool), ``op_hash`` (int64 per op: where an ALLOCATE_CACHED's chain or a SEAL's hash starts in
    ``hashes``) and ``hits_out`` (int64 per step: prompt tokens served from the cache, for :func:`check_hits`).
    ALLOCATE_CACHED: a0 = row, a1 = tokens, chain = ``hashes[op_hash[i] : op_hash[i] + a1 // block_size]``;
    SEAL: a0 = row, a1 = the answer expected (1/0, status 1 when it differs), hash = ``hashes[op_hash[i]]``.
    ``ValueError`` for kernels without the caching operations."""
    if not hasattr(kernels, "allocate_cached"):
        raise ValueError("these kernels have no prefix-caching operations (allocate_cached, seal)")
    key = "caching:" + kernels.decode_step.py_func.__module__
    if key not in _DRIVERS:
        env = {**_replay_loop_caching.__globals__, "_k_can": kernels.can_allocate, "_k_alloc": kernels.allocate,
               "_k_fork": kernels.fork, "_k_free": kernels.free, "_k_step": kernels.decode_step,
               "_k_lookup": kernels.lookup, "_k_alloc_cached": kernels.allocate_cached, "_k_seal": kernels.seal}
        name = "replay_loop_caching_" + re.sub(r"\W", "_", key.partition(":")[2])
        fn = types.FunctionType(_replay_loop_caching.__code__, env, name)
        fn.__qualname__ = name
        _DRIVERS[key] = njit(cache=True)(fn)
    return _DRIVERS[key]


def check_hits(hits: np.ndarray, expected: np.ndarray, lo: int = 0) -> None:
    """Prompt tokens served from the cache per step, steps ``[lo, lo + len)``, must be the expected ones (every
    design makes the same choices: hit counts are a correctness check, as copy-on-write counts are)."""
    bad = np.flatnonzero(np.asarray(hits) != np.asarray(expected)[lo : lo + len(hits)])
    if bad.size:
        s = lo + int(bad[0])
        raise ReplayError(f"step {s}: {int(hits[s - lo])} tokens served from the cache, the trace expects "
                          f"{int(expected[s])}")


def run_compiled(prep: Prepared, mgr, drive, detail: bool, lo: int = 0, hi: int | None = None) -> StepTimes:
    """Time steps ``[lo, hi)`` (default: all) of a whole-step-compiled replay (batched regime of a compiled
    design), on a manager already at step ``lo``."""
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
                                t.config["block_size"] - 1, *_caching_args(t, hits))
    if status:
        raise ReplayError(f"compiled replay failed at step {lo + step}, op {index}: status {status}")
    if trace_uses_caching(t):
        check_hits(hits, t.step_hits, lo)
    ns = ticks_out * ns_per_tick()
    if detail:
        step_ns = ns[:, _ALLOC] + ns[:, _FREE] + ns[:, _OTHER] + ns[:, _DECODE]
        regions = float((t.decode_offsets[lo:hi] - t.step_offsets[lo:hi]).mean()) + 1 if hi > lo else 1.0
    else:
        step_ns = ns[:, _DECODE].copy()
        regions = 1.0
    return StepTimes(ns, cows, step_ns, regions, "rdtsc", digests)


# -- the native driver (C++ designs, impls.native) -----------------------------------------------------------
def is_native(cls: type) -> bool:
    """Whether ``cls`` is replayed inside C++ (the ``cpp-*`` designs)."""
    return getattr(cls, "native", False) is True


def _native_replay(prep: Prepared, mgr, detail: bool, lo: int, hi: int):
    check_replayable(prep.trace, mgr, "native")
    from impls import native

    if prep.native_arrays is None:
        prep.native_arrays = native.prepare(prep.trace)
    try:
        return native.replay(mgr, prep.native_arrays, detail, lo, hi)
    except native.NativeReplayError as exc:
        raise ReplayError(str(exc)) from None


def native_step_runner(prep: Prepared, mgr, cows: np.ndarray | None = None):
    """``run(lo, hi)`` replaying steps ``[lo, hi)`` inside C++ (untimed use: allocations, instruction counts);
    copy-on-write counts per step go to ``cows`` when given."""
    cows = np.zeros(prep.num_steps, dtype=np.int64) if cows is None else cows

    def run(lo: int, hi: int) -> None:
        cows[lo:hi] = _native_replay(prep, mgr, False, lo, hi).cows

    return run


def run_native(prep: Prepared, mgr, detail: bool, lo: int = 0, hi: int | None = None) -> StepTimes:
    """Time steps ``[lo, hi)`` inside C++: one foreign call, timed as :func:`run_compiled` times the compiled
    loop. The C++ driver keeps its slot mapping to itself: slots are checked by :func:`verify_slots`."""
    r = _native_replay(prep, mgr, detail, lo, prep.num_steps if hi is None else hi)
    return StepTimes(r.ns, r.cows, r.step_ns, r.timed_regions_per_step, r.clock)
