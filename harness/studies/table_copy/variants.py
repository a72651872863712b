"""The variants of the rule-3 study: how each turns a step's block tables into the device's int32 tensor."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from harness.studies.table_copy.copied import Copied, MirroredFlat, RowsMirror
from harness.studies.table_copy.guards import BufferRing, CopyGuard, DoneEvent, Event
from impls.contract import blocks_for
from impls.core.ids import table_dtype
from impls.designs.flat import FlatBlockManager
from scenarios import PAPER

VARIANTS = ("a-per-seq", "b-rebuild", "c-one-copy", "c-host-widen", "d-changed-rows", "d-live-cols",
            "e-rows-changed")
# Each variant in a few words, for legends (docs/measurement.md#table_copy says it in full).
VARIANT_WORDS = {"a-per-seq": "a copy per sequence", "b-rebuild": "lists padded, a new tensor",
                 "c-one-copy": "the table, one copy", "c-host-widen": "one copy, widened on the host",
                 "d-changed-rows": "changed rows only", "d-live-cols": "live columns packed",
                 "e-rows-changed": "flat-rows' changed rows"}
WIDEN = ("host-numpy", "host-torch", "device")
COPY_METRICS = ("table_copy_ns", "table_copy_ns_per_seq", "table_copy_device_ns", "table_copy_bytes",
                "table_copy_bytes_per_step", "table_copies")
UNITS = {"table_copy_ns": "ns", "table_copy_ns_per_seq": "ns/seq", "table_copy_device_ns": "ns",
         "table_copy_bytes": "B", "table_copy_bytes_per_step": "B/step", "table_copies": "copies",
         "table_widen_ns": "ns"}
IMPL = "flat"
PAD = -1
NEEDS_TORCH = "needs torch: pip install -e '.[torch]'"
NO_CUDA = "no CUDA device"
HOST_CPU = "perf_counter_ns, host (CPU tensor as device)"
HOST_CUDA = "perf_counter_ns, host (issue time)"
CUDA_EVENTS = "cuda-events"
COMPUTED = "computed from the copies issued"
DEFAULT_WARMUP = 200
MAX_STEPS, MIN_STEPS = 300, 50
SEQ_STEPS = 300 * 256
TABLE_ENTRIES = 300 * 256 * 256
DEFAULT_SCENARIOS = (PAPER, "concurrency-64", "concurrency-128", "concurrency-256", "concurrency-512",
                     "concurrency-1024")


def gather_tables(out: np.ndarray, layout: str, ids: np.ndarray, nblocks: np.ndarray, pad: int = PAD) -> np.ndarray:
    """The batch's block tables read from a variant's device table (as a host array)."""
    if layout not in ("rows", "batch"):
        raise ValueError(f"unknown layout {layout!r}")
    width = int(nblocks.max(initial=0))
    rows = out[ids, :width] if layout == "rows" else out[: len(ids), :width]
    live = np.arange(width) < np.asarray(nblocks)[:, None]
    return np.where(live, rows.astype(np.int64), pad)


def padded_lists(tables: Sequence[Sequence[int]], pad: int = PAD) -> np.ndarray:
    """Lists of block ids as one ``[n, longest]`` int64 array padded with ``pad`` (what (b) builds)."""
    width = max((len(t) for t in tables), default=0)
    return np.array([list(t) + [pad] * (width - len(t)) for t in tables], dtype=np.int64).reshape(len(tables), width)


@dataclass
class StepState:
    """One decode step as the variants see it, built outside the timed regions."""

    ids: np.ndarray
    ids_list: list[int]
    nblocks: np.ndarray
    nblocks_list: list[int]
    lo: int
    hi: int
    width: int
    lists: list[list[int]]
    slots: np.ndarray
    cow_dst: np.ndarray
    pool_rows: list[int]


@dataclass
class Samples:
    """Per-step raw samples of one measurement, and failures found by the checks."""

    values: dict[str, list[float]] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)
    mismatches: dict[str, int] = field(default_factory=dict)

    def add(self, key: str, value: float) -> None:
        self.values.setdefault(key, []).append(float(value))


def _widen_mode(torch: Any, np_dtype: np.dtype, device: Any) -> str:
    """How the table's ids become int32 on ``device``."""
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
        # The ids travel as int16 bits: torch's CPU copy of uint16 has no vectorised kernel.
        self.widens = np_table == np.uint16
        self.t16 = torch.int16 if self.widens else torch.int32
        self.itemsize = np_table.itemsize
        self.widen_mode = _widen_mode(torch, np_table, self.device)
        self.host16 = self._host((s, w), self.t16)
        self.mgr = MirroredFlat(**config, table=self.host16.numpy().view(np_table))
        self.table = self.mgr.table

        def dev(shape: tuple[int, ...], dtype: Any) -> Any:
            return torch.zeros(shape, dtype=dtype, device=self.device)

        i32 = torch.int32
        # Each variant writes its own device tensors: one that misses a row cannot be covered up by another.
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
        self.rows_mirror = RowsMirror(self)
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
        """Bring the device mirrors of (d-changed-rows) and (e-rows-changed) up to date (untimed, once)."""
        self.widen(self.d32, self.host16.to(self.device))
        self.rows_mirror.sync()

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
        out = host.to(self.device, non_blocking=True, copy=True)
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
        dirty[st.ids[(st.slots & (self.block_size - 1)) == 0]] = True
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
            "d-live-cols": self.d_live_cols, "e-rows-changed": self.rows_mirror.copy,
        }
        if self.widens:
            out["widen:host-numpy"] = self.widen_host_numpy
            out["widen:host-torch"] = self.widen_host_torch
            if self.cuda:
                out["widen:device"] = self.widen_device
        return out


class Marker:
    """Records the CUDA start event at a variant's first device operation, outside the host time."""

    def __init__(self, perf: Callable[[], int], event: Any) -> None:
        self.perf, self.event, self.excluded = perf, event, 0

    def __call__(self) -> None:
        if self.event is not None:
            t = self.perf()
            self.event.record()
            self.excluded += self.perf() - t


def step_state(mgr: FlatBlockManager, ids: np.ndarray, slots: np.ndarray, cow_dst: np.ndarray,
               pool_rows: list[int]) -> StepState:
    """The variants' view of the step ``mgr`` just decoded."""
    nblocks = blocks_for(mgr._lens[ids].astype(np.int64), mgr.block_size)
    width = int(nblocks.max())
    nb_list = nblocks.tolist()
    prefix = mgr.table[ids, :width].tolist()
    return StepState(
        ids=ids, ids_list=ids.tolist(), nblocks=nblocks, nblocks_list=nb_list, lo=int(ids.min()),
        hi=int(ids.max()) + 1, width=width, lists=[r[:nb] for r, nb in zip(prefix, nb_list, strict=True)],
        slots=slots, cow_dst=cow_dst, pool_rows=pool_rows,
    )
