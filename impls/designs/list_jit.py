"""Compiled twin of design B (``"list-jit"``): per sequence an int64 array grown by doubling."""

from __future__ import annotations

import numpy as np
from numba import njit, typed

from impls.contract import blocks_for
from impls.core.validation import blocks_needed_jit
from impls.designs.twins import BLOCK_SHIFT, TwinBlockManager, next_token, twin_kernels

TOP = 3


@njit(cache=True, inline="always")
def _new_table(need):
    return np.empty(need, dtype=np.int64)


@njit(cache=True, inline="always")
def _take(refs, pool, meta):
    meta[TOP] -= 1
    block = pool[meta[TOP]]
    refs[block] = 1
    return block


@njit(cache=True, inline="always")
def _pool_size(pool, meta):
    return meta[TOP]


@njit(cache=True, inline="always")
def _push_back(tables, seq, size, block):
    """Store ``block`` at index ``size`` of the row, doubling its capacity (a copy) when it is full."""
    row = tables[seq]
    if size == row.shape[0]:
        grown = np.empty(max(1, 2 * size), dtype=np.int64)
        grown[:size] = row
        tables[seq] = grown
        row = grown
    row[size] = block


@njit(cache=True, inline="always")
def _append_token(tables, lens, refs, pool, meta, seq, sh):
    j, opens = next_token(lens, seq, sh)
    if opens:
        _push_back(tables, seq, j, _take(refs, pool, meta))
        return 0, -1, -1
    row = tables[seq]
    src = row[j]
    if refs[src] == 1:
        return 0, -1, -1
    refs[src] -= 1
    dst = _take(refs, pool, meta)
    row[j] = dst
    return 1, src, dst


@njit(cache=True, inline="always")
def _copy_table(tables, lens, refs, meta, parent):
    row = tables[parent][: blocks_needed_jit(lens[parent], meta[BLOCK_SHIFT])].copy()
    for block in row:
        refs[block] += 1
    return row


@njit(cache=True, inline="always")
def _release_table(tables, lens, refs, pool, meta, seq):
    row = tables[seq]
    for j in range(blocks_needed_jit(lens[seq], meta[BLOCK_SHIFT]) - 1, -1, -1):
        block = row[j]
        refs[block] -= 1
        if refs[block] == 0:
            pool[meta[TOP]] = block
            meta[TOP] += 1


@njit(cache=True)
def _build(max_seqs):
    tables = typed.List()
    for _ in range(max_seqs):
        tables.append(np.empty(0, dtype=np.int64))
    return tables


KERNELS = twin_kernels(__name__, new_table=_new_table, take=_take, pool_size=_pool_size, append_token=_append_token,
                       copy_table=_copy_table, release_table=_release_table)


class ListJitBlockManager(TwinBlockManager):
    """Compiled twin of design B (``"list-jit"``): per-sequence int64 arrays grown by doubling."""

    kernels = KERNELS

    def _containers(self) -> tuple:
        refs = np.zeros(self.num_blocks, dtype=np.int64)
        pool = np.arange(self.num_blocks - 1, -1, -1, dtype=np.int64)
        meta = np.array([self.block_shift, self.max_blocks_per_seq, 0, self.num_blocks], dtype=np.int64)
        return _build(self.max_seqs), refs, pool, meta

    def memory_bytes(self) -> int:
        return 16 * self.num_blocks + 16 * self.max_seqs + 8 * 4

    def num_free_blocks(self) -> int:
        return int(self._meta[TOP])

    def _table(self, seq_id: int) -> list[int]:
        n = blocks_for(int(self._lens[seq_id]), self.block_size)
        return self._tables[seq_id][:n].tolist()

    def _ref(self, block_id: int) -> int:
        return int(self._refs[block_id])

    def _table_nbytes(self, seq_id: int) -> int:
        return int(self._tables[seq_id].nbytes)
