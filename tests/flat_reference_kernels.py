"""Test-only: a frozen copy of ``impls.designs.flat``'s kernels before the one-pass rewrite (the differential
fuzz's reference).

Do not optimise or "fix" this module: tests/test_flat_differential.py compares the live kernels against it.
What follows is the original module docstring.

Design C: a preallocated flat block table and a free-block stack, operated on by Numba kernels.

Everything is allocated once, in the constructor, and never again:

- ``table``: ``[max_seqs, max_blocks_per_seq]`` block ids, **uint16** while ``num_blocks <= 65536`` (the
  article's rule 2: a 32-block table is one 64-byte cache line), uint32 above that (up to 2**31 - 1 blocks);
- ``ints``: one int32 array holding a small header and, one after another, the per-row lengths, the per-block
  ref counts, the free-block stack (ids, ``top`` of them live) and a scratch row of marks used to reject
  duplicate ids in a decode step without allocating.

Lengths, ref counts and stack share one array because Numba's dispatch costs about 130 ns per array
argument: two arguments instead of five keep the per-call regime honest about what it measures.
Kernels slice ``ints`` into named views at entry (:func:`_parts`), which allocates nothing.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from impls.contract import E_BUFFER, E_COUNT, E_NO_BLOCKS, OK
from impls.core import validation as checks  # the contract's checks, as the live kernels call them
from impls.core.compiled import Kernels

# The header slots at the start of ``ints`` (and the table's dtype, flat.table_dtype) are the live design's: the
# rewrite kept them, and the differential fuzz reads both states through them.
from impls.designs.flat import BLOCK_SHIFT, HEADER, NUM_BLOCKS, STAMP, TOP


@njit(cache=True, inline="always")
def _parts(table, ints):
    s, n = table.shape[0], ints[NUM_BLOCKS]
    lens = ints[HEADER : HEADER + s]
    refs = ints[HEADER + s : HEADER + s + n]
    stack = ints[HEADER + s + n : HEADER + s + 2 * n]
    marks = ints[HEADER + s + 2 * n : HEADER + 2 * s + 2 * n]
    return lens, refs, stack, marks


@njit(cache=True)
def can_allocate(table, ints, n):
    if n < 0:
        return E_COUNT
    return 1 if ints[TOP] >= n else 0


@njit(cache=True)
def allocate(table, ints, seq, num_tokens):
    lens, refs, stack, _ = _parts(table, ints)
    sh = ints[BLOCK_SHIFT]
    rc = checks.check_allocate_jit(lens, table.shape[1], sh, seq, num_tokens)
    if rc != OK:
        return rc
    need = checks.blocks_needed_jit(num_tokens, sh)
    top = ints[TOP]
    if need > top:
        return E_NO_BLOCKS
    for j in range(need):
        top -= 1
        block = stack[top]
        refs[block] = 1
        table[seq, j] = block
    ints[TOP] = top
    lens[seq] = num_tokens
    return OK


@njit(cache=True, inline="always")
def _append(table, ints, lens, refs, stack, seq, sh):
    """Unchecked append of one token; returns (1, src, dst) on copy-on-write, else (0, -1, -1)."""
    n = lens[seq]
    lens[seq] = n + 1
    j = n >> sh
    if (n & ((1 << sh) - 1)) == 0:
        top = ints[TOP] - 1
        ints[TOP] = top
        block = stack[top]
        refs[block] = 1
        table[seq, j] = block
        return 0, -1, -1
    src = table[seq, j]
    if refs[src] == 1:
        return 0, -1, -1
    top = ints[TOP] - 1
    ints[TOP] = top
    dst = stack[top]
    refs[dst] = 1
    refs[src] -= 1
    table[seq, j] = dst
    return 1, np.int64(src), np.int64(dst)


@njit(cache=True, inline="always")
def _needs_block(table, lens, refs, seq, sh):
    n = lens[seq]
    if (n & ((1 << sh) - 1)) == 0:
        return True
    # (not `return a or b`: Numba lowers that form about 20x slower than the branch)
    return refs[table[seq, n >> sh]] > 1


@njit(cache=True)
def append(table, ints, seq):
    lens, refs, stack, _ = _parts(table, ints)
    sh = ints[BLOCK_SHIFT]
    rc = checks.check_append_jit(lens, table.shape[1], sh, seq)
    if rc != OK:
        return rc, -1, -1
    if ints[TOP] == 0 and _needs_block(table, lens, refs, seq, sh):
        return E_NO_BLOCKS, -1, -1
    return _append(table, ints, lens, refs, stack, seq, sh)


@njit(cache=True)
def fork(table, ints, parent, child):
    lens, refs, _, _ = _parts(table, ints)
    rc = checks.check_fork_jit(lens, parent, child)
    if rc != OK:
        return rc
    sh = ints[BLOCK_SHIFT]
    for j in range(checks.blocks_needed_jit(lens[parent], sh)):
        block = table[parent, j]
        table[child, j] = block
        refs[block] += 1
    lens[child] = lens[parent]
    return OK


@njit(cache=True, inline="always")
def _active(table, ints, seq):
    """``seq``'s check (OK, or the error code) and what a kernel on an active sequence reads: views and shift."""
    lens, refs, stack, _ = _parts(table, ints)
    return checks.check_active_jit(lens, seq), lens, refs, stack, ints[BLOCK_SHIFT]


