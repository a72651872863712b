"""``flat-rows``: design C's flat table in two levels, with memory that follows the pool, not the longest sequence.

Design, and why the row pool covers any sequence of calls: docs/implementations.md#implsdesignsflat_rowspy
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numba import njit

from impls.contract import (
    E_ACTIVE,
    E_BUFFER,
    E_DUPLICATE,
    E_INACTIVE,
    E_SEQ_RANGE,
    E_TOO_LONG,
    OK,
)
from impls.core.compiled import CompiledBlockManager, Kernels
from impls.core.ids import ROW_BYTES, table_dtype
from impls.core.jit import specialise
from impls.core.pages import resident_zeros
from impls.core.validation import slot_of_jit
from impls.designs import flat
from impls.designs.flat import SHARED, STAMP_LIMIT, can_allocate, load

# Header slots at the start of ``ints``: counters, sizes, and where each region starts (int32 offsets: the
# constructor refuses a layout whose ints would not fit them). The first four are C's (flat's can_allocate
# reads TOP).
TOP, NUM_BLOCKS, BLOCK_SHIFT, STAMP, RTOP, NUM_ROWS, ROW_SHIFT, MAX_SEQS, MAX_BLOCKS, DIR_LEN, RTOP0 = range(11)
DIRS, REFS, STACK, RREFS, RSTACK, COWS = range(11, 17)
HEADER = 32  # 128 bytes: the records start on a cache-line boundary (``ints`` starts on one)
# Each sequence's record: length, mark (C's: stamp << 1 | shared), the int64 slot a failed step restores (an
# int32 pair), the row holding the last block, and the row a failed step's row copy restores.
REC, LEN, MARK, SAVED, LAST, SAVED_ROW = 8, 0, 1, 2, 4, 5
# Returned when the row pool is empty: unreachable (the pool holds the worst case, see the module docstring);
# checked so that a bug can never write outside the rows.
E_ROWS = -64
INT32_MAX = 2**31 - 1


def cache_aligned_zeros(shape: tuple[int, ...] | int, dtype: np.dtype | type) -> np.ndarray:
    """Zeros starting on a 64-byte boundary (NumPy aligns to 16 at most; its allocator takes no alignment):
    the view of an over-allocated byte buffer, ``ROW_BYTES`` more than the array's bytes."""
    count = int(np.prod(shape))
    nbytes = count * np.dtype(dtype).itemsize
    buffer = resident_zeros(nbytes + ROW_BYTES, np.uint8)
    start = -buffer.ctypes.data % ROW_BYTES
    return buffer[start : start + nbytes].view(dtype).reshape(shape)

_u = np.uint64  # unsigned indices: Numba adds a wrap-around fix-up to every signed index


@dataclass(frozen=True)
class Layout:
    """Sizes and offsets of one configuration's arrays."""

    ids_per_row: int
    num_rows: int
    dir_len: int
    dirs: int
    refs: int
    stack: int
    rrefs: int
    rstack: int
    cows: int
    size: int  # int32s in ``ints``


