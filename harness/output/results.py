"""Run directories and tidy results.

A run lives in ``results/<run-id>/``:

- ``results.csv``: one row per figure, long format, columns :data:`COLUMNS`; rewritten atomically after every
  finished cell, so an interrupted run keeps every finished row;
- ``meta.json``: machine, versions, command line, calibrations;
- ``raw/<scenario>/<impl>__<regime>.json.gz``: raw samples (per-step times of every repetition);
- reports (``paper_table.md``, ``summary.md``) and ``figures/``.

``results/latest`` is a symbolic link to the newest run. Run ids are unique: no run overwrites another.
"""

from __future__ import annotations

import contextlib
import csv
import gzip
import io
import json
import math
import os
import re
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from harness.errors import InputError
from impls.registry import RATIO_BASE
from scenarios.atomic import atomic_write_bytes

RESULTS_DIR = Path("results")
STATUSES = ("ok", "unsupported", "unavailable", "skipped", "failed")
SCHEMA_VERSION = 3
DRIVERS = ("python", "compiled", "native")  # the loops that issue a replay's calls (the ``driver`` column)
# Figures that may be negative: a counted region minus an empty region can come out below zero by noise, and
# so can a difference of two timed medians (the cache-operation study's derived rows) or a paced run's thread
# time minus its idle run's.
SIGNED_METRICS = frozenset({"allocs_per_step", "nrt_allocs_per_step", "aa_ratio_log", "cache_insert_ns",
                            "cache_evict_ns", "cpu_share_observed_pct", "cpu_share_observed_whole_step_pct",
                            "paced_floor_pct", "paced_above_floor_pct"})
MAX_ABS_VALUE = 1e15  # no figure we publish comes near this (1e15 ns is eleven days)


class ResultsError(InputError):
    """A results file that cannot be trusted; the message names the file and line."""


@dataclass
class Row:
    """One figure. ``source`` names the instrument; ``how`` says in a few words how it was measured.

    ``value`` is NaN unless ``status == "ok"``; a figure that was not measured is never a number. The
    structured columns say what the figure summarises, for tools to read (never parsed out of ``how``):
    ``reps`` repetitions (or calls) it is the median of, ``steps`` decode steps it covers, ``step_rate`` the
    steps per second a rate-based figure assumes, ``seqs`` the sequences (table rows) it covers, and
    ``ci_low``/``ci_high`` its 95 % interval where one was computed, ``driver`` the loop that issued the timed
    calls (:data:`DRIVERS`: a Python loop, a compiled Numba loop calling the kernels, a C++ loop); None (or
    "" for ``driver``) where it does not apply.
    """

    scenario: str
    impl: str
    regime: str
    metric: str
    value: float
    unit: str
    source: str
    status: str = "ok"
    how: str = ""
    reps: int | None = None
    steps: int | None = None
    step_rate: float | None = None
    seqs: int | None = None
    ci_low: float | None = None
    ci_high: float | None = None
    driver: str = ""

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"status {self.status!r} not in {STATUSES}")
        if self.driver and self.driver not in DRIVERS:
            raise ValueError(f"{self.metric}: driver {self.driver!r} not in {DRIVERS}")
        if self.status != "ok":
            self.value = math.nan
        else:
            self.value = _checked(self.metric, self.value)
        for name in ("ci_low", "ci_high", "step_rate"):
            if getattr(self, name) is not None:
                setattr(self, name, _checked(self.metric, getattr(self, name), what=name))
        for name in ("reps", "steps", "seqs"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or int(value) != value or value < 0):
                raise ValueError(f"{self.metric}: {name} must be a non-negative integer, got {value!r}")
            if value is not None:
                setattr(self, name, int(value))


def _checked(metric: str, value: object, what: str = "value") -> float:
    """``value`` as a float, if it is a finite, plausible figure for ``metric``."""
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise ValueError(f"{metric}: {what} {value!r} is not a number") from None
    if not math.isfinite(number):
        raise ValueError(f"{metric}: an ok row needs a finite {what}, got {value!r}")
    if abs(number) > MAX_ABS_VALUE:
        raise ValueError(f"{metric}: {what} {number:g} is beyond any plausible figure (|x| <= {MAX_ABS_VALUE:g})")
    if number < 0 and metric not in SIGNED_METRICS:
        raise ValueError(f"{metric}: {what} {number:g} is negative")
    return number


