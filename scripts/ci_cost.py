"""What CI's benchmark steps cost: ``scripts/ci_compare.sh`` at its defaults against one ``run`` of its profile.

Usage: python scripts/ci_cost.py [--out results/compare_pairs/ci_cost.json]

Run it on a quiet machine. Times, one after the other, ``scripts/ci_compare.sh`` (the gate, then ``kvblock-bench ab``
of HEAD against the working tree on the pull-request profile, then both versions' gate counts) and one
``kvblock-bench run`` of the same profile, and writes their wall seconds, the ab run's own start and finish (its
``meta.json``), the load average before each, the commit and the machine. The README's "Cost" line quotes the file.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harness.base.files import atomic_write_text
from harness.base.host import machine_name
from harness.run import metadata
from scripts.compare_pairs import finished_run

ROOT = Path(__file__).resolve().parents[1]


def timed(cmd: list[str], env: dict[str, str]) -> dict:
    """Wall seconds, exit status and the 1-minute load average before ``cmd``."""
    load, t0 = os.getloadavg()[0], time.perf_counter()
    status = subprocess.run(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, check=False).returncode
    return {"command": " ".join(cmd), "exit_status": status, "wall_s": round(time.perf_counter() - t0, 1),
            "load_1m_before": round(load, 2)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "compare_pairs" / "ci_cost.json")
    args = parser.parse_args(argv)
    py = sys.executable
    profile = subprocess.run([py, "-m", "harness.ci.profile", "--pull-request"], cwd=ROOT, check=True,
                             capture_output=True, text=True).stdout.split()
    with tempfile.TemporaryDirectory(prefix="ci-cost-") as tmp:
        env = {**os.environ, "PY": py, "KVB_CI_OUT": f"{tmp}/ci"}
        script = timed(["scripts/ci_compare.sh"], env)
        found = finished_run(Path(tmp) / "ci" / "runs")  # NEW's meta.json: the ab run's own start and finish
        script["ab_s"] = found[1] if found else None
        run = timed([py, "-m", "harness.cli", "run", *profile, "--results", f"{tmp}/run", "--no-progress"], env)
    meta = metadata.collect()
    doc = {"commit": metadata.git_commit(), "machine": machine_name(meta),
           "date": time.strftime("%Y-%m-%d"), "profile": " ".join(profile), "ci_compare": script, "run": run}
    atomic_write_text(args.out, json.dumps(doc, indent=1) + "\n")
    print(json.dumps(doc, indent=1))
    return 0 if script["exit_status"] == 0 and run["exit_status"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
