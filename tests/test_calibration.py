"""``kvblock-bench calibrate``: the import plan, the fetch, the rewritten traces, the table, and whole runs against a
stand-in engine built in a temporary folder (laid out as nano-vllm is, imported exactly as the real one is).

The real engines (downloads of 40 and 340 MB) run in the slow test at the end."""

from __future__ import annotations

import csv
import gzip
import hashlib
import json
import math
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from harness.base.replay import ReplayError, replay
from harness.calibration.table import CalibrationRow, merge, read_rows, write_rows
from harness.cli import main
from harness.engines import fetch
from harness.engines.catalog import parse_engine
from harness.engines.fan_out import fan_out_forks
from harness.engines.loader import ImportPlan, Piece, PlanError, StubTouched, engine_imports
from harness.errors import InputError
from impls import REGISTRY
from scenarios import generate
from tests.calibration_standin import build_wheel, write_standin
from tests.lmdeploy_standin import TRIES, write_lmdeploy

ROOT = Path(__file__).resolve().parents[1]
SMALL = ["--steps", "24", "--running", "12", "--num-blocks", "2048", "--prompt-mean", "40", "--output-mean", "30"]


# -- the import plan ---------------------------------------------------------------------------------------
def _fake_engine(root: Path) -> Path:
    files = {
        "fakeeng/__init__.py": "raise ImportError('package __init__ ran')\n",
        "fakeeng/core/manager.py": ("from fakeeng.heavy import Gpu\nfrom fakeeng.util import helper\n"
                                    "def work(x):\n    return helper(x) + 1\n"
                                    "def touch():\n    return Gpu.device\n"),
        "fakeeng/util.py": ("import not_installed_anywhere\nSIDE = []\nSIDE.append('module body ran')\n"
                            "def helper(x):\n    return x * FACTOR\n"
                            "def other():\n    raise AssertionError('not compiled')\n"),
        "fakeeng/heavy.py": "raise ImportError('a heavy module was executed')\n",
    }
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


def test_the_plan_runs_named_modules_from_their_files_and_nothing_else(tmp_path) -> None:
    root = _fake_engine(tmp_path)
    plan = ImportPlan(packages=("fakeeng",), real=("fakeeng.core.manager",), stubs={"fakeeng.heavy": {}},
                      pieces={"fakeeng.util": Piece("fakeeng.util", ("helper",), {"FACTOR": 10})})
    with engine_imports(plan, root) as imports:
        import fakeeng.core.manager as manager

        assert manager.__file__ == str(root / "fakeeng/core/manager.py")
        assert manager.work(2) == 21  # helper compiled from util.py, its module body (an import) not run
        assert "SIDE" not in vars(sys.modules["fakeeng.util"])
        assert "fakeeng" in imports.loaded and "fakeeng.heavy" in imports.loaded
        manager.touch()  # a stand-in may be touched while the engine loads...
        imports.arm()
        with pytest.raises(StubTouched, match=r"Gpu\.device"):
            manager.touch()  # ...not during a replay
        with pytest.raises(PlanError, match=r"fakeeng\.elsewhere"):
            __import__("fakeeng.elsewhere")
    assert not [name for name in sys.modules if name.startswith("fakeeng")]  # all dropped again
    assert not list(root.rglob("__pycache__"))  # no bytecode written into the engine's folder


def test_a_piece_that_names_a_missing_definition_or_global_is_a_plan_error(tmp_path) -> None:
    root = _fake_engine(tmp_path)
    for piece, match in ((Piece("fakeeng.util", ("nope",)), "nope"), (Piece("fakeeng.util", ("helper",)), None)):
        plan = ImportPlan(packages=("fakeeng",), real=(), pieces={"fakeeng.util": piece})
        with engine_imports(plan, root):
            if match:
                with pytest.raises(PlanError, match=match):
                    __import__("fakeeng.util")
            else:
                import fakeeng.util

                with pytest.raises(NameError, match="FACTOR"):  # a missing global fails when called, loudly
                    fakeeng.util.helper(1)


# -- fetching ----------------------------------------------------------------------------------------------
def test_engine_names_and_versions_parse_and_bad_ones_are_input_errors() -> None:
    assert parse_engine("vllm==0.33.0")[1] == "0.33.0"
    assert parse_engine("SGLang")[1] is None
    with pytest.raises(InputError, match="unknown engine"):
        parse_engine("tensorrt==1")
    with pytest.raises(InputError, match="version after"):
        parse_engine("vllm==")


def test_the_cache_and_a_source_folder_may_not_lie_inside_the_repository(tmp_path) -> None:
    with pytest.raises(InputError, match="inside the kvblock-bench repository"):
        fetch.outside_repository(ROOT / "results", "--cache")
    with pytest.raises(InputError, match="no nanovllm/ package folder"):
        fetch.source_folder(tmp_path, ("nanovllm",), None)
    code = fetch.source_folder(write_standin(tmp_path), ("nanovllm",), None)
    assert code.version == "unversioned" and code.digest.startswith("tree-sha256:")
    assert code.digest == fetch.source_folder(tmp_path, ("nanovllm",), "x").digest  # the files decide, not the label


def test_a_source_checkout_is_versioned_by_its_commit_and_a_wrong_label_is_refused(tmp_path) -> None:
    source = write_standin(tmp_path / "checkout")
    git = ["git", "-C", str(source), "-c", "user.name=t", "-c", "user.email=t@t"]
    for cmd in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "stand-in"]):
        subprocess.run(git + cmd, check=True, capture_output=True)
    commit = subprocess.run([*git, "rev-parse", "HEAD"], check=True, capture_output=True, text=True).stdout.strip()
    assert fetch.source_folder(source, ("nanovllm",), None).version == commit
    assert fetch.source_folder(source, ("nanovllm",), commit[:7]).version == commit
    with pytest.raises(InputError, match=f"at commit {commit}, not bb823b3"):
        fetch.source_folder(source, ("nanovllm",), "bb823b3")


