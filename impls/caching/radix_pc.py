"""``radix-pc``: SGLang's radix cache over block hashes, on design B's pool (:mod:`impls.designs.list_design`).

Follows SGLang 0.5.x, ``python/sglang/srt/mem_cache/radix_cache.py``:

- ``TreeNode``: a node per cached block (``page_size == block_size``: one page per node, as SGLang's paged
  tree with every node split at page boundaries), ``children`` keyed by the next block's hash (SGLang's
  ``get_child_key``: the page's first tokens), ``parent``, ``key`` (the hash), ``value`` (the block id);
- ``RadixCache.match_prefix``: walk from the root, child by child, to the first miss;
- ``RadixCache.insert``: below the last node walked, one new node per full block whose hash is not in the tree
  yet; a block whose hash is there already is skipped and the walk continues through the existing node;
- ``RadixCache.evict`` with ``TreeNode.__lt__``: a ``heapq`` ordered by time, popping until an evictable node
  is found; ``_delete_leaf``; ``evictable_size_`` (here ``_num_evictable``);
- ``inc_lock_ref`` / ``dec_lock_ref``: a node with ``lock_ref > 0`` is protected. Here a node's lock count is
  its block's ref count (``refs[block]``: the tables that hold it), kept once; SGLang also locks every ancestor
  up to the root, which here is the same count whenever a table holding a block holds its tree parent too.

What it must do differently to make exactly the contract's choices (:class:`impls.contract.CachingBlockManager`;
the differential test ``tests/test_prefix_caching.py`` holds it to the reference model):

- Eviction order. SGLang orders by ``last_access_time`` (set on match and insert) and evicts leaves only; the
  contract evicts the *least recently freed* evictable block, leaf or not. Here the heap is keyed by a free
  stamp. Under the contract's free order the two agree whenever every table that holds a cached block also
  holds its tree parent (a sequence's blocks are hits or its own inserts along one chain): then a node becomes
  evictable only after its last table released it, and that table released the node's cached children first
  (reverse table order) and its parent after it; a child held by another table keeps the parent held too. So
  the least recently freed evictable node has no child that is in use or freed later: it is a leaf, and it is
  the least recently freed evictable leaf. The contract also allows tables that break the premise (a fresh
  block whose hash another block carries stays uncached but its successor is inserted below that other
  block's node; ``seal`` after a plain ``allocate``; chains that reuse a hash after different predecessors),
  so ``_evict`` takes the contract's node even when it is inner and splices its children up to its parent:
  SGLang never evicts an inner node.
- Identity of a cached block. In SGLang a node is identified by its token path, so a page is in the tree at
  most once. Here the hash stands for its whole prefix, and the contract caches each hash at most once
  whatever chain it arrives in, so a hash -> node index (``_by_hash``) backs the tree: ``insert`` consults it
  (a hash anywhere in the tree is not inserted again), and ``match_prefix`` falls back to it when the walk
  steps off the tree (only the cases above; prefix-consistent chains of content hashes never do).
- A copy of a block whose hash is cached stays the sequence's own, uncached (SGLang frees the duplicate pages
  and points the request at the tree's); ``seal`` inserts one node under the node of the sequence's previous
  block, or under the root when that block is not cached.

Left out: token-level keys and node splitting (keys are whole blocks), ``RadixKey.extra_key`` namespaces,
host/storage tiers (``HiRadixCache``), eviction policies other than LRU, KV events, metrics, the request
objects (``cache_finished_req`` / ``cache_unfinished_req``: the contract's ``allocate_cached`` and ``seal``
stand for them).
"""

from __future__ import annotations

import heapq
import sys

from impls.core.interpreted_caching import CachingPlumbing
from impls.designs.list_design import ListBlockManager


class TreeNode:
    """One cached block: its hash (``key``), its block id (``value``), its place in the tree. ``stamp`` is
    when it was last freed (the heap's key); -1 while in use."""

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
        self._heap: list[tuple[int, int]] = []  # (free stamp, block); entries of re-used nodes are stale
        self._clock = 0
        self._num_evictable = 0

    def memory_bytes(self) -> int:
        """Design B's, plus per block a node slot (8 B) and the root node. Nodes (about 250 B each with their
        children dict), the hash index and the heap grow with the cached blocks."""
        return super().memory_bytes() + 8 * self.num_blocks + _ROOT_BYTES

    def num_free_blocks(self) -> int:
        return len(self._free_list) + self._num_evictable

    def num_cached_blocks(self) -> int:
        return len(self._by_hash)

    # -- the tree ---------------------------------------------------------------------------------------------
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
            if node is not None and node.stamp == stamp:  # else stale: hit since, or evicted and re-cached
                return node

    def _evict(self) -> int:
        """Drop the least recently freed evictable node from the tree; returns its block."""
        node = self._pop_oldest()
        block, node_of = node.value, self._node_of
        parent = node.parent
        del parent.children[node.key]
        for key, child in node.children.items():  # only an inner node has any (see the module docstring)
            child.parent = parent
            parent.children[key] = child
        del self._by_hash[node.key]
        node_of[block] = None
        self._num_evictable -= 1
        return block

    def _release_node(self, node: TreeNode, block: int) -> None:
        """dec_lock_ref to 0: the node becomes evictable, the most recently freed."""
        heap = self._heap
        if len(heap) > 2 * self.num_blocks + 16:  # drop stale entries: at most one live entry per block
            heap[:] = [(n.stamp, n.value) for n in self._node_of if n is not None and n.stamp >= 0]
            heapq.heapify(heap)
        self._clock += 1
        node.stamp = self._clock
        heapq.heappush(heap, (self._clock, block))
        self._num_evictable += 1

    # -- primitives -------------------------------------------------------------------------------------------
    def _take(self) -> int:
        block = self._free_list.pop() if self._free_list else self._evict()
        self._refs[block] = 1
        return block

    def _free(self, seq_id: int) -> None:
        table = self._tables[seq_id]
        self._tables[seq_id] = None
        refs, node_of = self._refs, self._node_of
        for block in reversed(table):  # last block first: a prompt's tail is evicted before its head
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
                child = by_hash.get(key)  # cached off this path (see the module docstring)
                if child is None:
                    break
            hits.append(child.value)
            node = child
        return hits

    def _admit(self, seq_id: int, hits: list[int], num_blocks: int, chain: list[int]) -> None:
        refs, node_of = self._refs, self._node_of
        for block in hits:  # inc_lock_ref: an evictable hit leaves the heap (its entry goes stale)
            if refs[block] == 0:
                node_of[block].stamp = -1
                self._num_evictable -= 1
            refs[block] += 1
        k = len(hits)
        table = hits + [self._take() for _ in range(num_blocks - k)]
        parent = node_of[hits[-1]] if k else self._root
        by_hash = self._by_hash
        for i in range(k, len(chain)):  # insert, after every take (a take may evict a hash of the chain)
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
