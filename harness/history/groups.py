"""``history``'s groups: releases measured a group at a time, the anchor in every group.
Design: docs/output.md#harnesshistorygroupspy."""

from __future__ import annotations

from dataclasses import dataclass

from packaging.version import Version

from harness.errors import InputError

DEFAULT_GROUP = 12
MIN_GROUP = 2
MEMORY_SHARE = 0.75


@dataclass(frozen=True)
class GroupPlan:
    """Releases per group (``size``, the anchor among them) and the anchor; ``size`` 0: every release in one group."""

    size: int
    anchor: str


def anchor_for(versions: list[str], size: int, anchor: str | None) -> str:
    """The release in every group: ``anchor`` (one of ``versions``), else the newest; :class:`InputError` otherwise."""
    if size and size < MIN_GROUP:
        raise InputError(f"--group {size}: a group holds the anchor and at least one release; give {MIN_GROUP} or "
                         "more, or 0 for every release in one group")
    if anchor is None:
        return versions[-1]
    if anchor not in versions:
        raise InputError(f"--anchor {anchor}: not one of the releases VERSIONS names ({versions[0]} to "
                         f"{versions[-1]}); give one of them, or leave --anchor out for the newest")
    return anchor


def next_group(pending: list[str], plan: GroupPlan, fits: int) -> list[str]:
    """The anchor and the oldest pending releases, ``min(plan.size, fits)`` in all (at least :data:`MIN_GROUP`)."""
    others = [v for v in pending if v != plan.anchor]
    size = min(plan.size or len(others) + 1, max(MIN_GROUP, fits))
    return sorted([*others[: size - 1], plan.anchor], key=Version)


def workers_that_fit(peak: int, available: int) -> int:
    """Workers of ``peak`` bytes that :data:`MEMORY_SHARE` of ``available`` holds (unbounded before a peak)."""
    if peak <= 0 or available <= 0:
        return 1 << 30
    return int(available * MEMORY_SHARE // peak)
