"""Figures of a run, rendered from ``results.csv``, ``meta.json`` and ``raw/`` into ``figures/`` (PNG and SVG).
Design: docs/output.md#harnessoutputplotspy."""

from __future__ import annotations

import logging
import math
import re
import statistics
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import NullFormatter

from harness.base.rows import ratio_metric
from harness.errors import WriteError
from harness.output import growth
from harness.output.cache_report import caching_scenarios
from harness.output.drawing import (
    ARTICLE,
    MIN_FONT,
    SCHEMES,
    article_handles,
    article_marker,
    ci,
    color,
    finish,
    instrument_words,
    label,
    log_headroom,
    new_figure,
    note,
    num,
    regime_hatch,
    regime_style,
    reps_of,
    save_figure,
    series_panels,
    status_word,
    whisker,
    word_at,
)
from harness.output.formatting import CACHE_BASE, fmt
from harness.output.headline import fig_paper_vs_article
from harness.output.paced_report import FLOOR, WHOLE
from harness.output.report import article_table
from harness.output.rundata import RunData, ordered, ordered_regimes
from harness.run.matrix import SWEEP, matches
from harness.studies import idwidth
from scenarios import PAPER

__all__ = ["FIGURES", "RunData", "render_figures", "save_figure"]

log = logging.getLogger(__name__)

DTYPE_COLORS = {"uint16": "#1b9e77", "int32": "#e6ab02", "int64": "#d95f02"}
DEFAULT_RATE = 2000.0

# metric -> (axis label, raw kinds whose per-repetition totals it divides)
OP_METRICS = {
    "lookup_ns": ("lookup\n(per lookup)", ("lookup",)),
    "alloc_ns": ("allocate\n(per block)", ("alloc",)),
    "free_ns": ("free\n(per block)", ("free",)),
    "alloc_free_ns": ("alloc + free\n(per block)", ("alloc", "free")),
    "seq_step_ns": ("whole step\n(per sequence)", ()),
}
ARTICLE_OF = {"lookup_ns": "lookup_ns_per_step", "alloc_free_ns": "alloc_free_ns_per_block",
              "cpu_share_pct": "cpu_share_pct_at_2000_steps_s", "l1d_miss_pct": "l1d_miss_pct"}


def _rate_of(row: dict | None) -> float:
    """The step rate a CPU-share row was computed at (its ``step_rate`` column), else the article's."""
    rate = row.get("step_rate") if row else None
    return float(rate) if rate is not None and not pd.isna(rate) else DEFAULT_RATE


def regime_panels(run: RunData, scenario: str, metrics, impls_of=None) -> list[tuple[str, str, list[str]]]:
    """(regime, title, impls) per panel of at most eight implementations with a row of one of ``metrics``."""
    panels = []
    for regime in run.regimes(scenario, "seq_step_ns"):
        impls = list(dict.fromkeys(i for m in metrics for i in run.impls(scenario, m, regime)))
        if impls_of is not None:
            impls = [i for i in impls if impls_of(regime, i)]
        panels += [(regime, title, members) for title, members in series_panels(impls)]
    return panels


def _rep_values(run: RunData, scenario: str, impl: str, regime: str, metric: str, value: float) -> list[float]:
    """Per-repetition values of a per-operation figure, rebuilt from the raw per-kind totals."""
    kinds = OP_METRICS[metric][1]
    raw = run.raw(scenario, impl, regime)
    if not kinds or raw is None:
        return []
    totals = [sum(float(t.get(k, math.nan)) for k in kinds) for t in raw.get("kind_ns_totals", [])]
    totals = [t for t in totals if math.isfinite(t)]
    if len(totals) < 2:
        return []
    mid = statistics.median(totals)
    return [value * t / mid for t in totals] if mid > 0 else []


def _op_spread(ax: Axes, run: RunData, impl: str, regime: str, metric: str, x: float, v: float) -> str:
    """Draw the bar's spread; returns what it is ("ci", "reps", "steps" or "")."""
    if bounds := ci(run.get(PAPER, impl, regime, metric)):
        whisker(ax, x, *bounds)
        return "ci"
    if metric == "seq_step_ns":
        mean_step = run.value(PAPER, impl, regime, "step_mean_ns")
        p50, p99 = (run.value(PAPER, impl, regime, m) for m in ("step_p50_ns", "step_p99_ns"))
        if mean_step > 0 and not (math.isnan(p50) or math.isnan(p99)):
            running = mean_step / v  # seq_step = mean step / mean running sequences, exactly
            whisker(ax, x, p50 / running, p99 / running)
            return "steps"
        return ""
    reps = _rep_values(run, PAPER, impl, regime, metric, v)
    if reps:
        whisker(ax, x, min(reps), max(reps), "0.15")
        return "reps"
    return ""


def _op_article(ax: Axes, art: pd.DataFrame, impl: str, metric: str, x: float) -> str | None:
    """The article's figure of ``impl``'s design as a hollow marker at ``x``; returns its bound, None if none."""
    scheme = next((s for s, i in SCHEMES.items() if i == impl), None)
    if scheme in art.index and metric in ARTICLE_OF:
        a = art.loc[scheme]
        ax.plot(x, float(a[ARTICLE_OF[metric]]), marker=article_marker(a.bound)[0], mfc="none", mec="black",
                ms=6, ls="")
        return str(a.bound)
    return None


@dataclass
class Marks:
    """What a panel drew that its legend must name: kinds of spread, repetition counts, the article's bounds."""

    spreads: set[str] = field(default_factory=set)
    reps: set[int] = field(default_factory=set)
    bounds: set[str] = field(default_factory=set)

    def handles(self) -> list:
        """Legend entries for the whiskers and the article's markers this panel drew (none for what it did not)."""
        out = [Line2D([], [], color=SPREAD_SHADES[k], marker="_", lw=0.9, label=SPREAD_WORDS[k])
               for k in sorted(self.spreads - {""})]
        if not out:
            reps = "/".join(map(str, sorted(self.reps))) or "?"
            out.append(Patch(facecolor="none", edgecolor="none", label=f"bars: median of {reps} rep(s), no spread"))
        return out + [h for h in article_handles() if any(h.get_label().endswith(article_marker(b)[1])
                                                           for b in self.bounds)]


