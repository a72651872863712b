"""Time each ``make`` target as a user runs it, and write the times the docs and ``--help`` quote.

Usage: python scripts/make_times.py [--targets setup,test,bench-quick,bench,bench-ci,gate] [--caches cold|warm]
                                    [--out results/times/times.json] [--dir .]

Run it on a quiet machine (nothing else running: the 1-minute load average is recorded with each target). Each
target runs as ``make TARGET`` in the repository, one after the other, its output passed through; its wall time and
the CPU time of its processes are recorded with its exit status, the commit and the date. ``setup`` runs on a fresh
virtual environment in a temporary folder (``make setup VENV=...``, pip's download cache off), as on a fresh clone;
the other targets use the repository's ``.venv``. With ``--caches cold`` (the default) the Numba cache, the C++
build and the trace cache are removed before each target, so that each time is what a first run costs. A target
that fails is recorded as failed, with no time. The file is rewritten atomically after every target (targets not
run this time keep their earlier entry) and the time table of ``docs/time-budget.md`` is rewritten from it, so that
the two agree while the next target runs (``make test`` checks that they do).
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harness.base.host import cpu_identity
from harness.output import sections
from harness.output.readme import write_time_table
from harness.output.times import TARGETS, TIMES_JSON, TargetTime, Times, read_times, write_times
from harness.run import metadata

DEFAULT_TARGETS = ("setup", "test", "bench-quick", "bench", "bench-ci", "gate")
COLD_PATHS = ("build/numba-cache", "build/native", "results/.trace-cache")  # what a fresh clone does not have


def children_cpu_s() -> float:
    """User + system CPU seconds of every waited-for child process so far."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def clear_caches(root: Path) -> None:
    for rel in COLD_PATHS:
        shutil.rmtree(root / rel, ignore_errors=True)


def command_of(target: str, venv: Path | None) -> list[str]:
    """``make TARGET``; ``setup`` on the fresh virtual environment ``venv``."""
    return ["make", target] + ([f"VENV={venv}"] if target == "setup" and venv is not None else [])


def time_target(target: str, root: Path, caches: str, scratch: Path) -> TargetTime:
    """Run one target and measure it (its output goes to this process's stdout and stderr)."""
    venv = scratch / "fresh-venv" if target == "setup" else None
    if caches == "cold":
        clear_caches(root)
    env = {**os.environ, **({"PIP_NO_CACHE_DIR": "1"} if target == "setup" else {})}
    cmd = command_of(target, venv)
    print(f"make_times: {' '.join(cmd)} (caches {caches})", file=sys.stderr, flush=True)
    started = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    load = os.getloadavg()[0]
    cpu0, t0 = children_cpu_s(), time.perf_counter()
    returncode = subprocess.run(cmd, cwd=root, env=env, check=False).returncode
    wall, cpu = time.perf_counter() - t0, children_cpu_s() - cpu0
    ok = returncode == 0
    shown = "make setup (fresh .venv)" if target == "setup" else f"make {target}"
    return TargetTime(target, shown, returncode, round(wall, 1) if ok else None, round(cpu, 1) if ok else None,
                      started, metadata.git_commit(), caches, round(load, 2))


def machine() -> dict:
    return {"cpu_model": metadata.cpu_model(), "cpu_count": os.cpu_count(), "caches": metadata.cache_sizes(),
            "cpu": cpu_identity()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--targets", default=",".join(DEFAULT_TARGETS),
                        help=f"comma-separated make targets (default {','.join(DEFAULT_TARGETS)}; known: "
                             f"{', '.join(TARGETS)})")
    parser.add_argument("--caches", choices=("cold", "warm"), default="cold")
    parser.add_argument("--out", type=Path, default=TIMES_JSON)
    parser.add_argument("--dir", type=Path, default=Path(__file__).resolve().parents[1], help="where to run make")
    args = parser.parse_args(argv)
    targets = [t for t in args.targets.split(",") if t]
    times = read_times(args.out) or Times(machine())
    if times.machine != machine():  # another machine: its earlier times do not belong beside these
        times = Times(machine())
    failed = 0
    # The docs quote the repository's file: its table follows the file after every target, so that a timed
    # `make test` (which checks the two agree) sees them agree.
    readme = sections.doc_path("times", args.dir)
    ours = readme.is_file() and args.out.resolve() == (args.dir / "results" / "times" / "times.json").resolve()
    if ours:
        write_time_table(readme, times)
    with tempfile.TemporaryDirectory(prefix="kvb-times-") as scratch:
        for target in targets:
            entry = time_target(target, args.dir.resolve(), args.caches, Path(scratch))
            times.put(entry)
            write_times(times, args.out)
            if ours:
                write_time_table(readme, times)
            failed += not entry.ok
            print(f"make_times: make {target}: exit {entry.returncode}, wall {entry.wall_s} s, CPU {entry.cpu_s} s",
                  file=sys.stderr, flush=True)
    print(f"wrote {args.out}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
