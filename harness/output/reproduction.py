"""The reference's figures across its kept runs and machines: median, range across runs, each run's own interval.
Design: docs/output.md#harnessoutputreproductionpy."""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path

from harness.base.files import read_json
from harness.base.host import competing_work, machine_key, machine_name
from harness.base.rows import Row, ratio_metric, read_rows
from harness.output.formatting import fmt
from harness.output.markdown import markdown_table

RUNS = "runs"  # results/reference/runs/<run-id>/: each kept run's results.csv and meta.json
FIGURES = ("seq_step_ns", ratio_metric("seq_step_ns"))


@dataclass(frozen=True)
class Kept:
    """One kept run of the reference: its id, meta.json, and its ok rows by (scenario, impl, regime, metric)."""

    run_id: str
    meta: dict
    rows: dict[tuple[str, str, str, str], Row]

    @property
    def machine(self) -> str:
        return machine_key(self.meta)


def kept_runs(reference: Path) -> list[Kept]:
    """Every run kept in ``reference/runs/``, oldest first (none where there is no such folder)."""
    folder = reference / RUNS
    runs = sorted(p for p in folder.iterdir() if (p / "results.csv").is_file()) if folder.is_dir() else []
    out = []
    for path in runs:
        meta = read_json(path / "meta.json") if (path / "meta.json").is_file() else {}
        rows = {(r.scenario, r.impl, r.regime, r.metric): r for r in read_rows(path / "results.csv")
                if r.status == "ok" and r.metric in FIGURES}
        out.append(Kept(path.name, meta if isinstance(meta, dict) else {}, rows))
    return sorted(out, key=lambda k: str(k.meta.get("started", k.run_id)))


def machines(kept: list[Kept]) -> dict[str, list[Kept]]:
    """The kept runs by machine kind, in first-seen order."""
    out: dict[str, list[Kept]] = {}
    for k in kept:
        out.setdefault(k.machine, []).append(k)
    return out


def spread_text(values: list[float]) -> str:
    """``median [min–max] ×n`` (the value alone for one run)."""
    if not values:
        return "—"
    med = statistics.median(values)
    return fmt(med) if len(values) == 1 else f"{fmt(med)} [{fmt(min(values))}–{fmt(max(values))}] ×{len(values)}"


def own_text(row: Row | None) -> str:
    if row is None:
        return "—"
    if row.ci_low is None or row.ci_high is None:
        return fmt(row.value)
    return f"{fmt(row.value)} [{fmt(row.ci_low)}–{fmt(row.ci_high)}]"


def cells(kept: list[Kept], scenario: str, metric: str) -> list[tuple[str, str]]:
    """The (impl, regime) cells any kept run measured ``metric`` for on ``scenario``, in first-seen order."""
    return list(dict.fromkeys((k[1], k[2]) for run in kept for k in run.rows if k[0] == scenario and k[3] == metric))


def table(kept: list[Kept], scenario: str, metric: str, regime: str = "batched") -> list[str]:
    """Per cell of ``regime`` (the article's table is batched): per machine kind, the median over its runs with
    their range, and its newest run's own interval."""
    groups = machines(kept)
    header = ["impl"]
    for runs in groups.values():
        header += [f"{machine_name(runs[-1].meta)}: median [range] ×runs", "newest run [its 95 % interval]"]
    body = []
    for impl in [impl for impl, r in cells(kept, scenario, metric) if r == regime]:
        line = [f"`{impl}`"]
        for runs in groups.values():
            found = [r.rows.get((scenario, impl, regime, metric)) for r in runs]
            line += [spread_text([f.value for f in found if f is not None]), own_text(found[-1])]
        body.append(line)
    return markdown_table(header, body)


def run_state(run: Kept) -> str:
    """``RUN-ID`` with the host's state it recorded: idle, or beside competing work and why."""
    if not isinstance(run.meta.get("host"), dict):
        return f"{run.run_id} (host state not recorded)"
    beside = competing_work(run.meta)
    return f"{run.run_id} ({'beside competing work: ' + beside if beside else 'idle'})"


