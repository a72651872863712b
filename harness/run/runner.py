"""A run: the matrix's scenarios, each measured in supervised workers, checked and written as it goes.
Design: docs/method.md#timing-rules."""

from __future__ import annotations

import sys
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

from harness.base import clock, compared_with
from harness.base.failures import OUT_OF_MEMORY
from harness.base.files import RESULTS_DIR, check_run_root, new_run_dir, point_latest, write_json
from harness.base.interleave import FAST_REPS, slice_bounds
from harness.base.interrupts import signal_name, sigterm_interrupts
from harness.base.metrics import Work
from harness.base.replay import REGIMES
from harness.base.rows import Row, clean_text, write_rows
from harness.errors import InputError, WriteError
from harness.run import metadata, progress
from harness.run.assemble import Merged, ScenarioRows, merge
from harness.run.bound import floor_per_slice, paced_violations, violations
from harness.run.jobs import FloorJob, ImplInfo, ProbeJob, ScenarioJob, describe, execute
from harness.run.lockstep import Order, lockstep, rotated
from harness.run.matrix import OWN_STUDIES, ScenarioPlan, default_scenarios, plan_scenario, sweep_scenarios
from harness.run.precheck import Checked, check_plugins
from harness.run.trace_cache import cached_trace, trace_cache_path
from harness.run.workers import DEFAULT_DEADLINE_S, CellDied, Pool, WorkerBug, WorkerSpec
from harness.studies.paced_study import PACED_METRICS
from harness.studies.scale import CONFIG_METRICS, config_rows
from impls import REGISTRY, UNAVAILABLE, registry
from scenarios import SCENARIOS, ScenarioError, Trace, load, save
from scenarios.trace import trace_uses_caching
from scenarios.trace.file_format import content_digest

Cell = tuple[str, str]


MAX_REPS = 1_000  # repetitions per cell a run may ask for
MAX_PROCESSES = 64  # worker processes a run may start (and never more than its repetitions)


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
    studies: bool = True  # False: the timed cells only, no study at all (kvblock-bench ab)
    sweep: list[str] = field(default_factory=list)  # scale-sweep families (matrix.SWEEPS), the default's rules
    root: Path = RESULTS_DIR
    label: str = ""
    progress: bool = True
    processes: int = 0  # worker processes the repetitions spread over (0: one per repetition)
    deadline_s: float = DEFAULT_DEADLINE_S  # a worker silent this long is killed, and its cell failed


def base_impl(trace: Trace) -> str:
    """The implementation every ratio of ``trace``'s cells is taken against."""
    return registry.CACHING_RATIO_BASE if trace_uses_caching(trace) else registry.RATIO_BASE


# -- one scenario, measured in the worker processes ---------------------------------------------------------
@dataclass
class Shared:
    """What every scenario of a run uses (timers' calibration, implementations, workers, settings) and learns."""

    calib: dict
    infos: dict[str, ImplInfo]
    pool: Pool
    bar: progress.Progress
    spool: Path  # a private folder for trace files the workers load when the trace cache cannot hold them
    cfg: RunConfig
    torch_threads: int | None = None  # torch's intra-op threads in the workers, as they reported it
    pids: dict[str, dict[str, list[int]]] = field(default_factory=dict)


@dataclass(frozen=True)
class ScenarioTrace:
    """One scenario as its workers measure it: plan, trace, the file they load, its digest, ratio base, start."""

    plan: ScenarioPlan
    trace: Trace
    path: Path
    digest: str
    base: str
    started: float

    @classmethod
    def of(cls, plan: ScenarioPlan, trace: Trace, path: Path, started: float) -> ScenarioTrace:
        return cls(plan, trace, path.resolve(), content_digest(trace), base_impl(trace), started)

    @property
    def scenario(self) -> str:
        return self.plan.scenario

    def job(self, kind: str, cells: list[Cell], shared: Shared, **fields: object) -> ScenarioJob:
        """A worker's job on this scenario: ``kind`` "timing" or "studies", of ``cells``."""
        return ScenarioJob(kind, self.scenario, str(self.path), cells, shared.cfg.reps, shared.calib, self.base,
                           digest=self.digest, **fields)


Sides = dict[str, list[Cell]]  # code ("": this checkout, else another checkout's folder) -> its cells


