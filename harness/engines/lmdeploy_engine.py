"""LMDeploy's own ``DefaultBlockManager`` (PyTorch engine) behind our contract, for the contender ``lmdeploy``.
Design: docs/output.md#harnessengineslmdeploy_enginepy."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import numpy as np

from harness.base.replay import ReplayError
from harness.engines.adapter import EngineAdapter
from harness.engines.catalog import Baseline
from harness.engines.eras import Era, era_of
from harness.engines.loader import ImportPlan
from impls.contenders.lmdeploy import SchedulerDrive, Sequence, Status
from impls.contenders.lmdeploy_pc import PcSequence, block_tokens, token_layout
from impls.contract import E_ACTIVE, E_NO_BLOCKS, E_NOT_FULL, E_SEALED, NoFreeBlocksError, blocks_for
from impls.core.validation import chain_arg, hash_arg, seq_arg, tokens_arg

PAGING = "lmdeploy.pytorch.paging.block_manager"
REAL = (f"{PAGING}.base_block_manager", f"{PAGING}.default_block_manager", "lmdeploy.pytorch.block")
TRIE_PACKAGE = "lmdeploy.pytorch.paging.block_trie"
TRIE = (TRIE_PACKAGE, *(f"{TRIE_PACKAGE}.{m}" for m in ("trie", "node", "kv_lifecycle", "checkpoint",
                                                       "checkpoint_lifecycle")),
        "lmdeploy.pytorch.prefix_cache_state")
# lmdeploy.utils imports torch for its logger; the trie's debug lines stay below the logger's level
LOGGER_STUB = {"lmdeploy.utils": {"get_logger": logging.getLogger}}
TRIE_STUBS = {**LOGGER_STUB, "lmdeploy.pytorch.paging.state_manager": {}}
# before 0.16.0 the trie is one module; its CacheConfig and BaseBlockManager only annotate BlockTrie's arguments
OLD_TRIE = (TRIE_PACKAGE,)
OLD_TRIE_STUBS = {"lmdeploy.pytorch.config": {}, PAGING: {}}


class CrossSequence(Sequence):
    __slots__ = ()

    def num_all_cross_tokens(self) -> int:
        return 0


class CalledSequence(CrossSequence):
    __slots__ = ()

    def num_all_tokens(self) -> int:
        return self._num_history_ids + self._num_token_ids


ERAS = (
    Era("0.9.2", "0.10.0", "the first release the plan drives: num_required_blocks calls seq.num_all_tokens() and "
        "seq.num_all_cross_tokens(); up to 0.9.2.post1 BaseBlockManager.allocate checks isinstance(seq, "
        "SchedulerSequence); the block trie is the module paging/block_trie.py (BlockTrie(cache_config, "
        "block_manager), its cursor the table's last_shared_node, its bound seq.num_all_ids)",
        real=OLD_TRIE, stubs=OLD_TRIE_STUBS, drive={"sequence": CalledSequence, "trie": "table"}),
    Era("0.10.1", "0.11.1", "num_required_blocks reads the property seq.num_all_ids, no longer num_all_tokens(); the "
        "trie's match and allocate stop at seq.num_valid_ids, no longer seq.num_all_ids",
        real=OLD_TRIE, stubs=OLD_TRIE_STUBS, drive={"sequence": CrossSequence, "trie": "table"}),
    Era("0.12.0", "0.13.0", "num_required_blocks no longer reads the cross-attention tokens (num_all_cross_tokens)",
        real=OLD_TRIE, stubs=OLD_TRIE_STUBS, drive={"sequence": Sequence, "trie": "table"}),
    Era("0.14.0", "0.14.0", "the trie keeps its cursor in seq.prefix_cache (a PrefixCacheState of messages.py, "
        "last_shared_node), keys a block by its token ids and multimodal hashes (_make_key) and logs (lmdeploy.utils); "
        "the table no longer has last_shared_node", real=OLD_TRIE, stubs={**OLD_TRIE_STUBS, **LOGGER_STUB},
        drive={"sequence": Sequence, "trie": "prefix_cache"}),
    Era("0.15.0", "0.15.0", "num_required_blocks caps the tokens at seq.kv_token_limit (long-context prefill chunks); "
        "the trie's allocate caps them too and reads the recompute-overlap fields of seq.prefix_cache",
        real=OLD_TRIE, stubs={**OLD_TRIE_STUBS, **LOGGER_STUB}, drive={"sequence": Sequence, "trie": "prefix_cache"}),
    Era("0.16.0", "0.18.0", "the block trie became the package paging/block_trie (BlockTrie(allocator=, block_size=, "
        "enabled=), seq.prefix_cache a PrefixCacheState with its trie cursor)",
        real=TRIE, stubs=TRIE_STUBS, drive={"sequence": Sequence, "trie": "package"}),
)
BEFORE = ("releases before 0.9.2 were not read: the eras of harness/engines/lmdeploy_engine.py were checked against "
          "the wheels of 0.9.2 to 0.18.0")


def era(version: str | None = None) -> Era:
    return era_of(ERAS, "lmdeploy", version, BEFORE)


def plan(version: str | None = None) -> ImportPlan:
    e = era(version)
    return ImportPlan(packages=("lmdeploy",), real=(*REAL, *e.real),
                      stubs={"lmdeploy.pytorch.messages": {"SchedulerSequence": e.drive["sequence"]}, **e.stubs})


def load(version: str | None = None) -> SimpleNamespace:
    from lmdeploy.pytorch.block import LogicalTokenBlocks
    from lmdeploy.pytorch.paging.block_manager.default_block_manager import DefaultBlockManager

    e = era(version)
    out = SimpleNamespace(DefaultBlockManager=DefaultBlockManager, LogicalTokenBlocks=LogicalTokenBlocks,
                          Sequence=e.drive["sequence"])
    if e.drive.get("trie"):  # the trie (a module before 0.16.0, a package from it) where the era drives it
        from lmdeploy.pytorch.paging.block_trie import BlockTrie

        out.BlockTrie, out.CachingEngine = BlockTrie, CACHING[e.drive["trie"]]
        out.TrieSequence = type("TrieSequence", (out.CachingEngine.sequence_base, e.drive["sequence"]),
                                {"__slots__": ()})  # an instance of the class messages.py stands in for
    if e.drive.get("trie") == "package":
        from lmdeploy.pytorch.prefix_cache_state import PrefixCacheState

        out.PrefixCacheState = PrefixCacheState
    return out


class LmdeployEngine(SchedulerDrive, EngineAdapter):
    lmdeploy: SimpleNamespace

    def __init__(self, num_blocks: int, block_size: int = 16, max_seqs: int = 256,
                 max_blocks_per_seq: int = 256) -> None:
        super().__init__(num_blocks, block_size, max_seqs, max_blocks_per_seq)
        self.sequence_class = self.lmdeploy.Sequence
        self.bm = self.lmdeploy.DefaultBlockManager(self.num_blocks, 0)
        self.allocator = self.bm.allocator
        self.gpu = self.allocator.get_phy_allocator("gpu")
        self.seqs: list = [None] * self.max_seqs

    def num_free_blocks(self) -> int:
        return self.gpu._free_count

    def _allocate(self, seq_id: int, num_blocks: int) -> None:
        lm, bm = self.lmdeploy, self.bm
        seq = lm.Sequence(self._admit_tokens, self.block_size, lm.LogicalTokenBlocks())
        if bm.num_required_blocks(seq, 0) > bm.get_num_free_gpu_blocks():
            raise NoFreeBlocksError(f"LMDeploy's block manager has no room for row {seq_id}")
        bm.allocate(seq, 0)
        seq.state.status = Status.RUNNING
        self.seqs[seq_id] = seq

    def _grow(self, seq) -> None:
        if seq.status != Status.RUNNING:
            raise ReplayError("a sequence not running was scheduled")
        bm = self.bm
        if bm.num_required_blocks(seq, 0) == 0:
            return
        if bm.num_required_blocks(seq, 0) > bm.get_num_free_gpu_blocks():
            raise NoFreeBlocksError("LMDeploy's block manager has no room for a decode token (it would preempt)")
        bm.allocate(seq, 0)

    def _free(self, seq_id: int) -> None:
        seq = self.seqs[seq_id]
        self.seqs[seq_id] = None
        self.bm.free(seq)

    def _memory(self):
        return self.allocator._log_mem

    def _physical(self, seq) -> np.ndarray:
        return self.bm.get_block_table(seq)

    def _ref(self, block_id: int) -> int:
        m = self._memory()
        return int(m.ref_count[(m.phy_map == block_id) & (m.ref_count > 0)].sum())


class TrieSequence(PcSequence):
    """The contender's sequence with what LMDeploy's ``BlockTrie`` reads of a ``SchedulerSequence``: the token
    history, the wheel's ``PrefixCacheState``, no adapter, no routed experts, no multimodal spans. During a match it
    counts one token more, so the trie (which keeps the last token out of a hit) may hit every full block, as the
    contract does."""

    __slots__ = ("_match_extra", "prefix_cache")
    adapter_name = None
    session_id = seq_id = 0  # read for the trie's debug lines

    @property
    def num_history_ids(self) -> int:
        return self._num_history_ids

    @property
    def num_valid_ids(self) -> int:
        return self._num_history_ids + self._num_token_ids + self._match_extra

    def get_prefix_cache_max_match_step(self) -> int:
        return self.num_valid_ids - 1

    def clamp_prefix_cache_match_step(self, step: int) -> int:
        return step


class OldTrieSequence(TrieSequence):
    """:class:`TrieSequence` for the trie module before 0.16.0: ``num_all_ids`` (its bound up to 0.10.0) counts the
    match's extra token too; no multimodal hashes."""

    __slots__ = ()

    @property
    def num_all_ids(self) -> int:
        return self.num_valid_ids

    def set_step(self, step: int) -> None:
        total = self._num_history_ids + self._num_token_ids
        self._num_history_ids, self._num_token_ids = step, total - step

    def get_prefix_cache_extra_hashes(self, start: int, end: int) -> tuple:
        return ()


