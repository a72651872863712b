"""Which code a process runs: ``""`` this checkout's, or an absolute folder path, another checkout's designs under
this checkout's harness (:data:`PINNED`). Standard library only, so that ``python harness/base/coderoot.py ROOT
REPO MODULE ARGS...`` can run MODULE so. Design: docs/measurement.md#code-roots."""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import runpy
import subprocess
import sys
from pathlib import Path

PINNED = ("harness", "scenarios")  # the measurement code: always this checkout's
HARNESS_ROOT = Path(__file__).resolve().parents[2]  # the folder holding this checkout's harness/
OWN_MODULES = ("impls", *PINNED)


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


def _inside(path: Path, folder: Path) -> bool:
    return path == folder or folder in path.parents


def moved(entry: str, repo: Path, root: Path) -> str:
    """A ``sys.path`` entry inside ``repo``, as the same place inside ``root`` where ``root`` has it; any other entry
    as it is (a virtual environment inside the checkout, which a worktree lacks, stays)."""
    path = Path(entry or os.getcwd()).resolve()
    if not _inside(path, repo):
        return entry
    there = root / path.relative_to(repo)
    return str(there) if there.exists() else entry


class _Finder(importlib.abc.MetaPathFinder):
    """:data:`PINNED` from this checkout; a top-level module the repository holds at its top, from the root."""

    def __init__(self, repo: Path, root: Path) -> None:
        self.repo, self.root = repo, root

    def find_spec(self, fullname: str, path=None, target=None):
        if "." in fullname:
            return None
        if fullname in PINNED:
            return importlib.machinery.PathFinder.find_spec(fullname, [str(HARNESS_ROOT)])
        if (self.repo / fullname).is_dir() or (self.repo / f"{fullname}.py").is_file():
            return importlib.machinery.PathFinder.find_spec(fullname, [str(self.root)])
        return None


def _dropped(name: str, module: object, repo: Path) -> bool:
    """Whether a module imported from the checkout must be imported again from the root; never one of the
    environment's (a virtual environment inside the checkout: a compiled extension cannot load twice)."""
    if name in ("__main__", "__mp_main__"):
        return False
    if name.split(".")[0] in OWN_MODULES:
        return True
    file = getattr(module, "__file__", None)
    if not file:
        return False
    path = Path(file).resolve()
    return _inside(path, repo) and not _inside(path, Path(sys.prefix).resolve())


def enter(root: str | os.PathLike, repo: str | os.PathLike | None = None) -> None:
    """From now on this process imports ``repo``'s modules (default: :func:`repository`) from ``root``, the harness
    from this checkout; modules already imported from either are dropped, to be imported again."""
    root, repo = Path(root).resolve(), Path(repo).resolve() if repo else repository()
    if not root.is_dir():
        raise ValueError(f"code root {root}: no such folder")
    sys.path[:] = [moved(entry, repo, root) for entry in sys.path]
    sys.meta_path.insert(0, _Finder(repo, root))
    for name in [n for n, m in list(sys.modules.items()) if _dropped(n, m, repo)]:
        del sys.modules[name]
    sys.path_importer_cache.clear()
    if (root / "impls").is_dir():
        import impls

        if not _inside(Path(impls.__file__).resolve(), root):
            raise ImportError(f"impls came from {impls.__file__}, not from the code root {root}")


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