@njit(cache=True)
def free(table, ints, seq):
    rc, lens, refs, stack, sh = _active(table, ints, seq)
    if rc != OK:
        return rc
    top = ints[TOP]
    for j in range(checks.blocks_needed_jit(lens[seq], sh) - 1, -1, -1):
        block = table[seq, j]
        refs[block] -= 1
        if refs[block] == 0:
            stack[top] = block
            top += 1
    ints[TOP] = top
    lens[seq] = 0
    return OK


@njit(cache=True)
def last_slot(table, ints, seq):
    rc, lens, _, _, sh = _active(table, ints, seq)
    if rc != OK:
        return rc
    n = lens[seq] - 1
    return checks.slot_of_jit(np.int64(table[seq, n >> sh]), n, sh)


@njit(cache=True, inline="always")
def _next_stamp(ints, marks):
    """A fresh mark value for duplicate detection; marks are cleared only when the stamp wraps."""
    if ints[STAMP] == 2**31 - 1:
        marks[:] = 0
        ints[STAMP] = 0
    ints[STAMP] += 1
    return ints[STAMP]


@njit(cache=True)
def decode_step(table, ints, seq_ids, cow_out, slot_out):
    lens, refs, _, marks = _parts(table, ints)
    sh = ints[BLOCK_SHIFT]
    n = seq_ids.shape[0]
    if slot_out.shape[0] < n or cow_out.shape[0] < n:
        return E_BUFFER, n
    stamp = _next_stamp(ints, marks)
    rc, i = checks.check_batch_jit(lens, marks, stamp, table.shape[1], sh, seq_ids)  # before changing anything
    if rc != OK:
        return rc, i
    need = 0  # the exact worst case, always (the live kernel reads it only when the pool is tight)
    for i in range(n):
        need += _needs_block(table, lens, refs, seq_ids[i], sh)
    if need > ints[TOP]:
        return E_NO_BLOCKS, need
    cows = 0
    for i in range(n):
        cows = _step_one(table, ints, seq_ids[i], i, cow_out, cows, slot_out)
    return cows, 0


@njit(cache=True, inline="always")
def _step_one(table, ints, seq, i, cow_out, cows, slot_out):
    """The batch's ``i``-th sequence through the one-call kernels (the reference's whole point: no fused loop): its
    slot at ``i``, its copy-on-write pair at ``cows``; returns the pairs so far."""
    cow, src, dst = append(table, ints, seq)
    slot_out[i] = last_slot(table, ints, seq)
    if cow == 1:
        cow_out[cows, 0] = src
        cow_out[cows, 1] = dst
    return cows + cow


@njit(cache=True)
def lookup(table, ints, seq_ids, slot_out):
    n = seq_ids.shape[0]
    if slot_out.shape[0] < n:
        return E_BUFFER, n
    for i in range(n):
        slot = last_slot(table, ints, seq_ids[i])  # an error code (below 0) for a sequence that is not active
        if slot < OK:
            return slot, i
        slot_out[i] = slot
    return OK, 0


KERNELS = Kernels(can_allocate, allocate, append, fork, free, decode_step, lookup, last_slot)
