r"""A deliberately slowed design, to check that ``kvblock-bench compare`` catches a slower design.

``SlowedFlat`` is design C (``flat``) behind a wrapper that forwards every contract call, and whose whole-step
entry points (``decode_step`` and ``step``) map the step's slots again: after the step, one more ``lookup`` of
the batch into a scratch buffer, ``KVB_SLOWED_FLAT_PASSES`` times per step on average (default 0.75: three steps
in four, in a fixed pattern, so every repetition does the same; 0 makes it a pass-through wrapper). The extra
work is real block-table work, not a sleep: it scales with the batch and with the machine as the step itself
does. The default is meant to make its batched step on ``paper`` about a third slower than the pass-through
wrapper's (what it measured, with its interval, is in ``results/compare_pairs/``); the per-call regime is left
unchanged, so its rows are a control. The run names it by its import path, with this folder on
``PYTHONPATH``::

    PYTHONPATH=examples/slowed_flat kvblock-bench run --scenario paper --regime batched \
        --impl flat,slowed_flat:SlowedFlat

``scripts/compare_pairs.py`` runs it with 0 passes in one run and the default in the other, and checks that
``compare`` reports it slower with exit status 1 in every pair.
"""

from __future__ import annotations

import os

import numpy as np

from impls.designs.flat import FlatBlockManager

PASSES_ENV = "KVB_SLOWED_FLAT_PASSES"


DEFAULT_PASSES = 0.75


def extra_passes() -> float:
    """The extra slot-mapping passes per step, on average, from :data:`PASSES_ENV` (default 0.75)."""
    text = os.environ.get(PASSES_ENV, str(DEFAULT_PASSES))
    try:
        passes = float(text)
    except ValueError:
        raise ValueError(f"{PASSES_ENV}={text!r}: give the extra passes per step as a number, e.g. 0.75") from None
    if not 0 <= passes <= 100:
        raise ValueError(f"{PASSES_ENV}={text}: give a number of extra passes per step from 0 to 100")
    return passes


class SlowedFlat:
    """``flat`` with ``KVB_SLOWED_FLAT_PASSES`` extra slot-mapping passes per decode step (see the module)."""

    def __init__(self, num_blocks: int, block_size: int = 16, max_seqs: int = 256,
                 max_blocks_per_seq: int = 256) -> None:
        self.passes, self.credit = extra_passes(), 0.0
        self.inner = FlatBlockManager(num_blocks, block_size, max_seqs, max_blocks_per_seq)
        self.scratch = np.zeros(self.inner.max_seqs, dtype=np.int64)

    def _map_again(self, seq_ids: np.ndarray) -> None:
        self.credit += self.passes  # whole passes when the credit reaches one: the same steps in every replay
        while self.credit >= 1:
            self.credit -= 1
            self.inner.lookup(seq_ids, self.scratch[: len(seq_ids)])

    def decode_step(self, seq_ids: np.ndarray, cow_out: np.ndarray, slot_out: np.ndarray) -> int:
        cows = self.inner.decode_step(seq_ids, cow_out, slot_out)
        self._map_again(seq_ids)
        return cows

    def step(self, ops: np.ndarray, a0: np.ndarray, a1: np.ndarray, seq_ids: np.ndarray, status_out: np.ndarray,
             cow_out: np.ndarray, slot_out: np.ndarray) -> int:
        result = self.inner.step(ops, a0, a1, seq_ids, status_out, cow_out, slot_out)
        if result >= 0:  # the decode batch ran: its slots are mapped again
            self._map_again(seq_ids)
        return result

    # -- everything else is flat's own ------------------------------------------------------------------
    def can_allocate(self, num_blocks: int) -> bool:
        return self.inner.can_allocate(num_blocks)

    def allocate(self, seq_id: int, num_tokens: int) -> None:
        self.inner.allocate(seq_id, num_tokens)

    def append_slot(self, seq_id: int) -> tuple[int, int] | None:
        return self.inner.append_slot(seq_id)

    def fork(self, parent_id: int, child_id: int) -> None:
        self.inner.fork(parent_id, child_id)

    def free(self, seq_id: int) -> None:
        self.inner.free(seq_id)

    def block_table(self, seq_id: int) -> list[int]:
        return self.inner.block_table(seq_id)

    def seq_len(self, seq_id: int) -> int:
        return self.inner.seq_len(seq_id)

    def num_free_blocks(self) -> int:
        return self.inner.num_free_blocks()

    def ref_count(self, block_id: int) -> int:
        return self.inner.ref_count(block_id)

    def last_slot(self, seq_id: int) -> int:
        return self.inner.last_slot(seq_id)

    def lookup(self, seq_ids: np.ndarray, slot_out: np.ndarray) -> None:
        self.inner.lookup(seq_ids, slot_out)

    def table_nbytes(self, seq_id: int) -> int | None:
        return self.inner.table_nbytes(seq_id)
