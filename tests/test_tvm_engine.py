"""``calibrate tvm``: TVM's paged KV cache beside our C++ tier. The adapter's mapping of the contract onto the
runtime's functions, the catalog record, the two wheels' fetch and the compiled package's import, on a stand-in of
the runtime (tests/tvm_standin.py); one slow run on the real wheels when they are in the cache."""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import pytest

from harness.base.replay import check_end_state, replay
from harness.calibration.table import CalibrationRow, read_rows
from harness.cli import main
from harness.engines import fetch
from harness.engines.call_meter import WHOLE_STEP
from harness.engines.catalog import CPP_TIER, ENGINES, parse_engine
from harness.engines.loader import ImportPlan, PlanError, engine_imports
from harness.engines.tvm_engine import TvmEngine, baselines, era, plan, wheels
from harness.errors import InputError
from impls.native import UNAVAILABLE_REASON
from scenarios import generate
from tests.tvm_standin import CALLS, namespace, write_package, write_wheels

VERSION = "0.27.0.post1"
SMALL = ("--steps", "30", "--running", "12")


def _engine(length: bool = True, **config):
    cls = type("TvmEngine", (TvmEngine,), {"tvm": namespace(length)})
    return cls(**({"num_blocks": 32, "block_size": 4, "max_seqs": 8, "max_blocks_per_seq": 16} | config))


def _step(mgr, ids: list[int]) -> tuple[int, np.ndarray, np.ndarray]:
    cow, slot = np.zeros((8, 2), np.int64), np.full(8, -1, np.int64)
    n = mgr.decode_step(np.array(ids, np.int64), cow, slot)
    mgr.untimed_after_step(0)
    return n, cow[:n], slot[: len(ids)]


# -- the adapter, on the stand-in runtime -------------------------------------------------------------------
def test_each_contract_operation_is_the_runtime_calls_an_engine_makes() -> None:
    """Admission: add_sequence and a prefill forward; a decode step: one begin_forward(ids, ones) and end_forward;
    fork: fork_sequence(parent, child, -1); free: remove_sequence. Nothing else reaches the runtime."""
    mgr = _engine()
    CALLS.clear()
    mgr.allocate(0, 6)
    mgr.allocate(3, 4)
    assert CALLS == [("add", 0), ("begin", (0,), (6,)), ("end",), ("add", 3), ("begin", (3,), (4,)), ("end",)]
    CALLS.clear()
    n, _, slots = _step(mgr, [3, 0])
    assert CALLS == [("begin", (3, 0), (1, 1)), ("end",)] and n == 0
    assert slots.tolist() == [0, 2]  # the offsets in their pages of tokens 5 and 7 (pages of 4)
    CALLS.clear()
    mgr.fork(0, 5)
    mgr.free(3)
    assert CALLS == [("fork", 0, 5, -1), ("remove", 3)]
    assert mgr.seq_len(5) == mgr.seq_len(0) == 7 and mgr.num_free_blocks() == 32 - 2


def test_a_fork_s_copy_made_at_once_by_the_engine_is_reported_at_the_contract_s_append() -> None:
    """TVM copies the partial last page when it forks; the contract copies at the next append of a row sharing it:
    the adapter reports TVM's copy there (its pages), counts its page free until then, and drops it when a sharing
    row is freed first. A fork at a page boundary copies nothing."""
    mgr = _engine()
    mgr.allocate(0, 6)
    table = mgr.block_table(0)
    mgr.fork(0, 1)
    mgr.fork(0, 2)
    assert mgr.num_free_blocks() == 30  # the contract has copied nothing yet
    n, cow, _ = _step(mgr, [2, 0, 1])
    assert n == 2 and mgr.num_free_blocks() == 28  # two of the three rows sharing the page copy it
    assert {int(src) for src, _ in cow} == {table[-1]} and len({int(dst) for _, dst in cow}) == 2
    assert len({tuple(mgr.block_table(s)) for s in (0, 1, 2)}) == 3 and mgr.block_table(1)[0] == table[0]
    mgr.fork(1, 3)
    mgr.free(3)  # freed before its append: the contract never copies for it
    assert _step(mgr, [1])[0] == 0 and mgr.num_free_blocks() == 28  # its eighth token fills the page
    mgr.allocate(4, 8)
    mgr.fork(4, 5)  # 8 tokens: a page boundary
    assert _step(mgr, [4, 5])[0] == 0 and mgr.block_table(4)[:2] == mgr.block_table(5)[:2]
    for s in (0, 1, 2, 4, 5):
        mgr.free(s)
    assert mgr.num_free_blocks() == 32


