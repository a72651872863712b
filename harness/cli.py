"""The ``kvblock-bench`` command line: one entry point, one subcommand per job.

``scenarios``, ``trace``, ``run``, ``report``, ``compare``, ``ab``, ``gate``, ``table-copy``, ``baseline``,
``check``, ``calibrate`` and ``history`` share this parser and its error handling: bad input ends as one line on
stderr naming the flag, file or line and the fix, with exit status 2, never a traceback. An interrupted command says
so and exits with 130.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from harness.base.args import (
    MAX_CALIBRATE_REPS,
    MAX_CHECK_EXAMPLES,
    MAX_CHECK_OPS,
    MAX_CHECK_SEEDS,
    add_deadline,
    count,
    csv_list,
    percentage,
)
from harness.base.files import check_creatable
from harness.errors import InputError, TooFewPairs
from impls.registry import PluginError
from scenarios import SCENARIOS, ScenarioError, TraceError

EXIT_USAGE, EXIT_INTERRUPTED, EXIT_PIPE = 2, 130, 141
EXIT_FAILED_CELLS = 3  # a run measured and saved everything else, but a design failed one of its cells
EXIT_DOES_NOT_CONFORM = 1  # kvblock-bench check: the implementation failed the contract
PROG = "kvblock-bench"


class UsageError(InputError):
    """Bad input on the command line; the message says which and how to fix it."""


class Parser(argparse.ArgumentParser):
    """argparse, with its errors as one line (no usage block): ``kvblock-bench run: error: ... (see --help)``."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(f"{message} (see `{self.prog} --help`)")


def writable_dir(path: Path, flag: str) -> Path:
    """``path``, checked to be a folder this process can write or make (made only when something is written)."""
    if path.exists() and not path.is_dir():
        raise UsageError(f"{flag} {path}: is a file, not a folder; give a folder (default: results)")
    try:
        check_creatable(path)
    except OSError as exc:
        raise UsageError(f"{flag} {path}: cannot create it ({exc.strerror}); give a folder you can write") from None
    if path.exists() and not os.access(path, os.W_OK | os.X_OK):
        raise UsageError(f"{flag} {path}: not writable; give a folder you can write")
    return path


def cmd_scenarios(args: argparse.Namespace) -> int:
    width = max(map(len, SCENARIOS))
    for name, sc in SCENARIOS.items():
        print(f"{name:<{width}}  {sc.description}")
        if args.verbose:
            print(" " * (width + 2) + " ".join(f"--{k.replace('_', '-')} {v}" for k, v in sc.defaults.items()))
    if not args.verbose:
        print("\n(-v shows each scenario's parameters and defaults)")
    return 0


PARAM_PREFIX = "param_"


def scenario_params(scenario: str, args: argparse.Namespace) -> dict[str, str]:
    """The ``--PARAM VALUE`` options given, checked against the scenario's own parameters; values stay
    strings, converted and range-checked by the scenario itself."""
    given = {k.removeprefix(PARAM_PREFIX): v for k, v in vars(args).items()
             if k.startswith(PARAM_PREFIX) and v is not None}
    foreign = sorted(set(given) - set(SCENARIOS[scenario].defaults))
    if foreign:
        raise UsageError(f"--{foreign[0].replace('_', '-')}: not a parameter of scenario {scenario!r}; "
                         f"`{PROG} scenarios -v` lists each scenario's parameters")
    return given


CSV_BASE = {False: "azure-code", True: "mooncake-cached"}  # the scenario an imported CSV takes its defaults from


def cmd_trace(args: argparse.Namespace) -> int:
    from scenarios import generate, load, save
    from scenarios.realtrace import build_real_trace

    if args.show:
        if args.name or args.from_csv or args.output or scenario_params(CSV_BASE[False], args):
            raise UsageError("--show takes only a trace file")
        summary = load(args.show).summary()
        width = max(map(len, summary))
        for key, value in summary.items():
            print(f"{key:<{width}}  {value}")
        return 0
    if bool(args.name) == bool(args.from_csv):
        raise UsageError(f"give either a scenario NAME or --from-csv FILE (see `{PROG} scenarios`)")
    if args.name and args.name not in SCENARIOS:
        raise UsageError(f"unknown scenario {args.name!r}; known: {', '.join(SCENARIOS)}")
    if not args.output:
        raise UsageError("-o FILE is required: where to write the trace (.npz)")
    check_output_file(Path(args.output))
    caching = args.param_prefix_caching is not None  # an imported CSV with --prefix-caching: mooncake-cached's
    params = scenario_params(CSV_BASE[caching] if args.from_csv else args.name, args)
    if args.from_csv:
        csv_path = Path(args.from_csv)
        base = SCENARIOS[CSV_BASE[caching]]  # absolute, not resolved: a pipe's /dev/fd/N is no file's link
        trace = build_real_trace(f"csv:{csv_path.name}", base.params({**params, "csv": str(csv_path.absolute()),
                                                                     "duration_s": params.get("duration_s")}))
    else:
        trace = generate(args.name, **params)
    path = save(trace, args.output)
    h = trace.header
    print(f"wrote {path}: {h['scenario']}, {h['num_steps']} steps, {h['num_requests']} requests, "
          f"{h['num_ops']} ops, peak {h['peak_blocks_in_use']} blocks, {h['cow_count']} copy-on-writes")
    return 0


