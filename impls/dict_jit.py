"""Compiled twin of design A (``"dict-jit"``): a Numba typed.Dict per sequence, as C++ would use
``std::unordered_map<int, int>``. Ref counts in a typed.Dict, the free pool a typed.List used as a stack.

It exists so that the batched regime compares data structures under compilation (as the article's C++ did),
not the interpreter against compiled code. Allocating a sequence builds a new hash map; taking a block
inserts a key: both allocate, which is what design A costs.
"""

from __future__ import annotations

import numpy as np
from numba import njit, typed, types

from .compiled import CompiledBlockManager, Kernels
from .contract import E_BUFFER, E_COUNT, E_DUPLICATE, E_NO_BLOCKS, OK
from .validation import check_active_jit, check_allocate_jit, check_append_jit, check_fork_jit

# meta slots
BLOCK_SIZE, MAX_BLOCKS, STAMP = 0, 1, 2
_i64 = types.int64


@njit(cache=True)
def _new_table():
    return typed.Dict.empty(key_type=_i64, value_type=_i64)


@njit(cache=True)
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
    bs = meta[BLOCK_SIZE]
    rc = check_allocate_jit(lens, meta[MAX_BLOCKS], bs, seq, num_tokens)
    if rc != OK:
        return rc
    need = (num_tokens + bs - 1) // bs
    if need > len(pool):
        return E_NO_BLOCKS
    table = _new_table()
    for j in range(need):
        table[j] = _take(refs, pool)
    tables[seq] = table
    lens[seq] = num_tokens
    return OK


@njit(cache=True)
def _needs_block(tables, lens, refs, seq, bs):
    n = lens[seq]
    return n % bs == 0 or refs[tables[seq][n // bs]] > 1


@njit(cache=True)
def _append(tables, lens, refs, pool, seq, bs):
    n = lens[seq]
    lens[seq] = n + 1
    table = tables[seq]
    j = n // bs
    if n % bs == 0:
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
    bs = meta[BLOCK_SIZE]
    rc = check_append_jit(lens, meta[MAX_BLOCKS], bs, seq)
    if rc != OK:
        return rc, -1, -1
    if len(pool) == 0 and _needs_block(tables, lens, refs, seq, bs):
        return E_NO_BLOCKS, -1, -1
    return _append(tables, lens, refs, pool, seq, bs)


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
    bs = meta[BLOCK_SIZE]
    n = lens[seq] - 1
    return tables[seq][n // bs] * bs + n % bs


@njit(cache=True)
def decode_step(tables, lens, refs, pool, meta, marks, seq_ids, cow_out, slot_out):
    bs = meta[BLOCK_SIZE]
    n = seq_ids.shape[0]
    if slot_out.shape[0] < n or cow_out.shape[0] < n:
        return E_BUFFER, n
    meta[STAMP] += 1
    stamp = meta[STAMP]
    need = 0
    for i in range(n):  # validate the whole step before changing anything
        seq = seq_ids[i]
        rc = check_append_jit(lens, meta[MAX_BLOCKS], bs, seq)
        if rc != OK:
            return rc, i
        if marks[seq] == stamp:
            return E_DUPLICATE, i
        marks[seq] = stamp
        need += _needs_block(tables, lens, refs, seq, bs)
    if need > len(pool):
        return E_NO_BLOCKS, need
    cows = 0
    for i in range(n):
        seq = seq_ids[i]
        cow, src, dst = _append(tables, lens, refs, pool, seq, bs)
        if cow:
            cow_out[cows, 0] = src
            cow_out[cows, 1] = dst
            cows += 1
        m = lens[seq] - 1
        slot_out[i] = tables[seq][m // bs] * bs + m % bs
    return cows, 0


@njit(cache=True)
def lookup(tables, lens, refs, pool, meta, marks, seq_ids, slot_out):
    bs = meta[BLOCK_SIZE]
    n = seq_ids.shape[0]
    if slot_out.shape[0] < n:
        return E_BUFFER, n
    for i in range(n):
        seq = seq_ids[i]
        rc = check_active_jit(lens, seq)
        if rc != OK:
            return rc, i
        m = lens[seq] - 1
        slot_out[i] = tables[seq][m // bs] * bs + m % bs
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
        meta = np.array([self.block_size, self.max_blocks_per_seq, 0], dtype=np.int64)
        marks = np.zeros(self.max_seqs, dtype=np.int64)
        self.state = (self._tables, self._lens, self._refs, self._pool, meta, marks)

    def num_free_blocks(self) -> int:
        return len(self._pool)

    def _table(self, seq_id: int) -> list[int]:
        table = self._tables[seq_id]
        return [table[j] for j in range(len(table))]

    def _ref(self, block_id: int) -> int:
        return self._refs.get(block_id, 0)
