"""``history``'s verdicts: each pair of consecutive releases compared as ``compare`` compares two runs.
Design: docs/output.md#harnessoutputhistory_reportpy."""

from __future__ import annotations

import csv
import io
import math
from dataclasses import asdict, dataclass
from itertools import groupby, pairwise
from pathlib import Path

from packaging.version import Version

from harness.base.files import atomic_write_text
from harness.base.history_rows import CALL_METRICS, METRICS, HistoryRow
from harness.base.stats import Estimate, independent_ratio
from harness.output.compare import DEFAULT_THRESHOLD, verdict

VERDICTS_CSV = "verdicts.csv"
SHORT = {"slower": "SLOWER", "faster": "faster", "no difference": "=", "not comparable": "n/c"}


@dataclass
class Step:
    """NEW release over BASE release of one figure: the ratio, its 95 % interval and ``compare``'s verdict."""

    engine: str
    caching: str
    scenario: str
    metric: str
    base: str
    new: str
    ratio: float
    ci_low: float
    ci_high: float
    verdict: str
    note: str


def series_key(row: HistoryRow) -> tuple[str, str, str, str]:
    return row.engine, row.caching, row.scenario, row.metric


def ordered(rows: list[HistoryRow]) -> list[HistoryRow]:
    """By engine, caching, scenario, metric (in :data:`METRICS`' order), then release."""
    return sorted(rows, key=lambda r: (r.engine, r.caching, r.scenario, METRICS.index(r.metric), Version(r.version)))


def _estimate(row: HistoryRow) -> Estimate | None:
    if row.status != "ok" or not all(math.isfinite(x) and x > 0 for x in (row.value, row.ci_low, row.ci_high)):
        return None
    return Estimate(row.value, row.ci_low, row.ci_high)


def step(base: HistoryRow, new: HistoryRow, threshold: float = DEFAULT_THRESHOLD) -> Step:
    """``new`` over ``base``, ``compare``'s verdict at ``threshold`` (independent intervals, combined as it does)."""
    b, n = _estimate(base), _estimate(new)
    head = (new.engine, new.caching, new.scenario, new.metric, base.version, new.version)
    if b is None or n is None:
        side = base.version if b is None else new.version
        return Step(*head, math.nan, math.nan, math.nan, "not comparable", f"no figure with an interval in {side}")
    est = independent_ratio(n, b)
    name, notes = verdict(est, threshold)
    return Step(*head, est.value, est.low, est.high, name, "; ".join(notes))


def steps(rows: list[HistoryRow], threshold: float = DEFAULT_THRESHOLD) -> list[Step]:
    """Every pair of consecutive releases of every series of :data:`METRICS`."""
    out = []
    for _, series in groupby(ordered([r for r in rows if r.metric in METRICS]), key=series_key):
        out += [step(a, b, threshold) for a, b in pairwise(list(series))]
    return out


def write_steps(folder: Path, found: list[Step]) -> Path:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(Step.__dataclass_fields__), lineterminator="\n")
    writer.writeheader()
    for s in found:
        writer.writerow({k: f"{v:.3f}" if isinstance(v, float) and math.isfinite(v) else ("" if isinstance(v, float)
                         else v) for k, v in asdict(s).items()})
    path = folder / VERDICTS_CSV
    atomic_write_text(path, buf.getvalue())
    return path


def _cell(s: Step) -> str:
    if s.verdict == "not comparable":
        return "n/c"
    return f"{s.ratio:.2f} [{s.ci_low:.2f}-{s.ci_high:.2f}] {SHORT[s.verdict]}"


def table(found: list[Step]) -> list[str]:
    """A markdown table: one row per pair of releases and caching mode and scenario, a column per metric."""
    head = ["release", "caching", "scenario", *METRICS]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    by_pair: dict[tuple, dict[str, Step]] = {}
    for s in found:
        by_pair.setdefault((s.engine, s.base, s.new, s.caching, s.scenario), {})[s.metric] = s
    for (engine, base, new, caching, scenario), cells in sorted(by_pair.items(), key=lambda kv: (
            kv[0][0], Version(kv[0][2]), kv[0][3], kv[0][4])):
        values = [_cell(cells[m]) if m in cells else "" for m in METRICS]
        lines.append(f"| {engine} {base} -> {new} | {caching} | {scenario} | " + " | ".join(values) + " |")
    return lines


def console_lines(found: list[Step], threshold: float = DEFAULT_THRESHOLD) -> list[str]:
    """The console summary: the table's rows as text, and the releases a verdict says are slower."""
    lines = [f"NEW/BASE per metric ({', '.join(METRICS)}), 95 % interval, compare's verdict at "
             f"{threshold * 100:g} % (SLOWER, faster, = no difference, n/c not comparable):"]
    lines += [line.strip("| ").replace(" | ", "  ") for line in table(found)[2:]]
    slower = [s for s in found if s.verdict == "slower"]
    lines.append("slower: " + ("; ".join(f"{s.engine} {s.new} ({s.caching}, {s.scenario}, {s.metric} x{s.ratio:.2f})"
                                         for s in slower) if slower else "none"))
    return lines


def calls_cells(rows: list[HistoryRow]) -> list[list[str]]:
    """Per release, caching mode and scenario: the engine's own calls, the shared rest of the step, the engine's
    share, as text cells."""
    found: dict[tuple, dict[str, HistoryRow]] = {}
    for r in rows:
        if r.metric in CALL_METRICS:
            found.setdefault((r.engine, Version(r.version), r.version, r.caching, r.scenario), {})[r.metric] = r
    out = []
    for (engine, _, version, caching, scenario), cells in sorted(found.items()):
        calls, shared = cells.get(CALL_METRICS[0]), cells.get(CALL_METRICS[1])
        share = calls.value / (calls.value + shared.value) if calls and shared and calls.value + shared.value > 0 \
            else math.nan
        out.append([f"{engine} {version}", caching, scenario, _spread(calls), _spread(shared),
                    "" if math.isnan(share) else f"{share * 100:.0f} %"])
    return out


def calls_table(cells: list[list[str]]) -> list[str]:
    """:func:`calls_cells`' cells as a Markdown table (none when there are none)."""
    if not cells:
        return []
    return ["| release | caching | scenario | engine calls, ns/seq-step | shared, ns/seq-step | engine's share |",
            "|---|---|---|---|---|---|", *("| " + " | ".join(c) + " |" for c in cells)]


def _spread(row: HistoryRow | None) -> str:
    if row is None or not math.isfinite(row.value):
        return "n/a"
    return f"{row.value:,.0f} [{row.ci_low:,.0f}-{row.ci_high:,.0f}]"
