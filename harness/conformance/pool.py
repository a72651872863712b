"""The full 65,536-block pool: every block id handed out once, none past the pool, all back after freeing."""

from __future__ import annotations

from impls.contract import NoFreeBlocksError
from impls.core.ids import UINT16_LIMIT

POOL = {"num_blocks": UINT16_LIMIT, "block_size": 16, "max_seqs": 257, "max_blocks_per_seq": 256}
BLOCK_SIZES = (1, 2, 4, 16, 64)


def full_pool_problems(cls: type) -> list[str]:
    """What goes wrong filling and emptying the 65,536-block pool at each block size (empty when nothing)."""
    return [f"block size {size}: {problem}" for size in BLOCK_SIZES
            for problem in _pool_problems(cls, {**POOL, "block_size": size})]


def _pool_problems(cls: type, pool: dict[str, int]) -> list[str]:
    mgr = cls(**pool)
    row_tokens = pool["max_blocks_per_seq"] * pool["block_size"]
    rows = pool["num_blocks"] // pool["max_blocks_per_seq"]
    for seq in range(rows):
        mgr.allocate(seq, row_tokens)
    problems = []
    ids = sorted(block for seq in range(rows) for block in mgr.block_table(seq))
    if ids != list(range(pool["num_blocks"])):
        problems.append(f"the full pool's tables do not hold every block id 0..{pool['num_blocks'] - 1} exactly once")
    if mgr.num_free_blocks() != 0 or mgr.can_allocate(1):
        problems.append(f"a full pool reports {mgr.num_free_blocks()} free blocks")
    try:
        mgr.allocate(rows, 1)
        problems.append("allocating from a full pool did not raise NoFreeBlocksError")
    except NoFreeBlocksError:
        pass
    for seq in range(rows):
        mgr.free(seq)
    if mgr.num_free_blocks() != pool["num_blocks"]:
        problems.append(f"after freeing everything the pool has {mgr.num_free_blocks()} free blocks, "
                        f"not {pool['num_blocks']}")
    return problems
