"""Contender ``"vllm-v1-pc"``: :mod:`impls.contenders.vllm_v1` with prefix caching on, vLLM v1's default."""

from __future__ import annotations

import itertools

import numpy as np

from impls.contenders.vllm_v1 import (
    FullAttentionManager,
    KVCacheCoordinator,
    KVCacheManager,
    Request,
    VllmV1BlockManager,
    cdiv,
)
from impls.contenders.vllm_v1_pool import BlockPool, KVCacheBlock
from impls.contract import (
    E_ACTIVE,
    E_NO_BLOCKS,
    E_NOT_FULL,
    E_SEALED,
    blocks_for,
)
from impls.core.validation import chain_arg, hash_arg, seq_arg, tokens_arg


def make_block_hash_with_group_id(block_hash: bytes, group_id: int) -> bytes:
    """The map's key: the block hash followed by the group id in 4 big-endian bytes (a new ``bytes``)."""
    return block_hash + group_id.to_bytes(4, "big", signed=False)


def cached_need(get_one_block, keys, num_tokens: int, block_size: int) -> int:
    """Free blocks an admission of chain ``keys`` consumes, as ``get_num_blocks_to_allocate`` counts them."""
    hits = evictable = 0
    for key in keys:
        block = get_one_block(key)
        if block is None:
            break
        hits += 1
        evictable += block.ref_cnt == 0
    return blocks_for(num_tokens, block_size) - hits + evictable


class _PrefixCacheableSpec:
    """The group's ``FullAttentionSpec``, for the ``prefix_cacheable`` property ``cache_blocks`` reads."""

    @property
    def prefix_cacheable(self) -> bool:
        return True


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
        self._cache[key] = block

    def pop(self, key: bytes, block_id: int) -> KVCacheBlock | None:
        blocks = self._cache.pop(key, None)
        if blocks is None:
            return None
        if isinstance(blocks, KVCacheBlock):
            if blocks.block_id == block_id:
                return blocks
            self._cache[key] = blocks  # pragma: no cover - another block's entry: put it back, as vLLM does
            return None  # pragma: no cover
        raise AssertionError("several blocks per key never happen here")  # pragma: no cover

    def __len__(self) -> int:
        return len(self._cache)


class CachingBlockPool(BlockPool):
    """:class:`impls.contenders.vllm_v1.BlockPool` with the prefix cache: lookups, inserts, and eviction on reuse."""

    def __init__(self, num_gpu_blocks: int, hash_block_size: int) -> None:
        super().__init__(num_gpu_blocks, True, hash_block_size)
        self.enable_kv_cache_events = False
        self.cached_block_hash_to_block = BlockHashToBlockMap()
        self.cached_block_hashes_by_block: dict[int, set[bytes]] = {}
        self.evictions = 0

    def get_cached_block(self, block_hash: bytes, kv_cache_group_ids: list[int]) -> list[KVCacheBlock] | None:
        cached_blocks = []
        for group_id in kv_cache_group_ids:
            block = self.cached_block_hash_to_block.get_one_block(make_block_hash_with_group_id(block_hash, group_id))
            if not block:
                return None
            cached_blocks.append(block)
        return cached_blocks

    def cache_full_blocks(self, request: Request, blocks: list[KVCacheBlock], num_cached_blocks: int,
                          num_full_blocks: int, block_size: int, kv_cache_group_id: int,
                          block_mask: list[bool] | None = None) -> None:
        """Give ``blocks[num_cached_blocks:num_full_blocks]`` their hashes from ``request.block_hashes``."""
        if num_cached_blocks >= num_full_blocks:
            return
        new_full_blocks = blocks[num_cached_blocks:num_full_blocks]
        new_block_hashes = request.block_hashes[num_cached_blocks:]
        for i, blk in enumerate(new_full_blocks):
            block_hash = new_block_hashes[i]
            if blk.is_null or block_hash is None or blk.block_hash is not None:
                continue
            self._insert_block_hash(make_block_hash_with_group_id(block_hash, kv_cache_group_id), blk)

    def _insert_block_hash(self, key: bytes, block: KVCacheBlock) -> None:
        if block.block_hash == key:
            return  # pragma: no cover - skipped above
        if self.cached_block_hash_to_block.get_one_block(key) is not None:
            return
        block.set_block_hash(key)
        self.cached_block_hash_to_block.insert(key, block)

    def _remove_cached_block_hashes(self, block: KVCacheBlock) -> list[bytes]:
        keys: list[bytes] = []
        if block.block_hash is not None:
            keys.append(block.block_hash)
        keys.extend(self.cached_block_hashes_by_block.pop(block.block_id, ()))
        if not keys:
            return []
        removed = [key for key in keys if self.cached_block_hash_to_block.pop(key, block.block_id) is not None]
        block.reset_hash()
        return removed

    def _maybe_evict_cached_block(self, block: KVCacheBlock) -> bool:
        if self.metrics_collector:  # pragma: no cover - metrics are left out
            self.metrics_collector.on_block_evicted(block)
        if not self._remove_cached_block_hashes(block):
            return False
        self.evictions += 1
        return True


