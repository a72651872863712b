"""Bring your own BlockManager: the example package installs, registers through the entry point, passes the
contract check, its broken variant fails with a runnable reproduction, and `run` compares it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from impls.registry import PluginError, contract_shape_problem, load_plugin

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "toy_block_manager"


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The example package installed (with its entry points) into a folder of its own."""
    target = tmp_path_factory.mktemp("site")
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                           "--no-deps", "--target", str(target), str(EXAMPLE)],
                          capture_output=True, text=True, timeout=300, check=False)
    if proc.returncode != 0:
        pytest.skip(f"pip could not build the example package here: {proc.stderr.strip()[-300:]}")
    return target


def cli(site: Path, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(site)])}
    return subprocess.run([sys.executable, "-m", "harness.cli", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT, env=env, check=False)


def test_the_example_conforms_by_its_entry_point_name(site: Path) -> None:
    proc = cli(site, "check", "toy", "--seeds", "1", "--examples", "40", "--ops", "20")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "verdict: CONFORMS" in proc.stdout


def test_the_broken_variant_fails_with_a_runnable_reproduction(site: Path) -> None:
    proc = cli(site, "check", "toy-leaky", "--seeds", "1", "--examples", "40", "--ops", "20")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "DOES NOT CONFORM" in proc.stdout
    script = proc.stdout.split("Reproduction:\n", 1)[1].split("\nverdict:", 1)[0]
    assert "state.free(" in script  # the leak shows when a sequence is freed
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(site)])}
    replay = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, cwd=ROOT,
                            timeout=120, check=False)
    assert replay.returncode != 0 and "AssertionError" in replay.stderr


@pytest.mark.slow  # an end-to-end CLI run (make test-slow, .ci/run)
def test_run_compares_the_plugin_with_built_in_designs(site: Path, tmp_path: Path) -> None:
    proc = cli(site, "run", "--impl", "toy,flat", "--scenario", "paper", "--quick", "--no-l1d", "--no-paced",
               "--no-table-copy", "--no-allocations", "--no-progress", "--results", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    run_dir = (tmp_path / "latest").resolve()
    csv = (run_dir / "results.csv").read_text()
    assert "paper,toy,batched,seq_step_ns," in csv and "paper,toy,batched,seq_step_ns_vs_flat," in csv
    meta = json.loads((run_dir / "meta.json").read_text())
    assert "toy-block-manager 0.1.0" in meta["impls"]["toy"]
    assert "`toy`" in (run_dir / "paper_table.md").read_text()


class _NoDecode:
    def __init__(self, num_blocks, block_size=16, max_seqs=256, max_blocks_per_seq=256) -> None: ...


class _BadSignature(_NoDecode):
    def can_allocate(self, n): ...
    def allocate(self, seq): ...  # the contract passes (seq_id, num_tokens)


def test_broken_plugins_are_refused_naming_what_is_missing() -> None:
    assert "missing contract method can_allocate" in contract_shape_problem(_NoDecode)
    with pytest.raises(PluginError, match="no_such_module"):
        load_plugin("no_such_module:Manager")
    with pytest.raises(PluginError, match="has no attribute 'Nope'"):
        load_plugin("impls.designs.flat:Nope")
    with pytest.raises(PluginError, match="not registered"):
        load_plugin("no-such-entry-point")
    for name in ("fork", "free", "block_table", "seq_len", "num_free_blocks", "ref_count", "last_slot",
                 "decode_step", "lookup", "table_nbytes", "append_slot"):
        setattr(_BadSignature, name, lambda self, *a: None)
    assert "allocate does not take 2 argument(s)" in contract_shape_problem(_BadSignature)
    _BadSignature.allocate = lambda self, seq, tokens: None
    assert contract_shape_problem(_BadSignature) == ""  # step is optional
    _BadSignature.step = lambda self, ops: None
    assert "step does not take 7 argument(s)" in contract_shape_problem(_BadSignature)


class _Delegating:
    """A pass-through wrapper: every contract method comes from the wrapped flat manager, through __getattr__."""

    def __init__(self, num_blocks, block_size=16, max_seqs=256, max_blocks_per_seq=256) -> None:
        from impls.designs.flat import FlatBlockManager

        self._inner = FlatBlockManager(num_blocks, block_size, max_seqs, max_blocks_per_seq)

    def __getattr__(self, name):
        return getattr(self.__dict__["_inner"], name)


class _DelegatingBroken(_Delegating):
    def __init__(self, num_blocks, block_size=16, max_seqs=256, max_blocks_per_seq=256) -> None:
        raise RuntimeError("needs a GPU")


def test_a_wrapper_delegating_through_getattr_is_accepted_or_refused_saying_why() -> None:
    assert contract_shape_problem(_Delegating) == ""
    problem = contract_shape_problem(_DelegatingBroken)
    assert "__getattr__" in problem and "RuntimeError: needs a GPU" in problem
