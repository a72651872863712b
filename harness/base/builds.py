"""How an implementation's measured code was compiled: the ``build`` column of its rows."""

from __future__ import annotations

from functools import cache


def build_of(cls: type) -> str:
    """The C++ flags of a native design, Numba's target CPU for a compiled one, "" for interpreted code."""
    if getattr(cls, "native", False) is True:
        return str(getattr(cls, "build_flags", ""))
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
