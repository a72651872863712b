"""Building the native library with the system C++ compiler, once per source, compiler and flags.

The library is cached under a folder named by a digest of the C++ source, the compiler's version line, the
flags and the machine: ``build/native/<digest>/libkvb_native.so`` in a source checkout, else
``~/.cache/kvblock-bench/native/<digest>/`` (``KVB_NATIVE_CACHE`` overrides the root). An edit to the source,
another compiler or other flags build a fresh library; the same ones load the cached file without compiling.
The source is fed to the compiler from the bytes that were digested, and the result is renamed into place
atomically, so concurrent first uses cannot load a half-written library.

Flags: ``-O2`` without ``-march=native``, so the code is the same on every x86-64 machine and results are
comparable across machines (:data:`FLAGS`; :func:`impls.native.build_info` records them).
"""

from __future__ import annotations

import hashlib
import os
import platform
import shutil
import subprocess
import time
from dataclasses import dataclass
from functools import cache
from pathlib import Path

SOURCE = Path(__file__).with_name("designs.cpp")
LIB_NAME = "libkvb_native.so"
FLAGS = ("-O2", "-std=c++17", "-fPIC", "-shared", "-fvisibility=hidden")
_PACKAGE_ROOT = Path(__file__).resolve().parents[2]


class BuildError(RuntimeError):
    """No usable C++ compiler, or the source did not compile."""


@dataclass(frozen=True)
class Build:
    """One built (or found) library."""

    path: Path
    digest: str
    compiler: str
    compiler_version: str
    flags: tuple[str, ...]
    compiled: bool  # False when the cached library was found
    seconds: float  # compile time, 0 when cached


def find_compiler() -> str:
    """``$CXX`` if set, else ``c++``, ``g++`` or ``clang++`` on the PATH; ``BuildError`` when none is found."""
    wanted = os.environ.get("CXX")
    candidates = [wanted] if wanted else ["c++", "g++", "clang++"]
    for name in candidates:
        path = shutil.which(name)
        if path:
            return path
    raise BuildError(f"no C++ compiler found (tried {', '.join(candidates)}; set CXX)")


@cache
def compiler_version(cxx: str) -> str:
    """The first line of ``cxx --version``."""
    try:
        out = subprocess.run([cxx, "--version"], capture_output=True, text=True, timeout=30, check=True)
    except (OSError, subprocess.SubprocessError) as exc:
        raise BuildError(f"C++ compiler {cxx} does not run: {exc}") from exc
    lines = out.stdout.strip().splitlines()
    return lines[0] if lines else "unknown"


def digest(source: bytes, version: str, flags: tuple[str, ...]) -> str:
    """The cache key: source, compiler version, flags and machine."""
    h = hashlib.sha256(source)
    h.update("\0".join((version, *flags, platform.machine())).encode())
    return h.hexdigest()[:16]


def cache_root() -> Path:
    """``$KVB_NATIVE_CACHE``, ``build/native`` in a source checkout, else ``~/.cache/kvblock-bench/native``."""
    if os.environ.get("KVB_NATIVE_CACHE"):
        return Path(os.environ["KVB_NATIVE_CACHE"])
    if (_PACKAGE_ROOT / "pyproject.toml").is_file():
        return _PACKAGE_ROOT / "build" / "native"
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "kvblock-bench" / "native"


LIBRARY_ENV = "KVB_NATIVE_LIBRARY"


def build(source: Path = SOURCE, root: Path | None = None, flags: tuple[str, ...] = FLAGS) -> Build:
    """The library for ``source``: found in the cache, or compiled into it. ``$KVB_NATIVE_LIBRARY`` names an
    already built library to load as it is: the harness sets it for its valgrind processes, where running the
    compiler for its version (a subprocess whose pipes are read in timing-dependent chunks) would shift the
    heap and make instruction counts differ from run to run."""
    given = os.environ.get(LIBRARY_ENV)
    if given and Path(given).is_file():
        return Build(Path(given), Path(given).parent.name, "(prebuilt)", "(prebuilt)", flags, compiled=False,
                     seconds=0.0)
    cxx = find_compiler()
    version = compiler_version(cxx)
    code = source.read_bytes()
    key = digest(code, version, flags)
    path = (root or cache_root()) / key / LIB_NAME
    if path.is_file():
        return Build(path, key, cxx, version, flags, compiled=False, seconds=0.0)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{LIB_NAME}.{os.getpid()}.tmp")
    t0 = time.perf_counter()
    try:
        run = subprocess.run([cxx, *flags, "-x", "c++", "-", "-o", str(tmp)], input=code, capture_output=True,
                             timeout=600, check=False)
    except (OSError, subprocess.SubprocessError) as exc:
        raise BuildError(f"{cxx} failed to run: {exc}") from exc
    if run.returncode != 0:
        tmp.unlink(missing_ok=True)
        raise BuildError(f"{cxx} could not compile {source.name}:\n{run.stderr.decode(errors='replace')[-2000:]}")
    os.replace(tmp, path)
    return Build(path, key, cxx, version, flags, compiled=True, seconds=time.perf_counter() - t0)
