"""Figures of a run, rendered from ``results.csv``, ``meta.json`` and ``raw/`` into ``figures/`` (PNG and SVG).

Each figure is one small function taking a :class:`RunData` and returning a matplotlib ``Figure``, or None
(with a logged note) when the run holds nothing it could draw. A run with a subset of scenarios,
implementations or metrics renders what it can. Only ``ok`` rows are drawn as numbers; other statuses are
written on the figure as words, and a missing figure is never drawn as zero. Spread is drawn only where it
was measured (repetitions in ``raw/``, step percentiles); otherwise the figure says what the bar is.

The article's figures (``harness/data/paper_table.csv``, C++ on its author's machine) are overlaid as hollow
black markers or hatched bars labelled "article (C++)". Every figure carries the machine and commit in its
footer. Matplotlib is used without pyplot, so rendering never touches a notebook's or a user's backend.
"""

from __future__ import annotations

import io
import logging
import math
import re
import statistics
import textwrap
from collections.abc import Callable
from pathlib import Path

import matplotlib as mpl
import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import NullFormatter

from harness.measure.matrix import SWEEP, matches
from harness.output import growth
from harness.output.report import article_table, machine_line
from harness.output.results import atomic_write_bytes
from harness.output.rundata import REGIMES, RunData, ordered
from impls import registry

log = logging.getLogger(__name__)

PAPER = "paper"
# The article's designs A, B, C -> our implementation of each (from the registry).
SCHEMES = {r.letter: r.name for r in registry.RECORDS if r.role == "design" and r.letter}
REGIME_STYLE = {"batched": "-", "per-call": "--"}
REGIME_HATCH = {"batched": "", "per-call": "\\\\\\"}  # line hatches: dot hatches make SVGs ten times larger
DTYPE_COLORS = {"uint16": "#1b9e77", "int32": "#e6ab02", "int64": "#d95f02"}  # id widths, not implementations
DEFAULT_RATE = 2000.0
ARTICLE_RATE = 2000.0  # steps/s of the article's CPU-share column
RATES = np.geomspace(100, 20_000, 121)
PNG_DPI = 110
ARTICLE = "article (C++)"

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


# -- shared drawing -------------------------------------------------------------------------------------
def label(impl: str) -> str:
    """The registry's label (the design letter and name for the article's designs), the bare name otherwise."""
    return registry.record(impl).label


def color(impl: str) -> str:
    """One colour per implementation across all figures (a stable pick from tab10 for unknown ones)."""
    if registry.record(impl).color:
        return registry.record(impl).color
    palette = mpl.colormaps["tab10"].colors
    return mpl.colors.to_hex(palette[sum(map(ord, impl)) % len(palette)])


def _status_word(row: dict | None, meta: dict) -> str:
    if row is None:
        return "not measured"
    status = str(row["status"])
    if status == "unsupported" and meta.get("pmu") == "unsupported":
        return "unsupported (no PMU)"
    return status


def _ci(row: dict | None) -> tuple[float, float] | None:
    """A row's 95 % interval (its ``ci_low``/``ci_high`` columns), None where it has none."""
    lo, hi = (row.get("ci_low"), row.get("ci_high")) if row else (None, None)
    if lo is None or hi is None or pd.isna(lo) or pd.isna(hi):
        return None
    return float(lo), float(hi)


def _reps_of(row: dict | None) -> int | None:
    reps = row.get("reps") if row else None
    return int(reps) if reps is not None and not pd.isna(reps) else None


def _rate_of(row: dict | None) -> float:
    """The step rate a CPU-share row was computed at (its ``step_rate`` column), else the article's."""
    rate = row.get("step_rate") if row else None
    return float(rate) if rate is not None and not pd.isna(rate) else DEFAULT_RATE


def _new_figure(width: float, height: float, nrows: int = 1, ncols: int = 1, **kw) -> tuple[Figure, list[Axes]]:
    fig = Figure(figsize=(width, height), layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False, **kw)
    return fig, list(axes.flat)


def _finish(fig: Figure, run: RunData, title: str) -> Figure:
    """Title, and a footer naming the machine, the run and the commit."""
    fig.suptitle(title, fontsize=12)
    width_in = fig.get_figwidth()
    lines = textwrap.wrap(f"Machine: {machine_line(run.meta)}", width=int(width_in * 17))
    lines.append(f"run {run.run_id}; commit {run.meta.get('git_commit', '?')}; "
                 f"finished {run.meta.get('finished', run.meta.get('started', '?'))}")
    fig.text(0.005, 0.004, "\n".join(lines), fontsize=6.5, ha="left", va="bottom", color="0.3")
    footer_in = 0.13 * len(lines) + 0.08
    fig.get_layout_engine().set(rect=(0, footer_in / fig.get_figheight(), 1, 1 - footer_in / fig.get_figheight()))
    return fig