def check_output_file(path: Path) -> None:
    """Refuse an output path that cannot be written, before minutes of simulation."""
    from scenarios.trace.storage import check_writable

    if path.is_dir():
        raise UsageError(f"-o {path}: is a folder; give a file name such as {path / 'trace.npz'}")
    check_writable(path)


def cmd_run(args: argparse.Namespace) -> int:
    from harness.base.replay import REGIMES
    from harness.output.console import console_summary
    from harness.output.report import write_reports
    from harness.run.runner import RunConfig, run

    if args.trace and args.scenario:
        raise UsageError("give --scenario or --trace, not both")
    cfg = RunConfig(
        scenarios=args.scenario or [],
        impls=args.impl or [],
        regimes=args.regime or list(REGIMES),
        trace_file=Path(args.trace) if args.trace else None,
        quick=args.quick,
        reps=args.reps if args.reps is not None else (1 if args.quick else 3),
        paced=not args.no_paced,
        l1d=not args.no_l1d,
        allocations=not args.no_allocations,
        table_copy=not args.no_table_copy,
        memory=args.memory or bool(args.sweep),
        sweep=args.sweep or [],
        root=writable_dir(Path(args.results), "--results"),
        label=args.label or "",
        progress=not args.no_progress,
        processes=args.processes or 0,
        deadline_s=args.deadline,
    )
    run_dir = run(cfg, argv=[PROG, *sys.argv[1:]])
    if run_dir is None:
        raise UsageError("nothing to measure: the selection has no cell (see `kvblock-bench run --help`)")
    write_reports(run_dir)
    if args.figures:
        from harness.output.plots import render_figures

        render_figures(run_dir)
    print(console_summary(run_dir))
    return _failed_cells_status(run_dir)


def _failed_cells_status(run_dir: Path) -> int:
    """EXIT_FAILED_CELLS, with one line per failed cell on stderr, when a design failed a cell; else 0."""
    from harness.base.rows import read_rows

    failed = [r for r in read_rows(run_dir / "results.csv") if r.status == "failed" and r.metric == "correctness"]
    for row in failed:
        print(f"{PROG}: {row.scenario} {row.impl} {row.regime} failed: {row.how}", file=sys.stderr)
    return EXIT_FAILED_CELLS if failed else 0


def cmd_report(args: argparse.Namespace) -> int:
    """Reports (and figures) into the run folder, the console summary printed. A run folder that cannot be written
    (read-only, disk full) costs the files only: one line says so, the tables are printed instead, exit status 2."""
    from harness.base.files import resolve_run
    from harness.errors import WriteError
    from harness.output.console import console_summary
    from harness.output.report import check_reportable, report_texts, write_reports
    from harness.output.rundata import RunData

    if args.history_readme:
        from harness.history.readme_section import write_history_readme

        engine = write_history_readme(Path(args.history_readme), Path(args.run or "."))
        print(f"rewrote the {engine} history section of {args.history_readme} from {args.run}", file=sys.stderr)
        return 0
    data = RunData.load(resolve_run(args.run, Path(args.results)))
    check_reportable(data)
    _check_readmes(args)
    texts = report_texts(data)
    unwritten = None
    try:
        write_reports(data, texts)
        if not args.no_figures:
            from harness.output.plots import render_figures

            render_figures(data)
    except WriteError as exc:
        unwritten = exc
    if args.readme:
        from harness.output.readme import write_readme

        write_readme(Path(args.readme), data)
        print(f"rewrote the results section of {args.readme} from {data.run_dir}", file=sys.stderr)
    if args.growth_readme:
        from harness.output.growth import write_growth_readme

        write_growth_readme(Path(args.growth_readme), data.run_dir)
        print(f"rewrote the growth section of {args.growth_readme} from {data.run_dir}", file=sys.stderr)
    if unwritten is not None:
        print(texts["paper_table.md"])
    print(console_summary(data))
    if unwritten is not None:
        print(f"{PROG}: error: {_one_line(unwritten)}; the tables are printed above instead", file=sys.stderr)
        return EXIT_USAGE
    return 0


def _check_readmes(args: argparse.Namespace) -> None:
    """Every README ``report`` is to rewrite, checked before anything is written."""
    if args.readme:
        from harness.output.readme import check_readme

        check_readme(Path(args.readme))
    if args.growth_readme:
        from harness.output.growth import BEGIN, END
        from harness.output.readme import check_readme

        check_readme(Path(args.growth_readme), "--growth-readme", BEGIN, END)


def _rules(args: argparse.Namespace):
    from harness.output.compare import Rules

    return Rules(fail_on_inconclusive=args.fail_on_inconclusive, allow_lost=args.allow_lost)


def _no_comparable(result) -> None:
    if result.exit_status == EXIT_USAGE:
        print(f"{PROG}: error: no figure of the runs is comparable (see the rows' reasons above); compare runs that "
              "measured the same scenarios and implementations", file=sys.stderr)


def cmd_compare(args: argparse.Namespace) -> int:
    """NEW over BASE for every figure both runs hold; exit 1 when the comparison fails, 2 when nothing compares."""
    from harness.output.compare import Allowed, compare_runs, load_run
    from harness.output.compare_report import RENDER

    root = Path(args.results)
    base, new = load_run("BASE", args.base, root), load_run("NEW", args.new, root)
    result = compare_runs(base, new, tuple(args.metric), args.threshold / 100,
                          Allowed(args.allow_other_machine, args.allow_quick_mismatch), _rules(args))
    print(RENDER[args.format](result), end="")
    _no_comparable(result)
    return result.exit_status


