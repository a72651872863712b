"""The native C++ designs: equivalence with the reference model, native replays, allocations, the build cache."""

from __future__ import annotations

import contextlib
import random

import numpy as np
import pytest

import impls.native as native
from harness.base import native as native_driver
from harness.base.replay import check_end_state
from harness.conformance import IdMap
from impls.contract import NoFreeBlocksError
from impls.core.reference import ReferenceModel
from impls.native import toolchain
from scenarios import generate

try:
    toolchain.find_compiler()
except toolchain.BuildError as exc:  # pragma: no cover - machines without a C++ compiler
    pytest.skip(f"no C++ compiler: {exc}", allow_module_level=True)

CFG = {"num_blocks": 32, "block_size": 4, "max_seqs": 6, "max_blocks_per_seq": 8}
ERRORS = (ValueError, KeyError, MemoryError)


def test_library_is_available() -> None:
    assert native.UNAVAILABLE_REASON is None
    assert sorted(native.NATIVE) == sorted(native.NAMES)


# -- (a) equivalence with the reference model on seeded random walks ------------------------------------------
def outcome(fn, *args):
    """('ok', result) or ('err', exception type)."""
    try:
        return "ok", fn(*args)
    except ERRORS as exc:
        return "err", type(exc)


def random_ids(rng: random.Random, active: list[int]) -> list[int]:
    """Mostly the active rows (a valid step), sometimes any rows, a duplicate or an id out of range."""
    pool = active if rng.random() < 0.7 else range(CFG["max_seqs"])
    ids = rng.sample(pool, rng.randint(0, len(pool)))
    if ids and rng.random() < 0.1:
        ids.append(rng.choice(ids))  # a duplicate
    if rng.random() < 0.05:
        ids.append(rng.choice([-1, CFG["max_seqs"]]))  # out of range
    return ids


def model_lookup(model: ReferenceModel, ids: list[int]) -> list[int]:
    return [model.last_slot(s) for s in ids]


def impl_decode(mgr, ids: list[int]):
    cow, slot = np.zeros((len(ids), 2), np.int64), np.zeros(len(ids), np.int64)
    k = mgr.decode_step(np.array(ids, dtype=np.int64), cow, slot)
    return [tuple(c) for c in cow[:k].tolist()], slot.tolist()


def impl_lookup(mgr, ids: list[int]) -> list[int]:
    slot = np.zeros(len(ids), np.int64)
    mgr.lookup(np.array(ids, dtype=np.int64), slot)
    return slot.tolist()


def random_op(rng: random.Random, active: list[int]) -> tuple[str, tuple]:
    seq = lambda: rng.randint(-1, CFG["max_seqs"])  # noqa: E731
    kind = rng.choices(["allocate", "append", "fork", "free", "can", "decode", "lookup", "last"],
                       weights=[4, 4, 3, 2, 1, 5, 1, 1])[0]
    args = {
        "allocate": lambda: (seq(), rng.randint(-1, 30)),
        "append": lambda: (seq(),),
        "fork": lambda: (seq(), seq()),
        "free": lambda: (seq(),),
        "can": lambda: (rng.randint(-2, 30),),
        "decode": lambda: (random_ids(rng, active),),
        "lookup": lambda: (random_ids(rng, active),),
        "last": lambda: (seq(),),
    }[kind]()
    return kind, args


MODEL_CALLS = {
    "allocate": lambda m, a: m.allocate(*a), "append": lambda m, a: m.append_slot(*a),
    "fork": lambda m, a: m.fork(*a), "free": lambda m, a: m.free(*a), "can": lambda m, a: m.can_allocate(*a),
    "decode": lambda m, a: m.decode_step(*a), "lookup": lambda m, a: model_lookup(m, *a),
    "last": lambda m, a: m.last_slot(*a),
}
IMPL_CALLS = {
    **MODEL_CALLS,
    "decode": lambda m, a: impl_decode(m, *a), "lookup": lambda m, a: impl_lookup(m, *a),
}


def bind_result(ids: IdMap, kind: str, got, want, block_size: int) -> None:
    """Results equal up to renaming: CoW pairs and slots bind model ids to implementation ids."""
    if kind == "append" and want is not None:
        ids.bind(want[0], got[0]), ids.bind(want[1], got[1])
    elif kind == "decode":
        assert len(got[0]) == len(want[0])
        for (ws, wd), (gs, gd) in zip(want[0], got[0], strict=True):
            ids.bind(ws, gs), ids.bind(wd, gd)
        for w, g in zip(want[1], got[1], strict=True):
            ids.slot(w, g, block_size)
    elif kind == "lookup":
        for w, g in zip(want, got, strict=True):
            ids.slot(w, g, block_size)
    elif kind == "last":
        ids.slot(want, got, block_size)
    else:
        assert (got is None) == (want is None) and (kind != "can" or got == want)


