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
import tempfile
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, fields
from pathlib import Path

RESULTS_DIR = Path("results")
STATUSES = ("ok", "unsupported", "unavailable", "skipped", "failed")


@dataclass
class Row:
    """One figure. ``source`` names the instrument; ``how`` says in a few words how it was measured.

    ``value`` is NaN unless ``status == "ok"``; a figure that was not measured is never a number.
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

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"status {self.status!r} not in {STATUSES}")
        if self.status != "ok":
            self.value = math.nan
        elif self.value is None or not math.isfinite(float(self.value)):
            raise ValueError(f"{self.metric}: an ok row needs a finite value, got {self.value!r}")
        self.value = float(self.value)


COLUMNS = [f.name for f in fields(Row)]


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file in the same folder, renamed into place."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, 0o666 & ~_umask())  # mkstemp makes owner-only files; keep the usual permissions
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode())


def write_rows(path: Path, rows: Iterable[Row]) -> None:
    """Write ``rows`` as the tidy CSV, atomically."""
    buf = io.StringIO(newline="")
    writer = csv.DictWriter(buf, fieldnames=COLUMNS)
    writer.writeheader()
    for row in rows:
        writer.writerow({**asdict(row), "value": "" if math.isnan(row.value) else repr(row.value)})
    atomic_write_text(path, buf.getvalue())


def read_rows(path: Path) -> list[Row]:
    """Read a tidy CSV back into rows."""
    with open(path, newline="") as fh:
        return [
            Row(**{**rec, "value": float(rec["value"]) if rec["value"] else math.nan})
            for rec in csv.DictReader(fh)
        ]


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
