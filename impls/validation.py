"""The contract's input checks, written once for both worlds.

Each function takes ``lens`` (per sequence row: its length in tokens, 0 when inactive; a list or a NumPy
array) and scalars, and returns a status code from :mod:`impls.contract`. The interpreted designs call these
functions as they are; the compiled designs call the ``njit`` twins at the bottom of this module, built from
the same source, so both worlds enforce identical rules in identical order.
"""

from __future__ import annotations

from numba import njit

from .contract import E_ACTIVE, E_INACTIVE, E_SEQ_RANGE, E_TOKENS, E_TOO_LONG, OK


def check_active(lens, seq):
    """Range, then active."""
    if seq < 0 or seq >= len(lens):
        return E_SEQ_RANGE
    if lens[seq] == 0:
        return E_INACTIVE
    return OK


def check_allocate(lens, max_blocks, block_size, seq, num_tokens):
    """Range, token count and size, then the row must be free."""
    if seq < 0 or seq >= len(lens):
        return E_SEQ_RANGE
    if num_tokens < 1:
        return E_TOKENS
    if (num_tokens + block_size - 1) // block_size > max_blocks:
        return E_TOO_LONG
    if lens[seq] != 0:
        return E_ACTIVE
    return OK


def check_append(lens, max_blocks, block_size, seq):
    """Range, active, then room for one more token (a new block at a boundary)."""
    if seq < 0 or seq >= len(lens):
        return E_SEQ_RANGE
    n = lens[seq]
    if n == 0:
        return E_INACTIVE
    if n % block_size == 0 and n // block_size >= max_blocks:
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


check_active_jit = njit(cache=True)(check_active)
check_allocate_jit = njit(cache=True)(check_allocate)
check_append_jit = njit(cache=True)(check_append)
check_fork_jit = njit(cache=True)(check_fork)