def _article_marker(bound: str) -> tuple[str, str]:
    """(marker, legend words) for how the article stated a figure."""
    return ("v", "upper bound (<)") if bound == "upper" else ("D", "approx. (~)")


def _article_handles() -> list[Line2D]:
    return [Line2D([], [], marker=m, ls="", mfc="none", mec="black", label=f"{ARTICLE}, {words}")
            for m, words in (_article_marker("approx"), _article_marker("upper"))]


def _note(ax: Axes, text: str) -> None:
    """How to read a panel, right of the axes under the legend, where it never hides data."""
    ax.text(1.01, 0.0, text, transform=ax.transAxes, ha="left", va="bottom", fontsize=7, color="0.25",
            bbox={"boxstyle": "round,pad=0.3", "fc": "white", "ec": "0.8", "alpha": 0.9})


def _num(v: float) -> str:
    if v == 0:
        return "0"
    return f"{v:,.0f}" if abs(v) >= 100 else f"{v:.3g}"


def _word_at(ax: Axes, x: float, text: str) -> None:
    """A status in place of a bar, standing on the axis (axes coordinates in y, so any scale works)."""
    ax.text(x, 0.02, text, transform=ax.get_xaxis_transform(), rotation=90, ha="center", va="bottom",
            fontsize=6.5, color="0.35")


# -- figures --------------------------------------------------------------------------------------------
def _rep_values(run: RunData, scenario: str, impl: str, regime: str, metric: str, value: float) -> list[float]:
    """Per-repetition values of a per-operation figure, rebuilt from the raw per-kind totals.

    The published figure is median(total_i) / work for a fixed work count, so each repetition's value is
    value * total_i / median(total): no denominator needs to be stored.
    """
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


def _whisker(ax: Axes, x: float, lo: float, hi: float, shade: str = "black") -> None:
    ax.vlines(x, lo, hi, color=shade, lw=0.9)
    ax.plot([x, x], [lo, hi], ls="", marker="_", color=shade, ms=5)


def _op_spread(ax: Axes, run: RunData, impl: str, regime: str, metric: str, x: float, v: float) -> str:
    """Draw the bar's spread; returns what it is ("ci", "reps", "steps" or "")."""
    if bounds := _ci(run.get(PAPER, impl, regime, metric)):
        _whisker(ax, x, *bounds)
        return "ci"
    if metric == "seq_step_ns":
        mean_step = run.value(PAPER, impl, regime, "step_mean_ns")
        p50, p99 = (run.value(PAPER, impl, regime, m) for m in ("step_p50_ns", "step_p99_ns"))
        if mean_step > 0 and not (math.isnan(p50) or math.isnan(p99)):
            running = mean_step / v  # seq_step = mean step / mean running sequences, exactly
            _whisker(ax, x, p50 / running, p99 / running)
            return "steps"
        return ""
    reps = _rep_values(run, PAPER, impl, regime, metric, v)
    if reps:
        _whisker(ax, x, min(reps), max(reps), "0.15")
        return "reps"
    return ""


def _op_article(ax: Axes, art: pd.DataFrame, impl: str, metric: str, x: float) -> None:
    scheme = next((s for s, i in SCHEMES.items() if i == impl), None)
    if scheme in art.index and metric in ARTICLE_OF:
        a = art.loc[scheme]
        ax.plot(x, float(a[ARTICLE_OF[metric]]), marker=_article_marker(a.bound)[0], mfc="none", mec="black",
                ms=6, ls="")


def _op_panel(ax: Axes, run: RunData, regime: str, art: pd.DataFrame) -> tuple[list[str], set[str], set[int]]:
    """Bars of one regime; returns (impls drawn, kinds of spread drawn, repetition counts seen)."""
    impls = list(dict.fromkeys(i for m in OP_METRICS for i in run.impls(PAPER, m, regime)))
    width = 0.84 / len(impls)
    spreads: set[str] = set()
    reps_seen: set[int] = set()
    for g, metric in enumerate(OP_METRICS):
        for k, impl in enumerate(impls):
            x = g - 0.42 + width * (k + 0.5)
            row = run.get(PAPER, impl, regime, metric)
            v = run.value(PAPER, impl, regime, metric)
            if math.isnan(v) or v <= 0:
                if row is not None:
                    _word_at(ax, x, _status_word(row, run.meta) if math.isnan(v) else "0")
                continue
            ax.bar(x, v, width, color=color(impl), edgecolor="white", linewidth=0.4)
            reps_seen.update(n for n in [_reps_of(row)] if n)
            spreads.add(_op_spread(ax, run, impl, regime, metric, x, v))
            _op_article(ax, art, impl, metric, x)
    return impls, spreads - {""}, reps_seen


