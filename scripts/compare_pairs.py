"""How often do ``kvblock-bench compare`` and ``ab`` cry wolf, and do they catch a slowed design, idle and loaded?

Usage: python scripts/compare_pairs.py [--pairs 10] [--modes ab,separate] [--kinds same,slowed] [--neighbour off,on]
                                       [--pairs-for ab-on-same=10,separate-off-slowed=3]
                                       [--passes 0.35] [--thresholds 0,2,5,7.5,10,15,20,25,30]
                                       [--run-args "ARGS OF kvblock-bench run"] [--neighbour-procs 2]
                                       [--out results/compare_pairs] [--work build/compare-pairs] [--resume]
       python scripts/compare_pairs.py --readme       (rewrite pairs.md and the sections from <out>/pairs.json)

A configuration is a mode, a kind and the neighbour. Modes: ``separate``, two ``kvblock-bench run`` of this
checkout one after the other (their order alternating from pair to pair), then ``compare``; ``ab``, one
``kvblock-bench ab BASE NEW`` of two commits made on top of HEAD that differ, if at all, in the slowed plug-in's
default only (``examples/slowed_flat``, ``DEFAULT_PASSES``: deterministic extra slot-mapping passes per step).
Kinds: ``same``, both sides' plug-in at 0 passes (the code is the same: every row reported slower or faster is a
false alarm); ``slowed``, NEW's at ``--passes`` (its batched and step ``seq_step_ns`` rows must be reported slower,
with exit status 1; every other row's code is the same). The neighbour: ``scripts/noisy_neighbour.py`` running
beside the pair, or not. Pair i of every configuration runs before pair i + 1 of any, so the machine's drift over
the session is shared; ``--pairs-for`` gives a configuration (``MODE-NEIGHBOUR-KIND``) fewer or more pairs than
``--pairs``. The results so far are kept in ``<work>/pairs.json`` after every pair. The run is the CI profile
plus the plug-in (:mod:`harness.ci.profile`) unless
``--run-args``.

Writes ``<out>/pairs.json`` (every pair: configuration, exit status, seconds, load, every compared row) and
``<out>/pairs.md``, and the generated sections of docs/ci.md and README.md (:mod:`harness.output.sections`).
Exit status 0 when ``ab`` under the neighbour met the targets (no same pair with a false alarm, at least 9 in 10
slowed pairs caught with exit status 1), else 1.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import math
import os
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np

from harness.base.files import atomic_write_text
from harness.base.host import machine_name
from harness.base.interrupts import interruptible
from harness.base.stats import Estimate, log_interval
from harness.ci.ab import AB_THRESHOLD_PCT
from harness.ci.profile import run_args as ci_run_args
from harness.errors import TooFewPairs
from harness.output import sections
from harness.output.compare import DEFAULT_THRESHOLD_PCT, MIN_PAIRS, verdict
from harness.output.markdown import markdown_table
from harness.run import metadata

ROOT = Path(__file__).resolve().parents[1]
PLUGIN_DIR = ROOT / "examples" / "slowed_flat"
PLUGIN_FILE = PLUGIN_DIR / "slowed_flat.py"
PLUGIN = "slowed_flat:SlowedFlat"
PASSES_ENV = "KVB_SLOWED_FLAT_PASSES"
NEIGHBOUR = ROOT / "scripts" / "noisy_neighbour.py"
CHILD_GRACE_S = 60  # an interrupted ab removes its worktrees within this
SLOWED_METRICS = ("seq_step_ns",)
UNTOUCHED_REGIMES = ("per-call",)  # the plug-in's per-call methods do no extra work
THRESHOLDS = (0, 2, 5, 7.5, 10, 15, 20, 25, 30)  # percent
# Every mode ab offers, as the options it adds to the run's: its defaults (8 repetitions, a process each), --quick
# (short traces, the fewest pairs a verdict may rest on), fewer processes than repetitions, fewer pairs than a
# verdict needs (it must refuse: exit 4), and many pairs of quick runs (whose subsets say how many pairs a verdict
# needs: "Pairs needed").
AB_MODES = {"ab": [], "ab-quick": ["--quick"], "ab-processes": ["--processes", str(MIN_PAIRS)],
            "ab-few": ["--reps", str(MIN_PAIRS - 1)], "ab-quick-wide": ["--quick", "--reps", "16"]}
DEFAULT_THRESHOLDS = {**{mode: AB_THRESHOLD_PCT for mode in AB_MODES}, "separate": DEFAULT_THRESHOLD_PCT}
MODES, KINDS, NEIGHBOURS = (*AB_MODES, "separate"), ("same", "slowed"), ("off", "on")
EXITS = (0, 1, 2, TooFewPairs.exit_status)
SUBSETS = 200  # subsets of n pairs drawn per row (all of them where there are fewer)
MAX_FALSE_SHARE = 0.05  # "Pairs needed": a 95 % interval's own error rate, for the share of runs with a false alarm
CAUGHT_SHARE = 0.9  # the targets: 9 of 10 slowed pairs caught
BEGIN, END = "<!-- compare-pairs:begin -->", "<!-- compare-pairs:end -->"
SUMMARY_BEGIN, SUMMARY_END = "<!-- compare-pairs-summary:begin -->", "<!-- compare-pairs-summary:end -->"
PLACEHOLDER = ("*Not measured yet: `python scripts/compare_pairs.py --pairs 10` writes "
               "`results/compare_pairs/pairs.json` and fills this section from it.*")
LEGACY = {"mode": "separate", "neighbour": "off", "kind": "slowed"}  # a results file from before configurations


# -- what a pair's rows say -----------------------------------------------------------------------------------------
def plugin_row(row: dict) -> bool:
    """Whether a compared row is one the slowed plug-in's extra passes change (when it has any)."""
    return row["impl"] == PLUGIN and row["metric"] in SLOWED_METRICS and row["regime"] not in UNTOUCHED_REGIMES


