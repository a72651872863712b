"""The headline figure, ``paper_vs_article``: the article's table measured, one regime per row of panels.
Design: docs/output.md#harnessoutputheadlinepy."""

from __future__ import annotations

import logging
import math
from typing import NamedTuple

import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import NullFormatter

from harness.base.rows import ratio_metric
from harness.output.drawing import (
    ARTICLE,
    NATIVE_OF,
    SCHEMES,
    color,
    finish,
    label,
    num,
    plugins_of,
    reason_word,
    status_word,
)
from harness.output.formatting import fmt, interval_of
from harness.output.report import article_table, regime_title
from harness.output.rundata import RunData
from impls.registry import RATIO_BASE
from scenarios import PAPER

log = logging.getLogger(__name__)

# metric -> (panel title, y label, the article's column, the metric its ratio to flat is read from)
COLUMNS = {
    "lookup_ns": ("lookup", "ns per lookup (log)", "lookup_ns_per_step", "lookup_ns"),
    "alloc_free_ns": ("alloc/free", "ns per block (log)", "alloc_free_ns_per_block", "alloc_free_ns"),
    "cpu_share_pct": ("CPU share at 2,000 steps/s (computed)", "% of one core (log)",
                      "cpu_share_pct_at_2000_steps_s", "seq_step_ns"),
    "l1d_misses_per_seq_step": ("L1D misses per sequence-step", "misses (log)", None, None),
}
RATE = "l1d_miss_pct"
L1D = "l1d_misses_per_seq_step"
PMU_SOURCE = "perf"
LABEL_FONT = 7.5


def _ratio_label(run: RunData, impl: str, regime: str, ratio_of: str | None) -> str:
    """``R× [low–high]`` (paired, same run and regime), ``1×`` for flat, "" where the run has no ratio."""
    if ratio_of is None:
        return ""
    if impl == RATIO_BASE:
        return "1× (base)"
    row = run.get(PAPER, impl, regime, ratio_metric(ratio_of))
    if row is None or row["status"] != "ok":
        return ""
    bounds = interval_of(row)
    return f"{fmt(float(row['value']))}×" + (f" [{fmt(bounds[0])}–{fmt(bounds[1])}]" if bounds else "")


class Group(NamedTuple):
    """A row group of the headline's panels: an article's design (ours, our C++ build, the article's) or a plug-in."""

    name: str
    ours: str
    cxx: str | None = None
    scheme: str | None = None


def groups(run: RunData) -> list[Group]:
    """The article's designs A, B, C, then every plug-in of the run (a plug-in appears in every figure)."""
    out = [Group(label(impl), impl, NATIVE_OF.get(scheme), scheme) for scheme, impl in SCHEMES.items()]
    return out + [Group(label(p), p) for p in plugins_of(run)]


def _bar(ax: Axes, run: RunData, impl: str, regime: str, metric: str, y: float, height: float,
         several: bool) -> tuple[float, float]:
    """One of our bars with its whisker and label, or its status word; returns its (start, end), NaN when none."""
    row = run.get(PAPER, impl, regime, metric)
    v = run.value(PAPER, impl, regime, metric)
    if math.isnan(v) or v <= 0:
        if row is not None:
            _word(ax, y, "0" if v == 0 else status_word(row, run.meta))
        elif (check := run.get(PAPER, impl, regime, "correctness")) is not None and check["status"] == "failed":
            _word(ax, y, "failed the trace check (results.csv says why)")
        elif run.get(PAPER, impl, regime, "seq_step_ns") is None:
            _word(ax, y, "not in this run")
        return math.nan, math.nan
    ax.barh(y, v, height, color=color(impl, run), edgecolor="white", linewidth=0.5)
    start = end = v
    if bounds := interval_of(row):
        ax.hlines(y, *bounds, color="black", lw=0.9)
        ax.plot(bounds, [y, y], ls="", marker="|", color="black", ms=4)
        start, end = min(v, bounds[0]), max(v, bounds[1])
    text = num(v)
    if ratio := _ratio_label(run, impl, regime, COLUMNS.get(metric, (None,) * 4)[3]):
        text += "  " + ratio
    if metric == "l1d_misses_per_seq_step" and several:
        text += "  " + str(row["source"])
    ax.text(end * 1.15, y, text, ha="left", va="center", fontsize=LABEL_FONT)
    return start, end


def _word(ax: Axes, y: float, text: str) -> None:
    """A status in place of a bar, from the axis (axes coordinates in x, so any scale works)."""
    ax.text(0.01, y, text, transform=ax.get_yaxis_transform(), ha="left", va="center", fontsize=LABEL_FONT,
            color="0.35")


def _article_bar(ax: Axes, art: pd.DataFrame, scheme: str | None, column: str, y: float, height: float) -> float:
    if scheme not in art.index:
        return math.nan
    a = art.loc[scheme]
    v = float(a[column])
    ax.barh(y, v, height, facecolor="none", edgecolor="black", hatch="///", lw=0.8)
    ax.text(v * 1.15, y, f"{'<' if a.bound == 'upper' else '~'}{v:g}", ha="left", va="center", fontsize=LABEL_FONT)
    return v