@dataclass(frozen=True)
class Timed:
    """One scenario's timed cells of every side (code version), those failed so far, the floor, the turns' order."""

    sides: Sides
    failed: dict[str, dict[Cell, str]]
    floor: dict[str, float]
    order: Order = rotated


def measure_scenario(sc: ScenarioTrace, shared: Shared) -> tuple[list[Row], dict]:
    """Every figure of one scenario: its timed cells in lockstep workers, then the studies; (rows, raw files)."""
    plan = sc.plan
    ((merged, rows, raw),) = measure_timings(sc, shared, {"": plan.cells}).values()
    shared.pids[plan.scenario] = merged.pids
    if merged.torch_threads is not None:  # what the workers held torch to (docs/method.md, "One host thread")
        shared.torch_threads = max(shared.torch_threads or 0, merged.torch_threads)
    if plan.studies:
        late = dict(merged.failed)
        rows += _studies(sc, [c for c in plan.cells if c not in merged.failed], shared, late, raw)
        rows += [Row(plan.scenario, *c, "correctness", float("nan"), "", "trace check", "failed",
                     f"in the studies: {reason}") for c, reason in late.items() if c not in merged.failed]
    return rows, raw


def measure_timings(sc: ScenarioTrace, shared: Shared, sides: Sides,
                    order: Order = rotated) -> dict[str, tuple[Merged, list[Row], dict]]:
    """Every side's timed cells of one scenario, a share's workers in one lockstep; per side (merged, rows, raw)."""
    plan, reps = sc.plan, shared.cfg.reps
    every = list(dict.fromkeys(c for cells in sides.values() for c in cells))
    caps = {c: plan.reps_of(c, reps) for c in every if plan.reps_of(c, reps) < reps}
    impls = {code: list(dict.fromkeys(i for i, _ in cells)) for code, cells in sides.items()}
    control = {code: sc.base if sc.base in mine else mine[0] if mine else "" for code, mine in impls.items()}
    timed = Timed(sides, {code: {} for code in sides}, _floor(shared, sc, every), order)
    results: dict[str, list] = {code: [] for code in sides}
    for w in range(len(shared.pool)):
        only = list(range(w, reps * FAST_REPS, len(shared.pool)))

        def job(code: str, impl: str, cells: list[Cell], only=only, w=w) -> ScenarioJob:
            return sc.job("timing", cells, shared, caps=caps, only=only, record=w == 0,
                          control=impl == control[code], lockstep=True)

        for code, got in _in_lockstep(shared, timed, w, job).items():
            results[code] += got
    out = {}
    for code, cells in sides.items():
        merged = merge(results[code], timed.failed[code])
        rows, raw = ScenarioRows(plan.scenario, sc.trace, Work.of_trace(sc.trace), slice_bounds(sc.trace.num_steps),
                                 sc.base, shared.calib).build(cells, merged)
        out[code] = (merged, rows, raw)
    return out


def _studies(sc: ScenarioTrace, cells: list[Cell], shared: Shared, failed: dict[Cell, str], raw: dict) -> list[Row]:
    """The studies' rows: each implementation's in its own worker, then those of no implementation."""
    impls = sorted(dict.fromkeys(i for i, _ in cells), key=lambda i: i != sc.base)
    rows: list[Row] = []
    for impl in [*impls, ""]:
        mine = [c for c in cells if c[0] == impl]
        if impl and not mine:
            continue
        result = _supervised(shared, WorkerSpec(impl, 0), mine,
                             lambda live, impl=impl: _studies_job(sc, live, impl, shared), failed)
        if result is not None:
            _bound_paced(result)
            seen = {(r.impl, r.regime, r.metric) for r in rows}
            rows += [r for r in result.rows if r.impl != "-" or (r.impl, r.regime, r.metric) not in seen]
            raw.update(result.raw)
            failed.update(result.failed)
    return rows


def _bound_paced(result) -> None:
    """Fail the cell, and its paced rows, whose paced loops break the supervisor's bound (``paced_violations``)."""
    bent = paced_violations(result.paced_claims, result.supervised, result.supervised_wall)
    result.rows = [replace(r, value=float("nan"), status="failed", how=bent[(r.impl, r.regime)])
                   if (r.impl, r.regime) in bent and r.metric in PACED_METRICS else r for r in result.rows]
    result.failed.update(bent)