def _op_panel(ax: Axes, run: RunData, regime: str, impls: list[str], art: pd.DataFrame) -> Marks:
    """Bars of one panel, a group per operation and a bar per implementation; returns what it drew."""
    width = 0.84 / len(impls)
    marks = Marks()
    for g, metric in enumerate(OP_METRICS):
        for k, impl in enumerate(impls):
            x = g - 0.42 + width * (k + 0.5)
            row = run.get(PAPER, impl, regime, metric)
            v = run.value(PAPER, impl, regime, metric)
            if math.isnan(v) or v <= 0:
                if row is not None and row["status"] != "skipped":
                    word_at(ax, x, status_word(row, run.meta) if math.isnan(v) else "0")
                continue
            ax.bar(x, v, width, color=color(impl, run), edgecolor="white", linewidth=0.4)
            marks.reps.update(n for n in [reps_of(row)] if n)
            marks.spreads.add(_op_spread(ax, run, impl, regime, metric, x, v))
            marks.bounds.add(_op_article(ax, art, impl, metric, x) or "")
    marks.bounds.discard("")
    return marks


def _whole_step_panel(ax: Axes, run: RunData, regime: str, impls: list[str]) -> Marks:
    """A regime timed by whole steps only: one bar per implementation (named by its tick), whole step per sequence."""
    marks = Marks()
    for x, impl in enumerate(impls):
        row = run.get(PAPER, impl, regime, "seq_step_ns")
        v = run.value(PAPER, impl, regime, "seq_step_ns")
        if math.isnan(v) or v <= 0:
            word_at(ax, x, status_word(row, run.meta))
            continue
        ax.bar(x, v, 0.7, color=color(impl, run), edgecolor="white", linewidth=0.4)
        marks.reps.update(n for n in [reps_of(row)] if n)
        marks.spreads.add(_op_spread(ax, run, impl, regime, "seq_step_ns", x, v))
    ax.set_xticks(range(len(impls)), [label(i) for i in impls], fontsize=8, rotation=25, ha="right")
    ax.set_xlim(-0.6, len(impls) - 0.4)
    return marks


def _whole_steps_only(run: RunData, regime: str, impls: list[str]) -> bool:
    """Whether every per-operation figure of the panel was skipped (the step regime's whole-step timing)."""
    rows = [run.get(PAPER, i, regime, m) for i in impls for m in OP_METRICS if m != "seq_step_ns"]
    return bool(rows) and all(r is not None and r["status"] == "skipped" for r in rows)


SPREAD_WORDS = {"ci": "whiskers: 95 % bootstrap interval", "reps": "whiskers: min–max over repetitions",
                "steps": "whiskers: per-step p50–p99 ÷ mean running sequences"}
SPREAD_SHADES = {"ci": "black", "reps": "0.15", "steps": "black"}


def _op_layout(run: RunData) -> list[tuple[str, str, list[str], bool]]:
    """(regime, title, impls, whole steps only) per panel; a regime timed by whole steps only gets one panel."""
    panels = regime_panels(run, PAPER, OP_METRICS)
    out = []
    for regime in dict.fromkeys(r for r, _, _ in panels):
        mine = [(t, m) for r, t, m in panels if r == regime]
        everyone = list(dict.fromkeys(i for _, m in mine for i in m))
        if _whole_steps_only(run, regime, everyone):
            out.append((regime, f"whole step per sequence, one step() call per decode step ({len(everyone)} "
                                "implementations)", ordered(everyone), True))
        else:
            out += [(regime, t, m, False) for t, m in mine]
    return out


def fig_op_latency(run: RunData) -> Figure | None:
    """Per-operation latency, paper scenario: a panel per regime and family, one shared log axis."""
    panels = _op_layout(run)
    if not panels:
        log.warning("op_latency: no per-operation rows for the %s scenario", PAPER)
        return None
    art = article_table(run)
    fig, axes = new_figure(12, 2.9 * len(panels) + 0.5, len(panels), 1, sharey=True)
    for ax, (regime, title, impls, whole) in zip(axes, panels, strict=True):
        if whole:
            marks = _whole_step_panel(ax, run, regime, impls)
            handles = []
        else:
            marks = _op_panel(ax, run, regime, impls, art)
            ax.set_xticks(range(len(OP_METRICS)), [OP_METRICS[m][0] for m in OP_METRICS], fontsize=8.5)
            ax.set_xlim(-0.5, len(OP_METRICS) - 0.5)
            handles = [Patch(color=color(i, run), label=label(i)) for i in impls]
        ax.set_yscale("log")
        ax.set_ylabel("ns per operation (log)", fontsize=8.5)
        ax.set_title(f"{regime} regime: {title}", fontsize=10)
        ax.grid(axis="y", which="both", alpha=0.25)
        ax.legend(handles=handles + marks.handles(), fontsize=7.5, loc="upper left", bbox_to_anchor=(1.005, 1),
                  frameon=False)
    return finish(fig, run, "Per-operation latency, paper scenario (the article's workload): one shared axis")


def _cdf_curve(run: RunData, impl: str, regime: str) -> tuple[np.ndarray, str, int] | None:
    """Sorted per-step times of every repetition of a cell, its clock and repetition count, from ``raw/``."""
    raw = run.raw(PAPER, impl, regime) or {}
    reps = [np.asarray(r, dtype=float).ravel() for r in raw.get("step_ns", [])]
    steps = np.concatenate(reps) if reps else np.empty(0)
    steps = steps[np.isfinite(steps) & (steps > 0)]
    return (np.sort(steps), str(raw.get("clock", "?")), len(reps)) if steps.size else None


