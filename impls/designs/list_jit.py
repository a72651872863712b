"""Compiled twin of design B (``"list-jit"``): per sequence an int64 array grown by doubling with a copy,
as ``std::vector<int64_t>::push_back`` does. Ref counts an int64 array, the free pool an int64 array used as a
stack (a vector reserved to the pool size).

Against ``flat`` it isolates two things the article blames: per-sequence heap arrays that reallocate as they
grow, and 8-byte block ids.
"""

from __future__ import annotations

import numpy as np
from numba import njit, typed

from impls.contract import E_BUFFER, E_COUNT, E_NO_BLOCKS, OK, blocks_for
from impls.core.compiled import CompiledBlockManager, Kernels
from impls.core.validation import (
    blocks_needed_jit,
    check_active_jit,
    check_allocate_jit,
    check_append_jit,
    check_batch_jit,
    check_fork_jit,
    slot_of_jit,
)

# meta slots
BLOCK_SHIFT, MAX_BLOCKS, TOP, STAMP = 0, 1, 2, 3


@njit(cache=True, inline="always")
def _take(refs, pool, meta):
    meta[TOP] -= 1
    block = pool[meta[TOP]]
    refs[block] = 1
    return block


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


@njit(cache=True)
def can_allocate(tables, lens, refs, pool, meta, marks, n):
    if n < 0:
        return E_COUNT
    return 1 if meta[TOP] >= n else 0


@njit(cache=True)
def allocate(tables, lens, refs, pool, meta, marks, seq, num_tokens):
    sh = meta[BLOCK_SHIFT]
    rc = check_allocate_jit(lens, meta[MAX_BLOCKS], sh, seq, num_tokens)
    if rc != OK:
        return rc
    need = blocks_needed_jit(num_tokens, sh)
    if need > meta[TOP]:
        return E_NO_BLOCKS
    row = np.empty(need, dtype=np.int64)  # like std::vector<int64_t>(need)
    for j in range(need):
        row[j] = _take(refs, pool, meta)
    tables[seq] = row
    lens[seq] = num_tokens
    return OK


@njit(cache=True, inline="always")
def _needs_block(tables, lens, refs, seq, sh):
    n = lens[seq]
    if (n & ((1 << sh) - 1)) == 0:
        return True
    # (not `return a or b`: Numba lowers that form about 20x slower than the branch)
    return refs[tables[seq][n >> sh]] > 1


@njit(cache=True, inline="always")
def _append(tables, lens, refs, pool, meta, seq, sh):
    n = lens[seq]
    lens[seq] = n + 1
    j = n >> sh
    if (n & ((1 << sh) - 1)) == 0:
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


@njit(cache=True)
def append(tables, lens, refs, pool, meta, marks, seq):
    sh = meta[BLOCK_SHIFT]
    rc = check_append_jit(lens, meta[MAX_BLOCKS], sh, seq)
    if rc != OK:
        return rc, -1, -1
    if meta[TOP] == 0 and _needs_block(tables, lens, refs, seq, sh):
        return E_NO_BLOCKS, -1, -1
    return _append(tables, lens, refs, pool, meta, seq, sh)


@njit(cache=True)
def fork(tables, lens, refs, pool, meta, marks, parent, child):
    rc = check_fork_jit(lens, parent, child)
    if rc != OK:
        return rc
    nblocks = blocks_needed_jit(lens[parent], meta[BLOCK_SHIFT])
    row = tables[parent][:nblocks].copy()
    for block in row:
        refs[block] += 1
    tables[child] = row
    lens[child] = lens[parent]
    return OK


@njit(cache=True)
def free(tables, lens, refs, pool, meta, marks, seq):
    rc = check_active_jit(lens, seq)
    if rc != OK:
        return rc
    row = tables[seq]
    for j in range(blocks_needed_jit(lens[seq], meta[BLOCK_SHIFT]) - 1, -1, -1):
        block = row[j]
        refs[block] -= 1
        if refs[block] == 0:
            pool[meta[TOP]] = block
            meta[TOP] += 1
    lens[seq] = 0
    return OK


