"""A memory latency probe: ns per dependent load over random cycles from L1 to memory. Design:
docs/measurement.md#host."""

from __future__ import annotations

import mmap

import numpy as np
from numba import njit

from harness.base.clock import perf_ns
from harness.base.oncpu import preempted, thread_ns

SIZES_KIB = (16, 256, 4 << 10, 64 << 10)  # L1, L2, L3 and memory on the machines we run on
LOADS = 50_000  # per walk: well under a scheduler's time slice, even from memory
WALKS = 7
LINE = 64
SMALL_PAGES = hasattr(mmap, "MADV_NOHUGEPAGE")  # where the kernel cannot be told, its own page size stands
METHOD = "walks going on where the last stopped, on " + ("4 KiB pages" if SMALL_PAGES else "the pages granted")


@njit(cache=True)
def _walk(chain, loads, at):
    for _ in range(loads):
        at = chain[at]
    return at


def small_pages(count: int) -> np.ndarray:
    """``count`` zeroed int64 slots on 4 KiB pages: NumPy asks for huge pages on large arrays, and whether the kernel
    grants them varies from call to call, which moved the probe more than the host did (docs/measurement.md#host)."""
    buffer = mmap.mmap(-1, count * 8)
    if SMALL_PAGES:
        buffer.madvise(mmap.MADV_NOHUGEPAGE)
    return np.frombuffer(buffer, dtype=np.int64)


def _chain(size_kib: int, seed: int = 0) -> np.ndarray:
    """A random cycle over one int64 slot per cache line of ``size_kib`` KiB (4 KiB pages)."""
    stride = LINE // 8
    n = max(2, size_kib * 1024 // LINE)
    order = np.random.default_rng(seed).permutation(n)
    chain = small_pages(n * stride)
    chain[order * stride] = np.roll(order, -1) * stride
    return chain


def probe(sizes_kib: tuple[int, ...] = SIZES_KIB) -> dict[str, float]:
    """ns per dependent load by size (``"16K"``: ...), the median of the walks run whole (``oncpu``). Each walk
    goes on where the last stopped, so a cycle larger than the caches is read from memory, not re-read."""
    _walk(_chain(16), 10, 0)  # compiled (or loaded from the cache) outside the timed walks
    out = {}
    for size in sizes_kib:
        chain = _chain(size)
        at = _walk(chain, min(LOADS, len(chain)), 0)  # the set in the caches it fits
        walls, cpus = np.zeros(WALKS), np.zeros(WALKS)
        for i in range(WALKS):
            c0 = thread_ns()
            t0 = perf_ns()
            at = _walk(chain, LOADS, at)
            walls[i] = perf_ns() - t0
            cpus[i] = thread_ns() - c0
        whole = ~preempted(walls, np.minimum(1.0, cpus / walls))
        out[f"{size}K"] = round(float(np.median(walls[whole] if whole.any() else walls)) / LOADS, 2)
    return out
