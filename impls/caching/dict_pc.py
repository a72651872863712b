"""``dict-pc``: design A (:mod:`impls.designs.dict_design`) with vLLM v1's prefix cache."""

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
        # The evictable ring: index n is the sentinel (prev = newest, next = oldest); links outside it are stale.
        self._prev = [n] * (n + 1)
        self._next = [n] * (n + 1)
        self._num_evictable = 0

    def memory_bytes(self) -> int:
        return super().memory_bytes() + 24 * self.num_blocks + 16

    def num_free_blocks(self) -> int:
        return len(self._free_list) + self._num_evictable

    def num_cached_blocks(self) -> int:
        return len(self._cache)

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

    def _take(self) -> int:
        if self._free_list:
            block = self._free_list.pop()
        else:
            block = self._next[self.num_blocks]
            self._unlink(block)
            del self._cache[self._hash_of[block]]
            self._hash_of[block] = 0
        self._refs[block] = 1
        return block

    def _free(self, seq_id: int) -> None:
        table = self._tables.pop(seq_id)
        refs = self._refs
        for i in range(len(table) - 1, -1, -1):
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
        for block in hits:
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
        for i in range(k, len(chain)):
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

