"""Two runs compared figure by figure: NEW over BASE, with a 95 % interval and a verdict (``kvblock-bench compare``).
Design: docs/output.md#harnessoutputcomparepy."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from harness.base.rows import RATIO_METRICS
from harness.base.stats import Estimate, independent_ratio
from harness.errors import InputError
from harness.output.rundata import RunData, ordered
from harness.run.metadata import TIMING_IDENTITY, identity_differences

# The timed headline figures, one per kind of work; the others are these scaled, parts of them, or without interval.
DEFAULT_METRICS = RATIO_METRICS
# Provisional: scripts/compare_pairs.py measures the false-alarm rate per threshold (results/compare_pairs/).
DEFAULT_THRESHOLD_PCT = 10.0
DEFAULT_THRESHOLD = DEFAULT_THRESHOLD_PCT / 100
VERDICTS = ("slower", "faster", "no difference", "not comparable")
SIDES = ("BASE", "NEW")
CONFIG_IGNORED = ("root", "label", "progress")


@dataclass
class Figure:
    """One run's row of a compared figure."""

    value: float
    ci_low: float | None
    ci_high: float | None
    reps: int | None
    driver: str

    @classmethod
    def of(cls, row: dict) -> Figure:
        def number(key: str) -> float | None:
            value = row.get(key)
            return None if value is None or (isinstance(value, float) and math.isnan(value)) else float(value)

        reps = number("reps")
        return cls(float(row["value"]), number("ci_low"), number("ci_high"), None if reps is None else int(reps),
                   row.get("driver") or "")

    @property
    def estimate(self) -> Estimate | None:
        if self.ci_low is None or self.ci_high is None:
            return None
        return Estimate(self.value, self.ci_low, self.ci_high)


@dataclass
class Compared:
    """One compared figure: both runs' rows, NEW/BASE with its interval, the verdict, why and notes."""

    scenario: str
    impl: str
    regime: str
    metric: str
    unit: str
    base: Figure | None
    new: Figure | None
    verdict: str
    why: str = ""
    ratio: float | None = None
    ci_low: float | None = None
    ci_high: float | None = None
    notes: list[str] = field(default_factory=list)


@dataclass
class Run:
    """A compared run: its data and what the comparison reads from its metadata."""

    side: str
    data: RunData

    @property
    def meta(self) -> dict:
        return self.data.meta

    @property
    def config(self) -> dict:
        config = self.meta.get("config")
        return config if isinstance(config, dict) else {}

    @property
    def traces(self) -> dict | None:
        traces = self.meta.get("traces")
        return traces if isinstance(traces, dict) else None

    def describe(self) -> dict:
        """What a report shows of the run: id, folder, commit, start, machine."""
        m = self.meta
        return {"side": self.side, "run_id": self.data.run_id, "path": str(self.data.run_dir),
                "commit": m.get("git_commit", "unknown"), "started": m.get("started", "unknown"),
                "cpu_model": m.get("cpu_model", "unknown"), "cpu_count": m.get("cpu_count"),
                "complete": m.get("complete"), "command_line": m.get("command_line", "")}


@dataclass
class Comparison:
    """Everything ``kvblock-bench compare`` reports."""

    base: Run
    new: Run
    threshold: float
    metrics: tuple[str, ...]
    other_machine: list[str]
    run_notes: list[str]
    rows: list[Compared]

    def count(self, verdict: str) -> int:
        return sum(r.verdict == verdict for r in self.rows)

    @property
    def slower(self) -> list[Compared]:
        return [r for r in self.rows if r.verdict == "slower"]

    @property
    def exit_status(self) -> int:
        """1 when a figure is slower beyond the threshold, else 0."""
        return 1 if self.slower else 0


def load_run(side: str, run: str | Path, root: Path) -> Run:
    """A run folder, or a run id under ``root``, as one side of the comparison."""
    return Run(side, RunData.load(run, root))


def verdict(est: Estimate, threshold: float) -> tuple[str, list[str]]:
    """The verdict of NEW/BASE's interval at ``threshold`` (a fraction), and notes on a change within it."""
    if est.low > 1 + threshold:
        return "slower", []
    if est.high < 1 / (1 + threshold):
        return "faster", []
    if est.high > 1 + threshold or est.low < 1 / (1 + threshold):
        return "no difference", [f"inconclusive: the interval reaches past ±{threshold * 100:g} %"]
    if est.low > 1 or est.high < 1:
        return "no difference", [f"changed by less than the {threshold * 100:g} % threshold"]
    return "no difference", []


def _failed(run: Run, scenario: str, impl: str, regime: str) -> bool:
    row = run.data.get(scenario, impl, regime, "correctness")
    return row is not None and row["status"] == "failed"


def _trace_differs(base: Run, new: Run, scenario: str, b: dict, n: dict) -> str:
    """Why the scenario's traces differ between the runs ("" when they agree, as far as the runs tell)."""
    digests = [run.traces.get(scenario) if run.traces is not None else None for run in (base, new)]
    if None not in digests:
        return "" if digests[0] == digests[1] else "different trace"
    for column in ("steps", "seqs"):
        if b.get(column) != n.get(column):
            return f"different trace ({column} {b.get(column)} -> {n.get(column)})"
    return ""


def _not_comparable(base: Run, new: Run, key: tuple[str, str, str, str], b: dict | None, n: dict | None) -> str:
    """Why the figure cannot be compared ("" when it can)."""
    for run, row in ((base, b), (new, n)):
        if row is None:
            return f"failed in {run.side}" if _failed(run, *key[:3]) else f"missing in {run.side}"
    why = _trace_differs(base, new, key[0], b, n)
    if why:
        return why
    for run, row in ((base, b), (new, n)):
        if row["status"] != "ok":
            return f"{row['status']} in {run.side}"
    for run, row in ((base, b), (new, n)):
        if Figure.of(row).estimate is None:
            return f"no interval in {run.side}"
    return ""


