"""Replay regions of a trace: the call paths that callgrind counts and the allocation gate counts.
Design: docs/measurement.md#regions."""

from __future__ import annotations

import sys

if __name__ == "__main__":
    # --layout N > 0: padding before any design's module loads moves later objects (docs/measurement.md#heap-layouts)
    _AT = sys.argv.index("--layout") + 1 if "--layout" in sys.argv[:-1] else 0
    _LAYOUT = int(sys.argv[_AT]) if _AT and sys.argv[_AT].isdigit() and len(sys.argv[_AT]) < 4 else 0
    _PADDING = [str(i) * (1 + (i * _LAYOUT) % 47) for i in range(97 * _LAYOUT)]
    from impls.registry import RECORDS

    # torch is slow to import under valgrind: blocked unless a cell needs it (impls lists it unavailable).
    if {r.name for r in RECORDS if "torch" in r.needs}.isdisjoint(sys.argv):
        sys.modules["torch"] = None

import argparse
import ctypes
import gc
from collections.abc import Callable
from pathlib import Path

import numpy as np

from harness.base.args import count
from harness.base.drivers import (
    Prepared,
    compiled_step_runner,
    driver_for,
    is_native,
    native_step_runner,
    step_runner,
)
from harness.base.files import write_json
from harness.base.replay import REGIMES, ReplayError
from harness.counters import symbols
from harness.counters.allocations import QUICKEN_CALLS
from impls import REGISTRY
from impls.registry import load_plugin
from scenarios import load

Advance = Callable[[int, int], None]

def prepare_cell(prep: Prepared, impl: str, regime: str, cls: type | None = None
                 ) -> tuple[object, Advance, np.ndarray]:
    """A fresh manager for the trace's config, its ``advance(lo, hi)``, and the per-step CoW counts it fills."""
    if regime not in REGIMES:
        raise ValueError(f"unknown regime {regime!r}; choose from {REGIMES}")
    if cls is None:
        cls = REGISTRY[impl] if impl in REGISTRY else load_plugin(impl)
    mgr = cls(**prep.trace.config)
    cows = np.full(prep.num_steps, -1, dtype=np.int64)
    if regime == "batched" and is_native(cls):
        return mgr, native_step_runner(prep, mgr, cows), cows
    if regime == "batched" and getattr(cls, "kernels", None) is not None:
        return mgr, compiled_step_runner(prep, mgr, driver_for(cls.kernels, prep), cows), cows
    return mgr, step_runner(prep, mgr, regime, cows), cows


def check_cows(prep: Prepared, cows: np.ndarray, lo: int, hi: int, label: str) -> None:
    """The copy-on-writes reported for steps ``[lo, hi)`` must be the trace's."""
    expected = prep.trace.step_cows[lo:hi]
    bad = np.flatnonzero(cows[lo:hi] != expected)
    if bad.size:
        s = lo + int(bad[0])
        raise ReplayError(f"{label}: step {s} reported {cows[s]} copy-on-writes, the trace expects {expected[s - lo]}")


class Regions:
    """The client requests of ``harness/valgrind_region.c`` (no-ops outside valgrind)."""

    def __init__(self, lib_path: str) -> None:
        lib = ctypes.CDLL(lib_path)
        lib.kvb_stop.argtypes = [ctypes.c_char_p]
        self.instrument, self._zero, self.stop = lib.kvb_instrument, lib.kvb_zero, lib.kvb_stop
        self.on_valgrind = bool(lib.kvb_on_valgrind())

    def zero(self, label: bytes = b"") -> None:
        self._zero()


