"""Two runs compared figure by figure: NEW over BASE, with a 95 % interval and a verdict (``kvblock-bench compare``).
Design: docs/output.md#harnessoutputcomparepy."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from harness.base.files import PAIRED_FILE, ResultsError, read_json
from harness.base.host import competing_work, machine_name
from harness.base.rows import RATIO_METRICS
from harness.base.stats import Estimate, independent_ratio
from harness.errors import InputError, TooFewPairs
from harness.output.rundata import RunData, ordered
from harness.run.metadata import TIMING_IDENTITY, identity_differences

# The timed headline figures, one per kind of work; the others are these scaled, parts of them, or without interval.
DEFAULT_METRICS = RATIO_METRICS
# From scripts/compare_pairs.py's pairs (results/compare_pairs/; docs/ci.md, "Threshold").
DEFAULT_THRESHOLD_PCT = 10.0
# The fewest pairs of worker processes a paired verdict rests on: scripts/compare_pairs.py's "Pairs needed".
MIN_PAIRS = 3
DEFAULT_THRESHOLD = DEFAULT_THRESHOLD_PCT / 100
EXIT_FAILS, EXIT_NOTHING_COMPARABLE = 1, 2  # a row slower (or a figure lost...); no row comparable: nothing judged
VERDICTS = ("slower", "faster", "no difference", "not comparable")
SIDES = ("BASE", "NEW")
CONFIG_IGNORED = ("root", "label", "progress")
Key = tuple[str, str, str, str]


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

    def problem(self) -> str:
        """Why this row is no figure to compare ("" when it is one), e.g. a value outside its own interval."""
        if self.ci_low is None or self.ci_high is None:
            return "no interval"
        if not (self.value > 0 and self.ci_low > 0):
            return f"not a positive figure ({self.value:g} [{self.ci_low:g}-{self.ci_high:g}])"
        slack = 1e-9 * self.ci_high
        if not self.ci_low - slack <= self.value <= self.ci_high + slack:
            return f"its value {self.value:g} lies outside its own interval [{self.ci_low:g}-{self.ci_high:g}]"
        return ""


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
    inconclusive: bool = False  # no difference, but the interval reaches past the threshold
    lost: bool = False  # BASE measured it, NEW did not (missing, failed, skipped or unavailable there)
    too_few: bool = False  # paired over fewer than MIN_PAIRS pairs of processes

    def detectable(self, threshold: float) -> float | None:
        """The smallest slowdown (a fraction) this row would have reported at ``threshold``: the NEW/BASE at which
        its interval, moved along with it, would lie wholly beyond the threshold; None without an interval."""
        if self.ratio is None or not self.ci_low or not math.isfinite(self.ci_low):
            return None
        return (1 + threshold) * self.ratio / self.ci_low - 1


@dataclass
class Counted:
    """The gate's deterministic counts of one cell in both versions (``kvblock-bench ab``); None where unmeasured."""

    impl: str
    regime: str
    instructions: tuple[float | None, float | None]  # per sequence-step, BASE and NEW
    allocations: tuple[float | None, float | None]  # the design's allocations per step, BASE and NEW

    @property
    def change(self) -> float | None:
        """NEW's instructions over BASE's, minus 1."""
        base, new = self.instructions
        return None if not base or new is None else new / base - 1

    def beyond(self, threshold_pct: float) -> list[str]:
        """What NEW needs more of than BASE beyond ``threshold_pct`` percent (instructions, allocations), in words."""
        change, (base, new) = self.change, self.allocations
        out = [] if change is None or change * 100 <= threshold_pct else [f"instructions {change * 100:+.1f} %"]
        if base is not None and new is not None and new > base * (1 + threshold_pct / 100):
            out.append(f"allocations per step {base:g} -> {new:g}")
        return out

    def verdict(self, threshold_pct: float) -> str:
        """``more work`` (it fails), ``not measured``, or ``within``."""
        if self.beyond(threshold_pct):
            return "more work"
        measured = None not in self.instructions or None not in self.allocations
        return "within" if measured else "not measured"

    def words(self, tolerance_pct: float = 0.0) -> str:
        """"more work: +x % instructions" (or less) beyond ``tolerance_pct``, and allocations when they differ;
        "" when neither changed."""
        change, (base, new) = self.change, self.allocations
        parts = [] if change is None or abs(change) * 100 <= tolerance_pct else [
            f"{'more' if change > 0 else 'less'} work: {change * 100:+.1f} % instructions"]
        if base is not None and new is not None and base != new:
            parts.append(f"allocations per step {base:g} -> {new:g}")
        return "; ".join(parts)


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
                "machine": machine_name(m), "beside": competing_work(m),
                "complete": m.get("complete"), "command_line": m.get("command_line", "")}


