"""Rule 3, measured: getting each decode step's block tables to the GPU as the int32 tensor attention takes.

The flat design (:class:`impls.flat.FlatBlockManager`) replays a trace untimed; in a window of decode steps
after a warm-up, right after each step's ``decode_step`` (the tables now hold the block of the token being
decoded), every variant below produces the batch's block tables as an int32 tensor on the device:

``a-per-seq``
    The anti-pattern: one host-to-device copy per live sequence, ``dev[row, :nblocks] <- table[row, :nblocks]``,
    then one device kernel widening the rows to int32.
``b-rebuild``
    What small engines do: pad the per-sequence Python lists of block ids to the longest (with ``PAD``),
    ``torch.tensor(padded, dtype=int32)`` (pinned on CUDA), then one copy into a freshly allocated device
    tensor. The lists are taken as the engine already holds them (built outside the timed region).
``c-one-copy``
    The article's rule: the manager's table *is* the persistent pinned buffer (its NumPy view is passed to
    the manager as ``table=``); one ``non_blocking`` copy of the rows spanning the live rows, all
    ``max_blocks_per_seq`` columns, then one device kernel widening them to int32.
``c-host-widen``
    (c) with the widening on the host: NumPy widens the live rows into a pinned int32 buffer (double
    buffered), one copy of twice the bytes, nothing to do on the device.
``d-changed-rows``
    Only the rows that changed since the previous step (a block appended, copied on write, or the row
    allocated or forked this step; found from the step's slot mapping and copy-on-write list, inside the
    timed region) are gathered into a pinned staging buffer; two copies (rows and their indices) and a
    device ``index_copy_`` into a persistent device mirror. A step where no row changed copies nothing.
``d-live-cols``
    Only the live columns: the live rows' first ``max(nblocks)`` columns are packed into a contiguous pinned
    staging buffer (a strided source would make torch stage it through pageable memory), one copy, then
    widened on the device into the first columns of the device table.

Layouts. The live rows of these scenarios are rows ``0..n-1`` in decode order, so for (a), (c) and (d) the
device table is indexed by row id, like the host table (an engine passes row ids, or orders its batch by
row id, as vLLM does); rows outside the span are not copied. (b) is in batch order, ``[n, max(nblocks)]``.
Columns past a row's block count hold stale ids (or ``PAD`` in (b)); attention reads ``nblocks`` of them.
Per-row block counts and the live span are taken as given: an engine computes them for the attention
metadata anyway.

The uint16 ids travel as their 16 bits (torch dtype int16: a copy moves bytes, and torch's CPU copy of
uint16 has no vectorised kernel, which would skew the CPU figures); widening reads them as uint16.
Widening the uint16 ids to int32 is measured apart (metric ``table_widen_ns``, on the live rows):
``host-numpy`` (``np.copyto`` into an int32 array), ``host-torch`` (a dtype-converting torch copy on the
host) and ``device`` (the device kernel (a), (c) and (d) use).

Timing. Every variant runs on the same manager state each step, in an order rotated from step to step so
that none always runs cache-cold, with torch limited to one intra-op thread (see :func:`measure`). The
window is ``steps`` decode steps after ``warmup`` untimed ones; by default a budget of 76,800
sequence-steps (300 steps up to 256 sequences, 75 at 1,024), a few seconds a scenario. With CUDA the host
time includes recording the race guards' events: protecting the buffers is part of the cost.

Rows (:class:`harness.results.Row`): ``impl`` is always ``"flat"`` (the design whose table is copied);
``regime`` is the variant (``a-per-seq`` ... ``d-live-cols``) or, for ``table_widen_ns``, where the widening
runs. Every value is the median over the measured steps; :func:`measure` also returns the raw per-step
samples, keyed ``"<regime>/<metric>"`` (plus ``"steps"`` and ``"live"``).

- ``table_copy_ns``: host time per step (``perf_counter_ns``). Without CUDA a CPU torch tensor stands in for
  the device, so this is the whole packing and copy; with CUDA it is the time the host spends issuing it.
- ``table_copy_ns_per_seq``: the same divided by the number of live sequences.
- ``table_copy_device_ns``: with CUDA, CUDA events from the variant's first device operation to the end of
  its last (gaps while the host issues per-sequence copies included); without CUDA ``unavailable``.
- ``table_copy_bytes``: bytes handed to host-to-device copies per step; ``table_copies``: their number.
  (``d-changed-rows`` may copy nothing in a step; its device time is the median of the steps that copied.)
- ``table_widen_ns``: see above; ``device`` is ``unavailable`` without CUDA.

Without torch every row is ``unavailable`` ("needs torch"). Every measured step (CPU or CUDA) checks that
each variant's device tensor holds exactly the host's tables after the copy; a variant that fails the check,
or raises, gets ``failed`` rows.

The race. An asynchronous copy reads its pinned source when the GPU gets to it, maybe after the host has
moved on to the next step and written the buffer again. :class:`CopyGuard` (the manager's table, read in
place by (a) and (c): wait for the copy's event before the next step mutates the table) and
:class:`BufferRing` (staging buffers of (c-host-widen) and (d), double buffered: a buffer is reused only
after the copy that read it has finished) prevent it.

Run ``python -m harness.table_copy --help``; ``scripts/gpu_check.sh`` produces the CUDA figures.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from impls.flat import FlatBlockManager, table_dtype
from scenarios.trace import ALLOCATE, FORK, Trace

from .replay import ReplayError, apply_pool_op
from .results import Row, new_run_dir, write_json, write_rows

VARIANTS = ("a-per-seq", "b-rebuild", "c-one-copy", "c-host-widen", "d-changed-rows", "d-live-cols")
WIDEN = ("host-numpy", "host-torch", "device")
COPY_METRICS = ("table_copy_ns", "table_copy_ns_per_seq", "table_copy_device_ns", "table_copy_bytes", "table_copies")
UNITS = {"table_copy_ns": "ns", "table_copy_ns_per_seq": "ns/seq", "table_copy_device_ns": "ns",
         "table_copy_bytes": "B", "table_copies": "copies", "table_widen_ns": "ns"}
IMPL = "flat"
PAD = -1  # padding of (b)'s rows, as nano-vllm pads its block tables
NEEDS_TORCH = "needs torch: pip install -e '.[torch]'"
NO_CUDA = "no CUDA device"
HOST_CPU = "perf_counter_ns, host (CPU tensor as device)"
HOST_CUDA = "perf_counter_ns, host (issue time)"
CUDA_EVENTS = "cuda-events"
COMPUTED = "computed from the copies issued"
DEFAULT_WARMUP = 200
MAX_STEPS, MIN_STEPS = 300, 50
SEQ_STEPS = 300 * 256  # default budget of sequence-steps: 300 steps of the paper's 256 sequences
DEFAULT_SCENARIOS = ("paper", "concurrency-64", "concurrency-128", "concurrency-256", "concurrency-512",
                     "concurrency-1024")


# -- the race guards (no torch needed: anything with record() and synchronize() is an event) -------------
class Event(Protocol):
    """The part of ``torch.cuda.Event`` the guards use."""

    def record(self) -> None: ...
    def synchronize(self) -> None: ...


class DoneEvent:
    """The event of a synchronous copy (CPU): complete as soon as recorded."""

    def record(self) -> None:
        pass

    def synchronize(self) -> None:
        pass


class CopyGuard:
    """Protects a host buffer that asynchronous copies read in place (the manager's table in (a) and (c)).

    Call :meth:`copied` right after enqueuing the copies that read the buffer and :meth:`before_write` before
    the host writes it again: it waits for those copies, so the device gets what the buffer held when the
    copy was issued, not what the host wrote afterwards.
    """

    def __init__(self, new_event: Callable[[], Event]) -> None:
        self._new_event = new_event
        self._pending: Event | None = None
        self.waits = 0

    def copied(self) -> None:
        """Mark the point after the copies that read the buffer."""
        event = self._new_event()
        event.record()
        self._pending = event

    def before_write(self) -> None:
        """Block until every copy marked by :meth:`copied` has read the buffer."""
        if self._pending is not None:
            self._pending.synchronize()
            self._pending = None
            self.waits += 1


class BufferRing:
    """``size`` staging buffers used in turn (double buffering for 2). :meth:`acquire` hands out the next
    buffer's index only after the copy that last read that buffer has finished, so the host fills one buffer
    while the device may still be reading the other."""

    def __init__(self, size: int, new_event: Callable[[], Event]) -> None:
        if size < 1:
            raise ValueError(f"a ring needs at least one buffer, got {size}")
        self._new_event = new_event
        self._events: list[Event | None] = [None] * size
        self._next, self._current = 0, -1
        self.waits = 0

    def acquire(self) -> int:
        """Index of a buffer the host may overwrite now."""
        i = self._next
        event = self._events[i]
        if event is not None:
            event.synchronize()
            self._events[i] = None
            self.waits += 1
        self._current, self._next = i, (i + 1) % len(self._events)
        return i

    def copied(self) -> None:
        """Mark the point after the copies that read the buffer last acquired."""
        if self._current < 0:
            raise RuntimeError("copied() before acquire()")
        event = self._new_event()
        event.record()
        self._events[self._current] = event


# -- reading a variant's result -----------------------------------------------------------------------------
def gather_tables(out: np.ndarray, layout: str, ids: np.ndarray, nblocks: np.ndarray, pad: int = PAD) -> np.ndarray:
    """The batch's block tables read from a variant's device table (as a host array): ``[len(ids),
    max(nblocks)]`` int64, row ``i`` the table of row ``ids[i]``, ``pad`` past its block count.

    ``layout`` is ``"rows"`` (indexed by row id, like the host table) or ``"batch"`` (in decode order)."""
    if layout not in ("rows", "batch"):
        raise ValueError(f"unknown layout {layout!r}")
    width = int(nblocks.max(initial=0))
    rows = out[ids, :width] if layout == "rows" else out[: len(ids), :width]
    live = np.arange(width) < np.asarray(nblocks)[:, None]
    return np.where(live, rows.astype(np.int64), pad)  # int64 first: a -1 pad would wrap in uint16


def padded_lists(tables: Sequence[Sequence[int]], pad: int = PAD) -> np.ndarray:
    """Lists of block ids as one ``[n, longest]`` int64 array padded with ``pad`` (what (b) builds)."""
    width = max((len(t) for t in tables), default=0)
    return np.array([list(t) + [pad] * (width - len(t)) for t in tables], dtype=np.int64).reshape(len(tables), width)


# -- the measurement ----------------------------------------------------------------------------------------
@dataclass
class Copied:
    """What one variant did in one step: its device table, how to read it, and what crossed to the device."""

    out: Any  # torch tensor on the device
    layout: str  # "rows" or "batch" (see gather_tables)
    nbytes: int
    copies: int


@dataclass
class StepState:
    """One decode step as the variants see it, built outside the timed regions."""

    ids: np.ndarray  # int64 live rows, decode order
    ids_list: list[int]
    nblocks: np.ndarray  # int64 blocks per live row after this step's appends
    nblocks_list: list[int]
    lo: int  # rows lo..hi-1 span the live rows
    hi: int
    width: int  # most blocks of any live row
    lists: list[list[int]]  # the tables as per-sequence Python lists, as a small engine keeps them
    slots: np.ndarray  # this step's slot mapping (decode_step's slot_out)
    cow_dst: np.ndarray  # blocks that copy-on-write gave a row this step
    pool_rows: list[int]  # rows allocated or forked by this step's pool operations


@dataclass
class Samples:
    """Per-step raw samples of one measurement, and failures found by the checks."""

    values: dict[str, list[float]] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)  # regime -> why
    mismatches: dict[str, int] = field(default_factory=dict)  # regime -> steps whose device table was wrong

    def add(self, key: str, value: float) -> None:
        self.values.setdefault(key, []).append(float(value))


def _widen_mode(torch: Any, np_dtype: np.dtype, device: Any) -> str:
    """How the table's ids become int32: ``"none"`` (uint32 tables: ids below 2**31 travel as int32),
    ``"uint16"`` (a dtype-converting copy from a uint16 view of the int16 bits) or ``"mask"`` (int16 widened,
    then ``& 0xFFFF``) where this torch cannot convert uint16 on ``device`` (a "limited support" dtype)."""
    if np_dtype == np.uint32:
        return "none"
    try:
        bits = torch.from_numpy(np.array([1, 65535], dtype=np.uint16).view(np.int16)).to(device)
        wide = torch.empty(2, dtype=torch.int32, device=device)
        wide.copy_(bits.view(torch.uint16))
        if wide.cpu().tolist() == [1, 65535]:
            return "uint16"
    except (TypeError, RuntimeError, AttributeError):
        pass
    return "mask"


class TableCopyBench:
    """Buffers and variants for one trace configuration; one instance measures one trace."""

    def __init__(self, torch: Any, config: dict, cuda: bool) -> None:
        self.torch, self.cuda = torch, cuda
        self.device = torch.device("cuda" if cuda else "cpu")
        s, w, n = config["max_seqs"], config["max_blocks_per_seq"], config["num_blocks"]
        self.block_size = config["block_size"]
        self.shift = self.block_size.bit_length() - 1
        np_table = table_dtype(n)
        # The ids travel as int16 bits: a copy moves bytes, and torch's CPU copy of uint16 (no vectorised
        # kernel for that dtype) is several times slower than int16's, which would skew the CPU figures.
        self.widens = np_table == np.uint16
        self.t16 = torch.int16 if self.widens else torch.int32
        self.itemsize = np_table.itemsize
        self.widen_mode = _widen_mode(torch, np_table, self.device)
        # The manager's table is a (pinned on CUDA) torch tensor's NumPy view: rule 3's persistent buffer.
        self.host16 = self._host((s, w), self.t16)
        self.mgr = FlatBlockManager(**config, table=self.host16.numpy().view(np_table))
        self.table = self.mgr.table

        def dev(shape: tuple[int, ...], dtype: Any) -> Any:
            return torch.zeros(shape, dtype=dtype, device=self.device)

        i32 = torch.int32
        # Each variant writes its own device tensors, so a variant that misses a row cannot be covered up
        # by another one having copied it.
        self.a16, self.a32 = dev((s, w), self.t16), dev((s, w), i32)
        self.c16, self.c32 = dev((s, w), self.t16), dev((s, w), i32)
        self.ch32 = dev((s, w), i32)
        self.d32, self.d_stage16, self.d_stage32 = dev((s, w), i32), dev((s, w), self.t16), dev((s, w), i32)
        self.d_idx = dev((s,), torch.int64)
        self.l16, self.l32 = dev((s * w,), self.t16), dev((s, w), i32)
        self.w16, self.w32 = dev((s, w), self.t16), dev((s, w), i32)
        self.ring_i32 = [self._host((s, w), i32) for _ in range(2)]
        self.ring_rows = [self._host((s, w), self.t16) for _ in range(2)]
        self.ring_idx = [self._host((s,), torch.int64) for _ in range(2)]
        self.ring_cols = [self._host((s * w,), self.t16) for _ in range(2)]
        self.np_i32 = [b.numpy() for b in self.ring_i32]
        self.np_rows = [b.numpy().view(np_table) for b in self.ring_rows]
        self.np_idx = [b.numpy() for b in self.ring_idx]
        self.np_cols = [b.numpy().view(np_table) for b in self.ring_cols]
        self.host_w32 = np.zeros((s, w), dtype=np.int32)
        self.host_w32_t = torch.zeros((s, w), dtype=i32)
        self.dirty = np.zeros(s, dtype=bool)
        self.table_guard = CopyGuard(self.new_event)
        self.i32_ring, self.rows_ring, self.cols_ring = (BufferRing(2, self.new_event) for _ in range(3))

    def _host(self, shape: tuple[int, ...], dtype: Any) -> Any:
        return self.torch.zeros(shape, dtype=dtype, pin_memory=self.cuda)

    def new_event(self) -> Event:
        """An event on the current stream (CUDA), or one that is always complete (CPU)."""
        return self.torch.cuda.Event() if self.cuda else DoneEvent()

    def widen(self, dst: Any, src: Any) -> None:
        """Widen transferred ids into int32 (a device kernel, or a host one for ``widen:host-torch``)."""
        if self.widen_mode == "uint16":
            dst.copy_(src.view(self.torch.uint16))
        else:
            dst.copy_(src)
            if self.widen_mode == "mask":
                dst.bitwise_and_(0xFFFF)

    def sync_mirror(self) -> None:
        """Bring (d-changed-rows)'s device mirror up to date with the whole table (untimed, once)."""
        self.widen(self.d32, self.host16.to(self.device))

    # -- the variants: (state, mark) -> Copied; mark() is called right before the first device operation --
    def a_per_seq(self, st: StepState, mark: Callable[[], None]) -> Copied:
        src, dst = self.host16, self.a16
        mark()
        for row, nb in zip(st.ids_list, st.nblocks_list, strict=True):
            dst[row, :nb].copy_(src[row, :nb], non_blocking=True)
        self.widen(self.a32[st.lo : st.hi], dst[st.lo : st.hi])
        self.table_guard.copied()
        return Copied(self.a32, "rows", int(st.nblocks.sum()) * self.itemsize, len(st.ids_list))

    def b_rebuild(self, st: StepState, mark: Callable[[], None]) -> Copied:
        width = max(st.nblocks_list)
        padded = [t + [PAD] * (width - len(t)) for t in st.lists]
        host = self.torch.tensor(padded, dtype=self.torch.int32, pin_memory=self.cuda)
        mark()
        out = host.to(self.device, non_blocking=True, copy=True)  # copy=True: on CPU too, a new tensor
        return Copied(out, "batch", host.numel() * 4, 1)

    def c_one_copy(self, st: StepState, mark: Callable[[], None]) -> Copied:
        lo, hi = st.lo, st.hi
        mark()
        self.c16[lo:hi].copy_(self.host16[lo:hi], non_blocking=True)
        self.widen(self.c32[lo:hi], self.c16[lo:hi])
        self.table_guard.copied()
        return Copied(self.c32, "rows", (hi - lo) * self.table.shape[1] * self.itemsize, 1)

    def c_host_widen(self, st: StepState, mark: Callable[[], None]) -> Copied:
        lo, hi = st.lo, st.hi
        i = self.i32_ring.acquire()
        np.copyto(self.np_i32[i][lo:hi], self.table[lo:hi])
        mark()
        self.ch32[lo:hi].copy_(self.ring_i32[i][lo:hi], non_blocking=True)
        self.i32_ring.copied()
        return Copied(self.ch32, "rows", (hi - lo) * self.table.shape[1] * 4, 1)

    def d_changed_rows(self, st: StepState, mark: Callable[[], None]) -> Copied:
        dirty = self.dirty
        dirty[:] = False
        dirty[st.ids[(st.slots & (self.block_size - 1)) == 0]] = True  # the token opened a new block
        if st.cow_dst.size:
            dirty[st.ids[np.isin(st.slots >> self.shift, st.cow_dst)]] = True
        if st.pool_rows:
            dirty[st.pool_rows] = True
        rows = np.flatnonzero(dirty)
        k = rows.size
        if k == 0:
            return Copied(self.d32, "rows", 0, 0)
        i = self.rows_ring.acquire()
        np.take(self.table, rows, axis=0, out=self.np_rows[i][:k])
        self.np_idx[i][:k] = rows
        mark()
        self.d_stage16[:k].copy_(self.ring_rows[i][:k], non_blocking=True)
        self.d_idx[:k].copy_(self.ring_idx[i][:k], non_blocking=True)
        self.widen(self.d_stage32[:k], self.d_stage16[:k])
        self.d32.index_copy_(0, self.d_idx[:k], self.d_stage32[:k])
        self.rows_ring.copied()
        return Copied(self.d32, "rows", k * (self.table.shape[1] * self.itemsize + 8), 2)

    def d_live_cols(self, st: StepState, mark: Callable[[], None]) -> Copied:
        lo, hi, w = st.lo, st.hi, st.width
        size = (hi - lo) * w
        i = self.cols_ring.acquire()
        np.copyto(self.np_cols[i][:size].reshape(hi - lo, w), self.table[lo:hi, :w])
        mark()
        self.l16[:size].copy_(self.ring_cols[i][:size], non_blocking=True)
        self.widen(self.l32[lo:hi, :w], self.l16[:size].view(hi - lo, w))
        self.cols_ring.copied()
        return Copied(self.l32, "rows", size * self.itemsize, 1)

    # -- widening alone, on the live rows -------------------------------------------------------------------
    def widen_host_numpy(self, st: StepState, mark: Callable[[], None]) -> None:
        np.copyto(self.host_w32[st.lo : st.hi], self.table[st.lo : st.hi])

    def widen_host_torch(self, st: StepState, mark: Callable[[], None]) -> None:
        self.widen(self.host_w32_t[st.lo : st.hi], self.host16[st.lo : st.hi])

    def widen_device(self, st: StepState, mark: Callable[[], None]) -> None:
        mark()
        self.widen(self.w32[st.lo : st.hi], self.w16[st.lo : st.hi])

    def tasks(self) -> dict[str, Callable[[StepState, Callable[[], None]], Copied | None]]:
        """Everything timed per step, by raw-sample key prefix."""
        out: dict[str, Callable] = {
            "a-per-seq": self.a_per_seq, "b-rebuild": self.b_rebuild, "c-one-copy": self.c_one_copy,
            "c-host-widen": self.c_host_widen, "d-changed-rows": self.d_changed_rows,
            "d-live-cols": self.d_live_cols,
        }
        if self.widens:
            out["widen:host-numpy"] = self.widen_host_numpy
            out["widen:host-torch"] = self.widen_host_torch
            if self.cuda:
                out["widen:device"] = self.widen_device
        return out


class _Marker:
    """Records the CUDA start event when a variant reaches its first device operation, and keeps the cost of
    recording it out of the host time."""

    def __init__(self, perf: Callable[[], int], event: Any) -> None:
        self.perf, self.event, self.excluded = perf, event, 0

    def __call__(self) -> None:
        if self.event is not None:
            t = self.perf()
            self.event.record()
            self.excluded += self.perf() - t


def step_state(mgr: FlatBlockManager, ids: np.ndarray, slots: np.ndarray, cow_dst: np.ndarray,
               pool_rows: list[int]) -> StepState:
    """The variants' view of the step ``mgr`` just decoded: ``ids`` its rows, ``slots`` and ``cow_dst`` what
    ``decode_step`` wrote (its ``slot_out`` and the second column of ``cow_out``), ``pool_rows`` the rows
    allocated or forked since the previous step the variants ran on."""
    nblocks = (mgr._lens[ids].astype(np.int64) + mgr.block_size - 1) >> (mgr.block_size.bit_length() - 1)
    width = int(nblocks.max())
    nb_list = nblocks.tolist()
    prefix = mgr.table[ids, :width].tolist()
    return StepState(
        ids=ids, ids_list=ids.tolist(), nblocks=nblocks, nblocks_list=nb_list, lo=int(ids.min()),
        hi=int(ids.max()) + 1, width=width, lists=[r[:nb] for r, nb in zip(prefix, nb_list, strict=True)],
        slots=slots, cow_dst=cow_dst, pool_rows=pool_rows,
    )


def _matches(copied: Copied, st: StepState, want: np.ndarray) -> bool:
    """Whether the variant's device table holds exactly ``want``, the host's tables of the live rows."""
    return bool(np.array_equal(gather_tables(copied.out.cpu().numpy(), copied.layout, st.ids, st.nblocks), want))


def _run_window(bench: TableCopyBench, trace: Trace, start: int, end: int, samples: Samples) -> None:
    """Replay steps ``0..end-1``; time every task in steps ``start..end-1`` (and run them once, untimed, at
    step ``start - 1`` to warm torch up)."""
    torch, mgr, perf = bench.torch, bench.mgr, time.perf_counter_ns
    tasks = bench.tasks()
    names = list(tasks)
    n_max = max(1, int(trace.running_per_step().max(initial=0)))
    cow_out, slot_out = np.zeros((n_max, 2), np.int64), np.zeros(n_max, np.int64)
    seq_ids = trace.a0.astype(np.int64)
    events = {k: (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for k in names} \
        if bench.cuda else {}
    pool_rows: list[int] = []  # rows allocated or forked since the last step the variants ran on
    for s in range(end):
        lo, mid, hi = int(trace.step_offsets[s]), int(trace.decode_offsets[s]), int(trace.step_offsets[s + 1])
        bench.table_guard.before_write()  # an asynchronous copy may still be reading the table
        if s == start:  # (d-changed-rows) tracks changes from here on
            bench.sync_mirror()
            pool_rows = []
        for o, x, y in zip(trace.op[lo:mid].tolist(), trace.a0[lo:mid].tolist(), trace.a1[lo:mid].tolist(),
                           strict=True):
            apply_pool_op(mgr, o, x, y)
            if o == ALLOCATE:
                pool_rows.append(x)
            elif o == FORK:
                pool_rows.append(y)
        ids = seq_ids[mid:hi]
        cows = mgr.decode_step(ids, cow_out, slot_out)
        if cows != trace.step_cows[s]:
            raise ReplayError(f"step {s}: {cows} copy-on-writes, the trace expects {trace.step_cows[s]}")
        if s < start - 1 or ids.size == 0:
            continue
        st = step_state(mgr, ids, slot_out[: ids.size].copy(), cow_out[:cows, 1].copy(), pool_rows)
        pool_rows = []
        order = names[s % len(names):] + names[: s % len(names)]  # rotate: no variant always runs cache-cold
        results: dict[str, tuple[int, Copied | None]] = {}
        for name in order:
            if name in samples.failed:
                continue
            ev = events.get(name)
            mark = _Marker(perf, ev[0] if ev else None)
            try:
                t0 = perf()
                copied = tasks[name](st, mark)
                t1 = perf()
            except (RuntimeError, TypeError, ValueError) as exc:
                samples.failed[name] = f"{type(exc).__name__}: {exc}"[:200]
                continue
            if ev:
                ev[1].record()
            results[name] = (t1 - t0 - mark.excluded, copied)
        if bench.cuda:
            torch.cuda.synchronize()
        if s < start:
            continue
        samples.add("steps", s)
        samples.add("live", ids.size)
        want = gather_tables(bench.table, "rows", st.ids, st.nblocks)
        for name, (ns, copied) in results.items():
            key = name.removeprefix("widen:")
            if name.startswith("widen:"):
                value = ev_ns(events[name]) if key == "device" else ns
                samples.add(f"{key}/table_widen_ns", value)
                continue
            if copied is not None and not _matches(copied, st, want):
                samples.mismatches[name] = samples.mismatches.get(name, 0) + 1
            samples.add(f"{key}/table_copy_ns", ns)
            samples.add(f"{key}/table_copy_ns_per_seq", ns / ids.size)
            samples.add(f"{key}/table_copy_bytes", copied.nbytes)
            samples.add(f"{key}/table_copies", copied.copies)
            if bench.cuda and copied.copies:
                samples.add(f"{key}/table_copy_device_ns", ev_ns(events[name]))
    bench.table_guard.before_write()


def ev_ns(pair: tuple[Any, Any]) -> float:
    """Nanoseconds between a pair of completed CUDA events."""
    return pair[0].elapsed_time(pair[1]) * 1e6


def default_steps(trace: Trace) -> int:
    """Steps to time by default: the per-sequence variants cost time in proportion to the batch, so a fixed
    budget of sequence-steps (:data:`SEQ_STEPS`) keeps every scenario to a few seconds: 300 steps up to 256
    sequences, 75 at 1,024."""
    batch = max(1, int(trace.running_per_step().max(initial=0)))
    return max(MIN_STEPS, min(MAX_STEPS, SEQ_STEPS // batch))


def _window(trace: Trace, steps: int, warmup: int) -> tuple[int, int]:
    """Steps ``start..end-1`` to time: ``steps`` after ``warmup``; a shorter trace warms up on at most its
    first half and times what is left, up to ``steps``."""
    start = min(warmup, trace.num_steps // 2)
    return start, min(trace.num_steps, start + steps)


def _row(scenario: str, regime: str, metric: str, values: list[float] | None, source: str, how: str,
         status: str = "ok") -> Row:
    if status == "ok" and not values:
        status, how = "skipped", "no step in the window gave a sample"
    value = statistics.median(values) if status == "ok" else float("nan")
    return Row(scenario, IMPL, regime, metric, value, UNITS[metric], source, status, how)


def _unavailable_rows(scenario: str, why: str) -> list[Row]:
    rows = [Row(scenario, IMPL, v, m, float("nan"), UNITS[m], "", "unavailable", why)
            for v in VARIANTS for m in COPY_METRICS]
    rows += [Row(scenario, IMPL, w, "table_widen_ns", float("nan"), "ns", "", "unavailable", why) for w in WIDEN]
    return rows


def _rows(scenario: str, samples: Samples, cuda: bool, window: tuple[int, int], widens: bool,
          no_device: str) -> list[Row]:
    values = samples.values
    where = f"median of {len(values.get('steps', []))} decode steps ({window[0]}..{window[1] - 1})"
    host_src = HOST_CUDA if cuda else HOST_CPU
    rows = []
    for v in VARIANTS:
        failed = samples.failed.get(v)
        if samples.mismatches.get(v):
            failed = f"device table differed from the host tables at {samples.mismatches[v]} steps"
        for metric in COPY_METRICS:
            source = {"table_copy_device_ns": CUDA_EVENTS, "table_copy_bytes": COMPUTED,
                      "table_copies": COMPUTED}.get(metric, host_src)
            if failed:
                rows.append(_row(scenario, v, metric, None, source, failed, "failed"))
            elif metric == "table_copy_device_ns" and not cuda:
                rows.append(_row(scenario, v, metric, None, "", no_device, "unavailable"))
            else:
                rows.append(_row(scenario, v, metric, values.get(f"{v}/{metric}"), source, where))
    for w in WIDEN:
        source = CUDA_EVENTS if w == "device" else "perf_counter_ns, host"
        if not widens:
            rows.append(_row(scenario, w, "table_widen_ns", None, "", "table ids are 32-bit already", "skipped"))
        elif f"widen:{w}" in samples.failed:
            rows.append(_row(scenario, w, "table_widen_ns", None, source, samples.failed[f"widen:{w}"], "failed"))
        elif w == "device" and not cuda:
            rows.append(_row(scenario, w, "table_widen_ns", None, "", no_device, "unavailable"))
        else:
            rows.append(_row(scenario, w, "table_widen_ns", values.get(f"{w}/table_widen_ns"), source,
                             f"{where}; live rows, all columns"))
    return rows


def measure(trace: Trace, steps: int | None = None, warmup: int = DEFAULT_WARMUP,
            device: str = "auto") -> tuple[list[Row], dict[str, list[float]]]:
    """Measure every variant on ``trace`` (the flat design); returns the tidy rows and the raw per-step samples.

    ``steps`` decode steps are timed after ``warmup`` untimed ones (None: :func:`default_steps`); a trace too
    short for both warms up on at most its first half. The rows' ``how`` names the steps timed.
    ``device``: ``"auto"`` (CUDA when torch sees one), ``"cpu"``, or ``"cuda"`` (``RuntimeError`` without
    one). Without torch, every row is ``unavailable`` and the samples are empty.
    """
    if device not in ("auto", "cpu", "cuda"):
        raise ValueError(f"device must be 'auto', 'cpu' or 'cuda', got {device!r}")
    steps = default_steps(trace) if steps is None else steps
    if steps < 1 or warmup < 0:
        raise ValueError(f"need steps >= 1 and warmup >= 0, got {steps} and {warmup}")
    scenario = str(trace.header["scenario"])
    try:
        import torch
    except ImportError:
        if device == "cuda":
            raise RuntimeError(f"device='cuda' {NEEDS_TORCH}") from None
        return _unavailable_rows(scenario, NEEDS_TORCH), {}
    cuda = device == "cuda" or (device == "auto" and torch.cuda.is_available())
    if cuda and not torch.cuda.is_available():
        raise RuntimeError("device='cuda' but torch.cuda.is_available() is False")
    bench = TableCopyBench(torch, trace.config, cuda)
    window = _window(trace, steps, warmup)
    samples = Samples()
    threads = torch.get_num_threads()
    # One intra-op thread: the CPU copy stands in for a DMA engine, not for host threads, and on a shared
    # two-core machine a parallel copy of 128 KiB waited whole scheduler time slices (~8 ms) for its helper.
    torch.set_num_threads(1)
    try:
        _run_window(bench, trace, *window, samples)
    finally:
        torch.set_num_threads(threads)
    no_device = NO_CUDA if not torch.cuda.is_available() else "device='cpu' requested"
    return _rows(scenario, samples, cuda, window, bench.widens, no_device), samples.values


# -- command line -------------------------------------------------------------------------------------------
def _print_table(rows: Sequence[Row]) -> None:
    scenarios = list(dict.fromkeys(r.scenario for r in rows))
    cells = {(r.scenario, r.regime, r.metric): r for r in rows}
    keys = [(v, m) for v in VARIANTS for m in ("table_copy_ns", "table_copy_device_ns", "table_copy_bytes")]
    keys += [(w, "table_widen_ns") for w in WIDEN]

    def show(r: Row | None) -> str:
        if r is None:
            return "-"
        return f"{r.value:,.0f}" if r.status == "ok" else r.status

    print(f"{'regime':<16}{'metric':<22}" + "".join(f"{s:>18}" for s in scenarios))
    for regime, metric in keys:
        print(f"{regime:<16}{metric:<22}" + "".join(f"{show(cells.get((s, regime, metric))):>18}"
                                                   for s in scenarios))


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m harness.table_copy``: measure, write ``results.csv`` and raw samples, print a table."""
    parser = argparse.ArgumentParser(prog="python -m harness.table_copy", description=__doc__.split("\n")[0])
    parser.add_argument("--scenarios", nargs="+", default=list(DEFAULT_SCENARIOS), metavar="NAME")
    parser.add_argument("--steps", type=int, help=f"decode steps timed per scenario (default: {SEQ_STEPS:,} "
                        f"sequence-steps, {MIN_STEPS} to {MAX_STEPS} steps)")
    parser.add_argument("--warmup", type=int, default=DEFAULT_WARMUP, help="untimed steps before them")
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    parser.add_argument("--out", type=Path, help="run directory to write (default: a new results/<id>-table-copy)")
    parser.add_argument("--full-trace", action="store_true",
                        help="generate every scenario's full trace (default: only its first warmup+steps steps, "
                             "which are identical, and faster to generate)")
    args = parser.parse_args(argv)
    from scenarios import generate

    out = args.out or new_run_dir(label="table-copy")
    out.mkdir(parents=True, exist_ok=True)
    rows: list[Row] = []
    timings = {}
    for name in args.scenarios:
        overrides = {} if args.full_trace else {"steps": args.warmup + (args.steps or MAX_STEPS)}
        trace = generate(name, **overrides)
        t0 = time.perf_counter()
        got, raw = measure(trace, args.steps, args.warmup, args.device)
        timings[name] = round(time.perf_counter() - t0, 3)
        rows += got
        write_rows(out / "results.csv", rows)
        write_json(out / "raw" / name / f"{IMPL}__table-copy.json.gz", raw, compress=True)
        print(f"{name}: measured in {timings[name]:.1f} s", file=sys.stderr)
    meta: dict[str, object] = {"command": ["python", "-m", "harness.table_copy", *(argv or sys.argv[1:])],
                               "seconds_per_scenario": timings}
    try:
        import torch

        meta["torch"] = torch.__version__
        meta["cuda_device"] = torch.cuda.get_device_name() if torch.cuda.is_available() else None
    except ImportError:
        meta["torch"] = None
    write_json(out / "table_copy_meta.json", meta)
    _print_table(rows)
    print(f"\nwrote {out / 'results.csv'}")
    return 1 if any(r.status == "failed" for r in rows) else 0


if __name__ == "__main__":
    raise SystemExit(main())
