"""``flat-rows`` against ``flat``, operation by operation, and the row pool's own invariants.

flat-rows keeps C's block-level behaviour exactly (stack order, ref counts, copy-on-write, the one-pass step
and its rollback, error codes), so the same random calls on both must give the same status codes and
failing indices, the same slots and CoW pairs (whole buffers: a failed step leaves them untouched), and the
same hidden block state: lengths, every ref count, the free stack (top and live entries, in order) and every
live table. On top, after every operation, the row pool must be consistent: each row's ref count is the
number of directory entries pointing at it, free rows are exactly those at ref 0, each record's last row is
its directory's last entry, and the rows in use stay within the bound the pool is sized by (``B // R + 2L -
1``, module docstring of :mod:`impls.designs.flat_rows`).

Small pools, rows of 32 (or 16) ids crossed often (one-token blocks), forks and rollbacks over shared rows
common; seeded and deterministic.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

from impls.designs import flat
from impls.designs import flat_rows as fr
from impls.designs.flat import FlatBlockManager
from impls.designs.flat_rows import FlatRowsBlockManager
from tests.test_flat_differential import _ids

CASES = int(os.environ.get("KVB_FLAT_ROWS_FUZZ_CASES", "250"))
OPS = 120


def _flat_hidden(mgr: FlatBlockManager) -> tuple:
    table, ints = mgr.state
    _, refs_at, stack_at, _, _ = flat.offsets(mgr.max_seqs, mgr.num_blocks)
    top, sh = int(ints[flat.TOP]), mgr.block_shift
    live = [table[r, : (length + (1 << sh) - 1) >> sh].tolist() for r, length in enumerate(mgr._lens.tolist())]
    return mgr._lens, ints[refs_at:stack_at], ints[stack_at : stack_at + top], live


def _rows_hidden(mgr: FlatRowsBlockManager) -> tuple:
    lens, stack, top = mgr._lens, mgr.layout.stack, int(mgr.ints[fr.TOP])
    live = [mgr._table(r) if length else [] for r, length in enumerate(lens.tolist())]
    return lens, mgr._refs, mgr.ints[stack : stack + top], live


def assert_same_blocks(a: FlatBlockManager, b: FlatRowsBlockManager, where: str) -> None:
    """Lengths, ref counts, the free stack's live entries (in order) and every live table agree."""
    (la, ra, sa, ta), (lb, rb, sb, tb) = _flat_hidden(a), _rows_hidden(b)
    assert np.array_equal(la, lb) and np.array_equal(ra, rb) and np.array_equal(sa, sb), (where, "block state")
    assert ta == tb, (where, "tables")


