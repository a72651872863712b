"""How cost and memory grow: the scale sweeps' figures against the size each family sweeps, with fitted slopes.
Design: docs/output.md#harnessoutputgrowthpy."""

from __future__ import annotations

import csv
import io
import logging
import math
import os
import textwrap
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import numpy as np

from harness.base.files import atomic_write_text
from harness.errors import InputError
from harness.output.drawing import (
    MAX_SERIES,
    MIN_FONT,
    color,
    finish,
    grid,
    hide_unused,
    new_figure,
    numbered,
    save_figure,
    series_panels,
)
from harness.output.formatting import run_duration
from harness.output.markdown import markdown_table, md, md_code
from harness.output.readme import check_readme
from harness.output.rundata import RunData, ordered
from harness.run.matrix import SWEEPS, matches
from harness.studies.scale import FAMILY_AXES
from harness.studies.table_copy.variants import VARIANT_WORDS
from impls import registry
from impls.core.ids import UINT16_LIMIT

log = logging.getLogger(__name__)

MIN_POINTS = 3
METRICS = {  # metric -> (panel title, axis label)
    "seq_step_ns": ("cost", "ns per sequence-step"),
    "memory_bytes": ("memory", "bytes at the trace's peak"),
    "table_copy_bytes_per_step": ("rule 3 copies", "bytes to the device per step, per copy variant"),
}
AXIS_LABELS = {"context": "largest context a sequence may reach (tokens)", "pool": "blocks in the pool",
               "concurrency": "running sequences"}
BEGIN, END = "<!-- growth:begin -->", "<!-- growth:end -->"
SLOPES_CSV, SLOPES_MD = "growth_slopes.csv", "growth_slopes.md"


@dataclass(frozen=True)
class Point:
    """One scenario's figure against the family's size; ``lo``/``hi`` its interval (NaN where none)."""

    scenario: str
    x: float
    y: float
    lo: float = math.nan
    hi: float = math.nan


@dataclass(frozen=True)
class Slope:
    """A fitted log-log slope with its 95 % interval, over ``points`` sizes from ``x_min`` to ``x_max``."""

    family: str
    impl: str
    regime: str
    metric: str
    slope: float
    ci_low: float
    ci_high: float
    points: int
    x_min: float
    x_max: float
    at_max: float


# -- the t quantile (no scipy: the regularised incomplete beta by Lentz's continued fraction) -------------
def _betacf(a: float, b: float, x: float) -> float:
    tiny, c, d = 1e-300, 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 300):
        for num in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
                    -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):
            d = 1.0 + num * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + num / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-15:
            break
    return h


def _betainc(a: float, b: float, x: float) -> float:
    """The regularised incomplete beta function I_x(a, b)."""
    if x <= 0.0 or x >= 1.0:
        return 0.0 if x <= 0.0 else 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def t_quantile(p: float, df: int) -> float:
    """The ``p`` quantile (p > 0.5) of Student's t with ``df`` degrees of freedom, by bisection on its CDF."""
    def upper_tail(t: float) -> float:
        return 0.5 * _betainc(df / 2.0, 0.5, df / (df + t * t))

    lo, hi = 0.0, 1e6
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if upper_tail(mid) > 1.0 - p else (lo, mid)
    return (lo + hi) / 2


def fit_slope(xs: list[float], ys: list[float]) -> tuple[float, float, float]:
    """(slope, 95 % low, 95 % high) of log10(y) on log10(x) by least squares (t-interval, n - 2 d.o.f.)."""
    lx, ly = np.log10(np.asarray(xs, float)), np.log10(np.asarray(ys, float))
    n = len(lx)
    sxx = float(((lx - lx.mean()) ** 2).sum())
    slope = float(((lx - lx.mean()) * (ly - ly.mean())).sum() / sxx)
    resid = ly - (ly.mean() + slope * (lx - lx.mean()))
    se = math.sqrt(float((resid**2).sum()) / (n - 2) / sxx) if n > 2 else math.inf
    half = t_quantile(0.975, n - 2) * se if n > 2 else math.inf
    return slope, slope - half, slope + half


def family_sizes(run: RunData, family: str) -> dict[str, float]:
    """Scenario -> the size ``family`` sweeps, for the run's scenarios of that family that state it."""
    out = {}
    for scenario in dict.fromkeys(run.df.scenario):
        if matches(str(scenario), (SWEEPS[family],)):
            x = run.value(str(scenario), "-", "-", FAMILY_AXES[family])
            if x > 0:
                out[str(scenario)] = x
    return out


