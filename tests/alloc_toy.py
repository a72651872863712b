"""Toy designs for tests/test_exact_allocations.py, in a file of their own: the events made under a frame of this
file are the toy design's (harness.run.alloc_cells.design_files)."""

from __future__ import annotations


class Quiet:
    """Writes small ints into a preallocated list and unpacks a tuple: allocates nothing."""

    def __init__(self) -> None:
        self.cells = [0] * 8
        self.pair = (3, 4)

    def step(self, s: int) -> None:
        a, b = self.pair  # unpacking: an iterator only under a profiler (the tool's, not the design's)
        self.cells[s % 8] = a + b


class OneList(Quiet):
    """Allocates exactly one list per step."""

    def step(self, s: int) -> None:
        self.cells[s % 8] = [s, s]
