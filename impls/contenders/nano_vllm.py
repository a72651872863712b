"""Contender ``"nano-vllm"``: the BlockManager of nano-vllm as its scheduler drives it, re-written from its design.

Follows ``nanovllm/engine/block_manager.py`` (``Block``, ``BlockManager``: ``_allocate_block``,
``_deallocate_block``, ``allocate``, ``deallocate``, ``can_append``, ``may_append``) and the decode branch of
``nanovllm/engine/scheduler.py`` (``schedule``: ``can_append`` then ``may_append`` for every running sequence
every step) of nano-vllm as of commit 8d63a98 (GitHub ``GeeeekExplorer/nano-vllm``, 2026-04-14; nano-vllm is
not published on PyPI):

* ``blocks: list[Block]``, one preallocated object per physical block, carrying its ref count, hash and
  token ids (``reset`` on allocation: ref count 1, hash -1, an empty token list);
* ``free_block_ids: deque[int]``, initially ``0, 1, 2, ...``; allocation reads ``free_block_ids[0]`` and then
  removes that id (``deque.remove``, which finds it at the front); a freed id is appended on the right, so
  ids are reused first in, first out;
* ``used_block_ids: set[int]``, the blocks in use;
* a block table (a Python list of ids) per sequence; a sequence's blocks are released tail first;
* every decode step, for every running sequence: ``can_append`` (a free block when the newest token opens a
  block) and ``may_append`` (a new block when it does; the full-block branch where nano-vllm hashes the
  block that has just filled; nothing otherwise).

Calibrated against the real BlockManager of commit bb823b3 (2026-04-26; ``results/calibration/``), which
differs from 8d63a98 in ways that leave the per-step work alike: ``_allocate_block`` pops the left end of
the deque (``popleft``, same first-in-first-out order), and the hashing moved out of ``may_append`` into
``hash_blocks``, which the scheduler's ``postprocess`` calls for every scheduled sequence every step (it
hashes the blocks that have filled). On ``paper`` this contender costs 1.40x (per call) and 1.31x (batched)
that real code with hashing stubbed out, 1.19x and 1.11x with its hashing.

Departures, to follow our contract: no prefix caching (nano-vllm hashes each full block with xxhash,
prefix caching always on, and keeps ``hash_to_block_id``; our contract carries no token ids, so the
full-block branch of ``may_append`` and ``allocate`` compute no hash and blocks keep hash -1): this contender
is nano-vllm *without* its hashing, which costs it more per step; nano-vllm has no fork or copy-on-write
(blocks are shared only through its prefix cache), so ``fork`` raises ref counts and an append to a shared
last block copies it, as in our contract; block tables live here, per sequence row, instead of on
nano-vllm's ``Sequence`` objects, and the sequence's length is the contract's row length.
"""

from __future__ import annotations

import sys
from collections import deque

from impls.core.interpreted import InterpretedBlockManager
from impls.core.validation import int_object_bytes


class Block:
    """One physical block: the number of sequences referencing it, and its prefix-cache hash and tokens."""

    __slots__ = ("block_id", "hash", "ref_count", "token_ids")

    def __init__(self, block_id: int) -> None:
        self.block_id = block_id
        self.ref_count = 0
        self.hash = -1
        self.token_ids: list[int] = []

    def reset(self) -> None:
        self.ref_count = 1
        self.hash = -1
        self.token_ids = []