EXIT_STATUSES = ("Exit status: 0 when nothing is slower beyond the threshold and NEW lost no figure BASE has, 1 "
                 "when something is slower (or lost, or inconclusive with --fail-on-inconclusive), 2 for bad input "
                 "or when no figure is comparable, 4 when a row of ab's runs rests on too few pairs of worker "
                 "processes for a verdict")
AB_EXIT_STATUSES = ("Exit status: 0 when nothing is slower beyond the threshold, NEW needs no more instructions or "
                    "allocations than BASE beyond the counts threshold and lost no figure BASE has; 1 when something "
                    "is slower, needs more work, is lost (or is inconclusive with --fail-on-inconclusive); 2 for bad "
                    "input (a ref whose code does not import or would come from elsewhere included) or when no "
                    "figure is comparable; 4 too few pairs for a verdict: options that leave fewer than {min_pairs} "
                    "pairs of worker processes per implementation are refused before measuring")


def _add_verdict_options(p: argparse.ArgumentParser, threshold_pct: float) -> None:
    """The options ``compare`` and ``ab`` share: metrics, threshold (default ``threshold_pct``), format, what fails."""
    from harness.output.compare import DEFAULT_METRICS
    from harness.output.compare_report import FORMATS

    p.add_argument("--metric", type=csv_list, metavar="M,...", default=list(DEFAULT_METRICS),
                   help=f"figures to compare (default: {','.join(DEFAULT_METRICS)})")
    p.add_argument("--threshold", type=percentage, default=threshold_pct, metavar="PCT",
                   help="a figure fails only when its whole interval lies more than PCT %% beyond 1 (default "
                        f"{threshold_pct:g})")
    p.add_argument("--format", choices=FORMATS, default="text", help="text (default), markdown (a pull-request "
                   "comment) or json")
    p.add_argument("--fail-on-inconclusive", action="store_true",
                   help="also fail when a row's interval reaches past the threshold (it cannot rule out a slowdown)")
    p.add_argument("--allow-lost", action="store_true",
                   help="pass although NEW lost figures BASE has (dropped, renamed, skipped, unavailable or failed)")


def _add_compare(sub, results: argparse.ArgumentParser) -> None:
    from harness.output.compare import DEFAULT_THRESHOLD_PCT

    p = sub.add_parser("compare", parents=[results], help="NEW over BASE for every figure two runs share, with "
                       "a 95 %% interval and a verdict; exit 1 when one is slower beyond the threshold",
                       description=f"Two runs made apart (kvblock-bench ab measures both versions in one run). "
                                   f"{EXIT_STATUSES}, including runs from different machines (unless "
                                   "--allow-other-machine) and a --quick run beside a full one (unless "
                                   "--allow-quick-mismatch).")
    p.add_argument("base", help="the run compared against: a run folder, or a run id under --results")
    p.add_argument("new", help="the run being judged: a run folder, or a run id under --results")
    _add_verdict_options(p, DEFAULT_THRESHOLD_PCT)
    p.add_argument("--allow-other-machine", action="store_true",
                   help="compare runs of different machines or software anyway (every row then says so)")
    p.add_argument("--allow-quick-mismatch", action="store_true",
                   help="compare a --quick run with a full one anyway (their traces differ: little compares)")


def cmd_ab(args: argparse.Namespace) -> int:
    """BASE_REF and NEW_REF (or the working tree) measured in one run and compared."""
    from harness.base.replay import REGIMES
    from harness.ci.ab import AB_QUICK_REPS, AB_REPS, AbOptions, check_options, repository_here, results_root
    from harness.ci.ab import run as run_ab
    from harness.output.compare_report import RENDER
    from harness.run.runner import RunConfig

    cfg = RunConfig(scenarios=args.scenario or [], impls=args.impl or [], regimes=args.regime or list(REGIMES),
                    trace_file=Path(args.trace) if args.trace else None, quick=args.quick,
                    reps=args.reps if args.reps is not None else (AB_QUICK_REPS if args.quick else AB_REPS),
                    label=args.label or "", progress=not args.no_progress, processes=args.processes or 0,
                    deadline_s=args.deadline)
    check_options(cfg, tuple(args.metric))
    if args.results is None:
        cfg.root = writable_dir(results_root(repository_here()), "ab's results folder (--results to choose another)")
        print(f"ab: the runs go to {cfg.root} (--results to choose another folder)", file=sys.stderr, flush=True)
    else:
        cfg.root = writable_dir(Path(args.results), "--results")
    opts = AbOptions(args.base_ref, args.new_ref, cfg, tuple(args.metric), args.threshold / 100, _rules(args),
                     counts=not args.no_counts, deadline_s=args.deadline, counts_threshold_pct=args.counts_threshold)
    result, folder = run_ab(opts, argv=[PROG, *sys.argv[1:]])
    print(RENDER[args.format](result), end="")
    print(f"both runs and the comparison (compare.txt, .md, .json) are in {folder.parent}: {folder.name} and "
          f"{result.base.data.run_id}", file=sys.stderr)
    _no_comparable(result)
    return result.exit_status


