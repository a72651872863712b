"""The interleaving's schedule: which steps each repetition replays per slice, and in which order of cells."""

from __future__ import annotations

import itertools
import time

import pytest

from harness.base import interleave as il
from harness.base.interleave import replay_slices, schedule, slice_bounds


@pytest.mark.parametrize("steps", [7, 200, 2000, 2001])
@pytest.mark.parametrize("reps", [1, 2, 3, 5])
def test_every_repetition_replays_every_step_once_in_order(steps: int, reps: int) -> None:
    blocks = slice_bounds(steps)
    for rep in range(reps):
        bounds = replay_slices(blocks, rep, reps)
        assert bounds[0][0] == 0 and bounds[-1][1] == steps
        assert all(hi > lo for lo, hi in bounds)
        assert all(a[1] == b[0] for a, b in itertools.pairwise(bounds))
    assert replay_slices(blocks, 0, reps) == blocks  # repetition 0 replays the estimates' blocks


@pytest.mark.parametrize("steps", [200, 2000])
def test_no_step_starts_a_slice_in_two_repetitions(steps: int) -> None:
    """The first step after a switch of cells is slow for the harness's sake; with three repetitions each
    step (but the trace's first) is that step at most once, and its median over repetitions is a warm one."""
    blocks, reps = slice_bounds(steps), 3
    starts = [{lo for lo, _ in replay_slices(blocks, rep, reps)} - {0} for rep in range(reps)]
    assert all(not (starts[a] & starts[b]) for a in range(reps) for b in range(a + 1, reps))
    size = blocks[0][1] - blocks[0][0]
    assert min(starts[1]) == size // 3 and min(starts[2]) == 2 * size // 3


@pytest.mark.parametrize("n", [1, 2, 3, 5, 6, 20, 21])
def test_each_cell_runs_first_once_every_n_slices(n: int) -> None:
    for rep in range(3):
        orders = schedule(n, rep, 2 * n)
        assert all(sorted(order) == list(range(n)) for order in orders)
        assert sorted(order[0] for order in orders[:n]) == list(range(n))


def _predecessors(order: list[int]) -> dict[int, int]:
    return {cell: order[i - 1] for i, cell in enumerate(order) if i}


@pytest.mark.parametrize("n", [5, 7, 8, 12, 20, 21])
def test_a_cell_follows_a_different_cell_in_each_repetition(n: int) -> None:
    """Within a slice a cell follows the same cell in every slice of a repetition (rotation keeps neighbours),
    so the repetitions change the neighbours: three repetitions, three different predecessors."""
    seen: dict[int, set[int]] = {c: set() for c in range(n)}
    for rep in range(3):
        per_rep = {c: set() for c in range(n)}
        for order in schedule(n, rep, n):
            for cell, before in _predecessors(order).items():
                per_rep[cell].add(before)
        for cell, before in per_rep.items():
            assert len(before) == 1  # a rotation: one predecessor per repetition
            seen[cell] |= before
    assert all(len(before) == 3 for before in seen.values())


@pytest.mark.parametrize("n", [3, 4, 6])
def test_consecutive_repetitions_change_neighbours_for_few_cells(n: int) -> None:
    first = _predecessors(schedule(n, 0, 1)[0])
    second = _predecessors(schedule(n, 1, 1)[0])
    assert any(first[c] != second[c] for c in first if c in second)


class RecordingDriver:
    """A stand-in driver whose managers are its name: it logs the managers it creates and the slices it
    replays, ``(manager, lo, hi)``, in one log shared by every driver of a test."""

    def __init__(self, name: str, log: dict[str, list]) -> None:
        self.name, self.log = name, log
        self.impl, self.cls = name, RecordingDriver

    def new(self):
        self.log["created"].append(self.name)
        return self.name

    def timed(self, mgr, detail, lo, hi):
        self.log["calls"].append((mgr, lo, hi))


def replay_fakes(monkeypatch, names, reps, blocks, done=lambda key: None, caps=None) -> dict[str, list]:
    """``interleaved`` over recording drivers (the whole-replay checks stubbed out); returns their log."""
    import harness.base.interleave as il

    monkeypatch.setattr(il, "_finish", lambda *args: None)
    log: dict[str, list] = {"created": [], "calls": []}
    il.interleaved({(n, "batched", ""): RecordingDriver(n, log) for n in names}, il.Turns(reps, blocks, caps or {}),
                   False, il.Hooks(done=done))
    return log


