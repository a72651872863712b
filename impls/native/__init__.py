"""The designs in C++ (``cpp-dict``, ``cpp-list``, ``cpp-flat``, ``cpp-flat-rows``) and their bindings."""

from __future__ import annotations

from impls.native.binding import (
    LIB,
    CppDictBlockManager,
    CppFlatBlockManager,
    CppFlatRowsBlockManager,
    CppListBlockManager,
    NativeBlockManager,
    alloc_bytes,
    alloc_count,
    function_address,
    load_library,
)
from impls.native.toolchain import FLAGS, Build, BuildError, build

NAMES = ("cpp-dict", "cpp-list", "cpp-flat", "cpp-flat-rows")
_CLASSES = {"cpp-dict": CppDictBlockManager, "cpp-list": CppListBlockManager, "cpp-flat": CppFlatBlockManager,
            "cpp-flat-rows": CppFlatRowsBlockManager}


def _load() -> tuple[Build | None, str | None]:
    try:
        result = build()
        LIB[:] = [load_library(result.path)]
    except (BuildError, OSError) as exc:
        return None, f"native C++ designs unavailable: {exc}"
    return result, None


BUILD, UNAVAILABLE_REASON = _load()
NATIVE: dict[str, type] = dict(_CLASSES) if UNAVAILABLE_REASON is None else {}


def build_info() -> dict:
    """What a run's metadata should record about the native library."""
    if BUILD is None:
        return {"available": False, "reason": UNAVAILABLE_REASON, "flags": list(FLAGS)}
    return {
        "available": True,
        "compiler": BUILD.compiler,
        "compiler_version": BUILD.compiler_version,
        "flags": list(BUILD.flags),
        "digest": BUILD.digest,
        "library": str(BUILD.path),
        "compiled_now": BUILD.compiled,
        "compile_s": round(BUILD.seconds, 3),
    }


__all__ = [
    "FLAGS",
    "NAMES",
    "NATIVE",
    "UNAVAILABLE_REASON",
    "BuildError",
    "CppDictBlockManager",
    "CppFlatBlockManager",
    "CppFlatRowsBlockManager",
    "CppListBlockManager",
    "NativeBlockManager",
    "alloc_bytes",
    "alloc_count",
    "build",
    "build_info",
    "function_address",
]
