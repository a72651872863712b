"""The benchmark runner and its command line, end to end on tiny matrices (no timing assertions)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from harness.base.rows import read_rows
from harness.cli import main
from harness.run import runner
from harness.run.matrix import overrides
from impls.designs.flat import FlatBlockManager
from scenarios import generate
from scenarios.trace.file_format import content_digest


def run_cli(tmp_path, *args: str) -> int:
    return main(["run", "--results", str(tmp_path), "--quick", "--no-progress", "--no-paced", "--no-l1d",
                 "--no-table-copy", *args])


@pytest.mark.slow  # an end-to-end run, ~10 s (make test-slow, .ci/run)
def test_run_writes_a_complete_run_directory(tmp_path, capsys) -> None:
    assert run_cli(tmp_path, "--scenario", "paper", "--impl", "dict,flat") == 0
    run_dir = (tmp_path / "latest").resolve()
    rows = read_rows(run_dir / "results.csv")
    cells = {(r.impl, r.regime) for r in rows if r.metric == "seq_step_ns"}
    assert cells == {(i, r) for i in ("dict", "flat") for r in ("per-call", "batched", "step")}
    metrics = {r.metric for r in rows}
    for m in ("lookup_ns", "alloc_ns", "free_ns", "alloc_free_ns", "seq_step_ns", "step_p99_ns", "cpu_share_pct",
              "allocs_per_step", "table_bytes_per_seq", "harness_overhead_pct", "compile_s"):
        assert m in metrics, m
    floors = {(r.impl, r.regime) for r in rows if r.metric == "dispatch_floor_seq_step_ns" and r.status == "ok"}
    assert floors == {("flat", "per-call")}  # compiled per call only: the interpreted designs cross no boundary
    assert {r.metric for r in rows if r.impl == "-"} >= {"trace_forks", "trace_cows", "scenario_wall_s"}
    wall = next(r for r in rows if r.metric == "scenario_wall_s")
    assert wall.scenario == "paper" and 0 < wall.value < 3600  # measured, in seconds
    flat_batched = {r.metric: r for r in rows if r.impl == "flat" and r.regime == "batched"}
    assert flat_batched["allocs_per_step"].value == 0  # counted, not assumed
    assert flat_batched["seq_step_ns"].source == "rdtsc"
    meta = json.loads((run_dir / "meta.json").read_text())
    assert meta["complete"] and meta["cpu_model"] and "numba" in meta["versions"]
    # each scenario's trace content digest, which `kvblock-bench compare` checks before comparing its figures
    assert meta["traces"] == {"paper": content_digest(generate("paper", **overrides("paper", quick=True)))}
    assert (run_dir / "paper_table.md").exists() and (run_dir / "summary.md").exists()
    assert (run_dir / "raw" / "paper" / "flat__batched.json.gz").exists()
    out = capsys.readouterr().out
    assert "paper: ns per sequence-step" in out and " flat " in out and "reports: " in out


def test_unknown_names_are_refused(tmp_path, capsys) -> None:
    assert run_cli(tmp_path, "--impl", "nope") == 2
    assert "unknown implementation" in capsys.readouterr().err
    assert run_cli(tmp_path, "--scenario", "nope") == 2
    assert run_cli(tmp_path, "--regime", "sideways") == 2


class WrongFlat(FlatBlockManager):
    """Fast and wrong: forgets to free, so its end state cannot match the trace."""

    def free(self, seq_id: int) -> None:
        pass


@pytest.mark.slow  # an end-to-end run, ~10 s (make test-slow, .ci/run)
def test_a_wrong_implementation_is_marked_failed_not_ranked(tmp_path, capsys) -> None:
    wrong = "tests.test_runner_cli:WrongFlat"
    assert run_cli(tmp_path, "--scenario", "paper", "--impl", f"{wrong},list", "--regime", "per-call") == 3
    rows = read_rows((tmp_path / "latest") / "results.csv")
    failed = [r for r in rows if r.impl == wrong]
    assert [r.status for r in failed] == ["failed"] and failed[0].metric == "correctness"
    assert "is already active" in failed[0].how  # it never freed the row
    assert any(r.impl == "list" and r.metric == "seq_step_ns" for r in rows)
    assert f"paper {wrong} per-call failed" in capsys.readouterr().err  # the run ends saying which cell failed


def test_interrupted_run_keeps_finished_scenarios(tmp_path, monkeypatch) -> None:
    calls = []
    original = runner.measure_scenario

    def interrupt_second(plan, *args):
        calls.append(plan.scenario)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return original(plan, *args)

    monkeypatch.setattr(runner, "measure_scenario", interrupt_second)
    # The command line says "interrupted" in one line and exits with 130, keeping what had finished.
    assert run_cli(tmp_path, "--scenario", "paper,shared-prefix", "--impl", "flat", "--no-allocations") == 130
    run_dir = (tmp_path / "latest").resolve()
    rows = read_rows(run_dir / "results.csv")
    assert {r.scenario for r in rows if r.metric == "seq_step_ns"} == {"paper"}
    meta = json.loads((run_dir / "meta.json").read_text())
    assert not meta["complete"] and "interrupted" in meta
    assert main(["report", "--results", str(tmp_path), "--no-figures"]) == 0
    assert "incomplete" in (run_dir / "paper_table.md").read_text()


def test_metadata_names_the_checkout_the_code_runs_from(tmp_path, monkeypatch) -> None:
    """Not the current directory's repository (a run started from another project's folder)."""
    import subprocess

    from harness.run import metadata

    root = Path(__file__).resolve().parents[1]
    head = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=root, capture_output=True, text=True,
                          check=False).stdout.strip()
    monkeypatch.chdir(tmp_path)
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=False)
    if head:
        assert metadata.git_commit().startswith(head)


def test_report_rewrites_tables_for_an_existing_run(tmp_path, capsys) -> None:
    assert run_cli(tmp_path, "--scenario", "paper", "--impl", "flat", "--regime", "batched", "--no-allocations") == 0
    (tmp_path / "latest" / "paper_table.md").unlink()
    assert main(["report", "--results", str(tmp_path), "--no-figures"]) == 0
    assert (tmp_path / "latest" / "paper_table.md").exists()
    assert "article" in capsys.readouterr().out


def test_report_takes_figures_as_run_does(tmp_path, capsys, monkeypatch) -> None:
    """`report DIR --figures` (the default, said out loud) renders; with --no-figures it is one line, exit 2."""
    from harness.output import plots

    rendered = []
    monkeypatch.setattr(plots, "render_figures", rendered.append)  # the figures' own tests render them
    shutil.copytree(Path(__file__).resolve().parents[1] / "results" / "sample", tmp_path / "sample")
    assert main(["report", str(tmp_path / "sample"), "--figures"]) == 0
    assert [run.run_dir for run in rendered] == [tmp_path / "sample"]
    assert "the article's table on `paper`" in capsys.readouterr().out
    assert main(["report", str(tmp_path / "sample"), "--figures", "--no-figures"]) == 2
    assert "not allowed with argument --figures" in capsys.readouterr().err
