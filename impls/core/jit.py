"""One way to make a compiled loop per design: a function's code under new globals."""

from __future__ import annotations

import re
import types


def specialise(fn: types.FunctionType, key: str, **bindings: object) -> types.FunctionType:
    """``fn``'s code as a new function with ``bindings`` as its globals, named after ``key``."""
    name = fn.__name__.lstrip("_") + "_" + re.sub(r"\W", "_", key)
    made = types.FunctionType(fn.__code__, {**fn.__globals__, **bindings}, name)
    made.__qualname__ = name
    return made
