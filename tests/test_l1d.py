"""L1D figures: honest statuses without a PMU, and the perf control protocol exercised with a software event."""

from __future__ import annotations

import math
import shutil

import pytest

from harness.counters import l1d
from scenarios import generate, save


@pytest.fixture(scope="module")
def small_trace():
    return generate("paper", steps=30, running=16, num_blocks=2048)


def test_without_a_pmu_perf_is_reported_unsupported_never_a_number(small_trace, monkeypatch) -> None:
    monkeypatch.setattr(l1d, "perf_status", lambda: ("unsupported", "no PMU"))
    monkeypatch.setattr(l1d.callgrind, "available", lambda: (False, "no valgrind here"))
    rows = l1d.l1d_rows("paper", small_trace, [("flat", "batched"), ("dict", "per-call")])
    perf = [r for r in rows if r.source == "perf"]
    sim = [r for r in rows if r.source == "callgrind-sim"]
    assert [r.status for r in perf] == ["unsupported"] * 2 and all(math.isnan(r.value) for r in perf)
    assert [r.status for r in sim] == ["unavailable"] * 2 and sim[0].how == "no valgrind here"


@pytest.mark.skipif(shutil.which("perf") is None, reason="perf is not installed")
def test_perf_control_protocol_counts_only_the_region(small_trace, tmp_path) -> None:
    """task-clock is a software event, so this runs without a PMU: the region's time is counted, and
    subtracting the empty region leaves the work of the steps."""
    path = save(small_trace, tmp_path / "t.npz")
    try:
        counts = l1d.perf_counts(path, "dict", "per-call", 10, 15, events=("task-clock",))
    except RuntimeError as exc:  # e.g. perf_event_paranoid forbids even software events
        pytest.skip(str(exc))
    assert counts["task-clock"] > 0