def fig_step_cdf(run: RunData) -> Figure | None:
    """Distribution of whole-step times, paper scenario, from the raw per-step samples; one shared time axis."""
    curves = {(i, r): c for r in run.regimes(PAPER, "step_p50_ns") for i in run.impls(PAPER, "step_p50_ns", r)
              if (c := _cdf_curve(run, i, r)) is not None}
    panels = [(r, t, m) for r, t, m in regime_panels(run, PAPER, ("step_p50_ns",), lambda r, i: (i, r) in curves)
              if m]
    if not panels:
        log.warning("step_cdf: no raw per-step samples for the %s scenario", PAPER)
        return None
    fig, axes = new_figure(12, 3.4 * len(panels) + 0.4, len(panels), 1, sharex=True)
    for ax, (regime, title, impls) in zip(axes, panels, strict=True):
        for impl in impls:
            steps, _, _ = curves[(impl, regime)]
            frac = np.arange(1, steps.size + 1) / steps.size
            ax.step(steps, frac, where="post", color=color(impl, run), lw=1.4, label=label(impl))
        ax.axhline(0.99, color="0.5", lw=0.7, ls=":")
        ax.text(0.005, 0.985, "p99", transform=ax.get_yaxis_transform(), va="top", fontsize=7, color="0.4")
        ax.set_xscale("log")
        ax.xaxis.set_minor_formatter(NullFormatter())  # a range under a decade labels minor ticks, overlapping
        ax.set_ylim(0, 1.01)
        ax.set_xlabel("whole-step block-manager time (ns, log)")
        ax.set_ylabel("fraction of steps ≤ x")
        ax.set_title(f"{regime} regime: {title}", fontsize=9.5)
        ax.grid(which="both", alpha=0.25)
        counts = "; ".join(sorted({f"{curves[(i, regime)][0].size} steps ({curves[(i, regime)][2]} rep(s))"
                                   for i in impls}))
        clocks = ", ".join(sorted({curves[(i, regime)][1] for i in impls}))
        ax.xaxis.set_tick_params(labelbottom=True)
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.005, 1), frameon=False,
                  title=f"per line: {counts}\nclocks: {clocks}", title_fontsize=7, alignment="left")
    return finish(fig, run, "Step-time CDF, paper scenario (closed loop, all repetitions pooled)")


def _concurrency_lines(run: RunData, sweep: dict[int, str]) -> tuple[list, list[str]]:
    """(impl, regime, [(running sequences, CPU share)]) of cells swept at two sizes or more; those at one only."""
    lines, alone = [], []
    regimes = ordered_regimes(r for s in sweep.values() for r in run.regimes(s, "cpu_share_pct"))
    for regime in regimes:
        impls = list(dict.fromkeys(i for s in sweep.values() for i in run.impls(s, "cpu_share_pct", regime)))
        for impl in ordered(impls):
            pts = [(n, run.value(sweep[n], impl, regime, "cpu_share_pct")) for n in sorted(sweep)]
            pts = [(n, v) for n, v in pts if not math.isnan(v) and v > 0]
            if len(pts) >= 2:
                lines.append((impl, regime, pts))
            elif pts:
                alone.append(sweep[pts[0][0]])
    return lines, alone


def _concurrency_panel(ax: Axes, run: RunData, sweep: dict[int, str], lines: list) -> None:
    """One panel of the concurrency figure: its lines with their intervals, the article's points of its designs."""
    for impl, regime, pts in lines:
        xs, ys = zip(*pts, strict=True)
        bounds = [ci(run.get(sweep[n], impl, regime, "cpu_share_pct")) or (y, y) for n, y in pts]
        yerr = [[y - lo for y, (lo, _) in zip(ys, bounds, strict=True)],
                [hi - y for y, (_, hi) in zip(ys, bounds, strict=True)]]
        ax.errorbar(xs, ys, yerr=yerr, ls=regime_style(regime), marker="o", ms=3.5, color=color(impl, run),
                    capsize=2, elinewidth=0.8, label=label(impl))
    art = article_table(run)
    drawn = set()
    for scheme, impl in SCHEMES.items():
        if scheme in art.index and any(i == impl for i, _, _ in lines):
            a = art.loc[scheme]
            ax.plot(256, float(a.cpu_share_pct_at_2000_steps_s), marker=article_marker(a.bound)[0], mfc="none",
                    mec=color(impl, run), mew=1.5, ms=8, ls="")
            drawn.add(str(a.bound))
    ax.axhline(100, color="black", lw=0.8, ls=":")
    ax.text(min(sweep), 100, " 100 % = one core", va="bottom", fontsize=7.5)
    ax.set_xscale("log", base=2)
    ax.set_xticks(sorted(sweep), [f"{n:,}" for n in sorted(sweep)])
    ax.set_yscale("log")
    ax.set_xlabel("running sequences per step (log scale)")
    ax.grid(which="both", alpha=0.25)
    handles, _ = ax.get_legend_handles_labels()
    handles += [Line2D([], [], marker=article_marker(b)[0], ls="", mfc="none", mec="black",
                       label=f"{ARTICLE} at 256 sequences, {article_marker(b)[1]} (marker colour = design)")
                for b in sorted(drawn)]
    ax.legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.005, 1), frameon=False)


