"""Workers of different designs taking turns slice by slice: each design in a process of its own, one process
running at a time, every design's slice k replayed within one pass, so ratios stay paired (docs/method.md)."""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

from harness.base.stats import SEED
from harness.run.workers import CellDied, Pool, Position, Worker, WorkerBug, WorkerSpec

Order = Callable[[list, int], list]


def rotated(ready: list, turn: int) -> list:
    """The keys ready at a position, rotated by one more each turn."""
    return ready[turn % len(ready):] + ready[: turn % len(ready)]


def alternating(codes: list[str], seed: int = SEED) -> Order:
    """An order for workers keyed by :class:`WorkerSpec` of several code versions (``kvblock-bench ab``): each
    implementation's versions side by side, which goes first drawn at a turn and swapped at the next one, the
    implementations in an order drawn anew each turn, so that no version always follows the same slice."""
    rng = random.Random(seed)
    drawn: dict[str, bool] = {}
    last = [-2]

    def order(ready: list[WorkerSpec], turn: int) -> list[WorkerSpec]:
        impls = list(dict.fromkeys(spec.impl for spec in ready))
        rng.shuffle(impls)
        swap = turn == last[0] + 1 and turn % 2 == 1  # the second turn of a pair: each order reversed
        last[0] = turn
        out = []
        for impl in impls:
            reverse = not drawn.get(impl, False) if swap else rng.random() < 0.5
            drawn[impl] = reverse
            out += sorted((s for s in ready if s.impl == impl), key=lambda s: codes.index(s.code), reverse=reverse)
        return out

    return order


def lockstep(pool: Pool, jobs: dict[Any, Any], on_tick: Callable[[str], None] = lambda what: None,
             on_status: Callable[[str], None] = lambda what: None, order: Order = rotated,
             on_position: Callable[[Position], None] = lambda position: None) -> dict[Any, Any]:
    """Each key's result, or the :class:`CellDied` or :class:`WorkerBug` (with ``cell``) it ended with. Jobs start
    one at a time; then at each earliest position (``on_position``) every job there goes in turn, in ``order``."""
    results: dict[Any, Any] = {}
    waiting: dict[Any, tuple[Position, Worker]] = {}
    for key, job in jobs.items():
        worker = pool.worker(key, keep=jobs)
        worker.submit(job)
        _advance(key, worker, waiting, results, on_tick, on_status)
    turn = 0
    while waiting:
        position = min(pos for pos, _ in waiting.values())
        on_position(position)
        ready = order([key for key in jobs if key in waiting and waiting[key][0] == position], turn)
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
