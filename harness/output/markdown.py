"""Markdown: a run's text as one inert line (it adds no heading, link, row or HTML); the harness's table writer."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

CONTROL = re.compile(r"([\\`*_\[\]<>|~])")
LEADING = re.compile(r"^([#+=>-])")
SPACES = re.compile(r"[\s\x00-\x1f\x7f\u2028\u2029]+")


def one_line(text: object) -> str:
    """``text`` with each run of whitespace and control characters as one space."""
    return SPACES.sub(" ", str(text)).strip()


def md(text: object) -> str:
    """``text`` as one line of Markdown text, its control characters escaped."""
    return LEADING.sub(r"\\\1", CONTROL.sub(r"\\\1", one_line(text)))


def md_code(text: object) -> str:
    """``text`` as an inline code span (in a table cell too)."""
    return "`" + one_line(text).replace("`", "'").replace("|", "\\|") + "`"


def markdown_table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> list[str]:
    """The table's lines: header, rule, a line per row of cells as given; ValueError for a row of another width."""
    lines = [_row(header), "|" + "---|" * len(header)]
    for row in rows:
        if len(row) != len(header):
            raise ValueError(f"a table row of {len(row)} cells under a header of {len(header)}: {list(row)}")
        lines.append(_row(row))
    return lines


def _row(cells: Sequence[str]) -> str:
    return "| " + " | ".join(cells) + " |"
