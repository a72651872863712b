"""One scenario's cells, measured where the implementations run (a worker process): the worker's half of a run.

:class:`CellBench` holds a driver per cell (:class:`harness.base.interleave.Driver`) and measures what the
main process asks of this worker: the first calls (compilation or cache load, outside every timed region),
the run's repetitions this worker replays (interleaved, :func:`harness.base.interleave.interleaved`), the
figures read off a cell's last manager (table bytes, the per-call dispatch floor), and the cell studies
(allocations, paced runs). A design that fails is recorded by cell with its reason
(:class:`harness.errors.DesignFailure`); nothing here computes a ratio or an interval: the main process does,
from every worker's samples (:mod:`harness.run.assemble`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

import numpy as np

from harness.base import clock
from harness.base.builds import build_of, with_build
from harness.base.drivers import Prepared
from harness.base.failures import blamed_on
from harness.base.interleave import (
    FAST_REPS,
    WARM_STEPS,
    Driver,
    Hooks,
    Key,
    Replays,
    Turns,
    interleaved,
    slice_bounds,
    verify_slots,
)
from harness.base.replay import ReplayError
from harness.base.rows import Row
from harness.base.steptimes import StepTimes
from harness.errors import DesignFailure
from harness.run.alloc_cells import cell_allocations
from harness.studies.dispatch import calls_per_trace, dispatch_rows, empty_call_ns, has_dispatch
from harness.studies.paced_study import PacedCells, PacedHooks, paced_study_rows
from impls.contract import table_nbytes_problem

if TYPE_CHECKING:
    from harness.run.workers import Events

Cell = tuple[str, str]
ALLOC_STEPS = 20  # steps counted for allocations per step (after warm-up)


@dataclass(frozen=True)
class CellSetup:
    """What one scenario's cells in a worker are built from, once per job: the scenario, its trace prepared, the
    cells and their implementations' classes, the timers' calibration, the worker's compiled replay loops."""

    scenario: str
    prep: Prepared
    cells: tuple[Cell, ...]
    classes: dict[str, type]
    calib: dict
    loops: dict


@dataclass(frozen=True)
class Repetitions:
    """What a timing job asks of its cells: ``reps`` repetitions (``caps`` a cell's own), this worker's ``only``,
    the A/A control on ``base`` (with ``control``), the figures read off the last managers (``read_off``), and
    a pause before each slice for the other designs' workers (``lockstep``)."""

    reps: int
    caps: dict[Cell, int]
    only: list[int]
    base: str
    read_off: bool = False
    control: bool = True
    lockstep: bool = False


@dataclass
class CellInfo:
    """How a cell is replayed, for the rows the main process writes."""

    driver: str  # python, compiled, native
    how: str
    timer_overhead_ns: float
    separate_detail: bool
    build: str = ""  # how the design's code was compiled, ending its rows' how (harness.base.builds)


@dataclass
class TimingResult:
    """One worker's share of a scenario's timings: samples by key with each one's repetition index."""

    steps: dict[Key, list[tuple[int, StepTimes]]] = field(default_factory=dict)
    details: dict[Key, list[tuple[int, StepTimes]]] = field(default_factory=dict)
    failed: dict[Cell, str] = field(default_factory=dict)
    rows: list[Row] = field(default_factory=list)  # compile time, table bytes, dispatch floor
    info: dict[Cell, CellInfo] = field(default_factory=dict)
    torch_threads: int | None = None  # torch's intra-op threads in the worker (None: torch not loaded)
    supervised: dict | None = None  # CPU time per key, set by the main process (harness.run.bound), not here
    pid: int = 0


def reps_of(cell_driver: Driver, reps: int, cap: int | None) -> int:
    """Repetitions of a cell: the plan's cap, else FAST_REPS times ``reps`` for compiled and C++ replays."""
    if cap is not None:
        return cap
    return reps * (FAST_REPS if cell_driver.separate_detail else 1)


