"""The jobs a worker process runs (:mod:`harness.run.workers`): every place a run executes an implementation.
:func:`execute` runs any of them; the main process never imports a plug-in, so a plug-in that hangs, crashes
or exits, at import or later, costs only its own cells (or its own verdict)."""

from __future__ import annotations

import importlib.metadata as importlib_metadata
import os
import sys
import traceback
from dataclasses import dataclass, field
from pathlib import Path

from harness.base.drivers import Prepared
from harness.base.failures import blamed_on, short_reason, users_interrupt
from harness.base.hook import hook_problem
from harness.base.rows import Row
from harness.base.threads import pin_one_thread
from harness.errors import DesignFailure
from harness.run.cells import CellBench, CellSetup, Repetitions, TimingResult
from harness.run.floor import FAST_FLOOR, measure_fast_floor, measure_floor
from harness.run.workers import Events
from impls import registry
from scenarios import load
from scenarios.trace.file_format import content_digest

Cell = tuple[str, str]


# -- implementations ---------------------------------------------------------------------------------------
@dataclass
class ImplInfo:
    """What the main process needs to know of an implementation, found where it can be imported safely."""

    name: str
    ok: bool
    reason: str = ""  # why it cannot be loaded (when not ok)
    prefix_caching: bool = False
    native: bool = False
    described: str = ""  # "module.Class (distribution version)", for meta.json
    source: str = ""  # the file of the class's module
    import_failed: bool = False  # its code raised or exited while imported (not merely absent)


def load_impl(name: str) -> type:
    """The class of a registered name, or of a plug-in (``package.module:Class`` or an entry point)."""
    if name in registry.BY_NAME:
        return registry.BY_NAME[name].load()
    return registry.load_plugin(name)


def describe(name: str, cls: type) -> ImplInfo:
    """An implementation's :class:`ImplInfo` from its class."""
    from impls.contract import supports_prefix_caching

    top = cls.__module__.split(".")[0]
    found = importlib_metadata.packages_distributions().get(top, [])
    version = importlib_metadata.version(found[0]) if found else "not an installed distribution"
    module = sys.modules.get(cls.__module__)
    return ImplInfo(name, True, prefix_caching=supports_prefix_caching(cls), native=getattr(cls, "native", False)
                    is True, described=f"{cls.__module__}.{cls.__qualname__} ({found[0] if found else top} {version})",
                    source=str(Path(module.__file__).resolve()) if getattr(module, "__file__", None) else "")


def _absent(exc: BaseException, name: str) -> bool:
    """Whether ``exc`` says that plug-in ``name``'s module (or a package above it) is absent, not failing."""
    module = name.partition(":")[0]
    return isinstance(exc, ModuleNotFoundError) and exc.name is not None and (
        module == exc.name or module.startswith(exc.name + "."))


@dataclass(frozen=True)
class ProbeJob:
    """Load an implementation by name (a plug-in's import runs here) and describe it, or say why it cannot load."""

    name: str


def probe(name: str) -> ImplInfo:
    """Load ``name`` and describe it; a plug-in that cannot be loaded (import error, missing method, an
    exception or an exit at import) is described as not ok, with the reason."""
    try:
        cls = load_impl(name)
    except registry.PluginError as exc:
        cause = exc.__context__
        failed = isinstance(cause, ImportError) and not _absent(cause, name)
        return ImplInfo(name, False, str(exc), import_failed=failed)
    except BaseException as exc:  # a plug-in's module may raise anything at import, or exit
        if users_interrupt(exc):
            raise
        return ImplInfo(name, False, import_failure(name, exc), import_failed=True)
    return describe(name, cls)


def import_failure(name: str, exc: BaseException) -> str:
    """Why ``name`` could not be imported, with the last line it reached."""
    frames = traceback.extract_tb(exc.__traceback__)
    at = f" ({frames[-1].filename}:{frames[-1].lineno})" if frames else ""
    return f"implementation {name!r} could not be imported: {short_reason(exc)}{at}"


@dataclass(frozen=True)
class RegistryJob:
    """The registry of the worker's code: each registered implementation described, or why it cannot run here."""


@dataclass
class RegistryResult:
    infos: dict[str, ImplInfo]
    unavailable: dict[str, str]
    native_build: dict | None


