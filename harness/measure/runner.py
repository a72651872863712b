"""A run: the matrix's scenarios, each measured, checked and written as it goes.

For each scenario (:mod:`harness.measure.matrix` says which cells and studies) the trace is generated (or read
from the trace cache), every cell is warmed up (Numba compilation or cache loading, timed as ``compile_s``),
then the cells' repetitions run interleaved in slices of steps (:mod:`harness.measure.interleave`), so that
machine drift hits all alike; ratios to ``flat`` and an A/A control come with paired bootstrap intervals.
Every replay is checked against the trace (copy-on-writes and slot digests per step, end state), so a fast
wrong implementation never reaches a table. After each scenario its rows are written (atomically) with the
raw samples; an interrupted run keeps what finished. The run folder is created when the first scenario has
figures, and ``results/latest`` moves to it only then: a run that fails before measuring leaves no trace.
"""

from __future__ import annotations

import hashlib
import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from harness.counters.allocations import allocations_per_step
from harness.errors import InputError
from harness.measure import clock
from harness.measure.dispatch import calls_per_trace, dispatch_rows, empty_call_ns, has_dispatch
from harness.measure.drivers import KINDS, Prepared
from harness.measure.interleave import (
    CELL_ERRORS,
    FAST_REPS,
    Driver,
    Replays,
    interleaved,
    slice_bounds,
    verify_slots,
)
from harness.measure.matrix import REGIMES, ScenarioPlan, default_scenarios, plan_scenario, sweep_scenarios
from harness.measure.metrics import Work, cell_blocks, timing_rows
from harness.measure.paced import paced_run, paced_whole_step_run
from harness.measure.stats import paired_ratio
from harness.measure.threads import one_intra_op_thread
from harness.output import metadata
from harness.output.results import RESULTS_DIR, Row, new_run_dir, point_latest, ratio_metric, write_json, write_rows
from harness.studies.scale import CONFIG_METRICS, config_rows
from impls import REGISTRY, UNAVAILABLE
from scenarios import SCENARIOS, Trace, generate, load, save
from scenarios.scheduler import GENERATOR_VERSION
from scenarios.trace import FORMAT_VERSION, content_digest, trace_uses_caching

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
    memory: bool = False  # the memory study (on in scale sweeps)
    sweep: list[str] = field(default_factory=list)  # scale-sweep families (matrix.SWEEPS), the default's rules
    root: Path = RESULTS_DIR
    label: str = ""
    progress: bool = True


# -- traces ---------------------------------------------------------------------------------------------
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
RATIO_METRICS = ("seq_step_ns", "lookup_ns", "alloc_free_ns")  # each against the base in the same regime
BASE_IMPL = "flat"  # the ratio base: the article's design C
CACHING_BASE_IMPL = "flat-pc"  # on prefix-caching scenarios: C with its prefix cache
HIT_METRICS = (("cache_hit_tokens_pct", "hit_tokens", "lookup_tokens", "% of prompt tokens looked up"),
               ("cache_hit_blocks_pct", "hit_blocks", "lookup_blocks", "% of full prompt blocks looked up"))


def base_impl(trace: Trace) -> str:
    """The implementation every ratio of ``trace``'s cells is taken against."""
    return CACHING_BASE_IMPL if trace_uses_caching(trace) else BASE_IMPL