def fig_cpu_concurrency(run: RunData) -> Figure | None:
    """Computed CPU share at 2,000 steps/s against running sequences (concurrency sweep), one shared axis."""
    sweep = {}
    rows = run.df[(run.df.metric == "cpu_share_pct") & run.df.seqs.notna()]
    for scenario, seqs in zip(rows.scenario, rows.seqs, strict=True):
        if matches(str(scenario), (SWEEP,)):
            sweep[int(seqs)] = scenario
    lines, alone = _concurrency_lines(run, sweep)
    if not lines:
        log.warning("cpu_share_concurrency: no cpu_share_pct rows for concurrency-N scenarios")
        return None
    first = lines[0]
    rate = _rate_of(run.get(sweep[first[2][0][0]], first[0], first[1], "cpu_share_pct"))
    regimes = ordered_regimes(r for _, r, _ in lines)
    panels = [(regime, title, members) for regime in regimes
              for title, members in series_panels([i for i, r, _ in lines if r == regime])]
    fig, axes = new_figure(10, 4.2 * len(panels) + 0.4, len(panels), 1, sharey=True)
    for ax, (regime, title, members) in zip(axes, panels, strict=True):
        _concurrency_panel(ax, run, sweep, [line for line in lines if line[0] in members and line[1] == regime])
        ax.set_title(f"{regime} regime: {title}", fontsize=9.5)
        ax.set_ylabel(f"block-manager CPU share at {rate:,.0f} steps/s (%, log scale)", fontsize=8.5)
    note(axes[-1], "computed: closed-loop mean\nstep time x step rate\nerror bars: 95 % bootstrap interval")
    counts = {scenario: alone.count(scenario) for scenario in alone}
    caption = ("Left out, measured at one size only (no line to draw): "
               + "; ".join(f"{n} cell(s) at {scenario} only" for scenario, n in counts.items()) + ".") if alone else ""
    return finish(fig, run, f"CPU share vs concurrency (computed at {rate:,.0f} steps/s)", caption)


PACED_KINDS = {"cpu_share_observed_pct": "paced decode calls", WHOLE: "paced one step() call"}
PACED_MARKERS = {("cpu_share_observed_pct", "batched"): "X", ("cpu_share_observed_pct", "per-call"): "P",
                 ("cpu_share_observed_pct", "step"): "s", (WHOLE, "batched"): "o"}


@dataclass(frozen=True)
class PacedPoint:
    """A cell's observed paced share (``y``) against its computed share at the same rate (``x``), intervals."""

    impl: str
    regime: str
    metric: str
    x: float
    y: float
    x_ci: tuple[float, float] | None
    y_ci: tuple[float, float] | None
    rate: float


def paced_points(run: RunData) -> tuple[list[PacedPoint], int]:
    """Paced shares of paper paired with their cells' computed shares at the paced rate; how many could not pair."""
    points, unpaired = [], 0
    for metric in PACED_KINDS:
        for regime in run.regimes(PAPER, metric):
            for impl in run.impls(PAPER, metric, regime):
                obs, comp = run.get(PAPER, impl, regime, metric), run.get(PAPER, impl, regime, "cpu_share_pct")
                y, x = run.value(PAPER, impl, regime, metric), run.value(PAPER, impl, regime, "cpu_share_pct")
                if not (x > 0 and y > 0):
                    unpaired += obs is not None and obs["status"] == "ok"
                    continue
                scale = _rate_of(obs) / _rate_of(comp)
                x_ci = ci(comp)
                points.append(PacedPoint(impl, regime, metric, x * scale, y,
                                         (x_ci[0] * scale, x_ci[1] * scale) if x_ci else None, ci(obs),
                                         _rate_of(obs)))
    return points, unpaired


def _paced_errorbars(ax: Axes, impl: str, pts: list[PacedPoint], shade: str) -> None:
    """One implementation's points with both intervals (cut, with an arrow, below a quarter of the point)."""
    def err(v: float, bounds: tuple[float, float] | None) -> tuple[float, float]:
        lo, hi = bounds or (v, v)
        return v - max(lo, v / 4), max(hi - v, 0.0)

    xerr = np.array([err(p.x, p.x_ci) for p in pts]).T
    yerr = np.array([err(p.y, p.y_ci) for p in pts]).T
    ax.errorbar([p.x for p in pts], [p.y for p in pts], xerr=xerr, yerr=yerr, ls="", color=shade,
                elinewidth=0.9, capsize=2.5, label=label(impl))
    for p in pts:
        ax.plot([p.x], [p.y], marker=PACED_MARKERS.get((p.metric, p.regime), "d"), color=shade,
                mec="black", mew=0.6, ms=8, ls="")
        if p.y_ci and p.y_ci[0] < p.y / 4:
            ax.plot([p.x], [p.y / 4], marker="v", color=shade, ms=4, ls="")


def _paced_floor(ax: Axes, run: RunData) -> Line2D | None:
    """The do-nothing crossing (``paced_floor_pct``) as a line with its interval as a band; its legend handle."""
    v = run.value(PAPER, "-", "-", FLOOR)
    if not v > 0:
        return None
    if bounds := ci(run.get(PAPER, "-", "-", FLOOR)):
        ax.axhspan(max(bounds[0], v / 4), bounds[1], color="0.85", zorder=0)
    return ax.axhline(v, color="black", lw=1.2, ls="-.", label="paced floor: a compiled call that does nothing")


def _paced_panel(ax: Axes, run: RunData, pts: list[PacedPoint], limits: tuple[float, float]) -> None:
    for impl in ordered(p.impl for p in pts):
        _paced_errorbars(ax, impl, [p for p in pts if p.impl == impl], color(impl, run))
    ax.plot(limits, limits, color="0.4", lw=0.9, ls=":", label="observed = computed")
    floor = _paced_floor(ax, run)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(*limits)
    ax.set_ylim(*limits)
    ax.set_aspect("equal")
    ax.grid(which="both", alpha=0.25)
    kinds = dict.fromkeys((p.metric, p.regime) for p in pts)
    handles, _ = ax.get_legend_handles_labels()
    handles = [h for h in handles if h is not floor] + ([floor] if floor is not None else [])
    handles += [Line2D([], [], marker=PACED_MARKERS.get(k, "d"), ls="", color="0.6", mec="black",
                       label=f"{PACED_KINDS[k[0]]}, {k[1]} cell") for k in kinds]
    ax.legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.005, 1), frameon=False)


