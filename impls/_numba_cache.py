"""Where Numba caches our compiled kernels, and why not beside the sources.

Numba keys a cached function by its own source file only. Our kernels inline checks from
:mod:`impls.validation` and call each other across modules, so an edit to one file could leave another
file's cached machine code stale, silently. Caching under a folder named by a digest of every ``impls``
source makes any edit start a fresh cache. A ``NUMBA_CACHE_DIR`` set by the user is respected.
"""

from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path

_HERE = Path(__file__).resolve().parent


def sources_digest() -> str:
    """A digest of the ``impls`` sources, the Python version and Numba's version."""
    import numba

    digest = hashlib.sha256(f"{sys.version}|{numba.__version__}".encode())
    for path in sorted(_HERE.glob("*.py")):
        digest.update(path.name.encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def cache_root() -> Path:
    """``build/numba-cache`` in a source checkout, else ``~/.cache/kvblock-bench/numba``."""
    if (_HERE.parent / "pyproject.toml").is_file():
        return _HERE.parent / "build" / "numba-cache"
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "kvblock-bench" / "numba"


def pin_numba_cache() -> None:
    """Point Numba's cache at a folder for exactly these sources (unless ``NUMBA_CACHE_DIR`` is set)."""
    import numba

    if os.environ.get("NUMBA_CACHE_DIR"):
        return
    numba.config.CACHE_DIR = str(cache_root() / sources_digest())
