"""The hashing study: each engine's algorithm as documented, the trace's hash count, unavailable libraries."""

from __future__ import annotations

import hashlib
import math
import pickle

import numpy as np
import pytest

from harness.studies import block_hashing as hashing
from scenarios import generate
from scenarios.trace import ALLOCATE, APPEND, FORK, FREE, Trace


def test_vllm_sha256_chains_pickled_parent_tokens_and_extra_keys() -> None:
    first, hash_block = hashing._sha256()
    seed = hashlib.sha256(pickle.dumps("vllm-none-hash", protocol=pickle.HIGHEST_PROTOCOL)).digest()
    assert first == seed
    h1 = hash_block(first, list(range(16)))
    assert h1 == hashlib.sha256(pickle.dumps((seed, tuple(range(16)), None), protocol=5)).digest()
    assert hash_block(h1, list(range(16))) != h1  # the parent is in the hash: same tokens, another block


class _FakeTrace:
    def __init__(self, ops: list[tuple[int, int, int]], running: list[int]) -> None:
        self.op, self.a0, self.a1 = (np.array(col) for col in zip(*ops, strict=True))
        self.config = {"block_size": 4, "max_seqs": 4}
        self._running = np.array(running)

    def running_per_step(self) -> np.ndarray:
        return self._running

    op_lengths = Trace.op_lengths  # the trace's one walk of row lengths, on these arrays


def test_hashes_per_seq_step_counts_prompt_blocks_fork_prompts_and_filled_blocks() -> None:
    ops = [(ALLOCATE, 0, 9), (FORK, 0, 1)]  # 2 full prompt blocks, and the child's 2
    ops += [(APPEND, 0, 0), (APPEND, 1, 0)] * 3  # both reach 12 tokens: one more full block each
    ops += [(FREE, 0, 0), (ALLOCATE, 0, 3)]  # a prompt of no full block
    trace = _FakeTrace(ops, [2, 2, 2])
    assert hashing.hashes_per_seq_step(trace) == pytest.approx((2 + 2 + 2) / 6)


def test_missing_libraries_are_reported_unavailable_not_substituted(monkeypatch) -> None:
    def missing():
        raise ImportError("no", name="xxhash")

    fake = (hashing.Hasher("x", "e", "w", missing), hashing.HASHERS[3])
    monkeypatch.setattr(hashing, "HASHERS", fake)
    monkeypatch.setattr(hashing, "_CACHE", {})
    rows = hashing.hashing_rows(generate("paper", steps=3), "paper", chain=20, runs=2)
    by = {(r.impl, r.metric): r for r in rows}
    assert by["x", "hash_ns_per_block"].status == "unavailable" and "xxhash" in by["x", "hash_ns_per_block"].how
    ok = by["python-hash", "hash_ns_per_block"]
    assert ok.status == "ok" and ok.reps == 2 and ok.ci_low <= ok.value <= ok.ci_high
    per_step = by["python-hash", "hash_ns_per_seq_step"].value
    assert math.isclose(per_step, ok.value * hashing.hashes_per_seq_step(generate("paper", steps=3)))
