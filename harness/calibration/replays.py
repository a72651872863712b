"""A calibration's replays of one scenario's repetitions ``only`` in a worker process.
Design: docs/output.md#harnesscalibrationreplayspy."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType, SimpleNamespace

from harness.base.drivers import Prepared, StepTimes
from harness.base.failures import blamed_on, short_reason
from harness.base.interleave import Driver, Hooks, Key, Replays, Turns, interleaved, slice_bounds
from harness.base.metrics import Work
from harness.base.threads import one_intra_op_thread
from harness.engines.call_meter import (
    METERED_REPLAYS,
    WHOLE_STEP,
    MeteredReplays,
    meter_cost,
    meterable,
    metered_replay,
    whole_step_replay,
)
from harness.engines.catalog import ENGINES, Baseline, Engine
from harness.engines.fan_out import FanOutError
from harness.engines.loader import PlanError, StubTouched, engine_imports
from harness.errors import DesignFailure, InputError
from harness.run.workers import Events, peak_rss
from impls import REGISTRY
from impls.contract import supports_prefix_caching
from scenarios import Trace, generate
from scenarios.trace import trace_uses_caching

FAILURES = (DesignFailure, StubTouched, PlanError, FanOutError)
IMPORTING: Key = ("the engine's modules", "import", "real")


@dataclass
class CalibrationJob:
    """One worker's repetitions ``only`` of one scenario; ``skip``: replays whose worker died or hung."""

    engine: str
    root: str
    version: str
    scenario: str
    params: dict[str, str]
    reps: int
    only: list[int]
    skip: list[Key] = field(default_factory=list)
    contenders: bool = True  # False: the engine's baselines alone (``history``)
    baselines: tuple[str, ...] = ()  # the baselines replayed (none named: all)
    lockstep: bool = False  # pause between slices (harness.run.lockstep: releases in workers of their own)


@dataclass
class BaselineInfo:
    """What the rows need of a baseline, without its classes (which live in the worker)."""

    name: str
    calibrates: tuple[str, ...]
    modelled_by: tuple[str, ...]
    how: str
    real_trace_how: str


@dataclass
class Measured:
    """What one worker measured of one scenario: samples by repetition index, failures, each replay's work."""

    samples: dict[Key, list[tuple[int, StepTimes]]]
    failed: dict[Key, str]
    work: dict[Key, Work]
    baselines: list[BaselineInfo]
    plan: str
    threads: int | None
    loaded: list[str]
    pid: int
    steps: int
    metered: dict[Key, MeteredReplays] = field(default_factory=dict)  # the engine's calls apart (call_meter)
    peak_rss: int = 0


@dataclass
class Refused:
    """The engine cannot be loaded here (bad input: a missing package, a plan that no longer fits)."""

    message: str


@contextmanager
def missing_packages(engine: Engine) -> Iterator[None]:
    """A package the engine's modules import that is not installed here, named in one line for the user."""
    try:
        yield
    except ModuleNotFoundError as exc:
        if exc.name is None or exc.name.partition(".")[0] in engine.packages:
            raise InputError(f"{engine.name}: its modules import {exc.name}, which the import plan does not name "
                             f"(harness/calibration/{engine.module}.py)") from None
        hint = " (pip install 'kvblock-bench[torch]')" if exc.name == "torch" else ""
        raise InputError(f"{engine.name}: its block manager needs the package {exc.name!r}, which is not "
                         f"installed here; install it{hint}") from None


def execute(job: CalibrationJob, events: Events) -> Measured | Refused:
    """A worker's entry point: the job's replays, or why the engine does not load."""
    try:
        return _measure(job, events)
    except InputError as exc:
        return Refused(str(exc))


def _measure(job: CalibrationJob, events: Events) -> Measured:
    engine = ENGINES[job.engine]
    with missing_packages(engine):
        module = engine.code()
        plan = module.plan(job.version)
    with engine_imports(plan, Path(job.root)) as imports:
        events.cell(IMPORTING)
        baselines = _load(engine, module, job)
        events.cell(None)
        imports.arm()
        context = Context(engine, generate(job.scenario, **job.params), job, events)
        measured = context.measure(baselines, plan.describe())
        measured.loaded = list(imports.loaded)
    measured.peak_rss = peak_rss()
    return measured