@pytest.mark.parametrize("scenario", ["paper", "parallel-sampling", "beam-search"])
@pytest.mark.parametrize("regime", ["batched", "per-call"])
def test_the_adapter_replays_the_traces_with_their_copies_and_end_state(scenario, regime) -> None:
    """Every answer, copy-on-write count and the end state (free pages, TVM's lengths, its pages read through its
    debug function, up to renaming) agree with the trace."""
    trace = generate(scenario, steps=40, running=12)
    mgr = _engine(**trace.config)
    assert replay(trace, mgr, regime) == int(trace.step_cows.sum())
    check_end_state(trace, mgr)


def test_before_0_27_0_a_length_is_the_end_tvm_s_debug_read_reaches() -> None:
    """0.25.0 and 0.26.0 register no length getter: the adapter reads TVM's length as the longest prefix its
    debug_get_kv accepts (it refuses an end past the length), so the end-state check still reads TVM's count."""
    trace = generate("parallel-sampling", steps=40, running=12)
    mgr = _engine(False, **trace.config)
    replay(trace, mgr, "batched")
    check_end_state(trace, mgr)
    row = next(s for s in range(mgr.max_seqs) if mgr._lens[s])
    kv, length = mgr._kv, int(mgr._lens[row])
    assert mgr.seq_len(row) == length
    kv.lens[row] = length - 1  # TVM counts a token fewer than the contract: the adapter says TVM's count
    assert mgr.seq_len(row) == length - 1
    kv.tables[row] += [kv.take(), kv.take()]  # and a few more (pages for them)
    kv.lens[row] = length + 3
    assert mgr.seq_len(row) == length + 3


def test_the_call_meter_sees_the_runtime_calls_alone() -> None:
    """The meter goes on ``cache`` (TVM's object and its functions), the baseline calibrates the C++ tier and models
    none of it (no band applies)."""
    [b] = baselines(namespace(), VERSION)
    assert b.engine_object == "cache" and b.calibrates == CPP_TIER and b.modelled_by == ()
    mgr = b.cls(num_blocks=16, block_size=4)
    from harness.engines.call_meter import public_methods

    assert set(public_methods(mgr.cache)) == {"add_sequence", "remove_sequence", "fork_sequence", "begin_forward",
                                              "end_forward", "num_available_pages", "sequence_length"}


def test_a_ratio_far_below_one_keeps_three_significant_digits_in_the_table() -> None:
    from dataclasses import replace

    row = CalibrationRow("cpp-flat", "TVM", VERSION, "paper", "batched", "page bookkeeping", False, 3.0, 3.0, 3.0,
                         749.0, 717.0, 779.0, 0.00368, 0.00351, 0.0041, 5, 2000, 512000, "sha256:x", "1", "m", "4",
                         "t", "cmd", "how", ratio_calls=0.0068)
    cells = row.cells()
    assert (cells["ratio"], cells["ratio_low"], cells["ratio_high"], cells["ratio_calls"]) == (
        "0.00368", "0.00351", "0.0041", "0.0068")
    assert replace(row, ratio=0.974).cells()["ratio"] == "0.974" and replace(row, ratio=1.2).cells()["ratio"] == "1.200"


def test_the_site_says_no_design_models_tvm(tmp_path) -> None:
    from harness.calibration.table import write_rows
    from harness.site.results_pages import calibration_page

    def row(contender: str, engine: str, modelled: bool) -> CalibrationRow:
        return CalibrationRow(contender, engine, "1", "paper", "batched", "b", modelled, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0,
                              1.0, 1.0, 1.0, 1, 1, 1, "sha256:x", "1", "m", "1", "t", "cmd", "how")

    write_rows(tmp_path / "calibration" / "calibration.csv", [row("sglang", "SGLang", True)], "SGLang", {"paper"})
    assert "No design models" not in calibration_page(tmp_path, tmp_path / "site")
    write_rows(tmp_path / "calibration" / "calibration.csv", [row("cpp-flat", "TVM", False)], "TVM", {"paper"})
    assert "No design models TVM: those rows say how far" in calibration_page(tmp_path, tmp_path / "site")


