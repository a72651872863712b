"""Bounded requests and a gate a plug-in cannot crash (issue 36, items 3 and 4), through the command line.

Every count option refuses a value past its bound in one line naming the flag and the range; ``run`` refuses
more worker processes than repetitions; ``gate --against`` refuses a malformed baseline, naming the file and
the field, before anything is measured; a failing gate saves no baseline; and a plug-in that exits (any code),
raises, crashes or hangs fails its own cells in the gate, with a one-line reason and exit status 1, while the
other cells are measured.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from harness import cli
from harness.base import args as arg_types
from harness.counters import callgrind
from harness.errors import InputError
from harness.gate import command as gate
from harness.gate import saved as gate_baseline
from harness.gate.counting import GateWorkers
from harness.run.runner import MAX_PROCESSES, MAX_REPS, RunConfig, check_config
from harness.studies.table_copy.measurement import FLAG_STEPS
from tests.test_hostile_plugins import MARK, assert_none_left

ROOT = Path(__file__).resolve().parents[1]
P = "tests.hostile_plugins:"
HUGE = str(2**62)


def one_error_line(err: str, *words: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    for word in words:
        assert word in lines[0], (word, lines[0])
    return lines[0]


# -- every count option has an upper bound --------------------------------------------------------------------
BOUNDED = [  # (argv before the value, the value, words of the one-line error)
    (["run", "--reps"], MAX_REPS + 1, ["--reps", f"from 1 to {MAX_REPS:,}"]),
    (["run", "--reps"], HUGE, ["--reps", f"from 1 to {MAX_REPS:,}"]),
    (["run", "--processes"], MAX_PROCESSES + 1, ["--processes", f"from 1 to {MAX_PROCESSES}"]),
    (["run", "--processes"], HUGE, ["--processes", f"from 1 to {MAX_PROCESSES}"]),
    (["calibrate", "vllm", "--reps"], arg_types.MAX_CALIBRATE_REPS + 1,
     ["--reps", f"to {arg_types.MAX_CALIBRATE_REPS:,}"]),
    (["history", "vllm", "0.23.0", "--reps"], arg_types.MAX_CALIBRATE_REPS + 1,
     ["--reps", f"to {arg_types.MAX_CALIBRATE_REPS:,}"]),
    (["check", "flat", "--seeds"], arg_types.MAX_CHECK_SEEDS + 1, ["--seeds", f"to {arg_types.MAX_CHECK_SEEDS:,}"]),
    (["check", "flat", "--examples"], arg_types.MAX_CHECK_EXAMPLES + 1,
     ["--examples", f"to {arg_types.MAX_CHECK_EXAMPLES:,}"]),
    (["check", "flat", "--ops"], arg_types.MAX_CHECK_OPS + 1, ["--ops", f"to {arg_types.MAX_CHECK_OPS:,}"]),
    (["check", "flat", "--ops"], HUGE, ["--ops", f"to {arg_types.MAX_CHECK_OPS:,}"]),
    (["table-copy", "--steps"], FLAG_STEPS + 1, ["--steps", f"from 1 to {FLAG_STEPS:,}"]),
    (["table-copy", "--warmup"], FLAG_STEPS + 1, ["--warmup", f"from 0 to {FLAG_STEPS:,}"]),
    (["table-copy", "--warmup"], -1, ["--warmup", f"from 0 to {FLAG_STEPS:,}"]),
    (["run", "--deadline"], arg_types.MAX_DEADLINE_S + 1, ["--deadline", "at most 86,400"]),
    (["check", "flat", "--deadline"], arg_types.MAX_DEADLINE_S + 1, ["--deadline", "at most 86,400"]),
    (["gate", "--deadline"], arg_types.MAX_DEADLINE_S + 1, ["--deadline", "at most 86,400"]),
]


@pytest.mark.parametrize(("argv", "value", "words"), BOUNDED)
def test_every_count_option_refuses_a_value_past_its_bound(argv: list[str], value, words: list[str],
                                                           capsys) -> None:
    assert cli.main([*argv, str(value)]) == cli.EXIT_USAGE
    out, err = capsys.readouterr()
    assert out == ""
    one_error_line(err, *words)


def test_a_count_at_its_bound_is_taken() -> None:
    assert arg_types.count(1, MAX_REPS)(str(MAX_REPS)) == MAX_REPS and arg_types.count(0, 5)("0") == 0


@pytest.mark.slow  # an end-to-end CLI run (make test-slow, .ci/run)
def test_more_processes_than_repetitions_is_refused_before_anything_starts(tmp_path: Path) -> None:
    """``--processes`` above ``--reps`` would start workers that never get a repetition: one line, no run."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for args, reps in ((["--reps", "2", "--processes", "3"], "2"), (["--quick", "--processes", "2"], "1")):
        proc = subprocess.run([sys.executable, "-m", "harness.cli", "run", "--scenario", "paper", "--no-progress",
                               "--results", str(tmp_path), *args], capture_output=True, text=True, cwd=ROOT, env=env,
                              timeout=300, check=False)
        assert proc.returncode == cli.EXIT_USAGE, proc.stderr
        one_error_line(proc.stderr, "--processes", f"--reps {reps}", f"give at most {reps}")
    assert list(tmp_path.iterdir()) == []