def series(run: RunData, family: str, metric: str) -> dict[tuple[str, str], list[Point]]:
    """(impl, regime) -> its measured points of ``metric`` across the family, by size."""
    sizes = family_sizes(run, family)
    out: dict[tuple[str, str], list[Point]] = {}
    for r in run.df[(run.df.metric == metric) & run.df.scenario.isin(list(sizes))].to_dict("records"):
        row = run.get(r["scenario"], r["impl"], r["regime"], metric)
        v = run.value(r["scenario"], r["impl"], r["regime"], metric)
        if row is None or not v > 0:
            continue
        lo, hi = row.get("ci_low"), row.get("ci_high")
        lo = float(lo) if lo is not None and not _nan(lo) else math.nan
        hi = float(hi) if hi is not None and not _nan(hi) else math.nan
        point = Point(r["scenario"], sizes[r["scenario"]], v, lo, hi)
        pts = out.setdefault((str(r["impl"]), str(r["regime"])), [])
        if point not in pts:
            pts.append(point)
    return {k: sorted(v, key=lambda p: p.x) for k, v in out.items()}


def _nan(v: object) -> bool:
    try:
        return math.isnan(float(v))  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return True


def slopes(run: RunData) -> list[Slope]:
    """Every fitted slope the run allows (families, then metrics, then implementations in registry order)."""
    out = []
    for family in SWEEPS:
        for metric in METRICS:
            found = series(run, family, metric)
            for impl in ordered(i for i, _ in found):
                for (i, regime), pts in found.items():
                    if i != impl or len({p.x for p in pts}) < MIN_POINTS:
                        continue
                    s, lo, hi = fit_slope([p.x for p in pts], [p.y for p in pts])
                    out.append(Slope(family, impl, regime, metric, s, lo, hi, len(pts), pts[0].x, pts[-1].x,
                                     pts[-1].y))
    return out


def slopes_csv(found: list[Slope]) -> str:
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow([f.name for f in fields(Slope)])
    for s in found:
        writer.writerow([f"{v:.6g}" if isinstance(v, float) else v for v in asdict(s).values()])
    return buf.getvalue()


def read_slopes(path: Path) -> list[Slope]:
    """Slopes from a ``growth_slopes.csv`` written by :func:`render`."""
    with path.open(newline="") as fh:
        rows = list(csv.DictReader(fh))
    kinds = {f.name: f.type for f in fields(Slope)}
    convert = {"float": float, "int": int, "str": str}
    return [Slope(**{k: convert[str(kinds[k])](v) for k, v in r.items()}) for r in rows]


def _size(x: float) -> str:
    for div, suffix in ((2**20, "Mi"), (2**10, "Ki")):
        if x >= div and x % div == 0:
            return f"{x / div:g} {suffix}"
    return f"{x:,.0f}"


