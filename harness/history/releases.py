"""``history``'s VERSIONS: a comma list or a range ``FIRST..LAST`` of published releases, resolved with pip.
Design: docs/output.md#harnesshistoryreleasespy."""

from __future__ import annotations

import re
from pathlib import Path

from packaging.version import Version

from harness.engines.eras import release
from harness.engines.fetch import pip
from harness.errors import InputError

PIP_INDEX_TIMEOUT_S = 300
EXAMPLE = "e.g. 0.23.0,0.24.0 or 0.21.0..0.33.0"


def parse_versions(text: str) -> tuple[list[str], tuple[str, str] | None]:
    """(the listed releases, None) or ([], (FIRST, LAST)); :class:`InputError` for anything else."""
    text = text.strip()
    if ".." in text:
        first, _, last = text.partition("..")
        ends = [first.strip(), last.strip()]
        _check(ends, text)
        if Version(ends[0]) > Version(ends[1]):
            raise InputError(f"VERSIONS {text}: the range runs backwards; give FIRST..LAST, oldest first ({EXAMPLE})")
        return [], (ends[0], ends[1])
    listed = [part.strip() for part in text.split(",")]
    _check(listed, text)
    unique = sorted(dict.fromkeys(listed), key=Version)
    return unique, None


def _check(parts: list[str], text: str) -> None:
    for part in parts:
        if not part or release(part) is None or not re.fullmatch(r"[0-9][0-9A-Za-z.+!-]*", part):
            raise InputError(f"VERSIONS {text}: {part!r} is not a release number; give a comma list or FIRST..LAST "
                             f"({EXAMPLE})")


def published(distribution: str, find_links: Path | None = None) -> list[str]:
    """Every release of ``distribution`` the package index lists (``pip index versions``), oldest first."""
    done = pip(["index", "versions"], [distribution], find_links, PIP_INDEX_TIMEOUT_S)
    m = re.search(r"^Available versions:\s*(.+)$", done.stdout, re.MULTILINE)
    if done.returncode != 0 or not m:
        tail = " ".join((done.stderr or done.stdout).strip().splitlines()[-1:])
        raise InputError(f"pip index versions {distribution} listed no release ({tail}); check the network, or give "
                         "the releases as a comma list")
    found = [v.strip() for v in m.group(1).split(",") if release(v.strip()) is not None]
    return sorted(found, key=Version)


def resolve(text: str, distribution: str, find_links: Path | None = None) -> list[str]:
    """The releases VERSIONS names, oldest first; a range is every release the index lists from FIRST to LAST."""
    listed, span = parse_versions(text)
    if span is None:
        return listed
    index = published(distribution, find_links)
    for end in span:
        if end not in index:
            raise InputError(f"VERSIONS {text}: {distribution} {end} is not a published release (the index lists "
                             f"{index[0]} to {index[-1]}); give published releases as FIRST..LAST")
    low, high = Version(span[0]), Version(span[1])
    return [v for v in index if low <= Version(v) <= high and not Version(v).is_prerelease]
