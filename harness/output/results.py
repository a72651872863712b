"""Run directories and tidy results.
Design: docs/output.md#harnessoutputresultspy."""

from __future__ import annotations

import contextlib
import csv
import errno
import gzip
import io
import json
import math
import os
import re
import time
import unicodedata
from collections.abc import Iterable
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from harness.errors import InputError, WriteError
from impls.registry import RATIO_BASE
from scenarios import atomic
from scenarios.files import read_once

RESULTS_DIR = Path("results")
STATUSES = ("ok", "unsupported", "unavailable", "skipped", "failed")
SCHEMA_VERSION = 3
DRIVERS = ("python", "compiled", "native")
# Figures that may be negative: allocations under a floor, differences of medians, paced minus idle time.
SIGNED_METRICS = frozenset({"allocs_per_step", "nrt_allocs_per_step", "allocs_above_floor_per_step",
                            "aa_ratio_log", "cache_insert_ns",
                            "cache_evict_ns", "cpu_share_observed_pct", "cpu_share_observed_whole_step_pct",
                            "paced_floor_pct", "paced_above_floor_pct"})
MAX_ABS_VALUE = 1e15


MAX_TEXT_CHARS = 2000
MAX_READ_FIELD_BYTES = 1 << 24
MAX_LABEL_CHARS = 64
LABEL_CHARS = re.compile(r"[A-Za-z0-9_.-]+")
_TEXT_FIELDS = ("scenario", "impl", "regime", "metric", "unit", "source", "status", "how", "driver")


