"""SIGTERM ends a run as Ctrl-C does: raised where the run is, what finished is kept, the interruption recorded."""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager


class Terminated(KeyboardInterrupt):
    """The process was sent SIGTERM (``kill``, a CI job's timeout, a container stopping)."""

    signal_name = "SIGTERM"


def signal_name(exc: KeyboardInterrupt) -> str:
    """The signal an interruption came from: SIGTERM for :class:`Terminated`, else SIGINT (Ctrl-C)."""
    return getattr(exc, "signal_name", "SIGINT")


@contextmanager
def sigterm_interrupts() -> Iterator[None]:
    """Within the block SIGTERM raises :class:`Terminated`; the previous handler is restored on exit."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: object) -> None:
        raise Terminated("SIGTERM")

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