def _studies_job(sc: ScenarioTrace, cells: list[Cell], impl: str, shared: Shared) -> ScenarioJob:
    studies = [s for s in sc.plan.studies if (s in OWN_STUDIES) == (not impl)]
    study_cells = {s: sc.plan.study_cells(s, cells) for s in studies}
    return sc.job("studies", cells, shared, studies=studies, study_cells=study_cells, quick=shared.cfg.quick)


def _floor(shared: Shared, sc: ScenarioTrace, cells: list[Cell]) -> dict[str, float]:
    """The harness's own CPU time per slice on this trace (``floor_per_slice``), once, in a worker of no design."""
    job = FloorJob(str(sc.path), sc.digest, sorted({r for _, r in cells}))
    shared.bar.status(f"{sc.scenario}: the harness's own work per slice (a do-nothing design's replays)")
    try:
        result = shared.pool.run(WorkerSpec("", 0), job, shared.bar, shared.bar.status)
    except CellDied as exc:
        raise WorkerBug(str(exc)) from None
    return floor_per_slice(result.supervised, result.claimed)


def _in_lockstep(shared: Shared, timed: Timed, share: int, make_job) -> dict[str, list]:
    """One share: each side's implementations' jobs each in its own worker, all in lockstep, again without a cell
    that failed; each result bounded by the floor (:mod:`harness.run.bound`). Per side, its results."""
    sides, failed = timed.sides, timed.failed
    results: dict[str, list] = {code: [] for code in sides}
    pending = [(code, i) for code, cells in sides.items() for i in dict.fromkeys(i for i, _ in cells)]
    while pending:
        live = {(code, i): [c for c in sides[code] if c[0] == i and c not in failed[code]] for code, i in pending}
        jobs = {WorkerSpec(i, share, code): make_job(code, i, mine) for (code, i), mine in live.items() if mine}
        # each share one turn further on: which version goes first varies from pair to pair
        outcome = lockstep(shared.pool, jobs, shared.bar, shared.bar.status,
                           lambda ready, turn: timed.order(ready, turn + share))
        pending = []
        for spec, value in outcome.items():
            if isinstance(value, (CellDied, WorkerBug)):
                _blame(shared, spec, value, live[(spec.code, spec.impl)], failed[spec.code])
                pending.append((spec.code, spec.impl))
            else:
                value.failed.update(violations(value, timed.floor))  # the supervisor's bound on what it claims
                results[spec.code].append(value)
                if any(reason.startswith(OUT_OF_MEMORY) for reason in value.failed.values()):
                    shared.pool.close_worker(spec)
    return results


def _blame(shared: Shared, spec: WorkerSpec, exc: CellDied | WorkerBug, live: list[Cell],
           failed: dict[Cell, str]) -> None:
    """Record the cell a worker died, hung or failed in (our bug in a plug-in's worker: its answers); raise ours."""
    cell = tuple(exc.cell) if getattr(exc, "cell", None) else None
    if isinstance(exc, WorkerBug):
        if cell not in live or (spec.impl in REGISTRY and not spec.code):  # another version's: its cell fails
            shared.pool.close_worker(spec)
            raise exc
        reason = f"the harness could not use its answers ({exc.last_line()})"
    elif cell is None or cell not in live:
        raise WorkerBug(str(exc)) from None
    else:
        reason = f"its worker process {exc.reason}"
    shared.pool.close_worker(spec)
    failed[cell] = reason
    shared.bar.status(f"{cell[0]} {cell[1]}: {reason}; measuring the others again")


def _supervised(shared: Shared, worker: WorkerSpec, cells: list[Cell], make_job, failed: dict[Cell, str]):
    """``make_job(cells)``'s result from ``worker``, again without each cell that failed (see :func:`_blame`)."""
    while True:
        live = [c for c in cells if c not in failed]
        if not live and worker.impl:  # the worker of no implementation runs its studies without cells
            return None
        try:
            return shared.pool.run(worker, make_job(live), shared.bar, shared.bar.status)
        except (CellDied, WorkerBug) as exc:
            if isinstance(exc, WorkerBug):
                exc.cell = shared.pool.worker(worker).last_cell
            _blame(shared, worker, exc, live, failed)


def _finite(x: float) -> float | None:
    return None if x != x else x


