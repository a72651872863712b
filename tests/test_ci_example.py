"""The CI example cannot rot: the GitHub Actions workflow and .ci/run run the same script, whose settings the
workflow names exist; the script runs end to end (slow) and refuses a base it cannot check out; the CI
profile and the slowed plug-in the measurement of the false-alarm rate uses are what they say."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from harness.ci import profile
from harness.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "ci_compare.sh"
WORKFLOW = (ROOT / "examples" / "ci" / "github-actions.yml").read_text()
TINY = "--quick --scenario paper --impl flat --regime batched --no-paced --no-l1d --no-allocations --no-table-copy"


def test_the_workflow_and_ci_run_call_the_one_script() -> None:
    assert "scripts/ci_compare.sh" in (ROOT / ".ci" / "run").read_text()
    assert re.search(r"run: scripts/ci_compare\.sh \"origin/\$\{\{ github\.base_ref \}\}\"", WORKFLOW)
    assert os.access(SCRIPT, os.X_OK)
    assert subprocess.run(["bash", "-n", str(SCRIPT)], check=False).returncode == 0
    script = SCRIPT.read_text()
    for name in set(re.findall(r"\bKVB_CI_[A-Z_]+", WORKFLOW)):
        assert name in script, f"the workflow sets {name}, which scripts/ci_compare.sh does not read"
    assert "build/ci-compare/comment.md" in WORKFLOW and "comment.md" in script


def test_the_ci_profile_is_a_valid_run() -> None:
    """The profile's arguments parse as `kvblock-bench run`'s, with a plug-in added to every registered name."""
    args = build_parser().parse_args(["run", *profile.run_args(["x.y:Z"])])
    assert args.scenario == ["paper"] and args.regime == ["batched", "step"] and args.impl[-1] == "x.y:Z"
    assert "flat" in args.impl and args.no_paced and args.no_l1d and args.no_allocations and args.no_table_copy
    assert build_parser().parse_args(["run", *profile.run_args()]).impl is None  # every registered one


def test_pull_requests_time_the_articles_designs_in_both_tiers() -> None:
    """CI's ab profile: A, B and C in Python/Numba and in C++, each side's workers a process per repetition, so
    every implementation dropped from it is minutes saved (README, "Benchmarks in CI")."""
    out = subprocess.run([sys.executable, "-m", "harness.ci.profile", "--pull-request", "x.y:Z"], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout
    args = build_parser().parse_args(["run", *out.split()])
    assert args.impl == ["dict", "list", "flat", "cpp-dict", "cpp-list", "cpp-flat", "x.y:Z"], args.impl
    assert "--pull-request)" in SCRIPT.read_text()


def test_a_base_that_cannot_be_checked_out_is_exit_2(tmp_path: Path) -> None:
    env = {**os.environ, "KVB_CI_OUT": str(tmp_path / "out"), "KVB_CI_SKIP_GATE": "1", "KVB_CI_RUN_ARGS": TINY,
           "PY": sys.executable}
    proc = subprocess.run([str(SCRIPT), "no-such-ref-anywhere"], cwd=ROOT, env=env, capture_output=True, text=True,
                          check=False)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "BASE_REF no-such-ref-anywhere: not a commit" in (tmp_path / "out" / "comment.md").read_text()


@pytest.mark.slow
def test_the_script_runs_a_same_commit_pair_end_to_end(tmp_path: Path) -> None:
    """Without a base: ab of HEAD against this checkout, one run, the comment written; its exit status is ab's
    (0, or 1 should this loaded machine make a false alarm of a one-repetition run)."""
    out = tmp_path / "out"
    env = {**os.environ, "KVB_CI_OUT": str(out), "KVB_CI_SKIP_GATE": "1", "KVB_CI_RUN_ARGS": TINY,
           "KVB_CI_AB_ARGS": "--no-counts", "PY": sys.executable}
    proc = subprocess.run([str(SCRIPT)], cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    assert proc.returncode in (0, 1), proc.stdout + proc.stderr
    comment = (out / "comment.md").read_text()
    assert comment.startswith("### kvblock-bench: ") and "- gate: left out" in comment
    assert "#### kvblock-bench ab:" in comment and "measured in one run, side by side" in comment
    assert ("passed" in comment.splitlines()[0]) is (proc.returncode == 0)
    assert "`flat` | batched | `seq_step_ns`" in comment
    folders = sorted(p.name for p in (out / "runs").glob("*-ab-*"))
    assert [f.rsplit("-", 1)[1] for f in folders] == ["base", "new"]


# -- the slowed plug-in ------------------------------------------------------------------------------------------
@pytest.fixture
def slowed(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.syspath_prepend(str(ROOT / "examples" / "slowed_flat"))
    import slowed_flat

    return slowed_flat


def test_the_slowed_plugin_maps_the_slots_again_as_often_as_asked(slowed, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []
    for passes, expected in (("0", 0), ("0.75", 3), ("2", 8)):
        monkeypatch.setenv(slowed.PASSES_ENV, passes)
        mgr = slowed.SlowedFlat(64, 16, 8, 8)
        monkeypatch.setattr(mgr.inner, "lookup", lambda ids, out: calls.append(len(ids)))
        ids, cow, slots = np.arange(4, dtype=np.int64), np.zeros((4, 2), np.int64), np.zeros(4, np.int64)
        for s in ids.tolist():
            mgr.allocate(s, 5)
        calls.clear()
        for _ in range(4):
            mgr.decode_step(ids, cow, slots)
        assert calls == [4] * expected, passes
    monkeypatch.setenv(slowed.PASSES_ENV, "lots")
    with pytest.raises(ValueError, match="KVB_SLOWED_FLAT_PASSES='lots'"):
        slowed.SlowedFlat(64)


def test_the_slowed_plugin_conforms_to_the_contract(slowed, monkeypatch: pytest.MonkeyPatch) -> None:
    from harness.conformance import check
    from impls.registry import contract_shape_problem

    monkeypatch.setenv(slowed.PASSES_ENV, "1")
    assert contract_shape_problem(slowed.SlowedFlat) == ""
    verdict = check(slowed.SlowedFlat, seeds=range(1), max_examples=25, step_count=20)
    assert verdict.ok, verdict


# -- the site workflow: the reference matrix on several runner kinds, merged, published ---------------------------
SITE_WORKFLOW = ROOT / "examples" / "ci" / "site-matrix.yml"


def _site_workflow() -> dict:
    import yaml

    return yaml.safe_load(SITE_WORKFLOW.read_text())


def test_the_site_workflow_measures_each_runner_kind_and_publishes_one_site() -> None:
    flow = _site_workflow()
    measure, site = flow["jobs"]["measure"], flow["jobs"]["site"]
    kinds = measure["strategy"]["matrix"]["runner"]
    assert len(kinds) >= 2 and measure["runs-on"] == "${{ matrix.runner }}"
    assert measure["strategy"]["fail-fast"] is False
    runs = [s.get("run", "") for s in measure["steps"]]
    assert any(r.startswith("make bench") for r in runs)  # the reference matrix, as a user runs it
    upload = next(s for s in measure["steps"] if str(s.get("uses", "")).startswith("actions/upload-artifact"))
    assert upload["with"]["name"] == "run-${{ matrix.runner }}"
    assert site["needs"] == "measure" and "cancelled()" in site["if"]
    assert site["permissions"] == {"pages": "write", "id-token": "write"}
    steps = {str(s.get("uses", "")).split("@")[0]: s for s in site["steps"] if "uses" in s}
    download = steps["actions/download-artifact"]["with"]
    assert download["pattern"] == "run-*" and download["merge-multiple"] is True
    build = next(s["run"] for s in site["steps"] if "kvblock-bench site" in s.get("run", ""))
    args = build_parser().parse_args(build.split()[1:])
    assert args.command == "site" and args.runs == [download["path"]]
    assert steps["actions/upload-pages-artifact"]["with"]["path"] == args.out
    assert "actions/deploy-pages" in steps and site["environment"]["name"] == "github-pages"


def test_the_site_workflows_build_step_merges_what_the_measure_jobs_upload(tmp_path: Path, monkeypatch) -> None:
    """The artifacts' layout as download-artifact merges them (runs/<runner kind>/<run>), then the workflow's own
    command: one site, every runner kind's run in it."""
    import shutil

    from harness.cli import main

    flow = _site_workflow()
    for kind in flow["jobs"]["measure"]["strategy"]["matrix"]["runner"]:
        shutil.copytree(ROOT / "results" / "sample", tmp_path / "runs" / kind, ignore=shutil.ignore_patterns("raw"))
    build = next(s["run"] for s in flow["jobs"]["site"]["steps"] if "kvblock-bench site" in s.get("run", ""))
    monkeypatch.chdir(tmp_path)
    assert main([*build.split()[1:], "--results", str(ROOT / "results")]) == 0
    index = (tmp_path / "build" / "site" / "index.html").read_text()
    assert all(f"<td>{kind}</td>" in index for kind in flow["jobs"]["measure"]["strategy"]["matrix"]["runner"])
