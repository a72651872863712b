"""Design C: a preallocated flat block table and a free-block stack, operated on by Numba kernels.

Everything is allocated once, in the constructor, and never again:

- ``table``: ``[max_seqs, max_blocks_per_seq]`` block ids, **uint16** while ``num_blocks <= 65536`` (the
  article's rule 2: a 32-block table is one 64-byte cache line), uint32 above that (up to 2**31 - 1 blocks);
- ``ints``: one int32 array holding a small header and, one after another, the per-row lengths, the per-block
  ref counts, the free-block stack (ids, ``top`` of them live) and a scratch row of marks used to reject
  duplicate ids in a decode step without allocating.

Lengths, ref counts and stack share one array because Numba's dispatch costs about 130 ns per array
argument: two arguments instead of five keep the per-call regime honest about what it measures.
Kernels index ``ints`` by offset (:func:`offsets`), never through views, which would cost Numba a locked
reference-count increment and decrement each.

The batched step is one pass when the pool covers its worst case (validation, append and slot write fused,
with a rollback of the appends already made on a bad id); a tight pool keeps the validate-then-reserve order.
Either way a failed step leaves the state as it was.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from .compiled import CompiledBlockManager, Kernels
from .contract import (
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
)
from .validation import slot_of_jit

# Header slots at the start of ``ints``.
TOP, NUM_BLOCKS, BLOCK_SHIFT, STAMP = 0, 1, 2, 3
HEADER = 4
UINT16_LIMIT = 65536
# A row's mark is ``stamp << 1 | shared``: the stamp of the last decode step that listed the row (duplicate
# detection) and a "last block may be shared" bit. A clear bit promises that the row's last block has ref
# count 1, so an append inside a block skips the ref-count read; fork sets it (sharing begins only there).
SHARED = 1
STAMP_LIMIT = 2**30 - 1  # stamp << 1 | 1 must fit the int32 marks

_u = np.uint64  # indices are cast to unsigned: Numba adds a wrap-around fix-up to every signed index


def table_dtype(num_blocks: int) -> np.dtype:
    """uint16 ids while they fit (rule 2), else uint32."""
    return np.dtype(np.uint16) if num_blocks <= UINT16_LIMIT else np.dtype(np.uint32)


def offsets(max_seqs: int, num_blocks: int) -> tuple[int, int, int, int, int, int]:
    """Where lengths, ref counts, the free stack, the marks and the saved outputs start in ``ints``, and its
    size."""
    marks = HEADER + max_seqs + 2 * num_blocks
    return HEADER, HEADER + max_seqs, HEADER + max_seqs + num_blocks, marks, marks + max_seqs, marks + 7 * max_seqs


# The kernels index ``ints`` by offset rather than slicing it into views: each view costs Numba a locked
# reference-count increment and decrement per call.
@njit(cache=True, inline="always")
def _offsets(table, ints):
    refs = HEADER + table.shape[0]
    stack = refs + ints[NUM_BLOCKS]
    return refs, stack, stack + ints[NUM_BLOCKS]


@njit(cache=True)
def can_allocate(table, ints, n):
    if n < 0:
        return E_COUNT
    return 1 if ints[TOP] >= n else 0


@njit(cache=True)
def allocate(table, ints, seq, num_tokens):
    refs, stack, marks = _offsets(table, ints)
    sh = ints[BLOCK_SHIFT]
    if _u(seq) >= _u(table.shape[0]):
        return E_SEQ_RANGE
    if num_tokens < 1:
        return E_TOKENS
    need = (num_tokens + (1 << sh) - 1) >> sh
    if need > table.shape[1]:
        return E_TOO_LONG
    if ints[_u(HEADER + seq)] != 0:
        return E_ACTIVE
    top = ints[TOP]
    if need > top:
        return E_NO_BLOCKS
    for j in range(need):
        top -= 1
        block = ints[_u(stack + top)]
        ints[_u(refs + block)] = 1
        table[_u(seq), _u(j)] = block
    ints[TOP] = top
    ints[_u(HEADER + seq)] = num_tokens
    ints[_u(marks + seq)] &= ~SHARED  # fresh blocks: not shared
    return OK


@njit(cache=True)
def append(table, ints, seq):
    refs, stack, marks = _offsets(table, ints)
    sh = ints[BLOCK_SHIFT]
    if _u(seq) >= _u(table.shape[0]):
        return E_SEQ_RANGE, -1, -1
    us = _u(seq)
    n = ints[_u(HEADER + seq)]
    if n == 0:
        return E_INACTIVE, -1, -1
    j = n >> sh
    mark = ints[_u(marks + seq)]
    top = ints[TOP]
    if (n & ((1 << sh) - 1)) == 0:
        if j >= table.shape[1]:
            return E_TOO_LONG, -1, -1
        if top == 0:
            return E_NO_BLOCKS, -1, -1
        top -= 1
        block = ints[_u(stack + top)]
        ints[_u(refs + block)] = 1
        table[us, _u(j)] = block
        ints[TOP] = top
        ints[_u(HEADER + seq)] = n + 1
        ints[_u(marks + seq)] = mark & ~SHARED
        return 0, -1, -1
    src = np.int64(table[us, _u(j)])
    if (mark & SHARED) == 0 or ints[_u(refs + src)] == 1:
        ints[_u(HEADER + seq)] = n + 1
        ints[_u(marks + seq)] = mark & ~SHARED
        return 0, -1, -1
    if top == 0:
        return E_NO_BLOCKS, -1, -1
    top -= 1
    dst = np.int64(ints[_u(stack + top)])
    ints[_u(refs + dst)] = 1
    ints[_u(refs + src)] -= 1
    table[us, _u(j)] = dst
    ints[TOP] = top
    ints[_u(HEADER + seq)] = n + 1
    ints[_u(marks + seq)] = mark & ~SHARED
    return 1, src, dst


@njit(cache=True)
def fork(table, ints, parent, child):
    refs, _, marks = _offsets(table, ints)
    rows = _u(table.shape[0])
    if _u(parent) >= rows or _u(child) >= rows:
        return E_SEQ_RANGE
    n = ints[_u(HEADER + parent)]
    if n == 0:
        return E_INACTIVE
    if ints[_u(HEADER + child)] != 0:
        return E_ACTIVE
    sh = ints[BLOCK_SHIFT]
    for j in range((n + (1 << sh) - 1) >> sh):
        block = table[_u(parent), _u(j)]
        table[_u(child), _u(j)] = block
        ints[_u(refs + block)] += 1
    ints[_u(HEADER + child)] = n
    ints[_u(marks + parent)] |= SHARED  # sharing begins: both rows' last block now has ref count >= 2
    ints[_u(marks + child)] |= SHARED
    return OK


@njit(cache=True)
def free(table, ints, seq):
    refs, stack, _ = _offsets(table, ints)
    if _u(seq) >= _u(table.shape[0]):
        return E_SEQ_RANGE
    n = ints[_u(HEADER + seq)]
    if n == 0:
        return E_INACTIVE
    sh = ints[BLOCK_SHIFT]
    top = ints[TOP]
    for j in range(((n + (1 << sh) - 1) >> sh) - 1, -1, -1):
        block = table[_u(seq), _u(j)]
        r = ints[_u(refs + block)] - 1
        ints[_u(refs + block)] = r
        if r == 0:
            ints[_u(stack + top)] = block
            top += 1
    ints[TOP] = top
    ints[_u(HEADER + seq)] = 0
    return OK


@njit(cache=True)
def last_slot(table, ints, seq):
    if _u(seq) >= _u(table.shape[0]):
        return E_SEQ_RANGE
    n = ints[_u(HEADER + seq)] - 1
    if n < 0:
        return E_INACTIVE
    sh = ints[BLOCK_SHIFT]
    return slot_of_jit(np.int64(table[_u(seq), _u(n >> sh)]), n, sh)


@njit(cache=True, inline="always")
def _next_stamp(ints, marks, rows):
    """A fresh stamp for duplicate detection; marks are reset (keeping their shared bits) only when it wraps."""
    if ints[STAMP] >= STAMP_LIMIT:
        for r in range(rows):
            ints[_u(marks + r)] &= SHARED
        ints[STAMP] = 0
    ints[STAMP] += 1
    return np.int64(ints[STAMP]) << 1


@njit(cache=True, inline="always")
def _validate(table, ints, seq_ids, stamp2, marks):
    """The tight pool's validation pass (every id valid for an append, listed once), as check_batch_jit."""
    rows, sh = _u(table.shape[0]), ints[BLOCK_SHIFT]
    for i in range(seq_ids.shape[0]):
        seq = seq_ids[_u(i)]
        if _u(seq) >= rows:
            return E_SEQ_RANGE, i
        n = ints[_u(HEADER + seq)]
        if n == 0:
            return E_INACTIVE, i
        if (n & ((1 << sh) - 1)) == 0 and (n >> sh) >= table.shape[1]:
            return E_TOO_LONG, i
        mark = ints[_u(marks + seq)]
        if (mark | SHARED) == (stamp2 | SHARED):
            return E_DUPLICATE, i
        ints[_u(marks + seq)] = stamp2 | (mark & SHARED)
    return OK, 0


