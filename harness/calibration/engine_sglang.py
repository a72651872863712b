"""SGLang's own ``PagedTokenToKVPoolAllocator`` behind our contract, for the contender ``sglang``.

Imported unmodified from the wheel: ``sglang/srt/mem_cache/allocator/{base,paged}.py``; ``get_num_new_pages``,
``next_power_of_2``, ``get_bool_env_var`` and ``is_hip`` are compiled from ``sglang/srt/utils/common.py``,
whose other 5,000 lines (and their imports: Triton, PIL, requests, the server) are not loaded. Stand-ins: the
Triton kernels (never called: on the CPU ``current_platform.capabilities.supports_triton`` is False, a stand-in
for SGLang's GPU platform, so the native torch path runs, as SGLang's does where Triton is unsupported).

The adapter (:class:`SGLangEngine`) holds, as SGLang's scheduler does, an int32 ``req_to_token`` tensor (one
row of token slots per request, as ``ReqToTokenPool`` keeps it) and the requests' lengths, and drives the
allocator as ``mem_cache/allocation.py`` does:

- ``allocate``: one ``alloc_extend`` with no prefix (``last_loc`` -1), the slots written into the row
  (SGLang batches a step's admissions into one call; our contract admits one sequence per call, and so does
  the contender);
- ``free``: the row's token slots to ``free`` inside ``free_group_begin`` ... ``free_group_end``: the frees
  of a step form one group, closed by the step's next other operation (as the scheduler closes it after the
  batch's frees);
- the decode step (``alloc_for_decode_default``): ``last_loc`` gathered from ``req_to_token``, one
  ``alloc_decode`` for the running batch, the slots written back as int32 and the lengths advanced;
- ``can_allocate``: ``available_size() // page_size >= n``.

Page 0 is SGLang's padding page, so contract block ids are page ids minus one (as in the contender). SGLang has
no fork: sharing is emulated as the contender emulates it (the same work on both sides): a fork copies the
parent's row and counts its pages in a host dict; a row whose last page is shared and not full gets a new page
(one ``alloc(k * page_size)`` for the step's k copies) with its earlier tokens re-pointed before the step's
``alloc_decode``; a freed row's pages still shared are kept out of ``free``.
"""

from __future__ import annotations

import functools
import logging
import os
import types
from types import SimpleNamespace

import numpy as np

from harness.calibration.adapter import EngineAdapter
from harness.calibration.engines import Baseline
from harness.calibration.loader import ImportPlan, Piece
from impls.contract import NoFreeBlocksError

REAL = ("sglang.srt.mem_cache.allocator.base", "sglang.srt.mem_cache.allocator.paged")
UTILS = ("is_hip", "_warned_bool_env_var_keys", "get_bool_env_var", "next_power_of_2", "get_num_new_pages")


def plan() -> ImportPlan:
    """How SGLang's modules are imported: the allocator from the wheel, four utilities compiled from theirs."""
    import torch

    cpu = SimpleNamespace(capabilities=SimpleNamespace(supports_triton=False))
    return ImportPlan(
        packages=("sglang",), real=REAL,
        stubs={"sglang.kernels.ops.memory.allocator": {}, "sglang.srt.platforms": {"current_platform": cpu},
               "sglang.srt.mem_cache.memory_pool": {}},
        pieces={"sglang.srt.utils": Piece("sglang.srt.utils.common", UTILS,
                                          {"torch": torch, "os": os, "lru_cache": functools.lru_cache,
                                           "logger": logging.getLogger("sglang")})})


def load() -> SimpleNamespace:
    from sglang.srt.mem_cache.allocator.paged import PagedTokenToKVPoolAllocator

    return SimpleNamespace(PagedTokenToKVPoolAllocator=PagedTokenToKVPoolAllocator)


