"""What every figure shares: registry colours and labels, panels, whiskers, status words, the footer.
Design: docs/output.md#harnessoutputdrawingpy."""

from __future__ import annotations

import io
import math
import textwrap
from pathlib import Path

import matplotlib as mpl
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from harness.base.files import atomic_write_bytes
from harness.output.formatting import fmt, machine_line
from harness.output.rundata import RunData, ordered
from impls import registry

SCHEMES = {r.letter: r.name for r in registry.RECORDS if r.role == "design" and r.letter}
NATIVE_OF = {r.letter: r.name for r in registry.RECORDS if r.role == "native" and r.letter}
REGIME_STYLE = {"batched": "-", "per-call": "--"}
REGIME_HATCH = {"batched": "", "per-call": "\\\\\\"}  # line hatches: dot hatches make SVGs far larger
OTHER_STYLE, OTHER_HATCH = ":", "///"
ARTICLE = "article (C++)"
MAX_SERIES = 8
MIN_FONT = 7.0  # the smallest text a figure prints (tests/test_figures.py holds every figure to it)
# Families of implementations shown together, in this order; adjacent families share a panel while they fit.
PANEL_FAMILIES: tuple[tuple[str, ...], ...] = (("design", "twin", "native"), ("contender",), ("caching",),
                                               ("plugin",))
ROLE_WORDS = {"design": "as designed", "twin": "compiled twins", "native": "in C++",
              "contender": "engines (our models)", "caching": "prefix caching", "plugin": "plug-ins"}
ARTICLE_ROLES = ("design", "twin", "native")


def label(impl: str) -> str:
    """The registry's label (the design letter and name for the article's designs), the bare name otherwise."""
    return registry.record(impl).label


def plugins_of(run: RunData) -> list[str]:
    """The run's plug-ins (unregistered implementations, timed or failed), in the order the run names them."""
    cells = run.df[run.df.metric.isin(["seq_step_ns", "correctness"])].impl
    return [i for i in dict.fromkeys(cells) if i not in registry.BY_NAME]


def color(impl: str, run: RunData) -> str:
    """The registry's colour; a plug-in's is its place in ``run``'s plug-ins in :data:`registry.PLUGIN_COLORS`."""
    if registry.record(impl).color:
        return registry.record(impl).color
    found = plugins_of(run)
    k = found.index(impl) if impl in found else len(found)
    return registry.PLUGIN_COLORS[k % len(registry.PLUGIN_COLORS)]


def regime_style(regime: str) -> str:
    return REGIME_STYLE.get(regime, OTHER_STYLE)


def regime_hatch(regime: str) -> str:
    return REGIME_HATCH.get(regime, OTHER_HATCH)


def family_title(impls: list[str]) -> str:
    """What a panel of ``impls`` shows, from their roles (``the article's designs (as designed, in C++)``)."""
    roles = {registry.record(i).role for i in impls}
    parts = []
    article = [ROLE_WORDS[r] for r in ARTICLE_ROLES if r in roles]
    if article:
        parts.append(f"the article's designs ({', '.join(article)})")
    parts += [ROLE_WORDS[r] for family in PANEL_FAMILIES[1:] for r in family if r in roles]
    return " and ".join(parts)


def numbered(titles: list[str]) -> list[str]:
    """``titles`` with ``(k of n)`` after each that occurs ``n`` > 1 times, so that no two panels share a title."""
    counts = {t: titles.count(t) for t in titles}
    seen: dict[str, int] = {}
    out = []
    for t in titles:
        seen[t] = seen.get(t, 0) + 1
        out.append(f"{t} ({seen[t]} of {counts[t]})" if counts[t] > 1 else t)
    return out