# -- the catalog record, the wheels, the import --------------------------------------------------------------
def test_the_tvm_record_calibrates_the_cpp_tier_from_two_pinned_wheels() -> None:
    engine, version = parse_engine(f"tvm=={VERSION}")
    assert (engine.distribution, engine.label, version) == ("apache-tvm", "TVM", VERSION)
    assert engine.regimes == {name: ("batched",) for name in CPP_TIER}
    assert engine.engine_objects == dict.fromkeys(CPP_TIER, WHOLE_STEP)
    assert engine.wheels(None) == wheels(VERSION) == (VERSION, ("apache-tvm-ffi==0.1.15.post2",))
    assert ENGINES["vllm"].wheels("0.33.0") == ("0.33.0", ())
    assert plan(VERSION).compiled == ("tvm_ffi",)
    # 0.25.0's runtime links a symbol only apache-tvm-ffi 0.1.12 exports; 0.26.0 runs with 0.27.0's companion
    assert [wheels(v)[1] for v in ("0.25.0", "0.25.0.post1", "0.26.0", "0.27.0")] == [
        ("apache-tvm-ffi==0.1.12",)] * 2 + [("apache-tvm-ffi==0.1.15.post2",)] * 2
    assert [era(v).drive["length"] for v in ("0.25.0", "0.26.0", "0.27.0")] == [False, False, True]
    for bad, reason in (("0.24.0", "lists no apache-tvm release before 0.25.0"), ("0.28.0", "newer than")):
        with pytest.raises(InputError, match=reason):
            wheels(bad)


def test_the_two_wheels_unpack_into_one_folder_with_both_digests(tmp_path) -> None:
    links = write_wheels(tmp_path / "wheels")
    e = ENGINES["tvm"]
    code = fetch.published(e.distribution, VERSION, e.packages, tmp_path / "cache", links, e.binaries,
                           e.wheels(VERSION)[1])
    assert (code.root / "tvm" / "lib" / "libtvm_runtime.so").is_file() and (code.root / "tvm_ffi" /
                                                                              "__init__.py").is_file()
    assert re.fullmatch(r"sha256:[0-9a-f]{64}\+sha256:[0-9a-f]{64}", code.digest) and code.version == VERSION
    assert " + " in code.origin and not code.repaired
    (code.root / "tvm_ffi" / "_runtime.py").write_text("changed")
    again = fetch.published(e.distribution, VERSION, e.packages, tmp_path / "cache", links, e.binaries,
                            e.wheels(VERSION)[1])
    assert again.repaired == ("tvm_ffi/_runtime.py",) and again.digest == code.digest


def test_a_compiled_package_imports_from_the_folder_and_never_from_elsewhere(tmp_path) -> None:
    root = write_package(tmp_path / "root")
    with engine_imports(ImportPlan(packages=("tvm_ffi",), real=(), compiled=("tvm_ffi",)), root) as imports:
        import tvm_ffi

        assert Path(tvm_ffi.__file__).is_relative_to(root) and "tvm_ffi._runtime" in imports.loaded
    plan_elsewhere = ImportPlan(packages=("tvm_ffi",), real=(), compiled=("tvm_ffi",))
    with engine_imports(plan_elsewhere, tmp_path / "empty"), pytest.raises(PlanError, match="not found under"):
        import tvm_ffi


@pytest.mark.parametrize("missing, library, version, message", [
    ("kv_state_fork_sequence", None, VERSION, "libtvm_runtime.so registers no vm.builtin.kv_state_fork_sequence"),
    ("kv_state_fork_sequence", None, "0.25.0", "registers no vm.builtin.kv_state_fork_sequence; the adapter "
     "(harness/engines/tvm_engine.py) drives the functions of the runtimes of 0.25.0..0.25.0.post1"),
    ("attention_kv_cache_get_sequence_length", None, "0.27.0", "registers no vm.builtin.attention_kv_cache_get_seq"),
    ("", b"not a shared library", VERSION, "libtvm_runtime.so does not load"),
])
def test_a_runtime_that_does_not_load_or_lacks_a_function_is_an_input_error(tmp_path, missing, library, version,
                                                                           message) -> None:
    import _ctypes

    from harness.engines.tvm_engine import LIBRARY, load

    root = write_package(tmp_path / "root", missing)
    (root / LIBRARY).parent.mkdir(parents=True)
    (root / LIBRARY).write_bytes(library or Path(_ctypes.__file__).read_bytes())
    with engine_imports(plan(version), root), pytest.raises(InputError, match=re.escape(message)):
        load(version)


@pytest.mark.parametrize("version", ["0.25.0", "0.26.0"])
def test_a_runtime_before_0_27_0_loads_without_a_length_getter(tmp_path, version) -> None:
    import _ctypes

    from harness.engines.tvm_engine import LIBRARY, load

    root = write_package(tmp_path / "root", "attention_kv_cache_get_sequence_length")
    (root / LIBRARY).parent.mkdir(parents=True)
    (root / LIBRARY).write_bytes(Path(_ctypes.__file__).read_bytes())
    with engine_imports(plan(version), root):
        tvm = load(version)
    assert tvm.length is None and tvm.debug_get_kv is not None


# -- whole runs through the CLI -----------------------------------------------------------------------------
def _calibrate(capsys, *args: str) -> tuple[int, str, str]:
    code = main(["calibrate", *args])
    out, err = capsys.readouterr()
    assert "Traceback" not in err, err
    return code, out, err