STUDY_FLAGS = {"allocations": "allocations", "paced": "paced", "l1d": "l1d", "table_copy": "table_copy",
               "memory": "memory"}


def enabled_studies(cfg: RunConfig) -> list[str]:
    """The studies this configuration runs (each ``--no-X`` flag switches one off; id width, the cache
    operations, hashing and the replays alone run unless every study is off: seconds each)."""
    if not cfg.studies:
        return []
    flagged = [study for study, flag in STUDY_FLAGS.items() if getattr(cfg, flag)]
    return ["idwidth", "cache_ops", "hashing", "cache_state", *flagged]


def resolve_impls(cfg: RunConfig, pool: Pool) -> tuple[dict[str, ImplInfo], dict[str, str]]:
    """(name -> what it is, name -> why it is skipped) for the configuration's implementations. Registered ones
    are described here; a plug-in is loaded in a worker process (its import never runs in this one), and one
    that cannot be loaded is bad input, named in one line."""
    if len(set(cfg.impls)) != len(cfg.impls):
        raise InputError(f"--impl names an implementation twice: {','.join(cfg.impls)}")
    infos: dict[str, ImplInfo] = {}
    for name in cfg.impls or list(REGISTRY):
        if name in REGISTRY:
            infos[name] = describe(name, REGISTRY[name])
        elif name not in UNAVAILABLE:
            infos[name] = _probe(pool, name)
    skipped = {i: UNAVAILABLE[i] for i in (cfg.impls or UNAVAILABLE) if i in UNAVAILABLE}
    return infos, skipped


def _probe(pool: Pool, name: str) -> ImplInfo:
    try:
        info = pool.run(WorkerSpec(name, 0), ProbeJob(name))
    except CellDied as died:
        info = ImplInfo(name, False, f"implementation {name!r}: loading it, the worker process {died.reason}")
    if not info.ok:
        raise InputError(f"{info.reason}; built in: {', '.join([*REGISTRY, *UNAVAILABLE])}")
    return info


def check_config(cfg: RunConfig) -> None:
    """Refuse a configuration before anything is created: unknown scenarios or regimes, bad counts."""
    bad = [s for s in cfg.scenarios if s not in SCENARIOS]
    if bad:
        raise InputError(f"unknown scenario(s) {bad}; see `kvblock-bench scenarios`")
    bad = [r for r in cfg.regimes if r not in REGIMES]
    if bad or not cfg.regimes:
        raise InputError(f"unknown regime(s) {bad or cfg.regimes}; choose from {', '.join(REGIMES)}")
    check_counts(cfg)
    if cfg.trace_file and cfg.scenarios:
        raise InputError("give --scenario or --trace, not both")
    if cfg.sweep and (cfg.scenarios or cfg.trace_file):
        raise InputError("give --sweep or --scenario/--trace, not both")


def check_counts(cfg: RunConfig) -> None:
    """Repetitions and worker processes within their bounds: no more processes than repetitions."""
    if not 1 <= cfg.reps <= MAX_REPS:
        raise InputError(f"--reps {cfg.reps}: give from 1 to {MAX_REPS:,} repetitions")
    if not 0 <= cfg.processes <= MAX_PROCESSES:
        raise InputError(f"--processes {cfg.processes}: give from 1 to {MAX_PROCESSES} worker processes")
    if cfg.processes > cfg.reps:
        raise InputError(f"--processes {cfg.processes}: more worker processes than repetitions (--reps {cfg.reps}); "
                         f"give at most {cfg.reps}: each runs whole repetitions")


def build_plan(cfg: RunConfig, infos: dict[str, ImplInfo]) -> list[tuple[ScenarioPlan, Trace | None]]:
    """The run's scenarios in order, each with its cells and studies (and the trace, for --trace)."""
    explicit = bool(cfg.scenarios or cfg.impls or cfg.trace_file)
    studies = enabled_studies(cfg)
    impls = list(infos)

    def caching(impl: str) -> bool:
        return infos[impl].prefix_caching

    if cfg.trace_file:
        trace = load(cfg.trace_file)  # refused here, before any run folder exists
        name = "trace:" + Path(cfg.trace_file).name
        return [(plan_scenario(name, impls, cfg.regimes, explicit=True, quick=cfg.quick, enabled=studies,
                               caching=caching), trace)]
    names = cfg.scenarios or (sweep_scenarios(cfg.sweep, SCENARIOS) if cfg.sweep else default_scenarios(SCENARIOS))
    return [(plan_scenario(name, impls, cfg.regimes, explicit=explicit, quick=cfg.quick, enabled=studies,
                           caching=caching), None) for name in names]


