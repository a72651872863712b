"""L1D figures: honest statuses without a PMU, and the perf control protocol exercised with a software event."""

from __future__ import annotations

import math
import shutil
import subprocess
import time

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


def test_with_a_pmu_rows_are_the_counts_ratios(small_trace, monkeypatch) -> None:
    """The supported path, from known counts: the miss rate and per-sequence-step figures are exact ratios."""
    counts = {"L1-dcache-loads": 8_000.0, "L1-dcache-load-misses": 200.0, "instructions": 96_000.0}
    calls = []
    monkeypatch.setattr(l1d, "perf_status", lambda: ("supported", "fake PMU"))
    monkeypatch.setattr(l1d, "perf_counts", lambda path, *args: calls.append(args) or counts)
    rows = {r.metric: r for r in l1d.l1d_rows("paper", small_trace, [("flat", "batched")])}
    warm = small_trace.num_steps - l1d.STEPS  # a 30-step trace cannot skip 20 warm steps: the last 16 are measured
    seq_steps = int(small_trace.running_per_step()[warm:].sum())
    assert calls == [("flat", "batched", warm, l1d.STEPS)] and seq_steps == 16 * l1d.STEPS  # 16 running
    assert rows["l1d_miss_pct"].value == 2.5 and rows["l1d_miss_pct"].source == "perf"
    assert rows["l1d_misses_per_seq_step"].value == 200.0 / seq_steps
    assert rows["instructions_per_seq_step"].value == 96_000.0 / seq_steps
    assert all(r.status == "ok" for r in rows.values())


def test_a_perf_failure_is_a_failed_row_never_a_number(small_trace, monkeypatch) -> None:
    monkeypatch.setattr(l1d, "perf_status", lambda: ("supported", "fake PMU"))

    def refuse(*args) -> dict:
        raise RuntimeError("perf stat failed (255): permission denied")

    monkeypatch.setattr(l1d, "perf_counts", refuse)
    (row,) = l1d.l1d_rows("paper", small_trace, [("flat", "batched")])
    assert (row.status, row.how) == ("failed", "perf stat failed (255): permission denied") and math.isnan(row.value)


def software_events_refused() -> str | None:
    """Why perf cannot count even a software event here (perf_event_paranoid, seccomp), or None if it can."""
    proc = subprocess.run(["perf", "stat", "-x,", "-e", "task-clock", "--", "true"], capture_output=True, text=True,
                          timeout=60, check=False)
    return None if proc.returncode == 0 else (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1]


@pytest.mark.skipif(shutil.which("perf") is None, reason="perf is not installed")
def test_perf_control_protocol_counts_only_the_region(small_trace, tmp_path, monkeypatch) -> None:
    """task-clock is a software event, so this runs without a PMU: the counters are on for the region only,
    and the figure is the region minus the same call path over zero steps."""
    refused = software_events_refused()
    if refused:
        pytest.skip(f"perf cannot count task-clock here: {refused}")
    path = save(small_trace, tmp_path / "t.npz")
    regions, real_region = [], l1d._perf_region
    monkeypatch.setattr(l1d, "_perf_region", lambda *args: regions.append(real_region(*args)) or regions[-1])
    started = time.perf_counter()
    counts = l1d.perf_counts(path, "dict", "per-call", 10, 15, events=("task-clock",))
    elapsed_ms = (time.perf_counter() - started) * 1e3
    (full,), (empty,) = (r.values() for r in regions)
    assert list(counts) == ["task-clock"] and counts["task-clock"] == full - empty
    assert 0 < empty < full  # 15 steps of 16 sequences cost more than the same call path over none
    # Each perf process also starts Python and imports NumPy and Numba (seconds); counting the whole process
    # instead of the region would put the figure near the elapsed time, not below a hundredth of it.
    assert full < elapsed_ms / 100


@pytest.mark.parametrize(("status", "quick", "said"), [("supported", True, "perf"), ("supported", False, "perf"),
                                                       ("unsupported", False, "callgrind"),
                                                       ("unsupported", True, "callgrind is not run with --quick")])
def test_the_progress_line_names_the_counter_l1d_rows_will_use(monkeypatch, status, quick, said) -> None:
    monkeypatch.setattr(l1d, "perf_status", lambda: (status, "why"))
    assert said in l1d.l1d_counter(quick)
    if said != "perf":
        assert "perf" not in l1d.l1d_counter(quick).replace("no perf", "")
