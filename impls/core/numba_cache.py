"""Where Numba caches compiled code, and why not beside the sources."""

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
    """Point Numba's cache, for functions defined from now on, at a folder keyed by these sources' digest."""
    import numba

    if os.environ.get("NUMBA_CACHE_DIR"):
        return
    numba.config.CACHE_DIR = str(cache_root() / sources_digest(extra))
