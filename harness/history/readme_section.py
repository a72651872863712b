"""The README's history section of one engine, generated from a ``history`` folder (``report DIR --history-readme``)."""

from __future__ import annotations

import csv
import os
from pathlib import Path

from packaging.version import Version

from harness.base.files import atomic_write_text, read_json
from harness.history.anchored import groups_note
from harness.history.records import HISTORY_CSV, read_history
from harness.history.verdicts import DEFAULT_THRESHOLD, Step, paired_steps, steps
from harness.output.markdown import md, md_code
from harness.output.readme import check_readme, replace_section


def markers(engine: str) -> tuple[str, str]:
    return f"<!-- history-{engine}:begin -->", f"<!-- history-{engine}:end -->"


CHANGES_CSV = "changes.csv"  # written by hand: version, caching, metric, change (the engine's code, read from sources)


def read_changes(folder: Path) -> dict[tuple[str, str, str], str]:
    """(version, caching, metric) -> the engine's code change named for that step, from ``changes.csv``."""
    path = folder / CHANGES_CSV
    if not path.is_file():
        return {}
    with path.open(newline="") as fh:
        return {(r["version"], r["caching"], r["metric"]): r["change"] for r in csv.DictReader(fh)}


def _moved(s: Step, changes: dict[tuple[str, str, str], str]) -> str:
    change = changes.get((s.new, s.caching, s.metric), "not identified yet")
    return (f"- {s.base} -> **{s.new}** ({s.caching}, `{s.scenario}`, {s.metric}): {s.ratio:.2f}x "
            f"[{s.ci_low:.2f}-{s.ci_high:.2f}], {s.verdict}; the engine's change: {change}")


def section(folder: Path, shown_as: str) -> tuple[str, str]:
    """(engine, the section's markdown) from ``folder``'s ``history.csv`` and ``meta.json``."""
    rows = read_history(folder / HISTORY_CSV)
    meta = read_json(folder / "meta.json") if (folder / "meta.json").is_file() else {}
    engine = sorted({r.engine for r in rows})[0]
    versions = sorted({r.version for r in rows}, key=Version)
    found = steps(rows, paired=paired_steps(folder, rows))
    moved = sorted((s for s in found if s.verdict in ("slower", "faster")),
                   key=lambda s: (Version(s.new), s.caching, s.metric))
    changes = read_changes(folder)
    load = "; ".join(f"`{name}` at load average {start:g} to {end:g}" for name, (start, end) in
                     meta.get("load_average_by_scenario", {}).items())
    load = load or "load average " + ", ".join(sorted({f"{r.load} (`{r.scenario}`)" for r in rows}))
    meta = {"command": rows[0].command, "machine": rows[0].machine, **meta}  # a run cut short wrote no meta.json
    lines = [f"`{shown_as}/`: {engine} {versions[0]} to {versions[-1]} ({len(versions)} releases), "
             f"{md_code(meta.get('command', '?'))} on {md(meta.get('machine', '?'))}, {load}. "
             f"{groups_note(meta)}{' ' if groups_note(meta) else ''}Each release over the one before, "
             f"`compare`'s verdict at {DEFAULT_THRESHOLD * 100:g} % ({len(found)} comparisons; every one in "
             f"[`history.md`]({shown_as}/history.md), the figure "
             f"[`history-{engine}.png`]({shown_as}/history-{engine}.png)):",
             *([_moved(s, changes) for s in moved] if moved
               else ["- no release slower or faster than the one before"])]
    return engine, "\n".join(lines)


def write_history_readme(readme: Path, folder: Path) -> str:
    """Rewrite ``readme``'s section of the folder's engine (between its markers); returns the engine."""
    shown_as = Path(os.path.relpath(folder.resolve(), readme.resolve().parent)).as_posix()
    engine, body = section(folder, shown_as)
    begin, end = markers(engine)
    text = check_readme(readme, "--history-readme", begin, end)
    atomic_write_text(readme, replace_section(text, body, begin, end))
    return engine
