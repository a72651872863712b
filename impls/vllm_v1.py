"""Contender ``"vllm-v1"``: the block pool of vLLM v1, re-written from its published design.

Models ``vllm/v1/core/block_pool.py`` (``BlockPool.get_new_blocks`` / ``free_blocks``),
``vllm/v1/core/kv_cache_utils.py`` (``KVCacheBlock``, ``FreeKVCacheBlockQueue``) and
``vllm/v1/core/single_type_kv_cache_manager.py`` (``req_to_blocks``, ``free``):

* every block is a preallocated ``KVCacheBlock`` object holding its id, ref count and free-list links;
* free blocks form an intrusive doubly linked list between two sentinel (fake) blocks, so pool operations
  relink existing objects and allocate no Python object per block;
* each request maps to a Python list of ``KVCacheBlock`` objects;
* a request's blocks are freed tail first, so that its tail is nearest the front of the free queue (vLLM
  evicts the least useful cached block first, and a chain's tail is shared by the fewest prefixes).

Departures, to follow our contract: no prefix-cache hashing or eviction (blocks carry no hash); no
reserved null block (vLLM keeps block 0 aside as a placeholder; here all ``num_blocks`` blocks are usable);
and vLLM v1 has no fork or copy-on-write at all (parallel sampling shares prefixes through the prefix cache),
so ``fork`` raises ref counts as a prefix-cache hit (``BlockPool.touch``) would, and an append to a shared
last block copies it, as in our contract.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

from .interpreted import InterpretedBlockManager
from .validation import int_object_bytes


@dataclass(slots=True, eq=False)  # eq=False: a field-wise __eq__ would compare (and walk) the links
class KVCacheBlock:
    """Metadata of one physical block; the links belong to :class:`FreeKVCacheBlockQueue` alone."""

    block_id: int
    ref_cnt: int = 0
    prev_free_block: KVCacheBlock | None = None
    next_free_block: KVCacheBlock | None = None


class FreeKVCacheBlockQueue:
    """Doubly linked free list over existing blocks, bounded by sentinels so no operation branches on ends.

    Initially ordered by block id; ``popleft`` takes from the front, ``append`` returns to the back.
    """

    def __init__(self, blocks: list[KVCacheBlock]) -> None:
        self.num_free_blocks = len(blocks)
        self.fake_free_list_head = KVCacheBlock(-1)
        self.fake_free_list_tail = KVCacheBlock(-1)
        prev = self.fake_free_list_head
        for block in blocks:
            prev.next_free_block, block.prev_free_block = block, prev
            prev = block
        prev.next_free_block, self.fake_free_list_tail.prev_free_block = self.fake_free_list_tail, prev

    def popleft(self) -> KVCacheBlock:
        block = self.fake_free_list_head.next_free_block
        assert block is not self.fake_free_list_tail, "popleft on an empty free queue"
        self.fake_free_list_head.next_free_block = block.next_free_block
        block.next_free_block.prev_free_block = self.fake_free_list_head
        block.prev_free_block = block.next_free_block = None
        self.num_free_blocks -= 1
        return block

    def popleft_n(self, n: int) -> list[KVCacheBlock]:
        # One walk and one relink of the head, instead of n relinks.
        assert n <= self.num_free_blocks
        out = []
        block = self.fake_free_list_head.next_free_block
        for _ in range(n):
            out.append(block)
            nxt = block.next_free_block
            block.prev_free_block = block.next_free_block = None
            block = nxt
        self.fake_free_list_head.next_free_block, block.prev_free_block = block, self.fake_free_list_head
        self.num_free_blocks -= n
        return out

    def remove(self, block: KVCacheBlock) -> None:
        # O(1) removal from the middle is why vLLM does not use collections.deque (a prefix-cache hit
        # revives a free block); our contract never calls it, but the queue keeps the full interface.
        block.prev_free_block.next_free_block = block.next_free_block
        block.next_free_block.prev_free_block = block.prev_free_block
        block.prev_free_block = block.next_free_block = None
        self.num_free_blocks -= 1

    def append(self, block: KVCacheBlock) -> None:
        last = self.fake_free_list_tail.prev_free_block
        last.next_free_block, block.prev_free_block = block, last
        block.next_free_block, self.fake_free_list_tail.prev_free_block = self.fake_free_list_tail, block
        self.num_free_blocks += 1

    def append_n(self, blocks: list[KVCacheBlock]) -> None:
        last = self.fake_free_list_tail.prev_free_block
        for block in blocks:
            last.next_free_block, block.prev_free_block = block, last
            last = block
        last.next_free_block, self.fake_free_list_tail.prev_free_block = self.fake_free_list_tail, last
        self.num_free_blocks += len(blocks)


class VllmV1BlockManager(InterpretedBlockManager):
    """Contender ``"vllm-v1"``: vLLM v1's BlockPool and per-request block lists."""

    def __init__(self, num_blocks: int, block_size: int = 16, max_seqs: int = 256,
                 max_blocks_per_seq: int = 256) -> None:
        super().__init__(num_blocks, block_size, max_seqs, max_blocks_per_seq)
        self.blocks = [KVCacheBlock(i) for i in range(self.num_blocks)]
        self.free_block_queue = FreeKVCacheBlockQueue(self.blocks)
        self.req_to_blocks: dict[int, list[KVCacheBlock]] = {}

    def memory_bytes(self) -> int:
        """Per block a ``KVCacheBlock`` object, its id (an int object) and a list slot; per row a length slot."""
        per_block = 8 + sys.getsizeof(KVCacheBlock(0)) + int_object_bytes(self.num_blocks)
        return self.num_blocks * per_block + 8 * self.max_seqs

    def num_free_blocks(self) -> int:
        return self.free_block_queue.num_free_blocks

    def _new_block(self) -> KVCacheBlock:
        block = self.free_block_queue.popleft()
        block.ref_cnt = 1
        return block

    def _allocate(self, seq_id: int, num_blocks: int) -> None:
        blocks = self.free_block_queue.popleft_n(num_blocks)
        for block in blocks:
            block.ref_cnt = 1
        self.req_to_blocks[seq_id] = blocks

    def _last_shared(self, seq_id: int) -> bool:
        return self.req_to_blocks[seq_id][-1].ref_cnt > 1

    def _append(self, seq_id: int) -> tuple[int, int] | None:
        n = self._lens[seq_id]
        self._lens[seq_id] = n + 1
        blocks = self.req_to_blocks[seq_id]
        if n % self.block_size == 0:
            blocks.append(self._new_block())
            return None
        src = blocks[-1]
        if src.ref_cnt == 1:
            return None
        src.ref_cnt -= 1
        dst = blocks[-1] = self._new_block()
        return src.block_id, dst.block_id

    def _fork(self, parent_id: int, child_id: int) -> None:
        blocks = self.req_to_blocks[parent_id]
        for block in blocks:
            block.ref_cnt += 1
        self.req_to_blocks[child_id] = blocks.copy()

    def _free(self, seq_id: int) -> None:
        freed = []
        for block in reversed(self.req_to_blocks.pop(seq_id)):  # tail first: evicted first
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                freed.append(block)
        self.free_block_queue.append_n(freed)

    def _table_nbytes(self, seq_id: int) -> int:
        # The per-request list of block references (the block objects are the pool's, preallocated).
        return sys.getsizeof(self.req_to_blocks[seq_id])

    def _table(self, seq_id: int) -> list[int]:
        return [block.block_id for block in self.req_to_blocks[seq_id]]

    def _ref(self, block_id: int) -> int:
        return self.blocks[block_id].ref_cnt

    def _last_slot(self, seq_id: int) -> int:
        n = self._lens[seq_id] - 1
        block = self.req_to_blocks[seq_id][n // self.block_size]
        return block.block_id * self.block_size + n % self.block_size
