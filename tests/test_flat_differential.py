"""Differential fuzz of ``flat``'s kernels against a frozen copy of the kernels they replaced.

The one-pass decode step (validation, append and slot write fused, rolled back on a bad id), the per-row
"last block shared" bit and the offset indexing must change nothing observable or hidden: after every
operation both managers must agree on the status code and failing index, the slots and copy-on-write pairs
(whole buffers: a failed step must leave them untouched, as the old kernels never wrote before failing),
and on the hidden state: lengths, every ref count, the free stack (top and live entries, in order) and the
live part of every row of the table. Entries past a row's length are not compared: neither version reads
them, and a rolled-back boundary append leaves its popped id there. The marks are not compared either: they
are the new design's own (stamp and shared bit).

Random operation sequences on small pools (so that errors, tight pools, forks and rollbacks over shared
blocks are common), seeded and deterministic. ``KVB_FLAT_FUZZ_CASES`` sets the number of sequences (default
:data:`CASES`, about 4 s); ``KVB_FLAT_FUZZ_LONG=1`` adds a run of :data:`SLOW_CASES` (about 4 minutes).
"""

from __future__ import annotations

import os

import numpy as np
import pytest

from impls.core.ids import table_dtype
from impls.designs import flat
from impls.designs.flat import FlatBlockManager
from tests import flat_reference_kernels as ref

CASES = int(os.environ.get("KVB_FLAT_FUZZ_CASES", "400"))
SLOW_CASES = 20_000
OPS = 120


def _old_state(num_blocks: int, block_size: int, rows: int, cols: int) -> tuple:
    """A fresh state in the old kernels' layout: header, lengths, ref counts, stack, marks."""
    table = np.zeros((rows, cols), dtype=table_dtype(num_blocks))
    ints = np.zeros(ref.HEADER + 2 * rows + 2 * num_blocks, dtype=np.int32)
    ints[ref.TOP], ints[ref.NUM_BLOCKS], ints[ref.BLOCK_SHIFT] = num_blocks, num_blocks, block_size.bit_length() - 1
    at = ref.HEADER + rows + num_blocks
    ints[at : at + num_blocks] = np.arange(num_blocks - 1, -1, -1, dtype=np.int32)
    return table, ints


def _pair(num_blocks: int, block_size: int, rows: int, cols: int) -> tuple[tuple, tuple]:
    return FlatBlockManager(num_blocks, block_size, rows, cols).state, _old_state(num_blocks, block_size, rows, cols)


def _hidden(state: tuple) -> tuple:
    """Lengths, ref counts, top, live stack entries and live table rows (see the module docstring), read in
    either layout (the old one is told apart by its size)."""
    table, ints = state
    rows, n = table.shape[0], int(ints[flat.NUM_BLOCKS])
    sh, top = int(ints[flat.BLOCK_SHIFT]), int(ints[flat.TOP])
    if len(ints) == ref.HEADER + 2 * rows + 2 * n:
        refs_at = ref.HEADER + rows
        lens = ints[ref.HEADER : refs_at].tolist()
    else:
        records, refs_at, *_ = flat.offsets(rows, n)
        lens = ints[records + flat.LEN : refs_at : flat.ROW].tolist()
    stack_at = refs_at + n
    live = [table[r, : (length + (1 << sh) - 1) >> sh].tolist() for r, length in enumerate(lens)]
    return lens, ints[refs_at:stack_at].tolist(), top, ints[stack_at : stack_at + top].tolist(), live


def _ids(rng: np.random.Generator, lens: list[int], cols: int, bs: int) -> np.ndarray:
    """A decode batch: mostly distinct active rows in random order, sometimes a bad id at a random place."""
    rows = len(lens)
    active = [r for r, length in enumerate(lens) if length]
    k = int(rng.integers(0, len(active) + 1))
    ids = list(rng.permutation(active)[:k]) if active else []
    if rng.random() < 0.35:
        inactive = [r for r, length in enumerate(lens) if not length]
        full = [r for r in active if lens[r] == cols * bs]
        candidates = [[-1, rows, rows + 5, -(2**40)], inactive, ids, full]  # range, inactive, duplicate, full
        pool = candidates[int(rng.integers(0, 4))] or candidates[0]
        bad = pool[int(rng.integers(0, len(pool)))]
        ids.insert(int(rng.integers(0, len(ids) + 1)), int(bad))
    return np.array(ids, dtype=np.int64)


