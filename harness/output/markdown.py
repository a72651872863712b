"""Text from a run's files (a commit, a command line, a plug-in's name, a reason) put into Markdown as text: one
line, every Markdown control character escaped, so that nothing in a results folder can add a heading, a link, a
table row or HTML to a report or a pull-request comment."""

from __future__ import annotations

import re

CONTROL = re.compile(r"([\\`*_\[\]<>|~])")  # what means something anywhere in a line
LEADING = re.compile(r"^([#+=>-])")  # what means something at a line's start: a heading, a list, a quote
SPACES = re.compile(r"[\s\x00-\x1f\x7f\u2028\u2029]+")


def one_line(text: object) -> str:
    """``text`` with every run of whitespace and control characters (newlines included) as one space."""
    return SPACES.sub(" ", str(text)).strip()


def md(text: object) -> str:
    """``text`` as one line of Markdown text, its control characters escaped."""
    return LEADING.sub(r"\\\1", CONTROL.sub(r"\\\1", one_line(text)))


def md_code(text: object) -> str:
    """``text`` as an inline code span (in a table cell too): one line, no backtick, pipes escaped."""
    return "`" + one_line(text).replace("`", "'").replace("|", "\\|") + "`"
