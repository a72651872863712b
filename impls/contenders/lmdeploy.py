"""Contender ``"lmdeploy"``: the block manager of LMDeploy's PyTorch engine as its scheduler drives it, re-written
from its design (docs/implementations.md): NumPy called per operation."""

from __future__ import annotations

import enum
import time

import numpy as np

from impls.core.interpreted import InterpretedBlockManager

TABLE_CHUNK = 128  # a sequence's table grows by this many ids (LMDeploy's LogicalTokenBlocks.ALLOC_SIZE)
EMPTY = np.empty((0,), dtype=np.int64)


class Status(enum.Enum):
    """The states the scheduler reads off a sequence (only RUNNING is ever set here)."""

    WAITING = enum.auto()
    RUNNING = enum.auto()


class State:
    """A sequence's lifecycle state (LMDeploy keeps it in an object of its own, read through ``seq.status``)."""

    __slots__ = ("status",)

    def __init__(self) -> None:
        self.status = Status.WAITING


class Sequence:
    """What the block manager and the scheduler read of LMDeploy's ``SchedulerSequence``: its token counts (the
    history already in the cache plus the step's input), the block size, the chunked-prefill limit and its table.
    The engine adapter (harness/engines/lmdeploy_engine.py) drives the engine's code with this same class."""

    __slots__ = ("_block_size", "_num_history_ids", "_num_token_ids", "kv_token_limit", "logical_blocks", "state")

    def __init__(self, num_tokens: int, block_size: int, table: object) -> None:
        self._block_size = block_size
        self._num_history_ids = 0
        self._num_token_ids = num_tokens
        self.kv_token_limit = None
        self.logical_blocks = table
        self.state = State()

    @property
    def block_size(self) -> int:
        return self._block_size

    @property
    def num_all_ids(self) -> int:
        return self._num_history_ids + self._num_token_ids

    @property
    def status(self) -> Status:
        return self.state.status

    def grow(self) -> None:
        """The step's tokens enter the history and the sampled token is the next input (``update_token_ids``)."""
        self._num_history_ids += self._num_token_ids
        self._num_token_ids = 1


def child_of(parent: Sequence, table: object, cls: type = Sequence) -> Sequence:
    """A fork's child (emulated: LMDeploy forks no sequence): the parent's token counts over ``table``, running."""
    child = cls(parent.num_all_ids, parent.block_size, table)
    child._num_history_ids, child._num_token_ids = parent._num_history_ids, parent._num_token_ids
    child.state.status = Status.RUNNING
    return child


