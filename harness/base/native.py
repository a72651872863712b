"""The native driver: timed replays of the C++ designs (``cpp-*``) inside C++. Design: docs/measurement.md#native."""

from __future__ import annotations

import ctypes
import weakref
from functools import cache
from pathlib import Path
from typing import NamedTuple

import numpy as np

from harness.base import clock
from harness.base.steptimes import KINDS
from impls.native import binding, toolchain

SOURCE = Path(__file__).with_name("native_replay.cpp")
LIB_NAME = "libkvb_replay.so"
LIBRARY_ENV = "KVB_NATIVE_REPLAY_LIBRARY"
ABI_VERSION = 1
_ALLOC, _FREE, _OTHER, _DECODE = range(4)
_I64, _P, _F64 = ctypes.c_int64, ctypes.c_void_p, ctypes.c_double
_SIGNATURES = {
    "kvb_replay_abi_version": (_I64, []),
    "kvb_have_tsc": (_I64, []),
    "kvb_ns_per_tick": (_F64, []),
    "kvb_empty_regions": (None, [_I64, _I64, _P]),
    "kvb_replay": (_I64, [_P, _P, _P, _P, _P, _I64, _P, _P, _I64, _I64, _I64, _I64, _I64, _P, _P, _I64, _P, _P, _P,
                          _I64, _P]),
}


class DesignOps(ctypes.Structure):
    """The design's per-call C functions the replay calls, by address (``DesignOps`` in native_replay.cpp)."""

    _fields_ = [(name, ctypes.c_void_p) for name in
                ("can_allocate", "allocate", "fork", "free", "decode_step", "lookup", "alloc_count")]




def kinds_prelude() -> str:
    """The timing columns (``steptimes.KINDS``) as C++ constants ``kvb::K_ALLOC`` and so on."""
    names = ", ".join(f"K_{kind.upper()} = {i}" for i, kind in enumerate(KINDS))
    return f"namespace kvb {{ enum : int {{ {names}, NKINDS = {len(KINDS)} }}; }}\n"


@cache
def build() -> toolchain.Build:
    """The replay library, built or found in the cache (``BuildError`` without a compiler)."""
    return toolchain.build(SOURCE, name=LIB_NAME, library_env=LIBRARY_ENV, prelude=kinds_prelude())


@cache
def lib() -> ctypes.CDLL:
    """The loaded replay library."""
    return toolchain.load(build().path, _SIGNATURES, "kvb_replay_abi_version", ABI_VERSION)


_OPS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def design_ops(mgr: binding.NativeBlockManager) -> DesignOps:
    """The functions the replay calls for ``mgr``, by address: those made for its kind of manager (no dispatch
    on the kind per call), and the allocation counter; found once per manager."""
    if mgr not in _OPS:
        _OPS[mgr] = DesignOps(*binding.kind_function_addresses(mgr), binding.function_address("kvb_alloc_count"))
    return _OPS[mgr]


def build_info() -> dict:
    """What a run's metadata records about the replay library."""
    try:
        b = build()
    except toolchain.BuildError as exc:
        return {"available": False, "reason": str(exc)}
    return {"available": True, "library": str(b.path), "digest": b.digest, "compiled_now": b.compiled,
            "compile_s": round(b.seconds, 3), "clock": "rdtsc" if tsc_usable() else "steady_clock"}


class NativeTrace(NamedTuple):
    """A trace's arrays in the dtypes C++ reads (no copy when they already are), built once per trace."""

    op: np.ndarray
    a0: np.ndarray
    a1: np.ndarray
    step_offsets: np.ndarray
    decode_offsets: np.ndarray
    max_batch: int

    @property
    def num_steps(self) -> int:
        return len(self.decode_offsets)


def prepare(trace) -> NativeTrace:
    """The arrays of a :class:`scenarios.trace.Trace` for :func:`replay`, read-only."""
    if isinstance(trace, NativeTrace):
        return trace
    so = np.ascontiguousarray(trace.step_offsets, dtype=np.int64)
    do = np.ascontiguousarray(trace.decode_offsets, dtype=np.int64)
    if len(so) != len(do) + 1:
        raise ValueError("step_offsets must hold one entry more than decode_offsets")
    running = so[1:] - do
    arrays = [np.array(trace.op, dtype=np.uint8), np.array(trace.a0, dtype=np.int32),
              np.array(trace.a1, dtype=np.int32), so.copy(), do.copy()]
    for a in arrays:
        a.setflags(write=False)
    return NativeTrace(*arrays, max(1, int(running.max(initial=0))))


class NativeReplayError(RuntimeError):
    """A native replay disagreed with the trace (a failed operation, or a can_allocate answer)."""


class NativeReplay(NamedTuple):
    """One native replay; the first five fields are those of :class:`harness.base.steptimes.StepTimes`."""

    ns: np.ndarray
    cows: np.ndarray
    step_ns: np.ndarray
    timed_regions_per_step: float
    clock: str
    allocs: np.ndarray


