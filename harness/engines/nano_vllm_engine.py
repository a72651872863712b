"""nano-vllm's own ``BlockManager`` behind our contract, for the contender ``nano-vllm``.
Design: docs/output.md#harnessenginesnano_vllm_enginepy."""

from __future__ import annotations

import importlib.util
import itertools
from types import SimpleNamespace

from harness.base.replay import ReplayError
from harness.engines.adapter import EngineAdapter
from harness.engines.catalog import Baseline
from harness.engines.loader import ImportPlan
from impls.contract import NoFreeBlocksError

REAL = ("nanovllm.engine.block_manager", "nanovllm.engine.sequence", "nanovllm.sampling_params")


def have_xxhash() -> bool:
    return importlib.util.find_spec("xxhash") is not None


def plan(version: str | None = None) -> ImportPlan:
    """How nano-vllm's modules are imported: three from the source folder (xxhash, or a stand-in without it)."""
    return ImportPlan(packages=("nanovllm",), real=REAL, external_stubs=() if have_xxhash() else ("xxhash",))


def load(version: str | None = None) -> SimpleNamespace:
    from nanovllm.engine.block_manager import BlockManager
    from nanovllm.engine.sequence import Sequence

    return SimpleNamespace(BlockManager=BlockManager, Sequence=Sequence)


class NanoEngine(EngineAdapter):
    """nano-vllm's ``BlockManager`` (the engine's, imported) driven per sequence per step, as its scheduler does."""

    nano: SimpleNamespace
    block_manager: type
    hash_blocks = True

    def __init__(self, num_blocks: int, block_size: int = 16, max_seqs: int = 256,
                 max_blocks_per_seq: int = 256) -> None:
        super().__init__(num_blocks, block_size, max_seqs, max_blocks_per_seq)
        self.nano.Sequence.block_size = self.block_size
        self.bm = self.block_manager(self.num_blocks, self.block_size)
        self.seqs: list = [None] * self.max_seqs
        self._numbers = itertools.count(1)
        self._next_token: dict[int, int] = {}
        self.forked = False

    def num_free_blocks(self) -> int:
        return len(self.bm.free_block_ids)

    def _tokens(self, seq_id: int, n: int) -> list[int]:
        base = next(self._numbers) << 24
        self._next_token[seq_id] = base + n
        return list(range(base, base + n))

    def _allocate(self, seq_id: int, num_blocks: int) -> None:
        n = self._admit_tokens
        seq = self.nano.Sequence(self._tokens(seq_id, n))
        cached = self.bm.can_allocate(seq)
        if cached != 0:
            raise ReplayError(f"row {seq_id}: nano-vllm's can_allocate answered {cached}, expected 0 cached blocks "
                              "(-1: no room)")
        self.bm.allocate(seq, 0)
        seq.num_scheduled_tokens = n
        self.seqs[seq_id] = seq
        if self.hash_blocks:
            self.bm.hash_blocks(seq)
        self._record_sampled(seq, seq_id)

    def _record_sampled(self, seq, seq_id: int) -> None:
        """``postprocess`` after its ``hash_blocks``: the step's tokens counted, the sampled token appended."""
        seq.num_cached_tokens += seq.num_scheduled_tokens
        seq.num_scheduled_tokens = 0
        token = self._next_token[seq_id]
        self._next_token[seq_id] = token + 1
        seq.append_token(token)

    def _append(self, seq_id: int) -> tuple[int, int] | None:
        """One running sequence's decode token: ``schedule``'s decode branch (with the emulated copy of a shared
        last block) and ``postprocess``'s ``hash_blocks``; its slot from ``_last_slot``, ``prepare_decode``'s formula
        (a decode step makes both per sequence, as our contender's does)."""
        seq, bm = self.seqs[seq_id], self.bm
        if not bm.can_append(seq):
            raise NoFreeBlocksError(f"nano-vllm's can_append refused row {seq_id} (it would preempt)")
        seq.num_scheduled_tokens = 1
        seq.is_prefill = False
        cow = None
        if self.forked and seq.num_tokens % self.block_size != 1 and bm.blocks[seq.block_table[-1]].ref_count > 1:
            cow = self._copy_last(seq)
        bm.may_append(seq)
        self._lens[seq_id] += 1
        if self.hash_blocks:
            bm.hash_blocks(seq)
        self._sampled.append(seq_id)
        return cow

    def _record(self, seq_id: int) -> None:
        """The rest of ``postprocess`` for the sequence: its tokens counted, its sampled token appended."""
        self._record_sampled(self.seqs[seq_id], seq_id)

    def _free(self, seq_id: int) -> None:
        seq = self.seqs[seq_id]
        self.seqs[seq_id] = None
        self._next_token.pop(seq_id, None)
        self.bm.deallocate(seq)

    def _fork(self, parent_id: int, child_id: int) -> None:
        parent = self.seqs[parent_id]
        child = self.nano.Sequence(parent.token_ids)
        child.block_table = parent.block_table.copy()
        child.num_cached_tokens = parent.num_cached_tokens + parent.num_scheduled_tokens  # not hashed twice
        child.status, child.is_prefill = parent.status, parent.is_prefill
        for block_id in parent.block_table:
            self.bm.blocks[block_id].ref_count += 1
        self.seqs[child_id] = child
        self._next_token[child_id] = next(self._numbers) << 24
        self.forked = True

    def _copy_last(self, seq) -> tuple[int, int]:
        src = seq.block_table[-1]
        self.bm.blocks[src].ref_count -= 1
        dst = self.bm._allocate_block()
        seq.block_table[-1] = dst
        return src, dst

    def _last_shared(self, seq_id: int) -> bool:
        return self.bm.blocks[self.seqs[seq_id].block_table[-1]].ref_count > 1

    def _table(self, seq_id: int) -> list[int]:
        return list(self.seqs[seq_id].block_table)

    def _ref(self, block_id: int) -> int:
        return self.bm.blocks[block_id].ref_count

    def _last_slot(self, seq_id: int) -> int:
        seq = self.seqs[seq_id]
        return seq.block_table[-1] * self.block_size + seq.last_block_num_tokens - 1