class ScenarioBench:
    """Measures every cell of one trace: interleaved timed replays, then the cell's counters."""

    def __init__(self, name: str, trace: Trace, cells: list[tuple[str, str]], cfg: RunConfig, calib: dict,
                 drivers: dict, tick: Callable[[str], None], classes: dict[str, type] | None = None) -> None:
        self.name, self.trace, self.cells, self.cfg, self.calib = name, trace, list(cells), cfg, calib
        self.prep = Prepared.from_trace(trace)
        self.work = Work.of(self.prep)
        self.slices = slice_bounds(self.prep.num_steps)
        classes = classes if classes is not None else REGISTRY
        self.drivers = {(i, r, ""): Driver(self.prep, classes[i], r, drivers, i) for i, r in self.cells}
        self.tick = tick
        self.base = base_impl(trace)
        self.rows: list[Row] = []
        self.raw: dict[tuple[str, str], dict] = {}
        self.max_reps: dict[tuple[str, str], int] = {}  # cells run for fewer repetitions than cfg.reps

    def row(self, impl: str, regime: str, metric: str, value: float, unit: str, source: str, how: str = "",
            status: str = "ok", **columns) -> None:
        self.rows.append(Row(self.name, impl, regime, metric, value, unit, source, status, how, **columns))

    def warm_up(self, key) -> None:
        """First calls (Numba cache load or compile, C++ library load) outside every timed region; the native
        driver's slot mapping is checked here, from Python, once."""
        driver = self.drivers[key]
        t0 = time.perf_counter()
        driver.advance(driver.new())(0, min(WARM_STEPS, self.prep.num_steps))
        if driver.kind == "native":
            verify_slots(driver)
        if driver.kind != "python" or getattr(driver.cls, "kernels", None) is not None:
            self.row(key[0], key[1], "compile_s", time.perf_counter() - t0, "s", "wall clock",
                     f"first steps through the {driver.kind} driver (compile or cache load)", driver=driver.kind)

    def fail(self, cell: tuple[str, str], exc: Exception) -> None:
        """A cell that disagreed with the trace: one ``failed`` row, and no figure from it anywhere."""
        self.row(cell[0], cell[1], "correctness", float("nan"), "", "trace check", f"{type(exc).__name__}: {exc}",
                 status="failed")
        self.cells = [c for c in self.cells if c != cell]  # our own list: the caller's plan is left as it was
        self.drivers.pop((*cell, ""), None)

    def measure_timings(self) -> None:
        for key in list(self.drivers):
            try:
                self.warm_up(key)
            except CELL_ERRORS as exc:
                self.fail(key[:2], exc)
        aa = self._aa_key()
        timed = {**self.drivers, **({aa: self.drivers[(*aa[:2], "")]} if aa else {})}
        caps = {k: self._reps(k[:2]) for k in timed}
        steps = interleaved(timed, self.cfg.reps, False, self.slices, self._repetition_done, caps=caps)
        detailed = {k: d for k, d in self.drivers.items() if d.separate_detail and k not in steps.failed}
        details = interleaved(detailed, self.cfg.reps, True, self.slices, caps=caps)
        for key, exc in {**steps.failed, **details.failed}.items():
            if not key[2] and key[:2] in self.cells:
                self.fail(key[:2], exc)
        for impl, regime in self.cells:
            key = (impl, regime, "")
            self._cell_rows(key, steps.samples[key], details.samples.get(key, steps.samples[key]),
                            steps.last_mgr[key])
        self._ratio_rows(steps, details)
        self._cache_rows()
        if aa and aa in steps.samples and (*aa[:2], "") in steps.samples:
            self._aa_row(aa, steps)

    def _reps(self, cell: tuple[str, str]) -> int:
        """Repetitions of ``cell``: the plan's cap, else FAST_REPS times --reps for compiled and C++ replays."""
        if cell in self.max_reps:
            return self.max_reps[cell]
        driver = self.drivers.get((*cell, ""))
        return self.cfg.reps * (FAST_REPS if driver is not None and driver.separate_detail else 1)

    def _cache_rows(self) -> None:
        """Hit rates and evictions of a caching trace, for every cell whose replays matched the trace's hits step
        by step (a cell that did not is marked failed): the same figures for all, which is the point."""
        if not trace_uses_caching(self.trace):
            return
        cache = self.trace.header["cache"]
        evictions = float(self.trace.step_evictions.sum()) / max(1, self.trace.num_steps)
        for impl, regime in self.cells:
            for metric, hit, looked, what in HIT_METRICS:
                self.row(impl, regime, metric, 100.0 * cache[hit] / max(1, cache[looked]), "%",
                         "trace check", f"{what}; every step's hits checked against the reference model's")
            self.row(impl, regime, "evictions_per_step", evictions, "blocks/step", "trace check",
                     "cached blocks evicted per step (the reference model's, which every replay reproduces)")

    def _repetition_done(self, key) -> None:
        """One progress unit per cell and repetition; the A/A copy is not a cell of the plan."""
        if not key[2]:
            self.tick(f"{self.name} {key[0]} {key[1]}")

    def _aa_key(self):
        """The A/A control: batched flat (else the first cell) replayed twice as if it were two cells."""
        if not self.drivers:
            return None
        key = (self.base, "batched", "") if (self.base, "batched", "") in self.drivers else next(iter(self.drivers))
        return (*key[:2], "aa")

    def _cell_rows(self, key, step_samples, detail_samples, mgr) -> None:
        impl, regime, _ = key
        driver = self.drivers[key]
        timed = timing_rows((self.name, impl, regime), self.work, step_samples, detail_samples,
                            self.trace.header["params"].get("step_rate", 2000), driver.timer_overhead(self.calib),
                            driver.how(), self.slices)
        for row in timed:
            row.driver = driver.kind
        self.rows += timed
        self.raw[(impl, regime)] = {
            "clock": step_samples[0].clock,
            "slices": self.slices,
            "step_ns": [s.step_ns.round(1).tolist() for s in step_samples],
            "kind_ns_totals": [dict(zip(KINDS, s.ns.sum(axis=0).round(1).tolist(), strict=True))
                               for s in detail_samples],
        }
        if regime == "per-call" and has_dispatch(driver.cls):  # the per-call figure's dispatch, apart
            dispatch = dispatch_rows(self.name, impl, empty_call_ns(mgr), calls_per_trace(self.trace))
            for row in dispatch:
                row.driver = "python"
            self.rows += dispatch
        sizes = [mgr.table_nbytes(row) for row in np.flatnonzero(self.trace.final_lens).tolist()]
        if sizes and sizes[0] is not None:
            self.row(impl, regime, "table_bytes_per_seq", float(np.mean(sizes)), "B", "design introspection",
                     f"mean over the {len(sizes)} live sequences at the end (see the design's _table_nbytes)")
        else:
            self.row(impl, regime, "table_bytes_per_seq", float("nan"), "B", "design introspection",
                     "the design cannot report it" if sizes else "no live sequence at the end",
                     status="unavailable")

    def _blocks(self, key, steps: Replays, details: Replays):
        step = steps.samples[key]
        return cell_blocks(self.work, step, details.samples.get(key, step), self.slices)

    def _ratio_rows(self, steps: Replays, details: Replays) -> None:
        """Each cell against the base in the same regime (and against the batched base), paired block by block."""
        for impl, regime in self.cells:
            mine = self._blocks((impl, regime, ""), steps, details)
            for base_regime, batched_base in ((regime, False), ("batched", True)):
                base_key = (self.base, base_regime, "")
                if base_key not in steps.samples or base_key == (impl, regime, "") or (
                        batched_base and regime == "batched"):
                    continue
                base = self._blocks(base_key, steps, details)
                for metric in ("seq_step_ns",) if batched_base else RATIO_METRICS:
                    self._ratio_row(impl, regime, ratio_metric(metric, self.base, batched_base), mine[metric],
                                    base[metric])

    def _ratio_row(self, impl: str, regime: str, metric: str, mine, base) -> None:
        if not mine[1].sum() or not base[1].sum():
            return
        est = paired_ratio(mine[0], base[0], mine[1], base[1])
        self.row(impl, regime, metric, est.value, "x", "ratio",
                 f"time per unit of work over {self.base}'s (each step's median over repetitions); 95 % paired "
                 "bootstrap interval, the same slices and repetitions drawn for both", ci_low=_finite(est.low),
                 ci_high=_finite(est.high), reps=self._reps((impl, regime)), steps=self.work.steps,
                 driver=self.drivers[(impl, regime, "")].kind)

    def _aa_row(self, aa, steps: Replays) -> None:
        impl, regime, _ = aa
        copy = cell_blocks(self.work, steps.samples[aa], steps.samples[aa], self.slices)["seq_step_ns"]
        orig = cell_blocks(self.work, steps.samples[(impl, regime, "")], steps.samples[(impl, regime, "")],
                           self.slices)["seq_step_ns"]
        est = paired_ratio(copy[0], orig[0])
        verdict = "no difference" if est.contains(1.0) else "differs: the noise floor of this run"
        self.row(impl, regime, "aa_ratio", est.value, "x", "ratio",
                 f"A/A control: the same cell replayed twice, interleaved as two cells; seq-step time of the copy "
                 f"over the original; {verdict}", ci_low=_finite(est.low), ci_high=_finite(est.high),
                 reps=self.cfg.reps, steps=self.work.steps, driver=self.drivers[(impl, regime, "")].kind)

    def measure_allocations(self) -> None:
        """Allocation events per step over ALLOC_STEPS steps (see :func:`allocations_per_step`), on a fresh
        manager advanced (uncounted) to the region's first step."""
        lo = min(WARM_STEPS, max(0, self.prep.num_steps - ALLOC_STEPS))
        hi = min(self.prep.num_steps, lo + ALLOC_STEPS)
        for impl, regime in self.cells:
            driver = self.drivers[(impl, regime, "")]
            advance = driver.advance(driver.new())
            advance(0, lo)
            counts = allocations_per_step(advance, lo, hi)
            if driver.kind == "native":  # first: reports show the first measured row of a figure
                self._native_allocations(driver, lo, hi)
            for metric, value, source in (("allocs_per_step", counts[0], "memray"),
                                          ("nrt_allocs_per_step", counts[1], "nrt-stats")):
                self.row(impl, regime, metric, value, "allocs/step", source,
                         f"steps {lo}-{hi} via the {driver.kind} driver, minus the same call over zero steps",
                         steps=hi - lo, driver=driver.kind)
            self.tick(f"{self.name} {impl} {regime} allocations")

    def _native_allocations(self, driver: Driver, lo: int, hi: int) -> None:
        """The C++ containers' own allocation calls per step (their counting allocator), without the Python
        wrapper around the replay call that memray also sees."""
        from impls import native

        mgr = driver.new()
        native.replay(mgr, self.prep.trace, False, 0, lo)
        allocs = native.replay(mgr, self.prep.trace, False, lo, hi).allocs
        self.row(driver.impl, driver.regime, "allocs_per_step", float(allocs.mean()) if len(allocs) else 0.0,
                 "allocs/step", "counting allocator",
                 f"steps {lo}-{hi}: operator new calls of the C++ containers, counted in the library", steps=hi - lo)

    def measure_paced(self, cells: list[tuple[str, str]] | None = None) -> None:
        rate = self.trace.header["params"].get("step_rate", 2000)
        for impl, regime in self.cells if cells is None else cells:
            driver = self.drivers[(impl, regime, "")]
            result = paced_run(self.prep, driver.new, regime, rate)
            how = (f"open loop paced at {rate:g} steps/s from Python ({result.steps} steps), thread CPU time "
                   f"minus an idle paced run; compiled designs pay one dispatch per call")
            self.row(impl, regime, "cpu_share_observed_pct", result.cpu_share_pct, "%", "thread_time_ns", how,
                     step_rate=rate, steps=result.steps, driver="python")
            self.row(impl, regime, "deadline_misses", result.deadline_misses, "steps", "perf_counter_ns",
                     f"steps whose work ended after the next step was due, of {result.steps}", steps=result.steps,
                     driver="python")
            if regime == "batched" and callable(getattr(driver.cls, "step", None)):
                self._paced_whole_step(driver, rate)
            self.tick(f"{self.name} {impl} {regime} paced")

    def _paced_whole_step(self, driver: Driver, rate: float) -> None:
        """The whole-step entry point paced as an engine would call it: one Python call per step."""
        if trace_uses_caching(self.trace):
            self.row(driver.impl, "batched", "cpu_share_observed_whole_step_pct", float("nan"), "%",
                     "thread_time_ns", "step() does not take the prefix-caching ops yet", status="unsupported")
            return
        try:
            result = paced_whole_step_run(self.prep, driver.new, rate)
        except CELL_ERRORS as exc:
            self.row(driver.impl, "batched", "cpu_share_observed_whole_step_pct", float("nan"), "%",
                     "thread_time_ns", f"{type(exc).__name__}: {exc}", status="failed")
            return
        how = (f"open loop paced at {rate:g} steps/s from Python ({result.steps} steps), one step() call per step "
               "(pool operations and decode batch), thread CPU time minus an idle paced run")
        self.row(driver.impl, "batched", "cpu_share_observed_whole_step_pct", result.cpu_share_pct, "%",
                 "thread_time_ns", how, step_rate=rate, steps=result.steps, driver="python")
        self.row(driver.impl, "batched", "deadline_misses_whole_step", result.deadline_misses, "steps",
                 "perf_counter_ns", f"steps whose step() call ended after the next step was due, of {result.steps}",
                 steps=result.steps, driver="python")


