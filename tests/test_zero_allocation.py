"""Rule 1: the flat design allocates nothing in its step; what a Python call allocates is the call itself.

Every Python-to-Numba call allocates a little: Numba wraps each array argument in a runtime MemInfo and the
dispatcher builds a few Python objects. Those costs do not depend on the work, so the tests compare K real
steps with K steps over zero sequences (same arguments, no work): the difference is the step's own.
"""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

from harness.counters.allocations import count_allocations, nrt_allocations
from impls import REGISTRY

K = 200


def running_manager(name: str, seqs: int = 64):
    mgr = REGISTRY[name](num_blocks=8192, block_size=16, max_seqs=seqs, max_blocks_per_seq=128)
    for seq in range(seqs):
        mgr.allocate(seq, 1 + 7 * seq)  # varied lengths: block boundaries fall on different steps
    ids = np.arange(seqs, dtype=np.int64)
    cow, slot = np.zeros((seqs, 2), np.int64), np.zeros(seqs, np.int64)
    empty = ids[:0]

    def step():
        mgr.decode_step(ids, cow, slot)

    def empty_step():
        mgr.decode_step(empty, cow, slot)

    for _ in range(3):  # compile and warm (first-call caches) outside the counted region
        step(), empty_step()
    return mgr, step, empty_step


@pytest.mark.parametrize("counter", [count_allocations, nrt_allocations])
def test_flat_step_allocates_nothing_beyond_the_call(counter) -> None:
    _, step, empty_step = running_manager("flat")
    counter(step, 2), counter(empty_step, 2)  # the counters' own first-use allocations
    assert counter(step, K) == counter(empty_step, K)


def test_flat_call_wrappers_are_counted() -> None:
    """The fixed cost is real and visible: one runtime MemInfo per array argument (5 arrays)."""
    _, _, empty_step = running_manager("flat")
    assert nrt_allocations(empty_step, K) == 5 * K


def test_flat_per_call_operations_allocate_only_their_wrappers() -> None:
    mgr, _, _ = running_manager("flat")
    mgr.free(3)

    def churn():
        mgr.allocate(3, 40)
        mgr.append_slot(3)
        mgr.free(3)

    churn()
    assert nrt_allocations(churn, K) == 3 * 2 * K  # table + ints per call, nothing else


def test_growable_design_does_allocate() -> None:
    """Positive control: the same count finds the doubling arrays of the vector twin."""
    _, step, empty_step = running_manager("list-jit")
    assert count_allocations(step, K) > count_allocations(empty_step, K)
    assert nrt_allocations(step, K) > nrt_allocations(empty_step, K)


def test_flat_steps_leave_no_memory_behind() -> None:
    _, step, _ = running_manager("flat")
    tracemalloc.start()
    try:
        step()
        before = tracemalloc.take_snapshot()
        for _ in range(K):
            step()
        after = tracemalloc.take_snapshot()
    finally:
        tracemalloc.stop()
    grown = [d for d in after.compare_to(before, "filename") if d.size_diff > 0 and "tracemalloc" not in str(d)]
    assert sum(d.count_diff for d in grown) == 0, grown[:5]
