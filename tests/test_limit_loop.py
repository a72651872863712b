"""The yardsticks beside `flat` (the minimal decode loop, `flat` without its checks): their rows, their refusals,
their writes kept inside their arrays, and the sentence (structure and bookkeeping only: no figure's size is
asserted)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from harness.base.drivers import Prepared
from harness.base.interleave import Driver, slice_bounds
from harness.base.rows import Row, write_rows
from harness.output.cache_state_report import limit_text
from harness.output.rundata import RunData
from harness.studies import limit_loop, unchecked_flat
from impls import REGISTRY
from scenarios import generate
from tests.test_cache_state import CountingEvictor


@pytest.fixture(scope="module")
def prep() -> Prepared:
    return Prepared.from_trace(generate("paper", steps=60, running=32, num_blocks=2048))


def flat_driver(prep: Prepared, cls: type | None = None) -> Driver:
    return Driver(prep, cls or REGISTRY["flat"], "batched", {}, "flat")


METRICS = [("-", "-", "seq_step_limit_warm_ns"), ("flat", "batched", "seq_step_alone_warm_vs_limit"),
           ("-", "-", "seq_step_unchecked_warm_ns"), ("flat", "batched", "seq_step_alone_warm_vs_unchecked"),
           ("-", "-", "seq_step_limit_cold_ns"), ("flat", "batched", "seq_step_alone_cold_vs_limit"),
           ("-", "-", "seq_step_unchecked_cold_ns"), ("flat", "batched", "seq_step_alone_cold_vs_unchecked")]


def test_each_yardstick_gets_warm_and_cold_figures_and_flat_its_ratios_over_it(prep: Prepared) -> None:
    evictor = CountingEvictor()
    rows = limit_loop.limit_rows("paper", flat_driver(prep), evictor, reps=3)
    assert [(r.impl, r.regime, r.metric) for r in rows] == METRICS
    assert [r.unit for r in rows] == ["ns", "x"] * 4
    assert all(r.status == "ok" and r.reps == 3 and r.ci_low <= r.value <= r.ci_high and r.value > 0 for r in rows)
    assert all(r.driver == "compiled" and r.steps == 60 for r in rows)
    # Cold repetitions evict before every slice of all three, the one left out included; warm ones never.
    assert evictor.calls == 3 * (3 + 1) * len(slice_bounds(60))
    assert "over that of the minimal loop on the same slice" in rows[1].how and "none of the contract's" in rows[0].how
    assert "over that of `flat` without its checks on the same" in rows[3].how and "own decode loop" in rows[2].how


def test_a_trace_with_copy_on_write_is_not_replayed_by_the_loop() -> None:
    prep = Prepared.from_trace(generate("parallel-sampling", steps=40, num_blocks=2048))
    assert prep.trace.step_cows.any()
    assert limit_loop.limit_rows("parallel-sampling", flat_driver(prep), CountingEvictor(), reps=2) == []


def test_a_failing_flat_fails_both_rows_of_each_state_with_the_reason(prep: Prepared) -> None:
    class Broken(REGISTRY["flat"]):
        def __init__(self, *args, **kwargs) -> None:
            raise KeyError("no such manager")

    rows = limit_loop.limit_rows("paper", flat_driver(prep, Broken), CountingEvictor(), reps=2)
    assert [(r.impl, r.regime, r.metric) for r in rows] == METRICS
    assert all(r.status == "failed" and "KeyError" in r.how for r in rows)


@pytest.mark.parametrize("module", [limit_loop, unchecked_flat], ids=["limit-loop", "unchecked-flat"])
def test_each_yardstick_refuses_what_would_write_outside_its_arrays(module) -> None:
    cls = limit_loop.LimitLoopManager if module is limit_loop else unchecked_flat.UncheckedFlatManager
    mgr = cls(num_blocks=3, block_size=16, max_seqs=2, max_blocks_per_seq=2)
    mgr.allocate(0, 16)  # one full block: the next append takes a second
    table, ints = mgr.state
    step = module.decode_step
    cow, slots = np.zeros((2, 2), np.int64), np.zeros(2, np.int64)
    before = (table.copy(), ints.copy())
    assert step(table, ints, np.array([5], np.int64), cow, slots)[0] < 0  # a row out of range
    assert step(table, ints, np.array([-1], np.int64), cow, slots)[0] < 0
    assert step(table, ints, np.array([0, 0], np.int64), cow, slots[:1])[0] < 0  # slot_out too short
    assert np.array_equal(table, before[0]) and np.array_equal(ints, before[1])
    mgr.free(0)
    mgr.allocate(0, 32)  # both columns full: one more token has no column
    table, ints = mgr.state
    assert step(table, ints, np.array([0], np.int64), cow, slots)[0] < 0
    mgr.free(0)
    mgr.allocate(0, 16)
    mgr.allocate(1, 32)  # the pool's last two blocks: the stack is empty now
    assert mgr.num_free_blocks() == 0
    assert step(table, ints, np.array([0], np.int64), cow, slots)[0] < 0


def test_flat_without_its_checks_gives_flats_slots_on_a_valid_batch() -> None:
    """Its NEXT path and its boundary path are flat's: the same slots and the same blocks for the same calls."""
    mine, theirs = (cls(num_blocks=64, block_size=4, max_seqs=4, max_blocks_per_seq=8)
                    for cls in (unchecked_flat.UncheckedFlatManager, REGISTRY["flat"]))
    for mgr in (mine, theirs):
        mgr.allocate(0, 3)
        mgr.allocate(2, 4)
        mgr.allocate(3, 9)
    ids = np.array([3, 0, 2], np.int64)
    for _ in range(9):  # across boundaries of every row
        got, want = np.zeros(3, np.int64), np.zeros(3, np.int64)
        assert unchecked_flat.decode_step(*mine.state, ids, np.zeros((3, 2), np.int64), got) == (0, 0)
        theirs.decode_step(ids, np.zeros((3, 2), np.int64), want)
        assert got.tolist() == want.tolist()
    assert mine.table.tolist() == theirs.table.tolist() and mine.num_free_blocks() == theirs.num_free_blocks()


