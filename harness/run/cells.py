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
from dataclasses import dataclass, field

import numpy as np

from harness.base import clock
from harness.base.builds import build_of, with_build
from harness.base.drivers import Prepared
from harness.base.failures import blamed_on
from harness.base.interleave import (
    FAST_REPS,
    WARM_STEPS,
    Driver,
    Key,
    Replays,
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
from harness.studies.paced_study import paced_study_rows
from impls.contract import table_nbytes_problem
from scenarios import Trace
from scenarios.trace import trace_uses_caching

Cell = tuple[str, str]
ALLOC_STEPS = 20  # steps counted for allocations per step (after warm-up)


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

    def __init__(self, scenario: str, trace: Trace, prep: Prepared, cells: list[Cell], classes: dict[str, type],
                 calib: dict, loops: dict, enter: Callable[[Cell | None], None] = lambda cell: None,
                 tick: Callable[[str], None] = lambda what: None,
                 status: Callable[[str], None] = lambda what: None,
                 mark: Callable[[tuple | None], None] = lambda key: None) -> None:
        self.scenario, self.trace, self.prep, self.calib = scenario, trace, prep, calib
        self.cells = list(cells)
        self.drivers = {(i, r, ""): Driver(prep, classes[i], r, loops, i) for i, r in self.cells}
        self.slices = slice_bounds(prep.num_steps)
        self.enter, self.tick, self.status, self.mark = enter, tick, status, mark
        self.pause: Callable[[tuple[int, ...]], None] = lambda position: None
        self.failed: dict[Cell, str] = {}
        self.rows: list[Row] = []
        self.paced_claims: dict[tuple, tuple[int, int]] = {}  # harness.studies.paced_study.paced_claims

    def row(self, impl: str, regime: str, metric: str, value: float, unit: str, source: str, how: str = "",
            status: str = "ok", build: str = "", **columns) -> None:
        self.rows.append(Row(self.scenario, impl, regime, metric, value, unit, source, status,
                             with_build(how, build), **columns))

    def _fail(self, cell: Cell, exc: DesignFailure) -> None:
        self.failed.setdefault(cell, exc.reason)
        self.drivers.pop((*cell, ""), None)

    def _guarded(self, cell: Cell, fn: Callable[[], object]) -> object:
        """``fn()`` inside ``cell``: its failure fails the cell (returns None then)."""
        self.enter(cell)
        try:
            with blamed_on(cell[0], self.drivers[(*cell, "")].cls):
                return fn()
        except DesignFailure as exc:
            self._fail(cell, exc)
            return None
        finally:
            self.enter(None)

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
                self.status(f"{self.scenario}: warming up {key[0]} ({regimes}; first calls: compilation or cache load)")
            t0 = time.perf_counter()
            if self._guarded(key[:2], lambda d=driver: self._first_steps(d)) is None:
                continue
            if record and (driver.kind != "python" or getattr(driver.cls, "kernels", None) is not None):
                self.row(key[0], key[1], "compile_s", time.perf_counter() - t0, "s", "wall clock",
                         f"first steps through the {driver.kind} driver (compile or cache load)", driver=driver.kind,
                         build=driver.build)
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

    def time(self, reps: int, caps: dict[Cell, int], only: list[int], base: str,
             read_off: bool = False, control: bool = True) -> TimingResult:
        """The repetitions ``only`` of every cell (with ``control``, the A/A control), whole steps then, for the
        compiled and C++ drivers, per operation; with ``read_off``, the figures read off each cell's last manager."""
        aa = self.aa_key(base) if control else None
        timed = {**self.drivers, **({aa: self.drivers[(*aa[:2], "")]} if aa else {})}
        rep_caps = {k: reps_of(self.drivers[(*k[:2], "")], reps, caps.get(k[:2])) for k in timed}

        def enter(key: Key) -> None:
            self.enter(key[:2])

        def done(key: Key) -> None:
            if not key[2]:
                self.tick(f"{self.scenario} {key[0]} {key[1]}")

        steps = interleaved(timed, reps, False, self.slices, done, caps=rep_caps, only=only, enter=enter,
                            mark=self.mark, pause=self.pause)
        detailed = {k: d for k, d in self.drivers.items() if d.separate_detail and k not in steps.failed}
        details = interleaved(detailed, reps, True, self.slices, caps=rep_caps, only=only, enter=enter,
                              mark=self.mark, pause=self.pause)
        self.enter(None)
        for key, exc in {**steps.failed, **details.failed}.items():
            if not key[2]:
                self._fail(key[:2], exc)
        if read_off:
            self.read_off(steps)
        return TimingResult(_by_rep(steps, self.failed), _by_rep(details, self.failed), dict(self.failed),
                            list(self.rows), self.info())

    def info(self) -> dict[Cell, CellInfo]:
        return {key[:2]: CellInfo(d.kind, d.how(), d.timer_overhead(self.calib), d.separate_detail, d.build)
                for key, d in self.drivers.items()}

    def read_off(self, replays: Replays) -> None:
        """Figures read off each cell's last manager: table bytes per live sequence, and for the per-call cells
        of compiled designs the dispatch floor."""
        for impl, regime in list(self.cells):
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
            self.row(impl, regime, "table_bytes_per_seq", float(np.mean(sizes)), "B", "design introspection",
                     f"mean over the {len(sizes)} live sequences at the end (see the design's _table_nbytes)")
        else:
            self.row(impl, regime, "table_bytes_per_seq", float("nan"), "B", "design introspection",
                     "the design cannot report it" if sizes else "no live sequence at the end",
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
            self.tick(f"{self.scenario} {cell[0]} {cell[1]} allocations")

    def _allocations(self, cell: Cell, lo: int, hi: int) -> None:
        impl, regime = cell
        driver = self.drivers[(*cell, "")]
        mgr = driver.new()
        advance = driver.advance(mgr)
        advance(0, lo)
        figures = cell_allocations(driver.kind, regime, driver.inputs, mgr, advance, lo, hi)
        driver.check_inputs(0, hi)
        for fig in figures:
            self.row(impl, regime, fig.metric, fig.per_step, "allocs/step", fig.source, fig.how, steps=fig.steps,
                     driver=driver.kind, build=driver.build, status=fig.status)

    def measure_paced(self, cells: list[Cell]) -> None:
        """The paced study (:mod:`harness.studies.paced_study`): every cell's paced loops and the floor, repeated
        and interleaved; a cell whose implementation fails gets a failed row."""
        cells = [c for c in cells if (*c, "") in self.drivers]
        self.rows += paced_study_rows(
            self.scenario, self.prep, {c: self.drivers[(*c, "")].new for c in cells},
            {c: self.drivers[(*c, "")].cls for c in cells}, self.trace.header["params"].get("step_rate", 2000),
            trace_uses_caching(self.trace), enter=self.enter, mark=self.mark, claims=self.paced_claims)
        self.enter(None)
        for impl, regime in cells:
            self.tick(f"{self.scenario} {impl} {regime} paced")


def _by_rep(replays: Replays, failed: dict[Cell, str]) -> dict[Key, list[tuple[int, StepTimes]]]:
    """Each key's samples with their repetition index, without the failed cells' (and their A/A copies)."""
    return {key: list(zip(replays.reps[key], samples, strict=True)) for key, samples in replays.samples.items()
            if key[:2] not in failed}
