"""Run directories and tidy results.
Design: docs/output.md#harnessbaserowspy."""

from __future__ import annotations

import csv
import io
import math
import unicodedata
from collections.abc import Iterable
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from harness.base.files import ResultsError, atomic_write_text, os_reason
from impls.registry import RATIO_BASE
from scenarios.files.kinds import read_once

STATUSES = ("ok", "unsupported", "unavailable", "skipped", "failed")
SCHEMA_VERSION = 4
DRIVERS = ("python", "compiled", "native")
# Figures that may be negative: allocations under a floor, differences of medians, paced minus idle time.
SIGNED_METRICS = frozenset({"allocs_per_step", "nrt_allocs_per_step", "allocs_above_floor_per_step",
                            "aa_ratio_log", "cache_insert_ns",
                            "cache_evict_ns", "cpu_share_observed_pct", "cpu_share_observed_whole_step_pct",
                            "paced_floor_pct", "paced_above_floor_pct", "paced_step_over_kernel_pct"})
MAX_ABS_VALUE = 1e15


MAX_TEXT_CHARS = 2000
MAX_READ_FIELD_BYTES = 1 << 24
_TEXT_FIELDS = ("scenario", "impl", "regime", "metric", "unit", "source", "status", "how", "driver", "conformance")
CONFORMANCE = ("", "conforms", "fails")


@dataclass
class Row:
    """One figure. ``source`` names the instrument; ``how`` says in a few words how it was measured."""

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
    conformance: str = ""

    def __post_init__(self) -> None:
        for name in _TEXT_FIELDS:
            setattr(self, name, clean_text(getattr(self, name)))
        if self.status not in STATUSES:
            raise ValueError(f"status {self.status!r} not in {STATUSES}")
        for name, allowed in (("driver", ("", *DRIVERS)), ("conformance", CONFORMANCE)):
            if getattr(self, name) not in allowed:
                raise ValueError(f"{self.metric}: {name} {getattr(self, name)!r} not in {allowed}")
        if self.status != "ok":
            self.value = math.nan
        else:
            self.value = _checked(self.metric, self.value)
        for name in ("ci_low", "ci_high", "step_rate"):
            if getattr(self, name) is not None:
                setattr(self, name, _checked(self.metric, getattr(self, name), what=name))
        for name in ("reps", "steps", "seqs"):
            setattr(self, name, _count(self.metric, name, getattr(self, name)))


def _count(metric: str, name: str, value: object) -> int | None:
    """A count column's ``value`` (a whole number, 0 or more) as an int; None stays None."""
    if value is not None and (isinstance(value, bool) or int(value) != value or value < 0):
        raise ValueError(f"{metric}: {name} must be a non-negative integer, got {value!r}")
    return None if value is None else int(value)


def clean_text(text: object) -> object:
    """``text`` as one printable line of at most :data:`MAX_TEXT_CHARS` characters; non-strings returned as is."""
    if not isinstance(text, str):
        return text
    if not text.isprintable():
        text = "".join(_printable(c) for c in text)
    if len(text) > MAX_TEXT_CHARS:
        keep = MAX_TEXT_CHARS - 40
        text = f"{text[:keep]} [... {len(text) - keep} characters cut]"
    return text


def _printable(char: str) -> str:
    if char.isprintable():
        return char
    category = unicodedata.category(char)
    return "\ufffd" if category == "Cs" else " " if category in ("Cc", "Zl", "Zp") else char


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
# Older schemas still read, their later columns empty: 1, 2 (before driver), 3 (before conformance).
COLUMNS_V1 = COLUMNS[:9]
COLUMNS_V2 = COLUMNS[:15]
COLUMNS_V3 = COLUMNS[:16]
_INTS = ("reps", "steps", "seqs")
_FLOATS = ("step_rate", "ci_low", "ci_high")


def write_rows(path: Path, rows: Iterable[Row]) -> None:
    """Write ``rows`` as the tidy CSV (schema :data:`SCHEMA_VERSION`), atomically, text fields cleaned again."""
    buf = io.StringIO(newline="")
    writer = csv.DictWriter(buf, fieldnames=COLUMNS)
    writer.writeheader()
    for row in rows:
        rec = {k: ("" if v is None else clean_text(v)) for k, v in asdict(row).items()}
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
    """Read a tidy CSV back into rows, refusing anything that could not have been written by :func:`write_rows`."""
    previous = csv.field_size_limit(MAX_READ_FIELD_BYTES)  # the module's default (128 KiB) is not ours
    reader = None
    try:
        with io.TextIOWrapper(read_once(path), encoding="utf-8-sig", newline="") as fh:
            reader = csv.reader(fh)
            header = next(reader, None)
            if header not in (COLUMNS, COLUMNS_V3, COLUMNS_V2, COLUMNS_V1):
                raise ResultsError(f"{path}:1: not a kvblock-bench results header (schema {SCHEMA_VERSION} has "
                                   f"columns {','.join(COLUMNS)}); was the file written by another tool?")
            return _read_records(path, reader, header)
    except UnicodeDecodeError as exc:
        raise ResultsError(f"{path}: not UTF-8 text ({exc.reason}); results files are written as UTF-8") from None
    except csv.Error as exc:
        line = reader.line_num if reader is not None else 1
        raise ResultsError(f"{path}:{line}: not a readable CSV line ({exc})") from None
    except OSError as exc:
        raise ResultsError(f"{path}: cannot read it ({os_reason(exc)})") from None
    finally:
        csv.field_size_limit(previous)


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
        if row.ci_low is not None and row.ci_high is not None and row.ci_low > row.ci_high:
            raise ResultsError(f"{path}:{line}: {row.metric}: its interval's low {row.ci_low:g} lies above its high "
                               f"{row.ci_high:g}; not a row kvblock-bench wrote")
        key = (row.scenario, row.impl, row.regime, row.metric, row.source)
        if key in seen:
            raise ResultsError(f"{path}:{line}: the same figure as line {seen[key]} ({', '.join(key)})")
        seen[key] = line
        rows.append(row)
    return rows


RATIO_METRICS = ("seq_step_ns", "lookup_ns", "alloc_free_ns")  # each against the base in the same regime


def ratio_metric(metric: str, base: str = RATIO_BASE, batched_base: bool = False) -> str:
    """The name of the ratio row of ``metric`` against ``base`` (same regime, or ``base`` batched)."""
    return f"{metric}_vs_{base.replace('-', '_')}" + ("_batched" if batched_base else "")
