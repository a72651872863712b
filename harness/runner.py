"""The benchmark matrix: scenarios x implementations x regimes, measured, checked and written as it goes.

For each scenario the trace is generated (or read from the trace cache), every cell is warmed up (Numba
compilation or cache loading, timed and reported as ``compile_s``), then repetitions run interleaved across
cells (A B C A B C ...) so that machine drift hits all alike. Every replay is checked against the trace
(copy-on-writes per step, end state), so a fast wrong implementation never reaches a table. After each
scenario its rows are written (atomically) with the raw samples; an interrupted run keeps what finished.

The default matrix keeps ``make bench`` near ten minutes on two cores (see :func:`default_cells`): the article's
designs run everywhere in both regimes; the compiled twins run batched everywhere and per call on ``paper``;
the engine contenders run on ``paper``; the concurrency sweep replays 500 steps. Naming scenarios or
implementations on the command line runs exactly what was named. ``--quick`` (``make bench-quick``, about a
minute) replays 200 steps once, counts allocations and copies tables on ``paper`` only, and skips the
callgrind simulation.
"""

from __future__ import annotations

import gc
import hashlib
import json
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from impls import REGISTRY, UNAVAILABLE
from scenarios import SCENARIOS, Trace, generate, load, save
from scenarios.scheduler import GENERATOR_VERSION
from scenarios.trace import FORMAT_VERSION, content_digest

from . import clock, metadata
from .allocations import count_allocations, nrt_allocations
from .drivers import (
    Prepared,
    StepTimes,
    compiled_driver,
    compiled_step_runner,
    run_compiled,
    run_interpreted,
    step_runner,
)
from .metrics import Work, timing_rows
from .paced import paced_run
from .replay import REGIMES, ReplayError, check_end_state
from .results import RESULTS_DIR, Row, new_run_dir, point_latest, write_json, write_rows

DESIGNS = ("dict", "list", "flat")
TWINS = ("dict-jit", "list-jit")
PAPER = "paper"
QUICK_OVERRIDES = {"azure-code": {"duration_s": 60.0}, "mooncake": {"duration_s": 30.0}}
QUICK_STEPS = 200
SWEEP_STEPS = 500
ALLOC_STEPS = 20  # steps counted for allocations per step (after warm-up)
WARM_STEPS = 5


@dataclass
class RunConfig:
    """What to run. Empty ``scenarios`` / ``impls`` mean the default matrix (:func:`default_cells`)."""

    scenarios: list[str] = field(default_factory=list)
    impls: list[str] = field(default_factory=list)
    regimes: list[str] = field(default_factory=lambda: list(REGIMES))
    trace_file: Path | None = None
    quick: bool = False
    reps: int = 3
    paced: bool = True
    l1d: bool = True
    allocations: bool = True
    table_copy: bool = True
    root: Path = RESULTS_DIR
    label: str = ""
    progress: bool = True


def default_cells(scenario: str, impls: Iterable[str], regimes: Iterable[str]) -> list[tuple[str, str]]:
    """The default matrix policy for one scenario (explicit --impl/--scenario lists bypass it)."""
    cells = []
    for impl in impls:
        for regime in regimes:
            if impl in DESIGNS or (impl in TWINS and (regime == "batched" or scenario == PAPER)) or (
                impl not in DESIGNS + TWINS and scenario == PAPER
            ):
                cells.append((impl, regime))
    return cells



# -- traces ---------------------------------------------------------------------------------------------
def scenario_overrides(name: str, quick: bool) -> dict:
    """Parameters the bench sets on top of a scenario's defaults."""
    if quick:
        return dict(QUICK_OVERRIDES.get(name, {"steps": QUICK_STEPS}))
    if name.startswith("concurrency-"):
        return {"steps": SWEEP_STEPS}
    return {}


def cached_trace(name: str, overrides: dict, cache_dir: Path) -> tuple[Trace, float]:
    """Generate a scenario's trace, or read it from the cache (keyed by scenario, parameters and format)."""
    params = SCENARIOS[name].params(overrides)
    key = hashlib.sha256(json.dumps([name, params, FORMAT_VERSION, GENERATOR_VERSION], sort_keys=True).encode())
    key = key.hexdigest()[:16]
    path = cache_dir / f"{name}-{key}.npz"
    t0 = time.perf_counter()
    if path.exists():
        try:
            return load(path), time.perf_counter() - t0
        except ValueError:
            path.unlink()  # a damaged cache entry is regenerated, never trusted
    trace = generate(name, **overrides)
    save(trace, path)
    return trace, time.perf_counter() - t0


