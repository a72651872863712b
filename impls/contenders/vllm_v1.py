"""Contender ``"vllm-v1"``: vLLM v1's KV-cache manager as its scheduler drives it, re-written from vLLM 0.33.0.

Follows, in vLLM 0.33.0 (the ``vllm`` wheel on PyPI):

* ``vllm/v1/core/kv_cache_utils.py``: ``KVCacheBlock`` (preallocated, slotted, with ``ref_cnt``, free-list
  links and ``is_null``) and ``FreeKVCacheBlockQueue`` (an intrusive doubly linked list between two sentinel
  blocks: ``popleft_n`` with its one-block fast path, ``prepend_n``, ``append_n``, ``remove``);
* ``vllm/v1/core/block_pool.py``: ``BlockPool`` (``get_new_blocks`` asserting each popped block's ref count is
  0, ``free_blocks`` skipping the null block and returning blocks without a hash to the *front* of the queue,
  ``touch``, ``get_num_free_blocks``; block 0 is popped at construction as the ``null_block``);
* ``vllm/v1/core/single_type_kv_cache_manager.py``: ``FullAttentionManager`` (``req_to_blocks``,
  ``num_cached_block``, ``get_num_blocks_to_allocate``, ``allocate_new_blocks``, ``remove_skipped_blocks``,
  ``free``);
* ``vllm/v1/core/kv_cache_coordinator.py``: ``KVCacheCoordinatorNoPrefixCache`` (each call forwarded to every
  single-type manager, ``cache_blocks`` computing ``replay_boundaries`` and skipping managers without caching);
* ``vllm/v1/core/kv_cache_manager.py``: ``KVCacheManager.allocate_slots`` / ``free`` / ``KVCacheBlocks``;
* ``vllm/v1/core/sched/scheduler.py``: the scheduler calls ``allocate_slots(request, num_new_tokens)`` for
  every running request every step (one new token in decode), not only when a block fills, and for a waiting
  request once with its prompt.

So every ``append_slot`` (and every sequence of a ``decode_step``) does what one decode ``allocate_slots``
does: the request-status check for the watermark, ``remove_skipped_blocks`` through the coordinator, the slow
path of ``get_num_blocks_to_allocate`` (prefix caching is off, so ``num_cached_block`` never holds the request),
the free-block check, ``allocate_new_blocks`` through the coordinator (a tuple over the one manager),
``cache_blocks`` (a no-op after its boundaries with caching off) and the ``KVCacheBlocks`` result.

Prefix caching is OFF: our contract carries no token contents, so there are no block hashes, no
``get_computed_blocks`` and no eviction; vLLM with caching on costs more per step (its ``cache_blocks`` hashes
and inserts each newly full block).

Departures, to follow our contract:

* the null block: the pool holds ``num_blocks + 1`` blocks and block 0 is reserved as vLLM's null block, so
  ``num_free_blocks()`` starts at ``num_blocks`` as the contract and the trace checks require; contract block
  ids are vLLM's minus one (vLLM id ``k`` is our block ``k - 1``), so they stay in ``[0, num_blocks)``;
* fork and copy-on-write: vLLM v1 has neither for running requests (parallel sampling shares prefixes through
  the prefix cache; 0.33.0 copies a block only for a partial prefix-cache hit, ``_apply_cow``). Here ``fork``
  creates a request whose blocks are the parent's, touched (ref +1) as a prefix-cache hit would be, and
  ``allocate_new_blocks`` copies a shared last block before a token is written to it (one block from the
  pool, counted by ``get_num_blocks_to_allocate`` so the free check stays exact);
* left out: the prefix cache (hashing, ``cached_block_hash_to_block``, eviction, KV events), the watermark
  (0, vLLM's default), lookahead and speculative tokens, encoder/cross-attention, sliding-window and Mamba
  managers, KV connectors, metrics collection and the ``Request`` object's token lists (a request here holds
  only the counters ``allocate_slots`` reads).
"""

from __future__ import annotations

import enum
import sys
from collections import defaultdict
from dataclasses import dataclass

from impls.core.interpreted import InterpretedBlockManager
from impls.core.validation import int_object_bytes


