"""Argument types shared by the command line and its verbs' own parsers."""

from __future__ import annotations

import argparse
from collections.abc import Callable


def csv_list(text: str) -> list[str]:
    """``a,b,c`` -> [a, b, c]; an empty item or a repeated one is an error, not a silent default."""
    items = [item.strip() for item in text.split(",")]
    if not text.strip() or any(not item for item in items):
        raise argparse.ArgumentTypeError(f"empty name in {text!r}: give comma-separated names, e.g. flat,dict")
    repeated = sorted({item for item in items if items.count(item) > 1})
    if repeated:
        raise argparse.ArgumentTypeError(f"{', '.join(repeated)} given twice in {text!r}")
    return items


def percentage(text: str) -> float:
    """A percentage such as ``10`` or ``10%`` (a number from 0 to 1000)."""
    try:
        value = float(text.strip().removesuffix("%"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a percentage (e.g. 10 or 10%)") from None
    if not 0 <= value < 1000:
        raise argparse.ArgumentTypeError(f"{text!r}: give a percentage from 0 to 1000")
    return value


# Upper bounds of the counts the command line takes (run's own are in harness.run.runner).
MAX_CHECK_SEEDS, MAX_CHECK_EXAMPLES, MAX_CHECK_OPS = 1_000, 100_000, 10_000
MAX_CALIBRATE_REPS = 1_000
MAX_DEADLINE_S = 86_400.0
DEFAULT_DEADLINE_S = 300.0  # the longest a worker may stay silent in a cell (one slice of the slowest is far less)


def count(low: int, high: int) -> Callable[[str], int]:
    """An argparse type: an integer from ``low`` to ``high`` (argparse names the flag in the error)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text[:40]!r} is not an integer from {low:,} to {high:,}") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"must be from {low:,} to {high:,}, got {text[:40]}")
        return value

    return parse


def positive_seconds(text: str) -> float:
    """A number of seconds > 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not 0 < value <= MAX_DEADLINE_S:
        raise argparse.ArgumentTypeError(f"must be a number of seconds above 0 and at most {MAX_DEADLINE_S:,g}, "
                                         f"got {text[:40]}")
    return value


def add_deadline(p: argparse.ArgumentParser) -> None:

    p.add_argument("--deadline", type=positive_seconds, default=DEFAULT_DEADLINE_S, metavar="S",
                   help=f"seconds a worker process may run an implementation without progress before it is killed "
                        f"and the implementation's cell failed (default {DEFAULT_DEADLINE_S:g})")
