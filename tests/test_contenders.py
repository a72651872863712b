"""What makes each contender its engine's design: free-queue order, sentinels, batched frees, FIFO reuse.

The contract tests already hold the contenders to the reference model; these check the engine-specific
structure behind them, which the contract cannot see (it compares up to a renaming of block ids).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from impls import REGISTRY, UNAVAILABLE
from impls.contenders.nano_vllm import NanoVllmBlockManager
from impls.contenders.vllm_v1 import VllmV1BlockManager
from impls.contenders.vllm_v1_pc import VllmV1CachingBlockManager
from impls.contenders.vllm_v1_pool import FreeKVCacheBlockQueue, KVCacheBlock
from impls.core.reference import ReferenceModel

BS = 4


def queue_ids(queue: FreeKVCacheBlockQueue) -> list[int]:
    """Free block ids front to back, after checking both link directions, the sentinels and the count."""
    head, tail = queue.fake_free_list_head, queue.fake_free_list_tail
    assert head.block_id == tail.block_id == -1
    assert head.prev_free_block is None and tail.next_free_block is None
    forward, block = [], head.next_free_block
    while block is not tail:
        assert block.next_free_block.prev_free_block is block, f"broken link after block {block.block_id}"
        forward.append(block)
        block = block.next_free_block
    backward, block = [], tail.prev_free_block
    while block is not head:
        backward.append(block)
        block = block.prev_free_block
    assert backward[::-1] == forward
    assert queue.num_free_blocks == len(forward)
    return [b.block_id for b in forward]


def check_vllm(mgr: VllmV1BlockManager) -> list[int]:
    """Free blocks are exactly the unreferenced ones but the null block; blocks in use carry no links.
    Returns the free queue front to back in contract ids (vLLM's minus one: vLLM's block 0 is the null block)."""
    ids = queue_ids(mgr.free_block_queue)
    null = mgr.blocks[0]
    assert null.is_null and null.prev_free_block is None and null.next_free_block is None
    assert sorted(ids) == [b.block_id for b in mgr.blocks[1:] if b.ref_cnt == 0]
    for block in mgr.blocks:
        if block.ref_cnt:
            assert block.prev_free_block is None and block.next_free_block is None
    return [i - 1 for i in ids]


# -- vllm-v1 ------------------------------------------------------------------------------------------------
def test_vllm_queue_starts_in_id_order_between_sentinels_with_the_null_block_aside() -> None:
    mgr = VllmV1BlockManager(num_blocks=6, block_size=BS)
    assert len(mgr.blocks) == 7 and mgr.num_free_blocks() == 6
    assert check_vllm(mgr) == [0, 1, 2, 3, 4, 5]
    assert not hasattr(mgr.blocks[0], "__dict__")  # slotted: no per-block dict


def test_vllm_frees_tail_first_to_the_front_of_the_queue() -> None:
    mgr = VllmV1BlockManager(num_blocks=8, block_size=BS)
    mgr.allocate(0, 3 * BS)  # blocks 0, 1, 2
    mgr.allocate(1, BS)  # block 3
    mgr.free(0)
    # Blocks without a hash (caching off) are prepended in reverse table order: reused first (LIFO).
    assert check_vllm(mgr) == [2, 1, 0, 4, 5, 6, 7]
    mgr.allocate(2, 5 * BS)
    assert mgr.block_table(2) == [2, 1, 0, 4, 5]
    assert check_vllm(mgr) == [6, 7]


def test_vllm_drained_pool_hands_out_the_freed_tail_first() -> None:
    mgr = VllmV1BlockManager(num_blocks=4, block_size=BS)
    mgr.allocate(0, 3 * BS)
    mgr.allocate(1, BS)
    assert check_vllm(mgr) == []
    mgr.free(0)
    assert check_vllm(mgr) == [2, 1, 0]
    mgr.allocate(2, 1)
    assert mgr.block_table(2) == [2]


def test_vllm_shared_blocks_stay_out_of_the_queue_until_the_last_reference() -> None:
    mgr = VllmV1BlockManager(num_blocks=8, block_size=BS)
    mgr.allocate(0, 2 * BS + 1)  # 0, 1, 2 (last block partial)
    mgr.fork(0, 1)
    assert mgr.append_slot(1) == (2, 3)  # copy-on-write takes the queue's front block
    mgr.free(0)  # blocks 0 and 1 are still the child's; block 2 is released
    assert check_vllm(mgr) == [2, 4, 5, 6, 7]
    mgr.free(1)
    assert check_vllm(mgr) == [3, 1, 0, 2, 4, 5, 6, 7]


def test_vllm_calls_allocate_slots_for_every_running_request_every_step(monkeypatch) -> None:
    mgr = VllmV1BlockManager(num_blocks=16, block_size=BS, max_seqs=4)
    calls = []
    real = mgr.kv_cache_manager.allocate_slots
    monkeypatch.setattr(mgr.kv_cache_manager, "allocate_slots", lambda r, n, *a: calls.append(n) or real(r, n, *a))
    mgr.allocate(0, 2)
    mgr.allocate(1, BS)
    for _ in range(3):  # no block boundary for row 0 in these steps: vLLM still calls per request
        mgr.append_slot(0)
    mgr.decode_step(np.array([0, 1]), np.zeros((2, 2), dtype=np.int64), np.zeros(2, dtype=np.int64))
    assert calls == [2, BS, 1, 1, 1, 1, 1]
    manager = mgr.single_type_manager
    assert manager.num_cached_block == {}  # caching off: the slow path of get_num_blocks_to_allocate


def test_vllm_queue_bulk_operations_keep_links_and_count() -> None:
    blocks = [KVCacheBlock(i) for i in range(6)]
    queue = FreeKVCacheBlockQueue(blocks)
    assert queue.popleft_n(0) == [] and queue_ids(queue) == [0, 1, 2, 3, 4, 5]
    taken = queue.popleft_n(4)
    assert [b.block_id for b in taken] == [0, 1, 2, 3] and queue_ids(queue) == [4, 5]
    assert all(b.prev_free_block is None and b.next_free_block is None for b in taken)
    queue.append_n(taken[:2][::-1])
    assert queue_ids(queue) == [4, 5, 1, 0]
    queue.prepend_n(taken[2:][::-1])
    assert queue_ids(queue) == [3, 2, 4, 5, 1, 0]
    queue.remove(blocks[4])
    assert queue_ids(queue) == [3, 2, 5, 1, 0]
    assert queue.popleft() is blocks[3]
    assert queue.popleft_n(1) == [blocks[2]] and queue_ids(queue) == [5, 1, 0]
    everything = queue.popleft_n(queue.num_free_blocks)
    assert queue_ids(queue) == [] and queue.fake_free_list_head.next_free_block is queue.fake_free_list_tail
    queue.append_n([])
    queue.prepend_n([])
    queue.append_n(everything[:1])
    assert queue_ids(queue) == [5]


# -- nano-vllm ----------------------------------------------------------------------------------------------
def check_nano(mgr: NanoVllmBlockManager) -> list[int]:
    in_use = {b.block_id for b in mgr.blocks if b.ref_count}
    assert mgr.used_block_ids == in_use
    assert sorted(mgr.free_block_ids) == sorted(set(range(mgr.num_blocks)) - in_use)
    return list(mgr.free_block_ids)


def test_nano_reuses_block_ids_first_in_first_out() -> None:
    mgr = NanoVllmBlockManager(num_blocks=6, block_size=BS)
    mgr.allocate(0, 2 * BS)
    assert mgr.block_table(0) == [0, 1] and check_nano(mgr) == [2, 3, 4, 5]
    mgr.free(0)
    assert check_nano(mgr) == [2, 3, 4, 5, 1, 0]  # appended on the right, tail first
    mgr.allocate(1, 1)
    assert mgr.block_table(1) == [2]  # FIFO: the oldest free id, not the one just freed (a stack's LIFO)
    mgr.fork(1, 2)
    assert mgr.append_slot(2) == (2, 3)
    mgr.free(1)
    assert check_nano(mgr) == [4, 5, 1, 0, 2]
    mgr.allocate(3, 3 * BS)
    assert mgr.block_table(3) == [4, 5, 1]



def test_nano_runs_the_hash_bookkeeping_of_its_neutralised_hashing(monkeypatch: pytest.MonkeyPatch) -> None:
    """nano-vllm with ``compute_hash`` returning 0, as the contender models it: each block a step fills is hashed
    (chained from the block before), updated with its tokens and entered in ``hash_to_block_id``; an admission looks
    its prompt's first block up (a miss: its stand-in tokens are its own); a reused block leaves the map."""
    from impls.contenders import nano_vllm

    hashed = []
    real_hash = nano_vllm.BlockManager.compute_hash.__func__

    def seen(cls, token_ids: list[int], prefix: int = -1) -> int:
        hashed.append((list(token_ids), prefix))
        return real_hash(cls, token_ids, prefix)

    monkeypatch.setattr(nano_vllm.BlockManager, "compute_hash", classmethod(seen))
    mgr = NanoVllmBlockManager(num_blocks=6, block_size=BS)
    mgr.allocate(0, 2 * BS + 1)  # can_allocate's lookup (nothing hashed yet), then the prefill's postprocess
    first = mgr.seqs[0].stand_in
    assert len(first) == BS and hashed == [(first, -1), (first, -1), (first, 0)]
    assert mgr.block_manager.hash_to_block_id == {0: 1} and [mgr.blocks[b].hash for b in (0, 1, 2)] == [0, 0, -1]
    assert mgr.blocks[1].token_ids == first
    hashed.clear()
    for _ in range(BS - 2):
        mgr.append_slot(0)
    assert hashed == []  # no block filled: the every-step test alone
    mgr.append_slot(0)  # fills block 2: hashed after block 1's hash
    assert hashed == [(first, 0)] and mgr.block_manager.hash_to_block_id == {0: 2}
    hashed.clear()
    mgr.allocate(1, BS + 1)  # can_allocate looks the first block up: it finds block 2, whose tokens differ
    assert hashed[0] == (mgr.seqs[1].stand_in, -1) and mgr.seqs[1].stand_in != first
    assert mgr.block_table(1) == [3, 4] and mgr.block_manager.hash_to_block_id == {0: 3}
    mgr.free(1)
    mgr.free(0)
    mgr.allocate(2, 2 * BS + 1)  # takes 5, 4 and 3: block 3, still named by hash 0, leaves the map as it is reset
    assert mgr.block_table(2) == [5, 4, 3]
    assert mgr.block_manager.hash_to_block_id == {0: 4} and [mgr.blocks[b].hash for b in (5, 4, 3)] == [0, 0, -1]


