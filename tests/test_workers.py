"""Worker processes: the deadline is the design's, inside a cell; our own silent stretches are not cut short."""

from __future__ import annotations

import time

import pytest

from harness.run.workers import CellDied, Events, Worker


def quiet_job(job: tuple[str, float], events: Events) -> str:
    """A job that stays silent for ``seconds``, inside a cell or outside any (a worker's entry point)."""
    where, seconds = job
    if where == "cell":
        events.cell(("slow", "batched"))
    time.sleep(seconds)
    events.cell(None)
    return "done"


def test_silence_inside_a_cell_is_cut_at_the_deadline_and_blamed_on_the_cell() -> None:
    worker = Worker(quiet_job, deadline_s=1.0)
    try:
        with pytest.raises(CellDied) as died:
            worker.run(("cell", 30.0))
        assert died.value.cell == ("slow", "batched") and "deadline" in died.value.reason
        assert worker.run(("outside", 0.0)) == "done"  # a fresh worker takes the next job
    finally:
        worker.stop()


def test_silence_outside_any_cell_is_our_own_code_and_not_a_hang() -> None:
    worker = Worker(quiet_job, deadline_s=1.0)
    try:
        assert worker.run(("outside", 3.0)) == "done"  # e.g. a callgrind study: one call of minutes
    finally:
        worker.stop()


def test_a_process_that_cannot_start_leaves_the_worker_stopped(monkeypatch: pytest.MonkeyPatch) -> None:
    """A failed start (e.g. spawn refused while the main module is still importing) raises that error, and the
    worker can still be stopped and started again (its stop once failed on the half-made process)."""
    import multiprocessing.process

    worker = Worker(quiet_job, deadline_s=1.0)
    with monkeypatch.context() as patch:
        patch.setattr(multiprocessing.process.BaseProcess, "start", lambda self: (_ for _ in ()).throw(
            RuntimeError("cannot start")))
        with pytest.raises(RuntimeError, match="cannot start"):
            worker.run(("outside", 0.0))
    worker.stop()
    try:
        assert worker.run(("outside", 0.0)) == "done"
    finally:
        worker.stop()


@pytest.mark.parametrize("interrupted", [True, False])
def test_busy_workers_are_stopped_together_not_one_after_another(interrupted: bool) -> None:
    """Four workers in a job of a minute: an interrupted command kills them at once; a normal close gives them one
    shared wait (a full run's nine to seventeen workers took 28-38 s to stop one by one, 2 s each, under load)."""
    from harness.run.workers import STOP_WAIT_S, Workers

    class Four(Workers):
        def __init__(self) -> None:
            self.workers = {i: Worker(quiet_job, deadline_s=120.0) for i in range(4)}

    pool = Four()
    for worker in pool.workers.values():
        worker.submit(("outside", 60.0))
    procs = [worker._proc for worker in pool.workers.values()]
    started = time.monotonic()
    pool.close(at_once=interrupted)
    took = time.monotonic() - started
    assert not any(proc.is_alive() for proc in procs)
    assert took < (2.0 if interrupted else STOP_WAIT_S + 2.0), took
