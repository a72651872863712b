"""Save a ``--benchmark-json`` file as a committed baseline: statistics and machine info, without raw rounds.

``kvblock-bench baseline RUN_JSON BASELINE_JSON`` (``make bench-baseline``). pytest-benchmark's JSON
holds every round's timing (megabytes for the fast operations); ``pytest-benchmark compare`` needs only
the statistics, which are kept with ``machine_info`` and ``commit_info`` so a baseline says where it ran.
"""

from __future__ import annotations

import json
from pathlib import Path

from harness.errors import InputError
from harness.output.results import atomic_write_text, read_json


def strip_rounds(run: dict) -> dict:
    """A copy of a pytest-benchmark JSON document without the per-round samples (``stats.data``)."""
    benchmarks = [{**bench, "stats": {k: v for k, v in bench["stats"].items() if k != "data"}}
                  for bench in run["benchmarks"]]
    return {**run, "benchmarks": benchmarks}


def check_document(run: object, path: Path) -> dict:
    """``run`` if it has the shape of a pytest-benchmark JSON document (an object whose ``benchmarks`` is a list
    of objects, each with a ``stats`` object); :class:`InputError` naming ``path`` otherwise."""
    fix = "give the file written by pytest --benchmark-json"
    if not isinstance(run, dict) or not isinstance(run.get("benchmarks"), list):
        raise InputError(f"{path}: not a pytest-benchmark JSON file (no list of benchmarks); {fix}")
    for i, bench in enumerate(run["benchmarks"]):
        if not isinstance(bench, dict) or not isinstance(bench.get("stats"), dict):
            raise InputError(f"{path}: benchmark {i} has no stats object: not a pytest-benchmark JSON file; {fix}")
    return run


def save_baseline(run_json: Path, baseline_json: Path) -> None:
    """Write ``run_json``'s statistics to ``baseline_json`` (atomically)."""
    run = check_document(read_json(run_json), run_json)
    atomic_write_text(baseline_json, json.dumps(strip_rounds(run), indent=1, sort_keys=True) + "\n")


def add_arguments(parser) -> None:
    """``kvblock-bench baseline``'s arguments."""
    parser.add_argument("run_json", type=Path, help="a pytest-benchmark --benchmark-json file")
    parser.add_argument("baseline_json", type=Path, help="the baseline to write (e.g. results/baselines/mybox.json)")


def run(args) -> int:
    """Save the run's statistics as the baseline."""
    save_baseline(args.run_json, args.baseline_json)
    print(f"saved baseline {args.baseline_json} from {args.run_json}")
    return 0