def registry_of_code(events: Events) -> RegistryResult:
    """:class:`RegistryJob`: every registered name of this code described (its import in its cell), or why not."""
    from impls import native

    infos, unavailable = {}, {}
    for rec in registry.RECORDS:
        events.cell((rec.name, "load"))
        try:
            infos[rec.name] = describe(rec.name, rec.load())
        except ImportError as exc:
            unavailable[rec.name] = rec.needs or str(exc)
        except BaseException as exc:  # a design's module may raise anything at import, or exit
            if users_interrupt(exc):
                raise
            infos[rec.name] = ImplInfo(rec.name, False, import_failure(rec.name, exc), import_failed=True)
    events.cell(None)
    return RegistryResult(infos, unavailable, native.build_info())


# -- a scenario's share of work --------------------------------------------------------------------------
@dataclass(frozen=True)
class ScenarioJob:
    """One worker's work on one scenario: ``kind`` "timing" (its cells' repetitions ``only``, the samples sent back
    whole) or "studies" (allocations, paced runs, studies; with no cells, the studies of no implementation)."""

    kind: str
    scenario: str
    trace_path: str
    cells: list[Cell]
    reps: int
    calib: dict
    base: str
    caps: dict[Cell, int] = field(default_factory=dict)
    only: list[int] = field(default_factory=list)
    record: bool = False  # this job records compile times and the figures read off the last managers
    studies: list[str] = field(default_factory=list)
    study_cells: dict[str, list[Cell]] = field(default_factory=dict)
    quick: bool = False
    digest: str = ""  # the trace's content digest: the file the worker loads must hold that trace
    control: bool = True  # the A/A control
    lockstep: bool = False  # pause between slices (harness.run.lockstep)

    def repetitions(self) -> Repetitions:
        """What this timing job asks of its cells, as the worker's cells take it."""
        return Repetitions(self.reps, self.caps, self.only, self.base, self.record, self.control, self.lockstep)


@dataclass
class StudiesResult:
    rows: list[Row]
    raw: dict[str, object]
    failed: dict[Cell, str]
    paced_claims: dict[tuple, tuple[int, int]] = field(default_factory=dict)
    supervised: dict | None = None  # CPU and wall time per marked key, set by the main process (harness.run.bound)
    supervised_wall: dict | None = None


_TRACE: dict[tuple[str, str], Prepared] = {}  # the last trace this worker loaded, prepared
_LOOPS: dict = {}  # compiled replay loops, made once per design in this worker


def _prepared(path: str, digest: str) -> Prepared:
    """The trace at ``path``, prepared (kept for the next job of the same trace); it must be the one whose content
    digest the main process measured."""
    if (path, digest) not in _TRACE:
        _TRACE.clear()
        trace = load(Path(path))
        if digest and content_digest(trace) != digest:
            raise RuntimeError(f"{path} no longer holds the trace the run measures (another run rewrote it?)")
        _TRACE[(path, digest)] = Prepared.from_trace(trace)
    return _TRACE[(path, digest)]


def _bench(job: ScenarioJob, events: Events) -> CellBench:
    """The job's cells in this worker; an implementation that cannot be loaded here fails its cells."""
    prep = _prepared(job.trace_path, job.digest)
    classes, failed = {}, {}
    for name in _impls(job):
        events.cell((name, job.cells[0][1]))
        try:
            classes[name] = load_impl(name)
        except BaseException as exc:  # as in probe()
            if users_interrupt(exc):
                raise
            failed[name] = short_reason(exc)
    events.cell(None)
    pin_one_thread()  # torch arrives with the designs that need it: held to one thread before anything runs
    cells = tuple(c for c in job.cells if c[0] in classes)
    bench = CellBench(CellSetup(job.scenario, prep, cells, classes, job.calib, _LOOPS), events)
    bench.failed.update({c: failed[c[0]] for c in job.cells if c[0] in failed})
    return bench


def run_timing(job: ScenarioJob, events: Events) -> TimingResult:
    bench = _bench(job, events)
    bench.warm_up(record=job.record)
    result = bench.time(job.repetitions())
    result.pid = os.getpid()
    result.torch_threads = pin_one_thread()
    return result


# -- the harness's own work per slice -------------------------------------------------------------------------
@dataclass(frozen=True)
class FloorJob:
    """A do-nothing design's replays of a scenario's trace in a worker of no design: the supervisor's bound's floor."""

    trace_path: str
    digest: str
    regimes: list[str]


