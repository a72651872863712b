"""vLLM v1's own ``KVCacheManager`` behind our contract, for the contenders ``vllm-v1`` and ``vllm-v1-pc``.
Design: docs/output.md#harnessenginesvllm_enginepy."""

from __future__ import annotations

import itertools
import logging
import typing
from collections import abc
from types import SimpleNamespace

import numpy as np

from harness.base.replay import ReplayError
from harness.engines.adapter import EngineAdapter
from harness.engines.catalog import Baseline
from harness.engines.eras import Era, era_of
from harness.engines.fan_out import fan_out_forks
from harness.engines.loader import ImportPlan, Piece
from impls.contenders.vllm_v1_pc import cached_need, sealable
from impls.contract import E_ACTIVE, E_NO_BLOCKS, NoFreeBlocksError
from impls.core.validation import chain_arg, seq_arg, tokens_arg

REAL = (
    "vllm.v1.core.kv_cache_manager", "vllm.v1.core.kv_cache_coordinator", "vllm.v1.core.single_type_kv_cache_manager",
    "vllm.v1.core.block_pool", "vllm.v1.core.kv_cache_utils", "vllm.v1.core.kv_cache_metrics", "vllm.v1.request",
    "vllm.v1.kv_cache_interface", "vllm.v1.kv_cache_spec_registry", "vllm.v1.kv_cache_layout",
    "vllm.v1.hisparse.block_pool", "vllm.utils", "vllm.utils.math_utils",
)


class _PrefillStats:
    """Stands for ``vllm.v1.metrics.stats.PrefillStats``, which every ``Request`` creates (metrics)."""


class _StructuredOutputRequest:
    """Stands for ``vllm.v1.structured_output.request.StructuredOutputRequest``: no structured output."""

    @staticmethod
    def from_sampling_params(sampling_params) -> None:
        return None


def _two(computed: tuple) -> tuple:
    """``get_computed_blocks``' answer up to 0.25: (blocks, hits)."""
    blocks, hits = computed
    return blocks, hits


def _three(computed: tuple) -> tuple:
    """``get_computed_blocks``' answer from 0.26: (blocks, hits, shared-prefix boundary)."""
    blocks, hits, _boundary = computed
    return blocks, hits


_OLD = {"vllm.utils.mem_utils": {}}  # format_gib, for the KV-cache planning's messages (not a replay's code)
_RETAINED = {**_OLD, "vllm.envs": {"VLLM_PREFIX_CACHE_RETENTION_INTERVAL": None}}  # its default: not set


def _update(request) -> None:
    """A request's hashes of its newly full blocks, from 0.16: ``update_block_hashes``."""
    request.update_block_hashes()


def _extend(request) -> None:
    """Up to 0.15, as ``append_output_token_ids`` updates them: ``get_hash_new_full_blocks`` appended."""
    request.block_hashes.extend(request.get_hash_new_full_blocks())


def _drive(scheduler_block_size: bool, computed, eos_token_id: bool = False, update_hashes=_update) -> dict:
    """How the adapter calls an era's code: KVCacheManager's keywords, get_computed_blocks' answer, Request's."""
    return {"scheduler_block_size": scheduler_block_size, "computed": computed, "eos_token_id": eos_token_id,
            "update_hashes": update_hashes}


_EOS = _drive(False, _two, eos_token_id=True, update_hashes=_extend)
ERAS = (
    Era("0.12.0", "0.13.0", "the first release the plan drives", {"vllm.utils.mem_constants": {}}, drive=_EOS),
    Era("0.14.0", "0.15.1", "kv_cache_utils takes its sizes from vllm.utils.mem_utils, not mem_constants", _OLD,
        drive=_EOS),
    Era("0.16.0", "0.16.0", "Request.update_block_hashes hashes its newly full blocks", _OLD,
        drive=_drive(False, _two, eos_token_id=True)),
    Era("0.17.0", "0.22.1", "Request no longer takes eos_token_id", _OLD,
        drive=_drive(False, _two)),
    Era("0.23.0", "0.25.1", "KVCacheManager takes scheduler_block_size; the coordinator reads "
        "vllm.envs.VLLM_PREFIX_CACHE_RETENTION_INTERVAL", _RETAINED,
        drive=_drive(True, _two)),
    Era("0.26.0", "0.28.0", "get_computed_blocks answers a third value (the shared-prefix boundary)", _RETAINED,
        drive=_drive(True, _three)),
    Era("0.29.0", "0.29.0", "the retention interval is read from KVCacheConfig, no longer from vllm.envs", _OLD,
        drive=_drive(True, _three)),
    Era("0.30.0", "0.32.0", "kv_cache_utils imports vllm.v1.hisparse.layout (the KV-cache planning's)",
        {**_OLD, "vllm.v1.hisparse.layout": {}}, drive=_drive(True, _three)),
    Era("0.33.0", "0.33.0", "the KV-cache planning moved out of kv_cache_utils (kv_cache_planning, not imported)",
        drive=_drive(True, _three)),
    Era("0.34.0", "0.34.0", "requests keep their tokens in vllm.v1.token_buffer; the block pool and requests untrack "
        "their objects from the garbage collector (vllm.utils.gc_utils)",
        real=("vllm.utils.gc_utils", "vllm.v1.token_buffer", "vllm.utils.collection_utils"),
        drive=_drive(True, _three)),
)
BEFORE = ("before 0.12.0 KVCacheManager takes no hash_block_size (0.11.x: the block size is the KV-cache spec's), "
          "and 0.11.0's vllm/utils/__init__.py, which the plan runs, imports cachetools")