@njit(cache=True, inline="always")
def _blocks_needed(table, ints, seq_ids, refs, marks):
    """The step's exact need: a block per row at a boundary or whose last block is shared."""
    sh = ints[BLOCK_SHIFT]
    need = 0
    for i in range(seq_ids.shape[0]):
        seq = seq_ids[_u(i)]
        n = ints[_u(HEADER + seq)]
        if (n & ((1 << sh) - 1)) == 0:
            need += 1
        elif ints[_u(marks + seq)] & SHARED:
            need += ints[_u(refs + table[_u(seq), _u(n >> sh)])] > 1
    return need


@njit(cache=True, inline="always")
def _save(ints, at, a, b):
    """Keep two int64 values as int32 pairs at ``ints[at : at + 4]``."""
    ints[_u(at)] = a
    ints[_u(at + 1)] = a >> 32
    ints[_u(at + 2)] = b
    ints[_u(at + 3)] = b >> 32


@njit(cache=True, inline="always")
def _load(ints, at):
    """The int64 kept as an int32 pair at ``ints[at : at + 2]``."""
    return (np.int64(ints[_u(at + 1)]) << 32) | (np.int64(ints[_u(at)]) & 0xFFFFFFFF)


@njit(cache=True, inline="always")
def _restore(ints, save, rows, cow_out, slot_out, count, cows):
    """Put back the slots and CoW pairs a failed one-pass step overwrote (see :func:`_one_pass`)."""
    for k in range(count):
        slot_out[_u(k)] = _load(ints, save + 2 * k)
    for c in range(cows):
        at = save + 2 * rows + 4 * c
        cow_out[_u(c), 0] = _load(ints, at)
        cow_out[_u(c), 1] = _load(ints, at + 2)


