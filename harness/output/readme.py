"""The README's results section, generated from a committed run (``kvblock-bench report --readme``).
Design: docs/output.md#harnessoutputreadmepy."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from harness.base.files import atomic_write_text, os_reason
from harness.errors import InputError, WriteError
from harness.output import reproduction, sections, times
from harness.output.cache_report import caching_scenarios, hit_sentence
from harness.output.cache_state_report import cache_state_sentence
from harness.output.coverage import left_out_note
from harness.output.formatting import (
    CACHE_BASE,
    aa_text,
    fmt,
    machine_line,
    ratio_text,
    run_duration,
    run_seconds,
    value_text,
)
from harness.output.markdown import markdown_table, md, md_code
from harness.output.paced_report import paced_sentence
from harness.output.report import (
    DESIGN_ROLES,
    NOT_RECORDED,
    SHARING_HEADER,
    SHARING_SCENARIOS,
    article_table,
    calibration_notes,
    l1d_texts,
    run_calibration,
    sharing_counts,
    sharing_rows,
    sharing_scenario,
)
from harness.output.rundata import RunData, ordered
from impls import registry
from scenarios import PAPER
from scenarios.files.kinds import write_target

BEGIN, END = "<!-- results:begin -->", "<!-- results:end -->"


class ReadmeError(InputError):
    """The README has no (or broken) results markers."""


def commit_text(meta: dict) -> str:
    """The run's commit, and for a ``-dirty`` one the files that differed from it (where the run recorded them)."""
    changed = meta.get("git_changed_files") or []
    changed = changed if isinstance(changed, list) else [changed]
    return md_code(meta.get("git_commit", "?")) + (f" (uncommitted edits to {md(', '.join(map(str, changed)))})"
                                                   if changed else "")


def _time_lines(run: RunData) -> list[str]:
    """Where the run's wall time went: each scenario's ``scenario_wall_s``, largest first, and the rest."""
    walls = run.df[(run.df.metric == "scenario_wall_s") & (run.df.status == "ok")]
    if walls.empty:
        return []
    parts = [f"`{r.scenario}` {float(r.value):.0f} s" for r in walls.sort_values("value", ascending=False).itertuples()]
    rest = run_seconds(run.meta) - float(walls.value.sum())
    tail = "" if math.isnan(rest) else f"; outside the scenarios (start-up, timer calibration) {rest:.0f} s"
    return [f"Where the time went (wall clock, each scenario's `scenario_wall_s` row): {', '.join(parts)}{tail}.", ""]


def _article(art: pd.DataFrame, rec: registry.Impl, column: str) -> str:
    if not rec.compares_with_article or rec.letter not in art.index:
        return ""
    a = art.loc[rec.letter]
    return f"{ {'upper': '<', 'approx': '~'}.get(a.bound, '')}{fmt(a[column])}".strip()


def _design_rows(run: RunData) -> list[tuple[list[str], list[str]]]:
    """Each design's (timings, counters) cells, batched on `paper`, beside the article's."""
    out, art = [], article_table(run)
    ran = {i for i, r in run.cells(PAPER) if r == "batched"}
    for rec in registry.RECORDS:
        if rec.role not in DESIGN_ROLES or rec.name not in ran:
            continue
        timings = [f"{rec.label}"]
        for metric, column in (("lookup_ns", "lookup_ns_per_step"), ("alloc_free_ns", "alloc_free_ns_per_block")):
            timings += [f"{value_text(run, PAPER, rec.name, 'batched', metric)} "
                        f"({ratio_text(run, PAPER, rec.name, 'batched', metric)})", _article(art, rec, column)]
        timings += [f"{value_text(run, PAPER, rec.name, 'batched', 'cpu_share_pct')} "
                    f"({ratio_text(run, PAPER, rec.name, 'batched', 'seq_step_ns')})",
                    _article(art, rec, "cpu_share_pct_at_2000_steps_s")]
        misses, rate, source = l1d_texts(run, PAPER, rec.name, "batched")
        counters = [f"{rec.label}", misses, rate, _article(art, rec, "l1d_miss_pct"), source,
                    fmt(run.value(PAPER, rec.name, "batched", "allocs_per_step"))]
        out.append((timings, counters))
    return out


