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


def test_the_section_shows_every_kept_run_by_machine(tmp_path: Path) -> None:
    """Each batched cell's x flat: per machine kind, the median over its kept runs with their range, beside the
    newest run's own interval; nothing said where no run is kept."""
    from harness.base.files import write_json
    from harness.base.rows import Row, write_rows
    from harness.output.reproduction import section

    def ratio(value: float, low: float, high: float) -> Row:
        return Row("paper", "dict", "batched", "seq_step_ns_vs_flat", value, "x", "ratio", ci_low=low, ci_high=high)

    assert section(tmp_path) == []
    cpu = {"vendor": "AuthenticAMD", "model_name": "AMD EPYC", "stepping": 1, "vcpus": 2}
    for name, value, family, model, started in (("a", 150, 25, 17, "1"), ("b", 170, 25, 17, "2"),
                                                ("c", 160, 25, 17, "3"), ("z", 300, 23, 49, "4")):
        write_rows(tmp_path / "runs" / name / "results.csv", [ratio(value, value - 10, value + 10)])
        write_json(tmp_path / "runs" / name / "meta.json", {
            "started": started, "git_commit": "abc", "caches": {"L2": "1024K"},
            "cpu": {**cpu, "family": family, "model": model,
                    "microarchitecture": "Zen 4" if family == 25 else "Zen 2"}})
    lines = section(tmp_path)
    assert "3 on AMD EPYC (Zen 4" in lines[0] and "1 on AMD EPYC (Zen 2" in lines[0]
    row = next(line for line in lines if line.startswith("| `dict`"))
    assert "| 160 [150–170] ×3 | 160 [150–170] | 300 | 300 [290–310] |" in row


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


def test_a_readers_run_is_checked_against_the_kept_runs_of_its_machine_kind() -> None:
    from harness.base.rows import Row
    from harness.output.reproduction import Kept, check

    def ratio(impl: str, value: float) -> Row:
        return Row("paper", impl, "batched", "seq_step_ns_vs_flat", value, "x", "ratio", ci_low=value * 0.9,
                   ci_high=value * 1.1)

    zen4 = {"cpu": {"vendor": "AuthenticAMD", "family": 25, "model": 17, "stepping": 1, "vcpus": 2}}
    zen2 = {"cpu": {"vendor": "AuthenticAMD", "family": 23, "model": 49, "stepping": 0, "vcpus": 2}}
    kept = [Kept(f"r{i}", zen4, {("paper", "dict", "batched", "seq_step_ns_vs_flat"): ratio("dict", v)})
            for i, v in enumerate((150, 170))] + [
        Kept("z", zen2, {("paper", "dict", "batched", "seq_step_ns_vs_flat"): ratio("dict", 400)})]
    verdicts = {v: check([ratio("dict", v)], zen4, kept)[0].verdict for v in (160, 180, 400)}
    assert verdicts == {160: "within the runs' range", 180: "within their intervals", 400: "outside"}
    other = check([ratio("dict", 390)], {"cpu": {"vendor": "GenuineIntel", "family": 6, "model": 143}}, kept)[0]
    assert not other.same_machine and other.verdict == "within the runs' range"  # every kind's range: 150-400


def test_each_kept_run_is_named_with_the_host_state_it_recorded() -> None:
    from harness.output.reproduction import Kept, run_state

    assert run_state(Kept("r1", {}, {})) == "r1 (host state not recorded)"
    assert run_state(Kept("r2", {"host": {"on_cpu_pct": {"min": 99.5}}}, {})) == "r2 (idle)"
    busy = run_state(Kept("r3", {"host": {"on_cpu_pct": {"min": 80.0}}}, {}))
    assert busy.startswith("r3 (beside competing work: ") and "80 %" in busy