@njit(cache=True, inline="always")
def _undo(table, ints, seq_ids, count, cow_out, cows, refs, marks):
    """Roll back the first ``count`` appends of a failed one-pass step, newest first, copy-on-writes included.

    Stack entries above ``top`` are never overwritten within a step, so giving a block back is ``top += 1``.
    Every rolled-back row gets its shared bit set: a row that found its block unshared only because an earlier
    row of the step copied away from it shares that block again once the copy is undone."""
    sh = ints[BLOCK_SHIFT]
    mask = (1 << sh) - 1
    top = ints[TOP]
    for k in range(count - 1, -1, -1):
        seq = seq_ids[_u(k)]
        n = ints[_u(HEADER + seq)] - 1
        ints[_u(HEADER + seq)] = n
        ints[_u(marks + seq)] |= SHARED
        block = np.int64(table[_u(seq), _u(n >> sh)])
        if (n & mask) == 0:
            ints[_u(refs + block)] = 0
            top += 1
        elif cows > 0 and block == cow_out[_u(cows - 1), 1]:
            cows -= 1
            src = cow_out[_u(cows), 0]
            table[_u(seq), _u(n >> sh)] = src
            ints[_u(refs + src)] += 1
            ints[_u(refs + block)] = 0
            top += 1
    ints[TOP] = top


