"""The command line under hostile input: exit status 2, one line naming the flag or file and the fix, no
traceback, nothing created and nothing lost (run as subprocesses, as a user would meet them)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness.base.files import ResultsError
from harness.base.rows import Row, read_rows, write_rows

ROOT = Path(__file__).resolve().parents[1]


def cli(*args: str, cwd: Path | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "harness.cli", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=cwd or ROOT, env=env, check=False)


def cli_in_process(capsys, *args: str) -> subprocess.CompletedProcess:
    """``cli`` without a new interpreter (seconds of imports per case); the other tests keep the real process."""
    from harness.cli import main

    capsys.readouterr()
    try:
        status = main(list(args))
    except SystemExit as exc:  # argparse's own exit
        status = exc.code if isinstance(exc.code, int) else 1
    out, err = capsys.readouterr()
    return subprocess.CompletedProcess(["kvblock-bench", *args], status, out, err)


def assert_one_line_error(proc: subprocess.CompletedProcess, *words: str) -> None:
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("kvblock-bench") and "Traceback" not in proc.stderr
    for word in words:
        assert word in lines[0], (word, lines[0])


@pytest.fixture
def results_with_a_run(tmp_path: Path) -> Path:
    """A results folder holding one finished run, ``latest`` pointing to it."""
    run = tmp_path / "20200101-000000"
    run.mkdir()
    write_rows(run / "results.csv", [Row("paper", "flat", "batched", "seq_step_ns", 10.0, "ns", "rdtsc")])
    (tmp_path / "latest").symlink_to(run.name)
    return tmp_path


@pytest.mark.parametrize(("args", "words"), [
    (["--trace", "no-such-trace.npz"], ["no-such-trace.npz"]),
    (["--impl", ""], ["--impl", "empty"]),
    (["--impl", "flat,flat"], ["--impl", "twice"]),
    (["--scenario", ","], ["--scenario", "empty"]),
    (["--scenario", "nope"], ["nope", "kvblock-bench scenarios"]),
    (["--impl", "no.such.module:Manager"], ["no.such.module"]),
    (["--reps", "0"], ["--reps"]),
    (["--regime", "sometimes"], ["sometimes"]),
    (["--sweep", "bogus"], ["--sweep", "bogus", "context"]),
    (["--sweep", "pool", "--scenario", "paper"], ["--sweep", "--scenario"]),
])
def test_bad_run_fails_before_creating_anything(results_with_a_run: Path, capsys, args, words) -> None:
    before = sorted(p.name for p in results_with_a_run.iterdir())
    proc = cli_in_process(capsys, "run", "--results", str(results_with_a_run), "--no-progress", *args)
    assert_one_line_error(proc, *words)
    assert sorted(p.name for p in results_with_a_run.iterdir()) == before  # no empty run folder left behind
    assert os.readlink(results_with_a_run / "latest") == "20200101-000000"  # the earlier run stays latest


def test_corrupt_trace_is_refused_naming_the_file(results_with_a_run: Path, tmp_path: Path) -> None:
    bad = tmp_path / "bad.npz"
    bad.write_bytes(b"PK\x03\x04 not really a zip")
    proc = cli("run", "--results", str(results_with_a_run), "--trace", str(bad), "--no-progress")
    assert_one_line_error(proc, "bad.npz")
    assert os.readlink(results_with_a_run / "latest") == "20200101-000000"


@pytest.mark.slow  # an end-to-end CLI run (make test-slow, .ci/run)
def test_results_path_that_is_a_file(tmp_path: Path) -> None:
    target = tmp_path / "results.txt"
    target.write_text("not a folder")
    assert_one_line_error(cli("run", "--results", str(target), "--quick"), "--results", "is a file")
    assert_one_line_error(cli("run", "--results", str(target / "sub"), "--quick"), "--results")


@pytest.mark.parametrize(("args", "words"), [
    (["paper", "--block-size", "3"], ["block-size", "power of two"]),
    (["paper", "--seed", "-1"], ["--seed"]),
    (["paper", "--sigma", "nan"], ["--sigma"]),
    (["paper", "--running", "100000"], ["--running"]),
    (["paper", "--samples", "2"], ["--samples", "not a parameter"]),
    (["nope"], ["nope"]),
])
def test_bad_trace_parameters(tmp_path: Path, capsys, args, words) -> None:
    out = tmp_path / "t.npz"
    assert_one_line_error(cli_in_process(capsys, "trace", *args, "-o", str(out)), *words)
    assert not out.exists()


def test_trace_output_that_cannot_be_written_fails_before_simulating(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    t0 = time.perf_counter()
    proc = cli("trace", "paper", "-o", str(blocker / "t.npz"))
    assert_one_line_error(proc, "t.npz", "not a folder")
    assert time.perf_counter() - t0 < 30  # the paper simulation alone takes longer than the refusal


def test_csv_that_is_a_folder(tmp_path: Path) -> None:
    assert_one_line_error(cli("trace", "--from-csv", str(tmp_path), "-o", str(tmp_path / "t.npz")), str(tmp_path))


def test_report_refuses_a_damaged_results_file(results_with_a_run: Path) -> None:
    csv = results_with_a_run / "latest" / "results.csv"
    csv.write_text(csv.read_text() + "paper,flat,batched,lookup_ns,-5,ns,rdtsc,ok,,,,,,,,,\n")
    assert_one_line_error(cli("report", "--results", str(results_with_a_run), "--no-figures"), "results.csv:3",
                          "negative")


def test_head_closing_the_pipe_is_not_an_error() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(f"{sys.executable} -m harness.cli scenarios -v | head -1", shell=True, capture_output=True,
                          text=True, env=env, cwd=ROOT, timeout=60, check=False)
    assert "Traceback" not in proc.stderr and "BrokenPipe" not in proc.stderr
    assert proc.stdout.startswith("paper")


def run_past_its_first_scenario(results: Path, *args: str) -> subprocess.Popen:
    """``kvblock-bench run`` of ``long-context`` then ``paper`` (quick, ``dict``), started and waited on until the
    first scenario is saved (the run folder appears then, and the second takes seconds)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "harness.cli", "run", "--results", str(results), "--quick",
                             "--scenario", "long-context,paper", "--impl", "dict", "--no-progress", *args], cwd=ROOT,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 240
    while not list(results.glob("*/results.csv")) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    return proc