def _design_tables(run: RunData) -> list[str]:
    """The article's table on `paper`, batched, as two tables that each fit a screen: timings, then counters."""
    rows = _design_rows(run)
    return [*markdown_table(["design", "lookup ns", "article", "alloc/free ns per block", "article",
                             "CPU % at 2,000 steps/s", "article"], [t for t, _ in rows]), "",
            *markdown_table(["design", "L1D misses/seq-step", "L1D miss %", "article", "L1D source", "allocs/step"],
                            [c for _, c in rows])]


def _engine_rows(run: RunData) -> list[list[str]]:
    out = []
    path = run_calibration(run)
    notes = calibration_notes(path)
    for rec in registry.RECORDS:
        if rec.role != "contender":
            continue
        for regime in ("per-call", "batched"):
            if math.isnan(run.value(PAPER, rec.name, regime, "seq_step_ns")):
                continue
            out.append([f"`{rec.name}`", regime, value_text(run, PAPER, rec.name, regime, "seq_step_ns"),
                        ratio_text(run, PAPER, rec.name, regime, "seq_step_ns", "batched"),
                        notes.get((rec.name, regime), "not calibrated" if path else NOT_RECORDED)])
    return out


def section(run: RunData) -> str:
    """The generated results section (without the markers)."""
    meta = run.meta
    versions = meta.get("versions", {})
    lines = [
        f"Run {md_code(run.run_id)} of {md_code(meta.get('command_line', '?'))} at commit {commit_text(meta)}, "
        f"started {md(meta.get('started', '?'))}, took {run_duration(meta)}"
        + ("" if meta.get("complete") else " (INCOMPLETE)") + ".",
        f"Machine: {md(machine_line(meta))}. Python {versions.get('python', '?')}, NumPy {versions.get('numpy', '?')}, "
        f"Numba {versions.get('numba', '?')}, torch {versions.get('torch', '?')}.",
        "",
        *_time_lines(run),
        aa_text(run, PAPER),
        "",
        *reproduction.section(run.run_dir),
        "The article's table on `paper` (65,536 blocks, 256 sequences, 2,000 steps), batched regime: our figure "
        "[95 % interval] (ratio to C `flat` measured in the same run [paired 95 % interval]) next to the "
        "article's C++ figure. L1D: misses per sequence-step first, the comparable figure (a design that makes "
        "few accesses has few misses, whatever its rate), then misses per access beside the article's rate, with "
        "the instrument that measured them.",
        "",
        *_design_tables(run),
        "",
        *_optional(left_out_note(run, PAPER, DESIGN_ROLES)),
        *_optional(paced_sentence(run, PAPER)),
        *_optional(cache_state_sentence(run, PAPER)),
    ]
    lines += _sharing_lines(run)
    lines += _caching_lines(run)
    engines = _engine_rows(run)
    if engines:
        lines += ["Engine contenders (our models of their block managers), ns per sequence-step and how many times "
                  "slower than batched `flat` [paired 95 % interval]:", "",
                  *markdown_table(["impl", "regime", "ns/seq-step", "× batched flat",
                                   "vs the engine's own code (results/calibration)"], engines), ""]
    return "\n".join(lines)


def _optional(line: str) -> list[str]:
    """``[line, ""]``, or nothing for an empty line."""
    return [line, ""] if line else []


def _sharing_lines(run: RunData) -> list[str]:
    """The headline's second table: every design on a scenario with forks and copy-on-write, batched."""
    scenario = sharing_scenario(run)
    if scenario is None:
        return [f"Copy-on-write: this run measured none of {', '.join(f'`{s}`' for s in SHARING_SCENARIOS)}, so no "
                "design is shown with sharing.", ""]
    return [f"Copy-on-write: `paper` shares no block, `{scenario}` does: its trace makes "
            f"{sharing_counts(run, scenario)}. The same designs on it, batched regime: our figure [95 % interval], "
            "ns per sequence-step also as a ratio to `flat` [paired 95 % interval].", "",
            *markdown_table(SHARING_HEADER, sharing_rows(run, scenario, ("batched",))), ""]


