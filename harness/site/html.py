"""The site's HTML: pages, sortable and filterable tables, Markdown from the results folders, each escaped."""

from __future__ import annotations

import html
import math
import re
from dataclasses import dataclass

from markdown_it import MarkdownIt

PAGES = (("index.html", "Overview"), ("reference.html", "The article's table"), ("scenarios.html", "Every scenario"),
         ("machines.html", "Machines side by side"), ("history.html", "Engines by release"),
         ("ci.html", "CI verdicts"), ("calibration.html", "Calibration"))
_MARKDOWN = MarkdownIt("commonmark").enable("table")


def esc(text: object) -> str:
    return html.escape(str(text), quote=True)


@dataclass(frozen=True)
class Cell:
    """A table cell: its text, and the number it sorts by (NaN: sorts as text)."""

    text: str
    sort: float = math.nan


def cell(value: object) -> Cell:
    return value if isinstance(value, Cell) else Cell(str(value))


def table(ident: str, header: list[str], rows: list[list[object]], caption: str = "") -> str:
    """A table whose columns sort on a click of their heading and whose rows the box above it filters."""
    head = "".join(f'<th scope="col" tabindex="0">{esc(h)}</th>' for h in header)
    body = []
    for row in rows:
        cells = [cell(c) for c in row]
        body.append("<tr>" + "".join(f'<td data-v="{c.sort!r}">{esc(c.text)}</td>' if math.isfinite(c.sort)
                                     else f"<td>{esc(c.text)}</td>" for c in cells) + "</tr>")
    count = f"{len(rows)} row" + ("" if len(rows) == 1 else "s")
    return (f'<div class="table-block"><label>Filter <input type="search" class="filter" data-table="{ident}" '
            f'placeholder="words in a row"></label> <span class="count" id="{ident}-count">{count}</span>'
            f'<table class="sortable" id="{ident}">' + (f"<caption>{esc(caption)}</caption>" if caption else "")
            + f"<thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table></div>")


def markdown(text: str) -> str:
    """Markdown from a results folder as HTML; its links to the repository's files become plain text (the site holds
    only itself), and its tables sort like the site's own."""
    out = _MARKDOWN.render(text)
    out = re.sub(r'<a href="(?!https?://)[^"]*">(.*?)</a>', r"\1", out, flags=re.S)
    return out.replace("<table>", '<table class="sortable">')


def page(name: str, title: str, body: str, footer: str, figures: bool) -> str:
    """A whole page: the navigation, ``body``, the footer; plotly.js from the site's own assets when it draws."""
    nav = "".join(f'<a href="{href}"' + (' aria-current="page"' if href == name else "") + f">{esc(text)}</a>"
                  for href, text in PAGES)
    scripts = '<script src="assets/plotly.min.js"></script>' if figures else ""
    return ("<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            '<meta name="viewport" content="width=device-width, initial-scale=1">'
            f'<title>{esc(title)} · kvblock-bench</title><link rel="icon" href="data:,">'
            f'<link rel="stylesheet" href="assets/site.css">{scripts}<script src="assets/site.js" defer></script>'
            f"</head><body><nav>{nav}</nav><main><h1>{esc(title)}</h1>{body}</main>"
            f"<footer>{footer}</footer></body></html>\n")


def section(title: str, body: str, ident: str = "") -> str:
    anchor = f' id="{esc(ident)}"' if ident else ""
    return f"<section{anchor}><h2>{esc(title)}</h2>{body}</section>"


def para(text: str) -> str:
    """A paragraph of plain text, its `code` spans set as code."""
    return "<p>" + re.sub(r"`([^`]+)`", r"<code>\1</code>", esc(text)) + "</p>"
