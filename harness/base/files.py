"""Run folders and atomic writes: ``results/<run-id>/``, ``results/latest``; layout in docs/results-folder.md."""

from __future__ import annotations

import contextlib
import errno
import gzip
import json
import os
import re
import time
from pathlib import Path

from harness.errors import InputError, WriteError
from scenarios.files import atomic
from scenarios.files.kinds import read_once, unwritable

RESULTS_DIR = Path("results")
MAX_LABEL_CHARS = 64
LABEL_CHARS = re.compile(r"[A-Za-z0-9_.-]+")
PAIRED_FILE = "ab.json"  # in the NEW run folder of `kvblock-bench ab`: NEW/BASE of every figure, paired


class ResultsError(InputError):
    """A results file that cannot be trusted; the message names the file and line."""


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


RUN_SUFFIXES = 1000  # run folders of one second and label: <stem>, <stem>-1, ... <stem>-999


def check_output_file(path: Path, flag: str) -> Path:
    """``path`` if a file can be written there (checked before any work), else :class:`InputError` naming ``flag``."""
    why = unwritable(path)
    if why:
        raise InputError(f"{flag} {path}: {why}; give a path where a file can be written")
    return Path(path)


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


def check_creatable(path: Path) -> Path:
    """The nearest existing ancestor of ``path``; :class:`OSError` unless it is a writable folder (nothing made)."""
    parent = path.absolute()
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise NotADirectoryError(errno.ENOTDIR, "a file stands where a folder is needed", str(parent))
    if not os.access(parent, os.W_OK | os.X_OK):
        raise PermissionError(errno.EACCES, "not writable", str(parent))
    return parent


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
        where = root if root.is_dir() else check_creatable(root)  # root is made when the run writes its folder
        (where / probe_name).mkdir()
        (where / probe_name).rmdir()
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
    except OSError:  # it exists, owned by someone else
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