def is_slowed(row: dict, kind: str = "slowed") -> bool:
    """Whether a compared row of a pair of ``kind`` is meant to be slower."""
    return kind == "slowed" and plugin_row(row)


def same_code(row: dict, kind: str = "slowed") -> bool:
    """Whether a compared row measures the same code on both sides (every row it reports is a false alarm). In a
    slowed pair the plug-in's whole-step regimes do not: the extra pass leaves the table warm for the lookup timed
    next (its per-call regime does no extra work)."""
    return kind != "slowed" or row["impl"] != PLUGIN or row["regime"] in UNTOUCHED_REGIMES


def row_verdict(row: dict, threshold_pct: float) -> str:
    """The row's verdict at another threshold (from its interval of NEW/BASE)."""
    if row["ci_low"] is None or row["ci_high"] is None:
        return row["verdict"]
    return verdict(Estimate(row["ratio"], row["ci_low"], row["ci_high"]), threshold_pct / 100)[0]


def detectable(row: dict, threshold_pct: float) -> float | None:
    """The smallest slowdown (percent) the row's interval would have reported at the threshold."""
    if not row.get("ci_low") or row.get("ratio") is None:
        return None
    return ((1 + threshold_pct / 100) * row["ratio"] / row["ci_low"] - 1) * 100


def by_threshold(pairs: list[dict], thresholds: tuple[float, ...], kind: str = "slowed") -> list[dict]:
    """Per candidate threshold: false alarms (rows of the same code reported slower, which fail CI, or faster;
    pairs with any) and, for slowed pairs, the pairs whose slowed rows were all reported slower."""
    out = []
    for t in thresholds:
        slower, faster, alarm_pairs, caught = 0, 0, 0, 0
        for pair in pairs:
            verdicts = [(r, row_verdict(r, t)) for r in pair["rows"]]
            wrong = [v for r, v in verdicts if same_code(r, kind) and v != "no difference"]
            slowed = [v for r, v in verdicts if is_slowed(r, kind)]
            slower += wrong.count("slower")
            faster += wrong.count("faster")
            alarm_pairs += bool(wrong)
            caught += bool(slowed) and all(v == "slower" for v in slowed)
        compared = sum(1 for pair in pairs for r in pair["rows"] if same_code(r, kind))
        out.append({"threshold_pct": t, "false_slower_rows": slower, "false_faster_rows": faster,
                    "false_alarm_rows": slower + faster, "rows_compared": compared,
                    "pairs_with_false_alarm": alarm_pairs, "pairs_caught": caught, "pairs": len(pairs)})
    return out


def suggested(table: list[dict], caught: float = 1.0) -> float | None:
    """The smallest threshold with no false alarm in any pair that caught the slowed plug-in in ``caught`` of them."""
    ok = [t["threshold_pct"] for t in table
          if t["false_alarm_rows"] == 0 and t["pairs_caught"] >= math.ceil(caught * t["pairs"])]
    return min(ok) if ok else None


def caught_in_nine_of_ten(pairs: list[dict], threshold_pct: float) -> float | None:
    """The smallest slowdown (percent) the plug-in's rows would have reported in 9 of 10 of ``pairs``: each pair's
    least precise plug-in row's :func:`detectable`, the 90th percentile over pairs."""
    needs = sorted(max(d) for d in ([detectable(r, threshold_pct) for r in p["rows"] if plugin_row(r)]
                                    for p in pairs) if d and None not in d)
    return needs[max(0, math.ceil(CAUGHT_SHARE * len(needs)) - 1)] if needs else None


# -- how many pairs a verdict needs ---------------------------------------------------------------------------------
def subsets(count: int, n: int, seed: int = 0) -> list[tuple[int, ...]]:
    """Subsets of ``n`` of ``count`` pairs: all of them when there are at most :data:`SUBSETS`, else as many drawn."""
    if math.comb(count, n) <= SUBSETS:
        return list(itertools.combinations(range(count), n))
    rng = np.random.default_rng(seed)
    return [tuple(sorted(rng.choice(count, n, replace=False))) for _ in range(SUBSETS)]


