"""What every implementation shares before its data structure begins: configuration, the memory it needs, and
error messages."""

from __future__ import annotations

import numpy as np

from impls.contract import E_BUFFER, E_NO_BLOCKS, check_config, raise_for
from impls.core import ops as pool_ops
from impls.core.validation import block_arg, check_memory, check_step_ops, step_args


class ManagerBase:
    """Stores the configuration and turns status codes into the contract's exceptions.

    Each design states the bytes its constructor allocates in :meth:`memory_bytes` (computed from the arrays
    and objects it creates, see README "The contract"); a configuration the machine cannot hold fails here,
    with a ``MemoryError``, before anything is allocated.
    """

    def __init__(
        self, num_blocks: int, block_size: int = 16, max_seqs: int = 256, max_blocks_per_seq: int = 256
    ) -> None:
        self.num_blocks, self.block_size, self.max_seqs, self.max_blocks_per_seq = check_config(
            num_blocks, block_size, max_seqs, max_blocks_per_seq
        )
        self.block_shift = self.block_size.bit_length() - 1  # block_size is a power of two
        self.max_tokens = self.max_blocks_per_seq << self.block_shift  # <= MAX_SEQ_TOKENS
        check_memory(self.memory_bytes(), repr(self))

    def memory_bytes(self) -> int:  # pragma: no cover - every design overrides it
        """Bytes the constructor allocates for this configuration (a lower bound where containers add headers
        the design cannot see)."""
        raise NotImplementedError

    def num_free_blocks(self) -> int:  # pragma: no cover - every design overrides it
        raise NotImplementedError

    def step(self, ops: np.ndarray, a0: np.ndarray, a1: np.ndarray, seq_ids: np.ndarray, status_out: np.ndarray,
             cow_out: np.ndarray, slot_out: np.ndarray) -> int:
        """One engine step in one call (see :meth:`impls.contract.BlockManager.step`): :func:`step_by_calls`, for
        every design without a compiled step of its own, so that an interpreted design pays exactly what its
        per-op calls cost."""
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
        """The exception for a batched operation's code ``rc``: ``detail`` is the blocks it needed for
        ``E_NO_BLOCKS``, else the index of the offending id; ``capacity`` the output buffers' rows."""
        if rc == E_NO_BLOCKS:
            self._fail(rc, need=detail)
        if rc == E_BUFFER:
            self._fail(rc, capacity=capacity, need=len(seq_ids))
        self._fail(rc, int(seq_ids[detail]))

    # -- inspection (plain Python, on no hot path), over what each base class and design provides: ``_active``
    # (an active sequence's id, else the contract's exception), ``_lens``, and the design's ``_table``, ``_ref``
    # and ``_table_nbytes``.
    def seq_len(self, seq_id: int) -> int:
        """Length of the sequence in tokens."""
        return int(self._lens[self._active(seq_id)])

    def block_table(self, seq_id: int) -> list[int]:
        """Physical block ids of the sequence in logical order (a copy)."""
        return self._table(self._active(seq_id))

    def table_nbytes(self, seq_id: int) -> int | None:
        """Bytes of block-table state held for this sequence (what is counted is design-specific and said in
        each design's ``_table_nbytes``); None where the design cannot tell."""
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
    """The whole-step entry point (:meth:`impls.contract.BlockManager.step`) made of ``mgr``'s per-call methods: a
    loop in Python over its pool operations, then its ``decode_step``, each contract exception caught and written
    as its status code. ``step`` is optional in the contract: this is what stands in for it (a design may use it
    as its ``step``; the harness calls it for a plug-in that has none)."""
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
    """One pool operation of a step through the per-call method; its status code (``can_allocate``: its answer,
    1 or 0)."""
    try:
        result = pool_ops.apply(mgr, op, x, y)
    except STEP_ERRORS as exc:
        return _status_of(exc)[0]
    return int(bool(result)) if pool_ops.POOL_OPS[op].result == "answer" else 0


STEP_ERRORS = (ValueError, KeyError, MemoryError)  # the contract's exceptions (NoFreeBlocksError is a MemoryError)


def _status_of(exc: Exception) -> tuple[int, int]:
    """(code, detail) a contract exception carries (see :func:`impls.contract.raise_for`); any other exception,
    e.g. a real ``MemoryError``, is not a status and propagates."""
    code = getattr(exc, "code", None)
    if code is None:
        raise exc
    return code, exc.detail