SPREAD_WORDS = {"ci": "whiskers: 95 % bootstrap interval", "reps": "per-op whiskers: min–max over repetitions",
                "steps": "whole-step whiskers: per-step\np50–p99 ÷ mean running sequences"}


def fig_op_latency(run: RunData) -> Figure | None:
    """Per-operation latency per design, paper scenario, one panel per regime, log scale."""
    regimes = [r for r in REGIMES if any(run.impls(PAPER, m, r) for m in OP_METRICS)]
    if not regimes:
        log.warning("op_latency: no per-operation rows for the %s scenario", PAPER)
        return None
    art = article_table()
    fig, axes = _new_figure(12, 4.2 * len(regimes), len(regimes), 1)
    for ax, regime in zip(axes, regimes, strict=True):
        impls, spreads, reps_seen = _op_panel(ax, run, regime, art)
        ax.set_yscale("log")
        ax.set_xticks(range(len(OP_METRICS)), [OP_METRICS[m][0] for m in OP_METRICS], fontsize=8.5)
        ax.set_xlim(-0.5, len(OP_METRICS) - 0.5)
        ax.set_ylabel("time per operation (ns, log scale)")
        ax.set_title(f"{regime} regime", fontsize=10)
        ax.grid(axis="y", which="both", alpha=0.25)
        reps_text = "/".join(map(str, sorted(reps_seen))) or "?"
        words = [SPREAD_WORDS[k] for k in sorted(spreads)] or [f"bars: median of {reps_text} rep(s),\nno spread"]
        _note(ax, "\n".join(words))
        handles = [Patch(color=color(i), label=label(i)) for i in impls]
        handles += [Line2D([], [], color="black", marker="_", lw=0.9, label="spread (see note)")]
        handles += _article_handles()
        ax.legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.005, 1), frameon=False)
    return _finish(fig, run, "Per-operation latency by design, paper scenario (the article's workload)")


def fig_step_cdf(run: RunData) -> Figure | None:
    """Distribution of whole-step times per design, paper scenario, from the raw per-step samples."""
    panels = []
    for regime in REGIMES:
        curves = []
        for impl in run.impls(PAPER, "step_p50_ns", regime):
            raw = run.raw(PAPER, impl, regime) or {}
            reps = [np.asarray(r, dtype=float).ravel() for r in raw.get("step_ns", [])]
            steps = np.concatenate(reps) if reps else np.empty(0)
            steps = steps[np.isfinite(steps) & (steps > 0)]
            if steps.size:
                curves.append((impl, np.sort(steps), str(raw.get("clock", "?")), len(reps)))
        if curves:
            panels.append((regime, curves))
    if not panels:
        log.warning("step_cdf: no raw per-step samples for the %s scenario", PAPER)
        return None
    fig, axes = _new_figure(12, 4.4, 1, len(panels), sharey=True)
    shown: dict[str, Line2D] = {}
    notes: list[str] = []
    for ax, (regime, curves) in zip(axes, panels, strict=True):
        for impl, steps, _, _ in curves:
            frac = np.arange(1, steps.size + 1) / steps.size
            (shown[impl],) = ax.step(steps, frac, where="post", color=color(impl), lw=1.3, label=label(impl))
        ax.axhline(0.99, color="0.5", lw=0.7, ls=":")
        ax.text(0.005, 0.985, "p99", transform=ax.get_yaxis_transform(), va="top", fontsize=7, color="0.4")
        ax.set_xscale("log")
        ax.xaxis.set_minor_formatter(NullFormatter())  # a range under a decade labels minor ticks, overlapping
        ax.set_ylim(0, 1.01)
        ax.set_xlabel("whole-step block-manager time (ns, log scale)")
        ax.set_title(f"{regime} regime", fontsize=10)
        ax.grid(which="both", alpha=0.25)
        counts = "; ".join(sorted({f"{c[1].size} steps ({c[3]} rep(s))" for c in curves}))
        clocks = ", ".join(sorted({c[2] for c in curves}))
        notes.append(f"{regime}: {counts} per line;\n  clocks: {clocks}")
    axes[0].set_ylabel("fraction of steps ≤ x")
    order = ordered(shown)
    axes[-1].legend(handles=[shown[i] for i in order], fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1),
                    frameon=False)
    _note(axes[-1], "\n".join(notes))
    return _finish(fig, run, "Step-time CDF by design, paper scenario (closed loop, all repetitions pooled)")


