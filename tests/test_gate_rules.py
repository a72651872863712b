"""The gate for any design: its rules read from a config file, its figures against a saved baseline, its
bad input as one line; and, slow, a plug-in gated end to end against a baseline it then exceeds."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from harness.cli import main
from harness.errors import InputError
from harness.gate import config as gate_config
from harness.gate import saved as gate_baseline
from harness.gate.command import GATE_LAYOUTS

ROOT = Path(__file__).resolve().parents[1]
RULES = """
[tool.kvblock-bench.gate]
impls = ["mine:BM"]
tolerance_pct = 0.5

[[tool.kvblock-bench.gate.rule]]
impl = "mine:BM"
regime = "batched"
max_instructions_per_seq_step = 60
zero_allocations = true
"""


def test_the_closest_pyproject_with_the_table_is_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "pyproject.toml").write_text(RULES)
    inner = tmp_path / "pkg" / "sub"
    inner.mkdir(parents=True)
    (tmp_path / "pkg" / "pyproject.toml").write_text("[project]\nname = 'x'\n")  # no gate table: skipped
    monkeypatch.chdir(inner)
    config = gate_config.load_config()
    assert config.source == f"{tmp_path / 'pyproject.toml'} [tool.kvblock-bench.gate]"
    assert config.impls == ("mine:BM",) and config.tolerance_pct == 0.5
    assert config.rule(("mine:BM", "batched")) == gate_config.Rule("mine:BM", "batched", 60.0, None, True)


def test_no_table_anywhere_means_no_rules(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(gate_config, "find_config", lambda start=None: None)
    config = gate_config.load_config()
    assert config.rules == () and config.wall is None and "no rules" in config.source


@pytest.mark.parametrize(("text", "message"), [
    ("[tool.kvblock-bench.gate]\nceilings = 3\n", "unknown key 'ceilings'"),
    ("[[tool.kvblock-bench.gate.rule]]\nimpl = 'flat'\nregime = 'batched'\nmax_instr = 4\n", "unknown key 'max_instr'"),
    ("[[tool.kvblock-bench.gate.rule]]\nimpl = 'flat'\n", "regime is required"),
    ("[[tool.kvblock-bench.gate.rule]]\nimpl = 'flat'\nregime = 'sideways'\nzero_allocations = true\n",
     "regime 'sideways'"),
    ("[[tool.kvblock-bench.gate.rule]]\nimpl = 'flat'\nregime = 'batched'\n", "a rule needs"),
    ("[[tool.kvblock-bench.gate.rule]]\nimpl = 'flat'\nregime = 'batched'\nmax_instructions_per_seq_step = '45'\n",
     "must be a non-negative number"),
    ("[[tool.kvblock-bench.gate.rule]]\nimpl = 'cpp-flat'\nregime = 'batched'\nmax_instructions_vs_base = -1\n",
     "max_instructions_vs_base must be a non-negative number"),
    ("[[tool.kvblock-bench.gate.rule]]\nimpl = 'flat'\nregime = 'batched'\nzero_allocations = 1\n",
     "true or false"),
    ("[tool.kvblock-bench.gate.wall]\nslower = 'dict'\n", "faster is required"),
    ("[tool.kvblock-bench.gate]\nimpls = 'flat'\n", "impls must be a list"),
    ("[tool.kvblock-bench.gate]\ntolerance_pct = -1\n", "tolerance_pct must be a non-negative number"),
    ("[project]\nname = 'x'\n", "no [tool.kvblock-bench.gate] table"),
    ("[tool.kvblock-bench.gate\n", "not valid TOML"),
])
def test_a_bad_config_is_one_error_naming_file_and_key(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "gate.toml"
    path.write_text(text)
    with pytest.raises(InputError, match=re.escape(message)) as info:
        gate_config.load_config(path)
    assert str(path) in str(info.value)


def test_two_rules_for_one_cell_are_refused() -> None:
    rule = {"impl": "flat", "regime": "batched", "zero_allocations": True}
    with pytest.raises(InputError, match="two rules for flat batched"):
        gate_config.parse({"rule": [rule, rule]}, "test")


# -- against a baseline ----------------------------------------------------------------------------------------
def doc(ir: int, memray: float = 0.0, versions: dict | None = None, checksum: str = "t") -> dict:
    machine = {"versions": versions or {"python": "3.11.7", "numpy": "2.4.6", "numba": "0.68.1",
                                        "llvmlite": "0.50.0"}, "cpu_model": "A"}
    return {"commit": "abc", "machine": machine, "trace_checksum": checksum, "cells": [
        {"impl": "mine:BM", "regime": "batched", "instructions": [ir, ir], "seq_steps": 100,
         "memray_per_step": memray, "nrt_per_step": 0.0}]}


def test_a_rise_beyond_the_tolerance_fails_and_a_fall_is_a_note() -> None:
    assert gate_baseline.against(doc(10_000), doc(10_100), 1.0)[0] == []  # exactly 1 %: passes
    failures, _ = gate_baseline.against(doc(10_000), doc(10_101), 1.0)
    assert failures == ["mine:BM batched needs 101.0 instructions per sequence-step, +1.01 % against the "
                        "baseline's 100.0 (tolerance 1 %)"]
    failures, notes = gate_baseline.against(doc(10_000), doc(9_000), 1.0)
    assert failures == [] and "-10.00 % (save a new baseline)" in notes[0]
    failures, _ = gate_baseline.against(doc(10_000), doc(10_000, memray=2.0), 1.0)
    assert failures and "allocates now" in failures[0]


def test_a_baseline_of_other_software_or_trace_is_refused_unless_allowed() -> None:
    other = doc(10_000, versions={"python": "3.12.1", "numpy": "2.4.6", "numba": "0.68.1", "llvmlite": "0.50.0"})
    why = gate_baseline.refusal(other, doc(10_000), Path("b.json"), allow_other_machine=False)
    assert "versions.python '3.12.1' -> '3.11.7'" in why and "--allow-other-machine" in why
    assert gate_baseline.refusal(other, doc(10_000), Path("b.json"), allow_other_machine=True) == ""
    assert "another trace" in gate_baseline.refusal(doc(1, checksum="x"), doc(1), Path("b.json"), True)
    # another CPU with the same software: instruction counts compare (NUMBA_CPU_NAME=generic, no cache simulation)
    cpu = {**doc(1), "machine": {**doc(1)["machine"], "cpu_model": "B"}}
    assert gate_baseline.refusal(cpu, doc(1), Path("b.json"), allow_other_machine=False) == ""


@pytest.mark.parametrize(("content", "message"), [
    (None, "no such file"), ("{not json", "not a gate baseline"), ('{"cells": 3}', "not a gate baseline"),
    ('[1, 2]', "not a gate baseline"), ('{"cells": [{"impl": "flat"}]}', "not a gate baseline")])
def test_gate_bad_input_is_one_line(tmp_path: Path, capsys, content: str | None, message: str) -> None:
    baseline = tmp_path / "base.json"
    if content is not None:
        baseline.write_text(content)
    assert main(["gate", "--no-callgrind", "--against", str(baseline)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and message in err and "Traceback" not in err


def test_gate_refuses_an_unknown_plugin_and_a_bad_config_in_one_line(tmp_path: Path, capsys) -> None:
    assert main(["gate", "--no-callgrind", "--impl", "nosuch.module:Thing"]) == 2
    assert "cannot import 'nosuch.module'" in capsys.readouterr().err
    bad = tmp_path / "g.toml"
    bad.write_text("[tool.kvblock-bench.gate]\nceilings = 1\n")
    assert main(["gate", "--no-callgrind", "--config", str(bad)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "unknown key 'ceilings'" in err
    assert main(["gate", "--no-callgrind", "--save-baseline", str(tmp_path / "b.json")]) == 2
    assert "needs the instruction counts" in capsys.readouterr().err


PLUGIN = '''
from slowed_flat import SlowedFlat


class Mine(SlowedFlat):
    """examples/slowed_flat with {extra} extra slot-mapping passes per step, fixed in the code."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.passes = {extra}
