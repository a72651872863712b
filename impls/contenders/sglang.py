"""Contender ``"sglang"``: SGLang's batched paged allocator, re-written from SGLang 0.5.23.

Follows, in SGLang 0.5.23 (the ``sglang`` wheel on PyPI), with torch on the CPU:

* ``python/sglang/srt/mem_cache/allocator/paged.py``: ``PagedTokenToKVPoolAllocator`` (``clear``: free page
  ids ``1 .. num_pages`` in an int64 tensor, page 0 kept for padded tokens; ``alloc_decode`` and its
  ``alloc_decode_naive``: one call for the whole decode batch, a page taken from the head of the free tensor
  for each request whose new token opens a page, ranked by a ``cumsum``, else ``last_loc + 1``; ``alloc`` for
  page-aligned extends; ``free`` inside ``free_group_begin`` / ``free_group_end``: a step's frees are joined
  with one ``torch.cat`` and put at the *front* of the free tensor, as ``_release_page_ids`` does without
  ``need_sort``, SGLang's default);
* ``python/sglang/srt/mem_cache/allocator/base.py``: ``available_size`` (free plus pending pages);
* ``python/sglang/srt/mem_cache/memory_pool.py``: ``ReqToTokenPool.req_to_token``, one row of token slots
  (``page * page_size + offset``) per request, written for every token; the decode batch reads ``last_loc``
  from it and writes the new slots back with one indexed store (``ScheduleBatch.prepare_for_decode``).

How our contract maps onto it:

* ``decode_step`` is one ``alloc_decode`` for the whole batch: a gather of the rows' lengths and last slots,
  the page-opening mask, its ``cumsum``, a gather from the free tensor, a ``where``, a slice of the free tensor
  and one scatter into ``req_to_token``; the slots come out as one tensor (minus one page: contract block ids
  are SGLang's page ids minus one, since page 0 is reserved, so ``num_free_blocks()`` is ``num_blocks``);
* ``allocate`` is an extend of one request with no prefix (SGLang batches a prefill's requests into one
  ``alloc_extend``; our contract admits one sequence per call): pages sliced from the head and each token's
  slot computed per token as ``alloc_extend_naive`` does (owner by ``searchsorted``, page, offset), written
  into the row;
* ``free`` adds a copy of the row's token slots to the pending group (SGLang's ``free`` inside a group); the
  group is released by the next ``decode_step`` (the end of the scheduler's step) or earlier by an allocation
  that needs it: one ``torch.cat`` of the group, ``torch.unique`` of its pages, one ``torch.cat`` to the front;
* ``append_slot`` (the per-call regime) is a decode batch of one: SGLang has no per-token call, so the
  per-call figures are the batched code paid per sequence.

Fork and copy-on-write (SGLang has neither: prefixes are shared through the radix cache, whose nodes hold a
``lock_ref``, and the allocator keeps no per-page ref counts): pages shared by a fork are counted in a host
dict (page -> references) that is empty unless the trace forks, so an unforked step pays one emptiness check.
``fork`` copies the parent's row and counts its pages; in a step, a sequence whose last page is shared and
not full is marked as needing a new page in the same batched ``alloc_decode`` (so pages are handed out in
batch order, as one append after another would), then its earlier tokens in that page are re-pointed to the
new page and the pair is reported; ``free`` keeps pages that are still referenced. ``ref_count`` answers from
that dict and from the free tensor (a scan: a query, not a hot path).

Left out: the radix cache, eviction, ``need_sort`` and ``merge_and_sort_free``, the Triton kernels (the
native torch path runs instead, as SGLang does where Triton is unsupported), ``alloc_extend`` with prefixes,
the KV tensors themselves, hierarchical/SWA/Mamba pools, and the request objects.
"""

from __future__ import annotations

import numpy as np
import torch

from impls.contract import blocks_for
from impls.core.interpreted import InterpretedBlockManager
from impls.core.validation import lookup_args


def _write_slots(token_slots: torch.Tensor, page_size: int, slot_out: np.ndarray, n: int) -> None:
    """Contract slots (one page less: page 0 is reserved) into ``slot_out[:n]``, in place when it is int64."""
    if slot_out.dtype == np.int64 and slot_out.flags.writeable:
        torch.sub(token_slots, page_size, out=torch.from_numpy(slot_out)[:n])
    else:
        slot_out[:n] = (token_slots - page_size).numpy()


