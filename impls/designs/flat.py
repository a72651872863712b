"""Design C: a preallocated flat block table and a free-block stack, operated on by Numba kernels.

Design: docs/implementations.md#implsdesignsflatpy
"""

from __future__ import annotations

import numpy as np
from numba import njit

from impls.contract import (
    E_ACTIVE,
    E_BUFFER,
    E_COUNT,
    E_DUPLICATE,
    E_INACTIVE,
    E_NO_BLOCKS,
    E_SEQ_RANGE,
    E_TOKENS,
    E_TOO_LONG,
    OK,
    blocks_for,
)
from impls.core.compiled import CompiledBlockManager, Kernels
from impls.core.ids import table_dtype
from impls.core.pages import resident_zeros
from impls.core.validation import blocks_needed_jit, slot_of_jit

# Header slots at the start of ``ints``.
TOP, NUM_BLOCKS, BLOCK_SHIFT, STAMP = 0, 1, 2, 3
HEADER = 4
# Each row owns a record of ROW int32s after the header: its length, its mark and, as an int32 pair, NEXT: the
# slot its next token takes when that token needs no new block and no copy, else a value with its offset bits
# clear. One record, one base pointer: a decode step's common path reads and writes only it and slot_out.
ROW, LEN, MARK, NEXT = 4, 0, 1, 2
SAVED = 6  # int32s per row after the stack: a step's overwritten CoW pair (4) and slot (2), for a rollback
# A row's mark is ``stamp << 1 | shared``: the stamp of the last decode step that listed the row (duplicate
# detection) and a "last block may be shared" bit. A clear bit promises that the row's last block has ref
# count 1, so an append inside a block skips the ref-count read; fork sets it (sharing begins only there).
SHARED = 1
STAMP_LIMIT = 2**30 - 1  # stamp << 1 | 1 must fit the int32 marks

_u = np.uint64  # indices are cast to unsigned: Numba adds a wrap-around fix-up to every signed index
# The kernels are compiled without Numba's runtime: they cannot allocate, and they take their arrays without the
# locked reference-count increments and decrements Numba otherwise leaves in a function as large as decode_step.
kernel = njit(cache=True, _nrt=False)


def offsets(max_seqs: int, num_blocks: int) -> tuple[int, int, int, int, int]:
    """Where the row records, the ref counts, the free stack and the saved entries (CoW pairs, then slots) of
    ``cow_out`` and ``slot_out`` start in ``ints``, and its size."""
    refs = HEADER + ROW * max_seqs
    return HEADER, refs, refs + num_blocks, refs + 2 * num_blocks, refs + 2 * num_blocks + SAVED * max_seqs


# The kernels index ``ints`` by offset (a record's fields at HEADER + ROW * seq, ref counts and stack after
# the records) rather than slicing it into views: each view costs Numba a locked reference-count increment
# and decrement per call. Helpers that take arrays are inlined: a call to a compiled function that takes
# arrays keeps the caller's reference counting of its own arguments, which Numba otherwise prunes.
@kernel
def can_allocate(table, ints, n):
    if n < 0:
        return E_COUNT
    return 1 if ints[TOP] >= n else 0


# -- the pool, as the kernels below use it: what flat-pc makes different -------------------------------------
# allocate, append and free are written once (allocate_row, append_token, release_row) over these operations
# on the pool; flat-pc makes the same code again over its own (a stack of never-cached blocks, takes that may
# evict a cached block, freed cached blocks kept for reuse), which read its cache (``keys``, and ``ext``: its
# part of ``ints``); flat has none (``keys`` is None here).
@njit(cache=True, inline="always")
def _extension(table, ints):
    """Where a design's own part of ``ints`` starts, after flat's (flat has none)."""
    return 0


@njit(cache=True, inline="always")
def _free_count(ints, ext):
    """Blocks a take can hand out."""
    return ints[TOP]


@njit(cache=True, inline="always")
def _take(ints, keys, ext, refs, stack):
    """A fresh block with ref count 1 (the caller has checked that the pool holds one)."""
    top = ints[TOP] - 1
    ints[TOP] = top
    block = np.int64(ints[_u(stack + top)])
    ints[_u(refs + block)] = 1
    return block