def series_panels(impls: list[str], reference: str | None = registry.RATIO_BASE) -> list[tuple[str, list[str]]]:
    """``impls`` as (title, impls) panels of at most :data:`MAX_SERIES` series by role family, with ``reference``."""
    found = ordered(impls)
    groups: list[tuple[int, list[str]]] = []
    for f, roles in enumerate(PANEL_FAMILIES):
        members = [i for i in found if registry.record(i).role in roles]
        for k in range(0, len(members), MAX_SERIES):
            groups.append((f, members[k:k + MAX_SERIES]))
    merged: list[tuple[int, list[str]]] = []
    for f, members in groups:
        if merged and len(merged[-1][1]) + len(members) <= MAX_SERIES and merged[-1][0] != f:
            merged[-1] = (f, merged[-1][1] + members)
        else:
            merged.append((f, members))
    panels = [m for _, m in merged]
    titles = numbered([family_title(m) for m in panels])
    if reference not in found:
        return list(zip(titles, panels, strict=True))
    out = []
    for title, members in zip(titles, panels, strict=True):
        if reference in members or len(members) >= MAX_SERIES:
            out.append((title, members))
        else:
            out.append((f"{title}, {label(reference)} for reference", [reference, *members]))
    return out


def status_word(row: dict | None, meta: dict) -> str:
    """What stands in place of a figure that was not measured."""
    if row is None:
        return "not measured"
    status = str(row["status"])
    if status == "unsupported" and meta.get("pmu") == "unsupported":
        return "unsupported (no PMU)"
    return status


def reason_word(row: dict, meta: dict) -> str:
    """Why one instrument's row has no figure (``no PMU``, ``not run (--quick)``), else its status."""
    status = str(row["status"])
    if status == "unsupported" and meta.get("pmu") == "unsupported":
        return "no PMU"
    if status == "skipped" and str(meta.get("config", {}).get("quick")) == "True":
        return "not run (--quick)"
    return status


def instrument_words(rows: list[dict], meta: dict) -> str:
    """What stands in place of a figure every instrument of ``rows`` left unmeasured (each ``source: reason``)."""
    if len(rows) < 2:
        return status_word(rows[0] if rows else None, meta)
    return "; ".join(dict.fromkeys(f"{r['source']}: {reason_word(r, meta)}" for r in rows if r["status"] != "ok"))


def ci(row: dict | None) -> tuple[float, float] | None:
    """A row's 95 % interval (its ``ci_low``/``ci_high`` columns), None where it has none."""
    lo, hi = (row.get("ci_low"), row.get("ci_high")) if row else (None, None)
    if lo is None or hi is None or pd.isna(lo) or pd.isna(hi):
        return None
    return float(lo), float(hi)


def reps_of(row: dict | None) -> int | None:
    reps = row.get("reps") if row else None
    return int(reps) if reps is not None and not pd.isna(reps) else None


def new_figure(width: float, height: float, nrows: int = 1, ncols: int = 1, **kw) -> tuple[Figure, list[Axes]]:
    fig = Figure(figsize=(width, height), layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False, **kw)
    for ax in axes.flat:
        ax.set_axisbelow(True)  # gridlines behind bars and lines, never through them
    return fig, list(axes.flat)


def grid(n: int, ncols: int = 2) -> tuple[int, int]:
    """(rows, columns) of a grid for ``n`` panels, at most ``ncols`` wide."""
    cols = max(1, min(ncols, n))
    return math.ceil(n / cols), cols


def finish(fig: Figure, run: RunData, title: str, caption: str = "") -> Figure:
    """Title, and a footer: how to read the figure (``caption``), then the machine, the run and the commit."""
    fig.suptitle(title, fontsize=12)
    width_in = fig.get_figwidth()
    lines = textwrap.wrap(caption, width=int(width_in * 14)) if caption else []
    lines += textwrap.wrap(f"Machine: {machine_line(run.meta)}", width=int(width_in * 16))
    lines.append(f"run {run.run_id}; commit {run.meta.get('git_commit', '?')}; "
                 f"finished {run.meta.get('finished', run.meta.get('started', '?'))}")
    fig.text(0.005, 0.004, "\n".join(lines), fontsize=MIN_FONT, ha="left", va="bottom", color="0.3")
    footer_in = 0.14 * len(lines) + 0.08
    fig.get_layout_engine().set(rect=(0, footer_in / fig.get_figheight(), 1, 1 - footer_in / fig.get_figheight()))
    return fig


