"""A tiny, obviously correct model of the contract."""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

from impls.contract import NoFreeBlocksError, blocks_for


def append_token(self, seq: int) -> tuple[int, int] | None:
    """One token appended to ``seq`` (a method: ``self.tables``, ``lens``, ``refs``, ``block_size``, ``_take()``): a new
    block at a block's start, the shared last block copied; the (source, copy) of a copy-on-write, else None."""
    n = self.lens[seq]
    table = self.tables[seq]
    self.lens[seq] = n + 1
    if n % self.block_size == 0:
        table.append(self._take())
        return None
    src = table[-1]
    if self.refs[src] == 1:
        return None
    self.refs[src] -= 1
    table[-1] = self._take()
    return src, table[-1]


class ReferenceModel:
    """The contract, written for clarity rather than speed. Not a contender: not in the registry."""

    prefix_caching = True

    def __init__(self, num_blocks: int, block_size: int = 16, max_seqs: int = 256,
                 max_blocks_per_seq: int = 256) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.max_seqs = max_seqs
        self.max_blocks_per_seq = max_blocks_per_seq
        self.free_ids = list(range(num_blocks - 1, -1, -1))
        self.refs = [0] * num_blocks
        self.tables: dict[int, list[int]] = {}
        self.lens: dict[int, int] = {}
        self.cache: dict[int, int] = {}
        self.block_hash: dict[int, int] = {}
        self.evictable: OrderedDict[int, None] = OrderedDict()
        self.evictions = 0

    def _in_range(self, seq: int) -> None:
        if not 0 <= seq < self.max_seqs:
            raise ValueError(f"sequence id {seq} out of range")

    def _active(self, seq: int) -> None:
        self._in_range(seq)
        if seq not in self.tables:
            raise KeyError(seq)

    def _blocks(self, tokens: int) -> int:
        return blocks_for(tokens, self.block_size)

    def _take(self) -> int:
        if self.free_ids:
            block = self.free_ids.pop()
        else:
            block, _ = self.evictable.popitem(last=False)
            del self.cache[self.block_hash.pop(block)]
            self.evictions += 1
        self.refs[block] = 1
        return block

    def _release(self, block: int) -> None:
        self.refs[block] -= 1
        if self.refs[block] == 0:
            if block in self.block_hash:
                self.evictable[block] = None
            else:
                self.free_ids.append(block)

    def _free_count(self) -> int:
        return len(self.free_ids) + len(self.evictable)

    def _check_hash(self, value: object) -> int:
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not 1 <= int(value) < 2**64:
            raise ValueError(f"block hash {value!r} is not in [1, 2**64)")
        return int(value)

    def _check_chain(self, num_tokens: int, hashes: object) -> list[int]:
        if not isinstance(hashes, np.ndarray) or hashes.dtype != np.uint64 or hashes.ndim != 1:
            raise ValueError("hashes must be a 1-D uint64 array")
        if not hashes.flags.c_contiguous:
            raise ValueError("hashes must be C-contiguous")
        if len(hashes) != num_tokens // self.block_size:
            raise ValueError("one hash per full prompt block")
        chain = [self._check_hash(h) for h in hashes.tolist()]
        if len(set(chain)) != len(chain):
            raise ValueError("a hash twice in one chain")
        return chain

    def _needs_block(self, seq: int) -> bool:
        n = self.lens[seq]
        return n % self.block_size == 0 or self.refs[self.tables[seq][-1]] > 1

    def _check_append(self, seq: int) -> None:
        self._active(seq)
        n = self.lens[seq]
        if n % self.block_size == 0 and n // self.block_size >= self.max_blocks_per_seq:
            raise ValueError("sequence full")

    def can_allocate(self, num_blocks: int) -> bool:
        if num_blocks < 0:
            raise ValueError("negative count")
        return self._free_count() >= num_blocks

    def allocate(self, seq: int, num_tokens: int) -> None:
        self._in_range(seq)
        if num_tokens < 1:
            raise ValueError("num_tokens < 1")
        need = self._blocks(num_tokens)
        if need > self.max_blocks_per_seq:
            raise ValueError("prompt too long")
        if seq in self.tables:
            raise KeyError(seq)
        if need > self._free_count():
            raise NoFreeBlocksError(need)
        self.tables[seq] = [self._take() for _ in range(need)]
        self.lens[seq] = num_tokens

    def cached_prefix(self, hashes: list[int]) -> list[int]:
        """The blocks a chain hits, from its start to its first miss."""
        hits = []
        for h in hashes:
            if h not in self.cache:
                break
            hits.append(self.cache[h])
        return hits

    def cached_need(self, num_tokens: int, hashes: list[int]) -> int:
        """Free blocks ``allocate_cached`` would consume: fresh blocks plus evictable hits (for schedulers)."""
        hits = self.cached_prefix(hashes)
        return self._blocks(num_tokens) - len(hits) + sum(self.refs[b] == 0 for b in hits)

    def allocate_cached(self, seq: int, num_tokens: int, hashes: object) -> int:
        self._in_range(seq)
        if num_tokens < 1:
            raise ValueError("num_tokens < 1")
        if self._blocks(num_tokens) > self.max_blocks_per_seq:
            raise ValueError("prompt too long")
        chain = self._check_chain(num_tokens, hashes)
        if seq in self.tables:
            raise KeyError(seq)
        need = self.cached_need(num_tokens, chain)
        if need > self._free_count():
            raise NoFreeBlocksError(need)
        hits = self.cached_prefix(chain)
        for block in hits:
            self.refs[block] += 1
            self.evictable.pop(block, None)
        fresh = [self._take() for _ in range(self._blocks(num_tokens) - len(hits))]
        for block, h in zip(fresh, chain[len(hits):], strict=False):
            if h not in self.cache:
                self.cache[h] = block
                self.block_hash[block] = h
        self.tables[seq] = hits + fresh
        self.lens[seq] = num_tokens
        return len(hits) * self.block_size

    def seal(self, seq: int, block_hash: object) -> bool:
        self._active(seq)
        h = self._check_hash(block_hash)
        if self.lens[seq] % self.block_size:
            raise ValueError("last block not full")
        block = self.tables[seq][-1]
        if block in self.block_hash:
            raise ValueError("already sealed")
        if h in self.cache:
            return False
        self.cache[h] = block
        self.block_hash[block] = h
        return True

    def num_cached_blocks(self) -> int:
        return len(self.block_hash)

    def append_slot(self, seq: int) -> tuple[int, int] | None:
        self._check_append(seq)
        if self._needs_block(seq) and not self._free_count():
            raise NoFreeBlocksError(1)
        return self._append(seq)

    _append = append_token

    def fork(self, parent: int, child: int) -> None:
        self._in_range(parent)
        self._in_range(child)
        if parent not in self.tables:
            raise KeyError(parent)
        if child in self.tables:
            raise KeyError(child)
        self.tables[child] = list(self.tables[parent])
        self.lens[child] = self.lens[parent]
        for block in self.tables[child]:
            self.refs[block] += 1

    def free(self, seq: int) -> None:
        self._active(seq)
        for block in reversed(self.tables.pop(seq)):
            self._release(block)
        del self.lens[seq]

    def block_table(self, seq: int) -> list[int]:
        self._active(seq)
        return list(self.tables[seq])

    def seq_len(self, seq: int) -> int:
        self._active(seq)
        return self.lens[seq]

    def num_free_blocks(self) -> int:
        return self._free_count()

    def ref_count(self, block: int) -> int:
        if not 0 <= block < self.num_blocks:
            raise ValueError("block id out of range")
        return self.refs[block]

    def last_slot(self, seq: int) -> int:
        self._active(seq)
        n = self.lens[seq] - 1
        return self.tables[seq][n // self.block_size] * self.block_size + n % self.block_size

    def decode_step(self, seq_ids: list[int]) -> tuple[list[tuple[int, int]], list[int]]:
        """The batched step: validate all, reserve the worst case, then append in order."""
        seen = set()
        for seq in seq_ids:
            self._check_append(seq)
            if seq in seen:
                raise ValueError("duplicate")
            seen.add(seq)
        if sum(self._needs_block(s) for s in seq_ids) > self._free_count():
            raise NoFreeBlocksError("step")
        cows = [cow for cow in (self._append(s) for s in seq_ids) if cow is not None]
        return cows, [self.last_slot(s) for s in seq_ids]

    def worst_case_blocks(self, seq_ids: list[int]) -> int:
        """Blocks the decode step over ``seq_ids`` reserves (boundary or shared last block)."""
        return sum(self._needs_block(s) for s in seq_ids)
