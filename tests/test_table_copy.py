"""Rule 3: the flat design's caller-provided table, the block-table copy variants, and the race guards.

Runs on CPU in a few seconds; the torch-dependent tests skip without torch, the CUDA one without a GPU.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable

import numpy as np
import pytest

from harness.base.replay import replay
from harness.studies import table_copy as tc
from impls.core.ids import table_dtype
from impls.designs.flat import FlatBlockManager
from scenarios import generate

SMALL = {"num_blocks": 256, "block_size": 4, "max_seqs": 8, "max_blocks_per_seq": 16}


# -- FlatBlockManager(table=...) ------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: np.zeros((8, 15), np.uint16), "shape"),
        (lambda: np.zeros((16, 8), np.uint16), "shape"),
        (lambda: np.zeros((8, 16), np.uint32), "dtype"),
        (lambda: np.zeros((8, 16), np.int16), "dtype"),
        (lambda: np.zeros((8, 16), np.dtype(">u2")), "dtype"),
        (lambda: np.zeros((8, 16), np.uint16, order="F"), "C-contiguous"),
        (lambda: np.zeros((8, 32), np.uint16)[:, ::2], "C-contiguous"),
        (lambda: np.zeros((8, 16), np.uint16).tolist(), "numpy.ndarray"),
    ],
)
def test_flat_table_rejects_unusable_buffers(make: Callable[[], object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        FlatBlockManager(**SMALL, table=make())


def test_flat_table_rejects_read_only_buffer() -> None:
    buf = np.zeros((8, 16), np.uint16)
    buf.flags.writeable = False
    with pytest.raises(ValueError, match="writeable"):
        FlatBlockManager(**SMALL, table=buf)


def test_flat_table_dtype_follows_the_pool_size() -> None:
    big = {**SMALL, "num_blocks": 70_000}
    FlatBlockManager(**big, table=np.zeros((8, 16), table_dtype(70_000)))
    with pytest.raises(ValueError, match="uint32"):
        FlatBlockManager(**big, table=np.zeros((8, 16), np.uint16))


def test_flat_uses_the_buffer_it_is_given() -> None:
    buf = np.full((8, 16), 7, np.uint16)  # stale contents: the manager must start from a zeroed table
    mgr = FlatBlockManager(**SMALL, table=buf)
    assert mgr.table is buf and mgr.state[0] is buf
    assert not buf.any()
    mgr.allocate(3, 9)
    assert buf[3, :3].tolist() == mgr.block_table(3) == [0, 1, 2]


def test_flat_with_a_provided_table_replays_like_the_default() -> None:
    trace = generate("beam-search", running=16, steps=40, num_blocks=1024)
    own = FlatBlockManager(**trace.config)
    given = FlatBlockManager(**trace.config, table=np.zeros_like(own.table))
    assert replay(trace, own, "batched") == replay(trace, given, "batched")
    assert np.array_equal(own.table, given.table)


# -- the race guards, against a stand-in stream whose copies read their source late --------------------------
class LateStream:
    """Copies run in order, but only when an event is synchronised or the stream is told to catch up: like a
    GPU that runs ``lag`` copies behind the host, each copy reads its source when it runs."""

    def __init__(self) -> None:
        self.pending: list[Callable[[], None]] = []
        self.done = 0

    def copy(self, dst: np.ndarray, src: np.ndarray) -> None:
        self.pending.append(lambda: np.copyto(dst, src))

    def run(self, keep: int = 0) -> None:
        while len(self.pending) > keep:
            self.pending.pop(0)()
            self.done += 1

    def event(self) -> LateEvent:
        return LateEvent(self)


class LateEvent:
    def __init__(self, stream: LateStream) -> None:
        self.stream, self.at = stream, None

    def record(self) -> None:
        self.at = self.stream.done + len(self.stream.pending)

    def synchronize(self) -> None:
        assert self.at is not None, "synchronize() on an event never recorded"
        self.stream.run(keep=max(0, self.stream.done + len(self.stream.pending) - self.at))


def _copy_in_place(guarded: bool, lag: int, steps: int = 6) -> bool:
    """The host writes step t into one buffer and copies it in place to device slot t, as (c) copies the
    manager's table; True if every slot got what the buffer held when its copy was issued."""
    stream = LateStream()
    guard = tc.CopyGuard(stream.event)
    host = np.zeros(4, np.int32)
    device = np.full((steps, 4), -1, np.int32)
    for t in range(steps):
        if guarded:
            guard.before_write()
        host[:] = t
        stream.copy(device[t], host)
        guard.copied()
        stream.run(keep=lag)
    stream.run()
    return bool(np.array_equal(device, np.repeat(np.arange(steps), 4).reshape(steps, 4)))