def check_state(ids: IdMap, mgr, model: ReferenceModel) -> None:
    assert mgr.num_free_blocks() == model.num_free_blocks()
    for seq in range(CFG["max_seqs"]):
        assert outcome(mgr.seq_len, seq) == outcome(model.seq_len, seq)
        if seq in model.tables:
            for w, g in zip(model.block_table(seq), mgr.block_table(seq), strict=True):
                ids.bind(w, g)
    for m, i in ids.to_impl.items():
        assert mgr.ref_count(i) == model.ref_count(m)


@pytest.mark.parametrize("name", native.NAMES)
@pytest.mark.parametrize("seed", range(4))
def test_random_walk_matches_reference(name: str, seed: int) -> None:
    rng = random.Random(seed)
    mgr, model, ids = native.NATIVE[name](**CFG), ReferenceModel(**CFG), IdMap()
    for _ in range(400):
        kind, args = random_op(rng, sorted(model.tables))
        want, got = outcome(MODEL_CALLS[kind], model, args), outcome(IMPL_CALLS[kind], mgr, args)
        assert got[0] == want[0], (kind, args, got, want)
        if want[0] == "ok":
            bind_result(ids, kind, got[1], want[1], CFG["block_size"])
        else:
            assert got[1] is want[1], (kind, args, got, want)
        ids.forget_free(model.refs)
        check_state(ids, mgr, model)
    for b in (-1, CFG["num_blocks"]):
        assert outcome(mgr.ref_count, b) == outcome(model.ref_count, b)


def snapshot(mgr) -> tuple:
    tables = {}
    for seq in range(mgr.max_seqs):
        with contextlib.suppress(KeyError):
            tables[seq] = (mgr.seq_len(seq), mgr.block_table(seq))
    return mgr.num_free_blocks(), tables, [mgr.ref_count(b) for b in range(mgr.num_blocks)]


@pytest.mark.parametrize("name", native.NAMES)
def test_decode_step_matches_per_call_appends(name: str) -> None:
    rng = random.Random(7)
    cfg = {**CFG, "num_blocks": 64, "max_blocks_per_seq": 16}
    batched, per_call = native.NATIVE[name](**cfg), native.NATIVE[name](**cfg)
    for mgr in (batched, per_call):
        for seq, tokens in enumerate((3, 4, 9)):
            mgr.allocate(seq, tokens)
        mgr.fork(0, 3), mgr.fork(2, 4)
    running = [0, 1, 2, 3, 4]
    for _ in range(20):
        rng.shuffle(running)
        cows, slots = impl_decode(batched, running)
        assert cows == [c for c in (per_call.append_slot(s) for s in running) if c is not None]
        assert slots == [per_call.last_slot(s) for s in running]
        assert snapshot(batched) == snapshot(per_call)


@pytest.mark.parametrize("name", native.NAMES)
def test_failed_calls_change_nothing_and_buffers_are_checked(name: str) -> None:
    mgr = native.NATIVE[name](num_blocks=6, block_size=2, max_seqs=4, max_blocks_per_seq=4)
    mgr.allocate(0, 2)
    mgr.allocate(1, 3)
    mgr.fork(1, 2)
    before = snapshot(mgr)
    ids = np.array([0, 1, 2], dtype=np.int64)
    with pytest.raises(ValueError):  # output buffers too small for the batch (C++ must not write past them)
        mgr.decode_step(ids, np.zeros((2, 2), np.int64), np.zeros(3, np.int64))
    with pytest.raises(ValueError):
        mgr.lookup(ids, np.zeros(2, np.int64))
    with pytest.raises(TypeError):  # not int64 (the same error every design raises)
        mgr.decode_step(ids, np.zeros((3, 2), np.int32), np.zeros(3, np.int64))
    with pytest.raises(TypeError):
        mgr.allocate(3, 2.5)
    with pytest.raises(NoFreeBlocksError):
        mgr.allocate(3, 8)  # 4 blocks, 2 free
    assert not mgr.can_allocate(2**70) and mgr.can_allocate(0)
    with pytest.raises(ValueError):
        mgr.allocate(2**70, 1)
    assert snapshot(mgr) == before


def test_flat_ids_widen_above_65536_blocks() -> None:
    small, large = native.CppFlatBlockManager(65536), native.CppFlatBlockManager(70000)
    assert (small.id_bytes(), large.id_bytes()) == (2, 4)
    large.allocate(0, 16 * 3)
    assert large.block_table(0) == [0, 1, 2] and large.table_nbytes(0) == 4 * 256


def test_flat_rows_ids_widen_above_65536_blocks() -> None:
    """32 uint16 ids per 64-byte row up to 65,536 blocks, 16 uint32 above: a 40-block table takes 2 rows, then
    3; table_nbytes is the directory (256 blocks / ids per row, int32 entries) plus the rows."""
    small, large = native.CppFlatRowsBlockManager(65536), native.CppFlatRowsBlockManager(70000)
    assert (small.id_bytes(), large.id_bytes()) == (2, 4)
    for mgr in (small, large):
        mgr.allocate(0, 16 * 40)
        assert mgr.block_table(0) == list(range(40))
    assert (small.rows_in_use(), large.rows_in_use()) == (2, 3)
    assert small.table_nbytes(0) == 4 * 8 + 64 * 2 and large.table_nbytes(0) == 4 * 16 + 64 * 3