def fig_cpu_concurrency(run: RunData) -> Figure | None:
    """Computed CPU share at 2,000 steps/s against the number of running sequences (concurrency sweep)."""
    sweep = {}  # running sequences -> scenario, from the rows' seqs column
    rows = run.df[(run.df.metric == "cpu_share_pct") & run.df.seqs.notna()]
    for scenario, seqs in zip(rows.scenario, rows.seqs, strict=True):
        if matches(str(scenario), (SWEEP,)):
            sweep[int(seqs)] = scenario
    lines = []
    rate = DEFAULT_RATE
    for regime in REGIMES:
        impls = list(dict.fromkeys(i for s in sweep.values() for i in run.impls(s, "cpu_share_pct", regime)))
        for impl in ordered(impls):
            pts = [(n, run.value(sweep[n], impl, regime, "cpu_share_pct")) for n in sorted(sweep)]
            pts = [(n, v) for n, v in pts if not math.isnan(v) and v > 0]
            if pts:
                lines.append((impl, regime, pts))
                rate = _rate_of(run.get(sweep[pts[0][0]], impl, regime, "cpu_share_pct"))
    if not lines:
        log.warning("cpu_share_concurrency: no cpu_share_pct rows for concurrency-N scenarios")
        return None
    fig, (ax,) = _new_figure(10, 5.2)
    for impl, regime, pts in lines:
        xs, ys = zip(*pts, strict=True)
        bounds = [_ci(run.get(sweep[n], impl, regime, "cpu_share_pct")) or (y, y) for n, y in pts]
        yerr = [[y - lo for y, (lo, _) in zip(ys, bounds, strict=True)],
                [hi - y for y, (_, hi) in zip(ys, bounds, strict=True)]]
        ax.errorbar(xs, ys, yerr=yerr, ls=REGIME_STYLE[regime], marker="o", ms=3.5, color=color(impl), capsize=2,
                    elinewidth=0.8, label=f"{label(impl)}, {regime}")
    art = article_table()
    for scheme, impl in SCHEMES.items():
        if scheme in art.index and any(i == impl for i, _, _ in lines):
            a = art.loc[scheme]
            ax.plot(256, float(a.cpu_share_pct_at_2000_steps_s), marker=_article_marker(a.bound)[0], mfc="none",
                    mec=color(impl), mew=1.5, ms=8, ls="")
    ax.axhline(100, color="black", lw=0.8, ls=":")
    ax.text(min(sweep), 100, " 100 % = one core", va="bottom", fontsize=7.5)
    ax.set_xscale("log", base=2)
    ax.set_xticks(sorted(sweep), [f"{n:,}" for n in sorted(sweep)])
    ax.set_yscale("log")
    ax.set_xlabel("running sequences per step (log scale)")
    ax.set_ylabel(f"block-manager CPU share at {rate:,.0f} steps/s (%, log scale)")
    ax.grid(which="both", alpha=0.25)
    handles, _ = ax.get_legend_handles_labels()
    handles += [Line2D([], [], marker="D", ls="", mfc="none", mec="black",
                       label=f"{ARTICLE} at 256 sequences (marker colour = design)")]
    ax.legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.005, 1), frameon=False)
    _note(ax, "computed: closed-loop mean\nstep time x step rate\n(solid: batched, dashed: per-call)\n"
              "error bars: 95 % bootstrap interval")
    return _finish(fig, run, f"CPU share vs concurrency (computed at {rate:,.0f} steps/s)")