def _load(engine: Engine, module: ModuleType, job: CalibrationJob) -> list[Baseline]:
    """The engine's modules imported by the plan and its baselines made; a failure there is an :class:`InputError`."""
    with missing_packages(engine):
        try:
            baselines = module.baselines(_classes_checked(engine, job.version, module.load(job.version)), job.version)
        except ModuleNotFoundError:
            raise
        except (ImportError, SyntaxError) as exc:  # PlanError included: a newer release imports more
            raise InputError(f"{engine.name} {job.version}: its modules do not load by the import plan "
                             f"(harness/calibration/{engine.module}.py): {exc}") from None
        except BaseException as exc:
            if not raised_in(exc, Path(job.root)):
                raise  # ours: a traceback
            raise InputError(f"{engine.name} {job.version}: its code failed while its modules were imported: "
                             f"{short_reason(exc)}") from None
    return [b for b in baselines if not job.baselines or b.name in job.baselines]


def _classes_checked(engine: Engine, version: str | None, loaded: SimpleNamespace) -> SimpleNamespace:
    """``loaded``, once every capitalised name in it is a class (else :class:`InputError` naming it)."""
    for name, value in vars(loaded).items():
        if name[:1].isupper() and not isinstance(value, type):
            raise InputError(f"{engine.name} {version or 'unversioned'}: {name} in its modules is not a class (it "
                             f"is of type {type(value).__name__}); the adapter (harness/calibration/{engine.module}"
                             ".py) drives the engine's class of that name")
    return loaded


def raised_in(exc: BaseException, root: Path) -> bool:
    """Whether ``exc``'s traceback passes through a file under ``root`` (the engine's code)."""
    root = root.resolve()
    tb = exc.__traceback__
    while tb is not None:
        if Path(tb.tb_frame.f_code.co_filename).resolve().is_relative_to(root):
            return True
        tb = tb.tb_next
    return False