def fig_cpu_paced(run: RunData) -> Figure | None:
    """CPU share observed in a paced loop against the share computed from the closed loop, cell by cell."""
    points, unpaired = paced_points(run)
    if not points:
        log.warning("cpu_share_paced: no paced CPU-share rows with a computed share in the %s scenario", PAPER)
        return None
    values = [v for p in points for v in (p.x, p.y, *(p.x_ci or ()), *(p.y_ci or ())) if v > 0]
    floor = run.value(PAPER, "-", "-", FLOOR)
    values += [floor] if floor > 0 else []
    limits = (min(values) / 3, max(values) * 3)
    panels = series_panels(ordered(p.impl for p in points))
    fig, axes = new_figure(8.2, 6.0 * len(panels) + 0.4, len(panels), 1)
    for ax, (title, members) in zip(axes, panels, strict=True):
        _paced_panel(ax, run, [p for p in points if p.impl in members], limits)
        ax.set_title(title, fontsize=9.5)
        ax.set_xlabel(f"computed: closed-loop mean step time x {fmt(points[0].rate)} steps/s (% of one core, log)")
        ax.set_ylabel(f"observed: paced at {fmt(points[0].rate)} steps/s (% of one core, log)")
    caption = ("Each point: one cell's CPU share in an open loop paced from Python (median over interleaved "
               "repetitions) against the share computed from its closed-loop mean step time at the same rate; "
               "bars: 95 % intervals (an arrow: the interval reaches further down, below zero included). Above "
               "the diagonal the paced loop costs more than its timed calls; no block manager entered once per step "
               "goes below the floor.")
    if unpaired:
        caption += f" {unpaired} paced figure(s) without a computed share, or at zero, are not drawn."
    return finish(fig, run, "CPU share, paper scenario: observed in a paced loop against computed", caption)


def _grouped_values(run: RunData, metric: str, impls: list[str], regimes: list[str], width: float) -> Iterator:
    """``(x, impl, regime, row, value)`` of ``metric`` in paper, ``x`` the bar's centre (group ``k`` at ``k``)."""
    for k, impl in enumerate(impls):
        for j, regime in enumerate(regimes):
            x = k - 0.4 + width * (j + 0.5)
            yield x, impl, regime, run.get(PAPER, impl, regime, metric), run.value(PAPER, impl, regime, metric)


def _sources(run: RunData, metric: str, impls: list[str], regimes: list[str]) -> list[str]:
    """The instruments that measured the panel's bars (``callgrind-sim``, ``perf``), in the order found."""
    rows = [run.get(PAPER, i, r, metric) for i in impls for r in regimes]
    return list(dict.fromkeys(str(r["source"]) for r in rows if r is not None and r["status"] == "ok"))


SOURCE_WORDS = {"perf": "perf: hardware counters", "callgrind-sim": "callgrind-sim: simulated caches"}


def _l1d_bars(ax: Axes, run: RunData, metric: str, impls: list[str], regimes: list[str], article: bool) -> float:
    """Labelled bars of ``metric`` per implementation and regime (beside the article's); returns the tallest."""
    ran = set(run.cells(PAPER))
    width = 0.8 / (len(regimes) + (1 if article else 0))
    top = 0.0
    art = article_table(run)
    missing: list[tuple[float, str]] = []
    several = len(_sources(run, metric, impls, regimes)) > 1
    for x, impl, regime, row, v in _grouped_values(run, metric, impls, regimes, width):
        if math.isnan(v):
            if (impl, regime) in ran:
                missing.append((x, instrument_words(run.rows(PAPER, impl, regime, "l1d_miss_pct"), run.meta)))
            continue
        ax.bar(x, v, width, color=color(impl, run), hatch=regime_hatch(regime), edgecolor="white")
        ax.text(x, v, f" {v:.2g}" + (f" {row['source']}" if several else ""), ha="center", va="bottom",
                fontsize=MIN_FONT, rotation=90)
        top = max(top, v)
    _missing_words(ax, missing, measured=top > 0)
    for k, impl in enumerate(impls):
        scheme = next((s for s, i in SCHEMES.items() if i == impl), None)
        if article and scheme in art.index:
            a = art.loc[scheme]
            x = k - 0.4 + width * (len(regimes) + 0.5)
            ax.bar(x, float(a.l1d_miss_pct), width, facecolor="none", edgecolor="black", hatch="///", lw=0.8)
            ax.text(x, float(a.l1d_miss_pct), f" ~{a.l1d_miss_pct:g}", ha="center", va="bottom", fontsize=MIN_FONT,
                    rotation=90)
            top = max(top, float(a.l1d_miss_pct))
    ax.set_xticks(range(len(impls)), [label(i) for i in impls], fontsize=8, rotation=30, ha="right")
    ax.set_xlim(-0.5, len(impls) - 0.5)
    ax.grid(axis="y", alpha=0.25)
    return top


def _source_title(run: RunData, metric: str, impls: list[str], regimes: list[str]) -> str:
    """The panel's instrument in words when all its bars share one (``; measured by callgrind-sim: ...``)."""
    found = _sources(run, metric, impls, regimes)
    if len(found) != 1:
        return "; each bar names its instrument" if found else ""
    return f"; every bar: {SOURCE_WORDS.get(found[0], found[0])}"


def _missing_words(ax: Axes, missing: list[tuple[float, str]], measured: bool) -> None:
    """Why cells have no bar: once for the whole panel when no cell was measured for one reason, else per bar."""
    reasons = {words for _, words in missing}
    if missing and not measured and len(reasons) == 1:
        ax.text(0.5, 0.5, f"no cell measured in this run: {reasons.pop()}", transform=ax.transAxes, ha="center",
                va="center", fontsize=9, color="0.35")
        return
    for x, words in missing:
        word_at(ax, x, words)


L1D_MISSES = "l1d_misses_per_seq_step"


