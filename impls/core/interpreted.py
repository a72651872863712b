"""Contract plumbing shared by the interpreted (pure-Python) designs."""

from __future__ import annotations

import numpy as np

from impls.contract import (
    E_DUPLICATE,
    E_NO_BLOCKS,
    blocks_for,
    fork_culprit,
)
from impls.core.base import ManagerBase
from impls.core.validation import (
    batch_args,
    check_active,
    check_allocate,
    check_append,
    check_fork,
    count_arg,
    lookup_args,
    seq_arg,
    tokens_arg,
)


def append_as_batch(self, seq_id: int) -> tuple[int, int] | None:
    """``_append`` (a method) of a design whose unit of work is the batched step ``self._engine_step``: a batch of
    one; the copy-on-write pair, or None."""
    cow_out = np.zeros((1, 2), dtype=np.int64)
    slot_out = np.zeros(1, dtype=np.int64)
    if self._engine_step(np.array([seq_id], dtype=np.int64), [seq_id], cow_out, slot_out):
        return int(cow_out[0, 0]), int(cow_out[0, 1])
    return None


class InterpretedBlockManager(ManagerBase):
    """Base class: validates every call, then hands the work to the design's primitives."""

    kernels = None
    _refs: dict[int, int] | list[int]

    def __init__(
        self, num_blocks: int, block_size: int = 16, max_seqs: int = 256, max_blocks_per_seq: int = 256
    ) -> None:
        super().__init__(num_blocks, block_size, max_seqs, max_blocks_per_seq)
        self._lens = [0] * self.max_seqs  # tokens per row; 0 marks an inactive row
        self._free_list = list(range(self.num_blocks - 1, -1, -1))

    def num_free_blocks(self) -> int:
        return len(self._free_list)

    def _take(self) -> int:
        """A block from the pool, with ref count 1."""
        block = self._free_list.pop()
        self._refs[block] = 1
        return block

    def _active(self, seq_id: object) -> int:
        """The id of an active sequence as a Python int, else the contract's exception."""
        if type(seq_id) is not int:
            seq_id = seq_arg(seq_id, self.max_seqs)
        rc = check_active(self._lens, seq_id)
        if rc:
            self._fail(rc, seq_id)
        return seq_id

    def _needs_block(self, seq_id: int) -> bool:
        return self._lens[seq_id] % self.block_size == 0 or self._last_shared(seq_id)

    def can_allocate(self, num_blocks: int) -> bool:
        """Whether the free pool holds at least ``num_blocks`` blocks."""
        if type(num_blocks) is not int or num_blocks < 0:
            num_blocks = count_arg(num_blocks)
        return self.num_free_blocks() >= num_blocks

    def allocate(self, seq_id: int, num_tokens: int) -> None:
        """Give a new sequence ``ceil(num_tokens / block_size)`` fresh blocks with ref count 1."""
        if type(seq_id) is not int:
            seq_id = seq_arg(seq_id, self.max_seqs)
        if type(num_tokens) is not int:
            num_tokens = tokens_arg(num_tokens, seq_id, self.max_blocks_per_seq, self.block_shift)
        rc = check_allocate(self._lens, self.max_blocks_per_seq, self.block_shift, seq_id, num_tokens)
        if rc:
            self._fail(rc, seq_id, num_tokens=num_tokens)
        need = blocks_for(num_tokens, self.block_size)
        if need > self.num_free_blocks():
            self._fail(E_NO_BLOCKS, seq_id, need=need)
        self._admit_tokens = num_tokens
        self._allocate(seq_id, need)
        self._lens[seq_id] = num_tokens

    def append_slot(self, seq_id: int) -> tuple[int, int] | None:
        """Add one token; returns ``(src, dst)`` when the shared last block was copied, else None."""
        if type(seq_id) is not int:
            seq_id = seq_arg(seq_id, self.max_seqs)
        rc = check_append(self._lens, self.max_blocks_per_seq, self.block_shift, seq_id)
        if rc:
            self._fail(rc, seq_id)
        if self.num_free_blocks() == 0 and self._needs_block(seq_id):
            self._fail(E_NO_BLOCKS, seq_id, need=1)
        return self._append(seq_id)

    def fork(self, parent_id: int, child_id: int) -> None:
        """The child gets the parent's table and length; every block's ref count rises by one."""
        if type(parent_id) is not int or type(child_id) is not int:
            parent_id, child_id = seq_arg(parent_id, self.max_seqs), seq_arg(child_id, self.max_seqs)
        rc = check_fork(self._lens, parent_id, child_id)
        if rc:
            self._fail(rc, fork_culprit(rc, parent_id, child_id, self.max_seqs))
        self._fork(parent_id, child_id)
        self._lens[child_id] = self._lens[parent_id]

    def free(self, seq_id: int) -> None:
        """Drop one reference to each block; blocks reaching zero return to the pool."""
        if type(seq_id) is not int:
            seq_id = seq_arg(seq_id, self.max_seqs)
        rc = check_active(self._lens, seq_id)
        if rc:
            self._fail(rc, seq_id)
        self._free(seq_id)
        self._lens[seq_id] = 0

    def last_slot(self, seq_id: int) -> int:
        """Physical KV slot (``block * block_size + offset``) of the sequence's newest token."""
        if type(seq_id) is not int:
            seq_id = seq_arg(seq_id, self.max_seqs)
        rc = check_active(self._lens, seq_id)
        if rc:
            self._fail(rc, seq_id)
        return self._last_slot(seq_id)

    def decode_step(self, seq_ids: np.ndarray, cow_out: np.ndarray, slot_out: np.ndarray) -> int:
        """One decode step: append a token to each sequence in order and write its slot to ``slot_out``."""
        return self._decode(seq_ids, self._decode_args(seq_ids, cow_out, slot_out), cow_out, slot_out)

    def _decode_args(self, seq_ids: np.ndarray, cow_out: np.ndarray, slot_out: np.ndarray) -> list[int]:
        """The contract's checks of a decode step (its arguments, each row's append, no row twice, the pool's room),
        before anything changes; the ids as a list. The calibration's adapters make the same checks through it."""
        ids = batch_args(seq_ids, cow_out, slot_out, self.max_seqs).tolist()
        n = len(ids)
        lens, max_blocks, shift = self._lens, self.max_blocks_per_seq, self.block_shift
        seen = set()
        for s in ids:
            rc = check_append(lens, max_blocks, shift, s)
            if rc:
                self._fail(rc, s)
            if s in seen:
                self._fail(E_DUPLICATE, s)
            seen.add(s)
        if n > self.num_free_blocks():
            need = sum(self._needs_block(s) for s in ids)
            if need > self.num_free_blocks():
                self._fail(E_NO_BLOCKS, need=need)
        return ids

    def _decode(self, seq_ids: np.ndarray, ids: list[int], cow_out: np.ndarray, slot_out: np.ndarray) -> int:
        """The validated step: one append per sequence, in order (a batched design overrides it)."""
        cows = []
        slots = []
        for s in ids:
            cow = self._append(s)
            if cow is not None:
                cows.append(cow)
            slots.append(self._last_slot(s))
        slot_out[: len(ids)] = slots
        if cows:
            cow_out[: len(cows)] = cows
        return len(cows)

    def lookup(self, seq_ids: np.ndarray, slot_out: np.ndarray) -> None:
        """Write the newest token's physical slot of each sequence to ``slot_out`` (read-only)."""
        ids = lookup_args(seq_ids, slot_out, self.max_seqs).tolist()
        for s in ids:
            rc = check_active(self._lens, s)
            if rc:
                self._fail(rc, s)
        slot_out[: len(ids)] = [self._last_slot(s) for s in ids]
