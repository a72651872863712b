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
