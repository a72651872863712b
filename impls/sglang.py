"""Contender ``"sglang"``: SGLang's tensor-backed page allocator, re-written from its published design.

Models ``python/sglang/srt/mem_cache/allocator.py`` (``TokenToKVPoolAllocator``,
``PagedTokenToKVPoolAllocator``: ``alloc``, ``free``, ``free_group_begin`` / ``free_group_end``,
``available_size``) and the ``req_to_token`` table of ``python/sglang/srt/mem_cache/memory_pool.py``
(``ReqToTokenPool``):

* free page (block) ids live in a torch int64 tensor; allocation slices its head
  (``select = free_pages[:need]; free_pages = free_pages[need:]``), a view, no copy;
* frees are batched: freed ids go to a pending list (SGLang's ``free_group``) and are joined onto the
  free tensor with one ``torch.cat``, lazily, when the head runs short (as ``alloc`` calls
  ``merge_and_sort_free`` when ``need_size > len(free_pages)``); pending ids count as free, as
  ``available_size`` counts ``release_pages``;
* each sequence owns a row of a preallocated ``[max_seqs, max_blocks_per_seq]`` tensor, like
  ``req_to_token`` (SGLang's holds int32 token slots; here int64 block ids, the free tensor's dtype);
* ref counts are a torch int32 tensor indexed by block id.

Departures, to follow our contract: no radix (prefix) cache, and SGLang has no fork or copy-on-write in the
allocator (prefixes are shared through the radix tree's ``lock_ref``), so ``fork`` copies the row and raises
ref counts and an append to a shared last block copies it, as in our contract; all ``num_blocks`` ids are
usable (SGLang keeps slot 0 for padded tokens); joined frees are not re-sorted (SGLang sorts only with
``need_sort``). SGLang allocates for a whole batch per call on the GPU; our contract asks one call per token,
so every call here pays torch's per-operation overhead on CPU scalars: that cost is what this entry measures.
"""

from __future__ import annotations

import torch

from .interpreted import InterpretedBlockManager


class SGLangBlockManager(InterpretedBlockManager):
    """Contender ``"sglang"``: a sliced free-id tensor, batched frees and a ``req_to_token``-like table."""

    def __init__(self, num_blocks: int, block_size: int = 16, max_seqs: int = 256,
                 max_blocks_per_seq: int = 256) -> None:
        super().__init__(num_blocks, block_size, max_seqs, max_blocks_per_seq)
        self.free_pages = torch.arange(self.num_blocks, dtype=torch.int64)
        self.free_group: list[torch.Tensor] = []  # freed, not yet joined onto free_pages
        self.num_pending = 0
        self.req_to_token = torch.zeros((self.max_seqs, self.max_blocks_per_seq), dtype=torch.int64)
        self.ref_counts = torch.zeros(self.num_blocks, dtype=torch.int32)
        # Blocks per row, on the host: SGLang keeps lengths on the CPU too, beside the device tensors.
        self._nblocks = [0] * self.max_seqs

    def memory_bytes(self) -> int:
        """Per block 12 B (int64 free id, int32 ref count); per row ``max_blocks_per_seq`` int64 ids of the
        ``req_to_token``-like tensor and 16 B (length, block count)."""
        return 12 * self.num_blocks + self.max_seqs * (8 * self.max_blocks_per_seq + 16)

    def num_free_blocks(self) -> int:
        return len(self.free_pages) + self.num_pending

    def merge_free_group(self) -> None:
        """Join the pending frees onto the free tensor with one ``torch.cat``."""
        self.free_pages = torch.cat([self.free_pages, *self.free_group])
        self.free_group = []
        self.num_pending = 0

    def _alloc(self, need: int) -> torch.Tensor:
        if need > len(self.free_pages):  # the base class has checked num_free_blocks() >= need
            self.merge_free_group()
        select = self.free_pages[:need]
        self.free_pages = self.free_pages[need:]
        self.ref_counts[select] = 1
        return select

    def _allocate(self, seq_id: int, num_blocks: int) -> None:
        self.req_to_token[seq_id, :num_blocks] = self._alloc(num_blocks)
        self._nblocks[seq_id] = num_blocks

    def _last_shared(self, seq_id: int) -> bool:
        return int(self.ref_counts[int(self.req_to_token[seq_id, self._nblocks[seq_id] - 1])]) > 1

    def _append(self, seq_id: int) -> tuple[int, int] | None:
        n = self._lens[seq_id]
        self._lens[seq_id] = n + 1
        nb = self._nblocks[seq_id]
        if n % self.block_size == 0:
            self.req_to_token[seq_id, nb : nb + 1] = self._alloc(1)
            self._nblocks[seq_id] = nb + 1
            return None
        src = int(self.req_to_token[seq_id, nb - 1])
        if int(self.ref_counts[src]) == 1:
            return None
        self.ref_counts[src] -= 1
        dst = self._alloc(1)
        self.req_to_token[seq_id, nb - 1 : nb] = dst
        return src, int(dst[0])

    def _fork(self, parent_id: int, child_id: int) -> None:
        nb = self._nblocks[parent_id]
        row = self.req_to_token[parent_id, :nb]
        self.ref_counts[row] += 1  # a row never holds a block twice, so a gather-scatter is exact
        self.req_to_token[child_id, :nb] = row
        self._nblocks[child_id] = nb

    def _free(self, seq_id: int) -> None:
        row = self.req_to_token[seq_id, :self._nblocks[seq_id]]
        self._nblocks[seq_id] = 0
        self.ref_counts[row] -= 1
        freed = row[self.ref_counts[row] == 0]  # a boolean mask copies: the row may be reused at once
        if len(freed):
            self.free_group.append(freed)
            self.num_pending += len(freed)

    def _table_nbytes(self, seq_id: int) -> int:
        # One preallocated row of the req_to_token-like tensor.
        return self.req_to_token.element_size() * self.max_blocks_per_seq

    def _table(self, seq_id: int) -> list[int]:
        return self.req_to_token[seq_id, :self._nblocks[seq_id]].tolist()

    def _ref(self, block_id: int) -> int:
        return int(self.ref_counts[block_id])

    def _last_slot(self, seq_id: int) -> int:
        n = self._lens[seq_id] - 1
        return int(self.req_to_token[seq_id, n // self.block_size]) * self.block_size + n % self.block_size
