"""The CI gate: figures that do not vary between identical runs, with floors that fail the build.

``kvblock-bench gate`` (``make gate``) checks, on a small committed trace (:data:`TRACE`):

1. allocations: the batched ``flat`` step allocates nothing (memray events and Numba runtime allocations,
   steps minus an empty region, as in :mod:`harness.counters.allocations`); the other cells' counts are reported;
2. instructions: callgrind counts per sequence-step of every core design in both regimes, from two
   independent valgrind runs that must agree exactly; floors (:data:`INSTRUCTION_FLOORS`) on how many
   times more instructions a cell needs than batched ``flat``, and ceilings (:data:`INSTRUCTION_CEILINGS`)
   on the instructions per sequence-step of a cell itself;
3. wall clock: batched ``dict`` over batched ``flat`` step time in this one process, printed; it fails only
   below :data:`WALL_FLOOR`, because timings on shared CI machines vary by 5-10 % between identical runs.

Exit status: 0 when every check passes, 1 when one fails, 2 when a figure cannot be measured here.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from harness.counters import callgrind
from harness.counters.allocations import allocations_per_step
from harness.counters.regions import prepare_cell
from harness.measure.clock import tsc_usable
from harness.measure.drivers import Prepared, compiled_driver, run_compiled, run_interpreted
from harness.measure.replay import REGIMES
from harness.output.results import atomic_write_text
from impls import REGISTRY, registry
from scenarios import Trace, generate, load, save

TRACE = Path(__file__).resolve().parents[2] / "scenarios" / "data" / "gate-paper.npz"
# How TRACE was made; tests/test_gate.py regenerates it and compares checksums.
TRACE_SCENARIO = "paper"
TRACE_PARAMS = {"steps": 48, "running": 64, "num_blocks": 8192}
WARM_STEPS, STEPS = 16, 32
CORE = tuple(registry.names("design", "twin"))  # the article's designs and their compiled twins
BASE = (registry.RATIO_BASE, "batched")
# (impl, regime) -> the least number of times more instructions per sequence-step than batched flat.
INSTRUCTION_FLOORS = {("dict", "batched"): 10.0}
# (impl, regime) -> the most instructions per sequence-step, just above what the cell needs now (batched flat:
# 44.1 with the one-pass kernels; see README, "Deterministic gate"), so that a slower kernel fails the build.
INSTRUCTION_CEILINGS = {("flat", "batched"): 45.0}
WALL_FLOOR = 3.0
# The wall-clock comparison runs on the paper workload's 256 sequences, generated in memory.
WALL_PARAMS = {"steps": 200, "running": 256}
WALL_REPEATS = 3

EXIT_FAIL, EXIT_UNMEASURED = 1, 2


@dataclass
class CellFigures:
    """What the gate measured for one (impl, regime) cell; None where it was not measured."""

    impl: str
    regime: str
    instructions: list[int] | None = None  # one count per callgrind run
    seq_steps: int | None = None
    memray_per_step: float | None = None
    nrt_per_step: float | None = None

    @property
    def instructions_per_seq_step(self) -> float | None:
        if not self.instructions or not self.seq_steps:
            return None
        return self.instructions[0] / self.seq_steps


def gate_cells(contenders: bool) -> list[tuple[str, str]]:
    """The gate's cells: the article's designs and twins in both regimes, the C++ designs batched (where a
    compiler built them), and with ``contenders`` the engines' designs too."""
    impls = [*CORE, *(name for name in registry.names("contender") if name in REGISTRY and contenders)]
    native = [name for name in registry.names("native") if name in REGISTRY]
    return [(impl, regime) for regime in REGIMES for impl in impls] + [(impl, "batched") for impl in native]


def gate_trace() -> Trace:
    """The gate's trace, built from its scenario and parameters (what :data:`TRACE` holds)."""
    return generate(TRACE_SCENARIO, **TRACE_PARAMS)


