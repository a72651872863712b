"""What a run left out of a table, and the command that measures it.
Design: docs/output.md#harnessoutputcoveragepy."""

from __future__ import annotations

from harness.output.rundata import RunData, ordered_regimes
from harness.run.matrix import PLAIN_ONLY_REGIMES, ROLE_REGIMES, is_caching
from harness.run.matrix import REGIMES as MATRIX_REGIMES
from impls import registry


def missing_cells(run: RunData, scenario: str, roles: tuple[str, ...]) -> dict[str, list[str]]:
    """Implementation -> regimes it can run in but did not in ``scenario``, for available ones of ``roles``."""
    unavailable = run.meta.get("skipped_impls") or {}
    ran = set(run.cells(scenario))
    missing: dict[str, list[str]] = {}
    for name in registry.names(*roles):
        if name in unavailable:
            continue
        gone = [r for r in possible_regimes(name, scenario) if (name, r) not in ran]
        if gone:
            missing[name] = gone
    return missing


def possible_regimes(name: str, scenario: str) -> list[str]:
    """The regimes ``name`` can run in on ``scenario``, in report order."""
    regimes = ordered_regimes(ROLE_REGIMES.get(registry.record(name).role, MATRIX_REGIMES))
    return [r for r in regimes if not (is_caching(scenario) and r in PLAIN_ONLY_REGIMES)]


def _command(scenario: str, impls: list[str], regimes: list[str] | None) -> str:
    regime = f" --regime {','.join(regimes)}" if regimes else ""
    return f"`kvblock-bench run --scenario {scenario} --impl {','.join(impls)}{regime}`"


def left_out_note(run: RunData, scenario: str, roles: tuple[str, ...]) -> str:
    """One line: the cells of ``roles`` not measured on ``scenario`` with their commands, and unavailable ones."""
    groups: dict[tuple[str, ...] | None, list[str]] = {}
    for name, gone in missing_cells(run, scenario, roles).items():
        every = possible_regimes(name, scenario)
        groups.setdefault(None if gone == every else tuple(gone), []).append(name)
    parts = []
    for regimes, names in groups.items():
        what = "" if regimes is None else f"{', '.join(regimes)} regime of "
        parts.append(f"{what}{', '.join(f'`{n}`' for n in names)} "
                     f"({_command(scenario, names, None if regimes is None else list(regimes))})")
    unavailable = {n: why for n, why in (run.meta.get("skipped_impls") or {}).items()
                   if registry.record(n).role in roles}
    if unavailable:
        parts.append("unavailable on this machine: " + "; ".join(f"`{n}` ({why})" for n, why in unavailable.items()))
    return f"Not in this run: {'; '.join(parts)}." if parts else ""