@njit(cache=True)
def last_slot(tables, lens, refs, pool, meta, marks, seq):
    rc = check_active_jit(lens, seq)
    if rc != OK:
        return rc
    sh = meta[BLOCK_SHIFT]
    n = lens[seq] - 1
    return slot_of_jit(tables[seq][n >> sh], n, sh)


@njit(cache=True)
def decode_step(tables, lens, refs, pool, meta, marks, seq_ids, cow_out, slot_out):
    sh = meta[BLOCK_SHIFT]
    n = seq_ids.shape[0]
    if slot_out.shape[0] < n or cow_out.shape[0] < n:
        return E_BUFFER, n
    meta[STAMP] += 1
    stamp = meta[STAMP]
    rc, i = check_batch_jit(lens, marks, stamp, meta[MAX_BLOCKS], sh, seq_ids)  # before changing anything
    if rc != OK:
        return rc, i
    if n > meta[TOP]:  # only a tight pool needs the exact worst case (a ref-count read per sequence)
        need = 0
        for i in range(n):
            need += _needs_block(tables, lens, refs, seq_ids[i], sh)
        if need > meta[TOP]:
            return E_NO_BLOCKS, need
    cows = 0
    for i in range(n):
        seq = seq_ids[i]
        cow, src, dst = _append(tables, lens, refs, pool, meta, seq, sh)
        if cow:
            cow_out[cows, 0] = src
            cow_out[cows, 1] = dst
            cows += 1
        m = lens[seq] - 1
        slot_out[i] = slot_of_jit(tables[seq][m >> sh], m, sh)
    return cows, 0


@njit(cache=True)
def lookup(tables, lens, refs, pool, meta, marks, seq_ids, slot_out):
    sh = meta[BLOCK_SHIFT]
    n = seq_ids.shape[0]
    if slot_out.shape[0] < n:
        return E_BUFFER, n
    for i in range(n):
        seq = seq_ids[i]
        rc = check_active_jit(lens, seq)
        if rc != OK:
            return rc, i
        m = lens[seq] - 1
        slot_out[i] = slot_of_jit(tables[seq][m >> sh], m, sh)
    return OK, 0


@njit(cache=True)
def _build(max_seqs):
    tables = typed.List()
    for _ in range(max_seqs):
        tables.append(np.empty(0, dtype=np.int64))
    return tables


KERNELS = Kernels(can_allocate, allocate, append, fork, free, decode_step, lookup, last_slot)


class ListJitBlockManager(CompiledBlockManager):
    """Compiled twin of design B (``"list-jit"``): per-sequence int64 arrays grown by doubling."""

    kernels = KERNELS

    def __init__(self, num_blocks: int, block_size: int = 16, max_seqs: int = 256,
                 max_blocks_per_seq: int = 256) -> None:
        super().__init__(num_blocks, block_size, max_seqs, max_blocks_per_seq)
        self._tables = _build(self.max_seqs)
        self._lens = np.zeros(self.max_seqs, dtype=np.int64)
        self._refs = np.zeros(self.num_blocks, dtype=np.int64)
        pool = np.arange(self.num_blocks - 1, -1, -1, dtype=np.int64)  # the top hands out 0, 1, 2, ...
        self._meta = np.array([self.block_shift, self.max_blocks_per_seq, self.num_blocks, 0], dtype=np.int64)
        marks = np.zeros(self.max_seqs, dtype=np.int64)
        self.state = (self._tables, self._lens, self._refs, pool, self._meta, marks)

    def memory_bytes(self) -> int:
        """Per block 16 B (int64 ref count and pool slot), per row 16 B (int64 length and mark); the rows' own
        arrays start empty and grow with the sequence (by doubling: up to 16 B per block in use)."""
        return 16 * self.num_blocks + 16 * self.max_seqs + 8 * 4

    def num_free_blocks(self) -> int:
        return int(self._meta[TOP])

    def _table(self, seq_id: int) -> list[int]:
        n = blocks_for(int(self._lens[seq_id]), self.block_size)
        return self._tables[seq_id][:n].tolist()

    def _ref(self, block_id: int) -> int:
        return int(self._refs[block_id])

    def _table_nbytes(self, seq_id: int) -> int:
        # The row's data buffer at its current (doubled) capacity; array headers not counted.
        return int(self._tables[seq_id].nbytes)