class Context:
    """One scenario's replays in this worker: its drivers, warm-up and timed repetitions."""

    def __init__(self, engine: Engine, trace: Trace, job: CalibrationJob, events: Events) -> None:
        self.engine, self.trace, self.job, self.events = engine, trace, job, events
        self.prep = Prepared.from_trace(trace)
        self.slices = slice_bounds(self.prep.num_steps)
        self.drivers: dict[Key, Driver] = {}
        self.failed: dict[Key, str] = {}

    def contenders(self, baselines: list[Baseline]) -> list[str]:
        if not self.job.contenders:
            return []
        caching = trace_uses_caching(self.trace)
        names = dict.fromkeys(c for b in baselines for c in b.calibrates)
        return [c for c in names if c in REGISTRY and (not caching or supports_prefix_caching(REGISTRY[c]))]

    def regimes(self, contenders: list[str], b: Baseline) -> tuple[str, ...]:
        """The regimes the engine's code is replayed in for ``b``: each regime of a contender it calibrates here
        (ours[regime] pairs with real[regime]); the batched one alone when no contender is replayed (``history``)."""
        found = dict.fromkeys(r for c in b.calibrates if c in contenders
                              for r in self.engine.regimes.get(c, ("per-call", "batched")))
        return tuple(found) or ("batched",)

    def build(self, baselines: list[Baseline]) -> None:
        real_preps: dict[object, Prepared] = {}
        contenders = self.contenders(baselines)
        for contender in contenders:
            for regime in self.engine.regimes.get(contender, ("per-call", "batched")):
                self.drivers[(contender, regime, "")] = Driver(self.prep, REGISTRY[contender], regime, {}, contender)
        for b in baselines:
            keys = [(b.name, regime, "real") for regime in self.regimes(contenders, b)]
            try:
                if b.real_trace not in real_preps:
                    real = self.trace if b.real_trace is None else b.real_trace(self.trace)
                    real_preps[b.real_trace] = self.prep if real is self.trace else Prepared.from_trace(real)
            except FanOutError as exc:
                self.failed.update({key: f"{type(exc).__name__}: {exc}" for key in keys})
                continue
            for key in keys:
                self.drivers[key] = Driver(real_preps[b.real_trace], b.cls, key[1], {}, b.name)
        for key in map(tuple, self.job.skip):
            self.drivers.pop(key, None)

    def warm_up(self) -> None:
        """A few steps on a fresh manager, untimed: first calls, and an early stop for a replay that cannot run."""
        for key, driver in list(self.drivers.items()):
            self.events.cell(key)
            try:
                with blamed_on(key[0], driver.cls):
                    driver.warm_up()
            except FAILURES as exc:
                self.failed[key] = getattr(exc, "reason", f"{type(exc).__name__}: {exc}")
                del self.drivers[key]
        self.events.cell(None)

    def measure(self, baselines: list[Baseline], plan: str) -> Measured:
        baselines = [b for b in baselines if b.replays(self.trace)]
        self.build(baselines)
        with one_intra_op_thread() as threads:
            self.warm_up()
            try:
                hooks = Hooks(self.events.cell)
                if self.job.lockstep:
                    hooks = Hooks(self.events.cell, pause=self.events.pause)
                replays = interleaved(self.drivers, Turns(self.job.reps, self.slices, only=self.job.only), False,
                                      hooks) if self.drivers else None
            except (StubTouched, PlanError) as exc:
                raise RuntimeError(f"{self.job.scenario}: the engine's code left the import plan during a replay: "
                                   f"{exc}") from exc
            metered = self.meter_calls(baselines, replays)
        self.events.cell(None)
        samples = {}
        if replays is not None:
            self.failed.update({k: e.reason for k, e in replays.failed.items()})
            samples = {k: list(zip(replays.reps[k], v, strict=True)) for k, v in replays.samples.items()}
        infos = [BaselineInfo(b.name, b.calibrates, b.modelled_by, b.how, b.real_trace_how
                              if self.trace_changed(b) else "") for b in baselines]
        return Measured(samples, self.failed, {k: Work.of(d.prep) for k, d in self.drivers.items()}, infos, plan,
                        threads, [], os.getpid(), self.prep.num_steps, metered)

    def trace_changed(self, b: Baseline) -> bool:
        preps = [d.prep for k, d in self.drivers.items() if k[0] == b.name and k[2]]
        return b.real_trace is not None and any(prep is not self.prep for prep in preps)

    def meter_calls(self, baselines: list[Baseline], replays: Replays | None) -> dict[Key, MeteredReplays]:
        """After the timed repetitions, full replays with the meter on each replay's engine object."""
        objects = {b.name: b.engine_object for b in baselines}
        done = set() if replays is None else {k for k in replays.samples if k not in replays.failed}
        out = {}
        for key, driver in self.drivers.items():
            attribute = objects.get(key[0]) if key[2] else self.engine.engine_objects.get(key[0])
            kind = "native" if attribute == WHOLE_STEP else "python"
            if attribute and key in done and key not in self.failed and driver.kind == kind:
                out[key] = MeteredReplays(attribute, Work.of(driver.prep).seq_steps)
        if not out:
            return out
        cost = meter_cost()
        for m in out.values():
            m.read_ns, m.added_ns = (0.0, 0.0) if m.attribute == WHOLE_STEP else cost
        for i in range(min(METERED_REPLAYS, len(self.job.only))):
            if self.job.lockstep:
                self.events.pause((2, i, 0))  # after every timed slice's position: the releases take turns still
            for key, m in out.items():
                if not m.why:
                    self.events.cell(key)
                    m.why = self.metered(self.drivers[key], m)
        self.events.cell(None)
        return out

    def metered(self, driver: Driver, m: MeteredReplays) -> str:
        """One metered full replay on a fresh manager, checked against the trace; why it failed ("": it did not)."""
        prep = driver.prep
        try:
            with blamed_on(driver.impl, driver.cls):
                mgr = driver.new()

                def step(s: int) -> StepTimes:
                    times = driver.timed(mgr, False, s, s + 1)
                    times.check(prep.trace.step_cows, prep.slot_digests, s)
                    return times

                if m.attribute == WHOLE_STEP:
                    whole_step_replay(m, step, Work.of(prep).seq_steps_per_step)
                    return ""
                target = getattr(mgr, m.attribute, None)
                why = meterable(target)
                if why:
                    return f"{m.attribute}: {why}"
                metered_replay(m, target, step, Work.of(prep).seq_steps_per_step)
        except FAILURES as exc:
            return getattr(exc, "reason", f"{type(exc).__name__}: {exc}")
        return ""