@cache
def tsc_usable() -> bool:
    """A constant-rate TSC that this build can read (:func:`harness.base.clock.tsc_usable`), once per process."""
    return clock.tsc_usable() and bool(lib().kvb_have_tsc())


@cache
def ns_per_tick() -> float:
    """TSC period in ns, calibrated in C++ (median of five 20 ms runs against ``CLOCK_MONOTONIC``)."""
    return float(lib().kvb_ns_per_tick())


def timer_overhead_ns(n: int = 200_000) -> float:
    """Median cost of an empty region timed with two reads of the replay's clock, in C++."""
    use_tsc = tsc_usable()
    out = np.zeros(n, dtype=np.int64)
    lib().kvb_empty_regions(n, int(use_tsc), out.ctypes.data)
    return float(np.median(out)) * (ns_per_tick() if use_tsc else 1.0)


def _slice(num_steps: int, lo: int, hi: int | None) -> tuple[int, int]:
    hi = num_steps if hi is None else int(hi)
    lo = int(lo)
    if not 0 <= lo <= hi <= num_steps:
        raise ValueError(f"step slice [{lo}, {hi}) is outside [0, {num_steps}]")
    return lo, hi


class Buffers(NamedTuple):
    """What a replay writes, for steps ``[0, steps)``: ticks per kind, CoW counts, allocations, scratch, status."""

    ticks: np.ndarray
    cows: np.ndarray
    allocs: np.ndarray
    cow_buf: np.ndarray
    slot_buf: np.ndarray
    status: np.ndarray


def buffers(t: NativeTrace, steps: int) -> Buffers:
    """Zeroed :class:`Buffers` for ``steps`` steps of ``t``."""
    return Buffers(np.zeros((steps, len(KINDS)), dtype=np.int64), np.zeros(steps, dtype=np.int64),
                   np.zeros(steps, dtype=np.int64), np.zeros((t.max_batch, 2), dtype=np.int64),
                   np.zeros(t.max_batch, dtype=np.int64), np.zeros(3, dtype=np.int64))


def _run(mgr: binding.NativeBlockManager, t: NativeTrace, lo: int, hi: int, detail: bool, b: Buffers,
         at: int) -> None:
    """Steps ``[lo, hi)`` inside C++, their figures written to rows ``at`` onward of ``b``."""
    k = b.ticks.itemsize
    lib().kvb_replay(ctypes.byref(design_ops(mgr)), mgr._h, t.op.ctypes.data, t.a0.ctypes.data, t.a1.ctypes.data,
                     len(t.op), t.step_offsets.ctypes.data, t.decode_offsets.ctypes.data, t.num_steps, lo, hi,
                     int(bool(detail)), int(tsc_usable()), b.cow_buf.ctypes.data, b.slot_buf.ctypes.data,
                     t.max_batch, b.ticks.ctypes.data + at * len(KINDS) * k, b.cows.ctypes.data + at * k,
                     b.allocs.ctypes.data + at * k, len(b.cows) - at, b.status.ctypes.data)
    if b.status[0]:
        raise NativeReplayError(f"native replay failed at step {b.status[1]}, op {b.status[2]}: status "
                                f"{b.status[0]}")


def replay_untimed(mgr: binding.NativeBlockManager, t: NativeTrace, lo: int, hi: int, b: Buffers) -> None:
    """Steps ``[lo, hi)`` of ``t`` (:func:`prepare`'s result) inside C++, untimed: their figures go to rows
    ``[lo, hi)`` of ``b`` (made once for every step of the trace), and no array is made per call."""
    if not isinstance(mgr, binding.NativeBlockManager):
        raise TypeError(f"replay needs a native manager, got {type(mgr).__name__}")
    lo, hi = _slice(min(t.num_steps, len(b.cows)), lo, hi)
    _run(mgr, t, lo, hi, False, b, lo)


def replay(mgr: binding.NativeBlockManager, trace, detail: bool = False, lo: int = 0,
           hi: int | None = None) -> NativeReplay:
    """Replay steps ``[lo, hi)`` of ``trace`` (a Trace or :func:`prepare`'s result) on ``mgr`` inside C++."""
    if not isinstance(mgr, binding.NativeBlockManager):
        raise TypeError(f"replay needs a native manager, got {type(mgr).__name__}")
    t = prepare(trace)
    lo, hi = _slice(t.num_steps, lo, hi)
    steps, use_tsc = hi - lo, tsc_usable()
    b = buffers(t, steps)
    _run(mgr, t, lo, hi, detail, b, 0)
    ns = b.ticks * (ns_per_tick() if use_tsc else 1.0)
    if detail:
        step_ns = ns[:, _ALLOC] + ns[:, _FREE] + ns[:, _OTHER] + ns[:, _DECODE]
        pool_ops = t.decode_offsets[lo:hi] - t.step_offsets[lo:hi]
        regions = float(pool_ops.mean()) + 1 if steps else 1.0
    else:
        step_ns, regions = ns[:, _DECODE].copy(), 1.0
    return NativeReplay(ns, b.cows, step_ns, regions, "rdtsc" if use_tsc else "steady_clock", b.allocs)