def test_interleaved_replays_each_repetition_in_its_schedule(monkeypatch) -> None:
    names = ["a", "b", "c", "d", "e"]
    blocks = slice_bounds(60, 6)
    log = replay_fakes(monkeypatch, names, 3, blocks)
    expected = []
    for rep in range(3):
        bounds = replay_slices(blocks, rep, 3)
        for (lo, hi), order in zip(bounds, schedule(len(names), rep, len(bounds)), strict=True):
            expected += [(names[j], lo, hi) for j in order]
    assert log["calls"] == expected
    assert log["created"] == [names[j] for rep in range(3) for j in schedule(len(names), rep, 1)[0]]


def test_a_capped_cell_runs_only_its_repetitions(monkeypatch) -> None:
    done: list[str] = []
    log = replay_fakes(monkeypatch, ("fast", "slow"), 3, slice_bounds(30, 3), lambda key: done.append(key[0]),
                       caps={("slow", "batched", ""): 1})
    runs = [(name, lo) for name, lo, _ in log["calls"]]
    assert [lo for name, lo in runs if name == "slow"] == [0, 10, 20]  # repetition 0 only
    assert len([1 for name, _ in runs if name == "fast"]) == 3 + 4 + 4  # staggered repetitions: one slice more
    assert done.count("slow") == 1 and done.count("fast") == 3


def test_a_cheap_cell_runs_more_repetitions_and_ticks_the_plans(monkeypatch) -> None:
    done: list[str] = []
    log = replay_fakes(monkeypatch, ("fast", "slow"), 2, slice_bounds(60, 2), lambda key: done.append(key[0]),
                       caps={("fast", "batched", ""): 6})
    starts = {name: [lo for n, lo, _ in log["calls"] if n == name] for name in ("fast", "slow")}
    assert len([lo for lo in starts["fast"] if lo == 0]) == 6 and len([lo for lo in starts["slow"] if lo == 0]) == 2
    opened = [lo for lo in starts["fast"] if lo]
    assert len(opened) == len(set(opened))  # six repetitions, staggered by a sixth of a slice: no step twice
    assert done.count("fast") == 2 and done.count("slow") == 2  # progress counts the plan's repetitions


def test_constructors_run_outside_every_marked_slice(monkeypatch) -> None:
    """The supervisor's bound counts marked slices only: a constructor (a large pool is legitimately costly to
    build, and no timed region claims it) runs while no cell is marked."""
    import harness.base.interleave as il

    monkeypatch.setattr(il, "_finish", lambda *args: None)
    marks: list = [None]
    log: dict[str, list] = {"created": [], "calls": [], "marked": []}

    class MarkRecordingDriver(RecordingDriver):
        def new(self):
            log["marked"].append(marks[-1])
            return super().new()

    drivers = {(n, "batched", ""): MarkRecordingDriver(n, log) for n in ("a", "b")}
    il.interleaved(drivers, il.Turns(2, slice_bounds(20, 2)), False, il.Hooks(mark=marks.append))
    assert len(log["marked"]) == 4 and set(log["marked"]) == {None}
    assert {m for m in marks if m} == set(drivers) and len(log["calls"]) > 0


def test_warm_up_makes_every_call_the_timed_batched_loop_makes() -> None:
    """The batched timed loop calls ``lookup`` after each step's decode: its first call (a compile, a cache load:
    tens of ms for a plug-in wrapping Numba) must come in the warm-up, not in the first timed step of a process."""
    from harness.base.drivers import _LOOKUP, Prepared, run_interpreted
    from impls import REGISTRY
    from scenarios import generate

    calls: list[str] = []

    class FirstLookupSlow(REGISTRY["dict"]):
        def lookup(self, seq_ids, slot_out):
            if not calls:
                time.sleep(0.05)  # the first call's one-time cost
            calls.append("lookup")
            super().lookup(seq_ids, slot_out)

    prep = Prepared.from_trace(generate("paper", steps=40, running=8, num_blocks=512))
    driver = il.Driver(prep, FirstLookupSlow, "batched", {}, "first-lookup-slow")
    driver.warm_up()
    assert calls, "the warm-up never called lookup, which the timed batched loop calls every step"
    times = run_interpreted(driver.inputs, driver.new(), "batched")
    assert times.ns[:, _LOOKUP].max() < 0.05e9, "a timed lookup paid the first call's cost"
