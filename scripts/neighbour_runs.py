"""Does a run's "x flat" hold from run to run beside other work? Several back-to-back runs of one commit.

Usage: python scripts/neighbour_runs.py [--runs 5] [--neighbour-procs 2] [--run-args "ARGS OF kvblock-bench run"]
                                        [--out results/neighbour_runs] [--label NAME]

Runs ``kvblock-bench run RUN-ARGS`` ``--runs`` times, one after the other, beside ``scripts/noisy_neighbour.py``
(``--neighbour-procs`` processes alternating busy and idle phases of 1-5 s; 0: idle), and for every ratio to
``flat`` on the scenario (metrics ``*_vs_flat``) states each run's figure with its paired interval, their spread
(largest over smallest) and whether every run's interval holds every other run's figure. The target (issue 50):
every design within 1.25x, every interval holding the others. It writes ``OUT/LABEL.csv`` (a row per ratio and
run) and ``OUT/LABEL.md`` (the table, each run's host line and the command) atomically, and keeps the runs in
``OUT/runs-LABEL/`` (git-ignored). Exit status 0 when every ratio met the target, 1 otherwise.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "scripts")]

from compare_pairs import neighbour  # noqa: E402

from harness.base.files import atomic_write_text  # noqa: E402
from harness.base.host import machine_name  # noqa: E402
from harness.output.formatting import host_line  # noqa: E402
from harness.output.markdown import markdown_table  # noqa: E402
from harness.output.overlap import SPREAD_TARGET, Agreement, agreement, figure, ratio_rows  # noqa: E402
from harness.run import metadata  # noqa: E402

HEADLINE = "seq_step_ns_vs_flat"
RUN_ARGS = ("--scenario paper --regime batched --no-paced --no-l1d --no-allocations --no-table-copy --no-progress")


def one_run(run_args: list[str], results: Path, label: str) -> Path:
    """One ``kvblock-bench run`` into ``results``; its folder."""
    cmd = [sys.executable, "-m", "harness.cli", "run", *run_args, "--results", str(results), "--label", label]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"run {label} failed ({done.returncode}): {done.stderr.strip().splitlines()[-1:]}")
    return (results / "latest").resolve()


def table(found: list[Agreement], runs: int) -> list[str]:
    header = ["impl", "regime", "figure", *(f"run {i + 1}" for i in range(runs)), "max/min", "intervals hold"]
    rows = [[f"`{a.key[0]}`", a.key[1], a.key[2].removesuffix("_vs_flat"),
             *(figure(r) if r is not None else "—" for r in a.rows), f"{a.spread:.2f}", "yes" if a.covered else "NO"]
            for a in sorted(found, key=lambda a: (a.key[2] != HEADLINE, a.key[2], a.key[0]))]
    return markdown_table(header, rows)


def verdict(found: list[Agreement]) -> str:
    """The target, counted for the headline figure (seq-step time over flat's) and for every ratio."""
    head = [a for a in found if a.key[2] == HEADLINE]
    within, held, every = (sum(a.spread <= SPREAD_TARGET for a in head), sum(a.holds() for a in head),
                           sum(a.holds() for a in found))
    return (f"Seq-step time over `flat`'s: {within} of {len(head)} designs within {SPREAD_TARGET}x across the runs, "
            f"{held} of them with every run's interval holding the others' figures. Every ratio (lookup and "
            f"allocate/free too): {every} of {len(found)} hold both.")


def write(out: Path, label: str, found: list[Agreement], metas: list[dict], command: str) -> None:
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(["impl", "regime", "metric", "run", "run_id", "value", "ci_low", "ci_high", "spread", "covered"])
    for a in found:
        for i, row in enumerate(a.rows):
            if row is not None:
                writer.writerow([*a.key, i + 1, metas[i]["run_id"], f"{row.value:.6g}", f"{row.ci_low:.6g}",
                                 f"{row.ci_high:.6g}", f"{a.spread:.4f}", a.covered])
    atomic_write_text(out / f"{label}.csv", buf.getvalue())
    lines = [f"# {label}: `x flat` across {len(metas)} runs of one commit", "",
             f"`{command}`, at {metas[0]['commit']} on {metas[0]['machine']}.", "", verdict(found), "",
             *table(found, len(metas)), "", "Each run's host:", ""]
    lines += [f"- run {i + 1} ({m['run_id']}): {m['host']}" for i, m in enumerate(metas)]
    atomic_write_text(out / f"{label}.md", "\n".join(lines) + "\n")


def run_meta(run: Path) -> dict:
    meta = json.loads((run / "meta.json").read_text())
    return {"run_id": run.name, "commit": meta.get("git_commit"), "machine": machine_name(meta),
            "host": host_line(meta) or "not recorded"}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--neighbour-procs", type=int, default=2, help="0: no neighbour (idle)")
    parser.add_argument("--run-args", default=RUN_ARGS, help=f"kvblock-bench run's arguments (default: {RUN_ARGS})")
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "neighbour_runs")
    parser.add_argument("--label", default="beside-neighbour")
    parser.add_argument("--scenario", default="paper")
    parser.add_argument("--summarise", action="store_true",
                        help="measure nothing: summarise the runs already in OUT/runs-LABEL/")
    args = parser.parse_args(argv)
    if not 2 <= args.runs <= 50:
        parser.error("--runs: give 2 to 50")
    run_args = shlex.split(args.run_args)
    runs_dir = args.out / f"runs-{args.label}"
    runs_dir.mkdir(parents=True, exist_ok=True)
    folders = sorted(p for p in runs_dir.glob("2*") if (p / "results.csv").is_file()) if args.summarise else []
    procs = 0 if args.summarise else args.neighbour_procs
    with neighbour(procs > 0, procs, 1, duration_s=86400):
        for i in range(0 if args.summarise else args.runs):
            folders.append(one_run(run_args, runs_dir, f"{args.label}-{i + 1}"))
            print(f"run {i + 1} of {args.runs}: {folders[-1].name}", file=sys.stderr)
    if len(folders) < 2:
        parser.error(f"{runs_dir}: fewer than two runs to summarise")
    found = agreement([ratio_rows(f / "results.csv", args.scenario) for f in folders], "_vs_flat")
    command = (f"python scripts/neighbour_runs.py --runs {args.runs} --neighbour-procs {args.neighbour_procs} "
               f"--run-args {shlex.quote(args.run_args)} --label {args.label}")
    metas = [run_meta(f) for f in folders]
    if not metas[0]["commit"]:
        metas[0]["commit"] = metadata.git_commit()
    write(args.out, args.label, found, metas, command)
    print("\n".join([verdict(found), *table(found, len(folders))]))
    return 0 if found and all(a.holds() for a in found) else 1


if __name__ == "__main__":
    sys.exit(main())
