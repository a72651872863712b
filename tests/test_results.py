"""Result files: tidy rows, atomic writes, unique run directories, the latest link, interruption safety."""

from __future__ import annotations

import math
import os

import pytest

from harness.base.files import new_run_dir, point_latest, resolve_run
from harness.base.rows import Row, read_rows, write_rows
from scenarios.files import atomic


def test_row_refuses_numbers_for_unmeasured_figures() -> None:
    row = Row("paper", "flat", "batched", "l1d_miss_pct", 0.0, "%", "perf", "unsupported", "no PMU")
    assert math.isnan(row.value)
    with pytest.raises(ValueError):
        Row("paper", "flat", "batched", "lookup_ns", float("nan"), "ns", "rdtsc")
    with pytest.raises(ValueError):
        Row("paper", "flat", "batched", "lookup_ns", 1.0, "ns", "rdtsc", status="guessed")


def test_round_trip(tmp_path) -> None:
    rows = [Row("paper", "flat", "batched", "lookup_ns", 2.5, "ns", "rdtsc", how="x, y"),
            Row("paper", "flat", "batched", "l1d_miss_pct", 0, "%", "perf", "unsupported", "no PMU")]
    write_rows(tmp_path / "results.csv", rows)
    back = read_rows(tmp_path / "results.csv")
    assert back[0] == rows[0]
    assert back[1].status == "unsupported" and math.isnan(back[1].value)
    header = (tmp_path / "results.csv").read_text().splitlines()[0].split(",")
    assert header[:7] == ["scenario", "impl", "regime", "metric", "value", "unit", "source"]


def test_interrupted_write_keeps_the_previous_file(tmp_path, monkeypatch) -> None:
    path = tmp_path / "results.csv"
    write_rows(path, [Row("a", "b", "c", "m", 1.0, "ns", "s")])

    def boom(src, dst):
        raise KeyboardInterrupt

    monkeypatch.setattr(atomic.os, "replace", boom)  # the one atomic-write implementation
    with pytest.raises(KeyboardInterrupt):
        write_rows(path, [Row("a", "b", "c", "m", 2.0, "ns", "s")])
    monkeypatch.undo()
    assert read_rows(path)[0].value == 1.0
    assert [p.name for p in tmp_path.iterdir()] == ["results.csv"]  # no temporary left behind


def test_run_dirs_are_unique_and_latest_follows(tmp_path) -> None:
    a, b = new_run_dir(tmp_path, "x"), new_run_dir(tmp_path, "x")
    assert a != b and a.is_dir() and b.is_dir()
    write_rows(a / "results.csv", [])
    write_rows(b / "results.csv", [])
    point_latest(a)
    point_latest(b)
    assert os.readlink(tmp_path / "latest") == b.name
    assert resolve_run(None, tmp_path) == b.resolve()
    assert resolve_run(a.name, tmp_path) == a.resolve()
    with pytest.raises(FileNotFoundError):
        resolve_run("nope", tmp_path)


def test_calibration_notes_name_every_scenario_a_contender_was_calibrated_on(tmp_path) -> None:
    from harness.base.project import CALIBRATION_CSV
    from harness.output.report import calibration_notes

    path = tmp_path / "calibration.csv"
    path.write_text(
        "contender,engine,engine_version,scenario,call_shape,ours_ns_per_seq_step,real_ns_per_seq_step,ratio,reps,how\n"
        "a,E,1,paper,per-call,1,1,0.90,5,x\n"
        "a,E,1,sharing,per-call,1,1,1.10,5,x\n"
        "a,E,1,sharing,per-call,1,1,9.99,5,a second row of a scenario is not shown\n"
        "b,E,1,paper,batched,1,,,0,no real run\n")
    notes = calibration_notes(path)
    assert notes[("a", "per-call")] == "calibrated: ours/real = 0.90 (paper), 1.10 (sharing)"
    assert notes[("b", "batched")] == "not calibrated (no real run)"
    # the committed figures still read
    assert calibration_notes(CALIBRATION_CSV)[("vllm-v1", "per-call")].startswith("calibrated: ours/real = ")
