"""``history``'s verdicts: each pair of consecutive releases compared as ``compare`` compares two runs.
Design: docs/output.md#harnesshistoryverdictspy."""

from __future__ import annotations

import csv
import gzip
import io
import json
import math
from dataclasses import asdict, dataclass, replace
from itertools import pairwise
from pathlib import Path

import numpy as np
from packaging.version import Version

from harness.base.files import ResultsError, atomic_write_text
from harness.base.stats import Estimate, independent_ratio, paired_reps
from harness.history.anchored import Chained, anchor_of, by_release, chain, chained_from_rows, common_group
from harness.history.records import CALL_METRICS, METRICS, HistoryRow, raw_path
from harness.output.compare import DEFAULT_THRESHOLD, measured_change, verdict
from harness.output.markdown import markdown_table

VERDICTS_CSV = "verdicts.csv"
PAIRING = ("`seq_step_ns` is paired over repetitions where the folder's `runs/` holds them (every release's "
           "repetition r ran in the same windows of time); the other metrics combine the releases' own intervals.")
SHORT = {"slower": "SLOWER", "faster": "faster", "no difference": "=", "not comparable": "n/c",
         "slower, under the threshold": "slower <{t}", "faster, under the threshold": "faster <{t}",
         "slower, near the threshold": "slower ~{t}", "faster, near the threshold": "faster ~{t}"}
LEGEND = ("SLOWER, faster: beyond the threshold; slower <{t}, faster <{t}: a change measured (the whole interval on "
          "one side of 1) but under the threshold; slower ~{t}, faster ~{t}: measured, its interval reaching past "
          "{t}; = no difference; n/c not comparable")


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
    interval: str = "independent"  # or "paired" (the same windows of time), either "through the anchor V"


def _estimate(row: HistoryRow) -> Estimate | None:
    if row.status != "ok" or not all(math.isfinite(x) and x > 0 for x in (row.value, row.ci_low, row.ci_high)):
        return None
    return Estimate(row.value, row.ci_low, row.ci_high)


PairKey = tuple[str, str, str, str, str, str]  # engine, caching, scenario, metric, BASE release, NEW release


def step(base: HistoryRow, new: HistoryRow, threshold: float = DEFAULT_THRESHOLD,
         paired: dict[PairKey, Estimate] | None = None) -> Step:
    """``new`` over ``base``, ``compare``'s verdict at ``threshold``; paired where ``paired`` holds the figure."""
    b, n = _estimate(base), _estimate(new)
    head = (new.engine, new.caching, new.scenario, new.metric, base.version, new.version)
    est = (paired or {}).get(head)
    if isinstance(est, Chained) and not math.isfinite(est.low):
        b = None
        base = replace(base, version=f"{base.version} or the anchor {est.anchor}")
    if b is None or n is None:
        side = base.version if b is None else new.version
        return Step(*head, math.nan, math.nan, math.nan, "not comparable", f"no figure with an interval in {side}")
    interval = _interval(est)
    est = independent_ratio(n, b) if interval == "independent" else est
    name, notes = verdict(est, threshold)
    side = measured_change(est) if name == "no difference" else ""
    if side:
        name = f"{side}, {'near' if notes[0].startswith('inconclusive') else 'under'} the threshold"
    return Step(*head, est.value, est.low, est.high, name, "; ".join(notes), interval)


def _interval(est: Estimate | None) -> str:
    if isinstance(est, Chained):
        return f"{'paired' if est.paired else 'independent'} through the anchor {est.anchor}"
    return "independent" if est is None or not math.isfinite(est.low) else "paired"


def steps(rows: list[HistoryRow], threshold: float = DEFAULT_THRESHOLD,
          paired: dict[PairKey, Estimate] | None = None) -> list[Step]:
    """Every pair of consecutive releases of every series of :data:`METRICS`, in a shared group or via the anchor."""
    out = []
    for key, releases in by_release([r for r in rows if r.metric in METRICS]).items():
        for a, b in pairwise(releases):
            g = common_group(releases, a, b)
            if g is not None:
                out.append(step(releases[a][g], releases[b][g], threshold, paired))
                continue
            head = (*key, a, b)
            through = (paired or {}).get(head) or chained_from_rows(releases, a, b)
            base, new = next(iter(releases[a].values())), next(iter(releases[b].values()))
            out.append(step(base, new, threshold, {head: through} if through is not None else {}))
    return sorted(out, key=lambda s: (s.engine, s.caching, s.scenario, METRICS.index(s.metric), Version(s.new)))


