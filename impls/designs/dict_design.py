"""Design A: a hash map per sequence (logical block index -> physical block id), as a prototype writes it."""

from __future__ import annotations

import sys

from impls.core.interpreted import InterpretedBlockManager
from impls.core.validation import int_object_bytes


class HashMapTables:
    """Reading design A's containers (shared with its twin): a hash map per row, ref counts of blocks in use."""

    def _table(self, seq_id: int) -> list[int]:
        table = self._tables[seq_id]
        return [table[i] for i in range(len(table))]

    def _ref(self, block_id: int) -> int:
        return self._refs.get(block_id, 0)


class DictBlockManager(HashMapTables, InterpretedBlockManager):
    """Design A (``"dict"``)."""

    def __init__(self, num_blocks: int, block_size: int = 16, max_seqs: int = 256,
                 max_blocks_per_seq: int = 256) -> None:
        super().__init__(num_blocks, block_size, max_seqs, max_blocks_per_seq)
        self._refs: dict[int, int] = {}
        self._tables: dict[int, dict[int, int]] = {}

    def memory_bytes(self) -> int:
        return self.num_blocks * (8 + int_object_bytes(self.num_blocks)) + 8 * self.max_seqs

    def _allocate(self, seq_id: int, num_blocks: int) -> None:
        self._tables[seq_id] = {i: self._take() for i in range(num_blocks)}

    def _last_shared(self, seq_id: int) -> bool:
        table = self._tables[seq_id]
        return self._refs[table[len(table) - 1]] > 1

    def _append(self, seq_id: int) -> tuple[int, int] | None:
        n = self._lens[seq_id]
        self._lens[seq_id] = n + 1
        table = self._tables[seq_id]
        if n % self.block_size == 0:
            table[len(table)] = self._take()
            return None
        last = len(table) - 1
        src = table[last]
        if self._refs[src] == 1:
            return None
        self._refs[src] -= 1
        dst = table[last] = self._take()
        return src, dst

    def _fork(self, parent_id: int, child_id: int) -> None:
        table = self._tables[parent_id]
        for block in table.values():
            self._refs[block] += 1
        self._tables[child_id] = dict(table)

    def _free(self, seq_id: int) -> None:
        table = self._tables.pop(seq_id)
        for i in range(len(table) - 1, -1, -1):
            block = table[i]
            if self._refs[block] == 1:
                del self._refs[block]
                self._free_list.append(block)
            else:
                self._refs[block] -= 1

    def _table_nbytes(self, seq_id: int) -> int:
        table = self._tables[seq_id]
        return sys.getsizeof(table) + sum(sys.getsizeof(k) + sys.getsizeof(v) for k, v in table.items())

    def _last_slot(self, seq_id: int) -> int:
        n = self._lens[seq_id] - 1
        return self._tables[seq_id][n // self.block_size] * self.block_size + n % self.block_size
