"""Every untimed figure is measured through the path its regime names: per-call the contract's calls, batched one
``decode_step`` per step, step one ``step()`` per step; an unknown regime raises (a spy records the outermost
calls each runner makes)."""

from __future__ import annotations

import pytest

from harness.base.drivers import Prepared, step_runner
from harness.base.interleave import Driver
from harness.counters.regions import prepare_cell
from harness.studies.paced import paced_run, paced_runner
from harness.studies.paced_study import PacedCells, kinds_of, paced_study_rows
from impls import REGISTRY
from scenarios import generate

DECODE = {"append_slot", "last_slot", "decode_step", "step"}  # how a step's decode batch can be entered
PATH = {"per-call": {"append_slot", "last_slot"}, "batched": {"decode_step"}, "step": {"step"}}
WRAPPED = ("step", "decode_step", "append_slot", "last_slot", "lookup", "can_allocate", "allocate", "free", "fork")
RATE = 20_000.0


@pytest.fixture(scope="module")
def prep() -> Prepared:
    return Prepared.from_trace(generate("paper", steps=12, running=8, num_blocks=512))


def spy(base: type) -> tuple[type, list[str]]:
    """A subclass of ``base`` that logs each outermost call (a call made from inside another is not logged)."""
    log: list[str] = []
    depth = [0]

    def wrap(name: str):
        inner = getattr(base, name)

        def method(self, *args, **kwargs):
            if depth[0] == 0:
                log.append(name)
            depth[0] += 1
            try:
                return inner(self, *args, **kwargs)
            finally:
                depth[0] -= 1
        return method

    return type(f"Spy{base.__name__}", (base,), {n: wrap(n) for n in WRAPPED}), log


def entered(log: list[str]) -> set[str]:
    return set(log) & DECODE


@pytest.mark.parametrize("impl", ["dict", "flat"])
@pytest.mark.parametrize("regime", list(PATH))
def test_the_untimed_runner_takes_its_regimes_path(prep: Prepared, impl: str, regime: str) -> None:
    cls, log = spy(REGISTRY[impl])
    step_runner(prep, cls(**prep.trace.config), regime)(0, prep.num_steps)
    assert entered(log) == PATH[regime]
    if regime == "step":
        assert set(log) == {"step"}  # the pool operations too go through step()


@pytest.mark.parametrize("regime", list(PATH))
def test_the_paced_run_takes_its_regimes_path(prep: Prepared, regime: str) -> None:
    cls, log = spy(REGISTRY["flat"])
    result = paced_run(prep, lambda: cls(**prep.trace.config), regime, RATE)
    assert entered(log) == PATH[regime] and result.steps == prep.num_steps


@pytest.mark.parametrize("regime", list(PATH))
def test_the_paced_study_measures_each_cell_through_its_regimes_path(prep: Prepared, regime: str) -> None:
    cls, log = spy(REGISTRY["flat"])
    cell = ("flat", regime)
    make = {cell: lambda: cls(**prep.trace.config)}
    calls = next(k for k in kinds_of(prep, make, set(), {cell: cls}) if k.what == "calls")
    calls.start()[0](0, prep.num_steps)
    assert entered(log) == PATH[regime]
    log.clear()
    rows = paced_study_rows(PacedCells("paper", prep, make, {cell: cls}, RATE, False, reps=1))
    assert entered(log) == PATH[regime] | ({"step"} if regime == "batched" else set())  # + the batched whole step
    share = next(r for r in rows if r.metric == "cpu_share_observed_pct")
    assert share.status == "ok" and share.regime == regime
    assert ("step()" in share.how) == (regime == "step") and ("decode_step" in share.how) == (regime == "batched")


@pytest.mark.parametrize("regime", list(PATH))
def test_the_counters_and_allocation_counts_replay_through_the_regimes_path(prep: Prepared, regime: str) -> None:
    cls, log = spy(REGISTRY["dict"])  # interpreted: batched stays in Python, where the spy sees it
    _, advance, cows = prepare_cell(prep, "dict", regime, cls)  # callgrind, perf and the gate's regions
    advance(0, prep.num_steps)
    assert entered(log) == PATH[regime] and (cows == prep.trace.step_cows).all()
    log.clear()
    driver = Driver(prep, cls, regime, {}, "dict")  # the run's allocation counts and warm-up
    driver.advance(driver.new())(0, prep.num_steps)
    assert entered(log) == PATH[regime]


def test_an_unknown_regime_is_refused_by_every_runner(prep: Prepared) -> None:
    mgr = REGISTRY["flat"](**prep.trace.config)
    with pytest.raises(ValueError, match="unknown regime 'whole'"):
        step_runner(prep, mgr, "whole")
    with pytest.raises(ValueError, match="unknown regime"):
        paced_runner(prep, lambda: mgr, "whole")
    with pytest.raises(ValueError, match="unknown regime"):
        prepare_cell(prep, "flat", "whole")