# One loop on purpose: this is the batched step (validation, append and slot write fused), and a call or a
# second pass per sequence is exactly what it exists to remove.
@njit(cache=True, inline="always")
def _one_pass(table, ints, seq_ids, cow_out, slot_out, stamp2, refs, stack, marks):
    """Validate, append and write the slot of each id in one loop; on a bad id undo what was done.

    Requires a pool covering the worst case (one block per id). Returns ``(cows, 0)`` or ``(code, index)``."""
    rows, cols = _u(table.shape[0]), table.shape[1]
    save = marks + table.shape[0]  # the outputs' old values, int64 as int32 pairs (restored on failure)
    sh = ints[BLOCK_SHIFT]
    mask = (1 << sh) - 1
    top = ints[TOP]
    cows = 0
    rc = OK
    i = 0
    for i in range(seq_ids.shape[0]):
        seq = seq_ids[_u(i)]
        if _u(seq) >= rows:
            rc = E_SEQ_RANGE
            break
        us = _u(seq)
        mark = ints[_u(marks + seq)]
        if (mark | SHARED) == (stamp2 | SHARED):  # listed earlier in this step (so valid then)
            rc = E_DUPLICATE
            break
        n = ints[_u(HEADER + seq)]
        off = n & mask
        j = _u(n >> sh)
        if off == 0:  # empty and full rows sit on a boundary: the length checks live only here
            if n == 0:
                rc = E_INACTIVE
                break
            if n >> sh >= cols:
                rc = E_TOO_LONG
                break
            top -= 1
            block = np.int64(ints[_u(stack + top)])
            ints[_u(refs + block)] = 1
            table[us, j] = block
        else:
            block = np.int64(table[us, j])
            if mark & SHARED and ints[_u(refs + block)] != 1:
                top -= 1
                dst = np.int64(ints[_u(stack + top)])
                ints[_u(refs + dst)] = 1
                ints[_u(refs + block)] -= 1
                table[us, j] = dst
                _save(ints, save + 2 * table.shape[0] + 4 * cows, cow_out[_u(cows), 0], cow_out[_u(cows), 1])
                cow_out[_u(cows), 0] = block
                cow_out[_u(cows), 1] = dst
                cows += 1
                block = dst
        ints[_u(marks + seq)] = stamp2  # the row's last block is its own now
        ints[_u(HEADER + seq)] = n + 1
        old = slot_out[_u(i)]  # a failed step leaves the caller's buffers untouched: keep what it overwrites
        ints[_u(save + 2 * i)] = old
        ints[_u(save + 2 * i + 1)] = old >> 32
        slot_out[_u(i)] = (block << sh) | off
    if rc == OK:
        ints[TOP] = top
        return cows, 0
    ints[TOP] = top
    _undo(table, ints, seq_ids, i, cow_out, cows, refs, marks)
    _restore(ints, save, table.shape[0], cow_out, slot_out, i, cows)
    return rc, i


@njit(cache=True)
def decode_step(table, ints, seq_ids, cow_out, slot_out):
    refs, stack, marks = _offsets(table, ints)
    n = seq_ids.shape[0]
    if slot_out.shape[0] < n or cow_out.shape[0] < n:
        return E_BUFFER, n
    stamp2 = _next_stamp(ints, marks, table.shape[0])
    if n > ints[TOP]:
        # A tight pool keeps the validate-then-reserve order: validation, the exact need, then appends (under
        # a fresh stamp, so the one pass does not mistake the validation's marks for duplicates).
        rc, i = _validate(table, ints, seq_ids, stamp2, marks)
        if rc != OK:
            return rc, i
        need = _blocks_needed(table, ints, seq_ids, refs, marks)
        if need > ints[TOP]:
            return E_NO_BLOCKS, need
        stamp2 = _next_stamp(ints, marks, table.shape[0])
    return _one_pass(table, ints, seq_ids, cow_out, slot_out, stamp2, refs, stack, marks)


