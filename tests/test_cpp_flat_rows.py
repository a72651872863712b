"""``cpp-flat-rows`` against ``flat-rows``, call by call: the C++ twin answers and holds exactly what flat-rows does.

The same random calls through the public contract (allocate, append_slot, fork, free, decode_step, lookup,
last_slot, can_allocate; valid ones and failing ones) on both must give the same results or the same exception
(type and message) and the same whole output buffers (a failed step leaves them untouched in both). After every
call both hold the same state: free count, every sequence's length, block table and ``table_nbytes``, the ref
count of every block handed out so far (the stacks hand out 0, 1, 2, ... and reuse the last freed first, so
blocks past the peak in use were never touched), and the same number of rows in use (forks share rows, a
write into a shared row copies it first).

Small pools, one-token blocks (rows crossed often), forks and failed steps over shared rows common; seeded and
deterministic. flat-rows is itself held to flat block for block (``tests/test_flat_rows.py``).
"""

from __future__ import annotations

import numpy as np
import pytest

import impls.native as native
from impls.designs import flat_rows
from impls.designs.flat_rows import FlatRowsBlockManager
from tests.test_flat_differential import _ids

if "cpp-flat-rows" not in native.NATIVE:  # pragma: no cover - machines without a C++ compiler
    pytest.skip(f"native designs unavailable: {native.UNAVAILABLE_REASON}", allow_module_level=True)

CppFlatRowsBlockManager = native.CppFlatRowsBlockManager
CASES, OPS = 100, 80


def outcome(fn, *args) -> tuple:
    try:
        return "ok", fn(*args)
    except (ValueError, KeyError, TypeError, MemoryError) as exc:
        return "err", type(exc), str(exc)


def state(mgr, peak: int) -> tuple:
    tables = []
    for seq in range(mgr.max_seqs):
        length = outcome(mgr.seq_len, seq)
        tables.append((length, mgr.block_table(seq), mgr.table_nbytes(seq)) if length[0] == "ok" else length)
    refs = [mgr.ref_count(b) for b in range(min(mgr.num_blocks, peak + 2))]
    return mgr.num_free_blocks(), tables, refs, mgr.rows_in_use()


def _decode(mgr, ids: np.ndarray, cap: int) -> tuple:
    cow, slot = np.full((cap, 2), -7, np.int64), np.full(cap, -7, np.int64)
    return outcome(mgr.decode_step, ids, cow, slot), cow.tolist(), slot.tolist()


def _lookup(mgr, ids: np.ndarray) -> tuple:
    slot = np.full(len(ids), -7, np.int64)
    return outcome(mgr.lookup, ids, slot), slot.tolist()