def cdiv(a: int, b: int) -> int:
    """Ceiling division, as ``vllm.utils.math_utils.cdiv``."""
    return -(a // -b)


class RequestStatus(enum.IntEnum):
    """The statuses ``allocate_slots`` tests (an ``IntEnum``, as vLLM's)."""

    WAITING = enum.auto()
    RUNNING = enum.auto()
    PREEMPTED = enum.auto()


class Request:
    """The counters of ``vllm.v1.request.Request`` that the KV-cache manager reads."""

    __slots__ = (
        "num_computed_tokens",
        "num_in_flight_tokens",
        "num_prompt_tokens",
        "num_tokens",
        "request_id",
        "status",
    )

    def __init__(self, request_id: str, num_tokens: int) -> None:
        self.request_id = request_id
        self.status = RequestStatus.WAITING
        self.num_prompt_tokens = num_tokens
        self.num_tokens = num_tokens
        self.num_computed_tokens = 0
        self.num_in_flight_tokens = 0


@dataclass(slots=True, eq=False)  # eq=False: a field-wise __eq__ would compare (and walk) the links
class KVCacheBlock:
    """Metadata of one physical block; the links belong to :class:`FreeKVCacheBlockQueue` alone."""

    block_id: int
    ref_cnt: int = 0
    block_hash: object = None  # always None here: prefix caching is off
    prev_free_block: KVCacheBlock | None = None
    next_free_block: KVCacheBlock | None = None
    is_null: bool = False


class FreeKVCacheBlockQueue:
    """Doubly linked free list over existing blocks, bounded by sentinels so no operation branches on ends.

    Initially ordered by block id; ``popleft_n`` takes from the front, ``prepend_n`` returns blocks to the
    front (blocks without a hash: reused first) and ``append_n`` to the back (cached blocks: evicted last).
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
        if n == 0:
            return []
        assert self.num_free_blocks >= n
        self.num_free_blocks -= n
        head = self.fake_free_list_head
        block = head.next_free_block
        if n == 1:  # the decode path: one block, no loop
            nxt = block.next_free_block
            block.prev_free_block = block.next_free_block = None
            head.next_free_block, nxt.prev_free_block = nxt, head
            return [block]
        out = []
        for _ in range(n):
            assert block is not None
            out.append(block)
            nxt = block.next_free_block
            block.prev_free_block = block.next_free_block = None
            block = nxt
        head.next_free_block, block.prev_free_block = block, head
        return out

    def remove(self, block: KVCacheBlock) -> None:
        # O(1) removal from the middle is why vLLM does not use collections.deque (a prefix-cache hit
        # revives a free block); with caching off nothing calls it, but the queue keeps the full interface.
        block.prev_free_block.next_free_block = block.next_free_block
        block.next_free_block.prev_free_block = block.prev_free_block
        block.prev_free_block = block.next_free_block = None
        self.num_free_blocks -= 1

    def prepend_n(self, blocks: list[KVCacheBlock]) -> None:
        if not blocks:
            return
        head = self.fake_free_list_head
        first = head.next_free_block
        prev = head
        for block in blocks:
            block.prev_free_block, prev.next_free_block = prev, block
            prev = block
        prev.next_free_block, first.prev_free_block = first, prev
        self.num_free_blocks += len(blocks)

    def append_n(self, blocks: list[KVCacheBlock]) -> None:
        if not blocks:
            return
        last = self.fake_free_list_tail.prev_free_block
        for block in blocks:
            last.next_free_block, block.prev_free_block = block, last
            last = block
        last.next_free_block, self.fake_free_list_tail.prev_free_block = self.fake_free_list_tail, last
        self.num_free_blocks += len(blocks)


class BlockPool:
    """``num_gpu_blocks`` preallocated blocks, block 0 kept aside as the null block."""

    def __init__(self, num_gpu_blocks: int) -> None:
        self.num_gpu_blocks = num_gpu_blocks
        self.enable_caching = False
        self.metrics_collector = None
        self.blocks = [KVCacheBlock(i) for i in range(num_gpu_blocks)]
        self.free_block_queue = FreeKVCacheBlockQueue(self.blocks)
        self.null_block = self.free_block_queue.popleft()  # never handed out, never freed
        self.null_block.is_null = True

    def get_num_free_blocks(self) -> int:
        return self.free_block_queue.num_free_blocks

    def get_new_blocks(self, num_blocks: int) -> list[KVCacheBlock]:
        if num_blocks > self.get_num_free_blocks():
            raise ValueError(f"Cannot get {num_blocks} free blocks from the pool")
        ret = self.free_block_queue.popleft_n(num_blocks)
        for block in ret:
            assert block.ref_cnt == 0
            block.ref_cnt += 1
            if self.metrics_collector:
                self.metrics_collector.on_block_allocated(block)
        return ret

    def touch(self, blocks: list[KVCacheBlock]) -> None:
        for block in blocks:
            if block.ref_cnt == 0 and not block.is_null:
                self.free_block_queue.remove(block)
            block.ref_cnt += 1

    def free_blocks(self, ordered_blocks) -> None:
        """Blocks in eviction order (first evicted first); those without a hash go to the front."""
        evict_last = []
        evict_first = []
        for block in ordered_blocks:
            if block.is_null:
                continue
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                if block.block_hash is None or not self.enable_caching:
                    evict_first.append(block)
                else:
                    evict_last.append(block)
        self.free_block_queue.prepend_n(evict_first)
        self.free_block_queue.append_n(evict_last)


class FullAttentionManager:
    """One KV-cache group's blocks per request (vLLM's ``SingleTypeKVCacheManager`` for full attention)."""

    def __init__(self, block_pool: BlockPool, block_size: int) -> None:
        self.block_pool = block_pool
        self.block_size = block_size
        self.enable_caching = False
        self.req_to_blocks: defaultdict[str, list[KVCacheBlock]] = defaultdict(list)
        self.num_cached_block: dict[str, int] = {}  # stays empty with caching off: the slow path below
        self.new_block_ids: list[int] = []
        self._record_new_block_ids = False
        self._null_block = block_pool.null_block
        self.cow: tuple[int, int] | None = None  # the last copy-on-write (vLLM ids), read by the contender

    def get_num_skipped_tokens(self, num_computed_tokens: int) -> int:
        return 0  # full attention skips nothing

    def _has_partial_local_hit(self, new_computed_blocks, num_local_computed_tokens: int) -> bool:
        return len(new_computed_blocks) > 0 and num_local_computed_tokens % self.block_size != 0

    def get_num_blocks_to_allocate(self, request_id: str, num_tokens: int, new_computed_blocks,
                                   total_computed_tokens: int, num_local_computed_tokens: int) -> int:
        num_required_blocks = cdiv(num_tokens, self.block_size)
        req_blocks = self.req_to_blocks.get(request_id, ())
        num_req_blocks = len(req_blocks)
        if request_id in self.num_cached_block:
            return max(num_required_blocks - num_req_blocks, 0)
        num_skipped_blocks = self.get_num_skipped_tokens(total_computed_tokens) // self.block_size
        num_local_computed_blocks = len(new_computed_blocks) + num_req_blocks
        num_new_blocks = max(num_required_blocks - max(num_skipped_blocks, num_local_computed_blocks), 0)
        skipped_new = max(0, num_skipped_blocks - num_req_blocks)
        num_evictable = sum(b.ref_cnt == 0 and not b.is_null for b in new_computed_blocks[skipped_new:])
        if self._has_partial_local_hit(new_computed_blocks, num_local_computed_tokens):
            num_new_blocks += 1
        if num_new_blocks == 0 and num_req_blocks and req_blocks[-1].ref_cnt > 1:
            num_new_blocks = 1  # ours: the shared last block will be copied (see the module docstring)
        return num_new_blocks + num_evictable

    def remove_skipped_blocks(self, request_id: str, processed_computed_tokens: int) -> None:
        num_skipped_tokens = self.get_num_skipped_tokens(processed_computed_tokens)
        if num_skipped_tokens <= 0:
            return
        raise AssertionError("full attention never skips blocks")  # pragma: no cover

    def allocate_new_blocks(self, request_id: str, num_tokens: int) -> list[KVCacheBlock]:
        req_blocks = self.req_to_blocks[request_id]
        num_new_blocks = cdiv(num_tokens, self.block_size) - len(req_blocks)
        if num_new_blocks <= 0:
            src = req_blocks[-1]
            if src.ref_cnt == 1 or src.block_hash is not None:  # a cached block is full: nothing written to it
                return []
            return [self._copy_on_write(req_blocks, src)]
        new_blocks = self.block_pool.get_new_blocks(num_new_blocks)
        req_blocks.extend(new_blocks)
        if self._record_new_block_ids:
            self.new_block_ids.extend(b.block_id for b in new_blocks)
        return new_blocks

    def _copy_on_write(self, req_blocks: list[KVCacheBlock], src: KVCacheBlock) -> KVCacheBlock:
        dst = self.block_pool.get_new_blocks(1)[0]
        src.ref_cnt -= 1  # still referenced by the other request(s): it stays out of the queue
        req_blocks[-1] = dst
        self.cow = (src.block_id, dst.block_id)
        return dst

    def add_forked_blocks(self, parent_id: str, child_id: str) -> None:
        blocks = self.req_to_blocks[parent_id]
        self.block_pool.touch(blocks)
        self.req_to_blocks[child_id] = blocks.copy()

    def free(self, request_id: str) -> None:
        blocks = self.req_to_blocks.pop(request_id, [])
        self.num_cached_block.pop(request_id, None)
        self.block_pool.free_blocks(reversed(blocks))  # tail first: reused (or evicted) first


class KVCacheCoordinatorNoPrefixCache:
    """Forwards each call to every single-type manager (one here: a model with full attention only)."""

    def __init__(self, block_pool: BlockPool, block_size: int) -> None:
        self.block_pool = block_pool
        self.scheduler_block_size = block_size
        self.single_type_managers = (FullAttentionManager(block_pool, block_size),)

    def get_num_blocks_to_allocate(self, request_id: str, num_tokens: int, new_computed_blocks,
                                   total_computed_tokens: int, num_local_computed_tokens: int) -> int:
        num_blocks_to_allocate = 0
        for i, manager in enumerate(self.single_type_managers):
            num_blocks_to_allocate += manager.get_num_blocks_to_allocate(
                request_id, num_tokens, new_computed_blocks[i], total_computed_tokens, num_local_computed_tokens)
        return num_blocks_to_allocate

    def remove_skipped_blocks(self, request_id: str, processed_computed_tokens: int) -> None:
        for manager in self.single_type_managers:
            manager.remove_skipped_blocks(request_id, processed_computed_tokens)

    def allocate_new_blocks(self, request_id: str, num_tokens: int) -> tuple[list[KVCacheBlock], ...]:
        return tuple(manager.allocate_new_blocks(request_id, num_tokens) for manager in self.single_type_managers)

    def cache_blocks(self, request: Request, num_computed_tokens: int) -> None:
        boundaries = (request.num_prompt_tokens - 1,)  # replay_boundaries without EAGLE
        for manager in self.single_type_managers:
            if not manager.enable_caching:
                continue
            manager.cache_blocks(request, num_computed_tokens, boundaries)  # pragma: no cover

    def free(self, request_id: str) -> None:
        for manager in self.single_type_managers:
            manager.free(request_id)


class KVCacheBlocks:
    """``allocate_slots``'s result: the new blocks per KV-cache group."""

    __slots__ = ("blocks",)

    def __init__(self, blocks: tuple[list[KVCacheBlock], ...]) -> None:
        self.blocks = blocks


