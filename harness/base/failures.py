"""Whose failure is it? A cell's exception is the design's, or a bug of ours (harness/errors.py)."""

from __future__ import annotations

import inspect
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache
from pathlib import Path

from harness.base.replay import ReplayError
from harness.errors import DesignFailure

REASON_CHARS = 400
OUT_OF_MEMORY = "out of memory"


def short_reason(exc: BaseException) -> str:
    """``Type: message`` on one line, cut to :data:`REASON_CHARS` characters."""
    try:
        message = str(exc)
    except Exception:
        message = "(its message cannot be printed)"
    message = " ".join(message[: 4 * REASON_CHARS].split())
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
    """Whether ``exc`` is the design's: a replay error, or raised while the design's own code ran."""
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
    """Whether ``exc`` is an interruption from the user (Ctrl-C, SIGTERM): a ``KeyboardInterrupt`` in a process that
    does not ignore SIGINT (a worker ignores it, so there only code raises one)."""
    return isinstance(exc, KeyboardInterrupt) and signal.getsignal(signal.SIGINT) is not signal.SIG_IGN


@contextmanager
def blamed_on(impl: str, cls: type) -> Iterator[None]:
    """Turn a design's failure inside the block into :class:`DesignFailure`; let anything else through."""
    try:
        yield
    except DesignFailure:
        raise
    except BaseException as exc:
        if isinstance(exc, MemoryError):  # the design's own worker, held to a memory limit
            raise DesignFailure(impl, f"{OUT_OF_MEMORY} ({short_reason(exc)})") from exc
        if users_interrupt(exc) or not is_design_failure(exc, cls):
            raise
        raise DesignFailure(impl, short_reason(exc)) from exc