@dataclass
class FloorResult:
    claimed: dict[str, float]  # what the floor's timed regions claimed, per regime or driver
    supervised: dict | None = None  # its worker's CPU time per key, set by the main process (harness.run.bound)


def run_floor(job: FloorJob, events: Events) -> FloorResult:
    """The floor of every regime in ``job`` and of the compiled and C++ drivers, once per scenario."""
    prep = _prepared(job.trace_path, job.digest)
    claimed = measure_floor(prep, job.regimes, events.mark)
    claimed.update(measure_fast_floor(prep, FAST_FLOOR, _LOOPS, events.mark))
    return FloorResult(claimed)


def _designs(job: ScenarioJob) -> str:
    """The implementations a job's cells name, for its progress lines (each design's worker runs its own)."""
    return ", ".join(_impls(job))


def _impls(job: ScenarioJob) -> list[str]:
    return list(dict.fromkeys(impl for impl, _ in job.cells))


def run_studies(job: ScenarioJob, events: Events) -> StudiesResult:
    bench = _bench(job, events)
    bench.warm_up(record=False)
    if "allocations" in job.studies:
        events.status(f"{job.scenario}: {_designs(job)}: allocations per step")
        bench.measure_allocations(job.study_cells.get("allocations", []))
    if "paced" in job.studies:
        events.status(f"{job.scenario}: {_designs(job)}: paced runs at the step rate")
        bench.measure_paced(job.study_cells.get("paced", []))
    live = [c for c in job.cells if c not in bench.failed]
    raw: dict[str, object] = {}
    rows = bench.rows + scenario_studies(job, bench, live, events, raw)
    return StudiesResult(rows, raw, dict(bench.failed), bench.paced_claims)


def scenario_studies(job: ScenarioJob, bench: CellBench, cells: list[Cell], events: Events,
                     raw: dict) -> list[Row]:
    """The scenario's studies with machinery of their own (L1D, id width, cache, hashing, memory, table copies)."""
    rows: list[Row] = []
    trace, scenario = bench.trace, job.scenario
    if "l1d" in job.studies:
        from harness.counters.l1d import l1d_counter, l1d_rows

        events.status(f"{scenario}: {_designs(job)}: L1D misses ({l1d_counter(job.quick)})")
        rows += l1d_rows(scenario, trace, [c for c in job.study_cells.get("l1d", []) if c in cells], quick=job.quick)
        events.tick(f"{scenario} L1D")
    if "idwidth" in job.studies:
        from harness.studies.idwidth import idwidth_rows

        rows += idwidth_rows(trace, scenario=scenario)
        events.tick(f"{scenario} id width")
    if "cache_state" in job.studies:
        rows += _cache_state_rows(job, bench, cells, events)
    if "cache_ops" in job.studies:
        rows += _cache_ops_rows(scenario, cells, bench, events)
        events.tick(f"{scenario} cache operations")
    if "hashing" in job.studies:
        from harness.studies.block_hashing import hashing_rows

        rows += hashing_rows(trace, scenario)
        events.tick(f"{scenario} hashing")
    if "memory" in job.studies:
        from harness.studies.memory import memory_rows

        events.status(f"{scenario}: {_designs(job)}: memory at the trace's peak")
        classes = {impl: bench.drivers[(impl, regime, "")].cls for impl, regime in cells}
        memory = memory_rows(scenario, trace, cells, classes, events.cell)
        events.cell(None)
        rows += memory
        bench.failed.update({(r.impl, r.regime): r.how for r in memory if r.status == "failed"})
        events.tick(f"{scenario} memory")
    if "table_copy" in job.studies:
        from harness.studies.table_copy import measure as measure_table_copy

        copy_rows, copy_raw = measure_table_copy(trace)
        rows += copy_rows
        raw[f"raw/{scenario}/flat__table-copy.json.gz"] = copy_raw
        events.tick(f"{scenario} table copy")
    return rows


def _cache_state_rows(job: ScenarioJob, bench: CellBench, cells: list[Cell], events: Events) -> list[Row]:
    from harness.studies.cache_state import Evictor, cache_state_rows
    from harness.studies.limit_loop import limit_rows
    from harness.studies.twin_pair import twin_rows

    events.status(f"{job.scenario}: {_designs(job)}: replays alone, warm and cold")
    drivers = [bench.drivers[(*cell, "")] for cell in job.study_cells.get("cache_state", []) if cell in cells]
    evictor = Evictor.make() if drivers else None
    rows = cache_state_rows(job.scenario, drivers, evictor, enter=events.cell)
    for driver in drivers:
        events.cell((driver.impl, driver.regime))
        rows += twin_rows(job.scenario, driver, evictor)
        if driver.impl == registry.RATIO_BASE and driver.regime == "batched" and driver.kind == "compiled":
            rows += limit_rows(job.scenario, driver, evictor)
        events.cell(None)
    events.tick(f"{job.scenario} cache state")
    return rows