def _copy_from_ring(ring_waits: bool, lag: int, steps: int = 8) -> bool:
    """The host fills one of two staging buffers per step and copies it to device slot t (double buffering)."""
    stream = LateStream()
    ring = tc.BufferRing(2, stream.event if ring_waits else tc.DoneEvent)
    buffers = np.zeros((2, 4), np.int32)
    device = np.full((steps, 4), -1, np.int32)
    for t in range(steps):
        i = ring.acquire()
        buffers[i] = t
        stream.copy(device[t], buffers[i])
        ring.copied()
        stream.run(keep=lag)
    stream.run()
    return bool(np.array_equal(device, np.repeat(np.arange(steps), 4).reshape(steps, 4)))


@pytest.mark.parametrize("lag", [1, 2, 3])
def test_unguarded_in_place_copy_races_and_the_guard_prevents_it(lag: int) -> None:
    assert not _copy_in_place(guarded=False, lag=lag)  # the stand-in really reads late
    assert _copy_in_place(guarded=True, lag=lag)


def test_in_place_copy_is_safe_when_the_device_keeps_up() -> None:
    assert _copy_in_place(guarded=False, lag=0)


def test_double_buffering_alone_covers_one_step_of_lag_only() -> None:
    assert _copy_from_ring(ring_waits=False, lag=1)
    assert not _copy_from_ring(ring_waits=False, lag=2)


@pytest.mark.parametrize("lag", [1, 2, 3, 5])
def test_buffer_ring_waits_for_the_copy_that_last_read_a_buffer(lag: int) -> None:
    assert _copy_from_ring(ring_waits=True, lag=lag)


def test_guards_count_their_waits() -> None:
    ring = tc.BufferRing(2, tc.DoneEvent)
    with pytest.raises(RuntimeError):
        ring.copied()
    for _ in range(5):
        ring.acquire()
        ring.copied()
    assert ring.waits == 3  # the first use of each buffer has nothing to wait for
    guard = tc.CopyGuard(tc.DoneEvent)
    guard.before_write()
    guard.copied()
    guard.before_write()
    assert guard.waits == 1


# -- reading tables ------------------------------------------------------------------------------------------
def test_gather_tables_pads_past_each_rows_blocks() -> None:
    out = np.arange(24, dtype=np.uint16).reshape(4, 6)
    ids, nblocks = np.array([2, 0]), np.array([1, 3])
    assert tc.gather_tables(out, "rows", ids, nblocks).tolist() == [[12, -1, -1], [0, 1, 2]]
    assert tc.gather_tables(out, "batch", ids, nblocks).tolist() == [[0, -1, -1], [6, 7, 8]]
    assert tc.padded_lists([[5], [1, 2, 3]]).tolist() == [[5, -1, -1], [1, 2, 3]]


# -- the variants (torch) -----------------------------------------------------------------------------------
def _decode(bench: tc.TableCopyBench, ids: list[int], pool_rows: list[int]) -> tc.StepState:
    mgr = bench.mgr
    seq = np.array(ids, dtype=np.int64)
    cow_out, slot_out = np.zeros((len(ids), 2), np.int64), np.zeros(len(ids), np.int64)
    cows = mgr.decode_step(seq, cow_out, slot_out)
    return tc.step_state(mgr, seq, slot_out.copy(), cow_out[:cows, 1].copy(), pool_rows)


def _run_variants(bench: tc.TableCopyBench, st: tc.StepState) -> dict[str, tc.Copied]:
    tasks = bench.tasks()
    return {v: tasks[v](st, lambda: None) for v in tc.VARIANTS}


