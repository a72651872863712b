"""Which run a notebook reads, said out loud: the one named, else the newest full ``make bench`` run.
Design: docs/figures.md#notebooks."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from harness.base.files import read_json
from harness.errors import InputError
from harness.output.rundata import RunData

ENV = "KVB_RUN"


class NoRunError(InputError):
    """No run to read: the notebook says how to name one."""


@dataclass(frozen=True)
class Chosen:
    """The run a notebook reads and why (``reason``), with the other runs it could read instead."""

    data: RunData
    reason: str
    others: list[Path]

    def lines(self) -> list[str]:
        """What a notebook prints first: the run, why it, and how to read another."""
        out = [f"run:     {self.data.run_dir}", f"why:     {self.reason}"]
        if self.others:
            out.append("others:  " + ", ".join(p.name for p in self.others[:8])
                       + (f" (+{len(self.others) - 8} more)" if len(self.others) > 8 else ""))
        out.append(f"another: set RUN = '<run folder or id>' in the first cell, or {ENV}=<run> before starting Jupyter")
        return out


def full_bench(meta: dict) -> bool:
    """Whether a run is a complete ``make bench`` (the default matrix, not --quick, not interrupted)."""
    cfg = meta.get("config", {}) if isinstance(meta.get("config"), dict) else {}
    chosen = [str(cfg.get(k, "")) for k in ("scenarios", "impls", "sweep")]
    return (meta.get("complete") is True and str(cfg.get("quick")) == "False" and chosen == ["[]", "[]", "[]"]
            and str(cfg.get("trace_file")) == "None")


def _meta(run_dir: Path) -> dict:
    try:
        meta = read_json(run_dir / "meta.json")
    except (OSError, ValueError):
        return {}
    return meta if isinstance(meta, dict) else {}


def _runs(results: Path) -> list[Path]:
    """Run folders under ``results``: this checkout's newest first (ids start with the time), then committed ones."""
    if not results.is_dir():
        return []
    found = [p for p in results.iterdir() if p.is_dir() and not p.is_symlink() and (p / "results.csv").is_file()]
    return sorted(found, key=lambda p: (p.name[:1].isdigit(), p.name), reverse=True)


def _named(name: str, root: Path | None) -> Path:
    bases = [Path.cwd()] + ([root, root / "results"] if root is not None else [Path.cwd() / "results"])
    for base in bases:
        if (base / name / "results.csv").is_file():
            return base / name
    raise NoRunError(f"{name}: no run folder (results.csv) there, nor under {', '.join(map(str, bases[1:]))}; "
                     f"give a run folder or a run id under results/")


def choose_run(name: str | os.PathLike | None = None, root: Path | None = None) -> Chosen:
    """The run named (or ``$KVB_RUN``), else ``results/latest`` if a full bench, else the newest full one."""
    name = name or os.environ.get(ENV)
    results = (root if root is not None else Path.cwd()) / "results"
    others = _runs(results)
    if name:
        run_dir = _named(str(name), root)
        return Chosen(RunData.load(run_dir), f"named ({ENV} or RUN)", [p for p in others if p != run_dir])
    latest = results / "latest"
    if (latest / "results.csv").is_file() and full_bench(_meta(latest)):
        run_dir, reason = latest.resolve(), "results/latest, a full `make bench` run"
    else:
        full = [p for p in others if full_bench(_meta(p))]
        if not full:
            raise NoRunError(f"no full `make bench` run under {results}: run `make bench`, or name a run with "
                             f"RUN = '<run folder>' in the first cell or {ENV}=<run folder>")
        run_dir = full[0]
        why = ("results/latest is not a full `make bench` run (a --quick run, a selection, or interrupted)"
               if latest.exists() else "there is no results/latest")
        which = "the newest full `make bench` run" if run_dir.name[:1].isdigit() else "the committed full run"
        reason = f"{which} under results/ ({why})"
    return Chosen(RunData.load(run_dir), reason, [p for p in others if p.resolve() != run_dir.resolve()])
