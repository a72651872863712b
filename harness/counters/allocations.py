"""Counting heap allocations (the article's rule 1) without guessing.

Two instruments, each labelled where its figures appear:

- ``memray``: every allocation event of the calling thread (CPython's object allocator and the C allocator
  family, which Numba's runtime and typed containers use), recorded by Bloomberg's memray tracker; other
  threads (a progress bar's monitor, torch's pool) record too, and are left out;
- ``nrt-stats``: Numba's own runtime counters (``alloc``), which see compiled-code allocations only.

Both count events in a region; callers isolate the work from fixed costs by subtracting a baseline region
that makes the same calls with no work (for example a decode step over zero sequences).
"""

from __future__ import annotations

import contextlib
import gc
import os
import tempfile
from collections.abc import Callable, Iterator

_ALLOCATING = {
    "PYMALLOC_MALLOC", "PYMALLOC_CALLOC", "PYMALLOC_REALLOC", "MALLOC", "REALLOC", "CALLOC",
    "POSIX_MEMALIGN", "ALIGNED_ALLOC", "MEMALIGN", "VALLOC", "PVALLOC", "MMAP",
}


# memray numbers threads by itself; one allocation of this size, made first in the tracked region, tells which
# number is the calling thread's (no other allocation of the process has this size).
_MARKER_BYTES = 7_654_321


@contextlib.contextmanager
def no_collection() -> Iterator[None]:
    """No garbage collection inside a counted region: a collection runs the finalizers of earlier garbage (a
    native manager's ``__del__`` makes a ctypes call), whose allocations would land in whichever region it
    hit. Collects first; inside a region that already holds collection off, does nothing (a collection there
    would itself be counted)."""
    if not gc.isenabled():
        yield
        return
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def count_allocations(fn: Callable[[], object], repeat: int) -> int:
    """Allocation events (memray) of the calling thread while calling ``fn`` ``repeat`` times."""
    with no_collection():
        return _count_allocations(fn, repeat)


def _count_allocations(fn: Callable[[], object], repeat: int) -> int:
    import memray

    kinds = {a.value for a in memray.AllocatorType if a.name in _ALLOCATING}
    fd, path = tempfile.mkstemp(suffix=".memray")
    os.close(fd)
    os.unlink(path)  # memray refuses to overwrite
    try:
        with memray.Tracker(path, trace_python_allocators=True, native_traces=False, follow_fork=False):
            marker = bytes(_MARKER_BYTES)
            for _ in range(repeat):
                fn()
        del marker
        records = list(memray.FileReader(path).get_allocation_records())
        marks = [rec for rec in records if _MARKER_BYTES <= rec.size < _MARKER_BYTES + 4096]
        if len(marks) != 1:
            raise RuntimeError(f"memray: expected one marker allocation, found {len(marks)}")
        mine = marks[0].tid
        return sum(1 for rec in records if rec.tid == mine and int(rec.allocator) in kinds) - 1
    finally:
        if os.path.exists(path):
            os.unlink(path)


def nrt_allocations(fn: Callable[[], object], repeat: int) -> int:
    """Numba runtime ``alloc`` events while calling ``fn`` ``repeat`` times (stats switched on here)."""
    from numba.core.runtime import _nrt_python, rtsys

    _nrt_python.memsys_enable_stats()
    with no_collection():
        before = rtsys.get_allocation_stats().alloc
        for _ in range(repeat):
            fn()
        return rtsys.get_allocation_stats().alloc - before


QUICKEN_CALLS = 10  # empty calls first, so that Python's specialising interpreter has settled on the call path


def count_both(fn: Callable[[], object]) -> tuple[int, int]:
    """memray events and Numba runtime allocations of one call of ``fn``, counted together."""
    nrt = 0

    def counted() -> None:
        nonlocal nrt
        nrt = nrt_allocations(fn, 1)

    return count_allocations(counted, 1), nrt


def allocations_per_step(advance: Callable[[int, int], object], lo: int, hi: int) -> tuple[float, float]:
    """Allocations per step (memray, Numba runtime) of ``advance(lo, hi)``, less the same call over no step.

    The one protocol every allocation figure uses: ``advance(lo, hi)`` replays steps ``[lo, hi)`` of a
    manager already brought to step ``lo``; empty calls settle the call path, one more pays the counters'
    own first-use allocations, then the region and an empty region are counted, each in one pass of both
    counters. The difference is what the steps themselves allocate.
    """
    for _ in range(QUICKEN_CALLS):
        advance(lo, lo)
    with no_collection():  # one collection for the three regions
        count_both(lambda: advance(lo, lo))
        region = count_both(lambda: advance(lo, hi))
        empty = count_both(lambda: advance(hi, hi))
    steps = max(1, hi - lo)
    return (region[0] - empty[0]) / steps, (region[1] - empty[1]) / steps
