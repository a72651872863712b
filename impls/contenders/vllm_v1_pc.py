"""Contender ``"vllm-v1-pc"``: :mod:`impls.contenders.vllm_v1` with prefix caching on, vLLM v1's default.

Follows, in vLLM 0.33.0 (the ``vllm`` wheel on PyPI), beside what :mod:`impls.contenders.vllm_v1` follows:

* ``vllm/v1/core/block_pool.py``: ``BlockHashToBlockMap`` (``get_one_block``, ``insert``, ``pop``),
  ``BlockPool.get_cached_block``, ``cache_full_blocks``, ``_insert_block_hash``, ``_remove_cached_block_hashes``,
  ``_maybe_evict_cached_block`` (called on every block ``get_new_blocks`` pops), ``touch`` and ``free_blocks``
  (cached blocks to the *back* of the free queue, uncached ones to the front);
* ``vllm/v1/core/kv_cache_utils.py``: ``make_block_hash_with_group_id`` (the hash bytes plus a 4-byte group id:
  the map's keys are new ``bytes`` objects, hashed on every lookup);
* ``vllm/v1/core/single_type_kv_cache_manager.py``: ``FullAttentionManager.find_longest_cache_hit`` (the chain
  looked up from its start to the first miss), ``add_local_computed_blocks`` (touch, then ``num_cached_block``
  set: from then on ``get_num_blocks_to_allocate`` takes its fast path), ``cache_blocks`` (called through the
  coordinator by every ``allocate_slots``, every step; it returns early unless the request's hashes cover a
  full block not yet cached);
* ``vllm/v1/core/kv_cache_coordinator.py``: ``UnitaryKVCacheCoordinator`` (``find_longest_cache_hit``,
  ``allocate_new_computed_blocks``, ``cache_blocks``);
* ``vllm/v1/core/kv_cache_manager.py``: ``get_computed_blocks`` then ``allocate_slots(request, new tokens,
  num_new_computed_tokens, new_computed_blocks)`` at admission, as ``Scheduler.schedule`` calls them, and
  ``allocate_slots(request, 1)`` per running request per step.

What the contract decides, and how the contender reproduces vLLM's cost while making the contract's choices
(the reference model, :class:`impls.core.reference.ReferenceModel`, must see the same hits at every step):

* **Free-block order.** vLLM keeps one queue: blocks without a hash are prepended when freed, cached ones
  appended, and ``get_new_blocks`` pops the head, evicting the popped block's hash. Since no block gains a hash
  while in the queue, the queue is always [never-cached blocks][cached blocks in the order freed], so popping the
  head *is* the contract's rule (a never-cached block first, else the least recently freed cached one) and
  ``free``'s reverse table order makes a prompt's tail evicted before its head, as the contract says. The
  contender keeps vLLM's single queue unchanged.
* **Hits.** vLLM caps a hit at ``num_tokens - 1`` tokens (the last prompt token is always recomputed), so a
  prompt made of full blocks all cached hits one block less; the contract shares every full block it finds.
  The contender passes ``max_cache_hit_length = num_tokens`` (the same lookup loop, one block longer at most).
* **A hash already cached.** vLLM does not de-duplicate: a fresh block whose hash another block carries is
  inserted beside it (the map's value becomes a dict of blocks). The contract keeps the first block's hash and
  leaves the fresh block uncached (so it is freed to the front, never evicted). ``_insert_block_hash`` here
  looks the key up once (vLLM's ``contain`` check) and skips the insert when it is taken.
* **Sealing.** vLLM appends a new block hash to ``request.block_hashes`` when a sampled token fills a block
  (``Request.append_output_token_ids`` runs the block hasher: hashing time, not the KV-cache manager's) and the
  next ``allocate_slots`` caches it through ``cache_blocks``. The trace says when a block fills with
  ``seal(seq, hash)``; the contender's ``seal`` appends the hash to the request's ``block_hashes`` and calls the
  coordinator's ``cache_blocks`` as that ``allocate_slots`` would. Blocks of a row whose hashes the contract
  never gave (a plain ``allocate``, full blocks never sealed) hold ``None`` in ``block_hashes``, which
  ``cache_full_blocks`` skips as vLLM skips masked blocks.
* **Hashes.** The trace's hashes are 64-bit integers standing for vLLM's 32-byte SHA-256 digests; the contender
  keeps them as 8-byte ``bytes`` (converted once per admission, as vLLM's ``Request`` holds its hashes) and
  builds vLLM's keys from them, so dictionary lookups hash ``bytes`` as vLLM's do (12 bytes instead of 36).
  Computing the hashes from token ids is not here: it is measured on its own (:mod:`harness.studies.hashing`).
* **Plain ``allocate``** (a request the trace gives no hashes) goes through ``get_computed_blocks`` with an
  empty hash list, as a vLLM request shorter than a block does: no hit, no ``num_cached_block`` entry, so its
  steps take ``get_num_blocks_to_allocate``'s slow path until a block of it is sealed.

Left out, beside what :mod:`impls.contenders.vllm_v1` leaves out: KV-cache events, partial-block (fine-grained) hits,
``cached_block_hashes_by_block`` entries (only partial hits make them), prefix-cache statistics and the
metrics collector, EAGLE's dropped block, cache salts and extra keys (they are inside the hash).
"""