class PerfRegions:
    """The same protocol for ``perf stat --control``: counting only in the region labelled ``wanted``."""

    on_valgrind = False

    def __init__(self, ctl: str, ack: str, wanted: str) -> None:
        self.ctl, self.ack = open(ctl, "w"), open(ack)  # noqa: SIM115 - held for the process's life
        self.wanted, self.active = wanted.encode(), False

    def _send(self, command: str) -> None:
        self.ctl.write(command + "\n")
        self.ctl.flush()
        self.ack.readline()

    def instrument(self) -> None:
        pass

    def zero(self, label: bytes = b"") -> None:
        if label == self.wanted:
            self.active = True
            self._send("enable")

    def stop(self, label: bytes) -> None:
        if self.active:
            self._send("disable")
            self.active = False


def measure_cell(regions: Regions, prep: Prepared, impl: str, regime: str, warm: int, steps: int,
                 cache_warm: int) -> None:
    """Dump ``impl|regime|<steps>`` (steps ``[warm, warm + steps)``) and ``impl|regime|0`` (no step)."""
    _, advance, cows = prepare_cell(prep, impl, regime)
    start, end = warm - cache_warm, warm + steps
    advance(0, start)
    for _ in range(QUICKEN_CALLS):
        advance(start, start)
    label, empty_label = f"{impl}|{regime}|{steps}".encode(), f"{impl}|{regime}|0".encode()
    gc.collect()
    regions.instrument()
    advance(start, warm)
    regions.zero(label)
    advance(warm, end)
    regions.stop(label)
    gc.collect()
    regions.instrument()
    regions.zero(empty_label)
    advance(end, end)
    regions.stop(empty_label)
    check_cows(prep, cows, 0, end, f"{impl} {regime}")


def compiled_here() -> list[str]:
    """Cached Numba functions of the project that this process compiled instead of loading from the cache."""
    from numba.core.registry import CPUDispatcher

    from harness.base.drivers import COMPILED_DRIVERS

    found = [(f"replay loop of {module}{' (caching)' if caching else ''}", drive)
             for (module, caching), drive in COMPILED_DRIVERS.items()]
    for name, module in list(sys.modules.items()):
        if name.split(".")[0] in ("impls", "harness"):
            found += [(f"{name}.{attr}", obj) for attr, obj in vars(module).items() if isinstance(obj, CPUDispatcher)]
    return sorted({label for label, dispatcher in found if dispatcher.stats.cache_misses})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trace", required=True)
    parser.add_argument("--lib", help="the compiled valgrind_region.c (callgrind mode)")
    parser.add_argument("--perf", nargs=3, metavar=("CTL", "ACK", "LABEL"),
                        help="perf mode: control and ack FIFOs of `perf stat --control`, and the region to count")
    parser.add_argument("--warm", type=int, required=True)
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--cache-warm", type=int, default=0)
    parser.add_argument("--cell", nargs=2, action="append", metavar=("IMPL", "REGIME"), required=True)
    parser.add_argument("--layout", type=count(0, 999), default=0,
                        help="heap layout: 0 adds nothing, N > 0 allocates padding first (the top of this module)")
    parser.add_argument("--symbols", help="write where the compiled replay loops start to this JSON file")
    args = parser.parse_args(argv)

    if bool(args.lib) == bool(args.perf):
        parser.error("give exactly one of --lib (callgrind) and --perf")
    regions = Regions(args.lib) if args.lib else PerfRegions(*args.perf)
    prep = Prepared.from_trace(load(args.trace))
    regions.instrument()
    regions.zero(b"kvb|warm-up")
    regions.stop(b"kvb|warm-up")
    for impl, regime in args.cell:
        measure_cell(regions, prep, impl, regime, args.warm, args.steps, args.cache_warm)
        gc.collect()
        print(f"{impl}|{regime}: ok", flush=True)
    if args.symbols:
        write_json(Path(args.symbols), symbols.starts())
    compiled = compiled_here()
    # A compile under valgrind shifts the heap and the counts: the native run must have filled the cache.
    if regions.on_valgrind and compiled:
        print(f"compiled under valgrind instead of loading from Numba's cache: {', '.join(compiled)}",
              file=sys.stderr)
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
