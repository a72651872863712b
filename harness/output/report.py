"""Markdown reports of a run (paper table, per-scenario summary, engines) and its console summary.
Design: docs/output.md#harnessoutputreportpy."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from harness.base import compared_with
from harness.base.files import atomic_write_text
from harness.base.project import PAPER_TABLE_CSV
from harness.errors import InputError
from harness.output.cache_report import caching_scenarios, prefix_cache_section
from harness.output.cache_state_report import cache_state_sentence
from harness.output.coverage import left_out_note
from harness.output.formatting import (
    BASE,
    CACHE_BASE,
    aa_text,
    fmt,
    host_line,
    machine_line,
    measured_text,
    ratio_text,
    source_text,
    value_text,
)
from harness.output.markdown import markdown_table, md, one_line
from harness.output.paced_report import paced_sentence
from harness.output.rundata import RunData, ordered
from harness.studies.table_copy.variants import IMPL as TABLE_COPY_IMPL
from impls import registry
from scenarios import PAPER

# The article's designs, their compiled twins and their C++ builds: the rows of the paper table.
DESIGN_ROLES = ("design", "twin", "native")
ENGINE_ROLES = ("contender", "plugin")
REGIME_TITLES = {
    "batched": "Batched regime: one decode step per call (compiled designs: the whole step compiled)",
    "per-call": "Per-call regime: one contract call per operation from Python (compiled designs pay dispatch)",
}


def article_table(run: RunData | None = None) -> pd.DataFrame:
    """The article's figures, one row per design letter: the run's copy, else the project's."""
    path = compared_with.copy_of(run.run_dir if run else None, compared_with.PAPER_TABLE) or PAPER_TABLE_CSV
    return pd.read_csv(path).set_index("scheme")


def regime_title(regime: str) -> str:
    return REGIME_TITLES.get(regime, f"{regime} regime")


def base_of(run: RunData, scenario: str) -> str:
    """The implementation the scenario's ratios are taken against: ``flat-pc`` on caching scenarios."""
    return CACHE_BASE if scenario in caching_scenarios(run) else BASE


def _get(run: RunData, scenario: str, impl: str, regime: str, metric: str) -> tuple[float, str, str]:
    """(value, source, status) of one figure; NaN and 'missing' when the run has no such row."""
    row = run.get(scenario, impl, regime, metric)
    if row is None:
        return math.nan, "", "missing"
    return run.value(scenario, impl, regime, metric), source_text(run, scenario, impl, regime, metric), str(
        row["status"])


def _rows_of(run: RunData, roles: tuple[str, ...]) -> list[registry.Impl]:
    """Registry records (plug-ins too) of ``roles`` that the run has rows of, in the registry's order."""
    present = list(dict.fromkeys(run.df.impl))
    recs = [registry.record(i) for i in registry.names() + [i for i in present if i not in registry.BY_NAME]]
    return [r for r in recs if r.role in roles and r.name in present]


def design_cells(run: RunData, scenario: str, regime: str) -> list[registry.Impl]:
    """Records of the designs (:data:`DESIGN_ROLES`, plug-ins too) measured in ``regime`` on ``scenario``."""
    ran = {i for i, r in run.cells(scenario) if r == regime}
    return [rec for rec in _rows_of(run, (*DESIGN_ROLES, "plugin")) if rec.name in ran]


def l1d_texts(run: RunData, scenario: str, impl: str, regime: str) -> tuple[str, str, str]:
    """(misses per sequence-step, miss rate %, source) of a cell, else why not; "—" without any L1D row."""
    rate_row = run.get(scenario, impl, regime, "l1d_miss_pct")
    if rate_row is None:
        return "—", "—", ""
    rate = measured_text(run, scenario, impl, regime, "l1d_miss_pct")
    misses = (value_text(run, scenario, impl, regime, "l1d_misses_per_seq_step")
              if run.get(scenario, impl, regime, "l1d_misses_per_seq_step") is not None else rate)
    return misses, rate, source_text(run, scenario, impl, regime, "l1d_miss_pct")


