"""A toy BlockManager for kvblock-bench: per-sequence ``array('H')`` tables and a deque of free block ids.

It follows the contract of ``impls.contract`` (see kvblock-bench's docs/contract.md): every operation
checks its arguments in the contract's order before changing anything, and ``decode_step`` validates and
reserves the whole step first, so it never fails half-way.
"""

from __future__ import annotations

import operator
from array import array
from collections import deque

import numpy as np

from impls.contract import NoFreeBlocksError
from impls.core.reference import append_token


def _int(value: object, name: str) -> int:
    if isinstance(value, bool):
        raise TypeError(f"{name} must be an integer, got a bool")
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an integer, got {type(value).__name__}") from None


class ToyBlockManager:
    """Design "toy": one ``array('H')`` of block ids per sequence, free ids in a deque, ref counts in a list."""

    def __init__(self, num_blocks: int, block_size: int = 16, max_seqs: int = 256,
                 max_blocks_per_seq: int = 256) -> None:
        for name, value in (("num_blocks", num_blocks), ("block_size", block_size), ("max_seqs", max_seqs),
                            ("max_blocks_per_seq", max_blocks_per_seq)):
            if _int(value, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        if block_size & (block_size - 1) or num_blocks > 65536:
            raise ValueError("block_size must be a power of two and num_blocks <= 65536 (uint16 ids)")
        self.num_blocks, self.block_size = int(num_blocks), int(block_size)
        self.max_seqs, self.max_blocks_per_seq = int(max_seqs), int(max_blocks_per_seq)
        self.free_ids = deque(range(self.num_blocks))
        self.refs = [0] * self.num_blocks
        self.tables: dict[int, array] = {}
        self.lens: dict[int, int] = {}

    # -- checks, in the contract's order ----------------------------------------------------------------
    def _seq(self, seq: object) -> int:
        seq = _int(seq, "seq_id")
        if not 0 <= seq < self.max_seqs:
            raise ValueError(f"sequence id {seq} is outside [0, {self.max_seqs})")
        return seq

    def _active(self, seq: object) -> int:
        seq = self._seq(seq)
        if seq not in self.tables:
            raise KeyError(f"sequence {seq} is not active")
        return seq

    def _needs_block(self, seq: int) -> bool:
        return self.lens[seq] % self.block_size == 0 or self.refs[self.tables[seq][-1]] > 1

    def _check_append(self, seq: object) -> int:
        seq = self._active(seq)
        n = self.lens[seq]
        if n % self.block_size == 0 and n // self.block_size >= self.max_blocks_per_seq:
            raise ValueError(f"sequence {seq} would need more than {self.max_blocks_per_seq} blocks")
        return seq

    def _take(self) -> int:
        block = self.free_ids.popleft()
        self.refs[block] = 1
        return block

    # -- the contract -----------------------------------------------------------------------------------
    def can_allocate(self, num_blocks: int) -> bool:
        if _int(num_blocks, "num_blocks") < 0:
            raise ValueError(f"num_blocks must be >= 0, got {num_blocks}")
        return len(self.free_ids) >= num_blocks

    def allocate(self, seq_id: int, num_tokens: int) -> None:
        seq, tokens = self._seq(seq_id), _int(num_tokens, "num_tokens")
        if tokens < 1:
            raise ValueError(f"num_tokens must be >= 1, got {tokens}")
        need = -(-tokens // self.block_size)
        if need > self.max_blocks_per_seq:
            raise ValueError(f"sequence {seq} would need more than {self.max_blocks_per_seq} blocks")
        if seq in self.tables:
            raise KeyError(f"sequence {seq} is already active")
        if need > len(self.free_ids):
            raise NoFreeBlocksError(f"need {need} free blocks, pool has {len(self.free_ids)}")
        self.tables[seq] = array("H", (self._take() for _ in range(need)))
        self.lens[seq] = tokens

    def append_slot(self, seq_id: int) -> tuple[int, int] | None:
        seq = self._check_append(seq_id)
        if self._needs_block(seq) and not self.free_ids:
            raise NoFreeBlocksError("need 1 free block, pool has 0")
        return self._append(seq)

    _append = append_token  # the contract's reference model appends a token exactly so: shared, not copied

    def fork(self, parent_id: int, child_id: int) -> None:
        parent, child = self._seq(parent_id), self._seq(child_id)
        if parent not in self.tables:
            raise KeyError(f"sequence {parent} is not active")
        if child in self.tables:
            raise KeyError(f"sequence {child} is already active")
        self.tables[child] = array("H", self.tables[parent])
        self.lens[child] = self.lens[parent]
        for block in self.tables[child]:
            self.refs[block] += 1

    def free(self, seq_id: int) -> None:
        seq = self._active(seq_id)
        for block in reversed(self.tables.pop(seq)):
            self.refs[block] -= 1
            if self.refs[block] == 0:
                self.free_ids.append(block)
        del self.lens[seq]

    def block_table(self, seq_id: int) -> list[int]:
        return list(self.tables[self._active(seq_id)])

    def seq_len(self, seq_id: int) -> int:
        return self.lens[self._active(seq_id)]

    def num_free_blocks(self) -> int:
        return len(self.free_ids)

    def ref_count(self, block_id: int) -> int:
        block = _int(block_id, "block_id")
        if not 0 <= block < self.num_blocks:
            raise ValueError(f"block id {block} is outside [0, {self.num_blocks})")
        return self.refs[block]

    def last_slot(self, seq_id: int) -> int:
        seq = self._active(seq_id)
        n = self.lens[seq] - 1
        return self.tables[seq][n // self.block_size] * self.block_size + n % self.block_size

    def _check_batch(self, seq_ids: np.ndarray, *outs: tuple[np.ndarray, tuple]) -> list[int]:
        if not isinstance(seq_ids, np.ndarray) or seq_ids.ndim != 1 or seq_ids.dtype.kind not in "iu":
            raise TypeError("seq_ids must be a 1-D integer array")
        n = len(seq_ids)
        for out, tail in outs:
            if not isinstance(out, np.ndarray) or out.dtype != np.int64 or out.shape[1:] != tail:
                raise TypeError(f"output buffers must be int64 arrays of shape (n, {tail})")
            if not out.flags.writeable or not out.flags.c_contiguous or out.shape[0] < n:
                raise ValueError(f"output buffers must be writable, C-contiguous and hold {n} entries")
        return [int(s) for s in seq_ids]

    def decode_step(self, seq_ids: np.ndarray, cow_out: np.ndarray, slot_out: np.ndarray) -> int:
        seqs = self._check_batch(seq_ids, (cow_out, (2,)), (slot_out, ()))
        for seq in seqs:
            self._check_append(seq)
        if len(set(seqs)) != len(seqs):
            raise ValueError("a sequence appears twice in one decode step")
        need = sum(self._needs_block(seq) for seq in seqs)
        if need > len(self.free_ids):
            raise NoFreeBlocksError(f"need {need} free blocks, pool has {len(self.free_ids)}")
        cows = 0
        for i, seq in enumerate(seqs):
            pair = self._append(seq)
            if pair is not None:
                cow_out[cows] = pair
                cows += 1
            slot_out[i] = self.last_slot(seq)
        return cows

    def lookup(self, seq_ids: np.ndarray, slot_out: np.ndarray) -> None:
        seqs = self._check_batch(seq_ids, (slot_out, ()))
        for seq in seqs:
            self._active(seq)
        for i, seq in enumerate(seqs):
            slot_out[i] = self.last_slot(seq)

    def table_nbytes(self, seq_id: int) -> int | None:
        return self.tables[self._active(seq_id)].itemsize * len(self.tables[seq_id])


class LeakyToyBlockManager(ToyBlockManager):
    """Deliberately broken: ``free`` never returns a sequence's last block to the pool (a one-block leak per
    request). ``kvblock-bench check toy-leaky`` finds it and prints the shortest call sequence that shows it."""

    def free(self, seq_id: int) -> None:
        seq = self._active(seq_id)
        table = self.tables.pop(seq)
        for block in reversed(table):
            self.refs[block] -= 1
            if self.refs[block] == 0 and block != table[-1]:
                self.free_ids.append(block)
        del self.lens[seq]
