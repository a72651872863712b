"""Contender ``"sglang"``: SGLang's batched paged allocator as its scheduler drives it (SGLang 0.5.23)."""

from __future__ import annotations

import numpy as np
import torch

from impls.contract import NoFreeBlocksError
from impls.core.interpreted import InterpretedBlockManager, append_as_batch
from impls.core.validation import lookup_args

_CPU = torch.device("cpu")


def get_num_new_pages(seq_lens: torch.Tensor, page_size: int, prefix_lens: torch.Tensor | None = None,
                      decode: bool = False) -> int:
    """Pages a batch takes, from its host lengths (SGLang's ``get_num_new_pages``)."""
    assert seq_lens.device == _CPU
    if prefix_lens is None or decode:
        return (seq_lens % page_size == 1 % page_size).int().sum().item()  # ours: not `== 1` (block size 1)
    assert prefix_lens.device == _CPU
    pages_after = (seq_lens + page_size - 1) // page_size
    pages_before = (prefix_lens + page_size - 1) // page_size
    return torch.sum(pages_after - pages_before).to(torch.int64).item()


def _extend_slots(prefix_lens: torch.Tensor, seq_lens: torch.Tensor, last_loc: torch.Tensor,
                  free_pages: torch.Tensor, out: torch.Tensor, page_size: int) -> None:
    """Every extended token's slot, per token in three phases merged with ``torch.where`` (the native path)."""
    extend_lens = seq_lens - prefix_lens
    ends = torch.cumsum(extend_lens, 0)
    starts = ends - extend_lens
    if out.shape[0] == 0:
        return
    token = torch.arange(out.shape[0], dtype=torch.int64)
    req = torch.searchsorted(ends, token, right=True)
    offset = token - starts[req]
    after_last = last_loc[req]
    prefix_page_end = (prefix_lens + page_size - 1) // page_size * page_size
    last_page_start = seq_lens // page_size * page_size
    if free_pages.numel() == 0:  # pragma: no cover - the caller checked the pool
        raise AssertionError("no free page for an extend")
    fill = torch.clamp(seq_lens, max=prefix_page_end) - prefix_lens
    filled = (prefix_lens + fill) == seq_lens
    whole = torch.where(filled, torch.zeros_like(fill), last_page_start - prefix_page_end)
    tail = torch.where(filled, torch.zeros_like(fill), seq_lens - last_page_start)
    pages = whole // page_size + (tail > 0).to(torch.int64)
    pages_end = torch.cumsum(pages, 0)
    pages_start = pages_end - pages
    fill_t, whole_t, start_t, end_t = fill[req], whole[req], pages_start[req], pages_end[req]
    in_fill = offset < fill_t
    in_whole = (~in_fill) & (offset < fill_t + whole_t)
    slot_fill = after_last + 1 + offset
    into_whole = torch.clamp(offset - fill_t, min=0)
    last = free_pages.numel() - 1
    slot_whole = free_pages[torch.clamp(start_t + into_whole // page_size, min=0, max=last)] * page_size \
        + into_whole % page_size
    into_tail = torch.clamp(offset - fill_t - whole_t, min=0)
    slot_tail = free_pages[torch.clamp(end_t - 1, min=0, max=last)] * page_size + into_tail
    out.copy_(torch.where(in_fill, slot_fill, torch.where(in_whole, slot_whole, slot_tail)))


def _decode_slots(seq_lens: torch.Tensor, last_loc: torch.Tensor, free_pages: torch.Tensor, out: torch.Tensor,
                  page_size: int, num_new_pages: int) -> None:
    """Every request's new slot (native path): ``last_loc + 1``, or a fresh page ranked by a ``cumsum``."""
    if num_new_pages == 0:
        out.copy_(last_loc + 1)
        return
    opens = ((seq_lens - 1) % page_size == 0).to(torch.int64)
    rank = (torch.cumsum(opens, 0) - opens).clamp_(max=num_new_pages - 1)
    out.copy_(torch.where(opens.bool(), free_pages[rank] * page_size, last_loc + 1))


class PagedAllocator:
    """SGLang's ``PagedTokenToKVPoolAllocator`` on the CPU (``need_sort`` off): free pages in an int64 tensor."""

    def __init__(self, size: int, page_size: int) -> None:
        self.size = size
        self.page_size = page_size
        self.num_pages = size // page_size
        self.device = _CPU
        self.debug_mode = False
        self.staged_pages: list[torch.Tensor] = []
        self.num_staged_pages = 0
        self.free_page_ids_group: list[torch.Tensor] = []
        self.free_pages = torch.arange(1, self.num_pages + 1, dtype=torch.int64)  # page 0: padded tokens
        self.free_group: list[torch.Tensor] | None = None

    def available_size(self) -> int:
        return (len(self.free_pages) + self.num_staged_pages) * self.page_size

    def merge_and_sort_free(self) -> None:
        if not self.staged_pages:
            return
        raise AssertionError("need_sort is left out")  # pragma: no cover

    def alloc(self, need_size: int) -> torch.Tensor | None:
        """Whole pages from the head of the free tensor, as their token slots."""
        num_pages = need_size // self.page_size
        if num_pages > len(self.free_pages):
            self.merge_and_sort_free()
        if num_pages > len(self.free_pages):
            return None
        out_pages = self.free_pages[:num_pages]
        self.free_pages = self.free_pages[num_pages:]
        return (out_pages[:, None] * self.page_size + torch.arange(self.page_size)).reshape(-1)

    def alloc_extend(self, prefix_lens: torch.Tensor, prefix_lens_cpu: torch.Tensor, seq_lens: torch.Tensor,
                     seq_lens_cpu: torch.Tensor, last_loc: torch.Tensor, extend_num_tokens: int,
                     num_new_pages: int | None = None) -> torch.Tensor | None:
        """Slots for the batch's extensions (see :func:`_extend_slots`); None when the pool is short."""
        bs = len(prefix_lens)
        bound = extend_num_tokens // self.page_size + bs + 1
        if bound > len(self.free_pages):
            self.merge_and_sort_free()
        if bound > len(self.free_pages):
            if num_new_pages is None:
                num_new_pages = get_num_new_pages(seq_lens_cpu, self.page_size, prefix_lens_cpu)
            if num_new_pages > len(self.free_pages):
                return None
        out = torch.empty((extend_num_tokens,), dtype=torch.int64)
        _extend_slots(prefix_lens, seq_lens, last_loc, self.free_pages, out, self.page_size)
        if num_new_pages is None:
            num_new_pages = get_num_new_pages(seq_lens_cpu, self.page_size, prefix_lens_cpu)
        self.free_pages = self.free_pages[num_new_pages:]
        return out

    def alloc_decode(self, seq_lens: torch.Tensor, seq_lens_cpu: torch.Tensor,
                     last_loc: torch.Tensor) -> torch.Tensor | None:
        """One new slot per request of the batch (see :func:`_decode_slots`); None when the pool is short."""
        bs = len(seq_lens)
        if bs > len(self.free_pages):
            self.merge_and_sort_free()
        num_new_pages = get_num_new_pages(seq_lens_cpu, self.page_size, decode=True)
        if num_new_pages > len(self.free_pages):
            return None
        out = torch.empty((bs,), dtype=torch.int64)
        _decode_slots(seq_lens, last_loc, self.free_pages, out, self.page_size, num_new_pages)
        self.free_pages = self.free_pages[num_new_pages:]
        return out

    def alloc_decode_copying(self, seq_lens: torch.Tensor, last_loc: torch.Tensor,
                             copy: torch.Tensor) -> torch.Tensor | None:
        """Ours, not SGLang's (it has no fork): :meth:`alloc_decode`, step for step, where the rows in ``copy`` (a
        shared last page, copied on write) take a fresh page as well, every page taken in batch order; None when the
        pool is short."""
        bs = len(seq_lens)
        if bs > len(self.free_pages):
            self.merge_and_sort_free()
        need = ((seq_lens - 1) % self.page_size == 0) | copy
        num_new_pages = need.int().sum().item()
        if num_new_pages > len(self.free_pages):
            return None
        out = torch.empty((bs,), dtype=torch.int64)
        taken = need.to(torch.int64)
        rank = (torch.cumsum(taken, 0) - taken).clamp_(max=num_new_pages - 1)
        out.copy_(torch.where(need, self.free_pages[rank] * self.page_size + (seq_lens - 1) % self.page_size,
                              last_loc + 1))
        self.free_pages = self.free_pages[num_new_pages:]
        return out

    def free(self, free_index: torch.Tensor) -> None:
        if free_index.numel() == 0:
            return
        if self.free_group is None:
            self._release_page_ids(torch.unique(free_index // self.page_size))
        else:
            self.free_group.append(free_index.clone())

    def _release_page_ids(self, page_ids: torch.Tensor) -> None:
        self.free_pages = torch.cat((page_ids, self.free_pages))  # freed pages are reused first

    def free_group_begin(self) -> None:
        assert self.free_group is None, "free groups cannot be nested"
        self.free_group = []
        self.free_page_ids_group = []

    def free_group_end(self) -> None:
        pending, self.free_group = self.free_group, None
        if pending:
            self.free(torch.cat(pending))
        if self.free_page_ids_group:  # pragma: no cover - page-id frees are not used here
            self._release_page_ids(torch.cat(self.free_page_ids_group))
            self.free_page_ids_group = []


class PagedRows:
    """The scheduler's side around a paged allocator: ``req_to_token`` rows, batches, grouped frees, fork emulation."""

    allocator: PagedAllocator
    page_size: int
    _lens: list[int]
    _admit_tokens: int

    def _setup_rows(self, max_seqs: int, max_tokens: int) -> None:
        self.req_to_token = torch.zeros((max_seqs, max_tokens), dtype=torch.int32)
        self.seq_lens = torch.zeros(max_seqs, dtype=torch.int64)
        self.grouping = False
        self.pending_pages = 0
        self.admitting: list[tuple[int, int]] = []  # the prefill batch being formed: (row, tokens)
        self.admitting_pages = 0
        self.shared: dict[int, int] = {}
        self._offsets = torch.arange(self.page_size, dtype=torch.int64)

    def _end_frees(self) -> None:
        """Close the open free group, as SGLang's scheduler does before it schedules."""
        if self.grouping:
            self.allocator.free_group_end()
            self.grouping = False
            self.pending_pages = 0

    def num_free_blocks(self) -> int:
        """Free pages, counting those of the open free group and not those the forming prefill batch holds (a
        query: it leaves both open)."""
        return self.allocator.available_size() // self.page_size + self.pending_pages - self.admitting_pages

    def _allocate(self, seq_id: int, num_blocks: int) -> None:
        """The request joins the step's prefill batch (its pages held from now on); the batch is extended in one
        ``alloc_extend`` when the step's decode batch, or anything that reads the rows, comes (:meth:`_admit`), as
        SGLang's ``alloc_for_extend`` extends a scheduled prefill batch."""
        self.admitting.append((seq_id, self._admit_tokens))
        self.admitting_pages += num_blocks

    def _admit(self) -> None:
        """One ``alloc_extend`` for the requests admitted since the last one (no prefix), the slots written into
        their rows."""
        if not self.admitting:
            return
        self._end_frees()
        batch, self.admitting, self.admitting_pages = self.admitting, [], 0
        rows = torch.tensor([r for r, _ in batch], dtype=torch.int64)
        seq_lens = torch.tensor([n for _, n in batch], dtype=torch.int64)
        prefix = torch.zeros(len(batch), dtype=torch.int64)
        out = self.allocator.alloc_extend(prefix, prefix, seq_lens, seq_lens, torch.full_like(prefix, -1),
                                          int(seq_lens.sum()))
        if out is None:  # pragma: no cover - the batch's pages were held as each request joined it
            raise AssertionError("alloc_extend refused a prefill batch whose pages were held")
        at = 0
        for row, n in batch:
            self.req_to_token[row, :n] = out[at : at + n].to(torch.int32)
            at += n
        self.seq_lens[rows] = seq_lens

    def _decode(self, seq_ids: np.ndarray, ids: list[int], cow_out: np.ndarray, slot_out: np.ndarray) -> int:
        """The decode batch (with forked pages, its emulation); CoW pairs to ``cow_out``, their number back."""
        self._admit()
        self._end_frees()
        if not ids:
            return 0
        if self.shared:
            return self._decode_sharing(seq_ids, ids, cow_out, slot_out)
        self._decode_batch(torch.as_tensor(seq_ids, dtype=torch.int64), ids, slot_out)
        return 0

    def _decode_batch(self, rows: torch.Tensor, ids: list[int], slot_out: np.ndarray) -> torch.Tensor:
        """``alloc_for_decode_default``: one ``alloc_decode`` for the batch; its new slots back."""
        seq_lens = self.seq_lens[rows]
        last_loc = self.req_to_token[rows, seq_lens - 1]
        seq_lens_next = seq_lens + 1
        out = self.allocator.alloc_decode(seq_lens_next, seq_lens_next, last_loc)
        if out is None:
            raise NoFreeBlocksError("alloc_decode refused the decode batch")
        self.req_to_token[rows, seq_lens] = out.to(torch.int32)
        self.seq_lens[rows] = seq_lens_next
        lens = self._lens
        for s in ids:
            lens[s] += 1
        slot_out[: len(ids)] = (out - self.page_size).numpy()
        return out

    def _decode_sharing(self, seq_ids: np.ndarray, ids: list[int], cow_out: np.ndarray, slot_out: np.ndarray) -> int:
        """The decode batch when a fork shares pages (SGLang has no fork: each side emulates it its own way)."""
        raise NotImplementedError

    _engine_step = _decode  # the step SGLang's scheduler makes; the per-call append is a batch of one of it
    _append = append_as_batch

    def _free(self, seq_id: int) -> None:
        self._admit()
        if not self.grouping:
            self.allocator.free_group_begin()
            self.grouping = True
        n = self._lens[seq_id]
        self.seq_lens[seq_id] = 0
        if self.shared:
            kept = [page for page in self._pages(seq_id).tolist() if not self._unshare(page)]
            if kept:
                self.allocator.free(torch.tensor(kept, dtype=torch.int64) * self.page_size)
                self.pending_pages += len(kept)
            return
        self.allocator.free(self.req_to_token[seq_id, :n])
        self.pending_pages += -(-n // self.page_size)

    def _pages(self, seq_id: int) -> torch.Tensor:
        self._admit()
        return self.req_to_token[seq_id, : self._lens[seq_id] : self.page_size].to(torch.int64) // self.page_size

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
        self._admit()
        self._end_frees()
        n = self._lens[parent_id]
        self.req_to_token[child_id, :n] = self.req_to_token[parent_id, :n]
        self.seq_lens[child_id] = n
        shared = self.shared
        for page in self._pages(parent_id).tolist():
            shared[page] = shared.get(page, 1) + 1

    def _shared_tails(self, ids: list[int]) -> list[tuple[int, int]]:
        """(position in the batch, page) of the rows whose last page is shared and not full when their turn comes."""
        ps, movers = self.page_size, []
        copied: dict[int, int] = {}
        for i, s in enumerate(ids):
            n = self._lens[s]
            if n % ps == 0:
                continue
            page = int(self.req_to_token[s, n - 1]) // ps
            if self.shared.get(page, 1) - copied.get(page, 0) > 1:
                copied[page] = copied.get(page, 0) + 1
                movers.append((i, page))
        return movers

    def _copy_tail(self, seq_id: int, n: int, src: int, dst: int) -> tuple[int, int]:
        """Move the row's tokens before ``n`` in its last page to page ``dst``; the (src, dst) pair in contract ids."""
        start = n // self.page_size * self.page_size
        self.req_to_token[seq_id, start:n] = (dst * self.page_size + self._offsets[: n - start]).to(torch.int32)
        self._unshare(src)
        return src - 1, dst - 1

    def _last_shared(self, seq_id: int) -> bool:
        self._admit()
        return bool(self.shared) and int(self.req_to_token[seq_id, self._lens[seq_id] - 1]) // self.page_size \
            in self.shared

    def _table(self, seq_id: int) -> list[int]:
        return (self._pages(seq_id) - 1).tolist()

    def _ref(self, block_id: int) -> int:
        self._admit()
        page = block_id + 1
        if page in self.shared:
            return self.shared[page]
        pending = self.allocator.free_group or []
        freed = (self.allocator.free_pages == page).any() or any((t // self.page_size == page).any() for t in pending)
        return 0 if bool(freed) else 1

    def _last_slot(self, seq_id: int) -> int:
        self._admit()
        return int(self.req_to_token[seq_id, self._lens[seq_id] - 1]) - self.page_size

    def lookup(self, seq_ids: np.ndarray, slot_out: np.ndarray) -> None:
        """The newest token's slot of each sequence, gathered from ``req_to_token`` in one operation (the
        calibration's adapter shares it: its per-row reads would leave the caches unlike ours between two steps)."""
        checked = lookup_args(seq_ids, slot_out, self.max_seqs)
        self._admit()
        ids = checked.tolist()
        n = len(ids)
        if any(s < 0 or s >= self.max_seqs or self._lens[s] == 0 for s in ids):
            super().lookup(seq_ids, slot_out)
            return
        rows = torch.as_tensor(checked, dtype=torch.int64)
        slot_out[:n] = (self.req_to_token[rows, self.seq_lens[rows] - 1] - self.page_size).numpy()


class SGLangBlockManager(PagedRows, InterpretedBlockManager):
    """Contender ``"sglang"``: SGLang's paged allocator driven one batch per step."""

    def __init__(self, num_blocks: int, block_size: int = 16, max_seqs: int = 256,
                 max_blocks_per_seq: int = 256) -> None:
        super().__init__(num_blocks, block_size, max_seqs, max_blocks_per_seq)
        self.page_size = self.block_size
        self.allocator = PagedAllocator(self.num_blocks * self.page_size, self.page_size)
        self._setup_rows(self.max_seqs, self.max_tokens)
        self._admit_tokens = 0

    def _decode_sharing(self, seq_ids: np.ndarray, ids: list[int], cow_out: np.ndarray, slot_out: np.ndarray) -> int:
        """Our fork emulation. A step with no shared last page to copy is the default decode batch, one
        ``alloc_decode``, as on SGLang's side; one with copies takes them with its new pages, in batch order (the
        contract's per-call order), by one call on the allocator model (so the engine-call meter counts that work as
        the allocator's)."""
        movers = self._shared_tails(ids)
        rows = torch.as_tensor(seq_ids, dtype=torch.int64)
        if not movers:
            self._decode_batch(rows, ids, slot_out)
            return 0
        ps = self.page_size
        seq_lens = self.seq_lens[rows] + 1
        last_loc = self.req_to_token[rows, seq_lens - 2].to(torch.int64)
        copy = torch.zeros(len(ids), dtype=torch.bool)
        copy[[i for i, _ in movers]] = True
        out = self.allocator.alloc_decode_copying(seq_lens, last_loc, copy)
        if out is None:
            raise NoFreeBlocksError("the decode batch needs more pages than are free")
        self.req_to_token[rows, seq_lens - 1] = out.to(torch.int32)
        self.seq_lens[rows] = seq_lens
        lens = self._lens
        for s in ids:
            lens[s] += 1
        slot_out[: len(ids)] = (out - ps).numpy()
        for k, (i, page) in enumerate(movers):
            cow_out[k] = self._copy_tail(ids[i], lens[ids[i]] - 1, page, int(out[i]) // ps)
        return len(movers)

    @property
    def free_pages(self) -> torch.Tensor:
        self._admit()
        return self.allocator.free_pages

    def memory_bytes(self) -> int:
        tokens = self.max_blocks_per_seq * self.block_size
        return 8 * (self.num_blocks + 1) + self.max_seqs * (4 * tokens + 16)

    def _table_nbytes(self, seq_id: int) -> int:
        return self.req_to_token.element_size() * self.req_to_token.shape[1]
