"""Do two runs agree? Compare the paper table's ratios of two runs, interval against interval.

Usage: python scripts/overlap_check.py RUN_A RUN_B [--scenario paper] [--out FILE]

For every ratio row (metric ``*_vs_*``) and the A/A control (``aa_ratio``) of the scenario that both runs
measured with status ``ok``, prints both figures with their 95 % intervals and whether the intervals overlap,
then the count. Exit status 0 only if every pair overlaps. ``--out`` also writes the table (atomically).
Two runs on the same machine should agree within their intervals: a pair that does not is either a real change
between the runs or an interval too narrow for the machine's drift, and either is worth a look. Runs made with
other options (``--quick``, other ``--reps``) are named; runs of different traces of the scenario fail. For a
verdict on every figure of two runs, use ``kvblock-bench compare BASE NEW``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harness.base.files import atomic_write_text, resolve_run
from harness.output.compare import load_run, run_notes
from harness.output.overlap import compare, figure, overlaps, ratio_rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_a")
    parser.add_argument("run_b")
    parser.add_argument("--scenario", default="paper")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    result = compare(*(ratio_rows(resolve_run(run) / "results.csv", args.scenario) for run in (args.run_a, args.run_b)))
    lines = [f"{'ok ' if overlaps(x, y) else 'NO '} {k[0]:11s} {k[1]:9s} {k[2]:28s} "
             f"{figure(x):>24s}   {figure(y):>24s}" for k, x, y in result.pairs]
    overlap, total = result.overlap, len(result.pairs)
    runs = [load_run(side, resolve_run(run), Path()) for side, run in (("BASE", args.run_a), ("NEW", args.run_b))]
    digests = [(run.traces or {}).get(args.scenario) for run in runs]
    same_trace = None in digests or digests[0] == digests[1]
    notes = [f"# note: {n}" for n in run_notes(*runs)]
    if not same_trace:
        notes.append(f"# NOT COMPARABLE: the runs replayed different traces of {args.scenario}")
    text = "\n".join([f"# {args.scenario}: {Path(args.run_a).name} against {Path(args.run_b).name} "
                      "(ratio [95 % interval] in each run)", *notes, *lines,
                      f"overlapping {overlap} of {total}"]) + "\n"
    print(text, end="")
    if args.out:
        atomic_write_text(args.out, text)
    return 0 if total and overlap == total and same_trace else 1


if __name__ == "__main__":
    sys.exit(main())
