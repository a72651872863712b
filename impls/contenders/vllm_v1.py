"""Contender ``"vllm-v1"``: vLLM v1's KV-cache manager as its scheduler drives it, re-written from vLLM 0.33.0."""

from __future__ import annotations

import enum
import sys
from abc import ABC, abstractmethod
from collections import defaultdict
from dataclasses import dataclass

from impls.contenders.vllm_v1_pool import BlockPool, KVCacheBlock, trim_null_head
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
    """What of ``vllm.v1.request.Request`` the KV-cache manager reads: counters, the status, the block hashes."""

    __slots__ = (
        "_num_tokens",
        "block_hashes",
        "num_computed_tokens",
        "num_in_flight_tokens",
        "num_prompt_tokens",
        "request_id",
        "shared_prefix_boundary",
        "skip_reading_prefix_cache",
        "status",
    )

    def __init__(self, request_id: str, num_tokens: int, block_hashes: list | None = None) -> None:
        self.request_id = request_id
        self.status = RequestStatus.WAITING
        self.num_prompt_tokens = num_tokens
        self._num_tokens = num_tokens
        self.num_computed_tokens = 0
        self.num_in_flight_tokens = 0
        self.block_hashes = [] if block_hashes is None else block_hashes
        self.skip_reading_prefix_cache = False
        self.shared_prefix_boundary = 0

    @property
    def num_tokens(self) -> int:
        return self._num_tokens


