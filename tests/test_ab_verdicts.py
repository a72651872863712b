"""``kvblock-bench ab`` never gives a confident verdict it cannot back: options leaving too few pairs of processes are
refused with their own exit status (4), repetitions sharing a process count as one pair, the version going first
changes from pair to pair, unknown metrics are refused before measuring; NEW's counts are held against BASE's (2 %
by default), "no rule" is never "passed", and the pull-request comment never says passed above a failure;
``make ci-compare`` ends with the script's status."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import numpy as np
import pytest

from harness.base import stats
from harness.base.metrics import TIMED_FIGURES, Work
from harness.base.steptimes import StepTimes
from harness.ci import ab, comment
from harness.cli import build_parser, main
from harness.errors import InputError, TooFewPairs
from harness.gate import command as gate
from harness.gate.config import DEFAULT_COUNTS_THRESHOLD_PCT, parse
from harness.output.compare import MIN_PAIRS, Counted
from harness.output.compare_report import render_markdown, render_text
from harness.run import runner
from harness.run.assemble import Merged, paired_sides
from harness.run.lockstep import alternating
from harness.run.runner import RunConfig
from harness.run.workers import WorkerSpec

ROOT = Path(__file__).resolve().parents[1]


# -- too few pairs ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("reps", "processes", "refused"), [
    (1, 0, True), (MIN_PAIRS - 1, 0, True), (8, MIN_PAIRS - 1, True), (MIN_PAIRS, 0, False), (8, MIN_PAIRS, False),
    (8, 0, False)])
def test_options_that_leave_too_few_pairs_of_processes_are_refused(reps: int, processes: int, refused: bool) -> None:
    cfg = RunConfig(reps=reps, processes=processes)
    if not refused:
        ab.check_options(cfg, ("seq_step_ns",))
        return
    with pytest.raises(TooFewPairs, match=rf"^too few pairs for a verdict: use at least {MIN_PAIRS} \("):
        ab.check_options(cfg, ("seq_step_ns",))


@pytest.mark.parametrize(("argv", "status", "words"), [
    (["--reps", "1"], 4, f"too few pairs for a verdict: use at least {MIN_PAIRS}"),
    (["--quick", "--reps", "2"], 4, "--reps 2 gives 2 pairs"),
    (["--processes", "1"], 4, "--processes 1 gives 1 pair of worker processes"),
    (["--metric", "nope"], 2, "--metric nope: ab compares the figures it pairs"),
    (["--metric", "seq_step_ns,step_p99_ns"], 2, "--metric step_p99_ns"),
])
def test_ab_refuses_before_measuring_in_one_line(tmp_path: Path, capsys, argv: list[str], status: int,
                                                 words: str) -> None:
    code = main(["ab", "HEAD", *argv, "--results", str(tmp_path / "r")])
    out, err = capsys.readouterr()
    assert code == status and not out and words in err and len(err.strip().splitlines()) == 1, err
    assert "Traceback" not in err and not (tmp_path / "r").exists()  # refused before any folder was made


def test_quick_measures_the_fewest_pairs_a_verdict_may_rest_on_and_the_help_says_so() -> None:
    assert ab.AB_QUICK_REPS == MIN_PAIRS >= 2
    text = build_parser()._subparsers._group_actions[0].choices["ab"].format_help()
    assert f"--quick {MIN_PAIRS}" in " ".join(text.split()) and "4 too few pairs" in " ".join(text.split())


def _steps(level: np.ndarray) -> list[StepTimes]:
    steps = level.shape[1]
    return [StepTimes(np.zeros((steps, 5)), np.zeros(steps, dtype=np.int64), 1000.0 * row, 1.0, "tsc")
            for row in level]


def test_repetitions_that_share_a_process_count_as_one_pair() -> None:
    """Six repetitions in three processes (rep r in process r % 3) whose process moves all its repetitions alike:
    three pairs, each the mean of its repetitions' logs, and the interval over three, not six."""
    rng = np.random.default_rng(5)
    process = np.array([1.0, 1.3, 0.8])[np.arange(6) % 3]  # a layout effect per process, NEW's processes only
    base = Merged(steps={("x", "batched", ""): _steps(np.ones((6, 40)) * rng.uniform(0.99, 1.01, (6, 1)))})
    new = Merged(steps={("x", "batched", ""): _steps(np.ones((6, 40)) * process[:, None])})
    work = Work.uniform(40, 8)
    pairs: dict = {}
    grouped = paired_sides("paper", work, [(0, 20), (20, 40)], base, new, ("seq_step_ns",), processes=3, pairs=pairs)
    key = ("paper", "x", "batched", "seq_step_ns")
    assert len(pairs[key]) == 3 and np.allclose(sorted(pairs[key]), [0.8, 1.0, 1.3], rtol=0.03)
    alone = paired_sides("paper", work, [(0, 20), (20, 40)], base, new, ("seq_step_ns",))
    width = [e[key].high / e[key].low for e in (grouped, alone)]
    assert width[0] > width[1]  # six "pairs" that are three would claim a narrower interval
    assert stats.paired_reps(np.ones((4, 3)), np.ones((4, 3)), groups=np.array([0, 1, 0, 1])).value == 1.0