class KVCacheManager:
    """The scheduler's entry point: ``allocate_slots`` per request per step, ``free`` when it ends."""

    def __init__(self, num_gpu_blocks: int, block_size: int, max_model_len: int) -> None:
        self.max_model_len = max_model_len
        self.watermark_blocks = 0
        self.block_pool = BlockPool(num_gpu_blocks)
        self.coordinator = KVCacheCoordinatorNoPrefixCache(self.block_pool, block_size)
        self.empty_kv_cache_blocks = KVCacheBlocks(([],))

    def allocate_slots(self, request: Request, num_new_tokens: int,
                       num_lookahead_tokens: int = 0) -> KVCacheBlocks | None:
        """Slots for ``num_new_tokens`` more tokens of ``request``; None when the pool is short."""
        if num_new_tokens == 0:
            raise ValueError("num_new_tokens must be greater than 0")
        new_computed_block_list = self.empty_kv_cache_blocks.blocks  # no prefix-cache hit with caching off
        num_local_computed_tokens = request.num_computed_tokens
        total_computed_tokens = min(num_local_computed_tokens, self.max_model_len)
        watermark_blocks = 0
        if request.status in (RequestStatus.WAITING, RequestStatus.PREEMPTED):
            watermark_blocks = self.watermark_blocks
        num_tokens_main_model = total_computed_tokens + num_new_tokens
        num_tokens_need_slot = min(num_tokens_main_model + num_lookahead_tokens, self.max_model_len)
        coordinator = self.coordinator
        coordinator.remove_skipped_blocks(request.request_id,
                                          max(0, total_computed_tokens - request.num_in_flight_tokens))
        num_blocks_to_allocate = coordinator.get_num_blocks_to_allocate(
            request.request_id, num_tokens_need_slot, new_computed_block_list, total_computed_tokens,
            num_local_computed_tokens)
        if num_blocks_to_allocate + watermark_blocks > self.block_pool.get_num_free_blocks():
            return None
        new_blocks = coordinator.allocate_new_blocks(request.request_id, num_tokens_need_slot)
        coordinator.cache_blocks(request, min(total_computed_tokens + num_new_tokens, request.num_tokens))
        return KVCacheBlocks(new_blocks) if any(new_blocks) else self.empty_kv_cache_blocks

    def free(self, request: Request) -> None:
        self.coordinator.free(request.request_id)