def era(version: str | None = None) -> Era:
    """The era of :data:`ERAS` that drives ``version`` (None: the newest); :class:`InputError` when none does."""
    return era_of(ERAS, "vllm", version, BEFORE)


def plan(version: str | None = None) -> ImportPlan:
    """How vLLM's modules are imported: :data:`REAL` from the wheel, the rest stand-ins (by ``version``'s era)."""
    e = era(version)
    off_path = ("vllm.envs", "vllm.distributed.kv_events", "vllm.multimodal.inputs", "vllm.multimodal.utils",
                "vllm.pooling_params", "vllm.sampling_params", "vllm.utils.hashing", "vllm.utils.torch_utils",
                "vllm.v1.attention.backends.registry", "vllm.v1.engine", "vllm.v1.kv_hints")
    stubs: dict[str, dict] = {name: {} for name in off_path}
    stubs.update({
        "vllm.logger": {"init_logger": logging.getLogger},
        "vllm.config": {"get_current_vllm_config_or_none": lambda: None},
        "vllm.platforms": {"current_platform": SimpleNamespace(register_custom_kv_cache_specs=lambda config: None)},
        "vllm.v1.metrics.stats": {"PrefillStats": _PrefillStats},
        "vllm.v1.structured_output.request": {"StructuredOutputRequest": _StructuredOutputRequest},
        **e.stubs,
    })
    typing_names = {"TypeVar": typing.TypeVar, "Generic": typing.Generic, "Sequence": abc.Sequence,
                    "overload": typing.overload}
    return ImportPlan(packages=("vllm",), real=REAL + e.real, stubs=stubs,
                      pieces={"vllm.v1.utils": Piece("vllm.v1.utils", ("T", "ConstantList"), typing_names)})


def load(version: str | None = None) -> SimpleNamespace:
    """The engine's classes the adapter uses (inside :func:`harness.engines.loader.engine_imports`), and how
    ``version``'s era is driven."""
    from vllm.v1.core.kv_cache_manager import KVCacheManager
    from vllm.v1.core.kv_cache_utils import make_block_hash_with_group_id
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.request import Request, RequestStatus

    return SimpleNamespace(KVCacheManager=KVCacheManager, FullAttentionSpec=FullAttentionSpec,
                           KVCacheConfig=KVCacheConfig, KVCacheGroupSpec=KVCacheGroupSpec, Request=Request,
                           RequestStatus=RequestStatus, make_block_hash_with_group_id=make_block_hash_with_group_id,
                           **era(version).drive)


