"""Prefix-caching plumbing shared by the interpreted designs with a cache (``dict-pc``, ``radix-pc``)."""

from __future__ import annotations

import numpy as np

from impls.contract import E_ACTIVE, E_NO_BLOCKS, E_NOT_FULL, E_SEALED, blocks_needed
from impls.core.validation import chain_arg, hash_arg, seq_arg, tokens_arg


class CachingPlumbing:
    """Mixin: validated ``allocate_cached`` and ``seal`` over the design's caching primitives."""

    prefix_caching = True

    def allocate_cached(self, seq_id: int, num_tokens: int, hashes: np.ndarray) -> int:
        """Admit a prompt with hash chain ``hashes``: share its cached prefix, take fresh blocks for the rest."""
        seq_id = seq_arg(seq_id, self.max_seqs)
        num_tokens = tokens_arg(num_tokens, seq_id, self.max_blocks_per_seq, self.block_shift)
        chain = chain_arg(hashes, num_tokens, self.block_shift, seq_id).tolist()
        if self._lens[seq_id]:
            self._fail(E_ACTIVE, seq_id)
        num_blocks = blocks_needed(num_tokens, self.block_shift)
        hits = self._match(chain)
        need = num_blocks - len(hits) + sum(1 for block in hits if self._ref(block) == 0)
        if need > self.num_free_blocks():
            self._fail(E_NO_BLOCKS, seq_id, need=need)
        self._admit(seq_id, hits, num_blocks, chain)
        self._lens[seq_id] = num_tokens
        return len(hits) << self.block_shift

    def seal(self, seq_id: int, block_hash: int) -> bool:
        seq_id = self._active(seq_id)
        h = hash_arg(block_hash, seq_id)
        if self._lens[seq_id] & (self.block_size - 1):
            self._fail(E_NOT_FULL, seq_id)
        if self._last_hashed(seq_id):
            self._fail(E_SEALED, seq_id)
        return self._cache_last(seq_id, h)
