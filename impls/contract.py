"""The BlockManager contract every implementation follows, and its errors.

Every public operation validates its input first and raises before touching state, so a failed call leaves
the manager exactly as it was. The checks run in a fixed order, the same in every implementation:

0. argument types (``TypeError``: ids, counts and lengths must be ``int`` or NumPy integers, not ``bool``;
   batch buffers must be int64 arrays), then buffer shapes, writeability, contiguity and overlap
   (``ValueError``), all in :mod:`impls.validation`;
1. argument ranges (``ValueError``: sequence id outside ``[0, max_seqs)``, ``num_tokens < 1``, a prompt that
   needs more than ``max_blocks_per_seq`` blocks, a negative block count, a block id outside the pool);
2. sequence state (``KeyError``: operating on an inactive sequence, allocating or forking into an active one);
3. capacity of the sequence (``ValueError``: an append that would need block ``max_blocks_per_seq + 1``);
4. the pool (``NoFreeBlocksError``).

Compiled implementations report failures as integer codes (exceptions with formatted messages are costly in
Numba); :func:`raise_for` turns a code into the exception, so every implementation raises the same way.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import numpy as np

# Status codes shared by compiled kernels and the Python wrappers. OK and positive values are results.
OK = 0
E_SEQ_RANGE = -1  # ValueError
E_TOKENS = -2  # ValueError
E_TOO_LONG = -3  # ValueError: more than max_blocks_per_seq blocks
E_INACTIVE = -4  # KeyError
E_ACTIVE = -5  # KeyError
E_NO_BLOCKS = -6  # NoFreeBlocksError
E_DUPLICATE = -7  # ValueError: a sequence twice in one decode step
E_BLOCK_RANGE = -8  # ValueError
E_BUFFER = -9  # ValueError: an output buffer too small for the batch
E_COUNT = -10  # ValueError: negative block count


class NoFreeBlocksError(MemoryError):
    """The free pool holds fewer blocks than the operation needs; the scheduler should preempt."""


_MESSAGES = {
    E_SEQ_RANGE: (ValueError, "sequence id {seq} is outside [0, {max_seqs})"),
    E_TOKENS: (ValueError, "num_tokens must be >= 1, got {num_tokens}"),
    E_TOO_LONG: (ValueError, "sequence {seq} would need more than max_blocks_per_seq={max_blocks} blocks"),
    E_INACTIVE: (KeyError, "sequence {seq} is not active"),
    E_ACTIVE: (KeyError, "sequence {seq} is already active"),
    E_NO_BLOCKS: (NoFreeBlocksError, "need {need} free blocks, pool has {free}"),
    E_DUPLICATE: (ValueError, "sequence {seq} appears twice in one decode step"),
    E_BLOCK_RANGE: (ValueError, "block id {block} is outside [0, {num_blocks})"),
    E_BUFFER: (ValueError, "output buffers hold {capacity} entries, the batch has {need}"),
    E_COUNT: (ValueError, "num_blocks must be >= 0, got {need}"),
}


class _Context(dict):
    def __missing__(self, key: str) -> str:
        return "?"


def raise_for(code: int, **context: object) -> None:
    """Raise the contract's exception for a negative status ``code``; ``context`` fills the message."""
    exc_type, template = _MESSAGES[code]
    raise exc_type(template.format_map(_Context(context)))


def fork_culprit(code: int, parent: int, child: int, max_seqs: int) -> int:
    """The sequence id a failed ``fork`` should name in its message."""
    if code == E_SEQ_RANGE:
        return parent if not 0 <= parent < max_seqs else child
    return child if code == E_ACTIVE else parent


def blocks_for(num_tokens: int, block_size: int) -> int:
    """Number of blocks holding ``num_tokens`` tokens."""
    return (num_tokens + block_size - 1) // block_size


def check_config(num_blocks: int, block_size: int, max_seqs: int, max_blocks_per_seq: int) -> tuple[int, ...]:
    """Validate constructor arguments shared by every implementation; returns them as Python ints."""
    values = []
    for name, value in (
        ("num_blocks", num_blocks),
        ("block_size", block_size),
        ("max_seqs", max_seqs),
        ("max_blocks_per_seq", max_blocks_per_seq),
    ):
        if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
        values.append(int(value))  # before any arithmetic: NumPy scalars would wrap around
    num_blocks, block_size, max_seqs, max_blocks_per_seq = values
    if block_size & (block_size - 1):
        raise ValueError(f"block_size must be a power of two (as in vLLM, SGLang and TensorRT-LLM), got {block_size}")
    if num_blocks > MAX_NUM_BLOCKS:
        raise ValueError(f"num_blocks={num_blocks} exceeds the supported maximum {MAX_NUM_BLOCKS}")
    if max_seqs > MAX_SEQS:
        raise ValueError(f"max_seqs={max_seqs} exceeds the supported maximum {MAX_SEQS}")
    if block_size * max_blocks_per_seq > MAX_SEQ_TOKENS:
        raise ValueError(
            f"block_size * max_blocks_per_seq = {block_size * max_blocks_per_seq} exceeds {MAX_SEQ_TOKENS}: "
            "a sequence's length must fit the compiled designs' int32 lengths"
        )
    return tuple(values)


# Caps, chosen so that no count, length or slot can overflow the compiled designs' integers:
# - ids and ref counts: compiled designs keep ref counts and the free stack in int32 arrays (``flat``);
MAX_NUM_BLOCKS = 2**31 - 1
# - a block's ref count is at most max_seqs (each row holds a block once), int32 in ``flat``;
MAX_SEQS = 2**31 - 1
# - lengths: a sequence holds at most ``block_size * max_blocks_per_seq`` tokens, and ``flat`` keeps lengths in
#   int32; hence also block_size <= 2**30;
MAX_SEQ_TOKENS = 2**31 - 1
# - slots (int64): the largest slot is num_blocks * block_size - 1 < 2**31 * 2**30 = 2**61, so int64 slots
#   never overflow under the two caps above.


@runtime_checkable
class BlockManager(Protocol):
    """What the harness and the tests rely on. See README.md, "The contract"."""

    num_blocks: int
    block_size: int
    max_seqs: int
    max_blocks_per_seq: int

    def can_allocate(self, num_blocks: int) -> bool: ...
    def allocate(self, seq_id: int, num_tokens: int) -> None: ...
    def append_slot(self, seq_id: int) -> tuple[int, int] | None: ...
    def fork(self, parent_id: int, child_id: int) -> None: ...
    def free(self, seq_id: int) -> None: ...
    def block_table(self, seq_id: int) -> Sequence[int]: ...
    def seq_len(self, seq_id: int) -> int: ...
    def num_free_blocks(self) -> int: ...
    def ref_count(self, block_id: int) -> int: ...
    def last_slot(self, seq_id: int) -> int: ...
    def decode_step(self, seq_ids: np.ndarray, cow_out: np.ndarray, slot_out: np.ndarray) -> int: ...
    def lookup(self, seq_ids: np.ndarray, slot_out: np.ndarray) -> None: ...
    def table_nbytes(self, seq_id: int) -> int | None: ...
