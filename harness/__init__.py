"""Replay traces on BlockManagers, measure, and report (docs/method.md, docs/measurement.md)."""

from __future__ import annotations

from pathlib import Path

from impls.core.numba_cache import pin_numba_cache

# Modules whose replay loops inline impls' kernels: their Numba cache is keyed by these and impls' sources.
COMPILED_MODULES = ("base/clock.py", "base/drivers.py", "studies/paced.py", "studies/idwidth.py",
                    "studies/limit_loop.py", "studies/unchecked_flat.py", "counters/latency.py")
pin_numba_cache(Path(__file__).resolve().parent / name for name in COMPILED_MODULES)