@pytest.mark.slow  # an end-to-end CLI run (make test-slow, .ci/run)
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_ctrl_c_or_sigterm_is_one_line_and_keeps_what_finished(tmp_path: Path, sig: signal.Signals) -> None:
    """Interrupted while its second scenario runs, a run says so in one line, exits with 130, keeps the first
    scenario's rows and records the interruption, and which signal, in meta.json."""
    proc = run_past_its_first_scenario(tmp_path)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, f"not interrupted mid-run (exit {proc.returncode}): {err[-2000:]}"
    assert "Traceback" not in err and err.strip().splitlines()[-1] == "kvblock-bench: interrupted"
    (csv,) = [p for p in tmp_path.glob("*/results.csv") if not p.parent.is_symlink()]
    assert {row.scenario for row in read_rows(csv)} == {"long-context"}
    meta = json.loads((csv.parent / "meta.json").read_text())
    assert meta["interrupted"] and meta["interrupted_by"] == sig.name and not meta["complete"]


# -- the results reader, in-process (each case names file:line) -----------------------------------------------
GOOD = "paper,flat,batched,seq_step_ns,10.0,ns,rdtsc,ok,how,3,2000,2000.0,256,9.0,11.0,compiled,\n"


@pytest.mark.parametrize(("line", "words"), [
    ("paper,flat,batched,lookup_ns,-5,ns,rdtsc,ok,,,,,,,,,\n", ["results.csv:3", "negative"]),
    ("paper,flat,batched,lookup_ns,inf,ns,rdtsc,ok,,,,,,,,,\n", ["results.csv:3", "finite"]),
    ("paper,flat,batched,lookup_ns,1e300,ns,rdtsc,ok,,,,,,,,,\n", ["results.csv:3", "plausible"]),
    ("paper,flat,batched,lookup_ns,fast,ns,rdtsc,ok,,,,,,,,,\n", ["results.csv:3", "not a number"]),
    ("paper,flat,batched,lookup_ns,1,ns,rdtsc,guessed,,,,,,,,,\n", ["results.csv:3", "guessed"]),
    (GOOD, ["results.csv:3", "same figure as line 2"]),
    ("garbage\n", ["results.csv:3", "fields"]),
    ("paper,flat,batched,lookup_ns,1,ns,rdtsc,ok,,1.5,,,,,,,\n", ["results.csv:3", "reps"]),
])
def test_results_reader_names_file_and_line(tmp_path: Path, line: str, words) -> None:
    from harness.base.rows import COLUMNS

    path = tmp_path / "results.csv"
    path.write_text(",".join(COLUMNS) + "\n" + GOOD + line)
    with pytest.raises(ResultsError) as err:
        read_rows(path)
    for word in words:
        assert word in str(err.value)


def test_results_reader_refuses_a_missing_header_and_reads_schema_1(tmp_path: Path) -> None:
    path = tmp_path / "results.csv"
    path.write_text(GOOD)
    with pytest.raises(ResultsError, match=r"results\.csv:1"):
        read_rows(path)
    path.write_text("scenario,impl,regime,metric,value,unit,source,status,how\npaper,flat,batched,x,1.0,ns,s,ok,h\n")
    (row,) = read_rows(path)
    assert row.value == 1.0 and row.reps is None and row.ci_low is None and row.driver == ""
    from harness.base.rows import COLUMNS_V2

    path.write_text(",".join(COLUMNS_V2) + "\n" + GOOD.rsplit(",", 2)[0] + "\n")  # schema 2: no driver column
    (row,) = read_rows(path)
    assert row.value == 10.0 and row.ci_high == 11.0 and row.driver == ""


def test_results_refuse_an_unknown_driver(tmp_path: Path) -> None:
    from harness.base.rows import COLUMNS

    path = tmp_path / "results.csv"
    path.write_text(",".join(COLUMNS) + "\n" + GOOD.replace("compiled", "gpu"))
    with pytest.raises(ResultsError, match=r"results\.csv:2.*driver"):
        read_rows(path)
