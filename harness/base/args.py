"""Argument types shared by the command line and its verbs' own parsers."""

from __future__ import annotations

import argparse


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
