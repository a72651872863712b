"""Workers of different designs take turns slice by slice (harness/run/lockstep.py), one at a time."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from harness.run.lockstep import lockstep
from harness.run.workers import CellDied, Events, Pool, WorkerSpec


def slices_job(job: tuple[str, str, int, bool], events: Events) -> int:
    """Pause before each of ``slices`` slices and log ``name slice`` after it; with ``dies``, exit in slice 1."""
    name, log, slices, dies = job
    events.cell((name, "batched"))
    for k in range(slices):
        events.pause((0, 0, k))
        if dies and k == 1:
            os._exit(0)
        with open(log, "a", encoding="ascii") as out:
            out.write(f"{name} {k}\n")
    events.cell(None)
    return os.getpid()


def test_workers_take_turns_slice_by_slice_in_rotated_order(tmp_path: Path) -> None:
    log = str(tmp_path / "log")
    with Pool(1, slices_job, deadline_s=60) as pool:
        jobs = {WorkerSpec("a"): ("a", log, 4, False), WorkerSpec("b"): ("b", log, 3, False),
                WorkerSpec("c"): ("c", log, 4, False)}
        results = lockstep(pool, jobs)
    lines = Path(log).read_text().split()
    order = list(zip(lines[::2], map(int, lines[1::2]), strict=True))
    assert [k for _, k in order] == sorted(k for _, k in order)  # no worker is a slice ahead of another
    by_slice = [[name for name, k in order if k == s] for s in range(4)]
    assert by_slice[:3] == [["a", "b", "c"], ["b", "c", "a"], ["c", "a", "b"]] and by_slice[3] == ["c", "a"]
    assert len(set(results.values())) == 3  # three processes


def test_a_worker_that_dies_costs_only_its_own_job(tmp_path: Path) -> None:
    log = str(tmp_path / "log")
    with Pool(1, slices_job, deadline_s=60) as pool:
        results = lockstep(pool, {WorkerSpec("a"): ("a", log, 3, False), WorkerSpec("b"): ("b", log, 3, True)})
    assert isinstance(results[WorkerSpec("b")], CellDied) and results[WorkerSpec("b")].cell == ("b", "batched")
    assert isinstance(results[WorkerSpec("a")], int)
    assert Path(log).read_text().split("\n").count("a 2") == 1


def pid_job(job: object, events: Events) -> int:
    return os.getpid()


def test_a_pool_keeps_at_most_its_limit_of_processes_the_most_recently_used_other_stopped() -> None:
    pool = Pool(1, pid_job, limit=2)
    try:
        first = pool.run("x", 0)
        pool.run("y", 0)
        assert pool.run("x", 0) == first  # kept
        pool.run("z", 0)  # x, the most recently used other, is stopped (a cycle x y z x y z needs y next)
        assert list(pool.workers) == ["y", "z"]
    finally:
        pool.close()


@pytest.mark.parametrize("spec", [WorkerSpec(), WorkerSpec("dict", 2)])
def test_a_worker_spec_names_the_current_code_by_default(spec: WorkerSpec) -> None:
    assert spec.code == ""