# -- one scenario ------------------------------------------------------------------------------------------
class ScenarioBench:
    """Measures every cell of one trace."""

    def __init__(self, name: str, trace: Trace, cells: list[tuple[str, str]], cfg: RunConfig, calib: dict,
                 drivers: dict, tick: Callable[[str], None]) -> None:
        self.name, self.trace, self.cells, self.cfg, self.calib = name, trace, cells, cfg, calib
        self.prep = Prepared.from_trace(trace)
        self.work = Work.of(self.prep)
        self.drivers = drivers  # impl -> compiled driver, shared across scenarios (compiled once)
        self.tick = tick
        self.rows: list[Row] = []
        self.raw: dict[tuple[str, str], dict] = {}
        self.last_mgr: dict[tuple[str, str], object] = {}

    def compiled(self, impl: str, regime: str) -> bool:
        return regime == "batched" and REGISTRY[impl].kernels is not None and clock.tsc_usable()

    def row(self, impl: str, regime: str, metric: str, value: float, unit: str, source: str, how: str = "",
            status: str = "ok") -> None:
        self.rows.append(Row(self.name, impl, regime, metric, value, unit, source, status, how))

    def warm_up(self, impl: str, regime: str) -> None:
        """First calls (Numba cache load or compile) on a scratch manager, outside every timed region."""
        cls = REGISTRY[impl]
        t0 = time.perf_counter()
        mgr = cls(**self.trace.config)
        steps = min(WARM_STEPS, self.prep.num_steps)
        if self.compiled(impl, regime):
            fresh = impl not in self.drivers
            if fresh:
                self.drivers[impl] = compiled_driver(cls.kernels)
            compiled_step_runner(self.prep, mgr, self.drivers[impl])(0, steps)
            what = "first call of the compiled replay: " + (
                "Numba compiles the driver, kernels load from the cache" if fresh else "driver compiled earlier")
        else:
            step_runner(self.prep, mgr, regime)(0, steps)
            what = "first steps from Python (Numba cache load where compiled)"
        if cls.kernels is not None:
            self.row(impl, regime, "compile_s", time.perf_counter() - t0, "s", "wall clock", what)

    def replay(self, impl: str, regime: str, detail: bool) -> StepTimes:
        mgr = REGISTRY[impl](**self.trace.config)
        gc.collect()
        gc.freeze()  # collections triggered by the replay's own allocations scan only what it creates
        try:
            if self.compiled(impl, regime):
                samples = run_compiled(self.prep, mgr, self.drivers[impl], detail)
            else:
                samples = run_interpreted(self.prep, mgr, regime)
        finally:
            gc.unfreeze()
        if not np.array_equal(samples.cows, self.trace.step_cows):
            step = int(np.flatnonzero(samples.cows != self.trace.step_cows)[0])
            raise ReplayError(f"step {step}: {samples.cows[step]} copy-on-writes, trace expects "
                              f"{self.trace.step_cows[step]}")
        check_end_state(self.trace, mgr)
        self.last_mgr[(impl, regime)] = mgr
        return samples

    def fail(self, cell: tuple[str, str], exc: Exception) -> None:
        """A cell that disagreed with the trace: one ``failed`` row, and no figure from it anywhere."""
        self.rows.append(Row(self.name, cell[0], cell[1], "correctness", float("nan"), "", "trace check", "failed",
                             f"{type(exc).__name__}: {exc}"))
        self.cells.remove(cell)

    def measure_timings(self) -> None:
        for cell in list(self.cells):
            try:
                self.warm_up(*cell)
            except (ReplayError, ValueError, KeyError, MemoryError) as exc:
                self.fail(cell, exc)
        steps: dict[tuple[str, str], list[StepTimes]] = {c: [] for c in self.cells}
        details: dict[tuple[str, str], list[StepTimes]] = {c: [] for c in self.cells}
        for _ in range(self.cfg.reps):
            for cell in list(self.cells):  # interleaved: A B C A B C ...
                try:
                    steps[cell].append(self.replay(*cell, detail=False))
                    details[cell].append(self.replay(*cell, detail=True) if self.compiled(*cell) else steps[cell][-1])
                except (ReplayError, ValueError, KeyError, MemoryError) as exc:
                    self.fail(cell, exc)
                self.tick(f"{self.name} {cell[0]} {cell[1]}")
        for impl, regime in self.cells:
            cell = (impl, regime)
            compiled = self.compiled(impl, regime)
            overhead = self.calib["compiled_timer_ns" if compiled else "python_timer_ns"]
            how = ("closed loop, whole step compiled (Numba replay loop calling the kernels), TSC"
                   if compiled else f"closed loop from Python, {regime}, perf_counter_ns")
            self.rows += timing_rows((self.name, impl, regime), self.work, steps[cell], details[cell],
                                     self.trace.header["params"].get("step_rate", 2000), overhead, how)
            self.raw[cell] = {
                "clock": steps[cell][0].clock,
                "step_ns": [s.step_ns.round(1).tolist() for s in steps[cell]],
                "kind_ns_totals": [dict(zip(("alloc", "free", "other", "decode", "lookup"),
                                            s.ns.sum(axis=0).round(1).tolist(), strict=True))
                                   for s in details[cell]],
            }
            mgr = self.last_mgr[cell]
            sizes = [mgr.table_nbytes(row) for row in np.flatnonzero(self.trace.final_lens).tolist()]
            if sizes and sizes[0] is not None:
                self.row(impl, regime, "table_bytes_per_seq", float(np.mean(sizes)), "B", "design introspection",
                         f"mean over the {len(sizes)} live sequences at the end (see the design's _table_nbytes)")
            else:
                self.row(impl, regime, "table_bytes_per_seq", float("nan"), "B", "design introspection",
                         "the design cannot report it" if sizes else "no live sequence at the end",
                         status="unavailable")

    def measure_allocations(self) -> None:
        """Allocation events per step over ALLOC_STEPS steps, minus the same call path over zero steps.

        Each counter gets a fresh manager advanced (uncounted) to the same step, so both see the same work.
        """
        lo = min(WARM_STEPS, max(0, self.prep.num_steps - ALLOC_STEPS))
        hi = min(self.prep.num_steps, lo + ALLOC_STEPS)
        for impl, regime in self.cells:
            compiled = self.compiled(impl, regime)
            path = "compiled replay loop" if compiled else f"Python driver, {regime}"
            for metric, counter, source in (("allocs_per_step", count_allocations, "memray"),
                                            ("nrt_allocs_per_step", nrt_allocations, "nrt-stats")):
                mgr = REGISTRY[impl](**self.trace.config)
                run = (compiled_step_runner(self.prep, mgr, self.drivers[impl]) if compiled
                       else step_runner(self.prep, mgr, regime))
                run(0, lo)
                counter(lambda run=run: run(lo, lo), 1)  # the counter's own first-use allocations
                empty = counter(lambda run=run: run(lo, lo), 1)
                events = counter(lambda run=run: run(lo, hi), 1)
                self.row(impl, regime, metric, (events - empty) / max(1, hi - lo), "allocs/step", source,
                         f"steps {lo}-{hi} via the {path}, minus the same call over zero steps")
            self.tick(f"{self.name} {impl} {regime} allocations")

    def measure_paced(self) -> None:
        rate = self.trace.header["params"].get("step_rate", 2000)
        for impl, regime in self.cells:
            cls = REGISTRY[impl]
            result = paced_run(self.prep, lambda cls=cls: cls(**self.trace.config), regime, rate)
            how = (f"open loop paced at {rate:g} steps/s from Python ({result.steps} steps), thread CPU time "
                   f"minus an idle paced run; compiled designs pay one dispatch per call")
            self.row(impl, regime, "cpu_share_observed_pct", result.cpu_share_pct, "%", "thread_time_ns", how)
            self.row(impl, regime, "deadline_misses", result.deadline_misses, "steps", "perf_counter_ns",
                     f"steps whose work ended after the next step was due, of {result.steps}")
            self.tick(f"{self.name} {impl} {regime} paced")