def section(reference: Path, scenario: str = "paper") -> list[str]:
    """The README's lines on the kept runs: how many, where, the ``x flat`` table, how to reproduce it."""
    kept = kept_runs(reference)
    if not kept:
        return []
    groups = machines(kept)
    where = "; ".join(f"{len(runs)} on {machine_name(runs[-1].meta)} ({', '.join(map(run_state, runs))}, "
                      f"commit{'s' if len({r.meta.get('git_commit') for r in runs}) > 1 else ''} "
                      f"{', '.join(sorted({str(r.meta.get('git_commit', '?')) for r in runs}))})"
                      for runs in groups.values())
    metric = ratio_metric("seq_step_ns")
    return [f"Every kept run of the reference (`{reference.name}/{RUNS}/`): {where}. Each batched cell's time over "
            f"`flat`'s on `{scenario}`, as the median over a machine's runs with their range, beside its newest run's "
            "own paired interval:", "", *table(kept, scenario, metric), "",
            "To check a run of yours against these: `make bench`, then `python scripts/reproduce_check.py "
            "results/latest` (against the kept runs of your machine kind, or of every kind where none is kept). "
            + across_machines(kept, scenario, metric), ""]


def across_machines(kept: list[Kept], scenario: str, metric: str) -> str:
    """What the kept runs say of another machine: how far a cell's median moved between machine kinds."""
    groups = machines(kept)
    if len(groups) < 2:
        return ("Only one machine kind is kept so far, so no range across machines is measured: on another kind "
                "expect other figures, above all for the object-heavy designs.")
    moves = []
    for impl, regime in cells(kept, scenario, metric):
        medians = [statistics.median(vals) for runs in groups.values()
                   if (vals := [r.rows[(scenario, impl, regime, metric)].value for r in runs
                                if (scenario, impl, regime, metric) in r.rows])]
        if len(medians) >= 2 and min(medians) > 0:
            moves.append((max(medians) / min(medians), impl, regime))
    factor, impl, regime = max(moves, default=(1.0, "?", "?"))
    return (f"Between the {len(groups)} machine kinds kept, a cell's median moved by up to {factor:.2f}x (`{impl}` "
            f"{regime}): on another machine expect moves of that order.")


@dataclass(frozen=True)
class Check:
    """One cell of a reader's run against the kept runs: their figures (of its machine kind where kept)."""

    cell: tuple[str, str]
    mine: Row
    theirs: list[Row]
    same_machine: bool

    @property
    def verdict(self) -> str:
        """``within the runs' range``, ``within their intervals`` or ``outside`` (``no kept figure``)."""
        if not self.theirs:
            return "no kept figure"
        values = [r.value for r in self.theirs]
        if min(values) <= self.mine.value <= max(values):
            return "within the runs' range"
        lows = [r.ci_low for r in self.theirs if r.ci_low is not None]
        highs = [r.ci_high for r in self.theirs if r.ci_high is not None]
        if lows and highs and min(lows) <= self.mine.value <= max(highs):
            return "within their intervals"
        return "outside"


def check(run_rows: list[Row], run_meta: dict, kept: list[Kept], scenario: str = "paper") -> list[Check]:
    """Each ``x flat`` of a reader's run against the kept runs of its machine kind (of every kind where none)."""
    metric = ratio_metric("seq_step_ns")
    mine = machine_key(run_meta)
    same = [k for k in kept if k.machine == mine]
    pool = same or kept
    out = []
    for r in run_rows:
        if r.scenario == scenario and r.metric == metric and r.status == "ok":
            theirs = [k.rows[key] for k in pool if (key := (scenario, r.impl, r.regime, metric)) in k.rows]
            out.append(Check((r.impl, r.regime), r, theirs, bool(same)))
    return out
