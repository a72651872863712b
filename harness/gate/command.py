"""The CI gate (``kvblock-bench gate``): exact allocation and instruction counts, held to configured rules.

Design: docs/ci.md#the-gate-as-the-code-has-it; exit status 0 pass, 1 a check failed, 2 a figure could not be measured.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from harness.base.args import DEFAULT_DEADLINE_S, add_deadline, csv_list, percentage
from harness.base.files import atomic_write_text, check_output_file
from harness.base.project import SCENARIO_DATA
from harness.counters import callgrind
from harness.errors import InputError
from harness.gate import saved as gate_baseline
from harness.gate.config import BASE_CELL, COUNTED_REGIMES, GateConfig, Rule, load_config
from harness.gate.counting import AllocationsJob, Failed, GateWorkers, WallJob, wall_bound
from harness.run import metadata
from impls import REGISTRY, UNAVAILABLE, registry
from scenarios import PAPER, Trace, generate, load, save

TRACE = SCENARIO_DATA / "gate-paper.npz"
# How TRACE was made; tests/test_gate.py regenerates it and compares checksums.
TRACE_SCENARIO = PAPER
TRACE_PARAMS = {"steps": 48, "running": 64, "num_blocks": 8192}
WARM_STEPS, STEPS = 16, 32
CORE = tuple(registry.names("design", "twin"))  # the article's designs and their compiled twins
BASE = BASE_CELL
# Callgrind runs: every heap layout, the first twice (identical runs, whose counts must agree).
GATE_LAYOUTS = (callgrind.LAYOUTS[0], *callgrind.LAYOUTS)
# The wall-clock comparison runs on the paper workload's 256 sequences, generated in memory.

EXIT_FAIL, EXIT_UNMEASURED = 1, 2


@dataclass
class CellFigures:
    """What the gate measured for one (impl, regime) cell; None where it was not measured."""

    impl: str
    regime: str
    instructions: list[int] | None = None  # one count per callgrind run
    seq_steps: int | None = None
    memray_per_step: float | None = None  # the design's allocations per step, by ``alloc_source``
    nrt_per_step: float | None = None
    alloc_source: str | None = None  # memray, nrt-stats or counting allocator
    layouts: list[int] | None = None  # each callgrind run's heap layout (None: all layout 0)

    @property
    def instructions_per_seq_step(self) -> float | None:
        """The fewest instructions of the runs (over heap layouts), per sequence-step."""
        if not self.instructions or not self.seq_steps:
            return None
        return min(self.instructions) / self.seq_steps

    @property
    def spread_pct(self) -> float | None:
        """How far the most instructions of the runs lie above the fewest, in percent."""
        return (max(self.instructions) / min(self.instructions) - 1) * 100 if self.instructions else None

    def repeats(self) -> dict[int, list[int]]:
        """The counts of each heap layout run more than once: identical runs, whose counts must agree."""
        layouts = self.layouts or [0] * len(self.instructions or [])
        by_layout: dict[int, list[int]] = {}
        for layout, count in zip(layouts, self.instructions or [], strict=True):
            by_layout.setdefault(layout, []).append(count)
        return {layout: counts for layout, counts in by_layout.items() if len(counts) > 1}


def gate_impls(named: list[str] | None, config: GateConfig, contenders: bool) -> list[str]:
    """The implementations gated: those named, else the configuration's, else the article's designs, their
    twins and the C++ designs; with ``contenders`` the engines' designs too; batched ``flat`` always."""
    if named:
        impls = list(named)
    elif config.impls:
        impls = list(config.impls)
    else:
        impls = [*CORE, *registry.names("native")]
    if contenders:
        impls += [name for name in registry.names("contender") if name not in impls]
    return impls


def resolve(names: list[str], workers: GateWorkers) -> tuple[list[str], dict[str, str]]:
    """(the names that can run here, name -> why not) for registry names and plug-ins; a plug-in is loaded in its
    own worker process, and one that cannot be loaded is bad input."""
    runnable, skipped = [], {}
    for name in dict.fromkeys(names):
        if name in UNAVAILABLE:
            skipped[name] = UNAVAILABLE[name]
            continue
        why = "" if name in REGISTRY else workers.probe(name)
        if why:
            raise InputError(f"--impl: {why}")
        runnable.append(name)
    return runnable, skipped


