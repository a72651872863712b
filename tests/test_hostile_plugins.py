"""Hostile plug-ins (issue 27, items 1 and 2), loaded with ``--impl`` through the real command line.

A plug-in that writes into its inputs, raises outside the contract, exits, hangs, crashes, raises a 200 KB
message or answers an absurd ``table_nbytes`` costs only its own cells: each is recorded ``failed`` with a
one-line reason, the other cells (``flat``, ``list`` and a spy that records what it was handed) are measured and
saved, the run exits with 3, no traceback shows, and no process of the run is left behind. ``check`` gives each a
verdict and a non-zero status. A plug-in that cannot even be loaded (an exception, a SyntaxError, an exit, a
crash or a hang at import) is refused in one line before anything is measured (exit 2), as bad input is.
The plug-ins are real classes: ``tests/hostile_plugins.py``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from harness import cli
from harness.base.failures import REASON_CHARS, blamed_on, short_reason
from harness.base.rows import read_rows
from harness.errors import DesignFailure
from impls.contract import table_nbytes_problem
from scenarios import load
from tests.hostile_plugins import HUGE, SPY_LOG, expected, ids_digest, spy_config

ROOT = Path(__file__).resolve().parents[1]
P = "tests.hostile_plugins:"
MARK = "KVB_HOSTILE_RUN"  # every process a command starts inherits it: how leftovers are found
QUICK_RUN = ["--scenario", "paper", "--quick", "--no-l1d", "--no-paced", "--no-table-copy", "--processes", "1",
             "--no-progress"]
GOOD = ("flat", "list", P + "Spy")

pytestmark = pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="finds leftover processes in /proc")


# -- helpers ----------------------------------------------------------------------------------------------------
def processes_marked(marker: str, tracker: bool) -> list[int]:
    """Live processes whose environment holds ``MARK=marker`` (without multiprocessing's resource tracker unless
    ``tracker``: the one a test's own process starts lives as long as that process)."""
    found, needle = [], f"{MARK}={marker}".encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            marked = needle in (entry / "environ").read_bytes().split(b"\0")
            if marked and (tracker or b"resource_tracker" not in (entry / "cmdline").read_bytes()):
                found.append(int(entry.name))
        except OSError:  # gone, or not ours
            continue
    return found


def assert_none_left(marker: str, tracker: bool = False) -> None:
    """No process started under ``marker`` still runs (a moment's grace for the ones being reaped); with
    ``tracker``, multiprocessing's resource tracker included (a command run as a process of its own)."""
    deadline = time.monotonic() + 10
    while (left := processes_marked(marker, tracker)) and time.monotonic() < deadline:
        time.sleep(0.1)
    details = subprocess.run(["ps", "-o", "pid,args", "-p", ",".join(map(str, left))], capture_output=True,
                             text=True, check=False).stdout if left else ""
    assert not left, f"processes left running: {details}"


def kvb(*args: str, env: dict[str, str] | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    """``python -m harness.cli ARGS`` from the repository root; asserts afterwards that it left no process."""
    marker = uuid.uuid4().hex
    proc = subprocess.run([sys.executable, "-m", "harness.cli", *args], capture_output=True, text=True, cwd=ROOT,
                          timeout=timeout, check=False, env={**os.environ, **(env or {}), MARK: marker,
                                                             "PYTHONPATH": str(ROOT)})
    assert_none_left(marker, tracker=True)
    return proc


@dataclass
class Run:
    proc: subprocess.CompletedProcess
    run_dir: Path
    rows: list
    regimes: set[str]

    def failed(self, impl: str) -> dict[str, str]:
        """regime -> reason, for each cell of ``impl`` recorded as failed."""
        return {r.regime: r.how for r in self.rows if r.impl == impl and r.metric == "correctness"
                and r.status == "failed"}

    def measured(self, impl: str) -> set[str]:
        """The regimes in which ``impl``'s time per sequence-step was measured and saved."""
        return {r.regime for r in self.rows if r.impl == impl and r.metric == "seq_step_ns" and r.status == "ok"}


ALL_REGIMES = ("per-call", "batched", "step")


def run_with(tmp: Path, *plugins: str, regimes: tuple[str, ...] = ALL_REGIMES, extra: tuple[str, ...] = (),
             env: dict[str, str] | None = None) -> Run:
    """A quick ``paper`` run of the good designs and ``plugins``."""
    impls = ",".join([*GOOD, *(P + p for p in plugins)])
    proc = kvb("run", "--impl", impls, "--regime", ",".join(regimes), *QUICK_RUN, "--results", str(tmp), *extra,
               env=env)
    return Run(proc, (tmp / "latest").resolve(), read_rows(tmp / "latest" / "results.csv"), set(regimes))


def assert_cells_fail_alone(run: Run, cases: dict[str, tuple[str, set[str]]]) -> None:
    """Each plug-in of ``cases`` failed in (at least) the regimes given, each reason holding the words given and
    fitting one line, its other cells measured; the good designs measured in every regime and saved; exit 3,
    one stderr line per failed cell, no traceback. A cell that failed only in the studies keeps its timings (they
    passed their trace checks); any other failed cell has none."""
    err = run.proc.stderr
    assert run.proc.returncode == cli.EXIT_FAILED_CELLS, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    assert all(line.startswith("kvblock-bench: paper ") and " failed: " in line for line in err.splitlines()), err
    for impl in GOOD:
        assert run.measured(impl) == run.regimes and not run.failed(impl), impl
        assert any(r.impl == impl and r.metric == "seq_step_ns_vs_flat" for r in run.rows) or impl == "flat"
    for plugin, (words, regimes) in cases.items():
        failed = run.failed(P + plugin)
        assert regimes <= set(failed), (plugin, failed)
        for regime, reason in failed.items():
            assert words in reason and "\n" not in reason and len(reason) <= REASON_CHARS, (plugin, reason)
            assert (regime in run.measured(P + plugin)) == reason.startswith("in the studies: "), (plugin, regime)
            assert f"paper {P}{plugin} {regime} failed: " in err
        assert run.measured(P + plugin) | set(failed) == run.regimes, plugin
    meta = json.loads((run.run_dir / "meta.json").read_text())
    assert meta["complete"] is True


# -- item 1 and 2: failures inside the worker (one run, every plug-in beside the others) ---------------------
IN_PROCESS = expected("FillsIdsInDecode", "ReversesIdsInDecode", "FillsIdsInLookup", "ReversesIdsInLookup",
                      "RaisesInConstructor", "AttributeErrorInCall", "IndexErrorInCall", "RaisesBaseException",
                      "RaisesKeyboardInterrupt", "ExitsInDecode", "HugeMessage", "AbsurdTableBytes")


@pytest.fixture(scope="module")
def in_process_run(tmp_path_factory: pytest.TempPathFactory) -> Run:
    tmp = tmp_path_factory.mktemp("in-process")
    return run_with(tmp, *IN_PROCESS, env={SPY_LOG: str(tmp / "spy.log")})


@pytest.mark.slow  # an end-to-end CLI run (make test-slow, .ci/run)
def test_failing_plugins_cost_only_their_own_cells(in_process_run: Run) -> None:
    assert_cells_fail_alone(in_process_run, IN_PROCESS)


@pytest.mark.slow  # on the module's end-to-end CLI run (make test-slow, .ci/run)
def test_the_others_replay_exactly_their_workload_beside_plugins_writing_into_theirs(in_process_run: Run) -> None:
    """The spy, measured beside four plug-ins that overwrite or reverse their ids, was handed every step's ids
    exactly as the trace has them, in every call and every replay."""
    root = in_process_run.run_dir.parent
    (trace_file,) = (root / ".trace-cache").glob("paper-*.npz")
    trace = load(trace_file)
    expected = [ids_digest(trace.a0[trace.decode_offsets[s]:trace.step_offsets[s + 1]]) for s in range(trace.num_steps)]
    config = spy_config(**trace.config)  # the managers built for the trace (the quick contract check builds others)
    calls = [line.split()[:3] for line in (root / "spy.log").read_text().splitlines() if line.split()[3] == config]
    assert sum(call == "decode_step" for call, _, _ in calls) >= trace.num_steps  # a whole replay, at least
    assert {call for call, _, _ in calls} == {"decode_step", "lookup"}
    wrong = [(call, step) for call, step, digest in calls if digest != expected[int(step)]]
    assert not wrong, f"the spy was handed other ids than the trace's: {wrong[:5]}"


@pytest.mark.slow  # on the module's end-to-end CLI run (make test-slow, .ci/run)
def test_a_huge_exception_message_leaves_results_csv_readable_and_report_working(in_process_run: Run) -> None:
    (reason,) = {r.how for r in in_process_run.rows if r.impl == P + "HugeMessage" and r.status == "failed"}
    assert len(reason) <= REASON_CHARS < HUGE
    report = kvb("report", "--results", str(in_process_run.run_dir.parent), "--no-figures")
    assert report.returncode == 0 and "Traceback" not in report.stderr, report.stderr[-2000:]


# -- item 2: workers that die or hang -------------------------------------------------------------------------
DYING = expected("OsExitInCall", "SegfaultsInCall", "CrashesInStudies", "FailsInStudies", "SignalsItsSupervisor",
                 "InterruptsItsGroup")


@pytest.mark.slow  # an end-to-end CLI run (make test-slow, .ci/run)
def test_plugins_that_crash_or_exit_their_worker_cost_only_their_own_cells(tmp_path: Path) -> None:
    """Workers killed by a segfault or ``os._exit`` in a call, in the timed replays or in the studies, or stopped
    because their design signalled its supervisor or its own group: those cells fail naming the signal or the
    status, the others are measured and saved (allocation counts included), and the run goes on to its end."""
    run = run_with(tmp_path, *DYING, regimes=("per-call", "batched"))
    assert_cells_fail_alone(run, DYING)
    counted = {r.impl for r in run.rows if r.metric == "allocs_per_step" and r.status == "ok"}
    assert set(GOOD) <= counted


@pytest.mark.slow  # an end-to-end CLI run (make test-slow, .ci/run)
def test_a_hanging_plugin_is_killed_at_the_deadline_and_costs_only_its_cells(in_process_run: Run,
                                                                            tmp_path: Path) -> None:
    """An endless loop in decode_step: killed after --deadline seconds of silence, its cells failed saying so.
    (After the first run, so that the compiled designs load from the Numba cache well within the deadline.)"""
    t0 = time.monotonic()
    run = run_with(tmp_path, "HangsInDecode", regimes=("per-call", "batched"), extra=("--deadline", "5"))
    assert_cells_fail_alone(run, {"HangsInDecode": ("made no progress for 5 s (the deadline) and was killed",
                                                    {"batched"})})
    assert time.monotonic() - t0 < 120


# -- plug-ins that cannot be loaded: refused in one line before anything is measured -------------------------
AT_IMPORT = {  # module source -> words of the one-line refusal
    "raises": ("raise RuntimeError('broken at import')\n", "RuntimeError: broken at import"),
    "syntax": ("def broken(:\n    pass\n", "SyntaxError"),
    "exits": ("import sys\nsys.exit(0)\n", "SystemExit: 0"),
    "interrupts": ("raise KeyboardInterrupt\n", "KeyboardInterrupt"),
    "os_exit": ("import os\nos._exit(0)\n", "exited with status 0"),
    "segfault": ("import ctypes\nctypes.string_at(0)\n", "killed by signal SIGSEGV"),
    "hangs": ("while True:\n    pass\n", "made no progress for 3 s"),
}


def write_module(folder: Path, case: str) -> str:
    name = f"hostile_import_{case}_{uuid.uuid4().hex[:8]}"
    (folder / f"{name}.py").write_text(AT_IMPORT[case][0])
    return f"{name}:Manager"


@pytest.mark.parametrize("case", [pytest.param(c, marks=pytest.mark.slow) if c == "hangs" else c for c in AT_IMPORT])
def test_a_plugin_failing_at_import_is_refused_in_one_line(case: str, tmp_path: Path, monkeypatch, capfd) -> None:
    """``run`` and ``check``: exit 2, one line naming the plug-in and why, no traceback, no run folder, and the
    import never runs in the main process."""
    monkeypatch.syspath_prepend(str(tmp_path))  # the workers inherit sys.path
    marker = uuid.uuid4().hex
    monkeypatch.setenv(MARK, marker)
    spec = write_module(tmp_path, case)
    results = tmp_path / "results"
    for args in (["run", "--impl", f"flat,{spec}", *QUICK_RUN, "--results", str(results), "--deadline", "3"],
                 ["check", spec, "--seeds", "1", "--examples", "5", "--deadline", "3"]):
        status = cli.main(args)
        out, err = capfd.readouterr()
        words = AT_IMPORT[case][1]
        assert "Traceback" not in out + err and "verdict: CONFORMS" not in out
        if args[0] == "check" and status == 1:  # the checking process died loading it: a verdict says so
            assert "verdict: DOES NOT CONFORM" in out and words in out, out
        else:
            assert status == cli.EXIT_USAGE, (args[0], status, out, err)
            (line,) = err.strip().splitlines()
            assert line.startswith("kvblock-bench: error: ") and spec.split(":")[0] in line and words in line, line
    assert spec.split(":")[0] not in sys.modules
    assert not (results / "latest").exists()
    assert_none_left(marker)


# -- kvblock-bench check: a verdict for every hostile plug-in -------------------------------------------------
CHECKED = {  # plug-in -> words of the verdict
    "FillsIdsInDecode": ("decode_step", "wrote into its inputs"),
    "ReversesIdsInDecode": ("decode_step", "wrote into its inputs"),
    "FillsIdsInLookup": ("lookup", "wrote into its inputs"),
    "ReversesIdsInLookup": ("lookup", "wrote into its inputs"),
    "RaisesInConstructor": ("RuntimeError", "needs a GPU"),
    "AttributeErrorInCall": ("AttributeError",),
    "IndexErrorInCall": ("IndexError",),
    "RaisesBaseException": ("FAILS: PluginAbort: giving up",),
    "RaisesKeyboardInterrupt": ("FAILS: KeyboardInterrupt",),
    "ExitsInDecode": ("FAILS: SystemExit: 0",),
    "OsExitInCall": ("the checking process exited with status 0",),
    "SegfaultsInCall": ("the checking process was killed by signal SIGSEGV",),
    "HangsInDecode": ("made no progress for 5 s",),
    "HugeMessage": ("RuntimeError(", '"long", story'),
    "AbsurdTableBytes": ("table_nbytes returned 1e+20",),
}


@pytest.mark.parametrize("plugin", [pytest.param(p, marks=pytest.mark.slow) if p == "HangsInDecode" else p
                                    for p in CHECKED])
def test_check_gives_every_hostile_plugin_a_verdict(plugin: str, monkeypatch, capfd) -> None:
    """Exit 1 with DOES NOT CONFORM and the reason, never 0 and never a traceback (few examples on purpose: the
    input probe and the first calls find every one of them)."""
    marker = uuid.uuid4().hex
    monkeypatch.setenv(MARK, marker)
    deadline = ["--deadline", "5"] if plugin == "HangsInDecode" else []  # a check sends no word until its verdict
    status = cli.main(["check", P + plugin, "--seeds", "1", "--examples", "10", "--ops", "15", *deadline])
    out, err = capfd.readouterr()
    assert status == 1, out[-3000:] + err[-3000:]
    assert out.rstrip().endswith("verdict: DOES NOT CONFORM"), out[-3000:]
    assert all(words in out for words in CHECKED[plugin]), out[-3000:]
    assert "Traceback" not in out + err and len(out) < 30_000  # a 200 KB message is cut
    assert_none_left(marker)


def test_check_still_passes_a_design_that_behaves(monkeypatch, capfd) -> None:
    assert cli.main(["check", P + "Spy", "--seeds", "1", "--examples", "10", "--ops", "15"]) == 0
    assert capfd.readouterr().out.rstrip().endswith("verdict: CONFORMS")


# -- Ctrl-C while a plug-in hangs in a worker -----------------------------------------------------------------
@pytest.mark.slow  # an end-to-end CLI run (make test-slow, .ci/run)
def test_ctrl_c_while_a_plugin_hangs_in_a_worker_is_an_interruption_and_leaves_no_process(tmp_path: Path) -> None:
    """SIGINT while the worker is stuck in a plug-in's endless loop (the worker ignores SIGINT): exit 130,
    "interrupted", the scenario finished before kept, and the worker killed, not left spinning."""
    marker, flag = uuid.uuid4().hex, tmp_path / "hang-now"
    env = {**os.environ, MARK: marker, "PYTHONPATH": str(ROOT), "KVB_HANG_FLAG": str(flag)}
    proc = subprocess.Popen([sys.executable, "-m", "harness.cli", "run", "--impl", f"dict,{P}HangsWhenFlagged",
                             "--scenario", "long-context,paper", "--quick", "--no-progress", "--results",
                             str(tmp_path)], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    deadline = time.monotonic() + 240
    while not list(tmp_path.glob("*/results.csv")) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    flag.write_text("")
    hanging = flag.with_suffix(".hanging")
    while not hanging.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert hanging.exists(), "the plug-in never started hanging"
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == cli.EXIT_INTERRUPTED, err[-2000:]
    assert "Traceback" not in err and err.strip().splitlines()[-1] == "kvblock-bench: interrupted"
    (csv,) = [p for p in tmp_path.glob("*/results.csv") if not p.parent.is_symlink()]
    assert {row.scenario for row in read_rows(csv)} == {"long-context"}
    assert json.loads((csv.parent / "meta.json").read_text())["interrupted_by"] == "SIGINT"
    assert_none_left(marker, tracker=True)


# -- the pieces, in-process ----------------------------------------------------------------------------------
def test_every_registered_implementation_passes_the_input_probe(impl_name: str) -> None:
    from harness.conformance.inputs import input_problems
    from impls import REGISTRY

    assert input_problems(REGISTRY[impl_name]) == []


@pytest.mark.parametrize(("plugin", "words"), [
    ("FillsIdsInDecode", "decode_step wrote into its inputs (seq_ids [5, 2, 7, 0, 3] became [5, 5, 5, 5, 5])"),
    ("ReversesIdsInLookup", "lookup wrote into its inputs (seq_ids [5, 2, 7, 0, 3] became [3, 0, 7, 2, 5])"),
    ("AbsurdTableBytes", "table_nbytes returned 1e+20, not an int byte count or None for sequence 5"),
])
def test_the_input_probe_names_what_changed(plugin: str, words: str) -> None:
    import tests.hostile_plugins as plugins
    from harness.conformance.inputs import input_problems

    assert any(words in problem for problem in input_problems(getattr(plugins, plugin)))


@pytest.mark.parametrize(("value", "ok"), [
    (None, True), (0, True), (512, True), (2**40, True), (np.int64(96), True), (2**40 + 1, False), (-1, False),
    (True, False), (1e20, False), (512.0, False), ("512", False), pytest.param(10**5000, False, id="int-of-16610-bits"),
])
def test_table_nbytes_answers_are_none_or_an_int_byte_count_in_range(value, ok: bool) -> None:
    problem = table_nbytes_problem(value)
    assert (problem == "") is ok and len(problem) < 200


def test_base_exceptions_from_a_design_are_its_failure_but_ctrl_c_is_the_users(monkeypatch) -> None:
    from tests.hostile_plugins import DictBlockManager, PluginAbort, RaisesBaseException, RaisesKeyboardInterrupt

    def decode(cls):
        mgr = cls(16, 4, 4, 4)
        mgr.decode_step(np.zeros(0, np.int64), np.zeros((0, 2), np.int64), np.zeros(0, np.int64))

    with pytest.raises(DesignFailure, match="PluginAbort: giving up"), blamed_on("abort", RaisesBaseException):
        decode(RaisesBaseException)
    assert issubclass(PluginAbort, BaseException) and not issubclass(PluginAbort, Exception)
    with pytest.raises(KeyboardInterrupt), blamed_on("kbd", RaisesKeyboardInterrupt):  # SIGINT is handled here
        decode(RaisesKeyboardInterrupt)
    monkeypatch.setattr(signal, "getsignal", lambda signum: signal.SIG_IGN)  # as in a worker
    with pytest.raises(DesignFailure, match="KeyboardInterrupt"), blamed_on("kbd", RaisesKeyboardInterrupt):
        decode(RaisesKeyboardInterrupt)
    with pytest.raises(PluginAbort), blamed_on("dict", DictBlockManager):  # not raised in the design's code
        raise PluginAbort("ours")


def test_a_reason_is_one_short_line_whatever_the_exception() -> None:
    class Unprintable(Exception):
        def __str__(self) -> str:
            raise RuntimeError("no")

    assert short_reason(KeyboardInterrupt()) == "KeyboardInterrupt"
    assert short_reason(Unprintable()) == "Unprintable: (its message cannot be printed)"
    huge = short_reason(RuntimeError("a,\n" * HUGE))
    assert len(huge) == REASON_CHARS and "\n" not in huge
