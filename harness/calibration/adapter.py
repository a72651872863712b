"""What every adapter (an engine's imported objects behind our contract) shares.
Design: docs/output.md#harnesscalibrationadapterpy."""

from __future__ import annotations

import numpy as np

from harness.base.replay import ReplayError
from impls.core.interpreted import InterpretedBlockManager, append_as_batch
from impls.core.validation import batch_args


class EngineAdapter(InterpretedBlockManager):
    """Base class of the adapters."""

    def __init__(self, num_blocks: int, block_size: int = 16, max_seqs: int = 256,
                 max_blocks_per_seq: int = 256) -> None:
        super().__init__(num_blocks, block_size, max_seqs, max_blocks_per_seq)
        self._sampled: list[list[int]] = []

    def memory_bytes(self) -> int:
        """Not stated: the engine's own objects (0 passes the constructor's memory check)."""
        return 0

    def _table_nbytes(self, seq_id: int) -> int | None:
        return None

    def decode_step(self, seq_ids: np.ndarray, cow_out: np.ndarray, slot_out: np.ndarray) -> int:
        """One decode step of the engine for the batch: its per-sequence calls, then the slots (see the module)."""
        ids = batch_args(seq_ids, cow_out, slot_out, self.max_seqs)
        if self._sampled:
            raise ReplayError("the previous step's sampled tokens were never recorded: replay an adapter with a "
                              "driver that calls untimed_after_step (harness.base.drivers)")
        return self._engine_step(ids, ids.tolist(), cow_out, slot_out)

    def _engine_step(self, seq_ids: np.ndarray, ids: list[int], cow_out: np.ndarray, slot_out: np.ndarray) -> int:
        """The engine's step for ``ids``: slots to ``slot_out``, copy-on-write pairs to ``cow_out``; their number."""
        raise NotImplementedError

    _append = append_as_batch  # append_slot (per-call, not timed for engines): the engine's step for a batch of one