def fig_cpu_rate(run: RunData) -> Figure | None:
    """CPU share against the step rate: computed lines (linear in the rate), observed paced points at 2,000."""
    cells = [(impl, regime) for regime in REGIMES for impl in run.impls(PAPER, "step_mean_ns", regime)
             if run.value(PAPER, impl, regime, "step_mean_ns") > 0]
    if not cells:
        log.warning("cpu_share_rate: no step_mean_ns rows for the %s scenario", PAPER)
        return None
    rate = _rate_of(run.get(PAPER, cells[0][0], cells[0][1], "cpu_share_pct"))
    fig, (ax,) = _new_figure(10.5, 5.6)
    observed_any = unmeasured = False
    for impl, regime in cells:
        mean_step = run.value(PAPER, impl, regime, "step_mean_ns")
        ax.plot(RATES, mean_step * RATES / 1e9 * 100, ls=REGIME_STYLE[regime], color=color(impl), lw=1.2,
                label=f"{label(impl)}, {regime}")
        obs = run.value(PAPER, impl, regime, "cpu_share_observed_pct")
        if not math.isnan(obs) and obs > 0:
            ax.plot(rate, obs, marker="X" if regime == "batched" else "P", color=color(impl), mec="black",
                    mew=0.6, ms=8, ls="")
            observed_any = True
        elif run.get(PAPER, impl, regime, "cpu_share_observed_pct") is not None:
            unmeasured = True
    art = article_table()
    for scheme, impl in SCHEMES.items():
        if scheme in art.index:
            a = art.loc[scheme]
            ax.plot(ARTICLE_RATE, float(a.cpu_share_pct_at_2000_steps_s), marker=_article_marker(a.bound)[0],
                    mfc="none", mec=color(impl), mew=1.5, ms=9, ls="")
    ax.axvline(rate, color="0.3", lw=0.8, ls=":")
    ax.axhline(100, color="black", lw=0.8, ls=":")
    ax.text(RATES[0], 100, " 100 % = one core", va="bottom", fontsize=7.5)
    ax.text(rate, 0.01, f"{rate:,.0f} steps/s ", transform=ax.get_xaxis_transform(), rotation=90, va="bottom",
            ha="right", fontsize=7.5)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("decode step rate (steps/s, log scale)")
    ax.set_ylabel("block-manager CPU share (% of one core, log scale)")
    ax.grid(which="both", alpha=0.25)
    handles, _ = ax.get_legend_handles_labels()
    if observed_any:
        handles += [Line2D([], [], marker="X", ls="", color="0.6", mec="black", label="observed, paced, batched"),
                    Line2D([], [], marker="P", ls="", color="0.6", mec="black", label="observed, paced, per-call")]
    handles += [Line2D([], [], marker="D", ls="", mfc="none", mec="black", label=f"{ARTICLE} (colour = design)")]
    ax.legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.005, 1), frameon=False)
    words = ["lines: computed = closed-loop\nmean step time x rate",
             f"filled markers at {rate:,.0f}: observed,\nopen loop paced from Python" if observed_any
             else "no observed (paced) points\nin this run"]
    if unmeasured:
        words.append("some paced runs not measured\n(see status in results.csv)")
    _note(ax, "\n".join(words))
    return _finish(fig, run, "CPU share vs step rate, paper scenario: computed lines, observed points")


def fig_l1d(run: RunData) -> Figure | None:
    """L1D miss rate per design and regime, each bar labelled with its source; the article's figures beside."""
    metric = "l1d_miss_pct"
    regimes = run.regimes(PAPER, metric)
    impls = list(dict.fromkeys(i for r in regimes for i in run.impls(PAPER, metric, r)))
    if not impls:
        # not measured at all: still show the article's figures beside the designs the run has, saying so
        regimes = run.regimes(PAPER, "seq_step_ns")
        impls = [i for i in SCHEMES.values() if i in run.impls(PAPER, "seq_step_ns")]
        if not impls:
            log.warning("l1d_miss: no %s rows and no design A/B/C in the %s scenario", metric, PAPER)
            return None
        log.warning("l1d_miss: no %s rows in this run; the figure shows the article's figures only", metric)
    art = article_table()
    fig, (ax,) = _new_figure(10, 5)
    width = 0.8 / (len(regimes) + 1)
    top = 0.0
    for k, impl in enumerate(impls):
        for j, regime in enumerate(regimes):
            x = k - 0.4 + width * (j + 0.5)
            row = run.get(PAPER, impl, regime, metric)
            v = run.value(PAPER, impl, regime, metric)
            if math.isnan(v):
                _word_at(ax, x, _status_word(row, run.meta))
                continue
            ax.bar(x, v, width, color=color(impl), hatch=REGIME_HATCH[regime], edgecolor="white")
            ax.text(x, v, f"{v:.2g}\n{row['source']}", ha="center", va="bottom", fontsize=6.5)
            top = max(top, v)
        scheme = next((s for s, i in SCHEMES.items() if i == impl), None)
        if scheme in art.index:
            a = art.loc[scheme]
            x = k - 0.4 + width * (len(regimes) + 0.5)
            ax.bar(x, float(a.l1d_miss_pct), width, facecolor="none", edgecolor="black", hatch="///", lw=0.8)
            ax.text(x, float(a.l1d_miss_pct), f"~{a.l1d_miss_pct:g}", ha="center", va="bottom", fontsize=6.5)
            top = max(top, float(a.l1d_miss_pct))
    ax.set_xticks(range(len(impls)), [label(i) for i in impls], fontsize=8)
    ax.set_xlim(-0.5, len(impls) - 0.5)
    ax.set_ylim(0, max(top, 1.0) * 1.25)
    ax.set_ylabel("L1D misses / L1D loads (%)")
    ax.grid(axis="y", alpha=0.25)
    handles = [Patch(facecolor="0.6", edgecolor="white", label=f"measured, {r}", hatch=REGIME_HATCH[r])
               for r in regimes]
    handles.append(Patch(facecolor="none", edgecolor="black", hatch="///", label=ARTICLE))
    ax.legend(handles=handles, fontsize=7.5, loc="upper left", bbox_to_anchor=(1.005, 1), frameon=False)
    measured = run.df[(run.df.scenario == PAPER) & (run.df.metric == metric) & (run.df.status == "ok")]
    sources = sorted(set(measured.source.astype(str)) - {"", "nan"})
    _note(ax, f"source written on each bar:\nperf = hardware counters,\ncallgrind-sim = simulated caches\n"
              f"PMU here: {run.meta.get('pmu', '?')}\nsources in this run:\n{', '.join(sources) or 'none'}")
    return _finish(fig, run, "L1D miss rate by design, paper scenario")


