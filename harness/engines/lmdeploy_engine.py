"""LMDeploy's own ``DefaultBlockManager`` (PyTorch engine) behind our contract, for the contender ``lmdeploy``.
Design: docs/output.md#harnessengineslmdeploy_enginepy."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from harness.base.replay import ReplayError
from harness.engines.adapter import EngineAdapter
from harness.engines.catalog import Baseline
from harness.engines.eras import Era, era_of
from harness.engines.loader import ImportPlan
from impls.contenders.lmdeploy import SchedulerDrive, Sequence, Status
from impls.contract import NoFreeBlocksError

PAGING = "lmdeploy.pytorch.paging.block_manager"
REAL = (f"{PAGING}.base_block_manager", f"{PAGING}.default_block_manager", "lmdeploy.pytorch.block")


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
        "SchedulerSequence)", drive={"sequence": CalledSequence}),
    Era("0.10.1", "0.11.1", "num_required_blocks reads the property seq.num_all_ids, no longer num_all_tokens()",
        drive={"sequence": CrossSequence}),
    Era("0.12.0", "0.14.0", "num_required_blocks no longer reads the cross-attention tokens (num_all_cross_tokens)",
        drive={"sequence": Sequence}),
    Era("0.15.0", "0.18.0", "num_required_blocks caps the tokens at seq.kv_token_limit (long-context prefill chunks)",
        drive={"sequence": Sequence}),
)
BEFORE = ("releases before 0.9.2 were not read: the eras of harness/engines/lmdeploy_engine.py were checked against "
          "the wheels of 0.9.2 to 0.18.0")


def era(version: str | None = None) -> Era:
    return era_of(ERAS, "lmdeploy", version, BEFORE)


def plan(version: str | None = None) -> ImportPlan:
    e = era(version)
    return ImportPlan(packages=("lmdeploy",), real=REAL,
                      stubs={"lmdeploy.pytorch.messages": {"SchedulerSequence": e.drive["sequence"]}})


def load(version: str | None = None) -> SimpleNamespace:
    from lmdeploy.pytorch.block import LogicalTokenBlocks
    from lmdeploy.pytorch.paging.block_manager.default_block_manager import DefaultBlockManager

    return SimpleNamespace(DefaultBlockManager=DefaultBlockManager, LogicalTokenBlocks=LogicalTokenBlocks,
                           Sequence=era(version).drive["sequence"])


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
    return [Baseline("caching off", cls, ("lmdeploy",), ("lmdeploy",), how, engine_object="bm")]
