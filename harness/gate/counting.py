"""The gate's work on implementations, in supervised worker processes (:mod:`harness.run.workers`).

The gate's own process never imports a plug-in nor runs a design's code: a plug-in is loaded, its allocations
counted and its wall clock taken in a worker of its own; the registered designs share one. A design that
exits, raises, hangs past the deadline or kills its worker fails only the cell it was in, with a one-line
reason (:class:`Failed`); the next job starts a fresh worker.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from harness.base.clock import tsc_usable
from harness.base.drivers import Prepared, compiled_driver, run_compiled, run_interpreted
from harness.base.failures import blamed_on, short_reason, users_interrupt
from harness.counters.regions import prepare_cell
from harness.errors import DesignFailure, InputError
from harness.run.alloc_cells import alloc_kind, cell_allocations
from harness.run.bound import floor_per_slice, judge, on_cpu_ns
from harness.run.floor import oracle_class
from harness.run.jobs import ProbeJob, load_impl
from harness.run.jobs import execute as execute_measure_job
from harness.run.workers import DEFAULT_DEADLINE_S, CellDied, Events, Worker, Workers
from impls import REGISTRY
from scenarios import PAPER, generate, load

Cell = tuple[str, str]


@dataclass
class Failed:
    """A design's failure in a job: its cell (or its loading) is failed with this reason."""

    reason: str


@dataclass
class AllocationsJob:
    """Allocations per step of one cell on the trace at ``trace_path`` (an absolute path)."""

    trace_path: str
    cell: Cell
    warm: int
    steps: int


@dataclass
class WallJob:
    """Median batched step of ``slower`` and ``faster`` in one process; with ``floor``, the do-nothing design's."""

    slower: str = ""
    faster: str = ""
    floor: bool = False


@dataclass
class WallResult:
    """Per design (or "floor"): median step ns, all timed ns, Python-timed; CPU per key (set by the main process)."""

    step_ns: dict[str, float]
    claimed: dict[str, float]
    python: dict[str, bool]
    supervised: dict | None = None


WALL_PARAMS = {"steps": 200, "running": 256}
WALL_REPEATS = 3


def allocations(prep: Prepared, impl: str, regime: str, warm: int, steps: int,
                cls: type | None = None) -> tuple[float, float, str]:
    """(the design's allocations per step, Numba runtime allocations per step, the first one's instrument) over
    steps ``[warm, warm + steps)``: exact counts (:func:`harness.run.alloc_cells.cell_allocations`)."""
    mgr, advance, _ = prepare_cell(prep, impl, regime, cls)
    advance(0, warm)
    figures = {f.metric: f for f in cell_allocations(alloc_kind(type(mgr), regime), regime, prep, mgr, advance,
                                                     warm, warm + steps)}
    design, nrt = figures["allocs_per_step"], figures["nrt_allocs_per_step"]
    if design.status != "ok":
        raise InputError(f"{impl} {regime}: allocations not counted ({design.how})")
    return design.per_step, nrt.per_step, design.source


def compiled_wall(cls: type) -> bool:
    """Whether the wall clock replays ``cls`` through the compiled driver (its clock out of the design's reach)."""
    return getattr(cls, "kernels", None) is not None and tsc_usable()


def median_step_ns(cls: type, prep: Prepared, mark=lambda key: None, key: tuple = ()) -> tuple[float, float]:
    """(median batched step time in ns, all timed ns) of ``cls`` on ``prep`` over :data:`WALL_REPEATS` replays
    (the median of their medians); ``mark(key)`` before each replay and ``mark(None)`` after it."""
    times, claimed = [], 0.0
    for _ in range(WALL_REPEATS):
        mgr = cls(**prep.trace.config)
        mark(key or None)
        if compiled_wall(cls):
            result = run_compiled(prep, mgr, compiled_driver(cls.kernels), detail=False)
        else:
            result = run_interpreted(prep, mgr, "batched")
        mark(None)
        times.append(float(statistics.median(result.step_ns)))
        claimed += on_cpu_ns(result)  # every timed region, the lookup too, as the bound counts them
    return statistics.median(times), claimed