@njit(cache=True)
def lookup(table, ints, seq_ids, slot_out):
    rows, sh = _u(table.shape[0]), ints[BLOCK_SHIFT]
    n = seq_ids.shape[0]
    if slot_out.shape[0] < n:
        return E_BUFFER, n
    for i in range(n):
        seq = seq_ids[_u(i)]
        if _u(seq) >= rows:
            return E_SEQ_RANGE, i
        m = ints[_u(HEADER + seq)] - 1
        if m < 0:
            return E_INACTIVE, i
        slot_out[_u(i)] = slot_of_jit(np.int64(table[_u(seq), _u(m >> sh)]), m, sh)
    return OK, 0


def check_table_buffer(table: object, max_seqs: int, max_blocks_per_seq: int, num_blocks: int) -> None:
    """Raise ``ValueError`` unless ``table`` can serve as the flat design's block table.

    The kernels are compiled for C-contiguous arrays of :func:`table_dtype`; any other buffer would either
    compile a second, slower specialisation or silently write to a copy.
    """
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
        """``table``, if given, becomes the block table (zeroed here) instead of a fresh array: e.g. the NumPy
        view of a pinned torch tensor, so that the table can be copied to a GPU as it is (rule 3). It must be
        exactly what the design would allocate: shape ``(max_seqs, max_blocks_per_seq)``, dtype
        :func:`table_dtype` of ``num_blocks``, C-contiguous and writeable; else ``ValueError``."""
        self._own_table = table is None
        super().__init__(num_blocks, block_size, max_seqs, max_blocks_per_seq)
        s, n = self.max_seqs, self.num_blocks
        if table is None:
            self.table = np.zeros((s, self.max_blocks_per_seq), dtype=table_dtype(n))
        else:
            check_table_buffer(table, s, self.max_blocks_per_seq, n)
            table[...] = 0  # the same starting state as a fresh table
            self.table = table
        lens, refs, stack, _, _, size = offsets(s, n)
        self.ints = np.zeros(size, dtype=np.int32)
        self.ints[TOP], self.ints[NUM_BLOCKS], self.ints[BLOCK_SHIFT] = n, n, self.block_shift
        self._lens, self._refs = self.ints[lens:refs], self.ints[refs:stack]
        # the top of the stack hands out 0, 1, 2, ...
        self.ints[stack : stack + n] = np.arange(n - 1, -1, -1, dtype=np.int32)
        self.state = (self.table, self.ints)

    def memory_bytes(self) -> int:
        """Per block 12 B (ref count and stack slot, int32, plus the int32 ids the stack is filled from), per
        row ``max_blocks_per_seq`` ids of :func:`table_dtype` (unless the table is given) and 32 B (length,
        mark, and room for the slot and CoW pair a failed step restores). 2**31 - 1 blocks need 24 GiB while
        the stack is filled, 16 GiB after."""
        n, s = self.num_blocks, self.max_seqs
        table = s * self.max_blocks_per_seq * table_dtype(n).itemsize if self._own_table else 0
        return table + 4 * offsets(s, n)[-1] + 4 * n

    def num_free_blocks(self) -> int:
        return int(self.ints[TOP])

    def _table(self, seq_id: int) -> list[int]:
        return self.table[seq_id, : -(-int(self._lens[seq_id]) // self.block_size)].tolist()

    def _ref(self, block_id: int) -> int:
        return int(self._refs[block_id])

    def _table_nbytes(self, seq_id: int) -> int:
        # One preallocated row of the flat table, whatever the sequence's length.
        return self.table.itemsize * self.max_blocks_per_seq