@njit(cache=True, inline="always")
def _take_row(table, ints, keys, ext, refs, stack, seq, need):
    """Row ``seq``'s first ``need`` blocks, fresh (the caller has checked that the pool holds them); OK, or a
    code and no change."""
    top = ints[TOP]
    for j in range(need):
        top -= 1
        block = ints[_u(stack + top)]
        ints[_u(refs + block)] = 1
        table[_u(seq), _u(j)] = block
    ints[TOP] = top
    return OK


@njit(cache=True, inline="always")
def _pool_context(ints, ext):
    """What :func:`_give_back` needs, found once per call."""
    return 0


@njit(cache=True, inline="always")
def _give_back(ints, keys, ext, context, stack, top, block):
    """``block``, its ref count now 0, back to the pool; returns the stack's new top."""
    ints[_u(stack + top)] = block
    return top + 1


@njit(cache=True, inline="always")
def _short_by(ints, ext, need):
    """Where an allocation refused for want of ``need`` blocks says so (flat's wrapper knows the need)."""


# -- the table, as allocate and append use it: what flat-rows makes different -----------------------------
@njit(cache=True, inline="always")
def _shape(table, ints):
    """Rows (sequences) and columns (blocks per sequence) of the block table."""
    return table.shape[0], table.shape[1]


@njit(cache=True, inline="always")
def _regions(table, ints):
    """Where the ref counts and the free stack start in ``ints``."""
    refs = HEADER + ROW * table.shape[0]
    return refs, refs + ints[NUM_BLOCKS]


@njit(cache=True, inline="always")
def _cell(table, ints, rec, seq, j):
    """Where row ``seq``'s last block, its ``j``-th, sits in ``table``."""
    return _u(seq), _u(j)


@njit(cache=True, inline="always")
def _cell_to_write(table, ints, rec, seq, j, mark, boundary):
    """``(code, row, column)`` where row ``seq`` writes its ``j``-th block (a new one at a block ``boundary``,
    else a copy of a shared one): flat writes in place; a code means no room, and nothing changed."""
    return OK, _u(seq), _u(j)


@njit(cache=True, inline="always")
def _keep_next(table, ints, rec, seq, length):
    """Row ``seq``'s NEXT for ``length`` tokens, its last block its own."""
    sh = ints[BLOCK_SHIFT]
    off = length & ((1 << sh) - 1)
    store(ints, rec + NEXT, (np.int64(table[_u(seq), _u(length >> sh)]) << sh) | off if off else 0)


@njit(cache=True, inline="always")
def _appended(table, ints, rec, seq, n, mark):
    """Row ``seq`` holds ``n + 1`` tokens now, its last block its own (flat-rows' records have no NEXT)."""
    ints[_u(rec + LEN)] = n + 1
    ints[_u(rec + MARK)] = mark & ~SHARED
    _keep_next(table, ints, rec, seq, n + 1)


@njit(cache=True, inline="always")
def fits(rows, cols, sh, seq, num_tokens):
    """``(code, blocks)`` of a new sequence of ``num_tokens`` tokens in row ``seq``, for ``rows`` rows of ``cols``
    blocks: E_SEQ_RANGE, E_TOKENS or E_TOO_LONG in the contract's order, else OK and the blocks it needs."""
    if _u(seq) >= _u(rows):
        return E_SEQ_RANGE, 0
    if num_tokens < 1:
        return E_TOKENS, 0
    need = blocks_needed_jit(num_tokens, sh)
    if need > cols:
        return E_TOO_LONG, 0
    return OK, need


@njit(cache=True, inline="always")
def allocate_row(table, ints, keys, seq, num_tokens):
    ext = _extension(table, ints)
    refs, stack = _regions(table, ints)
    rows, cols = _shape(table, ints)
    rc, need = fits(rows, cols, ints[BLOCK_SHIFT], seq, num_tokens)
    if rc != OK:
        return rc
    rec = HEADER + ROW * seq
    if ints[_u(rec + LEN)] != 0:
        return E_ACTIVE
    if need > _free_count(ints, ext):
        _short_by(ints, ext, need)
        return E_NO_BLOCKS
    rc = _take_row(table, ints, keys, ext, refs, stack, seq, need)
    if rc != OK:
        return rc
    _appended(table, ints, rec, seq, num_tokens - 1, ints[_u(rec + MARK)])  # fresh blocks: not shared
    return OK