def test_pip_fetches_a_wheel_into_the_cache_and_unpacks_its_package_once(tmp_path) -> None:
    wheel = build_wheel(write_standin(tmp_path / "src"), "nano-vllm-standin", "1.2", tmp_path / "house")
    cache = tmp_path / "cache"
    code = fetch.published("nano-vllm-standin", "1.2", ("nanovllm",), cache, find_links=tmp_path / "house")
    assert code.version == "1.2" and code.origin == wheel.name
    assert code.digest == "sha256:" + fetch.sha256_file(wheel)
    assert (code.root / "nanovllm/engine/block_manager.py").is_file()
    stamp = (code.root / ".sha256").stat().st_mtime_ns
    again = fetch.published("nano-vllm-standin", "1.2", ("nanovllm",), cache, find_links=tmp_path / "house")
    assert again == code and (code.root / ".sha256").stat().st_mtime_ns == stamp  # unpacked once
    with pytest.raises(InputError, match=r"pip download nano-vllm-standin==9\.9 failed"):
        fetch.published("nano-vllm-standin", "9.9", ("nanovllm",), cache, find_links=tmp_path / "house")


# -- the adapters' untimed per-step hook ----------------------------------------------------------------------
def test_an_adapter_records_sampled_tokens_in_the_untimed_hook_and_stops_without_it(tmp_path) -> None:
    """The engine's request objects get their sampled tokens in ``untimed_after_step`` (outside the timed step);
    a step that finds the previous step's tokens unrecorded stops the replay instead of running behind."""
    from harness.engines import nano_vllm_engine

    root = write_standin(tmp_path / "nano-src")
    with engine_imports(nano_vllm_engine.plan(), root):
        adapter = nano_vllm_engine.baselines(nano_vllm_engine.load(), "standin")[0].cls(64, 4, 4, 16)
        adapter.allocate(0, 5)
        seq = adapter.seqs[0]
        assert len(seq) == 6  # the prompt and the prefill's sampled token (its postprocess comes with admission)
        ids, cows, slots = np.array([0]), np.zeros((1, 2), dtype=np.int64), np.zeros(1, dtype=np.int64)
        adapter.decode_step(ids, cows, slots)
        assert len(seq) == 6 and slots[0] == adapter.last_slot(0)  # the step's token is not recorded in the step
        adapter.untimed_after_step(0)
        assert len(seq) == 7 and adapter.seq_len(0) == 6
        adapter.decode_step(ids, cows, slots)
        with pytest.raises(ReplayError, match="untimed_after_step"):
            adapter.decode_step(ids, cows, slots)



def test_an_adapter_makes_the_contract_s_checks_our_contenders_make(tmp_path, monkeypatch) -> None:
    """Both sides of a calibration pay the same bookkeeping around the engine's calls: an adapter's decode step
    checks its batch through the contenders' own function (each row active and listed once, the pool's room) before
    the engine is called, and a refused step leaves the engine's state as it was."""
    from harness.engines import nano_vllm_engine
    from impls.contenders.nano_vllm import NanoVllmBlockManager
    from impls.core.interpreted import InterpretedBlockManager

    checked = []
    real_args = InterpretedBlockManager._decode_args
    monkeypatch.setattr(InterpretedBlockManager, "_decode_args",
                        lambda self, *args: checked.append(type(self).__name__) or real_args(self, *args))
    root = write_standin(tmp_path / "nano-src")
    with engine_imports(nano_vllm_engine.plan(), root):
        adapter = nano_vllm_engine.baselines(nano_vllm_engine.load(), "standin")[0].cls(64, 4, 4, 16)
        ours = NanoVllmBlockManager(64, 4, 4, 16)
        cows, slots = np.zeros((2, 2), dtype=np.int64), np.zeros(2, dtype=np.int64)
        for mgr in (adapter, ours):
            mgr.allocate(0, 4)
            mgr.decode_step(np.array([0]), cows, slots)
            mgr.untimed_after_step(0) if mgr is adapter else None
        assert checked == ["NanoEngine", "NanoVllmBlockManager"]
        seq = adapter.seqs[0]
        before = (len(seq), list(seq.block_table), adapter.num_free_blocks(), seq.num_scheduled_tokens)
        for bad, exc, match in ((np.array([0, 0]), ValueError, "appears twice"), (np.array([0, 1]), KeyError,
                                                                                  "not active")):
            for mgr in (adapter, ours):
                with pytest.raises(exc, match=match):
                    mgr.decode_step(bad, cows, slots)
            assert (len(seq), list(seq.block_table), adapter.num_free_blocks(), seq.num_scheduled_tokens) == before



@pytest.mark.parametrize("version, reads", [("0.10.0", "method"), ("0.12.0", "property"), ("0.18.0", "limit")])
def test_the_lmdeploy_adapter_keeps_the_contract_on_each_era_s_layout(tmp_path, version, reads) -> None:
    """The adapter over a stand-in laid out as each era's release (what num_required_blocks reads off a sequence)
    passes the contract checker, forks and copy-on-write included, and never runs messages.py or an __init__."""
    from harness.conformance.check import check
    from harness.engines import lmdeploy_engine

    root = write_lmdeploy(tmp_path / "lmdeploy-src", reads, trie=TRIES.get(version, "package"))
    with engine_imports(lmdeploy_engine.plan(version), root) as imports:
        cls = lmdeploy_engine.baselines(lmdeploy_engine.load(version), version)[0].cls
        verdict = check(cls, seeds=(1,), max_examples=8, step_count=30)
        assert verdict.ok, verdict.failures[0].reproduction
        assert "lmdeploy.pytorch.messages" in imports.loaded  # served as a stand-in, never run