from __future__ import annotations

import itertools

import numpy as np

from impls.contenders.vllm_v1 import (
    BlockPool,
    FullAttentionManager,
    KVCacheBlock,
    KVCacheBlocks,
    KVCacheCoordinatorNoPrefixCache,
    KVCacheManager,
    Request,
    RequestStatus,
    VllmV1BlockManager,
    cdiv,
)
from impls.contract import (
    E_ACTIVE,
    E_NO_BLOCKS,
    E_NOT_FULL,
    E_SEALED,
    blocks_for,
)
from impls.core.validation import chain_arg, hash_arg, seq_arg, tokens_arg

_GROUP0 = (0).to_bytes(4, "big", signed=False)


def make_block_hash_with_group_id(block_hash: bytes, group_id: int) -> bytes:
    """The map's key: the block hash followed by the group id in 4 big-endian bytes (a new ``bytes``)."""
    return block_hash + group_id.to_bytes(4, "big", signed=False)


class CachingRequest(Request):
    """A request with the block hashes of its full blocks (``None`` where the trace gave none).

    ``num_tokens`` is a property, as vLLM's (``len`` of its token list): ``allocate_slots`` reads it twice."""

    __slots__ = ("_num_tokens", "block_hashes", "shared_prefix_boundary", "skip_reading_prefix_cache")

    def __init__(self, request_id: str, num_tokens: int, block_hashes: list) -> None:
        super().__init__(request_id, num_tokens)
        self.block_hashes = block_hashes
        self.skip_reading_prefix_cache = False
        self.shared_prefix_boundary = 0

    @property
    def num_tokens(self) -> int:
        return self._num_tokens

    @num_tokens.setter
    def num_tokens(self, value: int) -> None:
        self._num_tokens = value


class _PrefixCacheableSpec:
    """The group's ``FullAttentionSpec``, for the ``prefix_cacheable`` property ``cache_blocks`` reads."""

    @property
    def prefix_cacheable(self) -> bool:
        return True


def replay_boundaries(num_prompt_tokens: int, scheduler_block_size: int, use_eagle: bool) -> tuple[int, ...]:
    """Positions a later request replaying the prompt resumes at (without EAGLE: the last prompt token)."""
    if not use_eagle:
        return (num_prompt_tokens - 1,)
    raise NotImplementedError("EAGLE is left out")  # pragma: no cover


class BlockHashToBlockMap:
    """hash key -> block. vLLM's map may hold several blocks per key; under the contract it never does."""

    def __init__(self) -> None:
        self._cache: dict[bytes, KVCacheBlock | dict[int, KVCacheBlock]] = {}

    def get_one_block(self, key: bytes) -> KVCacheBlock | None:
        blocks = self._cache.get(key)
        if blocks is None:
            return None
        if isinstance(blocks, KVCacheBlock):
            return blocks
        return next(iter(blocks.values()))  # pragma: no cover - several blocks per key never happen here

    def insert(self, key: bytes, block: KVCacheBlock) -> None:
        self._cache[key] = block  # the key is free: _insert_block_hash checked it

    def pop(self, key: bytes, block_id: int) -> KVCacheBlock | None:
        blocks = self._cache.pop(key, None)
        if blocks is None or blocks.block_id == block_id:
            return blocks
        self._cache[key] = blocks  # pragma: no cover - another block's entry: put it back, as vLLM does
        return None  # pragma: no cover

    def __len__(self) -> int:
        return len(self._cache)


