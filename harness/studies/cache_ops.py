"""Prefix-cache operations one at a time: cached lookup, insert and eviction. Design: docs/measurement.md#cache_ops."""

from __future__ import annotations

import gc
import time
import tracemalloc
from collections.abc import Callable

import numpy as np

from harness.base.rows import Row
from harness.base.stats import median_estimate
from impls.contract import supports_prefix_caching

CHAIN = 32
SAMPLES = 200
SOURCE = "perf_counter_ns"
BLOCK_SIZE = 16
MAX_SEQS = 4


class CacheOpsError(RuntimeError):
    """A design answered an admission differently from the contract (wrong hit count)."""


def _chain(start: int, n: int = CHAIN) -> np.ndarray:
    """``n`` distinct non-zero hashes from ``start`` (the study needs distinct chains, not realistic ones)."""
    return np.arange(start, start + n, dtype=np.uint64)


def _new(cls: type, num_blocks: int):
    return cls(num_blocks=num_blocks, block_size=BLOCK_SIZE, max_seqs=MAX_SEQS, max_blocks_per_seq=CHAIN)


def _timed_admissions(mgr, chains: Callable[[int], np.ndarray], expect_hits: int, samples: int) -> list[float]:
    """ns per block of ``samples`` admissions of ``chains(i)`` into row 1, each freed (untimed) afterwards."""
    perf = time.perf_counter_ns
    out = []
    tokens = CHAIN * BLOCK_SIZE
    for i in range(samples):
        chain = chains(i)
        t0 = perf()
        hit = mgr.allocate_cached(1, tokens, chain)
        t1 = perf()
        mgr.free(1)
        if hit != expect_hits * BLOCK_SIZE:
            raise CacheOpsError(f"{type(mgr).__name__}: admission {i} served {hit} tokens from the cache, "
                                f"the contract says {expect_hits * BLOCK_SIZE}")
        out.append((t1 - t0) / CHAIN)
    return out


def _pool(samples: int) -> int:
    """One pool size for every measure (the hash table's size, and so its cache footprint, must not differ between
    them): room for ``samples`` new chains without eviction, plus two."""
    return (samples + 2) * CHAIN


def _hit(cls: type, samples: int) -> list[float]:
    mgr = _new(cls, _pool(samples))
    chain = _chain(1)
    mgr.allocate_cached(0, CHAIN * BLOCK_SIZE, chain)
    return _timed_admissions(mgr, lambda i: chain, CHAIN, samples)


def _miss_insert(cls: type, samples: int) -> list[float]:
    mgr = _new(cls, _pool(samples))
    return _timed_admissions(mgr, lambda i: _chain(1 + i * CHAIN), 0, samples)


def _miss_evict(cls: type, samples: int) -> list[float]:
    mgr = _new(cls, _pool(samples))
    fill = _pool(samples) // CHAIN
    for k in range(fill):  # the whole pool cached and evictable: every fresh block below evicts one
        mgr.allocate_cached(1, CHAIN * BLOCK_SIZE, _chain(1 + k * CHAIN))
        mgr.free(1)
    return _timed_admissions(mgr, lambda i: _chain(1 + (fill + i) * CHAIN), 0, samples)


def _plain(cls: type, samples: int) -> list[float]:
    mgr = _new(cls, _pool(samples))
    perf = time.perf_counter_ns
    out = []
    for _ in range(samples):
        t0 = perf()
        mgr.allocate(1, CHAIN * BLOCK_SIZE)
        t1 = perf()
        mgr.free(1)
        out.append((t1 - t0) / CHAIN)
    return out


def bytes_per_cached_block(cls: type, num_blocks: int = 64 * CHAIN) -> float:
    """Traced bytes of a manager whose whole pool is cached, per block (construction included)."""
    gc.collect()
    tracemalloc.start()
    try:
        mgr = _new(cls, num_blocks)
        for k in range(num_blocks // CHAIN):
            mgr.allocate_cached(1, CHAIN * BLOCK_SIZE, _chain(1 + k * CHAIN))
            mgr.free(1)
        if mgr.num_cached_blocks() != num_blocks:
            raise CacheOpsError(f"{cls.__name__}: {mgr.num_cached_blocks()} blocks cached, expected {num_blocks}")
        size, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return size / num_blocks


MEASURES = {
    "cache_hit_ns": (_hit, "allocate_cached of a chain whose blocks are all cached and in use"),
    "cache_miss_insert_ns": (_miss_insert, "allocate_cached of a new chain: never-cached fresh blocks, inserted"),
    "cache_miss_evict_ns": (_miss_evict, "allocate_cached of a new chain: every fresh block evicts a cached one"),
    "plain_allocate_ns": (_plain, "plain allocate of as many blocks (no lookup, no insert)"),
}
DERIVED = {
    "cache_insert_ns": ("cache_miss_insert_ns", "plain_allocate_ns"),
    "cache_evict_ns": ("cache_miss_evict_ns", "cache_miss_insert_ns"),
}


def cache_ops_rows(cls: type, impl: str, scenario: str, samples: int = SAMPLES) -> list[Row]:
    """The study's rows for one caching implementation (``impl`` its registry name)."""
    if not supports_prefix_caching(cls):
        raise CacheOpsError(f"{impl} does not implement prefix caching")
    cls_warm = _new(cls, 2 * CHAIN)
    cls_warm.allocate_cached(0, CHAIN * BLOCK_SIZE, _chain(1))
    cls_warm.free(0)
    rows, medians = [], {}
    for metric, (measure, what) in MEASURES.items():
        est = median_estimate(np.array(measure(cls, samples)))
        medians[metric] = est.value
        rows.append(Row(scenario, impl, "per-call", metric, est.value, "ns/block", SOURCE,
                        how=f"{what}; chain of {CHAIN} blocks; median of {samples} admissions",
                        reps=samples, ci_low=est.low, ci_high=est.high))
    for metric, (a, b) in DERIVED.items():
        rows.append(Row(scenario, impl, "per-call", metric, medians[a] - medians[b], "ns/block", "derived",
                        how=f"median {a} - median {b}"))
    rows.append(Row(scenario, impl, "per-call", "cache_bytes_per_block", bytes_per_cached_block(cls), "B/block",
                    "tracemalloc", how=f"traced memory of a manager whose {64 * CHAIN} blocks are all cached, "
                    "construction included, per block"))
    return rows