@njit(cache=True, inline="always")
def append_token(table, ints, keys, seq):
    ext = _extension(table, ints)
    refs, stack = _regions(table, ints)
    rows, cols = _shape(table, ints)
    sh = ints[BLOCK_SHIFT]
    if _u(seq) >= _u(rows):
        return E_SEQ_RANGE, -1, -1
    rec = HEADER + ROW * seq
    n = ints[_u(rec + LEN)]
    if n == 0:
        return E_INACTIVE, -1, -1
    j = n >> sh
    mark = ints[_u(rec + MARK)]
    if (n & ((1 << sh) - 1)) == 0:
        if j >= cols:
            return E_TOO_LONG, -1, -1
        if _free_count(ints, ext) == 0:
            return E_NO_BLOCKS, -1, -1
        rc, r, c = _cell_to_write(table, ints, rec, seq, j, mark, True)
        if rc != OK:
            return rc, -1, -1
        table[r, c] = _take(ints, keys, ext, refs, stack)
        _appended(table, ints, rec, seq, n, mark)
        return 0, -1, -1
    r, c = _cell(table, ints, rec, seq, j)
    src = np.int64(table[r, c])
    if (mark & SHARED) == 0 or ints[_u(refs + src)] == 1:
        _appended(table, ints, rec, seq, n, mark)
        return 0, -1, -1
    if _free_count(ints, ext) == 0:
        return E_NO_BLOCKS, -1, -1
    rc, r, c = _cell_to_write(table, ints, rec, seq, j, mark, False)
    if rc != OK:
        return rc, -1, -1
    dst = _take(ints, keys, ext, refs, stack)  # (with a cache: a partial block is never cached, src stays in use)
    ints[_u(refs + src)] -= 1
    table[r, c] = dst
    _appended(table, ints, rec, seq, n, mark)
    return 1, src, dst


@njit(cache=True, inline="always")
def release_row(table, ints, keys, seq):
    ext = _extension(table, ints)
    refs = HEADER + ROW * table.shape[0]
    stack = refs + ints[NUM_BLOCKS]
    context = _pool_context(ints, ext)
    if _u(seq) >= _u(table.shape[0]):
        return E_SEQ_RANGE
    rec = HEADER + ROW * seq
    n = ints[_u(rec + LEN)]
    if n == 0:
        return E_INACTIVE
    sh = ints[BLOCK_SHIFT]
    top = ints[TOP]
    for j in range(blocks_needed_jit(n, sh) - 1, -1, -1):  # the tail first (with a cache: evicted first)
        block = np.int64(table[_u(seq), _u(j)])
        r = ints[_u(refs + block)] - 1
        ints[_u(refs + block)] = r
        if r == 0:
            top = _give_back(ints, keys, ext, context, stack, top, block)
    ints[TOP] = top
    ints[_u(rec + LEN)] = 0
    store(ints, rec + NEXT, 0)  # an inactive row's NEXT is 0: allocations need not write it
    return OK


@kernel
def allocate(table, ints, seq, num_tokens):
    return allocate_row(table, ints, None, seq, num_tokens)


@kernel
def append(table, ints, seq):
    return append_token(table, ints, None, seq)


@kernel
def fork(table, ints, parent, child):
    refs = HEADER + ROW * table.shape[0]
    rows = _u(table.shape[0])
    if _u(parent) >= rows or _u(child) >= rows:
        return E_SEQ_RANGE
    p, c = HEADER + ROW * parent, HEADER + ROW * child
    n = ints[_u(p + LEN)]
    if n == 0:
        return E_INACTIVE
    if ints[_u(c + LEN)] != 0:
        return E_ACTIVE
    sh = ints[BLOCK_SHIFT]
    for j in range(blocks_needed_jit(n, sh)):
        block = table[_u(parent), _u(j)]
        table[_u(child), _u(j)] = block
        ints[_u(refs + block)] += 1
    ints[_u(c + LEN)] = n
    ints[_u(p + MARK)] |= SHARED  # sharing begins: both rows' last block now has ref count >= 2
    ints[_u(c + MARK)] |= SHARED
    store(ints, p + NEXT, 0)  # and neither row's next token may go into it unchecked
    return OK


@kernel
def free(table, ints, seq):
    return release_row(table, ints, None, seq)