def by_pair_count(pairs: list[dict], kind: str, threshold_pct: float) -> list[dict]:
    """Per count n of pairs of processes: every ab pair judged again from subsets of n of its pairs of processes (the
    same subset for all its rows, ab's interval): the subsets with a same-code row judged slower or faster (a false
    alarm), and those whose slowed rows were all reported slower."""
    runs = [rows for rows in ([r for r in p["rows"] if len(r.get("pairs") or []) >= 2] for p in pairs) if rows]
    counts = [min(len(r["pairs"]) for r in rows) for rows in runs]
    out = []
    for n in range(2, max(counts, default=1) + 1):
        judged = wrong = caught = 0
        for i, (rows, count) in enumerate((rows, c) for rows, c in zip(runs, counts, strict=True) if c >= n):
            logs = [np.log(np.asarray(r["pairs"][:count], dtype=float)) for r in rows]
            for pick in subsets(count, n, seed=i):
                said = [verdict(log_interval(x[list(pick)]), threshold_pct / 100)[0] for x in logs]
                slowed = [v for r, v in zip(rows, said, strict=True) if is_slowed(r, kind)]
                judged += 1
                wrong += any(v != "no difference" for r, v in zip(rows, said, strict=True) if same_code(r, kind))
                caught += bool(slowed) and all(v == "slower" for v in slowed)
        out.append({"pairs": n, "judged": judged, "wrong": wrong, "caught": caught})
    return out


def least_pairs(table: list[dict]) -> int | None:
    """The fewest pairs from which on every count measured gave at most :data:`MAX_FALSE_SHARE` of its same-code
    runs a false alarm (None: no count did, or nothing was judged)."""
    fine = [t["pairs"] for t in table if t["judged"] and t["wrong"] <= MAX_FALSE_SHARE * t["judged"]]
    bad = [t["pairs"] for t in table if t["judged"] and t["pairs"] not in fine]
    return min((n for n in fine if all(b < n for b in bad)), default=None)


def pairs_needed(doc: dict) -> tuple[list[tuple[dict, list[dict]]], int | None]:
    """Per ab configuration with pairs recorded: :func:`by_pair_count`; and the fewest pairs every configuration
    beside the neighbour supports (:func:`least_pairs`, the most over them)."""
    found = [(config, by_pair_count(pairs, config["kind"], default_threshold(doc, config["mode"])))
             for config, pairs in configs_of(doc) if config["mode"] in AB_MODES]
    found = [(config, table) for config, table in found if table]
    needs = [least_pairs(table) for config, table in found if config["neighbour"] == "on"]
    return found, (None if not needs or None in needs else max(needs))


def pairs_needed_lines(doc: dict) -> list[str]:
    """docs/ci.md's "Pairs needed": per configuration and count of pairs, the false alarms and slowed pairs caught."""
    found, least = pairs_needed(doc)
    if not found:
        return []
    counts = sorted({t["pairs"] for _, table in found for t in table})
    lines = ["Pairs needed: each ab pair judged again from subsets of n of its pairs of processes (up to "
             f"{SUBSETS} per pair, the same for all its rows, at ab's threshold): those with a false alarm (a row of "
             "the same code on both sides reported slower or faster); of slowed pairs, those whose slowed rows were "
             f"all reported slower. The fewest pairs with at most {MAX_FALSE_SHARE:.0%} alarmed at that count and "
             "every larger one, beside the neighbour: "
             f"{least if least is not None else 'none'} (ab's minimum: {MIN_PAIRS}).", ""]
    rows = []
    for config, table in found:
        by_n = {t["pairs"]: t for t in table}
        rows.append([config["mode"], config["neighbour"], config["kind"],
                     *(_pair_cell(by_n.get(n), config["kind"]) for n in counts)])
    return [*lines, *markdown_table(["mode", "neighbour", "kind", *(f"{n} pairs" for n in counts)], rows), ""]


def _pair_cell(t: dict | None, kind: str) -> str:
    if t is None:
        return "—"
    alarms = f"{t['wrong']} of {t['judged']} alarmed"
    return alarms + (f", {t['caught']} caught" if kind == "slowed" else "")


# -- running pairs ----------------------------------------------------------------------------------------------
def _env(passes: float | None) -> dict[str, str]:
    """The runs' environment: the plug-in on PYTHONPATH; its passes set (separate) or left to each commit (ab)."""
    env = {k: v for k, v in os.environ.items() if k != PASSES_ENV}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PLUGIN_DIR), str(ROOT), os.environ.get("PYTHONPATH")]))
    return env if passes is None else {**env, PASSES_ENV: str(passes)}


