"""Which published releases an engine's import plan and adapter drive: a table of release ranges, and refusals.
Design: docs/output.md#harnessengineseraspy."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from packaging.version import InvalidVersion, Version

from harness.errors import InputError


@dataclass(frozen=True)
class Era:
    """Releases ``first`` to ``last``: the stand-ins and modules the plan adds for them, how the adapter drives
    them (``drive``), and what moved at ``first`` (why the era before cannot drive it)."""

    first: str
    last: str
    moved: str
    stubs: Mapping[str, Mapping[str, object]] = field(default_factory=dict)
    real: tuple[str, ...] = ()
    drive: Mapping[str, object] = field(default_factory=dict)

    def holds(self, version: Version) -> bool:
        return Version(self.first) <= version <= Version(self.last)


def release(text: str) -> Version | None:
    """``text`` as a published release number (PEP 440), None when it is not one (a commit, "unversioned")."""
    try:
        return Version(text)
    except InvalidVersion:
        return None


def era_of(eras: Sequence[Era], engine: str, version: str | None, before: str) -> Era:
    """The era that drives ``version`` (not a release number: the newest, as ``calibrate --source`` uses it);
    :class:`InputError` naming why otherwise (``before``: what the first era needs that older releases lack)."""
    v = release(version) if version else None
    if v is None:
        return eras[-1]
    for era in eras:
        if era.holds(v):
            return era
    span = f"{eras[0].first}..{eras[-1].last}"
    if v < Version(eras[0].first):
        raise InputError(f"{engine} {version}: older than the plans drive ({span}): {before}")
    if v > Version(eras[-1].last):
        raise InputError(f"{engine} {version}: newer than {eras[-1].last}, the last release the import plans were "
                         f"checked against ({span}); its modules may have moved: check them and add a row to the "
                         "table in harness/engines/" + engine.replace("-", "_") + "_engine.py")
    raise InputError(f"{engine} {version}: between the plans' ranges ({span}); no plan names it")


def describe(eras: Sequence[Era]) -> list[str]:
    """One line per era: its releases and what moved at its first."""
    return [f"{e.first}..{e.last}: {e.moved}" for e in eras]
