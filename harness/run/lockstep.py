"""Workers of different designs taking turns slice by slice: each design in a process of its own, one process
running at a time, every design's slice k replayed within one pass, so ratios stay paired (docs/method.md)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from harness.run.workers import CellDied, Pool, Position, Worker, WorkerBug


def lockstep(pool: Pool, jobs: dict[Any, Any], on_tick: Callable[[str], None] = lambda what: None,
             on_status: Callable[[str], None] = lambda what: None) -> dict[Any, Any]:
    """Each key's result, or the :class:`CellDied` or :class:`WorkerBug` (with ``cell``) it ended with. Jobs start
    one at a time; then at each earliest position every job there goes in turn, in a rotated order."""
    results: dict[Any, Any] = {}
    waiting: dict[Any, tuple[Position, Worker]] = {}
    for key, job in jobs.items():
        worker = pool.worker(key, keep=jobs)
        worker.submit(job)
        _advance(key, worker, waiting, results, on_tick, on_status)
    turn = 0
    while waiting:
        position = min(pos for pos, _ in waiting.values())
        ready = [key for key in jobs if key in waiting and waiting[key][0] == position]
        ready = ready[turn % len(ready):] + ready[: turn % len(ready)]
        turn += 1
        for key in ready:
            worker = waiting.pop(key)[1]
            worker.go()
            _advance(key, worker, waiting, results, on_tick, on_status)
    return results


def _advance(key: Any, worker: Worker, waiting: dict, results: dict, on_tick: Callable[[str], None],
             on_status: Callable[[str], None]) -> None:
    try:
        kind, value = worker.advance(on_tick, on_status)
    except (CellDied, WorkerBug) as exc:
        exc.cell = exc.cell if isinstance(exc, CellDied) else worker.last_cell
        results[key] = exc
        return
    if kind == "ready":
        waiting[key] = (tuple(value), worker)
    else:
        results[key] = value
