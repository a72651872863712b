"""The summary printed at the end of ``kvblock-bench run`` and ``report``: what a reader needs before opening a file.
Design: docs/output.md#harnessoutputconsolepy."""

from __future__ import annotations

from pathlib import Path

from harness.base.host import competing_work
from harness.base.text import duration_text
from harness.output.cache_state_report import cache_state_sentence
from harness.output.coverage import left_out_note
from harness.output.formatting import (
    aa_row,
    cpu_text,
    fmt,
    host_line,
    interval_of,
    machine_line,
    ratio_text,
    run_seconds,
)
from harness.output.growth import cost_lines, slopes
from harness.output.paced_report import paced_sentence
from harness.output.report import (
    ARTICLE_TABLE_KEYS,
    DESIGN_ROLES,
    PAPER_COLUMNS,
    article_table,
    base_of,
    checked_line,
    design_cells,
    driver_of,
    nonconforming,
    paper_cells,
)
from harness.output.rundata import RunData
from scenarios import PAPER

HEADLINE = PAPER


def headline_scenario(run: RunData) -> str | None:
    """``paper`` when the run timed it, else the first scenario it timed; None when it timed nothing."""
    timed = list(dict.fromkeys(run.df[run.df.metric == "seq_step_ns"].scenario))
    return HEADLINE if HEADLINE in timed else (timed[0] if timed else None)


def aa_line(run: RunData, scenario: str) -> str:
    """The noise floor in one line: the A/A control's ratio and interval, and what it means."""
    row = aa_row(run, scenario)
    if row is None:
        return f"noise floor ({scenario}): no A/A control in this run"
    bounds = interval_of(row)
    figure = fmt(float(row["value"])) + "×" + (f" [{fmt(bounds[0])}–{fmt(bounds[1])}]" if bounds else "")
    verdict = ("no difference: ratios whose interval holds 1 are noise" if bounds and bounds[0] <= 1 <= bounds[1]
               else "a difference between two identical cells: treat ratios this close to 1 as noise"
               if bounds else "no interval (too few slices)")
    return f"noise floor ({scenario}): A/A control, `{row['impl']}` {row['regime']} replayed twice, {figure}: {verdict}"


def article_lines(run: RunData, scenario: str = HEADLINE, regime: str = "batched") -> list[str]:
    """The article's table as measured (``paper``, batched), aligned for a terminal; nothing without such a cell."""
    recs = design_cells(run, scenario, regime)
    if not recs:
        return []
    art = article_table(run)
    header = ["design", *(PAPER_COLUMNS[k] for k in ARTICLE_TABLE_KEYS)]
    rows = [[rec.label, *(cells[k] for k in ARTICLE_TABLE_KEYS)]
            for rec in recs for cells in [paper_cells(run, scenario, regime, rec, art)]]
    widths = [max(len(r[k]) for r in [header, *rows]) for k in range(len(header))]
    lines = [f"the article's table on `{scenario}`, {regime} regime: our figure [95 % interval] (× flat in the same "
             "regime [paired 95 %]), then the article's C++ figure (× its C); every regime: paper_table.md"]
    lines += ["  " + "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in [header, *rows]]
    return lines


def cell_lines(run: RunData, scenario: str) -> list[str]:
    """A header and one line per measured cell: regime, impl, driver, ns/seq-step, × base, CPU share."""
    base = base_of(run, scenario)
    cells = run.cells(scenario)
    wide = max([11, *(len(impl) for impl, _ in cells)])  # a plug-in's name is often module:Class
    lines = [f"{scenario}: ns per sequence-step, × {base} in the same regime [paired 95 % interval] (summary.md's "
             f"× batched {base} is against batched {base} in every regime), CPU share at the trace's step rate "
             "(computed):",
             f"  {'regime':<9} {'impl':<{wide}} {'driver':<9} {'ns/seq-step':>11}  {'× ' + base + ', same regime':<36}"
             " CPU"]
    regimes = run.regimes(scenario, "seq_step_ns")
    failing = set(run.df[run.df.conformance == "fails"].impl)
    for impl, regime in sorted(cells, key=lambda cell: regimes.index(cell[1])):
        ns = fmt(run.value(scenario, impl, regime, "seq_step_ns"))
        ratio = ratio_text(run, scenario, impl, regime, "seq_step_ns", base=base)
        cpu = cpu_text(run.value(scenario, impl, regime, "cpu_share_pct"))
        lines.append(f"  {regime:<9} {impl:<{wide}} {driver_of(run, scenario, impl, regime):<9} {ns:>11}  "
                     f"{ratio:<36} {cpu}" + ("  DOES NOT CONFORM" if impl in failing else ""))
    return lines


def where_lines(run: RunData) -> list[str]:
    """Where the reports and figures of the run are (figures: rendered ones, else the command that renders them)."""
    run_dir = run.run_dir
    reports = [p for p in (run_dir / "paper_table.md", run_dir / "summary.md") if p.is_file()]
    figures = sorted((run_dir / "figures").glob("*.png")) if (run_dir / "figures").is_dir() else []
    lines = [f"reports: {', '.join(map(str, reports))}" if reports
             else f"reports: none yet (`kvblock-bench report {run_dir}` writes them)"]
    if figures:
        lines.append(f"figures: {run_dir / 'figures'}/ ({len(figures)}: {', '.join(p.stem for p in figures)}; "
                     "PNG and SVG)")
    else:
        lines.append(f"figures: none rendered (`kvblock-bench report {run_dir}` renders them)")
    return lines


def console_summary(run: str | Path | RunData | None = None) -> str:
    """The end-of-run text: run, machine, the headline scenario's cells, the A/A line, omissions, failures, files."""
    data = run if isinstance(run, RunData) else RunData.load(run)
    state = "complete" if data.meta.get("complete", True) else "INCOMPLETE (interrupted or failed)"
    beside = "; beside competing work" if competing_work(data.meta) else ""
    lines = [f"run: {data.run_dir} ({state}; took {duration_text(run_seconds(data.meta))}{beside})",
             f"machine: {machine_line(data.meta)}"]
    if host := host_line(data.meta):
        lines.append(f"host: {host}")
    lines += [*filter(None, [checked_line(data)]), *nonconforming(data)]
    scenario = headline_scenario(data)
    if scenario is not None:
        lines += [aa_line(data, scenario), *article_lines(data), *cell_lines(data, scenario)]
        if note := left_out_note(data, scenario, DESIGN_ROLES):
            lines.append(note)
        if paced := paced_sentence(data, scenario):
            lines.append(paced)
        if alone := cache_state_sentence(data, scenario):
            lines.append(alone)
    lines += cost_lines(slopes(data))
    if not data.meta.get("complete", True):
        lines.append("INCOMPLETE run: only the scenarios it finished have figures")
    failed = data.df[data.df.status == "failed"]
    if len(failed):
        which = sorted({f"{r.scenario} {r.impl} {r.regime} {r.metric}" for r in failed.itertuples()})
        lines.append(f"{len(failed)} figure(s) FAILED: see results.csv (status column): {', '.join(which[:5])}"
                     + (", ..." if len(which) > 5 else ""))
    return "\n".join(lines + where_lines(data))