class CachingFullAttentionManager(FullAttentionManager):
    """``FullAttentionManager`` with prefix caching: hits, ``num_cached_block``, caching."""

    def __init__(self, block_pool: CachingBlockPool, block_size: int, enable_caching: bool = True,
                 kv_cache_group_id: int = 0) -> None:
        super().__init__(block_pool, block_size, enable_caching, kv_cache_group_id)
        self.kv_cache_spec = _PrefixCacheableSpec()
        self.use_eagle = False
        self.cache_hit_alignment_tokens = block_size

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
        hit_length -= hit_length % block_size
        num_blocks = cdiv(hit_length, block_size)
        for computed in computed_blocks:
            del computed[num_blocks:]
        return computed_blocks, hit_length

    @classmethod
    def reachable_block_mask(cls, start_block: int, end_block: int, alignment_tokens: int | None, kv_cache_spec,
                             use_eagle: bool, retention_interval: int | None = None,
                             reachable_boundaries=(), dcp_world_size: int = 1) -> None:
        return None

    def cache_blocks(self, request: Request, num_tokens: int, retention_interval: int | None = None, *,
                     replay_boundaries: tuple[int, ...]) -> None:
        """``FullAttentionManager.cache_blocks``: the base class's, then the partial tail (none at one size)."""
        self._cache_full(request, num_tokens, retention_interval=retention_interval,
                         replay_boundaries=replay_boundaries)
        if self.block_size == self.block_pool.hash_block_size:
            return

    def _cache_full(self, request: Request, num_tokens: int, retention_interval: int | None = None, *,
                    replay_boundaries: tuple[int, ...]) -> None:
        """``SingleTypeKVCacheManager.cache_blocks``: caches the full blocks the request's hashes cover."""
        if not self.kv_cache_spec.prefix_cacheable:
            return  # pragma: no cover
        num_cached_blocks = self.num_cached_block.get(request.request_id, 0)
        num_hashed_tokens = len(request.block_hashes) * self.block_pool.hash_block_size
        num_full_blocks = min(num_tokens, num_hashed_tokens) // self.block_size
        if num_cached_blocks >= num_full_blocks:
            return
        reachable_boundaries = [*replay_boundaries]
        if request.shared_prefix_boundary:
            reachable_boundaries.append(request.shared_prefix_boundary)  # pragma: no cover
        block_mask = self.reachable_block_mask(
            start_block=num_cached_blocks, end_block=num_full_blocks, alignment_tokens=self.cache_hit_alignment_tokens,
            kv_cache_spec=self.kv_cache_spec, use_eagle=self.use_eagle, retention_interval=retention_interval,
            reachable_boundaries=reachable_boundaries)
        self.block_pool.cache_full_blocks(
            request=request, blocks=self.req_to_blocks[request.request_id], num_cached_blocks=num_cached_blocks,
            num_full_blocks=num_full_blocks, block_size=self.block_size, kv_cache_group_id=self.kv_cache_group_id,
            block_mask=block_mask)
        self.num_cached_block[request.request_id] = num_full_blocks


class UnitaryKVCacheCoordinator(KVCacheCoordinator):
    """The coordinator of a model with one KV-cache group and caching on."""

    manager_class = CachingFullAttentionManager

    def __init__(self, block_pool: CachingBlockPool, block_size: int) -> None:
        super().__init__(block_pool, block_size, True)
        self.block_size = block_size

    def find_longest_cache_hit(self, block_hashes: list, max_cache_hit_length: int) -> tuple[tuple, int, int]:
        hit_blocks, hit_length = self.single_type_managers[0].find_longest_cache_hit(
            block_hashes=block_hashes, max_length=max_cache_hit_length, kv_cache_group_ids=[0],
            block_pool=self.block_pool, block_size=self.block_size)
        return hit_blocks, hit_length, 0