@kernel
def last_slot(table, ints, seq):
    if _u(seq) >= _u(table.shape[0]):
        return E_SEQ_RANGE
    n = ints[_u(HEADER + ROW * seq + LEN)] - 1
    if n < 0:
        return E_INACTIVE
    sh = ints[BLOCK_SHIFT]
    return slot_of_jit(np.int64(table[_u(seq), _u(n >> sh)]), n, sh)


@njit(cache=True, inline="always")
def _next_stamp(ints, rows):
    """A fresh stamp (``stamp << 1``) for duplicate detection; marks are reset, keeping their shared bits,
    only when it wraps."""
    if ints[STAMP] >= STAMP_LIMIT:
        for r in range(rows):
            ints[_u(HEADER + ROW * r + MARK)] &= SHARED
        ints[STAMP] = 0
    ints[STAMP] += 1
    return np.int64(ints[STAMP]) << 1


@njit(cache=True, inline="always")
def reserve(table, ints, seq_ids):
    """A tight pool's step keeps the validate-then-reserve order: every id valid for an append and listed
    once (as :func:`impls.core.validation.check_batch_jit`), then the exact need against the pool: a block per row
    at a boundary or whose last block is shared. Returns ``(code, detail)``; changes only marks."""
    rows, cols, sh = _u(table.shape[0]), table.shape[1], ints[BLOCK_SHIFT]
    refs = HEADER + ROW * table.shape[0]
    stamp2 = _next_stamp(ints, table.shape[0])
    return reserve_rows(table, ints, seq_ids, rows, cols, sh, refs, stamp2)


@njit(cache=True, inline="always")
def reserve_rows(table, ints, seq_ids, rows, cols, sh, refs, stamp2):
    """:func:`reserve` for ``rows`` sequences of ``cols`` blocks, ref counts at ``refs``, a fresh ``stamp2``."""
    for i in range(seq_ids.shape[0]):
        seq = seq_ids[_u(i)]
        if _u(seq) >= rows:
            return E_SEQ_RANGE, i
        rec = HEADER + ROW * seq
        n = ints[_u(rec + LEN)]
        if n == 0:
            return E_INACTIVE, i
        if (n & ((1 << sh) - 1)) == 0 and (n >> sh) >= cols:
            return E_TOO_LONG, i
        mark = ints[_u(rec + MARK)]
        if (mark | SHARED) == (stamp2 | SHARED):
            return E_DUPLICATE, i
        ints[_u(rec + MARK)] = stamp2 | (mark & SHARED)
    need = 0
    for i in range(seq_ids.shape[0]):
        seq = seq_ids[_u(i)]
        rec = HEADER + ROW * seq
        n = ints[_u(rec + LEN)]
        if (n & ((1 << sh) - 1)) == 0:
            need += 1
        elif ints[_u(rec + MARK)] & SHARED:
            r, c = _cell(table, ints, rec, seq, n >> sh)
            need += ints[_u(refs + table[r, c])] > 1
    if need > ints[TOP]:
        return E_NO_BLOCKS, need
    return OK, 0


@njit(cache=True, inline="always")
def load(ints, at):
    """The int64 kept as an int32 pair at ``ints[at : at + 2]``."""
    return (np.int64(ints[_u(at + 1)]) << 32) | (np.int64(ints[_u(at)]) & 0xFFFFFFFF)


@njit(cache=True, inline="always")
def store(ints, at, value):
    """Keep the int64 ``value`` as an int32 pair at ``ints[at : at + 2]``."""
    ints[_u(at)] = value
    ints[_u(at + 1)] = value >> 32


@njit(cache=True, inline="always")
def _fail(table, ints, seq_ids, cow_out, slot_out, count, cows, rc):
    """Roll back the first ``count`` appends of a failed one-pass step, newest first; returns ``(rc, count)``."""
    sh = ints[BLOCK_SHIFT]
    refs = HEADER + ROW * table.shape[0]
    saved = refs + 2 * ints[NUM_BLOCKS]
    slots = saved + 4 * table.shape[0]
    top, c = ints[TOP], cows
    for k in range(count - 1, -1, -1):
        seq = seq_ids[_u(k)]
        rec = HEADER + ROW * seq
        n = ints[_u(rec + LEN)] - 1
        ints[_u(rec + LEN)] = n
        ints[_u(rec + MARK)] |= SHARED
        store(ints, rec + NEXT, 0)
        j = _u(n >> sh)
        block = np.int64(table[_u(seq), j])
        if (n & ((1 << sh) - 1)) == 0:
            ints[_u(refs + block)] = 0
            top += 1
        elif c > 0 and block == cow_out[_u(c - 1), 1]:
            c -= 1
            src = cow_out[_u(c), 0]
            table[_u(seq), j] = src
            ints[_u(refs + src)] += 1
            ints[_u(refs + block)] = 0
            top += 1
        slot_out[_u(k)] = load(ints, slots + 2 * k)
    ints[TOP] = top
    for c in range(cows):
        cow_out[_u(c), 0] = load(ints, saved + 4 * c)
        cow_out[_u(c), 1] = load(ints, saved + 4 * c + 2)
    return rc, count


