"""``run`` checks every plug-in against the contract (the checker's quick form) before timing it (issue 51, item 4):
a design that fails is still measured, but its rows say so (the ``conformance`` column), and so do meta.json, the
console and the reports; it is never ranked beside correct designs without a word."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.base.rows import Row, read_rows
from harness.output.console import console_summary
from harness.output.report import report_texts
from harness.output.rundata import RunData
from harness.run.runner import RunConfig, RunWriter
from tests.test_compare import make_run, timed

BROKEN = "tests.hostile_plugins:FillsIdsInDecode"


def test_a_checked_plugins_rows_carry_its_verdict_and_read_back(tmp_path: Path) -> None:
    writer = RunWriter(RunConfig(root=tmp_path), {"complete": False}, {"mine:Bad": "fails", "mine:Good": "conforms"})
    writer.add([timed("seq_step_ns", 8.0, impl=name) for name in ("flat", "mine:Bad", "mine:Good")])
    rows = {r.impl: r.conformance for r in read_rows(writer.run_dir / "results.csv")}
    assert rows == {"flat": "", "mine:Bad": "fails", "mine:Good": "conforms"}
    with pytest.raises(ValueError, match="conformance"):
        Row("paper", "x", "batched", "seq_step_ns", 1.0, "ns", "tsc", conformance="maybe")


@pytest.fixture
def marked_run(tmp_path: Path) -> RunData:
    rows = [timed("seq_step_ns", 8.0), timed("seq_step_ns", 7.0, impl="mine:Bad", conformance="fails"),
            timed("seq_step_ns", 9.0, impl="mine:Good", conformance="conforms")]
    checks = {"mine:Bad": {"verdict": "fails", "why": "seed 0: AssertionError: wrote into its inputs", "seconds": 3.2},
              "mine:Good": {"verdict": "conforms", "why": "", "seconds": 2.9}}
    return RunData.load(make_run(tmp_path / "run", rows, meta={"conformance": checks}))


def test_the_console_and_the_reports_say_which_design_does_not_conform(marked_run: RunData) -> None:
    text = console_summary(marked_run)
    assert "contract check before timing (quick form: 2 plug-in(s)): mine:Bad fails (3.2 s); mine:Good conforms " \
           "(2.9 s)" in text
    assert "DOES NOT CONFORM: mine:Bad failed the contract check before the run timed it (seed 0: AssertionError: " \
           "wrote into its inputs)" in text
    (bad,) = [line for line in text.splitlines() if line.startswith("  batched") and "mine:Bad" in line]
    assert bad.endswith("DOES NOT CONFORM")
    assert not any(line.endswith("DOES NOT CONFORM") for line in text.splitlines() if "mine:Good" in line)
    for name, report in report_texts(marked_run).items():
        assert "DOES NOT CONFORM: mine:Bad" in report, name


@pytest.mark.slow  # two workers check two plug-ins (about 10 s)
def test_the_quick_form_tells_a_broken_plugin_from_a_correct_one() -> None:
    from harness.run.precheck import check_plugins

    checked = check_plugins(["tests.hostile_plugins:Spy", BROKEN], 60)
    assert checked["tests.hostile_plugins:Spy"].verdict == "conforms"
    bad = checked[BROKEN]
    assert bad.verdict == "fails" and "wrote into its inputs" in bad.why and "\n" not in bad.why
    assert all(0 < c.seconds < 60 for c in checked.values())


@pytest.mark.slow  # an end-to-end CLI run (make test-slow, .ci/run)
def test_run_checks_a_plugin_before_timing_it_and_marks_its_rows(tmp_path: Path, capsys) -> None:
    from harness.cli import main

    main(["run", "--impl", f"flat,{BROKEN}", "--scenario", "paper", "--quick", "--no-l1d", "--no-paced",
          "--no-table-copy", "--no-allocations", "--processes", "1", "--no-progress", "--results", str(tmp_path)])
    out = capsys.readouterr().out
    rows = read_rows(tmp_path / "latest" / "results.csv")
    assert {r.conformance for r in rows if r.impl == BROKEN} == {"fails"}
    assert {r.conformance for r in rows if r.impl == "flat"} == {""}
    meta = json.loads((tmp_path / "latest" / "meta.json").read_text())
    assert meta["conformance"][BROKEN]["verdict"] == "fails" and meta["conformance"][BROKEN]["seconds"] > 0
    assert f"DOES NOT CONFORM: {BROKEN}" in out
