"""Applying a trace to a BlockManager, and checking that it ended where the trace says it must."""

from __future__ import annotations

import numpy as np

from impls.contract import supports_prefix_caching
from impls.core import ops as pool_ops
from scenarios.trace import ALLOCATE_CACHED, APPEND, SEAL, Trace, canonical_tables, trace_uses_caching

REGIMES = ("batched", "per-call", "step")


class ReplayError(Exception):
    """An implementation disagreed with the trace: a wrong answer, a failure, or a wrong end state (the design's
    failure, never the harness's)."""


INT64 = 1 << 63


def answered(value: object, call: str, s: int) -> int:
    """The count ``call`` answered at step ``s`` as an int; :class:`ReplayError` unless an integer of 64 bits."""
    if isinstance(value, (int, np.integer, np.bool_)) and -INT64 <= int(value) < INT64:
        return int(value)
    raise ReplayError(f"step {s}: {call} returned {answered_shown(value)}, not an integer count")


def answered_shown(value: object) -> str:
    """A design's answer in a reason: its repr when short and plain, else its type."""
    return repr(value)[:80] if isinstance(value, (int, float, str, bytes, type(None))) else f"a {type(value).__name__}"


def check_replayable(trace: Trace, mgr, driver: str = "python") -> None:
    """Refuse a prefix-caching trace that ``mgr`` (or a non-Python ``driver``) cannot replay, before it starts."""
    if not trace_uses_caching(trace):
        return
    name = trace.header["scenario"]
    if not supports_prefix_caching(mgr):
        raise ReplayError(f"{type(mgr).__name__} has no prefix caching (impls.contract.CachingBlockManager), and "
                          f"trace {name!r} uses it; replay it on a design with prefix caching")
    if driver in ("native", "step") or (driver == "compiled" and not hasattr(getattr(mgr, "kernels", None),
                                                                             "allocate_cached")):
        raise ReplayError(f"the {driver} driver of {type(mgr).__name__} does not replay prefix-caching ops (trace "
                          f"{name!r}); replay it from Python (the interpreted driver)")


def hash_args(trace: Trace, hashes: np.ndarray | None = None) -> dict[int, np.ndarray | int]:
    """Per prefix-caching op index: its chain (ALLOCATE_CACHED) or hash (SEAL), made outside timed regions."""
    pool = trace.arrays.get("hashes") if hashes is None else hashes
    found = np.flatnonzero((trace.op == ALLOCATE_CACHED) | (trace.op == SEAL)).tolist()
    args: dict[int, np.ndarray | int] = {}
    for i in found:
        start = int(trace.op_hash[i])
        n = int(trace.a1[i]) >> (trace.config["block_size"].bit_length() - 1) if trace.op[i] == ALLOCATE_CACHED else 1
        args[i] = pool[start : start + n] if trace.op[i] == ALLOCATE_CACHED else int(pool[start])
    return args


def apply_pool_op(mgr, op: int, a0: int, a1: int, arg: np.ndarray | int | None = None) -> int:
    """One pool operation of a trace, as a scheduler issues it; the prompt tokens the cache served, else 0."""
    if op == APPEND:
        mgr.append_slot(a0)
        return 0
    if op not in pool_ops.POOL_OPS:
        raise ReplayError(f"unknown op code {op}")
    spec = pool_ops.POOL_OPS[op]
    got = pool_ops.apply(mgr, op, a0, a1, arg)
    if spec.result == "answer" and bool(got) != bool(a1):
        raise ReplayError(f"{spec.method}({a0}) answered {got}, the trace expects {bool(a1)}")
    return got if spec.result == "hits" else 0


def check_step_hits(trace: Trace, step: int, hits: int) -> None:
    """The prompt tokens the cache served in ``step`` must be the trace's."""
    if hits != trace.step_hits[step]:
        raise ReplayError(f"step {step}: the cache served {hits} prompt tokens, the trace expects "
                          f"{int(trace.step_hits[step])}")


def replay(trace: Trace, mgr, regime: str = "per-call") -> int:
    """Apply every step of ``trace`` to ``mgr``; returns the number of copy-on-writes it reported."""
    if regime not in REGIMES:
        raise ValueError(f"unknown regime {regime!r}; choose from {REGIMES}")
    check_replayable(trace, mgr)
    op, a0, a1, args = trace.op.tolist(), trace.a0.tolist(), trace.a1.tolist(), hash_args(trace)
    n = int(trace.running_per_step().max(initial=0))
    cow_out, slot_out = np.zeros((n, 2), np.int64), np.zeros(n, np.int64)
    cows = 0
    for step in range(trace.num_steps):
        lo, mid, hi = int(trace.step_offsets[step]), int(trace.decode_offsets[step]), int(trace.step_offsets[step + 1])
        hits = sum(apply_pool_op(mgr, op[i], a0[i], a1[i], args.get(i)) for i in range(lo, mid))
        check_step_hits(trace, step, hits)
        if regime == "batched":
            step_cows = answered(mgr.decode_step(trace.a0[mid:hi].astype(np.int64), cow_out, slot_out), "decode_step",
                                 step)
        else:
            step_cows = sum(mgr.append_slot(a0[i]) is not None for i in range(mid, hi))
        if step_cows != trace.step_cows[step]:
            raise ReplayError(f"step {step}: {step_cows} copy-on-writes, the trace expects {trace.step_cows[step]}")
        cows += step_cows
    return cows


def check_end_state(trace: Trace, mgr) -> None:
    """The manager's free count, live rows, lengths and tables (up to renaming) must match the trace."""
    expected_free = trace.header["final_free"]
    if mgr.num_free_blocks() != expected_free:
        raise ReplayError(f"{mgr.num_free_blocks()} free blocks at the end, the trace expects {expected_free}")
    tables = {}
    for row, length in enumerate(trace.final_lens.tolist()):
        try:
            got = mgr.seq_len(row)
        except KeyError:
            got = 0
        if got != length:
            raise ReplayError(f"row {row}: length {got} at the end, the trace expects {length}")
        if length:
            tables[row] = mgr.block_table(row)
    if canonical_tables(tables) != trace.final_canon.tolist():
        raise ReplayError("block tables at the end differ from the trace's (up to renaming of block ids)")
