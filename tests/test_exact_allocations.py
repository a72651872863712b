"""Allocation counts are exact integers of the design's own allocations (issue 34, items 2 and 4), per family:
interpreted (memray events under the design's frames), compiled (Numba runtime statistics), C++ (the counting
allocator), caching; the harness's own allocations never change a design's count, and nothing is subtracted."""

from __future__ import annotations

import numpy as np
import pytest

from harness.base.drivers import Prepared
from harness.counters.allocations import region_allocations
from harness.counters.regions import prepare_cell
from harness.gate import counting as gate_jobs
from harness.run.alloc_cells import alloc_kind, cell_allocations, design_files
from scenarios import generate
from tests import alloc_toy

LO, HI = 16, 36


@pytest.fixture(scope="module")
def prep() -> Prepared:
    return Prepared.from_trace(generate("paper", steps=48, running=64, num_blocks=8192))


def figures(prep: Prepared, impl: str, regime: str) -> dict:
    mgr, advance, _ = prepare_cell(prep, impl, regime)
    advance(0, LO)
    found = cell_allocations(alloc_kind(type(mgr), regime), regime, prep, mgr, advance, LO, HI)
    return {f.metric: f for f in found}


def toy_advance(design, harness_garbage: dict):
    """A harness loop that allocates, more in an empty call than in a step (an estimator that subtracts an
    empty region would then read a negative count)."""
    def advance(lo: int, hi: int) -> None:
        harness_garbage[lo] = [[i] for i in range(50 if lo == hi else 3)]
        for s in range(lo, hi):
            design.step(s)
            harness_garbage[s] = {"s": [s] * 4}
    return advance


@pytest.mark.parametrize(("cls", "per_step"), [(alloc_toy.Quiet, 0), (alloc_toy.OneList, 1)])
def test_interpreted_count_is_the_designs_only(cls, per_step: int) -> None:
    """The harness's allocations (more in an empty call than in a step), the interpreter's and memray's own (the
    iterator of an unpacking under a profiler) are not counted, and nothing is subtracted: exactly 0 or 1."""
    design, garbage = cls(), {}
    advance = toy_advance(design, garbage)
    advance(0, 4)
    events, nrt = region_allocations(advance, 4, 24, design_files(cls))
    assert (events, nrt) == (per_step * 19, 0)  # step 4 settles the traced call path; 5..23 are counted


@pytest.mark.parametrize("impl", ["dict", "list"])
def test_interpreted_designs_allocate_and_are_counted(prep: Prepared, impl: str) -> None:
    f = figures(prep, impl, "batched")["allocs_per_step"]
    assert f.source == "memray" and f.steps == HI - LO - 1 and f.events > 100 * f.steps


@pytest.mark.parametrize(("impl", "source"), [("flat", "nrt-stats"), ("flat-rows", "nrt-stats"),
                                              ("cpp-flat", "counting allocator"),
                                              ("cpp-flat-rows", "counting allocator")])
def test_preallocated_designs_batched_read_exactly_zero(prep: Prepared, impl: str, source: str) -> None:
    """The compiled designs (counted by Numba's runtime) and the C++ ones (by the counting allocator)."""
    found = figures(prep, impl, "batched")
    assert found["allocs_per_step"].source == source
    assert found["allocs_per_step"].events == 0 and found["nrt_allocs_per_step"].events == 0
    assert gate_jobs.allocations(prep, impl, "batched", LO, HI - LO) == (0.0, 0.0, source)


def test_compiled_growth_is_counted(prep: Prepared) -> None:
    """Positive control: list-jit's growing rows are Numba runtime allocations, counted the same in two runs."""
    counts = [figures(prep, "list-jit", "batched")["allocs_per_step"].events for _ in range(2)]
    assert counts[0] > 0 and counts[0] == counts[1]


def test_flat_step_is_its_floor(prep: Prepared) -> None:
    """Item 4: flat's step() allocates what one crossing into compiled code with its arguments allocates (a
    Numba runtime wrapper per array argument: two state arrays and seven buffers), and nothing above it."""
    found = figures(prep, "flat", "step")
    assert found["allocs_per_step"].events == found["allocs_floor_per_step"].events == 9 * (HI - LO - 1)
    assert found["allocs_above_floor_per_step"].events == 0
    assert found["nrt_allocs_per_step"].per_step == 9.0


def test_native_growth_is_counted(prep: Prepared) -> None:
    """Positive control: cpp-list's growth, exactly the library's allocation calls over the counted steps."""
    import impls.native as native

    mgr, advance, _ = prepare_cell(prep, "cpp-list", "batched")
    advance(0, LO)
    before = native.alloc_count()
    found = cell_allocations("native", "batched", prep, mgr, advance, LO, HI)
    assert 0 < found[0].events == native.alloc_count() - before


def test_caching_compiled_reads_exactly_zero() -> None:
    cached = Prepared.from_trace(generate("system-prompt-256", steps=30))
    mgr, advance, _ = prepare_cell(cached, "flat-pc", "batched")
    advance(0, 5)
    found = {f.metric: f for f in cell_allocations("compiled", "batched", cached, mgr, advance, 5, 25)}
    assert found["allocs_per_step"].events == 0 and found["allocs_per_step"].per_step == 0.0
    mgr, advance, _ = prepare_cell(cached, "dict-pc", "batched")
    advance(0, 5)
    found = {f.metric: f for f in cell_allocations("python", "batched", cached, mgr, advance, 5, 25)}
    assert found["allocs_per_step"].events > 0 and isinstance(found["allocs_per_step"].events, int)


def test_counts_are_integers_over_steps(prep: Prepared) -> None:
    for f in figures(prep, "flat", "per-call").values():
        assert isinstance(f.events, int) and f.per_step * f.steps == pytest.approx(f.events)
    assert np.isclose(figures(prep, "flat", "per-call")["nrt_allocs_per_step"].events % 1, 0)


def test_a_design_without_a_file_is_not_counted_but_says_why(prep: Prepared) -> None:
    """No file, no attribution: the figure is unavailable with its reason, never the harness's events."""
    orphan = type("Orphan", (), {"__module__": "no_such_module"})
    assert design_files(orphan) == ()
    assert design_files(alloc_toy.Quiet)[-1].endswith("alloc_toy.py")
