"""SIGTERM ends a run as Ctrl-C does: raised where the run is, so that what finished is kept and ``meta.json``
records the interruption (and which signal) instead of the process dying with nothing said."""

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
    """Within the block, SIGTERM raises :class:`Terminated` (a ``KeyboardInterrupt``); the previous handler is
    restored on exit. Only the main thread can set handlers: elsewhere the block changes nothing."""
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
