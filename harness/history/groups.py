"""``history``'s groups: the releases measured a group at a time, one anchor release in every group, so no more
workers live at once than memory holds and every group's figures pair with the others' through the anchor.
Design: docs/output.md#harnesshistorygroupspy."""

from __future__ import annotations

from dataclasses import dataclass

from packaging.version import Version

from harness.errors import InputError

DEFAULT_GROUP = 12  # releases per group, the anchor included: 12 workers of a few hundred MB each
MIN_GROUP = 2  # the anchor and one release
MEMORY_SHARE = 0.75  # of the memory available when a group starts, for that group's workers


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
    """The next group, in release order: the anchor and the oldest ``min(plan.size, fits) - 1`` of the ``pending``
    releases (``plan.size`` 0: as many as ``fits``); never fewer than :data:`MIN_GROUP` releases."""
    others = [v for v in pending if v != plan.anchor]
    size = min(plan.size or len(others) + 1, max(MIN_GROUP, fits))
    return sorted([*others[: size - 1], plan.anchor], key=Version)


def workers_that_fit(peak: int, available: int) -> int:
    """How many workers of ``peak`` bytes each :data:`MEMORY_SHARE` of ``available`` holds (a large number while
    nothing has been measured)."""
    if peak <= 0 or available <= 0:
        return 1 << 30
    return int(available * MEMORY_SHARE // peak)