def _neutralised(block_manager: type) -> type:
    """The engine's BlockManager with ``compute_hash`` returning 0: its hash bookkeeping runs, no hash is computed."""
    return type(block_manager.__name__, (block_manager,), {"compute_hash": classmethod(lambda cls, token_ids,
                                                                                         prefix=-1: 0)})


def _bound(nano: SimpleNamespace, block_manager: type, hash_blocks: bool) -> type:
    return type("NanoEngine", (NanoEngine,), {"nano": nano, "block_manager": block_manager,
                                              "hash_blocks": hash_blocks})


def baselines(nano: SimpleNamespace, version: str) -> list[Baseline]:
    """Hashing neutralised (what the contender models), with its hashing (as it ships), and bare."""
    how = (f"nano-vllm {version}'s BlockManager(num_blocks, block_size) from the source folder, driven as "
           "engine/scheduler.py does: can_allocate + allocate(seq, 0) and the prefill's postprocess (hash_blocks, "
           "append_token) at admission; per step and running sequence can_append + may_append, the slot as "
           "prepare_decode computes it, postprocess's hash_blocks, and after the step, untimed, the rest of "
           "postprocess (counters, append_token); deallocate at a free; synthetic distinct token ids; fork and "
           "copy-on-write emulated as the contender emulates them; ")
    neutral = _neutralised(nano.BlockManager)
    out = [Baseline("hashing neutralised", _bound(nano, neutral, True), ("nano-vllm",), ("nano-vllm",),
                    how + "compute_hash returns 0 (hash bookkeeping runs, no hash computed)", engine_object="bm"),
           Baseline("bare", _bound(nano, neutral, False), ("nano-vllm",), (),
                    how + "bare: hash_blocks not called and compute_hash returns 0 (no hash bookkeeping at all)",
                    engine_object="bm")]
    if have_xxhash():
        out.insert(1, Baseline("with hashing", _bound(nano, nano.BlockManager, True), ("nano-vllm",), (),
                               how + "its xxhash hashing as it ships (compute_hash unmodified)", engine_object="bm"))
    return out
