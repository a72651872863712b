"""A ``history`` folder rendered: the verdicts (``verdicts.csv``, ``history.md``), a figure per engine, the summary.
Design: docs/output.md#harnesshistoryrenderpy."""

from __future__ import annotations

from pathlib import Path

from harness.base.files import atomic_write_text, read_json
from harness.history import figure as history_figure
from harness.history.anchored import canonical, groups_note, on_anchor_scale
from harness.history.records import HISTORY_CSV, read_history
from harness.history.verdicts import (
    DEFAULT_THRESHOLD,
    PAIRING,
    calls_cells,
    calls_table,
    console_lines,
    legend,
    paired_steps,
    steps,
    table,
    write_steps,
)
from harness.output.markdown import md, md_code


def render(folder: Path, figures: bool = True) -> list[str]:
    """Write the folder's verdicts, table and figures from its ``history.csv`` and ``meta.json``; the summary."""
    rows = read_history(folder / HISTORY_CSV)
    meta_path = folder / "meta.json"
    meta = read_json(meta_path) if meta_path.is_file() else {}
    found = steps(rows, paired=paired_steps(folder, rows))
    write_steps(folder, found)
    lines = [f"# {', '.join(sorted({r.engine for r in rows}))} by release", "",
             f"Figures: `{HISTORY_CSV}`; machine: {md(meta.get('machine', '?'))}; load average at the start "
             f"{md(meta.get('load_average', '?'))}; command: {md_code(meta.get('command', '?'))}.", "",
             f"Each release over the one before, per metric: NEW/BASE, its 95 % interval, and `compare`'s verdict at "
             f"{DEFAULT_THRESHOLD * 100:g} % ({legend()}). {PAIRING} {groups_note(meta)}".strip(), "",
             *table(found), ""]
    cells = calls_cells(canonical(rows))
    calls = calls_table(cells)
    if calls:
        lines += ["The timed step apart: the engine's own calls (the public methods of its object, metered in full "
                  "replays after the timed ones) and the rest, the harness side; median [min-max over the metered "
                  "replays].", "", *calls, ""]
    atomic_write_text(folder / "history.md", "\n".join(lines))
    drawn = []
    if figures:
        for engine in sorted({r.engine for r in rows}):
            drawn += history_figure.draw(engine, on_anchor_scale(rows), found, meta, folder)
    apart = ["engine calls and shared, ns per seq-step [min-max over the metered replays], the engine's share:",
             *("  ".join(c) for c in cells)] if cells else []
    return [*console_lines(found), *apart, *(f"figure: {p}" for p in drawn if p.suffix == ".png")]