@dataclass
class Rules:
    """What fails a comparison beyond a slower row: inconclusive rows (``--fail-on-inconclusive``), figures NEW
    lost (unless ``--allow-lost``)."""

    fail_on_inconclusive: bool = False
    allow_lost: bool = False


@dataclass
class Comparison:
    """Everything ``kvblock-bench compare`` (and ``ab``) reports."""

    base: Run
    new: Run
    threshold: float
    metrics: tuple[str, ...]
    other_machine: list[str]
    run_notes: list[str]
    rows: list[Compared]
    interleaved: bool = False  # both versions measured in one run, side by side (ab): paired intervals
    rules: Rules = field(default_factory=Rules)
    counted: list[Counted] = field(default_factory=list)
    counted_notes: list[str] = field(default_factory=list)
    sources: list[str] = field(default_factory=list)  # where each side's code came from (ab)
    counts_threshold_pct: float = 0.0  # NEW's counts beyond BASE's by more than this fail (ab)

    @property
    def more_work(self) -> list[Counted]:
        """The counted cells where NEW needs more than BASE beyond the threshold."""
        return [k for k in self.counted if k.beyond(self.counts_threshold_pct)]

    def count(self, verdict: str) -> int:
        return sum(r.verdict == verdict for r in self.rows)

    @property
    def slower(self) -> list[Compared]:
        return [r for r in self.rows if r.verdict == "slower"]

    @property
    def inconclusive(self) -> list[Compared]:
        return [r for r in self.rows if r.inconclusive]

    @property
    def lost(self) -> list[Compared]:
        return [r for r in self.rows if r.lost]

    @property
    def comparable(self) -> list[Compared]:
        return [r for r in self.rows if r.verdict != "not comparable"]

    @property
    def too_few(self) -> list[Compared]:
        return [r for r in self.rows if r.too_few]

    @property
    def detectable(self) -> tuple[float, Compared] | None:
        """The smallest slowdown every comparable row would have reported, and the row that needs it."""
        found = [(r.detectable(self.threshold), r) for r in self.comparable
                 if r.detectable(self.threshold) is not None]
        return max(found, key=lambda pair: pair[0]) if found else None

    def failures(self) -> list[str]:
        """Why the comparison fails, in words (empty when it passes)."""
        why = [f"{len(self.slower)} slower beyond the threshold"] if self.slower else []
        if self.more_work:
            why.append(f"more work than BASE beyond {self.counts_threshold_pct:g} %: " + "; ".join(
                f"{k.impl} {k.regime} ({', '.join(k.beyond(self.counts_threshold_pct))})" for k in self.more_work))
        if self.lost and not self.rules.allow_lost:
            why.append(f"NEW lost {len(self.lost)} figure{'s' * (len(self.lost) != 1)} BASE has")
        if self.inconclusive and self.rules.fail_on_inconclusive:
            why.append(f"{len(self.inconclusive)} inconclusive (--fail-on-inconclusive)")
        return why

    @property
    def exit_status(self) -> int:
        """1 when the comparison fails; else 4 for a row of too few pairs, 2 when nothing is comparable, 0."""
        if self.failures():
            return EXIT_FAILS
        if self.too_few:
            return TooFewPairs.exit_status
        return 0 if self.comparable else EXIT_NOTHING_COMPARABLE


def load_run(side: str, run: str | Path, root: Path) -> Run:
    """A run folder, or a run id under ``root``, as one side of the comparison."""
    return Run(side, RunData.load(run, root))


def paired_from(base: Run, new: Run) -> dict[Key, Estimate] | None:
    """NEW/BASE paired slice by slice, when NEW's run folder says ``kvblock-bench ab`` measured it beside BASE's."""
    path = new.data.run_dir / PAIRED_FILE
    try:
        doc = read_json(path) if path.is_file() else None
    except (ResultsError, ValueError, OSError):
        return None
    if not isinstance(doc, dict) or doc.get("sides", {}).get("BASE", {}).get("run_id") != base.data.run_id:
        return None
    return {(r["scenario"], r["impl"], r["regime"], r["metric"]): Estimate(
        r["ratio"], *(float("nan") if r[k] is None else r[k] for k in ("ci_low", "ci_high"))) for r in doc["paired"]}