def _finite(x: float) -> float | None:
    return None if x != x else x


STUDY_FLAGS = {"allocations": "allocations", "paced": "paced", "l1d": "l1d", "table_copy": "table_copy",
               "memory": "memory"}


def enabled_studies(cfg: RunConfig) -> list[str]:
    """The studies this configuration runs (each ``--no-X`` flag switches one off; id width, the cache
    operations and hashing always run: seconds each)."""
    return ["idwidth", "cache_ops", "hashing", *(study for study, flag in STUDY_FLAGS.items() if getattr(cfg, flag))]


def resolve_impls(cfg: RunConfig) -> tuple[dict[str, type], dict[str, str]]:
    """(name -> class to run, name -> why it is skipped) for the configuration's implementations."""
    from impls.registry import PluginError, load_plugin

    if len(set(cfg.impls)) != len(cfg.impls):
        raise ValueError(f"--impl names an implementation twice: {','.join(cfg.impls)}")
    classes: dict[str, type] = {}
    for name in cfg.impls or list(REGISTRY):
        if name in REGISTRY:
            classes[name] = REGISTRY[name]
        elif name not in UNAVAILABLE:
            try:
                classes[name] = load_plugin(name)
            except PluginError as exc:
                raise ValueError(f"{exc}; built in: {', '.join([*REGISTRY, *UNAVAILABLE])}") from None
    skipped = {i: UNAVAILABLE[i] for i in (cfg.impls or UNAVAILABLE) if i in UNAVAILABLE}
    return classes, skipped


