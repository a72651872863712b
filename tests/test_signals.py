"""Signals and children (issue 57, item 3): SIGINT and SIGTERM end every command, at any phase, with "interrupted"
(130) after removing what it made in temporary places; no process of ours outlives the one that started it; a
design's own signals (to its supervisor, to its process group) cost only its own cells."""

from __future__ import annotations

import importlib
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid
from pathlib import Path

import pytest

from harness import cli
from harness.base.rows import Row, write_rows
from tests.test_hostile_plugins import MARK, assert_none_left, processes_marked

ROOT = Path(__file__).resolve().parents[1]
SIGNALS = (signal.SIGTERM, signal.SIGINT)
pytestmark = pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="finds leftover processes in /proc")


def python(script: str, marker: str, **kwargs) -> subprocess.Popen:
    """``script`` in a Python process of its own (the repository on its path), marked for :func:`assert_none_left`."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), MARK: marker}
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(script)], cwd=ROOT, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kwargs)


# -- a design's signals ----------------------------------------------------------------------------------------
@pytest.mark.parametrize(("target", "name"), [("parent", "SIGTERM"), ("parent", "SIGINT"), ("group", "SIGINT")])
def test_a_design_signalling_its_supervisor_or_its_group_costs_only_its_cell(target: str, name: str) -> None:
    """The supervising process goes on, the cell the design was in is blamed with the signal, and nothing is left
    running."""
    marker = uuid.uuid4().hex
    proc = python(f"""
        from harness.run.workers import CellDied, Worker
        from tests.signal_plugins import signalling_job
        worker = Worker(signalling_job, 60)
        try:
            print("result:", worker.run(({target!r}, {name!r})))
        except CellDied as died:
            print("died:", died.cell, died.reason)
        worker.stop()
        print("the supervisor went on")
        """, marker)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, (proc.returncode, out, err)
    assert f"died: ('signals', 'batched') was stopped: its design sent {name} to the process supervising it" in out
    assert "the supervisor went on" in out and "Traceback" not in err
    assert_none_left(marker)


def test_a_supervisor_killed_outright_leaves_no_worker_and_no_resource_tracker() -> None:
    """SIGKILL (no clean-up possible) of a process whose worker hangs in a design: the worker, the process between
    them and multiprocessing's resource tracker end with it."""
    marker = uuid.uuid4().hex
    proc = python("""
        from harness.run.workers import Worker
        from tests.signal_plugins import hanging_job
        Worker(hanging_job, 600).run("hang")
        """, marker)
    deadline = time.monotonic() + 60
    while len(processes_marked(marker, tracker=True)) < 4 and time.monotonic() < deadline:  # itself, tracker, 2
        time.sleep(0.1)
    assert len(processes_marked(marker, tracker=True)) >= 4, "the worker never started"
    proc.kill()
    proc.communicate(timeout=30)
    assert_none_left(marker, tracker=True)


# -- every command, interrupted at a phase of its work ----------------------------------------------------------
@pytest.fixture
def sigterm_is_an_error():
    """SIGTERM that no command handles fails the test (instead of ending the test run)."""
    def unhandled(signum, frame):
        raise AssertionError("SIGTERM reached the test: the command did not handle it")

    previous = signal.signal(signal.SIGTERM, unhandled)
    yield
    signal.signal(signal.SIGTERM, previous)


def signal_at(monkeypatch: pytest.MonkeyPatch, target: str, sig: signal.Signals, check=None) -> None:
    """Replace ``target`` (``module.attr`` or ``module.Class.attr``) by a phase that first runs ``check`` (what
    must exist by then), then sends ``sig`` to this process and waits to be interrupted."""
    path = target.split(".")
    for split in range(len(path) - 1, 0, -1):
        try:
            owner = importlib.import_module(".".join(path[:split]))
            break
        except ModuleNotFoundError:
            continue
    for name in path[split:-1]:
        owner = getattr(owner, name)

    def phase(*args, **kwargs):
        if check is not None:
            check()
        os.kill(os.getpid(), sig)
        time.sleep(10)
        raise AssertionError(f"{sig.name} did not interrupt {target}")

    monkeypatch.setattr(owner, path[-1], phase)


