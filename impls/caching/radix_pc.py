"""``radix-pc``: SGLang's radix cache over block hashes, on design B's pool (:mod:`impls.designs.list_design`)."""

from __future__ import annotations

import heapq
import sys

from impls.core.interpreted_caching import CachingPlumbing
from impls.designs.list_design import ListBlockManager


class TreeNode:
    """One cached block: its hash (``key``), its block id (``value``), its place in the tree."""

    __slots__ = ("children", "key", "parent", "stamp", "value")

    def __init__(self, key: int, value: int, parent: TreeNode | None) -> None:
        self.key = key
        self.value = value
        self.parent = parent
        self.children: dict[int, TreeNode] = {}
        self.stamp = -1


_ROOT_BYTES = sys.getsizeof(TreeNode(0, -1, None)) + sys.getsizeof({})


class RadixPcBlockManager(CachingPlumbing, ListBlockManager):
    """SGLang's radix cache over block hashes (``"radix-pc"``)."""

    prefix_caching = True

    def __init__(self, num_blocks: int, block_size: int = 16, max_seqs: int = 256,
                 max_blocks_per_seq: int = 256) -> None:
        super().__init__(num_blocks, block_size, max_seqs, max_blocks_per_seq)
        self._root = TreeNode(0, -1, None)
        self._node_of: list[TreeNode | None] = [None] * self.num_blocks
        self._by_hash: dict[int, TreeNode] = {}
        self._heap: list[tuple[int, int]] = []
        self._clock = 0
        self._num_evictable = 0

    def memory_bytes(self) -> int:
        return super().memory_bytes() + 8 * self.num_blocks + _ROOT_BYTES

    def num_free_blocks(self) -> int:
        return len(self._free_list) + self._num_evictable

    def num_cached_blocks(self) -> int:
        return len(self._by_hash)

    def _insert(self, parent: TreeNode, key: int, block: int) -> TreeNode:
        node = TreeNode(key, block, parent)
        parent.children[key] = node
        self._by_hash[key] = node
        self._node_of[block] = node
        return node

    def _pop_oldest(self) -> TreeNode:
        """The least recently freed evictable node, off the heap."""
        heap, node_of = self._heap, self._node_of
        while True:
            stamp, block = heapq.heappop(heap)
            node = node_of[block]
            if node is not None and node.stamp == stamp:
                return node

    def _evict(self) -> int:
        """Drop the least recently freed evictable node from the tree; returns its block."""
        node = self._pop_oldest()
        block, node_of = node.value, self._node_of
        parent = node.parent
        del parent.children[node.key]
        for key, child in node.children.items():
            child.parent = parent
            parent.children[key] = child
        del self._by_hash[node.key]
        node_of[block] = None
        self._num_evictable -= 1
        return block

    def _release_node(self, node: TreeNode, block: int) -> None:
        """dec_lock_ref to 0: the node becomes evictable, the most recently freed."""
        heap = self._heap
        if len(heap) > 2 * self.num_blocks + 16:
            heap[:] = [(n.stamp, n.value) for n in self._node_of if n is not None and n.stamp >= 0]
            heapq.heapify(heap)
        self._clock += 1
        node.stamp = self._clock
        heapq.heappush(heap, (self._clock, block))
        self._num_evictable += 1

    def _take(self) -> int:
        block = self._free_list.pop() if self._free_list else self._evict()
        self._refs[block] = 1
        return block

    def _free(self, seq_id: int) -> None:
        table = self._tables[seq_id]
        self._tables[seq_id] = None
        refs, node_of = self._refs, self._node_of
        for block in reversed(table):
            refs[block] -= 1
            if refs[block] == 0:
                node = node_of[block]
                if node is None:
                    self._free_list.append(block)
                else:
                    self._release_node(node, block)

    def _match(self, chain: list[int]) -> list[int]:
        hits = []
        node, by_hash = self._root, self._by_hash
        for key in chain:
            child = node.children.get(key)
            if child is None:
                child = by_hash.get(key)
                if child is None:
                    break
            hits.append(child.value)
            node = child
        return hits

    def _admit(self, seq_id: int, hits: list[int], num_blocks: int, chain: list[int]) -> None:
        refs, node_of = self._refs, self._node_of
        for block in hits:
            if refs[block] == 0:
                node_of[block].stamp = -1
                self._num_evictable -= 1
            refs[block] += 1
        k = len(hits)
        table = hits + [self._take() for _ in range(num_blocks - k)]
        parent = node_of[hits[-1]] if k else self._root
        by_hash = self._by_hash
        for i in range(k, len(chain)):
            key = chain[i]
            node = by_hash.get(key)
            parent = self._insert(parent, key, table[i]) if node is None else node
        self._tables[seq_id] = table

    def _last_hashed(self, seq_id: int) -> bool:
        return self._node_of[self._tables[seq_id][-1]] is not None

    def _cache_last(self, seq_id: int, key: int) -> bool:
        if key in self._by_hash:
            return False
        table = self._tables[seq_id]
        parent = self._node_of[table[-2]] if len(table) > 1 else None
        self._insert(parent or self._root, key, table[-1])
        return True