@njit(cache=True, inline="always")
def _copy_on_write(table, ints, seq, j, src, cow_out, cows):
    """Give row ``seq`` a private copy of its shared block ``src`` at position ``j``; record the pair (keeping
    the buffer's old entry for a rollback). Returns the new block."""
    refs = HEADER + ROW * table.shape[0]
    stack = refs + ints[NUM_BLOCKS]
    top = ints[TOP] - 1
    ints[TOP] = top
    dst = np.int64(ints[_u(stack + top)])
    ints[_u(refs + dst)] = 1
    ints[_u(refs + src)] -= 1
    table[_u(seq), _u(j)] = dst
    at = stack + ints[NUM_BLOCKS] + 4 * cows
    store(ints, at, cow_out[_u(cows), 0])
    store(ints, at + 2, cow_out[_u(cows), 1])
    cow_out[_u(cows), 0] = src
    cow_out[_u(cows), 1] = dst
    return dst


@njit(cache=True, inline="always")
def _new_block(table, ints, seq, j):
    """A block from the stack, ref count 1, as row ``seq``'s ``j``-th (the caller knows the stack holds one)."""
    refs = HEADER + ROW * table.shape[0]
    top = ints[TOP] - 1
    ints[TOP] = top
    block = np.int64(ints[_u(refs + ints[NUM_BLOCKS] + top)])
    ints[_u(refs + block)] = 1
    table[_u(seq), _u(j)] = block
    return block


# One function on purpose: this loop is the batched step (validation, append and slot write fused), and a call
# or a second pass per sequence is exactly what it exists to remove. A row whose NEXT holds (the common case:
# 15 of 16 tokens with 16-token blocks) costs its checks, its record and its slot; the others take the
# branch that reads the table, the stack and the ref counts.
@kernel
def decode_step(table, ints, seq_ids, cow_out, slot_out):  # noqa: C901
    n = seq_ids.shape[0]
    if slot_out.shape[0] < n or cow_out.shape[0] < n:
        return E_BUFFER, n
    if n > ints[TOP]:  # a tight pool: validate and count the exact need first, change nothing on failure
        rc, detail = reserve(table, ints, seq_ids)
        if rc != OK:
            return rc, detail
    # One pass: the pool covers the step now, so only a bad id can stop it, and _fail undoes what was done.
    stamp2 = np.int32(_next_stamp(ints, table.shape[0]))  # an int32: compared with the marks in place
    rows, cols = _u(table.shape[0]), table.shape[1]
    sh = ints[BLOCK_SHIFT]
    mask = (1 << sh) - 1
    refs = HEADER + ROW * table.shape[0]
    slots = refs + 2 * ints[NUM_BLOCKS] + 4 * table.shape[0]
    cows, i = 0, 0
    while True:
        while i < n:  # the common path: a row whose NEXT holds
            seq = seq_ids[_u(i)]
            if _u(seq) >= rows:
                break
            rec = HEADER + ROW * seq
            if ints[_u(rec + MARK)] == stamp2:  # appended earlier in this step (which leaves exactly stamp2)
                break
            slot = load(ints, rec + NEXT)
            if (slot & mask) == 0:
                break
            ints[_u(rec + MARK)] = stamp2
            ints[_u(rec + LEN)] += 1
            store(ints, rec + NEXT, slot + 1)
            store(ints, slots + 2 * i, slot_out[_u(i)])  # a failed step leaves the caller's buffers as they were
            slot_out[_u(i)] = slot
            i += 1
        if i == n:
            return cows, 0
        # The row that left the common path: a bad id, a boundary (empty and full rows too: the length checks live
        # only here), a shared last block, or a record another operation changed.
        seq = seq_ids[_u(i)]
        if _u(seq) >= rows:
            return _fail(table, ints, seq_ids, cow_out, slot_out, i, cows, E_SEQ_RANGE)
        rec = HEADER + ROW * seq
        if ints[_u(rec + MARK)] == stamp2:
            return _fail(table, ints, seq_ids, cow_out, slot_out, i, cows, E_DUPLICATE)
        length = ints[_u(rec + LEN)]
        off, j = length & mask, length >> sh
        if off == 0:
            if length == 0:
                return _fail(table, ints, seq_ids, cow_out, slot_out, i, cows, E_INACTIVE)
            if j >= cols:
                return _fail(table, ints, seq_ids, cow_out, slot_out, i, cows, E_TOO_LONG)
            block = _new_block(table, ints, seq, j)
        else:
            block = np.int64(table[_u(seq), _u(j)])
            if ints[_u(rec + MARK)] & SHARED and ints[_u(refs + block)] != 1:
                block = _copy_on_write(table, ints, seq, j, block, cow_out, cows)
                cows += 1
        slot = (block << sh) | off
        ints[_u(rec + MARK)] = stamp2  # the row's last block is its own now
        ints[_u(rec + LEN)] = length + 1
        store(ints, rec + NEXT, slot + 1)
        store(ints, slots + 2 * i, slot_out[_u(i)])
        slot_out[_u(i)] = slot
        i += 1


