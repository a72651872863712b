"""The ``kvblock-bench`` command line: scenarios, traces, benchmark runs and reports."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from scenarios import SCENARIOS, ScenarioError, TraceError, generate, load, save
from scenarios.realtrace import build_real_trace


def _scenario_params(extra: Sequence[str]) -> dict[str, str]:
    """``--steps 500 --seed 3`` -> {"steps": "500", "seed": "3"}; values are converted per scenario."""
    params: dict[str, str] = {}
    items = list(extra)
    while items:
        key = items.pop(0)
        if not key.startswith("--") or len(key) < 3:
            raise ScenarioError(f"expected --PARAM VALUE, got {key!r}")
        key = key[2:]
        if "=" in key:
            key, value = key.split("=", 1)
        elif items and not items[0].startswith("--"):
            value = items.pop(0)
        else:
            raise ScenarioError(f"--{key} needs a value")
        params[key.replace("-", "_")] = value
    return params


def cmd_scenarios(args: argparse.Namespace) -> int:
    width = max(map(len, SCENARIOS))
    for name, sc in SCENARIOS.items():
        print(f"{name:<{width}}  {sc.description}")
        if args.verbose:
            print(" " * (width + 2) + " ".join(f"--{k.replace('_', '-')} {v}" for k, v in sc.defaults.items()))
    if not args.verbose:
        print("\n(-v shows each scenario's parameters and defaults)")
    return 0


def cmd_trace(args: argparse.Namespace, extra: Sequence[str]) -> int:
    if args.show:
        if args.name or args.from_csv or extra:
            raise ScenarioError("--show takes only a trace file")
        summary = load(args.show).summary()
        width = max(map(len, summary))
        for key, value in summary.items():
            print(f"{key:<{width}}  {json.dumps(value) if isinstance(value, dict) else value}")
        return 0
    if bool(args.name) == bool(args.from_csv):
        raise ScenarioError("give either a scenario NAME or --from-csv FILE (see `kvblock-bench scenarios`)")
    if not args.output:
        raise ScenarioError("-o FILE is required")
    params = _scenario_params(extra)
    if args.from_csv:
        base = SCENARIOS["azure-code"]
        overrides = {**params, "csv": str(Path(args.from_csv).resolve()), "duration_s": params.get("duration_s")}
        trace = build_real_trace(f"csv:{Path(args.from_csv).name}", base.params(overrides))
    else:
        trace = generate(args.name, **params)
    path = save(trace, args.output)
    h = trace.header
    print(f"wrote {path}: {h['scenario']}, {h['num_steps']} steps, {h['num_requests']} requests, "
          f"{h['num_ops']} ops, peak {h['peak_blocks_in_use']} blocks, {h['cow_count']} copy-on-writes")
    return 0


_TRACE_OPTIONS = {"-o", "--output", "--from-csv", "--show"}


def _split_trace_argv(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """Separate ``trace``'s own options from scenario parameters (``--PARAM VALUE``), which argparse
    cannot tell from a positional NAME."""
    own, params = [], []
    items = list(argv)
    while items:
        token = items.pop(0)
        name = token.split("=", 1)[0]
        if name in _TRACE_OPTIONS or name in ("-h", "--help") or not token.startswith("--"):
            own.append(token)
            if name in _TRACE_OPTIONS and "=" not in token and items:
                own.append(items.pop(0))
        else:
            params.append(token)
            if "=" not in token and items and not items[0].startswith("-"):
                params.append(items.pop(0))
    return own, params


def _csv_list(text: str) -> list[str]:
    return [item.strip() for item in text.split(",") if item.strip()]


def cmd_run(args: argparse.Namespace) -> int:
    from .report import console_summary, write_reports
    from .runner import RunConfig, run

    if args.trace and args.scenario:
        raise ScenarioError("give --scenario or --trace, not both")
    cfg = RunConfig(
        scenarios=_csv_list(args.scenario or ""),
        impls=_csv_list(args.impl or ""),
        regimes=_csv_list(args.regime) if args.regime else ["per-call", "batched"],
        trace_file=Path(args.trace) if args.trace else None,
        quick=args.quick,
        reps=args.reps if args.reps is not None else (1 if args.quick else 3),
        paced=not args.no_paced,
        l1d=not args.no_l1d,
        allocations=not args.no_allocations,
        table_copy=not args.no_table_copy,
        root=Path(args.results),
        label=args.label or "",
        progress=not args.no_progress,
    )
    if cfg.reps < 1:
        raise ScenarioError("--reps must be at least 1")
    run_dir = run(cfg, argv=["kvblock-bench", *sys.argv[1:]])
    write_reports(run_dir)
    if args.figures:
        from .plots import render_figures

        render_figures(run_dir)
    print(console_summary(run_dir))
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from .report import console_summary, write_reports
    from .results import resolve_run

    run_dir = write_reports(resolve_run(args.run, Path(args.results)))
    if not args.no_figures:
        from .plots import render_figures

        render_figures(run_dir)
    print((run_dir / "paper_table.md").read_text())
    print(console_summary(run_dir))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kvblock-bench", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("scenarios", help="list the scenarios with their descriptions")
    p.add_argument("-v", "--verbose", action="store_true", help="show every parameter and its default")

    p = sub.add_parser(
        "trace", help="generate a trace file, import one from a CSV, or summarise one",
        description="kvblock-bench trace NAME [--PARAM VALUE ...] -o FILE | --from-csv CSV -o FILE | --show FILE",
    )
    p.add_argument("name", nargs="?", help="scenario name (see `kvblock-bench scenarios`)")
    p.add_argument("-o", "--output", help="trace file to write (.npz)")
    p.add_argument("--from-csv", metavar="CSV",
                   help="import requests from a CSV (timestamp, prompt_tokens, output_tokens)")
    p.add_argument("--show", metavar="FILE", help="summarise a trace file")

    p = sub.add_parser("run", help="replay scenarios on implementations and measure (writes results/<run-id>/)",
                       description="Without --scenario/--impl: the default matrix (see README, 'The matrix').")
    p.add_argument("--scenario", metavar="S,...", help="scenarios to run (default: all)")
    p.add_argument("--trace", metavar="FILE", help="replay a trace file instead of named scenarios")
    p.add_argument("--impl", metavar="I,...", help="implementations (default: all in the registry)")
    p.add_argument("--regime", metavar="R,...", help="per-call, batched (default: both)")
    p.add_argument("--quick", action="store_true", help="short traces, one repetition: about a minute")
    p.add_argument("--reps", type=int, help="repetitions per cell (default 3, --quick 1)")
    p.add_argument("--results", default="results", help="results folder (default: results)")
    p.add_argument("--label", help="appended to the run id")
    p.add_argument("--no-paced", action="store_true", help="skip the paced open-loop CPU-share runs")
    p.add_argument("--no-l1d", action="store_true", help="skip L1D-miss measurement (perf or callgrind)")
    p.add_argument("--no-allocations", action="store_true", help="skip allocation counting")
    p.add_argument("--no-table-copy", action="store_true", help="skip the block-table copy study (rule 3)")
    p.add_argument("--figures", action="store_true", help="also render figures (as `kvblock-bench report`)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")

    p = sub.add_parser("report", help="write reports (and figures) for a run and print the paper table")
    p.add_argument("run", nargs="?", help="run id or directory (default: results/latest)")
    p.add_argument("--results", default="results", help="results folder (default: results)")
    p.add_argument("--no-figures", action="store_true", help="tables only")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    extra: list[str] = []
    if argv and argv[0] == "trace":
        own, extra = _split_trace_argv(argv[1:])
        argv = ["trace", *own]
    args, unknown = parser.parse_known_args(argv)
    extra += unknown
    try:
        if args.command == "trace":
            return cmd_trace(args, extra)
        if extra:
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
        if args.command == "scenarios":
            return cmd_scenarios(args)
        if args.command == "run":
            return cmd_run(args)
        if args.command == "report":
            return cmd_report(args)
    except (ScenarioError, TraceError, ValueError, FileNotFoundError) as exc:
        print(f"kvblock-bench: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
