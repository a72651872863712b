"""The headline figure, ``paper_vs_article``: the article's table measured, one regime per row of panels.
Design: docs/output.md#harnessoutputheadlinepy."""

from __future__ import annotations

import logging
import math

import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from harness.base.rows import ratio_metric
from harness.output.drawing import (
    ARTICLE,
    NATIVE_OF,
    SCHEMES,
    color,
    finish,
    label,
    log_headroom,
    num,
    reason_word,
    status_word,
    whisker,
    word_at,
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
PMU_SOURCE = "perf"


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


def _bar(ax: Axes, run: RunData, impl: str, regime: str, metric: str, x: float, width: float) -> float:
    """One of our bars with its whisker and label, or its status word; returns its height (NaN when none)."""
    row = run.get(PAPER, impl, regime, metric)
    v = run.value(PAPER, impl, regime, metric)
    if math.isnan(v) or v <= 0:
        if row is not None:
            word_at(ax, x, "0" if v == 0 else status_word(row, run.meta))
        elif run.get(PAPER, impl, regime, "seq_step_ns") is None:
            word_at(ax, x, "not in this run")
        return math.nan
    ax.bar(x, v, width, color=color(impl), edgecolor="white", linewidth=0.5)
    top = v
    if bounds := interval_of(row):
        whisker(ax, x, *bounds)
        top = max(v, bounds[1])
    text = num(v)
    if ratio := _ratio_label(run, impl, regime, COLUMNS.get(metric, (None,) * 4)[3]):
        text += "  " + ratio
    if metric == "l1d_misses_per_seq_step":
        text += "  " + str(row["source"])
    ax.text(x, top * 1.15, text, rotation=90, ha="center", va="bottom", fontsize=6.3)
    return v


def _article_bar(ax: Axes, art: pd.DataFrame, scheme: str, column: str, x: float, width: float) -> float:
    if scheme not in art.index:
        return math.nan
    a = art.loc[scheme]
    v = float(a[column])
    ax.bar(x, v, width, facecolor="none", edgecolor="black", hatch="///", lw=0.8)
    ax.text(x, v * 1.15, f"{'<' if a.bound == 'upper' else '~'}{v:g}", rotation=90, ha="center", va="bottom",
            fontsize=6.3)
    return v


def _series(run: RunData, regime: str, metric: str) -> list[str]:
    """The bars of each design group: ours (Python/Numba), our C++ build where the regime has it, the article's."""
    cxx = any(run.get(PAPER, NATIVE_OF.get(s, ""), regime, "seq_step_ns") is not None for s in SCHEMES)
    article = COLUMNS[metric][2] is not None
    return ["ours", *(["cxx"] if cxx else []), *(["article"] if article else [])]


def _panel(ax: Axes, run: RunData, art: pd.DataFrame, regime: str, metric: str) -> None:
    series = _series(run, regime, metric)
    width = 0.84 / len(series)
    heights: list[float] = []
    for k, (scheme, impl) in enumerate(SCHEMES.items()):
        for j, what in enumerate(series):
            x = k - 0.42 + width * (j + 0.5)
            if what == "article":
                heights.append(_article_bar(ax, art, scheme, COLUMNS[metric][2], x, width))
            else:
                heights.append(_bar(ax, run, impl if what == "ours" else NATIVE_OF.get(scheme, ""), regime, metric,
                                    x, width))
    ax.set_yscale("log")
    found = [h for h in heights if not math.isnan(h) and h > 0]
    if found:
        log_headroom(ax, min(found) * 0.5, max(found), share=0.45)
    ax.set_xticks(range(len(SCHEMES)), [label(i) for i in SCHEMES.values()], fontsize=8.5)
    ax.set_xlim(-0.5, len(SCHEMES) - 0.5)
    ax.set_ylabel(COLUMNS[metric][1], fontsize=8)
    ax.set_title(COLUMNS[metric][0], fontsize=9.5)
    ax.grid(axis="y", which="both", alpha=0.25)
    if metric == "l1d_misses_per_seq_step" and not found:
        ax.text(0.5, 0.5, _l1d_missing_words(run, regime), transform=ax.transAxes, ha="center", va="center",
                fontsize=7.5, color="0.3", wrap=True)


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
    width = 0.84 / 2
    top = 1.0
    for k, (scheme, impl) in enumerate(SCHEMES.items()):
        row = run.get(PAPER, impl, regime, RATE)
        x = k - 0.42 + width * 0.5
        if row is not None and row["status"] == "ok" and row["source"] == PMU_SOURCE:
            v = float(row["value"])
            ax.bar(x, v, width, color=color(impl), edgecolor="white")
            ax.text(x, v, f"{v:.2g} %", ha="center", va="bottom", fontsize=6.5)
            top = max(top, v)
        else:
            word_at(ax, x, status_word(row, run.meta))
        if scheme in art.index:
            a = art.loc[scheme]
            xa = x + width
            ax.bar(xa, float(a.l1d_miss_pct), width, facecolor="none", edgecolor="black", hatch="///", lw=0.8)
            ax.text(xa, float(a.l1d_miss_pct), f"~{a.l1d_miss_pct:g}", ha="center", va="bottom", fontsize=6.5)
            top = max(top, float(a.l1d_miss_pct))
    ax.set_ylim(0, top * 1.3)
    ax.set_xticks(range(len(SCHEMES)), [label(i) for i in SCHEMES.values()], fontsize=8.5)
    ax.set_xlim(-0.5, len(SCHEMES) - 0.5)
    ax.set_title("L1D miss rate (perf, hardware counters)", fontsize=9.5)
    ax.set_ylabel("misses / loads (%)", fontsize=8)
    ax.grid(axis="y", alpha=0.25)


def _rate_words(art: pd.DataFrame, meta: dict) -> str:
    rates = ", ".join(f"{s} {'<' if art.loc[s].bound == 'upper' else '~'}{art.loc[s].l1d_miss_pct:g} %"
                      for s in SCHEMES if s in art.index)
    return (f"L1D miss rate: drawn only where a PMU measures it (PMU here: {meta.get('pmu', '?')}); the article's "
            f"rates: {rates}. A rate flatters code that makes many cheap accesses: misses per sequence-step are the "
            "comparable figure.")


def _has_operations(run: RunData, regime: str) -> bool:
    """Whether the regime has per-operation figures for designs A/B/C (the step regime has none)."""
    return any(run.get(PAPER, i, regime, "seq_step_ns") is not None
               and run.get(PAPER, i, regime, "lookup_ns") is not None
               and run.get(PAPER, i, regime, "lookup_ns")["status"] != "skipped" for i in SCHEMES.values())


def fig_paper_vs_article(run: RunData) -> Figure | None:
    """The article's table measured, one regime per row, our bars labelled with their ratio to ``flat``."""
    regimes = [r for r in run.regimes(PAPER, "seq_step_ns") if _has_operations(run, r)]
    if not regimes:
        log.warning("paper_vs_article: no figures for designs A/B/C in the %s scenario", PAPER)
        return None
    art = article_table()
    rates = _pmu_rates(run)
    metrics = list(COLUMNS)
    ncols = len(metrics) + (1 if rates else 0)
    fig = Figure(figsize=(3.4 * ncols + 1.8, 3.9 * len(regimes) + 0.6), layout="constrained")
    rows = fig.subfigures(len(regimes), 1, squeeze=False)[:, 0]
    for sub, regime in zip(rows, regimes, strict=True):
        sub.suptitle(regime_title(regime), fontsize=10.5, x=0.01, ha="left")
        axes = sub.subplots(1, ncols, squeeze=False)[0]
        for ax, metric in zip(axes, metrics, strict=False):
            _panel(ax, run, art, regime, metric)
        if rates:
            _rate_panel(axes[-1], run, art, regime)
    impls = [i for i in [*SCHEMES.values(), *NATIVE_OF.values()] if run.has(PAPER, i)]
    handles = [Patch(color=color(i), label=label(i)) for i in impls]
    handles += [Patch(facecolor="none", edgecolor="black", hatch="///", label=ARTICLE),
                Line2D([], [], color="black", marker="_", lw=0.9, label="95 % interval")]
    fig.legend(handles=handles, fontsize=7.5, loc="outside right upper", frameon=False)
    caption = ("Above each bar: our figure, then its ratio to C flat measured in the same run and regime [paired 95 % "
               "interval]; the article's figures are hatched. " + ("" if rates else _rate_words(art, run.meta)))
    return finish(fig, run, "The article's table on the paper scenario: ours (Python, Numba, C++; this machine) vs "
                            "the article (C++), ratios to C flat", caption)
