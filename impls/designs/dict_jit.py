"""Compiled twin of design A (``"dict-jit"``): a Numba typed.Dict per sequence, as C++ would use
``std::unordered_map<int, int>``. Ref counts in a typed.Dict, the free pool a typed.List used as a stack.

It exists so that the batched regime compares data structures under compilation (as the article's C++ did),
not the interpreter against compiled code. Allocating a sequence builds a new hash map; taking a block
inserts a key: both allocate, which is what design A costs.
"""

from __future__ import annotations

import numpy as np
from numba import njit, typed, types

from impls.contract import E_BUFFER, E_COUNT, E_NO_BLOCKS, OK
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
BLOCK_SHIFT, MAX_BLOCKS, STAMP = 0, 1, 2
_i64 = types.int64


@njit(cache=True, inline="always")
def _new_table():
    return typed.Dict.empty(key_type=_i64, value_type=_i64)


@njit(cache=True, inline="always")
def _take(refs, pool):
    block = pool.pop()
    refs[block] = 1
    return block


@njit(cache=True)
def can_allocate(tables, lens, refs, pool, meta, marks, n):
    if n < 0:
        return E_COUNT
    return 1 if len(pool) >= n else 0


@njit(cache=True)
def allocate(tables, lens, refs, pool, meta, marks, seq, num_tokens):
    sh = meta[BLOCK_SHIFT]
    rc = check_allocate_jit(lens, meta[MAX_BLOCKS], sh, seq, num_tokens)
    if rc != OK:
        return rc
    need = blocks_needed_jit(num_tokens, sh)
    if need > len(pool):
        return E_NO_BLOCKS
    table = _new_table()
    for j in range(need):
        table[j] = _take(refs, pool)
    tables[seq] = table
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
def _append(tables, lens, refs, pool, seq, sh):
    n = lens[seq]
    lens[seq] = n + 1
    table = tables[seq]
    j = n >> sh
    if (n & ((1 << sh) - 1)) == 0:
        table[j] = _take(refs, pool)
        return 0, -1, -1
    src = table[j]
    if refs[src] == 1:
        return 0, -1, -1
    refs[src] -= 1
    dst = _take(refs, pool)
    table[j] = dst
    return 1, src, dst


@njit(cache=True)
def append(tables, lens, refs, pool, meta, marks, seq):
    sh = meta[BLOCK_SHIFT]
    rc = check_append_jit(lens, meta[MAX_BLOCKS], sh, seq)
    if rc != OK:
        return rc, -1, -1
    if len(pool) == 0 and _needs_block(tables, lens, refs, seq, sh):
        return E_NO_BLOCKS, -1, -1
    return _append(tables, lens, refs, pool, seq, sh)


@njit(cache=True)
def fork(tables, lens, refs, pool, meta, marks, parent, child):
    rc = check_fork_jit(lens, parent, child)
    if rc != OK:
        return rc
    table = _new_table()
    for j, block in tables[parent].items():
        table[j] = block
        refs[block] += 1
    tables[child] = table
    lens[child] = lens[parent]
    return OK


@njit(cache=True)
def free(tables, lens, refs, pool, meta, marks, seq):
    rc = check_active_jit(lens, seq)
    if rc != OK:
        return rc
    table = tables[seq]
    for j in range(len(table) - 1, -1, -1):
        block = table[j]
        if refs[block] == 1:
            del refs[block]
            pool.append(block)
        else:
            refs[block] -= 1
    table.clear()
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
    if n > len(pool):  # only a tight pool needs the exact worst case (a ref-count read per sequence)
        need = 0
        for i in range(n):
            need += _needs_block(tables, lens, refs, seq_ids[i], sh)
        if need > len(pool):
            return E_NO_BLOCKS, need
    cows = 0
    for i in range(n):
        seq = seq_ids[i]
        cow, src, dst = _append(tables, lens, refs, pool, seq, sh)
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
def _build(num_blocks, max_seqs):
    tables = typed.List()
    for _ in range(max_seqs):
        tables.append(_new_table())
    refs = typed.Dict.empty(key_type=_i64, value_type=_i64)
    pool = typed.List()
    for block in range(num_blocks - 1, -1, -1):  # pop() hands out 0, 1, 2, ...
        pool.append(np.int64(block))
    return tables, refs, pool


KERNELS = Kernels(can_allocate, allocate, append, fork, free, decode_step, lookup, last_slot)


class DictJitBlockManager(CompiledBlockManager):
    """Compiled twin of design A (``"dict-jit"``): typed.Dict per sequence."""

    kernels = KERNELS

    def __init__(self, num_blocks: int, block_size: int = 16, max_seqs: int = 256,
                 max_blocks_per_seq: int = 256) -> None:
        super().__init__(num_blocks, block_size, max_seqs, max_blocks_per_seq)
        self._tables, self._refs, self._pool = _build(self.num_blocks, self.max_seqs)
        self._lens = np.zeros(self.max_seqs, dtype=np.int64)
        meta = np.array([self.block_shift, self.max_blocks_per_seq, 0], dtype=np.int64)
        marks = np.zeros(self.max_seqs, dtype=np.int64)
        self.state = (self._tables, self._lens, self._refs, self._pool, meta, marks)

    def memory_bytes(self) -> int:
        """Per block 8 B (the pool's int64 slot), per row 16 B (int64 length and mark): a lower bound, as the
        typed containers' headers and each row's empty hash map are not counted; ref counts and tables grow
        with the blocks in use (a hash-map entry, >= 24 B, per reference)."""
        return 8 * self.num_blocks + 16 * self.max_seqs + 8 * 3

    def num_free_blocks(self) -> int:
        return len(self._pool)

    def _table(self, seq_id: int) -> list[int]:
        table = self._tables[seq_id]
        return [table[j] for j in range(len(table))]

    def _ref(self, block_id: int) -> int:
        return self._refs.get(block_id, 0)

    def _table_nbytes(self, seq_id: int) -> None:
        return None  # a Numba typed.Dict does not expose its memory footprint
