"""An engine's published code: fetched with the user's pip into a cache outside the repository, or a source folder.
Design: docs/output.md#harnessenginesfetchpy."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

from harness.base import lifetime
from harness.base.project import ROOT as PROJECT_ROOT
from harness.errors import InputError

PIP_TIMEOUT_S = 1800
MANIFEST = ".sha256-files.json"


@dataclass(frozen=True)
class EngineCode:
    """Where an engine's code lies, and what identifies it in the results."""

    root: Path
    version: str
    digest: str  # "sha256:<wheel digest>" or "tree-sha256:<digest of the packages' .py files>"
    origin: str
    repaired: tuple[str, ...] = field(default=(), compare=False)
    wheels: tuple[Path, ...] = field(default=(), compare=False)


def default_cache() -> Path:
    if os.environ.get("KVBLOCK_BENCH_CACHE"):
        return Path(os.environ["KVBLOCK_BENCH_CACHE"]).expanduser()
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache").expanduser()
    return base / "kvblock-bench" / "engines"


def outside_repository(path: Path, flag: str) -> Path:
    """``path``, resolved, refused when it lies inside this checkout (engine code never enters it)."""
    path = path.expanduser().resolve()
    if path == PROJECT_ROOT or PROJECT_ROOT in path.parents:
        raise InputError(f"{flag} {path}: inside the kvblock-bench repository; engine code is never written or "
                         "kept there: give a folder outside it")
    return path


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def tree_digest(root: Path, packages: tuple[str, ...]) -> str:
    """SHA-256 over the relative paths and contents of every ``.py`` file of ``packages`` under ``root``."""
    h = hashlib.sha256()
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            h.update(path.relative_to(root).as_posix().encode() + b"\0")
            h.update(hashlib.sha256(path.read_bytes()).digest())
    return h.hexdigest()


def pip(verb: list[str], args: list[str], find_links: Path | None, timeout: float) -> subprocess.CompletedProcess:
    """``pip VERB... ARGS`` with this Python (from ``find_links`` only, when given); :class:`InputError` if it fails."""
    index = ["--no-index", "--find-links", str(find_links)] if find_links is not None else []
    cmd = [sys.executable, "-m", "pip", *verb, *index, "--disable-pip-version-check", *args]
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False,
                              preexec_fn=lifetime.tied_to_me())
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise InputError(f"pip {' '.join(verb)} {args[-1]} failed ({exc}); check pip and the network") from None


def pip_download(requirement: str, dest: Path, find_links: Path | None = None) -> Path:
    """The wheel pip downloads for ``requirement`` (no dependencies, no source builds) into ``dest``."""
    dest.mkdir(parents=True, exist_ok=True)
    before = {p.name for p in dest.glob("*.whl")}
    done = pip(["download"], ["--no-deps", "--only-binary=:all:", "-d", str(dest), requirement], find_links,
               PIP_TIMEOUT_S)
    if done.returncode != 0:
        tail = " ".join((done.stderr or done.stdout).strip().splitlines()[-2:])
        where = (f"no wheel of it in --find-links {find_links}" if find_links is not None else
                 f"is that version published? `{sys.executable} -m pip index versions {requirement.partition('=')[0]}`"
                 " lists them")
        raise InputError(f"pip download {requirement} failed: {tail} ({where})")
    return _downloaded(done.stdout, dest, requirement, before)


def _downloaded(stdout: str, dest: Path, requirement: str, before: set[str]) -> Path:
    """The wheel pip reported (``Saved`` or ``File was already downloaded``), else the one new in ``dest``."""
    for line in stdout.splitlines():
        m = re.search(r"(?:Saved|File was already downloaded)\s+(\S+\.whl)", line)
        if m:
            path = Path(m.group(1))
            return path if path.is_absolute() else dest / path.name
    new = sorted(p for p in dest.glob("*.whl") if p.name not in before)
    if len(new) == 1:
        return new[0]
    name, _, version = requirement.partition("==")
    prefix = f"{re.sub(r'[-_.]+', '_', name).lower()}-{version}" if version else None
    named = sorted(p for p in dest.glob("*.whl") if prefix and p.name.lower().startswith(prefix + "-"))
    if len(named) != 1:
        raise InputError(f"pip download {requirement}: cannot tell which wheel it fetched into {dest}")
    return named[0]


def wheel_version(wheel: Path) -> str:
    """The version field of a wheel's file name (``name-version-tags.whl``)."""
    parts = wheel.name.split("-")
    if len(parts) < 5:
        raise InputError(f"{wheel.name}: not a wheel file name (name-version-python-abi-platform.whl)")
    return parts[1]


def unpack(wheel: Path, packages: tuple[str, ...], cache: Path, binaries: tuple[str, ...] = (),
           companions: tuple[Path, ...] = ()) -> EngineCode:
    """The ``.py`` files of ``packages`` and the files under the path prefixes ``binaries`` (compiled libraries) from
    ``wheel`` and the ``companions`` it loads, unpacked into one folder of the cache, reused while intact."""
    wheels = (wheel, *companions)
    digests = [sha256_file(w) for w in wheels]
    root = cache / "+".join(w.name.removesuffix(".whl") for w in wheels)
    stamp = root / ".sha256"
    record = {k: v for w in wheels for k, v in wheel_record(w).items()}
    fresh = stamp.is_file() and stamp.read_text().strip() == " ".join(digests)
    changed = unpacked_changes(root, packages, record) if fresh else []
    if not fresh or changed:
        shutil.rmtree(root, ignore_errors=True)
        tmp = root.with_name(root.name + ".partial")
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            manifest = {}
            for w in wheels:
                manifest |= _extract(w, packages if w is wheel else (), tmp, record, binaries)
            (tmp / MANIFEST).write_text(json.dumps(manifest, indent=0, sort_keys=True) + "\n")
            (tmp / ".sha256").write_text(" ".join(digests) + "\n")
            tmp.rename(root)
        finally:  # an interrupted or refused unpack leaves no half-made folder in the cache
            shutil.rmtree(tmp, ignore_errors=True)
    return EngineCode(root, wheel_version(wheel), "+".join(f"sha256:{d}" for d in digests),
                      " + ".join(w.name for w in wheels), tuple(changed), wheels)


