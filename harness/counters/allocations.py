"""Heap allocations (rule 1) counted exactly: integer events of a region. Design: docs/measurement.md#allocations."""

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


# memray numbers threads itself: one allocation of this unique size, made first, names the caller's.
_MARKER_BYTES = 7_654_321


@contextlib.contextmanager
def no_collection() -> Iterator[None]:
    """No garbage collection inside a counted region: a collection runs the finalizers of earlier garbage (a native
    manager's ``__del__`` makes a ctypes call), whose allocations would land in whichever region it hit."""
    if not gc.isenabled():
        yield
        return
    gc.collect(1)
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def count_allocations(fn: Callable[[], object], repeat: int, within: tuple[str, ...] = (),
                      settle: Callable[[], object] | None = None) -> int:
    """memray allocation events of the calling thread over ``repeat`` calls of ``fn`` (``within``: a design's own)."""
    with no_collection():
        return _count_allocations(fn, repeat, within, settle)


def _count_allocations(fn: Callable[[], object], repeat: int, within: tuple[str, ...],
                       settle: Callable[[], object] | None) -> int:
    import memray

    kinds = {a.value for a in memray.AllocatorType if a.name in _ALLOCATING}
    fd, path = tempfile.mkstemp(suffix=".memray")
    os.close(fd)
    os.unlink(path)
    try:
        with memray.Tracker(path, trace_python_allocators=True, native_traces=bool(within), follow_fork=False):
            marker = bytes(_MARKER_BYTES)
            if settle is not None:
                settle()
            start = bytes(_MARKER_BYTES + 8192)
            for _ in range(repeat):
                fn()
        del marker, start
        records = list(memray.FileReader(path).get_allocation_records())
        marks = [i for i, rec in enumerate(records) if _MARKER_BYTES <= rec.size < _MARKER_BYTES + 4096]
        starts = [i for i, rec in enumerate(records) if _MARKER_BYTES + 8192 <= rec.size < _MARKER_BYTES + 12288]
        if len(marks) != 1 or len(starts) != 1:
            raise RuntimeError(f"memray: expected one marker of each kind, found {len(marks)} and {len(starts)}")
        tid = records[marks[0]].tid
        mine = [rec for rec in records[starts[0] + 1:] if rec.tid == tid and int(rec.allocator) in kinds]
        if not within:
            return len(mine)
        return _designs(mine, within)
    finally:
        if os.path.exists(path):
            os.unlink(path)


def _designs(records: list, within: tuple[str, ...]) -> int:
    """How many of ``records`` are made under ``within``'s files and not by memray's profile hook."""
    made: dict[int, bool] = {}
    tool: dict[tuple[int, int], bool] = {}
    count = 0
    for rec in records:
        if rec.stack_id not in made:
            made[rec.stack_id] = _made_within(rec, within)
        key = (rec.native_stack_id, rec.native_segment_generation)
        if made[rec.stack_id] and key not in tool:
            tool[key] = _tool_made(rec)
        count += made[rec.stack_id] and not tool[key]
    return count


def _made_within(record, within: tuple[str, ...]) -> bool:
    """Whether ``record``'s Python stack holds a frame of a file under ``within``."""
    return any(frame[1].startswith(within) for frame in record.stack_trace(max_stacks=256))


# Events that exist only while a profile function (memray's) is set: not the design's.
_PROFILER_CALLS = {"call_cfunc": ("PyFrame_New", "PyObject_GetAttrString", "PyDict_SetItemString"),
                   "unpack_iterable": ("PyObject_GetIter",)}
_UNPACKED_ITERATORS = ("tuple_iter", "list_iter")


def _tool_made(record) -> bool:
    """Whether ``record`` is an event memray's profile hook causes (see :data:`_PROFILER_CALLS`)."""
    names = [frame[0] for frame in record.native_stack_trace(max_stacks=64)]
    for i, name in enumerate(names[1:], start=1):
        if name in _PROFILER_CALLS and names[i - 1] in _PROFILER_CALLS[name]:
            return name == "call_cfunc" or any(n in _UNPACKED_ITERATORS for n in names[:i])
    return False


def nrt_allocations(fn: Callable[[], object], repeat: int) -> int:
    """Numba runtime ``alloc`` events while calling ``fn`` ``repeat`` times (stats switched on here)."""
    from numba.core.runtime import _nrt_python, rtsys

    _nrt_python.memsys_enable_stats()
    with no_collection():
        before = rtsys.get_allocation_stats().alloc
        for _ in range(repeat):
            fn()
        return rtsys.get_allocation_stats().alloc - before


QUICKEN_CALLS = 10


def count_both(fn: Callable[[], object], within: tuple[str, ...],
               settle: Callable[[], object] | None = None) -> tuple[int, int]:
    """memray events and Numba runtime allocations of one call of ``fn``, counted together after ``settle``."""
    nrt = 0

    def counted() -> None:
        nonlocal nrt
        nrt = nrt_allocations(fn, 1)

    return count_allocations(counted, 1, within, settle), nrt


def region_allocations(advance: Callable[[int, int], object], lo: int, hi: int,
                       within: tuple[str, ...]) -> tuple[int, int]:
    """(memray events of ``within``'s files, Numba runtime allocations) of steps ``[lo + 1, hi)``: integers, nothing
    subtracted."""
    for _ in range(QUICKEN_CALLS):
        advance(lo, lo)
    return count_both(lambda: advance(lo + 1, hi), within, settle=lambda: advance(lo, lo + 1))