PAPER_INTRO = (
    "Each cell: our figure [95 % interval] (its ratio to C `flat` in the same regime, measured in the same run "
    "[paired 95 % interval]), then the article's figure (its ratio to C). Lookup: ns per lookup (newest token -> "
    "block and slot). Alloc/free: ns per block taken by `allocate` or released by `free`. CPU share: block-manager "
    "CPU per second at 2,000 steps/s, computed from the closed-loop step time, and observed in a paced open-loop "
    "run from Python (median over interleaved repetitions). L1D: misses per sequence-step first (the comparable "
    "figure: a design that makes few accesses has few misses), then misses / accesses (a rate flatters code that "
    "makes many cheap accesses, such as an interpreter), with their source. The article's figures are C++; ours "
    "are Python, Numba and C++ on the machine above. Dispatch floor (per-call regime, compiled designs): what the "
    "same calls cost over empty kernels, per sequence-step: the part of the per-call figure that is crossing into "
    "compiled code, not the data structure's work. Allocs/step: the design's own allocations, an exact count; in the "
    "step regime of a compiled design, with the floor of one do-nothing compiled call with the same arguments. "
    "Brackets: 95 % intervals (block bootstrap over interleaved "
    "slices; for ratios, the same blocks for both designs).")
PAPER_COLUMNS = {
    "lookup": "lookup ns", "lookup_article": "article", "alloc_free": "alloc/free ns", "alloc_free_article": "article",
    "cpu_share": "CPU share % (computed)", "cpu_observed": "CPU % (observed, paced)", "cpu_article": "article",
    "l1d_misses": "L1D misses/seq-step", "l1d_rate": "L1D miss %", "l1d_article": "article",
    "l1d_source": "L1D source", "instructions": "instr/seq-step", "allocs": "allocs/step",
    "dispatch_floor": "dispatch floor ns/seq-step",
}
PAPER_TABLES = (
    ("Timings", ("lookup", "lookup_article", "alloc_free", "alloc_free_article", "dispatch_floor")),
    ("CPU share at 2,000 steps/s", ("cpu_share", "cpu_observed", "cpu_article")),
    ("Counters", ("l1d_misses", "l1d_rate", "l1d_article", "l1d_source", "instructions", "allocs")),
)


def paper_table(run: RunData, scenario: str = PAPER) -> str:
    """The article's table, each measured cell beside the article's figure, ratios to C in the same run."""
    art = article_table(run)
    out = [f"# The article's table, reproduced on the `{scenario}` scenario", "",
           f"Machine: {md(machine_line(run.meta))}.", *host_lines(run.meta), "",
           *(f"**{md(line)}**\n" for line in nonconforming(run)), PAPER_INTRO, ""]
    out += [aa_text(run, scenario), ""]
    if not run.meta.get("complete", True):
        out += ["**This run is incomplete** (interrupted or failed): scenarios it did not finish are missing.", ""]
    for regime in run.regimes(scenario, "seq_step_ns"):
        recs = design_cells(run, scenario, regime)
        if not recs:
            continue
        out += [f"## {regime_title(regime)}", ""]
        out += _paper_tables([paper_cells(run, scenario, regime, rec, art) for rec in recs])
    if note := left_out_note(run, scenario, DESIGN_ROLES):
        out += [note, ""]
    if paced := paced_sentence(run, scenario):
        out += [paced, ""]
    if alone := cache_state_sentence(run, scenario):
        out += [alone, ""]
    out += _perf_note(run, scenario)
    return "\n".join(out) + "\n"


ARTICLE_COLUMNS = (("lookup_ns", "lookup_ns_per_step"), ("alloc_free_ns", "alloc_free_ns_per_block"),
                   ("cpu_share_pct", "cpu_share_pct_at_2000_steps_s"))


def _article_cell(art: pd.DataFrame, rec: registry.Impl, column: str) -> str:
    """The article's figure and its ratio to C, for the article's own designs only."""
    if not rec.compares_with_article or rec.letter not in art.index:
        return ""
    a, c = art.loc[rec.letter], art.loc["C"]
    bound = {"upper": "<", "approx": "~"}.get(a.bound, "")
    return f"{bound}{fmt(a[column])} ({fmt(a[column] / c[column], 2)}×)"


