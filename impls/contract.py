"""The BlockManager contract every implementation follows, and its errors.

Every public operation validates its input first and raises before touching state, so a failed call leaves
the manager exactly as it was. The checks run in a fixed order, the same in every implementation:

0. argument types (``TypeError``: ids, counts and lengths must be ``int`` or NumPy integers, not ``bool``;
   batch buffers must be int64 arrays), then buffer shapes, writeability, contiguity and overlap
   (``ValueError``), all in :mod:`impls.core.validation`;
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
E_HASH = -11  # ValueError: an invalid hash chain or block hash (prefix caching)
E_NOT_FULL = -12  # ValueError: sealing a sequence whose last block is not full (prefix caching)
E_SEALED = -13  # ValueError: sealing a block that already carries a hash (prefix caching)
# The native layer's own codes (impls/native, the harness's C++ replay): never raised by a contract call.
E_TRACE = -20  # a malformed trace slice, or output buffers too small for it
E_OOM = -21  # std::bad_alloc inside a C++ container


# Pool-operation codes of the whole-step entry point (:meth:`BlockManager.step`) and of trace files
# (:mod:`scenarios.trace` imports them from here); a0/a1 per op:
CAN_ALLOCATE = 0  # a0 = blocks asked for (a trace keeps in a1 the answer the scheduler got; step ignores a1)
ALLOCATE = 1  # a0 = row, a1 = tokens
FORK = 2  # a0 = parent row, a1 = child row
FREE = 3  # a0 = row
APPEND = 4  # a0 = row (a trace's decode appends; step takes them as its decode batch, never as an op)
# Prefix caching (trace format version 3; see CachingBlockManager). Reserved: step refuses them for now.
ALLOCATE_CACHED = 5  # a0 = row, a1 = tokens; the chain comes from the trace's hashes
SEAL = 6  # a0 = row, a1 = the answer seal() gave (1/0)
STEP_OPS = (CAN_ALLOCATE, ALLOCATE, FORK, FREE)  # what step accepts
OP_NAMES = {CAN_ALLOCATE: "can_allocate", ALLOCATE: "allocate", FORK: "fork", FREE: "free", APPEND: "append",
            ALLOCATE_CACHED: "allocate_cached", SEAL: "seal"}  # in trace files; a pool op's is its contract method
OP_CODES = {name.upper(): code for code, name in OP_NAMES.items()}
# status_out of step holds one entry per op, then the decode batch's status and its detail.
STEP_EXTRA = 2


def status_codes() -> dict[str, int]:
    """Every status code by name (``OK`` and the ``E_*`` constants above): the one table, which the C++ code
    receives as a generated prelude (:func:`impls.native.toolchain.contract_prelude`)."""
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
    """Raise the contract's exception for a negative status ``code``; ``context`` fills the message.

    The exception carries ``code`` and ``detail`` (the blocks needed for ``E_NO_BLOCKS``, else the sequence id
    named, -1 when none): what the whole-step entry point writes to its status buffer when a design's own
    methods raise."""
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
    """Blocks holding ``tokens`` tokens (an int or an integer array) when a block holds ``1 << shift`` tokens: the
    one ceiling division (shifts, not a divide; compiled code inlines :data:`impls.core.validation.
    blocks_needed_jit`, the same function compiled)."""
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

# ``table_nbytes`` answers None (the design cannot tell) or a byte count: an int (or NumPy integer, not bool) from 0
# to MAX_TABLE_NBYTES, a terabyte, more than any one sequence's table could hold on any machine.
MAX_TABLE_NBYTES = 2**40


def table_nbytes_problem(value: object) -> str:
    """What is wrong with ``value`` as an answer of ``table_nbytes`` ("" when nothing): see MAX_TABLE_NBYTES."""
    if value is None:
        return ""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):  # never the object's own repr
        shown = repr(float(value)) if isinstance(value, float) else f"a value of type {type(value).__name__}"
        return f"table_nbytes returned {shown}, not an int byte count or None"
    if not 0 <= value <= MAX_TABLE_NBYTES:
        bits = abs(int(value)).bit_length()
        return f"table_nbytes returned {value if bits <= 64 else f'an int of {bits} bits'}, outside 0 to 2**40 bytes"
    return ""


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
    def step(self, ops: np.ndarray, a0: np.ndarray, a1: np.ndarray, seq_ids: np.ndarray, status_out: np.ndarray,
             cow_out: np.ndarray, slot_out: np.ndarray) -> int:
        """One engine step in one call: the step's pool operations in order, then its decode batch.

        - ``ops``, ``a0``, ``a1``: 1-D integer arrays of one length ``m`` (int64 and C-contiguous: no copy; other
          integer dtypes are converted), the pool operations in a trace's encoding: ``CAN_ALLOCATE`` (a0 =
          blocks), ``ALLOCATE`` (a0 = row, a1 = tokens), ``FORK`` (a0 = parent, a1 = child), ``FREE`` (a0 =
          row); ``a1`` is ignored for ``CAN_ALLOCATE`` and ``FREE``. ``seq_ids``: the decode batch, as for
          ``decode_step``.
        - ``status_out``: int64[>= m + STEP_EXTRA], writeable. ``status_out[i]`` receives op ``i``'s status:
          for ``CAN_ALLOCATE`` its answer (1 or 0) or ``E_COUNT``, for the others 0 or the contract's negative
          code (the ``code`` the per-call method's exception carries). ``status_out[m]`` receives the decode
          batch's status (0 or a negative code), ``status_out[m + 1]`` its detail: the blocks needed for
          ``E_NO_BLOCKS``, else the offending sequence id (0 when the batch succeeded). ``cow_out`` and
          ``slot_out`` as for ``decode_step``.
        - Returns the number of copy-on-write pairs written to ``cow_out`` (>= 0), or the batch's negative code.
        - Atomicity is per operation, as if the engine had made each call itself and caught its exception: a
          failed op changes nothing and does not stop later ops (each sees the state the earlier ones left);
          the decode batch runs last, whatever the ops' statuses, and is atomic as ``decode_step`` is (on
          failure ``cow_out`` and ``slot_out`` are left as they were). The caller reads ``status_out``.
        - The call as a whole is refused before anything changes, with ``TypeError``/``ValueError``, when a
          buffer is wrong (type, dtype, shape, lengths that differ, too small, not writeable, outputs that
          overlap one another or an input) or an op code is not in :data:`STEP_OPS` (``APPEND`` belongs in
          ``seq_ids``; ``ALLOCATE_CACHED`` and ``SEAL`` are reserved for prefix caching and refused for now:
          their hash chains will come as further arguments).
        """
        ...


@runtime_checkable
class CachingBlockManager(BlockManager, Protocol):
    """A BlockManager with prefix caching, the optional part of the contract.

    A design that implements it sets the class attribute ``prefix_caching = True``; :class:`impls.core.reference.
    ReferenceModel` is its executable definition, and the differential tests hold every such design to it.

    - Block hashes are Python or NumPy integers in ``[1, 2**64)`` (0 is reserved: open-addressing tables use it as
      "empty"). A prompt's hash chain is a 1-D, C-contiguous ``uint64`` array with exactly ``num_tokens //
      block_size`` entries (its full blocks; hash ``i`` covers tokens ``[0, (i + 1) * block_size)``), no entry 0
      and no entry twice (a row holds a block once). Anything else is ``ValueError`` (``E_HASH``), checked after
      the sequence id and token count and before the row's state.
    - Each block carries at most one hash, and each hash is carried by at most one block (the cache maps hash ->
      block). A block that carries a hash is *cached*: in use (ref >= 1) or, with ref 0, *evictable*.
    - ``allocate_cached(seq, num_tokens, hashes)`` admits a request: it looks the chain up from the start; every
      hit block is shared (ref + 1; an evictable block leaves the evictable set); the first miss and every block
      after it are fresh. It needs ``fresh + evictable hits`` free blocks (else ``NoFreeBlocksError``, nothing
      changed). Order, which every design follows so that all make the same choices: (1) the hits, in chain
      order; (2) the fresh blocks, taken one by one (each may evict); (3) the fresh full blocks' hashes are
      inserted in chain order, except a hash another block already carries (that block keeps it; the fresh block
      stays uncached). Returns the prompt tokens served from the cache: ``hits * block_size``.
    - ``seal(seq, block_hash)`` gives the sequence's last block its hash once decode has filled it (the trace
      says when). Checks, in order: sequence range and state as ``append_slot``, the hash (``E_HASH``), the last
      block full (``E_NOT_FULL``), the last block without a hash yet (``E_SEALED``). Returns
      ``True`` when the block is now cached, ``False`` when another block already carries that hash (it stays
      uncached). Plain ``allocate`` and decode appends never cache anything; a partial block is never cached.
    - Taking a fresh block (admission, a decode append at a boundary, a copy-on-write) prefers a never-cached free
      block; only when there is none does it evict the least recently freed evictable block (dropping its hash).
    - ``free`` releases a sequence's blocks in reverse table order (its last block first); a block whose ref
      count reaches 0 joins the evictable set as the most recently freed if it is cached, else the never-cached
      free blocks. So a freed prompt's tail is evicted before its head, as in vLLM.
    - ``num_free_blocks()`` and ``can_allocate`` count never-cached free blocks plus evictable ones; ``ref_count``
      of an evictable block is 0; ``num_cached_blocks()`` counts blocks that carry a hash.
    - Copy-on-write and fork keep their meaning: a forked child shares its parent's blocks, cached or not; a
      copy-on-write only ever copies a partial (so never cached) last block.
    """

    prefix_caching: bool

    def allocate_cached(self, seq_id: int, num_tokens: int, hashes: np.ndarray) -> int: ...
    def seal(self, seq_id: int, block_hash: int) -> bool: ...
    def num_cached_blocks(self) -> int: ...


def supports_prefix_caching(manager: object) -> bool:
    """Whether ``manager`` (an instance or a class) implements the prefix-caching part of the contract."""
    return getattr(manager, "prefix_caching", False) is True


MAX_HASH = 2**64 - 1