def test_run_config_counts_are_checked_for_callers_of_the_api() -> None:
    for cfg, words in ((RunConfig(reps=2, processes=3), "more worker processes than repetitions"),
                       (RunConfig(reps=MAX_REPS + 1), "--reps"), (RunConfig(reps=MAX_REPS, processes=MAX_PROCESSES + 1),
                                                                   "--processes")):
        with pytest.raises(InputError, match=words):
            check_config(cfg)
    check_config(RunConfig(reps=MAX_PROCESSES, processes=MAX_PROCESSES))


# -- gate --against: a malformed baseline is refused before anything is measured ------------------------------
def baseline_doc() -> dict:
    return {"commit": "abc", "machine": {"versions": {"python": "3"}}, "trace_checksum": "t", "cells": [
        {"impl": "flat", "regime": "batched", "instructions": [9000, 9000], "seq_steps": 100,
         "memray_per_step": 0.0, "nrt_per_step": 0.0}]}


def _set(key: str, value: object):
    def mutate(doc: dict) -> None:
        doc["cells"][0][key] = value
    return mutate


def _drop(key: str):
    def mutate(doc: dict) -> None:
        del doc["cells"][0][key]
    return mutate


MALFORMED = {  # name -> (how the good baseline is spoilt, words of the one-line refusal)
    "instructions 0": (_set("instructions", [0, 0]), "cells[0].instructions must be a list of instruction counts"),
    "instructions a string": (_set("instructions", "9000"), "cells[0].instructions must be"),
    "instructions NaN": (_set("instructions", [math.nan, 1]), "cells[0].instructions must be"),
    "instructions true": (_set("instructions", [True]), "cells[0].instructions must be"),
    "impl a list": (_set("impl", ["flat"]), "cells[0].impl must be an implementation name"),
    "regime unknown": (_set("regime", "sideways"), "cells[0].regime must be one of"),
    "seq_steps 0": (_set("seq_steps", 0), "cells[0].seq_steps must be"),
    "seq_steps a float": (_set("seq_steps", 1.5), "cells[0].seq_steps must be"),
    "allocations negative": (_set("memray_per_step", -1), "cells[0].memray_per_step must be"),
    "impl missing": (_drop("impl"), "cells[0].impl is missing"),
    "instructions missing": (_drop("instructions"), "cells[0].instructions is missing"),
    "seq_steps missing": (_drop("seq_steps"), "cells[0].seq_steps is missing"),
    "no cells": (lambda doc: doc.update(cells=[]), "cells: no cell"),
    "a cell twice": (lambda doc: doc["cells"].append(dict(doc["cells"][0])), "cells[1]: flat batched is given twice"),
    "trace_checksum missing": (lambda doc: doc.pop("trace_checksum"), "trace_checksum must be"),
    "machine a list": (lambda doc: doc.update(machine=[]), "machine must be an object"),
}


