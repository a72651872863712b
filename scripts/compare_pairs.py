"""How often does ``kvblock-bench compare`` cry wolf, and does it catch a design made a third slower?

Usage: python scripts/compare_pairs.py [--pairs 5] [--out results/compare_pairs] [--work build/compare-pairs]
                                       [--thresholds 0,2,5,7.5,10,15,20,25,30] [--passes 0.75]
                                       [--run-args "ARGS OF kvblock-bench run"] [--resume] [--readme docs/ci.md]

Runs ``--pairs`` pairs of runs of this checkout (default: the CI profile, :mod:`harness.ci.profile`, plus the
slowed plug-in ``examples/slowed_flat``). In each pair BASE runs the plug-in as a pass-through wrapper of
``flat`` (``KVB_SLOWED_FLAT_PASSES=0``) and NEW with ``--passes`` extra slot-mapping passes per step; the order
of BASE and NEW alternates from pair to pair, so that a machine slowing down over the session favours neither.
Then ``kvblock-bench compare BASE NEW --format json`` (its exit status at the default threshold is recorded),
and at every candidate threshold:

- false alarms: rows reported slower or faster among all rows except the slowed ones (every other
  implementation's code, and the plug-in's lookup and alloc/free, are the same in both runs);
- detection: whether the slowed rows (the plug-in's ``seq_step_ns`` in every regime but per-call, whose calls
  the extra passes do not touch) are reported slower.

Writes ``<out>/pairs.json`` (every pair's runs, durations, exit status, the slowed rows' NEW/BASE, the failing
rows, and the counts per threshold) and ``<out>/pairs.md`` (the table docs/ci.md shows), atomically. With
``--readme FILE`` it only rewrites FILE's section between the compare-pairs markers from ``<out>/pairs.json``.
Exit status 0 when the default threshold had no false alarm and caught the slowed plug-in with exit status 1
in every pair, else 1.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harness.base.files import atomic_write_text
from harness.base.stats import Estimate
from harness.ci.profile import run_args as ci_run_args
from harness.output.compare import DEFAULT_THRESHOLD_PCT, verdict
from harness.run import metadata

ROOT = Path(__file__).resolve().parents[1]
PLUGIN_DIR = ROOT / "examples" / "slowed_flat"
PLUGIN = "slowed_flat:SlowedFlat"
PASSES_ENV = "KVB_SLOWED_FLAT_PASSES"
SLOWED_METRICS = ("seq_step_ns",)
UNTOUCHED_REGIMES = ("per-call",)  # the plug-in's per-call methods do no extra work
THRESHOLDS = (0, 2, 5, 7.5, 10, 15, 20, 25, 30)  # percent
BEGIN, END = "<!-- compare-pairs:begin -->", "<!-- compare-pairs:end -->"
PLACEHOLDER = ("*Not measured yet: `python scripts/compare_pairs.py --pairs 5` on the reference machine writes "
               "`results/compare_pairs/pairs.json`, and `python scripts/compare_pairs.py --readme docs/ci.md` fills "
               "this section from it.*")


def is_slowed(row: dict) -> bool:
    """Whether a compared row is one the slowed plug-in's extra passes make slower."""
    return row["impl"] == PLUGIN and row["metric"] in SLOWED_METRICS and row["regime"] not in UNTOUCHED_REGIMES


