"""``kvblock-bench compare``'s output: plain text, Markdown for a pull-request comment, JSON; all say the same."""

from __future__ import annotations

import json
from dataclasses import asdict

from harness.output.compare import VERDICTS, Compared, Comparison, Figure
from harness.output.formatting import fmt

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
    """``N slower, N faster, N no difference, N not comparable`` at the threshold."""
    counts = ", ".join(f"{c.count(v)} {v}" for v in VERDICTS)
    return f"{counts} (threshold {c.threshold * 100:g} %, 95 % intervals of NEW/BASE)"


def _run_line(side: str, d: dict) -> str:
    return (f"{side}: {d['run_id']} (commit {d['commit']}, started {d['started']}; {d['cpu_model']}, "
            f"{d['cpu_count']} CPUs)")


def header_lines(c: Comparison) -> list[str]:
    """The runs, the machine warning, the run notes."""
    lines = [_run_line("BASE", c.base.describe()), _run_line("NEW", c.new.describe())]
    if c.other_machine:
        lines.append("WARNING: the runs come from different machines or software (" + "; ".join(c.other_machine)
                     + "): these verdicts say little about the change")
    return lines + [f"note: {n}" for n in c.run_notes]


def render_text(c: Comparison) -> str:
    """Aligned columns, most important rows first (slower, faster, not comparable, no difference)."""
    head = ["scenario", "impl", "regime", "metric", "BASE", "NEW", "NEW/BASE [95 %]", "verdict"]
    body = [[r.scenario, r.impl, r.regime, r.metric, _figure(r.base), _figure(r.new), _ratio(r), _outcome(r)
             + (f" ({'; '.join(r.notes)})" if r.notes else "")] for r in _sorted(c.rows)]
    widths = [max(len(x[i]) for x in [head, *body]) for i in range(len(head) - 1)]
    lines = [*header_lines(c), ""]
    lines += ["  ".join(cell.ljust(w) for cell, w in zip(row[:-1], widths, strict=True)) + "  " + row[-1]
              for row in [head, *body]]
    return "\n".join([*lines, "", summary_line(c)]) + "\n"


def _sorted(rows: list[Compared]) -> list[Compared]:
    return sorted(rows, key=lambda r: ORDER[r.verdict])


def _md_row(r: Compared) -> str:
    cells = [f"**{r.verdict}**" if r.verdict in ("slower", "faster") else _outcome(r), f"`{r.scenario}`",
             f"`{r.impl}`", r.regime, f"`{r.metric}`", _figure(r.base), _figure(r.new), _ratio(r),
             "; ".join(r.notes)]
    return "| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |"


MD_HEAD = ("| verdict | scenario | impl | regime | metric | BASE | NEW | NEW/BASE [95 %] | notes |\n"
           "|---|---|---|---|---|---|---|---|---|")


def render_markdown(c: Comparison) -> str:
    """A pull-request comment: the verdict first, the rows that need a look in a table, the rest folded."""
    title = ("❌ slower beyond the threshold" if c.exit_status else "✅ nothing slower beyond the threshold")
    lines = [f"### kvblock-bench compare: {title}", "", summary_line(c) + ".", ""]
    lines += [f"- {line}" for line in header_lines(c)]
    shown = [r for r in _sorted(c.rows) if r.verdict != "no difference"]
    folded = [r for r in c.rows if r.verdict == "no difference"]
    if shown:
        lines += ["", MD_HEAD, *map(_md_row, shown)]
    if folded:
        lines += ["", f"<details><summary>{len(folded)} figures with no difference</summary>", "", MD_HEAD,
                  *map(_md_row, folded), "", "</details>"]
    return "\n".join(lines) + "\n"


def render_json(c: Comparison) -> str:
    """Everything, for tools: runs, threshold (a fraction), notes, counts, exit status and every row."""
    doc = {
        "base": c.base.describe(), "new": c.new.describe(), "threshold": c.threshold, "metrics": list(c.metrics),
        "other_machine": c.other_machine, "run_notes": c.run_notes,
        "counts": {v: c.count(v) for v in VERDICTS}, "exit_status": c.exit_status,
        "rows": [asdict(r) for r in c.rows],
    }
    return json.dumps(doc, indent=1) + "\n"


RENDER = {"text": render_text, "markdown": render_markdown, "json": render_json}
