"""Every implementation keeps the contract at every block size, 1 included (SGLang's default page size).

The engines' own arithmetic (``len % block_size == 1`` opens a block) never holds at block size 1; the
contenders follow the contract there (issue 34). The conformance checker draws every block size and pools up to
65,536 blocks, so it finds such a case: ``tests/test_contract_stateful.py`` runs it on every implementation.
"""

from __future__ import annotations

import pytest

from harness.conformance import CONFIGS
from harness.conformance.pool import BLOCK_SIZES as POOL_BLOCK_SIZES
from harness.conformance.pool import POOL
from impls import REGISTRY
from impls.core.reference import ReferenceModel
from tests.registered import impl_params

BLOCK_SIZES = (1, 2, 4, 16, 64)


@pytest.mark.parametrize("name", impl_params())
def test_fourth_token_takes_a_fourth_block_at_block_size_1(name: str) -> None:
    """Issue 34's reproduction: nano-vllm and sglang kept 5 free blocks, and wrote the token past the table."""
    mgr = REGISTRY[name](num_blocks=8, block_size=1, max_seqs=6, max_blocks_per_seq=4)
    mgr.allocate(3, 3)
    assert mgr.append_slot(3) is None
    assert mgr.num_free_blocks() == 4
    table = list(mgr.block_table(3))
    assert len(table) == len(set(table)) == 4 and all(mgr.ref_count(b) == 1 for b in table)
    assert mgr.last_slot(3) == table[-1]
    with pytest.raises(ValueError):  # a fifth block is past max_blocks_per_seq
        mgr.append_slot(3)


@pytest.mark.parametrize("block_size", BLOCK_SIZES)
@pytest.mark.parametrize("name", impl_params())
def test_appends_open_blocks_where_the_model_does(name: str, block_size: int) -> None:
    """Appends across two block boundaries, and a fork's copy-on-write, at each block size: the same free counts,
    table lengths, slot offsets and copies as the reference model, call by call."""
    cfg = {"num_blocks": 16, "block_size": block_size, "max_seqs": 4, "max_blocks_per_seq": 4}
    mgr, model = REGISTRY[name](**cfg), ReferenceModel(**cfg)
    for m in (mgr, model):
        m.allocate(0, block_size)  # a full block: the next token opens one
        m.allocate(1, max(1, block_size // 2))
        m.fork(1, 2)
    for _ in range(2 * block_size + 1):
        for seq in (0, 1, 2):
            cow, expected = mgr.append_slot(seq), model.append_slot(seq)
            assert (cow is None) == (expected is None), (seq, cow, expected)
            assert mgr.num_free_blocks() == model.num_free_blocks()
            assert len(mgr.block_table(seq)) == len(model.tables[seq])
            assert mgr.last_slot(seq) % block_size == model.last_slot(seq) % block_size


def test_the_checker_draws_every_block_size_and_pools_up_to_65536() -> None:
    assert sorted({c["block_size"] for c in CONFIGS}) == list(BLOCK_SIZES)
    pools = [c["num_blocks"] for c in CONFIGS]
    assert min(pools) <= 8 and max(pools) == 65536
    assert POOL_BLOCK_SIZES == BLOCK_SIZES and POOL["num_blocks"] == 65536
