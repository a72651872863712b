"""The site's pages of runs: the article's table, every scenario, the machines side by side, the overview."""

from __future__ import annotations

import math
import re
from itertools import pairwise
from pathlib import Path

from harness.base.files import atomic_write_bytes
from harness.base.rows import ratio_metric
from harness.output.drawing import color, label
from harness.output.formatting import BASE, fmt, interval_of, machine_line, ratio_text, run_duration, value_text
from harness.output.report import article_table, base_of, design_cells, driver_of, paper_cells
from harness.output.rundata import RunData
from harness.site.collect import Machine
from harness.site.figures import Points, bars, block
from harness.site.html import Cell, esc, para, section, table
from impls import registry
from scenarios import PAPER

ARTICLE_METRICS = (("lookup_ns", "lookup", "lookup_ns_per_step", "ns per lookup"),
                   ("alloc_free_ns", "alloc_free", "alloc_free_ns_per_block", "ns per block allocated or freed"),
                   ("cpu_share_pct", "cpu_share", "cpu_share_pct_at_2000_steps_s", "% of one core at 2,000 steps/s"))
ARTICLE_TITLES = {"lookup_ns": "Lookup", "alloc_free_ns": "Alloc/free", "cpu_share_pct": "CPU share (computed)"}
ARTICLE_KEYS = {"lookup": "lookup_article", "alloc_free": "alloc_free_article", "cpu_share": "cpu_article"}


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")[:60]


def across_cell(m: Machine, scenario: str, impl: str, regime: str, metric: str) -> Cell:
    """The range of a figure over the machine's runs: ``low–high (n runs)``; one run says so."""
    low, high, n = m.across(scenario, impl, regime, metric)
    if n < 2:
        return Cell(f"{n} run" if n else "—", math.nan)
    return Cell(f"{fmt(low)}–{fmt(high)} ({n} runs)", high / low if low > 0 else math.nan)


def _value_cell(run: RunData, scenario: str, impl: str, regime: str, metric: str, text: str | None = None) -> Cell:
    return Cell(text if text is not None else value_text(run, scenario, impl, regime, metric),
                run.value(scenario, impl, regime, metric))


def runs_table(machines: list[Machine], ident: str) -> str:
    rows = [[m.name, run.run_id, str(run.meta.get("git_commit", "?")), str(run.meta.get("started", "?")),
             run_duration(run.meta), str(run.meta.get("command_line", "?")), machine_line(run.meta)]
            for m in machines for run in m.runs]
    return table(ident, ["machine", "run", "commit", "started", "took", "command", "machine line (meta.json)"], rows)


# -- the article's table ---------------------------------------------------------------------------------------
def _article_rows(m: Machine) -> list[list[object]]:
    run = m.newest
    art = article_table(run)
    rows = []
    for regime in run.regimes(PAPER, "lookup_ns"):
        if not any(run.value(PAPER, r.name, regime, "lookup_ns") > 0 for r in design_cells(run, PAPER, regime)):
            continue  # a regime timed by whole steps only has no operation to set beside the article's
        for rec in design_cells(run, PAPER, regime):
            cells = paper_cells(run, PAPER, regime, rec, art)
            row: list[object] = [rec.label, rec.name, regime]
            for metric, key, _, _ in ARTICLE_METRICS:
                row += [_value_cell(run, PAPER, rec.name, regime, metric, cells[key]),
                        across_cell(m, PAPER, rec.name, regime, metric), cells[ARTICLE_KEYS[key]]]
            rows.append(row)
    return rows


def _article_figure(m: Machine, metric: str, column: str, unit: str, out: Path, ident: str) -> str:
    run = m.newest
    art = article_table(run)
    points = Points()
    for rec in design_cells(run, PAPER, "batched"):
        row = run.get(PAPER, rec.name, "batched", metric)
        lo, hi = interval_of(row) or (math.nan, math.nan)
        points.add("ours (this machine)", rec.label, run.value(PAPER, rec.name, "batched", metric), lo, hi,
                   color(rec.name, run))
        if rec.compares_with_article and rec.letter in art.index:
            points.add("article (C++)", rec.label, float(art.loc[rec.letter, column]))
    fig = bars(points, f"{ARTICLE_TITLES[metric]} on paper, batched regime, beside the article's", f"{unit} (log)",
               m.name)
    return block(fig, points, f"{ident}-{metric}", out)


