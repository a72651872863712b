"""vLLM v1's block pool, re-written from vLLM 0.33.0, for the vLLM contenders."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True, eq=False)  # a field-wise __eq__ would compare (and walk) the links
class KVCacheBlock:
    """Metadata of one physical block; the links belong to :class:`FreeKVCacheBlockQueue` alone."""

    block_id: int
    ref_cnt: int = 0
    pool: BlockPool | None = field(default=None, repr=False, kw_only=True)
    _block_hash: object = None
    prev_free_block: KVCacheBlock | None = None
    next_free_block: KVCacheBlock | None = None
    is_null: bool = False

    @property
    def block_hash(self) -> object:
        return self._block_hash

    def set_block_hash(self, key: object) -> None:
        assert self._block_hash is None, "the block already carries a hash"
        self._block_hash = key

    def reset_hash(self) -> None:
        self._block_hash = None


class FreeKVCacheBlockQueue:
    """Doubly linked free list over existing blocks, bounded by sentinels so no operation branches on ends."""

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
        if n == 0:
            return []
        assert self.num_free_blocks >= n
        self.num_free_blocks -= n
        head = self.fake_free_list_head
        block = head.next_free_block
        if n == 1:
            assert block is not None
            nxt = block.next_free_block
            block.prev_free_block = block.next_free_block = None
            if nxt is not None:
                head.next_free_block, nxt.prev_free_block = nxt, head
            return [block]
        out = []
        for _ in range(n):
            assert block is not None
            out.append(block)
            nxt = block.next_free_block
            block.prev_free_block = block.next_free_block = None
            block = nxt
        if block is not None:
            head.next_free_block, block.prev_free_block = block, head
        return out

    def remove(self, block: KVCacheBlock) -> None:
        prev, nxt = block.prev_free_block, block.next_free_block
        if prev is None or nxt is None:  # pragma: no cover - a block outside the queue
            raise RuntimeError(f"remove() of block {block.block_id}, which is not in the free queue")
        prev.next_free_block, nxt.prev_free_block = nxt, prev
        block.prev_free_block = block.next_free_block = None
        self.num_free_blocks -= 1

    def prepend_n(self, blocks: list[KVCacheBlock]) -> None:
        if len(blocks) == 0:
            return
        head = self.fake_free_list_head
        first = head.next_free_block
        assert first is not None
        prev = head
        for block in blocks:
            block.prev_free_block, prev.next_free_block = prev, block
            prev = block
        prev.next_free_block, first.prev_free_block = first, prev
        self.num_free_blocks += len(blocks)

    def append_n(self, blocks: list[KVCacheBlock]) -> None:
        if len(blocks) == 0:
            return
        last = self.fake_free_list_tail.prev_free_block
        assert last is not None
        for block in blocks:
            last.next_free_block, block.prev_free_block = block, last
            last = block
        last.next_free_block, self.fake_free_list_tail.prev_free_block = self.fake_free_list_tail, last
        self.num_free_blocks += len(blocks)


def trim_null_head(blocks: list[KVCacheBlock]) -> list[KVCacheBlock]:
    """``blocks`` without its leading null blocks (a sliding window's skipped prefix; never any here)."""
    if not blocks or not blocks[0].is_null:
        return blocks
    return [b for b in blocks if not b.is_null]  # pragma: no cover - full attention never nulls a block


class BlockPool:
    """``num_gpu_blocks`` preallocated blocks, block 0 kept aside as the null block."""

    def __init__(self, num_gpu_blocks: int, enable_caching: bool = False, hash_block_size: int = 16) -> None:
        self.num_gpu_blocks = num_gpu_blocks
        self.enable_caching = enable_caching
        self.hash_block_size = hash_block_size
        self.metrics_collector = None
        self._reuse_watchers: dict[int, object] = {}
        self.blocks = [KVCacheBlock(i, pool=self) for i in range(num_gpu_blocks)]
        self.free_block_queue = FreeKVCacheBlockQueue(self.blocks)
        self.null_block = self.free_block_queue.popleft()
        self.null_block.is_null = True

    def get_num_free_blocks(self) -> int:
        return self.free_block_queue.num_free_blocks

    def get_new_blocks(self, num_blocks: int) -> list[KVCacheBlock]:
        if num_blocks > self.get_num_free_blocks():
            raise ValueError(f"Cannot get {num_blocks} free blocks from the pool")
        ret = self.free_block_queue.popleft_n(num_blocks)
        if self._reuse_watchers:  # pragma: no cover - no watcher is ever registered here
            raise AssertionError("reuse watchers are left out")
        if self.enable_caching:
            for block in ret:
                self._maybe_evict_cached_block(block)
                assert block.ref_cnt == 0
                block.ref_cnt += 1
                if self.metrics_collector:  # pragma: no cover - metrics are left out
                    self.metrics_collector.on_block_allocated(block)
        else:
            for block in ret:
                assert block.ref_cnt == 0
                block.ref_cnt += 1
                if self.metrics_collector:  # pragma: no cover
                    self.metrics_collector.on_block_allocated(block)
        return ret

    def _maybe_evict_cached_block(self, block: KVCacheBlock) -> bool:
        """Drop a reused block's cache entry (the prefix cache's, :mod:`impls.contenders.vllm_v1_pc`)."""
        return False  # pragma: no cover - only called with caching on

    def touch(self, blocks: list[KVCacheBlock]) -> None:
        for block in blocks:
            if block.is_null:
                continue
            if block.ref_cnt == 0:
                self.free_block_queue.remove(block)
            block.ref_cnt += 1
            if self.metrics_collector:  # pragma: no cover
                self.metrics_collector.on_block_accessed(block)

    def free_blocks(self, ordered_blocks) -> None:
        """Blocks in eviction order (first evicted first); those without a hash go to the front."""
        evict_last = []
        evict_first = []
        other_pools: dict[BlockPool, list[KVCacheBlock]] = {}
        for block in ordered_blocks:
            if block.is_null:
                continue
            if block.pool is not None and block.pool is not self:  # pragma: no cover - one pool here
                other_pools.setdefault(block.pool, []).append(block)
                continue
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                if block.block_hash is None or not self.enable_caching:
                    evict_first.append(block)
                else:
                    evict_last.append(block)
        self.free_block_queue.prepend_n(evict_first)
        self.free_block_queue.append_n(evict_last)
        for pool, blocks in other_pools.items():  # pragma: no cover
            pool.free_blocks(blocks)