def _series(run: RunData, regime: str) -> list[str]:
    """A design group's bar rows in every panel of a regime: ours, our C++ build if the regime has it, the article's."""
    cxx = any(run.get(PAPER, NATIVE_OF.get(s, ""), regime, "seq_step_ns") is not None for s in SCHEMES)
    return ["ours", *(["cxx"] if cxx else []), "article"]


SLOT, GAP = 1.0, 0.7  # a bar's row, and the space between two groups (y units)


def _slots(found: list[Group], series: list[str]) -> tuple[list[tuple[Group, str, float]], list[float]]:
    """(group, what, y) of every bar row, ``series`` for a design and ours alone for a plug-in; each group's centre."""
    slots, centres, y = [], [], 0.0
    for group in found:
        mine = series if group.scheme else ["ours"]
        slots += [(group, what, y + j * SLOT) for j, what in enumerate(mine)]
        centres.append(y + (len(mine) - 1) * SLOT / 2)
        y += len(mine) * SLOT + GAP
    return slots, centres


def _sources(run: RunData, regime: str, impls: list[str]) -> list[str]:
    rows = [run.get(PAPER, i, regime, "l1d_misses_per_seq_step") for i in impls]
    return list(dict.fromkeys(str(r["source"]) for r in rows if r is not None and r["status"] == "ok"))


def _rows_axis(ax: Axes, found: list[Group], slots: list, centres: list[float]) -> None:
    """The y axis of a panel: a tick per group at its centre, the first group at the top."""
    ax.set_yticks(centres, [g.name for g in found], fontsize=8.5)
    ax.set_ylim(max(y for _, _, y in slots) + SLOT * 0.7, -SLOT * 0.7)


def _panel(ax: Axes, run: RunData, art: pd.DataFrame, regime: str, metric: str) -> None:
    found = groups(run)
    slots, centres = _slots(found, _series(run, regime))
    impls = [i for g in found for i in (g.ours, g.cxx) if i]
    sources = _sources(run, regime, impls)
    measured = any(run.value(PAPER, i, regime, metric) > 0 for i in impls)
    spans: list[tuple[float, float]] = []
    for group, what, y in slots:
        if what == "article" and COLUMNS[metric][2] is not None:
            v = _article_bar(ax, art, group.scheme, COLUMNS[metric][2], y, SLOT * 0.9)
            spans.append((v, v))
        elif what != "article" and (what == "ours" or group.cxx) and (measured or metric != "l1d_misses_per_seq_step"):
            spans.append(_bar(ax, run, group.ours if what == "ours" else str(group.cxx), regime, metric, y,
                              SLOT * 0.9, len(sources) > 1))
    ax.set_xscale("log")
    ax.xaxis.set_minor_formatter(NullFormatter())  # a range under a decade labels minor ticks, overlapping
    shown = [(lo, hi) for lo, hi in spans if lo > 0 and hi > 0]
    if shown:
        _x_headroom(ax, min(lo for lo, _ in shown) * 0.5, max(hi for _, hi in shown))
    _rows_axis(ax, found, slots, centres)
    ax.set_xlabel(COLUMNS[metric][1], fontsize=8)
    title = COLUMNS[metric][0]
    if metric == "l1d_misses_per_seq_step" and len(sources) == 1:
        title += f" ({sources[0]})"
    ax.set_title(title, fontsize=9.5)
    ax.grid(axis="x", which="both", alpha=0.25)
    ax.set_axisbelow(True)
    if metric == "l1d_misses_per_seq_step" and not shown:
        ax.text(0.5, 0.5, _l1d_missing_words(run, regime), transform=ax.transAxes, ha="center", va="center",
                fontsize=7.5, color="0.3", wrap=True)


def _x_headroom(ax: Axes, low: float, high: float, share: float = 0.38) -> None:
    """A log x axis from ``low`` to above ``high`` with ``share`` of its width left free for the bars' labels."""
    low, high = max(low, 1e-12), max(high, low * 10)
    span = math.log10(high / low)
    ax.set_xlim(low, high * 10 ** (span * share / (1 - share)))


def _l1d_missing_words(run: RunData, regime: str) -> str:
    """Why a row has no L1D misses: the reasons of its rate's rows (``perf: no PMU``)."""
    df = run.df
    sel = df[(df.scenario == PAPER) & (df.metric == RATE) & (df.regime == regime) & df.impl.isin(SCHEMES.values())]
    states = sorted({f"{r['source']}: {reason_word(r, run.meta)}" for r in sel.to_dict("records")})
    return "not measured in this run\n" + ("\n".join(states) if states else "(no L1D rows: the L1D study did not run)")


def _pmu_rates(run: RunData) -> bool:
    """Whether a PMU measured any design's L1D miss rate in this run (only then is a rate drawn)."""
    df = run.df
    return bool(((df.scenario == PAPER) & (df.metric == RATE) & (df.source == PMU_SOURCE) & (df.status == "ok")).any())


