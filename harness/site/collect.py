"""The runs a site shows: found under the paths given, grouped by machine, one commit unless told otherwise."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from harness.base.host import machine_key, machine_name
from harness.errors import InputError
from harness.output.rundata import RunData

MAX_DEPTH = 4  # how deep under a given folder run folders are looked for (CI artifacts nest them)


class SiteInputError(InputError):
    """Run folders that cannot make one site; the message names them and the fix."""


def find_runs(paths: list[Path]) -> list[Path]:
    """Every run folder (a ``results.csv`` beside a ``meta.json``) at or under ``paths``, each once, in order."""
    found: list[Path] = []
    for path in paths:
        if not path.exists():
            raise SiteInputError(f"{path}: no such file or folder; give run folders or folders holding them")
        here = [path] if (path / "results.csv").is_file() else _under(path, MAX_DEPTH)
        if not here:
            raise SiteInputError(f"{path}: no run folder (results.csv and meta.json) in it or {MAX_DEPTH} levels below")
        found += [p for p in here if p.resolve() not in {f.resolve() for f in found}]
    return found


def _under(folder: Path, depth: int) -> list[Path]:
    if depth == 0 or not folder.is_dir():
        return []
    out = []
    for child in sorted(folder.iterdir()):
        if child.is_symlink() or not child.is_dir():
            continue  # results/latest names a run found anyway
        out += [child] if (child / "results.csv").is_file() and (child / "meta.json").is_file() \
            else _under(child, depth - 1)
    return out


@dataclass
class Machine:
    """The runs of one machine (one ``host.machine_key``), newest first; ``name`` is ``host.machine_name``."""

    key: str
    runs: list[RunData] = field(default_factory=list)

    @property
    def name(self) -> str:
        return machine_name(self.newest.meta)

    @property
    def newest(self) -> RunData:
        return self.runs[0]

    def across(self, scenario: str, impl: str, regime: str, metric: str) -> tuple[float, float, int]:
        """(lowest, highest, how many) of the runs' measured values of a figure."""
        values = [v for run in self.runs if math.isfinite(v := run.value(scenario, impl, regime, metric))]
        return (min(values), max(values), len(values)) if values else (math.nan, math.nan, 0)


def _commit(run: RunData) -> str:
    return str(run.meta.get("git_commit") or "?")


def load_runs(paths: list[Path], allow_mixed_commits: bool = False) -> list[Machine]:
    """The runs under ``paths`` by machine (machines in the order first met, each machine's runs newest first);
    runs of different commits only when ``allow_mixed_commits``."""
    runs = [RunData.load(p) for p in find_runs(paths)]
    commits: dict[str, list[str]] = {}
    for run in runs:
        commits.setdefault(_commit(run), []).append(str(run.run_dir))
    if len(commits) > 1 and not allow_mixed_commits:
        listed = "; ".join(f"{c}: {', '.join(dirs[:3])}" + (" ..." if len(dirs) > 3 else "")
                           for c, dirs in commits.items())
        raise SiteInputError(f"runs of {len(commits)} commits ({listed}): a site compares one version of the code "
                             "across machines; give runs of one commit, or --allow-mixed-commits to show them anyway")
    machines: dict[str, Machine] = {}
    for run in runs:
        machines.setdefault(machine_key(run.meta), Machine(machine_key(run.meta))).runs.append(run)
    for m in machines.values():
        m.runs.sort(key=lambda r: str(r.meta.get("started", "")), reverse=True)
    return list(machines.values())
