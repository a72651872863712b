"""``kvblock-bench ab``: a worker of another code root imports that root's designs under this checkout's harness;
the two versions take turns slice by slice, A B then B A; NEW/BASE paired slice by slice cancels a change of
load that a comparison of separate runs cannot; the gate's counts see the run's environment; bad refs and places
are refused in one line; end to end on HEAD against the working tree and against itself (slow)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from harness.base import coderoot
from harness.base.metrics import Work
from harness.base.stats import independent_ratio, ratio_of_sums
from harness.base.steptimes import StepTimes
from harness.cli import main
from harness.output.compare import Counted
from harness.run.assemble import Merged, paired_sides
from harness.run.jobs import ProbeJob, execute
from harness.run.lockstep import alternating
from harness.run.workers import Worker, WorkerSpec

ROOT = Path(__file__).resolve().parents[1]
TINY = ["--quick", "--scenario", "paper", "--impl", "flat", "--regime", "batched", "--no-progress"]


# -- code roots -------------------------------------------------------------------------------------------------
def test_code_forms_and_paths_moved_into_the_root(tmp_path: Path) -> None:
    assert coderoot.check("") == "" and coderoot.check(str(tmp_path)) == str(tmp_path)
    for bad in ("relative/path", str(tmp_path / "missing"), "engine:vllm"):
        with pytest.raises(ValueError, match=r"give '' \(this checkout\) or the absolute path"):
            coderoot.check(bad)
    repo, root = tmp_path / "repo", tmp_path / "root"
    (root / "examples" / "x").mkdir(parents=True)
    venv = repo / ".venv" / "lib" / "site-packages"  # in the checkout, not in the worktree: it stays
    venv.mkdir(parents=True)
    assert coderoot.moved(str(repo / "examples" / "x"), repo, root) == str(root / "examples" / "x")
    assert coderoot.moved(str(repo), repo, root) == str(root)
    assert coderoot.moved(str(venv), repo, root) == str(venv)
    assert coderoot.moved("/usr/lib/python3", repo, root) == "/usr/lib/python3"


def test_a_process_started_in_a_code_root_takes_the_roots_modules_and_this_harness(tmp_path: Path) -> None:
    """``coderoot.py ROOT REPO MODULE``: a package the repository holds comes from the root, the harness from this
    checkout, whatever PYTHONPATH says."""
    repo, root = tmp_path / "repo", tmp_path / "root"
    for where in (repo, root):
        (where / "mypkg").mkdir(parents=True)
        (where / "mypkg" / "__init__.py").write_text(f"WHERE = {where.name!r}\n")
        (where / "mypkg" / "show.py").write_text(
            "import harness, mypkg\nprint(mypkg.WHERE, harness.__file__)\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(repo), str(ROOT)])}
    proc = subprocess.run([sys.executable, str(Path(coderoot.__file__)), str(root), str(repo), "mypkg.show"],
                          env=env, capture_output=True, text=True, check=True)
    where, harness_file = proc.stdout.split()
    assert where == "root" and Path(harness_file).resolve() == ROOT / "harness" / "__init__.py"


def _version_of_this_checkout(root: Path) -> Path:
    """A copy of this checkout's code (harness, designs, scenarios, the slowed plug-in) at ``root``: another
    version of the repository, as a worktree of another commit would be."""
    for name in ("harness", "impls", "scenarios", "examples"):
        shutil.copytree(ROOT / name, root / name, ignore=shutil.ignore_patterns("__pycache__", "*.npz"))
    return root


def test_a_worker_of_another_version_of_this_checkout_runs_that_versions_designs_and_harness(tmp_path: Path) -> None:
    """A version whose flat raises at import and whose harness marks what it describes: a worker of that root cannot
    load flat, nor a plug-in inside the repository that wraps it, and describes dict with its own harness, from its
    own files; a worker of this checkout loads both."""
    root = _version_of_this_checkout(tmp_path / "root")
    with (root / "impls" / "designs" / "flat.py").open("a") as source:
        source.write("\nraise RuntimeError('the flat of the code root')\n")
    with (root / "harness" / "run" / "jobs.py").open("a") as source:
        source.write("\n_described = describe\n\n\ndef describe(name, cls):\n    info = _described(name, cls)\n"
                     "    info.described += ' [the root harness]'\n    return info\n")
    sys.path.insert(0, str(ROOT / "examples" / "slowed_flat"))  # the workers start with this process's path
    try:
        for code, loads in (("", True), (str(root), False)):
            worker = Worker(execute, 60, code)
            try:
                for name in ("flat", "slowed_flat:SlowedFlat"):
                    info = worker.run(ProbeJob(name))
                    assert info.ok is loads, (code, name, info.reason)
                    assert loads or ("the flat of the code root" in info.reason and info.import_failed)
                info = worker.run(ProbeJob("dict"))
                assert info.ok and Path(info.source).is_relative_to(Path(code or ROOT).resolve()), info.source
                assert info.described.endswith("[the root harness]") is (not loads)
            finally:
                worker.stop()
    finally:
        sys.path.remove(str(ROOT / "examples" / "slowed_flat"))


# -- the order and the pairing ------------------------------------------------------------------------------------
def test_each_implementations_two_versions_go_side_by_side_their_order_swapped_each_turn() -> None:
    order = alternating(["/base", ""])
    ready = [WorkerSpec(i, 0, c) for i in ("a", "b", "c") for c in ("", "/base")]
    turns = [order(ready, turn) for turn in range(400)]
    for got in turns:
        assert sorted(got, key=str) == sorted(ready, key=str)
        assert all(got[k].impl == got[k + 1].impl for k in range(0, len(got), 2))  # side by side
    for even, odd in zip(turns[::2], turns[1::2], strict=True):
        firsts = {s.impl: s.code for s in even[::2]}
        assert all(firsts[s.impl] != s.code for s in odd[::2])  # the next turn swaps which goes first
    assert [s.code for s in alternating(["/base", ""])(ready, 0)] == [s.code for s in turns[0]]  # the same run
    assert order(ready[:1], 1) == ready[:1]  # a version alone (the other failed or lacks the implementation)


def test_no_version_always_follows_the_same_slice() -> None:
    """A version that always ran after its own other slice (or never after another implementation's) carried a
    cache or scheduling state the other version never had: a systematic NEW/BASE of code that did not change."""
    for impls in (("a", "b"), ("a", "b", "c")):
        order = alternating(["/base", ""])
        ready = [WorkerSpec(i, 0, c) for i in impls for c in ("", "/base")]
        flat = [spec for turn in range(2000) for spec in order(ready, turn)]
        for impl in impls:
            after_own_impl = {}
            for code in ("", "/base"):
                mine = [k for k in range(1, len(flat)) if flat[k].impl == impl and flat[k].code == code]
                after_own_impl[code] = sum(flat[k - 1].impl == impl for k in mine) / len(mine)
            assert abs(after_own_impl[""] - after_own_impl["/base"]) < 0.05, (impls, impl, after_own_impl)


def _samples(level: np.ndarray, slowdown: float, rng: np.random.Generator) -> list[StepTimes]:
    """Per repetition, per-step times: the machine's load (``level``, shared by both versions at each step), the
    version's own cost and a little noise of its own."""
    steps = level.shape[1]
    out = []
    for per_step in level * slowdown * np.exp(rng.normal(0, 0.02, size=level.shape)):
        out.append(StepTimes(np.zeros((steps, 5)), np.zeros(steps, dtype=np.int64), 1000.0 * per_step, 1.0, "tsc"))
    return out


def test_pairing_slice_by_slice_cancels_a_load_that_drifts_between_slices() -> None:
    """The load drifts by up to 2x from slice to slice, the same for both versions at each slice (they replay it
    one right after the other): NEW/BASE paired holds 1 narrowly for the same code and catches 15 %. The same code
    run apart, under a load a quarter higher on average, reads slower beyond 10 %: the intervals made inside each
    run cannot see the change between them."""
    rng = np.random.default_rng(3)
    slices = [(i, i + 20) for i in range(0, 400, 20)]

    def load(scale: float = 1.0) -> np.ndarray:
        return scale * np.repeat(np.exp(rng.uniform(0, np.log(2), size=(3, 20))), 20, axis=1)

    work, shared = Work.uniform(400, 256), load()
    base = Merged(steps={("x", "batched", ""): _samples(shared, 1.0, rng)})
    for slowdown, verdict_ok in ((1.0, lambda e: e.low < 1 < e.high and e.high / e.low < 1.05),
                                 (1.15, lambda e: e.low > 1.1)):
        new = Merged(steps={("x", "batched", ""): _samples(shared, slowdown, rng)})
        est = paired_sides("paper", work, slices, base, new)[("paper", "x", "batched", "seq_step_ns")]
        assert verdict_ok(est), (slowdown, est)
    apart = Merged(steps={("x", "batched", ""): _samples(load(1.25), 1.0, rng)})
    assert independent_ratio(*(ratio_of_sums(*_blocks(m, work, slices)) for m in (apart, base))).low > 1.1


def _blocks(merged: Merged, work: Work, slices):
    from harness.base.metrics import cell_blocks

    samples = merged.steps[("x", "batched", "")]
    return cell_blocks(work, samples, samples, slices)["seq_step_ns"]


# -- the counts beside ---------------------------------------------------------------------------------------------
def test_the_counts_note_says_more_work_beyond_the_tolerance_only() -> None:
    assert Counted("x", "batched", (100.0, 112.0), (0.0, 0.0)).words(1.0) == "more work: +12.0 % instructions"
    assert Counted("x", "batched", (100.0, 100.4), (0.0, 0.0)).words(1.0) == ""
    assert Counted("x", "batched", (100.0, 90.0), (0.0, 2.0)).words(1.0) == (
        "less work: -10.0 % instructions; allocations per step 0 -> 2")
    assert Counted("x", "batched", (None, 90.0), (None, 2.0)).words(1.0) == ""


def test_callgrind_sees_the_runs_environment_but_what_it_must_pin(monkeypatch: pytest.MonkeyPatch,
                                                                 tmp_path: Path) -> None:
    from harness.counters import callgrind

    monkeypatch.setenv("KVB_A_DESIGNS_SETTING", "7")
    monkeypatch.setenv("PYTHONHASHSEED", "123")
    env = callgrind.environment(tmp_path)
    assert env["KVB_A_DESIGNS_SETTING"] == "7" and env["PYTHONHASHSEED"] == "0"
    said = callgrind.environment_differences(env)
    assert "PYTHONHASHSEED=0 (the run: 123)" in said and not any("KVB_A_DESIGNS_SETTING" in s for s in said)


# -- the command line ----------------------------------------------------------------------------------------------
def run_ab(capsys, *argv: str) -> tuple[int, str, str]:
    status = main(["ab", *argv])
    out, err = capsys.readouterr()
    return status, out, err


@pytest.mark.parametrize("argv", [
    ["no-such-ref-anywhere", *TINY], ["HEAD", "no-such-ref-either", *TINY], ["HEAD", "--sweep", "pool"],
    ["HEAD", "--threshold", "-1"], ["HEAD", "--impl", "flat", "--reps", "0"],
])
def test_bad_input_is_one_line_and_exit_2(tmp_path: Path, capsys, argv: list[str]) -> None:
    status, out, err = run_ab(capsys, *argv, "--results", str(tmp_path))
    assert status == 2 and not out and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert not list(tmp_path.glob("*-ab-*"))


def test_outside_a_git_checkout_it_says_where_to_run_it(tmp_path: Path, capsys,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    status, _, err = run_ab(capsys, "HEAD", *TINY, "--results", str(tmp_path / "r"))
    assert status == 2 and "not inside a git checkout" in err


@pytest.mark.slow
def test_ab_of_head_against_the_working_tree_end_to_end(tmp_path: Path, capsys) -> None:
    """Both versions in one run: two run folders with their commits, the paired comparison in NEW's, the
    headline saying so; compare of the two folders gives the same rows (it reads ab.json)."""
    before = ab_worktrees()  # another checkout of this repository may run an ab of its own meanwhile
    status, out, err = run_ab(capsys, "HEAD", *TINY, "--no-counts", "--results", str(tmp_path), "--format", "json")
    assert status in (0, 1), err  # 1 should this loaded machine make a false alarm of a one-repetition run
    doc = json.loads(out)
    assert doc["interleaved"] and doc["counts"]["not comparable"] == 0 and len(doc["rows"]) == 3
    base, new = (Path(doc[side]["path"]) for side in ("base", "new"))
    assert base.name.endswith("-ab-base") and new.name.endswith("-ab-new") and (tmp_path / "latest").resolve() == new
    metas = [json.loads((folder / "meta.json").read_text()) for folder in (base, new)]
    head = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                          check=True).stdout.strip()
    assert metas[0]["git_commit"] == head and metas[1]["git_commit"].startswith(head)
    assert metas[0]["ab"]["side"] == "BASE" and metas[1]["ab"]["other"]["commit"] == head
    assert {p.name for p in new.iterdir()} >= {"ab.json", "compare.txt", "compare.md", "compare.json"}
    assert json.loads((new / "compare.json").read_text())["rows"] == doc["rows"]
    assert main(["compare", str(base), str(new), "--format", "json"]) == status
    again = json.loads(capsys.readouterr().out)
    assert again["interleaved"] and [r["ci_low"] for r in again["rows"]] == [r["ci_low"] for r in doc["rows"]]
    assert ab_worktrees() <= before  # this run's temporary checkouts are gone


def ab_worktrees() -> set[str]:
    """The temporary checkouts of ``ab`` that git lists for this repository (every checkout of it shares them)."""
    listed = subprocess.run(["git", "worktree", "list"], cwd=ROOT, capture_output=True, text=True).stdout
    return {line.split()[0] for line in listed.splitlines() if "kvblock-bench-ab-" in line}


@pytest.mark.slow
def test_ab_of_a_commit_against_itself_with_the_counts(tmp_path: Path, capsys) -> None:
    """HEAD against HEAD, both checked out: same code, so the gate's counts agree within its tolerance and no row
    says more work."""
    status, out, err = run_ab(capsys, "HEAD", "HEAD", *TINY, "--results", str(tmp_path))
    assert status in (0, 1), err
    assert "deterministic counts" in out and "flat  batched" in out and "more work" not in out
    assert "callgrind's environment: the run's, except" in out and "PYTHONHASHSEED=0" in out