def gate_cells(impls: list[str]) -> list[tuple[str, str]]:
    """The cells of ``impls`` (loadable ones): batched ``flat`` first, then every implementation in both regimes
    (regime by regime), the C++ designs batched only (a per-call regime would time ctypes, not the design)."""
    native = [i for i in impls if registry.record(i).role == "native"]
    others = [i for i in impls if i not in native]
    cells = [(impl, regime) for regime in COUNTED_REGIMES for impl in others] + [(impl, "batched") for impl in native]
    return [BASE, *(c for c in cells if c != BASE)]


def gate_trace() -> Trace:
    """The gate's trace, built from its scenario and parameters (what :data:`TRACE` holds)."""
    return generate(TRACE_SCENARIO, **TRACE_PARAMS)


def rule_failures(rule: Rule, cell: CellFigures, base_ir: float | None) -> list[str]:
    """What ``cell`` fails of ``rule``, in words (a figure not measured fails nothing: it is reported apart)."""
    name, failures = f"{rule.impl} {rule.regime}", []
    if rule.zero_allocations and cell.memray_per_step is not None and (
            cell.memray_per_step != 0 or cell.nrt_per_step != 0):
        failures.append(f"{name} allocates: {cell.memray_per_step:g} ({cell.alloc_source or 'memray'}) and "
                        f"{cell.nrt_per_step:g} Numba runtime allocations per step (must be 0)")
    ir = cell.instructions_per_seq_step
    floor, ceiling = rule.min_instructions_vs_base, rule.max_instructions_per_seq_step
    if floor is not None and ir is not None and base_ir and ir / base_ir < floor:
        failures.append(f"{name} needs {ir / base_ir:.1f}x the instructions of batched flat per sequence-step; "
                        f"the floor is {floor:g}x")
    if ceiling is not None and ir is not None and ir > ceiling:
        failures.append(f"{name} needs {ir:.1f} instructions per sequence-step; the ceiling is {ceiling:g}")
    most = rule.max_instructions_vs_base
    if most is not None and ir is not None and base_ir and ir > most * base_ir:
        failures.append(f"{name} needs {ir:.2f} instructions per sequence-step, {ir / base_ir:.3f}x batched flat's "
                        f"{base_ir:.2f}; the ceiling is {most:g}x")
    return failures


def check(cells: dict[tuple[str, str], CellFigures], wall: tuple[float, float] | None,
          config: GateConfig) -> list[str]:
    """Every failed check, in words (empty when the gate passes)."""
    failures = []
    for key, cell in cells.items():
        for layout, counts in cell.repeats().items():
            if len(set(counts)) > 1:
                failures.append(f"{key[0]} {key[1]}: instruction counts differ between identical runs (heap layout "
                                f"{layout}): {counts}")
    base_ir = cells[BASE].instructions_per_seq_step if BASE in cells else None
    for rule in config.rules:
        if rule.cell in cells:
            failures += rule_failures(rule, cells[rule.cell], base_ir)
    if wall is not None and config.wall is not None and wall[0] / wall[1] < config.wall.min_ratio:
        failures.append(f"batched {config.wall.faster} is only {wall[0] / wall[1]:.1f}x faster than batched "
                        f"{config.wall.slower} by the clock; the floor is {config.wall.min_ratio:g}x")
    return failures


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None or (isinstance(value, float) and math.isnan(value)) else format(value, spec)


def _ceiling(rule: Rule | None) -> str:
    """A rule's ceiling for the table: instructions per sequence-step, or ``<ratio>x`` batched flat's."""
    if rule is None or (rule.max_instructions_per_seq_step is None and rule.max_instructions_vs_base is None):
        return "-"
    if rule.max_instructions_per_seq_step is not None:
        return format(rule.max_instructions_per_seq_step, "g")
    return f"{rule.max_instructions_vs_base:g}x"


