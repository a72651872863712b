"""scripts/overlap_check.py: two runs' ratios compared interval against interval."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from harness.base.rows import Row, write_rows

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "overlap_check.py"
spec = importlib.util.spec_from_file_location("overlap_check", SCRIPT)
overlap_check = importlib.util.module_from_spec(spec)
spec.loader.exec_module(overlap_check)


def _run(folder: Path, low: float, high: float) -> Path:
    folder.mkdir()
    write_rows(folder / "results.csv", [
        Row("paper", "dict", "batched", "seq_step_ns_vs_flat", (low + high) / 2, "x", "ratio", ci_low=low,
            ci_high=high),
        Row("paper", "flat", "batched", "aa_ratio", 1.0, "x", "ratio", ci_low=0.95, ci_high=1.05),
        Row("paper", "dict", "batched", "seq_step_ns", 100.0, "ns", "perf_counter_ns"),  # not a ratio: ignored
    ])
    return folder


def test_overlapping_runs_pass(tmp_path: Path, capsys) -> None:
    a, b = _run(tmp_path / "a", 100, 120), _run(tmp_path / "b", 115, 130)
    out = tmp_path / "overlap.txt"
    assert overlap_check.main([str(a), str(b), "--out", str(out)]) == 0
    assert "overlapping 2 of 2" in out.read_text()


def test_disjoint_intervals_fail_and_are_named(tmp_path: Path, capsys) -> None:
    a, b = _run(tmp_path / "a", 100, 110), _run(tmp_path / "b", 120, 130)
    assert overlap_check.main([str(a), str(b)]) == 1
    text = capsys.readouterr().out
    assert "NO  dict" in text and "overlapping 1 of 2" in text


def test_other_options_are_named_and_other_traces_fail(tmp_path: Path, capsys) -> None:
    from harness.base.files import write_json

    a, b = _run(tmp_path / "a", 100, 120), _run(tmp_path / "b", 115, 130)
    write_json(a / "meta.json", {"config": {"quick": "False"}, "traces": {"paper": "x" * 64}})
    write_json(b / "meta.json", {"config": {"quick": "True"}, "traces": {"paper": "y" * 64}})
    assert overlap_check.main([str(a), str(b)]) == 1
    text = capsys.readouterr().out
    assert "quick False (BASE) -> True (NEW)" in text and "NOT COMPARABLE" in text
