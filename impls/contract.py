"""The BlockManager contract every implementation follows, and its errors (in detail: docs/contract.md)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import numpy as np

# Status codes: kernels return them, raise_for turns them into exceptions, C++ gets them as a prelude.
OK = 0
E_SEQ_RANGE = -1
E_TOKENS = -2
E_TOO_LONG = -3
E_INACTIVE = -4
E_ACTIVE = -5
E_NO_BLOCKS = -6
E_DUPLICATE = -7
E_BLOCK_RANGE = -8
E_BUFFER = -9
E_COUNT = -10
E_HASH = -11
E_NOT_FULL = -12
E_SEALED = -13
E_TRACE = -20
E_OOM = -21


# Op codes of step and of trace files (scenarios.trace re-exports them); a0/a1 per op: docs/contract.md.
CAN_ALLOCATE = 0
ALLOCATE = 1
FORK = 2
FREE = 3
APPEND = 4
ALLOCATE_CACHED = 5
SEAL = 6
STEP_OPS = (CAN_ALLOCATE, ALLOCATE, FORK, FREE)
OP_NAMES = {CAN_ALLOCATE: "can_allocate", ALLOCATE: "allocate", FORK: "fork", FREE: "free", APPEND: "append",
            ALLOCATE_CACHED: "allocate_cached", SEAL: "seal"}  # in trace files; a pool op's is its contract method
OP_CODES = {name.upper(): code for code, name in OP_NAMES.items()}
STEP_EXTRA = 2


def status_codes() -> dict[str, int]:
    """Every status code by name: the one table, which the C++ code receives as a generated prelude."""
    return {name: value for name, value in globals().items() if name == "OK" or name.startswith("E_")}


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
    E_HASH: (ValueError, "invalid block hash for sequence {seq}: {why}"),
    E_NOT_FULL: (ValueError, "sequence {seq}'s last block is not full: only full blocks are cached"),
    E_SEALED: (ValueError, "sequence {seq}'s last block already carries a hash"),
}


class _Context(dict):
    def __missing__(self, key: str) -> str:
        return "?"


def raise_for(code: int, **context: object) -> None:
    """Raise the contract's exception for a negative status ``code``; ``context`` fills the message."""
    exc_type, template = _MESSAGES[code]
    exc = exc_type(template.format_map(_Context(context)))
    exc.code = code
    exc.detail = _detail(code, context)
    raise exc


def _detail(code: int, context: dict) -> int:
    value = context.get("need" if code == E_NO_BLOCKS else "seq", -1)
    return value if type(value) is int else -1


def fork_culprit(code: int, parent: int, child: int, max_seqs: int) -> int:
    """The sequence id a failed ``fork`` should name in its message."""
    if code == E_SEQ_RANGE:
        return parent if not 0 <= parent < max_seqs else child
    return child if code == E_ACTIVE else parent


def blocks_needed(tokens, shift):
    """Blocks holding ``tokens`` tokens when a block holds ``1 << shift``: the one ceiling division."""
    return (tokens + (1 << shift) - 1) >> shift


def blocks_for(num_tokens, block_size: int):
    """Blocks holding ``num_tokens`` tokens (an int or an integer array) when a block holds ``block_size``."""
    return blocks_needed(num_tokens, int(block_size).bit_length() - 1)


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


# Caps: no count, length or slot overflows the compiled designs' int32 and int64 (docs/contract.md, Limits).
MAX_NUM_BLOCKS = 2**31 - 1
MAX_SEQS = 2**31 - 1
MAX_SEQ_TOKENS = 2**31 - 1

MAX_TABLE_NBYTES = 2**40


def table_nbytes_problem(value: object) -> str:
    """What is wrong with ``value`` as an answer of ``table_nbytes`` ("" when nothing): see MAX_TABLE_NBYTES."""
    if value is None:
        return ""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        shown = repr(float(value)) if isinstance(value, float) else f"a value of type {type(value).__name__}"
        return f"table_nbytes returned {shown}, not an int byte count or None"
    if not 0 <= value <= MAX_TABLE_NBYTES:
        bits = abs(int(value)).bit_length()
        return f"table_nbytes returned {value if bits <= 64 else f'an int of {bits} bits'}, outside 0 to 2**40 bytes"
    return ""


@runtime_checkable
class BlockManager(Protocol):
    """What the harness and the tests rely on (docs/contract.md)."""

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
    def step(self, ops: np.ndarray, a0: np.ndarray, a1: np.ndarray, seq_ids: np.ndarray, status_out: np.ndarray,
             cow_out: np.ndarray, slot_out: np.ndarray) -> int:
        """One engine step in one call: the step's pool operations in order, then its decode batch."""
        ...


@runtime_checkable
class CachingBlockManager(BlockManager, Protocol):
    """A BlockManager with prefix caching, the optional part of the contract."""

    prefix_caching: bool

    def allocate_cached(self, seq_id: int, num_tokens: int, hashes: np.ndarray) -> int: ...
    def seal(self, seq_id: int, block_hash: int) -> bool: ...
    def num_cached_blocks(self) -> int: ...


def supports_prefix_caching(manager: object) -> bool:
    """Whether ``manager`` (an instance or a class) implements the prefix-caching part of the contract."""
    return getattr(manager, "prefix_caching", False) is True


MAX_HASH = 2**64 - 1
