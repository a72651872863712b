"""What a run says while it runs: a progress bar of the plan's units, and what is happening between units.

Before the first unit ends a run loads the implementations (the C++ designs build on first use), calibrates its
timers, generates or loads each trace and makes each cell's first calls (Numba compilation or cache load, the
C++ library's load): tens of seconds in which a bar alone would sit at zero. :meth:`Progress.status` says which
of these is under way: as a line of its own before the bar exists, in the bar's postfix after. The bar shows
units done and time elapsed, no estimate of the time left: its units (a repetition of a cell, a study) differ in
length by orders of magnitude, and an estimate from them would be wrong by as much.
"""

from __future__ import annotations

import sys
from typing import TextIO

BAR_FORMAT = "{desc}: {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} units [{elapsed}]{postfix}"
WIDTH = 70  # characters of a status in the bar's postfix


class Progress:
    """A run's progress: ``status(what)`` for work under way, ``progress(what)`` (calling it) for a unit done."""

    def __init__(self, enabled: bool = True, stream: TextIO | None = None) -> None:
        self.enabled = enabled
        self.stream = stream if stream is not None else sys.stderr
        self.bar = None

    def start(self, total: int) -> None:
        """Show the bar: ``total`` units, none done."""
        if not self.enabled:
            return
        from tqdm import tqdm

        self.bar = tqdm(total=total, desc="kvblock-bench", unit="unit", file=self.stream, bar_format=BAR_FORMAT)

    def status(self, what: str) -> None:
        """Say what is under way now, without counting a unit."""
        if not self.enabled:
            return
        if self.bar is None:
            print(f"kvblock-bench: {what}", file=self.stream, flush=True)
        else:
            self.bar.set_postfix_str(f"now: {what}"[:WIDTH])

    def __call__(self, what: str) -> None:
        """One unit done: ``what`` (a cell's repetition, a study)."""
        if self.bar is not None:
            self.bar.set_postfix_str(f"done: {what}"[:WIDTH], refresh=False)
            self.bar.update(1)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


def status(tick, what: str) -> None:
    """``tick.status(what)`` where the run's progress callback has a status line (a plain callback has none)."""
    report = getattr(tick, "status", None)
    if callable(report):
        report(what)