def test_every_variant_delivers_the_block_tables() -> None:
    torch = pytest.importorskip("torch")
    bench = tc.TableCopyBench(torch, SMALL, cuda=False)
    mgr = bench.mgr
    bench.sync_mirror()

    def pool_ops(step: int) -> list[int]:
        if step == 0:
            for row, tokens in enumerate([6, 7, 1, 30, 4]):
                mgr.allocate(row, tokens)
            return [0, 1, 2, 3, 4]
        if step == 1:
            mgr.fork(1, 6)  # row 1 (8 tokens) ends a block: its next append opens one
            mgr.fork(0, 7)  # row 0's partial last block is now shared: row 0's append copies it on write
            return [6, 7]
        if step == 3:
            for row in (1, 7, 2):
                mgr.free(row)
            mgr.allocate(2, 13)
            return [2]
        return []

    for step, ids in enumerate([[0, 1, 2, 3, 4], [0, 1, 2, 3, 4, 6, 7], [0, 1, 2, 3, 4, 6, 7], [0, 2, 3, 4, 6]]):
        st = _decode(bench, ids, pool_ops(step))
        if step == 1:
            assert st.cow_dst.size == 1 and 0 not in st.pool_rows  # only the slot mapping reveals row 0
        want = tc.padded_lists([mgr.block_table(r) for r in ids])
        for name, copied in _run_variants(bench, st).items():
            got = tc.gather_tables(copied.out.numpy(), copied.layout, st.ids, st.nblocks)
            assert got.tolist() == want.tolist(), (step, name)
            assert copied.out.dtype == torch.int32


def test_byte_and_copy_counts() -> None:
    torch = pytest.importorskip("torch")
    bench = tc.TableCopyBench(torch, SMALL, cuda=False)
    mgr = bench.mgr
    bench.sync_mirror()
    for row, tokens in [(0, 4), (1, 9), (2, 2)]:
        mgr.allocate(row, tokens)
    st = _decode(bench, [0, 1, 2], [0, 1, 2])  # blocks 2, 3, 1; row 0 opened a block
    got = {v: (c.nbytes, c.copies) for v, c in _run_variants(bench, st).items()}
    width = SMALL["max_blocks_per_seq"]
    assert st.nblocks.tolist() == [2, 3, 1] and (st.lo, st.hi, st.width) == (0, 3, 3)
    assert got["a-per-seq"] == (6 * 2, 3)
    assert got["b-rebuild"] == (3 * 3 * 4, 1)
    assert got["c-one-copy"] == (3 * width * 2, 1)
    assert got["c-host-widen"] == (3 * width * 4, 1)
    assert got["d-live-cols"] == (3 * 3 * 2, 1)
    assert got["d-changed-rows"] == (3 * (width * 2 + 8), 2)
    assert got["e-rows-changed"] == (3 * (64 + 8) + 3 * (4 + 8), 4)  # one 64-byte row and directory entry each
    st = _decode(bench, [0, 1, 2], [])  # lengths 6, 11, 4: no row opens a block
    got = {v: (c.nbytes, c.copies) for v, c in _run_variants(bench, st).items()}
    assert got["d-changed-rows"] == got["e-rows-changed"] == (0, 0)


