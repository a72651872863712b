"""Rule 3 for ``flat-rows``: only the 64-byte rows a step wrote go to the device. Design: docs/measurement.md#copied."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from harness.base.replay import ReplayError
from harness.studies.table_copy.guards import BufferRing
from impls.designs.flat import FlatBlockManager
from impls.designs.flat_rows import FlatRowsBlockManager

VARIANT = "e-rows-changed"
INDEX_BYTES = 8
DIR_BYTES = 4


class MirroredFlat(FlatBlockManager):
    """``flat`` whose pool operations and decode steps also drive a ``flat-rows`` manager, :attr:`rows`; a decode step
    on which the two disagree raises :class:`ReplayError`."""

    def __init__(self, num_blocks: int, block_size: int = 16, max_seqs: int = 256, max_blocks_per_seq: int = 256,
                 *, table: np.ndarray | None = None) -> None:
        super().__init__(num_blocks, block_size, max_seqs, max_blocks_per_seq, table=table)
        self.rows = FlatRowsBlockManager(num_blocks, block_size, max_seqs, max_blocks_per_seq)
        self._cow, self._slot = np.zeros((max_seqs, 2), np.int64), np.zeros(max_seqs, np.int64)

    def allocate(self, seq_id: int, num_tokens: int) -> None:
        super().allocate(seq_id, num_tokens)
        self.rows.allocate(seq_id, num_tokens)

    def fork(self, parent_id: int, child_id: int) -> None:
        super().fork(parent_id, child_id)
        self.rows.fork(parent_id, child_id)

    def free(self, seq_id: int) -> None:
        super().free(seq_id)
        self.rows.free(seq_id)

    def decode_step(self, seq_ids: np.ndarray, cow_out: np.ndarray, slot_out: np.ndarray) -> int:
        cows = super().decode_step(seq_ids, cow_out, slot_out)
        n = len(seq_ids)
        if self.rows.decode_step(seq_ids, self._cow, self._slot) != cows or not np.array_equal(
                self._slot[:n], slot_out[:n]):
            raise ReplayError("flat-rows and flat disagree on a decode step (slots or copy-on-writes)")
        return cows


class RowsMirror:
    """The device side of ``e-rows-changed`` for one :class:`~harness.studies.table_copy.variants.TableCopyBench`."""

    def __init__(self, bench: Any) -> None:
        torch, rm = bench.torch, bench.mgr.rows
        self.bench, self.rm, self.torch = bench, rm, torch
        lay = rm.layout
        self.per_row, self.dir_len, s = lay.ids_per_row, lay.dir_len, rm.max_seqs
        self.row_shift = self.per_row.bit_length() - 1
        self.dirs = rm._dirs.reshape(-1)

        def dev(shape: tuple[int, ...], dtype: Any) -> Any:
            return torch.zeros(shape, dtype=dtype, device=bench.device)

        self.rows_dev = dev((lay.num_rows, self.per_row), bench.t16)
        self.dirs_dev = dev((s * lay.dir_len,), torch.int32)
        self.out = dev((s, rm.max_blocks_per_seq), torch.int32)
        self.stage = (dev((lay.num_rows, self.per_row), bench.t16), dev((lay.num_rows,), torch.int64),
                      dev((s * lay.dir_len,), torch.int32), dev((s * lay.dir_len,), torch.int64))
        self.ring = [tuple(bench._host(t.shape, t.dtype) for t in self.stage) for _ in range(2)]
        self.np_ring = [(r.numpy().view(rm.rows.dtype), i.numpy(), d.numpy(), di.numpy()) for r, i, d, di in self.ring]
        self.buffers = BufferRing(2, bench.new_event)

    def sync(self) -> None:
        """Bring the mirror up to date with the whole host state (untimed, once)."""
        host_rows = self.torch.from_numpy(self.rm.rows.view(np.int16 if self.rm.rows.itemsize == 2 else np.int32))
        self.rows_dev.copy_(host_rows)
        self.dirs_dev.copy_(self.torch.from_numpy(self.dirs))

    def changed(self, st: Any) -> tuple[np.ndarray, np.ndarray]:
        """Rows the step wrote and directory entries that may have changed (flat indices), sorted, unique."""
        rm, bs = self.rm, self.bench.block_size
        wrote = (st.slots & (bs - 1)) == 0
        if st.cow_dst.size:
            wrote |= np.isin(st.slots >> self.bench.shift, st.cow_dst)
        seqs = st.ids[wrote]
        last_k = ((rm._lens[seqs].astype(np.int64) - 1) >> (self.bench.shift + self.row_shift))
        rows, dirs = [rm._last[seqs].astype(np.int64)], [seqs * self.dir_len + last_k]
        for seq in st.pool_rows:
            if rm._lens[seq]:
                held = rm._row_ids(seq).astype(np.int64)
                rows.append(held)
                dirs.append(seq * self.dir_len + np.arange(held.size))
        return np.unique(np.concatenate(rows)), np.unique(np.concatenate(dirs))

    def copy(self, st: Any, mark: Callable[[], None]) -> Any:
        """The variant: changed rows and directory entries to the mirror, then the attention's table from it."""

        rows, dirs = self.changed(st)
        k, m = rows.size, dirs.size
        if k == 0 and m == 0:
            return Copied(self.out, "rows", 0, 0)
        i = self.buffers.acquire()
        h_rows, h_idx, h_dirs, h_didx = self.np_ring[i]
        np.take(self.rm.rows, rows, axis=0, out=h_rows[:k])
        h_idx[:k] = rows
        np.take(self.dirs, dirs, out=h_dirs[:m])
        h_didx[:m] = dirs
        d_rows, d_idx, d_dirs, d_didx = self.stage
        mark()
        for dst, src, n in zip(self.stage, self.ring[i], (k, k, m, m), strict=True):
            dst[:n].copy_(src[:n], non_blocking=True)
        self.rows_dev.index_copy_(0, d_idx[:k], d_rows[:k])
        self.dirs_dev.index_copy_(0, d_didx[:m], d_dirs[:m])
        self.buffers.copied()
        lo, hi, width = st.lo, st.hi, st.width
        used = -(-width // self.per_row)
        where = self.dirs_dev.view(-1, self.dir_len)[lo:hi, :used].long()
        self.bench.widen(self.out[lo:hi, :width], self.rows_dev[where].reshape(hi - lo, -1)[:, :width])
        nbytes = k * (self.per_row * self.rm.rows.itemsize + INDEX_BYTES) + m * (DIR_BYTES + INDEX_BYTES)
        return Copied(self.out, "rows", nbytes, 4)


@dataclass
class Copied:
    """What one variant did in one step: its device table, how to read it, and what crossed to the device."""

    out: Any  # torch tensor on the device
    layout: str  # "rows" or "batch" (see gather_tables)
    nbytes: int
    copies: int
