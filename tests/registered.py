"""Parameters over every registered implementation name, including those unavailable here.

An implementation that cannot run in this environment (``impls.UNAVAILABLE``, e.g. ``sglang`` without torch)
appears as a skipped test with the reason, rather than vanishing from the report.
"""

from __future__ import annotations

import pytest

from impls import REGISTRY, UNAVAILABLE


def impl_params() -> list:
    """``pytest.param`` per registered name, sorted; unavailable ones marked skip with what to install."""
    return [
        pytest.param(name, marks=pytest.mark.skip(reason=f"{name} unavailable: {UNAVAILABLE[name]}"))
        if name in UNAVAILABLE else name
        for name in sorted({*REGISTRY, *UNAVAILABLE})
    ]



def slow_for(params: list, slow: set[str]) -> list:
    """``params`` with the plain names in ``slow`` marked slow (their minutes go to ``make test-slow``, which CI
    runs); a param already marked (unavailable) stays as it is."""
    return [pytest.param(p, marks=pytest.mark.slow) if isinstance(p, str) and p in slow else p for p in params]
