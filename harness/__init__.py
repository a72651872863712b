"""Replay traces on BlockManagers, measure, and report (see README.md, "How measurements are made")."""

from __future__ import annotations

from pathlib import Path

from impls.core.numba_cache import pin_numba_cache

# The harness's modules that define compiled code; their replay loops inline the designs' kernels, so their
# cache folder is keyed by these sources and every impls source (tests/test_architecture.py keeps the list
# complete). Pinned here, before any of them defines a function.
COMPILED_MODULES = ("base/clock.py", "base/drivers.py", "studies/paced.py", "studies/idwidth.py")
pin_numba_cache(Path(__file__).resolve().parent / name for name in COMPILED_MODULES)