def test_the_lmdeploy_adapter_and_the_contender_take_the_same_step(tmp_path) -> None:
    """The two sides of LMDeploy's calibration share the scheduler's step (SchedulerDrive): the same sequence class,
    the same order, the same contract answers; only the block manager differs."""
    from harness.engines import lmdeploy_engine
    from impls.contenders.lmdeploy import LmdeployBlockManager, SchedulerDrive

    root = write_lmdeploy(tmp_path / "lmdeploy-src")
    with engine_imports(lmdeploy_engine.plan(), root) as imports:
        adapter = lmdeploy_engine.baselines(lmdeploy_engine.load(), "standin")[0].cls(32, 4, 4, 16)
        imports.arm()  # a stand-in touched from here on raises
        ours = LmdeployBlockManager(32, 4, 4, 16)
        assert isinstance(adapter, SchedulerDrive) and type(adapter.seqs) is type(ours.seqs)
        seen = []
        for mgr in (adapter, ours):
            cows, slots = np.zeros((4, 2), dtype=np.int64), np.zeros(4, dtype=np.int64)
            mgr.allocate(0, 6)
            mgr.fork(0, 1)
            n = mgr.decode_step(np.array([0, 1]), cows, slots)
            mgr.allocate(2, 4)
            mgr.decode_step(np.array([2, 1, 0]), cows, slots)
            mgr.free(0)
            seen.append((n, [mgr.seq_len(s) for s in (1, 2)], mgr.num_free_blocks(),
                         [[mgr.ref_count(b) for b in mgr.block_table(s)] for s in (1, 2)],
                         type(mgr.seqs[1]).__name__))
        assert seen[0] == seen[1] and seen[0][0] == 1  # the shared last block was copied once


@pytest.mark.parametrize("version, reads, trie", [("0.10.0", "method", "table-all"), ("0.12.0", "property", "table"),
                                                  ("0.15.0", "limit", "prefix_cache"), ("0.18.0", "limit", "package")])
@pytest.mark.parametrize("scenario, params", [("system-prompt-256", {"steps": 30}),
                                              ("tight-pool-cached", {"steps": 120, "num_blocks": 512,
                                                                     "running": 32})])
def test_the_lmdeploy_caching_adapter_replays_caching_traces_as_the_contender_does(tmp_path, scenario, params, version,
                                                                                    reads, trie) -> None:
    """The caching-on baseline drives each era's trie (before 0.16.0 the module block_trie.py: its cursor on the
    table, its bound num_all_ids up to 0.10.0, its cursor in seq.prefix_cache from 0.14.0; from 0.16.0 the package)
    with the token ids the contender gives its own (cut from the chain hashes): the same hits, seals, evictions and
    end state as the trace says, with no stand-in touched."""
    from harness.base.replay import check_end_state, replay
    from harness.engines import lmdeploy_engine
    from impls.contenders.lmdeploy_pc import LmdeployCachingBlockManager
    from scenarios import generate

    trace = generate(scenario, **params)
    assert trace.header["cache"]["hit_blocks"] > 0 and (scenario != "tight-pool-cached"
                                                        or trace.header["cache"]["evictions"] > 0)
    root = write_lmdeploy(tmp_path / "lmdeploy-src", reads, trie=trie)
    with engine_imports(lmdeploy_engine.plan(version), root) as imports:
        found = lmdeploy_engine.baselines(lmdeploy_engine.load(version), version)
        assert [b.name for b in found] == ["caching off", "caching on"]
        on = found[1]
        assert on.calibrates == ("lmdeploy-pc",) and on.replays(trace) and not on.plain_traces
        assert ("cache_config" in on.how) == (trie != "package")
        imports.arm()
        for cls in (on.cls, LmdeployCachingBlockManager):
            for regime in ("per-call", "batched"):
                mgr = cls(**trace.config)
                replay(trace, mgr, regime)
                check_end_state(trace, mgr)
        assert ("lmdeploy.pytorch.config" in imports.loaded) == (trie != "package")  # stood in for, never run


@pytest.mark.parametrize("version, reads, trie", [("0.10.0", "method", "table-all"), ("0.12.0", "property", "table"),
                                                  ("0.15.0", "limit", "prefix_cache"), ("0.18.0", "limit", "package")])
def test_the_lmdeploy_caching_adapter_reads_each_trie_layout_s_cursor_bound_and_key(tmp_path, version, reads,
                                                                                   trie) -> None:
    """What moved between the trie's layouts, one call each: a whole cached prompt hits every full block (the
    bound the trie stops at, counting the match's extra token), a short pool admits a prompt whose hits it shares
    (the walk of the trie's children by the layout's key), a fork keeps its parent's cursor, and a second row
    sealing a hash under the same prefix is refused (the layout's cursor and key), as the contender answers."""
    from harness.base.replay import ReplayError
    from harness.engines import lmdeploy_engine
    from impls.contenders.lmdeploy_pc import LmdeployCachingBlockManager

    h = np.array([11, 12, 13], dtype=np.uint64)
    cows, slots = np.zeros((4, 2), dtype=np.int64), np.zeros(4, dtype=np.int64)
    root = write_lmdeploy(tmp_path / "lmdeploy-src", reads, trie=trie)
    with engine_imports(lmdeploy_engine.plan(version), root) as imports:
        adapter = lmdeploy_engine.baselines(lmdeploy_engine.load(version), version)[1].cls
        imports.arm()
        seen = []
        for cls in (adapter, LmdeployCachingBlockManager):
            mgr = cls(num_blocks=4, block_size=4, max_seqs=4, max_blocks_per_seq=4)
            hits = [mgr.allocate_cached(0, 8, h[:2])]
            mgr.free(0)
            hits.append(mgr.allocate_cached(1, 8, h[:2]))  # all of it cached
            hits.append(mgr.allocate_cached(2, 12, h))  # 2 blocks free, 3 asked: the 2 hits are shared
            mgr.free(2)
            mgr.fork(1, 3)
            for _ in range(4):
                mgr.decode_step(np.array([1, 3]), cows, slots)
            mgr.seal(1, 14)
            seen.append((hits, mgr.num_free_blocks(), [mgr.seq_len(s) for s in (1, 3)]))
        assert seen[0] == seen[1] and seen[0][0] == [0, 8, 8]
        with pytest.raises(ReplayError, match="under the same prefix"):
            mgr_adapter = adapter(num_blocks=8, block_size=4, max_seqs=4, max_blocks_per_seq=4)
            mgr_adapter.allocate_cached(0, 4, h[:1])
            mgr_adapter.fork(0, 1)  # the child's cursor: its parent's
            for _ in range(4):
                mgr_adapter.decode_step(np.array([0, 1]), cows, slots)
            mgr_adapter.seal(0, 14)
            mgr_adapter.seal(1, 14)


