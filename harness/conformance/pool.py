"""The full 65,536-block pool: every block id handed out once, none past the pool, all back after freeing.

The state machine runs small pools; this check fills the article's pool (uint16 ids at their limit) through
the contract and empties it again.
"""

from __future__ import annotations

from impls.contract import NoFreeBlocksError

POOL = {"num_blocks": 65536, "block_size": 16, "max_seqs": 257, "max_blocks_per_seq": 256}


def full_pool_problems(cls: type) -> list[str]:
    """What goes wrong filling and emptying the 65,536-block pool (an empty list when nothing does)."""
    mgr = cls(**POOL)
    row_tokens = POOL["max_blocks_per_seq"] * POOL["block_size"]
    rows = POOL["num_blocks"] // POOL["max_blocks_per_seq"]
    for seq in range(rows):
        mgr.allocate(seq, row_tokens)
    problems = []
    ids = sorted(block for seq in range(rows) for block in mgr.block_table(seq))
    if ids != list(range(POOL["num_blocks"])):
        problems.append("the full pool's tables do not hold every block id 0..65535 exactly once")
    if mgr.num_free_blocks() != 0 or mgr.can_allocate(1):
        problems.append(f"a full pool reports {mgr.num_free_blocks()} free blocks")
    try:
        mgr.allocate(rows, 1)  # a free row, no free block
        problems.append("allocating from a full pool did not raise NoFreeBlocksError")
    except NoFreeBlocksError:
        pass
    for seq in range(rows):
        mgr.free(seq)
    if mgr.num_free_blocks() != POOL["num_blocks"]:
        problems.append(f"after freeing everything the pool has {mgr.num_free_blocks()} free blocks, not 65536")
    return problems