def article_marker(bound: str) -> tuple[str, str]:
    """(marker, legend words) for how the article stated a figure."""
    return ("v", "upper bound (<)") if bound == "upper" else ("D", "approx. (~)")


def article_handles() -> list[Line2D]:
    return [Line2D([], [], marker=m, ls="", mfc="none", mec="black", label=f"{ARTICLE}, {words}")
            for m, words in (article_marker("approx"), article_marker("upper"))]


def note(ax: Axes, text: str) -> None:
    """How to read a panel, right of the axes under the legend, where it never hides data."""
    ax.text(1.01, 0.0, text, transform=ax.transAxes, ha="left", va="bottom", fontsize=MIN_FONT, color="0.25",
            bbox={"boxstyle": "round,pad=0.3", "fc": "white", "ec": "0.8", "alpha": 0.9})


def num(v: float) -> str:
    """A bar's value in three significant digits (thousands separated)."""
    return fmt(v)


def word_at(ax: Axes, x: float, text: str) -> None:
    """A status in place of a bar, standing on the axis (axes coordinates in y, so any scale works)."""
    ax.text(x, 0.02, text, transform=ax.get_xaxis_transform(), rotation=90, ha="center", va="bottom",
            fontsize=MIN_FONT, color="0.35")


def whisker(ax: Axes, x: float, lo: float, hi: float, shade: str = "black") -> None:
    ax.vlines(x, lo, hi, color=shade, lw=0.9)
    ax.plot([x, x], [lo, hi], ls="", marker="_", color=shade, ms=5)


def log_headroom(ax: Axes, low: float, high: float, share: float = 0.4) -> None:
    """A log axis from ``low`` to above ``high`` with ``share`` of its height left free for labels."""
    low, high = max(low, 1e-12), max(high, low * 10)
    span = math.log10(high / low)
    ax.set_ylim(low, high * 10 ** (span * share / (1 - share)))


def hide_unused(axes: list[Axes], used: int) -> None:
    for ax in axes[used:]:
        ax.set_visible(False)


PNG_DPI = 110


def save_figure(fig: Figure, out_dir: Path, stem: str) -> list[Path]:
    """PNG and SVG of ``fig`` in ``out_dir``, each written to a temporary name and renamed into place."""
    paths = []
    # fixed ids and no date: re-rendering the same run gives the same SVG bytes
    with mpl.rc_context({"svg.hashsalt": "kvblock-bench", "svg.fonttype": "none"}):
        for fmt in ("png", "svg"):
            buf = io.BytesIO()
            fig.savefig(buf, format=fmt, dpi=PNG_DPI, metadata={"Date": None} if fmt == "svg" else {"Software": None})
            path = out_dir / f"{stem}.{fmt}"
            atomic_write_bytes(path, _small_png(buf.getvalue()) if fmt == "png" else buf.getvalue())
            paths.append(path)
            fig.set_layout_engine("none")  # laid out by the first save; the second reuses it (half the time)
    return paths


def _small_png(data: bytes) -> bytes:
    """The PNG with a 256-colour palette: flat-coloured charts look the same at a third of the bytes, which
    matters for the figures committed with reference runs."""
    try:
        from PIL import Image
    except ImportError:  # pragma: no cover - Pillow comes with matplotlib
        return data
    out = io.BytesIO()
    with Image.open(io.BytesIO(data)) as im:
        im.convert("RGB").quantize(256, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE).save(
            out, format="PNG", optimize=True)
    return out.getvalue()
