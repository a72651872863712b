"""Design B: a growable Python list per sequence, indexed by logical block."""

from __future__ import annotations

import sys

from impls.core.interpreted import InterpretedBlockManager
from impls.core.validation import int_object_bytes


class ListBlockManager(InterpretedBlockManager):
    """Design B (``"list"``)."""

    def __init__(self, num_blocks: int, block_size: int = 16, max_seqs: int = 256,
                 max_blocks_per_seq: int = 256) -> None:
        super().__init__(num_blocks, block_size, max_seqs, max_blocks_per_seq)
        self._refs = [0] * self.num_blocks
        self._tables: list[list[int] | None] = [None] * self.max_seqs

    def memory_bytes(self) -> int:
        return self.num_blocks * (16 + int_object_bytes(self.num_blocks)) + 16 * self.max_seqs

    def _allocate(self, seq_id: int, num_blocks: int) -> None:
        self._tables[seq_id] = [self._take() for _ in range(num_blocks)]

    def _last_shared(self, seq_id: int) -> bool:
        return self._refs[self._tables[seq_id][-1]] > 1

    def _append(self, seq_id: int) -> tuple[int, int] | None:
        n = self._lens[seq_id]
        self._lens[seq_id] = n + 1
        table = self._tables[seq_id]
        if n % self.block_size == 0:
            table.append(self._take())
            return None
        src = table[-1]
        if self._refs[src] == 1:
            return None
        self._refs[src] -= 1
        dst = table[-1] = self._take()
        return src, dst

    def _fork(self, parent_id: int, child_id: int) -> None:
        table = self._tables[parent_id]
        for block in table:
            self._refs[block] += 1
        self._tables[child_id] = table.copy()

    def _free(self, seq_id: int) -> None:
        table = self._tables[seq_id]
        self._tables[seq_id] = None
        for block in reversed(table):
            self._refs[block] -= 1
            if self._refs[block] == 0:
                self._free_list.append(block)

    def _table(self, seq_id: int) -> list[int]:
        return list(self._tables[seq_id])

    def _ref(self, block_id: int) -> int:
        return self._refs[block_id]

    def _table_nbytes(self, seq_id: int) -> int:
        table = self._tables[seq_id]
        return sys.getsizeof(table) + sum(sys.getsizeof(b) for b in table)

    def _last_slot(self, seq_id: int) -> int:
        n = self._lens[seq_id] - 1
        return self._tables[seq_id][n // self.block_size] * self.block_size + n % self.block_size
