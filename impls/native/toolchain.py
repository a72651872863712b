"""Building a native library with the system C++ compiler, once per source, prelude, compiler and flags."""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import time
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from impls.contract import OP_CODES, status_codes
from impls.core.ids import ROW_BYTES, UINT16_LIMIT

SOURCE = Path(__file__).with_name("designs.cpp")
LIB_NAME = "libkvb_native.so"
LIBRARY_ENV = "KVB_NATIVE_LIBRARY"
OPT_FLAGS = ("-O2",)  # the article's likely build: no architecture flags, the code runs on any x86-64
BASE_FLAGS = ("-std=c++17", "-fPIC", "-shared", "-fvisibility=hidden")
FLAGS = (*OPT_FLAGS, *BASE_FLAGS)
OPT_FLAGS_ENV = "KVB_NATIVE_FLAGS"  # e.g. "-O3 -march=native": a build of its own, its rows' how says so


def opt_flags() -> tuple[str, ...]:
    """The optimisation and architecture flags: ``$KVB_NATIVE_FLAGS`` when set (each ``-O...``, ``-m...`` or
    ``-f...``), else :data:`OPT_FLAGS`; ``BuildError`` for anything else."""
    given = os.environ.get(OPT_FLAGS_ENV, "").split()
    bad = [f for f in given if not f.startswith(("-O", "-m", "-f"))]
    if bad:
        raise BuildError(f"{OPT_FLAGS_ENV}: {bad[0]!r} is not an optimisation flag (-O..., -m..., -f...)")
    return tuple(given) or OPT_FLAGS


def build_flags() -> tuple[str, ...]:
    """Every flag of a build: :func:`opt_flags` then :data:`BASE_FLAGS`."""
    return (*opt_flags(), *BASE_FLAGS)
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
    compiled: bool
    seconds: float


def contract_prelude() -> str:
    """The contract's status codes and op codes, and the id-width rule (:mod:`impls.core.ids`), as C++ constants
    (``kvb::E_NO_BLOCKS``, ``kvb::ALLOCATE``, ``kvb::UINT16_LIMIT``, …)."""
    lines = ["// Generated from impls/contract.py and impls/core/ids.py by impls/native/toolchain.py.",
             "#include <cstdint>", "namespace kvb {"]
    lines += [f"constexpr int64_t {name} = {value};" for name, value in status_codes().items()]
    lines += [f"constexpr uint8_t {name} = {value};" for name, value in OP_CODES.items()]
    lines += [f"constexpr int64_t UINT16_LIMIT = {UINT16_LIMIT};", f"constexpr int64_t ROW_BYTES = {ROW_BYTES};"]
    return "\n".join([*lines, "}  // namespace kvb", ""])


def load(path: Path, signatures: dict[str, tuple], abi_function: str, abi: int) -> ctypes.CDLL:
    """Open a built library, declare its functions' types, check its ABI version (``OSError`` when it differs)."""
    lib = ctypes.PyDLL(str(path))
    for name, (restype, argtypes) in signatures.items():
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = restype, argtypes
    found = getattr(lib, abi_function)()
    if found != abi:
        raise OSError(f"{path} has ABI {found}, expected {abi}")
    return lib


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
    try:
        out = subprocess.run([cxx, "--version"], capture_output=True, text=True, timeout=30, check=True)
    except (OSError, subprocess.SubprocessError) as exc:
        raise BuildError(f"C++ compiler {cxx} does not run: {exc}") from exc
    lines = out.stdout.strip().splitlines()
    return lines[0] if lines else "unknown"


def digest(source: bytes, version: str, flags: tuple[str, ...]) -> str:
    """The cache key: what is compiled, compiler version, flags and machine."""
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


def build(source: Path = SOURCE, root: Path | None = None, flags: tuple[str, ...] | None = None, name: str = LIB_NAME,
          library_env: str = LIBRARY_ENV, prelude: str = "") -> Build:
    """The library ``name`` from the contract prelude, ``prelude`` and ``source``: cached, or compiled (with
    :func:`build_flags` unless ``flags`` are given)."""
    flags = build_flags() if flags is None else flags
    given = os.environ.get(library_env)
    if given and Path(given).is_file():
        return Build(Path(given), Path(given).parent.name, "(prebuilt)", "(prebuilt)", flags, compiled=False,
                     seconds=0.0)
    cxx = find_compiler()
    version = compiler_version(cxx)
    code = f'{contract_prelude()}{prelude}#line 1 "{source.name}"\n'.encode() + source.read_bytes()
    key = digest(code, version, flags)
    path = (root or cache_root()) / key / name
    if path.is_file():
        return Build(path, key, cxx, version, flags, compiled=False, seconds=0.0)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{name}.{os.getpid()}.tmp")
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
