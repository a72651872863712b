"""``kvblock-bench compare``'s output: plain text, Markdown for a pull-request comment, JSON; all say the same."""

from __future__ import annotations

import json
from dataclasses import asdict

from harness.errors import TooFewPairs
from harness.output.compare import MIN_PAIRS, VERDICTS, Compared, Comparison, Counted, Figure
from harness.output.formatting import fmt
from harness.output.markdown import markdown_table, md, md_code, one_line

FORMATS = ("text", "markdown", "json")
ORDER = {v: i for i, v in enumerate(("slower", "faster", "not comparable", "no difference"))}


def _figure(f: Figure | None) -> str:
    if f is None:
        return "—"
    interval = f" [{fmt(f.ci_low)}–{fmt(f.ci_high)}]" if f.ci_low is not None and f.ci_high is not None else ""
    return fmt(f.value) + interval


def _ratio(r: Compared) -> str:
    if r.ratio is None:
        return "—"
    return f"{r.ratio:.3f}× [{r.ci_low:.3f}–{r.ci_high:.3f}]"


def _outcome(r: Compared) -> str:
    return f"not comparable: {r.why}" if r.why else r.verdict


def summary_line(c: Comparison) -> str:
    """``N slower, N faster, N no difference (N of them inconclusive), N not comparable`` at the threshold."""
    counts = [f"{c.count(v)} {v}" + (f" ({len(c.inconclusive)} of them inconclusive: the interval reaches past "
                                     "the threshold)" if v == "no difference" and c.inconclusive else "")
              for v in VERDICTS]
    return f"{', '.join(counts)} (threshold {c.threshold * 100:g} %, 95 % intervals of NEW/BASE)"


def title(c: Comparison) -> str:
    """The verdict in a few words: what fails, else whether every row was conclusive."""
    if c.exit_status == 2:
        return "no figure comparable: nothing was judged"
    if c.failures():
        return "FAILED: " + "; ".join(c.failures())
    if c.too_few:
        return f"too few pairs for a verdict: use at least {MIN_PAIRS} (--reps {MIN_PAIRS})"
    if c.inconclusive:
        return (f"nothing slower beyond the threshold, but {len(c.inconclusive)} of {len(c.comparable)} rows "
                "inconclusive: they cannot rule out a slowdown beyond it")
    return "nothing slower beyond the threshold (every comparable row conclusive)"


def _lost_line(c: Comparison) -> str:
    by_impl: dict[str, list[str]] = {}
    for r in c.lost:
        by_impl.setdefault(r.impl, []).append(f"{r.regime} {r.metric}: {r.why}")
    shown = "; ".join(f"{impl} ({', '.join(what)})" for impl, what in by_impl.items())
    allowed = " (allowed: --allow-lost)" if c.rules.allow_lost else " (fails the comparison; --allow-lost accepts it)"
    return f"NEW lost figures BASE has: {shown}{allowed}"


def headline(c: Comparison) -> list[str]:
    """The lines under the title: counts, the smallest slowdown the comparison could detect, how the runs were
    made (interleaved or apart), what NEW lost (plain text: :func:`render_markdown` escapes it)."""
    lines = [summary_line(c)]
    found = c.detectable
    if found is not None:
        need, row = found
        lines.append(f"smallest slowdown this comparison could detect in every comparable row: {need * 100:+.1f} % "
                     f"(the least precise row: {row.impl} {row.regime} {row.metric})")
    lines.append("BASE and NEW measured in one run, side by side slice by slice (kvblock-bench ab): intervals "
                 "paired over repetitions" if c.interleaved else "BASE and NEW are runs made apart, not interleaved: "
                 "a change of load between them is not in the intervals (kvblock-bench ab measures both in one run)")
    if c.too_few:
        lines.append(f"no verdict on {len(c.too_few)} row{'s' * (len(c.too_few) != 1)}: paired over fewer than "
                     f"{MIN_PAIRS} pairs of worker processes, too few for an interval to cover what varies between "
                     "processes")
    lines += [f"code of {words}" for words in c.sources]
    if c.lost:
        lines.append(_lost_line(c))
    return lines


def _run_line(side: str, d: dict) -> str:
    beside = f"; taken beside competing work: {d['beside']}" if d.get("beside") else ""
    return one_line(f"{side}: {d['run_id']} (commit {d['commit']}, started {d['started']}; {d['machine']}{beside})")


def header_lines(c: Comparison) -> list[str]:
    """The runs, the machine warning, the run notes."""
    lines = [_run_line("BASE", c.base.describe()), _run_line("NEW", c.new.describe())]
    if c.other_machine:
        lines.append("WARNING: the runs come from different machines or software (" + "; ".join(c.other_machine)
                     + "): these verdicts say little about the change")
    return lines + [one_line(f"note: {n}") for n in c.run_notes]


def render_text(c: Comparison) -> str:
    """Aligned columns, most important rows first (slower, faster, not comparable, no difference)."""
    head = ["scenario", "impl", "regime", "metric", "BASE", "NEW", "NEW/BASE [95 %]", "verdict"]
    body = [[r.scenario, r.impl, r.regime, r.metric, _figure(r.base), _figure(r.new), _ratio(r), _outcome(r)
             + (f" ({'; '.join(r.notes)})" if r.notes else "")] for r in _sorted(c.rows)]
    widths = [max(len(x[i]) for x in [head, *body]) for i in range(len(head) - 1)]
    lines = [f"kvblock-bench compare: {title(c)}", *headline(c), *header_lines(c), ""]
    lines += ["  ".join(cell.ljust(w) for cell, w in zip(row[:-1], widths, strict=True)) + "  " + row[-1]
              for row in [head, *body]]
    lines += counted_text(c)
    return "\n".join([*lines, "", summary_line(c)]) + "\n"