def run(cfg: RunConfig, argv: list[str] | None = None) -> Path:
    """Run the matrix; returns the run directory (also pointed to by ``results/latest``)."""
    from tqdm import tqdm

    unknown = [i for i in cfg.impls if i not in REGISTRY and i not in UNAVAILABLE]
    if unknown:
        raise ValueError(f"unknown implementation(s) {unknown}; known: {', '.join([*REGISTRY, *UNAVAILABLE])}")
    bad = [s for s in cfg.scenarios if s not in SCENARIOS]
    if bad:
        raise ValueError(f"unknown scenario(s) {bad}; see `kvblock-bench scenarios`")
    bad = [r for r in cfg.regimes if r not in REGIMES]
    if bad:
        raise ValueError(f"unknown regime(s) {bad}; choose from {', '.join(REGIMES)}")
    explicit = bool(cfg.scenarios or cfg.impls or cfg.trace_file)
    impls = [i for i in (cfg.impls or list(REGISTRY)) if i in REGISTRY]
    skipped_impls = {i: UNAVAILABLE[i] for i in (cfg.impls or UNAVAILABLE) if i in UNAVAILABLE}

    run_dir = new_run_dir(cfg.root, cfg.label or ("quick" if cfg.quick else ""))
    calib = {
        "python_timer_ns": clock.python_timer_overhead_ns(),
        "compiled_timer_ns": clock.compiled_timer_overhead_ns() if clock.tsc_usable() else None,
        "tsc_ns_per_tick": clock.ns_per_tick() if clock.tsc_usable() else None,
    }
    meta = {**metadata.collect(argv), "config": {k: str(v) for k, v in vars(cfg).items()}, "calibration": calib,
            "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "complete": False, "skipped_impls": skipped_impls}
    write_json(run_dir / "meta.json", meta)
    point_latest(run_dir)

    plan: list[tuple[str, Trace | None, dict]] = []
    if cfg.trace_file:
        plan.append(("trace:" + Path(cfg.trace_file).name, load(cfg.trace_file), {}))
    else:
        for name in cfg.scenarios or list(SCENARIOS):
            plan.append((name, None, scenario_overrides(name, cfg.quick)))

    rows: list[Row] = []
    drivers: dict = {}
    seen: dict[str, str] = {}
    cache_dir = cfg.root / ".trace-cache"
    def cells_of(name: str) -> list[tuple[str, str]]:
        return (default_cells(name, impls, cfg.regimes) if not explicit
                else [(i, r) for i in impls for r in cfg.regimes])

    def counts_allocations(name: str) -> bool:
        return cfg.allocations and (name == PAPER or not cfg.quick)

    def copies_tables(name: str) -> bool:
        return cfg.table_copy and (name == PAPER or (name.startswith("concurrency-") and not cfg.quick))

    total = sum(len(cells_of(n)) * (cfg.reps + counts_allocations(n) + (cfg.paced and n == PAPER))
                + (n == PAPER) * (cfg.l1d + 1) + copies_tables(n)
                for n, _, _ in plan)
    bar = tqdm(total=total, desc="kvblock-bench", unit="cell", disable=not cfg.progress, file=sys.stderr)

    def tick(what: str) -> None:
        bar.set_postfix_str(what[:60])
        bar.update(1)

    try:
        for name, trace, overrides in plan:
            if trace is None:
                trace, gen_s = cached_trace(name, overrides, cache_dir)
                rows.append(Row(name, "-", "-", "trace_s", gen_s, "s", "wall clock",
                                how="generate (or load from the trace cache) the scenario's trace"))
            checksum = content_digest(trace)
            if checksum in seen:  # the same trace twice (concurrency-256 is paper): measure once, say so
                rows += [Row(name, r.impl, r.regime, r.metric, r.value, r.unit, r.source, r.status,
                             f"{r.how}; same trace as {seen[checksum]}")
                         for r in rows if r.scenario == seen[checksum] and r.metric != "trace_s"]
                write_rows(run_dir / "results.csv", rows)
                continue
            seen[checksum] = name
            cells = cells_of(name)
            bench = ScenarioBench(name, trace, cells, cfg, calib, drivers, tick)
            bench.measure_timings()
            if counts_allocations(name):
                bench.measure_allocations()
            if cfg.paced and name == PAPER:
                bench.measure_paced()
            rows += bench.rows
            for (impl, regime), raw in bench.raw.items():
                write_json(run_dir / "raw" / name / f"{impl}__{regime}.json.gz", raw, compress=True)
            write_rows(run_dir / "results.csv", rows)
            if name == PAPER or name.startswith("trace:"):
                rows += extra_measurements(name, trace, cells, cfg, tick)
                write_rows(run_dir / "results.csv", rows)
            if copies_tables(name):
                from .table_copy import measure as measure_table_copy

                copy_rows, copy_raw = measure_table_copy(trace)
                rows += copy_rows
                write_json(run_dir / "raw" / name / "flat__table-copy.json.gz", copy_raw, compress=True)
                write_rows(run_dir / "results.csv", rows)
                tick(f"{name} table copy")
        meta["complete"] = True
    except KeyboardInterrupt:
        meta["interrupted"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        print(f"\ninterrupted: {run_dir} keeps every finished scenario", file=sys.stderr)
        raise
    finally:
        bar.close()
        meta["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        write_json(run_dir / "meta.json", meta)
        write_rows(run_dir / "results.csv", rows)
    return run_dir


def extra_measurements(name: str, trace: Trace, cells: list[tuple[str, str]], cfg: RunConfig,
                       tick: Callable[[str], None]) -> list[Row]:
    """Counters that need their own process (L1D misses, instructions) and the table-copy study."""
    rows: list[Row] = []
    if cfg.l1d:
        from .l1d import l1d_rows

        rows += l1d_rows(name, trace, cells, quick=cfg.quick)
        tick(f"{name} L1D")
    if name == PAPER:
        from .idwidth import idwidth_rows

        rows += idwidth_rows(trace)
        tick(f"{name} id width")
    return rows