def _paper_tables(rows: list[dict[str, str]]) -> list[str]:
    """The rows' cells as :data:`PAPER_TABLES`, each under its title."""
    out = []
    for title, keys in PAPER_TABLES:
        header = ["design", "impl", *(PAPER_COLUMNS[k] for k in keys)]
        out += [f"### {title}", "", *markdown_table(header, [[r["design"], r["impl"], *(r[k] for k in keys)]
                                                             for r in rows]), ""]
    return out


ARTICLE_TABLE_KEYS = ("lookup", "lookup_article", "alloc_free", "alloc_free_article", "cpu_share", "cpu_article")


def paper_cells(run: RunData, scenario: str, regime: str, rec: registry.Impl, art: pd.DataFrame) -> dict[str, str]:
    """One design's paper-table cells by column key: each figure with its ratio to flat, beside the article's."""
    cells = {"design": f"{rec.label} {rec.description}", "impl": f"`{rec.name}`"}
    for (metric, column), key, article in zip(ARTICLE_COLUMNS, ("lookup", "alloc_free", "cpu_share"),
                                              ("lookup_article", "alloc_free_article", "cpu_article"), strict=True):
        ratio_of = "seq_step_ns" if metric == "cpu_share_pct" else metric
        cells[key] = (f"{value_text(run, scenario, rec.name, regime, metric)} "
                      f"({ratio_text(run, scenario, rec.name, regime, ratio_of)})")
        cells[article] = _article_cell(art, rec, column)
    cells["cpu_observed"] = measured_text(run, scenario, rec.name, regime, "cpu_share_observed_pct")
    cells["l1d_misses"], cells["l1d_rate"], cells["l1d_source"] = l1d_texts(run, scenario, rec.name, regime)
    cells["l1d_article"] = _article_cell(art, rec, "l1d_miss_pct").split(" (")[0]
    for key, metric in (("instructions", "instructions_per_seq_step"),
                        ("dispatch_floor", "dispatch_floor_seq_step_ns")):
        cells[key] = fmt(_get(run, scenario, rec.name, regime, metric)[0])
    cells["allocs"] = allocs_text(run, scenario, rec.name, regime)
    return cells


def allocs_text(run: RunData, scenario: str, impl: str, regime: str) -> str:
    """Allocations per step; where the run has a floor (step regime, compiled designs), with it and the excess."""
    text = fmt(_get(run, scenario, impl, regime, "allocs_per_step")[0])
    if run.get(scenario, impl, regime, "allocs_above_floor_per_step") is None:
        return text
    floor = run.value(scenario, impl, regime, "allocs_floor_per_step")
    above = run.value(scenario, impl, regime, "allocs_above_floor_per_step")
    return f"{text} (floor {fmt(floor)}, {fmt(above)} above)"


def _perf_note(run: RunData, scenario: str) -> list[str]:
    df = run.df
    l1d = df[(df.scenario == scenario) & (df.metric == "l1d_miss_pct")]
    hows = sorted(set(l1d.how.dropna()) - {""})
    return ["L1D sources: " + "; ".join(hows), ""] if hows else []


SUMMARY_METRICS = [("seq_step_ns", "ns/seq-step"), ("step_p99_ns", "p99 step ns"), ("lookup_ns", "lookup ns"),
                   ("alloc_free_ns", "alloc/free ns"), ("allocs_per_step", "allocs/step"),
                   ("cpu_share_pct", "CPU %"), ("dispatch_floor_seq_step_ns", "dispatch floor ns/seq-step")]


def host_lines(meta: dict) -> list[str]:
    """The report's host paragraph (``formatting.host_line``), when the run recorded its host's state."""
    line = host_line(meta)
    return ["", f"Host: {line[0].upper()}{line[1:]}."] if line else []