class VllmV1BlockManager(InterpretedBlockManager):
    """Contender ``"vllm-v1"``: vLLM v1's ``KVCacheManager`` driven per request per step, as its scheduler does."""

    kv_cache_manager_class = KVCacheManager  # the caching-on contender (impls.contenders.vllm_v1_pc) puts its own here

    def __init__(self, num_blocks: int, block_size: int = 16, max_seqs: int = 256,
                 max_blocks_per_seq: int = 256) -> None:
        super().__init__(num_blocks, block_size, max_seqs, max_blocks_per_seq)
        # num_blocks + 1: vLLM's block 0 is the null block (see the module docstring)
        self.kv_cache_manager = self.kv_cache_manager_class(self.num_blocks + 1, self.block_size,
                                                            self.block_size * self.max_blocks_per_seq)
        pool = self.kv_cache_manager.block_pool
        self.blocks = pool.blocks  # vLLM ids: blocks[k] is our block k - 1; blocks[0] is the null block
        self.free_block_queue = pool.free_block_queue
        self.single_type_manager = self.kv_cache_manager.coordinator.single_type_managers[0]
        self.req_to_blocks = self.single_type_manager.req_to_blocks
        self.requests: list[Request | None] = [None] * self.max_seqs
        self._num_requests = 0
        self._admit_tokens = 0

    def memory_bytes(self) -> int:
        """Per block a ``KVCacheBlock`` object, its id (an int object) and a list slot; per row a length slot."""
        per_block = 8 + sys.getsizeof(KVCacheBlock(0)) + int_object_bytes(self.num_blocks)
        return self.num_blocks * per_block + 8 * self.max_seqs

    def num_free_blocks(self) -> int:
        return self.free_block_queue.num_free_blocks

    def _new_request(self, seq_id: int, num_tokens: int) -> Request:
        self._num_requests += 1
        request = self.requests[seq_id] = Request(str(self._num_requests), num_tokens)
        return request

    def _allocate(self, seq_id: int, num_blocks: int) -> None:
        request = self._new_request(seq_id, self._admit_tokens)
        if self.kv_cache_manager.allocate_slots(request, request.num_tokens) is None:  # pragma: no cover
            raise AssertionError("the contract checked the pool before admission")
        request.status = RequestStatus.RUNNING
        request.num_computed_tokens = request.num_tokens

    def _last_shared(self, seq_id: int) -> bool:
        return self.req_to_blocks[self.requests[seq_id].request_id][-1].ref_cnt > 1

    def _append(self, seq_id: int) -> tuple[int, int] | None:
        request = self.requests[seq_id]
        request.num_tokens += 1  # the token sampled last step, whose KV this step writes
        if self.kv_cache_manager.allocate_slots(request, 1) is None:  # pragma: no cover
            raise AssertionError("the contract checked the pool before the append")
        request.num_computed_tokens += 1
        self._lens[seq_id] = request.num_tokens
        manager = self.single_type_manager
        if manager.cow is None:
            return None
        src, dst = manager.cow
        manager.cow = None
        return src - 1, dst - 1

    def _fork(self, parent_id: int, child_id: int) -> None:
        parent = self.requests[parent_id]
        child = self._new_request(child_id, parent.num_tokens)
        child.num_prompt_tokens = parent.num_prompt_tokens
        child.num_computed_tokens = parent.num_computed_tokens
        child.status = RequestStatus.RUNNING
        self.single_type_manager.add_forked_blocks(parent.request_id, child.request_id)

    def _free(self, seq_id: int) -> None:
        request = self.requests[seq_id]
        self.requests[seq_id] = None
        self.kv_cache_manager.free(request)

    def _table_nbytes(self, seq_id: int) -> int:
        # The per-request list of block references (the block objects are the pool's, preallocated).
        return sys.getsizeof(self.req_to_blocks[self.requests[seq_id].request_id])

    def _table(self, seq_id: int) -> list[int]:
        return [block.block_id - 1 for block in self.req_to_blocks[self.requests[seq_id].request_id]]

    def _ref(self, block_id: int) -> int:
        return self.blocks[block_id + 1].ref_cnt

    def _last_slot(self, seq_id: int) -> int:
        n = self._lens[seq_id] - 1
        block = self.req_to_blocks[self.requests[seq_id].request_id][n // self.block_size]
        return (block.block_id - 1) * self.block_size + n % self.block_size
