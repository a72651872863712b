"""``dict-pc``: design A (:mod:`impls.designs.dict_design`) with vLLM v1's prefix cache.

The cache follows vLLM v1 (``vllm/v1/core/block_pool.py`` ``BlockPool.cached_block_hash_to_block``,
``get_cached_block``, ``cache_full_blocks``, ``_maybe_evict_cached_block``, ``touch``, ``free_blocks``; and
``vllm/v1/core/kv_cache_utils.py`` ``FreeKVCacheBlockQueue``), in design A's plain Python containers:

- ``_cache``: a dict hash -> block, and ``_hash_of``: per block its hash (0: none), as ``KVCacheBlock.block_hash``;
- an intrusive doubly linked list of the evictable blocks (cached, ref 0), oldest freed first: per block a
  ``prev`` and a ``next`` index in two preallocated lists, one sentinel (index ``num_blocks``) closing the ring,
  as ``FreeKVCacheBlockQueue``'s fake head and tail. ``remove`` (a hit on an evictable block, vLLM's ``touch``)
  and ``popleft`` (an eviction) are O(1);
- never-cached free blocks stay in design A's free list, apart, so a fresh block is taken from there first.
  vLLM 0.33 keeps them in the same queue instead and ``free_blocks`` *prepends* blocks without a hash, so its
  ``popleft`` also takes them before any cached block: the same choice, up to renaming of never-cached ids.

Departures from vLLM, to follow the contract (:class:`impls.contract.CachingBlockManager`): a hash is an opaque
integer given by the caller (vLLM computes ``BlockHash`` from token ids and extra keys, and keys the dict by
hash plus KV-cache group id); a hash carried by another block is not inserted again (vLLM 0.33 keeps a
per-hash dict of duplicate blocks); no KV events, no metrics, no null block.
"""

from __future__ import annotations

from impls.core.interpreted_caching import CachingPlumbing
from impls.designs.dict_design import DictBlockManager


class DictPcBlockManager(CachingPlumbing, DictBlockManager):
    """Design A with vLLM v1's prefix cache (``"dict-pc"``)."""

    prefix_caching = True

    def __init__(self, num_blocks: int, block_size: int = 16, max_seqs: int = 256,
                 max_blocks_per_seq: int = 256) -> None:
        super().__init__(num_blocks, block_size, max_seqs, max_blocks_per_seq)
        n = self.num_blocks
        self._cache: dict[int, int] = {}
        self._hash_of = [0] * n
        # The evictable ring: index n is the sentinel (prev = newest, next = oldest). Blocks outside it keep
        # stale links, which nothing reads (vLLM sets them to None; a list of ints has no None to spare).
        self._prev = [n] * (n + 1)
        self._next = [n] * (n + 1)
        self._num_evictable = 0

    def memory_bytes(self) -> int:
        """Design A's, plus per block a hash slot and two link slots (8 B each; the links' int objects are the
        block ids design A already counts) and the sentinel's two links. The hash dict grows with the cached
        blocks (about 100 B per entry with its key object), as design A's tables grow with blocks in use."""
        return super().memory_bytes() + 24 * self.num_blocks + 16

    def num_free_blocks(self) -> int:
        return len(self._free_list) + self._num_evictable

    def num_cached_blocks(self) -> int:
        return len(self._cache)

    # -- the evictable ring (FreeKVCacheBlockQueue) ---------------------------------------------------------
    def _push_newest(self, block: int) -> None:
        sentinel = self.num_blocks
        newest = self._prev[sentinel]
        self._prev[block], self._next[block] = newest, sentinel
        self._next[newest] = self._prev[sentinel] = block
        self._num_evictable += 1

    def _unlink(self, block: int) -> None:
        prev, nxt = self._prev[block], self._next[block]
        self._next[prev], self._prev[nxt] = nxt, prev
        self._num_evictable -= 1

    # -- primitives -----------------------------------------------------------------------------------------
    def _take(self) -> int:
        if self._free_list:
            block = self._free_list.pop()
        else:  # evict the least recently freed cached block (the ring's oldest), dropping its hash
            block = self._next[self.num_blocks]
            self._unlink(block)
            del self._cache[self._hash_of[block]]
            self._hash_of[block] = 0
        self._refs[block] = 1
        return block

    def _free(self, seq_id: int) -> None:
        table = self._tables.pop(seq_id)
        refs = self._refs
        for i in range(len(table) - 1, -1, -1):  # last block first: a prompt's tail is evicted before its head
            block = table[i]
            if refs[block] > 1:
                refs[block] -= 1
                continue
            del refs[block]
            if self._hash_of[block]:
                self._push_newest(block)
            else:
                self._free_list.append(block)

    def _match(self, chain: list[int]) -> list[int]:
        hits = []
        cache = self._cache
        for h in chain:
            block = cache.get(h)
            if block is None:
                break
            hits.append(block)
        return hits

    def _admit(self, seq_id: int, hits: list[int], num_blocks: int, chain: list[int]) -> None:
        refs = self._refs
        for block in hits:  # vLLM's touch: an evictable hit leaves the queue
            if block in refs:
                refs[block] += 1
            else:
                self._unlink(block)
                refs[block] = 1
        table = dict(enumerate(hits))
        k = len(hits)
        for i in range(k, num_blocks):
            table[i] = self._take()
        cache, hash_of = self._cache, self._hash_of
        for i in range(k, len(chain)):  # the fresh full blocks, after every take (a take may evict a hash)
            h = chain[i]
            if h not in cache:
                cache[h] = table[i]
                hash_of[table[i]] = h
        self._tables[seq_id] = table

    def _last_hashed(self, seq_id: int) -> bool:
        table = self._tables[seq_id]
        return self._hash_of[table[len(table) - 1]] != 0

    def _cache_last(self, seq_id: int, h: int) -> bool:
        if h in self._cache:
            return False
        table = self._tables[seq_id]
        block = table[len(table) - 1]
        self._cache[h] = block
        self._hash_of[block] = h
        return True