'''


@pytest.mark.slow
def test_a_plugin_is_gated_against_its_saved_baseline(tmp_path: Path) -> None:
    """gate --impl PLUGIN --save-baseline, then the plug-in does more work per step: gate --against fails with
    exit 1, naming the cell and the rise; the unchanged plug-in passes against its own baseline."""
    from harness.counters import callgrind

    if not callgrind.available()[0]:
        pytest.skip("valgrind unavailable")
    module = tmp_path / "mine.py"
    config = tmp_path / "gate.toml"
    config.write_text("[tool.kvblock-bench.gate]\ntolerance_pct = 1.0\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT / "examples" / "slowed_flat")])}

    def gate(*argv: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "harness.cli", "gate", "--impl", "mine:Mine", "--config",
                               str(config), *argv], cwd=ROOT, env=env, capture_output=True, text=True, check=False)

    module.write_text(PLUGIN.format(extra=0))
    saved = gate("--save-baseline", str(tmp_path / "base.json"))
    assert saved.returncode == 0, saved.stdout + saved.stderr
    baseline = json.loads((tmp_path / "base.json").read_text())
    assert baseline["commit"] and baseline["machine"]["versions"]["numba"]
    assert {(c["impl"], c["regime"]) for c in baseline["cells"]} == {
        ("flat", "batched"), ("mine:Mine", "batched"), ("mine:Mine", "per-call")}
    # the second call finds base.json in a folder on PYTHONPATH: another heap layout (CI once failed on it here)
    assert all(c["layouts"] == list(GATE_LAYOUTS) for c in baseline["cells"])
    same = gate("--against", str(tmp_path / "base.json"))
    assert same.returncode == 0, same.stdout + same.stderr
    module.write_text(PLUGIN.format(extra=1))
    slower = gate("--against", str(tmp_path / "base.json"))
    assert slower.returncode == 1, slower.stdout + slower.stderr
    assert "FAIL: mine:Mine batched needs" in slower.stdout and "against the baseline's" in slower.stdout
    assert "mine:Mine per-call" not in slower.stdout.split("FAIL:", 1)[1]  # per-call calls no decode_step