def scenario_summary(run: RunData) -> str:
    """One table per scenario, a row per measured cell: its main figures and slowdown against the batched base."""
    out = ["# Per-scenario summary", "", f"Machine: {md(machine_line(run.meta))}.", *host_lines(run.meta), "",
           *(f"**{md(line)}**\n" for line in nonconforming(run)),
           "× base: seq-step time relative to batched `flat` (`flat-pc` on the prefix-caching scenarios) in the "
           "same run (higher is slower), with its paired 95 % interval. Brackets: 95 % intervals. driver: the loop "
           "that issued the timed calls (python, compiled, native).", ""]
    for scenario in dict.fromkeys(run.df.scenario):
        cells = run.cells(scenario)
        if not cells:
            continue
        base = base_of(run, scenario)
        header = ["impl", "regime", "driver", *(h for _, h in SUMMARY_METRICS), f"× batched {base}"]
        rows = [[f"`{impl}`", regime, driver_of(run, scenario, impl, regime),
                 *(value_text(run, scenario, impl, regime, m) for m, _ in SUMMARY_METRICS),
                 ratio_text(run, scenario, impl, regime, "seq_step_ns", "batched", base)] for impl, regime in cells]
        out += [f"## {scenario}", "", *markdown_table(header, rows), ""]
        if note := left_out_note(run, scenario, ("caching",) if base == CACHE_BASE else DESIGN_ROLES):
            out += [note, ""]
    return "\n".join(out) + "\n"


def driver_of(run: RunData, scenario: str, impl: str, regime: str) -> str:
    """The ``driver`` column of the cell's seq-step row; "—" in runs written before the column existed."""
    row = run.get(scenario, impl, regime, "seq_step_ns")
    driver = row.get("driver") if row else None
    return str(driver) if isinstance(driver, str) and driver else "—"


# The copy-on-write headline: the first of these scenarios the run has (each forks, and its forks copy on write).
SHARING_SCENARIOS = ("parallel-sampling", "shared-prefix", "beam-search")
SHARING_COLUMNS = (("seq_step_ns", "ns/seq-step"), ("lookup_ns", "lookup ns"), ("alloc_free_ns", "alloc/free ns"),
                   ("cpu_share_pct", "CPU % at 2,000 steps/s"), ("allocs_per_step", "allocs/step"))


def sharing_scenario(run: RunData) -> str | None:
    """The scenario of the copy-on-write table: the first of :data:`SHARING_SCENARIOS` with design rows."""
    return next((s for s in SHARING_SCENARIOS if s in set(run.df[run.df.metric == "seq_step_ns"].scenario)), None)


def sharing_counts(run: RunData, scenario: str) -> str:
    """``1,234 forks and 5,678 copy-on-writes`` from the trace's rows; what is missing is said so."""
    forks, cows = (run.value(scenario, "-", "-", m) for m in ("trace_forks", "trace_cows"))
    if math.isnan(forks) or math.isnan(cows):
        return "forks and copy-on-writes (how many is not in this run's rows)"
    return f"{forks:,.0f} forks and {cows:,.0f} copy-on-writes"


SHARING_HEADER = ["design", "impl", "regime", *(h for _, h in SHARING_COLUMNS)]


def sharing_rows(run: RunData, scenario: str, regimes: tuple[str, ...] | None = None) -> list[list[str]]:
    """One row of cells (:data:`SHARING_HEADER`) per design and regime measured on ``scenario``: each figure with its
    interval, ratio to flat."""
    out = []
    for rec in _rows_of(run, DESIGN_ROLES):
        for regime in run.regimes(scenario, "seq_step_ns") if regimes is None else regimes:
            if run.get(scenario, rec.name, regime, "seq_step_ns") is None:
                continue
            cells = [f"{value_text(run, scenario, rec.name, regime, m)}" for m, _ in SHARING_COLUMNS]
            cells[0] += f" ({ratio_text(run, scenario, rec.name, regime, 'seq_step_ns')})"
            out.append([f"{rec.label} {rec.description}", f"`{rec.name}`", regime, *cells])
    return out


