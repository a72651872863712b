"""SIGINT and SIGTERM end a command alike, where it is, after its clean-up.
Design: docs/measurement.md#interrupts-scratch-and-lifetime."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

GRACE_S = 30.0  # after an interruption, further signals are ignored this long


class Terminated(KeyboardInterrupt):
    """The process was sent SIGTERM (``kill``, a CI job's timeout, a container stopping)."""

    signal_name = "SIGTERM"


def signal_name(exc: KeyboardInterrupt) -> str:
    """The signal an interruption came from: SIGTERM for :class:`Terminated`, else SIGINT (Ctrl-C)."""
    return getattr(exc, "signal_name", "SIGINT")


_state = {"depth": 0, "last": -GRACE_S}  # blocks entered; when the last interruption was raised


def _handler(signum: int, frame: object) -> None:
    if time.monotonic() - _state["last"] < GRACE_S:
        return
    _state["last"] = time.monotonic()
    raise Terminated("SIGTERM") if signum == signal.SIGTERM else KeyboardInterrupt()


@contextmanager
def interruptible() -> Iterator[None]:
    """Within the block SIGINT and SIGTERM raise (:class:`Terminated`), once per :data:`GRACE_S`."""
    if threading.current_thread() is not threading.main_thread() or _state["depth"]:
        yield
        return
    caught = [signal.SIGTERM] + ([signal.SIGINT] if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN else [])
    previous = {sig: signal.signal(sig, _handler) for sig in caught}
    _state["depth"] += 1
    try:
        yield
    finally:
        _state.update(depth=0, last=-GRACE_S)
        for sig, before in previous.items():
            signal.signal(sig, before)


sigterm_interrupts = interruptible  # the runner's name for it (a run started without the command line)
