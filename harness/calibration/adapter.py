"""What every adapter (an engine's imported objects behind our contract) shares.

An adapter is our code; the engine's objects it holds are the engine's, imported unmodified. The contract's
per-call methods validate their arguments as every design's do (:class:`impls.core.interpreted.
InterpretedBlockManager`). ``decode_step``, the step the calibration times, checks the batch's buffers (types,
shapes, overlap: per step, not per sequence) and then runs :meth:`EngineAdapter._engine_step`: the engine's own
per-sequence calls as its scheduler makes them, and the slot mapping read from the engine's block table. The
contract's per-sequence checks (active, not twice, within its blocks) are left out of that step: the engine's
scheduler does not make them (its own code checks what it checks), and every replay is checked against its
trace afterwards, step by step.

What the engine does between two steps that is not block management (recording each request's sampled token on
the engine's request objects) runs in ``untimed_after_step``, the Python drivers' untimed per-step hook
(:mod:`harness.base.drivers`): an adapter that needs it lists each step's rows in ``_sampled`` and records
their tokens there. A step that finds rows still listed stops the replay: a driver without the hook would leave
the engine's requests behind the trace.
"""

from __future__ import annotations

import numpy as np

from harness.base.replay import ReplayError
from impls.core.interpreted import InterpretedBlockManager
from impls.core.validation import batch_args


class EngineAdapter(InterpretedBlockManager):
    """Base class of the adapters."""

    def __init__(self, num_blocks: int, block_size: int = 16, max_seqs: int = 256,
                 max_blocks_per_seq: int = 256) -> None:
        super().__init__(num_blocks, block_size, max_seqs, max_blocks_per_seq)
        self._sampled: list[list[int]] = []  # rows whose sampled token untimed_after_step records, per call

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
        """The engine's step for ``ids``: its calls per sequence, the slots to ``slot_out``, copy-on-write pairs to
        ``cow_out``; returns their number. Every adapter writes its own."""
        raise NotImplementedError

    def _append(self, seq_id: int) -> tuple[int, int] | None:
        """``append_slot`` (the per-call regime, which the calibration does not time for the engine): the engine's
        step for a batch of one."""
        cow_out = np.zeros((1, 2), dtype=np.int64)
        slot_out = np.zeros(1, dtype=np.int64)
        if self._engine_step(np.array([seq_id], dtype=np.int64), [seq_id], cow_out, slot_out):
            return int(cow_out[0, 0]), int(cow_out[0, 1])
        return None