def cell_rule(config: GateConfig, key: tuple[str, str], cell: CellFigures, base_ir: float | None) -> str:
    """The cell's rule: ``met``, ``FAILED``, ``not measured``, or ``no rule``."""
    rule = config.rule(key)
    if rule is None:
        return "no rule"
    if cell.instructions_per_seq_step is None and cell.memray_per_step is None:
        return "not measured"
    return "FAILED" if rule_failures(rule, cell, base_ir) else "met"


def rules_checked(cells: dict[tuple[str, str], CellFigures], config: GateConfig) -> dict[str, str]:
    """Each cell's :func:`cell_rule`, by ``"impl regime"``."""
    base_ir = cells[BASE].instructions_per_seq_step if BASE in cells else None
    return {f"{key[0]} {key[1]}": cell_rule(config, key, cell, base_ir) for key, cell in cells.items()}


def table(cells: dict[tuple[str, str], CellFigures], config: GateConfig | None = None) -> str:
    """The gate's table: instructions per sequence-step, ratio to batched flat, the cell's floor and ceiling,
    allocations per step, its rule's outcome."""
    config = config or GateConfig("")
    base_ir = cells[BASE].instructions_per_seq_step if BASE in cells else None
    width = max([10, *(len(impl) for impl, _ in cells)])
    lines = [
        f"{'impl':<{width}} {'regime':<9} {'instr/seq-step':>14} {'layouts +%':>10} {'x batched flat':>14} "
        f"{'floor':>6} {'ceiling':>7} {'allocs/step':>18} {'allocs/step nrt':>15}  {'allocs source':<17} rule",
    ]
    for key, cell in cells.items():
        ir = cell.instructions_per_seq_step
        ratio = ir / base_ir if ir is not None and base_ir else None
        rule = config.rule(key)
        floor = rule.min_instructions_vs_base if rule else None
        ceiling = _ceiling(rule)
        lines.append(
            f"{cell.impl:<{width}} {cell.regime:<9} {_fmt(ir, ',.1f'):>14} {_fmt(cell.spread_pct, '.2f'):>10} "
            f"{_fmt(ratio, '.1f'):>14} "
            f"{_fmt(floor, 'g'):>6} {ceiling:>7} {_fmt(cell.memray_per_step, '.2f'):>18} "
            f"{_fmt(cell.nrt_per_step, '.2f'):>15}  {cell.alloc_source or '-':<17} "
            f"{cell_rule(config, key, cell, base_ir)}"
        )
    return "\n".join(lines)


def measure_instructions(trace: Path, cells: dict[tuple[str, str], CellFigures],
                         layouts: tuple[int, ...] = GATE_LAYOUTS, code: str = "") -> str:
    """Fill each cell's instruction counts from one callgrind run per heap layout of ``layouts`` (``code``: another
    checkout's designs); returns why they are missing, or ""."""
    ok, why = callgrind.available()
    if not ok:
        return f"instruction counts unavailable: {why}"
    counted = callgrind.measure_runs(trace, list(cells), WARM_STEPS, STEPS, cache_sim=False, timeout=600,
                                     import_plugins=False, code=code, layouts=layouts)  # plug-ins: in workers
    for key, cell in cells.items():
        cell.instructions, cell.layouts = [run[key].ir for run in counted], list(layouts)
        cell.seq_steps = counted[0][key].seq_steps
    again = " (one run twice: identical runs must agree)" if len(set(layouts)) < len(layouts) else ""
    print(f"instruction counts: callgrind, ASLR off, the fewest over {len(set(layouts))} heap layouts{again}; {why}",
          flush=True)
    print(f"callgrind's environment: the run's, except {environment_note()}", flush=True)
    return ""


def environment_note() -> str:
    """What callgrind's processes set otherwise than the run's environment, in words."""
    env = callgrind.environment(callgrind.numba_cache_dir())
    return "; ".join(callgrind.environment_differences(env)) or "nothing"