def allocations(prep: Prepared, impl: str, regime: str, warm: int, steps: int) -> tuple[float, float]:
    """Allocations per step (memray, Numba runtime) of steps ``[warm, warm + steps)``, less an empty region."""
    _, advance, _ = prepare_cell(prep, impl, regime)
    advance(0, warm)
    return allocations_per_step(advance, warm, warm + steps)


def _median_step_ns(impl: str, prep: Prepared) -> float:
    cls = REGISTRY[impl]
    times = []
    for _ in range(WALL_REPEATS):
        mgr = cls(**prep.trace.config)
        if cls.kernels is not None and tsc_usable():
            result = run_compiled(prep, mgr, compiled_driver(cls.kernels), detail=False)
        else:
            result = run_interpreted(prep, mgr, "batched")
        times.append(float(statistics.median(result.step_ns)))
    return statistics.median(times)


def wall_clock() -> tuple[float, float]:
    """Median batched step time (ns) of ``dict`` and of ``flat`` on the paper workload, in this process."""
    prep = Prepared.from_trace(generate("paper", **WALL_PARAMS))
    return _median_step_ns("dict", prep), _median_step_ns("flat", prep)


def check(cells: dict[tuple[str, str], CellFigures], wall: tuple[float, float] | None) -> list[str]:
    """Every failed check, in words (empty when the gate passes)."""
    failures = []
    base = cells[BASE]
    if base.memray_per_step is not None and (base.memray_per_step != 0 or base.nrt_per_step != 0):
        failures.append(f"batched flat allocates: {base.memray_per_step:g} memray events and "
                        f"{base.nrt_per_step:g} Numba runtime allocations per step (must be 0)")
    for key, cell in cells.items():
        if cell.instructions and len(set(cell.instructions)) > 1:
            failures.append(f"{key[0]} {key[1]}: instruction counts differ between identical runs: {cell.instructions}")
    base_ir = base.instructions_per_seq_step
    for key, floor in INSTRUCTION_FLOORS.items():
        ir = cells[key].instructions_per_seq_step
        if ir is not None and base_ir and ir / base_ir < floor:
            failures.append(f"{key[0]} {key[1]} needs {ir / base_ir:.1f}x the instructions of batched flat "
                            f"per sequence-step; the floor is {floor:g}x")
    for key, ceiling in INSTRUCTION_CEILINGS.items():
        ir = cells[key].instructions_per_seq_step if key in cells else None
        if ir is not None and ir > ceiling:
            failures.append(f"{key[0]} {key[1]} needs {ir:.1f} instructions per sequence-step; the ceiling is "
                            f"{ceiling:g}")
    if wall is not None and wall[0] / wall[1] < WALL_FLOOR:
        failures.append(f"batched flat is only {wall[0] / wall[1]:.1f}x faster than batched dict by the clock; "
                        f"the floor is {WALL_FLOOR:g}x")
    return failures


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None or (isinstance(value, float) and math.isnan(value)) else format(value, spec)


def table(cells: dict[tuple[str, str], CellFigures]) -> str:
    """The gate's table: instructions per sequence-step, ratio to batched flat, its floor and ceiling,
    allocations per step."""
    base_ir = cells[BASE].instructions_per_seq_step
    lines = [
        f"{'impl':<10} {'regime':<9} {'instr/seq-step':>14} {'x batched flat':>14} {'floor':>6} {'ceiling':>7} "
        f"{'allocs/step memray':>18} {'allocs/step nrt':>15}",
    ]
    for key, cell in cells.items():
        ir = cell.instructions_per_seq_step
        ratio = ir / base_ir if ir is not None and base_ir else None
        floor, ceiling = INSTRUCTION_FLOORS.get(key), INSTRUCTION_CEILINGS.get(key)
        lines.append(
            f"{cell.impl:<10} {cell.regime:<9} {_fmt(ir, ',.1f'):>14} {_fmt(ratio, '.1f'):>14} "
            f"{_fmt(floor, 'g'):>6} {_fmt(ceiling, 'g'):>7} {_fmt(cell.memray_per_step, '.2f'):>18} "
            f"{_fmt(cell.nrt_per_step, '.2f'):>15}"
        )
    return "\n".join(lines)


