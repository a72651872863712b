"""How a figure of a run is written in every report: numbers, intervals, ratios, the noise floor, CPU share."""

from __future__ import annotations

import math
from datetime import datetime

import pandas as pd

from harness.base.host import competing_work, machine_name
from harness.base.rows import ratio_metric
from harness.base.text import duration_text
from harness.output.markdown import one_line
from harness.output.rundata import RunData
from impls import registry

BASE = registry.RATIO_BASE
CACHE_BASE = registry.CACHING_RATIO_BASE


def fmt(value: float | None, digits: int = 3) -> str:
    """A figure in ``digits`` significant digits, thousands separated from 100 up; "—" for none."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    if value == 0:
        return "0"
    if abs(value) >= 100:
        return f"{value:,.0f}"
    return f"{value:.{digits}g}"


WHY = {"met": "the whole interval is at or below it", "missed": "the whole interval is above it",
       "not decided": "the interval holds it"}


def target_word(row: dict | None, target: float) -> str:
    """Whether a figure is at most ``target`` judged on its interval (a key of :data:`WHY`), or ``no interval``."""
    bounds = interval_of(row)
    if bounds is None:
        return "no interval"
    return "met" if bounds[1] <= target else "missed" if bounds[0] > target else "not decided"


def target_verdict(row: dict | None, target: float) -> str:
    """:func:`target_word` with its reason, never on the point alone."""
    word = target_word(row, target)
    if word == "no interval":
        return "not decided (no interval: the figure needs at least two repetitions)"
    return f"{word} ({WHY[word]})"


def interval_of(row: dict | None) -> tuple[float, float] | None:
    """A measured row's 95 % interval (its ``ci_low``/``ci_high`` columns), None where it has none."""
    if not row or row.get("status") != "ok":
        return None
    low, high = row.get("ci_low"), row.get("ci_high")
    if low is None or high is None or pd.isna(low) or pd.isna(high):
        return None
    return float(low), float(high)


def interval_text(row: dict | None) -> str:
    """`` [low–high]`` of a row's 95 % interval, or "" where it has none."""
    bounds = interval_of(row)
    return f" [{fmt(bounds[0])}–{fmt(bounds[1])}]" if bounds else ""


def value_text(run: RunData, scenario: str, impl: str, regime: str, metric: str) -> str:
    """The figure with its 95 % interval where it has one."""
    return fmt(run.value(scenario, impl, regime, metric)) + interval_text(run.get(scenario, impl, regime, metric))


def ratio_text(run: RunData, scenario: str, impl: str, regime: str, metric: str, base_regime: str | None = None,
               base: str = BASE) -> str:
    """``R× [low–high]``: the cell's ``metric`` over ``base``'s with the paired interval; "no difference" at 1."""
    batched_base = base_regime not in (None, regime)
    if impl == base and not batched_base:
        return "1×"
    row = run.get(scenario, impl, regime, ratio_metric(metric, base, batched_base))
    if row is None or row["status"] != "ok":
        return "—"
    text = f"{fmt(float(row['value']), 3)}×{interval_text(row)}"
    bounds = interval_of(row)
    if bounds and bounds[0] <= 1 <= bounds[1]:
        text += " (no difference)"
    return text


def aa_row(run: RunData, scenario: str) -> dict | None:
    """The scenario's measured A/A control row, None when the run has none."""
    rows = run.df[(run.df.scenario == scenario) & (run.df.metric == "aa_ratio") & (run.df.status == "ok")]
    return None if rows.empty else rows.iloc[0].to_dict()


def aa_text(run: RunData, scenario: str) -> str:
    """The run's noise floor on ``scenario``: the A/A control's ratio and interval, in one sentence."""
    r = aa_row(run, scenario)
    if r is None:
        return "Noise floor: no A/A control in this run."
    bounds = interval_of(r)
    if bounds is None:
        return (f"Noise floor: the A/A control (`{r['impl']}` {r['regime']} replayed twice as two cells) reads "
                f"{fmt(r['value'], 3)}×, without an interval (too few slices to resample).")
    verdict = ("no difference, as it must be" if bounds[0] <= 1 <= bounds[1]
               else "a difference: treat ratios this close to 1 as noise")
    return (f"Noise floor: the A/A control (`{r['impl']}` {r['regime']} replayed twice as two cells) reads "
            f"{fmt(r['value'], 3)}× [{fmt(bounds[0], 3)}–{fmt(bounds[1], 3)}]: {verdict}.")