def _cache_ops_rows(scenario: str, cells: list[Cell], bench: CellBench, events: Events) -> list[Row]:
    """The cache-operation study for every implementation with prefix caching among the scenario's cells."""
    from harness.studies.cache_ops import CacheOpsError, cache_ops_rows
    from impls.contract import supports_prefix_caching

    rows: list[Row] = []
    for impl, regime in cells:
        cls = bench.drivers[(impl, regime, "")].cls
        if not supports_prefix_caching(cls) or any(r.impl == impl and r.metric == "cache_hit_ns" for r in rows):
            continue
        events.cell((impl, regime))
        try:
            with blamed_on(impl, cls):
                rows += cache_ops_rows(cls, impl, scenario)
        except (CacheOpsError, DesignFailure) as exc:
            rows.append(Row(scenario, impl, "per-call", "cache_hit_ns", float("nan"), "ns/block", "perf_counter_ns",
                            "failed", getattr(exc, "reason", short_reason(exc))))
    events.cell(None)
    return rows


# -- kvblock-bench check ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class CheckJob:
    """``kvblock-bench check``'s conformance run of one implementation."""

    name: str
    seeds: int
    examples: int
    ops: int


@dataclass
class CheckResult:
    ok: bool
    text: str
    caching: bool


def run_check(job: CheckJob, events: Events) -> CheckResult:
    """The contract checker on one implementation, then the full pool: the verdict as printed text."""
    from harness.conformance import check
    from harness.conformance.inputs import input_problems
    from harness.conformance.pool import full_pool_problems
    from impls.contract import supports_prefix_caching

    events.cell((job.name, "check"))  # from the import on, the design's code runs: its deadline applies
    info = probe(job.name)
    if not info.ok:
        return CheckResult(False, info.reason, False)
    cls = load_impl(job.name)
    if hook_problem(cls):  # refused by every run's drivers (harness.base.hook)
        return CheckResult(False, f"{job.name}: FAILS: {hook_problem(cls)}", supports_prefix_caching(cls))
    try:
        with blamed_on(job.name, cls):  # an exit or an exception Hypothesis does not catch is the verdict too
            verdict = check(cls, seeds=range(job.seeds), max_examples=job.examples, step_count=job.ops,
                            progress=lambda: events.cell((job.name, "check")))
            inputs = input_problems(cls) if verdict.ok else []
            problems = full_pool_problems(cls) if verdict.ok else []
    except DesignFailure as exc:
        return CheckResult(False, f"{job.name}: FAILS: {exc.reason}", supports_prefix_caching(cls))
    events.cell(None)
    lines = [str(verdict), *(f"inputs: {problem}" for problem in inputs),
             *(f"full pool: {problem}" for problem in problems)]
    return CheckResult(verdict.ok and not inputs and not problems, "\n".join(lines), supports_prefix_caching(cls))


_START: list[tuple[str, dict[str, str]]] = []


def restore_start() -> None:
    """Back to the working folder and environment this worker started with."""
    if not _START:
        _START.append((os.getcwd(), dict(os.environ)))
        return
    cwd, env = _START[0]
    os.chdir(cwd)
    if dict(os.environ) != env:
        os.environ.clear()
        os.environ.update(env)


def execute(job: object, events: Events) -> object:
    """Run a job in this process (a worker's entry point), torch held to one thread, from the worker's start."""
    restore_start()
    pin_one_thread()
    if isinstance(job, ScenarioJob):
        return run_timing(job, events) if job.kind == "timing" else run_studies(job, events)
    if isinstance(job, ProbeJob):
        events.cell((job.name, "load"))  # a plug-in's import is its own code: the design's deadline bounds it
        info = probe(job.name)
        events.cell(None)
        return info
    if isinstance(job, CheckJob):
        return run_check(job, events)
    if isinstance(job, FloorJob):
        return run_floor(job, events)
    if isinstance(job, RegistryJob):
        return registry_of_code(events)
    raise TypeError(f"not a job: {job!r}")