def pair_counts(new: Run) -> dict[Key, int]:
    """Per figure of NEW's ``ab.json``, the pairs of worker processes its interval rests on."""
    try:
        doc = read_json(new.data.run_dir / PAIRED_FILE)
    except (ResultsError, ValueError, OSError):
        return {}
    config = new.config

    def number(key: str) -> int:
        text = str(config.get(key, "0"))
        return int(text) if text.isdigit() else 0

    older = min(number("reps"), number("processes") or number("reps"))
    return {(r["scenario"], r["impl"], r["regime"], r["metric"]): len(r["pairs"]) if isinstance(r.get("pairs"), list)
            else older for r in doc.get("paired", []) if isinstance(r, dict)}


def too_few_pairs(row: Compared, pairs: int) -> Compared:
    """``row`` with its verdict withheld: too few pairs of processes."""
    row.verdict, row.why, row.too_few, row.inconclusive = "not comparable", (
        f"too few pairs for a verdict: {pairs} pair{'s' * (pairs != 1)} of worker processes, at least {MIN_PAIRS} "
        f"needed (--reps {MIN_PAIRS})"), True, False
    return row


def verdict(est: Estimate, threshold: float) -> tuple[str, list[str]]:
    """The verdict of NEW/BASE's interval at ``threshold`` (a fraction), and notes on a change within it."""
    if est.low > 1 + threshold:
        return "slower", []
    if est.high < 1 / (1 + threshold):
        return "faster", []
    if est.high > 1 + threshold or est.low < 1 / (1 + threshold):
        return "no difference", [f"inconclusive: the interval reaches past ±{threshold * 100:g} %"]
    if measured_change(est):
        return "no difference", [f"changed by less than the {threshold * 100:g} % threshold"]
    return "no difference", []


def measured_change(est: Estimate) -> str:
    """"slower" or "faster" when NEW/BASE's whole interval lies on that side of 1; "" when it holds 1."""
    return "slower" if est.low > 1 else "faster" if est.high < 1 else ""


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
        problem = Figure.of(row).problem()
        if problem:
            return f"{problem} in {run.side}"
    return ""


def _lost(why: str, b: dict | None, n: dict | None) -> bool:
    """Whether BASE's row is a figure to compare and NEW's is not (another trace loses nothing)."""
    def usable(row: dict | None) -> bool:
        return row is not None and row["status"] == "ok" and not Figure.of(row).problem()

    return bool(why) and not why.startswith("different trace") and usable(b) and not usable(n)


def compare_figure(base: Run, new: Run, key: Key, threshold: float,
                   paired: dict[Key, Estimate] | None = None) -> Compared:
    """One figure of both runs compared (NEW/BASE from ``paired`` where it holds the figure)."""
    b, n = base.data.get(*key), new.data.get(*key)
    unit = (b or n or {}).get("unit", "")
    fb = Figure.of(b) if b is not None and b["status"] == "ok" else None
    fn = Figure.of(n) if n is not None and n["status"] == "ok" else None
    why = _not_comparable(base, new, key, b, n)
    if why:
        return Compared(*key, unit, fb, fn, "not comparable", why, lost=_lost(why, b, n))
    est = paired[key] if paired and key in paired else independent_ratio(fn.estimate, fb.estimate)
    if not (math.isfinite(est.low) and math.isfinite(est.high)):
        return Compared(*key, unit, fb, fn, "not comparable", "not a positive figure in both runs")
    name, notes = verdict(est, threshold)
    if paired is not None and key not in paired:
        notes.append("independent interval (not paired)")
    if fb.reps != fn.reps:
        notes.append(f"repetitions {fb.reps} -> {fn.reps}")
    if fb.driver != fn.driver:
        notes.append(f"driver {fb.driver or '?'} -> {fn.driver or '?'}")
    return Compared(*key, unit, fb, fn, name, "", est.value, est.low, est.high, notes,
                    inconclusive=name == "no difference" and not (1 / (1 + threshold) <= est.low
                                                                   and est.high <= 1 + threshold))


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