class SGLangBlockManager(InterpretedBlockManager):
    """Contender ``"sglang"``: SGLang's paged allocator driven one batch per step."""

    def __init__(self, num_blocks: int, block_size: int = 16, max_seqs: int = 256,
                 max_blocks_per_seq: int = 256) -> None:
        super().__init__(num_blocks, block_size, max_seqs, max_blocks_per_seq)
        self.page_size = self.block_size
        self.num_pages = self.num_blocks
        self.free_pages = torch.arange(1, self.num_pages + 1, dtype=torch.int64)  # page 0: padded tokens
        self.free_group: list[torch.Tensor] = []  # this step's freed pages, joined at the step's end
        self.num_pending = 0
        width = self.max_blocks_per_seq * self.page_size
        self.req_to_token = torch.zeros((self.max_seqs, width), dtype=torch.int64)
        self.seq_lens = torch.zeros(self.max_seqs, dtype=torch.int64)
        self.shared: dict[int, int] = {}  # page -> references, only for pages shared by a fork
        self._arange = torch.arange(self.page_size, dtype=torch.int64)
        self._admit_tokens = 0

    def memory_bytes(self) -> int:
        """Per block 8 B (an int64 free page id); per row an int64 slot per token of the longest sequence
        (``req_to_token``: ``max_blocks_per_seq * block_size`` of them, as SGLang's rows hold token slots) and
        16 B (lengths); one int64 offset per slot of a page (``arange(page_size)``)."""
        tokens = self.max_blocks_per_seq * self.block_size
        return 8 * (self.num_blocks + 1) + self.max_seqs * (8 * tokens + 16) + 8 * self.block_size

    def num_free_blocks(self) -> int:
        return len(self.free_pages) + self.num_pending

    def free_group_end(self) -> None:
        """Release the step's frees as ``free_group_end`` does: the freed token slots joined with one
        ``torch.cat``, their pages found with ``torch.unique``, and put at the front of the free tensor."""
        if self.free_group:
            pages = torch.unique(torch.cat(self.free_group) // self.page_size)
            self.free_pages = torch.cat((pages, self.free_pages))
            self.free_group = []
            self.num_pending = 0

    def _take_pages(self, num_pages: int) -> torch.Tensor:
        if num_pages > len(self.free_pages):  # the base class has checked num_free_blocks() >= num_pages
            self.free_group_end()
        out = self.free_pages[:num_pages]
        self.free_pages = self.free_pages[num_pages:]
        return out

    # -- allocation -----------------------------------------------------------------------------------------
    def _allocate(self, seq_id: int, num_blocks: int) -> None:
        """An extend of one request with no prefix, computed per token as ``alloc_extend``'s native path
        does for a batch: each token finds its request (``searchsorted`` over the batch's end positions),
        its page among the request's new pages and its offset."""
        n = self._admit_tokens
        pages = self._take_pages(num_blocks)
        extend_lens = torch.tensor([n], dtype=torch.int64)
        end_pos = torch.cumsum(extend_lens, 0)
        start_pos = end_pos - extend_lens
        j = torch.arange(n, dtype=torch.int64)
        owner = torch.searchsorted(end_pos, j, right=True)
        local = j - start_pos[owner]
        slots = pages[torch.div(local, self.page_size, rounding_mode="floor")] * self.page_size + local % self.page_size
        self.req_to_token[seq_id, :n] = slots
        self.seq_lens[seq_id] = n

    def append_slot(self, seq_id: int) -> tuple[int, int] | None:
        """One append, as one step of one sequence: the frees pending from earlier steps are released first,
        as a decode step releases them, so that per-call appends hand out the pages the batched step would."""
        self.free_group_end()
        return super().append_slot(seq_id)

    def _decode(self, seq_ids: np.ndarray, ids: list[int], cow_out: np.ndarray, slot_out: np.ndarray) -> int:
        if ids:  # the previous step's frees, before this step allocates (an empty step allocates nothing)
            self.free_group_end()
        rows = torch.as_tensor(seq_ids, dtype=torch.int64)
        seq_lens = self.seq_lens[rows] + 1
        last_loc = self.req_to_token[rows, seq_lens - 2]
        need_new_page = (seq_lens - 1) % self.page_size == 0
        cows = self._shared_tails(ids) if self.shared else []
        if cows:  # fork emulation: a shared, partly filled last page moves to a new page too
            need_new_page[cows] = True
        num_new_pages = int(need_new_page.sum())
        if num_new_pages:
            need = need_new_page.to(torch.int64)
            rank = (torch.cumsum(need, 0) - need).clamp_(max=num_new_pages - 1)
            new_page = self.free_pages[rank]
            out = torch.where(need_new_page, new_page * self.page_size + (seq_lens - 1) % self.page_size,
                              last_loc + 1)
            self.free_pages = self.free_pages[num_new_pages:]
        else:
            out = last_loc + 1
        self.req_to_token[rows, seq_lens - 1] = out
        self.seq_lens[rows] = seq_lens
        _write_slots(out, self.page_size, slot_out, len(ids))
        lens = self._lens
        for s in ids:  # the host copy of the lengths (SGLang's seq_lens_cpu), read by the contract's checks
            lens[s] += 1
        for k, i in enumerate(cows):
            cow_out[k] = self._copy_tail(ids[i], int(last_loc[i]) // self.page_size, int(new_page[i]))
        return len(cows)

    def _shared_tails(self, ids: list[int]) -> list[int]:
        """Positions in the batch whose last page is shared and not full when their turn comes (an earlier
        copy in the batch may have left the page to this sequence alone)."""
        out, copied = [], {}
        for i, s in enumerate(ids):
            n = self._lens[s]
            if n % self.page_size == 0:
                continue
            page = int(self.req_to_token[s, n - 1]) // self.page_size
            if self.shared.get(page, 1) - copied.get(page, 0) > 1:
                copied[page] = copied.get(page, 0) + 1
                out.append(i)
        return out

    def _copy_tail(self, seq_id: int, src: int, dst: int) -> tuple[int, int]:
        """The tokens before the new one in the copied page now live in ``dst`` (the KV copy is the
        engine's); the source page loses a reference."""
        n = self._lens[seq_id] - 1  # tokens before this step's
        start = n // self.page_size * self.page_size
        self.req_to_token[seq_id, start:n] = dst * self.page_size + self._arange[: n - start]
        self._unshare(src)
        return src - 1, dst - 1

    def _unshare(self, page: int) -> None:
        refs = self.shared[page] - 1
        if refs == 1:
            del self.shared[page]
        else:
            self.shared[page] = refs

    def _append(self, seq_id: int) -> tuple[int, int] | None:
        cow_out = np.zeros((1, 2), dtype=np.int64)
        slot_out = np.zeros(1, dtype=np.int64)
        if self._decode(np.array([seq_id], dtype=np.int64), [seq_id], cow_out, slot_out):
            return int(cow_out[0, 0]), int(cow_out[0, 1])
        return None

    # -- sharing and release ----------------------------------------------------------------------------------
    def _pages(self, seq_id: int) -> torch.Tensor:
        return self.req_to_token[seq_id, : self._lens[seq_id] : self.page_size] // self.page_size

    def _last_shared(self, seq_id: int) -> bool:
        if not self.shared:
            return False
        page = int(self.req_to_token[seq_id, self._lens[seq_id] - 1]) // self.page_size
        return page in self.shared

    def _fork(self, parent_id: int, child_id: int) -> None:
        n = self._lens[parent_id]
        self.req_to_token[child_id, :n] = self.req_to_token[parent_id, :n]
        self.seq_lens[child_id] = n
        shared = self.shared
        for page in self._pages(parent_id).tolist():
            shared[page] = shared.get(page, 1) + 1

    def _free(self, seq_id: int) -> None:
        n = self._lens[seq_id]
        self.seq_lens[seq_id] = 0
        if self.shared:
            self._free_shared(seq_id)
            return
        # SGLang's free inside a group: a copy of the request's token slots (the row may be reused at once).
        self.free_group.append(self.req_to_token[seq_id, :n].clone())
        self.num_pending += blocks_for(n, self.page_size)

    def _free_shared(self, seq_id: int) -> None:
        kept = []
        for page in self._pages(seq_id).tolist():
            if page in self.shared:
                self._unshare(page)
            else:
                kept.append(page)
        if kept:
            self.free_group.append(torch.tensor(kept, dtype=torch.int64) * self.page_size)  # a slot per page
            self.num_pending += len(kept)

    # -- queries ----------------------------------------------------------------------------------------------
    def _table_nbytes(self, seq_id: int) -> int:
        # One preallocated row of the req_to_token tensor (a slot per token).
        return self.req_to_token.element_size() * self.req_to_token.shape[1]

    def _table(self, seq_id: int) -> list[int]:
        return (self._pages(seq_id) - 1).tolist()

    def _ref(self, block_id: int) -> int:
        page = block_id + 1
        if page in self.shared:
            return self.shared[page]
        free = bool((self.free_pages == page).any()) or any(
            bool((g // self.page_size == page).any()) for g in self.free_group)
        return 0 if free else 1

    def _last_slot(self, seq_id: int) -> int:
        return int(self.req_to_token[seq_id, self._lens[seq_id] - 1]) - self.page_size

    def lookup(self, seq_ids: np.ndarray, slot_out: np.ndarray) -> None:
        """The newest token's slot of each sequence, gathered from ``req_to_token`` in one operation."""
        checked = lookup_args(seq_ids, slot_out, self.max_seqs)  # types, shapes, sizes first, as every design
        ids = checked.tolist()
        n = len(ids)
        if any(s < 0 or s >= self.max_seqs or self._lens[s] == 0 for s in ids):
            super().lookup(seq_ids, slot_out)  # the contract's error, named by the base class
            return
        rows = torch.as_tensor(checked, dtype=torch.int64)
        _write_slots(self.req_to_token[rows, self.seq_lens[rows] - 1], self.page_size, slot_out, n)
