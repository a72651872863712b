"""What every implementation shares before its data structure begins: configuration, memory, errors."""

from __future__ import annotations

import numpy as np

from impls.contract import E_BUFFER, E_NO_BLOCKS, check_config, raise_for
from impls.core import ops as pool_ops
from impls.core.validation import block_arg, check_memory, check_step_ops, step_args


class ManagerBase:
    """Stores the configuration and turns status codes into the contract's exceptions."""

    def __init__(
        self, num_blocks: int, block_size: int = 16, max_seqs: int = 256, max_blocks_per_seq: int = 256
    ) -> None:
        self.num_blocks, self.block_size, self.max_seqs, self.max_blocks_per_seq = check_config(
            num_blocks, block_size, max_seqs, max_blocks_per_seq
        )
        self.block_shift = self.block_size.bit_length() - 1
        self.max_tokens = self.max_blocks_per_seq << self.block_shift
        check_memory(self.memory_bytes(), repr(self))

    def memory_bytes(self) -> int:  # pragma: no cover - every design overrides it
        """Bytes the constructor allocates for this configuration (a lower bound where containers hide headers)."""
        raise NotImplementedError

    def num_free_blocks(self) -> int:  # pragma: no cover - every design overrides it
        raise NotImplementedError

    def step(self, ops: np.ndarray, a0: np.ndarray, a1: np.ndarray, seq_ids: np.ndarray, status_out: np.ndarray,
             cow_out: np.ndarray, slot_out: np.ndarray) -> int:
        """One engine step in one call: :func:`step_by_calls`, so a design pays what its per-op calls cost."""
        return step_by_calls(self, ops, a0, a1, seq_ids, status_out, cow_out, slot_out)

    def _fail(self, code: int, seq: int = -1, **context: object) -> None:
        raise_for(
            code,
            seq=seq,
            max_seqs=self.max_seqs,
            max_blocks=self.max_blocks_per_seq,
            num_blocks=self.num_blocks,
            free=self.num_free_blocks(),
            **context,
        )

    def _fail_batch(self, rc: int, detail: int, seq_ids: np.ndarray, capacity: int) -> None:
        """The exception for a batched operation's code ``rc`` (``detail``: blocks needed, or the offending index)."""
        if rc == E_NO_BLOCKS:
            self._fail(rc, need=detail)
        if rc == E_BUFFER:
            self._fail(rc, capacity=capacity, need=len(seq_ids))
        self._fail(rc, int(seq_ids[detail]))

    def seq_len(self, seq_id: int) -> int:
        """Length of the sequence in tokens."""
        return int(self._lens[self._active(seq_id)])

    def block_table(self, seq_id: int) -> list[int]:
        """Physical block ids of the sequence in logical order (a copy)."""
        return self._table(self._active(seq_id))

    def table_nbytes(self, seq_id: int) -> int | None:
        """Bytes of block-table state held for this sequence (design-specific); None where the design cannot tell."""
        return self._table_nbytes(self._active(seq_id))

    def ref_count(self, block_id: int) -> int:
        """References held on a physical block (0 when it is in the free pool)."""
        return self._ref(block_arg(block_id, self.num_blocks))

    def _active(self, seq_id: object) -> int:  # pragma: no cover - every base class overrides it
        raise NotImplementedError

    def _table(self, seq_id: int) -> list[int]:  # pragma: no cover - every design overrides it
        raise NotImplementedError

    def _ref(self, block_id: int) -> int:  # pragma: no cover - every design overrides it
        raise NotImplementedError

    def _table_nbytes(self, seq_id: int) -> int | None:  # pragma: no cover - every design overrides it
        raise NotImplementedError

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(num_blocks={self.num_blocks}, block_size={self.block_size}, "
            f"max_seqs={self.max_seqs}, max_blocks_per_seq={self.max_blocks_per_seq})"
        )


def step_by_calls(mgr: object, ops: np.ndarray, a0: np.ndarray, a1: np.ndarray, seq_ids: np.ndarray,
                  status_out: np.ndarray, cow_out: np.ndarray, slot_out: np.ndarray) -> int:
    """The whole-step entry point made of ``mgr``'s per-call methods, each exception written as its status."""
    ops, a0, a1, ids = step_args(ops, a0, a1, seq_ids, status_out, cow_out, slot_out, mgr.max_seqs)
    codes = ops.tolist()
    check_step_ops(codes)
    m = len(codes)
    status_out[:m] = [_step_op(mgr, o, x, y) for o, x, y in zip(codes, a0.tolist(), a1.tolist(), strict=True)]
    try:
        rc, detail = mgr.decode_step(ids, cow_out, slot_out), 0
    except STEP_ERRORS as exc:
        rc, detail = _status_of(exc)
    status_out[m] = min(rc, 0)
    status_out[m + 1] = detail
    return rc


def _step_op(mgr: object, op: int, x: int, y: int) -> int:
    """One pool operation of a step through its per-call method; its status (``can_allocate``: 1 or 0)."""
    try:
        result = pool_ops.apply(mgr, op, x, y)
    except STEP_ERRORS as exc:
        return _status_of(exc)[0]
    return int(bool(result)) if pool_ops.POOL_OPS[op].result == "answer" else 0


STEP_ERRORS = (ValueError, KeyError, MemoryError)


def _status_of(exc: Exception) -> tuple[int, int]:
    """(code, detail) a contract exception carries; any other exception propagates."""
    code = getattr(exc, "code", None)
    if code is None:
        raise exc
    return code, exc.detail
