"""Whose failure is it? A cell's exception is the design's, or a bug of ours (harness/errors.py).

An exception is the design's when the trace check rejected what the design did (:class:`ReplayError`), or when
it was raised while the design's own code was running: its traceback passes through a module of the
implementation's class or of one of its base classes (our base classes included: a design that calls them
wrongly fails in them). ``SystemExit`` raised there counts too: a plug-in that exits fails its cells, it does not
end the run; so does any other ``BaseException`` it raises, ``KeyboardInterrupt`` included where it cannot be the
user's: in a process that ignores SIGINT (a worker, :mod:`harness.measure.workers`), only code raises it.
A ``MemoryError`` in a cell is the design's too: its cells run in a worker of its own, held to a memory limit
(:func:`harness.measure.workers.limit_memory`). Anything else is ours: it propagates, with its traceback.
"""

from __future__ import annotations

import inspect
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache
from pathlib import Path

from harness.errors import DesignFailure
from harness.measure.replay import ReplayError

REASON_CHARS = 400  # a failure's reason as recorded: one line, at most this long
OUT_OF_MEMORY = "out of memory"  # how a design's failure to allocate begins


def short_reason(exc: BaseException) -> str:
    """``Type: message`` on one line, cut to :data:`REASON_CHARS` characters."""
    try:
        message = str(exc)
    except Exception:  # a design's exception may fail to print, too
        message = "(its message cannot be printed)"
    message = " ".join(message[: 4 * REASON_CHARS].split())  # a huge message is cut before it is worked on
    text = f"{type(exc).__name__}: {message}" if message else type(exc).__name__
    return text if len(text) <= REASON_CHARS else text[: REASON_CHARS - 1] + "…"


@cache
def design_files(cls: type) -> frozenset[str]:
    """The source files of ``cls`` and of its base classes (those with a source file)."""
    files = set()
    for klass in cls.__mro__:
        try:
            path = inspect.getsourcefile(klass)
        except (TypeError, OSError):
            continue
        if path:
            files.add(str(Path(path).resolve()))
    return frozenset(files)


def is_design_failure(exc: BaseException, cls: type) -> bool:
    """Whether ``exc`` is the design's (see the module docstring)."""
    if isinstance(exc, (ReplayError, DesignFailure)):
        return True
    files = design_files(cls)
    tb = exc.__traceback__
    while tb is not None:
        if str(Path(tb.tb_frame.f_code.co_filename).resolve()) in files:
            return True
        tb = tb.tb_next
    return False


def users_interrupt(exc: BaseException) -> bool:
    """Whether ``exc`` is an interruption from the user (Ctrl-C, SIGTERM): a ``KeyboardInterrupt`` in a process
    that does not ignore SIGINT (a worker ignores it, so there only code raises one)."""
    return isinstance(exc, KeyboardInterrupt) and signal.getsignal(signal.SIGINT) is not signal.SIG_IGN


@contextmanager
def blamed_on(impl: str, cls: type) -> Iterator[None]:
    """Turn a design's failure inside the block into :class:`DesignFailure`; let anything else through."""
    try:
        yield
    except DesignFailure:
        raise
    except BaseException as exc:  # a design may raise or exit with anything (see the module docstring)
        if isinstance(exc, MemoryError):  # in a worker of the design's own, its allocations exhausted the limit
            raise DesignFailure(impl, f"{OUT_OF_MEMORY} ({short_reason(exc)})") from exc
        if users_interrupt(exc) or not is_design_failure(exc, cls):
            raise
        raise DesignFailure(impl, short_reason(exc)) from exc
