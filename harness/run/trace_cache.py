"""The run's trace cache (``results/.trace-cache/``): each trace beside a claim of what it holds.
Design: docs/results-folder.md#the-trace-cache."""

from __future__ import annotations

import hashlib
import json
import sys
import time
from pathlib import Path

from harness.base.files import ResultsError, read_json, write_json
from harness.errors import WriteError
from scenarios import SCENARIOS, Trace, TraceError, generate, load, save
from scenarios.scheduler import GENERATOR_VERSION
from scenarios.trace.file_format import FORMAT_VERSION


def _claim(name: str, overrides: dict, cache_dir: Path) -> tuple[dict, Path]:
    """What a trace cache entry claims to hold, and where it lives (named by a hash of the claim)."""
    claim = json.loads(json.dumps({"scenario": name, "params": SCENARIOS[name].params(overrides),
                                   "format_version": FORMAT_VERSION, "generator_version": GENERATOR_VERSION},
                                  sort_keys=True, default=str))
    key = hashlib.sha256(json.dumps(claim, sort_keys=True).encode()).hexdigest()[:16]
    return claim, cache_dir / f"{name}-{key}.npz"


def trace_cache_path(name: str, overrides: dict, cache_dir: Path) -> Path:
    """Where the trace cache keeps a scenario's trace (see :func:`cached_trace`)."""
    return _claim(name, overrides, cache_dir)[1]


def cached_trace(name: str, overrides: dict, cache_dir: Path) -> tuple[Trace, float]:
    """A scenario's trace, generated or read from the cache (docs/results-folder.md); (trace, seconds)."""
    claim, path = _claim(name, overrides, cache_dir)
    t0 = time.perf_counter()
    trace = _cache_entry(path, claim)
    if trace is None:
        trace = generate(name, **overrides)
        _cache_store(path, claim, trace)
    return trace, time.perf_counter() - t0


def _plain_file(path: Path) -> bool:
    return path.is_file() and not path.is_symlink()


def _cache_entry(path: Path, claim: dict) -> Trace | None:
    """The cached trace at ``path`` if its content is what ``claim`` asks for (see :func:`cached_trace`)."""
    claim_path = path.with_suffix(".json")
    if not (_plain_file(path) and _plain_file(claim_path)):
        return None
    try:
        stored, trace = read_json(claim_path), load(path)
    except (ResultsError, TraceError):
        return None
    ok = stored == {**claim, "checksum": trace.header["checksum"]} and trace.header["scenario"] == claim["scenario"]
    return trace if ok else None


def _cache_store(path: Path, claim: dict, trace: Trace) -> None:
    claim_path = path.with_suffix(".json")
    try:
        for entry in (path, claim_path):
            if entry.is_symlink() or (entry.exists() and not entry.is_file()):
                raise WriteError(f"{entry}: not a regular file; left alone")
        save(trace, path)
        write_json(claim_path, {**claim, "checksum": trace.header["checksum"]})
    except (TraceError, WriteError) as exc:
        print(f"kvblock-bench: note: the trace cache is not written ({exc}); the trace is used uncached",
              file=sys.stderr)