class SGLangEngine(EngineAdapter):
    """SGLang's paged allocator (the engine's, imported) driven one batch per step, as its scheduler does."""

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
        self.req_to_token = torch.zeros((self.max_seqs, self.max_tokens), dtype=torch.int32)
        self.seq_lens = torch.zeros(self.max_seqs, dtype=torch.int64)
        self.grouping = False  # inside free_group_begin ... free_group_end
        self.shared: dict[int, int] = {}  # page -> references, for pages shared by a fork (the emulation)
        self._no_prefix = torch.zeros(1, dtype=torch.int64)
        self._no_loc = torch.full((1,), -1, dtype=torch.int64)

    def _end_frees(self) -> None:
        if self.grouping:
            self.allocator.free_group_end()
            self.grouping = False

    def num_free_blocks(self) -> int:
        self._end_frees()
        return self.allocator.available_size() // self.page_size

    # -- the scheduler's calls ---------------------------------------------------------------------------
    def _allocate(self, seq_id: int, num_blocks: int) -> None:
        n = self._admit_tokens
        seq_lens = self.torch.tensor([n], dtype=self.torch.int64)
        out = self.allocator.alloc_extend(self._no_prefix, self._no_prefix, seq_lens, seq_lens, self._no_loc, n)
        if out is None:
            raise NoFreeBlocksError(f"SGLang's alloc_extend refused the admission of row {seq_id}")
        self.req_to_token[seq_id, :n] = out.to(self.torch.int32)
        self.seq_lens[seq_id] = n

    def _engine_step(self, seq_ids: np.ndarray, ids: list[int], cow_out: np.ndarray, slot_out: np.ndarray) -> int:
        """``alloc_for_decode_default`` for the batch (after the emulated copies, when a fork shares a page)."""
        torch = self.torch
        self._end_frees()
        if not ids:
            return 0
        cows = self._copy_shared_tails(ids) if self.shared else []
        rows = torch.from_numpy(seq_ids)
        seq_lens = self.seq_lens[rows]
        last_loc = self.req_to_token[rows, seq_lens - 1]
        seq_lens_next = seq_lens + 1
        out = self.allocator.alloc_decode(seq_lens_next, seq_lens_next, last_loc)
        if out is None:
            raise NoFreeBlocksError("SGLang's alloc_decode refused the decode batch")
        self.req_to_token[rows, seq_lens] = out.to(torch.int32)
        self.seq_lens[rows] = seq_lens_next
        lens = self._lens
        for s in ids:  # the host copy of the lengths (SGLang's seq_lens_cpu)
            lens[s] += 1
        slot_out[: len(ids)] = (out - self.page_size).numpy()
        if cows:
            cow_out[: len(cows)] = cows
        return len(cows)

    def _free(self, seq_id: int) -> None:
        if not self.grouping:
            self.allocator.free_group_begin()
            self.grouping = True
        n = self._lens[seq_id]
        self.seq_lens[seq_id] = 0
        if self.shared:
            kept = [page for page in self._pages(seq_id).tolist() if not self._unshare(page)]
            if kept:
                self.allocator.free(self.torch.tensor(kept, dtype=self.torch.int64) * self.page_size)
            return
        self.allocator.free(self.req_to_token[seq_id, :n])

    # -- fork and copy-on-write, emulated as the contender emulates them ----------------------------------------
    def _pages(self, seq_id: int):
        return self.req_to_token[seq_id, : self._lens[seq_id] : self.page_size].to(self.torch.int64) // self.page_size

    def _unshare(self, page: int) -> bool:
        """One reference less on a shared page; whether it was shared (then it is not freed)."""
        refs = self.shared.get(page)
        if refs is None:
            return False
        if refs == 2:
            del self.shared[page]
        else:
            self.shared[page] = refs - 1
        return True

    def _fork(self, parent_id: int, child_id: int) -> None:
        self._end_frees()
        n = self._lens[parent_id]
        self.req_to_token[child_id, :n] = self.req_to_token[parent_id, :n]
        self.seq_lens[child_id] = n
        for page in self._pages(parent_id).tolist():
            self.shared[page] = self.shared.get(page, 1) + 1

    def _copy_shared_tails(self, ids: list[int]) -> list[tuple[int, int]]:
        """Rows whose last page is shared and not full (in batch order; the last holder keeps the page) move their
        earlier tokens in it to a new page, all new pages from one ``alloc``; the (src, dst) pairs."""
        ps, movers = self.page_size, []
        copied: dict[int, int] = {}
        for s in ids:
            n = self._lens[s]
            if n % ps == 0:
                continue
            page = int(self.req_to_token[s, n - 1]) // ps
            if self.shared.get(page, 1) - copied.get(page, 0) > 1:
                copied[page] = copied.get(page, 0) + 1
                movers.append((s, page))
        if not movers:
            return []
        slots = self.allocator.alloc(len(movers) * ps)
        if slots is None:
            raise NoFreeBlocksError("SGLang's alloc refused the step's copied pages")
        pairs = []
        for k, (s, page) in enumerate(movers):
            n = self._lens[s]
            start = n // ps * ps
            self.req_to_token[s, start:n] = slots[k * ps : k * ps + n - start].to(self.torch.int32)
            self._unshare(page)
            pairs.append((page - 1, int(slots[k * ps]) // ps - 1))
        return pairs

    def _last_shared(self, seq_id: int) -> bool:
        return bool(self.shared) and int(self.req_to_token[seq_id, self._lens[seq_id] - 1]) // self.page_size \
            in self.shared

    # -- queries --------------------------------------------------------------------------------------------
    def _table(self, seq_id: int) -> list[int]:
        return (self._pages(seq_id) - 1).tolist()

    def _ref(self, block_id: int) -> int:
        page = block_id + 1
        if page in self.shared:
            return self.shared[page]
        self._end_frees()
        return 0 if bool((self.allocator.free_pages == page).any()) else 1

    def _last_slot(self, seq_id: int) -> int:
        return int(self.req_to_token[seq_id, self._lens[seq_id] - 1]) - self.page_size


def baselines(sglang: SimpleNamespace, version: str) -> list[Baseline]:
    """One baseline: the allocator on the CPU's native path, torch at one intra-op thread (as every run)."""
    cls = types.new_class("SGLangEngine", (SGLangEngine,), exec_body=lambda ns: ns.update(sglang=sglang))
    how = (f"SGLang {version}'s PagedTokenToKVPoolAllocator(page_size=block_size, need_sort=False, CPU, native torch "
           "path) from the wheel, driven as mem_cache/allocation.py does: alloc_extend per admission, the step's "
           "frees in one free group, one alloc_decode per step with last_loc from an int32 req_to_token, slots "
           "written back; fork and copy-on-write emulated as the contender emulates them; torch at one intra-op "
           "thread")
    return [Baseline("one torch thread", cls, ("sglang",), ("sglang",), how)]