def measure_instructions(trace: Path, cells: dict[tuple[str, str], CellFigures]) -> str:
    """Fill each cell's instruction counts from two callgrind runs; returns why they are missing, or ""."""
    ok, why = callgrind.available()
    if not ok:
        return f"instruction counts unavailable: {why}"
    runs = callgrind.measure_runs(trace, list(cells), WARM_STEPS, STEPS, cache_sim=False, runs=2, timeout=600)
    for key, cell in cells.items():
        cell.instructions = [run[key].ir for run in runs]
        cell.seq_steps = runs[0][key].seq_steps
    print(f"instruction counts: callgrind, 2 runs, PYTHONHASHSEED=0, ASLR off; {why}", flush=True)
    return ""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``kvblock-bench gate``'s options."""
    parser.add_argument("--trace", type=Path, default=TRACE, help="trace file (default: the committed gate trace)")
    parser.add_argument("--contenders", action="store_true", help="also report the engines' designs")
    parser.add_argument("--no-callgrind", action="store_true", help="skip the instruction counts (not for CI)")
    parser.add_argument("--json", type=Path, help="also write the figures and failures to this file")
    parser.add_argument("--write-trace", action="store_true", help="regenerate the gate trace into --trace and exit")


def run(args: argparse.Namespace) -> int:
    """Run the gate; the exit status says whether it passed (see the module docstring)."""
    if args.write_trace:
        print(f"wrote {save(gate_trace(), args.trace)}")
        return 0
    started, phases = time.perf_counter(), {}

    def phase_done(name: str) -> None:
        phases[name] = time.perf_counter() - started - sum(phases.values())

    cells = {key: CellFigures(*key) for key in gate_cells(args.contenders)}
    prep = Prepared.from_trace(load(args.trace))
    seq_steps = int(prep.trace.running_per_step()[WARM_STEPS : WARM_STEPS + STEPS].sum())
    print(f"gate trace: {args.trace.name}, steps [{WARM_STEPS}, {WARM_STEPS + STEPS}) after {WARM_STEPS} warm "
          f"steps, {seq_steps} sequence-steps", flush=True)

    dict_ns, flat_ns = wall = wall_clock()
    phase_done("wall clock")
    print(f"wall clock, batched step, 256 sequences: dict {dict_ns / 1e3:.1f} us, flat {flat_ns / 1e3:.2f} us, "
          f"ratio {dict_ns / flat_ns:.1f}x (floor {WALL_FLOOR:g}x)", flush=True)

    for key, cell in cells.items():
        cell.memray_per_step, cell.nrt_per_step = allocations(prep, *key, WARM_STEPS, STEPS)
    phase_done("allocations")

    failures = []
    unmeasured = "instruction counts skipped (--no-callgrind)" if args.no_callgrind else ""
    if not args.no_callgrind:
        try:
            unmeasured = measure_instructions(args.trace, cells)
        except callgrind.CallgrindError as exc:
            failures.append(f"callgrind measurement failed: {exc}")
        phase_done("callgrind")

    print(table(cells))
    failures += check(cells, wall)
    elapsed = time.perf_counter() - started
    if args.json:
        payload = {"cells": [asdict(c) for c in cells.values()], "wall_ns": {"dict": dict_ns, "flat": flat_ns},
                   "failures": failures, "unmeasured": unmeasured, "seconds": elapsed, "phases": phases}
        atomic_write_text(args.json, json.dumps(payload, indent=2))
    for failure in failures:
        print(f"FAIL: {failure}")
    if unmeasured:
        print(f"NOT MEASURED: {unmeasured}")
    spent = ", ".join(f"{name} {seconds:.0f} s" for name, seconds in phases.items())
    print(f"gate {'failed' if failures else 'incomplete' if unmeasured else 'passed'} in {elapsed:.0f} s ({spent})")
    if failures:
        return EXIT_FAIL
    return EXIT_UNMEASURED if unmeasured else 0