class SingleTypeKVCacheManager(ABC):
    """One KV-cache group's blocks per request (vLLM's abstract ``SingleTypeKVCacheManager``)."""

    def __init__(self, block_pool: BlockPool, block_size: int, enable_caching: bool = False,
                 kv_cache_group_id: int = 0) -> None:
        self.block_pool = block_pool
        self.block_size = block_size
        self.enable_caching = enable_caching
        self.kv_cache_group_id = kv_cache_group_id
        self.max_admission_blocks_per_request: int | None = None
        self.req_to_blocks: defaultdict[str, list[KVCacheBlock]] = defaultdict(list)
        self.num_cached_block: dict[str, int] = {}
        self._partial_hit_reqs: dict[str, tuple[int, KVCacheBlock]] = {}
        self.new_block_ids: list[int] = []
        self._record_new_block_ids = False
        self._null_block = block_pool.null_block
        self.cow: tuple[int, int] | None = None

    def get_num_skipped_tokens(self, num_computed_tokens: int) -> int:
        return 0

    @classmethod
    def _get_num_evictable_blocks(cls, blocks) -> int:
        return sum(b.ref_cnt == 0 and not b.is_null for b in blocks)

    def _has_partial_local_hit(self, new_computed_blocks, num_local_computed_tokens: int) -> bool:
        return len(new_computed_blocks) > 0 and num_local_computed_tokens % self.block_size != 0

    def get_num_blocks_to_allocate(self, request_id: str, num_tokens: int, new_computed_blocks,
                                   total_computed_tokens: int, num_local_computed_tokens: int,
                                   num_tokens_main_model: int, apply_admission_cap: bool = False,
                                   prefill_end: int = 0) -> int:
        num_required_blocks = cdiv(num_tokens, self.block_size)
        if apply_admission_cap and self.max_admission_blocks_per_request is not None:  # pragma: no cover
            num_required_blocks = min(num_required_blocks, self.max_admission_blocks_per_request)
        req_blocks = self.req_to_blocks.get(request_id, ())
        num_req_blocks = len(req_blocks)
        if request_id in self.num_cached_block:
            assert len(new_computed_blocks) == 0
            num_new_blocks = max(num_required_blocks - num_req_blocks, 0)
            if num_new_blocks == 0 and num_req_blocks and req_blocks[-1].ref_cnt > 1:
                num_new_blocks = 1  # ours: the shared last block will be copied
            return num_new_blocks
        num_skipped_tokens = self.get_num_skipped_tokens(total_computed_tokens)
        num_local_computed_blocks = len(new_computed_blocks) + num_req_blocks
        num_skipped_blocks = num_skipped_tokens // self.block_size
        num_new_blocks = max(num_required_blocks - max(num_skipped_blocks, num_local_computed_blocks), 0)
        skipped_new = max(0, num_skipped_blocks - num_req_blocks)
        num_evictable = self._get_num_evictable_blocks(new_computed_blocks[skipped_new:])
        if self._has_partial_local_hit(new_computed_blocks, num_local_computed_tokens):
            num_new_blocks += 1
        if num_new_blocks == 0 and num_req_blocks and req_blocks[-1].ref_cnt > 1:
            num_new_blocks = 1  # ours: the shared last block will be copied
        return num_new_blocks + num_evictable

    def remove_skipped_blocks(self, request_id: str, processed_computed_tokens: int,
                              num_prompt_tokens: int | None = None) -> None:
        del num_prompt_tokens
        num_skipped_tokens = self.get_num_skipped_tokens(processed_computed_tokens)
        if num_skipped_tokens <= 0:
            return
        raise AssertionError("full attention never skips blocks")  # pragma: no cover

    def allocate_new_blocks(self, request_id: str, num_tokens: int, num_tokens_main_model: int) -> list[KVCacheBlock]:
        cow_blocks: list[KVCacheBlock] = []
        if request_id in self._partial_hit_reqs:  # pragma: no cover - partial hits are left out
            raise AssertionError("partial prefix-cache hits are left out")
        req_blocks = self.req_to_blocks[request_id]
        num_new_blocks = cdiv(num_tokens, self.block_size) - len(req_blocks)
        if num_new_blocks <= 0:
            src = req_blocks[-1]
            if src.ref_cnt == 1 or src.block_hash is not None:
                return cow_blocks
            return [self._copy_on_write(req_blocks, src)]
        new_blocks = self.block_pool.get_new_blocks(num_new_blocks)
        req_blocks.extend(new_blocks)
        if self._record_new_block_ids:  # pragma: no cover - KV zeroing is left out
            self.new_block_ids.extend(b.block_id for b in new_blocks)
        return cow_blocks + new_blocks

    def add_local_computed_blocks(self, request_id: str, new_computed_blocks: list[KVCacheBlock],
                                  num_local_computed_tokens: int, num_external_computed_tokens: int) -> None:
        """A first allocation's prefix-cache hits: touched, then the request's first blocks."""
        req_blocks = self.req_to_blocks[request_id]
        assert len(req_blocks) == 0
        num_skipped_blocks = self.get_num_skipped_tokens(num_local_computed_tokens + num_external_computed_tokens) \
            // self.block_size
        if self.enable_caching:
            self.block_pool.touch(new_computed_blocks)
        else:  # pragma: no cover - no hit without caching
            assert not any(new_computed_blocks), "hits with prefix caching off"
        req_blocks.extend([self._null_block] * num_skipped_blocks)
        req_blocks.extend(new_computed_blocks)
        self.num_cached_block[request_id] = len(req_blocks)
        if self._has_partial_local_hit(new_computed_blocks, num_local_computed_tokens):  # pragma: no cover
            raise AssertionError("partial prefix-cache hits are left out")

    def _copy_on_write(self, req_blocks: list[KVCacheBlock], src: KVCacheBlock) -> KVCacheBlock:
        dst = self.block_pool.get_new_blocks(1)[0]
        src.ref_cnt -= 1
        req_blocks[-1] = dst
        self.cow = (src.block_id, dst.block_id)
        return dst

    def add_forked_blocks(self, parent_id: str, child_id: str) -> None:
        blocks = self.req_to_blocks[parent_id]
        self.block_pool.touch(blocks)
        self.req_to_blocks[child_id] = blocks.copy()

    def pop_blocks_for_free(self, request_id: str) -> list[KVCacheBlock]:
        blocks = self.req_to_blocks.pop(request_id, [])
        self.num_cached_block.pop(request_id, None)
        self._partial_hit_reqs.pop(request_id, None)
        return trim_null_head(blocks)

    def free(self, request_id: str) -> None:
        self.block_pool.free_blocks(reversed(self.pop_blocks_for_free(request_id)))

    @abstractmethod
    def find_longest_cache_hit(self, *args, **kwargs):
        """The cached blocks heading a hash chain (each attention type its own; :mod:`.vllm_v1_pc`)."""