def test_the_sglang_adapter_drives_the_allocator_as_the_contender_does(monkeypatch) -> None:
    """The SGLang adapter (here around our model of the allocator, in place of SGLang's) extends a step's admissions
    as one prefill batch, one ``alloc_extend`` of every request, when the decode batch comes, as the contender and
    SGLang's ``alloc_for_extend`` do; and its lookup is the contender's one gather, not a read per row (the untimed
    lookup sits between two timed steps: the per-row reads left the adapter's caches unlike the contender's)."""
    pytest.importorskip("torch")
    from types import SimpleNamespace

    from harness.engines import sglang_engine
    from impls.contenders.sglang import PagedAllocator, PagedRows

    def allocator(size, page_size, dtype, device, kvcache, need_sort):
        return PagedAllocator(size, page_size)

    cls = sglang_engine.baselines(SimpleNamespace(PagedTokenToKVPoolAllocator=allocator), "standin")[0].cls
    for mgr in (cls(16, 4, 4, 8), REGISTRY["sglang"](16, 4, 4, 8)):
        calls, real = [], mgr.allocator.alloc_extend
        monkeypatch.setattr(mgr.allocator, "alloc_extend", lambda prefix, *a, real=real, calls=calls: calls.append(
            len(prefix)) or real(prefix, *a))
        for row, blocks in ((0, 2), (1, 3), (2, 1)):
            mgr.allocate(row, blocks * 4)
        assert calls == [] and mgr.num_free_blocks() == 10  # the batch's pages held from each admission on
        ids, cows, slots = np.array([0, 1, 2]), np.zeros((3, 2), dtype=np.int64), np.zeros(3, dtype=np.int64)
        mgr.decode_step(ids, cows, slots)
        assert calls == [3] and slots.tolist() == [24, 28, 32]  # each row opens a block after the batch's six
        read = []
        monkeypatch.setattr(type(mgr), "_last_slot",
                            lambda self, s, read=read: read.append(s) or PagedRows._last_slot(self, s))
        looked = np.zeros(3, dtype=np.int64)
        mgr.lookup(ids, looked)
        assert looked.tolist() == slots.tolist() and read == []


# -- a trace as vLLM serves it -------------------------------------------------------------------------------
def test_fanned_out_forks_are_independent_requests_with_the_same_decode_batches() -> None:
    trace = generate("parallel-sampling", steps=60, running=24, num_blocks=4096)
    fanned = fan_out_forks(trace)
    assert trace.header["ops_by_kind"]["fork"] > 0 and fanned.header["ops_by_kind"]["fork"] == 0
    assert fanned.header["ops_by_kind"]["allocate"] == (trace.header["ops_by_kind"]["allocate"]
                                                        + trace.header["ops_by_kind"]["fork"])
    assert fanned.header["cow_count"] == 0 and fanned.header["final_free"] < trace.header["final_free"]
    assert (fanned.running_per_step() == trace.running_per_step()).all()
    assert replay(fanned, REGISTRY["flat"](**fanned.config)) == 0  # a valid trace, checked as every trace is
    paper = generate("paper", steps=5, running=8, num_blocks=512)
    assert fan_out_forks(paper) is paper


# -- the table -------------------------------------------------------------------------------------------
def _row(engine: str, scenario: str, ratio: float = 1.0, modelled: bool = True) -> CalibrationRow:
    return CalibrationRow("c", engine, "1", scenario, "batched", "b", modelled, 10.0, 9.0, 11.0, 10.0, 9.0, 11.0,
                          ratio, 0.9, 1.1, 3, 10, 100, "sha256:x", "1", "m", "1.0-1.0", "t", "cmd", "how")


def test_a_run_replaces_its_engine_s_rows_and_the_rows_the_command_did_not_make(tmp_path) -> None:
    old = [{"contender": "c", "engine": "E", "scenario": "paper", "package_digest": "sha256:a"},
           {"contender": "c", "engine": "E", "scenario": "other", "package_digest": "sha256:a"},
           {"contender": "c", "engine": "E", "scenario": "scratch", "package_digest": ""},  # not made by the command
           {"contender": "d", "engine": "F", "scenario": "paper", "package_digest": ""}]
    rows = merge(old, [_row("E", "paper")], "E", {"paper"})
    assert [(r["engine"], r["scenario"]) for r in rows] == [("E", "other"), ("F", "paper"), ("E", "paper")]
    path = tmp_path / "calibration.csv"
    write_rows(path, [_row("E", "paper", 0.5)], "E", {"paper"})
    write_rows(path, [_row("F", "paper", 2.0, modelled=False)], "F", {"paper"})
    columns, got = read_rows(path)
    assert columns[:3] == ["contender", "engine", "engine_version"]
    assert [(r["engine"], r["ratio"], r["modelled"]) for r in got] == [("E", "0.500", "true"), ("F", "2.000", "false")]


