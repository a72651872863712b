"""The ``kvblock-bench`` command line: one entry point, one subcommand per job.

``scenarios``, ``trace``, ``run``, ``report``, ``gate``, ``table-copy``, ``baseline`` and ``check`` share
this parser and its error handling: bad input ends as one line on stderr naming the flag, file or line and
the fix, with exit status 2, never a traceback. An interrupted command says so and exits with 130.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from scenarios import SCENARIOS, ScenarioError, TraceError

EXIT_USAGE, EXIT_INTERRUPTED, EXIT_PIPE = 2, 130, 141
PROG = "kvblock-bench"


class UsageError(ValueError):
    """Bad input on the command line; the message says which and how to fix it."""


class Parser(argparse.ArgumentParser):
    """argparse, with its errors as one line (no usage block): ``kvblock-bench run: error: ... (see --help)``."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(f"{message} (see `{self.prog} --help`)")


def csv_list(text: str) -> list[str]:
    """``a,b,c`` -> [a, b, c]; an empty item or a repeated one is an error, not a silent default."""
    items = [item.strip() for item in text.split(",")]
    if not text.strip() or any(not item for item in items):
        raise argparse.ArgumentTypeError(f"empty name in {text!r}: give comma-separated names, e.g. flat,dict")
    repeated = sorted({item for item in items if items.count(item) > 1})
    if repeated:
        raise argparse.ArgumentTypeError(f"{', '.join(repeated)} given twice in {text!r}")
    return items