def random_call(rng: np.random.Generator, py: FlatRowsBlockManager) -> tuple:
    """(name, function of a manager) for one random call: mostly valid (allocate and fork into a free sequence,
    fork an active one: sharing is common), sometimes not."""
    rows, cols, bs = py.max_seqs, py.max_blocks_per_seq, py.block_size
    lens = py._lens.tolist()
    active = [r for r, n in enumerate(lens) if n]
    idle = [r for r, n in enumerate(lens) if not n]

    def pick(preferred: list[int]) -> int:
        if preferred and rng.random() < 0.85:
            return int(rng.choice(preferred))
        return int(rng.integers(-1, rows + 1)) if rng.random() < 0.1 else int(rng.integers(0, rows))

    op = rng.random()
    if op < 0.35:
        ids = _ids(rng, lens, cols, bs)
        cap = max(0, len(ids) + (1 if rng.random() < 0.9 else -1) * int(rng.integers(0, 2)))
        return "decode_step", lambda m: _decode(m, ids, cap)
    if op < 0.47:
        room = min(cols * bs, py.num_free_blocks() * bs // 2)  # mostly a prompt that fits, leaving room to grow
        seq = pick(idle)
        fits = room and rng.random() < 0.75
        tokens = int(rng.integers(1, room + 1)) if fits else int(rng.integers(-1, cols * bs + 3))
        return "allocate", lambda m: outcome(m.allocate, seq, tokens)
    if op < 0.67:
        parent, child = pick(active), pick(idle)
        return "fork", lambda m: outcome(m.fork, parent, child)
    seq = pick(active)
    if op < 0.8:
        return "free", lambda m: outcome(m.free, seq)
    if op < 0.9:
        return "append_slot", lambda m: outcome(m.append_slot, seq)
    if op < 0.95:
        n = int(rng.integers(-1, py.num_blocks + 2))
        return "last_slot", lambda m: (outcome(m.last_slot, seq), outcome(m.can_allocate, n))
    ids = _ids(rng, lens, cols, bs)
    return "lookup", lambda m: _lookup(m, ids)


def fuzz(cases: int, seed: int, min_blocks: int = 1, max_blocks: int | None = None) -> None:
    rng = np.random.default_rng(seed)
    for case in range(cases):
        rows, cols, bs = int(rng.integers(2, 9)), int(rng.integers(1, 70)), int(rng.choice([1, 2, 4]))
        num_blocks = max(min_blocks, int(rng.integers(1, max_blocks or rows * cols + 3)))
        py, cpp = FlatRowsBlockManager(num_blocks, bs, rows, cols), CppFlatRowsBlockManager(num_blocks, bs, rows, cols)
        assert cpp.num_rows == py.layout.num_rows and cpp.id_bytes() == py.rows.itemsize
        peak = 0
        for i in range(OPS):
            name, call = random_call(rng, py)
            want, got = call(py), call(cpp)
            where = f"seed {seed} case {case} {(num_blocks, bs, rows, cols)} op {i} {name}"
            assert got == want, where
            peak = max(peak, py.num_blocks - py.num_free_blocks())
            assert state(cpp, peak) == state(py, peak), where
        for b in (-1, num_blocks):
            assert outcome(cpp.ref_count, b) == outcome(py.ref_count, b)


def test_same_calls_same_answers_and_state_as_flat_rows() -> None:
    fuzz(CASES, seed=0)


@pytest.mark.slow  # an end-to-end CLI run (make test-slow, .ci/run)
def test_same_calls_with_uint32_ids() -> None:
    """Past 65,536 blocks ids are uint32 and a 64-byte row holds 16 of them."""
    assert CppFlatRowsBlockManager(65537, 1, 2, 4).id_bytes() == 4
    fuzz(3, seed=5, min_blocks=65537, max_blocks=65600)


@pytest.mark.slow
def test_same_calls_long() -> None:
    fuzz(20 * CASES, seed=1)


def test_forks_share_rows_and_a_write_copies_only_the_last() -> None:
    """A 100-block parent forked 5 times: the children share its 4 rows; each child's first append (a
    copy-on-write of the shared partial block) copies only the last row: 4 + 5 rows in use, not 6 x 4."""
    mgr = CppFlatRowsBlockManager(num_blocks=256, block_size=2, max_seqs=8, max_blocks_per_seq=128)
    mgr.allocate(0, 199)
    for child in range(1, 6):
        mgr.fork(0, child)
    assert mgr.rows_in_use() == 4 and mgr.table_nbytes(5) == 4 * 4 + 64 * 4
    assert [mgr.append_slot(child) for child in range(1, 6)] == [(99, 100 + k) for k in range(5)]
    assert mgr.rows_in_use() == 4 + 5
    for seq in range(6):
        mgr.free(seq)
    assert mgr.rows_in_use() == 0 and mgr.num_free_blocks() == 256


@pytest.mark.parametrize("config", [(65536, 256, 256), (70000, 3, 5), (8, 1, 1), (100, 4, 1000)])
def test_row_pool_has_flat_rows_size(config: tuple[int, int, int]) -> None:
    """The pool holds flat-rows' rows (its module docstring proves they cover any sequence of calls): the
    blocks' rows plus two per sequence, or every directory full where that is fewer."""
    num_blocks, seqs, cols = config
    mgr = CppFlatRowsBlockManager(num_blocks, 16, seqs, cols)
    assert mgr.num_rows == flat_rows.row_count(num_blocks, seqs, cols, 64 // mgr.id_bytes())
    assert mgr.num_rows == FlatRowsBlockManager(num_blocks, 16, seqs, cols).layout.num_rows


def test_memory_follows_the_pool_not_the_longest_sequence() -> None:
    """1,024 sequences of a 1M-token context (65,536 blocks of 16 tokens), 1M blocks: C's uint32 table alone is
    256 MiB; flat-rows' rows follow the pool (1M / 16 + 2,048 rows of 64 B) beside 16 MiB of directories."""
    mgr = CppFlatRowsBlockManager(1 << 20, 16, 1024, 65536)
    assert mgr.num_rows == (1 << 20) // 16 + 2 * 1024
    assert mgr.memory_bytes() < 1024 * 65536 * 4 // 8
