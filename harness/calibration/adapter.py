"""What every adapter (an engine's imported objects behind our contract) shares.

An adapter is our code; the engine's objects it holds are the engine's, imported unmodified. The contract's
per-call methods validate their arguments as every design's do (:class:`impls.core.interpreted.
InterpretedBlockManager`). ``decode_step``, the step the calibration times, checks the batch's buffers (types,
shapes, overlap: per step, not per sequence) and then runs :meth:`EngineAdapter._engine_step`: the engine's own
per-sequence calls as its scheduler makes them, and the slot mapping read from the engine's block table. The
contract's per-sequence checks (active, not twice, within its blocks) are left out of that step: the engine's
scheduler does not make them (its own code checks what it checks), and every replay is checked against its
trace afterwards, step by step.
"""

from __future__ import annotations

import numpy as np

from impls.core.interpreted import InterpretedBlockManager
from impls.core.validation import batch_args


class EngineAdapter(InterpretedBlockManager):
    """Base class of the adapters."""

    def memory_bytes(self) -> int:
        """Not stated: the engine's own objects (0 passes the constructor's memory check)."""
        return 0

    def _table_nbytes(self, seq_id: int) -> int | None:
        return None

    def decode_step(self, seq_ids: np.ndarray, cow_out: np.ndarray, slot_out: np.ndarray) -> int:
        """One decode step of the engine for the batch: its per-sequence calls, then the slots (see the module)."""
        ids = batch_args(seq_ids, cow_out, slot_out, self.max_seqs)
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