class CachingKVCacheManager(KVCacheManager):
    """``KVCacheManager(enable_caching=True)``: its coordinator and pool with the prefix cache."""

    enable_caching = True

    def _coordinator(self, num_gpu_blocks: int, block_size: int) -> KVCacheCoordinator:
        return UnitaryKVCacheCoordinator(CachingBlockPool(num_gpu_blocks, block_size), block_size)


class VllmV1CachingBlockManager(VllmV1BlockManager):
    """Contender ``"vllm-v1-pc"``: vLLM v1's ``KVCacheManager`` with prefix caching on (its default)."""

    prefix_caching = True

    kv_cache_manager_class = CachingKVCacheManager

    def _allocate(self, seq_id: int, num_blocks: int) -> None:
        request = self._new_request(seq_id, self._admit_tokens)
        self._admit(request, request.num_tokens)  # the contract: no cap at num_tokens - 1

    def allocate_cached(self, seq_id: int, num_tokens: int, hashes: np.ndarray) -> int:
        """Admit a prompt whose full blocks have the hash chain ``hashes``; returns the tokens served cached."""
        seq_id = seq_arg(seq_id, self.max_seqs)
        num_tokens = tokens_arg(num_tokens, seq_id, self.max_blocks_per_seq, self.block_shift)
        raw = chain_arg(hashes, num_tokens, self.block_shift, seq_id).astype("<u8", copy=False).tobytes()
        chain = [raw[i:i + 8] for i in range(0, len(raw), 8)]
        if self._lens[seq_id]:
            self._fail(E_ACTIVE, seq_id)
        need = cached_need(self.block_pool.cached_block_hash_to_block.get_one_block,
                           (make_block_hash_with_group_id(h, 0) for h in chain), num_tokens, self.block_size)
        if need > self.num_free_blocks():
            self._fail(E_NO_BLOCKS, seq_id, need=need)
        request = self._new_request(seq_id, num_tokens, chain)
        hit_tokens = self._admit(request, num_tokens)
        self._lens[seq_id] = num_tokens
        return hit_tokens

    def seal(self, seq_id: int, block_hash: int) -> bool:
        """Cache the sequence's full last block under ``block_hash``; False when another block carries it."""
        seq_id, request, key_hash, n, last = sealable(self, seq_id, block_hash, self._blocks, 8)
        manager = self.single_type_manager
        num_full = n >> self.block_shift
        hashes = request.block_hashes
        del hashes[num_full - 1:]
        hashes.extend([None] * (num_full - 1 - len(hashes)))
        hashes.append(key_hash)
        cached = manager.num_cached_block
        cached[request.request_id] = min(cached.get(request.request_id, 0), num_full - 1)
        self.kv_cache_manager.coordinator.cache_blocks(request, n)
        return last.block_hash is not None

    def _blocks(self, seq_id: int) -> list[KVCacheBlock]:
        return self.req_to_blocks[self.requests[seq_id].request_id]

    def num_cached_blocks(self) -> int:
        return len(self.block_pool.cached_block_hash_to_block)

    def _fork(self, parent_id: int, child_id: int) -> None:
        super()._fork(parent_id, child_id)
        parent, child = self.requests[parent_id], self.requests[child_id]
        cached = self.single_type_manager.num_cached_block
        if parent.request_id in cached:
            cached[child.request_id] = cached[parent.request_id]


def sealable(mgr, seq_id: int, block_hash: int, blocks, width: int) -> tuple[int, object, bytes, int, KVCacheBlock]:
    """The contract's checks of ``seal`` on a vLLM-shaped manager; (row, its request, the hash as ``width`` bytes,
    length, last block)."""
    seq_id = mgr._active(seq_id)
    value = hash_arg(block_hash, seq_id)
    n = mgr._lens[seq_id]
    if n & (mgr.block_size - 1):
        mgr._fail(E_NOT_FULL, seq_id)
    last = blocks(seq_id)[-1]
    if last.block_hash is not None:
        mgr._fail(E_SEALED, seq_id)
    return seq_id, mgr.requests[seq_id], value.to_bytes(width, "little"), n, last