class CellBench:
    """The drivers of one scenario's cells in this process, and what they measure."""

    def __init__(self, setup: CellSetup, events: Events) -> None:
        self.setup, self.events = setup, events
        self.scenario, self.prep, self.trace = setup.scenario, setup.prep, setup.prep.trace
        self.drivers = {(i, r, ""): Driver(setup.prep, setup.classes[i], r, setup.loops, i) for i, r in setup.cells}
        self.slices = slice_bounds(setup.prep.num_steps)
        self.failed: dict[Cell, str] = {}
        self.rows: list[Row] = []
        self.paced_claims: dict[tuple, tuple[int, int]] = {}  # harness.studies.paced_study.paced_claims

    def row(self, cell: Cell, metric: str, value: float, **columns) -> None:
        """A row of ``cell`` (``unit``, ``source``, ``how`` and the other columns by name; ``build`` ends ``how``)."""
        how = with_build(columns.pop("how", ""), columns.pop("build", ""))
        self.rows.append(Row(self.scenario, *cell, metric, value, how=how, **columns))

    def _fail(self, cell: Cell, exc: DesignFailure) -> None:
        self.failed.setdefault(cell, exc.reason)
        self.drivers.pop((*cell, ""), None)

    def _guarded(self, cell: Cell, fn: Callable[[], object]) -> object:
        """``fn()`` inside ``cell``: its failure fails the cell (returns None then)."""
        self.events.cell(cell)
        try:
            with blamed_on(cell[0], self.drivers[(*cell, "")].cls):
                return fn()
        except DesignFailure as exc:
            self._fail(cell, exc)
            return None
        finally:
            self.events.cell(None)

    # -- timings ---------------------------------------------------------------------------------------------
    def warm_up(self, record: bool) -> None:
        """First calls of every cell (Numba cache load or compile, C++ library load) outside every timed
        region; the native driver's slot mapping is checked here, from Python, once. With ``record``, a
        ``compile_s`` row per cell that compiles or loads code."""
        said: set[str] = set()
        for key in list(self.drivers):
            driver = self.drivers[key]
            if key[0] not in said:  # one line per design: its regimes warm up in turn
                said.add(key[0])
                regimes = ", ".join(dict.fromkeys(k[1] for k in self.drivers if k[0] == key[0]))
                self.events.status(f"{self.scenario}: warming up {key[0]} ({regimes}; first calls: compilation or "
                                   "cache load)")
            t0 = time.perf_counter()
            if self._guarded(key[:2], lambda d=driver: self._first_steps(d)) is None:
                continue
            if record and (driver.kind != "python" or getattr(driver.cls, "kernels", None) is not None):
                self.row(key[:2], "compile_s", time.perf_counter() - t0, unit="s", source="wall clock",
                         how=f"first steps through the {driver.kind} driver (compile or cache load)",
                         driver=driver.kind, build=driver.build)
        if any(d.kind != "python" for d in self.drivers.values()):
            clock.ns_per_tick()  # the tick's calibration (100 ms, once per process) outside the first timed slice

    def _first_steps(self, driver: Driver) -> bool:
        steps = min(WARM_STEPS, self.prep.num_steps)
        driver.warm_up(steps)
        driver.check_inputs(0, steps)  # a design that wrote into its inputs fails saying so, not later on them
        if driver.kind == "native":
            verify_slots(driver)
        return True

    def aa_key(self, base: str) -> Key | None:
        """The A/A control: batched ``base`` (else the first cell) replayed twice as if it were two cells."""
        if not self.drivers:
            return None
        key = (base, "batched", "") if (base, "batched", "") in self.drivers else next(iter(self.drivers))
        return (*key[:2], "aa")

    def time(self, asked: Repetitions) -> TimingResult:
        """The repetitions ``asked.only`` of every cell (and the A/A control), whole steps then, for the compiled and
        C++ drivers, per operation; with ``asked.read_off``, the figures read off each cell's last manager."""
        aa = self.aa_key(asked.base) if asked.control else None
        timed = {**self.drivers, **({aa: self.drivers[(*aa[:2], "")]} if aa else {})}
        turns = Turns(asked.reps, self.slices, {k: reps_of(self.drivers[(*k[:2], "")], asked.reps,
                                                           asked.caps.get(k[:2])) for k in timed}, asked.only)

        def enter(key: Key) -> None:
            self.events.cell(key[:2])

        def done(key: Key) -> None:
            if not key[2]:
                self.events.tick(f"{self.scenario} {key[0]} {key[1]}")

        hooks = Hooks(enter, self.events.mark, self.events.pause if asked.lockstep else _no_pause)
        steps = interleaved(timed, turns, False, replace(hooks, done=done))
        detailed = {k: d for k, d in self.drivers.items() if d.separate_detail and k not in steps.failed}
        details = interleaved(detailed, turns, True, hooks)
        self.events.cell(None)
        for key, exc in {**steps.failed, **details.failed}.items():
            if not key[2]:
                self._fail(key[:2], exc)
        if asked.read_off:
            self.read_off(steps)
        return TimingResult(_by_rep(steps, self.failed), _by_rep(details, self.failed), dict(self.failed),
                            list(self.rows), self.info())

    def info(self) -> dict[Cell, CellInfo]:
        return {key[:2]: CellInfo(d.kind, d.how(), d.timer_overhead(self.setup.calib), d.separate_detail, d.build)
                for key, d in self.drivers.items()}

    def read_off(self, replays: Replays) -> None:
        """Figures read off each cell's last manager: table bytes per live sequence, and for the per-call cells
        of compiled designs the dispatch floor."""
        for impl, regime in self.setup.cells:
            mgr = replays.last_mgr.get((impl, regime, ""))
            if mgr is None or (impl, regime) in self.failed:
                continue
            self._guarded((impl, regime), lambda i=impl, r=regime, m=mgr: self._read_off(i, r, m))

    def _read_off(self, impl: str, regime: str, mgr) -> None:
        cls = self.drivers[(impl, regime, "")].cls
        if regime == "per-call" and has_dispatch(cls):  # the per-call figure's dispatch, apart
            for row in dispatch_rows(self.scenario, impl, empty_call_ns(mgr), calls_per_trace(self.trace)):
                row.driver, row.how = "python", with_build(row.how, build_of(cls))
                self.rows.append(row)
        sizes = [mgr.table_nbytes(row) for row in np.flatnonzero(self.trace.final_lens).tolist()]
        problem = next(filter(None, map(table_nbytes_problem, sizes)), "")
        if problem:  # an answer outside the contract fails the cell, as a wrong slot would
            raise ReplayError(f"{problem}, for a sequence live at the end of the trace")
        if sizes and None not in sizes:
            self.row((impl, regime), "table_bytes_per_seq", float(np.mean(sizes)), unit="B",
                     source="design introspection",
                     how=f"mean over the {len(sizes)} live sequences at the end (see the design's _table_nbytes)")
        else:
            self.row((impl, regime), "table_bytes_per_seq", float("nan"), unit="B", source="design introspection",
                     how="the design cannot report it" if sizes else "no live sequence at the end",
                     status="unavailable")

    # -- cell studies ----------------------------------------------------------------------------------------
    def measure_allocations(self, cells: list[Cell]) -> None:
        """Allocation events per step over ALLOC_STEPS steps (:func:`harness.run.alloc_cells.cell_allocations`),
        on a fresh manager advanced (uncounted) to the region's first step."""
        lo = min(WARM_STEPS, max(0, self.prep.num_steps - ALLOC_STEPS))
        hi = min(self.prep.num_steps, lo + ALLOC_STEPS)
        for cell in cells:
            if (*cell, "") in self.drivers:
                self._guarded(cell, lambda c=cell: self._allocations(c, lo, hi))
            self.events.tick(f"{self.scenario} {cell[0]} {cell[1]} allocations")

    def _allocations(self, cell: Cell, lo: int, hi: int) -> None:
        driver = self.drivers[(*cell, "")]
        mgr = driver.new()
        advance = driver.advance(mgr)
        advance(0, lo)
        figures = cell_allocations(driver.kind, cell[1], driver.inputs, mgr, advance, lo, hi)
        driver.check_inputs(0, hi)
        for fig in figures:
            self.row(cell, fig.metric, fig.per_step, unit="allocs/step", source=fig.source, how=fig.how,
                     steps=fig.steps, driver=driver.kind, build=driver.build, status=fig.status)

    def measure_paced(self, cells: list[Cell]) -> None:
        """The paced study (:mod:`harness.studies.paced_study`): every cell's paced loops and the floor, repeated
        and interleaved; a cell whose implementation fails gets a failed row."""
        cells = [c for c in cells if (*c, "") in self.drivers]
        self.rows += paced_study_rows(
            PacedCells(self.scenario, self.prep, {c: self.drivers[(*c, "")].new for c in cells},
                       {c: self.drivers[(*c, "")].cls for c in cells},
                       self.trace.header["params"].get("step_rate", 2000), self.prep.caching),
            PacedHooks(self.events.cell, self.events.mark), self.paced_claims)
        self.events.cell(None)
        for impl, regime in cells:
            self.events.tick(f"{self.scenario} {impl} {regime} paced")


def _no_pause(position: tuple[int, ...]) -> None:
    """Outside a lockstep a worker goes on from slice to slice."""


def _by_rep(replays: Replays, failed: dict[Cell, str]) -> dict[Key, list[tuple[int, StepTimes]]]:
    """Each key's samples with their repetition index, without the failed cells' (and their A/A copies)."""
    return {key: list(zip(replays.reps[key], samples, strict=True)) for key, samples in replays.samples.items()
            if key[:2] not in failed}