def run_once(args: list[str], results: Path, passes: float, label: str) -> tuple[Path, float]:
    """One ``kvblock-bench run`` into its own results folder; returns (run folder, seconds the run took)."""
    env = {**os.environ, PASSES_ENV: str(passes),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(PLUGIN_DIR), str(ROOT), os.environ.get("PYTHONPATH")]))}
    cmd = [sys.executable, "-m", "harness.cli", "run", *args, "--results", str(results), "--no-progress",
           "--label", label]
    print(f"$ {PASSES_ENV}={passes} {shlex.join(cmd[2:])}", flush=True)
    subprocess.run(cmd, env=env, cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
    finished = finished_run(results)
    if finished is None:
        raise SystemExit(f"{results}: the run ended without a complete run folder")
    return finished


def finished_run(results: Path) -> tuple[Path, float] | None:
    """(run folder, seconds the run took, from its meta.json's start and finish) of the complete run under
    ``results``; None if there is none. The same measure for a run made now and one reused by ``--resume``."""
    meta_path = results / "latest" / "meta.json"
    try:
        meta = json.loads(meta_path.read_text())
    except (OSError, ValueError):
        return None
    if not meta.get("complete"):
        return None
    took = datetime.fromisoformat(meta["finished"]) - datetime.fromisoformat(meta["started"])
    return meta_path.parent.resolve(), took.total_seconds()


def reused_run(results: Path) -> tuple[Path, float] | None:
    """``--resume``: the complete run already under ``results``, said so; None if there is none."""
    found = finished_run(results)
    if found is not None:
        print(f"reusing {found[0]} (--resume)", flush=True)
    return found


def compare_json(base: Path, new: Path) -> tuple[int, dict]:
    """``kvblock-bench compare BASE NEW --format json``: (exit status, document)."""
    proc = subprocess.run([sys.executable, "-m", "harness.cli", "compare", str(base), str(new), "--format", "json"],
                          cwd=ROOT, capture_output=True, text=True, check=False)
    if proc.returncode not in (0, 1):
        raise SystemExit(f"compare failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc.returncode, json.loads(proc.stdout)


def row_verdict(row: dict, threshold_pct: float) -> str:
    """The row's verdict at another threshold (from its interval of NEW/BASE)."""
    if row["ci_low"] is None or row["ci_high"] is None:
        return row["verdict"]
    return verdict(Estimate(row["ratio"], row["ci_low"], row["ci_high"]), threshold_pct / 100)[0]


def run_commit(run: Path) -> str:
    """The commit a run measured (its meta.json)."""
    return json.loads((run / "meta.json").read_text())["git_commit"]


def pair_summary(index: int, order: str, runs: dict, status: int, doc: dict) -> dict:
    """What the results file keeps of one pair."""
    slowed = [r for r in doc["rows"] if is_slowed(r)]
    return {
        "pair": index, "order": order, "exit_status": status, "counts": doc["counts"],
        "runs": {side: {"run_id": path.name, "seconds": round(seconds, 1), "commit": run_commit(path)}
                 for side, (path, seconds) in runs.items()},
        "slowed": [{k: r[k] for k in ("regime", "metric", "ratio", "ci_low", "ci_high", "verdict")} for r in slowed],
        "failing": [{k: r[k] for k in ("impl", "regime", "metric", "ratio", "ci_low", "ci_high", "verdict")}
                    for r in doc["rows"] if r["verdict"] in ("slower", "faster")],
        "rows": [{k: r[k] for k in ("impl", "regime", "metric", "ratio", "ci_low", "ci_high")}
                 for r in doc["rows"] if r["ratio"] is not None],
    }


def by_threshold(pairs: list[dict], thresholds: tuple[float, ...]) -> list[dict]:
    """Per candidate threshold: false alarms (rows reported slower, which fail CI, and faster; pairs with any)
    and the pairs whose slowed rows were all reported slower."""
    out = []
    for t in thresholds:
        slower, faster, alarm_pairs, caught = 0, 0, 0, 0
        for pair in pairs:
            verdicts = [(is_slowed(r), row_verdict(r, t)) for r in pair["rows"]]
            wrong = [v for slowed, v in verdicts if not slowed and v != "no difference"]
            slowed = [v for is_s, v in verdicts if is_s]
            slower += wrong.count("slower")
            faster += wrong.count("faster")
            alarm_pairs += bool(wrong)
            caught += bool(slowed) and all(v == "slower" for v in slowed)
        compared = sum(1 for pair in pairs for r in pair["rows"] if not is_slowed(r))
        out.append({"threshold_pct": t, "false_slower_rows": slower, "false_faster_rows": faster,
                    "false_alarm_rows": slower + faster, "rows_compared": compared,
                    "pairs_with_false_alarm": alarm_pairs, "pairs_caught": caught, "pairs": len(pairs)})
    return out


def suggested(table: list[dict]) -> float | None:
    """The smallest threshold with no false alarm in any pair that caught the slowed plug-in in every pair."""
    ok = [t["threshold_pct"] for t in table if t["false_alarm_rows"] == 0 and t["pairs_caught"] == t["pairs"]]
    return min(ok) if ok else None


def render_markdown(doc: dict) -> str:
    """The README's section: what was run, the counts per threshold, the slowed plug-in's ratio per pair."""
    default = doc["default_threshold_pct"]
    seconds = [run["seconds"] for pair in doc["pairs"] for run in pair["runs"].values()]
    lines = [
        f"{len(doc['pairs'])} pairs of runs of commit `{doc['commit']}` on {doc['machine']} ({doc['date']}), "
        f"each run `kvblock-bench run {doc['run_args']}` ({min(seconds):.0f}-{max(seconds):.0f} s a run, start "
        "to finish in its meta.json); in each "
        f"pair the slowed plug-in `{PLUGIN}` ran with 0 extra passes in BASE and {doc['passes']:g} in NEW. "
        "False alarms: rows reported slower (these fail CI) or faster among the rows whose code is the same in "
        "both runs.", "",
        "| threshold | false alarms: slower | false alarms: faster | pairs with a false alarm | pairs where the "
        "slowed plug-in was reported slower |", "|---|---|---|---|---|"]
    for t in doc["by_threshold"]:
        mark = " (default)" if t["threshold_pct"] == default else ""
        lines.append(f"| {t['threshold_pct']:g} %{mark} | {t['false_slower_rows']} of {t['rows_compared']} | "
                     f"{t['false_faster_rows']} of {t['rows_compared']} | {t['pairs_with_false_alarm']} of "
                     f"{t['pairs']} | {t['pairs_caught']} of {t['pairs']} |")
    ratios = "; ".join(f"pair {p['pair']}: " + ", ".join(
        f"{s['ratio']:.2f}× [{s['ci_low']:.2f}–{s['ci_high']:.2f}] {s['verdict']}" for s in p["slowed"])
        + f", exit {p['exit_status']}" for p in doc["pairs"])
    lines += ["", f"The slowed plug-in's `seq_step_ns`, NEW/BASE [95 %] and `compare`'s exit status at the default "
                  f"threshold: {ratios}."]
    return "\n".join(lines) + "\n"


def write_readme(readme: Path, results: Path) -> None:
    """Rewrite the README's compare-pairs section from ``results`` (the placeholder while it does not exist)."""
    text = readme.read_text()
    if text.count(BEGIN) != 1 or text.count(END) != 1:
        raise SystemExit(f"{readme}: needs one {BEGIN} and one {END}")
    body = render_markdown(json.loads(results.read_text())) if results.is_file() else PLACEHOLDER + "\n"
    head, rest = text.split(BEGIN)
    atomic_write_text(readme, head + BEGIN + "\n" + body + END + rest.split(END, 1)[1])


def measure(args: argparse.Namespace) -> dict:
    """Run the pairs and compare each; the results document."""
    run_args = shlex.split(args.run_args) if args.run_args else ci_run_args([PLUGIN])
    pairs = []
    for i in range(1, args.pairs + 1):
        order = ("BASE", "NEW") if i % 2 else ("NEW", "BASE")
        runs = {side: (args.resume and reused_run(args.work / f"pair{i}" / side.lower()))
                or run_once(run_args, args.work / f"pair{i}" / side.lower(), 0 if side == "BASE" else args.passes,
                            f"pair{i}-{side.lower()}") for side in order}
        status, doc = compare_json(runs["BASE"][0], runs["NEW"][0])
        pairs.append(pair_summary(i, " then ".join(order), runs, status, doc))
        print(f"pair {i}: exit {status}, {doc['counts']}", flush=True)
    meta = metadata.collect()
    table = by_threshold(pairs, tuple(args.thresholds))
    commits = sorted({run["commit"] for pair in pairs for run in pair["runs"].values()})
    return {"commit": ", ".join(commits), "machine": f"{meta['cpu_model']} ({meta['cpu_count']} CPUs)",
            "date": time.strftime("%Y-%m-%d"), "run_args": shlex.join(run_args), "passes": args.passes,
            "default_threshold_pct": DEFAULT_THRESHOLD_PCT, "by_threshold": table,
            "suggested_threshold_pct": suggested(table), "pairs": pairs}


def thresholds(text: str) -> list[float]:
    return sorted({float(x) for x in text.split(",")})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "compare_pairs")
    parser.add_argument("--work", type=Path, default=ROOT / "build" / "compare-pairs", help="where the runs go")
    parser.add_argument("--thresholds", type=thresholds, default=list(THRESHOLDS), help="percentages, comma-separated")
    parser.add_argument("--passes", type=float, default=0.75, help="the slowed plug-in's extra passes per step in NEW")
    parser.add_argument("--run-args", help="arguments of `kvblock-bench run` (default: the CI profile + the plug-in)")
    parser.add_argument("--resume", action="store_true",
                        help="reuse a side's complete run already in --work (an interrupted campaign goes on)")
    parser.add_argument("--readme", type=Path, help="only rewrite this file's section from <out>/pairs.json "
                                                    "(docs/ci.md)")
    args = parser.parse_args(argv)
    if args.readme:
        write_readme(args.readme, args.out / "pairs.json")
        return 0
    doc = measure(args)
    args.out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(args.out / "pairs.json", json.dumps(doc, indent=1) + "\n")
    atomic_write_text(args.out / "pairs.md", render_markdown(doc))
    print(render_markdown(doc), end="")
    default = next(t for t in doc["by_threshold"] if t["threshold_pct"] == doc["default_threshold_pct"]) if (
        doc["default_threshold_pct"] in [t["threshold_pct"] for t in doc["by_threshold"]]) else None
    exits_ok = all(p["exit_status"] == 1 for p in doc["pairs"])
    good = default is not None and default["false_alarm_rows"] == 0 and default["pairs_caught"] == default["pairs"]
    found = doc["suggested_threshold_pct"]
    print(f"suggested threshold: {'none of those tried' if found is None else f'{found:g} %'}; at the default "
          f"{doc['default_threshold_pct']:g} %: {'no false alarm, every pair caught' if good else 'NOT clean'}; "
          f"compare exited 1 in {sum(p['exit_status'] == 1 for p in doc['pairs'])} of {len(doc['pairs'])} pairs")
    return 0 if good and exits_ok else 1


if __name__ == "__main__":
    sys.exit(main())
