"""The batched decode step gives the same state as the same appends done one call at a time."""

from __future__ import annotations

import contextlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.base.threads import one_intra_op_thread
from harness.conformance.machine import swept_ids
from impls import REGISTRY, NoFreeBlocksError
from tests.registered import impl_params, slow_for

CFG = {"num_blocks": 64, "block_size": 4, "max_seqs": 8, "max_blocks_per_seq": 8}
# Drawn per example: every block size from 1 to 64, pools from the 64 blocks a full step may need to 65,536
# (the largest in a few examples of its own: building a 65,536-block pool is most of an example's time).
BLOCK_SIZES = (1, 2, 4, 16, 64)
POOLS = (64, 1024)
FULL_POOL = 65536


def snapshot(mgr) -> tuple:
    """Everything observable through the contract (ref counts as the conformance checker sweeps them)."""
    tables = {}
    for seq in range(mgr.max_seqs):
        with contextlib.suppress(KeyError):
            tables[seq] = (mgr.seq_len(seq), list(mgr.block_table(seq)))
    swept = swept_ids(mgr.num_blocks, (int(b) for _, table in tables.values() for b in table))
    return mgr.num_free_blocks(), tables, [(b, mgr.ref_count(b)) for b in swept]


def build(name: str, prompts: list[int], forks: list[tuple[int, int]], cfg: dict[str, int] = CFG):
    mgr = REGISTRY[name](**cfg)
    for seq, tokens in enumerate(prompts):
        mgr.allocate(seq, tokens)
    for parent, child in forks:
        mgr.fork(parent, child)
    return mgr


SETUP = st.tuples(
    st.lists(st.integers(1, 12), min_size=1, max_size=4),
    st.lists(st.tuples(st.integers(0, 3), st.integers(4, 7)), max_size=4, unique_by=lambda f: f[1]),
)


@pytest.mark.parametrize("name", slow_for(impl_params(), {"flat-rows", "flat-pc"}))  # ~18 s each: Numba typings
@settings(max_examples=25, deadline=None)
@given(setup=SETUP, steps=st.integers(1, 12), block_size=st.sampled_from(BLOCK_SIZES), pool=st.sampled_from(POOLS))
def test_decode_step_matches_per_call(name: str, setup, steps: int, block_size: int, pool: int) -> None:
    with one_intra_op_thread():  # a block manager runs on one host thread (harness.base.threads)
        decode_steps_match(name, setup, steps, block_size, pool)


@pytest.mark.parametrize("name", impl_params())
@settings(max_examples=3, deadline=None)
@given(setup=SETUP, steps=st.integers(1, 12), block_size=st.sampled_from(BLOCK_SIZES))
def test_decode_step_matches_per_call_in_the_full_pool(name: str, setup, steps: int, block_size: int) -> None:
    with one_intra_op_thread():
        decode_steps_match(name, setup, steps, block_size, FULL_POOL)


def decode_steps_match(name: str, setup, steps: int, block_size: int, pool: int) -> None:
    """``steps`` batched decode steps on one instance, the same appends one call at a time on another."""
    prompts, forks = setup
    cfg = {**CFG, "num_blocks": pool, "block_size": block_size}
    prompts = [min(tokens, block_size * CFG["max_blocks_per_seq"]) for tokens in prompts]
    forks = [(p, c) for p, c in forks if p < len(prompts)]
    batched, per_call = build(name, prompts, forks, cfg), build(name, prompts, forks, cfg)
    running = np.array(sorted({*range(len(prompts)), *(c for _, c in forks)}), dtype=np.int64)
    cow_out, slot_out = np.zeros((len(running), 2), np.int64), np.zeros(len(running), np.int64)
    for _ in range(steps):
        try:
            ncow = batched.decode_step(running, cow_out, slot_out)
        except ValueError:  # a sequence reached max_blocks_per_seq: the per-call path must refuse too
            with pytest.raises(ValueError):
                for seq in running.tolist():
                    per_call.append_slot(seq)
            return
        cows = [c for c in (per_call.append_slot(s) for s in running.tolist()) if c is not None]
        assert cow_out[:ncow].tolist() == [list(c) for c in cows]
        assert slot_out.tolist() == [per_call.last_slot(s) for s in running.tolist()]
        assert snapshot(batched) == snapshot(per_call)


@pytest.mark.parametrize("name", impl_params())
def test_failed_step_changes_nothing(name: str) -> None:
    mgr = REGISTRY[name](num_blocks=6, block_size=2, max_seqs=4, max_blocks_per_seq=4)
    mgr.allocate(0, 2)  # at a boundary: needs a block
    mgr.allocate(1, 3)
    mgr.fork(1, 2)  # 1 and 2 share a partial last block: each may need a copy
    before = snapshot(mgr)
    cow_out, slot_out = np.zeros((4, 2), np.int64), np.zeros(4, np.int64)
    cases = [
        ([0, 1, 1], ValueError),  # duplicate
        ([0, 3], KeyError),  # inactive
        ([0, 9], ValueError),  # out of range
    ]
    for ids, error in cases:
        with pytest.raises(error):
            mgr.decode_step(np.array(ids, dtype=np.int64), cow_out, slot_out)
        assert snapshot(mgr) == before
    with pytest.raises(ValueError):  # output buffers too small
        mgr.decode_step(np.array([0, 1], dtype=np.int64), cow_out[:1], slot_out)
    mgr.allocate(3, 4)  # leaves 1 free block; the step's worst case is 3
    before = snapshot(mgr)
    with pytest.raises(NoFreeBlocksError):
        mgr.decode_step(np.array([0, 1, 2], dtype=np.int64), cow_out, slot_out)
    assert snapshot(mgr) == before