def test_which_version_goes_first_changes_from_one_share_to_the_next(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every share's lockstep starts one turn further on, so BASE does not go first at the start of every pair."""
    seen = []
    monkeypatch.setattr(runner, "lockstep", lambda pool, jobs, tick, status, order: seen.append(order) or {})
    shared = runner.Shared({}, {}, [0, 0], type("Bar", (), {"status": print})(), Path("."), RunConfig())
    specs = [WorkerSpec("a", 0, "/base"), WorkerSpec("a", 0, "/new")]
    sides = {"/base": [("a", "batched")], "/new": [("a", "batched")]}
    timed = runner.Timed(sides, {"/base": {}, "/new": {}}, {}, alternating(["/base", "/new"]))
    for share in (0, 1):
        runner._in_lockstep(shared, timed, share, lambda code, impl, cells: None)
    first = [order(specs, 0)[0].code for order in seen]
    assert first == ["/base", "/new"]


def test_ab_pairs_every_timed_figure() -> None:
    assert set(TIMED_FIGURES) >= {"seq_step_ns", "lookup_ns", "alloc_free_ns", "step_mean_ns"}
    ab.check_options(RunConfig(reps=8), TIMED_FIGURES)


def test_ci_run_and_the_profile_give_ab_enough_pairs() -> None:
    """.ci/run's self-check of the pipeline runs ab with at least the fewest pairs a verdict needs."""
    reps = re.search(r"--reps (\d+)", (ROOT / ".ci" / "run").read_text())
    assert reps is None or int(reps.group(1)) >= MIN_PAIRS
    assert ab.AB_REPS >= MIN_PAIRS


# -- the counts against BASE ------------------------------------------------------------------------------------
def test_new_s_counts_beyond_base_s_fail_by_the_threshold() -> None:
    more = Counted("dict", "batched", (1000.0, 1221.0), (5.0, 5.0))
    assert more.beyond(2.0) == ["instructions +22.1 %"] and more.verdict(2.0) == "more work"
    assert Counted("x", "batched", (100.0, 101.9), (0.0, 0.0)).verdict(2.0) == "within"
    assert Counted("x", "batched", (100.0, 100.0), (0.0, 1.0)).beyond(2.0) == ["allocations per step 0 -> 1"]
    assert Counted("x", "batched", (100.0, 90.0), (4.0, 2.0)).verdict(2.0) == "within"  # less work passes
    assert Counted("x", "batched", (None, 90.0), (None, 2.0)).verdict(2.0) == "not measured"
    assert Counted("x", "batched", (100.0, 104.0), (0.0, 0.0)).verdict(5.0) == "within"


def _comparison(counted: list[Counted], threshold: float = DEFAULT_COUNTS_THRESHOLD_PCT):
    from harness.output.compare import Comparison, Run
    from harness.output.rundata import RunData

    run = Run("BASE", RunData.__new__(RunData))
    comparison = Comparison(run, run, 0.05, ("seq_step_ns",), [], [], [], True, counted=counted)
    comparison.counts_threshold_pct = threshold
    return comparison


def test_more_work_than_base_fails_the_comparison_and_the_report_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    from harness.output import compare_report
    from harness.output.compare import Run

    monkeypatch.setattr(Run, "describe", lambda self: {"run_id": self.side, "commit": "c", "started": "s",
                                                       "machine": "cpu (2 CPUs)"})
    c = _comparison([Counted("dict", "batched", (1000.0, 1221.0), (0.0, 0.0)),
                     Counted("flat", "batched", (20.0, 20.0), (0.0, 0.0))])
    assert c.exit_status == 1 and c.failures() == ["more work than BASE beyond 2 %: dict batched "
                                                   "(instructions +22.1 %)"]
    md = render_markdown(c)
    assert md.startswith("### kvblock-bench compare: ❌ FAILED: more work than BASE") and "FAILED: more work |" in md
    text = render_text(c)
    assert "NEW needs more than BASE beyond 2 % in 1 of 2 cells" in text and "within 2 %" in text
    assert compare_report.counted_title(_comparison([Counted("x", "batched", (None, 1.0), (None, 0.0))])) == (
        "not measured: no cell's counts on both sides")


def test_the_counts_threshold_is_configured_and_checked() -> None:
    assert parse({}, "t").counts_threshold_pct == DEFAULT_COUNTS_THRESHOLD_PCT == 2.0
    assert parse({"counts_threshold_pct": 0.5}, "t").counts_threshold_pct == 0.5
    for bad in (-1, "2", float("nan"), True):
        with pytest.raises(InputError, match="counts_threshold_pct must be a non-negative number"):
            parse({"counts_threshold_pct": bad}, "t")
    args = build_parser().parse_args(["ab", "HEAD", "--counts-threshold", "3"])
    assert args.counts_threshold == 3.0


# -- the gate's words: "no rule", never "passed" for what nothing asked --------------------------------------------
def test_a_cell_without_a_rule_says_no_rule_and_a_gate_without_any_says_so() -> None:
    config = parse({"rule": [{"impl": "flat", "regime": "batched", "max_instructions_per_seq_step": 30.0}]}, "t")
    cells = {("flat", "batched"): gate.CellFigures("flat", "batched", [100], 10, 0.0, 0.0),
             ("mine", "batched"): gate.CellFigures("mine", "batched", [900], 10, 0.0, 0.0)}
    assert gate.rules_checked(cells, config) == {"flat batched": "met", "mine batched": "no rule"}
    assert gate.rules_checked(cells, parse({}, "t")) == {"flat batched": "no rule", "mine batched": "no rule"}
    assert gate.verdict_word([], "", checked=False) == "checked no rule"
    assert gate.verdict_word([], "", checked=True) == "passed"
    assert gate.verdict_word(["x"], "", checked=True) == "failed"


# -- the pull-request comment ---------------------------------------------------------------------------------------
GATE_PASSED = {"config": "pyproject.toml [tool.kvblock-bench.gate]", "verdict": "passed", "failures": [],
               "rules": {"flat batched": "met", "mine batched": "no rule", "mine per-call": "no rule"}}
GATE_NO_RULE = {**GATE_PASSED, "verdict": "checked no rule", "rules": {"mine batched": "no rule"}}
GATE_FAILED = {**GATE_PASSED, "verdict": "failed", "rules": {"flat batched": "FAILED"},
               "failures": ["flat batched needs 31.0 instructions per sequence-step; the ceiling is 30"]}
REPORT = "### kvblock-bench compare: ❌ FAILED: more work than BASE beyond 2 %: dict batched (instructions +22.1 %)\n"


@pytest.mark.parametrize("gate_doc", [GATE_PASSED, GATE_NO_RULE, GATE_FAILED, None])
@pytest.mark.parametrize("ab_status", [0, 1, 2, 4])
def test_the_comment_says_passed_only_when_both_passed(gate_doc: dict | None, ab_status: int) -> None:
    gate_status = None if gate_doc is None else 1 if gate_doc is GATE_FAILED else 0
    text = comment.comment(gate_doc, gate_status, "", ab_status, REPORT if ab_status else "", [])
    first, rest = text.splitlines()[0], "\n".join(text.splitlines()[1:])
    everything_passed = ab_status == 0 and gate_status in (0, None)
    assert ("passed" in first) is everything_passed and "gate passed" not in text
    assert ("FAILED" in first) is (bool(gate_status) or ab_status in (1, 2))
    if gate_doc is not None and "no rule" in gate_doc["rules"].values():
        assert re.search(r"no rule for \d+ of \d+ cells", rest)
    if ab_status == 4:
        assert "too few pairs for a verdict" in text


def test_the_comment_reads_what_the_script_wrote(tmp_path: Path, capsys) -> None:
    (tmp_path / "gate.json").write_text(json.dumps(GATE_PASSED))
    (tmp_path / "compare.md").write_text(REPORT)
    (tmp_path / "compare.err").write_text("progress\nkvblock-bench: error: something\n")
    assert comment.main([str(tmp_path), "0", "1"]) == 0
    text = capsys.readouterr().out
    assert text.startswith("### kvblock-bench: ❌ FAILED\n") and "- gate (pyproject.toml" in text
    assert "1 met; no rule for 2 of 3 cells" in text and "#### kvblock-bench ab: ❌ FAILED: more work" in text
    assert text.rstrip().endswith("kvblock-bench: error: something")


# -- make ci-compare ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("status", "expected"), [(0, 0), (1, 1), (2, 2), (4, 2)])
def test_make_ci_compare_ends_with_the_scripts_status(tmp_path: Path, status: int, expected: int) -> None:
    """GNU make exits 0, 1 or 2 only: 0 and 1 and 2 come through as they are; 4 (too few pairs) is an error naming
    it (exit 2)."""
    stub = tmp_path / "ci_compare.sh"
    stub.write_text(f"#!/bin/sh\necho \"compared with $1\"\nexit {status}\n")
    stub.chmod(0o755)
    stamp = tmp_path / "stamp"
    stamp.write_text("")  # newer than pyproject.toml: setup has nothing to do
    proc = subprocess.run(["make", "-s", "ci-compare", f"CI_COMPARE={stub}", f"STAMP={stamp}", "BASE_REF=origin/x"],
                          cwd=ROOT, capture_output=True, text=True, check=False, timeout=120)
    assert proc.returncode == expected, proc.stdout + proc.stderr
    assert "compared with origin/x" in proc.stdout + proc.stderr
    if status == 4:
        assert "exited with status 4" in proc.stderr