def _l1d_article_only(run: RunData, impls: list[str], regimes: list[str]) -> Figure:
    """A run that measured no L1D figure: the article's rates alone, and why ours are missing, said once."""
    ran = set(run.cells(PAPER))
    reasons = list(dict.fromkeys(instrument_words(run.rows(PAPER, i, r, "l1d_miss_pct"), run.meta)
                                 for i in impls for r in regimes if (i, r) in ran))
    designs = [i for i in impls if i in SCHEMES.values()] or list(SCHEMES.values())
    fig, (ax,) = new_figure(9, 4.6)
    top = _l1d_bars(ax, run, "l1d_miss_pct", designs, [], True)
    ax.set_ylim(0, max(top, 1.0) * 1.5)
    ax.set_ylabel("L1D misses / L1D accesses (%)")
    ax.set_title("the article's miss rates; none of ours measured in this run", fontsize=9.5)
    words = "\n".join(reasons) or "no L1D rows (the L1D study did not run)"
    ax.text(0.98, 0.95, f"not measured in this run:\n{words}", transform=ax.transAxes, ha="right", va="top",
            fontsize=8, color="0.3")
    ax.legend(handles=[Patch(facecolor="none", edgecolor="black", hatch="///", label=ARTICLE)], fontsize=7.5,
              loc="upper left", bbox_to_anchor=(1.005, 1), frameon=False)
    return finish(fig, run, "L1D misses by design, paper scenario")


def fig_l1d(run: RunData) -> Figure | None:
    """L1D misses per sequence-step and the miss rate beside the article's, per design and regime, labelled."""
    rate = "l1d_miss_pct"
    regimes = run.regimes(PAPER, rate)
    impls = list(dict.fromkeys(i for r in regimes for i in run.impls(PAPER, rate, r)))
    if not impls:
        regimes = run.regimes(PAPER, "seq_step_ns")
        impls = [i for i in SCHEMES.values() if i in run.impls(PAPER, "seq_step_ns")]
        if not impls:
            log.warning("l1d_miss: no %s rows and no design A/B/C in the %s scenario", rate, PAPER)
            return None
        log.warning("l1d_miss: no %s rows in this run; the figure shows the article's figures only", rate)
    if not any(run.value(PAPER, i, r, m) > 0 for i in impls for r in regimes for m in (rate, L1D_MISSES)):
        return _l1d_article_only(run, impls, regimes)
    fig, axes = new_figure(14, 9, 2, 1)
    top = _l1d_bars(axes[0], run, L1D_MISSES, impls, regimes, False)
    axes[0].set_ylim(0, max(top, 1.0) * 1.5)
    axes[0].set_ylabel("L1D misses per sequence-step")
    axes[0].set_title("misses per sequence-step (comparable across designs)"
                      + _source_title(run, L1D_MISSES, impls, regimes), fontsize=9.5)
    top = _l1d_bars(axes[1], run, rate, impls, regimes, True)
    axes[1].set_ylim(0, max(top, 1.0) * 1.5)
    axes[1].set_ylabel("L1D misses / L1D accesses (%)")
    axes[1].set_title("miss rate, beside the article's (a rate flatters many cheap accesses)"
                      + _source_title(run, rate, impls, regimes), fontsize=9.5)
    handles = [Patch(facecolor="0.6", edgecolor="white", label=f"measured, {r}", hatch=regime_hatch(r))
               for r in regimes]
    handles.append(Patch(facecolor="none", edgecolor="black", hatch="///", label=ARTICLE))
    axes[1].legend(handles=handles, fontsize=7.5, loc="upper left", bbox_to_anchor=(1.005, 1), frameon=False)
    note(axes[1], f"instruments:\nperf = hardware counters\ncallgrind-sim = simulated caches\n"
                  f"PMU here: {run.meta.get('pmu', '?')}")
    return finish(fig, run, "L1D misses by design, paper scenario")


def fig_allocs(run: RunData) -> Figure | None:
    """Allocation events per decode step per design and regime (symlog: flat allocates nothing)."""
    own = "the design's own allocations (exact: memray by its frames, NRT stats, C++ counter)"
    metrics = [(m, t) for m, t in (("allocs_per_step", own),
                                   ("nrt_allocs_per_step", "Numba runtime allocations (NRT stats)"))
               if run.regimes(PAPER, m)]
    if not metrics:
        log.warning("allocs_per_step: no allocation rows for the %s scenario", PAPER)
        return None
    fig, axes = new_figure(13, 4.4 * len(metrics), len(metrics), 1)
    for ax, (metric, title) in zip(axes, metrics, strict=True):
        regimes = run.regimes(PAPER, metric)
        impls = list(dict.fromkeys(i for r in regimes for i in run.impls(PAPER, metric, r)))
        width = 0.8 / len(regimes)
        top = 1.0
        for x, impl, regime, row, v in _grouped_values(run, metric, impls, regimes, width):
            if math.isnan(v):
                if row is not None:
                    word_at(ax, x, status_word(row, run.meta))
                continue
            ax.bar(x, max(v, 0.0), width, color=color(impl, run), hatch=regime_hatch(regime), edgecolor="white")
            ax.text(x, max(v, 0.0), f" {num(v)}", ha="center", va="bottom", fontsize=MIN_FONT, rotation=90)
            top = max(top, v)
        ax.set_xlim(-0.5, len(impls) - 0.5)
        ax.set_yscale("symlog", linthresh=1)
        ax.set_ylim(0, top * 40)
        ax.set_xticks(range(len(impls)), [label(i) for i in impls], fontsize=8, rotation=30, ha="right")
        ax.set_ylabel("allocations per step (symlog)")
        ax.set_title(title, fontsize=10)
        ax.grid(axis="y", which="both", alpha=0.25)
        ax.legend(handles=[Patch(facecolor="0.6", edgecolor="white", hatch=regime_hatch(r), label=r) for r in regimes],
                  fontsize=7.5, loc="upper left", bbox_to_anchor=(1.005, 1), frameon=False)
    return finish(fig, run, "Allocations per decode step, paper scenario (after warm-up)")