def fig_allocs(run: RunData) -> Figure | None:
    """Allocation events per decode step per design and regime (symlog: flat allocates nothing)."""
    metrics = [(m, t) for m, t in (("allocs_per_step", "all allocations (memray)"),
                                   ("nrt_allocs_per_step", "Numba runtime allocations (NRT stats)"))
               if run.regimes(PAPER, m)]
    if not metrics:
        log.warning("allocs_per_step: no allocation rows for the %s scenario", PAPER)
        return None
    fig, axes = _new_figure(11, 3.8 * len(metrics), len(metrics), 1)
    for ax, (metric, title) in zip(axes, metrics, strict=True):
        regimes = run.regimes(PAPER, metric)
        impls = list(dict.fromkeys(i for r in regimes for i in run.impls(PAPER, metric, r)))
        width = 0.8 / len(regimes)
        top = 1.0
        for k, impl in enumerate(impls):
            for j, regime in enumerate(regimes):
                x = k - 0.4 + width * (j + 0.5)
                row = run.get(PAPER, impl, regime, metric)
                v = run.value(PAPER, impl, regime, metric)
                if math.isnan(v):
                    if row is not None:
                        _word_at(ax, x, _status_word(row, run.meta))
                    continue
                ax.bar(x, max(v, 0.0), width, color=color(impl), hatch=REGIME_HATCH[regime],
                       edgecolor="white")
                ax.text(x, max(v, 0.0), _num(v), ha="center", va="bottom", fontsize=6.5)
                top = max(top, v)
        ax.set_xlim(-0.5, len(impls) - 0.5)
        ax.set_yscale("symlog", linthresh=1)
        ax.set_ylim(0, top * 4)
        ax.set_xticks(range(len(impls)), [label(i) for i in impls], fontsize=8)
        ax.set_ylabel("allocations per step (symlog)")
        ax.set_title(title, fontsize=10)
        ax.grid(axis="y", which="both", alpha=0.25)
        ax.legend(handles=[Patch(facecolor="0.6", edgecolor="white", hatch=REGIME_HATCH[r], label=r) for r in regimes],
                  fontsize=7.5, loc="upper left", bbox_to_anchor=(1.005, 1), frameon=False)
    return _finish(fig, run, "Allocations per decode step, paper scenario (after warm-up)")


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
            v = run.value(PAPER, "flat", regime, metric)
            row = run.get(PAPER, "flat", regime, metric)
            if math.isnan(v):
                if row is not None:
                    _word_at(ax, x, _status_word(row, run.meta))
                continue
            ax.bar(x, v, width, color=DTYPE_COLORS[dtype])
            text = f"{v:.3g}" if metric == "idwidth_lookup_ns" else _human_bytes(v)
            ax.text(x, v, text, ha="center", va="bottom", fontsize=6.5)
            calls.update(n for n in [_reps_of(row)] if n)
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
    fig, axes = _new_figure(12, 4.4, 1, 3)
    calls: set[int] = set()
    for ax, metric, ylabel in ((axes[0], "idwidth_lookup_ns", "time per lookup (ns)"),
                               (axes[2], "idwidth_table_bytes", "whole table (bytes, log scale)")):
        calls |= _idwidth_panel(ax, run, metric, states, dtypes)
        ax.set_xticks(range(len(states)), [_state_label(run, st) for st in states], fontsize=7.5)
        ax.set_ylabel(ylabel)
        ax.grid(axis="y", which="both", alpha=0.25)
    median_of = f", median of {'/'.join(map(str, sorted(calls)))} calls" if calls else ""
    axes[0].set_title(f"batched lookup (newest token -> slot){median_of}", fontsize=9.5)
    axes[0].set_ylim(0, axes[0].get_ylim()[1] * 1.12)
    axes[2].set_title("table size vs caches", fontsize=9.5)
    axes[2].set_yscale("log")
    for name, style in (("L1d", ":"), ("L2", "--")):
        size = _cache_bytes(run.meta.get("caches", {}).get(name, ""))
        if math.isfinite(size):
            axes[2].axhline(size, color="0.3", lw=0.8, ls=style)
            axes[2].text(0.99, size, f"{name} {_human_bytes(size)}", transform=axes[2].get_yaxis_transform(),
                         ha="right", va="bottom", fontsize=7)
    ax = axes[1]
    for d, dtype in enumerate(dtypes):
        vals = [run.value(PAPER, "flat", f"{dtype}/{st}" if st else dtype, "table_bytes_per_seq") for st in states]
        vals = [v for v in vals if not math.isnan(v)]
        if vals:
            ax.bar(d, vals[0], 0.6, color=DTYPE_COLORS[dtype])
            ax.text(d, vals[0], f"{vals[0]:,.0f} B", ha="center", va="bottom", fontsize=7)
    ax.set_xticks(range(len(dtypes)), dtypes)
    ax.set_ylabel("block table per sequence (bytes)")
    ax.set_title("itemsize x max blocks per sequence", fontsize=9.5)
    ax.grid(axis="y", alpha=0.25)
    axes[0].legend(handles=[Patch(color=DTYPE_COLORS[d], label=d) for d in dtypes], fontsize=7.5, loc="upper left")
    return _finish(fig, run, "Block-id width: uint16 vs int32 vs int64 ids in the flat table (compiled lookup)")


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


