"""The README's results section is what `kvblock-bench report --readme` generates from the committed reference."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.output import sections
from harness.output.readme import BEGIN, END, ReadmeError, current_section, replace_section, section
from harness.output.rundata import RunData

ROOT = Path(__file__).resolve().parents[1]


def test_readme_results_match_the_reference_run() -> None:
    expected = section(RunData.load(ROOT / "results" / "reference")).strip("\n")
    assert current_section(sections.doc_path("results").read_text(encoding="utf-8")) == expected, (
        "README.md's results section differs from results/reference: run "
        "`kvblock-bench report results/reference --readme README.md --no-figures`")


def test_markers_are_required_and_replaced_in_place() -> None:
    text = f"head\n{BEGIN}\nold\n{END}\ntail\n"
    assert replace_section(text, "new") == f"head\n{BEGIN}\nnew\n{END}\ntail\n"
    with pytest.raises(ReadmeError):
        replace_section("no markers", "x")
    with pytest.raises(ReadmeError):
        replace_section(f"{END}\n{BEGIN}", "x")


def test_the_section_says_where_the_time_went(tmp_path: Path) -> None:
    """Each scenario's wall time, largest first, and the rest of the run, from the rows and meta.json."""
    from harness.base.files import write_json
    from harness.base.rows import Row, write_rows
    from harness.output.readme import _time_lines

    write_rows(tmp_path / "results.csv", [Row("paper", "-", "-", "scenario_wall_s", 100.0, "s", "wall clock"),
                                          Row("mooncake", "-", "-", "scenario_wall_s", 250.4, "s", "wall clock")])
    write_json(tmp_path / "meta.json", {"started": "2026-11-30T08:00:00+0000",
                                        "finished": "2026-11-30T08:06:00+0000"})
    lines = _time_lines(RunData.load(tmp_path))
    assert lines[0].endswith("`mooncake` 250 s, `paper` 100 s; outside the scenarios (start-up, timer "
                             "calibration) 10 s.")
    write_rows(tmp_path / "results.csv", [Row("paper", "-", "-", "trace_s", 1.0, "s", "wall clock")])
    assert _time_lines(RunData.load(tmp_path)) == []  # an older run without the rows says nothing


def test_the_section_compares_the_run_with_its_repeat(tmp_path: Path) -> None:
    """Every paper ratio of the run against the repeat kept beside it; the pairs that do not overlap named."""
    from harness.base.files import write_json
    from harness.base.rows import Row, write_rows
    from harness.output.readme import _repeat_lines

    def ratio(metric: str, value: float, low: float, high: float) -> Row:
        return Row("paper", "dict", "batched", metric, value, "x", "ratio", ci_low=low, ci_high=high)

    write_rows(tmp_path / "results.csv", [ratio("seq_step_ns_vs_flat", 150, 140, 160),
                                          ratio("lookup_ns_vs_flat", 200, 190, 210)])
    assert _repeat_lines(RunData.load(tmp_path)) == []  # no repeat kept: nothing said
    write_rows(tmp_path / "repeat_results.csv", [ratio("seq_step_ns_vs_flat", 155, 145, 170),
                                                 ratio("lookup_ns_vs_flat", 300, 280, 320)])
    write_json(tmp_path / "repeat_meta.json", {"git_commit": "abc"})
    lines = _repeat_lines(RunData.load(tmp_path))
    assert "agree on 1 of 2 `paper` ratios" in lines[0] and "commit `abc`" in lines[0]
    assert lines[1:] == ["- `dict` batched `lookup_ns_vs_flat`: 300 [280-320] against 200 [190-210]", ""]


def test_a_dirty_commit_names_the_files_that_differed() -> None:
    """``-dirty`` alone cannot tell an edited README from edited code: the run records the files, and the
    section names them."""
    from harness.output.readme import commit_text

    assert commit_text({"git_commit": "abc"}) == "`abc`"
    assert commit_text({"git_commit": "abc-dirty", "git_changed_files": ["README.md"]}) == (
        "`abc-dirty` (uncommitted edits to README.md)")


def test_the_run_records_the_files_that_differ_from_its_commit(monkeypatch, tmp_path: Path) -> None:
    from harness.run import metadata

    (tmp_path / ".git").mkdir()
    monkeypatch.setattr(metadata, "PROJECT_ROOT", tmp_path)
    calls = []

    def fake_run(cmd, cwd=None):
        calls.append(cmd)
        return "README.md\nimpls/designs/flat.py" if cmd[:2] == ["git", "diff"] else "0123456789ab"

    monkeypatch.setattr(metadata, "_run", fake_run)
    assert metadata.git_changed_files() == ["README.md", "impls/designs/flat.py"]
    assert metadata.git_commit() == "0123456789ab-dirty"
    assert ["git", "diff", "--name-only", "HEAD"] in calls