class CachingBlockPool(BlockPool):
    """:class:`impls.contenders.vllm_v1.BlockPool` with the prefix cache: lookups, inserts, and eviction on reuse."""

    def __init__(self, num_gpu_blocks: int) -> None:
        super().__init__(num_gpu_blocks)
        self.enable_caching = True
        self.enable_kv_cache_events = False
        self.cached_block_hash_to_block = BlockHashToBlockMap()
        self.evictions = 0  # a statistic (the reference model counts them too)

    def get_cached_block(self, block_hash: bytes, kv_cache_group_ids: list[int]) -> list[KVCacheBlock] | None:
        cached_blocks = []
        for group_id in kv_cache_group_ids:
            block = self.cached_block_hash_to_block.get_one_block(make_block_hash_with_group_id(block_hash, group_id))
            if not block:
                return None
            cached_blocks.append(block)
        return cached_blocks

    def cache_full_blocks(self, request: CachingRequest, blocks: list[KVCacheBlock], num_cached_blocks: int,
                          num_full_blocks: int, block_size: int, kv_cache_group_id: int) -> None:
        """Give ``blocks[num_cached_blocks:num_full_blocks]`` their hashes from ``request.block_hashes``."""
        if num_cached_blocks >= num_full_blocks:
            return
        new_full_blocks = blocks[num_cached_blocks:num_full_blocks]
        new_block_hashes = request.block_hashes[num_cached_blocks:]
        for i, blk in enumerate(new_full_blocks):
            block_hash = new_block_hashes[i]
            if blk.is_null or block_hash is None or blk.block_hash is not None:
                continue  # no hash given (masked, in vLLM's terms), or already cached (a hit)
            self._insert_block_hash(make_block_hash_with_group_id(block_hash, kv_cache_group_id), blk)

    def _insert_block_hash(self, key: bytes, block: KVCacheBlock) -> None:
        if self.cached_block_hash_to_block.get_one_block(key) is not None:
            return  # the contract: the block that carries the hash keeps it, this one stays uncached
        block.block_hash = key
        self.cached_block_hash_to_block.insert(key, block)

    def _remove_cached_block_hashes(self, block: KVCacheBlock) -> list[bytes]:
        key = block.block_hash
        if key is None:
            return []
        removed = [key] if self.cached_block_hash_to_block.pop(key, block.block_id) is not None else []
        block.block_hash = None
        return removed

    def _maybe_evict_cached_block(self, block: KVCacheBlock) -> bool:
        if not self._remove_cached_block_hashes(block):
            return False
        self.evictions += 1
        return True

    def get_new_blocks(self, num_blocks: int) -> list[KVCacheBlock]:
        if num_blocks > self.get_num_free_blocks():
            raise ValueError(f"Cannot get {num_blocks} free blocks from the pool")
        ret = self.free_block_queue.popleft_n(num_blocks)
        for block in ret:
            self._maybe_evict_cached_block(block)
            assert block.ref_cnt == 0
            block.ref_cnt += 1
        return ret

    def touch(self, blocks: list[KVCacheBlock]) -> None:
        for block in blocks:
            if block.is_null:
                continue
            if block.ref_cnt == 0:
                self.free_block_queue.remove(block)  # an evictable hit leaves the queue (O(1): the links)
            block.ref_cnt += 1


class _CrossAttentionManager:
    """Stands for vLLM's ``CrossAttentionManager``, which the coordinator tests every manager against."""


