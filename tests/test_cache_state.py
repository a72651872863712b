"""The cache-state study: compiled and C++ cells replayed alone, warm and cold, checked as the run's replays are
(structure and bookkeeping only: no figure's size is asserted)."""

from __future__ import annotations

import numpy as np
import pytest

from harness.base.drivers import Prepared
from harness.base.interleave import Driver, slice_bounds
from harness.studies import cache_state
from impls import REGISTRY
from impls.native import UNAVAILABLE_REASON
from scenarios import generate


@pytest.fixture(scope="module")
def prep() -> Prepared:
    return Prepared.from_trace(generate("paper", steps=60, running=32, num_blocks=2048))


class CountingEvictor(cache_state.Evictor):
    def __init__(self) -> None:
        super().__init__(np.ones(1 << 16, dtype=np.uint8))
        self.calls = 0

    def evict(self) -> None:
        self.calls += 1
        super().evict()


def driver(prep: Prepared, impl: str, regime: str = "batched", cls: type | None = None) -> Driver:
    return Driver(prep, cls or REGISTRY[impl], regime, {}, impl)


def test_a_compiled_cell_gets_a_warm_and_a_cold_row_and_a_python_cell_none(prep: Prepared) -> None:
    evictor = CountingEvictor()
    rows = cache_state.cache_state_rows("paper", [driver(prep, "flat"), driver(prep, "dict"),
                                                  driver(prep, "flat", "per-call")], evictor)
    assert [(r.impl, r.regime, r.metric) for r in rows] == [("flat", "batched", "seq_step_alone_warm_ns"),
                                                            ("flat", "batched", "seq_step_alone_cold_ns")]
    assert all(r.status == "ok" and r.reps == cache_state.REPS and r.ci_low <= r.value <= r.ci_high for r in rows)
    assert all(r.driver == "compiled" and r.steps == 60 and r.value > 0 for r in rows)
    # The cold replays (the repetitions and the one left out) evict before every slice; the warm ones never.
    assert evictor.calls == (cache_state.REPS + 1) * len(slice_bounds(60))
    assert "alone" in rows[0].how and "MiB buffer read and written before every slice" in rows[1].how


@pytest.mark.skipif(UNAVAILABLE_REASON is not None, reason=f"the C++ designs: {UNAVAILABLE_REASON}")
def test_a_cpp_cell_is_replayed_alone_too(prep: Prepared) -> None:
    rows = cache_state.cache_state_rows("paper", [driver(prep, "cpp-flat")], CountingEvictor())
    assert {(r.metric, r.status, r.driver) for r in rows} == {("seq_step_alone_warm_ns", "ok", "native"),
                                                              ("seq_step_alone_cold_ns", "ok", "native")}


def test_a_design_that_fails_gets_failed_rows_with_the_reason(prep: Prepared) -> None:
    class Broken(REGISTRY["flat"]):
        def __init__(self, *args, **kwargs) -> None:
            raise KeyError("no such manager")

    rows = cache_state.cache_state_rows("paper", [driver(prep, "flat", cls=Broken)], CountingEvictor())
    assert [(r.metric, r.status) for r in rows] == [("seq_step_alone_warm_ns", "failed"),
                                                    ("seq_step_alone_cold_ns", "failed")]
    assert all("KeyError" in r.how for r in rows)


def test_a_replay_that_disagrees_with_the_trace_fails(prep: Prepared, monkeypatch: pytest.MonkeyPatch) -> None:
    d = driver(prep, "flat")
    timed = d.timed

    def wrong_cows(mgr, detail, lo, hi):  # a design whose copy-on-write count is not the trace's
        times = timed(mgr, detail, lo, hi)
        times.cows[:] += 1
        return times

    monkeypatch.setattr(d, "timed", wrong_cows)
    rows = cache_state.cache_state_rows("paper", [d], CountingEvictor())
    assert {r.status for r in rows} == {"failed"}


def test_the_supervisor_is_told_each_cell_before_its_code_runs(prep: Prepared) -> None:
    told: list = []
    cache_state.cache_state_rows("paper", [driver(prep, "dict"), driver(prep, "flat")], CountingEvictor(),
                                 enter=told.append)
    assert told == [("flat", "batched"), None]  # the Python cell is not replayed, so never announced
