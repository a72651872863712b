"""The check the hostile-input tests share: what a user sees for bad input is one line naming the file."""

from __future__ import annotations

from pathlib import Path


def one_line(error: BaseException, path: str | Path, *needles: str) -> str:
    """``error``'s message, asserted to be one line that names ``path`` and holds every needle."""
    message = str(error)
    assert "\n" not in message and str(path) in message, message
    for needle in needles:
        assert needle in message, message
    return message
