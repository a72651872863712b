"""Each compiled design beside its C++ twin (`twin_pair`): the registry's pairs, the rows, their refusals and the
sentence with the target's verdict (structure and bookkeeping only: no figure's size is asserted)."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.base.drivers import Prepared
from harness.base.interleave import Driver, slice_bounds
from harness.base.rows import Row, write_rows
from harness.output.cache_state_report import twin_text
from harness.output.rundata import RunData
from harness.studies import twin_pair
from impls import REGISTRY, registry
from impls.native import UNAVAILABLE_REASON
from scenarios import generate
from tests.test_cache_state import CountingEvictor

needs_native = pytest.mark.skipif(UNAVAILABLE_REASON is not None, reason=f"no C++ twins: {UNAVAILABLE_REASON}")


@pytest.fixture(scope="module")
def prep() -> Prepared:
    return Prepared.from_trace(generate("paper", steps=40, running=16, num_blocks=1024))


def test_every_twin_is_a_native_record_of_a_registered_compiled_design() -> None:
    pairs = {r.twin_of: r.name for r in registry.RECORDS if r.twin_of}
    assert pairs == {"dict-jit": "cpp-dict", "list-jit": "cpp-list", "flat": "cpp-flat", "flat-rows": "cpp-flat-rows"}
    assert all(registry.record(twin).role == "native" for twin in pairs.values())
    assert all(registry.record(design).role in ("design", "twin") for design in pairs)
    assert all(registry.cpp_twin(design) == twin for design, twin in pairs.items())
    assert registry.cpp_twin("flat-pc") is None and registry.cpp_twin("cpp-flat") is None


@needs_native
@pytest.mark.parametrize("impl", ["flat", "flat-rows"])
def test_the_twin_gets_warm_and_cold_figures_and_the_design_its_ratios_over_it(prep: Prepared, impl: str) -> None:
    evictor, twin = CountingEvictor(), registry.cpp_twin(impl)
    rows = twin_pair.twin_rows("paper", Driver(prep, REGISTRY[impl], "batched", {}, impl), evictor, reps=2)
    assert [(r.impl, r.regime, r.metric, r.unit, r.driver) for r in rows] == [
        (twin, "batched", "seq_step_twin_warm_ns", "ns", "native"),
        (impl, "batched", "seq_step_alone_warm_vs_cpp", "x", "compiled"),
        (twin, "batched", "seq_step_twin_cold_ns", "ns", "native"),
        (impl, "batched", "seq_step_alone_cold_vs_cpp", "x", "compiled")]
    assert all(r.status == "ok" and r.reps == 2 and r.ci_low <= r.value <= r.ci_high and r.value > 0 for r in rows)
    assert f"over that of its C++ twin `{twin}` on the same slice" in rows[1].how
    assert evictor.calls == 2 * (2 + 1) * len(slice_bounds(40))  # both, every slice, the repetition left out too


def test_designs_without_a_twin_and_other_regimes_get_no_rows(prep: Prepared) -> None:
    for impl, regime in (("flat-pc", "batched"), ("flat", "step"), ("dict", "batched")):
        driver = Driver(prep, REGISTRY[impl], regime, {}, impl)
        assert twin_pair.twin_rows("paper", driver, CountingEvictor(), reps=2) == []


@needs_native
def test_a_failing_design_fails_the_twins_rows_and_its_own_with_the_reason(prep: Prepared) -> None:
    class Broken(REGISTRY["flat"]):
        def __init__(self, *args, **kwargs) -> None:
            raise KeyError("no such manager")

    rows = twin_pair.twin_rows("paper", Driver(prep, Broken, "batched", {}, "flat"), CountingEvictor(), reps=2)
    assert len(rows) == 4 and all(r.status == "failed" and "KeyError" in r.how for r in rows)


def _row(impl: str, metric: str, value: float, low: float, high: float) -> Row:
    return Row("paper", impl, "batched", metric, value, "x", "rdtsc", "ok", "how", reps=7, ci_low=low, ci_high=high,
               driver="compiled")


def test_the_sentence_judges_each_ratio_on_its_interval_and_needs_both_states(tmp_path: Path) -> None:
    warm, cold = twin_pair.RATIOS["warm"], twin_pair.RATIOS["cold"]
    rows = [_row("flat", warm, 1.02, 0.98, 1.04), _row("flat", cold, 1.1, 1.07, 1.2),
            _row("flat-rows", warm, 0.7, 0.6, 1.3)]
    write_rows(tmp_path / "results.csv", rows)
    text = twin_text(RunData.load(tmp_path))
    assert "`flat` over `cpp-flat` 1.02× [0.98–1.04] warm, met, and 1.1× [1.07–1.2] cold, missed" in text
    assert "flat-rows" not in text  # its cold ratio is missing
    write_rows(tmp_path / "results.csv", [*rows, _row("flat-rows", cold, 0.7, 0.65, 0.75)])
    text = twin_text(RunData.load(tmp_path))
    assert "`flat-rows` over `cpp-flat-rows` 0.7× [0.6–1.3] warm, not decided, and 0.7× [0.65–0.75] cold, met" in text
    assert f"at most {twin_pair.TARGET:g}×" in text
    write_rows(tmp_path / "results.csv", rows[2:])
    assert twin_text(RunData.load(tmp_path)) == ""
