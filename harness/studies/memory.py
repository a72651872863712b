"""Memory, measured: each design's tables and metadata at the trace's peak. Design: docs/measurement.md#memory."""

from __future__ import annotations

import contextlib
import gc
import inspect
import os
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path

import numpy as np

from harness.base.builds import build_of, with_build
from harness.base.failures import blamed_on
from harness.base.project import IMPLS_DIR
from harness.base.replay import ReplayError, answered, answered_shown, apply_pool_op, check_step_hits, hash_args
from harness.base.rows import Row
from harness.errors import DesignFailure
from scenarios.trace import Trace, trace_uses_caching


class Replayer:
    """Replays steps of one trace on a manager from Python, as an engine's scheduler would call it."""

    def __init__(self, trace: Trace) -> None:
        self.trace = trace
        self.op, self.a0, self.a1 = trace.op.tolist(), trace.a0.tolist(), trace.a1.tolist()
        self.args = hash_args(trace)
        n = max(1, int(trace.running_per_step().max(initial=0)))
        self.cow_out, self.slot_out = np.zeros((n, 2), np.int64), np.zeros(n, np.int64)
        self.ids = trace.a0.astype(np.int64)

    def advance(self, mgr, lo: int, hi: int) -> None:
        """Steps ``[lo, hi)``; ``ReplayError`` where ``mgr`` disagrees with the trace."""
        t = self.trace
        for step in range(lo, hi):
            a, mid, b = int(t.step_offsets[step]), int(t.decode_offsets[step]), int(t.step_offsets[step + 1])
            hits = sum(apply_pool_op(mgr, self.op[i], self.a0[i], self.a1[i], self.args.get(i)) for i in range(a, mid))
            check_step_hits(t, step, hits)
            cows = answered(mgr.decode_step(self.ids[mid:b], self.cow_out, self.slot_out), "decode_step", step)
            if cows != t.step_cows[step]:
                raise ReplayError(f"step {step}: {cows} copy-on-writes, the trace expects {t.step_cows[step]}")


def peak_step(trace: Trace) -> int:
    """How many steps to replay to stand at the trace's peak: the first step after which the most blocks are in use
    (replayed on ``flat``, or ``flat-pc`` for a prefix-caching trace)."""
    from impls import REGISTRY
    from impls.registry import CACHING_RATIO_BASE, RATIO_BASE

    mgr = REGISTRY[CACHING_RATIO_BASE if trace_uses_caching(trace) else RATIO_BASE](**trace.config)
    replayer, lowest, at = Replayer(trace), mgr.num_blocks + 1, 0
    for step in range(trace.num_steps):
        replayer.advance(mgr, step, step + 1)
        if mgr.num_free_blocks() < lowest:
            lowest, at = mgr.num_free_blocks(), step + 1
    return at


def code_roots(cls: type) -> tuple[str, ...]:
    """Folders whose code counts as the implementation's: ``impls/`` and, for a plug-in, its own folder."""
    roots = {str(IMPLS_DIR) + os.sep}
    with contextlib.suppress(TypeError, OSError):
        roots.add(str(Path(inspect.getfile(cls)).resolve().parent) + os.sep)
    return tuple(sorted(roots))


def live_bytes(build, roots: Iterable[str]) -> tuple[object, int]:
    """``build()``'s result and the bytes it allocated (memray) that are still live when it returns, counting
    allocations whose Python stack has a frame under one of ``roots``."""
    import memray

    roots = tuple(roots)
    fd, path = tempfile.mkstemp(suffix=".memray")
    os.close(fd)
    os.unlink(path)
    gc.collect()
    try:
        with memray.Tracker(path, trace_python_allocators=True, native_traces=False, follow_fork=False):
            result = build()
            gc.collect()  # garbage in reference cycles is not the design's state
        records = memray.FileReader(path).get_leaked_allocation_records(merge_threads=True)
        total = sum(r.size for r in records if any(f[1].startswith(roots) for f in r.stack_trace()))
        return result, total
    finally:
        if os.path.exists(path):
            os.unlink(path)


def measure_one(cls: type, trace: Trace, steps: int) -> tuple[int, str, int]:
    """``(bytes, source, stated bytes)`` of ``cls`` after ``steps`` steps of ``trace``."""
    replayer = Replayer(trace)

    def build():
        mgr = cls(**trace.config)
        replayer.advance(mgr, 0, steps)
        return mgr

    # The same steps untracked first: what the replay compiles or caches on its way is not the design's state.
    warm = cls(**trace.config)
    replayer.advance(warm, 0, steps)
    del warm
    mgr, total = live_bytes(build, code_roots(cls))
    return total, "memray", stated_bytes(mgr)


def stated_bytes(mgr) -> int | None:
    """What ``mgr.memory_bytes()`` states (None: no such method); :class:`ReplayError` unless an int >= 0."""
    method = getattr(type(mgr), "memory_bytes", None)
    if method is None:
        return None
    value = mgr.memory_bytes()
    if type(value) is not int or value < 0:
        raise ReplayError(f"memory_bytes() returned {answered_shown(value)}, not a byte count (an int, 0 or more)")
    return value


def _regimes(cells: list[tuple[str, str]]) -> dict[str, str]:
    """Each implementation once: its batched cell's regime where it has one."""
    out: dict[str, str] = {}
    for impl, regime in cells:
        if out.get(impl) != "batched":
            out[impl] = regime
    return out


def memory_rows(scenario: str, trace: Trace, cells: list[tuple[str, str]], classes: dict[str, type],
                enter: Callable[[tuple[str, str] | None], None] = lambda cell: None) -> list[Row]:
    """Memory rows for each implementation among ``cells``; a design that fails gets a failed row."""
    steps = peak_step(trace)
    peak = trace.header["peak_blocks_in_use"]
    where = f"after step {steps} of {trace.num_steps}, the trace's peak ({peak:,} blocks in use)"
    seqs = trace.config["max_seqs"]
    rows: list[Row] = []
    for impl, regime in _regimes(cells).items():
        enter((impl, regime))
        try:
            with blamed_on(impl, classes[impl]):
                value, source, stated = measure_one(classes[impl], trace, steps)
        except DesignFailure as exc:
            rows.append(Row(scenario, impl, regime, "memory_bytes", float("nan"), "B", "replay", "failed",
                            exc.reason))
            continue
        how = ("live bytes allocated from construction on, from implementation code (memray, Python allocators "
               "traced)")
        rows.append(Row(scenario, impl, regime, "memory_bytes", float(value), "B", source,
                        how=with_build(f"{how}; {where}", build_of(classes[impl])), steps=steps, seqs=seqs,
                        driver="python"))
        if stated is None:
            rows.append(Row(scenario, impl, regime, "memory_stated_bytes", float("nan"), "B", "memory_bytes()",
                            "unavailable", "the design has no memory_bytes()", seqs=seqs))
            continue
        rows.append(Row(scenario, impl, regime, "memory_stated_bytes", float(stated), "B", "memory_bytes()",
                        how="what the constructor allocates, as the design states it (refuses configurations "
                            "larger than the machine's available memory)", seqs=seqs))
    return rows