def test_the_sentence_names_each_yardstick_and_flats_ratios_only_when_its_four_rows_are_there(tmp_path: Path) -> None:
    def row(impl: str, regime: str, metric: str, value: float, unit: str) -> Row:
        return Row("paper", impl, regime, metric, value, unit, "rdtsc", "ok", "how", reps=7, ci_low=value * 0.9,
                   ci_high=value * 1.1, driver="compiled")

    rows = [row("-", "-", "seq_step_limit_warm_ns", 4.5, "ns"), row("-", "-", "seq_step_limit_cold_ns", 6.0, "ns"),
            row("flat", "batched", "seq_step_alone_warm_vs_limit", 0.8, "x")]
    write_rows(tmp_path / "results.csv", rows)
    assert limit_text(RunData.load(tmp_path)) == ""
    write_rows(tmp_path / "results.csv", [*rows, row("flat", "batched", "seq_step_alone_cold_vs_limit", 0.9, "x")])
    text = limit_text(RunData.load(tmp_path))
    assert "minimal decode loop" in text and "4.5 ns" in text and "6 ns" in text
    assert "0.8×" in text and "0.9×" in text and "unchecked-flat" not in text
    unchecked = [row("-", "-", "seq_step_unchecked_warm_ns", 3.25, "ns"),
                 row("-", "-", "seq_step_unchecked_cold_ns", 4.75, "ns"),
                 row("flat", "batched", "seq_step_alone_warm_vs_unchecked", 1.15, "x"),
                 row("flat", "batched", "seq_step_alone_cold_vs_unchecked", 1.05, "x")]
    write_rows(tmp_path / "results.csv", [*rows, *unchecked[:3]])
    assert "unchecked-flat" not in limit_text(RunData.load(tmp_path))
    write_rows(tmp_path / "results.csv", [*rows, *unchecked])  # the minimal loop's rows incomplete: its sentence goes
    text = limit_text(RunData.load(tmp_path))
    assert "minimal decode loop" not in text and "`unchecked-flat`" in text
    assert "3.25 ns" in text and "4.75 ns" in text and "1.15×" in text and "1.05×" in text


def test_a_wrong_replay_fails_the_rows_even_in_the_repetition_left_out(prep: Prepared,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    d = flat_driver(prep)
    timed, calls = d.timed, []

    def wrong_first_slice(mgr, detail, lo, hi):  # only the very first slice, of the repetition left out
        times = timed(mgr, detail, lo, hi)
        calls.append(lo)
        if len(calls) == 1:
            times.cows[:] += 1
        return times

    monkeypatch.setattr(d, "timed", wrong_first_slice)
    rows = limit_loop.limit_rows("paper", d, CountingEvictor(), reps=2)
    assert rows[0].status == "failed" and rows[1].status == "failed"


def test_no_driver_follows_itself_more_often_than_another() -> None:
    """On warm slices a driver that ran just before itself finds its data in the caches: with a fixed order
    reversed from slice to slice the first and last drivers did on every other slice, the middle one never."""
    orders = limit_loop.slice_orders(3, 3000, rep=0)
    sequence = [i for order in orders for i in order]
    after_itself = []
    for driver in range(3):
        mine = [k for k in range(1, len(sequence)) if sequence[k] == driver]
        after_itself.append(sum(sequence[k - 1] == driver for k in mine) / len(mine))
    assert max(after_itself) - min(after_itself) < 0.03, after_itself
    assert all(sorted(order) == [0, 1, 2] for order in orders)
    drawn = limit_loop.slice_orders
    assert drawn(3, 20, rep=1) == drawn(3, 20, rep=1) != drawn(3, 20, rep=2)