class NanoVllmBlockManager(InterpretedBlockManager):
    """Contender ``"nano-vllm"``: nano-vllm's deque of free ids, used-id set and per-sequence lists."""

    def __init__(self, num_blocks: int, block_size: int = 16, max_seqs: int = 256,
                 max_blocks_per_seq: int = 256) -> None:
        super().__init__(num_blocks, block_size, max_seqs, max_blocks_per_seq)
        self.blocks = [Block(i) for i in range(self.num_blocks)]
        self.free_block_ids: deque[int] = deque(range(self.num_blocks))
        self.used_block_ids: set[int] = set()
        self.block_tables: list[list[int] | None] = [None] * self.max_seqs

    def memory_bytes(self) -> int:
        """Per block a ``Block`` object and its id, a list slot, and a deque slot with its own int object; per
        row a length and a table slot."""
        per_block = 16 + sys.getsizeof(Block(0)) + 2 * int_object_bytes(self.num_blocks)
        return self.num_blocks * per_block + 16 * self.max_seqs

    def num_free_blocks(self) -> int:
        return len(self.free_block_ids)

    def _allocate_block(self, block_id: int) -> Block:
        block = self.blocks[block_id]
        assert block.ref_count == 0
        block.reset()
        self.free_block_ids.remove(block_id)
        self.used_block_ids.add(block_id)
        return block

    def _deallocate_block(self, block_id: int) -> None:
        assert self.blocks[block_id].ref_count == 0
        self.used_block_ids.remove(block_id)
        self.free_block_ids.append(block_id)

    def _allocate(self, seq_id: int, num_blocks: int) -> None:
        table = self.block_tables[seq_id] = []
        for _ in range(num_blocks):  # every block a cache miss: no hashes (see the module docstring)
            block_id = self.free_block_ids[0]
            self._allocate_block(block_id)
            table.append(block_id)

    def _last_shared(self, seq_id: int) -> bool:
        return self.blocks[self.block_tables[seq_id][-1]].ref_count > 1

    def can_append(self, num_tokens: int) -> bool:
        """A free block when the newest token opens a block (``len(seq) % block_size == 1``)."""
        return len(self.free_block_ids) >= (num_tokens % self.block_size == 1)

    def may_append(self, table: list[int], num_tokens: int) -> None:
        """nano-vllm's ``may_append`` for a sequence of ``num_tokens`` tokens, the newest one included."""
        last_block = self.blocks[table[-1]]
        rem = num_tokens % self.block_size
        if rem == 1 or self.block_size == 1:
            block_id = self.free_block_ids[0]
            self._allocate_block(block_id)
            table.append(block_id)
        elif rem == 0:  # the last block has just filled: nano-vllm hashes it here (no tokens, no hash)
            assert last_block.hash == -1
        else:
            assert last_block.hash == -1

    def _append(self, seq_id: int) -> tuple[int, int] | None:
        n = self._lens[seq_id] + 1  # len(seq): the newest token, whose KV this step writes, included
        self._lens[seq_id] = n
        table = self.block_tables[seq_id]
        if not self.can_append(n):  # pragma: no cover - the contract checked the pool first
            raise AssertionError("can_append failed after the contract's check")
        opens = (n - 1) % self.block_size == 0
        src = self.blocks[table[-1]]
        if opens or src.ref_count == 1:
            self.may_append(table, n)
            return None
        src.ref_count -= 1  # ours: copy-on-write of a shared last block (see the module docstring)
        dst = self.free_block_ids[0]
        self._allocate_block(dst)
        table[-1] = dst
        return src.block_id, dst

    def _fork(self, parent_id: int, child_id: int) -> None:
        table = self.block_tables[parent_id]
        blocks = self.blocks
        for block_id in table:
            blocks[block_id].ref_count += 1
        self.block_tables[child_id] = table.copy()

    def _free(self, seq_id: int) -> None:
        table = self.block_tables[seq_id]
        self.block_tables[seq_id] = None
        for block_id in reversed(table):  # nano-vllm's deallocate walks the table backwards
            block = self.blocks[block_id]
            block.ref_count -= 1
            if block.ref_count == 0:
                self._deallocate_block(block_id)

    def _table_nbytes(self, seq_id: int) -> int:
        # The per-sequence list plus its int objects (Block objects belong to the pool, not the table).
        table = self.block_tables[seq_id]
        return sys.getsizeof(table) + sum(sys.getsizeof(b) for b in table)

    def _table(self, seq_id: int) -> list[int]:
        return self.block_tables[seq_id].copy()

    def _ref(self, block_id: int) -> int:
        return self.blocks[block_id].ref_count

    def _last_slot(self, seq_id: int) -> int:
        n = self._lens[seq_id] - 1
        return self.block_tables[seq_id][n // self.block_size] * self.block_size + n % self.block_size
