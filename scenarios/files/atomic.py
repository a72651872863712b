"""Atomic file writes, the one implementation: trace files and every result file of the harness.

A file is written to a temporary name in its own folder, flushed to disk, then renamed over the target, so a
reader sees the old file or the new one, never half of one, and an interrupted or failed write (disk full, a
read-only folder) leaves the old file and no temporary behind. Only a regular file is ever replaced: a symbolic
link is followed (its target is written, the link stays) and a device node, FIFO, socket or folder is refused
(:mod:`scenarios.files.kinds` states the rule).
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from .kinds import refuse_non_regular, write_target

TEMP_PREFIX_CHARS = 100  # of the target's name in the temporary's: a long (valid) name must not overflow NAME_MAX


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def atomic_write(path: str | os.PathLike, write: Callable[[BinaryIO], object]) -> Path:
    """Call ``write(fh)`` on a temporary file beside ``path`` (beside a symbolic link's target), fsync it, rename
    it into place; returns ``path``. Raises :class:`scenarios.files.kinds.NotRegularFileError` (an ``OSError``) before
    anything is written when the target is not a regular file, and the ``OSError`` of a failed write."""
    path = Path(path)
    target = write_target(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name[:TEMP_PREFIX_CHARS]}.", suffix=".tmp")
    try:
        os.fchmod(fd, 0o666 & ~_umask())  # mkstemp makes owner-only files; keep the usual permissions
        with os.fdopen(fd, "wb") as fh:
            write(fh)
            fh.flush()
            os.fsync(fh.fileno())
        refuse_non_regular(target, "refusing to replace it")  # again: something may have appeared meanwhile
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):  # gone already, or the folder turned read-only: the write's error counts
            os.unlink(tmp)
        raise
    return path


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically."""
    return atomic_write(path, lambda fh: fh.write(data))
