"""The site's pages of the committed studies: engines release by release, CI's verdicts, calibration."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

from packaging.version import InvalidVersion, Version

from harness.history.anchored import groups_note, on_anchor_scale
from harness.history.records import METRICS, UNITS, read_history
from harness.output.formatting import fmt
from harness.site.figures import Points, block, markers
from harness.site.html import Cell, markdown, para, section, table

HISTORY, PAIRS, CALIBRATION = Path("history"), Path("compare_pairs"), Path("calibration")
CAPTION_NONE = "Not in these results: {path} (the site shows what the results folder holds)."


def _csv(path: Path) -> list[dict[str, str]]:
    with path.open(newline="", encoding="utf-8") as fh:
        return list(csv.DictReader(fh))


def _float(text: str | None) -> float:
    try:
        return float(text) if text not in (None, "") else math.nan
    except ValueError:
        return math.nan


def _version_key(text: str) -> tuple:
    try:
        return (0, Version(text))
    except InvalidVersion:
        return (1, text)


def _interval(value: float, low: float, high: float, suffix: str = "") -> Cell:
    text = f"{fmt(value)}{suffix}" + (f" [{fmt(low)}–{fmt(high)}]" if math.isfinite(low) else "")
    return Cell(text, value)


# -- engines release by release --------------------------------------------------------------------------------
def _engine(folder: Path, out: Path) -> str:
    rows = on_anchor_scale(read_history(folder / "history.csv"))  # a release once, on the anchor's scale
    meta = json.loads((folder / "meta.json").read_text()) if (folder / "meta.json").is_file() else {}
    machine = str(meta.get("machine") or (rows[0].machine if rows else "?"))
    engine = rows[0].engine if rows else folder.name
    body = para(f"{engine}'s own block manager, each release imported unmodified from its published package and "
                f"replayed by the same driver, every release in lockstep ({len({r.version for r in rows})} releases; "
                f"machine: {machine}). {groups_note(meta)}".strip())
    for metric in METRICS:
        mine = sorted((r for r in rows if r.metric == metric and r.status == "ok"),
                      key=lambda r: _version_key(r.version))
        if not mine:
            continue
        points = Points()
        for r in mine:
            points.add(f"caching {r.caching}, {r.scenario}", r.version, r.value, r.ci_low, r.ci_high)
        fig = markers(points, f"{engine}: {metric} by release", f"{UNITS[metric]} (log)", machine, lines=True)
        body += block(fig, points, f"history-{folder.name}-{metric}", out)
    if (folder / "verdicts.csv").is_file():
        verdicts = [[v["base"], v["new"], v["caching"], v["scenario"], v["metric"],
                     _interval(_float(v["ratio"]), _float(v["ci_low"]), _float(v["ci_high"]), "×"), v["verdict"],
                     v.get("note", "")] for v in _csv(folder / "verdicts.csv")]
        body += table(f"verdicts-{folder.name}", ["release before", "release", "caching", "scenario", "metric",
                                                  "new / before", "verdict", "note"], verdicts,
                      "compare's verdict of each release against the one before")
    if (folder / "changes.csv").is_file():
        changes = [[c["version"], c["caching"], c["metric"], c["change"]] for c in _csv(folder / "changes.csv")]
        body += table(f"changes-{folder.name}", ["release", "caching", "metric", "the engine's change"], changes,
                      "what changed in the engine's code where a release is slower (read from both packages)")
    return section(f"{engine} ({folder})", body, f"engine-{folder.name}")


def history_page(root: Path, out: Path) -> str:
    folders = sorted(p for p in (root / HISTORY).glob("*") if (p / "history.csv").is_file())
    if not folders:
        return para(CAPTION_NONE.format(path=root / HISTORY))
    return (para("Whether an engine's block manager got slower between releases: `kvblock-bench history`.")
            + "".join(_engine(f, out) for f in folders))


# -- CI: compare's false-alarm campaign ----------------------------------------------------------------------
def ci_page(root: Path, out: Path) -> str:
    folder = root / PAIRS
    if not (folder / "pairs.json").is_file():
        return para(CAPTION_NONE.format(path=folder))
    data = json.loads((folder / "pairs.json").read_text())
    machine = str(data.get("machine", "?"))
    points = Points(log=False)
    for pair in data.get("pairs", []):
        for row in pair.get("slowed", []):
            series = f"{pair['mode']}, neighbour {pair['neighbour']}: {row['regime']} {row['metric']}"
            points.add(series, f"pair {pair['pair']}", _float(row.get("ratio")), _float(row.get("ci_low")),
                       _float(row.get("ci_high")))
    fig = markers(points, "The slowed plug-in's rows: NEW / BASE, pair by pair", "NEW / BASE", machine, reference=1.0)
    body = para(f"How often `compare` and `ab` cry wolf, idle and beside a noisy neighbour, and whether they catch a "
                f"design made slower on purpose: {len(data.get('pairs', []))} pairs of commit "
                f"{data.get('commit', '?')} "
                f"(machine: {machine}).")
    body += block(fig, points, "ci-slowed", out)
    if (folder / "pairs.md").is_file():
        body += markdown((folder / "pairs.md").read_text())
    if (folder / "ci_cost.json").is_file():
        cost = json.loads((folder / "ci_cost.json").read_text())
        flat = [[k, json.dumps(v) if isinstance(v, dict | list) else str(v)] for k, v in cost.items()]
        body += table("ci-cost", ["what", "measured"], flat, "what CI's benchmark steps cost (scripts/ci_cost.py)")
    return body


# -- calibration: the contenders against the engines' own code ---------------------------------------------
def calibration_page(root: Path, out: Path) -> str:
    path = root / CALIBRATION / "calibration.csv"
    if not path.is_file():
        return para(CAPTION_NONE.format(path=path))
    rows = _csv(path)
    machines = sorted({r.get("machine", "?") for r in rows})
    points = Points(log=False)
    table_rows = []
    for r in rows:
        ratio = _interval(_float(r["ratio"]), _float(r["ratio_low"]), _float(r["ratio_high"]))
        calls = _interval(_float(r.get("ratio_calls")), _float(r.get("ratio_calls_low")),
                          _float(r.get("ratio_calls_high")))
        table_rows.append([r["contender"], f"{r['engine']} {r['engine_version']}", r["scenario"], r["call_shape"],
                           r["baseline"], _interval(_float(r["ours_ns_per_seq_step"]), math.nan, math.nan),
                           _interval(_float(r["real_ns_per_seq_step"]), math.nan, math.nan), ratio, calls,
                           r.get("machine", "?")])
        points.add(f"{r['contender']} ({r['call_shape']})", r["scenario"], _float(r["ratio"]), _float(r["ratio_low"]),
                   _float(r["ratio_high"]))
    fig = markers(points, "Our contenders over the engines' own code, ns per sequence-step", "ours / real",
                  "; ".join(machines), reference=1.0)
    modelled = {r["engine"] for r in rows if r.get("modelled", "").lower() in ("true", "1")}
    unmodelled = sorted({r["engine"] for r in rows} - modelled)
    return (para("Each contender (our model of an engine's block manager) replayed beside the engine's own code on the "
                 "same trace: ours over real per sequence-step [paired 95 % interval], and on the engine's calls "
                 "alone." + (f" No design models {', '.join(unmodelled)}: those rows say how far a design's step "
                             "lies from the engine's, and no band applies (docs/calibration.md)." if unmodelled
                             else ""))
            + block(fig, points, "calibration", out)
            + table("calibration", ["contender", "engine", "scenario", "regime", "baseline", "ours ns/seq-step",
                                    "real ns/seq-step", "ours / real", "ours / real, engine calls", "machine"],
                    table_rows))