@pytest.fixture
def run_folder(tmp_path: Path) -> Path:
    """A results folder with one small complete run, and its saved reports."""
    run = tmp_path / "results" / "20200101-000000"
    run.mkdir(parents=True)
    write_rows(run / "results.csv", [Row("paper", "flat", "batched", "seq_step_ns", 10.0, "ns", "rdtsc",
                                         ci_low=9.0, ci_high=11.0, reps=3)])
    (run / "meta.json").write_text('{"complete": true, "command_line": "kvblock-bench run", "cpu_model": "x"}')
    (run / "summary.md").write_text("saved\n")
    (run.parent / "latest").symlink_to(run.name)
    return run


def plugin_repo(tmp_path: Path) -> Path:
    """A git repository holding only a plug-in, with one commit (``kvblock-bench ab`` checks it out)."""
    repo = tmp_path / "mine"
    (repo / "mine").mkdir(parents=True)
    (repo / "mine" / "__init__.py").write_text("from tests.hostile_plugins import DictBlockManager as Manager\n")
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    for cmd in (["init", "-q"], ["add", "."], ["commit", "-qm", "mine"]):
        subprocess.run(git + cmd, check=True, capture_output=True)
    return repo


def worktrees(repo: Path) -> int:
    return len(subprocess.run(["git", "-C", str(repo), "worktree", "list"], capture_output=True, text=True,
                              check=True).stdout.splitlines())


GATE_TOML = "[tool.kvblock-bench.gate]\n"
P = "tests.hostile_plugins:"


def command_case(name: str, tmp: Path, run: Path, monkeypatch: pytest.MonkeyPatch, sig: signal.Signals):
    """(argv, phase interrupted, what must exist at that phase, what must hold afterwards) of one command."""
    results = str(run.parent)
    (tmp / "gate.toml").write_text(GATE_TOML)
    if name == "ab":
        repo = plugin_repo(tmp)
        monkeypatch.chdir(repo)
        return (["ab", "HEAD", "--impl", "mine:Manager", "--results", str(tmp / "r")], "harness.ci.ab.run_ab",
                lambda: worktrees(repo) == 2 or pytest.fail("no worktree at the phase"),
                lambda: worktrees(repo) == 1 or pytest.fail("a worktree is left"))
    cases = {
        "scenarios": (["scenarios"], "harness.cli.cmd_scenarios"),
        "trace": (["trace", "paper", "-o", str(tmp / "t.npz")], "scenarios.generate"),
        "run": (["run", "--impl", f"flat,{P}Spy", "--scenario", "paper", "--quick", "--no-progress", "--results",
                 str(tmp / "r")], "harness.run.runner.check_plugins"),
        "report": (["report", "--results", results, "--no-figures"], "harness.output.report.write_reports"),
        "compare": (["compare", str(run), str(run)], "harness.output.compare.compare_runs"),
        "gate": (["gate", "--config", str(tmp / "gate.toml"), "--impl", f"{P}Spy", "--no-callgrind"],
                 "harness.gate.command._allocations"),
        "check": (["check", f"{P}Spy"], "harness.run.jobs.CheckJob"),
        "calibrate": (["calibrate", "nano-vllm", "--source", str(tmp), "--out", str(tmp / "c.csv")],
                      "harness.calibration.run.engine_code"),
        "history": (["history", "vllm", "0.1.0", "--out", str(tmp / "h")], "harness.history.measure.check"),
        "baseline": (["baseline", str(run), str(tmp / "base")], "shutil.copy2"),
        "table-copy": (["table-copy", "--out", str(tmp / "tc"), "--scenarios", "paper"],
                       "harness.studies.table_copy.measurement.measure"),
    }
    argv, phase = cases[name]
    if name == "scenarios":
        monkeypatch.setitem(cli.COMMANDS, "scenarios", lambda args: os.kill(os.getpid(), sig) or time.sleep(10))
        phase = ""
    return argv, phase, None, lambda: None