class RunWriter:
    """The run folder, made when the first figure is ready (``latest`` moves once it has rows); a failed write
    raises :class:`WriteError` naming what it keeps (docs/results-folder.md)."""

    def __init__(self, cfg: RunConfig, meta: dict, conformance: dict[str, str] | None = None) -> None:
        self.cfg, self.meta, self.conformance = cfg, meta, conformance or {}
        self.label = cfg.label or ("quick" if cfg.quick else "")
        check_run_root(cfg.root, self.label)
        self.run_dir: Path | None = None
        self.rows: list[Row] = []
        self.saved = 0  # rows in the results.csv on disk
        self.write_failed = False

    def folder(self) -> Path:
        if self.run_dir is None:
            self.run_dir = new_run_dir(self.cfg.root, self.label)
            write_json(self.run_dir / "meta.json", self.meta)
            compared_with.record(self.run_dir)
        return self.run_dir

    def add(self, rows: list[Row], raw: dict[str, object] | None = None) -> None:
        """Keep ``rows`` (a checked plug-in's marked) and rewrite results.csv (atomically), point ``latest`` to the
        run, then write the raw files (by relative path, cleaned as the rows' scenario names are)."""
        self.rows += [replace(r, conformance=self.conformance[r.impl]) if r.impl in self.conformance else r
                      for r in rows]
        try:
            run_dir = self.folder()
            write_rows(run_dir / "results.csv", self.rows)
            self.saved = len(self.rows)
            if self.rows:
                point_latest(run_dir)
            for rel, obj in (raw or {}).items():
                write_json(run_dir / clean_text(rel), obj, compress=True)
        except WriteError as exc:
            self.write_failed = True
            raise WriteError(f"{exc}; {self.kept()}") from None

    def kept(self) -> str:
        """What the run folder keeps, in words."""
        if self.run_dir is None or not self.saved:
            return f"nothing of this run was saved ({self.cfg.root / 'latest'} is unchanged)"
        return f"{self.run_dir} keeps the {self.saved} rows saved before"

    def interrupted(self, exc: KeyboardInterrupt) -> None:
        """Record an interruption (Ctrl-C or SIGTERM, which signal) in meta.json."""
        self.finish(interrupted=time.strftime("%Y-%m-%dT%H:%M:%S%z"), interrupted_by=signal_name(exc))

    def finish(self, **fields: object) -> None:
        """Stamp meta.json (``finished`` and ``fields``). After a failed write, a second failure is not reported:
        the first one is what the run ends with."""
        on_cpu = [r.value for r in self.rows if r.metric == "on_cpu_pct" and r.status == "ok"]
        self.meta.update(fields, finished=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                         load_average_end=metadata.load_average(), host=metadata.host_end(self.meta, on_cpu))
        if self.run_dir is None:
            return
        try:
            write_json(self.run_dir / "meta.json", self.meta)
        except WriteError as exc:
            if not self.write_failed:
                self.write_failed = True
                raise WriteError(f"{exc}; {self.kept()}") from None


def calibrate_timers() -> dict:
    usable = clock.tsc_usable()
    return {
        "python_timer_ns": clock.python_timer_overhead_ns(),
        "compiled_timer_ns": clock.compiled_timer_overhead_ns() if usable else None,
        "tsc_ns_per_tick": clock.ns_per_tick() if usable else None,
    }


