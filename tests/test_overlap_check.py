"""scripts/overlap_check.py: two runs' ratios compared interval against interval."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

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


def test_agreement_across_runs_needs_a_small_spread_and_intervals_that_hold_each_other() -> None:
    from harness.base.rows import Row
    from harness.output.overlap import agreement

    def run(value: float, low: float, high: float) -> dict:
        return {("vllm-v1", "batched", "seq_step_ns_vs_flat"): Row("paper", "vllm-v1", "batched",
                                                                    "seq_step_ns_vs_flat", value, "x", "ratio",
                                                                    ci_low=low, ci_high=high)}

    held = agreement([run(1800, 1500, 2200), run(1870, 1470, 2180), run(1900, 1600, 2100)], "_vs_flat")[0]
    assert held.holds() and held.spread == pytest.approx(1900 / 1800)
    wide_apart = agreement([run(1200, 500, 1500), run(3300, 1500, 3700)], "_vs_flat")[0]
    assert not wide_apart.holds() and not wide_apart.covered and wide_apart.spread > 2.5
    narrow = agreement([run(1000, 990, 1010), run(1100, 1090, 1110)], "_vs_flat")[0]
    assert narrow.spread <= 1.25 and not narrow.holds()  # close, but each interval excludes the other's figure
    missing = agreement([run(1000, 900, 1100), {}], "_vs_flat")[0]
    assert not missing.holds()