@kernel
def lookup(table, ints, seq_ids, slot_out):
    rows, sh = _u(table.shape[0]), ints[BLOCK_SHIFT]
    n = seq_ids.shape[0]
    if slot_out.shape[0] < n:
        return E_BUFFER, n
    for i in range(n):
        seq = seq_ids[_u(i)]
        if _u(seq) >= rows:
            return E_SEQ_RANGE, i
        m = ints[_u(HEADER + ROW * seq + LEN)] - 1
        if m < 0:
            return E_INACTIVE, i
        slot_out[_u(i)] = slot_of_jit(np.int64(table[_u(seq), _u(m >> sh)]), m, sh)
    return OK, 0


def check_table_buffer(table: object, max_seqs: int, max_blocks_per_seq: int, num_blocks: int) -> None:
    """Raise ``ValueError`` unless ``table`` can serve as the flat design's block table."""
    if not isinstance(table, np.ndarray):
        raise ValueError(f"table must be a numpy.ndarray, got {type(table).__name__}")
    shape, dtype = (max_seqs, max_blocks_per_seq), table_dtype(num_blocks)
    if table.shape != shape:
        raise ValueError(f"table has shape {table.shape}, expected (max_seqs, max_blocks_per_seq) = {shape}")
    if table.dtype != dtype:
        raise ValueError(f"table has dtype {table.dtype}, expected {dtype} for num_blocks={num_blocks}")
    if not (table.flags.c_contiguous and table.flags.aligned):
        raise ValueError("table must be C-contiguous and aligned")
    if not table.flags.writeable:
        raise ValueError("table must be writeable")


KERNELS = Kernels(can_allocate, allocate, append, fork, free, decode_step, lookup, last_slot)