class FullAttentionManager(SingleTypeKVCacheManager):
    """vLLM's manager of a full-attention group (its prefix-cache lookup: :mod:`impls.contenders.vllm_v1_pc`)."""

    def find_longest_cache_hit(self, *args, **kwargs):  # pragma: no cover - caching off never looks up
        raise NotImplementedError("prefix caching is off")


class CrossAttentionManager(SingleTypeKVCacheManager):
    """Stands for vLLM's encoder-decoder manager: never made here, tested against by the coordinator."""

    def find_longest_cache_hit(self, *args, **kwargs):  # pragma: no cover
        raise NotImplementedError


def replay_boundaries(num_prompt_tokens: int, scheduler_block_size: int, use_eagle: bool) -> tuple[int, ...]:
    """Positions a later request replaying the prompt resumes at (without EAGLE: the last prompt token)."""
    if not use_eagle:
        return (num_prompt_tokens - 1,)
    raise NotImplementedError("EAGLE is left out")  # pragma: no cover


class KVCacheCoordinator(ABC):
    """Forwards each call to every single-type manager (one here: a model with full attention only)."""

    manager_class: type[SingleTypeKVCacheManager] = FullAttentionManager

    def __init__(self, block_pool: BlockPool, block_size: int, enable_caching: bool) -> None:
        self.block_pool = block_pool
        self.scheduler_block_size = block_size
        self.num_reprefillable_tokens = 0
        self.retention_interval: int | None = None
        self.drop_eagle_group_ids: set[int] = set()
        self.single_type_managers = (self.manager_class(block_pool, block_size, enable_caching, 0),)

    def get_num_blocks_to_allocate(self, request_id: str, num_tokens: int, new_computed_blocks: tuple,
                                   num_encoder_tokens: int, total_computed_tokens: int,
                                   num_local_computed_tokens: int, num_tokens_main_model: int,
                                   apply_admission_cap: bool = False, prefill_end: int = 0) -> int:
        num_blocks_to_allocate = 0
        if self.retention_interval != 0:
            prefill_end = 0
        for i, manager in enumerate(self.single_type_managers):
            if isinstance(manager, CrossAttentionManager):  # pragma: no cover - decoder-only
                num_blocks_to_allocate += manager.get_num_blocks_to_allocate(
                    request_id, num_encoder_tokens, [], 0, 0, num_encoder_tokens,
                    apply_admission_cap=apply_admission_cap)
            else:
                num_blocks_to_allocate += manager.get_num_blocks_to_allocate(
                    request_id, num_tokens, new_computed_blocks[i], total_computed_tokens, num_local_computed_tokens,
                    num_tokens_main_model, apply_admission_cap=apply_admission_cap, prefill_end=prefill_end)
        return num_blocks_to_allocate

    def allocate_new_computed_blocks(self, request_id: str, new_computed_blocks: tuple,
                                     num_local_computed_tokens: int, num_external_computed_tokens: int) -> None:
        if any(request_id in manager.num_cached_block for manager in self.single_type_managers):
            return  # pragma: no cover - a running request has no new hits
        for i, manager in enumerate(self.single_type_managers):
            manager.add_local_computed_blocks(request_id, new_computed_blocks[i], num_local_computed_tokens,
                                              num_external_computed_tokens)

    def allocate_new_blocks(self, request_id: str, num_tokens: int, num_tokens_main_model: int,
                            num_encoder_tokens: int = 0) -> tuple[list[KVCacheBlock], ...]:
        return tuple(
            manager.allocate_new_blocks(
                request_id, num_encoder_tokens if isinstance(manager, CrossAttentionManager) else num_tokens,
                num_tokens_main_model)
            for manager in self.single_type_managers)

    def get_num_cacheable_tokens(self, num_computed_tokens: int, kv_cache_group_id: int) -> int:
        return max(0, num_computed_tokens - self.num_reprefillable_tokens)

    def cache_blocks(self, request: Request, num_computed_tokens: int) -> None:
        boundaries = replay_boundaries(request.num_prompt_tokens, self.scheduler_block_size,
                                       use_eagle=bool(self.drop_eagle_group_ids))
        for group_id, manager in enumerate(self.single_type_managers):
            if not manager.enable_caching:
                continue
            manager.cache_blocks(request, self.get_num_cacheable_tokens(num_computed_tokens, group_id),
                                 retention_interval=self.retention_interval, replay_boundaries=boundaries)

    def remove_skipped_blocks(self, request_id: str, processed_computed_tokens: int,
                              num_prompt_tokens: int | None = None) -> None:
        for manager in self.single_type_managers:
            manager.remove_skipped_blocks(request_id, processed_computed_tokens, num_prompt_tokens)

    def free(self, request_id: str) -> None:
        for manager in self.single_type_managers:
            manager.free(request_id)

    @abstractmethod
    def find_longest_cache_hit(self, block_hashes: list, max_cache_hit_length: int) -> tuple[tuple, int, int]:
        """The cached blocks heading ``block_hashes``, their tokens, and 0 (no uncached common prefix here)."""


