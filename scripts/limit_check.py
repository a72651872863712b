"""Do `flat`'s ratios over its yardsticks hold on a loaded machine? Runs idle and beside a noisy neighbour, in turn.

Usage: python scripts/limit_check.py [--runs 5] [--neighbour-procs 2] [--out results/limit_loop]

Each round runs ``kvblock-bench run`` on batched ``flat`` on ``paper`` (studies other than ``cache_state`` and
``limit_loop`` off) twice, once idle and once beside ``scripts/noisy_neighbour.py`` (the order swapped every other
round), and keeps the ``limit_loop`` rows and ``flat``'s own figures of each. It writes ``OUT/limit_check.csv`` (a
row per run and figure) and ``OUT/README.md`` (per condition: the runs whose ratio interval lies below 1 and above
1, and the medians), each written atomically.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "scripts")]

from compare_pairs import neighbour, run_meta, run_once  # noqa: E402

from harness.base.files import atomic_write_text  # noqa: E402
from harness.output.markdown import markdown_table  # noqa: E402
from harness.studies.limit_loop import YARDSTICKS  # noqa: E402

RUN_ARGS = ["--impl", "flat", "--scenario", "paper", "--regime", "batched", "--no-paced", "--no-l1d",
            "--no-allocations", "--no-table-copy"]
RATIOS = tuple(m for stick in YARDSTICKS for m in stick.ratios.values())
STICKS_WARM = tuple(stick.metrics["warm"] for stick in YARDSTICKS)
FIGURES = {("-", m) for stick in YARDSTICKS for m in stick.metrics.values()} | {("flat", m) for m in RATIOS} | {
    ("flat", "seq_step_alone_warm_ns"), ("flat", "seq_step_alone_cold_ns"), ("flat", "seq_step_ns")}


def figures(run: Path, condition: str, index: int) -> pd.DataFrame:
    """The run's figures this check keeps, with the condition, the round and the run's load."""
    df = pd.read_csv(run / "results.csv")
    wanted = pd.Series([(i, m) in FIGURES for i, m in zip(df.impl, df.metric, strict=True)], index=df.index)
    kept = df[(df.scenario == "paper") & (df.regime.isin(["batched", "-"])) & wanted]
    meta = run_meta(run)
    return kept.assign(condition=condition, round=index, run_id=meta["run_id"], commit=meta["commit"],
                       load_start=meta["load"][0], load_end=meta["load"][1])[
        ["condition", "round", "run_id", "commit", "load_start", "load_end", "impl", "metric", "value", "ci_low",
         "ci_high", "status"]]


def summary(rows: pd.DataFrame, procs: int) -> str:
    """The README: per condition and ratio, how many runs' intervals lie below 1 and above 1, and the medians."""
    lines = ["# `flat` over its yardsticks (the minimal decode loop, `flat` without its checks), idle and loaded", "",
             f"Written by `python scripts/limit_check.py` at `{rows.commit.iloc[0]}`: each round runs batched `flat` "
             f"on `paper` idle and beside `scripts/noisy_neighbour.py --procs {procs}` (busy, idle phases of 1-5 s), "
             "in turn; `limit_check.csv` has every figure of every run. A ratio below 1: `flat` takes less time "
             "than the yardstick. The load is the 1-minute load average at each run's end, which lags: an idle run "
             "that follows a loaded one still carries the neighbour in it.", ""]
    cells = []
    for condition in ("idle", "loaded"):
        part = rows[rows.condition == condition]
        for metric in (*RATIOS, *STICKS_WARM, "seq_step_alone_warm_ns"):
            r = part[part.metric == metric]
            below, above = int((r.ci_high < 1).sum()), int((r.ci_low > 1).sum())
            sides = f"{below} / {above} of {len(r)}" if metric in RATIOS else ""
            cells.append([condition, f"`{metric}`", sides, f"{r.value.median():.3g}",
                          f"{r.value.min():.3g}-{r.value.max():.3g}", f"{part.load_end.median():.2f}"])
    header = ["condition", "figure", "runs below 1 / above 1 (interval)", "median of the runs", "runs' range",
              "median load"]
    return "\n".join([*lines, *markdown_table(header, cells)]) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="rounds, each one idle run and one loaded run")
    parser.add_argument("--neighbour-procs", type=int, default=2)
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "limit_loop")
    args = parser.parse_args(argv)
    if not 1 <= args.runs <= 100:
        parser.error(f"--runs {args.runs}: give 1 to 100")
    parts = []
    with tempfile.TemporaryDirectory(prefix="limit-check-") as tmp:
        for index in range(args.runs):
            order = ("idle", "loaded") if index % 2 == 0 else ("loaded", "idle")
            for condition in order:
                with neighbour(condition == "loaded", args.neighbour_procs, index):
                    run, _ = run_once(RUN_ARGS, Path(tmp) / f"{condition}-{index}", 0.0, f"limit-{condition}")
                parts.append(figures(run, condition, index))
                print(f"round {index + 1}/{args.runs} {condition}: done", flush=True)
    rows = pd.concat(parts, ignore_index=True)
    args.out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(args.out / "limit_check.csv", rows.to_csv(index=False))
    atomic_write_text(args.out / "README.md", summary(rows, args.neighbour_procs))
    print((args.out / "README.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