NATIVE_OF = {r.letter: r.name for r in registry.RECORDS if r.role == "native" and r.letter}
CXX = "C++ (ours)"


def _article_bar(ax: Axes, art: pd.DataFrame, scheme: str, metric: str, x: float, width: float) -> None:
    if scheme not in art.index:
        return
    a = art.loc[scheme]
    v = float(a[ARTICLE_OF[metric]])
    ax.bar(x, v, width, facecolor="none", edgecolor="black", hatch="///", lw=0.8)
    ax.text(x, v, f"{'<' if a.bound == 'upper' else '~'}{v:g}", ha="center", va="bottom", fontsize=6)


def _measured_bar(ax: Axes, run: RunData, impl: str, regime: str, metric: str, x: float, width: float,
                  hatch: str, scenario: str = PAPER) -> None:
    row = run.get(scenario, impl, regime, metric)
    v = run.value(scenario, impl, regime, metric)
    if math.isnan(v) or v <= 0:
        if row is not None:
            _word_at(ax, x, "0" if v == 0 else _status_word(row, run.meta))
        return
    ax.bar(x, v, width, color=color(impl), hatch=hatch, edgecolor="white")
    if bounds := _ci(row):
        _whisker(ax, x, *bounds)
    ax.text(x, v, _num(v), ha="center", va="bottom", fontsize=6)


def fig_paper_vs_article(run: RunData) -> Figure | None:
    """The article's four columns, measured (both regimes, and our C++ where built) beside the article's C++
    figures, A/B/C."""
    cols = [("lookup_ns", "lookup", "ns per lookup (log scale)", True),
            ("alloc_free_ns", "alloc/free", "ns per block (log scale)", True),
            ("cpu_share_pct", "CPU share at 2,000 steps/s (computed)", "% of one core (log scale)", True),
            ("l1d_miss_pct", "L1D miss rate", "misses / loads (%)", False)]
    present = [impl for impl in SCHEMES.values() if run.has(PAPER, impl)]
    if not present:
        log.warning("paper_vs_article: no figures for designs A/B/C in the %s scenario", PAPER)
        return None
    art = article_table()
    fig, axes = _new_figure(14, 4.6, 1, len(cols))
    cxx = any(run.has(PAPER, impl) for impl in NATIVE_OF.values())
    series = [*REGIMES, *([CXX] if cxx else []), "article"]
    width = 0.8 / len(series)
    for ax, (metric, title, ylabel, logy) in zip(axes, cols, strict=True):
        for k, (scheme, impl) in enumerate(SCHEMES.items()):
            for j, what in enumerate(series):
                x = k - 0.4 + width * (j + 0.5)
                if what == "article":
                    _article_bar(ax, art, scheme, metric, x, width)
                elif what == CXX:
                    _measured_bar(ax, run, NATIVE_OF.get(scheme, ""), "batched", metric, x, width, "...")
                else:
                    _measured_bar(ax, run, impl, what, metric, x, width, REGIME_HATCH[what])
        if logy:
            ax.set_yscale("log")
        ax.set_xticks(range(len(SCHEMES)), [label(i) for i in SCHEMES.values()], fontsize=8)
        ax.set_xlim(-0.5, len(SCHEMES) - 0.5)
        sources = sorted({row["source"] for impl in SCHEMES.values() for r in REGIMES
                          if (row := run.get(PAPER, impl, r, metric)) is not None and row["status"] == "ok"})
        ax.set_title(title + (f"\nmeasured by: {', '.join(sources)}" if metric == "l1d_miss_pct" and sources else ""),
                     fontsize=9.5)
        ax.set_ylabel(ylabel, fontsize=8.5)
        ax.grid(axis="y", which="both", alpha=0.25)
    handles = [Patch(facecolor="0.6", edgecolor="white", hatch=REGIME_HATCH[r], label=f"measured, {r}")
               for r in REGIMES]
    if cxx:
        handles.append(Patch(facecolor="0.3", edgecolor="white", hatch="...", label=f"measured, {CXX}, batched"))
    handles.append(Patch(facecolor="none", edgecolor="black", hatch="///", label=ARTICLE))
    handles.append(Line2D([], [], color="black", marker="_", lw=0.9, label="95 % interval"))
    axes[-1].legend(handles=handles, fontsize=7.5, loc="upper left", bbox_to_anchor=(1.01, 1), frameon=False)
    return _finish(fig, run, "The article's table: measured (Python/Numba and C++, this machine) vs the article (C++)")