def _add_ab(sub) -> None:
    from harness.ci.ab import AB_QUICK_REPS, AB_REPS, AB_THRESHOLD_PCT
    from harness.output.compare import MIN_PAIRS
    from harness.run.runner import MAX_PROCESSES, MAX_REPS

    p = sub.add_parser("ab", help="two git refs (or a ref and the working tree) measured in "
                       "one run, side by side, and compared; exit 1 when NEW is slower beyond the threshold",
                       description="BASE_REF (and NEW_REF) are checked out into temporary git worktrees; each "
                                   "implementation's two versions replay every slice side by side, so NEW/BASE is "
                                   "paired over pairs of worker processes; the gate's counts of both stand beside it, "
                                   "NEW's held to BASE's. In a checkout of kvblock-bench each version brings its own "
                                   "designs and harness; in any other repository its plug-ins, under the installed "
                                   "harness; the headline says where each side's code came from. Timed cells only "
                                   f"(no study). {AB_EXIT_STATUSES.format(min_pairs=MIN_PAIRS)}.")
    p.add_argument("--results", help="where both runs go (default: results/ in a checkout of kvblock-bench; in "
                   "any other repository $XDG_CACHE_HOME/kvblock-bench/ab/<repository name>, else "
                   "~/.cache/kvblock-bench/ab/<repository name>)")
    p.add_argument("base_ref", help="the version compared against: a branch, tag or commit (e.g. origin/main)")
    p.add_argument("new_ref", nargs="?", help="the version judged (default: this working tree, as it is)")
    p.add_argument("--scenario", type=csv_list, metavar="S,...", help="scenarios (default: as `run`)")
    p.add_argument("--trace", metavar="FILE", help="replay a trace file instead of named scenarios")
    p.add_argument("--impl", type=csv_list, metavar="I,...", help="implementations (default: each side's registry)")
    p.add_argument("--regime", type=csv_list, metavar="R,...", help="per-call, batched, step (default: all)")
    p.add_argument("--quick", action="store_true", help=f"short traces, {AB_QUICK_REPS} repetitions")
    p.add_argument("--reps", type=count(1, MAX_REPS),
                   help=f"repetitions per cell, each a pair of NEW and BASE (default {AB_REPS}, --quick "
                        f"{AB_QUICK_REPS}; fewer than {MIN_PAIRS} are refused: too few pairs for a verdict)")
    p.add_argument("--processes", type=count(1, MAX_PROCESSES),
                   help="worker processes per implementation and side the repetitions spread over (default: one "
                        "per repetition: a process's layout moves a compiled design's per-call times, so the "
                        f"repetitions of one process make one pair; fewer than {MIN_PAIRS} are refused)")
    p.add_argument("--label", help="appended to both run ids")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--no-counts", action="store_true", help="leave out the gate's counts of both versions")
    p.add_argument("--counts-threshold", type=percentage, metavar="PCT",
                   help="fail when NEW's instructions per sequence-step or allocations per step exceed BASE's by more "
                        "than PCT %% (default: counts_threshold_pct of [tool.kvblock-bench.gate], else 2)")
    for flag in ("--no-paced", "--no-l1d", "--no-allocations", "--no-table-copy"):
        p.add_argument(flag, action="store_true", help="accepted as in `run` (ab runs no study)")
    _add_verdict_options(p, AB_THRESHOLD_PCT)
    add_deadline(p)


def cmd_gate(args: argparse.Namespace) -> int:
    from harness.gate import command as gate

    return gate.run(args)


def cmd_table_copy(args: argparse.Namespace) -> int:
    from harness.studies.table_copy import measurement

    return measurement.run(args)


def cmd_check(args: argparse.Namespace) -> int:
    """Contract conformance of one implementation, run in a worker process (a plug-in that exits, hangs or
    crashes there gets a verdict too); exit 0 only when it conforms."""
    from harness.run.jobs import CheckJob, ProbeJob, execute
    from harness.run.workers import CellDied, Worker, WorkerBug
    from impls import REGISTRY, UNAVAILABLE

    if args.impl in UNAVAILABLE:
        raise UsageError(f"{args.impl} cannot run here: {UNAVAILABLE[args.impl]}")
    worker = Worker(execute, args.deadline)
    try:
        info = worker.run(ProbeJob(args.impl))
        if not info.ok:
            raise UsageError(info.reason)
        caching = " (prefix caching included)" if info.prefix_caching else ""
        print(f"checking {info.described}: {args.seeds} seed(s) x {args.examples} random call sequences of up to "
              f"{args.ops} calls against the reference model{caching} at block sizes 1 to 64, then the 65,536-block "
              "pool at each", flush=True)
        result = worker.run(CheckJob(args.impl, args.seeds, args.examples, args.ops))
        ok, text = result.ok, result.text
    except CellDied as died:
        ok, text = False, f"{args.impl}: FAILS: the checking process {died.reason}"
    except WorkerBug as bug:  # in a plug-in's own process: its answers made the checker fail
        if args.impl in REGISTRY:
            raise
        ok, text = False, f"{args.impl}: FAILS: the checker could not use its answers ({bug.last_line()})"
    finally:
        worker.stop()
    print(text)
    print("verdict: " + ("CONFORMS" if ok else "DOES NOT CONFORM"))
    return 0 if ok else EXIT_DOES_NOT_CONFORM


def _ratio(x: float) -> str:
    """Two decimals; two significant digits below 0.1 (a design far cheaper than the engine keeps its figure)."""
    return f"{x:.2f}" if not 0 < abs(x) < 0.1 else f"{x:.2g}"


