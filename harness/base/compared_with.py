"""What a run's report compares against, copied into the run's folder when it runs (docs/results-folder.md)."""

from __future__ import annotations

from pathlib import Path

from harness.base.files import atomic_write_bytes
from harness.base.project import CALIBRATION_CSV, PAPER_TABLE_CSV

FOLDER = "compared_with"
PAPER_TABLE = "paper_table.csv"
CALIBRATION = "calibration.csv"
SOURCES = {PAPER_TABLE: PAPER_TABLE_CSV, CALIBRATION: CALIBRATION_CSV}


def record(run_dir: Path) -> list[str]:
    """Copy each source that exists into ``run_dir/compared_with/``; the names copied."""
    folder = run_dir / FOLDER
    copied = []
    for name, source in SOURCES.items():
        if source.is_file():
            folder.mkdir(exist_ok=True)
            atomic_write_bytes(folder / name, source.read_bytes())
            copied.append(name)
    return copied


def copy_of(run_dir: Path | None, name: str) -> Path | None:
    """The run's own copy of ``name``; None where it kept none."""
    path = None if run_dir is None else run_dir / FOLDER / name
    return path if path is not None and path.is_file() else None