@pytest.mark.parametrize(("scenario", "params"), [
    ("beam-search", {"running": 24, "steps": 60, "num_blocks": 2048}),  # forks, frees, copy-on-write
    ("concurrency-64", {"steps": 40}),
])
def test_measure_on_cpu(scenario: str, params: dict) -> None:
    pytest.importorskip("torch")
    trace = generate(scenario, **params)
    rows, raw = tc.measure(trace, steps=20, warmup=15, device="cpu")
    assert {r.status for r in rows} <= {"ok", "unavailable"}
    by = {(r.regime, r.metric): r for r in rows}
    assert len(by) == len(rows) == len(tc.VARIANTS) * len(tc.COPY_METRICS) + len(tc.WIDEN)
    for v in tc.VARIANTS:
        for metric in ("table_copy_ns", "table_copy_ns_per_seq", "table_copy_bytes", "table_copies"):
            row = by[(v, metric)]
            assert row.status == "ok" and row.value >= 0, (v, metric)
            assert row.value > 0 or v == "d-changed-rows", (v, metric)  # (d) may copy nothing in a step
            assert row.impl == "flat" and row.unit == tc.UNITS[metric]
        device = by[(v, "table_copy_device_ns")]
        assert device.status == "unavailable" and math.isnan(device.value) and device.how
    assert by[("device", "table_widen_ns")].status == "unavailable"
    assert math.isnan(by[("device", "table_widen_ns")].value)
    assert by[("host-numpy", "table_widen_ns")].status == "ok"
    assert len(raw["steps"]) == 20 and len(raw["c-one-copy/table_copy_ns"]) == 20
    for v in tc.VARIANTS:  # bytes per step: the mean of the steps' bytes, the median's sibling
        per_step = by[(v, "table_copy_bytes_per_step")]
        assert per_step.status == "ok" and per_step.unit == "B/step" and "mean over 20" in per_step.how
        assert per_step.value == pytest.approx(np.mean(raw[f"{v}/table_copy_bytes_per_step"]))
    assert by[("c-one-copy", "table_copy_bytes_per_step")].value == by[("c-one-copy", "table_copy_bytes")].value
    assert by[("c-one-copy", "table_copy_ns")].value == pytest.approx(np.median(raw["c-one-copy/table_copy_ns"]))


def test_a_wrong_device_table_fails_the_variant(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("torch")

    def lossy(self: tc.TableCopyBench, st: tc.StepState, mark: Callable[[], None]) -> tc.Copied:
        copied = original(self, st, mark)
        copied.out[st.ids_list[0], 0] += 1  # one wrong block id
        return copied

    original = tc.TableCopyBench.c_one_copy
    monkeypatch.setattr(tc.TableCopyBench, "c_one_copy", lossy)
    rows, _ = tc.measure(generate("concurrency-64", steps=20), steps=5, warmup=5, device="cpu")
    statuses = {(r.regime, r.status) for r in rows}
    assert ("c-one-copy", "failed") in statuses and ("c-one-copy", "ok") not in statuses
    assert ("c-host-widen", "ok") in statuses
    assert all(math.isnan(r.value) for r in rows if r.status == "failed")


def test_without_torch_every_row_is_unavailable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)  # makes `import torch` raise ImportError
    rows, raw = tc.measure(generate("concurrency-64", steps=5))
    assert raw == {} and rows
    assert all(r.status == "unavailable" and math.isnan(r.value) and r.how == tc.NEEDS_TORCH for r in rows)


def test_measure_rejects_bad_arguments() -> None:
    trace = generate("concurrency-64", steps=5)
    with pytest.raises(ValueError):
        tc.measure(trace, device="tpu")
    with pytest.raises(ValueError):
        tc.measure(trace, steps=0)


def test_default_steps_keep_a_fixed_budget() -> None:
    assert tc.default_steps(generate("concurrency-64", steps=3)) == tc.MAX_STEPS
    assert tc.default_steps(generate("concurrency-1024", steps=3)) == 75
    # the scale sweeps' largest tables (256 x 65,536 ids) are bounded by the table-entry budget
    assert tc.default_steps(generate("context-1048576", steps=3)) == tc.MIN_STEPS
    assert tc.default_steps(generate("context-16384", steps=3)) == tc.TABLE_ENTRIES // (256 * 1024) == 75


def test_cuda_device_tables_match_the_host() -> None:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    rows, _ = tc.measure(generate("beam-search", running=24, steps=40, num_blocks=2048), steps=20, warmup=10,
                         device="cuda")
    assert not [r for r in rows if r.status == "failed"]
    assert all(r.status == "ok" for r in rows if r.metric == "table_copy_device_ns")


@pytest.mark.parametrize("warmup", [0, 50])
def test_a_short_trace_is_measured_whole_or_from_its_middle(warmup: int) -> None:
    pytest.importorskip("torch")
    rows, raw = tc.measure(generate("beam-search", running=8, steps=6, num_blocks=512), steps=10, warmup=warmup,
                           device="cpu")
    assert raw["steps"] == ([0, 1, 2, 3, 4, 5] if warmup == 0 else [3, 4, 5])
    assert not [r for r in rows if r.status == "failed"]
