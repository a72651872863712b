"""Workers of different designs taking turns slice by slice, so that each design has a process of its own and
its ratios to the base stay paired.

Each design's cells run in a worker of their own (:class:`harness.measure.workers.WorkerSpec`): nothing a design
does to its process (patching another class, leaking memory, changing the working folder) reaches another's
figures. Running those workers at once would time them against each other on a machine of few cores; one after
the other, drift would fall on one design and not the next. So they alternate: a job pauses before each slice
(:meth:`harness.measure.workers.Events.pause`); the supervisor lets every job waiting at the earliest position
(pass, repetition, slice) replay its slice in turn, in an order rotated from position to position, and only one
worker runs at any moment. A slice's blocks are then replayed by every design within one pass over the
designs, as the cells of one process are (:mod:`harness.measure.interleave`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from harness.measure.workers import CellDied, Pool, Position, Worker, WorkerBug


def lockstep(pool: Pool, jobs: dict[Any, Any], on_tick: Callable[[str], None] = lambda what: None,
             on_status: Callable[[str], None] = lambda what: None) -> dict[Any, Any]:
    """Each key's result, or the :class:`CellDied` or :class:`WorkerBug` its job ended with (a WorkerBug carries
    ``cell``: the last cell its worker entered). Jobs start one at a time, each alone until its first pause."""
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