def row_count(num_blocks: int, max_seqs: int, max_blocks_per_seq: int, ids_per_row: int) -> int:
    """Rows the pool needs for any sequence of calls: ``num_blocks // ids_per_row + 2 * max_seqs`` (the
    worst case of the trie argument in the module docstring), or every directory full if that is fewer."""
    return min(max_seqs * -(-max_blocks_per_seq // ids_per_row), num_blocks // ids_per_row + 2 * max_seqs)


def layout(num_blocks: int, max_seqs: int, max_blocks_per_seq: int) -> Layout:
    """The arrays of a configuration (their sizes are what :meth:`FlatRowsBlockManager.memory_bytes` states)."""
    ids = ROW_BYTES // table_dtype(num_blocks).itemsize
    num_rows = row_count(num_blocks, max_seqs, max_blocks_per_seq, ids)
    dir_len = -(-max_blocks_per_seq // ids)
    dirs = HEADER + REC * max_seqs
    refs = dirs + max_seqs * dir_len
    stack = refs + num_blocks
    rrefs = stack + num_blocks
    rstack = rrefs + num_rows
    cows = rstack + num_rows
    return Layout(ids, num_rows, dir_len, dirs, refs, stack, rrefs, rstack, cows, cows + 4 * max_seqs)


# -- row helpers (inlined: a call taking arrays keeps its caller's reference counting of them) ----------------
@njit(cache=True, inline="always")
def _pop_row(ints):
    """A free row, ref count 1 (the caller knows the stack is not empty)."""
    rtop = ints[RTOP] - 1
    ints[RTOP] = rtop
    row = np.int64(ints[_u(ints[RSTACK] + rtop)])
    ints[_u(ints[RREFS] + row)] = 1
    return row


@njit(cache=True, inline="always")
def _copy_row(rows, ints, rec, seq, row, k, used):
    """Give ``seq`` a private copy of its shared last row ``row``; the record keeps the original for a rollback."""
    new = _pop_row(ints)
    for c in range(used):
        rows[_u(new), _u(c)] = rows[_u(row), _u(c)]
    ints[_u(ints[RREFS] + row)] -= 1
    ints[_u(ints[DIRS] + seq * np.int64(ints[DIR_LEN]) + k)] = new
    ints[_u(rec + LAST)] = new
    ints[_u(rec + SAVED_ROW)] = row
    return new


# -- flat's allocate and append, made over the rows (see flat's note on the table) ---------------------------
@njit(cache=True, inline="always")
def _shape(rows, ints):
    """Sequences and blocks per sequence (flat's table shape)."""
    return ints[MAX_SEQS], ints[MAX_BLOCKS]


@njit(cache=True, inline="always")
def _regions(rows, ints):
    """Where the block ref counts and the free-block stack start in ``ints``."""
    return np.int64(ints[REFS]), np.int64(ints[STACK])


@njit(cache=True, inline="always")
def _cell(rows, ints, rec, seq, j):
    """The sequence's last block, its ``j``-th: in the row its record keeps."""
    return _u(ints[_u(rec + LAST)]), _u(j & ((1 << ints[ROW_SHIFT]) - 1))


@njit(cache=True, inline="always")
def _cell_to_write(rows, ints, rec, seq, j, mark, boundary):
    """Where the sequence writes its ``j``-th block: a fresh row when the block opens one, a private copy of
    its last row when that is shared, else the last row; ``E_ROWS`` (nothing changed) if the row pool is empty."""
    rs = ints[ROW_SHIFT]
    col = np.int64(j) & ((1 << rs) - 1)
    row = np.int64(ints[_u(rec + LAST)])
    fresh = boundary and col == 0
    if not fresh and ((mark & SHARED) == 0 or ints[_u(ints[RREFS] + row)] == 1):
        return OK, _u(row), _u(col)
    if ints[RTOP] == 0:
        return E_ROWS, _u(0), _u(0)
    if fresh:
        row = _pop_row(ints)
        ints[_u(ints[DIRS] + seq * np.int64(ints[DIR_LEN]) + (j >> rs))] = row
        ints[_u(rec + LAST)] = row
    else:
        row = _copy_row(rows, ints, rec, seq, row, j >> rs, col if boundary else col + 1)
    return OK, _u(row), _u(col)


@njit(cache=True, inline="always")
def _take_row(rows, ints, keys, ext, refs, stack, seq, need):
    """The sequence's first ``need`` blocks, fresh, in fresh rows; ``E_ROWS`` (nothing changed) if the row
    pool is short."""
    rs = ints[ROW_SHIFT]
    if ((need + (1 << rs) - 1) >> rs) > ints[RTOP]:
        return E_ROWS
    at = np.int64(ints[DIRS]) + seq * np.int64(ints[DIR_LEN])
    mask = (1 << rs) - 1
    row = np.int64(0)
    top = ints[TOP]
    for j in range(need):
        top -= 1
        block = ints[_u(stack + top)]
        ints[_u(refs + block)] = 1
        if (j & mask) == 0:
            row = _pop_row(ints)
            ints[_u(at + (j >> rs))] = row
        rows[_u(row), _u(j & mask)] = block
    ints[TOP] = top
    ints[_u(HEADER + REC * seq + LAST)] = row
    return OK


@njit(cache=True, inline="always")
def _appended(rows, ints, rec, seq, n, mark):
    """The sequence holds ``n + 1`` tokens now, its last block its own (flat's, without flat's NEXT)."""
    ints[_u(rec + LEN)] = n + 1
    ints[_u(rec + MARK)] = mark & ~SHARED


_TABLE = {"HEADER": HEADER, "ROW": REC, "_shape": _shape, "_regions": _regions, "_cell": _cell,
          "_cell_to_write": _cell_to_write, "_take_row": _take_row, "_appended": _appended}
_allocate_row = njit(inline="always")(specialise(flat.allocate_row.py_func, "flat_rows", **_TABLE))
_append_token = njit(inline="always")(specialise(flat.append_token.py_func, "flat_rows", **_TABLE))


@njit(cache=True)
def allocate(rows, ints, seq, num_tokens):
    return _allocate_row(rows, ints, None, seq, num_tokens)


@njit(cache=True)
def append(rows, ints, seq):
    return _append_token(rows, ints, None, seq)


@njit(cache=True)
def fork(rows, ints, parent, child):
    nseq = _u(ints[MAX_SEQS])
    if _u(parent) >= nseq or _u(child) >= nseq:
        return E_SEQ_RANGE
    p, c = HEADER + REC * parent, HEADER + REC * child
    n = ints[_u(p + LEN)]
    if n == 0:
        return E_INACTIVE
    if ints[_u(c + LEN)] != 0:
        return E_ACTIVE
    sh, rs = ints[BLOCK_SHIFT], ints[ROW_SHIFT]
    refs, rrefs, dlen = np.int64(ints[REFS]), np.int64(ints[RREFS]), np.int64(ints[DIR_LEN])
    pdir, cdir = np.int64(ints[DIRS]) + parent * dlen, np.int64(ints[DIRS]) + child * dlen
    blocks = (n + (1 << sh) - 1) >> sh
    per_row = 1 << rs
    for k in range((blocks + per_row - 1) >> rs):
        row = np.int64(ints[_u(pdir + k)])
        ints[_u(cdir + k)] = row
        ints[_u(rrefs + row)] += 1
        for col in range(min(per_row, blocks - (k << rs))):
            ints[_u(refs + rows[_u(row), _u(col)])] += 1
    ints[_u(c + LEN)] = n
    ints[_u(c + LAST)] = ints[_u(p + LAST)]
    ints[_u(p + MARK)] |= SHARED  # sharing begins: both rows' last block (and last row) now have ref count >= 2
    ints[_u(c + MARK)] |= SHARED
    return OK


@njit(cache=True)
def free(rows, ints, seq):
    if _u(seq) >= _u(ints[MAX_SEQS]):
        return E_SEQ_RANGE
    rec = HEADER + REC * seq
    n = ints[_u(rec + LEN)]
    if n == 0:
        return E_INACTIVE
    sh, rs = ints[BLOCK_SHIFT], ints[ROW_SHIFT]
    refs, stack = np.int64(ints[REFS]), np.int64(ints[STACK])
    rrefs, rstack = np.int64(ints[RREFS]), np.int64(ints[RSTACK])
    at = np.int64(ints[DIRS]) + seq * np.int64(ints[DIR_LEN])
    mask = (1 << rs) - 1
    blocks = (n + (1 << sh) - 1) >> sh
    top, rtop = ints[TOP], ints[RTOP]
    for k in range(((blocks + mask) >> rs) - 1, -1, -1):  # rows and their blocks tail first, as C frees
        row = np.int64(ints[_u(at + k)])
        for col in range(min(mask, blocks - 1 - (k << rs)), -1, -1):
            block = rows[_u(row), _u(col)]
            r = ints[_u(refs + block)] - 1
            ints[_u(refs + block)] = r
            if r == 0:
                ints[_u(stack + top)] = block
                top += 1
        r = ints[_u(rrefs + row)] - 1
        ints[_u(rrefs + row)] = r
        if r == 0:
            ints[_u(rstack + rtop)] = row
            rtop += 1
    ints[TOP], ints[RTOP] = top, rtop
    ints[_u(rec + LEN)] = 0
    return OK


@njit(cache=True)
def last_slot(rows, ints, seq):
    if _u(seq) >= _u(ints[MAX_SEQS]):
        return E_SEQ_RANGE
    rec = HEADER + REC * seq
    n = ints[_u(rec + LEN)] - 1
    if n < 0:
        return E_INACTIVE
    sh = ints[BLOCK_SHIFT]
    col = (n >> sh) & ((1 << ints[ROW_SHIFT]) - 1)
    return slot_of_jit(np.int64(rows[_u(ints[_u(rec + LAST)]), _u(col)]), n, sh)


@njit(cache=True, inline="always")
def _next_stamp(ints):
    """A fresh stamp (``stamp << 1``) for duplicate detection; marks are reset, keeping their shared bits,
    only when it wraps."""
    if ints[STAMP] >= STAMP_LIMIT:
        for r in range(ints[MAX_SEQS]):
            ints[_u(HEADER + REC * r + MARK)] &= SHARED
        ints[STAMP] = 0
    ints[STAMP] += 1
    return np.int64(ints[STAMP]) << 1


_reserve_rows = njit(inline="always")(specialise(flat.reserve_rows.py_func, "flat_rows", **_TABLE))


@njit(cache=True, inline="always")
def _reserve(rows, ints, seq_ids):
    """flat's :func:`~impls.designs.flat.reserve` over the rows (rows need no count: the row pool holds the
    worst case). Returns ``(code, detail)``; changes only marks."""
    nseq, cols, sh = _u(ints[MAX_SEQS]), ints[MAX_BLOCKS], ints[BLOCK_SHIFT]
    return _reserve_rows(rows, ints, seq_ids, nseq, cols, sh, np.int64(ints[REFS]), _next_stamp(ints))


@njit(cache=True, inline="always")
def _undo_row_copy(ints, rec, seq, k, row, rtop):
    """If ``row`` is a copy this step made (the newest row popped and not yet given back), put the original
    back in the directory and the record and return the copy to the pool. Returns the new ``rtop``."""
    if rtop < ints[RTOP0] and ints[_u(ints[RSTACK] + rtop)] == row:
        orig = np.int64(ints[_u(rec + SAVED_ROW)])
        ints[_u(ints[RREFS] + orig)] += 1
        ints[_u(ints[RREFS] + row)] = 0
        ints[_u(ints[DIRS] + seq * np.int64(ints[DIR_LEN]) + k)] = orig
        ints[_u(rec + LAST)] = orig
        return rtop + 1
    return rtop


@njit(cache=True, inline="always")
def _fail(rows, ints, seq_ids, cow_out, slot_out, count, cows, rc):
    """Roll back the first ``count`` appends of a failed one-pass step, newest first, rows included; ``(rc, count)``."""
    sh, rs = ints[BLOCK_SHIFT], ints[ROW_SHIFT]
    rmask = (1 << rs) - 1
    refs, saved_cows = np.int64(ints[REFS]), np.int64(ints[COWS])
    top, rtop, c = ints[TOP], ints[RTOP], cows
    for k in range(count - 1, -1, -1):
        seq = seq_ids[_u(k)]
        rec = HEADER + REC * seq
        n = ints[_u(rec + LEN)] - 1
        ints[_u(rec + LEN)] = n
        ints[_u(rec + MARK)] |= SHARED
        j = np.int64(n >> sh)
        col = j & rmask
        row = np.int64(ints[_u(rec + LAST)])
        block = np.int64(rows[_u(row), _u(col)])
        if (n & ((1 << sh) - 1)) == 0:
            ints[_u(refs + block)] = 0
            top += 1
            if col == 0:  # a fresh row: give it back; the previous row holds the last block again
                ints[_u(ints[RREFS] + row)] = 0
                rtop += 1
                ints[_u(rec + LAST)] = ints[_u(ints[DIRS] + seq * np.int64(ints[DIR_LEN]) + (j >> rs) - 1)]
            else:
                rtop = _undo_row_copy(ints, rec, seq, j >> rs, row, rtop)
        elif c > 0 and block == cow_out[_u(c - 1), 1]:
            c -= 1
            src = cow_out[_u(c), 0]
            ints[_u(refs + src)] += 1
            ints[_u(refs + block)] = 0
            top += 1
            before = rtop
            rtop = _undo_row_copy(ints, rec, seq, j >> rs, row, rtop)
            if rtop == before:  # the row was the sequence's own: write the shared block back
                rows[_u(row), _u(col)] = src
        slot_out[_u(k)] = load(ints, rec + SAVED)
    ints[TOP], ints[RTOP] = top, rtop
    for c in range(cows):
        cow_out[_u(c), 0] = load(ints, saved_cows + 4 * c)
        cow_out[_u(c), 1] = load(ints, saved_cows + 4 * c + 2)
    return rc, count


@njit(cache=True, inline="always")
def _copy_on_write(rows, ints, row, col, src, cow_out, cows):
    """Give the (private) row a private copy of its shared block ``src`` at column ``col``; record the pair
    (keeping the buffer's old entry for a rollback). Returns the new block."""
    refs = np.int64(ints[REFS])
    top = ints[TOP] - 1
    ints[TOP] = top
    dst = np.int64(ints[_u(ints[STACK] + top)])
    ints[_u(refs + dst)] = 1
    ints[_u(refs + src)] -= 1
    rows[_u(row), _u(col)] = dst
    at = np.int64(ints[COWS]) + 4 * cows
    for k in range(2):
        old = cow_out[_u(cows), _u(k)]
        ints[_u(at + 2 * k)] = old
        ints[_u(at + 2 * k + 1)] = old >> 32
    cow_out[_u(cows), 0] = src
    cow_out[_u(cows), 1] = dst
    return dst


# One function on purpose, as C's: this loop is the batched step (validation, append and slot write fused).
@njit(cache=True)
def decode_step(rows, ints, seq_ids, cow_out, slot_out):  # noqa: C901
    n = seq_ids.shape[0]
    if slot_out.shape[0] < n or cow_out.shape[0] < n:
        return E_BUFFER, n
    if n > ints[TOP]:  # a tight pool: validate and count the exact need first
        rc, detail = _reserve(rows, ints, seq_ids)
        if rc != OK:
            return rc, detail
    # One pass: the pools cover the step now, so only a bad id can stop it, and _fail undoes what was done.
    stamp2 = _next_stamp(ints)
    nseq, cols = _u(ints[MAX_SEQS]), ints[MAX_BLOCKS]
    sh, rs = ints[BLOCK_SHIFT], ints[ROW_SHIFT]
    mask, rmask = (1 << sh) - 1, (1 << rs) - 1
    refs, stack, rrefs = np.int64(ints[REFS]), np.int64(ints[STACK]), np.int64(ints[RREFS])
    ints[RTOP0] = ints[RTOP]
    cows = 0
    for i in range(n):
        seq = seq_ids[_u(i)]
        if _u(seq) >= nseq:
            return _fail(rows, ints, seq_ids, cow_out, slot_out, i, cows, E_SEQ_RANGE)
        rec = HEADER + REC * seq
        mark = ints[_u(rec + MARK)]
        if mark == stamp2:  # appended earlier in this step (which leaves exactly stamp2): listed twice
            return _fail(rows, ints, seq_ids, cow_out, slot_out, i, cows, E_DUPLICATE)
        length = ints[_u(rec + LEN)]
        off = length & mask
        j = np.int64(length >> sh)
        col = j & rmask
        row = np.int64(ints[_u(rec + LAST)])
        if off == 0:  # empty and full sequences sit on a boundary: the length checks live only here
            if length == 0:
                return _fail(rows, ints, seq_ids, cow_out, slot_out, i, cows, E_INACTIVE)
            if j >= cols:
                return _fail(rows, ints, seq_ids, cow_out, slot_out, i, cows, E_TOO_LONG)
            copy = col != 0 and (mark & SHARED) != 0 and ints[_u(rrefs + row)] != 1
            if (col == 0 or copy) and ints[RTOP] == 0:  # never (see E_ROWS); kept off the rows' bounds
                return _fail(rows, ints, seq_ids, cow_out, slot_out, i, cows, E_ROWS)
            top = ints[TOP] - 1
            ints[TOP] = top
            block = np.int64(ints[_u(stack + top)])
            ints[_u(refs + block)] = 1
            if col == 0:  # the block opens a row
                row = _pop_row(ints)
                ints[_u(ints[DIRS] + seq * np.int64(ints[DIR_LEN]) + (j >> rs))] = row
                ints[_u(rec + LAST)] = row
            elif copy:
                row = _copy_row(rows, ints, rec, seq, row, j >> rs, col)
            rows[_u(row), _u(col)] = block
        else:
            block = np.int64(rows[_u(row), _u(col)])
            if mark & SHARED and ints[_u(refs + block)] != 1:
                if ints[_u(rrefs + row)] != 1:
                    if ints[RTOP] == 0:
                        return _fail(rows, ints, seq_ids, cow_out, slot_out, i, cows, E_ROWS)
                    row = _copy_row(rows, ints, rec, seq, row, j >> rs, col + 1)
                block = _copy_on_write(rows, ints, row, col, block, cow_out, cows)
                cows += 1
        ints[_u(rec + MARK)] = stamp2  # the sequence's last block (and row) is its own now
        ints[_u(rec + LEN)] = length + 1
        old = slot_out[_u(i)]  # a failed step leaves the caller's buffers untouched: keep what it overwrites
        ints[_u(rec + SAVED)] = old
        ints[_u(rec + SAVED + 1)] = old >> 32
        slot_out[_u(i)] = (block << sh) | off
    return cows, 0


@njit(cache=True)
def lookup(rows, ints, seq_ids, slot_out):
    nseq, sh = _u(ints[MAX_SEQS]), ints[BLOCK_SHIFT]
    rmask = (1 << ints[ROW_SHIFT]) - 1
    n = seq_ids.shape[0]
    if slot_out.shape[0] < n:
        return E_BUFFER, n
    for i in range(n):
        seq = seq_ids[_u(i)]
        if _u(seq) >= nseq:
            return E_SEQ_RANGE, i
        rec = HEADER + REC * seq
        m = ints[_u(rec + LEN)] - 1
        if m < 0:
            return E_INACTIVE, i
        block = np.int64(rows[_u(ints[_u(rec + LAST)]), _u((m >> sh) & rmask)])
        slot_out[_u(i)] = slot_of_jit(block, m, sh)
    return OK, 0


KERNELS = Kernels(can_allocate, allocate, append, fork, free, decode_step, lookup, last_slot)


class FlatRowsBlockManager(CompiledBlockManager):
    """``flat-rows``: a two-level flat table (directories of 64-byte rows from a row pool), Numba kernels."""

    kernels = KERNELS

    def __init__(self, num_blocks: int, block_size: int = 16, max_seqs: int = 256,
                 max_blocks_per_seq: int = 256) -> None:
        super().__init__(num_blocks, block_size, max_seqs, max_blocks_per_seq)
        n, s = self.num_blocks, self.max_seqs
        lay = self.layout = layout(n, s, self.max_blocks_per_seq)
        if lay.size > INT32_MAX:
            raise MemoryError(f"{self!r}: {lay.size} int32 entries of state exceed flat-rows' int32 offsets "
                              "(2**31 - 1): lower num_blocks or max_seqs")
        # Both on cache-line boundaries, so that a row and the header are one line each.
        self.rows = cache_aligned_zeros((lay.num_rows, lay.ids_per_row), table_dtype(n))
        ints = self.ints = cache_aligned_zeros(lay.size, np.int32)
        ints[[TOP, NUM_BLOCKS, BLOCK_SHIFT, RTOP, NUM_ROWS, ROW_SHIFT, MAX_SEQS, MAX_BLOCKS, DIR_LEN]] = (
            n, n, self.block_shift, lay.num_rows, lay.num_rows, lay.ids_per_row.bit_length() - 1, s,
            self.max_blocks_per_seq, lay.dir_len)
        ints[[DIRS, REFS, STACK, RREFS, RSTACK, COWS]] = (lay.dirs, lay.refs, lay.stack, lay.rrefs, lay.rstack,
                                                          lay.cows)
        # the tops of both stacks hand out 0, 1, 2, ... (C's block order)
        ints[lay.stack : lay.stack + n] = np.arange(n - 1, -1, -1, dtype=np.int32)
        ints[lay.rstack : lay.rstack + lay.num_rows] = np.arange(lay.num_rows - 1, -1, -1, dtype=np.int32)
        self._lens = ints[HEADER + LEN : lay.dirs : REC]
        self._last = ints[HEADER + LAST : lay.dirs : REC]
        self._dirs = ints[lay.dirs : lay.refs].reshape(s, lay.dir_len)
        self._refs = ints[lay.refs : lay.stack]
        self._row_refs = ints[lay.rrefs : lay.rstack]
        self.state = (self.rows, ints)

    def memory_bytes(self) -> int:
        """``rows`` (:func:`row_count` rows of 64 B) and ``ints``, plus 64 B per array for cache-line alignment."""
        lay = layout(self.num_blocks, self.max_seqs, self.max_blocks_per_seq)
        return lay.num_rows * ROW_BYTES + 4 * lay.size + 4 * (self.num_blocks + lay.num_rows) + 2 * ROW_BYTES

    def num_free_blocks(self) -> int:
        return int(self.ints[TOP])

    def rows_in_use(self) -> int:
        """Rows of the pool held by some directory (the rest are free)."""
        return self.layout.num_rows - int(self.ints[RTOP])

    def _row_ids(self, seq_id: int) -> np.ndarray:
        blocks = -(-int(self._lens[seq_id]) // self.block_size)
        return self._dirs[seq_id, : -(-blocks // self.layout.ids_per_row)]

    def _table(self, seq_id: int) -> list[int]:
        blocks = -(-int(self._lens[seq_id]) // self.block_size)
        return self.rows[self._row_ids(seq_id)].reshape(-1)[:blocks].tolist()

    def _ref(self, block_id: int) -> int:
        return int(self._refs[block_id])

    def _table_nbytes(self, seq_id: int) -> int:
        # The sequence's directory (preallocated) and the rows it points at (a shared row counts for each).
        return 4 * self.layout.dir_len + ROW_BYTES * len(self._row_ids(seq_id))

    def _fail(self, code: int, seq: int = -1, **context: object) -> None:
        if code == E_ROWS:  # pragma: no cover - unreachable: the row pool holds the worst case
            raise AssertionError(f"{self!r}: row pool exhausted ({self.layout.num_rows} rows); a bug in flat-rows")
        super()._fail(code, seq, **context)
