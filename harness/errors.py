"""Errors by origin, so that each is shown for what it is. Design: docs/measurement.md#errors."""

from __future__ import annotations


class InputError(ValueError):
    """Bad input from the user; the message names the flag, file or line and the fix."""


EXIT_TOO_FEW_PAIRS = 4


class TooFewPairs(InputError):
    """Too few pairs of worker processes for a verdict (``kvblock-bench ab``); an exit status of its own."""

    exit_status = EXIT_TOO_FEW_PAIRS


class WriteError(InputError):
    """A file we could not write; the message names it, the reason, and what was kept."""


class DesignFailure(Exception):
    """An implementation failed a cell; the message is its short reason (type, message, signal or deadline)."""

    def __init__(self, impl: str, reason: str) -> None:
        super().__init__(f"{impl}: {reason}")
        self.impl, self.reason = impl, reason

    def __reduce__(self) -> tuple:  # picklable across processes: the constructor takes two arguments
        return (DesignFailure, (self.impl, self.reason))
