"""One finished (or interrupted) run as reports, figures and notebooks read it.
Design: docs/output.md#harnessoutputrundatapy."""

from __future__ import annotations

import logging
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

import pandas as pd

from harness.base.files import ResultsError, read_json, resolve_run
from harness.base.replay import REGIMES
from harness.base.rows import COLUMNS, read_rows
from impls import registry

log = logging.getLogger(__name__)

IMPL_ORDER = registry.names()


def ordered_regimes(regimes) -> list[str]:
    """``regimes`` with :data:`REGIMES` first in that order, any other (a ``step`` regime) after, as found."""
    found = list(dict.fromkeys(regimes))
    return [r for r in REGIMES if r in found] + [r for r in found if r not in REGIMES]


def ordered(impls) -> list[str]:
    """``impls`` in the registry's order, unknown (plug-in) names last in their given order."""
    found = list(dict.fromkeys(impls))
    return [i for i in IMPL_ORDER if i in found] + [i for i in found if i not in IMPL_ORDER]


@dataclass
class RunData:
    """A run: its directory, its rows as a DataFrame (columns :data:`COLUMNS`), its metadata."""

    run_dir: Path
    df: pd.DataFrame
    meta: dict
    index: dict[tuple[str, str, str, str], dict] = field(default_factory=dict)
    meta_problem: str = ""  # why meta.json is no run's metadata ("": it is one): missing, or not a JSON object

    @classmethod
    def load(cls, run: Path | str | None = None, root: Path | None = None) -> RunData:
        """A run directory, a run id under ``root`` (default ``results/``), or None for the latest run."""
        run_dir = resolve_run(run, root) if root is not None else resolve_run(run)
        rows = read_rows(run_dir / "results.csv")
        df = pd.DataFrame([asdict(r) for r in rows], columns=COLUMNS)
        meta_path = run_dir / "meta.json"
        try:
            meta = read_json(meta_path) if meta_path.exists() else {}
        except (ValueError, OSError) as exc:
            raise ResultsError(f"{meta_path}: unreadable ({exc}); a run's meta.json is the JSON it wrote") from None
        problem = ("missing" if not meta_path.exists() else "" if isinstance(meta, dict)
                   else f"not a JSON object (a {type(meta).__name__})")
        index: dict[tuple[str, str, str, str], dict] = {}
        for r in df.to_dict("records"):
            key = (r["scenario"], r["impl"], r["regime"], r["metric"])
            if key not in index or (r["status"] == "ok" and index[key]["status"] != "ok"):
                index[key] = r  # a measured fallback (callgrind-sim) wins over an unsupported primary (perf)
        return cls(Path(run_dir), df, meta if isinstance(meta, dict) else {}, index, problem)

    @property
    def run_id(self) -> str:
        """The run directory's name."""
        return self.run_dir.name

    def get(self, scenario: str, impl: str, regime: str, metric: str) -> dict | None:
        """The row as a dict, or None when the run has no such figure."""
        return self.index.get((scenario, impl, regime, metric))

    def rows(self, scenario: str, impl: str, regime: str, metric: str) -> list[dict]:
        """Every row of the figure, one per instrument that tried (perf's and callgrind's L1D rows)."""
        df = self.df
        sel = df[(df.scenario == scenario) & (df.impl == impl) & (df.regime == regime) & (df.metric == metric)]
        return sel.to_dict("records")

    def value(self, scenario: str, impl: str, regime: str, metric: str) -> float:
        """The figure if it was measured (status ok, finite), else NaN."""
        row = self.get(scenario, impl, regime, metric)
        if row is None or row["status"] != "ok":
            return math.nan
        v = float(row["value"])
        return v if math.isfinite(v) else math.nan

    def has(self, scenario: str, impl: str | None = None) -> bool:
        """Whether the run has any row of ``scenario`` (and of ``impl``, when given)."""
        sel = self.df.scenario == scenario
        if impl is not None:
            sel &= self.df.impl == impl
        return bool(sel.any())

    def impls(self, scenario: str, metric: str, regime: str | None = None) -> list[str]:
        """Implementations with a row of ``metric`` (any status), in the registry's order, unknown ones last."""
        sel = self.df[(self.df.scenario == scenario) & (self.df.metric == metric)]
        if regime is not None:
            sel = sel[sel.regime == regime]
        return ordered(sel.impl)

    def regimes(self, scenario: str, metric: str) -> list[str]:
        """Regimes with a row of ``metric`` in ``scenario`` (any status), batched first (:func:`ordered_regimes`)."""
        return ordered_regimes(self.df[(self.df.scenario == scenario) & (self.df.metric == metric)].regime)

    def cells(self, scenario: str, metric: str = "seq_step_ns") -> list[tuple[str, str]]:
        """The (impl, regime) cells that ran ``metric`` in ``scenario``, in registry order, batched first."""
        sel = self.df[(self.df.scenario == scenario) & (self.df.metric == metric)]
        pairs = set(zip(sel.impl, sel.regime, strict=True))
        return [(i, r) for i in ordered(sel.impl) for r in ordered_regimes(sel.regime) if (i, r) in pairs]

    def raw(self, scenario: str, impl: str, regime: str) -> dict | None:
        """A cell's raw samples (``clock``, ``step_ns``, ``kind_ns_totals``), or None if absent or unreadable."""
        path = self.run_dir / "raw" / scenario / f"{impl}__{regime}.json.gz"
        if not path.is_file():
            return None
        try:
            data = read_json(path)
        except (OSError, ValueError) as exc:
            log.warning("unreadable raw file %s: %s", path, exc)
            return None
        return data if isinstance(data, dict) else None

