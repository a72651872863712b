"""Which code a process runs: ``""`` the harness's own checkout's, or a folder holding a version of the repository.
Standard library only (``python harness/base/coderoot.py ROOT REPO MODULE ARGS...``). Design:
docs/measurement.md#code-roots."""

from __future__ import annotations

import dataclasses
import functools
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import runpy
import subprocess
import sys
import sysconfig
import traceback
from pathlib import Path

OWN_MODULES = ("impls", "harness", "scenarios")
HARNESS_ROOT = Path(__file__).resolve().parents[2]  # the folder holding this harness/
MAIN_MODULES = ("__main__", "__mp_main__")
REASON_CHARS = 240


def check(code: str) -> str:
    """``code`` if it is a form this module knows (``""``, or an absolute path of a folder), else ValueError."""
    if code and not (os.path.isabs(code) and os.path.isdir(code)):
        raise ValueError(f"code {code!r}: give '' (this checkout) or the absolute path of a checkout's folder")
    return code


def repository(start: str | os.PathLike | None = None) -> Path:
    """The git checkout holding ``start`` (default: the current folder), else the harness's own folder."""
    proc = subprocess.run(["git", "rev-parse", "--show-toplevel"], cwd=start or os.getcwd(), capture_output=True,
                          text=True, check=False)
    top = proc.stdout.strip()
    return Path(top).resolve() if proc.returncode == 0 and top else HARNESS_ROOT


def is_checkout(folder: str | os.PathLike) -> bool:
    """Whether ``folder`` is a checkout of kvblock-bench itself: each version of it brings its own harness."""
    folder = Path(folder)
    return (folder / "harness" / "base" / "coderoot.py").is_file() and (folder / "impls" / "registry.py").is_file()


def _inside(path: Path, folder: Path) -> bool:
    return path == folder or folder in path.parents


@functools.cache
def _environment_dirs() -> list[Path]:
    """The standard library, site-packages, the virtual environment."""
    paths = sysconfig.get_paths()
    found = {paths.get(key) for key in ("stdlib", "platstdlib", "purelib", "platlib")}
    if sys.prefix != sys.base_prefix:
        found.add(sys.prefix)
    return [Path(p).resolve() for p in found if p]


def in_environment(path: Path) -> bool:
    """Whether ``path`` lies in the Python environment: the same for every version, and no worktree has it."""
    return any(part in ("site-packages", "dist-packages") for part in path.parts) or any(
        _inside(path, folder) for folder in _environment_dirs())


def moved(entry: str, repo: Path, root: Path) -> str:
    """A ``sys.path`` entry inside ``repo`` (but the environment) as the same place inside ``root``, had it or not."""
    path = Path(entry or os.getcwd()).resolve()
    if not _inside(path, repo) or in_environment(path):
        return entry
    return str(root / path.relative_to(repo))


def _names_in(folder: Path) -> list[str]:
    """The packages (with ``__init__.py``), modules and extensions at the top of ``folder``."""
    try:
        children = list(folder.iterdir())
    except OSError:
        return []
    names = []
    for child in children:
        name = child.name.split(".")[0]
        if child.is_dir() and (child / "__init__.py").is_file() and child.name.isidentifier():
            names.append(child.name)
        elif child.is_file() and child.suffix in (".py", ".so", ".pyd") and name.isidentifier():
            names.append(name)
    return names


def held(repo: Path, entries: list[str]) -> dict[str, Path]:
    """Top-level modules the repository holds (at its top, or on a ``sys.path`` entry inside it) -> that folder."""
    stdlib = set(getattr(sys, "stdlib_module_names", ()))
    folders = [repo, *(Path(e or os.getcwd()).resolve() for e in entries)]
    out: dict[str, Path] = {}
    for folder in folders:
        if not _inside(folder, repo) or in_environment(folder):
            continue
        for name in _names_in(folder):
            if name not in stdlib:
                out.setdefault(name, folder)
    return out


def _location(spec: object) -> Path | None:
    """A module spec's file, else its package's first folder."""
    origin = getattr(spec, "origin", None)
    if origin and origin not in ("built-in", "frozen", "namespace"):
        return Path(origin).resolve()
    folders = list(getattr(spec, "submodule_search_locations", None) or [])
    return Path(folders[0]).resolve() if folders else None


def shadowed(repo: Path) -> list[tuple[str, Path]]:
    """(module, where from) for each module the repository holds that this Python would import from elsewhere."""
    own, out = is_checkout(repo), []
    for name in held(repo, sys.path):
        if name in OWN_MODULES and not own:
            continue
        try:
            found = _location(importlib.util.find_spec(name))
        except (ImportError, ValueError):
            continue
        if found is not None and not (_inside(found, repo) or in_environment(found) or _inside(found, HARNESS_ROOT)):
            out.append((name, found))
    return out


