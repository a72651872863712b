"""The native classes, importable only where the C++ library was built (the registry's targets point here)."""

from __future__ import annotations

from impls.native import UNAVAILABLE_REASON
from impls.native.binding import (
    CppDictBlockManager,
    CppFlatBlockManager,
    CppFlatRowsBlockManager,
    CppListBlockManager,
)

if UNAVAILABLE_REASON is not None:
    raise ImportError(UNAVAILABLE_REASON)

__all__ = ["CppDictBlockManager", "CppFlatBlockManager", "CppFlatRowsBlockManager", "CppListBlockManager"]
