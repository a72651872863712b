"""Contract plumbing shared by the compiled (Numba) designs.

A compiled design keeps its whole state in NumPy arrays or Numba typed containers, exposed as the tuple
``self.state``, and provides :class:`Kernels`: ``@njit`` functions taking ``*state`` first. The per-call
methods below cross into compiled code once per contract call (paying Numba's dispatch, about 130 ns per
array argument on our machines); the harness's compiled replay calls the same kernels from compiled code
with no dispatch at all. Kernels validate their input and return status codes (see
:mod:`impls.contract`), so both paths enforce the same rules.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from .base import ManagerBase
from .contract import E_BUFFER, E_NO_BLOCKS, blocks_for, fork_culprit
from .validation import batch_args, block_arg, check_active, count_arg, lookup_args, seq_arg, tokens_arg


class Kernels(NamedTuple):
    """A compiled design's operations; each takes ``*state`` first and returns a status code."""

    can_allocate: Callable  # (n) -> 1 | 0 | <0
    allocate: Callable  # (seq, num_tokens) -> 0 | <0
    append: Callable  # (seq) -> (1 if copy-on-write else 0 | <0, src, dst)
    fork: Callable  # (parent, child) -> 0 | <0
    free: Callable  # (seq) -> 0 | <0
    decode_step: Callable  # (seq_ids, cow_out, slot_out) -> (number of CoWs | <0, detail)
    lookup: Callable  # (seq_ids, slot_out) -> (0 | <0, detail)
    last_slot: Callable  # (seq) -> slot | <0



class CachingKernels(NamedTuple):
    """:class:`Kernels` plus the prefix-caching operations (:class:`impls.contract.CachingBlockManager`), for
    designs whose kernels provide them (the compiled replay then runs caching traces)."""

    can_allocate: Callable
    allocate: Callable
    append: Callable
    fork: Callable
    free: Callable
    decode_step: Callable
    lookup: Callable
    last_slot: Callable
    allocate_cached: Callable  # (seq, num_tokens, chain uint64[:]) -> tokens served from the cache | <0
    seal: Callable  # (seq, block_hash as a 64-bit integer) -> 1 | 0 | <0