class PrefixCacheFields:
    """The fields of ``seq.prefix_cache`` the trie of 0.14.0 and 0.15.0 reads on its text path (LMDeploy's
    ``PrefixCacheState`` is in messages.py, which the plan stands in for)."""

    __slots__ = ("last_shared_node", "match_start_step", "private_recompute_end_step",
                 "private_recompute_start_step", "restore_node", "restore_state")
    match_recompute_blocks = 0
    suppress_match_stats = False

    def __init__(self) -> None:
        self.last_shared_node = self.restore_node = None
        self.match_start_step = 0
        self.restore_state = self.private_recompute_start_step = self.private_recompute_end_step = -1


class LmdeployCachingEngine(LmdeployEngine):
    """:class:`LmdeployEngine` with LMDeploy's ``BlockTrie`` on (the package, 0.16.0 on; the subclasses drive the
    module before it), driven as the contender ``lmdeploy-pc`` drives its own trie."""

    prefix_caching = True
    sequence_base = TrieSequence
    node_fields = ("token_ids", "block_id")
    cursor_at = ("prefix_cache", "trie_cursor")
    root_method = "_get_or_create_root"
    built = "BlockTrie(allocator, block_size, enabled=True)"

    def __init__(self, num_blocks: int, block_size: int = 16, max_seqs: int = 256,
                 max_blocks_per_seq: int = 256) -> None:
        super().__init__(num_blocks, block_size, max_seqs, max_blocks_per_seq)
        self.trie = self._new_trie()
        self.sequence_class = self.lmdeploy.TrieSequence
        self._layout = token_layout(self.block_size)
        self.in_trie = np.zeros(self.num_blocks, dtype=bool)
        self.num_evictable = 0

    def _new_trie(self):
        return self.lmdeploy.BlockTrie(allocator=self.allocator, block_size=self.block_size, enabled=True)

    def _new_cache_state(self, seq: TrieSequence) -> None:
        seq.prefix_cache = self.lmdeploy.PrefixCacheState()

    def _cursor(self, seq: TrieSequence):
        holder, name = self.cursor_at
        return getattr(getattr(seq, holder), name)

    def _set_cursor(self, seq: TrieSequence, node) -> None:
        holder, name = self.cursor_at
        setattr(getattr(seq, holder), name, node)

    def _root(self, seq: TrieSequence):
        return getattr(self.trie, self.root_method)(seq.adapter_name)

    def _key(self, tokens: np.ndarray) -> int:
        return self.trie._hash_block(tokens, ())

    def num_free_blocks(self) -> int:
        return self.gpu._free_count + self.num_evictable

    def num_cached_blocks(self) -> int:
        return int(np.count_nonzero(self.in_trie))

    def _new_sequence(self, num_tokens: int) -> TrieSequence:
        seq = self.sequence_class(num_tokens, self.block_size, self.lmdeploy.LogicalTokenBlocks())
        self._new_cache_state(seq)
        seq._match_extra = 0
        return seq

    def _allocate(self, seq_id: int, num_blocks: int) -> None:
        seq = self._new_sequence(self._admit_tokens)
        self._grow_evicting(seq)
        seq.state.status = Status.RUNNING
        self.seqs[seq_id] = seq

    def _evict(self, k: int) -> None:
        """The trie's ``evict(k)``; the blocks it freed leave our record of the trie's blocks."""
        refs = self._memory().ref_count
        candidates = np.flatnonzero(self.in_trie & (refs[: self.num_blocks] == 1))
        self.trie.evict(k)
        evicted = candidates[refs[candidates] == 0]
        self.in_trie[evicted] = False
        self.num_evictable -= len(evicted)

    def _grow_evicting(self, seq) -> None:
        """The eviction helper's room-making and ``allocate(seq, 0)``, the free stack's blocks first (as the
        contender does, in the contract's order)."""
        free = self.gpu._free_count
        missing = self.bm.num_required_blocks(seq, 0) - free
        if missing > 0:
            if free:
                seq.logical_blocks.append(self.allocator.allocate(free, "gpu"))
            self._evict(missing)
        self.bm.allocate(seq, 0)

    def _grow(self, seq) -> None:
        if seq.status != Status.RUNNING:
            raise ReplayError("a sequence not running was scheduled")
        if self.bm.num_required_blocks(seq, 0) == 0:
            return
        self._grow_evicting(seq)

    def _copy_shared_last(self, seq) -> tuple[int, int] | None:
        if self.gpu._free_count == 0 and self.allocator.get_ref_count(seq.logical_blocks.get_real_blocks()[-1]) > 1:
            self._evict(1)
        return super()._copy_shared_last(seq)

    def _fork(self, parent_id: int, child_id: int) -> None:
        super()._fork(parent_id, child_id)
        parent, child = self.seqs[parent_id], self.seqs[child_id]
        self._new_cache_state(child)
        self._set_cursor(child, self._cursor(parent))
        child.history_cache = parent.history_cache.clone()
        child._match_extra = 0

    def _need(self, seq: TrieSequence, num_blocks: int) -> int:
        """Free blocks the admission consumes (the contract's check, made before the trie's match mutates): a
        walk of the trie's children, only when the pool may be short."""
        bs, refs, (token_ids, block_id) = self.block_size, self._memory().ref_count, self.node_fields
        node = self._root(seq)
        need = num_blocks
        for i in range(len(seq.history_cache) // bs):
            tokens = seq.history_cache[i * bs:(i + 1) * bs]
            child = node.children.get(self._key(tokens))
            if child is None or not np.array_equal(tokens, getattr(child, token_ids)):
                break
            need += int(refs[getattr(child, block_id)] == 1) - 1
            node = child
        return need

    def allocate_cached(self, seq_id: int, num_tokens: int, hashes: np.ndarray) -> int:
        """Admit a prompt: the trie's ``match``, room made by eviction, ``allocate(seq, 0)``, the trie's
        ``allocate`` (its full blocks attached)."""
        self._recorded()
        seq_id = seq_arg(seq_id, self.max_seqs)
        num_tokens = tokens_arg(num_tokens, seq_id, self.max_blocks_per_seq, self.block_shift)
        chain = chain_arg(hashes, num_tokens, self.block_shift, seq_id)
        if self._lens[seq_id]:
            self._fail(E_ACTIVE, seq_id)
        seq = self._new_sequence(num_tokens)
        seq.history_cache.append(block_tokens(chain, self.block_size, self._layout).ravel())
        num_blocks = blocks_for(num_tokens, self.block_size)
        if num_blocks > self.num_free_blocks():
            need = self._need(seq, num_blocks)
            if need > self.num_free_blocks():
                self._fail(E_NO_BLOCKS, seq_id, need=need)
        seq._match_extra = 1
        self.trie.match(seq)
        seq._match_extra = 0
        hits = len(seq.logical_blocks)
        if hits:
            self.num_evictable -= int(np.count_nonzero(self.allocator.get_ref_count(
                seq.logical_blocks.get_real_blocks()) == 2))
        self._grow_evicting(seq)
        self.trie.allocate(seq)
        self.in_trie[seq.logical_blocks.get_real_blocks()[hits:len(chain)]] = True
        seq.state.status = Status.RUNNING
        self.seqs[seq_id] = seq
        self._lens[seq_id] = num_tokens
        return hits * self.block_size

    def seal(self, seq_id: int, block_hash: int) -> bool:
        """The block's token ids into the history, then the trie's ``allocate`` attaches it (LMDeploy does so when
        the next block is allocated; the trace says when the block is full)."""
        self._recorded()
        seq_id = self._active(seq_id)
        h = hash_arg(block_hash, seq_id)
        n = self._lens[seq_id]
        if n & (self.block_size - 1):
            self._fail(E_NOT_FULL, seq_id)
        seq = self.seqs[seq_id]
        table = seq.logical_blocks.get_real_blocks()
        if self.in_trie[table[-1]]:
            self._fail(E_SEALED, seq_id)
        if len(seq.history_cache) != n - self.block_size:
            raise ReplayError(f"row {seq_id}: LMDeploy's trie needs the token ids of all its full blocks, in order; "
                              f"the trace seals block {n // self.block_size} after "
                              f"{len(seq.history_cache) // self.block_size}")
        tokens = block_tokens(np.array([h], dtype=np.uint64), self.block_size, self._layout)[0]
        cursor = self._cursor(seq)
        if cursor is not None and self._key(tokens) in cursor.children:
            raise ReplayError(f"row {seq_id}: another row sealed hash {h} under the same prefix: LMDeploy's trie would "
                              "swap this row's block for the cached one, where the contract keeps it uncached")
        seq.history_cache.append(tokens)
        self.trie.allocate(seq)
        self.in_trie[table[-1]] = True
        return True

    def _free(self, seq_id: int) -> None:
        ids = self.seqs[seq_id].logical_blocks.get_real_blocks().copy()
        super()._free(seq_id)
        held = ids[self.in_trie[ids]]
        if len(held):
            self.num_evictable += int(np.count_nonzero(self.allocator.get_ref_count(held) == 1))

    def _ref(self, block_id: int) -> int:
        return int(self._memory().ref_count[block_id]) - int(self.in_trie[block_id])


class TableCursorEngine(LmdeployCachingEngine):
    """0.9.2 to 0.13.0: the module paging/block_trie.py, built from a cache config and the block manager; the cursor
    on the table (which starts and resets without one), a block's key computed inline."""

    sequence_base = OldTrieSequence
    node_fields = ("tokens", "block")
    cursor_at = ("logical_blocks", "last_shared_node")
    root_method = "get_root"
    built = ("BlockTrie(cache_config, block_manager) (the module paging/block_trie.py; cache_config giving "
             "block_size and enable_prefix_caching=True); its scheduler attaches a prompt's full blocks at "
             "admission from 0.11.1 on, at the next decode step before it, where the contract caches them at admission")

    def _new_trie(self):
        config = SimpleNamespace(block_size=self.block_size, enable_prefix_caching=True)
        return self.lmdeploy.BlockTrie(config, self.bm)

    def _new_cache_state(self, seq: TrieSequence) -> None:
        return

    def _key(self, tokens: np.ndarray) -> int:
        return hash(("random", tuple(tokens)))  # the key these releases' match and allocate compute inline


class StateCursorEngine(TableCursorEngine):
    """0.14.0 and 0.15.0: the cursor in ``seq.prefix_cache``, the key ``_make_key``."""

    cursor_at = ("prefix_cache", "last_shared_node")

    def _new_cache_state(self, seq: TrieSequence) -> None:
        seq.prefix_cache = PrefixCacheFields()

    def _key(self, tokens: np.ndarray) -> int:
        return self.trie._make_key(tokens, ())


CACHING = {"table": TableCursorEngine, "prefix_cache": StateCursorEngine, "package": LmdeployCachingEngine}


def baselines(lmdeploy: SimpleNamespace, version: str) -> list[Baseline]:
    cls = type("LmdeployEngine", (LmdeployEngine,), {"lmdeploy": lmdeploy})
    how = (f"LMDeploy {version}'s DefaultBlockManager(num_blocks, 0) and LogicalTokenBlocks from the wheel (PyTorch "
           "engine, prefix caching off), driven as paging/scheduler.py does: at admission num_required_blocks + "
           "get_num_free_gpu_blocks (the eviction helper's test) and allocate(seq, 0); per step, in the batch's order "
           "(the contract's; LMDeploy's goes last row first), schedule_running's num_required_blocks(seq, 0) and, "
           "when a block is due, the capacity test and allocate(seq, 0); then get_block_table per row and the slot "
           "from it; free(seq) at the end; look-ahead 0 "
           "(prefill_interval's 16 tokens, checked once per 16 decode loops, set aside: the contract counts blocks "
           "exactly); the sequence is the contender's (token counts, status, table); fork and copy-on-write emulated "
           "as the contender emulates them, with the allocator's add_ref_count, allocate and free")
    out = [Baseline("caching off", cls, ("lmdeploy",), ("lmdeploy",), how, engine_object="bm")]
    if hasattr(lmdeploy, "BlockTrie"):
        caching = type("LmdeployCachingEngine", (lmdeploy.CachingEngine,), {"lmdeploy": lmdeploy})
        out.append(Baseline("caching on", caching, ("lmdeploy-pc",), ("lmdeploy-pc",), how.replace(
            "prefix caching off", "prefix caching on") + CACHING_HOW.format(version=version, built=caching.built),
            plain_traces=False,
            caching_traces=True, engine_object="trie"))
    return out


CACHING_HOW = ("; with LMDeploy {version}'s {built} from the wheel: at "
               "admission the trie's match (the sequence counting one token more, so every full block may hit, as "
               "the contract says), the eviction helper's room-making (the free stack's blocks first, then "
               "trie.evict for the rest), allocate(seq, 0) and the trie's allocate; at a seal the block's token ids "
               "into the history and the trie's allocate; the token ids of a block are its chain hash cut into "
               "block_size pieces (impls/contenders/lmdeploy_pc.py, block_tokens), as the contender gives its trie")
