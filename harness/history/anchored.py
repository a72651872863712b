"""A history in groups: releases of different groups compared through the anchor.
Design: docs/output.md#harnesshistoryanchoredpy."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from itertools import groupby
from typing import TypeVar

from packaging.version import Version

from harness.base.stats import Estimate, independent_ratio
from harness.history.records import HistoryRow

Series = tuple[str, str, str, str]
T = TypeVar("T")


@dataclass(frozen=True)
class Chained(Estimate):
    """NEW/BASE of releases in different groups, through the anchor (:func:`chain`)."""

    anchor: str = ""
    paired: bool = False


def series_key(row: HistoryRow) -> Series:
    return row.engine, row.caching, row.scenario, row.metric


def by_release(rows: list[HistoryRow]) -> dict[Series, dict[str, dict[int, HistoryRow]]]:
    """Series -> release -> group -> row, releases in order."""
    out: dict[Series, dict[str, dict[int, HistoryRow]]] = {}
    for row in sorted(rows, key=lambda r: Version(r.version)):
        out.setdefault(series_key(row), {}).setdefault(row.version, {})[row.group] = row
    return out


def anchor_of(releases: dict[str, dict[int, object]]) -> str | None:
    """The release measured in every group of a series (None: one group, or none is in all)."""
    groups = {g for found in releases.values() for g in found}
    if len(groups) < 2:
        return None
    return next((v for v, found in releases.items() if set(found) == groups), None)


def common_group(releases: dict[str, dict[int, object]], base: str, new: str) -> int | None:
    both = sorted(set(releases[base]) & set(releases[new]))
    return both[0] if both else None


def chain(base: T, new: T, base_anchor: T, new_anchor: T, anchor: str,
          ratio: Callable[[T, T], Estimate] = independent_ratio, paired: bool = False) -> Chained:
    """``ratio(new, new_anchor) / ratio(base, base_anchor)``, the two intervals combined as independent."""
    est = independent_ratio(ratio(new, new_anchor), ratio(base, base_anchor))
    return Chained(est.value, est.low, est.high, anchor, paired)


def chained_from_rows(releases: dict[str, dict[int, HistoryRow]], base: str, new: str) -> Chained | None:
    """NEW/BASE of releases in different groups from the rows' own intervals (None: no anchor joins them)."""
    anchor = anchor_of(releases)
    if anchor is None:
        return None
    (gb, b), (gn, n) = next(iter(releases[base].items())), next(iter(releases[new].items()))
    return chain(_est(b), _est(n), _est(releases[anchor][gb]), _est(releases[anchor][gn]), anchor)


def _est(row: HistoryRow) -> Estimate:
    ok = row.status == "ok" and all(math.isfinite(x) and x > 0 for x in (row.value, row.ci_low, row.ci_high))
    return Estimate(row.value, row.ci_low, row.ci_high) if ok else Estimate(math.nan, math.nan, math.nan)


def canonical(rows: list[HistoryRow]) -> list[HistoryRow]:
    """One row per release and series: a release measured in several groups (the anchor) by its first group's."""
    first: dict[tuple, int] = {}
    for r in rows:
        key = (*series_key(r), r.version)
        first[key] = min(first.get(key, r.group), r.group)
    return [r for r in rows if first[(*series_key(r), r.version)] == r.group]


def on_anchor_scale(rows: list[HistoryRow]) -> list[HistoryRow]:
    """:func:`canonical`'s rows, each group's scaled by the anchor's first-group value over its value there."""
    out = []
    for key, series in groupby(sorted(rows, key=series_key), key=series_key):
        series = list(series)
        releases = by_release(series)[key]
        anchor = anchor_of(releases)
        if anchor is None:
            out += series
            continue
        first = min(releases[anchor])
        base = releases[anchor][first].value
        for r in canonical(series):
            scale = base / releases[anchor][r.group].value
            if math.isfinite(scale) and scale > 0:
                out.append(replace(r, value=r.value * scale, ci_low=r.ci_low * scale, ci_high=r.ci_high * scale))
    return out


def groups_note(meta: dict) -> str:
    """A sentence on the groups a history was measured in (empty for one group)."""
    groups = meta.get("groups", [])
    if len(groups) < 2:
        return ""
    return (f"Measured in {len(groups)} groups of up to {max(len(g['releases']) for g in groups)} releases in turn, "
            f"the anchor {meta.get('anchor', '?')} in every group: releases of different groups are compared through "
            "it (each over the anchor in its own group), and each group's figures drawn on the scale of the anchor's "
            "first group.")