def reference_page(machines: list[Machine], out: Path) -> str:
    parts = [para("Each design on the paper scenario (65,536 blocks, 256 sequences, 2,000 steps): our figure [its 95 % "
                  "interval] and its ratio to C flat in the same run and regime [paired 95 % interval], from the "
                  "machine's newest run; the range of the figure over the machine's runs; the article's C++ figure "
                  "(its ratio to its C). Click a column heading to sort, type in the box to filter.")]
    header = ["design", "impl", "regime"]
    for _, key, _, _ in ARTICLE_METRICS:
        header += [f"{key.replace('_', '/')} (× flat)", "range over runs", "article"]
    for m in machines:
        ident = slug(m.key)
        body = para(f"Newest run {m.newest.run_id} of {len(m.runs)}; machine: {machine_line(m.newest.meta)}")
        body += table(f"article-{ident}", header, _article_rows(m))
        body += "".join(_article_figure(m, metric, column, unit, out, f"article-{ident}")
                        for metric, _, column, unit in ARTICLE_METRICS)
        body += _png_figures(m.newest, out, ident)
        parts.append(section(m.name, body, f"machine-{ident}"))
    return "".join(parts)


def _png_figures(run: RunData, out: Path, ident: str) -> str:
    """The run's own PNG figures (as `report` rendered them), copied beside the page."""
    found = sorted((run.run_dir / "figures").glob("*.png")) if (run.run_dir / "figures").is_dir() else []
    html = []
    for path in found:
        target = Path("figures") / ident / path.name
        atomic_write_bytes(out / target, path.read_bytes())
        html.append(f'<a href="{target.as_posix()}"><img src="{target.as_posix()}" alt="{esc(path.stem)} of run '
                    f'{esc(run.run_id)}" loading="lazy"></a>')
    return (f"<details><summary>The run's {len(found)} figures as `report` renders them (PNG)</summary>"
            f'<div class="pngs">{"".join(html)}</div></details>') if found else ""


# -- every scenario ------------------------------------------------------------------------------------------
def _scenario_rows(m: Machine) -> list[list[object]]:
    run = m.newest
    rows = []
    for scenario in dict.fromkeys(run.df.scenario):
        base = base_of(run, scenario)
        for impl, regime in run.cells(scenario):
            batched = ratio_metric("seq_step_ns", base, regime != "batched")
            rows.append([scenario, impl, regime, driver_of(run, scenario, impl, regime),
                         _value_cell(run, scenario, impl, regime, "seq_step_ns"),
                         Cell(ratio_text(run, scenario, impl, regime, "seq_step_ns", base=base),
                              run.value(scenario, impl, regime, ratio_metric("seq_step_ns", base))),
                         Cell(ratio_text(run, scenario, impl, regime, "seq_step_ns", "batched", base),
                              run.value(scenario, impl, regime, batched) if impl != base or regime != "batched"
                              else 1.0),
                         across_cell(m, scenario, impl, regime, "seq_step_ns")])
    return rows


def _scenario_figure(m: Machine, scenario: str, out: Path) -> str:
    run = m.newest
    points = Points()
    for impl, regime in run.cells(scenario):
        row = run.get(scenario, impl, regime, "seq_step_ns")
        lo, hi = interval_of(row) or (math.nan, math.nan)
        points.add(regime, label(impl), run.value(scenario, impl, regime, "seq_step_ns"), lo, hi, color(impl, run))
    if not len(points):
        return ""
    fig = bars(points, f"{scenario}: ns per sequence-step, every cell (bars by regime)", "ns per sequence-step (log)",
               m.name)
    return block(fig, points, f"scenario-{slug(m.key)}-{slug(scenario)}", out)


def scenarios_page(machines: list[Machine], out: Path) -> str:
    parts = [para("Every cell of every scenario: ns per sequence-step [95 % interval] of the machine's newest run, its "
                  "ratio to the scenario's base (flat; flat-pc on the prefix-caching scenarios) in the same regime and "
                  "to the batched base, each [paired 95 % interval], and its range over the machine's runs.")]
    header = ["scenario", "impl", "regime", "driver", "ns/seq-step", "× base, same regime", "× batched base",
              "range over runs"]
    for m in machines:
        ident = slug(m.key)
        body = table(f"scenarios-{ident}", header, _scenario_rows(m))
        body += "".join(_scenario_figure(m, s, out) for s in dict.fromkeys(m.newest.df.scenario))
        parts.append(section(m.name, body, f"machine-{ident}"))
    return "".join(parts)


# -- machines side by side -----------------------------------------------------------------------------------
def _ratio(m: Machine, impl: str) -> tuple[float, float, float]:
    """× flat per sequence-step (paper, batched) of the machine's newest run and its paired interval."""
    row = m.newest.get(PAPER, impl, "batched", ratio_metric("seq_step_ns", BASE))
    if impl == BASE:
        return 1.0, 1.0, 1.0
    if row is None or row["status"] != "ok":
        return math.nan, math.nan, math.nan
    lo, hi = interval_of(row) or (math.nan, math.nan)
    return float(row["value"]), lo, hi


def _side(lo: float, hi: float) -> str:
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return "?"
    return "slower" if lo > 1 else "faster" if hi < 1 else "no difference"