_PREPARED: dict[str, Prepared] = {}  # the trace this worker loaded last


def run_allocations(job: AllocationsJob, events: Events) -> tuple[float, float, str] | Failed:
    if job.trace_path not in _PREPARED:
        _PREPARED.clear()
        _PREPARED[job.trace_path] = Prepared.from_trace(load(job.trace_path))
    impl, regime = job.cell
    events.cell(job.cell)
    cls = _load(impl)
    if isinstance(cls, Failed):
        return cls
    try:
        with blamed_on(impl, cls):
            return allocations(_PREPARED[job.trace_path], impl, regime, job.warm, job.steps, cls)
    except DesignFailure as exc:
        return Failed(exc.reason)
    finally:
        events.cell(None)


def _load(name: str) -> type | Failed:
    """``name``'s class (loaded once already, in the probe: a plug-in may still raise or exit at a new import)."""
    try:
        return load_impl(name)
    except BaseException as exc:
        if users_interrupt(exc):
            raise
        return Failed(f"loading it: {short_reason(exc)}")


def run_wall(job: WallJob, events: Events) -> WallResult | Failed:
    prep = Prepared.from_trace(generate(PAPER, **WALL_PARAMS))
    out = WallResult({}, {}, {})
    if job.floor:
        out.step_ns["floor"], out.claimed["floor"] = median_step_ns(oracle_class(prep), prep, events.mark,
                                                                    ("floor", "batched"))
        return out
    for name in (job.slower, job.faster):
        events.cell((name, "batched"))
        cls = _load(name)
        try:
            if isinstance(cls, Failed):
                raise DesignFailure(name, cls.reason)
            with blamed_on(name, cls):
                out.step_ns[name], out.claimed[name] = median_step_ns(cls, prep, events.mark, (name, "batched", ""))
            out.python[name] = not compiled_wall(cls)
        except DesignFailure as exc:
            return Failed(f"{name}: {exc.reason}")
    events.cell(None)
    return out


def wall_bound(wall: WallResult, floor: WallResult) -> dict[str, str]:
    """Per design timed from Python, why its figures break the supervisor's bound (:func:`harness.run.bound.judge`)
    given the do-nothing design's replays in a worker of no plug-in; compiled replays are not bounded."""
    if wall.supervised is None:
        return {}
    per_replay = floor_per_slice(floor.supervised, floor.claimed)
    out = {}
    for name, python in wall.python.items():
        reading = wall.supervised.get((name, "batched", ""), (0, 0))
        reason = judge(wall.claimed[name], reading, per_replay, "python", "batched") if python else ""
        if reason:
            out[name] = reason
    return out


def execute(job: object, events: Events) -> object:
    """Run a gate job in this process (a worker's entry point); a probe as ``run``'s workers do."""
    if isinstance(job, AllocationsJob):
        return run_allocations(job, events)
    if isinstance(job, WallJob):
        return run_wall(job, events)
    return execute_measure_job(job, events)


class GateWorkers(Workers):
    """The gate's workers: one for the registered designs, one for each plug-in, started on first use."""

    def __init__(self, deadline_s: float = DEFAULT_DEADLINE_S, code: str = "") -> None:
        self.deadline_s, self.code = deadline_s, code  # code: another checkout's designs (harness.base.coderoot)
        self.workers: dict[str, Worker] = {}

    def run(self, impl: str, job: object) -> object:
        """``job`` in ``impl``'s worker: its result, or :class:`Failed` when the worker hung or died."""
        key = "" if impl in REGISTRY else impl
        worker = self.workers.setdefault(key, Worker(execute, self.deadline_s, self.code))
        try:
            return worker.run(job)
        except CellDied as died:
            return Failed(f"the worker process {died.reason}")

    def probe(self, name: str) -> str:
        """Why the plug-in ``name`` cannot be loaded ("" when it can), found in its own worker."""
        info = self.run(name, ProbeJob(name))
        if isinstance(info, Failed):
            return f"implementation {name!r}: loading it, {info.reason}"
        return "" if info.ok else info.reason
