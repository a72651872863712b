"""Does my run reproduce the published table? Each "x flat" of a run against the reference's kept runs.

Usage: python scripts/reproduce_check.py RUN [--reference results/reference] [--scenario paper]

For every batched cell of RUN on the scenario, its time over ``flat``'s beside the kept runs' (results/reference/runs/)
of the same machine kind (CPUID vendor, family, model and stepping, CPUs, L2 and L3: ``host.machine_key``), or of
every kind where none matches, and a verdict: within the runs' range, within their intervals, or outside. Exit 0
when every cell is within the runs' range or intervals, 1 otherwise, 2 for bad input.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harness.base.files import ResultsError, read_json, resolve_run
from harness.base.host import machine_name
from harness.base.rows import read_rows
from harness.output.formatting import fmt
from harness.output.reproduction import check, kept_runs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run")
    parser.add_argument("--reference", type=Path, default=Path(__file__).resolve().parents[1] / "results" / "reference")
    parser.add_argument("--scenario", default="paper")
    args = parser.parse_args(argv)
    try:
        run = resolve_run(args.run)
        meta = read_json(run / "meta.json")
        rows = read_rows(run / "results.csv")
    except (ResultsError, OSError, ValueError) as exc:
        print(f"reproduce_check: {args.run}: {exc}", file=sys.stderr)
        return 2
    kept = kept_runs(args.reference)
    if not kept:
        print(f"reproduce_check: {args.reference}/runs/ holds no kept run", file=sys.stderr)
        return 2
    found = check(rows, meta if isinstance(meta, dict) else {}, kept, args.scenario)
    where = ("the kept runs of this machine kind" if found and found[0].same_machine
             else "the kept runs of every machine kind (none of this kind is kept)")
    print(f"{run.name} on {machine_name(meta)}: each x flat on {args.scenario} against {where}")
    for c in found:
        values = [r.value for r in c.theirs]
        theirs = f"{fmt(min(values))}–{fmt(max(values))} over {len(values)}" if values else "none"
        print(f"  {c.cell[0]:24s} {c.cell[1]:9s} {fmt(c.mine.value):>10s}   kept: {theirs:28s} {c.verdict}")
    return 0 if found and all(c.verdict.startswith("within") for c in found) else 1


if __name__ == "__main__":
    sys.exit(main())
