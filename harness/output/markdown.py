"""Text from a run's files put into Markdown as one line of text: it can add no heading, link, row or HTML."""

from __future__ import annotations

import re

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
