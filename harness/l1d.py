"""L1D miss rate and instructions per sequence-step (filled in with the callgrind/perf measurement)."""

from __future__ import annotations

from .results import Row


def l1d_rows(name, trace, cells, quick=False) -> list[Row]:
    return []
