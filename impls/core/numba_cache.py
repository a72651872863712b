"""Where Numba caches compiled code, and why not beside the sources.

Numba keys a cached function by its own source file only. Our kernels inline checks from
:mod:`impls.core.validation` and call each other across modules, and code compiled elsewhere (a replay loop)
inlines the kernels in turn, so an edit to one file could leave another file's cached machine code stale,
silently. Caching under a folder named by a digest of every source that compiled code may inline makes any
edit start a fresh cache. A ``NUMBA_CACHE_DIR`` set by the user is respected.

Numba fixes a function's cache folder when the function is decorated, so :func:`pin_numba_cache` must run
before the ``@njit(cache=True)`` functions it should cover are defined. ``impls`` pins a folder for its own
sources; a package whose compiled code inlines ``impls`` kernels pins again, before defining its own, with its
inlined modules added (``extra``): its folder's digest then covers both.
"""

from __future__ import annotations

import hashlib
import os
import sys
from collections.abc import Iterable
from pathlib import Path

IMPLS_ROOT = Path(__file__).resolve().parents[1]


def sources_digest(extra: Iterable[Path] = ()) -> str:
    """A digest of every ``impls`` source (all subpackages), of ``extra`` files, the Python and Numba versions."""
    import numba

    digest = hashlib.sha256(f"{sys.version}|{numba.__version__}".encode())
    paths = sorted(IMPLS_ROOT.rglob("*.py")) + sorted(Path(p).resolve() for p in extra)
    for path in paths:
        digest.update(str(path.relative_to(IMPLS_ROOT.parent) if path.is_relative_to(IMPLS_ROOT.parent)
                          else path.name).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def cache_root() -> Path:
    """``build/numba-cache`` in a source checkout, else ``~/.cache/kvblock-bench/numba``."""
    if (IMPLS_ROOT.parent / "pyproject.toml").is_file():
        return IMPLS_ROOT.parent / "build" / "numba-cache"
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "kvblock-bench" / "numba"


def pin_numba_cache(extra: Iterable[Path] = ()) -> None:
    """Point Numba's cache, for functions defined from now on, at a folder for exactly these sources: every
    ``impls`` module and ``extra`` (unless ``NUMBA_CACHE_DIR`` is set)."""
    import numba

    if os.environ.get("NUMBA_CACHE_DIR"):
        return
    numba.config.CACHE_DIR = str(cache_root() / sources_digest(extra))
