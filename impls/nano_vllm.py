"""Contender ``"nano-vllm"``: the BlockManager of nano-vllm, re-written from its published design.

Models ``nanovllm/engine/block_manager.py`` (``Block``, ``BlockManager``) of nano-vllm, a ~1,200-line
re-implementation of vLLM's engine:

* ``blocks: list[Block]``, one preallocated object per physical block, carrying its ref count;
* ``free_block_ids: deque[int]``, initially ``0, 1, 2, ...``; allocation takes the leftmost id and a
  freed id is appended on the right, so ids are reused first in, first out;
* ``used_block_ids: set[int]``, the blocks in use;
* a block table (a Python list of ids) per sequence; a sequence's blocks are released tail first.

Departures, to follow our contract: no prefix caching (nano-vllm hashes each full block with xxhash and
keeps ``hash_to_block_id``; blocks here carry neither a hash nor their token ids); allocation pops the
leftmost id where nano-vllm reads ``free_block_ids[0]`` and then calls ``free_block_ids.remove(id)``, the
same result without the scan; nano-vllm has no fork or copy-on-write (blocks are shared only through its
prefix cache), so ``fork`` raises ref counts and an append to a shared last block copies it, as in our
contract; block tables live here, per sequence row, instead of on nano-vllm's ``Sequence`` objects.
"""

from __future__ import annotations

import sys
from collections import deque

from .interpreted import InterpretedBlockManager
from .validation import int_object_bytes


class Block:
    """One physical block and the number of sequences referencing it."""

    __slots__ = ("block_id", "ref_count")

    def __init__(self, block_id: int) -> None:
        self.block_id = block_id
        self.ref_count = 0


class NanoVllmBlockManager(InterpretedBlockManager):
    """Contender ``"nano-vllm"``: nano-vllm's deque of free ids, used-id set and per-sequence lists."""

    def __init__(self, num_blocks: int, block_size: int = 16, max_seqs: int = 256,
                 max_blocks_per_seq: int = 256) -> None:
        super().__init__(num_blocks, block_size, max_seqs, max_blocks_per_seq)
        self.blocks = [Block(i) for i in range(self.num_blocks)]
        self.free_block_ids: deque[int] = deque(range(self.num_blocks))
        self.used_block_ids: set[int] = set()
        self.block_tables: list[list[int] | None] = [None] * self.max_seqs

    def memory_bytes(self) -> int:
        """Per block a ``Block`` object and its id, a list slot, and a deque slot with its own int object; per
        row a length and a table slot."""
        per_block = 16 + sys.getsizeof(Block(0)) + 2 * int_object_bytes(self.num_blocks)
        return self.num_blocks * per_block + 16 * self.max_seqs

    def num_free_blocks(self) -> int:
        return len(self.free_block_ids)

    def _allocate_block(self) -> int:
        block_id = self.free_block_ids.popleft()
        self.blocks[block_id].ref_count = 1
        self.used_block_ids.add(block_id)
        return block_id

    def _deallocate_block(self, block_id: int) -> None:
        self.used_block_ids.remove(block_id)
        self.free_block_ids.append(block_id)

    def _allocate(self, seq_id: int, num_blocks: int) -> None:
        self.block_tables[seq_id] = [self._allocate_block() for _ in range(num_blocks)]

    def _last_shared(self, seq_id: int) -> bool:
        return self.blocks[self.block_tables[seq_id][-1]].ref_count > 1

    def _append(self, seq_id: int) -> tuple[int, int] | None:
        n = self._lens[seq_id]
        self._lens[seq_id] = n + 1
        table = self.block_tables[seq_id]
        if n % self.block_size == 0:  # nano-vllm's may_append: the new token opens a block
            table.append(self._allocate_block())
            return None
        src = self.blocks[table[-1]]
        if src.ref_count == 1:
            return None
        src.ref_count -= 1
        dst = table[-1] = self._allocate_block()
        return src.block_id, dst

    def _fork(self, parent_id: int, child_id: int) -> None:
        table = self.block_tables[parent_id]
        blocks = self.blocks
        for block_id in table:
            blocks[block_id].ref_count += 1
        self.block_tables[child_id] = table.copy()

    def _free(self, seq_id: int) -> None:
        table = self.block_tables[seq_id]
        self.block_tables[seq_id] = None
        for block_id in reversed(table):  # nano-vllm's deallocate walks the table backwards
            block = self.blocks[block_id]
            block.ref_count -= 1
            if block.ref_count == 0:
                self._deallocate_block(block_id)

    def _table_nbytes(self, seq_id: int) -> int:
        # The per-sequence list plus its int objects (Block objects belong to the pool, not the table).
        table = self.block_tables[seq_id]
        return sys.getsizeof(table) + sum(sys.getsizeof(b) for b in table)

    def _table(self, seq_id: int) -> list[int]:
        return self.block_tables[seq_id].copy()

    def _ref(self, block_id: int) -> int:
        return self.blocks[block_id].ref_count

    def _last_slot(self, seq_id: int) -> int:
        n = self._lens[seq_id] - 1
        return self.block_tables[seq_id][n // self.block_size] * self.block_size + n % self.block_size
