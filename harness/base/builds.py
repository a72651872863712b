"""How an implementation's measured code was compiled, stated at the end of its rows' ``how``."""

from __future__ import annotations

from functools import cache


def build_of(cls: type | None) -> str:
    """The C++ flags of a native design, Numba's target CPU for a compiled one, "" for interpreted code."""
    if getattr(cls, "native", False) is True:
        return native_flags()
    if getattr(cls, "kernels", None) is not None:
        return numba_target()
    return ""


def with_build(how: str, build: str) -> str:
    """``how`` ending with ``build`` (words for people; tools read the columns)."""
    return f"{how}; {build}" if build and how else build or how


@cache
def numba_target() -> str:
    """The CPU Numba compiles for: the host's (its default) unless ``NUMBA_CPU_NAME`` names one."""
    import llvmlite.binding as llvm
    from numba.core import config

    if config.CPU_NAME:
        return f"Numba compiled for CPU {config.CPU_NAME} (NUMBA_CPU_NAME)"
    return f"Numba compiled for the host CPU ({llvm.get_host_cpu_name()})"


def native_flags() -> str:
    """The C++ designs' optimisation and architecture flags (``-O2`` unless ``$KVB_NATIVE_FLAGS`` says
    otherwise); a library given prebuilt says so."""
    from impls import native

    if native.BUILD is None:
        return ""
    if native.BUILD.compiler == "(prebuilt)":
        return f"C++ library given prebuilt ({native.toolchain.LIBRARY_ENV})"
    flags = " ".join(f for f in native.BUILD.flags if f not in native.toolchain.BASE_FLAGS)
    return f"C++ built with {flags}"