def run(cfg: RunConfig, argv: list[str] | None = None) -> Path | None:
    """Run the matrix; returns the run directory (also pointed to by ``results/latest``), None if nothing ran."""
    check_config(cfg)
    bar = progress.Progress(cfg.progress)
    with Pool(processes_of(cfg), execute, cfg.deadline_s) as pool, tempfile.TemporaryDirectory(
            prefix="kvblock-bench-") as spool:
        bar.status("loading the implementations (the C++ designs build on first use; plug-ins load in a worker)")
        infos, skipped = resolve_impls(cfg, pool)
        checked = _precheck(cfg, infos, bar)
        pool.limit = worker_limit(len(infos), len(pool))
        plan = build_plan(cfg, infos)
        bar.status("calibrating the timers (the compiled timing loop compiles on first use)")
        shared = Shared(calibrate_timers(), infos, pool, bar, Path(spool), cfg)
        natives = [name for name, info in infos.items() if info.native]
        meta = {**metadata.collect(argv, described={n: i.described for n, i in infos.items()}, natives=natives),
                "config": {k: str(v) for k, v in vars(cfg).items()}, "processes": len(pool),
                "calibration": shared.calib, "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "complete": False,
                "skipped_impls": skipped, "plan": [vars(p) for p, _ in plan],
                "conformance": {name: c.record() for name, c in checked.items()}}
        writer = RunWriter(cfg, meta, {name: c.verdict for name, c in checked.items()})
        meta["worker_pids"] = shared.pids
        weights = planned_work(plan)
        bar.start(sum(p.units(cfg.reps) for p, _ in plan),
                  sum(w * p.units(cfg.reps) for w, (p, _) in zip(weights, plan, strict=True)))
        try:
            with sigterm_interrupts():
                _run_plan(plan, shared, writer, weights)
            writer.finish(complete=True, torch_intra_op_threads=shared.torch_threads)
        except KeyboardInterrupt as exc:
            writer.interrupted(exc)
            where = writer.run_dir or "no run folder (nothing had finished)"
            print(f"\ninterrupted: {where} keeps every finished scenario", file=sys.stderr)
            raise
        except BaseException:
            writer.finish()
            raise
        finally:
            bar.close()
    return writer.run_dir


def _precheck(cfg: RunConfig, infos: dict[str, ImplInfo], bar: progress.Progress) -> dict[str, Checked]:
    """The contract check's quick form on every plug-in of the run."""
    plugins = [name for name in infos if name not in REGISTRY]
    if plugins:
        bar.status(f"checking {', '.join(plugins)} against the contract (quick form) before timing")
    return check_plugins(plugins, cfg.deadline_s)


WORKER_BYTES = 256 << 20