class FlatBlockManager(CompiledBlockManager):
    """Design C (``"flat"``): flat uint16 table + preallocated free stack, Numba kernels."""

    kernels = KERNELS

    def __init__(self, num_blocks: int, block_size: int = 16, max_seqs: int = 256,
                 max_blocks_per_seq: int = 256, *, table: np.ndarray | None = None) -> None:
        """``table``, if given (e.g. a pinned torch tensor's view, rule 3), becomes the block table, zeroed."""
        self._own_table = table is None
        super().__init__(num_blocks, block_size, max_seqs, max_blocks_per_seq)
        s, n = self.max_seqs, self.num_blocks
        if table is None:
            self.table = resident_zeros((s, self.max_blocks_per_seq), table_dtype(n))
        else:
            check_table_buffer(table, s, self.max_blocks_per_seq, n)
            table[...] = 0  # the same starting state as a fresh table
            self.table = table
        records, refs, stack, _, _ = offsets(s, n)
        self.ints = resident_zeros(self._ints_size(), np.int32)
        self.ints[TOP], self.ints[NUM_BLOCKS], self.ints[BLOCK_SHIFT] = n, n, self.block_shift
        self._lens, self._refs = self.ints[records + LEN : refs : ROW], self.ints[refs:stack]
        # the top of the stack hands out 0, 1, 2, ...
        self.ints[stack : stack + n] = np.arange(n - 1, -1, -1, dtype=np.int32)
        self.state = (self.table, self.ints)

    def _ints_size(self) -> int:
        return offsets(self.max_seqs, self.num_blocks)[-1]

    def memory_bytes(self) -> int:
        """Per block 12 B; per row the table's ids (unless the table is given) and 40 B."""
        n, s = self.num_blocks, self.max_seqs
        table = s * self.max_blocks_per_seq * table_dtype(n).itemsize if self._own_table else 0
        return table + 4 * offsets(s, n)[-1] + 4 * n

    def num_free_blocks(self) -> int:
        return int(self.ints[TOP])

    def _table(self, seq_id: int) -> list[int]:
        return self.table[seq_id, : blocks_for(int(self._lens[seq_id]), self.block_size)].tolist()

    def _ref(self, block_id: int) -> int:
        return int(self._refs[block_id])

    def _table_nbytes(self, seq_id: int) -> int:
        # One preallocated row of the flat table, whatever the sequence's length.
        return self.table.itemsize * self.max_blocks_per_seq

    # -- introspection (tests and checks; not on any hot path) -----------------------------------------------
    def free_stack(self) -> list[int]:
        """The free-block stack's live entries, bottom first (the next block handed out is the last)."""
        _, _, stack, _, _ = offsets(self.max_seqs, self.num_blocks)
        return self.ints[stack : stack + int(self.ints[TOP])].tolist()

    def held_blocks(self) -> dict[int, int]:
        """Block id -> how many live rows hold it (what each ref count must be)."""
        held: dict[int, int] = {}
        for seq in np.flatnonzero(self._lens).tolist():
            for block in self._table(seq):
                held[block] = held.get(block, 0) + 1
        return held

    def check_invariants(self) -> None:
        """``AssertionError`` naming the first broken invariant: every ref count is the number of live rows that
        hold the block; the free stack holds each unheld block once and nothing else; a row whose partial last
        block is shared carries the shared bit (a full last block is never written again)."""
        held = self.held_blocks()
        refs = self._refs.tolist()
        for block, count in enumerate(refs):
            if count != held.get(block, 0):
                raise AssertionError(f"block {block}: ref count {count}, held by {held.get(block, 0)} row(s)")
        self._check_free(held)
        records = HEADER + ROW * np.flatnonzero(self._lens)
        for seq, rec in zip(np.flatnonzero(self._lens).tolist(), records.tolist(), strict=True):
            last = self._table(seq)[-1]
            partial = self._lens[seq] % self.block_size != 0
            if partial and refs[last] > 1 and not self.ints[rec + MARK] & SHARED:
                raise AssertionError(f"row {seq}: its last block {last} is shared and its mark says it is not")
        self._check_next(refs)

    def _check_next(self, refs: list[int]) -> None:
        """A row's NEXT with offset bits set is the slot of its next token in a last block it holds alone; an
        inactive row's NEXT is 0."""
        nexts = self.ints[HEADER + NEXT : HEADER + ROW * self.max_seqs : ROW].astype(np.int64) & 0xFFFFFFFF
        nexts |= self.ints[HEADER + NEXT + 1 : HEADER + ROW * self.max_seqs : ROW].astype(np.int64) << 32
        for seq, (length, nxt) in enumerate(zip(self._lens.tolist(), nexts.tolist(), strict=True)):
            if length == 0 and nxt != 0:
                raise AssertionError(f"row {seq}: inactive, and its NEXT is {nxt}, not 0")
            if length and nxt % self.block_size:
                block = self._table(seq)[-1]
                if nxt != block * self.block_size + length % self.block_size or refs[block] != 1:
                    raise AssertionError(f"row {seq}: NEXT {nxt} is not the next slot of a block it holds alone")

    def _check_free(self, held: dict[int, int]) -> None:
        """The free stack is exactly the blocks no row holds (a design with a cache narrows this)."""
        stack = self.free_stack()
        if len(set(stack)) != len(stack) or set(stack) != set(range(self.num_blocks)) - set(held):
            raise AssertionError("the free stack is not exactly the blocks no row holds")