def _step(rng: np.random.Generator, new: tuple, old: tuple, dims: tuple[int, int, int, int], where: str) -> None:
    """One random operation on both states; asserts they agree (a dispatch over the contract's kernels)."""
    num_blocks, bs, rows, cols = dims
    lens = _hidden(old)[0]
    op = rng.random()
    seq = int(rng.integers(-1, rows + 1)) if rng.random() < 0.1 else int(rng.integers(0, rows))
    if op < 0.4:
        ids = _ids(rng, lens, cols, bs)
        cap = len(ids) + (1 if rng.random() < 0.9 else -1) * int(rng.integers(0, 2))
        outs = [(np.full((max(cap, 0), 2), -7, np.int64), np.full(max(cap, 0), -7, np.int64)) for _ in range(2)]
        a = flat.decode_step(*new, ids, *outs[0])
        b = ref.decode_step(*old, ids, *outs[1])
        assert a == b, (where, "decode_step", ids.tolist(), a, b)
        # whole buffers: the same slots and pairs on success, and a failed step leaves them untouched
        assert outs[0][0].tolist() == outs[1][0].tolist(), (where, "cow pairs", ids.tolist())
        assert outs[0][1].tolist() == outs[1][1].tolist(), (where, "slots", ids.tolist())
    elif op < 0.55:
        tokens = int(rng.integers(-1, cols * bs + 3))
        a, b = flat.allocate(*new, seq, tokens), ref.allocate(*old, seq, tokens)
        assert a == b, (where, "allocate", seq, tokens, a, b)
    elif op < 0.7:
        child = int(rng.integers(-1, rows + 1))
        a, b = flat.fork(*new, seq, child), ref.fork(*old, seq, child)
        assert a == b, (where, "fork", seq, child, a, b)
    elif op < 0.8:
        assert flat.free(*new, seq) == ref.free(*old, seq), (where, "free", seq)
    elif op < 0.9:
        a, b = flat.append(*new, seq), ref.append(*old, seq)
        assert a == b, (where, "append", seq, a, b)
    elif op < 0.95:
        assert flat.last_slot(*new, seq) == ref.last_slot(*old, seq), (where, "last_slot", seq)
        n = int(rng.integers(-1, num_blocks + 2))
        assert flat.can_allocate(*new, n) == ref.can_allocate(*old, n), (where, "can_allocate", n)
    else:
        ids = _ids(rng, lens, cols, bs)
        outs = [np.full(len(ids), -7, np.int64) for _ in range(2)]
        a, b = flat.lookup(*new, ids, outs[0]), ref.lookup(*old, ids, outs[1])
        assert a == b, (where, "lookup", ids.tolist(), a, b)
        assert outs[0].tolist() == outs[1].tolist(), (where, "lookup slots", ids.tolist())
    assert _hidden(new) == _hidden(old), (where, "hidden state")


def fuzz(cases: int, seed: int = 0) -> None:
    """``cases`` random operation sequences of :data:`OPS` operations each."""
    rng = np.random.default_rng(seed)
    for case in range(cases):
        rows, cols, bs = int(rng.integers(1, 9)), int(rng.integers(1, 6)), int(rng.choice([1, 2, 4]))
        num_blocks = int(rng.integers(1, rows * cols + 3))  # often tighter than the rows can use
        dims = (num_blocks, bs, rows, cols)
        new, old = _pair(*dims)
        for i in range(OPS):
            _step(rng, new, old, dims, f"seed {seed} case {case} {dims} op {i}")


def test_differential_fuzz() -> None:
    fuzz(CASES)


@pytest.mark.slow
@pytest.mark.skipif(not os.environ.get("KVB_FLAT_FUZZ_LONG"), reason="set KVB_FLAT_FUZZ_LONG=1 (about 4 min)")
def test_differential_fuzz_long() -> None:
    fuzz(SLOW_CASES, seed=1)


def test_rollback_restores_sharing() -> None:
    """Rows 0 and 1 share a last block; a step copies row 0 away, finds row 1's block unshared, then fails.
    After the rollback row 1 shares again, so its next append must copy (the prototype's bug)."""
    new, old = _pair(16, 4, 4, 4)
    for kernels, state in ((flat, new), (ref, old)):
        assert kernels.allocate(*state, 0, 2) == 0
        assert kernels.fork(*state, 0, 1) == 0
    cow, slot = np.zeros((3, 2), np.int64), np.zeros(3, np.int64)
    assert flat.decode_step(*new, np.array([0, 1, 3], np.int64), cow, slot) == (flat.E_INACTIVE, 2)
    assert _hidden(new) == _hidden(old)
    for ids in ([1], [0]):
        a = flat.decode_step(*new, np.array(ids, np.int64), cow, slot)
        b = ref.decode_step(*old, np.array(ids, np.int64), cow.copy(), slot.copy())
        assert a == b == (1 if ids == [1] else 0, 0)
        assert _hidden(new) == _hidden(old)


def test_stamp_wrap_keeps_shared_bits() -> None:
    """When the duplicate-detection stamp wraps, marks are reset but the shared bits survive."""
    new, old = _pair(16, 4, 4, 4)
    for kernels, state in ((flat, new), (ref, old)):
        kernels.allocate(*state, 0, 2)
        kernels.fork(*state, 0, 1)
    new[1][flat.STAMP] = flat.STAMP_LIMIT
    cow, slot = np.zeros((2, 2), np.int64), np.zeros(2, np.int64)
    ids = np.array([1, 0], np.int64)
    assert flat.decode_step(*new, ids, cow, slot) == ref.decode_step(*old, ids, cow.copy(), slot.copy()) == (1, 0)
    assert _hidden(new) == _hidden(old)
    assert flat.decode_step(*new, np.array([0, 0], np.int64), cow, slot) == (flat.E_DUPLICATE, 1)