class ResultsError(InputError):
    """A results file that cannot be trusted; the message names the file and line."""


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

    def __post_init__(self) -> None:
        for name in _TEXT_FIELDS:
            setattr(self, name, clean_text(getattr(self, name)))
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
# Older schemas still read, with the later columns empty: 1 (before the structured columns), 2 (before driver).
COLUMNS_V1 = COLUMNS[:9]
COLUMNS_V2 = COLUMNS[:15]
_INTS = ("reps", "steps", "seqs")
_FLOATS = ("step_rate", "ci_low", "ci_high")


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically; a failure raises :class:`WriteError` and leaves the file as it was."""
    try:
        atomic.atomic_write_bytes(path, data)
    except OSError as exc:
        raise WriteError(f"{path}: cannot write it ({os_reason(exc)})") from None


def os_reason(exc: OSError) -> str:
    """An ``OSError``'s reason in a few words (its ``strerror``, else its text)."""
    return exc.strerror or " ".join(str(exc).split()) or type(exc).__name__


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` atomically; a failure raises :class:`WriteError`."""
    atomic_write_bytes(path, text.encode())


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
            if header not in (COLUMNS, COLUMNS_V2, COLUMNS_V1):
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
        key = (row.scenario, row.impl, row.regime, row.metric, row.source)
        if key in seen:
            raise ResultsError(f"{path}:{line}: the same figure as line {seen[key]} ({', '.join(key)})")
        seen[key] = line
        rows.append(row)
    return rows


RUN_SUFFIXES = 1000  # run folders of one second and label: <stem>, <stem>-1, ... <stem>-999


def check_label(label: str) -> str:
    """``label`` if it can end a run folder's name: at most :data:`MAX_LABEL_CHARS` of ``A-Z a-z 0-9 _ . -``."""
    if not label or (len(label) <= MAX_LABEL_CHARS and LABEL_CHARS.fullmatch(label)):
        return label
    shown = label if len(label) <= 40 else label[:37] + "..."
    bad = sorted(set(LABEL_CHARS.sub("", label)))
    what = f"{len(label)} characters" if len(label) > MAX_LABEL_CHARS else f"has {''.join(bad)!r}"
    raise InputError(f"--label {shown!r}: {what}; a label is 1 to {MAX_LABEL_CHARS} characters of A-Z a-z 0-9 _ . - "
                     "(it ends the run folder's name)")


def _stem(label: str) -> str:
    return time.strftime("%Y%m%d-%H%M%S") + (f"-{check_label(label)}" if label else "")


def new_run_dir(root: Path = RESULTS_DIR, label: str = "") -> Path:
    """Create ``root/<timestamp>[-label][-N]``, never reusing an existing name; :class:`WriteError` if it cannot."""
    stem = _stem(label)
    try:
        root.mkdir(parents=True, exist_ok=True)
        for n in range(RUN_SUFFIXES):
            path = root / (stem if n == 0 else f"{stem}-{n}")
            try:
                path.mkdir()
                return path
            except FileExistsError:
                continue
    except OSError as exc:
        raise WriteError(f"{root}: cannot create a run folder in it ({os_reason(exc)})") from None
    raise WriteError(f"{root}: {RUN_SUFFIXES} run folders named {stem}[-N] exist already; try again in a second")


def check_run_root(root: Path, label: str = "") -> None:
    """Check before measuring that ``root`` takes this run's folder and link; :class:`InputError` naming the fix."""
    probe_name = f".{_stem(label)}-{RUN_SUFFIXES - 1}.probe"
    try:
        os.fsdecode(root).encode("utf-8")
    except UnicodeEncodeError:
        raise InputError(f"--results {os.fsdecode(root)!r}: the folder's name is not UTF-8; rename it or give "
                         "another folder") from None
    latest = root / "latest"
    if latest.exists() and not latest.is_symlink():
        raise InputError(f"{latest}: is a real {'folder' if latest.is_dir() else 'file'}, not the link to the newest "
                         "run that kvblock-bench keeps there; move it away (or give another --results folder)")
    try:
        root.mkdir(parents=True, exist_ok=True)
        (root / probe_name).mkdir()
        (root / probe_name).rmdir()
    except OSError as exc:
        raise WriteError(f"{root}: cannot create a run folder in it ({os_reason(exc)}); give a --results folder "
                         "you can write" + (" or a shorter --label" if exc.errno == errno.ENAMETOOLONG else "")
                         ) from None
    _remove_stale_latest_links(root)


def _remove_stale_latest_links(root: Path) -> None:
    for tmp in root.glob(".latest.*"):
        pid = tmp.name.split(".")[2]
        if tmp.is_symlink() and pid.isdigit() and not _alive(int(pid)):
            with contextlib.suppress(OSError):
                tmp.unlink()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True


def point_latest(run_dir: Path) -> None:
    """Point ``<root>/latest`` at ``run_dir`` atomically; a real file or folder named ``latest`` is never replaced."""
    link = run_dir.parent / "latest"
    if link.exists() and not link.is_symlink():
        raise WriteError(f"{link}: is a real {'folder' if link.is_dir() else 'file'}, not the link to the newest "
                         f"run; not replaced (the run is in {run_dir})")
    for n in range(100):
        tmp = run_dir.parent / f".latest.{os.getpid()}.{n}"
        try:
            tmp.symlink_to(run_dir.name)
            break
        except FileExistsError:
            continue
        except OSError as exc:
            raise WriteError(f"{link}: cannot point it to {run_dir.name} ({os_reason(exc)})") from None
    else:
        raise WriteError(f"{link}: cannot make a temporary link beside it (100 .latest.{os.getpid()}.N exist)")
    try:
        os.replace(tmp, link)
    except OSError as exc:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise WriteError(f"{link}: cannot point it to {run_dir.name} ({os_reason(exc)})") from None


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
    """JSON (optionally gzip-compressed), atomically; :class:`WriteError` if it cannot be written."""
    data = json.dumps(obj, indent=None if compress else 2, sort_keys=True, default=str).encode()
    atomic_write_bytes(path, gzip.compress(data, mtime=0) if compress else data)


def read_json(path: Path) -> object:
    """A JSON file (gzip if its name ends in ``.gz``); :class:`ResultsError` naming the file if it cannot be read."""
    try:
        with read_once(path) as fh:
            data = fh.read()
        return json.loads(gzip.decompress(data) if path.suffix == ".gz" else data)
    except RecursionError:
        raise ResultsError(f"{path}: JSON nested too deep to read; not a file kvblock-bench wrote") from None
    except OSError as exc:  # gzip.BadGzipFile is one too
        raise ResultsError(f"{path}: cannot read it ({os_reason(exc)})") from None
    except (ValueError, EOFError) as exc:  # JSONDecodeError, UnicodeDecodeError, zlib's errors are ValueErrors
        raise ResultsError(f"{path}: not valid JSON ({' '.join(str(exc).split())})") from None


def ratio_metric(metric: str, base: str = RATIO_BASE, batched_base: bool = False) -> str:
    """The name of the ratio row of ``metric`` against ``base`` (same regime, or ``base`` batched)."""
    return f"{metric}_vs_{base.replace('-', '_')}" + ("_batched" if batched_base else "")