def test_the_console_says_which_modelled_rows_lie_outside_the_band() -> None:
    """Whole step and engine calls, each with its interval, inside [0.8, 1.25]; unmodelled rows are not judged."""
    from dataclasses import replace

    from harness.calibration.table import BAND, band_lines

    inside = replace(_row("E", "paper"), ratio_calls=1.0, ratio_calls_low=0.85, ratio_calls_high=1.2)
    wide = replace(inside, scenario="wide", ratio_high=1.3)  # the figure inside, its interval not
    low_calls = replace(inside, scenario="calls", ratio_calls=0.79, ratio_calls_low=0.7, ratio_calls_high=0.9)
    unmetered = replace(_row("E", "bare"), scenario="bare")
    unmodelled = replace(_row("E", "other", 2.0, modelled=False))
    lines = band_lines([inside, wide, low_calls, unmetered, unmodelled])
    assert BAND == (0.8, 1.25) and lines[0].endswith(": 1 of 4")
    assert lines[1:] == ["  outside: wide c batched vs b: whole step 1.00 [0.90-1.30]",
                         "  outside: calls c batched vs b: engine calls 0.79 [0.70-0.90]",
                         "  outside: bare c batched vs b: engine calls not measured"]
    assert band_lines([]) == [] and band_lines([unmodelled]) == [
        "no row models the engine (E): no band applies; each row says how far the design's step lies from the "
        "engine's (docs/calibration.md)"]


def test_the_reports_show_the_modelled_baseline_with_its_interval(tmp_path) -> None:
    from harness.output.report import calibration_notes

    path = tmp_path / "calibration.csv"
    write_rows(path, [_row("E", "paper", 0.8, modelled=False), _row("E", "paper", 1.2)], "E", {"paper"})
    assert calibration_notes(path)[("c", "batched")] == "calibrated: ours/real = 1.20 [0.90-1.10] (paper)"


# -- whole runs on the stand-in engine ---------------------------------------------------------------------
def _calibrate(capsys, *args: str) -> tuple[int, str, str]:
    code = main(["calibrate", *args])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.slow  # an end-to-end CLI run (make test-slow, .ci/run)
def test_calibrate_runs_the_stand_in_engine_beside_the_contender_and_writes_every_baseline(tmp_path, capsys) -> None:
    source = write_standin(tmp_path / "nano-src")
    out = tmp_path / "results" / "calibration.csv"
    before = subprocess.run(["git", "status", "--porcelain"], cwd=ROOT, capture_output=True, text=True).stdout
    code, stdout, err = _calibrate(capsys, "nano-vllm==standin", "--source", str(source), "--scenario",
                                   "paper,parallel-sampling", "--reps", "2", "--out", str(out), *SMALL)
    assert code == 0, err
    _, rows = read_rows(out)
    have = {(r["scenario"], r["call_shape"], r["baseline"]) for r in rows}
    baselines = {"hashing neutralised", "with hashing", "bare"} if _has_xxhash() else {"hashing neutralised", "bare"}
    assert have == {(s, regime, b) for s in ("paper", "parallel-sampling") for regime in ("per-call", "batched")
                    for b in baselines}
    for r in rows:
        assert r["contender"] == "nano-vllm" and r["engine"] == "nano-vllm" and r["engine_version"] == "standin"
        assert r["modelled"] == ("true" if r["baseline"] == "hashing neutralised" else "false")
        assert r["package_digest"].startswith("tree-sha256:") and r["reps"] == "2" and r["steps"] == "24"
        ratio, low, high = float(r["ratio"]), float(r["ratio_low"]), float(r["ratio_high"])
        assert math.isfinite(ratio) and 0 < low <= high  # an interval (timings on a tiny trace: nothing more)
        assert math.isclose(ratio, float(r["ours_ns_per_seq_step"]) / float(r["real_ns_per_seq_step"]),
                            rel_tol=0.01, abs_tol=0.0006)  # the ratio of the two figures, rounded
        assert "nanovllm.engine.block_manager" in r["how"] and r["machine"] and r["command"].startswith("kvblock-bench")
        for side in ("ours", "real"):  # the engine's own calls apart from the shared rest of the step
            calls, low, high = (float(r[f"{side}_calls_{x}"]) for x in ("ns", "low", "high"))
            assert 0 < low <= calls <= high and float(r[f"{side}_shared_ns"]) > 0
        assert math.isfinite(float(r["ratio_calls"])) and "engine calls apart" in r["how"]
    assert "(modelled)" in stdout and "engine calls" in stdout
    assert (out.parent / "runs" / "nano-vllm__paper.json.gz").is_file()
    after = subprocess.run(["git", "status", "--porcelain"], cwd=ROOT, capture_output=True, text=True).stdout
    assert after == before  # nothing written into the repository


