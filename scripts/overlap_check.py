"""Do two runs agree? Compare the paper table's ratios of two runs, interval against interval.

Usage: python scripts/overlap_check.py RUN_A RUN_B [--scenario paper] [--out FILE]

For every ratio row (metric ``*_vs_*``) and the A/A control (``aa_ratio``) of the scenario that both runs
measured with status ``ok``, prints both figures with their 95 % intervals and whether the intervals overlap,
then the count. Exit status 0 only if every pair overlaps. ``--out`` also writes the table (atomically).
Two runs on the same machine should agree within their intervals: a pair that does not is either a real change
between the runs or an interval too narrow for the machine's drift, and either is worth a look.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harness.output.results import atomic_write_text, read_rows, resolve_run


def ratios(run: str, scenario: str) -> dict[tuple[str, str, str], object]:
    """(impl, regime, metric) -> row of the run's ratio and A/A rows on ``scenario``."""
    path = resolve_run(run) / "results.csv"
    return {(r.impl, r.regime, r.metric): r for r in read_rows(path)
            if r.scenario == scenario and r.status == "ok" and ("_vs_" in r.metric or r.metric == "aa_ratio")
            and r.ci_low is not None and r.ci_high is not None}


def _fig(row) -> str:
    return f"{row.value:9.3g} [{row.ci_low:.3g}-{row.ci_high:.3g}]"


def compare(a: dict, b: dict) -> tuple[list[str], int, int]:
    """Table lines, pairs that overlap, pairs in all."""
    lines, overlap = [], 0
    keys = sorted(set(a) & set(b))
    for key in keys:
        x, y = a[key], b[key]
        agree = x.ci_low <= y.ci_high and y.ci_low <= x.ci_high
        overlap += agree
        lines.append(f"{'ok ' if agree else 'NO '} {key[0]:11s} {key[1]:9s} {key[2]:28s} {_fig(x)}   {_fig(y)}")
    return lines, overlap, len(keys)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_a")
    parser.add_argument("run_b")
    parser.add_argument("--scenario", default="paper")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    lines, overlap, total = compare(ratios(args.run_a, args.scenario), ratios(args.run_b, args.scenario))
    text = "\n".join([f"# {args.scenario}: {Path(args.run_a).name} against {Path(args.run_b).name} "
                      "(ratio [95 % interval] in each run)", *lines,
                      f"overlapping {overlap} of {total}"]) + "\n"
    print(text, end="")
    if args.out:
        atomic_write_text(args.out, text)
    return 0 if total and overlap == total else 1


if __name__ == "__main__":
    sys.exit(main())
