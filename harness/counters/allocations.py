"""Counting heap allocations (the article's rule 1) exactly: integer events of a region, never a difference
with a noisy baseline.

- ``memray``: allocation events of the calling thread (CPython's allocators and the C allocator family),
  recorded by Bloomberg's memray tracker; other threads' are left out. With ``within`` only the events whose
  Python stack holds a frame of the design's own files count (the harness's are not the design's), and the
  events memray's profile hook itself causes are left out (:func:`_tool_made`);
- ``nrt-stats``: Numba's own runtime counters (``alloc``), which see compiled-code allocations only.
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
    hit. Collects the young generations first (a full collection empties CPython's free lists, whose refills
    a region would then count); inside a region that already holds collection off, does nothing."""
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
    """Allocation events (memray) of the calling thread while calling ``fn`` ``repeat`` times; with ``within``,
    only those whose Python stack holds a frame of a file under one of those paths (a design's own code), less
    the events memray's profile hook causes. ``settle`` runs first, traced and uncounted: the traced call path
    fills the free lists it draws from, as an untraced warm-up fills the untraced path's."""
    with no_collection():
        return _count_allocations(fn, repeat, within, settle)


def _count_allocations(fn: Callable[[], object], repeat: int, within: tuple[str, ...],
                       settle: Callable[[], object] | None) -> int:
    import memray

    kinds = {a.value for a in memray.AllocatorType if a.name in _ALLOCATING}
    fd, path = tempfile.mkstemp(suffix=".memray")
    os.close(fd)
    os.unlink(path)  # memray refuses to overwrite
    try:
        with memray.Tracker(path, trace_python_allocators=True, native_traces=bool(within), follow_fork=False):
            marker = bytes(_MARKER_BYTES)
            if settle is not None:
                settle()
            start = bytes(_MARKER_BYTES + 8192)  # counting starts here
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
    """How many of ``records`` are made under ``within``'s files and not by memray's profile hook (each stack
    looked at once)."""
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


# Events that exist only while a profile function is set, as memray's is (CPython 3.11 runs unspecialised
# bytecode then): Numba's dispatcher builds a frame for the profiler (call_cfunc calls these directly), and a
# tuple or list unpacking makes an iterator where the specialised instruction makes none.
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


QUICKEN_CALLS = 10  # calls first, so that Python's specialising interpreter has settled on the call path


def count_both(fn: Callable[[], object], within: tuple[str, ...],
               settle: Callable[[], object] | None = None) -> tuple[int, int]:
    """memray events (see :func:`count_allocations`) and Numba runtime allocations of one call of ``fn``,
    counted together after ``settle``."""
    nrt = 0

    def counted() -> None:
        nonlocal nrt
        nrt = nrt_allocations(fn, 1)

    return count_allocations(counted, 1, within, settle), nrt


def region_allocations(advance: Callable[[int, int], object], lo: int, hi: int,
                       within: tuple[str, ...]) -> tuple[int, int]:
    """(memray events of ``within``'s files, Numba runtime allocations) of steps ``[lo + 1, hi)``: integers,
    nothing subtracted. ``advance(lo, hi)`` replays steps ``[lo, hi)`` of a manager already at step ``lo``;
    calls over no step settle the call path, and step ``lo``, traced and uncounted, the traced one."""
    for _ in range(QUICKEN_CALLS):
        advance(lo, lo)
    return count_both(lambda: advance(lo + 1, hi), within, settle=lambda: advance(lo, lo + 1))