def check_config(cfg: RunConfig) -> None:
    """Refuse a configuration before anything is created: unknown scenarios or regimes, bad counts."""
    bad = [s for s in cfg.scenarios if s not in SCENARIOS]
    if bad:
        raise ValueError(f"unknown scenario(s) {bad}; see `kvblock-bench scenarios`")
    bad = [r for r in cfg.regimes if r not in REGIMES]
    if bad or not cfg.regimes:
        raise ValueError(f"unknown regime(s) {bad or cfg.regimes}; choose from {', '.join(REGIMES)}")
    if cfg.reps < 1:
        raise ValueError(f"--reps must be at least 1, got {cfg.reps}")
    if cfg.trace_file and cfg.scenarios:
        raise ValueError("give --scenario or --trace, not both")
    if cfg.sweep and (cfg.scenarios or cfg.trace_file):
        raise InputError("give --sweep or --scenario/--trace, not both")


def build_plan(cfg: RunConfig, impls: list[str]) -> list[tuple[ScenarioPlan, Trace | None]]:
    """The run's scenarios in order, each with its cells and studies (and the trace, for --trace)."""
    explicit = bool(cfg.scenarios or cfg.impls or cfg.trace_file)
    studies = enabled_studies(cfg)
    if cfg.trace_file:
        trace = load(cfg.trace_file)  # refused here, before any run folder exists
        name = "trace:" + Path(cfg.trace_file).name
        return [(plan_scenario(name, impls, cfg.regimes, explicit=True, quick=cfg.quick, enabled=studies), trace)]
    names = cfg.scenarios or (sweep_scenarios(cfg.sweep, SCENARIOS) if cfg.sweep else default_scenarios(SCENARIOS))
    return [(plan_scenario(name, impls, cfg.regimes, explicit=explicit, quick=cfg.quick, enabled=studies), None)
            for name in names]