def cmd_calibrate(args: argparse.Namespace) -> int:
    """Our contenders beside an engine's own code (a new folder, or the table asked for); exit 1 when a replay
    failed."""
    import shlex

    from harness.calibration.run import Options, calibrate
    from harness.calibration.table import band_lines
    from harness.engines.catalog import parse_engine

    engine, version = parse_engine(args.engine)
    scenarios = args.scenario or list(engine.scenarios)
    unknown = [s for s in scenarios if s not in SCENARIOS]
    if unknown:
        raise UsageError(f"--scenario {unknown[0]}: unknown scenario; `{PROG} scenarios` lists them")
    opts = Options(engine, version, scenarios, {s: scenario_params(s, args) for s in scenarios}, reps=args.reps,
                   source=Path(args.source) if args.source else None,
                   find_links=find_links(args),
                   destination=calibration_destination(args, engine.name), processes=args.processes or 0,
                   deadline_s=args.deadline, command=shlex.join([PROG, *sys.argv[1:]]))
    if args.cache:
        opts.cache = Path(args.cache)
    outcome = calibrate(opts)
    if outcome.rows:
        print("ours/real: whole step [95 % paired interval]; engine calls: ns per seq-step, ours/real, their ratio "
              "[min-max over the metered replays]")
    for row in outcome.rows:
        print(f"{row.scenario:<18} {row.contender:<13} {row.call_shape:<9} vs {row.baseline:<28} "
              f"ours/real = {_ratio(row.ratio)} [{_ratio(row.ratio_low)}-{_ratio(row.ratio_high)}]; "
              + (f"engine calls {row.ours_calls_ns:.0f}/{row.real_calls_ns:.0f} ns = {_ratio(row.ratio_calls)} "
                 f"[{_ratio(row.ratio_calls_low)}-{_ratio(row.ratio_calls_high)}]" if math.isfinite(row.ratio_calls)
                 else "engine calls not metered")
              + ("  (modelled)" if row.modelled else ""))
    for line in band_lines(outcome.rows):
        print(line)
    for failure in outcome.failures:
        print(f"failed: {failure}", file=sys.stderr)
    print(f"repetitions spread over {outcome.processes} worker process{'es' * (outcome.processes != 1)}")
    if outcome.written:
        print(f"calibration rows written to {outcome.written} ({len(outcome.rows)} rows; per-repetition step times "
              f"in {outcome.folder / 'runs'})")
    elif outcome.folder:
        print(f"no calibration row written; per-repetition step times in {outcome.folder / 'runs'}")
    return 1 if outcome.failures else 0


def cmd_history(args: argparse.Namespace) -> int:
    """An engine's block manager release by release (DIR/history.csv, verdicts, figures); exit 1 when a replay
    failed."""
    import shlex

    from harness.engines.catalog import ENGINES, HISTORY_ENGINES, or_list
    from harness.history.measure import HistoryOptions, history
    from harness.history.render import render

    if args.engine not in HISTORY_ENGINES:
        raise UsageError(f"ENGINE {args.engine!r}: history compares published releases of {or_list(HISTORY_ENGINES)}")
    engine = ENGINES[args.engine]
    scenarios = args.scenario or engine.history_scenarios()
    unknown = [s for s in scenarios if s not in SCENARIOS]
    if unknown:
        raise UsageError(f"--scenario {unknown[0]}: unknown scenario; `{PROG} scenarios` lists them")
    out = writable_dir(Path(args.out), "--out") if args.out else None
    opts = HistoryOptions(engine, args.versions, scenarios, {s: scenario_params(s, args) for s in scenarios}, out,
                          reps=args.reps, find_links=find_links(args), deadline_s=args.deadline, group=args.group,
                          anchor=args.anchor, command=shlex.join([PROG, *sys.argv[1:]]))
    if args.cache:
        opts.cache = Path(args.cache)
    outcome = history(opts)
    for line in render(outcome.written.parent, figures=not args.no_figures):
        print(line)
    for failure in outcome.failures:
        print(f"failed: {failure}", file=sys.stderr)
    disk = sum(r.disk for r in outcome.releases)
    print(f"{len(outcome.releases)} releases ({disk / 1e6:,.0f} MB in the cache {opts.cache}) in "
          f"{outcome.seconds:,.0f} s; rows in {outcome.written}")
    return 1 if outcome.failures else 0


def find_links(args: argparse.Namespace) -> Path | None:
    """``--find-links DIR`` as a folder that exists, or None."""
    if not args.find_links:
        return None
    path = Path(args.find_links)
    if not path.is_dir():
        raise UsageError(f"--find-links {path}: {'not a folder' if path.exists() else 'no such folder'}; give the "
                         "folder holding the engine's wheels")
    return path


def calibration_destination(args: argparse.Namespace, engine: str):
    """Where ``calibrate`` writes: a new folder in --results, or the table --out or --update-committed names."""
    from harness.calibration.destination import Destination
    from harness.calibration.table import DEFAULT_CSV

    if args.out and args.update_committed:
        raise UsageError("--out and --update-committed both name a table; give one")
    if args.update_committed:
        return Destination(DEFAULT_CSV, flag="--update-committed")
    if args.out:
        return Destination(Path(args.out), flag="--out")
    return Destination(None, Path(args.results), f"calibration-{engine}")


