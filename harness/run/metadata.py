"""Machine and software metadata recorded with every run (what a reader needs to trust or reproduce it)."""

from __future__ import annotations

import os
import platform
import shlex
import subprocess
import sys
from importlib import metadata as importlib_metadata
from pathlib import Path

from harness.base.host import cpu_identity, cpu_ticks, load_average, steal_pct
from harness.base.project import ROOT as PROJECT_ROOT
from harness.counters.latency import METHOD, probe
from harness.counters.perf import perf_status


def _run(cmd: list[str], cwd: Path | None = None) -> str:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=10, check=False,
                              cwd=cwd).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cache_sizes() -> dict[str, str]:
    """Per-core cache sizes from sysfs (``L1d``, ``L1i``, ``L2``, ``L3``)."""
    out: dict[str, str] = {}
    for index in sorted(Path("/sys/devices/system/cpu/cpu0/cache").glob("index*")):
        try:
            level = (index / "level").read_text().strip()
            kind = (index / "type").read_text().strip()
            size = (index / "size").read_text().strip()
            ways = (index / "ways_of_associativity").read_text().strip()
        except OSError:
            continue
        name = f"L{level}" + {"Data": "d", "Instruction": "i"}.get(kind, "")
        out[name] = f"{size} ({ways}-way)"
    return out


def versions() -> dict[str, str]:
    found = {"python": platform.python_version()}
    for dist in ("numpy", "numba", "llvmlite", "pandas", "matplotlib", "torch", "memray", "kvblock-bench"):
        try:
            found[dist] = importlib_metadata.version(dist)
        except importlib_metadata.PackageNotFoundError:
            found[dist] = "not installed"
    return found


def git_commit() -> str:
    """The commit of the kvblock-bench checkout this code runs from, with ``-dirty`` when tracked files differ."""
    if not (PROJECT_ROOT / ".git").exists():
        return "not a git checkout"
    commit = _run(["git", "rev-parse", "--short=12", "HEAD"], PROJECT_ROOT) or "unknown"
    return commit + ("-dirty" if git_changed_files() else "")


def git_changed_files() -> list[str]:
    """The tracked files that differ from the commit (what ``-dirty`` stands for); empty outside a git checkout."""
    if not (PROJECT_ROOT / ".git").exists():
        return []
    return _run(["git", "diff", "--name-only", "HEAD"], PROJECT_ROOT).splitlines()


def impl_versions(classes: dict[str, type]) -> dict[str, str]:
    """For each implementation, its module and the version of the distribution that provides it."""
    dists = importlib_metadata.packages_distributions()
    out = {}
    for name, cls in classes.items():
        top = cls.__module__.split(".")[0]
        found = dists.get(top, [])
        version = importlib_metadata.version(found[0]) if found else "not an installed distribution"
        out[name] = f"{cls.__module__}.{cls.__qualname__} ({found[0] if found else top} {version})"
    return out


def perf_event_paranoid() -> str:
    try:
        return Path("/proc/sys/kernel/perf_event_paranoid").read_text().strip()
    except OSError:
        return "unavailable"


def native_build(natives: list[str]) -> dict | None:
    """Compiler, version, flags and digest of the C++ designs' library, when the run has any of them."""
    if not natives:
        return None
    from harness.base import native as native_driver
    from impls import native

    return {"impls": natives, **native.build_info(), "replay": native_driver.build_info()}


def collect(argv: list[str] | None = None, classes: dict[str, type] | None = None,
            described: dict[str, str] | None = None, natives: list[str] | None = None) -> dict:
    """Everything about this machine and invocation that a run records in ``meta.json``."""
    pmu, pmu_reason = perf_status()
    natives = [*(natives or []),
               *(name for name, cls in (classes or {}).items() if getattr(cls, "native", False) is True)]
    return {
        "impls": {**impl_versions(classes or {}), **(described or {})},
        "native_build": native_build(natives),
        "cpu_model": cpu_model(),
        "cpu_count": os.cpu_count(),
        "cpu": cpu_identity(),
        "caches": cache_sizes(),
        "platform": platform.platform(),
        "hostname": platform.node(),
        "versions": versions(),
        "pmu": pmu,
        "pmu_reason": pmu_reason,
        "perf_event_paranoid": perf_event_paranoid(),
        "git_commit": git_commit(),
        "git_changed_files": git_changed_files(),
        "command_line": shlex.join(argv if argv is not None else sys.argv),
        "load_average": load_average(),
        "host": {"start": host_state()},
    }


def host_end(meta: dict, on_cpu_pct: list[float]) -> dict:
    """``meta``'s ``host`` with the end's reading and the cells' ``on_cpu_pct`` (least, median)."""
    host = dict(meta.get("host") or {})
    host["end"] = host_state(host.get("start"))
    if on_cpu_pct:
        ordered = sorted(on_cpu_pct)
        host["on_cpu_pct"] = {"min": round(ordered[0], 1), "median": round(ordered[len(ordered) // 2], 1),
                              "cells": len(ordered)}
    return host


def host_state(start: dict | None = None) -> dict:
    """The host now: load, ``/proc/stat`` ticks, the memory probe (and the steal since ``start``)."""
    now = {"load_average": load_average(), "cpu_ticks": cpu_ticks(), "latency_ns": probe(), "latency_probe": METHOD}
    if start is not None:
        ticks = start.get("cpu_ticks")
        now["steal_pct"] = steal_pct(tuple(ticks) if isinstance(ticks, list | tuple) else None, now["cpu_ticks"])
    return now


# What makes timings of two runs comparable: the machine and the software that compiles and runs the code.
TIMING_IDENTITY = ("cpu_model", "cpu.vendor", "cpu.family", "cpu.model", "cpu.stepping", "cpu_count", "caches",
                   "versions.python", "versions.numpy", "versions.numba")
# What makes callgrind instruction counts comparable: the software only (counted with NUMBA_CPU_NAME=generic).
COUNT_IDENTITY = ("versions.python", "versions.numpy", "versions.numba", "versions.llvmlite")


def identity_value(meta: dict, key: str) -> object:
    """``meta``'s value at a dotted ``key`` (``versions.numpy``), or None when it is not recorded."""
    value: object = meta
    for part in key.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return value


def identity_differences(a: dict, b: dict, keys: tuple[str, ...] = TIMING_IDENTITY) -> list[str]:
    """``key a -> b`` for every identity ``key`` whose values differ (unrecorded on one side counts as different;
    on neither, as the same: two runs made before a key was recorded are judged by the others)."""
    found = []
    for key in keys:
        va, vb = identity_value(a, key), identity_value(b, key)
        if va is None and vb is None:
            continue
        if va is None or vb is None or va != vb:
            found.append(f"{key} {_shown(va)} -> {_shown(vb)}")
    return found


def _shown(value: object) -> str:
    if value is None:
        return "(not recorded)"
    if isinstance(value, dict):
        return ", ".join(f"{k} {v}" for k, v in value.items())
    return repr(value) if isinstance(value, str) else str(value)
