"""SGLang's own ``PagedTokenToKVPoolAllocator`` behind our contract, for the contender ``sglang``.
Design: docs/output.md#harnessenginessglang_enginepy."""

from __future__ import annotations

import functools
import logging
import os
import types
from types import SimpleNamespace

import numpy as np

from harness.engines.adapter import EngineAdapter
from harness.engines.catalog import Baseline
from harness.engines.eras import Era, era_of
from harness.engines.loader import ImportPlan, Piece
from impls.contenders.sglang import PagedRows
from impls.contract import NoFreeBlocksError

REAL = ("sglang.srt.mem_cache.allocator.base", "sglang.srt.mem_cache.allocator.paged")
UTILS = ("is_hip", "_warned_bool_env_var_keys", "get_bool_env_var", "next_power_of_2", "get_num_new_pages")


ERAS = (Era("0.5.22", "0.5.23", "the first release the plan drives"),)
BEFORE = ("before 0.5.22 PagedTokenToKVPoolAllocator's alloc_extend and alloc_decode launch Triton kernels "
          "(alloc_extend_kernel, alloc_decode_kernel) with no CPU path; the native torch path (use_triton_kernels, "
          "from current_platform.capabilities.supports_triton) arrived in 0.5.22")


def era(version: str | None = None) -> Era:
    """The era of :data:`ERAS` that drives ``version`` (None: the newest); :class:`InputError` when none does."""
    return era_of(ERAS, "sglang", version, BEFORE)


def plan(version: str | None = None) -> ImportPlan:
    """How SGLang's modules are imported: the allocator from the wheel, four utilities compiled from theirs."""
    import torch

    era(version)

    cpu = SimpleNamespace(capabilities=SimpleNamespace(supports_triton=False))
    return ImportPlan(
        packages=("sglang",), real=REAL,
        stubs={"sglang.kernels.ops.memory.allocator": {}, "sglang.srt.platforms": {"current_platform": cpu},
               "sglang.srt.mem_cache.memory_pool": {}},
        pieces={"sglang.srt.utils": Piece("sglang.srt.utils.common", UTILS,
                                          {"torch": torch, "os": os, "lru_cache": functools.lru_cache,
                                           "logger": logging.getLogger("sglang")})})


def load(version: str | None = None) -> SimpleNamespace:
    from sglang.srt.mem_cache.allocator.paged import PagedTokenToKVPoolAllocator

    return SimpleNamespace(PagedTokenToKVPoolAllocator=PagedTokenToKVPoolAllocator)


class SGLangEngine(PagedRows, EngineAdapter):
    """SGLang's paged allocator (the engine's, imported) driven one batch per step by the contender's own rows."""

    sglang: SimpleNamespace

    def __init__(self, num_blocks: int, block_size: int = 16, max_seqs: int = 256,
                 max_blocks_per_seq: int = 256) -> None:
        super().__init__(num_blocks, block_size, max_seqs, max_blocks_per_seq)
        import torch

        self.torch = torch
        ps = self.page_size = self.block_size
        self.allocator = self.sglang.PagedTokenToKVPoolAllocator(
            size=self.num_blocks * ps, page_size=ps, dtype=torch.float16, device="cpu", kvcache=None,
            need_sort=False)
        self._setup_rows(self.max_seqs, self.max_tokens)

    def _decode_sharing(self, seq_ids: np.ndarray, ids: list[int], cow_out: np.ndarray, slot_out: np.ndarray) -> int:
        """The fork emulation on SGLang's allocator: copied pages from one ``alloc``, then the default decode."""
        movers = self._shared_tails(ids)
        pairs = []
        if movers:
            ps = self.page_size
            slots = self.allocator.alloc(len(movers) * ps)
            if slots is None:
                raise NoFreeBlocksError("SGLang's alloc refused the step's copied pages")
            pairs = [self._copy_tail(ids[i], self._lens[ids[i]], page, int(slots[k * ps]) // ps)
                     for k, (i, page) in enumerate(movers)]
        self._decode_batch(self.torch.as_tensor(seq_ids, dtype=self.torch.int64), ids, slot_out)
        if pairs:
            cow_out[: len(pairs)] = pairs
        return len(pairs)


def baselines(sglang: SimpleNamespace, version: str) -> list[Baseline]:
    """One baseline: the allocator on the CPU's native path, torch at one intra-op thread (as every run)."""
    cls = types.new_class("SGLangEngine", (SGLangEngine,), exec_body=lambda ns: ns.update(sglang=sglang))
    how = (f"SGLang {version}'s PagedTokenToKVPoolAllocator(page_size=block_size, need_sort=False, CPU, native torch "
           "path) from the wheel, driven as mem_cache/allocation.py does: alloc_extend per admission, the step's "
           "frees in one free group, one alloc_decode per step with last_loc from an int32 req_to_token, slots "
           "written back; fork and copy-on-write emulated as the contender emulates them; torch at one intra-op "
           "thread")
    return [Baseline("one torch thread", cls, ("sglang",), ("sglang",), how, engine_object="allocator")]