def count_cells(trace: Path, keys: list[tuple[str, str]], code: str = "",
                deadline_s: float = DEFAULT_DEADLINE_S) -> tuple[dict[tuple[str, str], CellFigures], list[str]]:
    """The gate's counts of ``keys`` (allocations per step, instructions from one callgrind run) with ``code``'s
    designs, no rule applied (``kvblock-bench ab``); returns the figures and what could not be counted."""
    cells = {key: CellFigures(*key) for key in keys}
    problems: list[str] = []
    with GateWorkers(deadline_s, code) as workers:
        kept = _allocations(trace, cells, workers, problems)
    try:
        why = measure_instructions(trace, kept, callgrind.LAYOUTS, code=code)
    except callgrind.CallgrindError as exc:
        why = f"callgrind measurement failed: {exc}"
    return cells, [*problems, *filter(None, [why])]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``kvblock-bench gate``'s options."""
    parser.add_argument("--impl", type=csv_list, metavar="I,...",
                        help="implementations to gate: registered names, package.module:Class or entry-point names "
                             "(default: the configuration's impls, else the article's designs, twins and C++ designs)")
    parser.add_argument("--contenders", action="store_true", help="also gate the engines' designs")
    parser.add_argument("--config", type=Path, metavar="FILE",
                        help="a TOML file with [tool.kvblock-bench.gate] (default: the closest pyproject.toml from "
                             "the current folder upward that has it)")
    parser.add_argument("--trace", type=Path, default=TRACE, help="trace file (default: the committed gate trace)")
    parser.add_argument("--no-callgrind", action="store_true", help="skip the instruction counts (not for CI)")
    parser.add_argument("--json", type=Path, help="also write the figures, machine and failures to this file")
    parser.add_argument("--save-baseline", type=Path, metavar="FILE",
                        help="save the figures as a baseline for --against (needs the instruction counts)")
    parser.add_argument("--against", type=Path, metavar="FILE",
                        help="also fail a cell whose instructions per sequence-step rose beyond the tolerance since "
                             "this saved baseline, or that allocates where the baseline did not")
    parser.add_argument("--tolerance", type=percentage, metavar="PCT",
                        help="--against's tolerance in percent (default: the configuration's tolerance_pct, else 1)")
    parser.add_argument("--allow-other-machine", action="store_true",
                        help="compare --against a baseline made with other software anyway")
    parser.add_argument("--write-trace", action="store_true", help="regenerate the gate trace into --trace and exit")
    add_deadline(parser)


def gate_document(cells: dict[tuple[str, str], CellFigures], trace: Trace, config: GateConfig, **fields) -> dict:
    """What ``--json`` and ``--save-baseline`` write: the figures with the commit, machine and software."""
    meta = metadata.collect()
    machine = {k: meta[k] for k in ("cpu_model", "cpu", "cpu_count", "caches", "platform", "versions", "pmu")}
    return {"commit": meta["git_commit"], "machine": machine, "command_line": meta["command_line"],
            "trace": trace.header.get("scenario"), "trace_checksum": trace.header.get("checksum"),
            "warm_steps": WARM_STEPS, "steps": STEPS, "config": config.source,
            "cells": [asdict(c) for c in cells.values()], **fields}


class _Phases:
    """Wall time of the gate's phases, for its last line."""

    def __init__(self) -> None:
        self.started, self.seconds = time.perf_counter(), {}

    def done(self, name: str) -> None:
        self.seconds[name] = time.perf_counter() - self.started - sum(self.seconds.values())

    @property
    def elapsed(self) -> float:
        return time.perf_counter() - self.started