def sharing_table(run: RunData) -> str:
    """The headline's second table: every design on a scenario with sharing, or a note when the run has none."""
    scenario = sharing_scenario(run)
    if scenario is None:
        names = ", ".join(f"`{s}`" for s in SHARING_SCENARIOS)
        return (f"# Copy-on-write: not in this run\n\nNone of {names} was measured, so no design is shown with "
                "forks and copy-on-write.\n")
    rows = sharing_rows(run, scenario)
    out = [f"# Copy-on-write: every design on `{scenario}`", "",
           f"The `paper` workload shares no block. `{scenario}` does: its trace makes "
           f"{sharing_counts(run, scenario)}, and every replay is checked against its copy-on-writes, step by "
           "step. Each figure with its 95 % interval; ns/seq-step also as a ratio to `flat` in the same regime "
           "[paired 95 % interval].", "",
           aa_text(run, scenario), "", *markdown_table(SHARING_HEADER, rows), ""]
    return "\n".join(out) + "\n"


NOT_RECORDED = "calibration not recorded with this run"


def run_calibration(run: RunData) -> Path | None:
    """The calibration rows in force when ``run`` ran; None where it kept none."""
    return compared_with.copy_of(run.run_dir, compared_with.CALIBRATION)


def calibration_notes(path: Path | None) -> dict[tuple[str, str], str]:
    """(contender, regime) -> "calibrated: ours/real = R [low-high] (scenario), ..." for the modelled baseline."""
    if path is None or not path.is_file():
        return {}
    frame = pd.read_csv(path)
    if "modelled" in frame:
        frame = frame[frame["modelled"].isna() | frame["modelled"].astype(str).str.lower().isin(["true", "1"])]
    ratios: dict[tuple[str, str], dict[str, str]] = {}
    for row in frame.to_dict("records"):
        per_scenario = ratios.setdefault((row["contender"], row["call_shape"]), {})
        if row["scenario"] not in per_scenario:
            per_scenario[row["scenario"]] = _ratio_note(row)
    return {key: ("calibrated: ours/real = " + ", ".join(v for v in per.values() if v)) if any(per.values())
            else "not calibrated (no real run)" for key, per in ratios.items()}


def _ratio_note(row: dict) -> str:
    """``R [low-high], engine calls C (scenario)``; the interval and the ratio on calls where the row has them."""
    if pd.isna(row["ratio"]):
        return ""
    low, high = row.get("ratio_low"), row.get("ratio_high")
    interval = "" if low is None or high is None or pd.isna(low) or pd.isna(high) else f" [{low:.2f}-{high:.2f}]"
    on_calls = row.get("ratio_calls")
    calls = "" if on_calls is None or pd.isna(on_calls) else f", engine calls {on_calls:.2f}"
    return f"{row['ratio']:.2f}{interval}{calls} ({row['scenario']})"


ENGINES_HEADER = ["impl", "regime", "ns/seq-step", "lookup ns", "alloc/free ns", "allocs/step",
                  "batched flat is × faster", "vs the engine's code"]


def engines_section(run: RunData, scenario: str = PAPER) -> str:
    """Engine-style contenders (as engines run them: per call) beside batched flat, ratios in one run."""
    flat = _get(run, scenario, registry.RATIO_BASE, "batched", "seq_step_ns")[0]
    present = [r.name for r in _rows_of(run, ENGINE_ROLES)]
    if not present or math.isnan(flat):
        return ""
    out = [f"# Engines: contenders modelled on real engines, `{scenario}` scenario", "",
           "Written in our code from each engine's published design (see `impls/`), under our contract. "
           "Engines call their block manager per operation from Python: the per-call rows are how they run.", ""]
    rows = []
    path = run_calibration(run)
    notes = calibration_notes(path)
    for impl in [*present, registry.RATIO_BASE]:
        for regime in ("per-call", "batched"):
            v = _get(run, scenario, impl, regime, "seq_step_ns")[0]
            if math.isnan(v):
                continue
            rows.append([f"`{impl}`", regime, fmt(v), fmt(_get(run, scenario, impl, regime, "lookup_ns")[0]),
                         fmt(_get(run, scenario, impl, regime, "alloc_free_ns")[0]),
                         fmt(_get(run, scenario, impl, regime, "allocs_per_step")[0]),
                         ratio_text(run, scenario, impl, regime, "seq_step_ns", "batched"),
                         notes.get((impl, regime), "" if path else NOT_RECORDED)])
    return "\n".join([*out, *markdown_table(ENGINES_HEADER, rows)]) + "\n"


