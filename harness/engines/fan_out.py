"""A trace as an engine without fork serves it: each fork an independent request.
Design: docs/output.md#harnessenginesfan_outpy."""

from __future__ import annotations

from impls.contract import NoFreeBlocksError
from scenarios import Trace
from scenarios.scheduler import TraceBuilder
from scenarios.trace import ALLOCATE, ALLOCATE_CACHED, CAN_ALLOCATE, FORK, FREE, SEAL, trace_uses_caching


class FanOutError(ValueError):
    """The trace's forks, made independent requests, do not fit its pool (or it uses prefix caching)."""


def fan_out_forks(trace: Trace) -> Trace:
    """``trace`` with every fork replaced by an independent admission of the parent's length."""
    if not int(trace.header["ops_by_kind"].get("fork", 0)):
        return trace
    if trace_uses_caching(trace):
        raise FanOutError(f"{trace.header['scenario']}: forks in a prefix-caching trace are not fanned out")
    b = TraceBuilder(trace.config)
    op, a0, a1 = trace.op.tolist(), trace.a0.tolist(), trace.a1.tolist()
    try:
        for s in range(trace.num_steps):
            first, mid, end = (int(x) for x in (trace.step_offsets[s], trace.decode_offsets[s],
                                                trace.step_offsets[s + 1]))
            for i in range(first, mid):
                _apply(b, op[i], a0[i], a1[i])
            b.decode(a0[mid:end])
    except NoFreeBlocksError as exc:
        raise FanOutError(f"{trace.header['scenario']}: with its forks as independent requests the trace does not "
                          f"fit its pool ({exc})") from None
    h = trace.header
    return b.finish(f"{h['scenario']} (forks fanned out)", {**h["params"], "forks": "fanned out"}, h["seed"],
                    h["num_requests"] + int(h["ops_by_kind"].get("fork", 0)))


def _apply(b: TraceBuilder, op: int, a0: int, a1: int) -> None:
    if op == FORK:
        b.allocate(a1, b.model.lens[a0])
    elif op == ALLOCATE:
        b.allocate(a0, a1)
    elif op == FREE:
        b.free(a0)
    elif op == CAN_ALLOCATE:
        b.can_allocate(a0)
    elif op in (ALLOCATE_CACHED, SEAL):  # pragma: no cover - refused above
        raise FanOutError("prefix-caching ops are not fanned out")