def compare_figure(base: Run, new: Run, key: tuple[str, str, str, str], threshold: float) -> Compared:
    """One figure of both runs compared."""
    b, n = base.data.get(*key), new.data.get(*key)
    unit = (b or n or {}).get("unit", "")
    fb = Figure.of(b) if b is not None and b["status"] == "ok" else None
    fn = Figure.of(n) if n is not None and n["status"] == "ok" else None
    why = _not_comparable(base, new, key, b, n)
    if why:
        return Compared(*key, unit, fb, fn, "not comparable", why)
    est = independent_ratio(fn.estimate, fb.estimate)
    if not (math.isfinite(est.low) and math.isfinite(est.high)):
        return Compared(*key, unit, fb, fn, "not comparable", "not a positive figure in both runs")
    name, notes = verdict(est, threshold)
    if fb.reps != fn.reps:
        notes.append(f"repetitions {fb.reps} -> {fn.reps}")
    if fb.driver != fn.driver:
        notes.append(f"driver {fb.driver or '?'} -> {fn.driver or '?'}")
    return Compared(*key, unit, fb, fn, name, "", est.value, est.low, est.high, notes)


def figure_keys(base: Run, new: Run, metrics: tuple[str, ...]) -> list[tuple[str, str, str, str]]:
    """Every (scenario, impl, regime, metric) of ``metrics`` in either run, in run, registry and asked order."""
    keys = [k for run in (base, new) for k in run.data.index if k[3] in metrics and k[1] != "-"]
    keys = list(dict.fromkeys(keys))
    scenarios = list(dict.fromkeys(k[0] for k in keys))
    impls = ordered(k[1] for k in keys)
    regimes = list(dict.fromkeys(k[2] for k in keys))
    return sorted(keys, key=lambda k: (scenarios.index(k[0]), impls.index(k[1]), regimes.index(k[2]),
                                       metrics.index(k[3])))


def run_notes(base: Run, new: Run) -> list[str]:
    """How the runs were made differently (options, repetitions, completeness, recorded traces), in words."""
    notes = []
    for key in sorted(set(base.config) | set(new.config)):
        if key in CONFIG_IGNORED:
            continue
        vb, vn = base.config.get(key), new.config.get(key)
        if vb != vn:
            notes.append(f"made with other options: {key} {vb} (BASE) -> {vn} (NEW)")
    for run in (base, new):
        if run.meta.get("complete") is False:
            notes.append(f"{run.side} did not finish (interrupted or failed): it holds what finished")
        if run.traces is None:
            notes.append(f"{run.side} records no trace digests (a run from before they were recorded): traces "
                         "are compared by their steps and sequences only")
    return notes


def check_metrics(base: Run, new: Run, metrics: tuple[str, ...]) -> None:
    """Refuse metrics that neither run holds (a misspelt name would otherwise compare nothing)."""
    held = {k[3] for run in (base, new) for k in run.data.index}
    missing = [m for m in metrics if m not in held]
    if missing:
        raise InputError(f"--metric {','.join(missing)}: neither run has such a figure; they hold e.g. "
                         f"{', '.join(m for m in DEFAULT_METRICS if m in held) or ', '.join(sorted(held)[:5])}")


def compare_runs(base: Run, new: Run, metrics: tuple[str, ...] = DEFAULT_METRICS,
                 threshold: float = DEFAULT_THRESHOLD, allow_other_machine: bool = False) -> Comparison:
    """Compare ``new`` against ``base``; :class:`InputError` for other machines (unless allowed) or unknown metrics."""
    if not (0 <= threshold < 10):
        raise InputError(f"--threshold {threshold * 100:g}: give a percentage from 0 to 1000, e.g. 10")
    differences = identity_differences(base.meta, new.meta, TIMING_IDENTITY)
    if differences and not allow_other_machine:
        raise InputError(f"{base.data.run_id} and {new.data.run_id} ran on different machines or software "
                         f"({'; '.join(differences)}): timings compare only on one machine; pass "
                         "--allow-other-machine to compare anyway")
    check_metrics(base, new, metrics)
    keys = figure_keys(base, new, metrics)
    unmeasured = [key for key in keys if _unmeasured_in_both(base, new, key)]
    rows = [compare_figure(base, new, key, threshold) for key in keys if key not in unmeasured]
    if differences:
        for row in rows:
            row.notes.append("other machine")
    notes = run_notes(base, new) + unmeasured_note(base, unmeasured)
    return Comparison(base, new, threshold, metrics, differences, notes, rows)


def _unmeasured_in_both(base: Run, new: Run, key: tuple[str, str, str, str]) -> bool:
    """Whether neither run measured the figure, for the same stated reason (not a failure)."""
    b, n = base.data.get(*key), new.data.get(*key)
    return (b is not None and n is not None and b["status"] == n["status"] not in ("ok", "failed")
            and b.get("how", "") == n.get("how", ""))


def unmeasured_note(base: Run, keys: list[tuple[str, str, str, str]]) -> list[str]:
    """One note for the figures neither run measured: how many, which kinds, and the first reason."""
    if not keys:
        return []
    kinds = ", ".join(dict.fromkeys(f"{metric} ({regime})" for _, _, regime, metric in keys))
    row = base.data.get(*keys[0])
    reason = f"{row['status']}: {row.get('how', '')}".rstrip(": ")
    return [f"{len(keys)} figures measured in neither run are left out ({kinds}; e.g. {reason})"]
