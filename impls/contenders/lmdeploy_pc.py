"""Contender ``"lmdeploy-pc"``: :mod:`impls.contenders.lmdeploy` with prefix caching on: LMDeploy's block trie,
re-written from its design (docs/implementations.md). The trie keys a block by its token ids; the contract carries
a chained hash per full block instead, so the trie is given token ids cut from that hash (:func:`block_tokens`)."""

from __future__ import annotations

import logging

import numpy as np

from impls.contenders.lmdeploy import Allocator, BlockIds, BlockManager, LmdeployBlockManager, Sequence, Status
from impls.contract import E_ACTIVE, E_NO_BLOCKS, E_NOT_FULL, E_SEALED, blocks_for
from impls.core.validation import chain_arg, hash_arg, seq_arg, tokens_arg

HASH_BITS = 64
logger = logging.getLogger("lmdeploy")  # the trie logs every match at debug level, as LMDeploy's does


def token_layout(block_size: int) -> tuple[np.ndarray, np.uint64]:
    """How :func:`block_tokens` cuts a 64-bit hash: the shift of each of its first pieces, and a piece's mask."""
    width = -(-HASH_BITS // block_size)
    pieces = -(-HASH_BITS // width)
    return np.arange(pieces, dtype=np.uint64) * np.uint64(width), np.uint64((1 << width) - 1)


def block_tokens(chain: np.ndarray, block_size: int, layout: tuple[np.ndarray, np.uint64]) -> np.ndarray:
    """The token ids the trie is given for blocks with chain hashes ``chain``: one row of ``block_size`` uint64 ids
    per block, the hash cut into ``ceil(64 / block_size)``-bit pieces (zeros past the 64 bits). The cut is
    one-to-one, so two blocks get the same ids exactly when their chain hashes are equal."""
    shifts, mask = layout
    tokens = np.zeros((len(chain), block_size), dtype=np.uint64)
    tokens[:, : len(shifts)] = (chain[:, None] >> shifts) & mask
    return tokens


class TokenHistory:
    """A sequence's token ids (LMDeploy's ``HistoryTokenIds``): a NumPy array padded by whole chunks, its real part
    sliced through ``get_real`` on every read, as the trie reads a block's ids."""

    ALLOC_SIZE = 512

    __slots__ = ("_data", "_num_real")

    def __init__(self) -> None:
        self._data = np.empty((self.ALLOC_SIZE,), dtype=np.uint64)
        self._num_real = 0

    def get_real(self) -> np.ndarray:
        return self._data[: self._num_real]

    def __getitem__(self, index):
        return self.get_real()[index]

    def __len__(self) -> int:
        return self._num_real

    def resize(self, size: int) -> None:
        assert size <= self._num_real
        self._num_real = size

    def append(self, ids: np.ndarray) -> None:
        end = self._num_real + len(ids)
        if end > len(self._data):
            more = -(-(end - len(self._data)) // self.ALLOC_SIZE) * self.ALLOC_SIZE
            self._data = np.pad(self._data, (0, more))
        self._data[self._num_real:end] = ids
        self._num_real = end

    def clone(self) -> TokenHistory:
        out = TokenHistory()
        out.append(self.get_real())
        return out


class Node:
    """One full block in the trie (LMDeploy's ``Node``): the key of its token ids (``block_hash``), its logical id,
    its token ids, where it ends in its sequence, its children by key; ``chain`` is the contract's hash."""

    __slots__ = ("block_hash", "block_id", "chain", "children", "extra_identity", "parent", "prefix_len",
                 "routed_experts", "token_ids")

    def __init__(self, block_hash: int, block_id: int, token_ids: np.ndarray | None, prefix_len: int = 0,
                 extra_identity: tuple = (), chain: int = 0) -> None:
        self.block_hash = block_hash
        self.block_id = block_id
        self.token_ids = token_ids
        self.prefix_len = prefix_len
        self.extra_identity = extra_identity
        self.chain = chain
        self.children: dict[int, Node] = {}
        self.parent: Node | None = None
        self.routed_experts = None

    def attach_to(self, parent: Node) -> None:
        parent.children[self.block_hash] = self
        self.parent = parent

    def detach(self) -> None:
        """Leave the trie; children move up to the parent (the contract may evict a block that has children)."""
        parent = self.parent
        if parent.children.get(self.block_hash) is self:
            del parent.children[self.block_hash]
        for key, child in self.children.items():
            child.parent = parent
            parent.children.setdefault(key, child)
        self.parent = None


class ClockAllocator(Allocator):
    """:class:`Allocator` whose access times come from a counter, later ids in a call stamped earlier: a freed
    table's tail is then older than its head, and eviction (least recently accessed first) follows the contract's
    order exactly, where LMDeploy's ``time.perf_counter()`` gives a whole call one time."""

    def __init__(self, num_gpu_blocks: int, num_cpu_blocks: int = 0) -> None:
        super().__init__(num_gpu_blocks, num_cpu_blocks)
        self.clock = 0

    def update_access_time(self, ids: np.ndarray) -> None:
        n = len(ids)
        self.map.touched[ids[::-1]] = np.arange(self.clock, self.clock + n)
        self.clock += n


class BlockTrie:
    """LMDeploy's ``BlockTrie`` for text: nodes per full block under a root per adapter, each holding one reference
    on its block, so a block whose ref count is 1 is held by the trie alone and may be evicted."""

    def __init__(self, allocator: Allocator, block_size: int) -> None:
        self.allocator = allocator
        self.block_size = block_size
        self._roots: dict[str, Node] = {}
        n = len(allocator.map.refs)
        self.node_of: list[Node | None] = [None] * n
        self.in_trie = np.zeros(n, dtype=bool)
        self.by_chain: dict[int, Node] = {}  # the contract's hash -> node: a hash is cached once, anywhere
        self.num_evictable = 0
        self.num_query_tokens = self.num_hit_tokens = 0  # LMDeploy's PrefixCacheStats

    def _root(self, adapter_name: str) -> Node:
        if adapter_name not in self._roots:
            self._roots[adapter_name] = Node(-1, -1, None)
        return self._roots[adapter_name]

    @staticmethod
    def key(token_ids: np.ndarray, extra_identity: tuple) -> int:
        return hash(("random", tuple(token_ids), extra_identity))

    @staticmethod
    def same_block(node: Node, token_ids: np.ndarray, extra_identity: tuple) -> bool:
        return np.array_equal(token_ids, node.token_ids) and extra_identity == node.extra_identity

    def find(self, seq: PcSequence, chain: list[int]) -> list[Node]:
        """The match's walk: each full block's key (its token ids, from the history) among the children, else its
        hash anywhere in the trie (as the contract hits); no reference taken, the stats counted."""
        node = self._root("")
        matched: list[Node] = []
        bs = self.block_size
        history = seq.history_cache
        for i, h in enumerate(chain):
            token_ids = history[i * bs:(i + 1) * bs]
            extra_identity = seq.get_prefix_cache_extra_identity(i * bs, (i + 1) * bs)
            child = node.children.get(self.key(token_ids, extra_identity))
            if child is None or not self.same_block(child, token_ids, extra_identity):
                child = self.by_chain.get(h)
                if child is None:
                    break
            matched.append(child)
            node = child
        self.num_query_tokens += seq.num_all_ids
        self.num_hit_tokens += len(matched) * bs
        logger.debug("Prefix-cache match: matched_step=%s candidate_step=%s", len(matched) * bs, len(chain) * bs)
        return matched

    def take(self, seq: Sequence, ids: np.ndarray) -> None:
        """The match's second half: the hits' access times, one more reference each, appended to the table."""
        alloc = self.allocator
        alloc.update_access_time(ids)
        alloc.add_ref_count(ids, 1)
        seq.logical_blocks.append(ids)
        seq.set_step(len(ids) * self.block_size)

    def attach(self, seq: PcSequence, chain: list[int], first: int, parent: Node) -> None:
        """``allocate``'s path extension: the sequence's blocks ``first ..`` (``chain`` holds their hashes, the
        history their token ids) become children along the path; a hash already cached stays with its block (the
        contract; LMDeploy would swap the sequence's block for the cached one)."""
        bs = self.block_size
        table = seq.logical_blocks.get_real_blocks()
        history = seq.history_cache
        ref_blocks: list[int] = []
        node = parent if parent.parent is None or parent.parent.children.get(parent.block_hash) is parent else \
            self._root("")  # LMDeploy's check that the cursor is still attached
        for i, h in enumerate(chain, first):
            token_ids = history[i * bs:(i + 1) * bs]
            extra_identity = seq.get_prefix_cache_extra_identity(i * bs, (i + 1) * bs)
            key = self.key(token_ids, extra_identity)
            child = node.children.get(key)
            if child is None or not self.same_block(child, token_ids, extra_identity):
                child = self.by_chain.get(h)
            if child is None:
                child = self._new_node(key, int(table[i]), token_ids, (i + 1) * bs, extra_identity, h)
                child.routed_experts = self._routed_experts(seq, i * bs, (i + 1) * bs)
                child.attach_to(node)
                ref_blocks.append(child.block_id)
            node = child
        if ref_blocks:
            self.allocator.add_ref_count(np.array(ref_blocks), 1)

    @staticmethod
    def _routed_experts(seq: PcSequence, start: int, end: int) -> None:
        """A MoE model's routed experts for the block, kept on its node (none asked for here)."""
        if not seq.return_routed_experts:
            return None
        raise AssertionError("routed experts are never asked for")  # pragma: no cover

    def _new_node(self, key: int, block: int, token_ids: np.ndarray, prefix_len: int, extra_identity: tuple,
                  chain: int) -> Node:
        node = Node(key, block, token_ids, prefix_len, extra_identity, chain)
        self.node_of[block] = node
        self.in_trie[block] = True
        self.by_chain[chain] = node
        return node

    def evict(self, max_num_blocks: int) -> int:
        """Free the ``max_num_blocks`` least recently accessed blocks the trie alone holds (LMDeploy: among the
        leaves; under the contract, where every chain shares its prefix, the oldest is always a leaf)."""
        alloc = self.allocator
        candidates = np.flatnonzero(self.in_trie & (alloc.map.refs == 1))
        if len(candidates) == 0:
            return 0
        times = alloc.get_access_time(candidates)
        if max_num_blocks < len(candidates):
            part = np.argpartition(times, max_num_blocks - 1)[:max_num_blocks]
            candidates, times = candidates[part], times[part]
        evicted = candidates[np.argsort(times, kind="stable")]
        node_of, by_chain = self.node_of, self.by_chain
        for block in evicted.tolist():
            node = node_of[block]
            node.detach()
            del by_chain[node.chain]
            node_of[block] = None
        self.in_trie[evicted] = False
        self.num_evictable -= len(evicted)
        alloc.free(evicted)
        return len(evicted)


class CachingBlockManager(BlockManager):
    """LMDeploy's ``DefaultBlockManager`` with the trie's allocator (:class:`ClockAllocator`)."""

    def __init__(self, num_gpu_blocks: int, num_cpu_blocks: int = 0) -> None:
        self.allocator = ClockAllocator(num_gpu_blocks, num_cpu_blocks)


class PcSequence(Sequence):
    """:class:`Sequence` with what the trie reads of it: its token history and the multimodal identity of a token
    range (none: text)."""

    __slots__ = ("history_cache",)
    return_routed_experts = False

    def __init__(self, num_tokens: int, block_size: int, table: object) -> None:
        super().__init__(num_tokens, block_size, table)
        self.history_cache = TokenHistory()

    def get_prefix_cache_extra_identity(self, start: int, end: int) -> tuple:
        return ()

    def set_step(self, step: int) -> None:
        """``step`` tokens are in the cache (a match's hits): the history, and the rest the step's input."""
        total = self.num_all_ids
        self._num_history_ids, self._num_token_ids = step, total - step


class LmdeployCachingBlockManager(LmdeployBlockManager):
    """Contender ``"lmdeploy-pc"``: LMDeploy's block manager with its block trie (prefix caching on), driven as its
    scheduler drives them: match at admission, evict trie-only blocks when the free stack is short, allocate the
    rest, attach full blocks to the trie (docs/implementations.md)."""

    prefix_caching = True
    sequence_class = PcSequence

    def _new_manager(self) -> CachingBlockManager:
        """The block manager, and the trie over its allocator (as LMDeploy's scheduler builds the two)."""
        manager = CachingBlockManager(self.num_blocks)
        self.trie = BlockTrie(manager.allocator, self.block_size)
        self._layout = token_layout(self.block_size)
        return manager

    def memory_bytes(self) -> int:
        """The plain manager's, plus per block a trie flag and a node slot (not the nodes, which grow with use)."""
        return super().memory_bytes() + 9 * self.num_blocks

    def num_free_blocks(self) -> int:
        return self.gpu.free + self.trie.num_evictable

    def num_cached_blocks(self) -> int:
        return len(self.trie.by_chain)

    def _grow_evicting(self, seq: Sequence) -> None:
        """The eviction helper's ``try_make_capacity_for`` and the allocation: trie-only blocks evicted for what the
        free stack lacks. The stack's blocks go first, then the evicted ones (the contract's order: never-cached
        blocks before evictable ones; LMDeploy evicts first, and the evicted ids come off its stack first)."""
        missing = self.manager.blocks_short(seq) - self.gpu.free
        if missing > 0:
            if self.gpu.free:
                seq.logical_blocks.append(self.allocator.allocate(self.gpu.free, "gpu"))
            self.trie.evict(missing)
        self.manager.grow(seq)

    def _allocate(self, seq_id: int, num_blocks: int) -> None:
        """A plain admission: no match and nothing cached (the contract), room made by eviction as LMDeploy's."""
        seq = PcSequence(self._admit_tokens, self.block_size, BlockIds())
        self._grow_evicting(seq)
        seq.state.status = Status.RUNNING
        self.seqs[seq_id] = seq

    def allocate_cached(self, seq_id: int, num_tokens: int, hashes: np.ndarray) -> int:
        """Admit a prompt whose full blocks have the hash chain ``hashes``; returns the tokens served cached."""
        seq_id = seq_arg(seq_id, self.max_seqs)
        num_tokens = tokens_arg(num_tokens, seq_id, self.max_blocks_per_seq, self.block_shift)
        chain = chain_arg(hashes, num_tokens, self.block_shift, seq_id)
        if self._lens[seq_id]:
            self._fail(E_ACTIVE, seq_id)
        seq = PcSequence(num_tokens, self.block_size, BlockIds())
        seq.history_cache.append(block_tokens(chain, self.block_size, self._layout).ravel())
        hashes_list = chain.tolist()
        trie = self.trie
        hits = trie.find(seq, hashes_list)
        ids = np.array([node.block_id for node in hits], dtype=np.int64)
        evictable_hits = int(np.count_nonzero(self.allocator.get_ref_count(ids) == 1)) if hits else 0
        need = blocks_for(num_tokens, self.block_size) - len(hits) + evictable_hits
        if need > self.num_free_blocks():
            self._fail(E_NO_BLOCKS, seq_id, need=need)
        if hits:
            trie.take(seq, ids)
            trie.num_evictable -= evictable_hits
        self._grow_evicting(seq)
        k = len(hits)
        trie.attach(seq, hashes_list[k:], k, hits[-1] if hits else trie._root(""))
        seq.state.status = Status.RUNNING
        self.seqs[seq_id] = seq
        self._lens[seq_id] = num_tokens
        return len(hits) * self.block_size

    def seal(self, seq_id: int, block_hash: int) -> bool:
        """Cache the sequence's full last block under ``block_hash`` (LMDeploy's ``allocate`` attaches it when the
        next block is allocated); False when another block carries that hash."""
        seq_id = self._active(seq_id)
        h = hash_arg(block_hash, seq_id)
        n = self._lens[seq_id]
        if n & (self.block_size - 1):
            self._fail(E_NOT_FULL, seq_id)
        table = self.seqs[seq_id].logical_blocks.get_real_blocks()
        trie = self.trie
        if trie.in_trie[table[-1]]:
            self._fail(E_SEALED, seq_id)
        if h in trie.by_chain:
            return False
        seq = self.seqs[seq_id]
        history = seq.history_cache
        start = n - self.block_size
        if len(history) > start:  # the block came with a chain hash whose block was cached elsewhere: re-keyed
            history.resize(start)
        if len(history) < start:  # earlier blocks without token ids (no chain): never read
            history.append(np.zeros(start - len(history), dtype=np.uint64))
        history.append(block_tokens(np.array([h], dtype=np.uint64), self.block_size, self._layout)[0])
        parent = trie.node_of[table[-2]] if len(table) > 1 else None
        trie.attach(seq, [h], len(table) - 1, parent or trie._root(""))
        return True

    def _grow(self, seq: Sequence) -> None:
        """``schedule_running`` for one sequence, with the eviction helper's room-making before the allocation."""
        if seq.status != Status.RUNNING:  # pragma: no cover - every row is running
            raise AssertionError("a sequence not running was scheduled")
        if self.manager.blocks_short(seq) == 0:
            return
        self._grow_evicting(seq)

    def _copy_shared_last(self, seq: Sequence) -> tuple[int, int] | None:
        if self.gpu.free == 0 and self.allocator.get_ref_count(seq.logical_blocks.get_real_blocks()[-1]) > 1:
            self.trie.evict(1)
        return super()._copy_shared_last(seq)

    def _free(self, seq_id: int) -> None:
        seq = self.seqs[seq_id]
        self.seqs[seq_id] = None
        ids = seq.logical_blocks.get_real_blocks().copy()
        self.manager.release(seq)
        trie = self.trie
        held = ids[trie.in_trie[ids]]  # its trie blocks now held by the trie alone join the evictable
        if len(held):
            trie.num_evictable += int(np.count_nonzero(self.allocator.get_ref_count(held) == 1))

    def _ref(self, block_id: int) -> int:
        """References held by sequences: the allocator's count less the trie's own (ids are physical ids)."""
        return int(self.allocator.map.refs[block_id]) - int(self.trie.in_trie[block_id])
