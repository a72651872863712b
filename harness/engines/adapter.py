"""What every adapter (an engine's imported objects behind our contract) shares.
Design: docs/output.md#harnessenginesadapterpy."""

from __future__ import annotations

import numpy as np

from harness.base.replay import ReplayError
from impls.core.interpreted import InterpretedBlockManager


class EngineAdapter(InterpretedBlockManager):
    """Base class of the adapters: the contract's checks are our contenders' own (:class:`InterpretedBlockManager`),
    so both sides of a calibration pay the same bookkeeping around the engine's calls."""

    def __init__(self, num_blocks: int, block_size: int = 16, max_seqs: int = 256,
                 max_blocks_per_seq: int = 256) -> None:
        super().__init__(num_blocks, block_size, max_seqs, max_blocks_per_seq)
        self._sampled: list[int] = []  # rows appended to whose sampled token is still to record

    def memory_bytes(self) -> int:
        """Not stated: the engine's own objects (0 passes the constructor's memory check)."""
        return 0

    def _table_nbytes(self, seq_id: int) -> int | None:
        return None

    def decode_step(self, seq_ids: np.ndarray, cow_out: np.ndarray, slot_out: np.ndarray) -> int:
        """The contenders' decode step (:class:`InterpretedBlockManager`'s: the contract's checks, then the step,
        ``_decode``), on the engine's objects; refused while the previous step's tokens are unrecorded."""
        self._recorded()
        return super().decode_step(seq_ids, cow_out, slot_out)

    def _recorded(self) -> None:
        """Stop a replay whose driver never records the sampled tokens (it would run the engine behind)."""
        if self._sampled:
            raise ReplayError("the previous step's sampled tokens were never recorded: replay an adapter with a "
                              "driver that calls untimed_after_step (harness.base.drivers)")

    def allocate(self, seq_id: int, num_tokens: int) -> None:
        self._recorded()  # the per-call regime's check: a step's pool operations come before its appends
        super().allocate(seq_id, num_tokens)

    def free(self, seq_id: int) -> None:
        self._recorded()
        super().free(seq_id)

    def untimed_after_step(self, step: int) -> None:
        """The drivers' untimed hook: every sampled token of the step recorded on the engine's requests."""
        record = self._record
        for s in self._sampled:
            record(s)
        self._sampled.clear()

    def _record(self, seq_id: int) -> None:
        """Record the row's sampled token on the engine's request (the engine's work between steps, untimed)."""
        raise NotImplementedError