def table_copy_section(run: RunData) -> str:
    """Rule 3: per step, the cost of getting the block tables to the device, per variant and scenario."""
    df = run.df
    sub = df[df.metric.isin(["table_copy_ns", "table_copy_ns_per_seq", "table_copy_bytes", "table_copy_device_ns"])]
    if sub.empty or not (sub.status == "ok").any():
        reasons = sorted(set(sub.how)) if not sub.empty else []
        return ("# Rule 3: block tables to the device\n\nNot measured" + (f": {reasons[0]}" if reasons else "") + "\n")
    out = ["# Rule 3: block tables to the device", "",
           "Host time per step (median over the measured steps) to turn the step's block tables into the int32 "
           "tensor attention takes; `device` is CUDA-event time where a GPU was present.", ""]
    rows = []
    for (scenario, variant), _ in sub.groupby(["scenario", "regime"], sort=False):
        vals = [_get(run, scenario, TABLE_COPY_IMPL, variant, m) for m in
                ("table_copy_ns", "table_copy_ns_per_seq", "table_copy_bytes", "table_copy_device_ns")]
        rows.append([scenario, variant, *(fmt(v) if st == "ok" else st for v, _src, st in vals)])
    header = ["scenario", "variant", "host ns/step", "host ns/seq", "bytes/step", "device ns/step"]
    return "\n".join([*out, *markdown_table(header, rows)]) + "\n"


def nonconforming(run: RunData) -> list[str]:
    """A line for each design the run marked as failing the contract check (the ``conformance`` column)."""
    checks = _checks(run)
    return [f"DOES NOT CONFORM: {impl} failed the contract check before the run timed it"
            + (f" ({one_line(checks[impl].get('why', ''))})" if impl in checks else "")
            + f"; its figures are a broken design's (`kvblock-bench check {impl}` says where)"
            for impl in ordered(run.df[run.df.conformance == "fails"].impl)]


def checked_line(run: RunData) -> str:
    """Each plug-in the run checked before timing it, with its verdict and cost ("": none)."""
    checks = _checks(run)
    if not checks:
        return ""
    verdicts = "; ".join(f"{impl} {c.get('verdict')} ({c.get('seconds')} s)" for impl, c in checks.items())
    return f"contract check before timing (quick form: {len(checks)} plug-in(s)): {verdicts}"


def _checks(run: RunData) -> dict[str, dict]:
    checks = run.meta.get("conformance")
    return {k: v for k, v in checks.items() if isinstance(v, dict)} if isinstance(checks, dict) else {}


def report_texts(data: RunData) -> dict[str, str]:
    """The run's reports by file name (``paper_table.md``, ``summary.md``), as text."""
    paper = paper_table(data) if data.has(PAPER) else "# No `paper` scenario in this run\n"
    engines = engines_section(data)
    caching = prefix_cache_section(data)
    return {"paper_table.md": paper + "\n" + sharing_table(data) + ("\n" + engines if engines else "") + "\n"
                              + table_copy_section(data),
            "summary.md": scenario_summary(data) + ("\n" + caching if caching else "")}


def check_reportable(data: RunData) -> None:
    """Refuse (:class:`InputError`) a run folder without rows or without a ``meta.json`` object."""
    if data.df.empty:
        raise InputError(f"{data.run_dir / 'results.csv'}: no rows (a header only); nothing to report, and the "
                         "saved reports are left as they are")
    if data.meta_problem:
        raise InputError(f"{data.run_dir / 'meta.json'}: {data.meta_problem}; a report names the machine and "
                         "software of its figures from it (kvblock-bench run writes it), so none is written")


def write_reports(run: str | Path | RunData | None = None, texts: dict[str, str] | None = None) -> Path:
    """Write ``paper_table.md`` and ``summary.md`` into the run directory; :class:`WriteError` if it cannot."""
    data = run if isinstance(run, RunData) else RunData.load(run)
    check_reportable(data)
    for name, text in (texts or report_texts(data)).items():
        atomic_write_text(data.run_dir / name, text)
    return data.run_dir
