"""The dispatch floor of the per-call regime: what a compiled design's contract calls cost with no work behind."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

from harness.base.rows import Row
from impls.contract import STEP_OPS
from impls.core.compiled import with_empty_kernels
from impls.core.ops import POOL_OPS
from scenarios.trace import Trace

CALLS = 2000
REPEATS = 5
OPS = ("can_allocate", "allocate", "fork", "free", "append_slot", "last_slot")
TRACE_OPS = {code: POOL_OPS[code].method for code in STEP_OPS}


def has_dispatch(cls: type) -> bool:
    """Whether ``cls``'s per-call methods cross into compiled kernels (a compiled design)."""
    return getattr(cls, "kernels", None) is not None and hasattr(cls, "rebind")


def empty_calls(mgr) -> dict[str, Callable[[], object]]:
    """Per operation, one contract call through ``mgr``'s own wrappers, on a copy whose kernels are empty."""
    empty = with_empty_kernels(mgr)
    return {"can_allocate": lambda: empty.can_allocate(1), "allocate": lambda: empty.allocate(0, 1),
            "fork": lambda: empty.fork(0, 1), "free": lambda: empty.free(0),
            "append_slot": lambda: empty.append_slot(0), "last_slot": lambda: empty.last_slot(0)}


def empty_call_ns(mgr, calls: int = CALLS, repeats: int = REPEATS) -> dict[str, float]:
    """Nanoseconds per empty call, per operation (median over ``repeats`` loops of ``calls`` calls)."""
    out = {}
    perf = time.perf_counter_ns
    for op, fn in empty_calls(mgr).items():
        fn()
        loops = []
        for _ in range(repeats):
            t0 = perf()
            for _ in range(calls):
                fn()
            loops.append((perf() - t0) / calls)
        out[op] = statistics.median(loops)
    return out


def calls_per_trace(trace: Trace) -> dict[str, int]:
    """The contract calls a per-call replay of ``trace`` makes, per operation."""
    counts = {name: int((trace.op == code).sum()) for code, name in TRACE_OPS.items()}
    running = int(trace.running_per_step().sum())
    return {**counts, "append_slot": running, "last_slot": running}


def dispatch_rows(scenario: str, impl: str, per_op_ns: dict[str, float], calls: dict[str, int]) -> list[Row]:
    """``empty_call_<op>_ns`` per operation and ``dispatch_floor_seq_step_ns`` for one per-call cell."""
    how = (f"the design's per-call wrapper over an empty kernel, same entry path; {CALLS} calls timed as one "
           f"region, median of {REPEATS}")
    rows = [Row(scenario, impl, "per-call", f"empty_call_{op}_ns", ns, "ns", "perf_counter_ns", how=how,
                reps=REPEATS) for op, ns in per_op_ns.items()]
    seq_steps = calls["append_slot"]
    if seq_steps:
        floor = sum(per_op_ns[op] * n for op, n in calls.items()) / seq_steps
        rows.append(Row(scenario, impl, "per-call", "dispatch_floor_seq_step_ns", floor, "ns", "perf_counter_ns",
                        how="computed: each operation's empty-call time x its calls in the trace, over the "
                            "sequence-steps (the per-call seq_step_ns with no data-structure work)", reps=REPEATS))
    return rows