def cmd_site(args: argparse.Namespace) -> int:
    """The static site of the runs given (default: the committed reference run) and of --results' studies."""
    from harness.site.build import build_site

    root = Path(args.results)
    paths = [Path(p) for p in args.runs] or [root / "reference"]
    out = build_site(paths, Path(args.out), root, args.allow_mixed_commits)
    print(f"site: {out / 'index.html'} (open it in a browser; no server needed)")
    return 0


def cmd_baseline(args: argparse.Namespace) -> int:
    from harness.ci import baseline

    return baseline.run(args)


def _add_trace(sub) -> None:
    p = sub.add_parser(
        "trace", help="generate a trace file, import one from a CSV, or summarise one",
        description=f"{PROG} trace NAME [--PARAM VALUE ...] -o FILE | --from-csv CSV [--PARAM VALUE ...] -o FILE "
                    f"| --show FILE. Each scenario's parameters: `{PROG} scenarios -v`.",
    )
    p.add_argument("name", nargs="?", help="scenario name (see `kvblock-bench scenarios`)")
    p.add_argument("-o", "--output", help="trace file to write (.npz)")
    p.add_argument("--from-csv", metavar="CSV",
                   help="import requests from a CSV (timestamp, prompt_tokens, output_tokens)")
    p.add_argument("--show", metavar="FILE", help="summarise a trace file")
    _add_scenario_params(p, "scenario parameters (each scenario takes its own: `kvblock-bench scenarios -v`)")


