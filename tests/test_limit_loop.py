"""The minimal decode loop beside `flat`: its rows, its refusals, its writes kept inside its arrays, and its
sentence (structure and bookkeeping only: no figure's size is asserted)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from harness.base.drivers import Prepared
from harness.base.interleave import Driver, slice_bounds
from harness.base.rows import Row, write_rows
from harness.output.cache_state_report import limit_text
from harness.output.rundata import RunData
from harness.studies import limit_loop
from impls import REGISTRY
from scenarios import generate
from tests.test_cache_state import CountingEvictor


@pytest.fixture(scope="module")
def prep() -> Prepared:
    return Prepared.from_trace(generate("paper", steps=60, running=32, num_blocks=2048))


def flat_driver(prep: Prepared, cls: type | None = None) -> Driver:
    return Driver(prep, cls or REGISTRY["flat"], "batched", {}, "flat")


def test_the_loop_gets_warm_and_cold_figures_and_flat_its_ratios_over_it(prep: Prepared) -> None:
    evictor = CountingEvictor()
    rows = limit_loop.limit_rows("paper", flat_driver(prep), evictor, reps=3)
    assert [(r.impl, r.regime, r.metric, r.unit) for r in rows] == [
        ("-", "-", "seq_step_limit_warm_ns", "ns"), ("flat", "batched", "seq_step_alone_warm_vs_limit", "x"),
        ("-", "-", "seq_step_limit_cold_ns", "ns"), ("flat", "batched", "seq_step_alone_cold_vs_limit", "x")]
    assert all(r.status == "ok" and r.reps == 3 and r.ci_low <= r.value <= r.ci_high and r.value > 0 for r in rows)
    assert all(r.driver == "compiled" and r.steps == 60 for r in rows)
    # Cold repetitions evict before every slice of both designs, the one left out included; warm ones never.
    assert evictor.calls == 2 * (3 + 1) * len(slice_bounds(60))
    assert "on the same slice" in rows[1].how and "none of the contract's" in rows[0].how


def test_a_trace_with_copy_on_write_is_not_replayed_by_the_loop() -> None:
    prep = Prepared.from_trace(generate("parallel-sampling", steps=40, num_blocks=2048))
    assert prep.trace.step_cows.any()
    assert limit_loop.limit_rows("parallel-sampling", flat_driver(prep), CountingEvictor(), reps=2) == []


def test_a_failing_flat_fails_both_rows_of_each_state_with_the_reason(prep: Prepared) -> None:
    class Broken(REGISTRY["flat"]):
        def __init__(self, *args, **kwargs) -> None:
            raise KeyError("no such manager")

    rows = limit_loop.limit_rows("paper", flat_driver(prep, Broken), CountingEvictor(), reps=2)
    assert [(r.metric, r.status) for r in rows] == [
        ("seq_step_limit_warm_ns", "failed"), ("seq_step_alone_warm_vs_limit", "failed"),
        ("seq_step_limit_cold_ns", "failed"), ("seq_step_alone_cold_vs_limit", "failed")]
    assert all("KeyError" in r.how for r in rows)


def test_the_loop_refuses_what_would_write_outside_its_arrays() -> None:
    mgr = limit_loop.LimitLoopManager(num_blocks=3, block_size=16, max_seqs=2, max_blocks_per_seq=2)
    mgr.allocate(0, 16)  # one full block: the next append takes a second
    table, ints = mgr.state
    step = limit_loop.decode_step
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


def test_the_sentence_names_the_loop_and_flats_ratios_only_when_all_four_rows_are_there(tmp_path: Path) -> None:
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
    assert "0.8×" in text and "0.9×" in text


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
