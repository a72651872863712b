"""Do two runs agree? Their ratios on one scenario, interval against interval.
Design: docs/output.md#harnessoutputoverlappy."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from harness.base.rows import Row, read_rows

Key = tuple[str, str, str]  # (impl, regime, metric)


def ratio_rows(results_csv: Path, scenario: str) -> dict[Key, Row]:
    """The ``ok`` ratio rows with an interval (and the A/A control) of ``scenario``, by (impl, regime, metric)."""
    return {(r.impl, r.regime, r.metric): r for r in read_rows(results_csv)
            if r.scenario == scenario and r.status == "ok" and ("_vs_" in r.metric or r.metric == "aa_ratio")
            and r.ci_low is not None and r.ci_high is not None}


@dataclass
class Comparison:
    """Pairs of the same ratio in two runs: which overlap, which do not."""

    pairs: list[tuple[Key, Row, Row]] = field(default_factory=list)

    @property
    def misses(self) -> list[tuple[Key, Row, Row]]:
        return [(k, a, b) for k, a, b in self.pairs if not overlaps(a, b)]

    @property
    def overlap(self) -> int:
        return len(self.pairs) - len(self.misses)


def overlaps(a: Row, b: Row) -> bool:
    """Whether the two rows' 95 % intervals share a point."""
    return a.ci_low <= b.ci_high and b.ci_low <= a.ci_high


def compare(a: dict[Key, Row], b: dict[Key, Row]) -> Comparison:
    """Every ratio both runs measured, in key order."""
    return Comparison([(k, a[k], b[k]) for k in sorted(set(a) & set(b))])


def figure(row: Row) -> str:
    """``value [low-high]`` in three significant digits."""
    return f"{row.value:.3g} [{row.ci_low:.3g}-{row.ci_high:.3g}]"


SPREAD_TARGET = 1.25  # max/min of one figure across runs of one commit beside a noisy neighbour (issue 50)


@dataclass(frozen=True)
class Agreement:
    """One ratio across several runs: each run's row (None where it has none)."""

    key: Key
    rows: tuple[Row | None, ...]

    @property
    def values(self) -> list[float]:
        return [r.value for r in self.rows if r is not None]

    @property
    def spread(self) -> float:
        values = [v for v in self.values if v > 0]
        return max(values) / min(values) if len(values) >= 2 else 1.0

    @property
    def covered(self) -> bool:
        found = [r for r in self.rows if r is not None]
        return all(a.ci_low <= b.value <= a.ci_high for a in found for b in found if a is not b)

    def holds(self, target: float = SPREAD_TARGET) -> bool:
        """In every run, max/min within ``target``, each run's interval holding every other run's figure."""
        return None not in self.rows and self.spread <= target and self.covered


def agreement(runs: list[dict[Key, Row]], metric_suffix: str = "") -> list[Agreement]:
    """Every ratio any of ``runs`` measured (those whose metric ends with ``metric_suffix``), in key order."""
    keys = sorted({k for run in runs for k in run if k[2].endswith(metric_suffix)})
    return [Agreement(k, tuple(run.get(k) for run in runs)) for k in keys]