class RunWriter:
    """The run folder, created when the first figure is ready; ``latest`` moves to it only once it has rows."""

    def __init__(self, cfg: RunConfig, meta: dict) -> None:
        self.cfg, self.meta = cfg, meta
        self.run_dir: Path | None = None
        self.rows: list[Row] = []

    def folder(self) -> Path:
        if self.run_dir is None:
            self.run_dir = new_run_dir(self.cfg.root, self.cfg.label or ("quick" if self.cfg.quick else ""))
            write_json(self.run_dir / "meta.json", self.meta)
        return self.run_dir

    def add(self, rows: list[Row], raw: dict[str, object] | None = None) -> None:
        """Keep ``rows`` (and raw files by relative path) and rewrite results.csv, atomically."""
        run_dir = self.folder()
        for rel, obj in (raw or {}).items():
            write_json(run_dir / rel, obj, compress=True)
        self.rows += rows
        write_rows(run_dir / "results.csv", self.rows)
        if self.rows:
            point_latest(run_dir)

    def finish(self, **fields: object) -> None:
        self.meta.update(fields, finished=time.strftime("%Y-%m-%dT%H:%M:%S%z"))
        if self.run_dir is not None:
            write_json(self.run_dir / "meta.json", self.meta)


def measure_scenario(plan: ScenarioPlan, trace: Trace, cfg: RunConfig, shared: dict, tick) -> tuple[list[Row], dict]:
    """Every figure of one scenario: timed cells, then its studies. Returns (rows, raw files)."""
    bench = ScenarioBench(plan.scenario, trace, plan.cells, cfg, shared["calib"], shared["drivers"], tick,
                          shared["classes"])
    bench.max_reps = {c: plan.reps_of(c, cfg.reps) for c in plan.cells if plan.reps_of(c, cfg.reps) < cfg.reps}
    bench.measure_timings()
    if "allocations" in plan.studies:
        bench.measure_allocations()
    if "paced" in plan.studies:
        bench.measure_paced(plan.study_cells("paced", bench.cells))
    raw = {f"raw/{plan.scenario}/{impl}__{regime}.json.gz": data for (impl, regime), data in bench.raw.items()}
    rows = bench.rows + run_studies(plan, trace, bench.cells, cfg, tick, raw, shared["classes"])
    return rows, raw


