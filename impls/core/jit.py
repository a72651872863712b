"""One way to make a compiled loop per design: a function's code under new globals."""

from __future__ import annotations

import re
import types


def specialise(fn: types.FunctionType, key: str, **bindings: object) -> types.FunctionType:
    """``fn``'s code as a new function reading ``bindings`` as its globals (a design's kernels), named after
    ``key``: the one way a loop over kernels is made per design. Numba compiles each such function on its own,
    with the kernels as constants it can inline, and caches it across processes under its own name (a closure
    over the kernels is never found in Numba's cache, so every process would compile it again)."""
    name = fn.__name__.lstrip("_") + "_" + re.sub(r"\W", "_", key)
    made = types.FunctionType(fn.__code__, {**fn.__globals__, **bindings}, name)
    made.__qualname__ = name
    return made