def _level(metric: str, v: float) -> str:
    if metric == "seq_step_ns":
        return f"{v:,.0f} ns" if v >= 100 else f"{v:.3g} ns"
    for div, unit in ((2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")):
        if v >= div:
            return f"{v / div:.3g} {unit}"
    return f"{v:,.0f} B"


def _slope_text(s: Slope) -> str:
    return f"{s.slope:.2f} [{s.ci_low:.2f}, {s.ci_high:.2f}]"


def _cell(s: Slope) -> str:
    return f"{_slope_text(s)}; {_level(s.metric, s.at_max)} at {_size(s.x_max)}"


def cost_lines(found: list[Slope]) -> list[str]:
    """Per family, one line of every cell's cost slope (ns per sequence-step): the console's answer to "at my size?"."""
    lines = []
    for family in SWEEPS:
        mine = [s for s in found if s.family == family and s.metric == "seq_step_ns"]
        if mine:
            cells = ", ".join(f"{s.impl}{'' if s.regime == 'batched' else ' ' + s.regime} {_slope_text(s)} "
                              f"({_level(s.metric, s.at_max)})" for s in mine)
            lines.append(f"growth over the {family} sweep, {_size(min(s.x_min for s in mine))} to "
                         f"{_size(max(s.x_max for s in mine))} ({AXIS_LABELS[family]}): log-log slope of ns per "
                         f"sequence-step [95 %] (1: linear, 0: none), then the figure at the largest size: {cells}")
    return lines


def slopes_markdown(found: list[Slope]) -> str:
    """The slopes as one markdown table per family: a row per implementation or copy variant, a column per metric."""
    out = ["Fitted log-log slopes (least squares on log10-log10; 95 % t-interval of the slope, n - 2 degrees of "
           "freedom): 1 is linear growth, 0 none; then the figure at the largest size; points: the sizes fitted.", ""]
    for family in SWEEPS:
        mine = [s for s in found if s.family == family]
        if not mine:
            continue
        lo, hi = min(s.x_min for s in mine), max(s.x_max for s in mine)
        cells: dict[tuple[str, str], dict[str, Slope]] = {}
        for s in mine:
            cells.setdefault((s.impl, s.regime), {})[s.metric] = s
        out += [f"**{family}** ({AXIS_LABELS[family]}, {_size(lo)} to {_size(hi)}):", "",
                *markdown_table(["impl", "regime", *(f"{METRICS[m][0]} (`{m}`)" for m in METRICS), "points"],
                                [[f"`{impl}`", regime, *(_cell(by[m]) if m in by else "" for m in METRICS),
                                  str(max(b.points for b in by.values()))] for (impl, regime), by in cells.items()]),
                ""]
    return "\n".join(out)


def _series_name(impl: str, regime: str, variants: bool) -> str:
    """A legend's name of a series: a copy variant with what it copies, else the implementation (and its regime)."""
    if variants:
        return f"{regime}: {VARIANT_WORDS[regime]}" if regime in VARIANT_WORDS else regime
    return registry.record(impl).label + ("" if regime == "batched" else f", {regime}")


def _panel(ax, run: RunData, family: str, data: dict[tuple[str, str], list[Point]],
           found: dict[tuple[str, str], Slope], variants: bool) -> None:
    """One axes: ``data``'s series (at most :data:`MAX_SERIES`) against the family's size, with their fits."""
    styles = ["-", "--", ":", "-.", (0, (5, 1)), (0, (1, 3))]
    for k, ((impl, regime), pts) in enumerate(data.items()):
        xs, ys = [p.x for p in pts], [p.y for p in pts]
        err = [[max(0.0, p.y - p.lo) if not math.isnan(p.lo) else 0.0 for p in pts],
               [max(0.0, p.hi - p.y) if not math.isnan(p.hi) else 0.0 for p in pts]]
        s = found.get((impl, regime))
        fit = f" {s.slope:.2f} [{s.ci_low:.2f}, {s.ci_high:.2f}]" if s else ""
        ax.errorbar(xs, ys, yerr=err, marker="o", ms=3, capsize=2, elinewidth=0.7, lw=1.1,
                    color=f"C{k % 10}" if variants else color(impl, run),
                    ls=styles[k % len(styles)] if variants else ("-" if regime == "batched" else "--"),
                    label=f"{_series_name(impl, regime, variants)}{fit}")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    if family == "pool":
        ax.axvline(UINT16_LIMIT, color="0.5", lw=0.8, ls=":")
        ax.text(UINT16_LIMIT, 1.0, " ids widen\n to uint32", transform=ax.get_xaxis_transform(), va="top",
                fontsize=MIN_FONT, color="0.35")
    ax.grid(which="both", alpha=0.25)
    ax.legend(fontsize=MIN_FONT, loc="upper left", bbox_to_anchor=(1.005, 1), frameon=False,
              title="copy variant: slope [95 %]" if variants else "slope [95 %]", title_fontsize=MIN_FONT)


def _chunks(data: dict[tuple[str, str], list[Point]], variants: bool) -> list[tuple[str, list[tuple[str, str]]]]:
    """``data``'s series as (title, keys) panels of at most :data:`MAX_SERIES` (:func:`series_panels`)."""
    keys = list(data)
    if variants:
        return [("", keys[k:k + MAX_SERIES]) for k in range(0, len(keys), MAX_SERIES)]
    regimes = list(dict.fromkeys(r for _, r in keys))
    if regimes == ["batched"] and len(keys) <= MAX_SERIES:
        return [("", keys)]
    return [(title if regime == "batched" else f"{regime}: {title}", [(i, regime) for i in members])
            for regime in regimes
            for title, members in series_panels([i for i, r in keys if r == regime])]


def growth_panels(run: RunData) -> tuple[list[tuple[str, str, str, dict]], list[tuple[str, str, str]]]:
    """The figure's panels (family, metric, title, {series: points}) and the series measured at one size only."""
    panels, alone = [], []
    for family in SWEEPS:
        if len(family_sizes(run, family)) < 2:
            continue
        for metric in METRICS:
            variants = metric == "table_copy_bytes_per_step"
            data = series(run, family, metric)
            alone += [(family, _series_name(i, r, variants), pts[0].scenario) for (i, r), pts in data.items()
                      if len(pts) < 2]
            rank = {impl: k for k, impl in enumerate(ordered(i for i, _ in data))}
            grown = {k: v for k, v in sorted(data.items(), key=lambda kv: (rank[kv[0][0]], kv[0][1]))
                     if len(v) >= 2}
            panels += [(family, metric, title, {k: grown[k] for k in keys})
                       for title, keys in _chunks(grown, variants)]
    return panels, alone


def _left_out(alone: list[tuple[str, str, str]]) -> str:
    """The caption's sentence on the series measured at one size only."""
    if not alone:
        return ""
    where = {}
    for family, name, scenario in alone:
        where.setdefault((family, scenario), []).append(name)
    parts = [f"{len(names)} at {scenario} only ({family})" for (family, scenario), names in where.items()]
    return "Left out, measured at one size only (no growth to show): " + "; ".join(parts) + "."


def _share_y(axes, keys: list[tuple[str, str]]) -> None:
    """One y range for the panels of the same family and metric, so that they read against each other."""
    for key in dict.fromkeys(keys):
        mine = [ax for ax, k in zip(axes, keys, strict=False) if k == key]
        lows, highs = zip(*(ax.get_ylim() for ax in mine), strict=True)
        for ax in mine:
            ax.set_ylim(min(lows), max(highs))


def fig_growth(run: RunData, found: list[Slope]):
    """A log-log panel per family, metric and group of at most eight series; ``None`` without two sizes."""
    panels, alone = growth_panels(run)
    if not panels:
        log.warning("growth: no scale-sweep family with two sizes in this run")
        return None
    nrows, ncols = grid(len(panels), 3)
    fig, axes = new_figure(7.0 * ncols, 4.2 * nrows, nrows, ncols)
    titles = numbered([f"{family}: {METRICS[metric][0]}" + (f", {title}" if title else "")
                       for family, metric, title, _ in panels])
    for ax, (family, metric, _, data), text in zip(axes, panels, titles, strict=False):
        fits = {(s.impl, s.regime): s for s in found if s.family == family and s.metric == metric}
        _panel(ax, run, family, data, fits, metric == "table_copy_bytes_per_step")
        ylabel = METRICS[metric][1]
        ax.set_title(textwrap.fill(text, 52), fontsize=9)
        ax.set_xlabel(f"{AXIS_LABELS[family]} (log scale)", fontsize=8)
        ax.set_ylabel(f"{ylabel} (log scale)", fontsize=8)
    hide_unused(axes, len(panels))
    _share_y(axes, [(family, metric) for family, metric, _, _ in panels])
    return finish(fig, run, "How cost and memory grow (error bars: 95 % intervals; legend: fitted log-log slope)",
                   _left_out(alone))


def render(run_dir: Path) -> list[Path]:
    """``figures/growth.*`` and ``growth_slopes.csv|md`` of a run with scale-sweep points; failures only logged."""
    try:
        run = RunData.load(run_dir)
        found = slopes(run)
        fig = fig_growth(run, found)
        if fig is None:
            return []
        written = save_figure(fig, run.run_dir / "figures", "growth")
        for name, text in ((SLOPES_CSV, slopes_csv(found)), (SLOPES_MD, slopes_markdown(found))):
            atomic_write_text(run.run_dir / name, text)
            written.append(run.run_dir / name)
        return written
    except Exception:  # one broken figure must not cost the others
        log.exception("figure growth failed")
        return []


class GrowthReadmeError(InputError):
    """The README has no (or broken) growth markers, or the run has no slopes."""


def growth_section(run_dir: Path, shown_as: str) -> str:
    """The README's generated growth section: the run (as ``shown_as``), its figure and its slopes."""
    path = Path(run_dir) / SLOPES_MD
    if not path.is_file():
        raise GrowthReadmeError(f"{path} does not exist: run `kvblock-bench report {run_dir}` first")
    run = RunData.load(run_dir)
    head = (f"Run {md_code(run.run_id)} of {md_code(run.meta.get('command_line', '?'))} at commit "
            f"{md_code(run.meta.get('git_commit', '?'))}, started {md(run.meta.get('started', '?'))}, took "
            f"{run_duration(run.meta)}.")
    return "\n".join([head, "", f"![How cost and memory grow]({shown_as}/figures/growth.png)", "",
                      path.read_text().rstrip(), ""])


def write_growth_readme(readme: Path, run_dir: Path, shown_as: str | None = None) -> None:
    """Replace the README's growth section with :func:`growth_section` of ``run_dir``."""
    text = check_readme(readme, "--growth-readme", BEGIN, END)
    if shown_as is None:
        shown_as = Path(os.path.relpath(Path(run_dir).resolve(), readme.resolve().parent)).as_posix()
    section = growth_section(run_dir, shown_as)
    head, rest = text.split(BEGIN)
    atomic_write_text(readme, head + BEGIN + "\n" + section + END + rest.split(END, 1)[1])
