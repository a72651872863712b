"""Save a ``--benchmark-json`` file as a committed baseline: statistics and machine info, without raw rounds.

``python -m benchmarks.baseline RUN_JSON BASELINE_JSON`` (``make bench-baseline``). pytest-benchmark's JSON
holds every round's timing (megabytes for the fast operations); ``pytest-benchmark compare`` needs only
the statistics, which are kept with ``machine_info`` and ``commit_info`` so a baseline says where it ran.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from harness.results import atomic_write_text


def strip_rounds(run: dict) -> dict:
    """A copy of a pytest-benchmark JSON document without the per-round samples (``stats.data``)."""
    benchmarks = [{**bench, "stats": {k: v for k, v in bench["stats"].items() if k != "data"}}
                  for bench in run["benchmarks"]]
    return {**run, "benchmarks": benchmarks}


def save_baseline(run_json: Path, baseline_json: Path) -> None:
    """Write ``run_json``'s statistics to ``baseline_json`` (atomically)."""
    run = json.loads(run_json.read_text())
    atomic_write_text(baseline_json, json.dumps(strip_rounds(run), indent=1, sort_keys=True) + "\n")


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print(__doc__.strip().split("\n")[2], file=sys.stderr)
        return 2
    save_baseline(Path(args[0]), Path(args[1]))
    print(f"saved baseline {args[1]} from {args[0]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