@pytest.fixture
def nothing_measured(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any measurement, in a worker or by callgrind, fails the test."""
    def measured(*args, **kwargs):
        raise AssertionError("measured before the baseline was refused")

    monkeypatch.setattr(callgrind, "measure_runs", measured)
    monkeypatch.setattr(GateWorkers, "run", measured)


def test_the_unspoilt_baseline_is_taken(tmp_path: Path) -> None:
    path = tmp_path / "base.json"
    path.write_text(json.dumps(baseline_doc()))
    assert gate_baseline.load(path) == baseline_doc()


@pytest.mark.parametrize("case", MALFORMED)
def test_a_malformed_baseline_is_refused_naming_file_and_field(case: str, tmp_path: Path, capsys,
                                                               nothing_measured) -> None:
    doc = baseline_doc()
    spoil, words = MALFORMED[case]
    spoil(doc)
    path = tmp_path / "base.json"
    path.write_text(json.dumps(doc))
    assert cli.main(["gate", "--against", str(path)]) == cli.EXIT_USAGE
    out, err = capsys.readouterr()
    assert out == ""  # not even the rules line: nothing was begun
    one_error_line(err, f"--against {path}: not a gate baseline", words)


@pytest.mark.parametrize(("text", "words"), [("{not json", "not a gate baseline"), ("", "not a gate baseline"),
                                             ('{"cells": {"impl": "flat"}}', "no list of cells")])
def test_a_baseline_that_is_no_document_is_refused(text: str, words: str, tmp_path: Path, capsys,
                                                   nothing_measured) -> None:
    path = tmp_path / "base.json"
    path.write_text(text)
    assert cli.main(["gate", "--against", str(path)]) == cli.EXIT_USAGE
    one_error_line(capsys.readouterr().err, str(path), words)


def test_a_baseline_of_another_trace_is_refused_before_measuring(tmp_path: Path, capsys, nothing_measured) -> None:
    path = tmp_path / "base.json"
    path.write_text(json.dumps(baseline_doc()))
    assert cli.main(["gate", "--against", str(path)]) == cli.EXIT_USAGE
    one_error_line(capsys.readouterr().err, f"--against {path}: measured on another trace")


# -- a failing gate saves no baseline ------------------------------------------------------------------------
@pytest.mark.parametrize("existing", [True, False])
def test_a_failing_gate_saves_no_baseline(existing: bool, tmp_path: Path, capsys) -> None:
    path = tmp_path / "base.json"
    if existing:
        path.write_text("the earlier baseline")
    args = type("Args", (), {"json": None, "save_baseline": path})()
    doc = {**baseline_doc(), "failures": ["flat batched needs 90.0 instructions per sequence-step"]}
    gate._write(args, doc, "")
    assert "NOT SAVED" in capsys.readouterr().out
    assert (path.read_text() == "the earlier baseline") if existing else not path.exists()


# -- plug-ins that exit, raise, crash or hang: their cells fail, the gate exits 1 -------------------------------
NO_RULES = "[tool.kvblock-bench.gate]\n"  # no wall clock and no rule: only the designs' failures fail the gate
EXITS_TWO = """
import sys

from impls.designs.dict_design import DictBlockManager


class Manager(DictBlockManager):
    def decode_step(self, seq_ids, cow_out, slot_out):
        sys.exit(2)
"""


def gate_cli(tmp_path: Path, *args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    """``kvblock-bench gate`` with no rules, tests and ``tmp_path`` importable; asserts it left no process."""
    config = tmp_path / "gate.toml"
    config.write_text(NO_RULES)
    marker = uuid.uuid4().hex
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(tmp_path)]), MARK: marker}
    proc = subprocess.run([sys.executable, "-m", "harness.cli", "gate", "--config", str(config), *args],
                          capture_output=True, text=True, cwd=ROOT, env=env, timeout=timeout, check=False)
    assert_none_left(marker, tracker=True)
    return proc


def table_rows(out: str) -> dict[tuple[str, str], list[str]]:
    """The gate table's rows: (impl, regime) -> the figures."""
    rows = {}
    for line in out.splitlines():
        parts = line.split()
        if len(parts) >= 9 and parts[1] in ("batched", "per-call"):  # then the allocations' source, in words
            rows[(parts[0], parts[1])] = parts[2:9]
    return rows


def assert_fails_alone(proc: subprocess.CompletedProcess, failed: dict[str, str], measured: list[tuple[str, str]]):
    """Exit 1 and "gate failed"; one FAIL line per failed batched cell (plug-in -> words of its reason); the
    ``measured`` cells have their allocation counts; no traceback."""
    assert proc.returncode == gate.EXIT_FAIL, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "Traceback" not in proc.stdout + proc.stderr, proc.stderr[-3000:]
    fails = [line for line in proc.stdout.splitlines() if line.startswith("FAIL: ")]
    assert len(fails) == len(failed), fails
    for plugin, words in failed.items():
        (line,) = [f for f in fails if f.startswith(f"FAIL: {plugin} batched: ")]
        assert words in line, line
    rows = table_rows(proc.stdout)
    for cell in measured:
        assert rows[cell][5] != "-" and rows[cell][6] != "-", (cell, rows)
    assert proc.stdout.strip().splitlines()[-1].startswith("gate failed in ")


@pytest.mark.slow  # an end-to-end CLI run (make test-slow, .ci/run)
def test_a_plugin_exiting_0_fails_its_cell_and_the_gate(tmp_path: Path) -> None:
    """``sys.exit(0)`` in decode_step: once the gate's exit status 0 with no verdict; now its batched cell fails
    and the gate exits 1, batched flat and the plug-in's per-call cell (no decode_step) measured."""
    proc = gate_cli(tmp_path, "--no-callgrind", "--impl", P + "ExitsInDecode")
    assert_fails_alone(proc, {P + "ExitsInDecode": "SystemExit: 0"},
                       [("flat", "batched"), (P + "ExitsInDecode", "per-call")])


@pytest.mark.slow
def test_plugins_that_exit_raise_crash_or_hang_fail_only_their_cells(tmp_path: Path) -> None:
    """Each plug-in in a worker of its own under the deadline: its batched cell fails with the reason, every
    other cell is measured, the gate exits 1."""
    (tmp_path / "gate_exits_two.py").write_text(EXITS_TWO)
    plugins = {"gate_exits_two:Manager": "SystemExit: 2", P + "RaisesBaseException": "PluginAbort: giving up",
               P + "OsExitInCall": "exited with status 0 before its job was done",
               P + "HangsInDecode": "made no progress for 20 s (the deadline) and was killed"}
    proc = gate_cli(tmp_path, "--no-callgrind", "--deadline", "20", "--impl", ",".join(["dict", *plugins]))
    assert_fails_alone(proc, plugins, [("flat", "batched"), ("dict", "batched"), ("dict", "per-call"),
                                       *((p, "per-call") for p in plugins)])


@pytest.mark.parametrize(("source", "words"), [("import sys\nsys.exit(0)\n", "SystemExit: 0"),
                                               ("import os\nos._exit(0)\n", "exited with status 0")],
                         ids=["sys.exit", "os._exit"])
@pytest.mark.slow  # an end-to-end CLI run (make test-slow, .ci/run)
def test_a_plugin_failing_at_import_is_refused_in_one_line_by_the_gate(source: str, words: str, tmp_path: Path) -> None:
    """Its import runs in its worker, never in the gate's process: exit 2, one line, nothing measured."""
    name = f"gate_at_import_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{name}.py").write_text(source)
    proc = gate_cli(tmp_path, "--no-callgrind", "--impl", f"{name}:Manager")
    assert proc.returncode == cli.EXIT_USAGE, proc.stdout + proc.stderr
    one_error_line(proc.stderr, "--impl", name, words)
    assert "gate trace" not in proc.stdout


