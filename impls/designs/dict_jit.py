"""Compiled twin of design A (``"dict-jit"``): a Numba typed.Dict per sequence."""

from __future__ import annotations

import numpy as np
from numba import njit, typed, types

from impls.designs.dict_design import HashMapTables
from impls.designs.twins import TwinBlockManager, next_token, twin_kernels

_i64 = types.int64


@njit(cache=True, inline="always")
def _new_table(need=0):
    return typed.Dict.empty(key_type=_i64, value_type=_i64)


@njit(cache=True, inline="always")
def _take(refs, pool, meta=None):
    block = pool.pop()
    refs[block] = 1
    return block


@njit(cache=True, inline="always")
def _pool_size(pool, meta):
    return len(pool)


# Passes no ``meta`` on: an array kept live across an inlined helper's branches costs reference counting.
@njit(cache=True, inline="always")
def _append_token(tables, lens, refs, pool, meta, seq, sh):
    j, opens = next_token(lens, seq, sh)
    table = tables[seq]
    if opens:
        table[j] = _take(refs, pool)
        return 0, -1, -1
    src = table[j]
    if refs[src] == 1:
        return 0, -1, -1
    refs[src] -= 1
    dst = _take(refs, pool)
    table[j] = dst
    return 1, src, dst


@njit(cache=True, inline="always")
def _copy_table(tables, lens, refs, meta, parent):
    table = _new_table()
    for j, block in tables[parent].items():
        table[j] = block
        refs[block] += 1
    return table


@njit(cache=True, inline="always")
def _release_table(tables, lens, refs, pool, meta, seq):
    table = tables[seq]
    for j in range(len(table) - 1, -1, -1):
        block = table[j]
        if refs[block] == 1:
            del refs[block]
            pool.append(block)
        else:
            refs[block] -= 1
    table.clear()


@njit(cache=True)
def _build(num_blocks, max_seqs):
    tables = typed.List()
    for _ in range(max_seqs):
        tables.append(_new_table())
    refs = typed.Dict.empty(key_type=_i64, value_type=_i64)
    pool = typed.List()
    for block in range(num_blocks - 1, -1, -1):
        pool.append(np.int64(block))
    return tables, refs, pool


KERNELS = twin_kernels(__name__, new_table=_new_table, take=_take, pool_size=_pool_size, append_token=_append_token,
                       copy_table=_copy_table, release_table=_release_table)


class DictJitBlockManager(HashMapTables, TwinBlockManager):
    """Compiled twin of design A (``"dict-jit"``): typed.Dict per sequence."""

    kernels = KERNELS

    def _containers(self) -> tuple:
        tables, refs, pool = _build(self.num_blocks, self.max_seqs)
        return tables, refs, pool, np.array([self.block_shift, self.max_blocks_per_seq, 0], dtype=np.int64)

    def memory_bytes(self) -> int:
        return 8 * self.num_blocks + 16 * self.max_seqs + 8 * 3

    def num_free_blocks(self) -> int:
        return len(self._pool)

    def _table_nbytes(self, seq_id: int) -> None:
        return None
