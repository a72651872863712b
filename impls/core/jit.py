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


def spread_state(kernel: object, extra: int) -> object:
    """``kernel`` (a compiled function of a state's items then ``extra`` arguments) as a compiled function of
    ``(state, *extra)`` that passes the state tuple's items one by one: ``kernel(*state, ...)`` makes Numba
    build a tuple, and count a reference to every array in it, at each call. For a kernel compiled without
    Numba's runtime (which can keep no reference) the adapter is compiled without it too: the call then counts
    no references at all; otherwise it is inlined into its caller."""
    from numba import njit

    arity = kernel.py_func.__code__.co_argcount - extra
    xs = [f"x{i}" for i in range(extra)]
    items = [f"state[{i}]" for i in range(arity)]
    env: dict = {}
    exec(f"def spread(state, {', '.join(xs)}):\n    return kernel({', '.join(items + xs)})\n",
         {"kernel": kernel}, env)
    if kernel.targetoptions.get("_nrt", True) is False:
        return njit(_nrt=False)(env["spread"])
    return njit(inline="always")(env["spread"])