class KVCacheCoordinatorNoPrefixCache(KVCacheCoordinator):
    """The coordinator of a manager with prefix caching off."""

    def __init__(self, block_pool: BlockPool, block_size: int) -> None:
        super().__init__(block_pool, block_size, False)
        self.num_single_type_manager = len(self.single_type_managers)

    def find_longest_cache_hit(self, block_hashes: list, max_cache_hit_length: int) -> tuple[tuple, int, int]:
        return tuple([] for _ in range(self.num_single_type_manager)), 0, 0  # pragma: no cover


@dataclass
class KVCacheBlocks:
    """``allocate_slots``'s and ``get_computed_blocks``'s result: the blocks per KV-cache group."""

    blocks: tuple


class KVCacheManager:
    """The scheduler's entry point: ``allocate_slots`` per request per step, ``free`` when it ends."""

    enable_caching = False

    def __init__(self, num_gpu_blocks: int, block_size: int, max_model_len: int) -> None:
        self.max_model_len = max_model_len
        self.watermark_blocks = 0
        self.coordinator = self._coordinator(num_gpu_blocks, block_size)
        self.block_pool = self.coordinator.block_pool
        self.retained_hit_group_ids: tuple[int, ...] = ()
        self.empty_kv_cache_blocks = KVCacheBlocks(((),))

    def _coordinator(self, num_gpu_blocks: int, block_size: int) -> KVCacheCoordinator:
        return KVCacheCoordinatorNoPrefixCache(BlockPool(num_gpu_blocks, False, block_size), block_size)

    def create_kv_cache_blocks(self, blocks: tuple[list[KVCacheBlock], ...]) -> KVCacheBlocks:
        return KVCacheBlocks(blocks) if any(blocks) else self.empty_kv_cache_blocks

    def prefix_cache_lookup_enabled(self, request: Request) -> bool:
        return self.enable_caching and not request.skip_reading_prefix_cache

    def get_computed_blocks(self, request: Request, max_cache_hit_length: int | None = None,
                            ) -> tuple[KVCacheBlocks, int, int]:
        """The cached blocks heading the request's hash chain, the tokens they hold, and 0 (no boundary)."""
        if not self.prefix_cache_lookup_enabled(request):
            return self.empty_kv_cache_blocks, 0, 0
        if max_cache_hit_length is None:
            max_cache_hit_length = request.num_tokens - 1
        computed_blocks, num_new_computed_tokens, num_uncached = self.coordinator.find_longest_cache_hit(
            request.block_hashes, max_cache_hit_length)
        boundary = num_new_computed_tokens + num_uncached if num_uncached else 0
        return self.create_kv_cache_blocks(computed_blocks), num_new_computed_tokens, boundary

    def allocate_slots(self, request: Request, num_new_tokens: int, num_new_computed_tokens: int = 0,
                       new_computed_blocks: KVCacheBlocks | None = None, num_lookahead_tokens: int = 0,
                       num_external_computed_tokens: int = 0, delay_cache_blocks: bool = False,
                       num_encoder_tokens: int = 0, full_sequence_must_fit: bool = False, reserved_blocks: int = 0,
                       has_scheduled_reqs: bool = True) -> KVCacheBlocks | None:
        """Slots for ``num_new_tokens`` more tokens, adopting the hits first; None when the pool is short."""
        if num_new_tokens == 0 and num_external_computed_tokens == 0 and num_new_computed_tokens == 0:
            raise ValueError("num_new_tokens must be greater than 0 when there are no computed tokens to adopt")
        if new_computed_blocks is not None:
            new_computed_block_list = new_computed_blocks.blocks
            if self.retained_hit_group_ids:  # pragma: no cover - no group keeps a longer hit
                raise AssertionError("retained hits are left out")
        else:
            new_computed_block_list = self.empty_kv_cache_blocks.blocks
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
                                          max(0, total_computed_tokens - request.num_in_flight_tokens),
                                          num_prompt_tokens=request.num_prompt_tokens)
        num_blocks_to_allocate = coordinator.get_num_blocks_to_allocate(
            request_id=request.request_id, num_tokens=num_tokens_need_slot,
            new_computed_blocks=new_computed_block_list, num_encoder_tokens=num_encoder_tokens,
            total_computed_tokens=num_local_computed_tokens + num_external_computed_tokens,
            num_local_computed_tokens=num_local_computed_tokens, num_tokens_main_model=num_tokens_main_model,
            prefill_end=prefill_end)
        available_blocks = self.block_pool.get_num_free_blocks() - reserved_blocks
        if num_blocks_to_allocate + watermark_blocks > available_blocks:
            return None
        if new_computed_block_list is not self.empty_kv_cache_blocks.blocks or num_external_computed_tokens > 0:
            coordinator.allocate_new_computed_blocks(request_id=request.request_id,
                                                     new_computed_blocks=new_computed_block_list,
                                                     num_local_computed_tokens=num_local_computed_tokens,
                                                     num_external_computed_tokens=num_external_computed_tokens)
        new_blocks = coordinator.allocate_new_blocks(request.request_id, num_tokens_need_slot, num_tokens_main_model,
                                                     num_encoder_tokens)
        if delay_cache_blocks:
            return self.create_kv_cache_blocks(new_blocks)  # pragma: no cover
        coordinator.cache_blocks(request, min(total_computed_tokens + num_new_tokens, request.num_tokens))
        return self.create_kv_cache_blocks(new_blocks)

    def free(self, request: Request) -> None:
        self.coordinator.free(request.request_id)


