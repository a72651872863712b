"""A tiny, obviously correct model of the contract.

The tests hold every implementation to it, and the scenario generator simulates its scheduler against it.
It re-states the rules on its own (it does not use :mod:`impls.validation`), so a mistake in the shared
checks cannot hide from the tests. Block ids are handed out in the order 0, 1, 2, ... and come back in
reverse table order; implementations may use any order (tests compare up to renaming of ids).
"""

from __future__ import annotations

from .contract import NoFreeBlocksError


class ReferenceModel:
    """The contract, written for clarity rather than speed. Not a contender: not in the registry."""

    def __init__(self, num_blocks: int, block_size: int = 16, max_seqs: int = 256,
                 max_blocks_per_seq: int = 256) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.max_seqs = max_seqs
        self.max_blocks_per_seq = max_blocks_per_seq
        self.free_ids = list(range(num_blocks - 1, -1, -1))
        self.refs = [0] * num_blocks
        self.tables: dict[int, list[int]] = {}
        self.lens: dict[int, int] = {}

    # -- checks, in the contract's order --------------------------------------------------------------------
    def _in_range(self, seq: int) -> None:
        if not 0 <= seq < self.max_seqs:
            raise ValueError(f"sequence id {seq} out of range")

    def _active(self, seq: int) -> None:
        self._in_range(seq)
        if seq not in self.tables:
            raise KeyError(seq)

    def _blocks(self, tokens: int) -> int:
        return -(-tokens // self.block_size)

    def _take(self) -> int:
        block = self.free_ids.pop()
        self.refs[block] = 1
        return block

    def _needs_block(self, seq: int) -> bool:
        n = self.lens[seq]
        return n % self.block_size == 0 or self.refs[self.tables[seq][-1]] > 1

    def _check_append(self, seq: int) -> None:
        self._active(seq)
        n = self.lens[seq]
        if n % self.block_size == 0 and n // self.block_size >= self.max_blocks_per_seq:
            raise ValueError("sequence full")

    # -- the contract ---------------------------------------------------------------------------------------
    def can_allocate(self, num_blocks: int) -> bool:
        if num_blocks < 0:
            raise ValueError("negative count")
        return len(self.free_ids) >= num_blocks

    def allocate(self, seq: int, num_tokens: int) -> None:
        self._in_range(seq)
        if num_tokens < 1:
            raise ValueError("num_tokens < 1")
        need = self._blocks(num_tokens)
        if need > self.max_blocks_per_seq:
            raise ValueError("prompt too long")
        if seq in self.tables:
            raise KeyError(seq)
        if need > len(self.free_ids):
            raise NoFreeBlocksError(need)
        self.tables[seq] = [self._take() for _ in range(need)]
        self.lens[seq] = num_tokens

    def append_slot(self, seq: int) -> tuple[int, int] | None:
        self._check_append(seq)
        if self._needs_block(seq) and not self.free_ids:
            raise NoFreeBlocksError(1)
        return self._append(seq)

    def _append(self, seq: int) -> tuple[int, int] | None:
        n = self.lens[seq]
        table = self.tables[seq]
        self.lens[seq] = n + 1
        if n % self.block_size == 0:
            table.append(self._take())
            return None
        src = table[-1]
        if self.refs[src] == 1:
            return None
        self.refs[src] -= 1
        table[-1] = self._take()
        return src, table[-1]

    def fork(self, parent: int, child: int) -> None:
        self._in_range(parent)
        self._in_range(child)
        if parent not in self.tables:
            raise KeyError(parent)
        if child in self.tables:
            raise KeyError(child)
        self.tables[child] = list(self.tables[parent])
        self.lens[child] = self.lens[parent]
        for block in self.tables[child]:
            self.refs[block] += 1

    def free(self, seq: int) -> None:
        self._active(seq)
        for block in reversed(self.tables.pop(seq)):
            self.refs[block] -= 1
            if self.refs[block] == 0:
                self.free_ids.append(block)
        del self.lens[seq]

    def block_table(self, seq: int) -> list[int]:
        self._active(seq)
        return list(self.tables[seq])

    def seq_len(self, seq: int) -> int:
        self._active(seq)
        return self.lens[seq]

    def num_free_blocks(self) -> int:
        return len(self.free_ids)

    def ref_count(self, block: int) -> int:
        if not 0 <= block < self.num_blocks:
            raise ValueError("block id out of range")
        return self.refs[block]

    def last_slot(self, seq: int) -> int:
        self._active(seq)
        n = self.lens[seq] - 1
        return self.tables[seq][n // self.block_size] * self.block_size + n % self.block_size

    def decode_step(self, seq_ids: list[int]) -> tuple[list[tuple[int, int]], list[int]]:
        """The batched step: validate all, reserve the worst case, then append in order.

        Returns (copy-on-write pairs, slots) rather than filling buffers: the model needs no speed.
        """
        seen = set()
        for seq in seq_ids:
            self._check_append(seq)
            if seq in seen:
                raise ValueError("duplicate")
            seen.add(seq)
        if sum(self._needs_block(s) for s in seq_ids) > len(self.free_ids):
            raise NoFreeBlocksError("step")
        cows = [cow for cow in (self._append(s) for s in seq_ids) if cow is not None]
        return cows, [self.last_slot(s) for s in seq_ids]

    def worst_case_blocks(self, seq_ids: list[int]) -> int:
        """Blocks the decode step over ``seq_ids`` reserves (boundary or shared last block)."""
        return sum(self._needs_block(s) for s in seq_ids)