# -- (b) native replays of generated traces -------------------------------------------------------------------
@pytest.fixture(scope="module")
def traces():
    return {name: generate(name, steps=50, running=32) for name in ("paper", "parallel-sampling")}


@pytest.mark.parametrize("scenario", ["paper", "parallel-sampling"])
@pytest.mark.parametrize("name", native.NAMES)
def test_native_replay_matches_trace(traces, scenario: str, name: str) -> None:
    trace = traces[scenario]
    for detail in (False, True):
        mgr = native.NATIVE[name](**trace.config)
        r = native_driver.replay(mgr, trace, detail=detail)
        assert r.cows.tolist() == trace.step_cows.tolist()
        check_end_state(trace, mgr)
        assert r.ns.shape == (trace.num_steps, 5) and (r.step_ns > 0).all()
        assert r.clock in ("rdtsc", "steady_clock")
        assert (r.ns[:, 4] > 0).all() == detail  # the lookup is timed only in detail
    if scenario == "parallel-sampling":
        assert trace.step_cows.sum() > 0  # the positive control: forks and copy-on-writes were replayed


def test_replay_in_slices_and_failures(traces) -> None:
    trace = traces["parallel-sampling"]
    mgr = native.CppFlatBlockManager(**trace.config)
    prepared = native_driver.prepare(trace)
    cows = np.concatenate([native_driver.replay(mgr, prepared, lo=lo, hi=hi).cows for lo, hi in ((0, 20), (20, 50))])
    assert cows.tolist() == trace.step_cows.tolist()
    check_end_state(trace, mgr)
    with pytest.raises(ValueError):
        native_driver.replay(mgr, prepared, lo=10, hi=60)
    with pytest.raises(native_driver.NativeReplayError):  # the state is already past the trace's start
        native_driver.replay(mgr, prepared)


# -- (c) allocations per step -----------------------------------------------------------------------------------
@pytest.mark.parametrize("scenario", ["paper", "parallel-sampling"])
@pytest.mark.parametrize("name", ["cpp-flat", "cpp-flat-rows"])
def test_preallocated_designs_allocate_nothing_per_step(traces, scenario: str, name: str) -> None:
    """Rule 1 in C++: the flat table and flat-rows' row pool are allocated by the constructor; a step (forks, row
    copies and copy-on-writes included, on parallel-sampling) makes no allocation call."""
    trace = traces[scenario]
    mgr = native.NATIVE[name](**trace.config)
    before = native.alloc_count()
    r = native_driver.replay(mgr, trace)
    assert r.allocs.tolist() == [0] * trace.num_steps and native.alloc_count() == before


@pytest.mark.parametrize("name", native.NAMES)
@pytest.mark.parametrize("config", [CFG, {**CFG, "num_blocks": 70000, "max_blocks_per_seq": 300}])
def test_memory_bytes_is_what_the_constructor_allocates(name: str, config: dict) -> None:
    """memory_bytes() states the bytes the constructor's containers ask for (counted by the allocator)."""
    before = native.alloc_bytes()
    mgr = native.NATIVE[name](**config)
    assert native.alloc_bytes() - before == mgr.memory_bytes()


def test_allocations_per_step(traces) -> None:
    trace = traces["paper"]
    mgr = native.CppListBlockManager(**trace.config)
    before = native.alloc_count()  # after construction: its allocations are not the steps'
    lst = native_driver.replay(mgr, trace)
    assert lst.allocs.sum() > 0  # positive control: push_back growth and new rows
    assert native.alloc_count() - before == lst.allocs.sum()


def test_timer_overhead_is_small_and_positive() -> None:
    assert 0 < native_driver.timer_overhead_ns(10_000) < 10_000


# -- (d) the build cache ------------------------------------------------------------------------------------------
def test_build_cache_compiles_once(tmp_path) -> None:
    source = tmp_path / "tiny.cpp"
    source.write_text('extern "C" int kvb_tiny() { return 7; }\n')
    first = toolchain.build(source, root=tmp_path / "cache")
    mtime = first.path.stat().st_mtime_ns
    second = toolchain.build(source, root=tmp_path / "cache")
    assert first.compiled and not second.compiled
    assert second.path == first.path and second.path.stat().st_mtime_ns == mtime
    other = toolchain.build(source, root=tmp_path / "cache", flags=("-O1", "-fPIC", "-shared"))
    assert other.digest != first.digest
    assert not toolchain.build().compiled  # the real library: already built when the package was imported
    info = native.build_info()
    assert info["available"] and info["flags"] == list(native.FLAGS) and info["digest"] in info["library"]


def test_no_compiler_is_a_reason_not_a_failure(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-compiler"))
    monkeypatch.setenv("KVB_NATIVE_CACHE", str(tmp_path))
    with pytest.raises(toolchain.BuildError):
        toolchain.build()
    build, reason = native._load()
    assert build is None and "no C++ compiler" in reason