class CachingFullAttentionManager(FullAttentionManager):
    """:class:`impls.contenders.vllm_v1.FullAttentionManager` with prefix caching: hits, ``num_cached_block``,
    caching."""

    def __init__(self, block_pool: CachingBlockPool, block_size: int) -> None:
        super().__init__(block_pool, block_size)
        self.enable_caching = True
        self.kv_cache_group_id = 0
        self.kv_cache_spec = _PrefixCacheableSpec()
        self.hash_block_size = block_size

    @classmethod
    def find_longest_cache_hit(cls, block_hashes: list, max_length: int, kv_cache_group_ids: list[int],
                               block_pool: CachingBlockPool, block_size: int) -> tuple[tuple[list, ...], int]:
        computed_blocks: tuple[list[KVCacheBlock], ...] = tuple([] for _ in range(len(kv_cache_group_ids)))
        for block_hash in itertools.islice(block_hashes, max_length // block_size):
            if block_hash is None:
                break
            cached_block = block_pool.get_cached_block(block_hash, kv_cache_group_ids)
            if not cached_block:
                break
            for computed, cached in zip(computed_blocks, cached_block, strict=True):
                computed.append(cached)
        hit_length = len(computed_blocks[0]) * block_size
        hit_length -= hit_length % block_size  # alignment to the block (a no-op at one block size)
        return computed_blocks, hit_length

    def get_num_blocks_to_allocate(self, request_id: str, num_tokens: int, new_computed_blocks,
                                   total_computed_tokens: int, num_local_computed_tokens: int,
                                   num_tokens_main_model: int = 0, apply_admission_cap: bool = False,
                                   prefill_end: int = 0) -> int:
        if request_id not in self.num_cached_block:  # the admission: the slow path, counting evictable hits
            return super().get_num_blocks_to_allocate(request_id, num_tokens, new_computed_blocks,
                                                      total_computed_tokens, num_local_computed_tokens)
        req_blocks = self.req_to_blocks.get(request_id, ())
        num_new_blocks = max(cdiv(num_tokens, self.block_size) - len(req_blocks), 0)
        if num_new_blocks == 0 and req_blocks and req_blocks[-1].ref_cnt > 1:
            num_new_blocks = 1  # ours: the shared last block will be copied (see impls.contenders.vllm_v1)
        return num_new_blocks

    def add_local_computed_blocks(self, request_id: str, new_computed_blocks: list[KVCacheBlock],
                                  num_local_computed_tokens: int) -> None:
        req_blocks = self.req_to_blocks[request_id]
        assert len(req_blocks) == 0
        self.block_pool.touch(new_computed_blocks)
        req_blocks.extend(new_computed_blocks)
        self.num_cached_block[request_id] = len(req_blocks)

    @classmethod
    def reachable_block_mask(cls, start_block: int, end_block: int) -> None:
        return None  # full attention caches every block

    def cache_blocks(self, request: CachingRequest, num_tokens: int, retention_interval: int | None = None, *,
                     replay_boundaries: tuple[int, ...]) -> None:
        """``FullAttentionManager.cache_blocks``: the base class's, then the partial tail (none at one size)."""
        self._cache_full(request, num_tokens, retention_interval=retention_interval,
                         replay_boundaries=replay_boundaries)
        if self.block_size == self.hash_block_size:
            return

    def _cache_full(self, request: CachingRequest, num_tokens: int, retention_interval: int | None = None, *,
                    replay_boundaries: tuple[int, ...]) -> None:
        """``SingleTypeKVCacheManager.cache_blocks``: caches the full blocks the request's hashes cover."""
        if not self.kv_cache_spec.prefix_cacheable:
            return  # pragma: no cover
        num_cached_blocks = self.num_cached_block.get(request.request_id, 0)
        num_hashed_tokens = len(request.block_hashes) * self.block_size
        num_full_blocks = min(num_tokens, num_hashed_tokens) // self.block_size
        if num_cached_blocks >= num_full_blocks:
            return  # every step but the one after a block fills
        reachable_boundaries = [*replay_boundaries]
        if request.shared_prefix_boundary:
            reachable_boundaries.append(request.shared_prefix_boundary)  # pragma: no cover
        self.reachable_block_mask(num_cached_blocks, num_full_blocks)
        self.block_pool.cache_full_blocks(request, self.req_to_blocks[request.request_id], num_cached_blocks,
                                          num_full_blocks, self.block_size, self.kv_cache_group_id)
        self.num_cached_block[request.request_id] = num_full_blocks


class UnitaryKVCacheCoordinator(KVCacheCoordinatorNoPrefixCache):
    """The coordinator of a model with one KV-cache group and caching on."""

    def __init__(self, block_pool: CachingBlockPool, block_size: int) -> None:
        self.block_pool = block_pool
        self.scheduler_block_size = self.block_size = block_size
        self.single_type_managers = (CachingFullAttentionManager(block_pool, block_size),)
        self.num_reprefillable_tokens = 0
        self.retention_interval = None
        self.drop_eagle_group_ids: tuple[int, ...] = ()

    def get_num_blocks_to_allocate(self, request_id: str, num_tokens: int, new_computed_blocks: tuple,
                                   num_encoder_tokens: int, total_computed_tokens: int,
                                   num_local_computed_tokens: int, num_tokens_main_model: int,
                                   prefill_end: int = 0) -> int:
        num_blocks_to_allocate = 0
        if self.retention_interval != 0:
            prefill_end = 0
        for i, manager in enumerate(self.single_type_managers):
            if isinstance(manager, _CrossAttentionManager):
                continue  # pragma: no cover - decoder-only
            num_blocks_to_allocate += manager.get_num_blocks_to_allocate(
                request_id, num_tokens, new_computed_blocks[i], total_computed_tokens, num_local_computed_tokens,
                num_tokens_main_model, apply_admission_cap=False, prefill_end=prefill_end)
        return num_blocks_to_allocate

    def allocate_new_blocks(self, request_id: str, num_tokens: int, num_tokens_main_model: int = 0,
                            num_encoder_tokens: int = 0) -> tuple[list[KVCacheBlock], ...]:
        return tuple(
            manager.allocate_new_blocks(
                request_id, num_encoder_tokens if isinstance(manager, _CrossAttentionManager) else num_tokens)
            for manager in self.single_type_managers)

    def find_longest_cache_hit(self, block_hashes: list, max_cache_hit_length: int) -> tuple[tuple, int, int]:
        hit_blocks, hit_length = self.single_type_managers[0].find_longest_cache_hit(
            block_hashes, max_cache_hit_length, [0], self.block_pool, self.block_size)
        return hit_blocks, hit_length, 0

    def allocate_new_computed_blocks(self, request_id: str, new_computed_blocks: tuple,
                                     num_local_computed_tokens: int) -> None:
        if any(request_id in manager.num_cached_block for manager in self.single_type_managers):
            return  # pragma: no cover - a running request has no new hits
        for i, manager in enumerate(self.single_type_managers):
            manager.add_local_computed_blocks(request_id, new_computed_blocks[i], num_local_computed_tokens)

    def get_num_cacheable_tokens(self, num_computed_tokens: int, kv_cache_group_id: int) -> int:
        return max(0, num_computed_tokens - self.num_reprefillable_tokens)

    def cache_blocks(self, request: CachingRequest, num_computed_tokens: int) -> None:
        boundaries = replay_boundaries(request.num_prompt_tokens, self.scheduler_block_size,
                                       use_eagle=bool(self.drop_eagle_group_ids))
        for group_id, manager in enumerate(self.single_type_managers):
            if not manager.enable_caching:
                continue  # pragma: no cover
            manager.cache_blocks(request, self.get_num_cacheable_tokens(num_computed_tokens, group_id),
                                 retention_interval=self.retention_interval, replay_boundaries=boundaries)


class CachingKVCacheManager(KVCacheManager):
    """``KVCacheManager(enable_caching=True)``: ``get_computed_blocks`` and the hit-aware ``allocate_slots``."""

    def __init__(self, num_gpu_blocks: int, block_size: int, max_model_len: int) -> None:
        self.max_model_len = max_model_len
        self.watermark_blocks = 0
        self.enable_caching = True
        self.block_pool = CachingBlockPool(num_gpu_blocks)
        self.coordinator = UnitaryKVCacheCoordinator(self.block_pool, block_size)
        self.empty_kv_cache_blocks = KVCacheBlocks(([],))

    def create_kv_cache_blocks(self, blocks: tuple[list[KVCacheBlock], ...]) -> KVCacheBlocks:
        return KVCacheBlocks(blocks) if any(blocks) else self.empty_kv_cache_blocks

    def get_computed_blocks(self, request: CachingRequest, max_cache_hit_length: int) -> tuple[KVCacheBlocks, int]:
        """The cached blocks heading the request's hash chain, and the tokens they hold."""
        if not self.enable_caching or request.skip_reading_prefix_cache:
            return self.empty_kv_cache_blocks, 0  # pragma: no cover
        computed_blocks, num_new_computed_tokens, _ = self.coordinator.find_longest_cache_hit(
            request.block_hashes, max_cache_hit_length)
        return self.create_kv_cache_blocks(computed_blocks), num_new_computed_tokens

    def allocate_slots(self, request: CachingRequest, num_new_tokens: int, num_new_computed_tokens: int = 0,
                       new_computed_blocks: KVCacheBlocks | None = None, num_lookahead_tokens: int = 0,
                       num_external_computed_tokens: int = 0, delay_cache_blocks: bool = False,
                       num_encoder_tokens: int = 0, full_sequence_must_fit: bool = False, reserved_blocks: int = 0,
                       has_scheduled_reqs: bool = True) -> KVCacheBlocks | None:
        """Slots for ``num_new_tokens`` more tokens, adopting ``new_computed_blocks`` (hits) first.

        vLLM's own keyword arguments and checks are kept (they are work it does on every call); the ones that
        do nothing here (external tokens, delayed caching, the full-sequence gate) keep their defaults."""
        if num_new_tokens == 0 and num_external_computed_tokens == 0 and num_new_computed_tokens == 0:
            raise ValueError("num_new_tokens must be greater than 0 when there are no computed tokens to adopt")
        empty = self.empty_kv_cache_blocks.blocks
        new_computed_block_list = empty if new_computed_blocks is None else new_computed_blocks.blocks
        num_local_computed_tokens = request.num_computed_tokens + num_new_computed_tokens
        total_computed_tokens = min(num_local_computed_tokens + num_external_computed_tokens, self.max_model_len)
        watermark_blocks = 0
        if has_scheduled_reqs and request.status in (RequestStatus.WAITING, RequestStatus.PREEMPTED):
            watermark_blocks = self.watermark_blocks
        prefill_end = max(request.num_prompt_tokens, request.num_tokens - 1)
        if full_sequence_must_fit:
            raise NotImplementedError("the full-sequence admission gate is left out")  # pragma: no cover
        num_tokens_main_model = total_computed_tokens + num_new_tokens
        num_tokens_need_slot = min(num_tokens_main_model + num_lookahead_tokens, self.max_model_len)
        coordinator = self.coordinator
        coordinator.remove_skipped_blocks(request.request_id,
                                          max(0, total_computed_tokens - request.num_in_flight_tokens))
        num_blocks_to_allocate = coordinator.get_num_blocks_to_allocate(
            request_id=request.request_id, num_tokens=num_tokens_need_slot,
            new_computed_blocks=new_computed_block_list, num_encoder_tokens=num_encoder_tokens,
            total_computed_tokens=num_local_computed_tokens + num_external_computed_tokens,
            num_local_computed_tokens=num_local_computed_tokens, num_tokens_main_model=num_tokens_main_model,
            prefill_end=prefill_end)
        available_blocks = self.block_pool.get_num_free_blocks() - reserved_blocks
        if num_blocks_to_allocate + watermark_blocks > available_blocks:
            return None
        if new_computed_block_list is not empty or num_external_computed_tokens > 0:
            coordinator.allocate_new_computed_blocks(request.request_id, new_computed_block_list,
                                                     num_local_computed_tokens)
        new_blocks = coordinator.allocate_new_blocks(request.request_id, num_tokens_need_slot, num_tokens_main_model,
                                                     num_encoder_tokens)
        if delay_cache_blocks:
            return self.create_kv_cache_blocks(new_blocks)  # pragma: no cover
        coordinator.cache_blocks(request, min(total_computed_tokens + num_new_tokens, request.num_tokens))
        return self.create_kv_cache_blocks(new_blocks)


class VllmV1CachingBlockManager(VllmV1BlockManager):
    """Contender ``"vllm-v1-pc"``: vLLM v1's ``KVCacheManager`` with prefix caching on (its default)."""

    prefix_caching = True

    kv_cache_manager_class = CachingKVCacheManager

    def __init__(self, num_blocks: int, block_size: int = 16, max_seqs: int = 256,
                 max_blocks_per_seq: int = 256) -> None:
        super().__init__(num_blocks, block_size, max_seqs, max_blocks_per_seq)
        self.block_pool = self.kv_cache_manager.block_pool

    def _new_request(self, seq_id: int, num_tokens: int, block_hashes: list | None = None) -> CachingRequest:
        self._num_requests += 1
        request = CachingRequest(str(self._num_requests), num_tokens, [] if block_hashes is None else block_hashes)
        self.requests[seq_id] = request
        return request

    def _admit(self, request: CachingRequest) -> int:
        """The scheduler's admission: look the chain up, then ``allocate_slots`` adopting the hits."""
        kv = self.kv_cache_manager
        computed, num_computed = kv.get_computed_blocks(request, request.num_tokens)  # contract: no -1 cap
        if kv.allocate_slots(request, request.num_tokens - num_computed, num_computed, computed) is None:
            raise AssertionError("the contract checked the pool before admission")  # pragma: no cover
        request.status = RequestStatus.RUNNING
        request.num_computed_tokens = request.num_tokens
        return num_computed

    def _allocate(self, seq_id: int, num_blocks: int) -> None:
        self._admit(self._new_request(seq_id, self._admit_tokens))

    def _cached_need(self, num_tokens: int, chain: list[bytes]) -> int:
        """Free blocks the admission consumes: fresh ones plus evictable hits (as get_num_blocks_to_allocate)."""
        pool = self.block_pool
        hits = 0
        evictable = 0
        for block_hash in chain:
            block = pool.cached_block_hash_to_block.get_one_block(make_block_hash_with_group_id(block_hash, 0))
            if block is None:
                break
            hits += 1
            evictable += block.ref_cnt == 0
        return blocks_for(num_tokens, self.block_size) - hits + evictable

    def allocate_cached(self, seq_id: int, num_tokens: int, hashes: np.ndarray) -> int:
        """Admit a prompt whose full blocks have the hash chain ``hashes``; returns the tokens served cached."""
        seq_id = seq_arg(seq_id, self.max_seqs)
        num_tokens = tokens_arg(num_tokens, seq_id, self.max_blocks_per_seq, self.block_shift)
        raw = chain_arg(hashes, num_tokens, self.block_shift, seq_id).astype("<u8", copy=False).tobytes()
        chain = [raw[i:i + 8] for i in range(0, len(raw), 8)]  # vLLM's Request holds its hashes as bytes
        if self._lens[seq_id]:
            self._fail(E_ACTIVE, seq_id)
        need = self._cached_need(num_tokens, chain)
        if need > self.num_free_blocks():
            self._fail(E_NO_BLOCKS, seq_id, need=need)
        hit_tokens = self._admit(self._new_request(seq_id, num_tokens, chain))
        self._lens[seq_id] = num_tokens
        return hit_tokens

    def seal(self, seq_id: int, block_hash: int) -> bool:
        """Cache the sequence's full last block under ``block_hash``; False when another block carries it."""
        seq_id = self._active(seq_id)
        key_hash = hash_arg(block_hash, seq_id).to_bytes(8, "little")
        n = self._lens[seq_id]
        if n & (self.block_size - 1):
            self._fail(E_NOT_FULL, seq_id)
        request = self.requests[seq_id]
        manager = self.single_type_manager
        last = self.req_to_blocks[request.request_id][-1]
        if last.block_hash is not None:
            self._fail(E_SEALED, seq_id)
        num_full = n >> self.block_shift
        hashes = request.block_hashes
        del hashes[num_full - 1:]  # the hash of the block that filled, in its place in the chain
        hashes.extend([None] * (num_full - 1 - len(hashes)))
        hashes.append(key_hash)
        cached = manager.num_cached_block
        cached[request.request_id] = min(cached.get(request.request_id, 0), num_full - 1)
        self.kv_cache_manager.coordinator.cache_blocks(request, n)
        return last.block_hash is not None

    def num_cached_blocks(self) -> int:
        """Blocks that carry a hash (each hash maps to one block under the contract)."""
        return len(self.block_pool.cached_block_hash_to_block)

    def _fork(self, parent_id: int, child_id: int) -> None:
        super()._fork(parent_id, child_id)
        parent, child = self.requests[parent_id], self.requests[child_id]
        child.block_hashes = parent.block_hashes.copy()  # the same tokens, so the same hashes
        cached = self.single_type_manager.num_cached_block
        if parent.request_id in cached:
            cached[child.request_id] = cached[parent.request_id]

