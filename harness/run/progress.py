"""What a run says while it runs: what is under way, units done, the time left, each scenario's time."""

from __future__ import annotations

import sys
import time
from typing import TextIO

from harness.base.text import duration_text

BAR_FORMAT = "{desc}: {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} units [{elapsed}]{postfix}"
WIDTH = 70
PLAIN_EVERY_S = 15.0


MIN_FRACTION = 0.05  # no estimate before this share of the work is done


def time_left(elapsed_s: float, done_work: float, total_work: float,
              since: tuple[float, float] = (0.0, 0.0)) -> float | None:
    """Seconds left at the rate measured since ``since`` (seconds, work): the first unit's start-up and
    compilation are no measure of the rest. None until the rate is measured and MIN_FRACTION of the work done."""
    t0, w0 = since
    if done_work <= w0 or done_work < MIN_FRACTION * total_work:
        return None
    return max(0.0, total_work - done_work) * (elapsed_s - t0) / (done_work - w0)


def left_text(seconds: float | None) -> str:
    return "time left: not known yet" if seconds is None else f"about {duration_text(seconds)} left"


class Progress:
    """A run's progress: ``status`` for work under way, ``progress`` for a unit done, scenario start and end."""

    def __init__(self, enabled: bool = True, stream: TextIO | None = None, tty: bool | None = None) -> None:
        self.enabled = enabled
        self.stream = stream if stream is not None else sys.stderr
        isatty = getattr(self.stream, "isatty", None)
        self.tty = (callable(isatty) and bool(isatty())) if tty is None else tty
        self.bar = None
        self.clock = time.monotonic
        self.n = self.total = 0
        self.done_work = self.total_work = 0.0
        self.unit_work, self.started, self.last_line = 1.0, 0.0, 0.0
        self.since = (0.0, 0.0)
        self.said: set[str] = set()

    def start(self, total: int, work: float | None = None) -> None:
        """``total`` units, none done, weighing ``work`` in all (default: one each)."""
        self.n, self.total, self.done_work, self.since = 0, total, 0.0, (0.0, 0.0)
        self.total_work = float(total if work is None else work)
        self.started = self.last_line = self.clock()
        if self.enabled and self.tty:
            from tqdm import tqdm

            self.bar = tqdm(total=total, desc="kvblock-bench", unit="unit", file=self.stream, bar_format=BAR_FORMAT)

    def scenario(self, units: int, planned: float, actual: float) -> None:
        """The next ``units`` units weigh ``actual`` each, where :meth:`start`'s total counted ``planned``."""
        self.total_work += units * (actual - planned)
        self.unit_work = actual

    def _left_part(self) -> str:
        return "" if self.n >= self.total else f", {left_text(self.left())}"

    def left(self) -> float | None:
        """Seconds left, estimated from the work done so far (:func:`time_left`)."""
        return time_left(self.clock() - self.started, self.done_work, self.total_work, self.since)

    def _line(self, text: str) -> None:
        if self.bar is not None:
            self.bar.write(text, file=self.stream)
        else:
            print(text, file=self.stream, flush=True)

    def status(self, what: str) -> None:
        """Say what is under way now, without counting a unit."""
        if not self.enabled:
            return
        if self.bar is None:
            if what not in self.said:  # once a scenario (every repetition's worker warms up alike)
                self.said.add(what)
                self._line(f"kvblock-bench: {what}")
        else:
            self.bar.set_postfix_str(f"now: {what}"[:WIDTH])

    def __call__(self, what: str) -> None:
        """One unit done: ``what`` (a cell's repetition, a study)."""
        self.n += 1
        self.done_work += self.unit_work
        if self.n == 1:
            self.since = (self.clock() - self.started, self.done_work)
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.set_postfix_str(f"{left_text(self.left())}; done: {what}"[:WIDTH], refresh=False)
            self.bar.update(1)
            return
        now = self.clock()
        if self.n >= self.total or now - self.last_line >= PLAIN_EVERY_S:
            self.last_line = now
            self._line(f"kvblock-bench: {self.n}/{self.total} units, {duration_text(now - self.started)} elapsed"
                       f"{self._left_part()}; done: {what}")

    def scenario_done(self, name: str, seconds: float, note: str = "") -> None:
        """One line: scenario ``name`` ended after ``seconds`` (``note``: how, when not measured)."""
        self.said.clear()  # each scenario's log says its own things, a failure met again included
        if self.enabled:
            self._line(f"kvblock-bench: {name} done in {duration_text(seconds)}{note} ({self.n}/{self.total} units"
                       f"{self._left_part()})")

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


def status(tick, what: str) -> None:
    """``tick.status(what)`` where the run's progress callback has a status line (a plain callback has none)."""
    report = getattr(tick, "status", None)
    if callable(report):
        report(what)