def holds(machines: list[Machine], impl: str) -> str:
    """Whether ``impl``'s × flat (paper, batched) reads the same on every machine: slower, faster or no difference."""
    sides = {_side(*_ratio(m, impl)[1:]) for m in machines if math.isfinite(_ratio(m, impl)[0])}
    if impl == BASE:
        return "the base"
    if not sides:
        return "not measured"
    if len(sides) == 1:
        side = sides.pop()
        where = "on the one machine" if len(machines) == 1 else f"on every machine ({len(machines)})"
        return f"no difference from flat {where}" if side == "no difference" else f"{side} than flat {where}"
    return "differs between machines: " + ", ".join(sorted(sides))


def ranking(m: Machine, roles: tuple[str, ...] = ("design",)) -> str:
    """The article's designs of ``roles`` by × flat (paper, batched), cheapest first; ``≈`` where the intervals of two
    neighbours overlap (no difference measured), ``<`` where they do not."""
    found = []
    for rec in registry.RECORDS:
        value, lo, hi = _ratio(m, rec.name)
        if rec.role in roles and rec.letter and math.isfinite(value):
            found.append((value, lo if math.isfinite(lo) else value, hi if math.isfinite(hi) else value, rec.label))
    found.sort()
    text = found[0][3] if found else "not measured"
    for before, after in pairwise(found):
        text += (" ≈ " if after[1] <= before[2] else " < ") + after[3]
    return text


def _compared(machines: list[Machine]) -> list[str]:
    found = {i for m in machines for i, r in m.newest.cells(PAPER) if r == "batched"}
    return [i for i in registry.names() if i in found] + sorted(found - set(registry.names()))


def machines_page(machines: list[Machine], out: Path) -> str:
    impls = _compared(machines)
    tags = [f"M{k + 1}" for k in range(len(machines))]  # the columns' short names; the ranking table says which
    header = ["impl", *(f"× flat on {t}" for t in tags), *(f"range over runs on {t}" for t in tags),
              "holds on every machine?"]
    rows = []
    points = Points()
    for impl in impls:
        ratios = [_ratio(m, impl) for m in machines]
        rows.append([impl, *(Cell("1× (base)" if impl == BASE else f"{fmt(v)}× [{fmt(lo)}–{fmt(hi)}]"
                                  if math.isfinite(lo) else fmt(v), v) for v, lo, hi in ratios),
                     *(across_cell(m, PAPER, impl, "batched", ratio_metric("seq_step_ns", BASE)) for m in machines),
                     holds(machines, impl)])
        for t, (v, lo, hi) in zip(tags, ratios, strict=True):
            points.add(t, label(impl), v, lo, hi)
    orders = [[f"{t}: {m.name}", ranking(m), ranking(m, ("native",)), m.newest.run_id, str(len(m.runs))]
              for t, m in zip(tags, machines, strict=True)]
    same = len({(o[1], o[2]) for o in orders}) == 1
    verdict = ("The ranking of the article's designs (and of their C++ builds) is the same on every machine "
               f"({len(machines)}): {orders[0][1]}; {orders[0][2]}." if same
               else "The ranking of the article's designs differs between machines (table below).")
    if len(machines) == 1:
        verdict = (f"The ranking of the article's designs on the one machine of this site: {orders[0][1]}; in C++: "
                   f"{orders[0][2]}. Run the matrix on other machines (examples/ci/site-matrix.yml) to see whether "
                   "it holds there.")
    fig = bars(points, "× flat per sequence-step on paper, batched regime, machine by machine", "× flat (log)",
               "; ".join(f"{t}: {m.name}" for t, m in zip(tags, machines, strict=True)))
    return (para(verdict) + table("ranking", ["machine", "cheapest first (paper, batched; ≈: intervals overlap)",
                                              "in C++", "newest run", "runs"], orders)
            + para("Each implementation's ratio to flat per sequence-step (paper, batched) on each machine "
                   "[paired 95 % interval], its range over that machine's runs, and whether it falls on the same "
                   "side of 1 on every machine.")
            + table("machines", header, rows) + block(fig, points, "machines-ratio", out))


def overview(machines: list[Machine], commits: list[str]) -> str:
    lines = [f"{m.name}: {ranking(m)}; in C++ {ranking(m, ('native',))} ({len(m.runs)} run(s), newest "
             f"{m.newest.run_id})" for m in machines]
    items = "".join(f"<li>{esc(line)}</li>" for line in lines)
    return (para(f"Runs of commit {', '.join(commits)} on {len(machines)} machine(s). The article's designs, cheapest "
                 "first, on paper in the batched regime:") + f"<ul>{items}</ul>"
            + para("Every figure names its machine; every table sorts on a click of a heading and filters by the box "
                   "above it; every figure's points are beside it as CSV."))
