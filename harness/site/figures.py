"""The site's interactive figures (Plotly), each written beside the CSV of the points it draws."""

from __future__ import annotations

import csv
import io
import math
from dataclasses import dataclass, field
from pathlib import Path

import plotly.graph_objects as go
import plotly.io as pio

from harness.base.files import atomic_write_text
from harness.site.html import esc

COLUMNS = ("series", "x", "y", "low", "high")
ARTICLE_SHADE = "#9a9a9a"


@dataclass
class Points:
    """A figure's points by series, as drawn and as written to its CSV (only finite, positive values on a log axis)."""

    log: bool = True
    series: dict[str, list[tuple[str, float, float, float]]] = field(default_factory=dict)
    colours: dict[str, list[str]] = field(default_factory=dict)

    def add(self, series: str, x: str, y: float, low: float = math.nan, high: float = math.nan,
            colour: str = "") -> None:
        if not math.isfinite(y) or (self.log and y <= 0):
            return
        self.series.setdefault(series, []).append((x, y, low, high))
        self.colours.setdefault(series, []).append(colour)

    def colour(self, series: str) -> str | list[str] | None:
        """The series' colour: one, a colour per point, or None (Plotly's)."""
        found = self.colours.get(series, [])
        if not any(found):
            return None
        return found[0] if len(set(found)) == 1 else found

    def __len__(self) -> int:
        return sum(len(v) for v in self.series.values())

    def csv(self) -> str:
        buf = io.StringIO()
        out = csv.writer(buf, lineterminator="\n")
        out.writerow(COLUMNS)
        for name, pts in self.series.items():
            out.writerows([name, x, f"{y:.6g}", _num(lo), _num(hi)] for x, y, lo, hi in pts)
        return buf.getvalue()


def _num(v: float) -> str:
    return f"{v:.6g}" if math.isfinite(v) else ""


def _errors(pts: list[tuple[str, float, float, float]]) -> dict | None:
    if not any(math.isfinite(lo) and math.isfinite(hi) for _, _, lo, hi in pts):
        return None
    up = [max(hi - y, 0.0) if math.isfinite(hi) else 0.0 for _, y, _, hi in pts]
    down = [max(y - lo, 0.0) if math.isfinite(lo) else 0.0 for _, y, lo, _ in pts]
    return {"type": "data", "array": up, "arrayminus": down, "thickness": 1.2, "width": 3}


def bars(points: Points, title: str, ytitle: str, machine: str) -> go.Figure:
    """Grouped bars, a trace per series, 95 % intervals as error bars; the machine under the title."""
    fig = go.Figure()
    for name, pts in points.series.items():
        article = name.startswith("article")
        fig.add_bar(name=name, x=[p[0] for p in pts], y=[p[1] for p in pts], error_y=_errors(pts),
                    marker={"color": ARTICLE_SHADE if article else points.colour(name),
                            "pattern": {"shape": "/"} if article else None})
    return _finish(fig, title, ytitle, machine, points.log)


def markers(points: Points, title: str, ytitle: str, machine: str, lines: bool = False,
            reference: float | None = None) -> go.Figure:
    """Points (joined when ``lines``), a trace per series, with their intervals; a dotted line at ``reference``."""
    fig = go.Figure()
    for name, pts in points.series.items():
        fig.add_scatter(name=name, x=[p[0] for p in pts], y=[p[1] for p in pts], error_y=_errors(pts),
                        mode="lines+markers" if lines else "markers",
                        marker={"size": 8, "color": points.colour(name)})
    if reference is not None:
        fig.add_hline(y=reference, line={"dash": "dot", "color": "black", "width": 1})
    return _finish(fig, title, ytitle, machine, points.log)


def _finish(fig: go.Figure, title: str, ytitle: str, machine: str, log: bool) -> go.Figure:
    fig.update_layout(title={"text": f"{esc(title)}<br><sup>machine: {esc(machine)}</sup>", "x": 0.01},
                      barmode="group", template="plotly_white", height=430, margin={"t": 80, "r": 10},
                      legend={"orientation": "v", "x": 1.01, "y": 1}, font={"size": 12})
    fig.update_yaxes(title=ytitle, type="log" if log else "linear")
    fig.update_xaxes(type="category")
    return fig


def block(fig: go.Figure, points: Points, slug: str, out: Path) -> str:
    """The figure's HTML (drawn by the site's own plotly.js) and its points' CSV at ``data/<slug>.csv``."""
    atomic_write_text(out / "data" / f"{slug}.csv", points.csv())
    div = pio.to_html(fig, full_html=False, include_plotlyjs=False, div_id=slug,
                      config={"displaylogo": False, "responsive": True})
    return (f'<figure class="plot" data-csv="data/{slug}.csv" data-points="{len(points)}" data-figure="{slug}">'
            f'{div}<figcaption><a href="data/{slug}.csv">the {len(points)} points drawn (CSV)</a></figcaption>'
            "</figure>")