def check_once(run: Run, metrics: tuple[str, ...]) -> None:
    """Refuse a run holding a compared figure twice (two measured rows with intervals)."""
    df = run.data.df
    sel = df[(df.status == "ok") & df.metric.isin(metrics) & df.ci_low.notna() & df.ci_high.notna()]
    twice = sel[sel.duplicated(["scenario", "impl", "regime", "metric"], keep=False)]
    if len(twice):
        first = twice.iloc[0]
        values = ", ".join(f"{v:g}" for v in twice[(twice.scenario == first.scenario) & (twice.impl == first.impl) & (
            twice.regime == first.regime) & (twice.metric == first.metric)].value)
        raise InputError(f"{run.side} {run.data.run_dir / 'results.csv'}: {first.scenario} {first.impl} {first.regime} "
                         f"{first.metric} is there more than once ({values}); a run writes each figure once: compare "
                         "runs as they were written")


def check_metrics(base: Run, new: Run, metrics: tuple[str, ...]) -> None:
    """Refuse metrics that neither run holds (a misspelt name would otherwise compare nothing)."""
    held = {k[3] for run in (base, new) for k in run.data.index}
    missing = [m for m in metrics if m not in held]
    if missing:
        raise InputError(f"--metric {','.join(missing)}: neither run has such a figure; they hold e.g. "
                         f"{', '.join(m for m in DEFAULT_METRICS if m in held) or ', '.join(sorted(held)[:5])}")


@dataclass
class Allowed:
    """What a comparison is asked to accept: runs of other machines, a ``--quick`` run beside a full one."""

    other_machine: bool = False
    quick_mismatch: bool = False


def check_runs(base: Run, new: Run, allowed: Allowed) -> list[str]:
    """Refuse runs of other machines or of other lengths (unless allowed); returns the machines' differences."""
    differences = identity_differences(base.meta, new.meta, TIMING_IDENTITY)
    if differences and not allowed.other_machine:
        raise InputError(f"{base.data.run_id} and {new.data.run_id} ran on different machines or software "
                         f"({'; '.join(differences)}): timings compare only on one machine; pass "
                         "--allow-other-machine to compare anyway")
    quick = [str(run.config.get("quick", "False")) == "True" for run in (base, new)]
    if quick[0] != quick[1] and not allowed.quick_mismatch:
        raise InputError(f"{'BASE' if quick[0] else 'NEW'} is a --quick run and the other a full one: their traces "
                         "differ and no figure would compare; run both alike, or pass --allow-quick-mismatch")
    return differences


def compare_runs(base: Run, new: Run, metrics: tuple[str, ...] = DEFAULT_METRICS,
                 threshold: float = DEFAULT_THRESHOLD, allowed: Allowed | None = None, rules: Rules | None = None,
                 paired: dict[Key, Estimate] | None = None, pairs: dict[Key, int] | None = None) -> Comparison:
    """Compare ``new`` against ``base`` (NEW/BASE paired where ``paired``, or NEW's ``ab.json``, holds it, over
    ``pairs`` pairs of processes); :class:`InputError` for other machines or lengths (unless allowed) or metrics."""
    if not (0 <= threshold < 10):
        raise InputError(f"--threshold {threshold * 100:g}: give a percentage from 0 to 1000, e.g. 10")
    differences = check_runs(base, new, allowed or Allowed())
    check_metrics(base, new, metrics)
    for run in (base, new):
        check_once(run, metrics)
    counts = pairs if pairs is not None else pair_counts(new) if paired is None else {}
    paired = paired if paired is not None else paired_from(base, new)
    keys = figure_keys(base, new, metrics)
    unmeasured = [key for key in keys if _unmeasured_in_both(base, new, key)]
    rows = [compare_figure(base, new, key, threshold, paired) for key in keys if key not in unmeasured]
    for row in rows:
        key = (row.scenario, row.impl, row.regime, row.metric)
        if paired and row.ratio is not None and key in paired and counts.get(key, MIN_PAIRS) < MIN_PAIRS:
            too_few_pairs(row, counts[key])
    if differences:
        for row in rows:
            row.notes.append("other machine")
    notes = run_notes(base, new) + unmeasured_note(base, unmeasured)
    return Comparison(base, new, threshold, metrics, differences, notes, rows, paired is not None,
                      rules or Rules(), sources=code_sources(base, new))


def code_sources(base: Run, new: Run) -> list[str]:
    """Where each side's code came from, as ``ab`` recorded it."""
    found = []
    for run in (base, new):
        ab = run.meta.get("ab")
        words = ab.get("code_from") if isinstance(ab, dict) else None
        if isinstance(words, str) and words:
            found.append(" ".join(words.split()))
    return found


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
