"""``results/calibration/calibration.csv``: one row per contender, regime, baseline and scenario.
Design: docs/output.md#harnesscalibrationtablepy."""

from __future__ import annotations

import csv
import io
import math
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from scenarios.files.atomic import atomic_write_bytes

DEFAULT_CSV = Path("results") / "calibration" / "calibration.csv"
BAND = (0.8, 1.25)  # where a modelled row's ours/real belongs, whole step and engine calls, intervals included


@dataclass
class CalibrationRow:
    contender: str
    engine: str
    engine_version: str
    scenario: str
    call_shape: str
    baseline: str
    modelled: bool
    ours_ns_per_seq_step: float
    ours_low: float
    ours_high: float
    real_ns_per_seq_step: float
    real_low: float
    real_high: float
    ratio: float
    ratio_low: float
    ratio_high: float
    reps: int
    steps: int
    seq_steps: int
    package_digest: str
    torch_threads: str
    machine: str
    load: str
    made: str
    command: str
    how: str
    ours_calls_ns: float = math.nan  # the engine's own calls apart (harness.engines.call_meter)
    ours_calls_low: float = math.nan
    ours_calls_high: float = math.nan
    ours_shared_ns: float = math.nan
    ours_shared_low: float = math.nan
    ours_shared_high: float = math.nan
    real_calls_ns: float = math.nan
    real_calls_low: float = math.nan
    real_calls_high: float = math.nan
    real_shared_ns: float = math.nan
    real_shared_low: float = math.nan
    real_shared_high: float = math.nan
    ratio_calls: float = math.nan
    ratio_calls_low: float = math.nan
    ratio_calls_high: float = math.nan
    real_call_shape: str = ""  # the regime the engine's code was replayed in (paired with ours in call_shape)

    def cells(self) -> dict[str, str]:
        out = {}
        for key, value in asdict(self).items():
            if isinstance(value, bool):
                out[key] = "true" if value else "false"
            elif isinstance(value, float):
                out[key] = "" if math.isnan(value) else (_ratio_cell(value) if key.startswith("ratio") else
                                                         f"{value:.0f}")
            else:
                out[key] = str(value)
        return out


def _ratio_cell(value: float) -> str:
    """Three decimals; three significant digits below 0.1 (a design far cheaper than the engine: TVM's rows)."""
    return f"{value:.3f}" if not 0 < abs(value) < 0.1 else f"{value:.3g}"


COLUMNS = [f.name for f in fields(CalibrationRow)]


def read_rows(path: Path) -> tuple[list[str], list[dict[str, str]]]:
    """The file's columns and rows (none when it does not exist)."""
    if not path.is_file():
        return [], []
    with path.open(newline="") as fh:
        reader = csv.DictReader(fh)
        return list(reader.fieldnames or []), list(reader)


def merge(old: list[dict[str, str]], new: list[CalibrationRow], engine: str, scenarios: set[str]) -> list[dict]:
    """``old`` without the rows ``new`` replaces (an engine's measured scenarios and undigested rows), then ``new``."""
    def replaced(row: dict[str, str]) -> bool:
        return row.get("engine") == engine and (row.get("scenario") in scenarios or not row.get("package_digest"))

    return [row for row in old if not replaced(row)] + [row.cells() for row in new]


def write_rows(path: Path, new: list[CalibrationRow], engine: str, scenarios: set[str]) -> Path:
    """Merge ``new`` into the file at ``path`` (atomically; the old file stays whole if this fails)."""
    old_columns, old = read_rows(path)
    rows = merge(old, new, engine, scenarios)
    columns = COLUMNS + [c for c in old_columns if c not in COLUMNS and any(r.get(c) for r in rows)]
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=columns, extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return atomic_write_bytes(path, buf.getvalue().encode())


def outside_band(row: CalibrationRow) -> list[str]:
    """What of a modelled row lies outside :data:`BAND` (its ratio or interval, whole step or engine calls)."""
    low, high = BAND
    out = []
    for name, figures in (("whole step", (row.ratio, row.ratio_low, row.ratio_high)),
                          ("engine calls", (row.ratio_calls, row.ratio_calls_low, row.ratio_calls_high))):
        finite = [x for x in figures if not math.isnan(x)]
        if not finite:
            out.append(f"{name} not measured")
        elif min(finite) < low or max(finite) > high:
            out.append(f"{name} {figures[0]:.2f} [{figures[1]:.2f}-{figures[2]:.2f}]")
    return out


def band_lines(rows: list[CalibrationRow]) -> list[str]:
    """The console's verdict on the modelled rows: how many lie inside the band, and what lies outside."""
    modelled = [r for r in rows if r.modelled]
    if not modelled:
        return [f"no row models the engine ({rows[0].engine}): no band applies; each row says how far the design's "
                "step lies from the engine's (docs/calibration.md)"] if rows else []
    low, high = BAND
    outside = [(r, why) for r in modelled if (why := outside_band(r))]
    lines = [f"modelled rows inside [{low}, {high}] (whole step and engine calls, intervals included): "
             f"{len(modelled) - len(outside)} of {len(modelled)}"]
    lines += [f"  outside: {r.scenario} {r.contender} {r.call_shape} vs {r.baseline}: {'; '.join(why)}"
              for r, why in outside]
    return lines
