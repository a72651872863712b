"""A cell's allocation figures: exact integer counts of the design's own allocations, by the loop that replays it."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import impls
from harness.base.drivers import Prepared, is_native, native_arrays
from harness.counters.allocations import count_allocations, nrt_allocations, region_allocations
from harness.counters.floor_call import floor_call
from harness.studies.paced import step_arguments
from impls.core.compiled import CompiledBlockManager, empty_step_kernel

Advance = Callable[[int, int], object]
_FLOOR_FILES = (os.path.abspath(sys.modules[floor_call.__module__].__file__),)


@dataclass(frozen=True)
class AllocFigure:
    """``events`` counted over ``steps`` steps by ``source``; ``per_step`` is their quotient."""

    metric: str
    events: int
    steps: int
    source: str
    how: str
    status: str = "ok"

    @property
    def per_step(self) -> float:
        return self.events / self.steps if self.steps else 0.0


def alloc_kind(cls: type, regime: str) -> str:
    """The loop that replays a cell for its allocation counts: ``python``, ``compiled`` or ``native``."""
    if regime == "batched" and is_native(cls):
        return "native"
    if regime == "batched" and getattr(cls, "kernels", None) is not None:
        return "compiled"
    return "python"


def design_files(cls: type) -> tuple[str, ...]:
    """Where a design's own code lives: the ``impls`` package and a plug-in's own module file (``()``: unknown)."""
    module = getattr(sys.modules.get(cls.__module__), "__file__", None)
    if not module:
        return ()
    return tuple(sorted({os.path.dirname(os.path.abspath(impls.__file__)) + os.sep, os.path.abspath(module)}))


def cell_allocations(kind: str, regime: str, prep: Prepared, mgr, advance: Advance, lo: int, hi: int
                     ) -> list[AllocFigure]:
    """The figures of steps ``[lo, hi)`` of ``mgr`` (already at step ``lo``), replayed by ``advance``."""
    steps = hi - lo
    if kind == "native":
        return _native(prep, mgr, lo, hi)
    if kind == "compiled":
        nrt, call = _compiled(advance, lo, hi)
        how = (f"steps {lo}-{hi}: Numba runtime allocations of the compiled replay, less the {call} of the same "
               "call over no step (its array arguments' wrappers, the harness's)")
        return [AllocFigure(m, nrt, steps, "nrt-stats", how) for m in ("allocs_per_step", "nrt_allocs_per_step")]
    files = design_files(type(mgr))
    why = "" if files else "the design's module has no file, so its events cannot be told from the harness's"
    if steps < 2:
        why = "needs two steps or more (the first settles the traced call path)"
    if why:
        return [AllocFigure(m, 0, 0, "memray", why, "unavailable") for m in ("allocs_per_step", "nrt_allocs_per_step")]
    events, nrt = region_allocations(advance, lo, hi, files)
    lo, steps = lo + 1, steps - 1
    figures = [AllocFigure("allocs_per_step", events, steps, "memray",
                           f"steps {lo}-{hi}: events under a frame of the design's code (the harness's, the "
                           "interpreter's and memray's own left out)"),
               AllocFigure("nrt_allocs_per_step", nrt, steps, "nrt-stats", f"steps {lo}-{hi}: every compiled call")]
    if regime == "step" and isinstance(mgr, CompiledBlockManager):
        floor = step_floor(prep, mgr, lo, hi)
        figures += [AllocFigure("allocs_floor_per_step", floor, steps, "memray",
                                "a compiled function that does nothing, called once per step with step()'s "
                                "arguments (the crossing into compiled code)"),
                    AllocFigure("allocs_above_floor_per_step", events - floor, steps, "memray",
                                "the design's step() events less the floor's, over the same steps")]
    return figures


def _compiled(advance: Advance, lo: int, hi: int) -> tuple[int, int]:
    """(Numba runtime allocations of the kernels over ``[lo, hi)``, those of the replay call itself)."""
    for _ in range(3):
        advance(lo, lo)
    region = nrt_allocations(lambda: advance(lo, hi), 1)
    call = nrt_allocations(lambda: advance(hi, hi), 1)
    return region - call, call


def _native(prep: Prepared, mgr, lo: int, hi: int) -> list[AllocFigure]:
    from harness.base import native

    allocs = None

    def replay() -> None:
        nonlocal allocs
        allocs = native.replay(mgr, native_arrays(prep), False, lo, hi).allocs

    nrt = nrt_allocations(replay, 1)
    return [AllocFigure("allocs_per_step", int(allocs.sum()), hi - lo, "counting allocator",
                        f"steps {lo}-{hi}: operator new calls of the C++ containers, counted in the library"),
            AllocFigure("nrt_allocs_per_step", nrt, hi - lo, "nrt-stats", f"steps {lo}-{hi}: nothing Numba compiled")]


def step_floor(prep: Prepared, mgr: CompiledBlockManager, lo: int, hi: int) -> int:
    """memray events of :func:`harness.counters.floor_call.floor_call` once per step ``[lo, hi)``: a compiled function
    that does nothing, entered as ``mgr.step`` enters its kernel (bound to the state, same arguments)."""
    args, buffers, _ = step_arguments(prep)
    limits = (mgr.max_seqs, mgr.max_tokens, mgr.num_blocks)
    call = partial(empty_step_kernel(mgr.state), *mgr.state)

    def run(a: int, b: int) -> None:
        for s in range(a, b):
            floor_call(call, *args[s], *buffers, *limits)

    for _ in range(3):
        run(lo, hi)
    return count_allocations(lambda: run(lo, hi), 1, _FLOOR_FILES, settle=lambda: run(lo - 1, lo))
