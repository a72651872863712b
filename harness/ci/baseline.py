"""Save a ``--benchmark-json`` file as a committed baseline: statistics and machine info, without raw rounds.

``kvblock-bench baseline RUN_JSON BASELINE_JSON`` (``make bench-baseline``). pytest-benchmark's JSON
holds every round's timing (megabytes for the fast operations); ``pytest-benchmark compare`` needs only
the statistics, which are kept with ``machine_info`` and ``commit_info`` so a baseline says where it ran.
"""

from __future__ import annotations

import json
from pathlib import Path

from harness.output.results import atomic_write_text


def strip_rounds(run: dict) -> dict:
    """A copy of a pytest-benchmark JSON document without the per-round samples (``stats.data``)."""
    benchmarks = [{**bench, "stats": {k: v for k, v in bench["stats"].items() if k != "data"}}
                  for bench in run["benchmarks"]]
    return {**run, "benchmarks": benchmarks}


def save_baseline(run_json: Path, baseline_json: Path) -> None:
    """Write ``run_json``'s statistics to ``baseline_json`` (atomically)."""
    run = json.loads(run_json.read_text())
    atomic_write_text(baseline_json, json.dumps(strip_rounds(run), indent=1, sort_keys=True) + "\n")


def add_arguments(parser) -> None:
    """``kvblock-bench baseline``'s arguments."""
    parser.add_argument("run_json", type=Path, help="a pytest-benchmark --benchmark-json file")
    parser.add_argument("baseline_json", type=Path, help="the baseline to write (e.g. results/baselines/mybox.json)")


def run(args) -> int:
    """Save the run's statistics as the baseline."""
    try:
        save_baseline(args.run_json, args.baseline_json)
    except (json.JSONDecodeError, KeyError, TypeError) as exc:
        raise ValueError(f"{args.run_json}: not a pytest-benchmark JSON file ({exc})") from None
    print(f"saved baseline {args.baseline_json} from {args.run_json}")
    return 0