class BlockIds:
    """A sequence's logical block ids: a NumPy array grown in chunks of :data:`TABLE_CHUNK`, and how many are real."""

    __slots__ = ("_ids", "_n")

    def __init__(self) -> None:
        self._ids = np.zeros((TABLE_CHUNK,), dtype=np.int64)
        self._n = 0

    def __len__(self) -> int:
        return self._n

    def __setitem__(self, index, value) -> None:
        self.get_real_blocks()[index] = value

    def get_real_blocks(self) -> np.ndarray:
        return self._ids[: self._n]

    def _room(self, size: int) -> None:
        if self._ids.size < size:
            more = -(-(size - self._ids.size) // TABLE_CHUNK) * TABLE_CHUNK
            self._ids = np.pad(self._ids, (0, more))

    def append(self, ids: np.ndarray) -> None:
        start = self._n
        self._room(start + len(ids))
        self._n = start + len(ids)
        self._ids[start:self._n] = ids

    def clear(self) -> None:
        self._n = 0

    def clone(self) -> BlockIds:
        out = BlockIds()
        out.append(self.get_real_blocks())
        return out


class IdStack:
    """Free ids in a NumPy array used as a stack: ``[0, used)`` handed out, ``[used, size)`` free."""

    def __init__(self, size: int, first: int = 0) -> None:
        self.size = size
        self.ids = np.arange(size, dtype=np.int64) + first
        self.free = size

    def count(self) -> int:
        return self.free

    def take(self, k: int) -> np.ndarray:
        """The next ``k`` free ids (a view of the stack)."""
        if self.count() < k:
            raise MemoryError("no free blocks left")
        used = self.size - self.free
        self.free -= k
        return self.ids[used:used + k]

    def give(self, ids: np.ndarray) -> np.ndarray:
        k = len(ids)
        if k > 0:
            used = self.size - self.free
            self.ids[used - k:used] = ids
            self.free += k
        return ids


class IdMap:
    """Per logical id: its physical block, its ref count and when it was last touched (int64 arrays)."""

    def __init__(self, n: int) -> None:
        self.to_physical = np.zeros(n, dtype=np.int64)
        self.refs = np.zeros((n,), dtype=np.int64)
        self.touched = np.zeros((n,), dtype=np.int64)

    def physical(self, ids: np.ndarray) -> np.ndarray:
        if isinstance(ids, np.ndarray) and len(ids) == 0:
            return EMPTY.copy()
        return self.to_physical[ids]


class Allocator:
    """LMDeploy's two-level allocator: logical ids (what tables hold) from a stack of their own, each mapped to a
    physical block of the GPU's or the CPU's stack, with an int64 ref count and access time per logical id. Its
    methods carry LMDeploy's names, so :class:`SchedulerDrive` drives this allocator and LMDeploy's alike."""

    def __init__(self, num_gpu_blocks: int, num_cpu_blocks: int = 0) -> None:
        n = num_gpu_blocks + num_cpu_blocks
        self.map = IdMap(n)
        self.cpu_offset = num_gpu_blocks
        self.gpu = IdStack(num_gpu_blocks)
        self.cpu = IdStack(num_cpu_blocks, num_gpu_blocks)
        self.logical = IdStack(n)

    def device(self, name: str) -> IdStack:
        if name == "gpu":
            return self.gpu
        if name == "cpu":
            return self.cpu
        raise ValueError(f"no device {name!r}")

    def allocate(self, k: int, device: str = "gpu") -> np.ndarray:
        """``k`` logical ids, each mapped to a new physical block of ``device``, ref count 1, touched now."""
        if k == 0:
            return EMPTY.copy()
        physical = self.device(device)
        if self.logical.count() < k or physical.count() < k:
            raise MemoryError("no free blocks left")
        ids = self.logical.take(k)
        self.map.to_physical.put(ids, physical.take(k))
        self.map.refs.put(ids, 1)
        self.update_access_time(ids)
        return ids.copy()

    def update_access_time(self, ids: np.ndarray) -> None:
        self.map.touched[ids] = time.perf_counter()

    def get_access_time(self, ids: np.ndarray) -> np.ndarray:
        return self.map.touched[ids]

    def add_ref_count(self, ids: np.ndarray, delta: int) -> None:
        np.add.at(self.map.refs, ids, delta)

    def get_ref_count(self, ids: np.ndarray) -> np.ndarray:
        return self.map.refs[ids]

    def get_physical_blocks(self, ids: np.ndarray) -> np.ndarray:
        return self.map.physical(ids)

    def free(self, ids: np.ndarray) -> None:
        """One reference fewer on each id; ids left unreferenced go back, with their physical blocks."""
        self.add_ref_count(ids, -1)
        self.update_access_time(ids)
        dropped = ids[self.get_ref_count(ids) == 0]
        if len(dropped) <= 0:
            return
        self.logical.give(dropped)
        physical = self.get_physical_blocks(dropped)
        on_cpu = physical[physical >= self.cpu_offset]
        on_gpu = physical[physical < self.cpu_offset]
        if len(on_cpu) > 0:
            self.cpu.give(on_cpu)
        if len(on_gpu) > 0:
            self.gpu.give(on_gpu)


class BlockManager:
    """LMDeploy's default (full-attention) block manager: blocks a sequence needs for its tokens and look-ahead,
    allocated in one call, freed in one call, its table resolved to physical ids."""

    def __init__(self, num_gpu_blocks: int, num_cpu_blocks: int = 0) -> None:
        self.allocator = Allocator(num_gpu_blocks, num_cpu_blocks)

    @staticmethod
    def blocks_short(seq: Sequence, lookahead: int = 0) -> int:
        """Blocks ``seq`` lacks for its tokens (up to its chunk limit) plus ``lookahead`` more."""
        tokens = seq.num_all_ids
        if seq.kv_token_limit is not None:
            tokens = min(tokens, seq.kv_token_limit)
        tokens += lookahead
        return max(0, (tokens + seq.block_size - 1) // seq.block_size - len(seq.logical_blocks))

    def free_gpu_blocks(self) -> int:
        return self.allocator.device("gpu").count()

    def grow(self, seq: Sequence, lookahead: int = 0) -> None:
        """The blocks ``seq`` lacks, allocated (the scheduler's entry, over :meth:`grow_table`)."""
        return self.grow_table(seq, lookahead)

    def grow_table(self, seq: Sequence, lookahead: int = 0) -> None:
        short = self.blocks_short(seq, lookahead)
        if short > 0:
            seq.logical_blocks.append(self.allocator.allocate(short, "gpu"))

    def release(self, seq: Sequence) -> None:
        self.allocator.free(seq.logical_blocks.get_real_blocks())
        seq.logical_blocks.clear()

    def physical_table(self, seq: Sequence) -> np.ndarray:
        return self.allocator.get_physical_blocks(seq.logical_blocks.get_real_blocks())


class SchedulerDrive:
    """The scheduler's decode step and the fork emulation, shared by the contender and the engine adapter
    (harness/engines/lmdeploy_engine.py), so both pay the same work around the block manager: a class provides
    ``allocator`` (with LMDeploy's ``LogicalAllocator`` methods: ours or LMDeploy's), ``sequence_class``, ``_grow``
    (one sequence's ``schedule_running``) and ``_physical`` (its table as physical ids, ``get_block_table``)."""

    seqs: list
    _lens: list[int]
    block_size: int
    allocator: Allocator
    sequence_class: type = Sequence

    def _copy_shared_last(self, seq: Sequence) -> tuple[int, int] | None:
        """Emulated copy-on-write (LMDeploy forks no sequence): a shared last block is swapped for a new one."""
        alloc, table = self.allocator, seq.logical_blocks
        last = table.get_real_blocks()[-1:].copy()
        if alloc.get_ref_count(last)[0] <= 1:
            return None
        new = alloc.allocate(1, "gpu")
        alloc.free(last)
        table[-1] = new[0]
        return int(alloc.get_physical_blocks(last)[0]), int(alloc.get_physical_blocks(new)[0])

    def _fork(self, parent_id: int, child_id: int) -> None:
        """Emulated fork: the child's table a copy of the parent's, one more reference on each block."""
        parent = self.seqs[parent_id]
        child = child_of(parent, parent.logical_blocks.clone(), self.sequence_class)
        self.allocator.add_ref_count(child.logical_blocks.get_real_blocks(), 1)
        self.seqs[child_id] = child

    def _last_shared(self, seq_id: int) -> bool:
        return bool(self.allocator.get_ref_count(self.seqs[seq_id].logical_blocks.get_real_blocks()[-1]) > 1)

    def _append(self, seq_id: int) -> tuple[int, int] | None:
        seq = self.seqs[seq_id]
        seq.grow()
        cow = self._copy_shared_last(seq) if self._lens[seq_id] % self.block_size else None
        self._grow(seq)
        self._lens[seq_id] += 1
        return cow

    def _decode(self, seq_ids: np.ndarray, ids: list[int], cow_out: np.ndarray, slot_out: np.ndarray) -> int:
        """One step: ``schedule_running`` over the batch (in the batch's order: the contract's step hands out blocks
        as its per-call appends would, where LMDeploy goes last row first), then every row's table resolved to
        physical ids (``get_block_tables``) and its slot read from it."""
        seqs, lens, bs = self.seqs, self._lens, self.block_size
        cows = []
        for s in ids:
            seq = seqs[s]
            seq.grow()
            if lens[s] % bs:
                cow = self._copy_shared_last(seq)
                if cow is not None:
                    cows.append(cow)
            self._grow(seq)
            lens[s] += 1
        physical = self._physical
        tables = [physical(seqs[s]) for s in ids]
        slot_out[: len(ids)] = [int(t[(lens[s] - 1) // bs]) * bs + (lens[s] - 1) % bs
                                for s, t in zip(ids, tables, strict=True)]
        if cows:
            cow_out[: len(cows)] = cows
        return len(cows)

    def _last_slot(self, seq_id: int) -> int:
        n = self._lens[seq_id] - 1
        table = self._physical(self.seqs[seq_id])
        return int(table[n // self.block_size]) * self.block_size + n % self.block_size

    def _table(self, seq_id: int) -> list[int]:
        return self._physical(self.seqs[seq_id]).tolist()


class LmdeployBlockManager(SchedulerDrive, InterpretedBlockManager):
    """Contender ``"lmdeploy"``: NumPy stacks of free ids, a logical-to-physical map with NumPy ref counts and
    access times, and a NumPy table per sequence; driven as the scheduler drives it (docs/implementations.md)."""

    def __init__(self, num_blocks: int, block_size: int = 16, max_seqs: int = 256,
                 max_blocks_per_seq: int = 256) -> None:
        super().__init__(num_blocks, block_size, max_seqs, max_blocks_per_seq)
        self.manager = self._new_manager()
        self.allocator = self.manager.allocator
        self.gpu = self.allocator.gpu
        self.seqs: list[Sequence | None] = [None] * self.max_seqs

    def _new_manager(self) -> BlockManager:
        return BlockManager(self.num_blocks)

    def memory_bytes(self) -> int:
        """Three int64 arrays per logical id, two int64 stacks (logical and physical); a row's table comes later."""
        return 40 * self.num_blocks + 8 * self.max_seqs

    def num_free_blocks(self) -> int:
        return self.gpu.free

    def _allocate(self, seq_id: int, num_blocks: int) -> None:
        """The prefill scheduler's admission: the capacity check (eviction's first test), the allocation, active."""
        seq = Sequence(self._admit_tokens, self.block_size, BlockIds())
        manager = self.manager
        if manager.blocks_short(seq) > manager.free_gpu_blocks():  # pragma: no cover - the contract checked it
            raise AssertionError("no room after the contract's check")
        manager.grow(seq)
        seq.state.status = Status.RUNNING
        self.seqs[seq_id] = seq

    def _grow(self, seq: Sequence) -> None:
        """``schedule_running`` for one sequence: its status, the blocks it lacks, and when it lacks any, the
        capacity check and the allocation."""
        if seq.status != Status.RUNNING:  # pragma: no cover - every row is running
            raise AssertionError("a sequence not running was scheduled")
        manager = self.manager
        if manager.blocks_short(seq) == 0:
            return
        if manager.blocks_short(seq) > manager.free_gpu_blocks():  # pragma: no cover - the contract checked it
            raise AssertionError("no room after the contract's check")
        manager.grow(seq)

    def _free(self, seq_id: int) -> None:
        seq = self.seqs[seq_id]
        self.seqs[seq_id] = None
        self.manager.release(seq)

    def _table_nbytes(self, seq_id: int) -> int:
        return int(self.seqs[seq_id].logical_blocks._ids.nbytes)

    def _physical(self, seq: Sequence) -> np.ndarray:
        return self.manager.physical_table(seq)

    def _ref(self, block_id: int) -> int:
        m = self.allocator.map
        return int(m.refs[(m.to_physical == block_id) & (m.refs > 0)].sum())
