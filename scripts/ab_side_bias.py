"""Does `ab` favour one side when both sides are the same code? Runs of ``kvblock-bench ab HEAD HEAD`` (or kept
ones) tabulated: each row's NEW/BASE over its pairs of processes, how many sit below 1, and a sign test.

Usage: python scripts/ab_side_bias.py --runs 4 --label "drawn order" [--ab-args "..."]
                                      [--out results/compare_pairs/side_bias]
       python scripts/ab_side_bias.py --keep DIR --label "fixed order (87b2080)"   (ab runs made already, in DIR)
       python scripts/ab_side_bias.py --table                                      (rewrite side_bias.md only)

Each group's ``ab.json`` and ``meta.json`` files are copied to ``<out>/runs/<label>/``; ``<out>/side_bias.md`` is made
from them.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from scipy.stats import binomtest

from harness.base.files import atomic_write_text
from harness.base.host import machine_name
from harness.output.markdown import markdown_table, md_code

ROOT = Path(__file__).resolve().parents[1]
AB_ARGS = ("--impl cpp-flat,flat --scenario paper --regime batched --quick --no-counts --no-paced --no-l1d "
           "--no-allocations --no-table-copy --no-progress --format json")
METRICS = ("seq_step_ns", "lookup_ns", "alloc_free_ns")


def slug(label: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", label.lower()).strip("-")


def run_ab(runs: int, ab_args: str, into: Path) -> None:
    """``runs`` runs of ``ab HEAD HEAD`` from this checkout; each NEW folder's ``ab.json`` kept in ``into``."""
    into.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="ab-side-bias-") as tmp:
        for i in range(runs):
            print(f"ab HEAD HEAD, run {i + 1} of {runs}", file=sys.stderr, flush=True)
            cli = str(Path(sys.executable).with_name("kvblock-bench"))
            cmd = [cli, "ab", "HEAD", "HEAD", *ab_args.split(), "--results", tmp]
            proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=False)
            if proc.returncode not in (0, 1):
                sys.exit(f"ab exited {proc.returncode}: {proc.stderr.strip().splitlines()[-1:]}")
        keep(Path(tmp), into)


def keep(found: Path, into: Path) -> None:
    """Every ``*-ab-new/ab.json`` under ``found``, copied to ``into`` as ``<run>.json``."""
    into.mkdir(parents=True, exist_ok=True)
    for path in sorted(found.glob("*-ab-new/ab.json")):
        shutil.copyfile(path, into / f"{path.parent.name}.ab.json")
        shutil.copyfile(path.with_name("meta.json"), into / f"{path.parent.name}.meta.json")


def rows_of(group: Path) -> dict[tuple[str, str], list[float]]:
    """Per (implementation, metric), every pair's NEW/BASE over the group's runs."""
    out: dict[tuple[str, str], list[float]] = {}
    for path in sorted(group.glob("*.ab.json")):
        for row in json.loads(path.read_text())["paired"]:
            if row["metric"] in METRICS:
                out.setdefault((row["impl"], row["metric"]), []).extend(row["pairs"])
    return out


def table(out: Path) -> str:
    lines = ["# Does `ab` favour one side? Both sides the same code", "",
             "Made by `python scripts/ab_side_bias.py` from the runs kept in `runs/` (each a `kvblock-bench ab "
             "HEAD HEAD` of the label's harness, each NEW's `ab.json` and `meta.json` kept). A row whose pairs sit "
             "on one side of 1 more often than chance (sign test, two-sided) is a bias between the sides, not noise.",
             ""]
    body, hosts = [], ["", "Where and what each group ran:", ""]
    for group in sorted(p for p in (out / "runs").iterdir() if p.is_dir()):
        runs = len(list(group.glob("*.ab.json")))
        metas = [json.loads(p.read_text()) for p in sorted(group.glob("*.meta.json"))]
        hosts.append(f"- {group.name}: commit {', '.join(sorted({m['git_commit'] for m in metas}))}; "
                     f"{'; '.join(sorted({machine_name(m) for m in metas}))}; load "
                     f"{min(m['load_average'][0] for m in metas):.1f}-{max(m['load_average'][0] for m in metas):.1f}")
        for (impl, metric), pairs in sorted(rows_of(group).items()):
            below = sum(x < 1 for x in pairs)
            p = binomtest(below, len(pairs)).pvalue
            body.append([group.name, str(runs), md_code(impl), metric, str(len(pairs)), str(below),
                         f"{statistics.median(pairs):.3f}", f"{min(pairs):.3f}-{max(pairs):.3f}", f"{p:.2g}"])
    header = ["runs of", "runs", "impl", "metric", "pairs", "below 1", "median NEW/BASE", "range", "sign test p"]
    return "\n".join([*lines, *markdown_table(header, body), *hosts, ""])


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=0)
    ap.add_argument("--keep", type=Path, help="a folder of ab runs made already")
    ap.add_argument("--label", default="")
    ap.add_argument("--ab-args", default=AB_ARGS)
    ap.add_argument("--out", type=Path, default=ROOT / "results" / "compare_pairs" / "side_bias")
    ap.add_argument("--table", action="store_true")
    args = ap.parse_args(argv)
    if not args.table:
        if not args.label:
            ap.error("--label names the group of runs (e.g. 'drawn order')")
        group = args.out / "runs" / slug(args.label)
        if args.keep:
            keep(args.keep, group)
        else:
            run_ab(args.runs, args.ab_args, group)
    atomic_write_text(args.out / "side_bias.md", table(args.out))
    print(args.out / "side_bias.md")


if __name__ == "__main__":
    main()
