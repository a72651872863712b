"""The interleaving's schedule: which steps each repetition replays per slice, and in which order of cells."""

from __future__ import annotations

import itertools

import pytest

from harness.measure.interleave import replay_slices, schedule, slice_bounds


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


def test_interleaved_replays_each_repetition_in_its_schedule(monkeypatch) -> None:
    import harness.measure.interleave as il

    calls: list[tuple[str, int, int]] = []
    created: list[str] = []

    class FakeDriver:
        def __init__(self, name: str) -> None:
            self.name = name

        def new(self):
            created.append(self.name)
            return self.name

        def timed(self, mgr, detail, lo, hi):
            calls.append((mgr, lo, hi))

    monkeypatch.setattr(il, "_finish", lambda driver, mgr, parts, out, key: None)
    names = ["a", "b", "c", "d", "e"]
    blocks = slice_bounds(60, 6)
    il.interleaved({(n, "batched", ""): FakeDriver(n) for n in names}, 3, False, blocks)
    expected = []
    for rep in range(3):
        bounds = replay_slices(blocks, rep, 3)
        for (lo, hi), order in zip(bounds, schedule(len(names), rep, len(bounds)), strict=True):
            expected += [(names[j], lo, hi) for j in order]
    assert calls == expected
    assert created == [names[j] for rep in range(3) for j in schedule(len(names), rep, 1)[0]]


def test_a_capped_cell_runs_only_its_repetitions(monkeypatch) -> None:
    import harness.measure.interleave as il

    runs: list[tuple[str, int]] = []

    class FakeDriver:
        def __init__(self, name: str) -> None:
            self.name = name

        def new(self):
            return self.name

        def timed(self, mgr, detail, lo, hi):
            runs.append((mgr, lo))

    done: list[str] = []
    monkeypatch.setattr(il, "_finish", lambda driver, mgr, parts, out, key: None)
    keys = {(n, "batched", ""): FakeDriver(n) for n in ("fast", "slow")}
    il.interleaved(keys, 3, False, slice_bounds(30, 3), lambda key: done.append(key[0]),
                   caps={("slow", "batched", ""): 1})
    assert [lo for name, lo in runs if name == "slow"] == [0, 10, 20]  # repetition 0 only
    assert len([1 for name, _ in runs if name == "fast"]) == 3 + 4 + 4  # staggered repetitions: one slice more
    assert done.count("slow") == 1 and done.count("fast") == 3


def test_a_cheap_cell_runs_more_repetitions_and_ticks_the_plans(monkeypatch) -> None:
    import harness.measure.interleave as il

    starts: dict[str, list[int]] = {"fast": [], "slow": []}

    class FakeDriver:
        def __init__(self, name: str) -> None:
            self.name = name

        def new(self):
            return self.name

        def timed(self, mgr, detail, lo, hi):
            starts[mgr].append(lo)

    done: list[str] = []
    monkeypatch.setattr(il, "_finish", lambda driver, mgr, parts, out, key: None)
    keys = {(n, "batched", ""): FakeDriver(n) for n in ("fast", "slow")}
    il.interleaved(keys, 2, False, slice_bounds(60, 2), lambda key: done.append(key[0]),
                   caps={("fast", "batched", ""): 6})
    assert len([lo for lo in starts["fast"] if lo == 0]) == 6 and len([lo for lo in starts["slow"] if lo == 0]) == 2
    opened = [lo for lo in starts["fast"] if lo]
    assert len(opened) == len(set(opened))  # six repetitions, staggered by a sixth of a slice: no step twice
    assert done.count("fast") == 2 and done.count("slow") == 2  # progress counts the plan's repetitions