class CompiledBlockManager(ManagerBase):
    """Base class of compiled designs. Subclasses set ``kernels``, ``self.state`` and ``self._lens``."""

    kernels: Kernels
    state: tuple
    _lens: np.ndarray

    def can_allocate(self, num_blocks: int) -> bool:
        """Whether the free pool holds at least ``num_blocks`` blocks."""
        if type(num_blocks) is not int or not 0 <= num_blocks <= self.num_blocks:
            if count_arg(num_blocks) > self.num_blocks:  # never; and kept out of the kernel's int64
                return False
            num_blocks = int(num_blocks)
        return self.kernels.can_allocate(*self.state, num_blocks) == 1

    def allocate(self, seq_id: int, num_tokens: int) -> None:
        """Give a new sequence ``ceil(num_tokens / block_size)`` fresh blocks with ref count 1."""
        # Only Python ints in range reach the kernel (Numba would type others, or wrap them); the hot path
        # inlines the range checks of seq_arg and tokens_arg.
        if type(seq_id) is not int or not 0 <= seq_id < self.max_seqs:
            seq_id = seq_arg(seq_id, self.max_seqs)
        if type(num_tokens) is not int or not 0 < num_tokens <= self.max_tokens:
            num_tokens = tokens_arg(num_tokens, seq_id, self.max_blocks_per_seq, self.block_shift)
        rc = self.kernels.allocate(*self.state, seq_id, num_tokens)
        if rc:
            self._fail(rc, seq_id, num_tokens=num_tokens, need=blocks_for(num_tokens, self.block_size))

    def append_slot(self, seq_id: int) -> tuple[int, int] | None:
        """Add one token; returns ``(src, dst)`` when the shared last block was copied, else None."""
        if type(seq_id) is not int or not 0 <= seq_id < self.max_seqs:  # (the hot path inlines seq_arg)
            seq_id = seq_arg(seq_id, self.max_seqs)
        rc, src, dst = self.kernels.append(*self.state, seq_id)
        if rc < 0:
            self._fail(rc, seq_id, need=1)
        return (src, dst) if rc else None

    def fork(self, parent_id: int, child_id: int) -> None:
        """The child gets the parent's table and length; every block's ref count rises by one."""
        parent_id, child_id = seq_arg(parent_id, self.max_seqs), seq_arg(child_id, self.max_seqs)
        rc = self.kernels.fork(*self.state, parent_id, child_id)
        if rc:
            self._fail(rc, fork_culprit(rc, parent_id, child_id, self.max_seqs))

    def free(self, seq_id: int) -> None:
        """Drop one reference to each block; blocks reaching zero return to the pool."""
        if type(seq_id) is not int or not 0 <= seq_id < self.max_seqs:
            seq_id = seq_arg(seq_id, self.max_seqs)
        rc = self.kernels.free(*self.state, seq_id)
        if rc:
            self._fail(rc, seq_id)

    def last_slot(self, seq_id: int) -> int:
        """Physical KV slot (``block * block_size + offset``) of the sequence's newest token."""
        if type(seq_id) is not int or not 0 <= seq_id < self.max_seqs:  # (the hot path inlines seq_arg)
            seq_id = seq_arg(seq_id, self.max_seqs)
        slot = self.kernels.last_slot(*self.state, seq_id)
        if slot < 0:
            self._fail(slot, seq_id)
        return slot

    def decode_step(self, seq_ids: np.ndarray, cow_out: np.ndarray, slot_out: np.ndarray) -> int:
        """One decode step in one compiled call; same semantics as the interpreted designs' step.

        ``seq_ids`` int64[n], ``cow_out`` int64[n, 2], ``slot_out`` int64[n]; returns the number of CoWs. The
        buffers are checked here, once (the kernel trusts them): see :func:`impls.validation.batch_args`.
        """
        seq_ids = batch_args(seq_ids, cow_out, slot_out, self.max_seqs)
        rc, detail = self.kernels.decode_step(*self.state, seq_ids, cow_out, slot_out)
        if rc < 0:
            self._fail_batch(rc, detail, seq_ids, min(len(cow_out), len(slot_out)))
        return rc

    def lookup(self, seq_ids: np.ndarray, slot_out: np.ndarray) -> None:
        """Write the newest token's physical slot of each sequence to ``slot_out`` (read-only)."""
        seq_ids = lookup_args(seq_ids, slot_out, self.max_seqs)
        rc, detail = self.kernels.lookup(*self.state, seq_ids, slot_out)
        if rc < 0:
            self._fail_batch(rc, detail, seq_ids, len(slot_out))

    def _fail_batch(self, rc: int, detail: int, seq_ids: np.ndarray, capacity: int) -> None:
        if rc == E_NO_BLOCKS:
            self._fail(rc, need=detail)
        if rc == E_BUFFER:
            self._fail(rc, capacity=capacity, need=len(seq_ids))
        self._fail(rc, int(seq_ids[detail]))

    # -- inspection (plain Python over the arrays: not on any hot path) --------------------------------------
    def _check_active(self, seq_id: object) -> int:
        seq_id = seq_arg(seq_id, self.max_seqs)
        rc = check_active(self._lens, seq_id)
        if rc:
            self._fail(rc, seq_id)
        return seq_id

    def seq_len(self, seq_id: int) -> int:
        """Length of the sequence in tokens."""
        seq_id = self._check_active(seq_id)
        return int(self._lens[seq_id])

    def block_table(self, seq_id: int) -> list[int]:
        """Physical block ids of the sequence in logical order (a copy)."""
        seq_id = self._check_active(seq_id)
        return self._table(seq_id)

    def table_nbytes(self, seq_id: int) -> int | None:
        """Bytes of block-table state held for this sequence (what is counted is design-specific and said in
        each design's ``_table_nbytes``); None where the design cannot tell."""
        seq_id = self._check_active(seq_id)
        return self._table_nbytes(seq_id)

    def ref_count(self, block_id: int) -> int:
        """References held on a physical block (0 when it is in the free pool)."""
        return self._ref(block_arg(block_id, self.num_blocks))

    def _table(self, seq_id: int) -> list[int]:  # pragma: no cover - every design overrides it
        raise NotImplementedError

    def _ref(self, block_id: int) -> int:  # pragma: no cover - every design overrides it
        raise NotImplementedError