def worker_limit(impls: int, shares: int) -> int:
    """Worker processes kept alive at once: as many as available memory allows, at least one share's."""
    try:
        with open("/proc/meminfo", encoding="ascii") as info:
            available = next(int(line.split()[1]) << 10 for line in info if line.startswith("MemAvailable:"))
    except (OSError, StopIteration, ValueError):
        available = 0
    return max(impls + 1, min(impls * shares + 1, available // WORKER_BYTES))


def processes_of(cfg: RunConfig) -> int:
    """Worker processes the run's repetitions spread over: ``cfg.processes``, else one per repetition."""
    return cfg.processes or cfg.reps


TRACE_METRICS = ("trace_s", "trace_forks", "trace_cows", "scenario_wall_s", *CONFIG_METRICS)  # never copied


def trace_count_rows(name: str, trace: Trace) -> list[Row]:
    """What the scenario's trace asks for beyond appends, as rows the reports read: its forks and the
    copy-on-writes they cause (the trace's own counts, which every replay is checked against)."""
    how = "counted in the trace (every replay is checked against its copy-on-writes per step)"
    forks = int(trace.header["ops_by_kind"].get("fork", 0))
    return [Row(name, "-", "-", "trace_forks", forks, "forks", "trace header", how=how, steps=trace.num_steps),
            Row(name, "-", "-", "trace_cows", int(trace.header["cow_count"]), "copy-on-writes", "trace header",
                how=how, steps=trace.num_steps), *config_rows(name, trace)]


def _worker_copy(trace: Trace, cached: Path, spool: Path) -> Path:
    """A trace file the workers load: the cache entry, or where the cache could not be written, a copy in the
    run's spool folder (the workers check its content against the trace's digest)."""
    if cached.is_file() and not cached.is_symlink():
        return cached
    return save(trace, spool / f"{clean_text(trace.header['scenario']).replace('/', '_')}.npz")


def seq_steps(plan: ScenarioPlan, trace: Trace | None) -> float | None:
    """The scenario's sequence-steps: its trace's when given, else its parameters' steps x running; None when its
    parameters do not say (a replayed production trace) or are refused (its generation will say why)."""
    if trace is not None:
        return float(trace.running_per_step().sum())
    scenario = SCENARIOS.get(plan.scenario)
    try:
        params = scenario.params(plan.overrides) if scenario is not None else {}
    except ScenarioError:
        return None
    return float(params["steps"] * params["running"]) if {"steps", "running"} <= params.keys() else None


def planned_work(plan: list[tuple[ScenarioPlan, Trace | None]]) -> list[float]:
    """What each progress unit of each scenario weighs in the time-left estimate before its trace exists: its
    sequence-steps (:func:`seq_steps`), where unknown the mean of the others' (1 when none is known)."""
    known = [seq_steps(p, t) for p, t in plan]
    values = [k for k in known if k is not None]
    fill = sum(values) / len(values) if values else 1.0
    return [fill if k is None else k for k in known]


def scenario_trace(scenario_plan: ScenarioPlan, given: Trace | None, shared: Shared) -> tuple[ScenarioTrace, list[Row]]:
    """The scenario, started now, with its trace (given, or from the trace cache) and the file workers load; rows."""
    started = time.perf_counter()
    name, trace, trace_rows, path = scenario_plan.scenario, given, [], shared.cfg.trace_file
    if trace is None:
        progress.status(shared.bar, f"{name}: the trace (generated, or read from the trace cache)")
        cache_dir = shared.cfg.root / ".trace-cache"
        trace, gen_s = cached_trace(name, scenario_plan.overrides, cache_dir)
        path = _worker_copy(trace, trace_cache_path(name, scenario_plan.overrides, cache_dir), shared.spool)
        trace_rows = [Row(name, "-", "-", "trace_s", gen_s, "s", "wall clock",
                          how="generate (or load from the trace cache) the scenario's trace")]
    return ScenarioTrace.of(scenario_plan, trace, Path(path), started), trace_rows + trace_count_rows(name, trace)


def same_trace_rows(writer: RunWriter, name: str, first: str) -> list[Row]:
    """The rows of ``first`` (which measured the same trace) as ``name``'s, said so."""
    return [replace(r, scenario=name, how=f"{r.how}; same trace as {first}")
            for r in writer.rows if r.scenario == first and r.metric not in TRACE_METRICS]


def skip_scenario(tick: progress.Progress, sc: ScenarioTrace, first: str, units: int, planned: float) -> None:
    """The progress of a scenario whose trace was measured already (as ``first``): its share of the bar done."""
    tick.scenario(units, planned, 0.0)  # nothing left to measure: its share of the work is none
    for _ in range(units):
        tick(f"{sc.scenario}: same trace as {first}")
    tick.scenario_done(sc.scenario, time.perf_counter() - sc.started, f" (same trace as {first}: its rows copied)")


def wall_row(sc: ScenarioTrace) -> Row:
    """The scenario's ``scenario_wall_s`` row: the time since it started."""
    return Row(sc.scenario, "-", "-", "scenario_wall_s", time.perf_counter() - sc.started, "s", "wall clock",
               how="the scenario's whole share of the run: trace, timed replays and studies")


def _run_plan(plan: list[tuple[ScenarioPlan, Trace | None]], shared: Shared, writer: RunWriter,
              weights: list[float] | None = None) -> None:
    seen: dict[str, str] = {}  # trace content digest -> the scenario that measured it
    tick = shared.bar
    weights = weights or [1.0] * len(plan)
    for (scenario_plan, given), planned in zip(plan, weights, strict=True):
        sc, trace_rows = scenario_trace(scenario_plan, given, shared)
        name, checksum = sc.scenario, sc.digest
        writer.meta.setdefault("traces", {})[name] = checksum  # what `kvblock-bench compare` checks per scenario
        units = scenario_plan.units(shared.cfg.reps)
        if checksum in seen:  # the same trace twice (concurrency-256 is paper): measure once, say so
            writer.add(trace_rows + same_trace_rows(writer, name, seen[checksum]))
            skip_scenario(tick, sc, seen[checksum], units, planned)
            continue
        seen[checksum] = name
        tick.scenario(units, planned, float(sc.trace.running_per_step().sum()))
        rows, raw = measure_scenario(sc, shared)
        rows.append(wall_row(sc))
        writer.add(trace_rows + rows, raw)
        tick.scenario_done(name, rows[-1].value)