class VllmEngine(EngineAdapter):
    """vLLM's ``KVCacheManager`` (the engine's, imported) driven per request per step, as its scheduler does."""

    vllm: SimpleNamespace
    enable_caching = False
    hash_plain = False
    prefix_caching = False

    def __init__(self, num_blocks: int, block_size: int = 16, max_seqs: int = 256,
                 max_blocks_per_seq: int = 256) -> None:
        super().__init__(num_blocks, block_size, max_seqs, max_blocks_per_seq)
        import torch  # vLLM's KV-cache spec names a dtype; the manager never touches a tensor

        v = self.vllm
        spec = v.FullAttentionSpec(block_size=self.block_size, num_kv_heads=1, head_size=1, dtype=torch.float16)
        config = v.KVCacheConfig(num_blocks=self.num_blocks + 1, kv_cache_tensors=[],
                                 kv_cache_groups=[v.KVCacheGroupSpec(["layer.0"], spec)])
        sizes = {"scheduler_block_size": self.block_size} if v.scheduler_block_size else {}
        self.manager = v.KVCacheManager(config, max_model_len=self.max_tokens, hash_block_size=self.block_size,
                                        enable_caching=self.enable_caching, **sizes)
        self._computed = v.computed
        self._request_kw = {"eos_token_id": None} if v.eos_token_id else {}
        self.pool = self.manager.block_pool
        self.free_queue = getattr(self.pool, "free_block_queue", None)
        self.req_to_blocks = self.manager.coordinator.single_type_managers[0].req_to_blocks
        self.requests: list = [None] * self.max_seqs
        self.params = SimpleNamespace(max_tokens=self.max_tokens, extra_args=None, skip_reading_prefix_cache=None,
                                      prompt_logprobs=None, prompt_logprob_token_ids=None, prompt_logprob_start=None)
        self._ids = itertools.count(1)
        self._digests = itertools.count(1)
        self._given: dict[str, list[bytes]] = {}
        caching = self.enable_caching
        self._plain_hasher = self._distinct_digests if caching and self.hash_plain else None
        self._cached_hasher = self._given_hashes if caching else None

    def num_free_blocks(self) -> int:
        """The contract's checks read the pool's free queue as the contenders' do (an attribute, no call; vLLM's own
        calls of ``get_num_free_blocks`` are the engine's, these the harness's), where the pool has the queue."""
        queue = self.free_queue
        return queue.num_free_blocks if queue is not None else self.pool.get_num_free_blocks()

    def _given_hashes(self, request) -> list[bytes]:
        """The hashes the trace gave for the request (``allocate_cached``'s chain, a ``seal``'s hash), once."""
        return self._given.pop(request.request_id, [])

    def _distinct_digests(self, request) -> list[bytes]:
        """A distinct 32-byte digest for each newly full block (vLLM hashes every full block with caching on)."""
        new = request.num_tokens // self.block_size - len(request.block_hashes)
        return [next(self._digests).to_bytes(32, "little") for _ in range(new)] if new > 0 else []

    def _admit(self, seq_id: int, num_tokens: int, chain: list[bytes] | None = None) -> int:
        """A new request, its cache lookup and its prompt's slots, as ``Scheduler.schedule`` admits one."""
        v = self.vllm
        request_id = str(next(self._ids))
        if chain is not None:
            self._given[request_id] = chain
        hasher = self._plain_hasher if chain is None else self._cached_hasher
        request = v.Request(request_id, [0] * num_tokens, self.params, None, block_hasher=hasher, **self._request_kw)
        self.requests[seq_id] = request
        blocks, hits = self._computed(self.manager.get_computed_blocks(request))
        if self.manager.allocate_slots(request, num_tokens - hits, hits, blocks) is None:
            raise NoFreeBlocksError(f"vLLM's allocate_slots refused the admission of row {seq_id}")
        request.status = v.RequestStatus.RUNNING
        request.num_computed_tokens = num_tokens
        return hits

    def _allocate(self, seq_id: int, num_blocks: int) -> None:
        self._admit(seq_id, self._admit_tokens)

    def _append(self, seq_id: int) -> None:
        """One running request's decode token, as ``Scheduler.schedule`` takes it: ``allocate_slots(request, 1)``
        (its slot from ``_last_slot``; a decode step makes both per request, as our contenders' does)."""
        request = self.requests[seq_id]
        if self.manager.allocate_slots(request, 1) is None:
            raise NoFreeBlocksError(f"vLLM's allocate_slots refused row {seq_id}'s decode token")
        request.num_computed_tokens += 1
        self._lens[seq_id] += 1
        self._sampled.append(seq_id)

    def _record(self, seq_id: int) -> None:
        """The request's sampled token (``append_output_token_ids``, which runs its block hasher)."""
        self.requests[seq_id].append_output_token_ids(0)

    def _last_shared(self, seq_id: int) -> bool:
        return False

    def _fork(self, parent_id: int, child_id: int) -> None:
        raise ReplayError("vLLM v1 has no fork: replay the trace with its forks fanned out into requests")

    def _free(self, seq_id: int) -> None:
        request = self.requests[seq_id]
        self.requests[seq_id] = None
        self._given.pop(request.request_id, None)
        self.manager.free(request)

    def _blocks(self, seq_id: int) -> list:
        return self.req_to_blocks[self.requests[seq_id].request_id]

    def _table(self, seq_id: int) -> list[int]:
        return [block.block_id - 1 for block in self._blocks(seq_id)]

    def _ref(self, block_id: int) -> int:
        return self.pool.blocks[block_id + 1].ref_cnt

    def _last_slot(self, seq_id: int) -> int:
        n = self._lens[seq_id] - 1
        block = self.req_to_blocks[self.requests[seq_id].request_id][n // self.block_size]
        return (block.block_id - 1) * self.block_size + n % self.block_size


class VllmCachingEngine(VllmEngine):
    """:class:`VllmEngine` with prefix caching on (vLLM's default): the contract's caching part too."""

    enable_caching = True
    prefix_caching = True

    def _key(self, block_hash: bytes) -> bytes:
        return self.vllm.make_block_hash_with_group_id(block_hash, 0)

    def allocate_cached(self, seq_id: int, num_tokens: int, hashes: np.ndarray) -> int:
        """Admit a prompt whose full blocks carry ``hashes`` (handed to vLLM as 32-byte block hashes)."""
        self._recorded()
        seq_id = seq_arg(seq_id, self.max_seqs)
        num_tokens = tokens_arg(num_tokens, seq_id, self.max_blocks_per_seq, self.block_shift)
        chain = [int(h).to_bytes(32, "little") for h in chain_arg(hashes, num_tokens, self.block_shift, seq_id)]
        if self._lens[seq_id]:
            self._fail(E_ACTIVE, seq_id)
        keys = (self._key(block_hash) for block_hash in chain)
        need = cached_need(self.pool.cached_block_hash_to_block.get_one_block, keys, num_tokens, self.block_size)
        if need > self.num_free_blocks():
            self._fail(E_NO_BLOCKS, seq_id, need=need)
        hits = self._admit(seq_id, num_tokens, chain)
        self._lens[seq_id] = num_tokens
        return hits

    def seal(self, seq_id: int, block_hash: int) -> bool:
        """Hand vLLM the hash of the block decode just filled and cache it; False when another block has it."""
        seq_id, request, digest, n, _ = sealable(self, seq_id, block_hash, self._blocks, 32)
        if len(request.block_hashes) != (n >> self.block_shift) - 1:
            raise ReplayError(f"row {seq_id}: vLLM needs the hashes of all its full blocks, in order; the trace "
                              f"seals block {n >> self.block_shift} after {len(request.block_hashes)}")
        taken = self.pool.cached_block_hash_to_block.get_one_block(self._key(digest)) is not None
        self._given[request.request_id] = [digest]
        self.vllm.update_hashes(request)
        self.manager.cache_blocks(request, n)
        return not taken

    def num_cached_blocks(self) -> int:
        return len(self.pool.cached_block_hash_to_block)


def _bound(cls: type, vllm: SimpleNamespace, **attrs) -> type:
    return type(cls.__name__, (cls,), {"vllm": vllm, **attrs})


HOW = ("vLLM {version}'s KVCacheManager(enable_caching={caching}) from the wheel, driven as its scheduler does: "
       "Request + get_computed_blocks + allocate_slots(request, prompt - hits, hits, blocks) at admission, "
       "allocate_slots(request, 1) per running request per step and the slot from its blocks, the sampled token "
       "recorded after the step (append_output_token_ids, untimed: vLLM's asynchronous-scheduling order), "
       "free(request); "
       "block hasher: {hasher}")


def baselines(vllm: SimpleNamespace, version: str) -> list[Baseline]:
    """Caching off (``vllm-v1``), caching on (vLLM's default, ``vllm-v1-pc``), and on without plain-block hashes."""
    fan = "vLLM v1 has no fork: each fork of the trace became an independent request of the parent's length " \
          "(vLLM fans n > 1 out into n requests), no sharing, no copy-on-write, checked against that trace"
    both = ("vllm-v1", "vllm-v1-pc")
    return [
        Baseline("caching off", _bound(VllmEngine, vllm), both, ("vllm-v1",),
                 HOW.format(version=version, caching=False, hasher="none"),
                 real_trace=fan_out_forks, real_trace_how=fan, engine_object="manager"),
        Baseline("caching on", _bound(VllmCachingEngine, vllm, hash_plain=True), both, ("vllm-v1-pc",),
                 HOW.format(version=version, caching=True,
                            hasher="a distinct 32-byte digest per full block of a plain allocation, the trace's "
                                   "hashes (as 32-byte digests) for allocate_cached and seal; hashing not timed"),
                 caching_traces=True, real_trace=fan_out_forks, real_trace_how=fan, engine_object="manager"),
        Baseline("caching on, no block hashes", _bound(VllmCachingEngine, vllm, hash_plain=False), ("vllm-v1-pc",),
                 (), HOW.format(version=version, caching=True, hasher="none (nothing looked up or cached)"),
                 real_trace=fan_out_forks, real_trace_how=fan, engine_object="manager"),
    ]
