"""What every implementation shares before its data structure begins: configuration and error messages."""

from __future__ import annotations

from .contract import check_config, raise_for


class ManagerBase:
    """Stores the configuration and turns status codes into the contract's exceptions."""

    def __init__(
        self, num_blocks: int, block_size: int = 16, max_seqs: int = 256, max_blocks_per_seq: int = 256
    ) -> None:
        check_config(num_blocks, block_size, max_seqs, max_blocks_per_seq)
        self.num_blocks = int(num_blocks)
        self.block_size = int(block_size)
        self.max_seqs = int(max_seqs)
        self.max_blocks_per_seq = int(max_blocks_per_seq)
        self.block_shift = self.block_size.bit_length() - 1  # block_size is a power of two

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
