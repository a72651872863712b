"""Token content modelled by block hash chains, for the prefix-caching scenarios.

A scenario never holds tokens. It gives each sequence a :class:`TokenChain`: the hash of block ``i`` of the
sequence's token stream (prompt, then generated tokens), which stands for the tokens ``[0, (i + 1) * block_size)``.
Block ``i``'s hash is ``block_hash(hash of block i - 1, content, i)`` (block 0's parent is :data:`ROOT`), where
``content`` names the text the block holds: two streams share a block's hash exactly when they share its whole
prefix, as a real content hash would. Hashes are 64-bit, never 0 (the contract reserves 0), and deterministic:
splitmix64 mixing, no randomness, no Python ``hash``.
"""

from __future__ import annotations

from collections.abc import Sequence

MASK = (1 << 64) - 1
ROOT = 0x6B76_626C_6F63_6B21  # the parent of every chain's first block ("kvblock!")
UNIQUE = 1 << 63  # content ids a scenario makes unique per sequence are tagged with this bit


def mix64(x: int) -> int:
    """splitmix64's finaliser: a bijection on 64-bit integers that scatters every input bit."""
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9 & MASK
    x = (x ^ (x >> 27)) * 0x94D049BB133111EB & MASK
    return x ^ (x >> 31)


def block_hash(parent: int, content: int, index: int) -> int:
    """The hash of a block holding ``content`` (at ``index``) after the blocks that hashed to ``parent``; never 0."""
    h = mix64(parent ^ mix64((content * 0x9E3779B97F4A7C15 + index) & MASK))
    return h or 1


class TokenChain:
    """The block hashes of one token stream: ``prefix`` (hashes shared with other streams), then blocks of this
    stream's own ``content``, made on demand (``hash(i)``, ``blocks(n)``)."""

    def __init__(self, content: int, prefix: Sequence[int] = ()) -> None:
        self.content = content & MASK
        self.hashes: list[int] = list(prefix)

    def hash(self, i: int) -> int:
        """Hash of block ``i`` (covering tokens ``[0, (i + 1) * block_size)``)."""
        while len(self.hashes) <= i:
            parent = self.hashes[-1] if self.hashes else ROOT
            self.hashes.append(block_hash(parent, self.content, len(self.hashes)))
        return self.hashes[i]

    def blocks(self, n: int) -> list[int]:
        """Hashes of blocks ``[0, n)``: the chain of a prompt of ``n`` full blocks."""
        if n:
            self.hash(n - 1)
        return self.hashes[:n]

    def branch(self, shared_blocks: int, content: int) -> TokenChain:
        """A stream that repeats this one's first ``shared_blocks`` blocks, then holds ``content`` (a follow-up
        prompt after a partial block: that block's tokens differ, so its hash does)."""
        return TokenChain(content, self.blocks(shared_blocks))
