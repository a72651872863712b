"""One benchmark per (operation x implementation), grouped by operation for ``pytest-benchmark compare``.

Every benchmark starts from the same state: the paper workload after its first step (256 running sequences
with ShareGPT-like lengths, 16-token blocks, a 16,384-block pool) in a manager with 512 rows, so that rows
256 and up are free for allocations and forks. Operations that change the state run in pedantic mode with
the state rebuilt (untimed) before every round; read-only and state-restoring ones run in the default mode.

What is timed is one Python call into the contract, as a Python scheduler makes it. For compiled designs
that includes Numba's dispatch (unboxing each argument), not only the compiled kernel: the harness's
compiled replay (``harness.base.drivers.compiled_driver``) measures kernels without it. ``extra_info`` records
the implementation, regime, scenario, what one round does (``ops_per_round`` of ``op_unit``) and the call.
"""

from __future__ import annotations

from functools import cache

import numpy as np
import pytest

from harness.base.replay import replay
from impls import REGISTRY, registry
from impls.contract import blocks_for
from scenarios import Trace, generate

SCENARIO = "paper"
PARAMS = {"steps": 1, "running": 256, "num_blocks": 16384}
SCENARIO_LABEL = "paper after step 0: 256 running sequences, 16,384-block pool, 512 rows"
# The C++ designs are measured by their own replay loop; one ctypes call per operation would time ctypes.
IMPLS = sorted(name for name in REGISTRY if registry.record(name).role != "native")
ROUNDS = 100  # pedantic rounds; each rebuilds the state first


@cache
def _trace() -> Trace:
    return generate(SCENARIO, **PARAMS)


def running_ids() -> np.ndarray:
    """Rows decoding in the state's step, int64 as the batched calls take them."""
    return _trace().decode_ids(0).astype(np.int64)


def free_row() -> int:
    """A row no sequence occupies in the state."""
    return _trace().config["max_seqs"]


def build(impl: str):
    """A fresh manager in the benchmarks' state."""
    trace = _trace()
    mgr = REGISTRY[impl](**{**trace.config, "max_seqs": 2 * trace.config["max_seqs"]})
    replay(trace, mgr, "batched")
    return mgr


def describe(benchmark, impl: str, regime: str, ops_per_round: int, op_unit: str) -> None:
    """Record what one round measures, for per-operation normalisation in reports."""
    compiled = getattr(REGISTRY[impl], "kernels", None) is not None
    benchmark.extra_info.update(
        impl=impl,
        regime=regime,
        scenario=SCENARIO_LABEL,
        ops_per_round=ops_per_round,
        op_unit=op_unit,
        call="python -> compiled kernel (Numba dispatch included)" if compiled else "python",
    )


def rebuilt(impl: str):
    """A pedantic-mode setup: a fresh manager per round, passed to the target."""

    def setup() -> tuple[tuple, dict]:
        return (build(impl),), {}

    return setup


@pytest.mark.benchmark(group="lookup: 256 sequences, batched", max_time=0.5, min_time=0.0002)
@pytest.mark.parametrize("impl", IMPLS)
def test_lookup(benchmark, impl: str) -> None:
    mgr, ids = build(impl), running_ids()
    slots = np.zeros(len(ids), dtype=np.int64)
    mgr.lookup(ids, slots)  # compiles (or loads) and warms outside timing
    describe(benchmark, impl, "batched", len(ids), "sequence")
    benchmark(mgr.lookup, ids, slots)
    assert slots[0] == mgr.last_slot(int(ids[0]))


@pytest.mark.benchmark(group="alloc+free: one block, per call", max_time=0.5, min_time=0.0002)
@pytest.mark.parametrize("impl", IMPLS)
def test_alloc_free_one_block(benchmark, impl: str) -> None:
    mgr, row = build(impl), free_row()
    free_before = mgr.num_free_blocks()

    def alloc_free() -> None:
        mgr.allocate(row, mgr.block_size)
        mgr.free(row)

    alloc_free()
    describe(benchmark, impl, "per-call", 1, "allocate + free of one block")
    benchmark(alloc_free)
    assert mgr.num_free_blocks() == free_before


@pytest.mark.benchmark(group="decode step: 256 sequences, batched")
@pytest.mark.parametrize("impl", IMPLS)
def test_decode_step(benchmark, impl: str) -> None:
    ids = running_ids()
    cow_out, slot_out = np.zeros((len(ids), 2), dtype=np.int64), np.zeros(len(ids), dtype=np.int64)
    lens = [build(impl).seq_len(int(i)) for i in ids[:2]]

    def step(mgr) -> object:
        mgr.decode_step(ids, cow_out, slot_out)
        return mgr

    step(build(impl))
    describe(benchmark, impl, "batched", len(ids), "sequence-step")
    mgr = benchmark.pedantic(step, setup=rebuilt(impl), rounds=ROUNDS, warmup_rounds=2)
    assert [mgr.seq_len(int(i)) for i in ids[:2]] == [n + 1 for n in lens]


def _partial_parent(mgr, ids: np.ndarray) -> int:
    """A running row whose last block is partly filled: the child's first append copies it."""
    return next(int(i) for i in ids if mgr.seq_len(int(i)) % mgr.block_size)


@pytest.mark.benchmark(group="fork + copy-on-write, per call")
@pytest.mark.parametrize("impl", IMPLS)
def test_fork_copy_on_write(benchmark, impl: str) -> None:
    probe, child = build(impl), free_row()
    parent = _partial_parent(probe, running_ids())

    def fork_cow(mgr) -> tuple[int, int] | None:
        mgr.fork(parent, child)
        return mgr.append_slot(child)

    fork_cow(build(impl))
    blocks = blocks_for(probe.seq_len(parent), probe.block_size)
    describe(benchmark, impl, "per-call", 1, f"fork of a {blocks}-block sequence + one copy-on-write")
    copied = benchmark.pedantic(fork_cow, setup=rebuilt(impl), rounds=ROUNDS, warmup_rounds=2)
    assert copied is not None


@pytest.mark.benchmark(group="free: a whole sequence, per call")
@pytest.mark.parametrize("impl", IMPLS)
def test_free_sequence(benchmark, impl: str) -> None:
    probe = build(impl)
    victim = max(running_ids().tolist(), key=probe.seq_len)
    blocks = blocks_for(probe.seq_len(victim), probe.block_size)

    def free(mgr) -> object:
        mgr.free(victim)
        return mgr

    free(build(impl))
    describe(benchmark, impl, "per-call", blocks, "block freed")
    mgr = benchmark.pedantic(free, setup=rebuilt(impl), rounds=ROUNDS, warmup_rounds=2)
    assert mgr.num_free_blocks() == probe.num_free_blocks() + blocks
