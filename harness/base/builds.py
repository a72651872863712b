"""How an implementation's measured code was compiled: the ``build`` column of its rows."""

from __future__ import annotations

from functools import cache


def build_of(cls: type) -> str:
    """The C++ flags of a native design, Numba's target CPU for a compiled one, "" for interpreted code."""
    if getattr(cls, "native", False) is True:
        return native_flags()
    if getattr(cls, "kernels", None) is not None:
        return numba_target()
    return ""


@cache
def numba_target() -> str:
    """The CPU Numba compiles for: the host's (its default) unless ``NUMBA_CPU_NAME`` names one."""
    import llvmlite.binding as llvm
    from numba.core import config

    if config.CPU_NAME:
        return f"numba, CPU {config.CPU_NAME} (NUMBA_CPU_NAME)"
    return f"numba, host CPU {llvm.get_host_cpu_name()}"


def native_flags() -> str:
    """The optimisation and architecture flags the C++ designs' library was built with (``-O2`` unless
    ``$KVB_NATIVE_FLAGS`` says otherwise); a library given prebuilt says so."""
    from impls import native

    if native.BUILD is None:
        return ""
    if native.BUILD.compiler == "(prebuilt)":
        return f"prebuilt ({native.toolchain.LIBRARY_ENV})"
    return " ".join(f for f in native.BUILD.flags if f not in native.toolchain.BASE_FLAGS)