class VllmV1BlockManager(InterpretedBlockManager):
    """Contender ``"vllm-v1"``: vLLM v1's ``KVCacheManager`` driven per request per step, as its scheduler does."""

    kv_cache_manager_class = KVCacheManager

    def __init__(self, num_blocks: int, block_size: int = 16, max_seqs: int = 256,
                 max_blocks_per_seq: int = 256) -> None:
        super().__init__(num_blocks, block_size, max_seqs, max_blocks_per_seq)
        self.kv_cache_manager = self.kv_cache_manager_class(self.num_blocks + 1, self.block_size,
                                                            self.block_size * self.max_blocks_per_seq)
        pool = self.block_pool = self.kv_cache_manager.block_pool
        self.blocks = pool.blocks  # vLLM ids: blocks[k] is our block k - 1; blocks[0] is the null block
        self.free_block_queue = pool.free_block_queue
        self.single_type_manager = self.kv_cache_manager.coordinator.single_type_managers[0]
        self.req_to_blocks = self.single_type_manager.req_to_blocks
        self.requests: list[Request | None] = [None] * self.max_seqs
        self._num_requests = 0
        self._admit_tokens = 0

    def memory_bytes(self) -> int:
        per_block = 8 + sys.getsizeof(KVCacheBlock(0)) + int_object_bytes(self.num_blocks)
        return self.num_blocks * per_block + 8 * self.max_seqs

    def num_free_blocks(self) -> int:
        return self.free_block_queue.num_free_blocks

    def _new_request(self, seq_id: int, num_tokens: int, block_hashes: list | None = None) -> Request:
        self._num_requests += 1
        request = self.requests[seq_id] = Request(str(self._num_requests), num_tokens, block_hashes)
        return request

    def _admit(self, request: Request, max_cache_hit_length: int | None = None) -> int:
        """The scheduler's admission: cache lookup, then ``allocate_slots`` adopting the hits; the tokens served."""
        kv = self.kv_cache_manager
        computed, num_computed, _ = kv.get_computed_blocks(request, max_cache_hit_length)
        if kv.allocate_slots(request, request.num_tokens - num_computed, num_computed, computed) is None:
            raise AssertionError("the contract checked the pool before admission")  # pragma: no cover
        request.status = RequestStatus.RUNNING
        request.num_computed_tokens = request.num_tokens
        return num_computed

    def _allocate(self, seq_id: int, num_blocks: int) -> None:
        self._admit(self._new_request(seq_id, self._admit_tokens))

    def _last_shared(self, seq_id: int) -> bool:
        return self.req_to_blocks[self.requests[seq_id].request_id][-1].ref_cnt > 1

    def _append(self, seq_id: int) -> tuple[int, int] | None:
        request = self.requests[seq_id]
        request._num_tokens += 1
        if self.kv_cache_manager.allocate_slots(request, 1) is None:  # pragma: no cover
            raise AssertionError("the contract checked the pool before the append")
        request.num_computed_tokens += 1
        self._lens[seq_id] = request._num_tokens
        manager = self.single_type_manager
        if manager.cow is None:
            return None
        src, dst = manager.cow
        manager.cow = None
        return src - 1, dst - 1

    def _fork(self, parent_id: int, child_id: int) -> None:
        parent = self.requests[parent_id]
        child = self._new_request(child_id, parent.num_tokens, parent.block_hashes.copy())
        child.num_prompt_tokens = parent.num_prompt_tokens
        child.num_computed_tokens = parent.num_computed_tokens
        child.status = RequestStatus.RUNNING
        self.single_type_manager.add_forked_blocks(parent.request_id, child.request_id)

    def _free(self, seq_id: int) -> None:
        request = self.requests[seq_id]
        self.requests[seq_id] = None
        self.kv_cache_manager.free(request)

    def _table_nbytes(self, seq_id: int) -> int:
        return sys.getsizeof(self.req_to_blocks[self.requests[seq_id].request_id])

    def _table(self, seq_id: int) -> list[int]:
        return [block.block_id - 1 for block in self.req_to_blocks[self.requests[seq_id].request_id]]

    def _ref(self, block_id: int) -> int:
        return self.blocks[block_id + 1].ref_cnt

    def _last_slot(self, seq_id: int) -> int:
        n = self._lens[seq_id] - 1
        block = self.req_to_blocks[self.requests[seq_id].request_id][n // self.block_size]
        return (block.block_id - 1) * self.block_size + n % self.block_size