def _cache_bytes(text: str) -> float:
    match = re.match(r"\s*([\d.]+)\s*([KMG]?)", str(text))
    if not match:
        return math.nan
    return float(match.group(1)) * {"": 1, "K": 2**10, "M": 2**20, "G": 2**30}[match.group(2)]


def _idwidth_panel(ax: Axes, run: RunData, metric: str, states: list[str], dtypes: list[str]) -> set[int]:
    """Bars of ``metric`` per table state and id width; returns the call counts the bars are medians of."""
    width = 0.8 / len(dtypes)
    calls: set[int] = set()
    for s, state in enumerate(states):
        for d, dtype in enumerate(dtypes):
            regime = f"{dtype}/{state}" if state else dtype
            x = s - 0.4 + width * (d + 0.5)
            v = run.value(PAPER, idwidth.IMPL, regime, metric)
            row = run.get(PAPER, idwidth.IMPL, regime, metric)
            if math.isnan(v):
                if row is not None:
                    word_at(ax, x, status_word(row, run.meta))
                continue
            ax.bar(x, v, width, color=DTYPE_COLORS[dtype])
            top = v
            if bounds := ci(row):
                whisker(ax, x, *bounds)
                top = max(v, bounds[1])
            text = f"{v:.3g}" if metric == "idwidth_lookup_ns" else _human_bytes(v)
            ax.text(x, top, text, ha="center", va="bottom", fontsize=MIN_FONT)
            calls.update(n for n in [reps_of(row)] if n)
    return calls


def fig_idwidth(run: RunData) -> Figure | None:
    """Block-id width: lookup time, bytes per sequence and whole-table bytes for uint16 / int32 / int64."""
    sel = run.df[(run.df.scenario == PAPER) & (run.df.metric == "idwidth_lookup_ns")]
    if sel.empty:
        log.warning("idwidth: no idwidth_lookup_ns rows (harness.studies.idwidth.idwidth_rows not run)")
        return None
    cases = [str(r).split("/", 1) for r in dict.fromkeys(sel.regime)]
    dtypes = [d for d in DTYPE_COLORS if any(c[0] == d for c in cases)]
    if not dtypes:
        log.warning("idwidth: no rows for the known id widths (%s)", ", ".join(DTYPE_COLORS))
        return None
    states = list(dict.fromkeys(c[1] if len(c) > 1 else "" for c in cases))
    fig, axes = new_figure(12, 4.4, 1, 3)
    calls: set[int] = set()
    for ax, metric, ylabel in ((axes[0], "idwidth_lookup_ns", "time per lookup (ns)"),
                               (axes[2], "idwidth_table_bytes", "whole table (bytes, log scale)")):
        calls |= _idwidth_panel(ax, run, metric, states, dtypes)
        ax.set_xticks(range(len(states)), [_state_label(run, st) for st in states], fontsize=7.5)
        ax.set_ylabel(ylabel)
        ax.grid(axis="y", which="both", alpha=0.25)
    intervals = any(ci(run.get(PAPER, idwidth.IMPL, r, "idwidth_lookup_ns"))
                    for r in run.regimes(PAPER, "idwidth_lookup_ns"))
    median_of = f"median of {'/'.join(map(str, sorted(calls)))} calls" if calls else "one call"
    spread = "whiskers: 95 % interval" if intervals else "no interval in this run"
    axes[0].set_title(f"batched lookup (newest token -> slot)\n{median_of}; {spread}", fontsize=9.5)
    axes[0].set_ylim(0, axes[0].get_ylim()[1] * 1.12)
    axes[2].set_title("table size vs caches", fontsize=9.5)
    axes[2].set_yscale("log")
    for name, style in (("L1d", ":"), ("L2", "--")):
        size = _cache_bytes(run.meta.get("caches", {}).get(name, ""))
        if math.isfinite(size):
            axes[2].axhline(size, color="0.3", lw=0.8, ls=style)
            axes[2].text(0.99, size, f"{name} {_human_bytes(size)}", transform=axes[2].get_yaxis_transform(),
                         ha="right", va="bottom", fontsize=MIN_FONT)
    ax = axes[1]
    for d, dtype in enumerate(dtypes):
        vals = [run.value(PAPER, idwidth.IMPL, f"{dtype}/{st}" if st else dtype, "table_bytes_per_seq")
                for st in states]
        vals = [v for v in vals if not math.isnan(v)]
        if vals:
            ax.bar(d, vals[0], 0.6, color=DTYPE_COLORS[dtype])
            ax.text(d, vals[0], f"{vals[0]:,.0f} B", ha="center", va="bottom", fontsize=MIN_FONT)
    ax.set_xticks(range(len(dtypes)), dtypes)
    ax.set_ylabel("block table per sequence (bytes)")
    ax.set_title("itemsize x max blocks per sequence", fontsize=9.5)
    ax.grid(axis="y", alpha=0.25)
    handles = [Patch(color=DTYPE_COLORS[d], label=d) for d in dtypes]
    handles += [Line2D([], [], color="black", marker="_", lw=0.9, label="95 % interval\nof the median")] * intervals
    fig.legend(handles=handles, fontsize=8, loc="outside right upper", frameon=False)
    caption = ("Overlapping intervals: no difference between the widths at that size." if intervals else "")
    return finish(fig, run, "Block-id width: uint16 vs int32 vs int64 ids in the flat table (compiled lookup)",
                  caption)


def _human_bytes(v: float) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if v >= size:
            return f"{v / size:.3g} {unit}"
    return f"{v:.0f} B"


def _state_label(run: RunData, state: str) -> str:
    """``state`` with the table rows it covers (the rows' ``seqs`` column)."""
    sel = run.df[(run.df.metric == "idwidth_table_bytes") & run.df.regime.astype(str).str.endswith("/" + state)]
    seqs = sel.seqs.dropna()
    return f"{state}\n{int(seqs.iloc[0]):,} sequences" if len(seqs) else state