class _Finder(importlib.abc.MetaPathFinder):
    """The repository's modules from the root, never elsewhere; kvblock-bench's from the installed harness."""

    def __init__(self, repo: Path, root: Path, own: bool, names: dict[str, Path]) -> None:
        self.repo, self.root, self.own, self.names = repo, root, own, names

    def find_spec(self, fullname: str, path=None, target=None):
        top = fullname.split(".")[0]
        if not self.own and top in OWN_MODULES:
            where = path if "." in fullname else [str(HARNESS_ROOT)]
        elif top in self.names:
            where = path if "." in fullname else [str(self.root / self.names[top].relative_to(self.repo))]
        else:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, where)
        if spec is None:
            raise ModuleNotFoundError(f"No module named {fullname!r} in {where[0] if where else self.root} (this "
                                      "version does not hold it)", name=fullname)
        return spec


@dataclasses.dataclass
class _Version:
    """What :func:`enter` set up in this process, for :func:`audit`."""

    root: Path | None = None
    repo: Path | None = None
    own: bool = False
    names: dict[str, Path] = dataclasses.field(default_factory=dict)
    seen: set[str] = dataclasses.field(default_factory=set)


_Entered = _Version()


def _dropped(name: str, module: object, repo: Path, names: dict[str, Path]) -> bool:
    """Whether a module imported so far must be imported again, from the root."""
    if name in MAIN_MODULES:
        return False
    if name.split(".")[0] in (*OWN_MODULES, *names):
        return True
    file = getattr(module, "__file__", None)
    if not isinstance(file, str) or not os.path.isabs(file):  # none, or a made-up name (torch.ops: "_ops.py")
        return False
    path = Path(file).resolve()
    return _inside(path, repo) and not in_environment(path)


def enter(root: str | os.PathLike, repo: str | os.PathLike | None = None) -> None:
    """From now on this process imports ``repo``'s modules (default: :func:`repository`) from ``root``."""
    root, repo = Path(root).resolve(), Path(repo).resolve() if repo else repository()
    if not root.is_dir():
        raise ValueError(f"code root {root}: no such folder")
    own, names = is_checkout(repo), held(repo, sys.path)
    sys.path[:] = [moved(entry, repo, root) for entry in sys.path]
    sys.meta_path.insert(0, _Finder(repo, root, own, names))
    for name in [n for n, m in list(sys.modules.items()) if _dropped(n, m, repo, names)]:
        del sys.modules[name]
    sys.path_importer_cache.clear()
    importlib.invalidate_caches()
    global _Entered
    _Entered = _Version(root, repo, own, names)
    if own:
        for name in OWN_MODULES:
            importlib.import_module(name)
    problem = audit()
    if problem:
        raise ImportError(problem)


def _misplaced(name: str, path: Path) -> str:
    """Why module ``name`` (from ``path``) is not this version's, or ""."""
    root, repo = _Entered.root, _Entered.repo
    top = name.split(".")[0]
    if not _Entered.own and top in OWN_MODULES:
        return "" if _inside(path, HARNESS_ROOT) else f"not from the installed kvblock-bench ({HARNESS_ROOT})"
    if top in _Entered.names or (_Entered.own and top in OWN_MODULES) or (
            root != repo and _inside(path, repo) and not in_environment(path)):
        if _inside(path, root):
            return ""
        return "the working tree's copy" if _inside(path, repo) else "a copy on PYTHONPATH or in another checkout"
    return ""


def audit() -> str:
    """The first module imported from elsewhere than the version :func:`enter` chose, in words, or ""."""
    if _Entered.root is None:
        return ""
    for name, module in list(sys.modules.items()):
        if name in _Entered.seen or name in MAIN_MODULES:
            continue
        _Entered.seen.add(name)
        file = getattr(module, "__file__", None)
        why = _misplaced(name, Path(file).resolve()) if isinstance(file, str) and os.path.isabs(file) else ""
        if why:
            return f"module {name} was imported from {file}, {why}, not from {_Entered.root}"
    return ""


def failure(exc: BaseException, root: str | os.PathLike) -> str:
    """``Type: message (file:line)``, the last line reached inside ``root``: why a version did not import."""
    root = Path(root).resolve()
    try:
        message = " ".join(str(exc).split())
    except Exception:
        message = ""
    text = f"{type(exc).__name__}: {message}" if message else type(exc).__name__
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if _inside(Path(f.filename).resolve(), root)]
    if frames:
        text += f" ({Path(frames[-1].filename).resolve().relative_to(root)}:{frames[-1].lineno})"
    return text if len(text) <= REASON_CHARS else text[: REASON_CHARS - 1] + "…"


def resolve(ref: str) -> object:
    """The object named ``module:attribute``, imported now."""
    module, _, name = ref.partition(":")
    return getattr(__import__(module, fromlist=[name]), name)


def main(argv: list[str]) -> None:
    """``ROOT REPO MODULE ARGS...``: MODULE run as ``__main__`` with ROOT's code (``-`` as ROOT: this checkout's)."""
    root, repo, module, *args = argv
    if sys.path and Path(sys.path[0] or ".").resolve() == Path(__file__).resolve().parent:
        sys.path[0] = str(HARNESS_ROOT)  # run as a script: this folder's modules are not top-level ones
    if root != "-":
        enter(root, repo)
    sys.argv = [module, *args]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main(sys.argv[1:])