def run_studies(plan: ScenarioPlan, trace: Trace, cells: list[tuple[str, str]], cfg: RunConfig, tick,
                raw: dict, classes: dict[str, type] | None = None) -> list[Row]:
    """The scenario's studies that need their own processes or machinery (L1D, id width, table copies)."""
    rows: list[Row] = []
    if "l1d" in plan.studies:
        from harness.counters.l1d import l1d_rows

        rows += l1d_rows(plan.scenario, trace, plan.study_cells("l1d", cells), quick=cfg.quick)
        tick(f"{plan.scenario} L1D")
    if "idwidth" in plan.studies:
        from harness.studies.idwidth import idwidth_rows

        rows += idwidth_rows(trace, scenario=plan.scenario)
        tick(f"{plan.scenario} id width")
    if "cache_ops" in plan.studies:
        rows += _cache_ops_rows(plan.scenario, cells, classes or {})
        tick(f"{plan.scenario} cache operations")
    if "hashing" in plan.studies:
        from harness.studies.hashing import hashing_rows

        rows += hashing_rows(trace, plan.scenario)
        tick(f"{plan.scenario} hashing")
    if "memory" in plan.studies:
        from harness.studies.memory import memory_rows

        rows += memory_rows(plan.scenario, trace, cells, classes or REGISTRY)
        tick(f"{plan.scenario} memory")
    if "table_copy" in plan.studies:
        from harness.studies.table_copy import measure as measure_table_copy

        copy_rows, copy_raw = measure_table_copy(trace)
        rows += copy_rows
        raw[f"raw/{plan.scenario}/flat__table-copy.json.gz"] = copy_raw
        tick(f"{plan.scenario} table copy")
    return rows


def _cache_ops_rows(scenario: str, cells: list[tuple[str, str]], classes: dict[str, type]) -> list[Row]:
    """The cache-operation study for every implementation with prefix caching among the scenario's cells."""
    from harness.studies.cache_ops import CacheOpsError, cache_ops_rows
    from impls.contract import supports_prefix_caching

    rows: list[Row] = []
    for impl in dict.fromkeys(i for i, _ in cells):
        cls = classes.get(impl) or REGISTRY.get(impl)
        if cls is None or not supports_prefix_caching(cls):
            continue
        try:
            rows += cache_ops_rows(cls, impl, scenario)
        except (CacheOpsError, *CELL_ERRORS) as exc:
            rows.append(Row(scenario, impl, "per-call", "cache_hit_ns", float("nan"), "ns/block", "perf_counter_ns",
                            "failed", f"{type(exc).__name__}: {exc}"))
    return rows


def _calibrate() -> dict:
    usable = clock.tsc_usable()
    return {
        "python_timer_ns": clock.python_timer_overhead_ns(),
        "compiled_timer_ns": clock.compiled_timer_overhead_ns() if usable else None,
        "tsc_ns_per_tick": clock.ns_per_tick() if usable else None,
    }


