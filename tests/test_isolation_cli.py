"""Issue 36, items 1 and 3, through the command line: each design's cells run in a worker process of its own, and
a plug-in's fault costs its own cells only.

A plug-in whose ``decode_step`` answers something the harness cannot use (None, text, 2**70, an array), that
exits with any code, exhausts its address space, changes its working folder and environment (with a relative
``--results``), states a ``memory_bytes`` that is no byte count, or replaces the registered ``dict`` class's
``decode_step``: the run folder exists, ``flat`` and ``dict`` are measured, the plug-in's cells fail with a
one-line reason, no traceback shows, and the run exits 3 (0 where nothing failed).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from harness import cli
from harness.base.failures import REASON_CHARS
from harness.base.rows import read_rows
from tests.hostile_plugins import expected
from tests.test_hostile_plugins import MARK, QUICK_RUN, ROOT, P, Run, assert_none_left

pytestmark = pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="finds leftover processes in /proc")
GOOD = ("flat", "dict")


def kvb_in(cwd: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """``python -m harness.cli ARGS`` run from ``cwd``; asserts afterwards that it left no process."""
    marker = uuid.uuid4().hex
    path = os.pathsep.join([str(ROOT), *(env or {}).pop("EXTRA_PATH", "").split(os.pathsep)]).rstrip(os.pathsep)
    proc = subprocess.run([sys.executable, "-m", "harness.cli", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=600, check=False, env={**os.environ, **(env or {}), MARK: marker,
                                                         "PYTHONPATH": path})
    assert_none_left(marker, tracker=True)
    return proc


def quick_run(tmp: Path, plugins: list[str], regimes: str, *extra: str, env: dict[str, str] | None = None) -> Run:
    impls = ",".join([*GOOD, *(p if ":" in p else P + p for p in plugins)])
    proc = kvb_in(ROOT, "run", "--impl", impls, "--regime", regimes, *QUICK_RUN, "--results", str(tmp), *extra,
                  env=env)
    assert (tmp / "latest" / "results.csv").is_file(), proc.stderr[-3000:]
    return Run(proc, (tmp / "latest").resolve(), read_rows(tmp / "latest" / "results.csv"), set(regimes.split(",")))


def assert_only_plugins_failed(run: Run, cases: dict[str, tuple[str, set[str]]], status: int = 3) -> None:
    """flat and dict measured in every regime, each case's cells failed in the regimes given with a one-line reason
    holding its words, one stderr line per failed cell, the given exit status, no traceback, meta complete."""
    err = run.proc.stderr
    assert run.proc.returncode == status, err[-3000:]
    assert "Traceback" not in err + run.proc.stdout, err[-3000:]
    assert all(" failed: " in line for line in err.splitlines()), err[-3000:]
    for impl in GOOD:
        assert run.measured(impl) == run.regimes and not run.failed(impl), (impl, run.failed(impl))
    assert any(r.impl == "dict" and r.metric == "seq_step_ns_vs_flat" and r.status == "ok" for r in run.rows)
    for plugin, (words, regimes) in cases.items():
        failed = run.failed(plugin if ":" in plugin else P + plugin)
        assert regimes <= set(failed) and (regimes or not failed), (plugin, failed)
        for regime, reason in failed.items():
            assert words in reason and "\n" not in reason and len(reason) <= REASON_CHARS, (plugin, reason)
            assert f" {plugin if ':' in plugin else P + plugin} {regime} failed: " in err
    assert json.loads((run.run_dir / "meta.json").read_text())["complete"] is True


# -- answers the harness cannot use, exits, exhausted memory, memory_bytes, a patched neighbour: one run --------
BAD_ANSWERS = expected("ReturnsNone", "ReturnsText", "ReturnsHuge", "ReturnsArray", "ExitsWithThree", "ExitsWithText",
                       "ExhaustsMemory", "StatesText", "StatesNegative", "ExitsInMemoryBytes")
TOY = "toy_bm:ToyBlockManager"  # the project's own example: no memory_bytes at all


@pytest.fixture(scope="module")
def bad_answers_run(tmp_path_factory: pytest.TempPathFactory) -> Run:
    tmp = tmp_path_factory.mktemp("bad-answers")
    run = quick_run(tmp, [*BAD_ANSWERS, "PatchesDict", TOY], "per-call,batched", "--memory",
                    env={"KVB_PID_LOG": str(tmp / "pids"),
                         "EXTRA_PATH": str(ROOT / "examples" / "toy_block_manager")})
    run.pid_log = tmp / "pids"
    return run


@pytest.mark.slow  # one shared CLI run of 14 designs (make test-slow, .ci/run)
def test_bad_answers_exits_and_exhausted_memory_cost_only_the_plugins_cells(bad_answers_run: Run) -> None:
    assert_only_plugins_failed(bad_answers_run, {**BAD_ANSWERS, "PatchesDict": ("", set()), TOY: ("", set())})


@pytest.mark.slow  # one shared CLI run of 14 designs (make test-slow, .ci/run)
def test_memory_bytes_that_fails_or_lies_fails_its_memory_row_and_a_missing_one_is_unavailable(
        bad_answers_run: Run) -> None:
    memory = {(r.impl, r.metric): r.status for r in bad_answers_run.rows if r.metric.startswith("memory_")}
    for impl in (*GOOD, TOY):
        assert memory[(impl, "memory_bytes")] == "ok", impl
    assert memory[(TOY, "memory_stated_bytes")] == "unavailable"
    assert all(memory[(P + p, "memory_bytes")] == "failed" for p in ("StatesText", "StatesNegative"))
    assert bad_answers_run.measured(TOY) == bad_answers_run.regimes


@pytest.mark.slow  # one shared CLI run of 14 designs (make test-slow, .ci/run)
def test_a_plugin_patching_dict_does_not_reach_dicts_cells(bad_answers_run: Run) -> None:
    """PatchesDict makes the ``dict`` class raise in every process that builds a PatchesDict: dict's cells run in
    other processes (meta.json's worker ids), so dict is measured, and PatchesDict itself too."""
    meta = json.loads((bad_answers_run.run_dir / "meta.json").read_text())
    workers = meta["worker_pids"]["paper"]
    patchers = {int(line) for line in bad_answers_run.pid_log.read_text().split()}
    assert patchers and set(workers["dict"]).isdisjoint(patchers), (workers, patchers)
    assert set(workers[P + "PatchesDict"]) <= patchers
    assert len({pid for pids in workers.values() for pid in pids}) == len(workers)  # one process per design
    assert bad_answers_run.measured(P + "PatchesDict") == bad_answers_run.regimes


# -- a working folder and environment changed, with a relative --results -----------------------------------------
@pytest.mark.slow  # an end-to-end CLI run (make test-slow, .ci/run)
def test_a_plugin_changing_its_working_folder_and_environment_spoils_nothing(tmp_path: Path) -> None:
    """The plug-in moves its process to / after every step: the second scenario still runs (its workers get
    absolute paths, and each job starts from the worker's own folder and environment); everything is measured."""
    proc = kvb_in(tmp_path, "run", "--impl", f"flat,dict,{P}ChangesCwdAndEnv", "--regime", "batched",
                  "--scenario", "paper,concurrency-64", "--quick", "--no-l1d", "--no-paced", "--no-table-copy",
                  "--no-allocations", "--processes", "1", "--no-progress", "--results", "res")
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    rows = read_rows(tmp_path / "res" / "latest" / "results.csv")
    measured = {(r.scenario, r.impl) for r in rows if r.metric == "seq_step_ns" and r.status == "ok"}
    assert measured == {(s, i) for s in ("paper", "concurrency-64") for i in (*GOOD, P + "ChangesCwdAndEnv")}


# -- check: a verdict for these plug-ins too -----------------------------------------------------------------
CHECKED = {
    "ReturnsNone": "decode_step",
    "ReturnsArray": "decode_step",
    "ExitsWithThree": "FAILS: SystemExit: 3",
    "StatesNegative": "memory_bytes() returned -1",
}


@pytest.mark.parametrize("plugin", list(CHECKED))
def test_check_gives_these_plugins_a_verdict(plugin: str, monkeypatch, capfd) -> None:
    marker = uuid.uuid4().hex
    monkeypatch.setenv(MARK, marker)
    status = cli.main(["check", P + plugin, "--seeds", "1", "--examples", "10", "--ops", "15"])
    out, err = capfd.readouterr()
    assert status == 1 and out.rstrip().endswith("verdict: DOES NOT CONFORM"), out[-3000:] + err[-3000:]
    assert CHECKED[plugin] in out and "Traceback" not in out + err, out[-3000:]
    assert_none_left(marker)