COMMANDS = ("scenarios", "trace", "run", "report", "compare", "ab", "gate", "check", "calibrate", "history",
            "baseline", "table-copy")


@pytest.mark.parametrize("sig", SIGNALS, ids=lambda s: s.name)
@pytest.mark.parametrize("command", [pytest.param(c, marks=pytest.mark.slow) if c == "gate" else c for c in COMMANDS])
def test_every_command_interrupted_at_work_says_so_and_leaves_nothing_behind(
        command: str, sig: signal.Signals, tmp_path: Path, run_folder: Path, monkeypatch: pytest.MonkeyPatch,
        capfd, sigterm_is_an_error) -> None:
    """Exit 130, "interrupted" as the last line, no traceback; the command's temporary folder gone (and ab's
    worktrees with git's record of them), no process of the command left; saved reports and results untouched."""
    marker = uuid.uuid4().hex
    monkeypatch.setenv(MARK, marker)
    temp = tmp_path / "tmp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    monkeypatch.setenv("TMPDIR", str(temp))
    argv, phase, at_phase, after = command_case(command, tmp_path, run_folder, monkeypatch, sig)
    if phase:
        signal_at(monkeypatch, phase, sig, at_phase)
    status = cli.main(argv)
    out, err = capfd.readouterr()
    assert status == cli.EXIT_INTERRUPTED, (status, out[-2000:], err[-2000:])
    assert err.strip().splitlines()[-1] == "kvblock-bench: interrupted" and "Traceback" not in err, err[-2000:]
    assert list(temp.iterdir()) == [], list(temp.rglob("*"))
    after()
    assert (run_folder / "summary.md").read_text() == "saved\n"
    assert not (tmp_path / "t.npz").exists() and not (tmp_path / "tc").exists()
    assert not (tmp_path / "base").exists() and not list(tmp_path.glob(".base.*"))
    assert_none_left(marker)


def test_a_second_signal_waits_for_the_clean_up(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd,
                                                sigterm_is_an_error) -> None:
    """Ctrl-C pressed again (or timeout's SIGTERM to the whole group) while the first interruption's clean-up runs
    does not cut it short: the worker is still stopped and the temporary folder still removed."""
    from harness.run import workers

    marker = uuid.uuid4().hex
    monkeypatch.setenv(MARK, marker)
    temp = tmp_path / "tmp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    stop = workers.Worker.stop

    def stop_interrupted(self):
        os.kill(os.getpid(), signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.2)
        stop(self)

    monkeypatch.setattr(workers.Worker, "stop", stop_interrupted)
    signal_at(monkeypatch, "harness.run.jobs.CheckJob", signal.SIGINT)
    assert cli.main(["check", f"{P}Spy"]) == cli.EXIT_INTERRUPTED
    assert capfd.readouterr().err.strip().splitlines()[-1] == "kvblock-bench: interrupted"
    assert list(temp.iterdir()) == []
    assert_none_left(marker)


@pytest.mark.slow  # starts the gate as a process of its own and waits for `timeout` (about 20 s)
def test_timeout_killing_the_gate_over_a_hanging_plugin_leaves_nothing(tmp_path: Path) -> None:
    """`timeout` sends SIGTERM to the gate while a plug-in hangs in its worker: "interrupted", and no process
    of the gate (worker, resource tracker) lives on."""
    marker = uuid.uuid4().hex
    config = tmp_path / "gate.toml"
    config.write_text(GATE_TOML)
    env = {**os.environ, "PYTHONPATH": str(ROOT), MARK: marker, "TMPDIR": str(tmp_path)}
    proc = subprocess.run(["timeout", "-s", "TERM", "20", sys.executable, "-m", "harness.cli", "gate", "--impl",
                           "tests.signal_plugins:HangsAtOnce", "--config", str(config), "--no-callgrind",
                           "--deadline", "600"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 124 and proc.stderr.strip().splitlines()[-1] == "kvblock-bench: interrupted", proc.stderr
    assert_none_left(marker, tracker=True)
    assert [p.name for p in tmp_path.iterdir()] == ["gate.toml"]