# -- sglang -------------------------------------------------------------------------------------------------
@pytest.fixture
def sglang_cls():
    pytest.importorskip("torch")
    from impls.contenders.sglang import SGLangBlockManager

    return SGLangBlockManager


@pytest.fixture
def cat_calls(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts torch.cat calls (one entry, the number of tensors joined, per call)."""
    torch = pytest.importorskip("torch")
    calls, real_cat = [], torch.cat

    def counting_cat(tensors, *args, **kwargs):
        tensors = list(tensors)
        calls.append(len(tensors))
        return real_cat(tensors, *args, **kwargs)

    monkeypatch.setattr(torch, "cat", counting_cat)
    return calls


def test_sglang_frees_wait_for_the_next_operation_and_join_at_the_front_with_one_cat(sglang_cls, cat_calls) -> None:
    mgr = sglang_cls(num_blocks=8, block_size=BS, max_seqs=4, max_blocks_per_seq=8)
    assert mgr.free_pages.tolist() == [1, 2, 3, 4, 5, 6, 7, 8]  # SGLang's page ids: page 0 is reserved
    mgr.allocate(0, 2 * BS)  # pages 1, 2: blocks 0, 1
    mgr.allocate(1, 4 * BS)  # blocks 2..5; the head keeps pages 7, 8
    mgr.free(0)
    mgr.free(1)
    # Pending: copies of the rows' token slots (page * page_size + offset), as SGLang's grouped free keeps.
    group = mgr.allocator.free_group
    assert [t.tolist() for t in group] == [list(range(BS, 3 * BS)), list(range(3 * BS, 7 * BS))] and cat_calls == []
    assert mgr.free_pages.tolist() == [7, 8]  # not free until the group ends
    assert mgr.num_free_blocks() == 8 and mgr.ref_count(0) == 0  # queries count the group's pages...
    assert cat_calls == [] and len(mgr.allocator.free_group) == 2  # ...and leave it open
    mgr.allocate(2, 3 * BS)  # joins the step's prefill batch: its pages are held, nothing is extended yet
    assert cat_calls == [] and mgr.num_free_blocks() == 5 and len(mgr.allocator.free_group) == 2
    assert mgr.block_table(2) == [0, 1, 2]  # extending the batch ends the group first; freed pages come first
    assert cat_calls[:2] == [2, 2]  # one cat joins the group, one puts its pages at the front
    assert mgr.allocator.free_group is None
    assert mgr.free_pages.tolist() == [4, 5, 6, 7, 8]


def test_sglang_extends_a_steps_admissions_as_one_prefill_batch(sglang_cls, monkeypatch) -> None:
    """SGLang's scheduler extends a prefill batch with one alloc_extend (mem_cache/allocation.py, alloc_for_extend):
    a step's three admissions are one call of three requests, made when the step's decode batch comes."""
    import numpy as np

    mgr = sglang_cls(num_blocks=16, block_size=BS, max_seqs=4, max_blocks_per_seq=8)
    calls, real = [], mgr.allocator.alloc_extend

    def counting(prefix_lens, *args, **kwargs):
        calls.append(len(prefix_lens))
        return real(prefix_lens, *args, **kwargs)

    monkeypatch.setattr(mgr.allocator, "alloc_extend", counting)
    for row, blocks in ((0, 2), (1, 3), (2, 1)):
        mgr.allocate(row, blocks * BS)
    assert calls == [] and mgr.num_free_blocks() == 10  # the batch's pages are held from each admission on
    assert not mgr.can_allocate(11) and mgr.can_allocate(10)
    slots = np.zeros(3, dtype=np.int64)
    mgr.decode_step(np.array([0, 1, 2]), np.zeros((3, 2), dtype=np.int64), slots)
    assert calls == [3]
    tables = [mgr.block_table(r) for r in range(3)]
    assert sorted(b for t in tables for b in t) == list(range(9))  # six admitted blocks and three new ones
    assert slots.tolist() == [t[-1] * BS for t in tables]


def test_sglang_a_forked_batch_without_a_copy_is_the_default_decode(sglang_cls, monkeypatch) -> None:
    """While a fork shares pages, a step whose rows copy no shared last page makes SGLang's default decode call, one
    alloc_decode, as the calibration's adapter does on SGLang's allocator; only a step with a copy takes its pages in
    the contender's one call of its own (alloc_decode_copying)."""
    import numpy as np

    mgr = sglang_cls(num_blocks=16, block_size=BS, max_seqs=4, max_blocks_per_seq=8)
    calls = []
    for name in ("alloc_decode", "alloc_decode_copying"):
        real = getattr(mgr.allocator, name)
        monkeypatch.setattr(mgr.allocator, name, lambda *a, real=real, name=name: calls.append(name) or real(*a))
    mgr.allocate(0, BS + 1)
    mgr.fork(0, 1)  # both share two pages, the last one partial
    cows, slots = np.zeros((2, 2), dtype=np.int64), np.zeros(2, dtype=np.int64)
    assert mgr.decode_step(np.array([0, 1]), cows, slots) == 1  # the second row copies the shared partial page
    assert calls == ["alloc_decode_copying"]
    assert mgr.decode_step(np.array([0, 1]), cows, slots) == 0  # a full page shared still, no last page to copy
    assert calls == ["alloc_decode_copying", "alloc_decode"] and mgr.ref_count(mgr.block_table(0)[0]) == 2


def test_sglang_queries_between_frees_do_not_change_later_block_ids(sglang_cls) -> None:
    """Regression: a pool query used to end the free group, so asking between two frees released their pages
    in two groups (freed order) instead of one (sorted) and later admissions got other block ids."""
    def run(query_between: bool) -> list[int]:
        mgr = sglang_cls(num_blocks=10, block_size=BS, max_seqs=6, max_blocks_per_seq=5)
        mgr.allocate(1, 5 * BS)
        mgr.allocate(0, 5 * BS)
        mgr.free(1)
        if query_between:
            assert mgr.num_free_blocks() == 5 and mgr.ref_count(mgr.block_table(0)[0]) == 1
        mgr.free(0)
        mgr.allocate(0, 5 * BS)
        return mgr.block_table(0)

    assert run(query_between=True) == run(query_between=False) == [0, 1, 2, 3, 4]


def test_sglang_decode_step_allocates_for_the_whole_batch_at_once(sglang_cls) -> None:
    mgr = sglang_cls(num_blocks=8, block_size=BS, max_seqs=4, max_blocks_per_seq=8)
    mgr.allocate(0, BS)  # full: its next token opens a page
    mgr.allocate(1, 2)
    mgr.allocate(2, BS)
    slots = np.zeros(3, dtype=np.int64)
    assert mgr.decode_step(np.array([0, 1, 2]), np.zeros((3, 2), dtype=np.int64), slots) == 0
    assert mgr.block_table(0) == [0, 3] and mgr.block_table(2) == [2, 4]
    assert slots.tolist() == [3 * BS, 1 * BS + 2, 4 * BS]
    assert mgr.req_to_token[1, :3].tolist() == [2 * BS, 2 * BS + 1, 2 * BS + 2]  # a token slot per token
    assert mgr.req_to_token.dtype == torch_int32()  # SGLang's ReqToTokenPool holds int32 slots


def test_sglang_extend_places_tokens_in_whole_pages_then_a_partial_one(sglang_cls) -> None:
    mgr = sglang_cls(num_blocks=8, block_size=BS, max_seqs=4, max_blocks_per_seq=8)
    mgr.allocate(0, 2 * BS + 1)
    assert mgr.block_table(0) == [0, 1, 2]
    assert mgr.req_to_token[0, : 2 * BS + 1].tolist() == list(range(BS, 3 * BS + 1))
    assert mgr.free_pages.tolist() == [4, 5, 6, 7, 8]


def test_sglang_fork_shares_pages_and_copies_the_tail_on_write(sglang_cls) -> None:
    mgr = sglang_cls(num_blocks=8, block_size=BS, max_seqs=4, max_blocks_per_seq=8)
    mgr.allocate(0, BS + 1)  # blocks 0, 1
    mgr.fork(0, 1)
    assert mgr.shared == {1: 2, 2: 2} and mgr.ref_count(0) == 2 and mgr.ref_count(2) == 0
    cows = np.zeros((2, 2), dtype=np.int64)
    assert mgr.decode_step(np.array([1, 0]), cows, np.zeros(2, dtype=np.int64)) == 1
    assert cows[0].tolist() == [1, 2] and mgr.block_table(1) == [0, 2] and mgr.block_table(0) == [0, 1]
    mgr.free(0)
    assert [t.tolist() for t in mgr.allocator.free_group] == [[2 * BS]] and mgr.ref_count(0) == 1


def torch_int32():
    return pytest.importorskip("torch").int32


# -- registration -------------------------------------------------------------------------------------------
def test_sglang_is_registered_or_unavailable() -> None:
    assert ("sglang" in REGISTRY) != ("sglang" in UNAVAILABLE)


def test_sglang_is_reported_unavailable_without_torch() -> None:
    code = (
        "import sys; sys.modules['torch'] = None\n"  # makes `import torch` raise ImportError
        "import impls; print('sglang' in impls.REGISTRY, impls.UNAVAILABLE['sglang'])"
    )
    root = Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False needs torch: pip install -e '.[torch]'"


# -- vllm-v1-pc: prefix caching ------------------------------------------------------------------------------
def chain(*hashes: int) -> np.ndarray:
    return np.array(hashes, dtype=np.uint64)


def test_vllm_pc_queue_holds_never_cached_blocks_before_cached_ones_in_free_order() -> None:
    """vLLM's one queue is the contract's two sets: uncached blocks at the front, cached ones behind them,
    least recently freed first, a freed prompt's tail before its head."""
    mgr = VllmV1CachingBlockManager(num_blocks=8, block_size=BS)
    assert mgr.allocate_cached(0, 2 * BS + 1, chain(7, 8)) == 0  # blocks 0, 1 cached; 2 partial
    mgr.allocate(1, BS)  # block 3, never cached
    mgr.free(0)
    mgr.free(1)
    assert check_vllm(mgr) == [3, 2, 4, 5, 6, 7, 1, 0]
    assert mgr.num_free_blocks() == 8 and mgr.num_cached_blocks() == 2
    mgr.allocate(2, 6 * BS)  # takes the six uncached blocks; nothing evicted yet
    assert mgr.num_cached_blocks() == 2 and mgr.block_pool.evictions == 0
    mgr.allocate(3, BS)  # evicts the least recently freed cached block: the prompt's tail, block 1
    assert mgr.block_table(3) == [1]
    assert mgr.num_cached_blocks() == 1 and mgr.block_pool.evictions == 1


def test_vllm_pc_hit_touches_an_evictable_block_out_of_the_queue_and_counts_it_as_needed() -> None:
    mgr = VllmV1CachingBlockManager(num_blocks=4, block_size=BS)
    mgr.allocate_cached(0, 2 * BS, chain(5, 6))
    mgr.free(0)
    assert mgr.num_free_blocks() == 4
    assert mgr.allocate_cached(1, 3 * BS, chain(5, 6, 9)) == 2 * BS  # both blocks hit, one fresh
    assert mgr.block_table(1)[:2] == [1, 0] or mgr.block_table(1)[:2] == [0, 1]
    assert [mgr.ref_count(b) for b in mgr.block_table(1)] == [1, 1, 1]
    assert mgr.num_free_blocks() == 1 and mgr.num_cached_blocks() == 3
    check_vllm(mgr)


def test_vllm_pc_calls_cache_blocks_every_step_and_caches_only_on_seal(monkeypatch) -> None:
    mgr = VllmV1CachingBlockManager(num_blocks=8, block_size=BS)
    pool = mgr.block_pool
    calls = []
    real = pool.cache_full_blocks
    monkeypatch.setattr(pool, "cache_full_blocks", lambda **k: calls.append(k["num_full_blocks"]) or real(**k))
    manager = mgr.single_type_manager
    steps = []
    real_cb = manager.cache_blocks
    monkeypatch.setattr(manager, "cache_blocks", lambda *a, **k: steps.append(1) or real_cb(*a, **k))
    mgr.allocate_cached(0, BS + 1, chain(3))
    assert calls == [1] and len(steps) == 1  # the prompt's full block cached at admission
    for _ in range(BS - 1):
        mgr.append_slot(0)
    assert len(steps) == BS and calls == [1]  # one cache_blocks per allocate_slots; no hash, nothing cached
    assert mgr.seal(0, 4) is True and calls == [1, 2] and mgr.num_cached_blocks() == 2


def test_vllm_pc_seal_of_a_hash_already_cached_leaves_the_block_uncached() -> None:
    mgr = VllmV1CachingBlockManager(num_blocks=8, block_size=BS)
    mgr.allocate_cached(0, BS, chain(1))
    mgr.allocate(1, BS)
    assert mgr.seal(1, 1) is False and mgr.num_cached_blocks() == 1
    with pytest.raises(ValueError):
        mgr.seal(0, 2)  # its last block already carries hash 1
    mgr.free(1)
    assert check_vllm(mgr)[0] == mgr.num_blocks - 8 + 1  # the uncached block went to the front


class _Differential:
    """Random calls on the reference model and a caching design side by side, compared after every call up to
    a renaming of block ids that the caches pin: the same hash must name corresponding blocks."""

    def __init__(self, design: object, ref: ReferenceModel, rng: np.random.Generator) -> None:
        self.d, self.r, self.rng = design, ref, rng
        self.bs = ref.block_size

    def prompt_chain(self, n: int) -> np.ndarray:
        """A chain from a small tree of prefixes, so that hits, partial hits and misses all happen."""
        branch = int(self.rng.integers(0, 3))
        return np.array([1000 * (i + 1) + (branch if i >= 2 else 0) for i in range(n // self.bs)], dtype=np.uint64)

    def call(self, name: str, *args: object) -> object:
        outcomes = []
        for mgr in (self.d, self.r):
            try:
                outcomes.append(("ok", getattr(mgr, name)(*args)))
            except (ValueError, KeyError, MemoryError) as exc:
                outcomes.append(("raise", type(exc)))
        (kd, vd), (kr, vr) = outcomes
        assert kd == kr, (name, args, outcomes)
        if name in ("allocate_cached", "seal") and kd == "ok":
            assert vd == vr, (name, args, vd, vr)
        self.compare()
        return vr if kr == "ok" else None

    def compare(self) -> None:
        d, r = self.d, self.r
        assert d.num_free_blocks() == r.num_free_blocks()
        assert d.num_cached_blocks() == r.num_cached_blocks()
        rename: dict[int, int] = {}
        cache = d.block_pool.cached_block_hash_to_block
        for h, rb in r.cache.items():
            ob = cache.get_one_block(int(h).to_bytes(8, "little") + bytes(4))
            assert ob is not None, f"hash {h} cached in the reference only"
            assert rename.setdefault(ob.block_id - 1, rb) == rb
        for seq in r.tables:
            ours, theirs = d.block_table(seq), r.block_table(seq)
            assert d.seq_len(seq) == r.seq_len(seq)
            for ob, rb in zip(ours, theirs, strict=True):
                assert rename.setdefault(ob, rb) == rb
        assert len(set(rename.values())) == len(rename)
        for ob, rb in rename.items():
            assert d.ref_count(ob) == r.ref_count(rb)

    def step(self) -> None:
        r, rng = self.r, self.rng
        live = sorted(r.tables)
        idle = [s for s in range(r.max_seqs) if s not in r.tables]
        kind = rng.integers(0, 10)
        if kind < 3 and idle:
            n = int(rng.integers(1, 6 * self.bs))
            self.call("allocate_cached", idle[0], n, self.prompt_chain(n))
        elif kind == 3 and idle:
            self.call("allocate", idle[0], int(rng.integers(1, 3 * self.bs)))
        elif kind == 4 and live and idle:
            self.call("fork", live[int(rng.integers(len(live)))], idle[0])
        elif kind < 7 and live:
            self.call("free", live[int(rng.integers(len(live)))])
        elif live:
            seq = live[int(rng.integers(len(live)))]
            self.call("append_slot", seq)
            if r.tables.get(seq) and r.lens[seq] % self.bs == 0:
                self.call("seal", seq, int(rng.integers(1, 40)))


@pytest.mark.parametrize("seed", range(6))
def test_vllm_pc_makes_the_reference_models_choices(seed: int) -> None:
    rng = np.random.default_rng(seed)
    run = _Differential(VllmV1CachingBlockManager(12, BS, 8, 8), ReferenceModel(12, BS, 8, 8), rng)
    for _ in range(400):
        run.step()
    check_vllm(run.d)
    assert run.d.block_pool.evictions == run.r.evictions > 0


# -- lmdeploy -----------------------------------------------------------------------------------------------
def test_lmdeploy_hands_out_the_ids_freed_last_first_from_numpy_stacks() -> None:
    """LMDeploy's allocators are NumPy arrays used as stacks: a free writes the ids just below the free part, so the
    next allocation takes them first, in the order the freed table listed them."""
    from impls.contenders.lmdeploy import LmdeployBlockManager

    mgr = LmdeployBlockManager(num_blocks=8, block_size=BS)
    alloc = mgr.allocator
    assert alloc.gpu.ids.dtype == alloc.logical.ids.dtype == alloc.map.refs.dtype == np.int64
    mgr.allocate(0, 3 * BS)
    mgr.allocate(1, BS)
    assert mgr.block_table(0) == [0, 1, 2] and mgr.block_table(1) == [3]
    mgr.free(0)
    assert mgr.num_free_blocks() == 7 and alloc.gpu.ids[1:4].tolist() == [0, 1, 2]  # the stack: 3 in use, then 0 1 2
    mgr.allocate(2, 2 * BS)
    assert mgr.block_table(2) == [0, 1]


def test_lmdeploy_tables_are_numpy_arrays_grown_by_whole_chunks_and_frees_are_stamped() -> None:
    from impls.contenders.lmdeploy import TABLE_CHUNK, LmdeployBlockManager

    mgr = LmdeployBlockManager(num_blocks=2 * TABLE_CHUNK + 8, block_size=1, max_seqs=2,
                               max_blocks_per_seq=2 * TABLE_CHUNK + 8)
    mgr.allocate(0, TABLE_CHUNK)
    assert mgr.table_nbytes(0) == TABLE_CHUNK * 8
    mgr.append_slot(0)
    assert mgr.table_nbytes(0) == 2 * TABLE_CHUNK * 8  # one more chunk, not doubling
    before = mgr.allocator.map.touched.copy()
    mgr.free(0)
    assert (mgr.allocator.map.touched[: TABLE_CHUNK + 1] >= before[: TABLE_CHUNK + 1]).all()


def test_lmdeploy_forks_by_reference_counts_and_copies_a_shared_last_block_on_append() -> None:
    from impls.contenders.lmdeploy import LmdeployBlockManager

    mgr = LmdeployBlockManager(num_blocks=8, block_size=BS)
    mgr.allocate(0, BS + 1)
    mgr.fork(0, 1)
    assert [mgr.ref_count(b) for b in mgr.block_table(0)] == [2, 2] and mgr.num_free_blocks() == 6
    src, dst = mgr.append_slot(1)
    assert src == mgr.block_table(0)[-1] and dst == mgr.block_table(1)[-1] != src
    assert mgr.ref_count(src) == 1 and mgr.ref_count(dst) == 1 and mgr.ref_count(mgr.block_table(1)[0]) == 2
    mgr.free(0)
    mgr.free(1)
    assert mgr.num_free_blocks() == 8 and not mgr.allocator.map.refs.any()


# -- lmdeploy-pc: the block trie -------------------------------------------------------------------------------
@pytest.mark.parametrize("block_size", [1, 2, 4, 16, 128])
def test_lmdeploy_pc_gives_the_trie_one_token_row_per_hash_and_another_for_every_other_hash(block_size) -> None:
    """The trie keys a block by its token ids: cut from the chain hash one-to-one, so equal hashes give equal rows
    (a shared prefix is shared) and any two hashes that differ, even in one bit, give rows that differ."""
    from impls.contenders.lmdeploy_pc import block_tokens, token_layout

    layout = token_layout(block_size)
    hashes = np.array([1, 2, 3, 2**63, 2**64 - 1, 2**64 - 2, 0x0123456789ABCDEF, 1 << 40, 1 << 41],
                      dtype=np.uint64)
    rows = block_tokens(hashes, block_size, layout)
    assert rows.shape == (len(hashes), block_size) and rows.dtype == np.uint64
    assert len({tuple(r) for r in rows.tolist()}) == len(hashes)
    again = block_tokens(hashes[::-1].copy(), block_size, layout)[::-1]
    assert (again == rows).all()
    width = -(-64 // block_size)  # the pieces put back together give the hash
    back = [sum(int(t) << (width * k) for k, t in enumerate(r)) for r in rows.tolist()]
    assert back == [int(h) for h in hashes]


def test_lmdeploy_pc_trie_keys_children_by_the_token_ids_and_holds_a_reference_per_cached_block() -> None:
    from impls.contenders.lmdeploy_pc import LmdeployCachingBlockManager

    mgr = LmdeployCachingBlockManager(num_blocks=8, block_size=BS, max_seqs=4, max_blocks_per_seq=4)
    assert mgr.allocate_cached(0, 2 * BS + 1, np.array([7, 9], dtype=np.uint64)) == 0
    trie = mgr.trie
    root = trie._root("")
    (first,) = root.children.values()
    (second,) = first.children.values()
    assert first.block_hash == hash(("random", tuple(first.token_ids), ())) and first.chain == 7 and second.chain == 9
    assert [first.block_id, second.block_id] == mgr.block_table(0)[:2] and second.prefix_len == 2 * BS
    refs = mgr.allocator.map.refs
    assert refs[mgr.block_table(0)].tolist() == [2, 2, 1]  # the row's and the trie's; the partial block uncached
    assert [mgr.ref_count(b) for b in mgr.block_table(0)] == [1, 1, 1]
    assert mgr.allocate_cached(1, 2 * BS, np.array([7, 9], dtype=np.uint64)) == 2 * BS
    assert refs[mgr.block_table(1)].tolist() == [3, 3]
    mgr.free(0)
    mgr.free(1)
    assert trie.num_evictable == 2 and mgr.num_free_blocks() == 8 and mgr.num_cached_blocks() == 2
    assert refs[[first.block_id, second.block_id]].tolist() == [1, 1]  # held by the trie alone: evictable


def test_lmdeploy_pc_evicts_only_what_the_free_stack_lacks_least_recently_freed_tail_first() -> None:
    from impls.contenders.lmdeploy_pc import LmdeployCachingBlockManager

    mgr = LmdeployCachingBlockManager(num_blocks=4, block_size=BS, max_seqs=4, max_blocks_per_seq=4)
    mgr.allocate_cached(0, 2 * BS, np.array([1, 2], dtype=np.uint64))
    mgr.allocate_cached(1, 2 * BS, np.array([3, 4], dtype=np.uint64))
    a, b = mgr.block_table(0), mgr.block_table(1)
    mgr.free(1)
    mgr.free(0)  # evictable, oldest first: 4, 3 (row 1's tail first), then 2, 1
    stamps = mgr.allocator.get_access_time(np.array([b[1], b[0], a[1], a[0]]))
    assert (np.diff(stamps) > 0).all()
    mgr.allocate(2, BS + 1)  # two fresh blocks: the stack is empty, so the two oldest go
    assert sorted(mgr.block_table(2)) == sorted(b) and mgr.num_cached_blocks() == 2
    assert mgr.allocate_cached(3, 2 * BS, np.array([1, 2], dtype=np.uint64)) == 2 * BS
    assert mgr.block_table(3) == a and mgr.num_free_blocks() == 0