def _prepare(args: argparse.Namespace, workers: GateWorkers) -> tuple[GateConfig, list[str], dict | None]:
    """Everything checked before anything is measured: configuration, baseline, implementations (plug-ins loaded
    in their workers). Returns the configuration, the gated implementations that can run here, the baseline."""
    config = load_config(args.config)
    for flag, path in (("--json", args.json), ("--save-baseline", args.save_baseline)):
        if path is not None:
            check_output_file(path, flag)
    baseline = gate_baseline.load(args.against) if args.against else None
    if args.save_baseline and args.no_callgrind:
        raise InputError("--save-baseline needs the instruction counts: leave out --no-callgrind")
    names = gate_impls(args.impl, config, args.contenders)
    runnable, skipped = resolve([BASE[0], *names], workers)
    if config.wall is not None:
        _, wall_skipped = resolve([config.wall.slower, config.wall.faster], workers)
        if wall_skipped:
            raise InputError(f"{config.source} wall: {', '.join(wall_skipped)} cannot run here "
                             f"({'; '.join(wall_skipped.values())})")
    for name, why in skipped.items():
        print(f"skipped {name}: {why}", flush=True)
    return config, [n for n in names if n in runnable], baseline


def _wall(config: GateConfig, workers: GateWorkers, failures: list[str]) -> tuple[float, float] | None:
    """Both wall-clock designs' batched step in one worker (a plug-in's own, if one is); None when not measured."""
    w = config.wall
    if w is None:
        return None
    owner = next((name for name in (w.slower, w.faster) if name not in REGISTRY), w.slower)
    floor = workers.run("", WallJob(floor=True))  # in the registered designs' worker, never a plug-in's
    wall = workers.run(owner, WallJob(w.slower, w.faster))
    if isinstance(floor, Failed):  # our own code in the registered designs' worker
        raise RuntimeError(f"the wall clock's floor failed: {floor.reason}")
    if isinstance(wall, Failed):
        failures.append(f"wall clock ({w.slower} against {w.faster}): {wall.reason}")
        return None
    bent = wall_bound(wall, floor)
    if bent:
        failures += [f"wall clock: {name}: {reason}" for name, reason in bent.items()]
        return None
    slower, faster = wall.step_ns[w.slower], wall.step_ns[w.faster]
    print(f"wall clock, batched step, 256 sequences: {w.slower} {slower / 1e3:.1f} us, {w.faster} "
          f"{faster / 1e3:.2f} us, ratio {slower / faster:.1f}x (floor {w.min_ratio:g}x)", flush=True)
    return slower, faster


def _allocations(trace: Path, cells: dict[tuple[str, str], CellFigures], workers: GateWorkers,
                 failures: list[str]) -> dict[tuple[str, str], CellFigures]:
    """Each cell's allocations, in its design's worker; returns the cells whose design did not fail them."""
    kept = {}
    for key, cell in cells.items():
        figures = workers.run(key[0], AllocationsJob(str(trace.resolve()), key, WARM_STEPS, STEPS))
        if isinstance(figures, Failed):
            failures.append(f"{key[0]} {key[1]}: {figures.reason}")
            continue
        cell.memray_per_step, cell.nrt_per_step, cell.alloc_source = figures
        kept[key] = cell
    return kept


def _measure(args, cells: dict, workers: GateWorkers, config: GateConfig, phases: _Phases):
    """Wall clock (when configured), allocations and instruction counts (of the cells no design failed);
    returns (wall, failures, unmeasured)."""
    failures: list[str] = []
    wall = _wall(config, workers, failures)
    if config.wall is not None:
        phases.done("wall clock")
    kept = _allocations(args.trace, cells, workers, failures)
    phases.done("allocations")
    unmeasured = "instruction counts skipped (--no-callgrind)" if args.no_callgrind else ""
    if not args.no_callgrind:
        try:
            unmeasured = measure_instructions(args.trace, kept)
        except callgrind.CallgrindError as exc:
            failures.append(f"callgrind measurement failed: {exc}")
        phases.done("callgrind")
    return wall, failures, unmeasured


def run(args: argparse.Namespace) -> int:
    """Run the gate; the exit status says whether it passed (see the module docstring)."""
    if args.write_trace:
        print(f"wrote {save(gate_trace(), args.trace)}")
        return 0
    with GateWorkers(args.deadline) as workers:
        return _gate(args, workers)