COLUMNS = [f.name for f in fields(Row)]
# Older schemas still read, with the later columns empty: 1 (before the structured columns), 2 (before driver).
COLUMNS_V1 = COLUMNS[:9]
COLUMNS_V2 = COLUMNS[:15]
_INTS = ("reps", "steps", "seqs")
_FLOATS = ("step_rate", "ci_low", "ci_high")


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` atomically (:mod:`scenarios.atomic`, the one implementation)."""
    atomic_write_bytes(path, text.encode())


def write_rows(path: Path, rows: Iterable[Row]) -> None:
    """Write ``rows`` as the tidy CSV (schema :data:`SCHEMA_VERSION`), atomically."""
    buf = io.StringIO(newline="")
    writer = csv.DictWriter(buf, fieldnames=COLUMNS)
    writer.writeheader()
    for row in rows:
        rec = {k: ("" if v is None else v) for k, v in asdict(row).items()}
        rec["value"] = "" if math.isnan(row.value) else repr(row.value)
        writer.writerow(rec)
    atomic_write_text(path, buf.getvalue())


def _number(text: str, name: str, kind: type) -> float | int | None:
    if not text:
        return None
    try:
        return kind(text)
    except ValueError:
        raise ValueError(f"{name} {text!r} is not {'an integer' if kind is int else 'a number'}") from None


def _parse(rec: dict[str, str]) -> Row:
    values: dict[str, object] = dict(rec)
    value = _number(rec["value"], "value", float)
    values["value"] = math.nan if value is None else value
    for name in _INTS:
        values[name] = _number(rec.get(name) or "", name, int)
    for name in _FLOATS:
        values[name] = _number(rec.get(name) or "", name, float)
    return Row(**values)  # type: ignore[arg-type]


def read_rows(path: Path) -> list[Row]:
    """Read a tidy CSV back into rows, refusing anything that could not have been written by :func:`write_rows`.

    Errors name ``file:line`` and what is wrong: an unknown header, a short or long line, a non-numeric or
    implausible value, an unknown status, a figure given twice.
    """
    try:
        with open(path, newline="", encoding="utf-8") as fh:
            reader = csv.reader(fh)
            header = next(reader, None)
            if header not in (COLUMNS, COLUMNS_V2, COLUMNS_V1):
                raise ResultsError(f"{path}:1: not a kvblock-bench results header (schema {SCHEMA_VERSION} has "
                                   f"columns {','.join(COLUMNS)}); was the file written by another tool?")
            return _read_records(path, reader, header)
    except UnicodeDecodeError as exc:
        raise ResultsError(f"{path}: not UTF-8 text ({exc.reason}); results files are written as UTF-8") from None


def _read_records(path: Path, reader, header: list[str]) -> list[Row]:
    rows: list[Row] = []
    seen: dict[tuple[str, ...], int] = {}
    for record in reader:
        line = reader.line_num
        if not record:
            continue
        if len(record) != len(header):
            raise ResultsError(f"{path}:{line}: {len(record)} fields, the header has {len(header)}")
        try:
            row = _parse(dict(zip(header, record, strict=True)))
        except ValueError as exc:
            raise ResultsError(f"{path}:{line}: {exc}") from None
        key = (row.scenario, row.impl, row.regime, row.metric, row.source)
        if key in seen:
            raise ResultsError(f"{path}:{line}: the same figure as line {seen[key]} ({', '.join(key)})")
        seen[key] = line
        rows.append(row)
    return rows


def new_run_dir(root: Path = RESULTS_DIR, label: str = "") -> Path:
    """Create ``root/<timestamp>[-label][-N]``, never reusing an existing name."""
    root.mkdir(parents=True, exist_ok=True)
    stem = time.strftime("%Y%m%d-%H%M%S")
    if label:
        stem += "-" + re.sub(r"[^A-Za-z0-9_.-]+", "-", label)
    for n in range(1000):
        path = root / (stem if n == 0 else f"{stem}-{n}")
        try:
            path.mkdir()
            return path
        except FileExistsError:
            continue
    raise RuntimeError(f"could not create a fresh run directory under {root}")


def point_latest(run_dir: Path) -> None:
    """Make ``<root>/latest`` a symbolic link to ``run_dir``, replacing the old link atomically."""
    link = run_dir.parent / "latest"
    tmp = run_dir.parent / f".latest.{os.getpid()}"
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    tmp.symlink_to(run_dir.name)
    os.replace(tmp, link)


def resolve_run(run: str | os.PathLike | None, root: Path = RESULTS_DIR) -> Path:
    """A run directory from a path, a run id under ``root``, or None for ``root/latest``."""
    if run is None:
        path = root / "latest"
    else:
        path = Path(run)
        if not path.exists() and (root / path).exists():
            path = root / path
    if not (path / "results.csv").is_file():
        raise FileNotFoundError(f"{path}: not a run directory (no results.csv); run `kvblock-bench run` first")
    return path.resolve()


def write_json(path: Path, obj: object, compress: bool = False) -> None:
    """JSON (optionally gzip-compressed), atomically."""
    data = json.dumps(obj, indent=None if compress else 2, sort_keys=True, default=str).encode()
    atomic_write_bytes(path, gzip.compress(data, mtime=0) if compress else data)


def read_json(path: Path) -> object:
    data = path.read_bytes()
    return json.loads(gzip.decompress(data) if path.suffix == ".gz" else data)


def ratio_metric(metric: str, base: str = RATIO_BASE, batched_base: bool = False) -> str:
    """The name of the ratio row of ``metric`` against ``base`` (same regime, or ``base`` batched)."""
    return f"{metric}_vs_{base.replace('-', '_')}" + ("_batched" if batched_base else "")