def _checksums(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def _committed_copy(tmp_path: Path, monkeypatch) -> Path:
    """A working folder holding a copy of the committed results/calibration/, made the current folder."""
    work = tmp_path / "work"
    shutil.copytree(ROOT / "results" / "calibration", work / "results" / "calibration")
    monkeypatch.chdir(work)
    return work / "results" / "calibration"


def _worker_pids(runs: Path, scenario: str) -> dict[str, int]:
    with gzip.open(runs / f"nano-vllm__{scenario}.json.gz") as fh:
        return json.load(fh)["worker_pid_of_repetition"]


@pytest.mark.slow  # an end-to-end CLI run (make test-slow, .ci/run)
def test_calibrate_writes_a_new_folder_by_default_and_leaves_the_committed_rows_alone(tmp_path, capsys,
                                                                                       monkeypatch) -> None:
    source = write_standin(tmp_path / "nano-src")
    committed = _committed_copy(tmp_path, monkeypatch)
    before = _checksums(committed)
    code, stdout, err = _calibrate(capsys, "nano-vllm==standin", "--source", str(source), "--scenario", "paper",
                                   "--reps", "3", *SMALL)
    assert code == 0, err
    assert _checksums(committed) == before
    written = re.search(r"calibration rows written to (\S+/calibration\.csv)", stdout)
    assert written, stdout
    folder = Path(written.group(1)).parent
    assert folder.parent == Path("results") and re.fullmatch(r"\d{8}-\d{6}-calibration-nano-vllm", folder.name)
    _, rows = read_rows(folder / "calibration.csv")
    assert {r["scenario"] for r in rows} == {"paper"} and all(r["reps"] == "3" for r in rows)
    pids = _worker_pids(folder / "runs", "paper")
    assert sorted(pids) == ["0", "1", "2"] and len(set(pids.values())) == 3 and os.getpid() not in pids.values()
    assert "repetitions spread over 3 worker processes" in stdout
    assert all("spread over 3 worker processes" in r["how"] for r in rows)


@pytest.mark.slow  # an end-to-end CLI run (make test-slow, .ci/run)
def test_update_committed_replaces_the_engine_s_measured_rows_only(tmp_path, capsys, monkeypatch) -> None:
    source = write_standin(tmp_path / "nano-src")
    committed = _committed_copy(tmp_path, monkeypatch)
    old_columns, old = read_rows(committed / "calibration.csv")
    kept = [r for r in old if not (r["engine"] == "nano-vllm" and r["scenario"] == "paper")]
    code, stdout, err = _calibrate(capsys, "nano-vllm==standin", "--source", str(source), "--scenario", "paper",
                                   "--reps", "3", "--processes", "2", "--update-committed", *SMALL)
    assert code == 0, err
    assert "calibration rows written to results/calibration/calibration.csv" in stdout
    _, new = read_rows(committed / "calibration.csv")
    # every other row as it was; columns added since it was measured (the engine calls) left blank, not invented
    assert [{k: r[k] for k in old_columns} for r in new[:len(kept)]] == kept
    assert all(v == "" for r in new[:len(kept)] for k, v in r.items() if k not in old_columns)
    assert {(r["engine"], r["engine_version"], r["reps"]) for r in new[len(kept):]} == {("nano-vllm", "standin", "3")}
    pids = _worker_pids(committed / "runs", "paper")
    assert sorted(pids) == ["0", "1", "2"] and len(set(pids.values())) == 2
    assert pids["0"] == pids["2"] != pids["1"]  # repetitions dealt out over the two workers, as `run` deals them


def test_an_engine_that_disagrees_with_the_trace_is_named_and_writes_no_row(tmp_path, capsys) -> None:
    source = write_standin(tmp_path / "nano-src", leak=True)
    out = tmp_path / "calibration.csv"
    code, _, err = _calibrate(capsys, "nano-vllm", "--source", str(source), "--scenario", "paper", "--reps", "1",
                              "--out", str(out), *SMALL)
    assert code == 1
    assert "failed: paper: hashing neutralised (the engine, batched)" in err and "ReplayError" in err
    assert not out.exists()


@pytest.mark.slow  # an end-to-end CLI run (make test-slow, .ci/run)
def test_a_worker_that_dies_in_the_engine_s_code_fails_those_replays_and_measures_the_rest(tmp_path, capsys) -> None:
    source = write_standin(tmp_path / "nano-src")  # hash_blocks exits the process; the "bare" baseline skips it
    path = source / "nanovllm/engine/block_manager.py"
    path.write_text(path.read_text().replace("    def hash_blocks(self, seq):\n",
                                             "    def hash_blocks(self, seq):\n        __import__('os')._exit(3)\n"))
    out = tmp_path / "calibration.csv"
    code, _, err = _calibrate(capsys, "nano-vllm", "--source", str(source), "--scenario", "paper", "--reps", "2",
                              "--processes", "1", "--out", str(out), *SMALL)
    assert code == 1
    assert "failed: paper: hashing neutralised (the engine, batched): its worker process exited with status 3" in err
    _, rows = read_rows(out)
    assert {(r["baseline"], r["call_shape"], r["reps"]) for r in rows} == {("bare", "per-call", "2"),
                                                                          ("bare", "batched", "2")}


@pytest.mark.parametrize("args, message", [
    (["tensorrt"], "unknown engine"),
    (["nano-vllm"], "not published on the package index: give its source folder with --source"),
    (["nano-vllm", "--source", "/nonexistent-kvb"], "no nanovllm/ package folder"),
    (["vllm", "--cache", str(ROOT / "results" / "x")], "inside the kvblock-bench repository"),
    (["nano-vllm", "--scenario", "nope"], "--scenario nope: unknown scenario"),
    (["nano-vllm", "--source", "/tmp", "--bogus-param", "1"], "unrecognized arguments"),
    (["nano-vllm", "--out", str(ROOT / "results")], "not a file; give the calibration table"),
    (["nano-vllm", "--results", str(ROOT / "README.md")], "is a file, not a folder"),
    (["nano-vllm", "--out", "x.csv", "--update-committed"], "--out and --update-committed both name a table"),
    (["nano-vllm", "--processes", "0"], "--processes"),
])
def test_bad_calibrate_input_is_one_line_and_exit_status_2(capsys, args, message) -> None:
    code, _, err = _calibrate(capsys, *args)
    assert code == 2 and message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_a_package_the_engine_needs_that_is_not_installed_is_named(tmp_path, capsys) -> None:
    source = write_standin(tmp_path / "nano-src")
    path = source / "nanovllm/engine/sequence.py"
    path.write_text("import kvb_not_installed_anywhere\n" + path.read_text())
    code, _, err = _calibrate(capsys, "nano-vllm", "--source", str(source), "--out", str(tmp_path / "c.csv"), *SMALL)
    assert code == 2 and "needs the package 'kvb_not_installed_anywhere', which is not installed here" in err
    code, _, err = _calibrate(capsys, "nano-vllm", "--source", str(source), "--steps", "-3")
    assert code == 2 and "steps" in err and "Traceback" not in err


# -- an engine's failures, a table that cannot take the rows, a changed cache (issue 36) -----------------------
def _calibrate_standin(capsys, source: Path, *args: str) -> tuple[int, str, str]:
    return _calibrate(capsys, "nano-vllm", "--source", str(source), "--scenario", "paper", "--reps", "1", *args,
                      *SMALL)


def _last_error(err: str) -> str:
    assert "Traceback" not in err, err
    return err.strip().splitlines()[-1]


@pytest.mark.parametrize("code, reason", [
    ("import sys; sys.exit(0)", "its code failed while its modules were imported: SystemExit: 0"),
    ("raise SystemExit(3)", "SystemExit: 3"),
    ("raise RuntimeError('the engine broke')", "RuntimeError: the engine broke"),
    ("raise KeyError('NANO_HOME')", "KeyError: 'NANO_HOME'"),
    ("raise MemoryError", "MemoryError"),
    ("import os; os._exit(0)", "the worker process importing its modules exited with status 0"),
])
def test_an_engine_that_fails_while_its_modules_import_is_one_line_and_exit_2(tmp_path, capsys, code, reason) -> None:
    source = write_standin(tmp_path / "nano-src")
    path = source / "nanovllm/engine/sequence.py"
    path.write_text(code + "\n" + path.read_text())
    out = tmp_path / "calibration.csv"
    status, _, err = _calibrate_standin(capsys, source, "--out", str(out))
    last = _last_error(err)
    assert status == 2 and last.startswith("kvblock-bench: error: nano-vllm unversioned: ") and reason in last, err
    assert not out.exists()


def test_an_engine_import_that_hangs_is_stopped_at_the_deadline(tmp_path, capsys) -> None:
    source = write_standin(tmp_path / "nano-src")
    path = source / "nanovllm/engine/block_manager.py"
    path.write_text("import time\ntime.sleep(3600)\n" + path.read_text())
    status, _, err = _calibrate_standin(capsys, source, "--out", str(tmp_path / "c.csv"), "--deadline", "2")
    assert status == 2 and "importing its modules made no progress for 2 s (the deadline) and was killed" in \
        _last_error(err)


def test_an_engine_that_exits_0_in_a_replay_fails_those_replays_with_one_line_each(tmp_path, capsys) -> None:
    source = write_standin(tmp_path / "nano-src")
    path = source / "nanovllm/engine/block_manager.py"
    path.write_text(path.read_text().replace("    def may_append(self, seq):\n",
                                             "    def may_append(self, seq):\n        __import__('sys').exit(0)\n"))
    out = tmp_path / "calibration.csv"
    status, _, err = _calibrate_standin(capsys, source, "--out", str(out))
    assert status == 1 and "Traceback" not in err, err
    failed = [line for line in err.splitlines() if line.startswith("failed: ")]
    engine_exit = re.compile(r"\(the engine, (per-call|batched)\): SystemExit: 0$")
    assert failed and all(engine_exit.search(line) for line in failed), err
    assert {"failed: paper: bare (the engine, per-call): SystemExit: 0",
            "failed: paper: bare (the engine, batched): SystemExit: 0"} <= set(failed)  # each regime the engine ran
    assert not out.exists()  # no engine figure, no ratio, no row


def _state(path: Path) -> object:
    if path.is_symlink():
        return ("link", os.readlink(path))
    if path.is_dir():
        return _checksums(path)
    return path.read_bytes() if path.is_file() else None


@pytest.mark.parametrize("kind, message", [
    ("folder", "not a file"), ("/dev/full", "not a file"), ("link loop", "a loop of symbolic links"),
    ("not UTF-8", "cannot be read ('utf-8' codec"), ("huge field", "cannot be read (field larger than field limit"),
])
def test_an_out_that_cannot_take_the_rows_is_refused_before_anything_is_measured(tmp_path, capsys, kind,
                                                                                 message) -> None:
    source = write_standin(tmp_path / "nano-src")
    out = Path(kind) if kind.startswith("/") else tmp_path / "table.csv"
    if not out.parent.is_dir() or (kind.startswith("/") and not out.exists()):
        pytest.skip(f"no {kind} here")
    if kind == "folder":
        out.mkdir()
        (out / "calibration.csv").write_text("contender,engine\nc,E\n")
    elif kind == "link loop":
        out.symlink_to(out.name)
    elif kind in ("not UTF-8", "huge field"):
        tail = b"\xff\xfe,E\n" if kind == "not UTF-8" else b"c," + b"E" * 200_000  # over csv's field limit
        out.write_bytes(b"contender,engine\nc,E\n" + tail)
    before = _state(out)
    status, _, err = _calibrate_standin(capsys, source, "--out", str(out))
    # one line, and nothing before it: refused before the engine was loaded, let alone measured
    assert status == 2 and len(err.strip().splitlines()) == 1, err
    assert _last_error(err).startswith(f"kvblock-bench: error: --out {out}: ") and message in err, err
    assert _state(out) == before and not (out.parent / "runs").exists()  # the earlier rows as they were


def _standin_wheel(tmp_path: Path) -> tuple[Path, Path]:
    house = tmp_path / "house"
    build_wheel(write_standin(tmp_path / "src"), "nano-vllm-standin", "1.2", house)
    return house, tmp_path / "cache"


def test_the_unpacked_cache_is_checked_file_by_file_and_unpacked_again_when_changed(tmp_path) -> None:
    house, cache = _standin_wheel(tmp_path)
    wheel = next(house.glob("*.whl"))
    code = fetch.unpack(wheel, ("nanovllm",), cache)
    manager = code.root / "nanovllm/engine/block_manager.py"
    pristine = manager.read_bytes()

    def file_and_manifest() -> None:  # the wheel's RECORD still tells
        manifest = json.loads((code.root / fetch.MANIFEST).read_text())
        manager.write_bytes(pristine + b"\n# changed\n")
        manifest["nanovllm/engine/block_manager.py"] = fetch.sha256_file(manager)
        (code.root / fetch.MANIFEST).write_text(json.dumps(manifest))

    for change, path in ((lambda: manager.write_bytes(pristine + b"\n# changed\n"), "nanovllm/engine/block_manager.py"),
                         (file_and_manifest, "nanovllm/engine/block_manager.py"),
                         (lambda: manager.unlink(), "nanovllm/engine/block_manager.py"),
                         (lambda: (code.root / "nanovllm/engine/extra.py").write_text(""), "nanovllm/engine/extra.py"),
                         (lambda: (code.root / fetch.MANIFEST).write_text("{}"), "nanovllm/__init__.py")):
        change()
        again = fetch.unpack(wheel, ("nanovllm",), cache)
        assert path in again.repaired and again == code
        assert manager.read_bytes() == pristine and not (code.root / "nanovllm/engine/extra.py").exists()
    assert fetch.unpack(wheel, ("nanovllm",), cache).repaired == ()


def test_a_wheel_whose_files_disagree_with_its_record_is_refused(tmp_path) -> None:
    import zipfile

    house, cache = _standin_wheel(tmp_path)
    wheel = next(house.glob("*.whl"))
    with zipfile.ZipFile(wheel) as zf:
        members = {name: zf.read(name) for name in zf.namelist()}
    members["nanovllm/engine/sequence.py"] += b"\n# not what RECORD lists\n"
    with zipfile.ZipFile(wheel, "w") as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    with pytest.raises(InputError, match=r"engine/sequence\.py does not match the wheel's RECORD"):
        fetch.unpack(wheel, ("nanovllm",), cache)


@pytest.mark.slow  # an end-to-end CLI run (make test-slow, .ci/run)
def test_calibrate_unpacks_a_changed_cached_file_again_before_importing_it(tmp_path, capsys, monkeypatch) -> None:
    from dataclasses import replace

    from harness.engines.catalog import ENGINES

    house, cache = _standin_wheel(tmp_path)
    code = fetch.published("nano-vllm-standin", "1.2", ("nanovllm",), cache, find_links=house)
    changed = code.root / "nanovllm/engine/sequence.py"
    pristine = changed.read_bytes()
    changed.write_text("raise RuntimeError('changed in the cache')\n")  # the wheel's stamp still matches
    monkeypatch.setitem(ENGINES, "nano-vllm", replace(ENGINES["nano-vllm"], distribution="nano-vllm-standin"))
    out = tmp_path / "calibration.csv"
    status, _, err = _calibrate(capsys, "nano-vllm==1.2", "--cache", str(cache), "--find-links", str(house),
                                "--scenario", "paper", "--reps", "1", "--out", str(out), *SMALL)
    assert status == 0, err
    assert "differed from the wheel (nanovllm/engine/sequence.py): unpacked again" in err
    assert changed.read_bytes() == pristine
    _, rows = read_rows(out)
    assert rows and all(r["package_digest"] == code.digest and r["engine_version"] == "1.2" for r in rows)


def _has_xxhash() -> bool:
    from harness.engines.nano_vllm_engine import have_xxhash

    return have_xxhash()


# -- the real engines --------------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("engine, baselines, digest", [
    ("sglang==0.5.23", {"one torch thread"},
     "sha256:00b3cd5b265a"),
    ("vllm==0.33.0", {"caching off", "caching on", "caching on, no block hashes"}, "sha256:4b6bdec4ab26"),
    ("lmdeploy==0.18.0", {"caching off"}, "sha256:e6790a25dcdb"),
])
def test_calibrate_runs_the_published_engines(tmp_path, capsys, engine, baselines, digest) -> None:
    """The published wheels (fetched once into the user's cache), on short traces: every baseline loads, replays
    correctly and gives a figure. Skipped when the package index cannot be reached."""
    out = tmp_path / "calibration.csv"
    code, _, err = _calibrate(capsys, engine, "--scenario", "paper,parallel-sampling", "--reps", "2", "--out",
                              str(out), "--steps", "40", "--running", "32")
    if code == 2 and "pip download" in err:
        pytest.skip(f"the package index is not reachable: {err.strip()}")
    assert code == 0, err
    _, rows = read_rows(out)
    assert {r["baseline"] for r in rows} == baselines
    assert all(r["package_digest"].startswith(digest) and math.isfinite(float(r["ratio"])) for r in rows)
    for r in rows:  # vLLM replays parallel-sampling with its forks fanned out, and says so only there
        assert ("independent request" in r["how"]) == (engine.startswith("vllm") and r["scenario"] != "paper")


@pytest.mark.slow
def test_calibrate_runs_nano_vllm_from_its_source_folder(tmp_path, capsys) -> None:
    """Set NANO_VLLM_SOURCE to a checkout of GeeeekExplorer/nano-vllm (e.g. at bb823b3) to run this."""
    source = os.environ.get("NANO_VLLM_SOURCE")
    if not source:
        pytest.skip("NANO_VLLM_SOURCE (a nano-vllm checkout) is not set")
    out = tmp_path / "calibration.csv"
    code, _, err = _calibrate(capsys, "nano-vllm", "--source", source, "--scenario", "paper,parallel-sampling",
                              "--reps", "2", "--out", str(out), "--steps", "40", "--running", "32")
    assert code == 0, err
    with out.open() as fh:
        assert {r["baseline"] for r in csv.DictReader(fh)} >= {"hashing neutralised", "bare"}
