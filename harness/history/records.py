"""``history.csv``: one row per engine release, caching mode, scenario and metric (``kvblock-bench history``).
Design: docs/output.md#harnesshistoryrecordspy."""

from __future__ import annotations

import csv
import io
import math
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from harness.base.files import ResultsError, atomic_write_text, os_reason

HISTORY_CSV = "history.csv"
METRICS = ("seq_step_ns", "alloc_ns", "free_ns", "lookup_ns")  # as `run` defines them (harness.base.metrics)
CALL_METRICS = ("engine_calls_ns", "shared_ns")  # the timed step apart (harness.engines.call_meter)
UNITS = {"seq_step_ns": "ns per sequence-step", "alloc_ns": "ns per block allocated",
         "free_ns": "ns per block freed", "lookup_ns": "ns per lookup (per sequence-step)",
         "engine_calls_ns": "ns of the engine's own calls per sequence-step",
         "shared_ns": "ns of the rest of the step (the harness side) per sequence-step"}


@dataclass
class HistoryRow:
    """One figure of one release; ``status`` "failed" (no value) when its replay failed, ``how`` says why."""

    engine: str
    version: str
    caching: str  # "off" or "on"
    scenario: str
    metric: str
    value: float
    ci_low: float
    ci_high: float
    status: str
    reps: int
    steps: int
    digest: str
    machine: str
    load: str
    made: str
    command: str
    how: str
    group: int = 1

    def cells(self) -> dict[str, str]:
        out = {}
        for key, v in asdict(self).items():
            out[key] = ("" if math.isnan(v) else f"{v:.1f}") if isinstance(v, float) else str(v)
        return out


COLUMNS = [f.name for f in fields(HistoryRow)]
_FLOATS = ("value", "ci_low", "ci_high")
_INTS = ("reps", "steps", "group")
_OPTIONAL = {"group": "1"}


def raw_path(folder: Path, engine: str, version: str, scenario: str, group: int = 1) -> Path:
    """A release's step times per repetition: ``runs/`` for the first group, ``runs/group-N/`` after."""
    runs = folder / "runs" if group == 1 else folder / "runs" / f"group-{group}"
    return runs / f"{engine}-{version}__{scenario}.json.gz"


def write_history(path: Path, rows: list[HistoryRow]) -> Path:
    """``rows`` into ``path`` (atomically)."""
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=COLUMNS, lineterminator="\n")
    writer.writeheader()
    writer.writerows(row.cells() for row in rows)
    atomic_write_text(path, buf.getvalue())
    return path


def read_history(path: Path) -> list[HistoryRow]:
    """The rows of a ``history.csv``; :class:`ResultsError` naming the file when it is not one."""
    try:
        with path.open(newline="", encoding="utf-8") as fh:
            reader = csv.DictReader(fh)
            missing = [c for c in COLUMNS if c not in (reader.fieldnames or []) and c not in _OPTIONAL]
            if missing:
                raise ResultsError(f"{path}: not a history table (no column {missing[0]!r})")
            return [_row(r, path, i) for i, r in enumerate(reader, start=2)]
    except OSError as exc:
        raise ResultsError(f"{path}: cannot be read ({os_reason(exc)})") from None


def _row(r: dict[str, str], path: Path, line: int) -> HistoryRow:
    try:
        values = {c: r[c] if c in r else _OPTIONAL[c] for c in COLUMNS}
        values.update({c: float(r[c]) if r[c] else math.nan for c in _FLOATS})
        values.update({c: int(values[c]) for c in _INTS})
    except ValueError as exc:
        raise ResultsError(f"{path}, line {line}: {exc}") from None
    return HistoryRow(**values)