def _caching_lines(run: RunData) -> list[str]:
    """Prefix caching: each caching scenario's hit rate and each caching design's seq-step time over `flat-pc`."""
    scenarios = caching_scenarios(run)
    if not scenarios:
        return ["Prefix caching: this run measured no caching scenario.", ""]
    impls = ordered(run.df[run.df.scenario.isin(scenarios) & (run.df.metric == "seq_step_ns")].impl)
    out = ["Prefix caching, batched regime: ns per sequence-step [95 % interval] and its ratio to `flat-pc` [paired "
           "95 % interval]; the hit rate is the same for every implementation (each replay is checked against the "
           "trace's hits step by step).", ""]
    rows = []
    for scenario in scenarios:
        cells = [f"{value_text(run, scenario, i, 'batched', 'seq_step_ns')} "
                 f"({ratio_text(run, scenario, i, 'batched', 'seq_step_ns', base=CACHE_BASE)})"
                 if run.get(scenario, i, "batched", "seq_step_ns") else "—" for i in impls]
        rows.append([f"`{scenario}`", hit_sentence(run, scenario), *cells])
    return [*out, *markdown_table(["scenario", "hit rate", *(f"`{i}`" for i in impls)], rows), ""]


def replace_section(text: str, body: str, begin: str = BEGIN, end: str = END, where: str = "the README") -> str:
    """``text`` with what lies between the markers replaced; :class:`ReadmeError` naming ``where`` without them."""
    if text.count(begin) != 1 or text.count(end) != 1 or text.index(begin) > text.index(end):
        raise ReadmeError(f"{where}: needs exactly one {begin} ... {end} pair, in that order; put the two markers "
                          "where the generated section goes")
    head, rest = text.split(begin)
    _, tail = rest.split(end)
    return f"{head}{begin}\n{body}\n{end}{tail}"


def current_section(text: str, begin: str = BEGIN, end: str = END) -> str:
    """What the README holds between the markers."""
    replace_section(text, "", begin, end)
    return text.split(begin)[1].split(end)[0].strip("\n")


def check_readme(readme: Path, flag: str = "--readme", begin: str = BEGIN, end: str = END) -> str:
    """A README's text, readable and holding the section's markers (else :class:`ReadmeError`)."""
    text = _text_to_rewrite(readme, flag)
    replace_section(text, "", begin, end, f"{flag} {readme}")
    if times.BEGIN in text or times.END in text:
        replace_section(text, "", times.BEGIN, times.END, f"{flag} {readme}")
    return text


def write_readme(readme: Path, run: RunData) -> None:
    """Rewrite the README's results section from ``run`` and its time table from the times file, atomically."""
    text = check_readme(readme)
    measured = times.read_times()
    atomic_write_text(readme, with_time_table(replace_section(text, section(run)), measured))
    table = sections.beside(readme, "times")
    if table.is_file():
        write_time_table(table, measured)


def _text_to_rewrite(readme: Path, flag: str = "--readme") -> str:
    """The README's text, once :func:`write_target` has refused what must not be rewritten."""
    try:
        return write_target(readme).read_text(encoding="utf-8")
    except OSError as exc:
        raise WriteError(f"{readme}: cannot rewrite it ({os_reason(exc)})") from None
    except UnicodeDecodeError as exc:
        raise ReadmeError(f"{flag} {readme}: not UTF-8 text ({exc.reason}); give a Markdown file") from None


def with_time_table(text: str, measured: times.Times | None) -> str:
    """``text`` with its time table (where it has the markers) rewritten from ``measured``."""
    if times.BEGIN in text or times.END in text:
        return replace_section(text, times.section(measured), times.BEGIN, times.END)
    return text


def write_time_table(readme: Path, measured: times.Times | None) -> None:
    """Rewrite only the time table of ``readme`` (any markdown file), atomically (as :func:`write_readme`)."""
    atomic_write_text(readme, with_time_table(_text_to_rewrite(readme), measured))