def _cache_tick(run: RunData, scenario: str) -> str:
    """A scenario's tick label: its name, hit rate (the same in every cell) and flat-pc's own time."""
    hit = run.df[(run.df.scenario == scenario) & (run.df.metric == "cache_hit_tokens_pct") & (run.df.status == "ok")]
    rates = sorted(set(hit.value.round(3)))
    words = f"hit {num(rates[0])} % of tokens" if len(rates) == 1 else "HIT RATES DIFFER"
    base = run.value(scenario, CACHE_BASE, "batched", "seq_step_ns")
    return f"{scenario}\n{words}\n{CACHE_BASE}: {fmt(base)} ns/seq-step"


def _cache_bar(ax: Axes, run: RunData, scenario: str, impl: str, regime: str, x: float, width: float) -> float:
    """One cell's ratio to ``flat-pc`` in the same regime with its paired interval, labelled; NaN if none."""
    if impl == CACHE_BASE:
        if run.get(scenario, impl, regime, "seq_step_ns") is None:
            return math.nan
        value, bounds = 1.0, None
    else:
        row = run.get(scenario, impl, regime, ratio_metric("seq_step_ns", CACHE_BASE))
        if row is None:
            return math.nan
        if row["status"] != "ok":
            word_at(ax, x, status_word(row, run.meta))
            return math.nan
        value, bounds = float(row["value"]), ci(row)
    ax.bar(x, value, width, color=color(impl, run), hatch=regime_hatch(regime), edgecolor="white")
    if bounds:
        whisker(ax, x, *bounds)
    text = "1× (base)" if impl == CACHE_BASE else f"{fmt(value)}×"
    ax.text(x, (bounds[1] if bounds else value) * 1.12, text, rotation=90, ha="center", va="bottom", fontsize=MIN_FONT)
    return value


def _cache_panel(ax, run: RunData, scenarios: list[str], series: list[tuple[str, str]]) -> None:
    """One regime's bars: per scenario each design's seq-step time over ``flat-pc``'s, with its legend."""
    present = {s: [c for c in series if c in run.cells(s)] for s in scenarios}
    width = 0.84 / max(1, *map(len, present.values()))
    heights = []
    for k, scenario in enumerate(scenarios):
        left = k - width * len(present[scenario]) / 2
        for j, (impl, regime) in enumerate(present[scenario]):
            heights.append(_cache_bar(ax, run, scenario, impl, regime, left + width * (j + 0.5), width))
    ax.set_yscale("log")
    found = [h for h in heights if h == h and h > 0]
    log_headroom(ax, min([*found, 1.0]) * 0.5, max([*found, 1.0]), share=0.2)
    ax.axhline(1, color="black", lw=0.8)
    ax.set_xticks(range(len(scenarios)), [_cache_tick(run, s) for s in scenarios], fontsize=7.5)
    ax.set_xlim(-0.5, len(scenarios) - 0.5)
    ax.set_ylabel(f"ns per sequence-step over {CACHE_BASE}'s (×, log)")
    ax.grid(axis="y", which="both", alpha=0.25)
    handles = [Patch(facecolor=color(i, run), edgecolor="white", hatch=regime_hatch(r), label=f"{label(i)}, {r}")
               for i, r in series]
    handles.append(Line2D([], [], color="black", marker="_", lw=0.9, label="paired 95 % interval"))
    ax.legend(handles=handles, fontsize=7.5, loc="upper left", bbox_to_anchor=(1.005, 1), frameon=False)


def fig_prefix_cache(run: RunData) -> Figure | None:
    """Prefix caching: each design's seq-step time over ``flat-pc``'s in the same regime and run, per scenario, a
    panel per regime (at most one series per design in a panel)."""
    scenarios = caching_scenarios(run)
    if not scenarios:
        log.warning("prefix_cache: no caching scenario in this run")
        return None
    cells = [c for s in scenarios for c in run.cells(s)]
    regimes = list(dict.fromkeys(r for s in scenarios for r in run.regimes(s, "seq_step_ns")))
    series = list(dict.fromkeys((i, r) for r in regimes for i in ordered(c[0] for c in cells) if (i, r) in cells))
    fig, axes = new_figure(max(11.0, 2.1 * len(scenarios) + 4.5), 4.4 * len(regimes) + 1.2, len(regimes), 1)
    for ax, regime in zip(axes, regimes, strict=True):
        _cache_panel(ax, run, scenarios, [c for c in series if c[1] == regime])
        ax.set_title(f"{regime} regime", fontsize=9)
    return finish(fig, run, f"Prefix caching: block-manager time per sequence-step relative to {CACHE_BASE}, "
                            "same hits for every design",
                  f"Bars: each cell's seq-step time over {CACHE_BASE}'s in the same run and regime, with the paired "
                  f"95 % interval; the tick labels give each scenario's hit rate and {CACHE_BASE}'s own time.")


FIGURES: dict[str, Callable[[RunData], Figure | None]] = {
    "op_latency": fig_op_latency,
    "step_cdf": fig_step_cdf,
    "cpu_share_concurrency": fig_cpu_concurrency,
    "cpu_share_paced": fig_cpu_paced,
    "l1d_miss": fig_l1d,
    "allocs_per_step": fig_allocs,
    "idwidth": fig_idwidth,
    "paper_vs_article": fig_paper_vs_article,
    "prefix_cache": fig_prefix_cache,
}


def render_figures(run_dir: Path | str | RunData | None = None) -> list[Path]:
    """Render every figure the run allows into ``<run_dir>/figures/``; returns the files written."""
    run = run_dir if isinstance(run_dir, RunData) else RunData.load(Path(run_dir) if run_dir is not None else None)
    out_dir = run.run_dir / "figures"
    written: list[Path] = []
    for stem, make in FIGURES.items():
        try:
            fig = make(run)
            if fig is not None:
                written += save_figure(fig, out_dir, stem)
        except WriteError:
            raise
        except Exception:  # one broken figure must not cost the others
            log.exception("figure %s failed", stem)
    written += growth.render(run.run_dir)
    return written
