"""What every implementation shares before its data structure begins: configuration, the memory it needs, and
error messages."""

from __future__ import annotations

from .contract import check_config, raise_for
from .validation import check_memory


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

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(num_blocks={self.num_blocks}, block_size={self.block_size}, "
            f"max_seqs={self.max_seqs}, max_blocks_per_seq={self.max_blocks_per_seq})"
        )
