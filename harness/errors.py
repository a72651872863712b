"""Errors by origin, so that each is shown for what it is (README, "Errors").

- :class:`InputError`: bad input from the user (a flag, a file, a line of a file, a plug-in that cannot be
  loaded). The command line prints it as one line naming what is wrong and the fix, exit status 2. Every check
  of user input in the harness raises it (or a subclass); ``scenarios`` and ``impls`` raise their own input
  errors (:class:`scenarios.ScenarioError`, :class:`scenarios.TraceError`, :class:`impls.registry.PluginError`),
  which the command line treats the same way.
- :class:`WriteError` (an :class:`InputError`): a file that could not be written (disk full, a read-only folder,
  a name too long, a path that names a device node or FIFO). One line naming the file, the reason and what was
  kept, exit status 2; what was saved before stays.
- :class:`DesignFailure`: an implementation failed a cell (raised, disagreed with the trace, exited, hung or
  crashed). The run records a ``failed`` row naming the implementation and goes on; the run ends with a
  non-zero status.
- anything else is a bug in our code: a traceback and exit status 1, never blamed on a design.
"""

from __future__ import annotations


class InputError(ValueError):
    """Bad input from the user; the message names the flag, file or line and the fix."""


class WriteError(InputError):
    """A file we could not write; the message names it, the reason, and what was kept."""


class DesignFailure(Exception):
    """An implementation failed a cell; the message is its short reason (type, message, signal or deadline)."""

    def __init__(self, impl: str, reason: str) -> None:
        super().__init__(f"{impl}: {reason}")
        self.impl, self.reason = impl, reason

    def __reduce__(self) -> tuple:  # picklable across processes: the constructor takes two arguments
        return (DesignFailure, (self.impl, self.reason))
