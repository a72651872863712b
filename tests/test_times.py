"""The make targets' times: scripts/make_times.py measures them into a file, the README and --help quote that file."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest

from harness.cli import build_parser
from harness.output import sections, times
from harness.output.readme import ReadmeError, current_section, replace_section

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "make_times.py"
spec = importlib.util.spec_from_file_location("make_times", SCRIPT)
make_times = importlib.util.module_from_spec(spec)
spec.loader.exec_module(make_times)

STUB = """\
VENV ?= .venv
setup:
\techo "$(VENV)" > venv-used.txt
test:
\tsleep 0.3
gate:
\texit 3
"""


def entry(target: str, wall: float | None, returncode: int = 0) -> times.TargetTime:
    return times.TargetTime(target, f"make {target}", returncode, wall, None if wall is None else wall / 2,
                            "2026-12-01T10:00:00+0000", "abc123", "cold", 0.05)


def test_each_target_is_timed_and_written_with_machine_commit_and_date(tmp_path: Path) -> None:
    (tmp_path / "Makefile").write_text(STUB)
    (tmp_path / "build" / "numba-cache").mkdir(parents=True)
    out = tmp_path / "times.json"
    code = make_times.main(["--targets", "gate,setup,test", "--dir", str(tmp_path), "--out", str(out)])
    assert code == 1  # gate failed, and says so
    data = json.loads(out.read_text())
    assert data["machine"]["cpu_model"] and data["machine"]["cpu_count"] >= 1
    by = {t["target"]: t for t in data["targets"]}
    assert [t["target"] for t in data["targets"]] == ["setup", "test", "gate"]  # the README's order
    assert by["test"]["returncode"] == 0 and 0.3 <= by["test"]["wall_s"] < 60 and by["test"]["cpu_s"] >= 0
    assert by["gate"]["returncode"] == 2 and by["gate"]["wall_s"] is None  # make says 2; a failure has no time
    assert all(t["commit"] and re.match(r"\d{4}-\d\d-\d\dT", t["started"]) and t["caches"] == "cold"
               for t in data["targets"])
    assert by["setup"]["command"] == "make setup (fresh .venv)"
    assert "fresh-venv" in (tmp_path / "venv-used.txt").read_text()  # setup ran on a fresh venv, not .venv
    assert not (tmp_path / "build" / "numba-cache").exists()  # cold: the caches were removed first
    loaded = times.read_times(out)
    assert loaded is not None and loaded.get("test").ok and not loaded.get("gate").ok


def test_a_second_measurement_replaces_only_its_targets(tmp_path: Path) -> None:
    (tmp_path / "Makefile").write_text(STUB)
    out = tmp_path / "times.json"
    make_times.main(["--targets", "test", "--dir", str(tmp_path), "--out", str(out), "--caches", "warm"])
    make_times.main(["--targets", "setup", "--dir", str(tmp_path), "--out", str(out), "--caches", "warm"])
    loaded = times.read_times(out)
    assert [t.target for t in loaded.targets] == ["setup", "test"] and loaded.get("test").caches == "warm"


def test_the_readme_table_follows_the_file_after_every_target(tmp_path: Path) -> None:
    """A timed ``make test`` checks the README against the file: the script rewrites the README's table after
    each target, so the target that runs next sees the two agree."""
    page = sections.doc_path("times", tmp_path)
    stub = STUB.replace("\tsleep 0.3", f"\tgrep -q 'make setup (fresh .venv)' {sections.FILES['times']}")
    (tmp_path / "Makefile").write_text(stub)
    page.parent.mkdir(parents=True)
    page.write_text(f"intro\n{times.BEGIN}\nstale table\n{times.END}\noutro\n")
    out = tmp_path / "results" / "times" / "times.json"
    assert make_times.main(["--targets", "setup,test", "--dir", str(tmp_path), "--out", str(out),
                            "--caches", "warm"]) == 0
    text = page.read_text()
    assert times.section(times.read_times(out)) in text and "stale table" not in text and text.endswith("outro\n")


def test_words_come_from_the_file_and_never_guess() -> None:
    measured = times.Times({"cpu_model": "Test CPU", "cpu_count": 2},
                           [entry("bench-quick", 221.0), entry("gate", None, returncode=2)])
    assert times.phrase("bench-quick", measured) == (
        "`make bench-quick` took 3 min 41 s on the reference machine (results/times/times.json)")
    assert "failed (exit status 2)" in times.phrase("gate", measured)
    assert "not timed yet" in times.phrase("bench", measured) and "not timed yet" in times.phrase("bench", None)
    table = times.section(measured)
    assert "| `make bench-quick` |" in table and "3 min 41 s" in table and "1 min 50 s" in table  # wall, CPU
    assert "Test CPU (family, model and stepping not recorded), 2 CPUs" in table and "`abc123`, 2026-12-01" in table
    assert "make bench-quick 3 min 41 s" in times.help_epilog(measured)
    assert times.section(None).startswith("Not measured yet")


def test_a_damaged_file_is_refused_by_name_and_costs_the_cli_nothing(tmp_path: Path) -> None:
    bad = tmp_path / "times.json"
    bad.write_text('{"format": 1, "machine": {}}')
    with pytest.raises(times.TimesError, match=r"times\.json"):
        times.read_times(bad)
    assert times.quoted_times(bad) is None
    assert times.read_times(tmp_path / "absent.json") is None


def _words(text: str) -> str:
    return " ".join(text.split())


def test_the_readme_and_help_quote_the_committed_file() -> None:
    committed = times.read_times()
    page = sections.doc_path("times")
    assert current_section(page.read_text(encoding="utf-8"), times.BEGIN, times.END) == times.section(committed), (
        f"{page.relative_to(ROOT)}'s time table differs from results/times/times.json: run "
        "`kvblock-bench report results/reference --readme README.md --no-figures`")
    parser = build_parser()
    assert _words(times.help_epilog(committed)) in _words(parser.format_help())
    run_help = _words(parser._subparsers._group_actions[0].choices["run"].format_help())
    assert _words(times.phrase("bench-quick", committed)) in run_help
    assert _words(times.phrase("bench", committed)) in run_help
    for guess in ("about a minute", "about ten minutes", "in under ten minutes"):
        assert guess not in run_help and guess not in (ROOT / "README.md").read_text(encoding="utf-8")


def test_the_time_markers_are_replaced_in_place() -> None:
    text = f"a\n{times.BEGIN}\nstale table\n{times.END}\nb"
    assert replace_section(text, "new", times.BEGIN, times.END) == f"a\n{times.BEGIN}\nnew\n{times.END}\nb"
    with pytest.raises(ReadmeError):
        replace_section(f"{times.END}{times.BEGIN}", "x", times.BEGIN, times.END)
