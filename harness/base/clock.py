"""Clocks for the timed replays, and what they cost. Design: docs/measurement.md#clock."""

from __future__ import annotations

import platform
import statistics
import time
from functools import cache
from pathlib import Path
from types import BuiltinFunctionType

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

perf_ns = time.perf_counter_ns  # the drivers' clock, bound before any design is imported (module docstring)


@intrinsic
def _readcyclecounter(typingctx):
    def codegen(context, builder, signature, args):
        fnty = ir.FunctionType(ir.IntType(64), [])
        fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.readcyclecounter")
        return builder.call(fn, [])

    return types.int64(), codegen


@njit(cache=True)
def ticks():
    """Time-stamp counter ticks (callable from compiled code)."""
    return _readcyclecounter()


@njit(cache=True)
def _empty_regions(n, out):
    for i in range(n):
        t0 = ticks()
        t1 = ticks()
        out[i] = t1 - t0


@cache
def tsc_usable() -> bool:
    """A constant-rate TSC on x86-64 Linux (read once per process: the answer cannot change, and reading /proc/cpuinfo
    at every replay call would put that read inside what the gate counts)."""
    if platform.machine() not in ("x86_64", "AMD64"):
        return False
    try:
        return "constant_tsc" in Path("/proc/cpuinfo").read_text()
    except OSError:
        return False


@cache
def ns_per_tick() -> float:
    """TSC period in nanoseconds: median of five 20 ms calibrations against ``perf_counter_ns``."""
    ticks()
    rates = []
    for _ in range(5):
        c0, t0 = ticks(), perf_ns()
        while perf_ns() - t0 < 20_000_000:
            pass
        c1, t1 = ticks(), perf_ns()
        rates.append((t1 - t0) / (c1 - c0))
    return statistics.median(rates)


def python_timer_overhead_ns(n: int = 200_000) -> float:
    """Median cost of an empty region timed with two ``perf_counter_ns`` reads (what one timed call adds)."""
    perf = perf_ns
    samples = []
    for _ in range(n):
        t0 = perf()
        t1 = perf()
        samples.append(t1 - t0)
    return float(statistics.median(samples))


def compiled_timer_overhead_ns(n: int = 200_000) -> float:
    """Median cost of an empty region timed with two TSC reads inside compiled code."""
    out = np.empty(n, dtype=np.int64)
    _empty_regions(n, out)
    return float(np.median(out)) * ns_per_tick()


# Every name the timed loops read a clock or a clock's scale through: sealed in a worker before any design is imported.
TIMING_NAMES = (("harness.base.clock", ("perf_ns", "ticks", "ns_per_tick")),
                ("harness.base.oncpu", ("thread_ns",)),
                ("harness.base.drivers", ("perf_ns", "thread_ns", "ticks", "ns_per_tick", "run_interpreted",
                                          "run_whole_steps", "run_compiled", "run_native")),
                ("harness.base.interleave", ("perf_ns", "thread_ns", "read_slice")),
                ("time", ("perf_counter_ns", "thread_time_ns")))
_SEALED: dict[tuple[str, str], int] = {}
_BUILTINS = {"perf_counter_ns": time.perf_counter_ns, "thread_time_ns": time.thread_time_ns}


def seal() -> None:
    """Record what every timing name is bound to now (a worker, before it imports a design; once a process)."""
    import importlib

    if not _SEALED:
        _SEALED.update({(m, n): id(getattr(importlib.import_module(m), n, None)) for m, names in TIMING_NAMES
                        for n in names})


def changed() -> str:
    """The first timing name bound to something else than when :func:`seal` ran ("" when none, or unsealed)."""
    import sys

    for (module, name), ident in _SEALED.items():
        if id(getattr(sys.modules.get(module), name, None)) != ident:
            return f"{module}.{name}"
    return ""


def genuine(fn: object, name: str) -> bool:
    """Whether ``fn`` is ``time``'s own builtin ``name`` (no Python object passes for one)."""
    owner = getattr(fn, "__self__", None)
    return (fn is _BUILTINS.get(name) and type(fn) is BuiltinFunctionType and getattr(fn, "__name__", "") == name
            and getattr(owner, "__name__", "") == "time")