def run(cfg: RunConfig, argv: list[str] | None = None) -> Path | None:
    """Run the matrix; returns the run directory (also pointed to by ``results/latest``), None if nothing ran."""
    from tqdm import tqdm

    check_config(cfg)
    classes, skipped = resolve_impls(cfg)
    plan = build_plan(cfg, list(classes))
    shared = {"calib": _calibrate(), "drivers": {}, "classes": classes}
    meta = {**metadata.collect(argv, classes), "config": {k: str(v) for k, v in vars(cfg).items()},
            "calibration": shared["calib"], "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "complete": False,
            "skipped_impls": skipped, "plan": [vars(p) for p, _ in plan]}
    writer = RunWriter(cfg, meta)
    total = sum(p.units(cfg.reps) for p, _ in plan)
    bar = tqdm(total=total, desc="kvblock-bench", unit="cell", disable=not cfg.progress, file=sys.stderr)

    def tick(what: str) -> None:
        bar.set_postfix_str(what[:60])
        bar.update(1)

    try:
        with one_intra_op_thread() as threads:
            meta["torch_intra_op_threads"] = threads
            _run_plan(plan, cfg, shared, writer, tick)
        writer.finish(complete=True)
    except KeyboardInterrupt:
        writer.finish(interrupted=time.strftime("%Y-%m-%dT%H:%M:%S%z"))
        where = writer.run_dir or "no run folder (nothing had finished)"
        print(f"\ninterrupted: {where} keeps every finished scenario", file=sys.stderr)
        raise
    except BaseException:
        writer.finish()
        raise
    finally:
        bar.close()
    return writer.run_dir


TRACE_METRICS = ("trace_s", "trace_forks", "trace_cows", "scenario_wall_s", *CONFIG_METRICS)  # never copied


def trace_count_rows(name: str, trace: Trace) -> list[Row]:
    """What the scenario's trace asks for beyond appends, as rows the reports read: its forks and the
    copy-on-writes they cause (the trace's own counts, which every replay is checked against)."""
    how = "counted in the trace (every replay is checked against its copy-on-writes per step)"
    forks = int(trace.header["ops_by_kind"].get("fork", 0))
    return [Row(name, "-", "-", "trace_forks", forks, "forks", "trace header", how=how, steps=trace.num_steps),
            Row(name, "-", "-", "trace_cows", int(trace.header["cow_count"]), "copy-on-writes", "trace header",
                how=how, steps=trace.num_steps), *config_rows(name, trace)]


def _run_plan(plan: list[tuple[ScenarioPlan, Trace | None]], cfg: RunConfig, shared: dict, writer: RunWriter,
              tick) -> None:
    seen: dict[str, str] = {}  # trace content digest -> the scenario that measured it
    cache_dir = cfg.root / ".trace-cache"
    for scenario_plan, given in plan:
        name, started = scenario_plan.scenario, time.perf_counter()
        trace, trace_rows = given, []
        if trace is None:
            trace, gen_s = cached_trace(name, scenario_plan.overrides, cache_dir)
            trace_rows = [Row(name, "-", "-", "trace_s", gen_s, "s", "wall clock",
                              how="generate (or load from the trace cache) the scenario's trace")]
        trace_rows += trace_count_rows(name, trace)
        checksum = content_digest(trace)
        if checksum in seen:  # the same trace twice (concurrency-256 is paper): measure once, say so
            first = seen[checksum]
            writer.add(trace_rows + [replace(r, scenario=name, how=f"{r.how}; same trace as {first}")
                                     for r in writer.rows if r.scenario == first and r.metric not in TRACE_METRICS])
            for _ in range(scenario_plan.units(cfg.reps)):  # its share of the bar is done
                tick(f"{name}: same trace as {seen[checksum]}")
            continue
        seen[checksum] = name
        rows, raw = measure_scenario(scenario_plan, trace, cfg, shared, tick)
        rows.append(Row(name, "-", "-", "scenario_wall_s", time.perf_counter() - started, "s", "wall clock",
                        how="the scenario's whole share of the run: trace, timed replays and studies"))
        writer.add(trace_rows + rows, raw)
