"""The contract's input checks, written once for both worlds.

Each function takes ``lens`` (per sequence row: its length in tokens, 0 when inactive; a list or a NumPy
array) and scalars (``shift`` is log2 of the block size: shifts and masks, not divisions, which cost a
hardware divide each in compiled code), and returns a status code from :mod:`impls.contract`. The
interpreted designs call these functions as they are; the compiled designs call the ``njit`` twins at
the bottom of this module, built from the same source, so both worlds enforce identical rules in identical
order. The twins are inlined into the kernels (``inline="always"``): a call that is not inlined passes
arrays by reference count, and those atomic increments cost more than the checks themselves.
"""

from __future__ import annotations

from numba import njit

from .contract import E_ACTIVE, E_DUPLICATE, E_INACTIVE, E_SEQ_RANGE, E_TOKENS, E_TOO_LONG, OK


def check_active(lens, seq):
    """Range, then active."""
    if seq < 0 or seq >= len(lens):
        return E_SEQ_RANGE
    if lens[seq] == 0:
        return E_INACTIVE
    return OK


def check_allocate(lens, max_blocks, shift, seq, num_tokens):
    """Range, token count and size, then the row must be free."""
    if seq < 0 or seq >= len(lens):
        return E_SEQ_RANGE
    if num_tokens < 1:
        return E_TOKENS
    if (num_tokens + (1 << shift) - 1) >> shift > max_blocks:
        return E_TOO_LONG
    if lens[seq] != 0:
        return E_ACTIVE
    return OK


def check_append(lens, max_blocks, shift, seq):
    """Range, active, then room for one more token (a new block at a boundary)."""
    if seq < 0 or seq >= len(lens):
        return E_SEQ_RANGE
    n = lens[seq]
    if n == 0:
        return E_INACTIVE
    if n & ((1 << shift) - 1) == 0 and n >> shift >= max_blocks:
        return E_TOO_LONG
    return OK


def check_fork(lens, parent, child):
    """Both ids in range, parent active, child free."""
    if parent < 0 or parent >= len(lens) or child < 0 or child >= len(lens):
        return E_SEQ_RANGE
    if lens[parent] == 0:
        return E_INACTIVE
    if lens[child] != 0:
        return E_ACTIVE
    return OK


def blocks_needed(tokens, shift):
    """Blocks holding ``tokens`` tokens."""
    return (tokens + (1 << shift) - 1) >> shift


def slot_of(block, pos, shift):
    """Physical KV slot of token position ``pos`` when its block is ``block``."""
    return (block << shift) | (pos & ((1 << shift) - 1))


blocks_needed_jit = njit(cache=True, inline="always")(blocks_needed)
slot_of_jit = njit(cache=True, inline="always")(slot_of)
check_active_jit = njit(cache=True, inline="always")(check_active)
check_allocate_jit = njit(cache=True, inline="always")(check_allocate)
check_append_jit = njit(cache=True, inline="always")(check_append)
check_fork_jit = njit(cache=True, inline="always")(check_fork)


@njit(cache=True, inline="always")
def check_batch_jit(lens, marks, stamp, max_blocks, shift, seq_ids):
    """A compiled decode step's validation pass: every id valid for an append and listed once.

    ``marks`` is a per-row scratch array and ``stamp`` a value no row holds yet, so duplicates are found
    without allocating. Returns ``(code, index of the offending id)``.
    """
    for i in range(seq_ids.shape[0]):
        seq = seq_ids[i]
        rc = check_append_jit(lens, max_blocks, shift, seq)
        if rc != OK:
            return rc, i
        if marks[seq] == stamp:
            return E_DUPLICATE, i
        marks[seq] = stamp
    return OK, 0