def cpu_text(pct: float) -> str:
    """A CPU share: ``66 %``, and from one core up also in cores (``382 % = 3.8 cores``)."""
    if math.isnan(pct):
        return "—"
    if pct < 100:
        return f"{fmt(pct)} %"
    return f"{fmt(pct)} % = {pct / 100:.1f} cores"


def machine_line(meta: dict) -> str:
    """The machine named precisely (``host.machine_name``), the PMU, the commit: where a run's figures belong."""
    return one_line(f"{machine_name(meta)}; PMU: {meta.get('pmu', '?')}; commit {meta.get('git_commit', '?')}"
                    f"{load_text(meta)}")


def host_line(meta: dict) -> str:
    """The host's state around a run and whether it was beside competing work ("" where unrecorded)."""
    host = meta.get("host") if isinstance(meta.get("host"), dict) else {}
    if not host:
        return ""
    parts = []
    on_cpu = host.get("on_cpu_pct") if isinstance(host.get("on_cpu_pct"), dict) else {}
    if on_cpu:
        parts.append(f"the cells' threads ran {on_cpu.get('min', '?'):g}-100 % (median {on_cpu.get('median', '?'):g} %)"
                     " of their timed slices' wall time")
    end = host.get("end") if isinstance(host.get("end"), dict) else {}
    if end.get("steal_pct") is not None:
        parts.append(f"steal {end['steal_pct']:g} %")
    probes = [(when, (host.get(when) or {}).get("latency_ns")) for when in ("start", "end")]
    shown = [f"{when} " + " / ".join(f"{v:g}" for v in lat.values()) for when, lat in probes if isinstance(lat, dict)]
    if shown:
        sizes = " / ".join(next(lat for _, lat in probes if isinstance(lat, dict)))
        parts.append(f"memory latency ns ({sizes} working sets) at the {', at the '.join(shown)}")
    verdict = competing_work(meta)
    head = f"taken beside competing work ({verdict})" if verdict else "no competing work seen"
    return f"{head}; " + "; ".join(parts) if parts else head


def load_text(meta: dict) -> str:
    """"; load average 0.4 at the start, 2.9 at the end" (1-minute), or "" for a run that did not record it."""
    start, end = meta.get("load_average"), meta.get("load_average_end")
    if not start:
        return ""
    return f"; load average {start[0]:g} at the start" + (f", {end[0]:g} at the end" if end else "")


def source_text(run: RunData, scenario: str, impl: str, regime: str, metric: str) -> str:
    """The instrument of a figure, naming the other instruments' rows too; "" when the run has no such row."""
    row = run.get(scenario, impl, regime, metric)
    if row is None:
        return ""
    sel = run.df[(run.df.scenario == scenario) & (run.df.impl == impl) & (run.df.regime == regime)
                 & (run.df.metric == metric)]
    others = [f"{r.source}: {r.status}" for r in sel.itertuples() if r.source != row["source"]]
    return str(row["source"]) + (f" ({'; '.join(others)})" if others else "")


def measured_text(run: RunData, scenario: str, impl: str, regime: str, metric: str) -> str:
    """The figure (with its interval) where measured, else its status word, else "—" without a row."""
    row = run.get(scenario, impl, regime, metric)
    if row is None:
        return "—"
    if row["status"] != "ok":
        return str(row["status"])
    return value_text(run, scenario, impl, regime, metric)


def run_duration(meta: dict) -> str:
    """How long the run took, in words."""
    return duration_text(run_seconds(meta))


def run_seconds(meta: dict) -> float:
    """A run's wall time from its ``started`` and ``finished`` stamps, NaN when it does not say."""
    try:
        stamp = "%Y-%m-%dT%H:%M:%S%z"
        return (datetime.strptime(meta["finished"], stamp) - datetime.strptime(meta["started"], stamp)).total_seconds()
    except (KeyError, TypeError, ValueError):
        return math.nan
