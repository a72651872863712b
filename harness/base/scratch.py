"""A command's own temporary folder (its children's too), removed however the command ends."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

PREFIX = "kvblock-bench-"


@contextmanager
def scratch_folder() -> Iterator[Path]:
    """A fresh folder as ``TMPDIR`` (and :mod:`tempfile`'s) within the block; removed on exit."""
    folder = tempfile.mkdtemp(prefix=PREFIX)
    before_env, before_tempdir = os.environ.get("TMPDIR"), tempfile.tempdir
    os.environ["TMPDIR"], tempfile.tempdir = folder, folder
    try:
        yield Path(folder)
    finally:
        tempfile.tempdir = before_tempdir
        if before_env is None:
            os.environ.pop("TMPDIR", None)
        else:
            os.environ["TMPDIR"] = before_env
        shutil.rmtree(folder, ignore_errors=True)