def finished_run(results: Path) -> tuple[Path, float] | None:
    """(run folder, seconds from its meta.json's start to finish) of the complete run ``results/latest``."""
    meta_path = results / "latest" / "meta.json"
    try:
        meta = json.loads(meta_path.read_text())
    except (OSError, ValueError):
        return None
    if not meta.get("complete"):
        return None
    took = datetime.fromisoformat(meta["finished"]) - datetime.fromisoformat(meta["started"])
    return meta_path.parent.resolve(), took.total_seconds()


def run_child(cmd: list[str], **kwargs) -> subprocess.CompletedProcess:
    """``subprocess.run`` whose child, when this script is interrupted (Ctrl-C, SIGTERM), is sent SIGTERM and given
    :data:`CHILD_GRACE_S` to clean up (``ab`` removes its worktrees) before it is killed."""
    with subprocess.Popen(cmd, **kwargs) as proc:
        try:
            out, err = proc.communicate()
        except KeyboardInterrupt:
            proc.terminate()
            try:
                proc.wait(CHILD_GRACE_S)
            except subprocess.TimeoutExpired:
                proc.kill()
            raise
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def run_once(args: list[str], results: Path, passes: float, label: str) -> tuple[Path, float]:
    """One ``kvblock-bench run`` into its own results folder; returns (run folder, seconds the run took)."""
    cmd = [sys.executable, "-m", "harness.cli", "run", *args, "--results", str(results), "--no-progress",
           "--label", label]
    print(f"$ {PASSES_ENV}={passes} {shlex.join(cmd[2:])}", flush=True)
    done = run_child(cmd, env=_env(passes), cwd=ROOT, stdout=subprocess.DEVNULL)
    if done.returncode:
        raise SystemExit(f"{shlex.join(cmd[2:])} failed ({done.returncode})")
    finished = finished_run(results)
    if finished is None:
        raise SystemExit(f"{results}: the run ended without a complete run folder")
    return finished