def _gate(args: argparse.Namespace, workers: GateWorkers) -> int:
    config, gated, baseline = _prepare(args, workers)
    phases = _Phases()
    print(f"rules: {config.source}", flush=True)
    cells = {key: CellFigures(*key) for key in gate_cells(gated)}
    trace = load(args.trace)
    if baseline is not None:  # another trace or other software: refused before anything is measured
        why = gate_baseline.refusal(baseline, gate_document({}, trace, config), args.against, args.allow_other_machine)
        if why:
            raise InputError(why)
    seq_steps = int(trace.running_per_step()[WARM_STEPS : WARM_STEPS + STEPS].sum())
    print(f"gate trace: {args.trace.name}, steps [{WARM_STEPS}, {WARM_STEPS + STEPS}) after {WARM_STEPS} warm "
          f"steps, {seq_steps} sequence-steps", flush=True)
    wall, failures, unmeasured = _measure(args, cells, workers, config, phases)
    print(table(cells, config))
    for rule in config.rules:
        if rule.cell not in cells:
            print(f"rule for {rule.impl} {rule.regime}: not measured (not among the gated cells)")
    unruled = [f"{impl} {regime}" for impl, regime in cells if config.rule((impl, regime)) is None]
    if unruled:
        print(f"no rule for {len(unruled)} of {len(cells)} cells ({', '.join(unruled)}): measured, nothing asked")
    failures += check(cells, wall, config)
    wall_ns = None if wall is None else {config.wall.slower: wall[0], config.wall.faster: wall[1]}
    rules = rules_checked(cells, config)
    doc = gate_document(cells, trace, config, wall_ns=wall_ns, unmeasured=unmeasured, seconds=phases.elapsed,
                        phases=phases.seconds, rules=rules)
    if baseline is not None:
        failures += _against(args, baseline, doc, config)
    checked = any(word != "no rule" for word in rules.values()) or wall is not None or baseline is not None
    doc.update(failures=failures, verdict=verdict_word(failures, unmeasured, checked))
    _write(args, doc, unmeasured)
    return _verdict(failures, unmeasured, phases, doc["verdict"])


def verdict_word(failures: list[str], unmeasured: str, checked: bool) -> str:
    """``failed``, ``incomplete``, ``passed``, or ``checked no rule`` when nothing was asked of what it measured."""
    if failures:
        return "failed"
    if unmeasured:
        return "incomplete"
    return "passed" if checked else "checked no rule"


def _against(args, baseline: dict, doc: dict, config: GateConfig) -> list[str]:
    """The figures against ``--against``'s baseline: failures, notes printed."""
    tolerance = args.tolerance if args.tolerance is not None else config.tolerance_pct
    failures, notes = gate_baseline.against(baseline, doc, tolerance)
    for note in notes:
        print(f"against {args.against}: {note}")
    return failures


def _write(args, doc: dict, unmeasured: str) -> None:
    text = json.dumps(doc, indent=2) + "\n"
    if args.json:
        atomic_write_text(args.json, text)
    if args.save_baseline:
        if doc["failures"]:
            print(f"NOT SAVED: {args.save_baseline}: the gate failed; a baseline is saved only by a passing gate")
        elif unmeasured or any(not c["instructions"] for c in doc["cells"]):
            print(f"NOT SAVED: {args.save_baseline}: a baseline needs every cell's instruction counts")
        else:
            atomic_write_text(args.save_baseline, text)
            print(f"saved baseline {args.save_baseline}")


def _verdict(failures: list[str], unmeasured: str, phases: _Phases, word: str) -> int:
    for failure in failures:
        print(f"FAIL: {failure}")
    if unmeasured:
        print(f"NOT MEASURED: {unmeasured}")
    spent = ", ".join(f"{name} {seconds:.0f} s" for name, seconds in phases.seconds.items())
    print(f"gate {word} in {phases.elapsed:.0f} s ({spent})")
    if failures:
        return EXIT_FAIL
    return EXIT_UNMEASURED if unmeasured else 0