def check_rows(mgr: FlatRowsBlockManager) -> None:
    """The row pool's invariants (see the module docstring)."""
    lay, ints = mgr.layout, mgr.ints
    counted = np.zeros(lay.num_rows, np.int64)
    live = 0
    for seq, length in enumerate(mgr._lens.tolist()):
        if not length:
            continue
        live += 1
        ids = mgr._row_ids(seq)
        assert len(set(ids.tolist())) == len(ids), (seq, ids)
        assert int(mgr._last[seq]) == int(ids[-1]), (seq, "last row")
        np.add.at(counted, ids, 1)
    assert counted.tolist() == mgr._row_refs.tolist(), "row ref counts"
    rtop = int(ints[fr.RTOP])
    free = sorted(ints[lay.rstack : lay.rstack + rtop].tolist())
    assert free == np.flatnonzero(counted == 0).tolist(), "free rows"
    in_use = mgr.rows_in_use()
    blocks = mgr.num_blocks - mgr.num_free_blocks()
    assert in_use <= max(0, blocks // lay.ids_per_row + 2 * live - 1), (in_use, blocks, live)


def _pair(num_blocks: int, bs: int, seqs: int, cols: int) -> tuple[FlatBlockManager, FlatRowsBlockManager]:
    return FlatBlockManager(num_blocks, bs, seqs, cols), FlatRowsBlockManager(num_blocks, bs, seqs, cols)


def _step(rng: np.random.Generator, a: FlatBlockManager, b: FlatRowsBlockManager, where: str) -> None:
    """One random operation on both managers' kernels; asserts they agree."""
    rows, cols, bs = a.max_seqs, a.max_blocks_per_seq, a.block_size
    sa, sb = a.state, b.state
    op = rng.random()
    seq = int(rng.integers(-1, rows + 1)) if rng.random() < 0.1 else int(rng.integers(0, rows))
    if op < 0.4:
        ids = _ids(rng, a._lens.tolist(), cols, bs)
        cap = len(ids) + (1 if rng.random() < 0.9 else -1) * int(rng.integers(0, 2))
        outs = [(np.full((max(cap, 0), 2), -7, np.int64), np.full(max(cap, 0), -7, np.int64)) for _ in range(2)]
        ra, rb = flat.decode_step(*sa, ids, *outs[0]), fr.decode_step(*sb, ids, *outs[1])
        assert ra == rb, (where, "decode_step", ids.tolist(), ra, rb)
        assert outs[0][0].tolist() == outs[1][0].tolist(), (where, "cow pairs", ids.tolist())
        assert outs[0][1].tolist() == outs[1][1].tolist(), (where, "slots", ids.tolist())
    elif op < 0.55:
        tokens = int(rng.integers(-1, cols * bs + 3))
        assert flat.allocate(*sa, seq, tokens) == fr.allocate(*sb, seq, tokens), (where, "allocate", seq, tokens)
    elif op < 0.72:
        child = int(rng.integers(-1, rows + 1))
        assert flat.fork(*sa, seq, child) == fr.fork(*sb, seq, child), (where, "fork", seq, child)
    elif op < 0.8:
        assert flat.free(*sa, seq) == fr.free(*sb, seq), (where, "free", seq)
    elif op < 0.9:
        assert flat.append(*sa, seq) == fr.append(*sb, seq), (where, "append", seq)
    elif op < 0.95:
        assert flat.last_slot(*sa, seq) == fr.last_slot(*sb, seq), (where, "last_slot", seq)
        n = int(rng.integers(-1, a.num_blocks + 2))
        assert flat.can_allocate(*sa, n) == fr.can_allocate(*sb, n), (where, "can_allocate", n)
    else:
        ids = _ids(rng, a._lens.tolist(), cols, bs)
        outs = [np.full(len(ids), -7, np.int64) for _ in range(2)]
        assert flat.lookup(*sa, ids, outs[0]) == fr.lookup(*sb, ids, outs[1]), (where, "lookup", ids.tolist())
        assert outs[0].tolist() == outs[1].tolist(), (where, "lookup slots", ids.tolist())
    assert_same_blocks(a, b, where)
    check_rows(b)


def fuzz(cases: int, seed: int = 0, min_blocks: int = 1) -> None:
    """``cases`` random operation sequences of :data:`OPS` operations each (pools of at least ``min_blocks``)."""
    rng = np.random.default_rng(seed)
    for case in range(cases):
        rows, cols, bs = int(rng.integers(1, 9)), int(rng.integers(1, 80)), int(rng.choice([1, 2, 4]))
        num_blocks = max(min_blocks, int(rng.integers(1, rows * cols + 3)))  # often tighter than the rows can use
        a, b = _pair(num_blocks, bs, rows, cols)
        for i in range(OPS):
            _step(rng, a, b, f"seed {seed} case {case} {(num_blocks, bs, rows, cols)} op {i}")


def test_differential_fuzz_against_flat() -> None:
    fuzz(CASES)


@pytest.mark.slow  # an end-to-end CLI run (make test-slow, .ci/run)
def test_differential_fuzz_with_uint32_ids() -> None:
    """Past 65,536 blocks ids are uint32 and a 64-byte row holds 16 of them."""
    a, b = _pair(65537, 1, 2, 4)
    assert b.rows.dtype == np.uint32 and b.layout.ids_per_row == 16 and a.table.dtype == np.uint32
    fuzz(max(1, CASES // 5), seed=3, min_blocks=65537)


def test_rows_follow_the_pool_not_the_longest_sequence() -> None:
    """A 1M-token context at 1,024 sequences: C's table is 256 MiB (uint32 ids: 1M blocks), flat-rows'
    rows follow the pool (1M / 16 ids + 2,048 rows of 64 B) and its directories are 1/16 of C's table."""
    n, seqs, cols = 1 << 20, 1024, 65536
    lay = fr.layout(n, seqs, cols)
    assert lay.ids_per_row == 16 and lay.num_rows == n // 16 + 2 * seqs
    assert lay.dir_len == cols // 16
    flat_table = seqs * cols * 4
    assert lay.num_rows * fr.ROW_BYTES < flat_table // 60
    # small pools and short tables: never more rows than every directory full
    assert fr.row_count(65536, 256, 256, 32) == 256 * 8


@pytest.mark.parametrize("num_blocks,max_seqs,cols", [(64, 4, 16), (1000, 7, 33), (70000, 3, 40000)])
def test_rows_and_records_start_on_cache_lines(num_blocks: int, max_seqs: int, cols: int) -> None:
    """Each 64-byte row is one cache line, and the records start on one (the header is 128 B); NumPy alone
    aligns to 16 B, which left rows straddling two lines. ``memory_bytes`` counts the alignment's slack."""
    mgr = fr.FlatRowsBlockManager(num_blocks, 16, max_seqs, cols)
    assert mgr.rows.ctypes.data % 64 == 0 and mgr.ints.ctypes.data % 64 == 0
    assert mgr.rows.flags.c_contiguous and mgr.rows.flags.writeable and mgr.ints.flags.c_contiguous
    assert mgr.rows.strides[0] == fr.ROW_BYTES
    held = mgr.rows.base.nbytes + mgr.ints.base.nbytes + 4 * (num_blocks + mgr.layout.num_rows)
    assert mgr.memory_bytes() == held


def test_forks_share_rows_and_a_write_copies_only_the_last() -> None:
    """A 100-block parent forked 5 times: children share its 4 rows; each child's first append copies only
    the last row (a copy-on-write of the shared partial block), so 4 + 5 rows are in use, not 6 x 4."""
    mgr = FlatRowsBlockManager(num_blocks=256, block_size=2, max_seqs=8, max_blocks_per_seq=128)
    mgr.allocate(0, 199)  # 100 blocks, the last one half full: rows of 32, 32, 32, 4 ids
    for child in range(1, 6):
        mgr.fork(0, child)
    assert mgr.rows_in_use() == 4 and mgr._row_refs[mgr._row_ids(0)].tolist() == [6, 6, 6, 6]
    for child in range(1, 6):
        assert mgr.append_slot(child) is not None  # copy-on-write of the shared last block
    assert mgr.rows_in_use() == 4 + 5
    assert [mgr._row_ids(c)[:3].tolist() for c in range(6)] == [mgr._row_ids(0)[:3].tolist()] * 6
    check_rows(mgr)
    for seq in range(6):
        mgr.free(seq)
    assert mgr.rows_in_use() == 0 and mgr.num_free_blocks() == 256
    check_rows(mgr)


def test_failed_step_gives_back_a_row_copy() -> None:
    """A step copies a shared row (writing into it), then meets an inactive id: the copy goes back to the pool
    and the sequence points at the shared row again, whose next write copies it anew."""
    mgr = FlatRowsBlockManager(num_blocks=64, block_size=1, max_seqs=4, max_blocks_per_seq=64)
    mgr.allocate(0, 5)
    mgr.fork(0, 1)
    shared = mgr._row_ids(0).tolist()
    cow, slot = np.zeros((3, 2), np.int64), np.full(3, -7, np.int64)
    with pytest.raises(KeyError):
        mgr.decode_step(np.array([1, 3], np.int64), cow, slot)  # row 1 copies its row, then 3 is inactive
    assert mgr._row_ids(1).tolist() == shared and mgr.rows_in_use() == 1 and slot.tolist() == [-7] * 3
    check_rows(mgr)
    mgr.decode_step(np.array([1], np.int64), cow, slot)
    assert mgr._row_ids(1).tolist() != shared and mgr.rows_in_use() == 2
    check_rows(mgr)


def test_allocate_and_append_are_flats_code() -> None:
    """flat-rows runs flat's allocate, append and a tight step's reserve loop, made over its rows (as flat-pc
    over its pool): one body each, not a copy."""
    for name in ("allocate_row", "append_token", "reserve_rows"):
        assert getattr(fr, "_" + name).py_func.__code__ is getattr(flat, name).py_func.__code__, name


@pytest.mark.parametrize("block_size, tokens, fork", [(1, 32, False), (1, 5, True), (2, 3, True)])
def test_an_empty_row_pool_refuses_and_changes_nothing(block_size: int, tokens: int, fork: bool) -> None:
    """With the row pool emptied by hand (it never empties: it holds the worst case), an append that needs a row
    (one opening a row; a write into a shared row, at a block boundary or not) and an allocate refuse with
    E_ROWS and change nothing."""
    mgr = FlatRowsBlockManager(num_blocks=64, block_size=block_size, max_seqs=4, max_blocks_per_seq=64)
    mgr.allocate(0, tokens)
    if fork:
        mgr.fork(0, 1)
    mgr.ints[fr.RTOP] = 0
    ints, rows = mgr.ints.copy(), mgr.rows.copy()
    assert fr.append(*mgr.state, 0) == (fr.E_ROWS, -1, -1)
    assert fr.allocate(*mgr.state, 2, 1) == fr.E_ROWS
    assert np.array_equal(mgr.ints, ints) and np.array_equal(mgr.rows, rows)


@pytest.mark.slow
def test_differential_fuzz_long() -> None:
    fuzz(20 * CASES, seed=1)