def _wanted(name: str, packages: tuple[str, ...], binaries: tuple[str, ...]) -> bool:
    return (name.endswith(".py") and name.split("/", 1)[0] in packages) or name.startswith(binaries)


def _extract(wheel: Path, packages: tuple[str, ...], dest: Path, record: dict[str, str],
             binaries: tuple[str, ...] = ()) -> dict[str, str]:
    """The ``.py`` files of ``packages`` and the files under ``binaries`` written under ``dest``, checked against
    ``record``; SHA-256 by path."""
    try:
        with zipfile.ZipFile(wheel) as zf:
            names = [n for n in zf.namelist() if not n.endswith("/") and _wanted(n, packages, binaries)]
            if not names or any(".." in n.split("/") for n in names):
                raise InputError(f"{wheel.name} holds no files of {', '.join(packages + binaries)} (or names outside "
                                 "them)")
            manifest = {}
            for name in names:
                data = zf.read(name)
                manifest[name] = hashlib.sha256(data).hexdigest()
                if record.get(name, manifest[name]) != manifest[name]:
                    raise InputError(f"{wheel}: {name} does not match the wheel's RECORD; delete the wheel and "
                                     "fetch it again")
                path = dest / name
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(data)
    except (zipfile.BadZipFile, KeyError) as exc:
        raise InputError(f"{wheel}: not a readable wheel ({exc}); delete it and fetch it again") from None
    return manifest


def wheel_record(wheel: Path) -> dict[str, str]:
    """The hex SHA-256 the wheel's ``*.dist-info/RECORD`` lists per file (files it lists without one: none)."""
    out = {}
    try:
        with zipfile.ZipFile(wheel) as zf:
            text = "".join(zf.read(n).decode("utf-8", "replace") + "\n" for n in zf.namelist()
                           if n.endswith(".dist-info/RECORD"))
    except (OSError, zipfile.BadZipFile) as exc:
        raise InputError(f"{wheel}: not a readable wheel ({exc}); delete it and fetch it again") from None
    for line in text.splitlines():
        path, _, rest = line.partition(",")
        algo, _, b64 = rest.partition(",")[0].partition("=")
        if algo == "sha256" and b64:
            out[path] = base64.urlsafe_b64decode(b64 + "=" * (-len(b64) % 4)).hex()
    return out


def unpacked_changes(root: Path, packages: tuple[str, ...], record: dict[str, str]) -> list[str]:
    """The files under ``root`` that differ from the wheel's ``record``, else from the manifest (all without one)."""
    try:
        manifest = json.loads((root / MANIFEST).read_text())
    except (OSError, ValueError):
        return [f"{MANIFEST} (missing or unreadable)"]
    if not isinstance(manifest, dict):
        return [f"{MANIFEST} (not a mapping)"]
    expected = {name: record.get(name, digest) for name, digest in manifest.items()}
    present = {p.relative_to(root).as_posix() for package in packages for p in (root / package).rglob("*.py")}
    changed = sorted(present - set(expected))
    for name, digest in expected.items():
        path = root / name
        if not path.is_file() or sha256_file(path) != digest:
            changed.append(name)
    return changed


def published(distribution: str, version: str | None, packages: tuple[str, ...], cache: Path,
              find_links: Path | None = None, binaries: tuple[str, ...] = (),
              companions: tuple[str, ...] = ()) -> EngineCode:
    """The published wheel of ``distribution`` (``version``, else the newest), fetched and unpacked; with
    ``companions`` (requirements of the other wheels its compiled code loads), theirs beside it."""
    requirement = f"{distribution}=={version}" if version else distribution
    wheel = pip_download(requirement, cache / "downloads", find_links)
    others = tuple(pip_download(r, cache / "downloads", find_links) for r in companions)
    return unpack(wheel, packages, cache, binaries, others)


def source_folder(folder: Path, packages: tuple[str, ...], version: str | None) -> EngineCode:
    """An engine's code from a folder holding its top-level packages (a checkout, an unpacked archive)."""
    root = outside_repository(folder, "--source")
    missing = [p for p in packages if not (root / p).is_dir()]
    if missing:
        raise InputError(f"--source {root}: no {missing[0]}/ package folder in it; give the folder that holds "
                         f"{', '.join(p + '/' for p in packages)} (the repository's top level)")
    commit = _folder_version(root)
    if version and commit != "unversioned" and not commit.startswith(version):
        raise InputError(f"--source {root}: the checkout is at commit {commit}, not {version}; check out {version} "
                         "or name the version it is at")
    label = commit if commit != "unversioned" else version or commit
    return EngineCode(root, label, f"tree-sha256:{tree_digest(root, packages)}", str(root))


def _folder_version(root: Path) -> str:
    """The checkout's commit when ``root`` is a git checkout (read locally), else "unversioned"."""
    if (root / ".git").exists() and shutil.which("git"):
        try:
            out = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                                 timeout=10, check=False).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            out = ""
        if re.fullmatch(r"[0-9a-f]{40}", out):
            return out
    return "unversioned"