def _count(value: float | None, spec: str) -> str:
    return "—" if value is None else format(value, spec)


def _counted_cells(k: Counted, threshold_pct: float) -> list[str]:
    verdict = k.verdict(threshold_pct)
    return [k.impl, k.regime, _count(k.instructions[0], ",.1f"), _count(k.instructions[1], ",.1f"),
            _count(None if k.change is None else k.change * 100, "+.2f"), _count(k.allocations[0], "g"),
            _count(k.allocations[1], "g"),
            "FAILED: more work" if verdict == "more work" else f"within {threshold_pct:g} %" if verdict == "within"
            else verdict]


COUNTED_HEAD = ["impl", "regime", "instr/seq-step BASE", "NEW", "change %", "allocs/step BASE", "NEW",
                "against BASE"]


def counted_title(c: Comparison) -> str:
    """The counts' verdict against BASE."""
    t, judged = c.counts_threshold_pct, [k for k in c.counted if k.verdict(c.counts_threshold_pct) != "not measured"]
    if c.more_work:
        return (f"FAILED: NEW needs more than BASE beyond {t:g} % in {len(c.more_work)} of {len(judged)} cells "
                "(instructions per sequence-step or allocations per step)")
    if not judged:
        return "not measured: no cell's counts on both sides"
    return f"{len(judged)} cells within {t:g} % of BASE's instructions per sequence-step and allocations per step"


def counted_text(c: Comparison) -> list[str]:
    """The gate's counts of both versions (ab), aligned, with their notes."""
    if not c.counted and not c.counted_notes:
        return []
    body = [COUNTED_HEAD, *(_counted_cells(k, c.counts_threshold_pct) for k in c.counted)]
    widths = [max(len(x[i]) for x in body) for i in range(len(COUNTED_HEAD))]
    return ["", f"deterministic counts against BASE (the gate's: callgrind instructions, allocations per step): "
                f"{counted_title(c)}",
            *("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)) for row in body),
            *(f"note: {n}" for n in c.counted_notes)]


def _sorted(rows: list[Compared]) -> list[Compared]:
    return sorted(rows, key=lambda r: ORDER[r.verdict])


def _md_cells(r: Compared) -> list[str]:
    return [f"**{r.verdict}**" if r.verdict in ("slower", "faster") else md(_outcome(r)), md_code(r.scenario),
            md_code(r.impl), md(r.regime), md_code(r.metric), md(_figure(r.base)), md(_figure(r.new)),
            md(_ratio(r)), md("; ".join(r.notes))]


MD_HEAD = ["verdict", "scenario", "impl", "regime", "metric", "BASE", "NEW", "NEW/BASE [95 %]", "notes"]


def _mark(c: Comparison) -> str:
    if c.exit_status == TooFewPairs.exit_status:
        return "⚠️"
    return "❌" if c.exit_status else "⚠️" if c.inconclusive else "✅"


def render_markdown(c: Comparison) -> str:
    """A pull-request comment: the verdict first, the rows that need a look in a table, the rest folded."""
    lines = [f"### kvblock-bench compare: {_mark(c)} {md(title(c))}", ""]
    lines += [f"- {md(line)}" for line in [*headline(c), *header_lines(c)]]
    shown = [r for r in _sorted(c.rows) if r.verdict != "no difference"]
    folded = [r for r in c.rows if r.verdict == "no difference"]
    if shown:
        lines += ["", *markdown_table(MD_HEAD, map(_md_cells, shown))]
    if folded:
        lines += ["", f"<details><summary>{len(folded)} figures with no difference</summary>", "",
                  *markdown_table(MD_HEAD, map(_md_cells, folded)), "", "</details>"]
    if c.counted:
        lines += ["", f"Deterministic counts against BASE (the gate's): {md(counted_title(c))}", "",
                  *markdown_table(COUNTED_HEAD, [[md(x) for x in _counted_cells(k, c.counts_threshold_pct)]
                                                 for k in c.counted])]
    lines += [f"- note: {md(n)}" for n in c.counted_notes]
    return "\n".join(lines) + "\n"


def render_json(c: Comparison) -> str:
    """Everything, for tools: runs, threshold (a fraction), notes, counts, exit status and every row."""
    doc = {
        "base": c.base.describe(), "new": c.new.describe(), "threshold": c.threshold, "metrics": list(c.metrics),
        "other_machine": c.other_machine, "run_notes": c.run_notes, "interleaved": c.interleaved,
        "counts": {**{v: c.count(v) for v in VERDICTS}, "inconclusive": len(c.inconclusive), "lost": len(c.lost)},
        "detectable": None if c.detectable is None else c.detectable[0], "failures": c.failures(),
        "exit_status": c.exit_status, "too_few_pairs": len(c.too_few), "min_pairs": MIN_PAIRS,
        "rows": [asdict(r) for r in c.rows],
        "counted": [{**asdict(k), "change": k.change, "verdict": k.verdict(c.counts_threshold_pct)}
                    for k in c.counted], "counted_notes": c.counted_notes,
        "counts_threshold_pct": c.counts_threshold_pct if c.counted else None,
        "counts_verdict": counted_title(c) if c.counted else None,
        "sources": c.sources,
    }
    return json.dumps(doc, indent=1) + "\n"


RENDER = {"text": render_text, "markdown": render_markdown, "json": render_json}
