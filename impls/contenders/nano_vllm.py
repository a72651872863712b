"""Contender ``"nano-vllm"``: the BlockManager of nano-vllm as its scheduler drives it, re-written from its design."""

from __future__ import annotations

import itertools
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

    def update(self, hash: int, token_ids: list[int]) -> None:
        self.hash = hash
        self.token_ids = token_ids

    def reset(self) -> None:
        self.ref_count = 1
        self.hash = -1
        self.token_ids = []


class Sequence:
    """What nano-vllm's block manager and scheduler read of a ``Sequence``: length, table, postprocess counters, and
    a block's tokens. Our contract carries no token ids: ``stand_in`` (one block of the sequence's own stand-in
    token, distinct per prompt as nano-vllm's prompts are) stands in for every block's tokens. ``block_size`` is a
    class attribute, as nano-vllm's (its engine sets it on the class): :func:`sequence_class` makes one per size."""

    block_size = 256

    def __init__(self, num_tokens: int, stand_in: list[int]) -> None:
        self.stand_in = stand_in
        self.num_tokens = num_tokens
        self.num_prompt_tokens = num_tokens
        self.num_cached_tokens = 0
        self.num_scheduled_tokens = 0
        self.is_prefill = True
        self.block_table: list[int] = []

    def __len__(self) -> int:
        return self.num_tokens

    @property
    def num_blocks(self) -> int:
        return (self.num_tokens + self.block_size - 1) // self.block_size

    @property
    def last_block_num_tokens(self) -> int:
        return self.num_tokens - (self.num_blocks - 1) * self.block_size

    def block(self, i: int) -> list[int]:
        """Block ``i``'s tokens: a new list of ``block_size`` stand-ins (nano-vllm slices its token ids)."""
        assert 0 <= i < self.num_blocks
        return self.stand_in[: self.block_size]


def sequence_class(block_size: int) -> type[Sequence]:
    """:class:`Sequence` with ``block_size`` on the class."""
    return type("Sequence", (Sequence,), {"block_size": block_size})


class BlockManager:
    """nano-vllm's block manager with ``compute_hash`` neutralised (every hash 0): its hash bookkeeping runs,
    over stand-in tokens (docs/implementations.md)."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        self.block_size = block_size
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.hash_to_block_id: dict[int, int] = {}
        self.free_block_ids: deque[int] = deque(range(num_blocks))
        self.used_block_ids: set[int] = set()

    def _allocate_block(self) -> int:
        block_id = self.free_block_ids.popleft()
        block = self.blocks[block_id]
        assert block.ref_count == 0
        if block.hash != -1 and self.hash_to_block_id.get(block.hash) == block_id:
            del self.hash_to_block_id[block.hash]
        block.reset()
        self.used_block_ids.add(block_id)
        return block_id

    def _deallocate_block(self, block_id: int) -> None:
        assert self.blocks[block_id].ref_count == 0
        self.used_block_ids.remove(block_id)
        self.free_block_ids.append(block_id)

    @classmethod
    def compute_hash(cls, token_ids: list[int], prefix: int = -1) -> int:
        """Neutralised: 0 for every block (hashing is measured apart, harness/studies/block_hashing.py)."""
        return 0

    def can_allocate(self, seq: Sequence) -> int:
        """Cached blocks of the prompt, or -1 when the pool cannot hold it. The prompt's first full block is looked
        up: with every hash 0 the lookup finds the block hashed last, or none, and its tokens differ (a miss)."""
        h = -1
        num_cached_blocks = 0
        num_new_blocks = seq.num_blocks
        for i in range(seq.num_blocks - 1):
            token_ids = seq.block(i)
            h = self.compute_hash(token_ids, h)
            block_id = self.hash_to_block_id.get(h, -1)
            if block_id == -1 or self.blocks[block_id].token_ids != token_ids:
                break
            num_cached_blocks += 1  # pragma: no cover - stand-in tokens differ from one prompt to the next
            if block_id in self.used_block_ids:  # pragma: no cover
                num_new_blocks -= 1
        if len(self.free_block_ids) < num_new_blocks:
            return -1
        return num_cached_blocks

    def allocate(self, seq: Sequence, num_cached_blocks: int) -> None:
        assert not seq.block_table
        for _ in range(num_cached_blocks, seq.num_blocks):
            seq.block_table.append(self._allocate_block())
        seq.num_cached_tokens = num_cached_blocks * self.block_size

    def deallocate(self, seq: Sequence) -> None:
        for block_id in reversed(seq.block_table):
            block = self.blocks[block_id]
            block.ref_count -= 1
            if block.ref_count == 0:
                self._deallocate_block(block_id)
        seq.num_cached_tokens = 0
        seq.block_table.clear()

    def can_append(self, seq: Sequence) -> bool:
        return len(self.free_block_ids) >= (len(seq) % self.block_size == 1)

    def may_append(self, seq: Sequence) -> None:
        if len(seq) % self.block_size == 1:
            seq.block_table.append(self._allocate_block())

    def hash_blocks(self, seq: Sequence) -> None:
        """nano-vllm's ``hash_blocks``: its every-step test and, for each block the step's tokens filled, its
        (neutralised) hash chained from the block before, ``Block.update`` and the ``hash_to_block_id`` entry."""
        start = seq.num_cached_tokens // self.block_size
        end = (seq.num_cached_tokens + seq.num_scheduled_tokens) // self.block_size
        if start == end:
            return
        h = self.blocks[seq.block_table[start - 1]].hash if start > 0 else -1
        for i in range(start, end):
            block = self.blocks[seq.block_table[i]]
            token_ids = seq.block(i)
            h = self.compute_hash(token_ids, h)
            block.update(h, token_ids)
            self.hash_to_block_id[h] = block.block_id


class UnitBlockManager(BlockManager):
    """Ours, for block size 1, where nano-vllm's test ``len(seq) % block_size == 1`` never holds: every token opens
    a block (``% 1 == 0``). Every other size runs nano-vllm's test as it is written."""

    def can_append(self, seq: Sequence) -> bool:
        return len(self.free_block_ids) >= (len(seq) % self.block_size == 0)

    def may_append(self, seq: Sequence) -> None:
        if len(seq) % self.block_size == 0:
            seq.block_table.append(self._allocate_block())