def _rate_panel(ax: Axes, run: RunData, art: pd.DataFrame, regime: str) -> None:
    """L1D miss rate measured by the PMU beside the article's rates (linear: a rate is bounded by 100 %)."""
    top = 1.0
    found = groups(run)
    slots, centres = _slots(found, _series(run, regime))
    for group, what, y in slots:
        if what == "cxx":
            continue
        if what == "article":
            a = art.loc[group.scheme]
            ax.barh(y, float(a.l1d_miss_pct), SLOT * 0.9, facecolor="none", edgecolor="black", hatch="///", lw=0.8)
            ax.text(float(a.l1d_miss_pct), y, f" ~{a.l1d_miss_pct:g}", ha="left", va="center", fontsize=LABEL_FONT)
            top = max(top, float(a.l1d_miss_pct))
            continue
        row = run.get(PAPER, group.ours, regime, RATE)
        if row is not None and row["status"] == "ok" and row["source"] == PMU_SOURCE:
            v = float(row["value"])
            ax.barh(y, v, SLOT * 0.9, color=color(group.ours, run), edgecolor="white")
            ax.text(v, y, f" {v:.2g} %", ha="left", va="center", fontsize=LABEL_FONT)
            top = max(top, v)
        else:
            _word(ax, y, status_word(row, run.meta))
    ax.set_xlim(0, top * 1.35)
    _rows_axis(ax, found, slots, centres)
    ax.set_title("L1D miss rate (perf, hardware counters)", fontsize=9.5)
    ax.set_xlabel("misses / loads (%)", fontsize=8)
    ax.grid(axis="x", alpha=0.25)
    ax.set_axisbelow(True)


def _rate_words(art: pd.DataFrame, meta: dict) -> str:
    rates = ", ".join(f"{s} {'<' if art.loc[s].bound == 'upper' else '~'}{art.loc[s].l1d_miss_pct:g} %"
                      for s in SCHEMES if s in art.index)
    return (f"L1D miss rate: drawn only where a PMU measures it (PMU here: {meta.get('pmu', '?')}); the article's "
            f"rates: {rates}. A rate flatters code that makes many cheap accesses: misses per sequence-step are the "
            "comparable figure.")


def _has_operations(run: RunData, regime: str) -> bool:
    """Whether the regime has per-operation figures for designs A/B/C or a plug-in (the step regime has none)."""
    return any(run.get(PAPER, i, regime, "seq_step_ns") is not None
               and run.get(PAPER, i, regime, "lookup_ns") is not None
               and run.get(PAPER, i, regime, "lookup_ns")["status"] != "skipped"
               for i in [*SCHEMES.values(), *plugins_of(run)])


def fig_paper_vs_article(run: RunData) -> Figure | None:
    """The article's table measured, a regime per row, plug-ins below; bars labelled with their ratio to ``flat``."""
    regimes = [r for r in run.regimes(PAPER, "seq_step_ns") if _has_operations(run, r)]
    if not regimes:
        log.warning("paper_vs_article: no figures for designs A/B/C in the %s scenario", PAPER)
        return None
    art = article_table(run)
    rates = _pmu_rates(run)
    found = groups(run)
    l1d = any(run.value(PAPER, i, r, L1D) > 0 for g in found for i in (g.ours, g.cxx) if i for r in regimes)
    metrics = [m for m in COLUMNS if l1d or m != L1D]
    ncols = len(metrics) + (1 if rates else 0)
    slots, _ = _slots(found, ["ours", "cxx", "article"])
    row_in = 0.2 * len(slots) + 0.1 * len(found) + 1.3
    fig = Figure(figsize=(3.6 * ncols + 1.6 + 0.07 * max(len(g.name) for g in found), row_in * len(regimes) + 0.9),
                 layout="constrained")
    rows = fig.subfigures(len(regimes), 1, squeeze=False)[:, 0]
    for sub, regime in zip(rows, regimes, strict=True):
        sub.suptitle(regime_title(regime), fontsize=10.5, x=0.01, ha="left")
        axes = sub.subplots(1, ncols, squeeze=False, sharey=True)[0]
        for ax, metric in zip(axes, metrics, strict=False):
            _panel(ax, run, art, regime, metric)
        if rates:
            _rate_panel(axes[-1], run, art, regime)
    impls = [i for g in found for i in (g.ours, g.cxx)
             if i and any(run.value(PAPER, i, r, m) > 0 for r in regimes for m in COLUMNS)]
    handles = [Patch(color=color(i, run), label=label(i)) for i in impls]
    handles += [Patch(facecolor="none", edgecolor="black", hatch="///", label=ARTICLE),
                Line2D([], [], color="black", marker="|", lw=0.9, label="95 % interval")]
    fig.legend(handles=handles, fontsize=8, loc="outside right upper", frameon=False)
    caption = ("Beside each bar: our figure, then its ratio to C flat measured in the same run and regime [paired 95 % "
               "interval]; the article's figures are hatched. " + ("" if rates else _rate_words(art, run.meta)))
    if not l1d:
        caption += " L1D misses per sequence-step: " + _l1d_missing_words(run, regimes[0]).replace("\n", "; ") + "."
    return finish(fig, run, "The article's table on the paper scenario: ours (Python, Numba, C++; this machine) vs "
                            "the article (C++), ratios to C flat", caption)
