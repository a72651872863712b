"""What the compiled twins of designs A and B share: their state, their common kernels, the base class."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from numba import njit

from impls.contract import E_BUFFER, E_COUNT, E_NO_BLOCKS, OK
from impls.core.compiled import CompiledBlockManager, Kernels
from impls.core.jit import specialise
from impls.core.validation import (
    blocks_needed_jit,
    check_active_jit,
    check_allocate_jit,
    check_append_jit,
    check_batch_jit,
    check_fork_jit,
    slot_of_jit,
)

BLOCK_SHIFT, MAX_BLOCKS, STAMP = 0, 1, 2

_new_table = _take = _pool_size = _append_token = _copy_table = _release_table = None


@njit(cache=True, inline="always")
def next_token(lens, seq, sh):
    """Count one more token in row ``seq``: ``(index of its block, whether it opens that block)``."""
    n = lens[seq]
    lens[seq] = n + 1
    return n >> sh, (n & ((1 << sh) - 1)) == 0


def can_allocate(tables, lens, refs, pool, meta, marks, n):
    if n < 0:
        return E_COUNT
    return 1 if _pool_size(pool, meta) >= n else 0


def allocate(tables, lens, refs, pool, meta, marks, seq, num_tokens):
    sh = meta[BLOCK_SHIFT]
    rc = check_allocate_jit(lens, meta[MAX_BLOCKS], sh, seq, num_tokens)
    if rc != OK:
        return rc
    need = blocks_needed_jit(num_tokens, sh)
    if need > _pool_size(pool, meta):
        return E_NO_BLOCKS
    table = _new_table(need)
    for j in range(need):
        table[j] = _take(refs, pool, meta)
    tables[seq] = table
    lens[seq] = num_tokens
    return OK


def _needs_block(tables, lens, refs, seq, sh):
    n = lens[seq]
    if (n & ((1 << sh) - 1)) == 0:
        return True
    return refs[tables[seq][n >> sh]] > 1  # not `return a or b`: Numba lowers that form far slower


def append(tables, lens, refs, pool, meta, marks, seq):
    sh = meta[BLOCK_SHIFT]
    rc = check_append_jit(lens, meta[MAX_BLOCKS], sh, seq)
    if rc != OK:
        return rc, -1, -1
    if _pool_size(pool, meta) == 0 and _needs_block(tables, lens, refs, seq, sh):
        return E_NO_BLOCKS, -1, -1
    return _append_token(tables, lens, refs, pool, meta, seq, sh)


def fork(tables, lens, refs, pool, meta, marks, parent, child):
    rc = check_fork_jit(lens, parent, child)
    if rc != OK:
        return rc
    tables[child] = _copy_table(tables, lens, refs, meta, parent)
    lens[child] = lens[parent]
    return OK


def free(tables, lens, refs, pool, meta, marks, seq):
    rc = check_active_jit(lens, seq)
    if rc != OK:
        return rc
    _release_table(tables, lens, refs, pool, meta, seq)
    lens[seq] = 0
    return OK


def last_slot(tables, lens, refs, pool, meta, marks, seq):
    rc = check_active_jit(lens, seq)
    if rc != OK:
        return rc
    sh = meta[BLOCK_SHIFT]
    n = lens[seq] - 1
    return slot_of_jit(tables[seq][n >> sh], n, sh)


def decode_step(tables, lens, refs, pool, meta, marks, seq_ids, cow_out, slot_out):
    sh = meta[BLOCK_SHIFT]
    n = seq_ids.shape[0]
    if slot_out.shape[0] < n or cow_out.shape[0] < n:
        return E_BUFFER, n
    meta[STAMP] += 1
    stamp = meta[STAMP]
    rc, i = check_batch_jit(lens, marks, stamp, meta[MAX_BLOCKS], sh, seq_ids)
    if rc != OK:
        return rc, i
    if n > _pool_size(pool, meta):
        need = 0
        for i in range(n):
            need += _needs_block(tables, lens, refs, seq_ids[i], sh)
        if need > _pool_size(pool, meta):
            return E_NO_BLOCKS, need
    cows = 0
    for i in range(n):
        seq = seq_ids[i]
        cow, src, dst = _append_token(tables, lens, refs, pool, meta, seq, sh)
        if cow:
            cow_out[cows, 0] = src
            cow_out[cows, 1] = dst
            cows += 1
        m = lens[seq] - 1
        slot_out[i] = slot_of_jit(tables[seq][m >> sh], m, sh)
    return cows, 0


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


def twin_kernels(module: str, **primitives: Callable) -> Kernels:
    """A twin's kernels, made for ``module`` over its inlined ``primitives``."""
    helpers = {"_" + name: fn for name, fn in primitives.items()}

    def made(fn: Callable) -> Callable:
        made_fn = specialise(fn, module, **helpers)
        made_fn.__module__ = module
        return made_fn

    helpers["_needs_block"] = njit(cache=True, inline="always")(made(_needs_block))
    kernel = njit(cache=True)
    return Kernels(*(kernel(made(fn)) for fn in (can_allocate, allocate, append, fork, free, decode_step, lookup,
                                                 last_slot)))


class TwinBlockManager(CompiledBlockManager):
    """Base class of the compiled twins: builds the state their kernels take."""

    def __init__(self, num_blocks: int, block_size: int = 16, max_seqs: int = 256,
                 max_blocks_per_seq: int = 256) -> None:
        super().__init__(num_blocks, block_size, max_seqs, max_blocks_per_seq)
        self._tables, self._refs, self._pool, self._meta = self._containers()
        self._lens = np.zeros(self.max_seqs, dtype=np.int64)
        marks = np.zeros(self.max_seqs, dtype=np.int64)
        self.state = (self._tables, self._lens, self._refs, self._pool, self._meta, marks)

    def _containers(self) -> tuple:  # pragma: no cover - every twin overrides it
        raise NotImplementedError