def positive_int(text: str) -> int:
    """An integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def writable_dir(path: Path, flag: str) -> Path:
    """``path`` as a folder this process can create files in (made if missing), checked before any work."""
    if path.exists() and not path.is_dir():
        raise UsageError(f"{flag} {path}: is a file, not a folder; give a folder (default: results)")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"{flag} {path}: cannot create it ({exc.strerror}); give a folder you can write") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise UsageError(f"{flag} {path}: not writable; give a folder you can write")
    return path


# -- scenarios and traces ---------------------------------------------------------------------------------
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
        base = SCENARIOS[CSV_BASE[caching]]
        trace = build_real_trace(f"csv:{csv_path.name}", base.params({**params, "csv": str(csv_path.resolve()),
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
    from scenarios.trace import check_writable

    if path.is_dir():
        raise UsageError(f"-o {path}: is a folder; give a file name such as {path / 'trace.npz'}")
    check_writable(path)


# -- runs and reports ------------------------------------------------------------------------------------
def cmd_run(args: argparse.Namespace) -> int:
    from harness.measure.runner import RunConfig, run
    from harness.output.report import console_summary, write_reports

    if args.trace and args.scenario:
        raise UsageError("give --scenario or --trace, not both")
    cfg = RunConfig(
        scenarios=args.scenario or [],
        impls=args.impl or [],
        regimes=args.regime or ["per-call", "batched"],
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
    )
    run_dir = run(cfg, argv=[PROG, *sys.argv[1:]])
    if run_dir is None:
        raise UsageError("nothing to measure: the selection has no cell (see `kvblock-bench run --help`)")
    write_reports(run_dir)
    if args.figures:
        from harness.output.plots import render_figures

        render_figures(run_dir)
    print(console_summary(run_dir))
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from harness.output.report import console_summary, write_reports
    from harness.output.results import resolve_run

    run_dir = write_reports(resolve_run(args.run, Path(args.results)))
    if args.readme:
        from harness.output.readme import write_readme
        from harness.output.rundata import RunData

        write_readme(Path(args.readme), RunData.load(run_dir))
        print(f"rewrote the results section of {args.readme} from {run_dir}", file=sys.stderr)
    if not args.no_figures:
        from harness.output.plots import render_figures

        render_figures(run_dir)
    if args.growth_readme:
        from harness.output.growth import write_growth_readme

        write_growth_readme(Path(args.growth_readme), run_dir)
        print(f"rewrote the growth section of {args.growth_readme} from {run_dir}", file=sys.stderr)
    print((run_dir / "paper_table.md").read_text())
    print(console_summary(run_dir))
    return 0


def cmd_gate(args: argparse.Namespace) -> int:
    from harness.ci import gate

    return gate.run(args)


def cmd_table_copy(args: argparse.Namespace) -> int:
    from harness.studies.table_copy import measurement

    return measurement.run(args)


def cmd_check(args: argparse.Namespace) -> int:
    """Contract conformance of one implementation; exit 0 only when it conforms."""
    from harness.conformance import check
    from harness.conformance.pool import full_pool_problems
    from impls import REGISTRY, UNAVAILABLE
    from impls.contract import supports_prefix_caching
    from impls.registry import load_plugin

    if args.impl in UNAVAILABLE:
        raise UsageError(f"{args.impl} cannot run here: {UNAVAILABLE[args.impl]}")
    cls = REGISTRY[args.impl] if args.impl in REGISTRY else load_plugin(args.impl)
    print(f"checking {cls.__module__}.{cls.__qualname__}: {args.seeds} seed(s) x {args.examples} random call "
          f"sequences of up to {args.ops} calls against the reference model"
          f"{' (prefix caching included)' if supports_prefix_caching(cls) else ''}, then the 65,536-block pool",
          flush=True)
    verdict = check(cls, seeds=range(args.seeds), max_examples=args.examples, step_count=args.ops)
    problems = [] if not verdict.ok else _pool_problems(cls, full_pool_problems)
    print(verdict)
    for problem in problems:
        print(f"full pool: {problem}")
    ok = verdict.ok and not problems
    print("verdict: " + ("CONFORMS" if ok else "DOES NOT CONFORM"))
    return 0 if ok else 1


def _pool_problems(cls: type, run: Callable[[type], list[str]]) -> list[str]:
    try:
        return run(cls)
    except Exception as exc:  # a plug-in may raise anything; the verdict must say what, not crash
        return [f"{type(exc).__name__}: {exc}"]


def cmd_baseline(args: argparse.Namespace) -> int:
    from harness.ci import baseline

    return baseline.run(args)


# -- the parser ------------------------------------------------------------------------------------------
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
    group = p.add_argument_group("scenario parameters (each scenario takes its own: `kvblock-bench scenarios -v`)")
    keys = dict.fromkeys(key for sc in SCENARIOS.values() for key in sc.defaults if key != "csv")
    for key in keys:
        group.add_argument(f"--{key.replace('_', '-')}", dest=PARAM_PREFIX + key, metavar="VALUE")


def _add_run(sub, results: argparse.ArgumentParser) -> None:
    from harness.measure.matrix import describe

    p = sub.add_parser("run", parents=[results],
                       help="replay scenarios on implementations and measure (writes results/<run-id>/)",
                       description="Without --scenario/--impl/--trace: the default matrix.\n\n" + describe(),
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
    p.add_argument("--quick", action="store_true", help="short traces, one repetition: about a minute")
    p.add_argument("--reps", type=positive_int, help="repetitions per cell (default 3, --quick 1)")
    p.add_argument("--label", help="appended to the run id")
    p.add_argument("--no-paced", action="store_true", help="skip the paced open-loop CPU-share runs")
    p.add_argument("--no-l1d", action="store_true", help="skip L1D-miss measurement (perf or callgrind)")
    p.add_argument("--no-allocations", action="store_true", help="skip allocation counting")
    p.add_argument("--no-table-copy", action="store_true", help="skip the block-table copy study (rule 3)")
    p.add_argument("--memory", action="store_true",
                   help="measure each design's memory at the trace's peak (on in --sweep runs)")
    p.add_argument("--figures", action="store_true", help="also render figures (as `kvblock-bench report`)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def build_parser() -> Parser:
    from harness.ci import baseline, gate
    from harness.studies.table_copy import measurement as table_copy

    parser = Parser(prog=PROG, description=__doc__.split("\n")[0])
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
    p.add_argument("--no-figures", action="store_true", help="tables only")
    p.add_argument("--growth-readme", metavar="FILE",
                   help="rewrite FILE's growth section (<!-- growth:begin/end -->) from this scale-sweep run")
    p.add_argument("--readme", metavar="FILE",
                   help="also rewrite FILE's section between <!-- results:begin --> and <!-- results:end --> "
                        "(e.g. README.md from results/reference)")
    gate.add_arguments(sub.add_parser("gate", help="the CI gate: allocations, instruction counts, wall-clock floor",
                                      description=gate.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter))
    table_copy.add_arguments(sub.add_parser("table-copy", help="rule 3 alone: block tables to the device"))
    baseline.add_arguments(sub.add_parser("baseline", help="save a pytest-benchmark JSON as a committed baseline"))
    p = sub.add_parser("check", help="is an implementation correct? contract conformance against the reference model",
                       description="Random valid and invalid call sequences on IMPL and on the reference model "
                                   "(impls/core/reference.py), compared after every call up to a renaming of block "
                                   "ids; "
                                   "failed calls must leave the state as it was; the batched step must equal the "
                                   "same appends made one at a time; then the full 65,536-block pool. Prints the "
                                   "shortest failing call sequence as runnable Python. Exit 0 only when it conforms.")
    p.add_argument("impl", help="a registered name, package.module:Class, or a kvblock_bench.impls entry point")
    p.add_argument("--seeds", type=positive_int, default=2, help="independent random runs (default 2)")
    p.add_argument("--examples", type=positive_int, default=100, help="call sequences per seed (default 100)")
    p.add_argument("--ops", type=positive_int, default=40, help="calls per sequence, at most (default 40)")
    return parser


COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "scenarios": cmd_scenarios, "trace": cmd_trace, "run": cmd_run, "report": cmd_report, "gate": cmd_gate,
    "table-copy": cmd_table_copy, "baseline": cmd_baseline, "check": cmd_check,
}
# What a command may raise for bad input: shown as one line, exit status 2.
INPUT_ERRORS = (UsageError, ScenarioError, TraceError, ValueError, FileNotFoundError, IsADirectoryError,
                NotADirectoryError, PermissionError)


def _dispatch(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    return COMMANDS[args.command](args)


def main(argv: Sequence[str] | None = None) -> int:
    """Run one subcommand; returns the exit status."""
    try:
        return _dispatch(list(sys.argv[1:] if argv is None else argv))
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