def paired_steps(folder: Path, rows: list[HistoryRow]) -> dict[PairKey, Estimate]:
    """``seq_step_ns`` of each release over the one before, paired over the repetitions in ``folder/runs/``."""
    out: dict[PairKey, Estimate] = {}
    for key, releases in by_release([r for r in rows if r.metric == "seq_step_ns" and r.status == "ok"]).items():
        times = {(v, g): _rep_step_times(raw_path(folder, r.engine, v, r.scenario, g)).get(r.caching)
                 for v, found in releases.items() for g, r in found.items()}
        for a, b in pairwise(releases):
            found = _paired(releases, times, a, b)
            if found is not None:
                out[(*key, a, b)] = found
    return out


def _paired(releases: dict, times: dict, a: str, b: str) -> Estimate | None:
    g = common_group(releases, a, b)
    if g is not None:
        ta, tb = times[(a, g)], times[(b, g)]
        return paired_reps(tb, ta) if ta is not None and tb is not None and ta.shape == tb.shape else None
    anchor = anchor_of(releases)
    if anchor is None:
        return None
    (ga, *_), (gb, *_) = releases[a], releases[b]
    ta, tb, tab, tan = times[(a, ga)], times[(b, gb)], times.get((anchor, ga)), times.get((anchor, gb))
    if any(t is None for t in (ta, tb, tab, tan)) or ta.shape != tab.shape or tb.shape != tan.shape:
        return None
    return chain(ta, tb, tab, tan, anchor, paired_reps, paired=True)


def _rep_step_times(path: Path) -> dict[str, np.ndarray]:
    """Caching mode -> its baseline's step times ``[reps, steps]`` in a release's raw file (nothing without one)."""
    if not path.is_file():
        return {}
    try:
        doc = json.loads(gzip.decompress(path.read_bytes()))
    except (OSError, ValueError, EOFError) as exc:
        raise ResultsError(f"{path}: not a history run file ({exc})") from None
    modes = doc.get("caching", {})
    return {modes[name]: np.asarray(reps, dtype=float) for name, reps in doc.get("step_ns", {}).items()
            if name in modes and len(reps) >= 2}


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


def _cell(s: Step, threshold: float) -> str:
    if s.verdict == "not comparable":
        return "n/c"
    return f"{s.ratio:.2f} [{s.ci_low:.2f}-{s.ci_high:.2f}] {SHORT[s.verdict].format(t=f'{threshold * 100:g} %')}"


def table(found: list[Step], threshold: float = DEFAULT_THRESHOLD) -> list[str]:
    """A markdown table: one row per pair of releases and caching mode and scenario, a column per metric."""
    by_pair: dict[tuple, dict[str, Step]] = {}
    for s in found:
        by_pair.setdefault((s.engine, s.base, s.new, s.caching, s.scenario), {})[s.metric] = s
    rows = [[f"{engine} {base} -> {new}", caching, scenario,
             *(_cell(cells[m], threshold) if m in cells else "" for m in METRICS)]
            for (engine, base, new, caching, scenario), cells in sorted(by_pair.items(), key=lambda kv: (
                kv[0][0], Version(kv[0][2]), kv[0][3], kv[0][4]))]
    return markdown_table(["release", "caching", "scenario", *METRICS], rows)


def console_lines(found: list[Step], threshold: float = DEFAULT_THRESHOLD) -> list[str]:
    """The console summary: the table's rows as text, and the releases a verdict says are slower."""
    lines = [f"NEW/BASE per metric ({', '.join(METRICS)}), 95 % interval, compare's verdict at "
             f"{threshold * 100:g} % ({legend(threshold)}):"]
    lines += [line.strip("| ").replace(" | ", "  ") for line in table(found, threshold)[2:]]
    slower = [s for s in found if s.verdict == "slower"]
    lines.append("slower: " + ("; ".join(f"{s.engine} {s.new} ({s.caching}, {s.scenario}, {s.metric} x{s.ratio:.2f})"
                                         for s in slower) if slower else "none"))
    return lines


def legend(threshold: float = DEFAULT_THRESHOLD) -> str:
    """What the table's verdict words mean, at ``threshold``."""
    return LEGEND.format(t=f"{threshold * 100:g} %")


def calls_cells(rows: list[HistoryRow]) -> list[list[str]]:
    """Per release, caching mode and scenario: the engine's calls, the shared rest, the engine's share (text)."""
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
    return markdown_table(["release", "caching", "scenario", "engine calls, ns/seq-step", "shared, ns/seq-step",
                           "engine's share"], cells)


def _spread(row: HistoryRow | None) -> str:
    if row is None or not math.isfinite(row.value):
        return "n/a"
    return f"{row.value:,.0f} [{row.ci_low:,.0f}-{row.ci_high:,.0f}]"
