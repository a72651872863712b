"""What a path names, and the rules for files that are not regular files.

- A write replaces only a regular file (or creates one): a path that names a device node, a FIFO, a socket or a
  folder is refused (:class:`NotRegularFileError`), never turned into a regular file. A symbolic link is
  followed: its final target is what is written (atomically, beside the target), and the link stays.
- A read of a regular file may open it as often as it needs; a FIFO (a named pipe, or a pipe such as
  ``<(zcat requests.csv.gz)``) is read once, as a stream, into a seekable spool (:func:`read_once`); any other
  kind (device node, socket) is refused. A FIFO that no process writes to is refused at once, not waited on.
"""

from __future__ import annotations

import errno
import os
import stat
import tempfile
from pathlib import Path
from typing import BinaryIO

KINDS = ((stat.S_ISREG, "regular file"), (stat.S_ISDIR, "folder"), (stat.S_ISFIFO, "FIFO (named pipe)"),
         (stat.S_ISCHR, "character device"), (stat.S_ISBLK, "block device"), (stat.S_ISSOCK, "socket"))
MAX_STREAM_BYTES = 1 << 30  # what a FIFO may deliver before it is refused (an endless writer must not fill /tmp)
SPOOL_IN_MEMORY = 1 << 26  # a stream's first 64 MiB are kept in memory, the rest in a temporary file


class NotRegularFileError(OSError):
    """A write (or read) refused because the path names a device node, FIFO, socket or folder; ``strerror``
    says which, ``filename`` is the path."""


def kind_of(path: str | os.PathLike) -> str | None:
    """What ``path`` names after following symbolic links ("regular file", "folder", "FIFO (named pipe)",
    "character device", ...), or None when nothing is there (a dangling link included)."""
    try:
        mode = os.stat(path).st_mode
    except (FileNotFoundError, NotADirectoryError):
        return None
    return next((name for test, name in KINDS if test(mode)), "special file")


def write_target(path: str | os.PathLike) -> Path:
    """The file a write to ``path`` replaces: ``path`` itself, or the final target of a symbolic link.

    Raises :class:`NotRegularFileError` when that target exists and is not a regular file, and an ``ELOOP``
    ``OSError`` for a link that never ends in a file (a loop).
    """
    path = Path(path)
    target = Path(os.path.realpath(path)) if path.is_symlink() else path
    if target.is_symlink():  # realpath stops at a loop and returns a link
        raise OSError(errno.ELOOP, "a loop of symbolic links", str(path))
    refuse_non_regular(target, "refusing to replace it")
    return target


def unwritable(path: str | os.PathLike) -> str:
    """Why no file can be written at ``path``, in words ("" when one can): a folder, a special file, a parent that
    is no folder, a folder that takes no new file. Checked before any work, with a probe file where it will go."""
    path = Path(path)
    if path.is_dir():
        return "is a folder"
    try:
        target = write_target(path)
    except OSError as exc:
        return exc.strerror or str(exc)
    folder = next(p for p in (target.parent, *target.parent.parents) if p.exists())
    if not folder.is_dir():
        return f"{folder} is not a folder"
    if folder != target.parent:
        return "" if os.access(folder, os.W_OK | os.X_OK) else f"cannot create folders in {folder} (permission denied)"
    try:
        fd, probe = tempfile.mkstemp(dir=folder, prefix=".kvblock-bench.", suffix=".probe")
    except OSError as exc:
        return f"cannot write to {folder} ({exc.strerror})"
    os.close(fd)
    os.unlink(probe)
    return ""


def refuse_non_regular(path: str | os.PathLike, consequence: str) -> None:
    """Raise :class:`NotRegularFileError` if ``path`` exists and is not a regular file."""
    kind = kind_of(path)
    if kind not in (None, "regular file"):
        raise NotRegularFileError(errno.EEXIST, f"is a {kind}, not a regular file; {consequence}", str(path))


def read_once(path: str | os.PathLike) -> BinaryIO:
    """``path`` opened for reading, seekable: a regular file as itself, a FIFO's whole stream read once into a
    spool. Device nodes and sockets raise :class:`NotRegularFileError`, and so do a FIFO with no writer and one
    that delivers more than :data:`MAX_STREAM_BYTES` (naming the fix); a folder ``IsADirectoryError``, a missing
    path ``FileNotFoundError``."""
    mode = os.stat(path).st_mode  # a missing path, or a file where a folder should be, raises here
    if stat.S_ISREG(mode):
        return open(path, "rb")
    if stat.S_ISDIR(mode):
        raise IsADirectoryError(errno.EISDIR, "is a folder", str(path))
    kind = next((name for test, name in KINDS if test(mode)), "special file")
    if kind != "FIFO (named pipe)":
        raise NotRegularFileError(errno.EINVAL, f"is a {kind}, not a file; give a regular file (a named pipe is "
                                                "read once)", str(path))
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # opening a FIFO without a writer would wait for ever
    try:
        return _spool(path, fd)
    finally:
        os.close(fd)


def _spool(path: str | os.PathLike, fd: int) -> BinaryIO:
    try:
        first = os.read(fd, 1 << 16)
    except BlockingIOError:  # a writer has it open and has not written yet: wait for it
        first = None
    if first == b"":
        raise NotRegularFileError(errno.EPIPE, "is a named pipe with no writer (nothing to read); start the "
                                               "program that writes into it first, or give a file", str(path))
    os.set_blocking(fd, True)
    spool = tempfile.SpooledTemporaryFile(max_size=SPOOL_IN_MEMORY)  # noqa: SIM115  (returned to the caller)
    size = 0
    chunk = first if first is not None else os.read(fd, 1 << 16)
    while chunk:
        size += len(chunk)
        if size > MAX_STREAM_BYTES:
            spool.close()
            raise NotRegularFileError(errno.EFBIG, f"the named pipe delivered more than {MAX_STREAM_BYTES >> 20} "
                                                   "MiB; save the data to a file and give that", str(path))
        spool.write(chunk)
        chunk = os.read(fd, 1 << 20)
    spool.seek(0)
    return spool  # type: ignore[return-value]
