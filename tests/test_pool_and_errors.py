"""The article's 65,536-block pool, block-id width, and the contract's per-call errors."""

from __future__ import annotations

import numpy as np
import pytest

from impls import REGISTRY, NoFreeBlocksError
from impls.designs.flat import FlatBlockManager


def test_no_free_blocks_error_is_memory_error() -> None:
    assert issubclass(NoFreeBlocksError, MemoryError)


def test_registry_has_the_three_designs() -> None:
    assert {"dict", "list", "flat"} <= set(REGISTRY)


def test_full_65536_block_pool(impl_name: str) -> None:
    mgr = REGISTRY[impl_name](num_blocks=65536, block_size=16, max_seqs=257, max_blocks_per_seq=256)
    for seq in range(256):  # 256 sequences x 256 blocks take every block exactly once
        mgr.allocate(seq, 256 * 16)
    assert mgr.num_free_blocks() == 0
    assert not mgr.can_allocate(1)
    ids = np.concatenate([np.asarray(mgr.block_table(seq)) for seq in range(256)])
    assert len(ids) == 65536 and len(np.unique(ids)) == 65536
    assert ids.min() >= 0 and ids.max() < 65536
    with pytest.raises(NoFreeBlocksError):
        mgr.allocate(256, 1)
    for seq in range(256):
        mgr.free(seq)
    assert mgr.num_free_blocks() == 65536
    assert all(mgr.ref_count(b) == 0 for b in (0, 1, 65535))


def test_flat_uses_uint16_ids_up_to_65536_and_uint32_above() -> None:
    small = FlatBlockManager(num_blocks=65536, max_seqs=4, max_blocks_per_seq=32)
    assert small.table.dtype == np.uint16
    assert small.table[0].nbytes == 64  # a 32-block table is one cache line
    big = FlatBlockManager(num_blocks=65537, max_seqs=4, max_blocks_per_seq=32)
    assert big.table.dtype == np.uint32
    big.allocate(0, 16)
    assert big.ref_count(0) == 1


@pytest.mark.parametrize(
    "kwargs",
    [
        {"num_blocks": 0},
        {"num_blocks": 8, "block_size": 0},
        {"num_blocks": 8, "block_size": 12},
        {"num_blocks": 8, "max_seqs": -1},
        {"num_blocks": 8, "max_blocks_per_seq": 2.5},
        {"num_blocks": 2**31},
    ],
)
def test_bad_configuration_is_refused(impl_name: str, kwargs: dict) -> None:
    with pytest.raises(ValueError):
        REGISTRY[impl_name](**kwargs)


def test_misuse_is_reported_before_the_pool(impl_name: str) -> None:
    mgr = REGISTRY[impl_name](num_blocks=2, block_size=4, max_seqs=4, max_blocks_per_seq=2)
    mgr.allocate(0, 8)  # empties the pool
    with pytest.raises(ValueError, match="outside"):
        mgr.allocate(7, 1)
    with pytest.raises(ValueError, match="num_tokens"):
        mgr.allocate(1, 0)
    with pytest.raises(ValueError, match="max_blocks_per_seq"):
        mgr.allocate(1, 9)
    with pytest.raises(KeyError, match="already active"):
        mgr.allocate(0, 4)
    with pytest.raises(KeyError, match="not active"):
        mgr.append_slot(1)
    with pytest.raises(ValueError, match="max_blocks_per_seq"):
        mgr.append_slot(0)  # full at 2 blocks
    with pytest.raises(KeyError):
        mgr.fork(2, 3)
    with pytest.raises(KeyError):
        mgr.fork(0, 0)
    with pytest.raises(ValueError):
        mgr.ref_count(2)
    with pytest.raises(ValueError):
        mgr.can_allocate(-1)
    with pytest.raises(NoFreeBlocksError, match="need 1 free blocks, pool has 0"):
        mgr.allocate(1, 1)
    assert mgr.num_free_blocks() == 0 and mgr.seq_len(0) == 8