@pytest.mark.slow
def test_with_callgrind_a_failed_cell_is_left_out_and_no_baseline_is_saved(tmp_path: Path) -> None:
    """The instruction counts of every cell no design failed; the failing gate keeps the earlier baseline."""
    if not callgrind.available()[0]:
        pytest.skip("valgrind unavailable")
    baseline, figures = tmp_path / "base.json", tmp_path / "gate.json"
    baseline.write_text("the earlier baseline")
    proc = gate_cli(tmp_path, "--impl", P + "ExitsInDecode", "--save-baseline", str(baseline), "--json", str(figures))
    assert_fails_alone(proc, {P + "ExitsInDecode": "SystemExit: 0"},
                       [("flat", "batched"), (P + "ExitsInDecode", "per-call")])
    assert f"NOT SAVED: {baseline}: the gate failed" in proc.stdout
    assert baseline.read_text() == "the earlier baseline"
    cells = {(c["impl"], c["regime"]): c for c in json.loads(figures.read_text())["cells"]}
    assert cells[(P + "ExitsInDecode", "batched")]["instructions"] is None
    for cell in (("flat", "batched"), (P + "ExitsInDecode", "per-call")):
        counts = cells[cell]["instructions"]
        assert cells[cell]["layouts"] == list(gate.GATE_LAYOUTS), cell
        assert len(counts) == len(gate.GATE_LAYOUTS) and counts[0] == counts[1] > 0 and min(counts) > 0, cell