def _add_run(sub, results: argparse.ArgumentParser) -> None:
    from harness.output import times
    from harness.run.matrix import describe
    from harness.run.runner import MAX_REPS

    took = times.quoted_times()
    p = sub.add_parser("run", parents=[results],
                       help="replay scenarios on implementations and measure (writes results/<run-id>/)",
                       description="Without --scenario/--impl/--trace: the default matrix; "
                                   f"{times.phrase('bench', took)}.\n\n" + describe(),
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--scenario", type=csv_list, metavar="S,...",
                   help="scenarios to run (default: all but the scale sweeps' own)")
    p.add_argument("--trace", metavar="FILE", help="replay a trace file instead of named scenarios")
    p.add_argument("--sweep", type=csv_list, metavar="F,...",
                   help="scale sweeps: every scenario of these families (context, pool, concurrency) with the "
                        "default matrix's rules, memory included (make bench-scale)")
    p.add_argument("--impl", type=csv_list, metavar="I,...",
                   help="implementations: registered names, package.module:Class, or entry-point names "
                        "(default: all registered)")
    p.add_argument("--regime", type=csv_list, metavar="R,...", help="per-call, batched (default: both)")
    p.add_argument("--quick", action="store_true",
                   help=f"short traces, one repetition; {times.phrase('bench-quick', took)}")
    p.add_argument("--reps", type=count(1, MAX_REPS), help=f"repetitions per cell (default 3, --quick 1; at most "
                   f"{MAX_REPS:,})")
    p.add_argument("--label", help="appended to the run id")
    p.add_argument("--no-paced", action="store_true", help="skip the paced open-loop CPU-share runs")
    p.add_argument("--no-l1d", action="store_true", help="skip L1D-miss measurement (perf or callgrind)")
    p.add_argument("--no-allocations", action="store_true", help="skip allocation counting")
    p.add_argument("--no-table-copy", action="store_true", help="skip the block-table copy study (rule 3)")
    p.add_argument("--memory", action="store_true",
                   help="measure each design's memory at the trace's peak (on in --sweep runs)")
    figures = p.add_mutually_exclusive_group()
    figures.add_argument("--figures", action="store_true", help="also render figures (as `kvblock-bench report`)")
    figures.add_argument("--no-figures", action="store_true", help="no figures (the default; as `report "
                                                                   "--no-figures`)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    _add_processes(p, "--reps and ")
    add_deadline(p)


def _add_processes(p: argparse.ArgumentParser, bound: str = "") -> None:
    from harness.run.runner import MAX_PROCESSES

    p.add_argument("--processes", type=count(1, MAX_PROCESSES),
                   help=f"worker processes the repetitions spread over (default: one per repetition; at most "
                        f"{bound}{MAX_PROCESSES})")


def _add_engine_scenarios(p: argparse.ArgumentParser, default: str) -> None:
    p.add_argument("--scenario", type=csv_list, metavar="S,...", help=f"scenarios (default: {default})")


def _add_calibrate(sub) -> None:
    from harness.engines.catalog import ENGINES, PUBLISHED_ENGINES, or_list

    unpublished = [name for name in ENGINES if name not in PUBLISHED_ENGINES]
    p = sub.add_parser(
        "calibrate", help="time our contenders beside an engine's own block manager (a new results/ folder)",
        description=f"{PROG} calibrate ENGINE[==VERSION] [--scenario S,...] [--source DIR] [--PARAM VALUE ...]. "
                    "Fetches the engine's published wheel with this Python's pip (--no-deps) into a cache outside "
                    "the repository (or reads --source DIR), imports its block-manager modules unmodified, replays "
                    "each scenario on them and on our contenders with the same driver and interleaving as `run`, "
                    "checks every replay against its trace, and writes ratio rows into a new folder "
                    "results/<timestamp>-calibration-ENGINE/ (--update-committed: into results/calibration/"
                    f"calibration.csv). Engines: {', '.join(PUBLISHED_ENGINES)}, {', '.join(unpublished)} (not on the "
                    "package index: --source).")
    p.add_argument("engine", help=f"{or_list(ENGINES)}, optionally ==VERSION (e.g. vllm==0.33.0)")
    _add_engine_scenarios(p, "the engine's committed ones")
    p.add_argument("--source", metavar="DIR", help="the engine's source folder (holding its top-level package)")
    _add_processes(p)
    p.add_argument("--results", default="results",
                   help="where the new calibration folder (<timestamp>-calibration-ENGINE/) is made (default: results)")
    p.add_argument("--out", metavar="FILE", help="merge the rows into this table instead (runs/ beside it)")
    p.add_argument("--update-committed", action="store_true",
                   help="replace this engine's rows of the measured scenarios in the committed "
                        "results/calibration/calibration.csv (and its runs/)")
    _add_engine_options(p, "interleaved repetitions")


def _add_history(sub) -> None:
    from harness.engines.catalog import ENGINES, HISTORY_ENGINES, or_list
    from harness.history.groups import DEFAULT_GROUP
    from harness.output.compare import DEFAULT_THRESHOLD_PCT

    p = sub.add_parser(
        "history", help="an engine's block manager release by release, on the same traces in one run",
        description=f"{PROG} history ENGINE VERSIONS [--scenario S,...] [--group N] [--out DIR]. Each release is "
                    "fetched, imported and replayed as `calibrate` does (see its --help), by the plan of its range of "
                    "releases (harness/engines/ENGINE_engine.py: ERAS), each in a worker process of its own, in "
                    "lockstep with the others of its group (the anchor release in every group); "
                    "writes DIR/history.csv, DIR/verdicts.csv (each release against the one before: compare's verdict "
                    f"at {DEFAULT_THRESHOLD_PCT:g} %), DIR/history.md and a figure.")
    p.add_argument("engine", help=or_list(HISTORY_ENGINES))
    p.add_argument("versions", metavar="VERSIONS",
                   help="published releases: a comma list (0.23.0,0.24.0) or a range FIRST..LAST (0.21.0..0.33.0), "
                        "resolved with `pip index versions`")
    forking = or_list(name for name, e in ENGINES.items() if e.history_forks)
    _add_engine_scenarios(p, f"the engine's calibration scenarios, with forks only for an engine that forks: {forking}")
    p.add_argument("--out", metavar="DIR",
                   help="where the tables and figures go (default: a new folder results/<timestamp>-history-ENGINE/)")
    p.add_argument("--no-figures", action="store_true", help="tables only")
    p.add_argument("--group", type=count(0, 1000), default=DEFAULT_GROUP, metavar="N",
                   help=f"measure N releases at a time, the anchor among them (default {DEFAULT_GROUP}; 0: as many as "
                        "memory holds): a worker process per release lives while its group is measured, and a group "
                        "shrinks when the workers' measured peak memory says fewer fit")
    p.add_argument("--anchor", metavar="VERSION", help="the release measured in every group, through which releases of "
                                                       "different groups are compared (default: the newest)")
    _add_engine_options(p, "interleaved repetitions per release")


def _add_engine_options(p: argparse.ArgumentParser, reps: str) -> None:
    """What calibrate and history share: repetitions, wheels, deadline, the scenarios' parameters."""
    p.add_argument("--reps", type=count(1, MAX_CALIBRATE_REPS), default=5,
                   help=f"{reps} (default 5, at most {MAX_CALIBRATE_REPS:,})")
    p.add_argument("--cache", metavar="DIR", help="where wheels are kept (default: ~/.cache/kvblock-bench/engines, "
                                                  "or $KVBLOCK_BENCH_CACHE); never inside the repository")
    p.add_argument("--find-links", metavar="DIR", help="fetch the wheels from this folder only (pip --no-index)")
    add_deadline(p)
    _add_scenario_params(p, "scenario parameters (e.g. --steps 200 for a short smoke run)")


def _add_scenario_params(p: argparse.ArgumentParser, title: str) -> None:
    group = p.add_argument_group(title)
    for key in dict.fromkeys(key for sc in SCENARIOS.values() for key in sc.defaults if key != "csv"):
        group.add_argument(f"--{key.replace('_', '-')}", dest=PARAM_PREFIX + key, metavar="VALUE")


def build_parser() -> Parser:
    from harness.ci import baseline
    from harness.gate import command as gate
    from harness.output import times
    from harness.studies.table_copy import measurement as table_copy

    parser = Parser(prog=PROG, description=__doc__.split("\n")[0], epilog=times.help_epilog(times.quoted_times()))
    results = Parser(add_help=False)
    results.add_argument("--results", default="results", help="results folder (default: results)")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)

    p = sub.add_parser("scenarios", help="list the scenarios with their descriptions")
    p.add_argument("-v", "--verbose", action="store_true", help="show every parameter and its default")
    _add_trace(sub)
    _add_run(sub, results)
    p = sub.add_parser("report", parents=[results],
                       help="write reports (and figures) for a run and print the paper table")
    p.add_argument("run", nargs="?", help="run id or directory (default: results/latest)")
    figures = p.add_mutually_exclusive_group()
    figures.add_argument("--figures", action="store_true", help="also render the figures (the default; as `run "
                                                                "--figures`)")
    figures.add_argument("--no-figures", action="store_true", help="tables only")
    p.add_argument("--growth-readme", metavar="FILE",
                   help="rewrite FILE's growth section (<!-- growth:begin/end -->) from this scale-sweep run "
                        "(e.g. docs/scale.md from results/scale)")
    p.add_argument("--history-readme", metavar="FILE",
                   help="only rewrite FILE's section <!-- history-ENGINE:begin/end --> from the history folder RUN "
                        "(e.g. README.md from results/history/vllm)")
    p.add_argument("--readme", metavar="FILE",
                   help="also rewrite FILE's section between <!-- results:begin --> and <!-- results:end --> "
                        "(e.g. README.md from results/reference), and the time table of docs/time-budget.md beside it")
    _add_compare(sub, results)
    _add_ab(sub)
    gate.add_arguments(sub.add_parser("gate", help="the CI gate: allocations, instruction counts, wall-clock floor",
                                      description=gate.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter))
    table_copy.add_arguments(sub.add_parser("table-copy", help="rule 3 alone: block tables to the device"))
    baseline.add_arguments(sub.add_parser("baseline", parents=[results],
                                          help="save a run as a committed baseline for `kvblock-bench compare`"))
    _add_calibrate(sub)
    _add_history(sub)
    p = sub.add_parser("site", parents=[results], help="a static site of runs (several machines side by side) and of "
                                                        "the committed studies, to open from disk or GitHub Pages")
    p.add_argument("runs", nargs="*", metavar="RESULTS",
                   help="run folders, or folders holding them (CI artifacts); default: --results' reference run")
    p.add_argument("--out", required=True, metavar="DIR", help="the site's folder (replaced whole when rebuilt)")
    p.add_argument("--allow-mixed-commits", action="store_true",
                   help="put runs of different commits side by side (refused otherwise: a site compares machines)")
    p = sub.add_parser("check", help="is an implementation correct? contract conformance against the reference model",
                       description="Random valid and invalid call sequences on IMPL and on the reference model "
                                   "(impls/core/reference.py), compared after every call up to a renaming of block "
                                   "ids; "
                                   "failed calls must leave the state as it was; the batched step must equal the "
                                   "same appends made one at a time; inputs must be left as they were and "
                                   "table_nbytes an int from 0 to 2**40 (or None); at block sizes 1 to 64, pools of a "
                                   "handful of blocks and of 65,536; then the full 65,536-block pool at each. "
                                   "Prints the shortest failing call sequence as runnable Python. Exit 0 only when it "
                                   "conforms.")
    p.add_argument("impl", help="a registered name, package.module:Class, or a kvblock_bench.impls entry point")
    p.add_argument("--seeds", type=count(1, MAX_CHECK_SEEDS), default=2,
                   help=f"independent random runs (default 2, at most {MAX_CHECK_SEEDS:,})")
    p.add_argument("--examples", type=count(1, MAX_CHECK_EXAMPLES), default=100,
                   help=f"call sequences per seed (default 100, at most {MAX_CHECK_EXAMPLES:,})")
    p.add_argument("--ops", type=count(1, MAX_CHECK_OPS), default=40,
                   help=f"most calls per sequence (default 40, at most {MAX_CHECK_OPS:,})")
    add_deadline(p)
    return parser


COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "scenarios": cmd_scenarios, "trace": cmd_trace, "run": cmd_run, "report": cmd_report, "compare": cmd_compare,
    "ab": cmd_ab, "gate": cmd_gate, "table-copy": cmd_table_copy, "baseline": cmd_baseline, "check": cmd_check,
    "calibrate": cmd_calibrate, "history": cmd_history, "site": cmd_site,
}
# What a command may raise for bad input: shown as one line, exit status 2. Anything else is a bug of ours and
# keeps its traceback (exit status 1); a design's failure is a failed cell, never an exception here.
INPUT_ERRORS = (InputError, ScenarioError, TraceError, PluginError, FileNotFoundError, IsADirectoryError,
                NotADirectoryError, PermissionError)


def _dispatch(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    return COMMANDS[args.command](args)


def main(argv: Sequence[str] | None = None) -> int:
    """Run one subcommand, interruptible, in a temporary folder of its own; returns the exit status."""
    from harness.base.interrupts import interruptible
    from harness.base.scratch import scratch_folder

    with interruptible():
        try:
            with scratch_folder():
                return _command(argv)
        except KeyboardInterrupt:
            print(f"{PROG}: interrupted", file=sys.stderr)
            return EXIT_INTERRUPTED


def _command(argv: Sequence[str] | None) -> int:
    try:
        return _dispatch(list(sys.argv[1:] if argv is None else argv))
    except TooFewPairs as exc:  # options that cannot give a verdict: a status of their own
        print(f"{PROG}: error: {_one_line(exc)}", file=sys.stderr)
        return TooFewPairs.exit_status
    except INPUT_ERRORS as exc:
        print(f"{PROG}: error: {_one_line(exc)}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # e.g. `kvblock-bench scenarios -v | head`: the reader left, which is fine
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_PIPE


def _one_line(exc: BaseException) -> str:
    text = str(exc.args[0]) if isinstance(exc, KeyError) and exc.args else str(exc)
    if isinstance(exc, OSError) and exc.filename is not None and exc.strerror:
        text = f"{exc.filename}: {exc.strerror}"
    return " ".join(text.split())


if __name__ == "__main__":
    sys.exit(main())