def cli_json(cmd: list[str], env: dict[str, str] | None = None) -> tuple[int, dict]:
    """A ``kvblock-bench compare`` or ``ab`` with ``--format json``: (exit status, document; empty for ab's refusal
    of too few pairs, which measures nothing)."""
    proc = run_child([sys.executable, "-m", "harness.cli", *cmd, "--format", "json"], cwd=ROOT, env=env,
                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if proc.returncode == TooFewPairs.exit_status and not proc.stdout.strip():
        return proc.returncode, {}
    if proc.returncode not in (0, 1, TooFewPairs.exit_status):
        raise SystemExit(f"{cmd[0]} failed ({proc.returncode}): {proc.stderr.strip()[-2000:]}")
    return proc.returncode, json.loads(proc.stdout)


def git(*args: str, cwd: Path = ROOT) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


def plugin_commit(passes: float) -> str:
    """A commit on top of HEAD whose slowed plug-in makes ``passes`` extra passes by default, nothing else changed
    (made in a temporary worktree; ``ab`` checks it out as BASE or NEW)."""
    with tempfile.TemporaryDirectory(prefix="compare-pairs-") as tmp:
        tree = Path(tmp) / "tree"
        git("worktree", "add", "--quiet", "--detach", str(tree), "HEAD")
        try:
            source = tree / PLUGIN_FILE.relative_to(ROOT)
            source.write_text(re.sub(r"^DEFAULT_PASSES = .*$", f"DEFAULT_PASSES = {passes!r}", source.read_text(),
                                     count=1, flags=re.M))
            git("-c", "user.name=compare_pairs", "-c", "user.email=compare_pairs@localhost", "commit", "--quiet",
                "--allow-empty", "-am", f"compare_pairs: the slowed plug-in at {passes:g} extra passes", cwd=tree)
            return git("rev-parse", "HEAD", cwd=tree)
        finally:
            git("worktree", "remove", "--force", str(tree))


@contextlib.contextmanager
def neighbour(on: bool, procs: int, seed: int, duration_s: int = 7200) -> Iterator[None]:
    """scripts/noisy_neighbour.py running for the block (nothing when not ``on``)."""
    if not on:
        yield
        return
    proc = subprocess.Popen([sys.executable, str(NEIGHBOUR), "--procs", str(procs), "--duration", str(duration_s),
                             "--seed", str(seed)], cwd=ROOT)
    try:
        time.sleep(2)  # its processes started
        yield
    finally:
        proc.terminate()
        proc.wait(30)


def run_meta(run: Path) -> dict:
    meta = json.loads((run / "meta.json").read_text())
    return {"run_id": run.name, "commit": meta["git_commit"], "load": [meta.get("load_average", [None])[0],
                                                                       (meta.get("load_average_end") or [None])[0]]}


def separate_pair(args: argparse.Namespace, run_args: list[str], work: Path, index: int, kind: str) -> tuple:
    """Two runs, one after the other (the order alternating with ``index``), then compare."""
    order = ("BASE", "NEW") if index % 2 else ("NEW", "BASE")
    passes = {"BASE": 0.0, "NEW": args.passes if kind == "slowed" else 0.0}
    runs = {}
    for side in order:
        folder = work / side.lower()
        runs[side] = (args.resume and finished_run(folder)) or run_once(run_args, folder, passes[side],
                                                                         f"pair{index}-{side.lower()}")
    status, doc = cli_json(["compare", str(runs["BASE"][0]), str(runs["NEW"][0])])
    return status, doc, " then ".join(order), {side: {**run_meta(path), "seconds": round(seconds, 1)}
                                                  for side, (path, seconds) in runs.items()}


def ab_pair(args: argparse.Namespace, run_args: list[str], work: Path, commits: dict[str, str], kind: str,
            mode: str = "ab") -> tuple:
    """One ``kvblock-bench ab`` (with ``mode``'s options) of the 0-pass commit against the 0-pass (same) or the
    slowed one; each row with its NEW/BASE per pair of processes (``ab.json``). A refusal measures nothing."""
    done = work / "latest" / "compare.json"
    if args.resume and done.is_file():
        doc = json.loads(done.read_text())
        status = doc["exit_status"]
    else:
        new = commits["slowed" if kind == "slowed" else "same"]
        argv = [*run_args, *AB_MODES[mode]]
        print(f"$ kvblock-bench ab {commits['same'][:12]} {new[:12]} {shlex.join(argv)}", flush=True)
        status, doc = cli_json(["ab", commits["same"], new, *argv, "--results", str(work), "--no-progress",
                                "--no-counts"], _env(None))
    if not doc:
        return status, {"counts": {}, "rows": []}, "refused", {}
    paired = json.loads((Path(doc["new"]["path"]) / "ab.json").read_text()).get("paired", [])
    ratios = {(r["scenario"], r["impl"], r["regime"], r["metric"]): r.get("pairs", []) for r in paired}
    for row in doc["rows"]:
        row["pairs"] = ratios.get((row["scenario"], row["impl"], row["regime"], row["metric"]), [])
    runs = {side: run_meta(Path(doc[side.lower()]["path"])) for side in ("BASE", "NEW")}
    seconds = finished_run(work)
    return status, doc, "interleaved", {side: {**run, "seconds": round(seconds[1], 1) if seconds else None}
                                         for side, run in runs.items()}


def already_measured(work: Path, config: dict) -> bool:
    """Whether ``--resume`` finds the pair measured in ``work`` (its seconds then are its runs' own)."""
    if config["mode"] in AB_MODES:
        return (work / "latest" / "compare.json").is_file()
    return all(finished_run(work / side) for side in ("base", "new"))


def pair_seconds(pair: dict) -> float:
    """A pair's seconds: as timed when it ran, else its runs' own (an ab pair's sides share one run)."""
    if pair.get("seconds"):
        return pair["seconds"]
    each = [r.get("seconds") or 0 for r in pair["runs"].values()]
    return max(each, default=0) if pair.get("order") == "interleaved" else sum(each)


def pair_summary(index: int, config: dict, result: tuple, seconds: float | None) -> dict:
    """What the results file keeps of one pair."""
    status, doc, order, runs = result
    keys = ("impl", "regime", "metric", "ratio", "ci_low", "ci_high")
    return {
        **config, "pair": index, "order": order, "exit_status": status, "counts": doc["counts"],
        "seconds": None if seconds is None else round(seconds, 1), "runs": runs,
        "slowed": [{**{k: r[k] for k in keys[1:]}, "verdict": r["verdict"]} for r in doc["rows"] if plugin_row(r)],
        "failing": [{**{k: r[k] for k in keys}, "verdict": r["verdict"]} for r in doc["rows"]
                    if r["verdict"] in ("slower", "faster")],
        "rows": [{**{k: r[k] for k in keys}, **({"pairs": r["pairs"]} if r.get("pairs") else {})}
                 for r in doc["rows"] if r["ratio"] is not None],
    }


def configurations(args: argparse.Namespace) -> list[dict]:
    return [{"mode": m, "neighbour": n, "kind": k} for m, n, k in itertools.product(args.modes, args.neighbour,
                                                                                   args.kinds)]


def pairs_for(text: str) -> dict[str, int]:
    """``CONFIG=N,...`` (CONFIG: ``MODE-NEIGHBOUR-KIND``) -> pairs per configuration."""
    names = {f"{m}-{n}-{k}" for m, n, k in itertools.product(MODES, NEIGHBOURS, KINDS)}
    out = {}
    for item in filter(None, text.split(",")):
        name, _, count = item.partition("=")
        if name not in names or not count.isdigit():
            raise argparse.ArgumentTypeError(f"{item!r}: give CONFIG=N with CONFIG one of {', '.join(sorted(names))}")
        out[name] = int(count)
    return out


def config_name(config: dict) -> str:
    return f"{config['mode']}-{config['neighbour']}-{config['kind']}"


def measure(args: argparse.Namespace) -> dict:
    """Every configuration's pairs, pair i of each before pair i + 1 of any; the results document."""
    run_args = shlex.split(args.run_args) if args.run_args else ci_run_args([PLUGIN])
    commits = ({"same": plugin_commit(0.0), "slowed": plugin_commit(args.passes)}
               if set(args.modes) & set(AB_MODES) else {})
    pairs: list[dict] = []
    meta = metadata.collect()
    counts = {config_name(c): args.pairs_for.get(config_name(c), args.pairs) for c in configurations(args)}
    for index, config in itertools.product(range(1, max(counts.values(), default=0) + 1), configurations(args)):
        if index > counts[config_name(config)]:
            continue
        work = args.work / config_name(config) / f"pair{index}"
        started, kept = time.monotonic(), args.resume and already_measured(work, config)
        with neighbour(config["neighbour"] == "on" and not kept, args.neighbour_procs, index):
            result = (ab_pair(args, run_args, work, commits, config["kind"], config["mode"])
                      if config["mode"] in AB_MODES else separate_pair(args, run_args, work, index, config["kind"]))
        pairs.append(pair_summary(index, config, result, None if kept else time.monotonic() - started))
        print(f"{config_name(config)} pair {index}: exit {result[0]}, {result[1]['counts']}", flush=True)
        atomic_write_text(args.work / "pairs.json", json.dumps(document(args, run_args, pairs, meta), indent=1) + "\n")
    return document(args, run_args, pairs, meta)


def document(args: argparse.Namespace, run_args: list[str], pairs: list[dict], meta: dict) -> dict:
    """The results document of ``pairs`` measured so far (``meta``: this machine's, :func:`metadata.collect`)."""
    return {"commit": metadata.git_commit(), "machine": machine_name(meta),
            "date": time.strftime("%Y-%m-%d"), "run_args": shlex.join(run_args), "passes": args.passes,
            "neighbour_procs": args.neighbour_procs, "default_threshold_pct": DEFAULT_THRESHOLDS,
            "thresholds": list(args.thresholds), "pairs": pairs}


# -- the results, summarised ------------------------------------------------------------------------------------
def configs_of(doc: dict) -> list[tuple[dict, list[dict]]]:
    """Each configuration of the document with its pairs (a file from before configurations: one, :data:`LEGACY`)."""
    pairs = [{**LEGACY, **p} for p in doc["pairs"]]
    found = list(dict.fromkeys(config_name(p) for p in pairs))
    return [({k: group[0][k] for k in LEGACY}, group)
            for group in ([p for p in pairs if config_name(p) == name] for name in found)]


def summarise(config: dict, pairs: list[dict], thresholds: tuple[float, ...], default: float) -> dict:
    """One configuration at every threshold, and at the default: exit statuses, seconds, the slowdown caught."""
    table = by_threshold(pairs, thresholds, config["kind"])
    at = next((t for t in table if t["threshold_pct"] == default), None)
    seconds = [pair_seconds(p) for p in pairs]
    return {**config, "pairs": len(pairs), "by_threshold": table, "at_default": at,
            "exits": {str(s): sum(p["exit_status"] == s for p in pairs) for s in EXITS},
            "seconds": [min(seconds), max(seconds)], "caught_9_of_10_pct": caught_in_nine_of_ten(pairs, default)}


def default_threshold(doc: dict, mode: str) -> float:
    """The threshold ``mode``'s command used by default when the pairs were made (one for both in older files)."""
    default = doc["default_threshold_pct"]
    return float(default[mode] if isinstance(default, dict) else default)


def defaults_words(doc: dict) -> str:
    """"10 %", or "ab's 5 %, separate's 10 %" when the modes' defaults differ."""
    found = {mode: default_threshold(doc, mode) for mode in dict.fromkeys(p.get("mode", "separate")
                                                                           for p in doc["pairs"])}
    if len(set(found.values())) == 1:
        return f"{next(iter(found.values())):g} %"
    return ", ".join(f"{mode}'s {t:g} %" for mode, t in found.items())


def summaries(doc: dict) -> list[dict]:
    thresholds = tuple(doc.get("thresholds") or THRESHOLDS)
    return [summarise(c, p, tuple(sorted({*thresholds, default_threshold(doc, c["mode"])})),
                      default_threshold(doc, c["mode"])) for c, p in configs_of(doc)]


def _pct(x: float | None) -> str:
    return "—" if x is None else f"{x:+.1f} %"


SUMMARY_HEADER = ["mode", "neighbour", "kind", "exit 0 / 1 / 2 / 4", "pairs with a false alarm",
                  "slowed pairs caught (each slowed row: median NEW/BASE, reported slower)",
                  "slowdown caught in 9 of 10", "seconds a pair"]


def summary_table(doc: dict) -> list[str]:
    """Per configuration at the default threshold: false alarms, slowed pairs caught, the slowdown caught in 9 of
    10, seconds per pair."""
    rows = []
    for s, (_, pairs) in zip(summaries(doc), configs_of(doc), strict=True):
        at = s["at_default"] or {}
        catches = row_catches(pairs, default_threshold(doc, s["mode"])) or "none judged"
        caught = f"{at.get('pairs_caught', '—')} of {s['pairs']} ({catches})" if s["kind"] == "slowed" else "—"
        rows.append([s["mode"], s["neighbour"], s["kind"], " / ".join(str(s["exits"].get(str(x), 0)) for x in EXITS),
                     f"{at.get('pairs_with_false_alarm', '—')} of {s['pairs']}", caught,
                     _pct(s["caught_9_of_10_pct"]), f"{s['seconds'][0]:.0f}-{s['seconds'][1]:.0f}"])
    return markdown_table(SUMMARY_HEADER, rows)


def slowed_row_stats(pairs: list[dict], default: float) -> list[tuple[tuple[str, str], list[float], int]]:
    """Per slowed row (regime, metric) of ``pairs``: its NEW/BASE over the pairs, sorted, and how many of them were
    reported slower at ``default``."""
    found = [r for p in pairs for r in p["rows"] if plugin_row(r)]
    out = []
    for key in dict.fromkeys((r["regime"], r["metric"]) for r in found):
        rows = [r for r in found if (r["regime"], r["metric"]) == key]
        out.append((key, sorted(r["ratio"] for r in rows), sum(row_verdict(r, default) == "slower" for r in rows)))
    return out


def row_catches(pairs: list[dict], default: float) -> str:
    """"batched 1.15x, 10; step 1.21x, 10": each slowed row's median NEW/BASE and how often it was reported slower."""
    return "; ".join(f"{key[0]} {statistics.median(ratios):.2f}x, {caught}"
                     for key, ratios, caught in slowed_row_stats(pairs, default))


def slowed_rows(doc: dict) -> list[str]:
    """Per slowed configuration and slowed row: NEW/BASE over its pairs (median, range) and how often it was
    reported slower at the mode's default threshold, so each catch rate stands beside the slowdown it caught."""
    rows = []
    for config, pairs in configs_of(doc):
        if config["kind"] != "slowed":
            continue
        for key, ratios, caught in slowed_row_stats(pairs, default_threshold(doc, config["mode"])):
            rows.append([config["mode"], config["neighbour"], f"{key[0]} {key[1]}",
                         f"{statistics.median(ratios):.3f}x [{ratios[0]:.3f}-{ratios[-1]:.3f}]",
                         f"{caught} of {len(ratios)}"])
    return markdown_table(["mode", "neighbour", "slowed row", "NEW/BASE: median [range] over pairs",
                           "reported slower"], rows)


def render_markdown(doc: dict) -> str:
    """docs/ci.md's section: what was run, the summary, every configuration at every threshold."""
    lines = [f"{len(doc['pairs'])} pairs in all, of commit `{doc['commit']}` on {doc['machine']} ({doc['date']}), "
             "each side "
             f"`kvblock-bench run {doc['run_args']}` (the slowed plug-in `{PLUGIN}` among them, "
             f"{doc['passes']:g} extra passes per step in slowed pairs); the neighbour: "
             + (f"{doc['neighbour_procs']} processes of `scripts/noisy_neighbour.py`" if "neighbour_procs" in doc
                else "none (this file predates it)")
             + f". At each command's default threshold ({defaults_words(doc)}):", "",
             *summary_table(doc), "", "Each slowed row of the plug-in, at the same thresholds:", "",
             *slowed_rows(doc), "", *pairs_needed_lines(doc),
             "False alarms and slowed pairs caught at each threshold (false-alarm rows of all compared rows "
             "whose code is the same):", ""]
    for s in summaries(doc):
        lines += [f"*{s['mode']}, neighbour {s['neighbour']}, {s['kind']}:* " + "; ".join(
            f"{t['threshold_pct']:g} %: {t['false_alarm_rows']} of {t['rows_compared']} rows, "
            f"{t['pairs_with_false_alarm']} pairs" + (f", caught {t['pairs_caught']}" if s["kind"] == "slowed" else "")
            for t in s["by_threshold"]) + ".", ""]
    return "\n".join(lines).rstrip() + "\n"


def render_summary(doc: dict) -> str:
    """README's section: the summary table alone."""
    return "\n".join(summary_table(doc)) + "\n"


def write_section(path: Path, begin: str, end: str, body: str) -> None:
    """Rewrite ``path``'s section between ``begin`` and ``end`` with ``body``."""
    text = path.read_text()
    if text.count(begin) != 1 or text.count(end) != 1:
        raise SystemExit(f"{path}: needs one {begin} and one {end}")
    head, rest = text.split(begin)
    atomic_write_text(path, head + begin + "\n" + body + end + rest.split(end, 1)[1])


def write_readme(readme: Path, results: Path, summary: Path | None = None) -> None:
    """Rewrite docs/ci.md's (``readme``) section, and README's (``summary``), from ``results`` (a placeholder while
    it does not exist)."""
    doc = json.loads(results.read_text()) if results.is_file() else None
    write_section(readme, BEGIN, END, render_markdown(doc) if doc else PLACEHOLDER + "\n")
    if summary is not None:
        write_section(summary, SUMMARY_BEGIN, SUMMARY_END, render_summary(doc) if doc else PLACEHOLDER + "\n")


def targets(doc: dict) -> list[str]:
    """What ab under the neighbour missed of the targets (empty when met, or when not measured): in every mode that
    gives verdicts no same pair with a false alarm; at the defaults 9 in 10 slowed pairs caught with exit status 1; a
    mode of too few pairs refused (exit 4) every time; ab's minimum of pairs the one its pairs support."""
    missed = []
    for s in summaries(doc):
        if s["mode"] not in AB_MODES or s["neighbour"] != "on" or s["at_default"] is None:
            continue
        if s["mode"] == "ab-few" and s["exits"].get(str(TooFewPairs.exit_status)) != s["pairs"]:
            missed.append(f"ab-few ({' '.join(AB_MODES['ab-few'])}) was not refused in every pair")
        if s["kind"] == "same" and s["at_default"]["pairs_with_false_alarm"]:
            missed.append(f"{s['at_default']['pairs_with_false_alarm']} same-code {s['mode']} pairs had a false alarm")
        if s["mode"] != "ab":
            continue
        if s["kind"] == "same" and s["at_default"]["pairs_with_false_alarm"]:
            missed.append(f"{s['at_default']['pairs_with_false_alarm']} same-code ab pairs had a false alarm")
        caught = s["at_default"]["pairs_caught"]
        if s["kind"] == "slowed" and min(caught, s["exits"]["1"]) < math.ceil(CAUGHT_SHARE * s["pairs"]):
            missed.append(f"slowed ab pairs exited 1 in {s['exits']['1']} of {s['pairs']}, every slowed row caught "
                          f"in {caught}")
    least = pairs_needed(doc)[1]
    if least is not None and least != MIN_PAIRS:
        missed.append(f"ab's minimum of pairs is {MIN_PAIRS} (harness/output/compare.py, MIN_PAIRS); the pairs "
                      f"support {least}")
    return missed


def options(text: str, allowed: tuple[str, ...]) -> list[str]:
    chosen = [x for x in text.split(",") if x]
    bad = [x for x in chosen if x not in allowed]
    if bad or not chosen:
        raise argparse.ArgumentTypeError(f"{text!r}: choose from {','.join(allowed)}")
    return chosen


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=10, help="pairs per configuration (default 10)")
    parser.add_argument("--modes", type=lambda t: options(t, MODES), default=list(MODES))
    parser.add_argument("--kinds", type=lambda t: options(t, KINDS), default=list(KINDS))
    parser.add_argument("--neighbour", type=lambda t: options(t, NEIGHBOURS), default=list(NEIGHBOURS))
    parser.add_argument("--pairs-for", type=pairs_for, default={},
                        help="pairs of some configurations, e.g. separate-off-same=3 (default: --pairs)")
    parser.add_argument("--neighbour-procs", type=int, default=2, help="the noisy neighbour's processes")
    parser.add_argument("--passes", type=float, default=0.35, help="the slowed plug-in's extra passes per step")
    parser.add_argument("--thresholds", type=lambda t: sorted({float(x) for x in t.split(",")}),
                        default=list(THRESHOLDS), help="percentages, comma-separated")
    parser.add_argument("--run-args", help="arguments of `kvblock-bench run` (default: the CI profile + the plug-in)")
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "compare_pairs")
    parser.add_argument("--work", type=Path, default=ROOT / "build" / "compare-pairs", help="where the runs go")
    parser.add_argument("--resume", action="store_true", help="reuse the pairs already complete in --work")
    parser.add_argument("--readme", action="store_true", help="only rewrite the generated sections")
    args = parser.parse_args(argv)
    readme, summary = sections.doc_path("compare-pairs"), sections.doc_path("compare-pairs-summary")
    if args.readme:
        write_readme(readme, args.out / "pairs.json", summary)
        if (args.out / "pairs.json").is_file():
            atomic_write_text(args.out / "pairs.md", render_markdown(json.loads((args.out / "pairs.json").read_text())))
        return 0
    with interruptible():  # SIGTERM as Ctrl-C: the neighbour and the running child are stopped on the way out
        doc = measure(args)
    args.out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(args.out / "pairs.json", json.dumps(doc, indent=1) + "\n")
    atomic_write_text(args.out / "pairs.md", render_markdown(doc))
    print(render_markdown(doc), end="")
    missed = targets(doc)
    print("targets (ab under the neighbour): " + ("met" if not missed else "MISSED: " + "; ".join(missed)))
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