def _cache_panel(ax: Axes, run: RunData, scenario: str) -> None:
    """One caching scenario: ns per sequence-step of every cell, with intervals, hit rate in the title."""
    cells = run.df[(run.df.scenario == scenario) & (run.df.metric == "seq_step_ns")][["impl", "regime"]]
    impls = ordered(cells.impl)
    width = 0.8 / len(REGIMES)
    for k, impl in enumerate(impls):
        for j, regime in enumerate(REGIMES):
            _measured_bar(ax, run, impl, regime, "seq_step_ns", k - 0.4 + width * (j + 0.5), width,
                          REGIME_HATCH[regime], scenario)
    ax.set_yscale("log")
    ax.set_xticks(range(len(impls)), [label(i) for i in impls], fontsize=8)
    ax.set_xlim(-0.5, len(impls) - 0.5)
    hit = run.df[(run.df.scenario == scenario) & (run.df.metric == "cache_hit_tokens_pct") & (run.df.status == "ok")]
    rates = sorted(set(hit.value.round(3)))
    words = f"hit rate {_num(rates[0])} % of prompt tokens, every cell" if len(rates) == 1 else "HIT RATES DIFFER"
    ax.set_title(f"{scenario}\n{words}", fontsize=9)
    ax.set_ylabel("ns per sequence-step (log scale)", fontsize=8.5)
    ax.grid(axis="y", which="both", alpha=0.25)


def fig_prefix_cache(run: RunData) -> Figure | None:
    """Prefix caching: what each caching design pays per sequence-step on each caching scenario (hit rates are
    the same for all: the replays are checked against the trace)."""
    scenarios = list(dict.fromkeys(run.df[run.df.metric == "cache_hit_tokens_pct"].scenario))
    if not scenarios:
        log.warning("prefix_cache: no caching scenario in this run")
        return None
    fig, axes = _new_figure(4.2 * len(scenarios) + 2.2, 4.4, 1, len(scenarios))
    for ax, scenario in zip(axes, scenarios, strict=True):
        _cache_panel(ax, run, scenario)
    handles = [Patch(facecolor="0.6", edgecolor="white", hatch=REGIME_HATCH[r], label=r) for r in REGIMES]
    handles.append(Line2D([], [], color="black", marker="_", lw=0.9, label="95 % interval"))
    axes[-1].legend(handles=handles, fontsize=7.5, loc="upper left", bbox_to_anchor=(1.01, 1), frameon=False)
    return _finish(fig, run, "Prefix caching: block-manager time per sequence-step, same hits for every design")


FIGURES: dict[str, Callable[[RunData], Figure | None]] = {
    "op_latency": fig_op_latency,
    "step_cdf": fig_step_cdf,
    "cpu_share_concurrency": fig_cpu_concurrency,
    "cpu_share_rate": fig_cpu_rate,
    "l1d_miss": fig_l1d,
    "allocs_per_step": fig_allocs,
    "idwidth": fig_idwidth,
    "paper_vs_article": fig_paper_vs_article,
    "prefix_cache": fig_prefix_cache,
}


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


def render_figures(run_dir: Path | str | None = None) -> list[Path]:
    """Render every figure the run allows into ``<run_dir>/figures/``; returns the files written.

    A figure whose data the run lacks is skipped with a logged note; one that fails is logged with its
    traceback and skipped, so that the tables of a report never depend on a figure.
    """
    run = RunData.load(Path(run_dir) if run_dir is not None else None)
    out_dir = run.run_dir / "figures"
    written: list[Path] = []
    for stem, make in FIGURES.items():
        try:
            fig = make(run)
            if fig is not None:
                written += save_figure(fig, out_dir, stem)
        except Exception:  # one broken figure must not cost the others
            log.exception("figure %s failed", stem)
    written += growth.render(run.run_dir)  # the scale sweeps' figure and slopes (harness/output/growth.py)
    return written
