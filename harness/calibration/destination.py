"""Where a calibration writes: a new folder ``RESULTS/<timestamp>-calibration-ENGINE/``, or a table when asked."""

from __future__ import annotations

import csv
import os
from dataclasses import dataclass
from pathlib import Path

from harness.base.files import RUN_SUFFIXES, check_label, new_run_dir, os_reason
from harness.calibration.table import read_rows
from harness.errors import InputError, WriteError
from scenarios.files.kinds import write_target


@dataclass
class Destination:
    """``table`` given: merge into it; else a folder made in ``root`` on the first write (named by ``label``)."""

    table: Path | None
    root: Path = Path("results")
    label: str = "calibration"
    flag: str = "--out"
    folder: Path | None = None

    def check(self) -> None:
        """Before measuring: the table or ``root`` can be written; :class:`InputError` naming the flag and fix."""
        if self.table is None:
            _creatable(self.root, f".{check_label(self.label)}-{RUN_SUFFIXES - 1}.probe", "--results")
            return
        flag = self.flag
        if self.table.exists() and not self.table.is_file():
            raise InputError(f"{flag} {self.table}: not a file; give the calibration table (a .csv file) to merge into")
        try:
            target = write_target(self.table)
        except OSError as exc:
            raise InputError(f"{flag} {self.table}: {os_reason(exc)}; give the calibration table (a .csv file) to "
                             "merge into, or a new path") from None
        try:
            read_rows(target)
        except (OSError, UnicodeDecodeError, csv.Error) as exc:
            raise InputError(f"{flag} {self.table}: cannot be read ({exc}); give a calibration table") from None
        runs = self.table.parent / "runs"
        if runs.exists() and not runs.is_dir():
            raise InputError(f"{flag} {self.table}: {runs} is a file; the per-repetition files go in a folder there")
        _creatable(self.table.parent, f".{self.table.name}.probe", flag)
        _creatable(target.parent, f".{target.name}.probe", flag)
        if target.exists() and not os.access(target, os.W_OK):
            raise WriteError(f"{flag} {self.table}: not writable; give a table you can write")

    def where(self) -> Path:
        """The folder written to (made now for the default)."""
        if self.table is not None:
            return self.table.parent
        if self.folder is None:
            self.folder = new_run_dir(self.root, self.label)
        return self.folder

    def csv(self) -> Path:
        return self.table if self.table is not None else self.where() / "calibration.csv"

    def runs(self) -> Path:
        return self.where() / "runs"


def _creatable(folder: Path, probe: str, flag: str) -> None:
    """``folder`` (made if missing) takes a new entry named ``probe``; :class:`WriteError` otherwise."""
    if folder.exists() and not folder.is_dir():
        raise InputError(f"{flag} {folder}: is a file, not a folder; give a folder you can write")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        (folder / probe).mkdir()
        (folder / probe).rmdir()
    except OSError as exc:
        raise WriteError(f"{flag} {folder}: cannot write there ({os_reason(exc)}); give a folder you can write") \
            from None
    if not os.access(folder, os.W_OK | os.X_OK):
        raise WriteError(f"{flag} {folder}: not writable; give a folder you can write")