class NanoVllmBlockManager(InterpretedBlockManager):
    """Contender ``"nano-vllm"``: nano-vllm's deque of free ids, used-id set and per-sequence lists."""

    unit_block_manager: type[BlockManager] = UnitBlockManager  # the block manager at block size 1

    def __init__(self, num_blocks: int, block_size: int = 16, max_seqs: int = 256,
                 max_blocks_per_seq: int = 256) -> None:
        super().__init__(num_blocks, block_size, max_seqs, max_blocks_per_seq)
        manager = self.unit_block_manager if self.block_size == 1 else BlockManager
        self.block_manager = manager(self.num_blocks, self.block_size)
        self.sequence = sequence_class(self.block_size)
        self.opens = 1 % self.block_size  # the token that opens a block: `1`, or `0` at block size 1
        self.blocks = self.block_manager.blocks
        self.free_block_ids = self.block_manager.free_block_ids
        self.used_block_ids = self.block_manager.used_block_ids
        self.seqs: list[Sequence | None] = [None] * self.max_seqs
        self.forked = False
        self._prompts = itertools.count(1)

    def memory_bytes(self) -> int:
        per_block = 16 + sys.getsizeof(Block(0)) + 2 * int_object_bytes(self.num_blocks)
        return self.num_blocks * per_block + 16 * self.max_seqs

    def num_free_blocks(self) -> int:
        return len(self.free_block_ids)

    def _allocate(self, seq_id: int, num_blocks: int) -> None:
        """The scheduler's prefill: ``can_allocate``, ``allocate``, then that step's ``postprocess``."""
        bm = self.block_manager
        seq = self.sequence(self._admit_tokens, [next(self._prompts)] * self.block_size)
        if bm.can_allocate(seq) == -1:  # pragma: no cover - the contract checked the pool
            raise AssertionError("can_allocate failed after the contract's check")
        bm.allocate(seq, 0)
        seq.num_scheduled_tokens = seq.num_tokens
        self.seqs[seq_id] = seq
        bm.hash_blocks(seq)
        seq.num_cached_tokens += seq.num_scheduled_tokens
        seq.num_scheduled_tokens = 0

    def _last_shared(self, seq_id: int) -> bool:
        return self.blocks[self.seqs[seq_id].block_table[-1]].ref_count > 1

    def _append(self, seq_id: int) -> tuple[int, int] | None:
        seq = self.seqs[seq_id]
        bm = self.block_manager
        seq.num_cached_tokens += seq.num_scheduled_tokens
        seq.num_tokens += 1
        if not bm.can_append(seq):  # pragma: no cover - the contract checked the pool first
            raise AssertionError("can_append failed after the contract's check")
        seq.num_scheduled_tokens = 1
        seq.is_prefill = False
        cow = None
        if self.forked and seq.num_tokens % self.block_size != self.opens:
            src = self.blocks[seq.block_table[-1]]
            if src.ref_count > 1:
                src.ref_count -= 1
                dst = bm._allocate_block()
                seq.block_table[-1] = dst
                cow = (src.block_id, dst)
        bm.may_append(seq)
        self._lens[seq_id] = seq.num_tokens
        bm.hash_blocks(seq)
        return cow

    def _fork(self, parent_id: int, child_id: int) -> None:
        parent = self.seqs[parent_id]
        child = self.sequence(parent.num_tokens, parent.stand_in)
        child.block_table = parent.block_table.copy()
        child.num_cached_tokens = parent.num_cached_tokens + parent.num_scheduled_tokens
        child.is_prefill = parent.is_prefill
        blocks = self.blocks
        for block_id in parent.block_table:
            blocks[block_id].ref_count += 1
        self.seqs[child_id] = child
        self.forked = True

    def _free(self, seq_id: int) -> None:
        seq = self.seqs[seq_id]
        self.seqs[seq_id] = None
        self.block_manager.deallocate(seq)

    def _table_nbytes(self, seq_id: int) -> int:
        table = self.seqs[seq_id].block_table
        return sys.getsizeof(table) + sum(sys.getsizeof(b) for b in table)

    def _table(self, seq_id: int) -> list[int]:
        return self.seqs[seq_id].block_table.copy()

    def _ref(self, block_id: int) -> int:
        return self.blocks[block_id].ref_count

    def _last_slot(self, seq_id: int) -> int:
        seq = self.seqs[seq_id]
        return seq.block_table[-1] * self.block_size + seq.last_block_num_tokens - 1