@pytest.mark.parametrize("args, wheels_kind, message", [
    (("tvm==0.24.0",), None, "tvm 0.24.0: older than the plans drive (0.25.0..0.27.0.post1): the package index"),
    ((f"tvm=={VERSION}", "--source", "/tmp"), None, "--source: tvm's block manager is compiled code"),
    ((f"tvm=={VERSION}",), "none", f"pip download apache-tvm=={VERSION} failed"),
    pytest.param((f"tvm=={VERSION}",), "missing", "libtvm_runtime.so registers no vm.builtin.kv_state_fork_sequence",
                 marks=pytest.mark.slow),  # a worker process starts: a few seconds
    pytest.param((f"tvm=={VERSION}",), "not a library", "libtvm_runtime.so does not load", marks=pytest.mark.slow),
])
def test_bad_tvm_input_is_one_line_and_exit_status_2(tmp_path, capsys, args, wheels_kind, message) -> None:
    links = tmp_path / "wheels"
    links.mkdir()
    if wheels_kind == "missing":
        write_wheels(links, missing="kv_state_fork_sequence")
    elif wheels_kind == "not a library":
        write_wheels(links, library=b"not a shared library")
    code, _, err = _calibrate(capsys, *args, "--find-links", str(links), "--cache", str(tmp_path / "cache"),
                              "--out", str(tmp_path / "out.csv"), "--reps", "1", *SMALL)
    lines = err.strip().splitlines()
    assert code == 2 and message in lines[-1] and lines[-1].startswith("kvblock-bench: error: "), err
    assert len(lines) <= 2  # the line naming the wheels fetched, where they were
    assert not (tmp_path / "out.csv").exists()


@pytest.mark.slow  # an end-to-end CLI run (make test-slow, .ci/run)
@pytest.mark.skipif(UNAVAILABLE_REASON is not None, reason=f"the C++ tier is not built: {UNAVAILABLE_REASON}")
def test_calibrate_tvm_times_the_cpp_tier_beside_the_stand_in_runtime(tmp_path, capsys) -> None:
    """Every C++ design on both scenarios, paired with the runtime's page bookkeeping, whole step and engine calls
    (ours: the whole native step), no row modelled and the console saying no band applies."""
    out = tmp_path / "calibration.csv"
    code, stdout, err = _calibrate(capsys, f"tvm=={VERSION}", "--find-links", str(write_wheels(tmp_path / "w")),
                                   "--cache", str(tmp_path / "cache"), "--out", str(out), "--reps", "2", *SMALL)
    assert code == 0, err
    _, rows = read_rows(out)
    assert sorted((r["scenario"], r["contender"]) for r in rows) == sorted(
        (s, c) for s in ("paper", "parallel-sampling") for c in CPP_TIER)
    for r in rows:
        assert r["engine"] == "TVM" and r["baseline"] == "page bookkeeping" and r["modelled"] == "false"
        assert all(math.isfinite(float(r[k])) for k in ("ratio", "ratio_low", "ratio_high", "ratio_calls",
                                                        "ours_calls_ns", "real_calls_ns"))
        assert "the whole step timed inside C++" in r["how"] and "public methods of `cache`" in r["how"]
        assert r["how"].startswith(f"ours: {r['contender']}, batched regime, the whole replay inside C++")
    assert "no row models the engine (TVM): no band applies" in stdout


@pytest.mark.slow
def test_calibrate_tvm_runs_the_real_runtime_from_the_cache(tmp_path, capsys) -> None:
    """The published wheels, when they are in the engines' cache (``calibrate tvm`` fetched them once): read from
    there (--find-links), unpacked into a temporary cache, replayed on short traces."""
    downloads = fetch.default_cache() / "downloads"
    needed = ("apache_tvm-0.27.0.post1-", "apache_tvm_ffi-0.1.15.post2-")
    if not all(any(downloads.glob(f"{prefix}*.whl")) for prefix in needed):
        pytest.skip(f"the two TVM wheels are not in {downloads} (run `kvblock-bench calibrate tvm=={VERSION}` once)")
    out = tmp_path / "calibration.csv"
    code, _, err = _calibrate(capsys, f"tvm=={VERSION}", "--find-links", str(downloads), "--cache",
                              str(tmp_path / "cache"), "--out", str(out), "--reps", "1", *SMALL)
    assert code == 0, err
    _, rows = read_rows(out)
    assert len(rows) == 2 * len(CPP_TIER) and all(r["package_digest"].startswith("sha256:f503fc903b6e") for r in rows)
    assert all("imported whole from the wheels' files (compiled parts included): tvm_ffi" in r["how"] for r in rows)
